/* graph.cu - CUDA graphs for work that repeats with the same shapes.
 *
 * A decode step of a small model is a few hundred short kernels; launched
 * one by one, the host's launch cost (a few microseconds each) can exceed
 * the device time. A graph captured once per shape replays the whole step
 * with one launch. The caller's key stands for everything the captured
 * launches freeze (pointers, sizes, grid shapes); what changes between
 * steps (tokens, positions, block tables) lives in device memory that the
 * replay reads afresh.
 *
 * A key is run eagerly the first time it is seen (that also grows any
 * scratch buffer it needs, which a capture must not do), captured and
 * replayed from the second time on. Graphs are kept in a small LRU table;
 * growing a scratch buffer they read forgets them all (they point at the
 * old one). If a capture fails where eager launches of the same work
 * succeed, graphs are turned off for the context and the reason is kept
 * for tl_cuda_graph_totals; a step that fails eagerly too just fails. */
#include <stdio.h>
#include <string.h>

#include "cuda_impl.h"

static long long total_captures, total_replays, total_eager, total_failures;
static char total_last_failure[256];

static void forget(tl_cuda *c, int i) {
    if (c->graphs[i].exec) cudaGraphExecDestroy(c->graphs[i].exec);
    c->graphs[i] = c->graphs[--c->n_graphs];
}

extern "C" TL_CUDA_API void tl_cuda_graph_reset(tl_cuda *c) {
    if (!c || !c->n_graphs || c->capturing) return; /* in a capture: the table stays as the capture found it */
    cudaSetDevice(c->device);
    /* a replay may still be running: its executable graph outlives it */
    if (cudaStreamSynchronize(c->stream) != cudaSuccess) (void)cudaGetLastError();
    while (c->n_graphs) forget(c, c->n_graphs - 1);
}

extern "C" TL_CUDA_API void tl_cuda_graph_enable(tl_cuda *c, int on) {
    if (!c) return;
    c->graphs_on = on != 0;
    if (!on) tl_cuda_graph_reset(c);
}

extern "C" TL_CUDA_API void tl_cuda_graph_totals(tl_cuda_graph_stats *out) {
    if (!out) return;
    out->captures = __atomic_load_n(&total_captures, __ATOMIC_RELAXED);
    out->replays = __atomic_load_n(&total_replays, __ATOMIC_RELAXED);
    out->eager = __atomic_load_n(&total_eager, __ATOMIC_RELAXED);
    out->failures = __atomic_load_n(&total_failures, __ATOMIC_RELAXED);
    snprintf(out->last_failure, sizeof out->last_failure, "%s", total_last_failure);
}

/* Captures fn's work into an executable graph. The stream is back to
 * normal (not capturing) whatever happens. */
static int capture(tl_cuda *c, cudaGraphExec_t *exec, tl_cuda_enqueue_fn fn, void *arg) {
    *exec = NULL;
    /* thread-local: another thread's unrelated CUDA calls cannot break this capture */
    TLC_CHECK(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal));
    c->capturing = 1;
    const int rc = fn(arg);
    cudaGraph_t g = NULL;
    const cudaError_t e = cudaStreamEndCapture(c->stream, &g);
    c->capturing = 0;
    if (rc < 0 || e != cudaSuccess) {
        if (g) cudaGraphDestroy(g);
        (void)cudaGetLastError();
        if (rc < 0) return rc; /* fn's own message names the step that failed */
        return tlc_fail(TL_CUDA_ERR_CUDA, "cudaStreamEndCapture", __FILE__, __LINE__, "%s (%s)", cudaGetErrorString(e),
                        cudaGetErrorName(e));
    }
    const cudaError_t ie = cudaGraphInstantiate(exec, g, 0);
    cudaGraphDestroy(g);
    if (ie != cudaSuccess) {
        *exec = NULL;
        (void)cudaGetLastError();
        return tlc_fail(TL_CUDA_ERR_CUDA, "cudaGraphInstantiate", __FILE__, __LINE__, "%s (%s)",
                        cudaGetErrorString(ie), cudaGetErrorName(ie));
    }
    return TL_CUDA_OK;
}

static int run_eager(tl_cuda_enqueue_fn fn, void *arg) {
    __atomic_add_fetch(&total_eager, 1, __ATOMIC_RELAXED);
    return fn(arg);
}

static int find(const tl_cuda *c, const int64_t *key, int n_key) {
    for (int i = 0; i < c->n_graphs; i++)
        if (c->graphs[i].n_key == n_key && !memcmp(c->graphs[i].key, key, (size_t)n_key * sizeof *key)) return i;
    return -1;
}

static void remember(tl_cuda *c, const int64_t *key, int n_key) {
    if (c->n_graphs == TLC_GRAPHS) {
        int lru = 0;
        for (int i = 1; i < c->n_graphs; i++)
            if (c->graphs[i].used < c->graphs[lru].used) lru = i;
        forget(c, lru);
    }
    tlc_graph *e = &c->graphs[c->n_graphs++];
    memset(e, 0, sizeof *e);
    memcpy(e->key, key, (size_t)n_key * sizeof *key);
    e->n_key = n_key;
    e->used = ++c->graph_clock;
}

extern "C" TL_CUDA_API int tl_cuda_graph_run(tl_cuda *c, const int64_t *key, int n_key, tl_cuda_enqueue_fn fn,
                                             void *arg) {
    TLC_ARG(c && fn && key && n_key > 0 && n_key <= TL_CUDA_GRAPH_KEY_MAX, "bad arguments (n_key %d)", n_key);
    TLC_ARG(!c->capturing, "tl_cuda_graph_run inside a capture");
    if (!c->graphs_on) return run_eager(fn, arg);
    TLC_BIND(c);
    int i = find(c, key, n_key);
    if (i < 0) { /* first sight: eager; a step that failed is not a shape worth keeping */
        const int rc = run_eager(fn, arg);
        if (rc == TL_CUDA_OK) remember(c, key, n_key); /* after: the run may have reset the table */
        return rc;
    }
    c->graphs[i].used = ++c->graph_clock;
    if (!c->graphs[i].exec) {
        cudaGraphExec_t exec = NULL;
        if (capture(c, &exec, fn, arg) < 0) {
            char why[sizeof total_last_failure];
            snprintf(why, sizeof why, "%s", tl_cuda_last_error());
            const int rc = run_eager(fn, arg); /* nothing of the failed capture ran */
            if (rc < 0) { /* the step fails by itself: not the capture's doing */
                if ((i = find(c, key, n_key)) >= 0) forget(c, i);
                return rc;
            }
            /* eager launches do what the capture could not: graphs cannot hold this work */
            __atomic_add_fetch(&total_failures, 1, __ATOMIC_RELAXED);
            snprintf(total_last_failure, sizeof total_last_failure, "%s", why);
            tl_cuda_graph_enable(c, 0);
            return TL_CUDA_OK;
        }
        /* upload now, so the first replay does not pay for it */
        const cudaError_t ue = cudaGraphUpload(exec, c->stream);
        if (ue != cudaSuccess) {
            cudaGraphExecDestroy(exec);
            TLC_CHECK(ue);
        }
        c->graphs[i].exec = exec;
        __atomic_add_fetch(&total_captures, 1, __ATOMIC_RELAXED);
    }
    TLC_CHECK(cudaGraphLaunch(c->graphs[i].exec, c->stream));
    __atomic_add_fetch(&total_replays, 1, __ATOMIC_RELAXED);
    return TL_CUDA_OK;
}
