/* plugin.cu - the CUDA backend behind the engine's plugin interface
 * (engine/backend.h): tl_backend_plugin_v1() returns the ops table.
 *
 * init uploads every weight in its packed type (the matmul launcher
 * dequantizes on the fly or through the GEMM path), allocates the paged KV
 * arena, activation scratch for max_batch_tokens tokens and the per-batch
 * metadata buffer; the forward pass is in forward.cu. kv_io moves one
 * KV block to or from the host for the engine's KV tiers (tl_cuda_io).
 *
 * Every failure returns < 0 with "call failed at file:line: detail" in msg;
 * nothing aborts. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../engine/backend.h"
#include "plugin_impl.h"

/* ---- errors ----------------------------------------------------------------- */

int pl_fail(char *msg, size_t cap, int rc, const char *call, const char *file, int line, const char *fmt, ...) {
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

/* A device buffer of `bytes` in the allocation list (freed with the
 * plugin); host: the data it will hold a copy of (shared by a later
 * upload of the same data), or NULL. Failures name `what`. */
static int dev_tracked(plugin *p, const void *host, size_t bytes, void **out, const char *what, char *msg,
                       size_t cap) {
    *out = NULL;
    void *d = NULL;
    int rc = tl_cuda_alloc(p->c, bytes, &d);
    if (rc < 0)
        return pl_fail(msg, cap, rc, "tl_cuda_alloc", __FILE__, __LINE__, "%s: %zu bytes (%.1f MiB): %s", what, bytes,
                       bytes / 1048576.0, tl_cuda_last_error());
    if (track(p, host, bytes, d)) {
        tl_cuda_dealloc(p->c, d);
        return pl_fail(msg, cap, TL_CUDA_ERR_NOMEM, "realloc", __FILE__, __LINE__, "host allocation list");
    }
    *out = d;
    return 0;
}

/* Device buffer of `bytes`, zeroed, freed with the plugin. */
static int dev_alloc(plugin *p, size_t bytes, void **out, const char *what, char *msg, size_t cap) {
    if (bytes == 0) bytes = 256;
    int rc = dev_tracked(p, NULL, bytes, out, what, msg, cap);
    if (rc) return rc;
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
    int rc = dev_tracked(p, host, bytes, &d, what, msg, cap);
    if (rc) return rc;
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
    REQ(!w->packed, "%s: rows repacked for the CPU (TL_PACK8 / TL_PACK16); describe a model opened without repacking", name);
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
        void *d = NULL;
        if ((rc = dev_tracked(p, NULL, (size_t)w->n_out * w->n_in * 2, &d, "f16 weight copy", msg, cap))) break;
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
void *pinned_alloc(size_t bytes) {
    void *h = NULL;
    if (cudaMallocHost(&h, bytes ? bytes : 1) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return h;
}

void pinned_free(void *h) {
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
    for (int i = 0; i < p->n_maps; i++) free(p->maps[i]);
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
    /* store-h blocks hold normed hidden states that attention re-projects
     * into K and V on every read: only the CPU path does that. */
    static const char *const kv_names[TL_KVT_COUNT] = {"f16", "f32", "q8", "q4"};
    const tl_kv_layout *kl = &m->kv_layout;
    REQ(kl->type_k >= 0 && kl->type_k < TL_KVT_COUNT && (kl->store_h || (kl->type_v >= 0 && kl->type_v < TL_KVT_COUNT)),
        "unknown KV row types (K %d, V %d)", kl->type_k, kl->type_v);
    REQ(!kl->store_h,
        "KV mode h:%s (store-h: blocks hold hidden states, K and V recomputed at read) runs on the CPU only; the "
        "CUDA backend holds K and V rows (f16, f32, q8, q4, or '<k>,<v>' such as q8,f16)", kv_names[kl->type_k]);
    REQ(m->kv_type == kl->type_k, "kv_type %d differs from kv_layout.type_k %d", m->kv_type, kl->type_k);
    REQ(kl->block_size == m->kv_block_size, "kv_layout.block_size %d, kv_block_size %d", kl->block_size,
        m->kv_block_size);
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
    const char *gr = getenv("TINYLOOP_CUDA_GRAPHS");
    tl_cuda_graph_enable(p->c, !(gr && !strcmp(gr, "0"))); /* decode steps replay CUDA graphs unless =0 */

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
    p->kv.type_k = kl->type_k;
    p->kv.type_v = kl->type_v;
    p->kv.block_size = m->kv_block_size;
    p->kv.n_head_kv = m->n_head_kv;
    p->kv.head_dim = hd;
    const size_t bb = tl_cuda_kv_block_bytes(&p->kv);
    REQ(bb > 0, "KV mode %s,%s with head_dim %d: no block layout (q4 needs an even head_dim)", kv_names[kl->type_k],
        kv_names[kl->type_v], hd);
    /* the engine sized its blocks (and copies them) by this same layout */
    REQ(bb == kl->block_bytes, "KV block of %zu bytes; the engine's layout has %zu", bb, kl->block_bytes);
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
    {
        size_t wbytes = 0;
        for (int i = 0; i < p->n_up; i++) wbytes += p->up[i].bytes;
        char what[160];
        snprintf(what, sizeof what, "KV arena of %d blocks x %zu bytes (caller sized %zu bytes) next to %.1f MiB of "
                 "weights", p->kv_blocks, bb, m->kv_mem, wbytes / 1048576.0);
        void *a = NULL;
        int r = dev_tracked(p, NULL, bb * (size_t)p->kv_blocks, &a, what, msg, cap);
        if (r) return r;
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

extern "C" TL_CUDA_API int tl_cuda_plugin_read_kv_block(void *ctx, int id, void *dst, size_t bytes) {
    plugin *p = (plugin *)ctx;
    if (!p || !dst || id < 0 || id >= p->kv_blocks || bytes > tl_cuda_kv_block_bytes(&p->kv))
        return tlc_fail(TL_CUDA_ERR_ARG, __func__, __FILE__, __LINE__, "bad arguments (block %d of %d, %zu bytes)", id,
                        p ? p->kv_blocks : 0, bytes);
    return tl_cuda_download(p->c, dst, (const uint8_t *)p->kv.arena + (size_t)id * tl_cuda_kv_block_bytes(&p->kv),
                            bytes);
}

/* ---- KV tiers ---------------------------------------------------------------- */

static int pl_kv_io(void *ctx, int block, void *host, int to_device, char *msg, size_t cap) {
    if (msg && cap) msg[0] = 0;
    plugin *p = (plugin *)ctx;
    REQ(p && host, "NULL context or host buffer");
    REQ(block >= 0 && block < p->kv_blocks, "block id %d of %d", block, p->kv_blocks);
    const size_t bb = tl_cuda_kv_block_bytes(&p->kv);
    TRY(tl_cuda_io(p->c, (uint8_t *)p->kv.arena + (size_t)block * bb, host, bb, to_device));
    return 0;
}

static int pl_kv_blocks(void *ctx) { return ctx ? ((plugin *)ctx)->kv_blocks : 0; }

static const tl_backend_ops cuda_ops = {
    "cuda", TL_BACKEND_ABI, pl_init, pl_free, pl_forward, pl_copy_block, pl_kv_blocks, pl_kv_io, TL_CUDA_SAMPLE_MAX_K,
};

extern "C" TL_CUDA_API const tl_backend_ops *tl_backend_plugin_v1(void) { return &cuda_ops; }

