/* plugin.cu - the CUDA backend behind the engine's plugin interface
 * (engine/backend.h): tl_backend_plugin_v1() returns the ops table.
 *
 * init uploads every weight in its packed type (the matmul launcher
 * dequantizes on the fly or through the GEMM path), allocates the paged KV
 * arena, activation scratch for max_batch_tokens tokens and the per-batch
 * metadata buffer. forward packs the batch metadata (tokens, positions,
 * per-virtual-layer KV slots, per-sequence query ranges, windows, block
 * tables, last-token rows) into one host buffer, uploads it with one copy,
 * enqueues every layer on the context's stream and synchronises only in the
 * final logits download. It mirrors engine/forward.c step by step.
 *
 * Every failure returns < 0 with "call failed at file:line: detail" in msg;
 * nothing aborts. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../engine/backend.h"
#include "cuda_impl.h"

/* ---- errors ----------------------------------------------------------------- */

static int pl_fail(char *msg, size_t cap, int rc, const char *call, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));
static int pl_fail(char *msg, size_t cap, int rc, const char *call, const char *file, int line, const char *fmt, ...) {
    if (msg && cap) {
        int n = snprintf(msg, cap, "cuda: %s failed at %s:%d: ", call, file, line);
        if (n >= 0 && (size_t)n < cap) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(msg + n, cap - (size_t)n, fmt, ap);
            va_end(ap);
        }
    }
    return rc < 0 ? rc : TL_CUDA_ERR_ARG;
}

/* A tl_cuda_* call; its own message (call, file, line inside the library) follows ours. */
#define TRY(call)                                                                                       \
    do {                                                                                                \
        int rc_ = (call);                                                                               \
        if (rc_ < 0) return pl_fail(msg, cap, rc_, #call, __FILE__, __LINE__, "%s", tl_cuda_last_error()); \
    } while (0)

/* A precondition; the message says what was wrong. */
#define REQ(cond, ...)                                                                                  \
    do {                                                                                                \
        if (!(cond)) return pl_fail(msg, cap, TL_CUDA_ERR_ARG, "check (" #cond ")", __FILE__, __LINE__, __VA_ARGS__); \
    } while (0)

/* ---- state ------------------------------------------------------------------ */

typedef struct dev_w {
    const void *d;   /* device, packed */
    const void *d16; /* device f16 copy for the GEMM path, or NULL */
    int type, n_in, n_out;
} dev_w;

typedef struct dev_layer {
    float *attn_norm, *bq, *bk, *bv, *q_norm, *k_norm, *post_attn_norm, *post_ffn_norm, *ffn_norm;
    dev_w wq, wk, wv, wo, w_gate, w_up, w_down;
} dev_layer;

typedef struct uploaded {
    const void *host;
    size_t bytes;
    void *dev;
} uploaded;

typedef struct plugin {
    tl_cuda *c;
    int n_vocab, n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_rot;
    float norm_eps, rope_base, rope_base_swa;
    int rope_type, ffn_act, embd_scale;
    int *layer_window; /* host (n_layer) */
    int kv_blocks, max_batch_tokens, max_seq_len;
    int exact; /* TINYLOOP_CUDA_EXACT=1: batch-invariant arithmetic (see mm) */
    int attn_split; /* TINYLOOP_CUDA_ATTN_SPLIT: decode attention split length, 0 auto, -1 never */

    dev_w tok_embd, output;
    float *output_norm, *rope_freqs;
    dev_layer *layers;

    uploaded *up; /* every init-time device buffer (freed at the end) */
    int n_up, cap_up;

    tl_cuda_kv kv;
    float *x, *xb, *q, *k, *v, *att, *hb, *hb2, *o, *lx;

    /* grown on demand (freed and reallocated) */
    float *logits;
    size_t logits_cap; /* floats */
    int32_t *meta_d, *meta_h;
    size_t meta_cap; /* int32s, both buffers */
    /* device sampling staging (host), grown on demand */
    tl_cuda_sample_row *smp_rows;
    int32_t *smp_pen;
    int smp_rows_cap, smp_pen_cap;
    int unfinished; /* a forward failed after enqueuing work that may still read the staging */
} plugin;

/* A matmul. The default picks cuBLAS for batches of more than
 * TL_CUDA_GEMM_MIN_T rows, whose f16 rounding differs from the direct
 * kernels'; TINYLOOP_CUDA_EXACT=1 keeps every batch on the direct kernels,
 * so a token's logits do not depend on what else is in its batch (cached
 * and uncached runs then agree bit for bit, at the cost of prefill speed). */
static int mm(const struct plugin *p, float *out, const float *x, const dev_w *w, int T) {
    if (!p->exact && w->d16 && T >= TL_CUDA_GEMM_MIN_T)
        return tl_cuda_matmul_path(p->c, out, x, w->d16, TLC_F16, w->n_in, w->n_out, T, TL_CUDA_MM_GEMM);
    return tl_cuda_matmul_path(p->c, out, x, w->d, w->type, w->n_in, w->n_out, T,
                               p->exact ? TL_CUDA_MM_DIRECT : TL_CUDA_MM_AUTO);
}

/* ---- small kernels the launcher set lacks ----------------------------------- */

static __global__ void kernel_add_bias(float *x, const float *b, int64_t n_rows, int n) {
    const int64_t total = n_rows * n;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x)
        x[i] += b[i % n];
}

static __global__ void kernel_scale(float *x, float s, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] *= s;
}

static unsigned grid_for(int64_t n) {
    int64_t b = (n + 255) / 256;
    return (unsigned)(b < 1 ? 1 : b > 4096 ? 4096 : b);
}

static int add_bias(tl_cuda *c, float *x, const float *b, int n_rows, int n) {
    if (n_rows <= 0 || n <= 0) return TL_CUDA_OK;
    kernel_add_bias<<<grid_for((int64_t)n_rows * n), 256, 0, c->stream>>>(x, b, n_rows, n);
    TLC_LAUNCHED(kernel_add_bias);
    return TL_CUDA_OK;
}

static int scale(tl_cuda *c, float *x, float s, int64_t n) {
    if (n <= 0) return TL_CUDA_OK;
    kernel_scale<<<grid_for(n), 256, 0, c->stream>>>(x, s, n);
    TLC_LAUNCHED(kernel_scale);
    return TL_CUDA_OK;
}

/* ---- init ------------------------------------------------------------------- */

static int track(plugin *p, const void *host, size_t bytes, void *dev) {
    if (p->n_up == p->cap_up) {
        int ncap = p->cap_up ? 2 * p->cap_up : 64;
        uploaded *u = (uploaded *)realloc(p->up, (size_t)ncap * sizeof *u);
        if (!u) return -1;
        p->up = u;
        p->cap_up = ncap;
    }
    uploaded u = {host, bytes, dev};
    p->up[p->n_up++] = u;
    return 0;
}

/* Device buffer of `bytes`, zeroed, freed with the plugin. */
static int dev_alloc(plugin *p, size_t bytes, void **out, const char *what, char *msg, size_t cap) {
    *out = NULL;
    if (bytes == 0) bytes = 256;
    int rc = tl_cuda_alloc(p->c, bytes, out);
    if (rc < 0)
        return pl_fail(msg, cap, rc, "tl_cuda_alloc", __FILE__, __LINE__, "%s: %zu bytes (%.1f MiB): %s", what, bytes,
                       bytes / 1048576.0, tl_cuda_last_error());
    if (track(p, NULL, bytes, *out)) {
        tl_cuda_dealloc(p->c, *out);
        *out = NULL;
        return pl_fail(msg, cap, TL_CUDA_ERR_NOMEM, "realloc", __FILE__, __LINE__, "host allocation list");
    }
    cudaError_t e = cudaMemsetAsync(*out, 0, bytes, p->c->stream);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return pl_fail(msg, cap, TL_CUDA_ERR_CUDA, "cudaMemsetAsync", __FILE__, __LINE__, "%s: %s", what,
                       cudaGetErrorString(e));
    }
    return 0;
}

/* Device copy of host data; a host buffer uploaded before is shared (tied output). */
static int dev_upload(plugin *p, const void *host, size_t bytes, void **out, const char *what, char *msg, size_t cap) {
    *out = NULL;
    for (int i = 0; i < p->n_up; i++)
        if (p->up[i].host && p->up[i].host == host && p->up[i].bytes == bytes) {
            *out = p->up[i].dev;
            return 0;
        }
    void *d = NULL;
    int rc = tl_cuda_alloc(p->c, bytes, &d);
    if (rc < 0)
        return pl_fail(msg, cap, rc, "tl_cuda_alloc", __FILE__, __LINE__, "%s: %zu bytes (%.1f MiB): %s", what, bytes,
                       bytes / 1048576.0, tl_cuda_last_error());
    if (track(p, host, bytes, d)) {
        tl_cuda_dealloc(p->c, d);
        return pl_fail(msg, cap, TL_CUDA_ERR_NOMEM, "realloc", __FILE__, __LINE__, "host allocation list");
    }
    rc = tl_cuda_upload(p->c, d, host, bytes);
    if (rc < 0)
        return pl_fail(msg, cap, rc, "tl_cuda_upload", __FILE__, __LINE__, "%s: %s", what, tl_cuda_last_error());
    *out = d;
    return 0;
}

static int up_weight(plugin *p, dev_w *dw, const tl_weight *w, const char *what, int layer, int64_t n_in,
                     int64_t n_out, char *msg, size_t cap) {
    char name[96];
    if (layer >= 0)
        snprintf(name, sizeof name, "layer %d %s", layer, what);
    else
        snprintf(name, sizeof name, "%s", what);
    REQ(w->data, "%s: no data", name);
    REQ(w->n_in == n_in && w->n_out == n_out, "%s: shape (%lld, %lld), expected (%lld, %lld)", name,
        (long long)w->n_in, (long long)w->n_out, (long long)n_in, (long long)n_out);
    REQ(n_in < (1 << 30) && n_out < (1 << 30), "%s: shape too large", name);
    size_t rb = tlc_row_bytes(w->type, w->n_in);
    REQ(rb != 0 && tl_cuda_type_supported(w->type),
        "%s: weight type %d unsupported by the CUDA kernels (or row length %lld not a multiple of its block)", name,
        w->type, (long long)w->n_in);
    void *d = NULL;
    int rc = dev_upload(p, w->data, rb * (size_t)w->n_out, &d, name, msg, cap);
    if (rc) return rc;
    dev_w r = {d, NULL, w->type, (int)w->n_in, (int)w->n_out};
    *dw = r;
    return 0;
}

static int up_vec(plugin *p, float **out, const float *v, int64_t n, const char *what, int layer, char *msg,
                  size_t cap) {
    *out = NULL;
    if (!v) return 0;
    char name[96];
    snprintf(name, sizeof name, "layer %d %s", layer, what);
    void *d = NULL;
    int rc = dev_upload(p, v, (size_t)n * sizeof(float), &d, layer >= 0 ? name : what, msg, cap);
    *out = (float *)d;
    return rc;
}

/* The GEMM path reads f16 weights: a persistent f16 copy of each quantized
 * (or BF16) matmul weight saves dequantizing it on every prefill chunk and
 * every decode step of more than 8 sequences. Made when the copies fit in
 * a third of the free memory; TINYLOOP_CUDA_F16_WEIGHTS=0 turns them off,
 * =1 makes them whatever the size. Not in the exact mode (direct path). */
static int make_f16_copies(plugin *p, char *msg, size_t cap) {
    const char *env = getenv("TINYLOOP_CUDA_F16_WEIGHTS");
    if (p->exact || (env && !strcmp(env, "0"))) return 0;
    const int n = 7 * p->n_layer + 1;
    dev_w **ws = (dev_w **)malloc((size_t)n * sizeof *ws);
    REQ(ws, "out of host memory");
    int k = 0;
    ws[k++] = &p->output;
    for (int L = 0; L < p->n_layer; L++) {
        dev_layer *l = &p->layers[L];
        dev_w *lw[7] = {&l->wq, &l->wk, &l->wv, &l->wo, &l->w_gate, &l->w_up, &l->w_down};
        for (int j = 0; j < 7; j++) ws[k++] = lw[j];
    }
    size_t need = 0;
    for (int i = 0; i < n; i++)
        if (ws[i]->type != TLC_F32 && ws[i]->type != TLC_F16) need += (size_t)ws[i]->n_out * ws[i]->n_in * 2;
    size_t free_b = 0, total_b = 0;
    int rc = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
        (void)cudaGetLastError();
        free_b = 0;
    }
    if (need == 0 || (!(env && !strcmp(env, "1")) && need > free_b / 3)) goto out;
    for (int i = 0; i < n && !rc; i++) {
        dev_w *w = ws[i];
        if (w->type == TLC_F32 || w->type == TLC_F16) continue;
        for (int j = 0; j < i && !w->d16; j++)
            if (ws[j]->d == w->d) w->d16 = ws[j]->d16; /* one tensor behind two names */
        if (w->d16) continue;
        const size_t bytes = (size_t)w->n_out * w->n_in * 2;
        void *d = NULL;
        rc = tl_cuda_alloc(p->c, bytes, &d);
        if (rc < 0) {
            rc = pl_fail(msg, cap, rc, "tl_cuda_alloc", __FILE__, __LINE__, "f16 weight copy of %zu bytes: %s", bytes,
                         tl_cuda_last_error());
            break;
        }
        if (track(p, NULL, bytes, d)) {
            tl_cuda_dealloc(p->c, d);
            rc = pl_fail(msg, cap, TL_CUDA_ERR_NOMEM, "realloc", __FILE__, __LINE__, "host allocation list");
            break;
        }
        rc = tl_cuda_dequantize_f16(p->c, d, w->d, w->type, w->n_out, w->n_in);
        if (rc < 0)
            rc = pl_fail(msg, cap, rc, "tl_cuda_dequantize_f16", __FILE__, __LINE__, "%s", tl_cuda_last_error());
        else
            w->d16 = d;
    }
out:
    free(ws);
    return rc;
}

/* Host staging for uploads is page-locked: a copy from pageable memory
 * waits for the stream first, a host synchronisation in the middle of a
 * forward pass (before the sampler's parameters go up, for one). */
static void *pinned_alloc(size_t bytes) {
    void *h = NULL;
    if (cudaMallocHost(&h, bytes ? bytes : 1) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return h;
}

static void pinned_free(void *h) {
    if (h) cudaFreeHost(h);
}

static void pl_free(void *ctx) {
    plugin *p = (plugin *)ctx;
    if (!p) return;
    if (p->c) {
        tl_cuda_sync(p->c);
        for (int i = 0; i < p->n_up; i++) {
            int shared = 0;
            for (int j = 0; j < i && !shared; j++) shared = p->up[j].dev == p->up[i].dev;
            if (!shared) tl_cuda_dealloc(p->c, p->up[i].dev);
        }
        if (p->logits) tl_cuda_dealloc(p->c, p->logits);
        if (p->meta_d) tl_cuda_dealloc(p->c, p->meta_d);
        tl_cuda_free(p->c);
    }
    free(p->up);
    free(p->layers);
    free(p->layer_window);
    pinned_free(p->meta_h);
    pinned_free(p->smp_rows);
    pinned_free(p->smp_pen);
    free(p);
}

static int init_inner(plugin *p, const tl_backend_model *m, char *msg, size_t cap) {
    REQ(m->abi == TL_BACKEND_ABI, "model descriptor ABI %d, plugin ABI %d", m->abi, TL_BACKEND_ABI);
    REQ(m->n_vocab > 0 && m->n_embd > 0 && m->n_layer > 0 && m->n_head > 0 && m->n_head_kv > 0 && m->head_dim > 0 &&
            m->n_ff > 0,
        "bad hyperparameters (vocab %d, embd %d, layers %d, heads %d/%d, head_dim %d, ff %d)", m->n_vocab, m->n_embd,
        m->n_layer, m->n_head, m->n_head_kv, m->head_dim, m->n_ff);
    REQ(m->n_head % m->n_head_kv == 0, "n_head %d not a multiple of n_head_kv %d", m->n_head, m->n_head_kv);
    REQ(m->head_dim <= 256, "head_dim %d > 256 (the attention kernel's limit)", m->head_dim);
    REQ(m->n_rot > 0 && m->n_rot <= m->head_dim && m->n_rot % 2 == 0, "n_rot %d (head_dim %d)", m->n_rot,
        m->head_dim);
    REQ(m->rope_type == TL_CUDA_ROPE_NORM || m->rope_type == TL_CUDA_ROPE_NEOX, "rope_type %d", m->rope_type);
    REQ(m->ffn_act == 0 || m->ffn_act == 1, "ffn_act %d", m->ffn_act);
    REQ(m->kv_type == TL_CUDA_KV_F16 || m->kv_type == TL_CUDA_KV_F32, "kv_type %d", m->kv_type);
    REQ(m->kv_blocks > 0 && m->kv_block_size > 0, "KV arena of %d blocks of %d positions", m->kv_blocks,
        m->kv_block_size);
    REQ(m->max_batch_tokens > 0, "max_batch_tokens %d (must be > 0)", m->max_batch_tokens);
    REQ(m->layers && m->output_norm && m->tok_embd.data && m->output.data, "NULL weights in the model descriptor");

    p->n_vocab = m->n_vocab;
    p->n_embd = m->n_embd;
    p->n_layer = m->n_layer;
    p->n_head = m->n_head;
    p->n_head_kv = m->n_head_kv;
    p->head_dim = m->head_dim;
    p->n_ff = m->n_ff;
    p->n_rot = m->n_rot;
    p->norm_eps = m->norm_eps;
    p->rope_base = m->rope_base;
    p->rope_base_swa = m->rope_base_swa;
    p->rope_type = m->rope_type;
    p->ffn_act = m->ffn_act;
    p->embd_scale = m->embd_scale;
    p->kv_blocks = m->kv_blocks;
    p->max_batch_tokens = m->max_batch_tokens;
    p->max_seq_len = m->max_seq_len;
    p->layer_window = (int *)calloc((size_t)m->n_layer, sizeof(int));
    p->layers = (dev_layer *)calloc((size_t)m->n_layer, sizeof(dev_layer));
    REQ(p->layer_window && p->layers, "out of host memory");
    if (m->layer_window) memcpy(p->layer_window, m->layer_window, (size_t)m->n_layer * sizeof(int));

    const char *ex = getenv("TINYLOOP_CUDA_EXACT");
    p->exact = ex && *ex && strcmp(ex, "0") != 0;
    const char *sp = getenv("TINYLOOP_CUDA_ATTN_SPLIT");
    p->attn_split = p->exact ? -1 : sp && *sp ? atoi(sp) : 0;
    REQ(p->attn_split == -1 || (p->attn_split >= 0 && p->attn_split % 32 == 0),
        "TINYLOOP_CUDA_ATTN_SPLIT=%s: -1, 0 or a multiple of 32", sp ? sp : "");
    const char *env = getenv("TINYLOOP_CUDA_DEVICE");
    int device = env && *env ? atoi(env) : 0;
    TRY(tl_cuda_init(device, &p->c));

    const int D = m->n_embd, hd = m->head_dim, q_dim = m->n_head * hd, kv_dim = m->n_head_kv * hd;
    int rc;
    /* weights */
    if ((rc = up_weight(p, &p->tok_embd, &m->tok_embd, "token_embd", -1, D, m->n_vocab, msg, cap))) return rc;
    if ((rc = up_weight(p, &p->output, &m->output, "output", -1, D, m->n_vocab, msg, cap))) return rc;
    if ((rc = up_vec(p, &p->output_norm, m->output_norm, D, "output_norm", -1, msg, cap))) return rc;
    if ((rc = up_vec(p, &p->rope_freqs, m->rope_freqs, m->n_rot / 2, "rope_freqs", -1, msg, cap))) return rc;
    for (int L = 0; L < m->n_layer; L++) {
        const tl_layer *ly = &m->layers[L];
        dev_layer *dl = &p->layers[L];
        REQ(ly->attn_norm && ly->ffn_norm, "layer %d: missing attn_norm or ffn_norm", L);
        if ((rc = up_weight(p, &dl->wq, &ly->wq, "attn_q", L, D, q_dim, msg, cap))) return rc;
        if ((rc = up_weight(p, &dl->wk, &ly->wk, "attn_k", L, D, kv_dim, msg, cap))) return rc;
        if ((rc = up_weight(p, &dl->wv, &ly->wv, "attn_v", L, D, kv_dim, msg, cap))) return rc;
        if ((rc = up_weight(p, &dl->wo, &ly->wo, "attn_output", L, q_dim, D, msg, cap))) return rc;
        if ((rc = up_weight(p, &dl->w_gate, &ly->w_gate, "ffn_gate", L, D, m->n_ff, msg, cap))) return rc;
        if ((rc = up_weight(p, &dl->w_up, &ly->w_up, "ffn_up", L, D, m->n_ff, msg, cap))) return rc;
        if ((rc = up_weight(p, &dl->w_down, &ly->w_down, "ffn_down", L, m->n_ff, D, msg, cap))) return rc;
        if ((rc = up_vec(p, &dl->attn_norm, ly->attn_norm, D, "attn_norm", L, msg, cap))) return rc;
        if ((rc = up_vec(p, &dl->ffn_norm, ly->ffn_norm, D, "ffn_norm", L, msg, cap))) return rc;
        if ((rc = up_vec(p, &dl->bq, ly->bq, q_dim, "attn_q.bias", L, msg, cap))) return rc;
        if ((rc = up_vec(p, &dl->bk, ly->bk, kv_dim, "attn_k.bias", L, msg, cap))) return rc;
        if ((rc = up_vec(p, &dl->bv, ly->bv, kv_dim, "attn_v.bias", L, msg, cap))) return rc;
        if ((rc = up_vec(p, &dl->q_norm, ly->q_norm, hd, "attn_q_norm", L, msg, cap))) return rc;
        if ((rc = up_vec(p, &dl->k_norm, ly->k_norm, hd, "attn_k_norm", L, msg, cap))) return rc;
        if ((rc = up_vec(p, &dl->post_attn_norm, ly->post_attn_norm, D, "post_attention_norm", L, msg, cap)))
            return rc;
        if ((rc = up_vec(p, &dl->post_ffn_norm, ly->post_ffn_norm, D, "post_ffw_norm", L, msg, cap))) return rc;
    }

    if ((rc = make_f16_copies(p, msg, cap))) return rc;

    /* activation scratch for max_batch_tokens tokens */
    const size_t T = (size_t)m->max_batch_tokens, wide = (size_t)(D > q_dim ? D : q_dim);
    struct {
        float **buf;
        size_t n;
        const char *what;
    } bufs[] = {
        {&p->x, T * D, "scratch x"},          {&p->xb, T * wide, "scratch xb"},
        {&p->q, T * q_dim, "scratch q"},      {&p->k, T * kv_dim, "scratch k"},
        {&p->v, T * kv_dim, "scratch v"},     {&p->att, T * q_dim, "scratch att"},
        {&p->hb, T * m->n_ff, "scratch hb"},  {&p->hb2, T * m->n_ff, "scratch hb2"},
        {&p->o, T * wide, "scratch o"},       {&p->lx, T * D, "scratch logits_x"},
    };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        void *d = NULL;
        if ((rc = dev_alloc(p, bufs[i].n * sizeof(float), &d, bufs[i].what, msg, cap))) return rc;
        *bufs[i].buf = (float *)d;
    }
    /* KV arena */
    p->kv.kv_type = m->kv_type;
    p->kv.block_size = m->kv_block_size;
    p->kv.n_head_kv = m->n_head_kv;
    p->kv.head_dim = hd;
    const size_t bb = tl_cuda_kv_block_bytes(&p->kv);
    REQ(bb > 0, "KV block of 0 bytes");
    if (m->kv_auto) {
        /* No size asked for: most of what is free after the weights and
         * activations, leaving room for the GEMM path's f16 copy of the
         * largest weight and the sampler's scratch. */
        size_t free_b = 0, total_b = 0, biggest = 0;
        TRY(tl_cuda_sync(p->c));
        cudaError_t e = cudaMemGetInfo(&free_b, &total_b);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            return pl_fail(msg, cap, TL_CUDA_ERR_CUDA, "cudaMemGetInfo", __FILE__, __LINE__, "%s",
                           cudaGetErrorString(e));
        }
        for (int i = 0; i < p->n_up; i++)
            if (p->up[i].host && p->up[i].bytes > biggest) biggest = p->up[i].bytes;
        const char *fe = getenv("TINYLOOP_CUDA_KV_FRACTION");
        double frac = fe && *fe ? atof(fe) : 0.9;
        REQ(frac > 0 && frac <= 1, "TINYLOOP_CUDA_KV_FRACTION=%s is not in (0, 1]", fe);
        const size_t reserve = ((size_t)1 << 30) + 4 * biggest;
        const double usable = free_b > reserve ? (double)(free_b - reserve) * frac : 0.0;
        double blocks = usable / (double)bb;
        if (blocks > (double)m->kv_blocks_max) blocks = (double)m->kv_blocks_max;
        if (blocks > (double)(INT32_MAX / m->kv_block_size)) blocks = (double)(INT32_MAX / m->kv_block_size);
        if (blocks > (double)p->kv_blocks) p->kv_blocks = (int)blocks;
    }
    /* KV slots (block * block_size + row) are int32 on the device */
    REQ((int64_t)p->kv_blocks * m->kv_block_size <= INT32_MAX, "%d KV blocks of %d positions exceed 2^31 slots",
        p->kv_blocks, m->kv_block_size);
    const size_t arena = bb * (size_t)p->kv_blocks;
    {
        size_t wbytes = 0;
        for (int i = 0; i < p->n_up; i++) wbytes += p->up[i].bytes;
        void *a = NULL;
        int r = tl_cuda_alloc(p->c, arena, &a);
        if (r < 0)
            return pl_fail(msg, cap, r, "tl_cuda_alloc", __FILE__, __LINE__,
                           "KV arena: %d blocks x %zu bytes = %zu bytes (%.1f MiB; caller sized %zu bytes) does not "
                           "fit next to %.1f MiB of weights: %s",
                           p->kv_blocks, bb, arena, arena / 1048576.0, m->kv_mem, wbytes / 1048576.0,
                           tl_cuda_last_error());
        if (track(p, NULL, arena, a)) {
            tl_cuda_dealloc(p->c, a);
            return pl_fail(msg, cap, TL_CUDA_ERR_NOMEM, "realloc", __FILE__, __LINE__, "host allocation list");
        }
        p->kv.arena = a;
    }

    TRY(tl_cuda_sync(p->c));
    return 0;
}

static int pl_init(const tl_backend_model *model, void **ctx, char *msg, size_t cap) {
    if (msg && cap) msg[0] = 0;
    if (!ctx) return pl_fail(msg, cap, TL_CUDA_ERR_ARG, "init", __FILE__, __LINE__, "NULL ctx");
    *ctx = NULL;
    if (!model) return pl_fail(msg, cap, TL_CUDA_ERR_ARG, "init", __FILE__, __LINE__, "NULL model");
    plugin *p = (plugin *)calloc(1, sizeof *p);
    if (!p) return pl_fail(msg, cap, TL_CUDA_ERR_NOMEM, "calloc", __FILE__, __LINE__, "%zu bytes", sizeof *p);
    int rc = init_inner(p, model, msg, cap);
    if (rc < 0) {
        pl_free(p);
        return rc;
    }
    *ctx = p;
    return 0;
}

/* ---- forward ---------------------------------------------------------------- */

/* Grows the metadata buffers (host staging and device) to n int32s. */
static int meta_reserve(plugin *p, size_t n, char *msg, size_t cap) {
    if (n <= p->meta_cap) return 0;
    size_t ncap = p->meta_cap ? p->meta_cap : 4096;
    while (ncap < n) ncap *= 2;
    if (p->meta_d) {
        tl_cuda_dealloc(p->c, p->meta_d); /* synchronises: earlier batches no longer read it */
        p->meta_d = NULL;
    }
    pinned_free(p->meta_h);
    p->meta_h = NULL;
    p->meta_cap = 0;
    p->meta_h = (int32_t *)pinned_alloc(ncap * sizeof(int32_t));
    REQ(p->meta_h, "out of page-locked host memory for %zu metadata ints", ncap);
    void *d = NULL;
    TRY(tl_cuda_alloc(p->c, ncap * sizeof(int32_t), &d));
    p->meta_d = (int32_t *)d;
    p->meta_cap = ncap;
    return 0;
}

static int logits_reserve(plugin *p, size_t n, char *msg, size_t cap) {
    if (n <= p->logits_cap) return 0;
    if (p->logits) {
        tl_cuda_dealloc(p->c, p->logits);
        p->logits = NULL;
    }
    p->logits_cap = 0;
    void *d = NULL;
    TRY(tl_cuda_alloc(p->c, n * sizeof(float), &d));
    p->logits = (float *)d;
    p->logits_cap = n;
    return 0;
}

/* The wanted rows' logits are on the device: rows sampled here send only
 * their ids; if any row is sampled on the host, every row's logits go
 * there (before the penalties below change the device rows). */
static int finish_rows(plugin *p, const tl_backend_batch *b, int rows, float *logits_host, char *msg, size_t cap) {
    int on_dev = 0, n_pen = 0;
    for (int r = 0; b->sample && r < rows; r++)
        if (b->sample[r].on_device) {
            on_dev++;
            REQ(b->sample[r].n_penalty >= 0 && (b->sample[r].n_penalty == 0 || b->sample[r].penalty_ids),
                "row %d: %d penalty ids without an array", r, b->sample[r].n_penalty);
            n_pen += b->sample[r].n_penalty;
        }
    REQ(!on_dev || b->ids_out, "%d rows sampled on the device but ids_out is NULL", on_dev);
    if (on_dev < rows) {
        REQ(logits_host, "%d rows want logits but logits_host is NULL", rows - on_dev);
        TRY(tl_cuda_download(p->c, logits_host, p->logits, (size_t)rows * p->n_vocab * sizeof(float)));
    }
    if (!on_dev) return 0;
    if (rows > p->smp_rows_cap) {
        pinned_free(p->smp_rows);
        p->smp_rows = (tl_cuda_sample_row *)pinned_alloc((size_t)rows * sizeof *p->smp_rows);
        p->smp_rows_cap = p->smp_rows ? rows : 0;
        REQ(p->smp_rows, "out of host memory for %d sampling rows", rows);
    }
    if (n_pen > p->smp_pen_cap) {
        pinned_free(p->smp_pen);
        p->smp_pen = (int32_t *)pinned_alloc((size_t)n_pen * sizeof *p->smp_pen);
        p->smp_pen_cap = p->smp_pen ? n_pen : 0;
        REQ(p->smp_pen, "out of host memory for %d penalty ids", n_pen);
    }
    int off = 0;
    for (int r = 0; r < rows; r++) {
        const tl_backend_sample *s = &b->sample[r];
        tl_cuda_sample_row *o = &p->smp_rows[r];
        memset(o, 0, sizeof *o);
        if (!s->on_device) continue; /* a greedy row whose id nobody reads */
        o->top_k = s->top_k;
        o->temperature = s->temperature;
        o->top_p = s->top_p;
        o->min_p = s->min_p;
        o->repeat_penalty = s->repeat_penalty;
        o->u = s->u;
        o->pen_off = off;
        o->pen_len = s->n_penalty;
        if (s->n_penalty) memcpy(p->smp_pen + off, s->penalty_ids, (size_t)s->n_penalty * sizeof(int32_t));
        off += s->n_penalty;
    }
    TRY(tl_cuda_sample(p->c, b->ids_out, p->logits, rows, p->n_vocab, p->smp_rows, p->smp_pen, n_pen));
    return 0;
}

static int pl_forward(void *ctx, const tl_backend_batch *b, float *logits_host, char *msg, size_t cap) {
    if (msg && cap) msg[0] = 0;
    plugin *p = (plugin *)ctx;
    REQ(p && b, "NULL context or batch");
    /* this thread may not have used the device yet (the plugin's own kernels need it current) */
    cudaError_t ce = cudaSetDevice(p->c->device);
    if (ce != cudaSuccess) {
        (void)cudaGetLastError();
        return pl_fail(msg, cap, TL_CUDA_ERR_CUDA, "cudaSetDevice", __FILE__, __LINE__, "%s", cudaGetErrorString(ce));
    }
    if (p->unfinished) {
        TRY(tl_cuda_sync(p->c));
        p->unfinished = 0;
    }
    const int T = b->T, n_seq = b->n_seq, depth = b->depth;
    REQ(n_seq >= 1 && T >= n_seq, "batch of %d tokens from %d sequences", T, n_seq);
    REQ(T <= p->max_batch_tokens, "batch of %d tokens exceeds max_batch_tokens %d", T, p->max_batch_tokens);
    REQ(b->tokens && b->pos && b->tok_seq && b->block_ids && b->n_logical && b->phys_layer,
        "NULL array in the batch");
    REQ(depth >= 1, "depth %d", depth);
    tl_cuda *c = p->c;
    const int bs = p->kv.block_size;
    const int D = p->n_embd, hd = p->head_dim, q_dim = p->n_head * hd, kv_dim = p->n_head_kv * hd;

    for (int vl = 0; vl < depth; vl++)
        REQ(b->phys_layer[vl] >= 0 && b->phys_layer[vl] < p->n_layer,
            "virtual layer %d maps to physical layer %d of %d",
            vl, b->phys_layer[vl], p->n_layer);

    /* Tokens of a sequence are contiguous, in order, at consecutive positions. */
    int max_nl = 0;
    for (int s = 0; s < n_seq; s++) {
        REQ(b->block_ids[s] || b->n_logical[s] == 0, "sequence %d has no block table", s);
        if (b->n_logical[s] > max_nl) max_nl = b->n_logical[s];
    }
    for (int t = 0; t < T; t++) {
        const int s = b->tok_seq[t];
        REQ(b->tokens[t] >= 0 && b->tokens[t] < p->n_vocab, "token %d: id %d outside the vocab [0, %d)", t,
            b->tokens[t], p->n_vocab);
        REQ(s >= 0 && s < n_seq, "token %d: sequence %d of %d", t, s, n_seq);
        if (t == 0) {
            REQ(s == 0, "the batch starts with sequence %d, not 0 (tokens must be grouped by sequence, in order)", s);
        } else {
            const int ps = b->tok_seq[t - 1];
            REQ(s == ps || s == ps + 1,
                "token %d: sequence %d after %d (tokens must be grouped by sequence, in order)", t, s, ps);
            REQ(s != ps || b->pos[t] == b->pos[t - 1] + 1,
                "token %d of sequence %d: position %d after %d (positions must be consecutive)", t, s, b->pos[t],
                b->pos[t - 1]);
        }
        REQ(b->pos[t] >= 0, "token %d: position %d", t, b->pos[t]);
        const int lb = b->pos[t] / bs;
        REQ(lb < b->n_logical[s], "token %d (sequence %d, position %d): logical block %d beyond the table's %d", t, s,
            b->pos[t], lb, b->n_logical[s]);
        for (int vl = 0; vl < depth; vl++) {
            const int id = b->block_ids[s][(size_t)lb * depth + vl];
            REQ(id >= 0 && id < p->kv_blocks, "sequence %d, logical block %d, virtual layer %d: block id %d of %d", s,
                lb, vl, id, p->kv_blocks);
        }
    }
    REQ(b->tok_seq[T - 1] == n_seq - 1,
        "the batch's last token belongs to sequence %d of %d (a sequence without tokens)",
        b->tok_seq[T - 1], n_seq);

    /* Pack the metadata: one upload. */
    const size_t stride = (size_t)max_nl * depth; /* flattened tables (n_seq, stride) */
    const size_t o_tok = 0, o_pos = o_tok + T, o_slot = o_pos + T, o_qs = o_slot + (size_t)depth * T,
                 o_ql = o_qs + n_seq, o_p0 = o_ql + n_seq, o_win = o_p0 + n_seq, o_last = o_win + n_seq,
                 o_tab = o_last + n_seq, total = o_tab + (size_t)n_seq * stride + 1;
    int rc = meta_reserve(p, total, msg, cap);
    if (rc) return rc;
    int32_t *h = p->meta_h;
    memcpy(h + o_tok, b->tokens, (size_t)T * sizeof(int32_t));
    memcpy(h + o_pos, b->pos, (size_t)T * sizeof(int32_t));
    for (int t = 0; t < T; t++) {
        const int s = b->tok_seq[t], pos = b->pos[t];
        for (int vl = 0; vl < depth; vl++)
            h[o_slot + (size_t)vl * T + t] = b->block_ids[s][(size_t)(pos / bs) * depth + vl] * bs + pos % bs;
    }
    int max_q = 0, rows = 0, max_pos = 0;
    for (int t = 0; t < T; t++)
        if (b->pos[t] + 1 > max_pos) max_pos = b->pos[t] + 1;
    for (int t = 0, s = 0; s < n_seq; s++) {
        const int t0 = t;
        while (t < T && b->tok_seq[t] == s) t++;
        h[o_qs + s] = t0;
        h[o_ql + s] = t - t0;
        h[o_p0 + s] = b->pos[t0];
        h[o_win + s] = b->window ? b->window[s] : 0;
        if (t - t0 > max_q) max_q = t - t0;
        if (!b->want_logits || b->want_logits[s]) h[o_last + rows++] = t - 1;
        int32_t *tab = h + o_tab + (size_t)s * stride;
        const size_t n = (size_t)b->n_logical[s] * depth;
        if (n) memcpy(tab, b->block_ids[s], n * sizeof(int32_t));
        for (size_t i = n; i < stride; i++) tab[i] = -1;
    }
    if (rows) {
        rc = logits_reserve(p, (size_t)rows * p->n_vocab, msg, cap);
        if (rc) return rc;
    }
    p->unfinished = 1; /* cleared when the pass has synchronised */
    TRY(tl_cuda_upload(c, p->meta_d, h, total * sizeof(int32_t)));
    const int32_t *d = p->meta_d;
    const int32_t *tok_d = d + o_tok, *pos_d = d + o_pos;

    /* Embeddings. */
    TRY(tl_cuda_get_rows(c, p->x, p->tok_embd.d, p->tok_embd.type, D, p->n_vocab, tok_d, T));
    if (p->embd_scale) TRY(scale(c, p->x, sqrtf((float)D), (int64_t)T * D));

    const int decode = T == n_seq; /* one new token per sequence */
    const float att_scale = 1.0f / sqrtf((float)hd);
    const float eps = p->norm_eps;
    for (int vl = 0; vl < depth; vl++) {
        const int L = b->phys_layer[vl];
        const dev_layer *ly = &p->layers[L];
        const int window = p->layer_window[L];
        const float base = window && p->rope_base_swa > 0 ? p->rope_base_swa : p->rope_base;

        TRY(tl_cuda_rmsnorm(c, p->xb, p->x, ly->attn_norm, T, D, eps));
        TRY(mm(p, p->q, p->xb, &ly->wq, T));
        TRY(mm(p, p->k, p->xb, &ly->wk, T));
        TRY(mm(p, p->v, p->xb, &ly->wv, T));
        if (ly->bq) TRY(add_bias(c, p->q, ly->bq, T, q_dim));
        if (ly->bk) TRY(add_bias(c, p->k, ly->bk, T, kv_dim));
        if (ly->bv) TRY(add_bias(c, p->v, ly->bv, T, kv_dim));
        if (ly->q_norm) TRY(tl_cuda_rmsnorm(c, p->q, p->q, ly->q_norm, T * p->n_head, hd, eps));
        if (ly->k_norm) TRY(tl_cuda_rmsnorm(c, p->k, p->k, ly->k_norm, T * p->n_head_kv, hd, eps));
        TRY(tl_cuda_rope(c, p->q, T, q_dim, p->n_head, hd, p->n_rot, pos_d, base, p->rope_type, p->rope_freqs));
        TRY(tl_cuda_rope(c, p->k, T, kv_dim, p->n_head_kv, hd, p->n_rot, pos_d, base, p->rope_type, p->rope_freqs));
        TRY(tl_cuda_kv_store(c, &p->kv, p->k, p->v, kv_dim, T, d + o_slot + (size_t)vl * T));

        tl_cuda_attn_seqs sq;
        sq.n_seq = n_seq;
        sq.q_start = d + o_qs;
        sq.q_len = d + o_ql;
        sq.pos0 = d + o_p0;
        sq.block_ids = d + o_tab + vl;
        sq.seq_stride = (int)stride;
        sq.blk_stride = depth;
        sq.window = d + o_win;
        sq.max_q_len = max_q;
        sq.split = p->attn_split; /* -1 in the exact mode: a split changes the summation order */
        sq.max_pos = max_pos;
        if (decode)
            TRY(tl_cuda_attn_decode(c, p->att, p->q, q_dim, &p->kv, &sq, p->n_head, window, att_scale));
        else
            TRY(tl_cuda_attn_prefill(c, p->att, p->q, q_dim, &p->kv, &sq, p->n_head, window, att_scale));

        TRY(mm(p, p->o, p->att, &ly->wo, T));
        if (ly->post_attn_norm) TRY(tl_cuda_rmsnorm(c, p->o, p->o, ly->post_attn_norm, T, D, eps));
        TRY(tl_cuda_add(c, p->x, p->x, p->o, (int64_t)T * D));
        TRY(tl_cuda_rmsnorm(c, p->xb, p->x, ly->ffn_norm, T, D, eps));
        TRY(mm(p, p->hb, p->xb, &ly->w_gate, T));
        TRY(mm(p, p->hb2, p->xb, &ly->w_up, T));
        if (p->ffn_act == 1)
            TRY(tl_cuda_geglu(c, p->hb, p->hb, p->hb2, (int64_t)T * p->n_ff));
        else
            TRY(tl_cuda_swiglu(c, p->hb, p->hb, p->hb2, (int64_t)T * p->n_ff));
        TRY(mm(p, p->o, p->hb, &ly->w_down, T));
        if (ly->post_ffn_norm) TRY(tl_cuda_rmsnorm(c, p->o, p->o, ly->post_ffn_norm, T, D, eps));
        TRY(tl_cuda_add(c, p->x, p->x, p->o, (int64_t)T * D));
    }

    if (rows) {
        /* Last token of each wanting sequence: gather (x as an f32 table), norm, project. */
        TRY(tl_cuda_get_rows(c, p->lx, p->x, TLC_F32, D, T, d + o_last, rows));
        TRY(tl_cuda_rmsnorm(c, p->lx, p->lx, p->output_norm, rows, D, eps));
        TRY(mm(p, p->logits, p->lx, &p->output, rows));
        if ((rc = finish_rows(p, b, rows, logits_host, msg, cap))) return rc; /* ends with a download */
    } else {
        TRY(tl_cuda_sync(c)); /* surface asynchronous faults of this batch here */
    }
    p->unfinished = 0;
    return 0;
}

/* ---- copy-on-write ---------------------------------------------------------- */

static int pl_copy_block(void *ctx, int dst, int src, char *msg, size_t cap) {
    if (msg && cap) msg[0] = 0;
    plugin *p = (plugin *)ctx;
    REQ(p, "NULL context");
    REQ(dst >= 0 && dst < p->kv_blocks && src >= 0 && src < p->kv_blocks, "block ids dst %d, src %d of %d", dst, src,
        p->kv_blocks);
    TRY(tl_cuda_kv_copy(p->c, &p->kv, dst, src));
    return 0;
}

static int pl_kv_blocks(void *ctx) { return ctx ? ((plugin *)ctx)->kv_blocks : 0; }

static const tl_backend_ops cuda_ops = {
    "cuda", TL_BACKEND_ABI, pl_init, pl_free, pl_forward, pl_copy_block, pl_kv_blocks, TL_CUDA_SAMPLE_MAX_K,
};

extern "C" TL_CUDA_API const tl_backend_ops *tl_backend_plugin_v1(void) { return &cuda_ops; }
