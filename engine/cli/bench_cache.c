/* bench_cache.c - `tinyloop bench cache`: what the prefix cache buys,
 * measured as ratios in one run.
 *   - TTFT of a shared-prefix prompt (prefix + 32-token suffix): miss vs hit
 *   - multi-turn chat (8 conversations x 6 turns resending their history):
 *     throughput with vs without the cache
 *   - KV blocks for 100 concurrent requests on one shared prefix vs none
 *   - radix longest-match of a 4096-token prompt against 10,000 entries,
 *     and insert time */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_cache.h"
#include "model.h"
#include "radix.h"
#include "tinyloop.h"
#include "util.h"

void tl_bench_fill(int32_t *t, int n, int nv, uint32_t seed) {
    for (int i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        t[i] = 3 + (int32_t)((seed >> 8) % (uint32_t)(nv - 3));
    }
}

double tl_bench_ttft(tl_model *m, const int32_t *p, int n, int no_cache) {
    tl_generate_params gp = tl_generate_default_params();
    gp.max_tokens = 1;
    gp.ignore_eos = 1;
    gp.no_cache = no_cache;
    int64_t id;
    double t0 = tl_now();
    if (tl_request_submit(m, p, n, &gp, NULL, &id)) return -1;
    while (tl_model_step(m) > 0) {
    }
    double dt = tl_now() - t0;
    tl_request_release(m, id);
    return dt;
}

static void bench_ttft(tl_model *m, int prefix, int suffix) {
    int nv = tl_model_n_vocab(m), n = prefix + suffix;
    int32_t *p = malloc((size_t)n * sizeof *p);
    tl_bench_fill(p, n, nv, 7);
    double miss = tl_bench_ttft(m, p, n, 1);
    tl_bench_ttft(m, p, prefix + 1, 0); /* puts the prefix in the cache (a previous request) */
    tl_bench_fill(p + prefix, suffix, nv, 99); /* a new suffix */
    double hit = tl_bench_ttft(m, p, n, 0);
    printf("  TTFT %d-token prefix + %d-token suffix: miss %.2f ms, hit %.2f ms -> %.1fx\n", prefix, suffix,
           miss * 1e3, hit * 1e3, miss / hit);
    free(p);
}

static double chat(tl_model *m, int no_cache, int sys_len, int turns, int user_len, int reply_len) {
    enum { CONV = 8 };
    int nv = tl_model_n_vocab(m), cap = sys_len + turns * (user_len + reply_len);
    int32_t *hist[CONV];
    int len[CONV];
    for (int c = 0; c < CONV; c++) {
        hist[c] = malloc((size_t)cap * sizeof(int32_t));
        tl_bench_fill(hist[c], sys_len, nv, 1); /* a shared system prompt */
        len[c] = sys_len;
    }
    tl_generate_params gp = tl_generate_default_params();
    gp.max_tokens = reply_len;
    gp.ignore_eos = 1;
    gp.no_cache = no_cache;
    double t0 = tl_now();
    long tokens = 0;
    for (int t = 0; t < turns; t++)
        for (int c = 0; c < CONV; c++) {
            tl_bench_fill(hist[c] + len[c], user_len, nv, (uint32_t)(c * 131 + t));
            len[c] += user_len;
            int got = tl_generate(m, hist[c], len[c], gp, hist[c] + len[c], reply_len);
            if (got < 0) { /* a ratio from partial runs would mislead: stop with the reason */
                fprintf(stderr, "bench cache: multi-turn chat: %s\n", tl_last_error());
                tokens = -1;
                goto out;
            }
            len[c] += got;
            tokens += got;
        }
out:;
    double dt = tl_now() - t0;
    for (int c = 0; c < CONV; c++) free(hist[c]);
    return tokens < 0 ? -1 : tokens / dt;
}

/* Blocks held by n requests on prefix + 8 distinct tokens, once all have
 * their prompt in KV (decoding). */
static int blocks_for(tl_model *m, int32_t *p, int prefix, int n, int no_cache) {
    int nv = tl_model_n_vocab(m);
    tl_generate_params gp = tl_generate_default_params();
    gp.max_tokens = 4;
    gp.ignore_eos = 1;
    gp.no_cache = no_cache;
    tl_radix_evict(&m->cache, m->kv.n_blocks); /* start from an empty cache */
    if (!no_cache) tl_bench_ttft(m, p, prefix + 1, 0); /* the prefix is cached once */
    int64_t *ids = malloc((size_t)n * sizeof *ids);
    int n_ok = 0;
    for (int r = 0; r < n; r++) {
        tl_bench_fill(p + prefix, 8, nv, (uint32_t)r + 1000);
        if (tl_request_submit(m, p, prefix + 8, &gp, NULL, &ids[n_ok]) == 0) n_ok++;
    }
    for (int all = 0; !all;) {
        tl_model_step(m);
        all = 1;
        for (int r = 0; r < n_ok; r++) {
            tl_request_info ri;
            tl_request_get_info(m, ids[r], &ri);
            all &= ri.n_generated >= 1 || ri.state >= TL_REQ_DONE;
        }
    }
    tl_cache_stats st;
    tl_model_get_stats(m, &st);
    for (int r = 0; r < n_ok; r++) tl_request_release(m, ids[r]);
    free(ids);
    return st.blocks_used;
}

static void bench_memory(tl_model *m, int prefix) {
    int32_t *p = malloc((size_t)(prefix + 8) * sizeof *p);
    tl_bench_fill(p, prefix, tl_model_n_vocab(m), 5);
    int shared = blocks_for(m, p, prefix, 100, 0);
    int one = blocks_for(m, p, prefix, 1, 1);
    tl_model_info info;
    tl_model_get_info(m, &info);
    double kb = (double)info.kv_bytes / info.kv_blocks_total / 1024.0;
    printf("  KV for 100 concurrent requests on a %d-token prefix: %d blocks (%.1f MiB) with sharing vs 100 x %d = %d "
           "blocks (%.1f MiB) without -> %.1fx less\n",
           prefix, shared, shared * kb / 1024, one, 100 * one, 100 * one * kb / 1024, 100.0 * one / shared);
    free(p);
}

static void bench_radix(void) {
    enum { ENTRIES = 10000, ELEN = 64, PROMPT = 4096 };
    tl_kv_pool kv;
    tl_kv_layout layout;
    tl_kv_layout_init(&layout, TL_KVT_F16, TL_KVT_F16, 0, 16, 1, 1, 1);
    if (tl_kv_pool_init(&kv, ENTRIES * 8 + PROMPT, &layout, 1)) return;
    tl_radix t;
    tl_radix_init(&t, &kv);
    int ns = tl_radix_namespace(&t, 1, 0, 0, 1, NULL);
    tl_block_table bt = {.depth = 1};
    int32_t *prompt = malloc(PROMPT * sizeof *prompt), e[ELEN];
    tl_bench_fill(prompt, PROMPT, 30000, 3);
    double t0 = tl_now();
    for (int i = 0; i < ENTRIES; i++) {
        /* entries share stems with the prompt at various depths */
        int share = i % 17;
        memcpy(e, prompt, (size_t)share * sizeof *e);
        tl_bench_fill(e + share, ELEN - share, 30000, (uint32_t)i + 11);
        tl_block_table_reserve(&bt, &kv, ELEN);
        tl_radix_insert(&t, ns, e, ELEN, &bt, 0);
        tl_block_table_release(&bt, &kv);
        bt.depth = 1;
    }
    double ins = (tl_now() - t0) / ENTRIES;
    /* one long entry: the prompt's first 3000 tokens */
    tl_block_table_reserve(&bt, &kv, 3000);
    tl_radix_insert(&t, ns, prompt, 3000, &bt, 0);
    tl_block_table_release(&bt, &kv);
    int reps = 2000, L = 0;
    t0 = tl_now();
    for (int r = 0; r < reps; r++) L = tl_radix_match(&t, ns, prompt, PROMPT, PROMPT, NULL);
    double match = (tl_now() - t0) / reps;
    printf("  radix: longest match of a %d-token prompt (matched %d) against %lld nodes: %.1f us; insert of a "
           "%d-token entry: %.2f us\n",
           PROMPT, L, (long long)t.n_nodes, match * 1e6, ELEN, ins * 1e6);
    free(prompt);
    tl_radix_destroy(&t);
    tl_kv_pool_destroy(&kv);
}

int tl_cli_bench_cache(int n_models, const char *const *models, tl_model_params mp) {
    static const char *defaults[] = {"../shared/models/stories260K.gguf"};
    if (n_models == 0) {
        models = defaults;
        n_models = 1;
    }
    for (int i = 0; i < n_models; i++) {
        tl_model_params p = mp;
        if (!p.kv_mem) p.kv_mem = (size_t)256 << 20; /* room for 100 requests on a shared prefix */
        tl_model *m;
        if (tl_model_open(models[i], p, &m)) {
            fprintf(stderr, "bench cache: %s\n", tl_last_error());
            return 1;
        }
        tl_model_info info;
        tl_model_get_info(m, &info);
        /* Every prompt is sized to the model: the TTFT prompt and the
         * memory bench's prefix + 8 + 4 fit in max_seq_len - 64 + 32 + 1,
         * and the chat runs as many turns (up to 6) as its history fits. */
        int prefix = info.max_seq_len >= 2048 ? 1536 : info.max_seq_len - 64;
        int sys_len = info.max_seq_len >= 2048 ? 256 : info.max_seq_len / 4, user = 16, reply = 16;
        int turns = (info.max_seq_len - sys_len) / (user + reply);
        if (turns > 6) turns = 6;
        if (prefix < 32 || turns < 1) {
            fprintf(stderr, "bench cache: max_seq_len %d of %s is too short for the bench (it needs at least 96)\n",
                    info.max_seq_len, models[i]);
            tl_model_close(m);
            return 1;
        }
        const char *name = strrchr(models[i], '/') ? strrchr(models[i], '/') + 1 : models[i];
        printf("%s (max_seq_len %d, %d threads)\n", name, info.max_seq_len, info.n_threads);
        bench_ttft(m, prefix, 32);
        double cold = chat(m, 1, sys_len, turns, user, reply);
        double warm = cold < 0 ? -1 : chat(m, 0, sys_len, turns, user, reply);
        if (warm < 0) {
            tl_model_close(m);
            return 1;
        }
        printf("  multi-turn chat, 8 conversations x %d turns: %.0f tok/s cached vs %.0f uncached -> %.2fx\n", turns,
               warm, cold, warm / cold);
        bench_memory(m, prefix);
        tl_model_close(m);
    }
    bench_radix();
    return 0;
}
