/* test_cuda_graph.c - tl_cuda_graph_run, the CUDA graph cache behind the
 * plugin's decode steps: a replay equals eager launches bit for bit and
 * reads device data afresh; it freezes the host values of its capture
 * (which is why the key must cover them); growing a scratch buffer forgets
 * the graphs that used it; a capture that meets a host wait fails, turns
 * graphs off and the work still runs; the LRU table stays correct past
 * its size. Without a CUDA device: "SKIP: no CUDA device". */
#include <stdint.h>
#include <string.h>

#include "gpu_test.h"
#include "quants.h"

static tl_cuda *ctx;

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;
static float frand(void) { return gpu_frand(&rng_state); }

enum { N_IN = 64, N_OUT = 48, MAX_T = 40 };

/* rmsnorm (eps: a host value) then a Q8_0 matmul of T rows: T >= 9 takes
 * the cuBLAS path, whose f16 scratch buffers grow with T. */
typedef struct job {
    const float *x, *norm_w;
    const void *w;
    float *y, *out;
    int T;
    float eps;
    int wait_inside; /* a host wait in the middle: no capture can hold it */
    int broken;      /* a launcher refuses its arguments, eagerly as in a capture */
} job;

static int enqueue(void *arg) {
    const job *j = (const job *)arg;
    int rc = tl_cuda_rmsnorm(ctx, j->y, j->x, j->norm_w, j->T, N_IN, j->eps);
    if (rc == TL_CUDA_OK && j->wait_inside) rc = tl_cuda_sync(ctx);
    if (rc == TL_CUDA_OK)
        rc = tl_cuda_matmul(ctx, j->out, j->y, j->w, j->broken ? 99 : TL_TYPE_Q8_0, N_IN, N_OUT, j->T);
    return rc;
}

static float *dev_floats(size_t n) {
    void *d = NULL;
    int rc = tl_cuda_alloc(ctx, n * sizeof(float), &d);
    CHECK(rc == TL_CUDA_OK, "alloc %zu floats: %s", n, tl_cuda_last_error());
    return (float *)d;
}

static float x_host[MAX_T * N_IN];

/* New input on the device (outside any graph, as the plugin's metadata). */
static void new_input(job *j) {
    for (int i = 0; i < j->T * N_IN; i++) x_host[i] = frand() * 3.0f;
    CHECK(tl_cuda_upload(ctx, (void *)j->x, x_host, sizeof(float) * j->T * N_IN) == TL_CUDA_OK, "upload: %s",
          tl_cuda_last_error());
}

/* Output of fn run eagerly (never through a graph), into host. */
static void eager(job *j, float *host) {
    CHECK(enqueue(j) == TL_CUDA_OK, "eager run: %s", tl_cuda_last_error());
    CHECK(tl_cuda_download(ctx, host, j->out, sizeof(float) * j->T * N_OUT) == TL_CUDA_OK, "download: %s",
          tl_cuda_last_error());
}

static int graph(job *j, int64_t key, float *host) {
    int rc = tl_cuda_graph_run(ctx, &key, 1, enqueue, j);
    CHECK(rc == TL_CUDA_OK, "graph run (key %lld): %s", (long long)key, tl_cuda_last_error());
    if (rc == TL_CUDA_OK) rc = tl_cuda_download(ctx, host, j->out, sizeof(float) * j->T * N_OUT);
    return rc;
}

static tl_cuda_graph_stats delta(const tl_cuda_graph_stats *before) {
    tl_cuda_graph_stats now, d;
    tl_cuda_graph_totals(&now);
    d = now;
    d.captures -= before->captures;
    d.replays -= before->replays;
    d.eager -= before->eager;
    d.failures -= before->failures;
    return d;
}

int main(void) {
    if (!gpu_test_open(&ctx)) return test_summary();
    tl_kernels_init();
    /* weights */
    const size_t rb = tl_row_size(TL_TYPE_Q8_0, N_IN);
    uint8_t *wq = malloc(rb * N_OUT);
    float row[N_IN], norm_w[N_IN];
    for (int r = 0; r < N_OUT; r++) {
        for (int i = 0; i < N_IN; i++) row[i] = frand();
        tl_quantize_row(TL_TYPE_Q8_0, row, wq + rb * r, N_IN);
    }
    for (int i = 0; i < N_IN; i++) norm_w[i] = 1.0f + 0.5f * frand();
    void *w_d = NULL;
    float *nw_d = dev_floats(N_IN), *x_d = dev_floats(MAX_T * N_IN), *y_d = dev_floats(MAX_T * N_IN),
          *out_d = dev_floats(MAX_T * N_OUT);
    CHECK(tl_cuda_alloc(ctx, rb * N_OUT, &w_d) == TL_CUDA_OK && tl_cuda_upload(ctx, w_d, wq, rb * N_OUT) == 0 &&
              tl_cuda_upload(ctx, nw_d, norm_w, sizeof norm_w) == 0,
          "weights: %s", tl_cuda_last_error());
    static float got[MAX_T * N_OUT], want[MAX_T * N_OUT];
    const size_t bytes12 = sizeof(float) * 12 * N_OUT;
    job j = {x_d, nw_d, w_d, y_d, out_d, 12, 1e-5f, 0, 0};
    tl_cuda_graph_stats s0, d;

    /* Graphs are off in a new context: every run is eager. */
    tl_cuda_graph_totals(&s0);
    new_input(&j);
    graph(&j, 1, got);
    graph(&j, 1, got);
    d = delta(&s0);
    CHECK(d.captures == 0 && d.replays == 0 && d.eager == 2, "graphs off by default (%lld captures, %lld eager)",
          d.captures, d.eager);
    tl_cuda_graph_enable(ctx, 1);

    /* 1. first run eager, second captured, then replays; each reads the new input */
    tl_cuda_graph_totals(&s0);
    int same = 1;
    for (int i = 0; i < 6; i++) {
        new_input(&j);
        graph(&j, 10, got);
        eager(&j, want);
        same &= !memcmp(got, want, bytes12);
    }
    d = delta(&s0);
    CHECK(same, "6 runs through key 10 == the same work launched eagerly, bit for bit, on new inputs");
    CHECK(d.captures == 1 && d.replays == 5 && d.eager == 1 && d.failures == 0,
          "key 10: 1 eager run, 1 capture, 5 replays (got %lld eager, %lld captures, %lld replays)", d.eager,
          d.captures, d.replays);

    /* 2. a replay keeps the host values of its capture: the key must cover them */
    j.eps = 4.0f; /* a large eps changes the norm visibly */
    new_input(&j);
    graph(&j, 10, got); /* the same key: replays eps 1e-5 */
    j.eps = 1e-5f;
    eager(&j, want);
    CHECK(!memcmp(got, want, bytes12), "a replay under the same key computes with the captured eps");
    j.eps = 4.0f;
    graph(&j, 11, got); /* a key of its own: eps 4 */
    eager(&j, want);
    CHECK(!memcmp(got, want, bytes12), "a new key runs with the new eps");
    float ref_small[12 * N_OUT];
    j.eps = 1e-5f;
    eager(&j, ref_small);
    CHECK(memcmp(ref_small, want, bytes12) != 0, "eps 4 and eps 1e-5 give different outputs (the check above bites)");

    /* 3. growing a scratch buffer (T 40 > 12 on the cuBLAS path) forgets every graph */
    tl_cuda_graph_totals(&s0);
    job big = j;
    big.T = MAX_T;
    new_input(&big);
    graph(&big, 20, got);
    eager(&big, want);
    CHECK(!memcmp(got, want, sizeof(float) * MAX_T * N_OUT), "T 40: eager first run == eager");
    new_input(&j);
    graph(&j, 10, got); /* forgotten: eager again */
    eager(&j, want);
    CHECK(!memcmp(got, want, bytes12), "key 10 after the scratch grew == eager");
    d = delta(&s0);
    CHECK(d.eager == 2 && d.replays == 0, "the scratch growth forgot key 10 (%lld eager, %lld replays)", d.eager,
          d.replays);
    graph(&j, 10, got);
    eager(&j, want);
    CHECK(!memcmp(got, want, bytes12), "key 10 recaptured == eager");

    /* 4. LRU: more keys than the table holds; each run 3 times in a row
     * (eager, captured, replayed), then all again from the newest down:
     * the 64 newest replay, the 16 oldest were evicted and run eagerly */
    same = 1;
    tl_cuda_graph_totals(&s0);
    for (int round = 0; round < 2; round++)
        for (int k = 0; k < 80; k++)
            for (int rep = 0; rep < (round ? 1 : 3); rep++) {
                const int key = round ? 79 - k : k;
                j.eps = 1e-5f * (float)(key + 1); /* the key covers eps */
                graph(&j, 1000 + key, got);
                eager(&j, want);
                same &= !memcmp(got, want, bytes12);
            }
    j.eps = 1e-5f;
    d = delta(&s0);
    CHECK(same, "80 keys through a table of 64 == eager");
    CHECK(d.captures == 80 && d.replays == 2 * 80 + 64 && d.eager == 80 + 16,
          "the 64 most recent keys replayed, the 16 evicted ran eagerly (%lld captures, %lld replays, %lld eager)",
          d.captures, d.replays, d.eager);

    /* 5. a step that fails by itself fails each time, and graphs stay on */
    tl_cuda_graph_totals(&s0);
    j.broken = 1;
    int fails = 0;
    for (int i = 0; i < 3; i++) fails += tl_cuda_graph_run(ctx, (const int64_t[]){40}, 1, enqueue, &j) == TL_CUDA_ERR_ARG;
    j.broken = 0;
    CHECK(fails == 3 && strstr(tl_cuda_last_error(), "99"), "a broken step fails every time, naming the type: %s",
          tl_cuda_last_error());
    new_input(&j);
    graph(&j, 41, got);
    graph(&j, 41, got);
    eager(&j, want);
    d = delta(&s0);
    CHECK(d.failures == 0 && d.captures == 1 && !memcmp(got, want, bytes12),
          "graphs stay on after it (%lld failures, %lld captures)", d.failures, d.captures);

    /* 6. the sampler's scratch growing does not forget graphs (no graph reads it) */
    {
        enum { NV = 5000 };
        float *logits = malloc(sizeof(float) * NV), *vals = dev_floats(8);
        for (int i = 0; i < NV; i++) logits[i] = frand();
        float *dl = dev_floats(NV);
        void *ids = NULL;
        tl_cuda_alloc(ctx, 8 * sizeof(int32_t), &ids);
        tl_cuda_graph_totals(&s0);
        CHECK(dl && ids && tl_cuda_upload(ctx, dl, logits, sizeof(float) * NV) == 0 &&
                  tl_cuda_topk(ctx, vals, (int32_t *)ids, dl, 1, NV, 8) == TL_CUDA_OK,
              "top-k over %d logits: %s", NV, tl_cuda_last_error());
        graph(&j, 41, got);
        d = delta(&s0);
        CHECK(d.replays == 1 && d.eager == 0, "key 41 still replays after the sampler's scratch grew (%lld eager)",
              d.eager);
        tl_cuda_dealloc(ctx, dl);
        tl_cuda_dealloc(ctx, vals);
        tl_cuda_dealloc(ctx, ids);
        free(logits);
    }

    /* 7. a host wait inside a capture: the capture fails, graphs turn off, the work runs eagerly */
    tl_cuda_graph_totals(&s0);
    j.wait_inside = 1;
    new_input(&j);
    graph(&j, 30, got); /* first sight: eager, fine */
    new_input(&j);
    int rc = graph(&j, 30, got); /* the capture fails; the eager rerun succeeds */
    eager(&j, want);
    d = delta(&s0);
    CHECK(rc == TL_CUDA_OK && !memcmp(got, want, bytes12), "the failed capture's work ran eagerly, correctly");
    CHECK(d.failures == 1 && strstr(d.last_failure, "cudaStreamSynchronize"), "the failure is counted and named: '%s'",
          d.last_failure);
    j.wait_inside = 0;
    graph(&j, 10, got);
    graph(&j, 10, got);
    d = delta(&s0);
    CHECK(d.captures == 0 && d.replays == 0, "graphs stay off after a failed capture (%lld captures)", d.captures);

    /* 8. bad arguments */
    int64_t keys[TL_CUDA_GRAPH_KEY_MAX + 1] = {0};
    CHECK(tl_cuda_graph_run(ctx, keys, 0, enqueue, &j) == TL_CUDA_ERR_ARG, "an empty key is refused");
    CHECK(tl_cuda_graph_run(ctx, keys, TL_CUDA_GRAPH_KEY_MAX + 1, enqueue, &j) == TL_CUDA_ERR_ARG &&
              strstr(tl_cuda_last_error(), "n_key"),
          "an oversized key is refused, naming n_key: %s", tl_cuda_last_error());
    CHECK(tl_cuda_graph_run(ctx, keys, 1, NULL, &j) == TL_CUDA_ERR_ARG, "a NULL function is refused");

    tl_cuda_dealloc(ctx, w_d);
    tl_cuda_dealloc(ctx, nw_d);
    tl_cuda_dealloc(ctx, x_d);
    tl_cuda_dealloc(ctx, y_d);
    tl_cuda_dealloc(ctx, out_d);
    free(wq);
    tl_cuda_free(ctx);
    return test_summary();
}
