/* test_backend.c - the engine's side of the backend plugin interface, on
 * any machine, through tests/c/fake_backend (a plugin whose logits hash
 * the KV a sequence reads through its block table; see that file):
 *   - TINYLOOP_BACKEND=cuda with TINYLOOP_CUDA_LIB naming a plugin loads it;
 *     without kv_mem the arena is what the plugin reports (kv_auto);
 *   - the prefix cache on a backend: cached == uncached after prefixes of
 *     the prompt minus 0/1/15/16/17/100 tokens were cached, and a second
 *     continuation of each cached prefix still sees intact blocks
 *     (copy-on-write went through copy_block);
 *   - device sampling: eight requests with different chains batched ==
 *     each alone, and == the same requests sampled on the host
 *     (FAKE_BACKEND_NO_SAMPLING=1), so the parameters, the draws and the
 *     penalty ids the scheduler sends reproduce the host's chain;
 *   - a request with a cache_window never reads released blocks;
 *   - KV tiers through kv_io: a prompt evicted from a small arena to the
 *     host tier comes back from it and gives the uncached tokens; a
 *     plugin without kv_io refuses tiers, naming itself; a failing
 *     kv_io leaves the prompt to be recomputed;
 *   - a failing forward fails its request with the plugin's message and
 *     the model keeps serving; a sampled id outside the vocab fails its
 *     request naming the id;
 *   - auto mode (TINYLOOP_BACKEND unset) tries a plugin named by
 *     TINYLOOP_CUDA_LIB even on a machine without an NVIDIA device node
 *     (tests/cli/test_cli.sh checks that the default plugin is not). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ref_cases.h"
#include "test.h"
#include "tinyloop.h"

static char model_path[512];

static tl_model *open_fake_mp(int no_sampling, int fail_at, tl_model_params mp) {
    setenv("TINYLOOP_BACKEND", "cuda", 1);
    setenv("TINYLOOP_CUDA_LIB", "build/tests/libtl-fake-backend.so", 1);
    setenv("FAKE_BACKEND_NO_SAMPLING", no_sampling ? "1" : "0", 1);
    char fa[16];
    snprintf(fa, sizeof fa, "%d", fail_at);
    setenv("FAKE_BACKEND_FAIL_AT", fa, 1);
    tl_model *m = NULL;
    int rc = tl_model_open(model_path, mp, &m);
    CHECK(rc == TL_OK, "the model opens on the fake backend: %s", tl_last_error());
    setenv("TINYLOOP_BACKEND", "cpu", 1);
    return rc == TL_OK ? m : NULL;
}

static tl_model *open_fake(int no_sampling, int fail_at, size_t kv_mem) {
    tl_model_params mp = tl_model_default_params();
    mp.max_seq_len = 512;
    mp.kv_mem = kv_mem;
    return open_fake_mp(no_sampling, fail_at, mp);
}

/* prompts of ids in [3, 503) (stories260K has 512) */
static void fill(int32_t *t, int n, uint32_t seed) { ref_fill_tokens(t, n, 503, seed); }

static void test_open_and_kv(void) {
    tl_model *m = open_fake(0, 0, 0);
    if (!m) return;
    tl_model_info info;
    tl_model_get_info(m, &info);
    CHECK(strcmp(info.backend, "fake") == 0, "the plugin named by TINYLOOP_CUDA_LIB serves (%s)", info.backend);
    int seq_blocks = (512 + info.kv_block_size - 1) / info.kv_block_size * info.n_layer;
    CHECK(info.kv_blocks_total == 1024 * seq_blocks,
          "without kv_mem the arena is the plugin's (%d blocks = 1,024 sequences of %d)", info.kv_blocks_total,
          seq_blocks);
    tl_model_close(m);
    m = open_fake(0, 0, (size_t)4 << 20);
    if (!m) return;
    tl_model_get_info(m, &info);
    CHECK(info.kv_bytes <= ((size_t)4 << 20) && info.kv_blocks_total < 1024 * seq_blocks,
          "kv_mem sizes the arena (%d blocks)", info.kv_blocks_total);
    tl_model_close(m);
}

static void test_cache(void) {
    static const int suffixes[] = {0, 1, 15, 16, 17, 100};
    enum { N = 300, GEN = 12 };
    tl_model *m = open_fake(0, 0, 0);
    if (!m) return;
    for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
        int s = suffixes[i];
        int32_t p[N], ref[GEN], got[GEN], one[1];
        fill(p, N, 40 + (uint32_t)i);
        int nr = ref_generate(m, p, N, GEN, 1, NULL, ref);
        ref_generate(m, p, N - s, 1, 0, NULL, one); /* caches the prefix */
        tl_cache_stats a, b;
        tl_model_get_stats(m, &a);
        int ng = ref_generate(m, p, N, GEN, 0, NULL, got);
        tl_model_get_stats(m, &b);
        long saved = (long)(b.prefill_tokens_saved - a.prefill_tokens_saved);
        CHECK(saved == (s == 0 ? N - 1 : N - s), "suffix %d: %ld prompt tokens came from the cache", s, saved);
        CHECK(nr == GEN && ref_same_ids(got, ng, ref, nr), "suffix %d: cached == uncached (first difference at %d)",
              s, ref_first_diff(got, ng, ref, nr));
        /* another continuation of the cached prefix: its blocks are intact */
        fill(p + N - s - 1, s + 1, 900 + (uint32_t)i);
        nr = ref_generate(m, p, N, GEN, 1, NULL, ref);
        ng = ref_generate(m, p, N, GEN, 0, NULL, got);
        CHECK(ref_same_ids(got, ng, ref, nr), "suffix %d: a second continuation == uncached (first difference at %d)",
              s, ref_first_diff(got, ng, ref, nr));
    }
    tl_model_close(m);
}

enum { R = 8, RGEN = 30 };

static void chains(tl_generate_params *gp, int32_t prompts[R][64], int *n_prompt) {
    for (int r = 0; r < R; r++) {
        gp[r] = tl_generate_default_params();
        gp[r].max_tokens = RGEN;
        gp[r].ignore_eos = 1;
        gp[r].no_cache = r % 2;
        tl_sampling_params *s = &gp[r].sampling;
        s->seed = 500 + (uint64_t)r;
        switch (r % 4) {
        case 0: s->repeat_penalty = r ? 1.5f : 1.0f; s->repeat_last_n = 8; break; /* greedy */
        case 1: s->temperature = 0.8f, s->top_k = 40, s->top_p = 0.9f; break;
        case 2: /* request 2 on the device, request 6 (top_k past 256) on the host */
            s->temperature = 1.2f, s->top_k = r == 2 ? 200 : 300, s->min_p = 0.02f, s->repeat_penalty = 1.3f;
            s->repeat_last_n = -1;
            break;
        case 3: s->temperature = 0.7f, s->top_k = 0; break; /* the whole vocab: the host samples */
        }
        n_prompt[r] = 6 + 5 * r;
        fill(prompts[r], n_prompt[r], 700 + (uint32_t)r);
    }
}

static void run_alone(tl_model *m, const tl_generate_params *gp, int32_t prompts[R][64], const int *n_prompt,
                      int32_t out[R][RGEN], int *n_out) {
    for (int r = 0; r < R; r++) n_out[r] = tl_generate(m, prompts[r], n_prompt[r], gp[r], out[r], RGEN);
}

static void test_sampling(void) {
    tl_generate_params gp[R];
    int32_t prompts[R][64], alone[R][RGEN], host[R][RGEN], batch[R][RGEN];
    int n_prompt[R], n_alone[R], n_host[R], n_batch[R];
    int64_t ids[R];
    chains(gp, prompts, n_prompt);
    tl_model *m = open_fake(0, 0, 0), *h = open_fake(1, 0, 0);
    if (!m || !h) goto out;
    run_alone(m, gp, prompts, n_prompt, alone, n_alone);
    run_alone(h, gp, prompts, n_prompt, host, n_host);
    int ok = 1;
    for (int r = 0; r < R && ok; r++) ok = tl_request_submit(m, prompts[r], n_prompt[r], &gp[r], NULL, &ids[r]) == 0;
    CHECK(ok, "8 requests submitted: %s", tl_last_error());
    while (ok && tl_model_step(m) > 0) {
    }
    for (int r = 0; r < R; r++) {
        int fin = 0;
        n_batch[r] = ok ? tl_request_take(m, ids[r], batch[r], RGEN, &fin) : -1;
        if (ok) tl_request_release(m, ids[r]);
        CHECK(n_alone[r] == RGEN && ref_same_ids(alone[r], n_alone[r], host[r], n_host[r]),
              "request %d (chain %d): sampled by the backend == sampled on the host (first difference at %d)", r,
              r % 4, ref_first_diff(alone[r], n_alone[r], host[r], n_host[r]));
        CHECK(ref_same_ids(batch[r], n_batch[r], alone[r], n_alone[r]),
              "request %d (chain %d): in a batch of 8 == alone (first difference at %d)", r, r % 4,
              ref_first_diff(batch[r], n_batch[r], alone[r], n_alone[r]));
    }
    int32_t other[RGEN];
    tl_generate_params g = gp[1];
    g.sampling.seed = 99;
    int no = tl_generate(m, prompts[1], n_prompt[1], g, other, RGEN);
    CHECK(!ref_same_ids(other, no, alone[1], n_alone[1]), "another seed gives other tokens");
out:
    tl_model_close(m);
    tl_model_close(h);
}

static void test_window_and_failure(void) {
    tl_model *m = open_fake(0, 0, 0);
    if (m) {
        int32_t p[40], out[200];
        fill(p, 40, 3);
        tl_generate_params gp = tl_generate_default_params();
        gp.max_tokens = 200;
        gp.ignore_eos = 1;
        gp.cache_window = 48;
        int n = tl_generate(m, p, 40, gp, out, 200);
        CHECK(n == 200, "a 48-token cache_window request runs 240 positions without reading released blocks (%d: %s)",
              n, n < 0 ? tl_last_error() : "");
        tl_model_close(m);
    }
    m = open_fake(0, 2, 0);
    if (m) {
        int32_t p[20], out[8];
        fill(p, 20, 5);
        int n = ref_generate(m, p, 20, 8, 0, NULL, out);
        CHECK(n == TL_ERR_STATE && strstr(tl_last_error(), "injected failure at forward"),
              "a failing forward fails the request with the plugin's message (%d: %s)", n, tl_last_error());
        n = ref_generate(m, p, 20, 8, 0, NULL, out);
        CHECK(n == 8, "the model serves the next request (%d: %s)", n, n < 0 ? tl_last_error() : "");
        tl_model_close(m);
    }
    setenv("FAKE_BACKEND_BAD_IDS", "1", 1);
    m = open_fake(0, 0, 0);
    unsetenv("FAKE_BACKEND_BAD_IDS");
    if (m) {
        int32_t p[20], out[8];
        fill(p, 20, 6);
        int n = ref_generate(m, p, 20, 8, 0, NULL, out);
        CHECK(n == TL_ERR_STATE && strstr(tl_last_error(), "sampled token id 512, outside the vocab [0, 512)"),
              "a token id outside the vocab from the backend fails the request, naming it (%d: %s)", n,
              tl_last_error());
        tl_model_close(m);
    }
}

/* A pool entry registered through the non-blocking path on a backend that
 * samples on its device keeps its last logits on the host, so a prompt
 * equal to it prefills nothing and gives the computed tokens. */
static void test_pool_full_match(void) {
    enum { N = 40, GEN = 8 };
    tl_model *m = open_fake(0, 0, 0);
    if (!m) return;
    int32_t p[N], ref[GEN], out[N + GEN];
    fill(p, N, 77);
    int nr = ref_generate(m, p, N, GEN, 1, NULL, ref);
    tl_pool *pool;
    tl_pool_new(2, &pool);
    int64_t id;
    int rc = tl_pool_register_submit(m, pool, p, N, 0, 0, &id);
    while (rc == TL_OK && tl_model_step(m) > 0) {
    }
    tl_request_release(m, id);
    tl_cache_stats s0, s1;
    tl_model_get_stats(m, &s0);
    tl_generate_params gp = tl_generate_default_params();
    gp.max_tokens = GEN;
    gp.ignore_eos = 1;
    int n = tl_generate_with_pool(m, pool, p, N, gp, out, N + GEN);
    tl_model_get_stats(m, &s1);
    CHECK(rc == TL_OK && nr == GEN && n == N + GEN && !memcmp(out + N, ref, sizeof ref),
          "a full match of a registered entry on the backend gives the computed tokens");
    CHECK(s1.prefill_tokens == s0.prefill_tokens, "... and prefills nothing (%lld tokens)",
          (long long)(s1.prefill_tokens - s0.prefill_tokens));
    tl_pool_free(pool);
    tl_model_close(m);
}

/* The KV tiers on a backend with its own arena: spills and restores go
 * through ops->kv_io (the engine stages blocks on the host). An arena of
 * two prompts' worth: five more prompts push the first out to the host
 * tier, and the first again comes back from it. */
static void test_tiers(void) {
    enum { P = 64, G = 8, N_OTHER = 5 };
    tl_model *m = open_fake(0, 0, 0);
    if (!m) return;
    tl_model_info info;
    tl_model_get_info(m, &info);
    int32_t pr[1 + N_OTHER][P], ref[G], out[G];
    for (int i = 0; i <= N_OTHER; i++) fill(pr[i], P, 1300 + (uint32_t)i);
    int nr = ref_generate(m, pr[0], P, G, 1, NULL, ref);
    tl_model_close(m);
    tl_model_params mp = tl_model_default_params();
    mp.max_seq_len = 512;
    mp.kv_mem = (size_t)2 * ((P + G + 15) / 16 * 16) * info.kv_token_bytes;
    mp.kv_host_mem = (size_t)1 << 20;
    m = open_fake_mp(0, 0, mp);
    if (!m) return;
    tl_model_get_info(m, &info);
    int ok = ref_generate(m, pr[0], P, G, 0, NULL, out) == G && ref_same_ids(out, G, ref, nr);
    for (int i = 1; i <= N_OTHER; i++) ok &= ref_generate(m, pr[i], P, G, 0, NULL, out) == G;
    tl_cache_stats a, b;
    tl_model_get_stats(m, &a);
    CHECK(ok && a.evictions > 0 && a.tier_spills[0] > 0,
          "tiers on the backend: %d prompts through a %d-block arena evict and spill to the host (%lld evictions, "
          "%lld blocks spilled; %s)",
          1 + N_OTHER, info.kv_blocks_total, (long long)a.evictions, (long long)a.tier_spills[0], tl_last_error());
    int n = ref_generate(m, pr[0], P, G, 0, NULL, out);
    tl_model_get_stats(m, &b);
    CHECK(nr == G && ref_same_ids(out, n, ref, nr),
          "tiers on the backend: the first prompt again gives the uncached tokens (first difference at %d; %s)",
          ref_first_diff(out, n, ref, nr), n < 0 ? tl_last_error() : "");
    CHECK(b.tier_hits[0] > a.tier_hits[0] && b.tier_restored_tokens > a.tier_restored_tokens,
          "tiers on the backend: its blocks came back through kv_io (%lld blocks, %lld tokens restored)",
          (long long)(b.tier_hits[0] - a.tier_hits[0]), (long long)(b.tier_restored_tokens - a.tier_restored_tokens));
    printf("  tiers on the fake backend: %d blocks, %lld evictions, %lld blocks spilled, %lld restored (%lld tokens)\n",
           info.kv_blocks_total, (long long)b.evictions, (long long)b.tier_spills[0],
           (long long)(b.tier_hits[0] - a.tier_hits[0]), (long long)(b.tier_restored_tokens - a.tier_restored_tokens));
    tl_model_close(m);

    setenv("FAKE_BACKEND_IO_FAIL", "1", 1);
    m = open_fake_mp(0, 0, mp);
    unsetenv("FAKE_BACKEND_IO_FAIL");
    if (m) {
        for (int i = 1; i <= N_OTHER; i++) ref_generate(m, pr[i], P, G, 0, NULL, out);
        ref_generate(m, pr[0], P, G, 0, NULL, out);
        for (int i = 1; i <= N_OTHER; i++) ref_generate(m, pr[i], P, G, 0, NULL, out);
        n = ref_generate(m, pr[0], P, G, 0, NULL, out);
        tl_model_get_stats(m, &b);
        CHECK(ref_same_ids(out, n, ref, nr) && b.tier_spills[0] > 0 && b.tier_restored_tokens == 0,
              "a kv_io that fails into the arena restores nothing and the prompt is recomputed (%lld restored; %s)",
              (long long)b.tier_restored_tokens, n < 0 ? tl_last_error() : "");
        tl_model_close(m);
    }

    setenv("TINYLOOP_BACKEND", "cuda", 1);
    setenv("FAKE_BACKEND_NO_KV_IO", "1", 1);
    m = NULL;
    int rc = tl_model_open(model_path, mp, &m);
    unsetenv("FAKE_BACKEND_NO_KV_IO");
    setenv("TINYLOOP_BACKEND", "cpu", 1);
    CHECK(rc == TL_ERR_UNSUPPORTED && !m && strstr(tl_last_error(), "the fake backend cannot copy KV blocks"),
          "a plugin without kv_io refuses KV tiers, naming the backend (%d: %s)", rc, tl_last_error());
    tl_model_close(m);
}

static void test_auto_mode(void) {
    tl_model_params mp = tl_model_default_params();
    mp.max_seq_len = 512;
    unsetenv("TINYLOOP_BACKEND");
    setenv("TINYLOOP_CUDA_LIB", "build/tests/libtl-fake-backend.so", 1);
    tl_model *m = NULL;
    int rc = tl_model_open(model_path, mp, &m);
    tl_model_info info = {0};
    if (rc == TL_OK) tl_model_get_info(m, &info);
    CHECK(rc == TL_OK && info.backend && strcmp(info.backend, "fake") == 0,
          "auto mode tries the plugin TINYLOOP_CUDA_LIB names (%d, %s)", rc, info.backend ? info.backend : "?");
    tl_model_close(m);
    setenv("TINYLOOP_BACKEND", "cpu", 1);
}

int main(void) {
    const char *shared = test_shared_dir();
    if (!shared) {
        printf("SKIP: ../shared/models/stories260K.gguf not found (set TINYLOOP_SHARED)\n");
        return test_summary();
    }
    snprintf(model_path, sizeof model_path, "%s/models/stories260K.gguf", shared);
    test_open_and_kv();
    test_cache();
    test_sampling();
    test_window_and_failure();
    test_pool_full_match();
    test_tiers();
    test_auto_mode();
    return test_summary();
}
