/* test_cuda_tiers.c - the KV tiers (engine/cache_tier.c) on the CUDA
 * backend: blocks leave the device arena and come back through the
 * plugin's kv_io (a copy stream and page-locked staging, tl_cuda_io).
 * stories260K in the exact mode (batch-invariant kernels), so a restored
 * prefix must give exactly the tokens of the backend's own uncached run.
 *
 *   1. tl_cuda_io round trip: host -> device -> host gives the bytes back,
 *      ordered after work queued on the context's stream.
 *   2. host tier: prompts through an arena of two prompts' worth evict the
 *      first; the first again comes back from host RAM (tier_hits[0]) with
 *      the uncached tokens.
 *   3. disk tier (kv_dir a mkdtemp directory): the same from block files
 *      (tier_hits[1]); then save_cache, close, reopen on the directory:
 *      the prompt still in the arena at the close hits (hit_tokens) with
 *      the same tokens.
 *
 * Without a CUDA device: "SKIP: no CUDA device" and "0 passed, 0 failed". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref_cases.h"
#include "test.h"
#include "tinyloop.h"
#include "tl_cuda.h"

/* The plugin the engine loads (the emulation's build names its own). */
#ifndef TL_CUDA_PLUGIN
#define TL_CUDA_PLUGIN "build/libtinyloop-cuda.so"
#endif

/* 72-token prompts (4.5 blocks of 16) and 8 tokens each: 5 blocks per
 * layer, so an arena of 10 holds two requests and the third evicts. */
enum { N_PROMPTS = 4, P = 72, G = 8 };

static char model_path[512];
static int32_t prompts[N_PROMPTS][P], expect[N_PROMPTS][G];
static size_t token_bytes;

static tl_model *open_cuda(size_t kv_mem, size_t host, const char *dir) {
    setenv("TINYLOOP_BACKEND", "cuda", 1);
    setenv("TINYLOOP_CUDA_EXACT", "1", 1);
    tl_model_params mp = tl_model_default_params();
    mp.kv_mode = "f16";
    mp.kv_mem = kv_mem;
    mp.kv_host_mem = host;
    mp.kv_dir = dir;
    tl_model *m = NULL;
    int rc = tl_model_open(model_path, mp, &m);
    CHECK(rc == TL_OK, "stories260K opens on cuda (host tier %zu bytes, kv_dir %s): %s", host, dir ? dir : "none",
          tl_last_error());
    if (rc != TL_OK) return NULL;
    tl_model_info info;
    tl_model_get_info(m, &info);
    CHECK(strcmp(info.backend, "cuda") == 0, "it runs on cuda (got %s)", info.backend);
    token_bytes = info.kv_token_bytes;
    return m;
}

static size_t small_arena(void) { return (size_t)2 * ((P + G + 15) / 16 * 16) * token_bytes; }

static tl_cache_stats stats(tl_model *m) {
    tl_cache_stats st;
    tl_model_get_stats(m, &st);
    return st;
}

static int gen_same(tl_model *m, int i) {
    int32_t out[G];
    int n = ref_generate(m, prompts[i], P, G, 0, NULL, out);
    return ref_same_ids(out, n, expect[i], G);
}

static void io_round_trip(void) {
    tl_cuda *c = NULL;
    if (tl_cuda_init(0, &c) != TL_CUDA_OK) {
        CHECK(0, "tl_cuda_init(0): %s", tl_cuda_last_error());
        return;
    }
    enum { N = 3000 };
    uint8_t in[N], out[N], *d = NULL, *d2 = NULL;
    for (int i = 0; i < N; i++) in[i] = (uint8_t)(i * 7 + 3);
    int ok = tl_cuda_alloc(c, N, (void **)&d) == TL_CUDA_OK && tl_cuda_alloc(c, N, (void **)&d2) == TL_CUDA_OK;
    /* a short copy first: the staging grows for the long one */
    ok = ok && tl_cuda_io(c, d, in, 100, 1) == TL_CUDA_OK && tl_cuda_io(c, d, in, N, 1) == TL_CUDA_OK;
    /* a copy queued on the compute stream, then a tier read of its destination */
    ok = ok && tl_cuda_copy(c, d2, d, N) == TL_CUDA_OK && tl_cuda_io(c, d2, out, N, 0) == TL_CUDA_OK;
    CHECK(ok && !memcmp(in, out, N), "tl_cuda_io: host -> device, a device copy, device -> host gives the bytes (%s)",
          ok ? "" : tl_cuda_last_error());
    memset(out, 0, N);
    ok = tl_cuda_io(c, d2, out, 100, 0) == TL_CUDA_OK;
    CHECK(ok && !memcmp(in, out, 100) && out[100] == 0, "tl_cuda_io: a shorter copy moves only its bytes");
    CHECK(tl_cuda_io(c, NULL, out, 10, 0) == TL_CUDA_ERR_ARG && strstr(tl_cuda_last_error(), "bad arguments"),
          "tl_cuda_io refuses a NULL pointer (%s)", tl_cuda_last_error());
    tl_cuda_dealloc(c, d);
    tl_cuda_dealloc(c, d2);
    tl_cuda_free(c);
}

/* Prompts 0..3, then 0 again: the last must come up from `tier`. */
static void evict_and_return(tl_model *m, const char *what, int tier) {
    int ok = 1;
    for (int i = 0; i < N_PROMPTS; i++) ok &= gen_same(m, i);
    tl_cache_stats a = stats(m);
    CHECK(ok && a.evictions > 0 && a.tier_spills[tier] > 0,
          "%s: %d prompts through a two-request arena give the uncached tokens, evict and spill (%lld evictions, "
          "%lld spilled; %s)",
          what, N_PROMPTS, (long long)a.evictions, (long long)a.tier_spills[tier], tl_last_error());
    ok = gen_same(m, 0);
    tl_cache_stats b = stats(m);
    CHECK(ok, "%s: the first prompt again gives the uncached tokens (%s)", what, tl_last_error());
    CHECK(b.tier_hits[tier] > a.tier_hits[tier] && b.tier_restored_tokens > a.tier_restored_tokens &&
              b.hit_tokens > a.hit_tokens,
          "%s: its blocks came back to the device (%lld blocks, %lld tokens restored)", what,
          (long long)(b.tier_hits[tier] - a.tier_hits[tier]),
          (long long)(b.tier_restored_tokens - a.tier_restored_tokens));
    printf("  %s: %lld evictions, %lld blocks spilled, %lld restored (%lld tokens)\n", what, (long long)b.evictions,
           (long long)b.tier_spills[tier], (long long)(b.tier_hits[tier] - a.tier_hits[tier]),
           (long long)(b.tier_restored_tokens - a.tier_restored_tokens));
}

static void host_tier(void) {
    tl_model *m = open_cuda(small_arena(), (size_t)1 << 20, NULL);
    if (!m) return;
    evict_and_return(m, "host tier", 0);
    tl_model_close(m);
}

static void disk_tier_and_restart(const char *dir) {
    tl_model *m = open_cuda(small_arena(), 0, dir);
    if (!m) return;
    evict_and_return(m, "disk tier", 1);
    /* prompt 3 is still in the arena only: save_cache writes it out */
    int saved = tl_model_save_cache(m, NULL);
    CHECK(saved > 0, "save_cache writes the arena's full blocks to the disk tier (%d: %s)", saved,
          saved < 0 ? tl_last_error() : "");
    tl_model_close(m);

    m = open_cuda(small_arena(), 0, dir);
    if (!m) return;
    int ok = gen_same(m, N_PROMPTS - 1);
    tl_cache_stats st = stats(m);
    CHECK(ok, "after a restart the saved prompt gives the uncached tokens (%s)", tl_last_error());
    CHECK(st.hit_tokens >= 64 && st.tier_hits[1] > 0,
          "after a restart the saved prompt hits blocks from disk (%lld hit tokens, %lld blocks from disk)",
          (long long)st.hit_tokens, (long long)st.tier_hits[1]);
    tl_model_close(m);
}

int main(void) {
    int n_dev = 0;
    tl_cuda_device_count(&n_dev);
    if (n_dev < 1) {
        printf("SKIP: no CUDA device\n");
        return test_summary();
    }
    setenv("TINYLOOP_CUDA_LIB", TL_CUDA_PLUGIN, 0);
    unsetenv("TINYLOOP_KV_DIR");
    unsetenv("TINYLOOP_KV_HOST_MEM");
    unsetenv("TINYLOOP_KV_DISK_MEM");
    double t0 = tl_clock();
    io_round_trip();
    const char *shared = test_shared_dir();
    if (!shared) {
        printf("SKIP stories260K checks: ../shared/models/stories260K.gguf not found (set TINYLOOP_SHARED)\n");
        return test_summary();
    }
    snprintf(model_path, sizeof model_path, "%s/models/stories260K.gguf", shared);
    tl_model *m = open_cuda(0, 0, NULL);
    if (!m) return test_summary();
    int ok = 1;
    for (int i = 0; i < N_PROMPTS; i++) {
        ref_fill_tokens(prompts[i], P, 512, 2100 + (uint32_t)i);
        ok &= ref_generate(m, prompts[i], P, G, 1, NULL, expect[i]) == G;
    }
    CHECK(ok, "the uncached runs on cuda give %d tokens each (%s)", G, tl_last_error());
    tl_model_close(m);

    char dir[] = "/tmp/tl_cuda_tiers_XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "a temporary directory for the disk tier");
    host_tier();
    disk_tier_and_restart(dir);
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0, "the disk tier's directory is removed (%s)", dir);
    printf("  time: %.1f s\n", tl_clock() - t0);
    return test_summary();
}
