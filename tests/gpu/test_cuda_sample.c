/* test_cuda_sample.c - sampling on the device (kernels/cuda/sample.cu)
 * against the engine's sampler (engine/sampler.c), which is the reference.
 *
 *   - tl_cuda_topk: the k best of each row, values and ids exactly equal to
 *     a host sort (descending, lower id first on ties), at sizes around the
 *     tournament's 2,048-entry chunks, with many ties, up to 262,144 (Gemma).
 *   - tl_cuda_sample: penalty, greedy, top-k, top-p, min-p, temperature,
 *     with the same draw u on both sides. The device's exp may differ from
 *     glibc's by an ulp, so a draw within 1e-4 (relative) of a boundary
 *     between two candidates may pick either; every other row must pick
 *     the host's token. The penalised logits must equal the host's exactly.
 *   - bad rows are rejected with TL_CUDA_ERR_ARG.
 *
 * --bench also times one sampling call of 64 rows over 262,144 logits.
 * Without a CUDA device: "SKIP: no CUDA device" and "0 passed, 0 failed". */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu_test.h"
#include "sampler.h"

static tl_cuda *ctx;
static uint64_t rng_state = 0x2545F4914F6CDD1Dull;

static uint32_t next_u32(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 32);
}

static float frand(void) { return (float)(next_u32() >> 8) / (float)(1u << 24); } /* [0, 1) */

/* Logits like a model's (a few large, a long tail); `ties` rounds them to
 * halves so many values repeat. */
static void fill_logits(float *x, int n, int ties) {
    for (int i = 0; i < n; i++) {
        float g = 0;
        for (int j = 0; j < 4; j++) g += frand() - 0.5f;
        x[i] = 3.0f * g + (frand() < 0.01f ? 6.0f * frand() : 0.0f);
        if (ties) x[i] = roundf(x[i] * 2.0f) / 2.0f;
    }
}

static void *dev_put(const void *src, size_t bytes) {
    void *d = NULL;
    if (tl_cuda_alloc(ctx, bytes, &d) != TL_CUDA_OK) return NULL;
    if (src && tl_cuda_upload(ctx, d, src, bytes) != TL_CUDA_OK) return NULL;
    return d;
}

static int cmp_cand(const void *a, const void *b) {
    const tl_cand *x = a, *y = b;
    if (x->v != y->v) return x->v < y->v ? 1 : -1;
    return x->id - y->id;
}

static void test_topk(void) {
    static const int sizes[] = {1, 5, 2047, 2048, 2049, 5000, 32000, 262144};
    static const int ks[] = {1, 7, 40, 256};
    enum { ROWS = 3 };
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        const int n = sizes[si];
        float *x = malloc(sizeof(float) * ROWS * n);
        tl_cand *ref = malloc(sizeof(tl_cand) * n);
        for (int r = 0; r < ROWS; r++) fill_logits(x + (size_t)r * n, n, r == 1);
        float *dx = dev_put(x, sizeof(float) * ROWS * n);
        float *dv = dev_put(NULL, sizeof(float) * ROWS * 256);
        int32_t *di = dev_put(NULL, sizeof(int32_t) * ROWS * 256);
        for (size_t ki = 0; ki < sizeof ks / sizeof ks[0] && dx && dv && di; ki++) {
            const int k = ks[ki];
            if (k > n) continue;
            float v[ROWS * 256];
            int32_t id[ROWS * 256];
            int rc = tl_cuda_topk(ctx, dv, di, dx, ROWS, n, k);
            if (rc == TL_CUDA_OK) rc = tl_cuda_download(ctx, v, dv, sizeof(float) * ROWS * k);
            if (rc == TL_CUDA_OK) rc = tl_cuda_download(ctx, id, di, sizeof(int32_t) * ROWS * k);
            CHECK(rc == TL_CUDA_OK, "topk n %d k %d: %s", n, k, tl_cuda_last_error());
            if (rc) continue;
            int bad = 0;
            for (int r = 0; r < ROWS; r++) {
                for (int i = 0; i < n; i++) ref[i] = (tl_cand){x[(size_t)r * n + i], i};
                qsort(ref, (size_t)n, sizeof *ref, cmp_cand);
                for (int i = 0; i < k; i++)
                    if (v[r * k + i] != ref[i].v || id[r * k + i] != ref[i].id) bad++;
            }
            CHECK(bad == 0, "topk n %d k %d (ties in row 1): %d of %d entries differ from a host sort", n, k, bad,
                  ROWS * k);
        }
        tl_cuda_dealloc(ctx, dx);
        tl_cuda_dealloc(ctx, dv);
        tl_cuda_dealloc(ctx, di);
        free(x);
        free(ref);
    }
}

typedef struct chain {
    const char *name;
    float temperature;
    int top_k;
    float top_p, min_p, repeat_penalty;
    int repeat_last_n;
} chain;

static const chain chains[] = {
    {"greedy", 0, 40, 1, 0, 1, 64},
    {"greedy+penalty", 0, 40, 1, 0, 1.3f, 64},
    {"top-k 40 T 0.8", 0.8f, 40, 1, 0, 1, 64},
    {"top-k 256 top-p 0.9", 1.0f, 256, 0.9f, 0, 1, 64},
    {"top-k 50 top-p 0.95 min-p 0.05 T 0.7", 0.7f, 50, 0.95f, 0.05f, 1, 64},
    {"top-k 1 T 1.5", 1.5f, 1, 1, 0, 1, 64},
    {"penalty 1.3 top-k 40 T 0.9", 0.9f, 40, 1, 0, 1.3f, 32},
    {"penalty 0.8 (boosts) top-k 8 T 2", 2.0f, 8, 1, 0, 0.8f, -1},
};

/* One configuration: ROWS rows cycling through the chains. */
static void test_sample_vocab(int n_vocab, int ties) {
    enum { ROWS = 32, HIST = 80 };
    const int nc = (int)(sizeof chains / sizeof chains[0]);
    float *x = malloc(sizeof(float) * ROWS * n_vocab), *pen_ref = malloc(sizeof(float) * ROWS * n_vocab);
    float *scratch = malloc(sizeof(float) * n_vocab), *back = malloc(sizeof(float) * ROWS * n_vocab);
    int32_t hist[ROWS][HIST], pen[ROWS * HIST], ids[ROWS];
    tl_cuda_sample_row rows[ROWS];
    int expect[ROWS], alt_lo[ROWS], alt_hi[ROWS], n_pen = 0;
    for (int r = 0; r < ROWS; r++) {
        const chain *c = &chains[r % nc];
        float *xr = x + (size_t)r * n_vocab;
        fill_logits(xr, n_vocab, ties && r % 2);
        for (int i = 0; i < HIST; i++) hist[r][i] = (int32_t)(next_u32() % (uint32_t)(i < 40 ? 50 : n_vocab));
        tl_sampling_params sp = {0};
        sp.temperature = c->temperature;
        sp.top_k = c->top_k < n_vocab ? c->top_k : n_vocab;
        sp.top_p = c->top_p;
        sp.min_p = c->min_p;
        sp.repeat_penalty = c->repeat_penalty;
        sp.repeat_last_n = c->repeat_last_n;
        tl_sampler s;
        if (tl_sampler_init(&s, &sp, n_vocab) != TL_OK) {
            CHECK(0, "tl_sampler_init: %s", tl_last_error());
            goto out;
        }
        const float u = frand();
        const float u_lo = u * (1 - 1e-4f), u_hi = fminf(u * (1 + 1e-4f), 0.99999994f);
        memcpy(scratch, xr, sizeof(float) * n_vocab);
        expect[r] = tl_sampler_sample_u(&s, scratch, hist[r], HIST, u);
        memcpy(pen_ref + (size_t)r * n_vocab, scratch, sizeof(float) * n_vocab); /* penalised (sorting is on idx) */
        memcpy(scratch, xr, sizeof(float) * n_vocab);
        alt_lo[r] = tl_sampler_sample_u(&s, scratch, hist[r], HIST, u_lo);
        memcpy(scratch, xr, sizeof(float) * n_vocab);
        alt_hi[r] = tl_sampler_sample_u(&s, scratch, hist[r], HIST, u_hi);
        rows[r] = (tl_cuda_sample_row){.top_k = sp.top_k, .temperature = sp.temperature, .top_p = sp.top_p,
                                       .min_p = sp.min_p, .repeat_penalty = sp.repeat_penalty, .u = u,
                                       .pen_off = n_pen};
        rows[r].pen_len = tl_sampler_penalty_ids(&s, hist[r], HIST, pen + n_pen);
        n_pen += rows[r].pen_len;
        tl_sampler_free(&s);
    }
    float *dx = dev_put(x, sizeof(float) * ROWS * n_vocab);
    CHECK(dx != NULL, "upload: %s", tl_cuda_last_error());
    if (!dx) goto out;
    int rc = tl_cuda_sample(ctx, ids, dx, ROWS, n_vocab, rows, pen, n_pen);
    CHECK(rc == TL_CUDA_OK, "tl_cuda_sample vocab %d: %s", n_vocab, tl_cuda_last_error());
    if (rc == TL_CUDA_OK) {
        int bad = 0, edge = 0;
        for (int r = 0; r < ROWS; r++) {
            const int decisive = alt_lo[r] == expect[r] && alt_hi[r] == expect[r];
            if (ids[r] == expect[r]) continue;
            if (!decisive && (ids[r] == alt_lo[r] || ids[r] == alt_hi[r])) {
                edge++;
                continue;
            }
            bad++;
            printf("  vocab %d row %d (%s): device %d, host %d\n", n_vocab, r, chains[r % nc].name, ids[r],
                   expect[r]);
        }
        CHECK(bad == 0, "vocab %d%s: %d of %d rows sampled differently from the host (%d at a draw boundary)",
              n_vocab, ties ? " (ties)" : "", bad, ROWS, edge);
        rc = tl_cuda_download(ctx, back, dx, sizeof(float) * ROWS * n_vocab);
        int diff = 0;
        for (size_t i = 0; rc == TL_CUDA_OK && i < (size_t)ROWS * n_vocab; i++) diff += back[i] != pen_ref[i];
        CHECK(rc == TL_CUDA_OK && diff == 0, "vocab %d: penalised logits equal the host's (%d differ)", n_vocab,
              diff);
    }
    tl_cuda_dealloc(ctx, dx);
out:
    free(x);
    free(pen_ref);
    free(scratch);
    free(back);
}

static void test_errors(void) {
    float x[64] = {0};
    int32_t id = -1, bad_pen = 64;
    float *dx = dev_put(x, sizeof x);
    tl_cuda_sample_row r = {.top_k = 0, .temperature = 1.0f, .top_p = 1, .u = 0.5f};
    int rc = tl_cuda_sample(ctx, &id, dx, 1, 64, &r, NULL, 0);
    CHECK(rc == TL_CUDA_ERR_ARG && strstr(tl_cuda_last_error(), "top_k"), "top_k 0 with a temperature: %s",
          tl_cuda_last_error());
    r.top_k = 8;
    r.u = 1.0f;
    rc = tl_cuda_sample(ctx, &id, dx, 1, 64, &r, NULL, 0);
    CHECK(rc == TL_CUDA_ERR_ARG && strstr(tl_cuda_last_error(), "u "), "u = 1: %s", tl_cuda_last_error());
    r.u = 0.5f;
    r.pen_len = 1;
    r.repeat_penalty = 1.1f;
    rc = tl_cuda_sample(ctx, &id, dx, 1, 64, &r, &bad_pen, 1);
    CHECK(rc == TL_CUDA_ERR_ARG && strstr(tl_cuda_last_error(), "64"), "penalty id outside the vocab: %s",
          tl_cuda_last_error());
    CHECK(tl_cuda_sync(ctx) == TL_CUDA_OK, "the context works after rejected calls");
    tl_cuda_dealloc(ctx, dx);
}

static void bench(void) {
    enum { ROWS = 64, NV = 262144 };
    float *x = malloc(sizeof(float) * ROWS * NV);
    for (int r = 0; r < ROWS; r++) fill_logits(x + (size_t)r * NV, NV, 0);
    float *dx = dev_put(x, sizeof(float) * ROWS * NV);
    tl_cuda_sample_row rows[ROWS];
    int32_t ids[ROWS];
    for (int r = 0; r < ROWS; r++)
        rows[r] = (tl_cuda_sample_row){.top_k = 40, .temperature = 0.8f, .top_p = 0.95f, .u = frand()};
    const char *what[] = {"top-k 40", "greedy"};
    for (int g = 0; g < 2 && dx; g++) {
        if (g) for (int r = 0; r < ROWS; r++) rows[r].temperature = 0;
        tl_cuda_sample(ctx, ids, dx, ROWS, NV, rows, NULL, 0);
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        int rc = 0;
        for (int i = 0; i < 20; i++) rc |= tl_cuda_sample(ctx, ids, dx, ROWS, NV, rows, NULL, 0);
        clock_gettime(CLOCK_MONOTONIC, &b);
        double us = ((b.tv_sec - a.tv_sec) * 1e6 + (b.tv_nsec - a.tv_nsec) / 1e3) / 20;
        printf("BENCH sample %s: %d rows x %d logits %.1f us per call (%.0f bytes to the host vs %.0f MB of logits)%s\n",
               what[g], ROWS, NV, us, (double)ROWS * 4, (double)ROWS * NV * 4 / 1e6, rc ? " ERROR" : "");
    }
    tl_cuda_dealloc(ctx, dx);
    free(x);
}

int main(int argc, char **argv) {
    if (!gpu_test_open(&ctx)) return test_summary();
    test_topk();
    test_sample_vocab(200, 0);
    test_sample_vocab(32000, 0);
    test_sample_vocab(32000, 1);
    test_sample_vocab(262144, 0);
    test_errors();
    if (argc > 1 && strcmp(argv[1], "--bench") == 0) bench();
    tl_cuda_free(ctx);
    return test_summary();
}
