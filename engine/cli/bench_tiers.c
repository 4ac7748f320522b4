/* bench_tiers.c - `tinyloop bench tiers`: what the KV tiers under the
 * arena buy, measured in one run.
 *   - TTFT of a shared prefix + 32-token suffix: a miss, a hit in the
 *     arena (tier 1), a hit restored from host RAM (tier 2) and from disk
 *     (tier 3; the file is in the page cache, as it is after a recent spill)
 *   - the first request after a restart, with and without the disk tier
 *   - token hit rate of a multi-tenant trace whose prefixes need 4x the
 *     arena, without and with the host tier */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_cache.h"
#include "tinyloop.h"

static tl_model *open_model(const char *path, tl_model_params mp, size_t kv_mem, size_t host, const char *dir) {
    mp.kv_mem = kv_mem;
    mp.kv_host_mem = host;
    mp.kv_dir = dir;
    tl_model *m = NULL;
    if (tl_model_open(path, mp, &m)) fprintf(stderr, "bench tiers: %s\n", tl_last_error());
    return m;
}

/* The prefix is cached, then pushed down a tier: a budget of one block
 * for its tenant evicts it (as memory pressure would, without sizing an
 * arena around each model's sliding windows). */
static double tier_hit(const char *path, tl_model_params mp, size_t host, const char *dir, const int32_t *p, int n,
                       int prefix, tl_cache_stats *st) {
    tl_model *m = open_model(path, mp, 0, host, dir);
    if (!m) return -1;
    tl_bench_ttft(m, p, prefix + 1, 0);
    tl_model_set_tenant_budget(m, 0, 1);
    tl_model_set_tenant_budget(m, 0, 0);
    double t = tl_bench_ttft(m, p, n, 0);
    tl_model_get_stats(m, st);
    tl_model_close(m);
    return t;
}

static void rm_dir(const char *dir) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) fprintf(stderr, "bench tiers: could not remove %s\n", dir);
}

static int bench_ttft(const char *path, tl_model_params mp, int prefix) {
    tl_model *m = open_model(path, mp, 0, 0, NULL);
    if (!m) return 1;
    tl_model_info info;
    tl_model_get_info(m, &info);
    int n = prefix + 32, nv = info.n_vocab;
    int32_t *p = malloc((size_t)n * sizeof *p);
    tl_bench_fill(p, n, nv, 7);
    double miss = tl_bench_ttft(m, p, n, 1);
    tl_bench_ttft(m, p, prefix + 1, 0);
    double hit1 = tl_bench_ttft(m, p, n, 0);
    tl_model_close(m);
    char dir[] = "/tmp/tl_bench_tiers_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    tl_cache_stats s2, s3;
    double hit2 = tier_hit(path, mp, (size_t)4 << 30, NULL, p, n, prefix, &s2);
    double hit3 = tier_hit(path, mp, 0, dir, p, n, prefix, &s3);
    printf("  TTFT %d-token prefix + 32: miss %.1f ms | tier 1 hit %.1f ms (%.1fx) | tier 2 (host) %.1f ms (%.1fx, "
           "%lld blocks, %.1f ms moving) | tier 3 (disk) %.1f ms (%.1fx, %lld blocks, %.1f ms reading)\n",
           prefix, miss * 1e3, hit1 * 1e3, miss / hit1, hit2 * 1e3, miss / hit2, (long long)s2.tier_hits[0],
           s2.tier_restore_ms[0], hit3 * 1e3, miss / hit3, (long long)s3.tier_hits[1], s3.tier_restore_ms[1]);
    /* a restart: the cache saved, the model opened again */
    m = open_model(path, mp, 0, 0, dir);
    double restart_hit = -1;
    if (m) {
        tl_bench_ttft(m, p, prefix + 1, 0);
        tl_model_save_cache(m, NULL);
        tl_model_close(m);
        m = open_model(path, mp, 0, 0, dir);
        tl_bench_fill(p + prefix, 32, nv, 99);
        restart_hit = m ? tl_bench_ttft(m, p, n, 0) : -1;
        tl_model_close(m);
    }
    m = open_model(path, mp, 0, 0, NULL);
    double restart_miss = m ? tl_bench_ttft(m, p, n, 0) : -1;
    tl_model_close(m);
    printf("  first request after a restart: %.1f ms without the disk tier, %.1f ms with it (%.1fx)\n",
           restart_miss * 1e3, restart_hit * 1e3, restart_miss / restart_hit);
    rm_dir(dir);
    free(p);
    return 0;
}

/* Tenants' prefixes needing 4x the arena, requests drawn at random: the
 * share of prompt tokens served from cache, without and with spilling. */
static int bench_trace(const char *path, tl_model_params mp, int prefix) {
    enum { TENANTS = 8, REQUESTS = 48, SUFFIX = 16 };
    tl_model *m = open_model(path, mp, 0, 0, NULL);
    if (!m) return 1;
    tl_model_info info;
    tl_model_get_info(m, &info);
    tl_model_close(m);
    int n = prefix + SUFFIX;
    size_t arena = (size_t)TENANTS * (size_t)prefix * info.kv_token_bytes / 4;
    int32_t *p = malloc((size_t)TENANTS * (size_t)n * sizeof *p);
    for (int t = 0; t < TENANTS; t++) tl_bench_fill(p + (size_t)t * n, prefix, info.n_vocab, 100 + (uint32_t)t);
    for (int with = 0; with < 2; with++) {
        m = open_model(path, mp, arena, with ? arena * 8 : 0, NULL);
        if (!m) return 1;
        uint32_t seed = 1;
        double total = 0;
        for (int r = 0; r < REQUESTS; r++) {
            seed = seed * 1103515245u + 12345u;
            int t = (int)((seed >> 8) % TENANTS);
            int32_t *q = p + (size_t)t * n;
            tl_bench_fill(q + prefix, SUFFIX, info.n_vocab, seed);
            total += tl_bench_ttft(m, q, n, 0);
        }
        tl_cache_stats st;
        tl_model_get_stats(m, &st);
        printf("  trace, %d tenants x %d-token prefixes in an arena of a quarter of them, %d requests, %s: "
               "token hit rate %.1f%%, mean TTFT %.1f ms (%lld evictions, %lld blocks restored)\n",
               TENANTS, prefix, REQUESTS, with ? "host tier 8x the arena" : "no spill tier",
               100.0 * (double)st.hit_tokens / ((double)REQUESTS * n), total / REQUESTS * 1e3,
               (long long)st.evictions, (long long)st.tier_hits[0]);
        tl_model_close(m);
    }
    free(p);
    return 0;
}

int tl_cli_bench_tiers(int n_models, const char *const *models, tl_model_params mp) {
    static const char *defaults[] = {"../shared/models/stories260K.gguf"};
    if (n_models == 0) {
        models = defaults;
        n_models = 1;
    }
    for (int i = 0; i < n_models; i++) {
        tl_model *m = open_model(models[i], mp, 0, 0, NULL);
        if (!m) return 1;
        tl_model_info info;
        tl_model_get_info(m, &info);
        tl_model_close(m);
        int prefix = info.max_seq_len >= 2048 ? 1536 : info.max_seq_len - 64;
        if (prefix < 32) {
            fprintf(stderr, "bench tiers: max_seq_len %d of %s is too short (it needs at least 96)\n",
                    info.max_seq_len, models[i]);
            return 1;
        }
        const char *name = strrchr(models[i], '/') ? strrchr(models[i], '/') + 1 : models[i];
        printf("%s (max_seq_len %d, %d threads, KV %s)\n", name, info.max_seq_len, info.n_threads, info.kv_mode);
        if (bench_ttft(models[i], mp, prefix) || bench_trace(models[i], mp, prefix > 256 ? 256 : prefix)) return 1;
    }
    return 0;
}
