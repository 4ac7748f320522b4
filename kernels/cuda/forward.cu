/* forward.cu - the plugin's forward pass (ops->forward). It packs the
 * batch metadata (tokens, positions, per-virtual-layer KV slots,
 * per-sequence query ranges, windows, block tables, last-token rows) into
 * one host buffer, uploads it with one copy, enqueues every layer on the
 * context's stream and synchronises only in the final logits (or sampled
 * ids) download. It mirrors engine/forward.c step by step. A decode step's
 * layers go through tl_cuda_graph_run (graph.cu): captured once per shape,
 * then replayed with one launch. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../engine/backend.h"
#include "plugin_impl.h"

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

static int add_bias(tl_cuda *c, float *x, const float *b, int n_rows, int n) {
    if (n_rows <= 0 || n <= 0) return TL_CUDA_OK;
    kernel_add_bias<<<tlc_grid_for((int64_t)n_rows * n), 256, 0, c->stream>>>(x, b, n_rows, n);
    TLC_LAUNCHED(kernel_add_bias);
    return TL_CUDA_OK;
}

static int scale(tl_cuda *c, float *x, float s, int64_t n) {
    if (n <= 0) return TL_CUDA_OK;
    kernel_scale<<<tlc_grid_for(n), 256, 0, c->stream>>>(x, s, n);
    TLC_LAUNCHED(kernel_scale);
    return TL_CUDA_OK;
}

/* ---- forward ---------------------------------------------------------------- */

/* Grows the metadata buffers (host staging and device) to n int32s. */
static int meta_reserve(plugin *p, size_t n, char *msg, size_t cap) {
    if (n <= p->meta_cap) return 0;
    size_t ncap = p->meta_cap ? p->meta_cap : 4096;
    while (ncap < n) ncap *= 2;
    tl_cuda_graph_reset(p->c); /* they read the old buffers */
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
    tl_cuda_graph_reset(p->c);
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

/* Logical blocks a decode step's tables are padded to. */
static int table_bucket(int n) {
    int b = 1;
    while (b < n && b < 64) b *= 2;
    return n <= b ? b : (n + 63) / 64 * 64;
}

/* The number standing for the batch's virtual-to-physical layer map in a
 * decode graph's key (the graph holds those layers' weights). Requests at
 * different loop depths alternate maps; each keeps its number while it is
 * among the last TL_CUDA_LAYER_MAPS seen, so their graphs stay usable. */
static int64_t layer_map_id(plugin *p, const tl_backend_batch *b) {
    const size_t bytes = (size_t)b->depth * sizeof(int);
    for (int i = 0; i < p->n_maps; i++)
        if (p->map_len[i] == b->depth && !memcmp(p->maps[i], b->phys_layer, bytes)) return p->map_id[i];
    int *m = (int *)malloc(bytes);
    if (!m) return -1 - p->next_map_id++; /* unremembered: a number no later step gets */
    memcpy(m, b->phys_layer, bytes);
    int i;
    if (p->n_maps < TL_CUDA_LAYER_MAPS) {
        i = p->n_maps++;
    } else { /* the oldest goes; its graphs age out of the LRU */
        i = p->map_victim++ % TL_CUDA_LAYER_MAPS;
        free(p->maps[i]);
    }
    p->maps[i] = m;
    p->map_len[i] = b->depth;
    p->map_id[i] = p->next_map_id++;
    return p->map_id[i];
}

/* One forward pass's device work, from the uploaded metadata to the
 * wanted rows' logits; host values it passes to launchers come from here
 * (or from the plugin), which the decode graph key covers. */
typedef struct pass {
    plugin *p;
    const tl_backend_batch *b;
    int T, n_seq, depth, rows, max_q, max_pos, stride;
    size_t o_slot, o_qs, o_ql, o_p0, o_win, o_last, o_tab; /* metadata offsets (int32s) */
    char *msg;
    size_t cap;
} pass;

static int enqueue_pass(void *arg) {
    const pass *ps = (const pass *)arg;
    plugin *p = ps->p;
    const tl_backend_batch *b = ps->b;
    char *msg = ps->msg;
    const size_t cap = ps->cap;
    tl_cuda *c = p->c;
    const int T = ps->T;
    const int D = p->n_embd, hd = p->head_dim, q_dim = p->n_head * hd, kv_dim = p->n_head_kv * hd;
    const int32_t *d = p->meta_d;
    const int32_t *tok_d = d, *pos_d = d + T; /* o_tok = 0, o_pos = T */

    /* Embeddings, or a resume handle's hidden states entering vl_begin. */
    int vl0 = 0;
    if (b->x_in) {
        TRY(tl_cuda_upload(c, p->x, b->x_in, (size_t)T * D * sizeof(float)));
        vl0 = b->vl_begin;
    } else {
        TRY(tl_cuda_get_rows(c, p->x, p->tok_embd.d, p->tok_embd.type, D, p->n_vocab, tok_d, T));
        if (p->embd_scale) TRY(scale(c, p->x, sqrtf((float)D), (int64_t)T * D));
    }

    const int decode = T == ps->n_seq;
    const float att_scale = 1.0f / sqrtf((float)hd);
    const float eps = p->norm_eps;
    for (int vl = vl0; vl < ps->depth; vl++) {
        if (b->x_capture && vl == b->vl_capture) /* a resume build: never inside a graph */
            TRY(tl_cuda_download(c, b->x_capture, p->x, (size_t)T * D * sizeof(float)));
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
        TRY(tl_cuda_kv_store(c, &p->kv, p->k, p->v, kv_dim, T, d + ps->o_slot + (size_t)vl * T));

        tl_cuda_attn_seqs sq;
        sq.n_seq = ps->n_seq;
        sq.q_start = d + ps->o_qs;
        sq.q_len = d + ps->o_ql;
        sq.pos0 = d + ps->o_p0;
        sq.block_ids = d + ps->o_tab + vl;
        sq.seq_stride = ps->stride;
        sq.blk_stride = ps->depth;
        sq.window = d + ps->o_win;
        sq.max_q_len = ps->max_q;
        sq.split = p->attn_split; /* -1 in the exact mode: a split changes the summation order */
        sq.max_pos = ps->max_pos;
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

    if (ps->rows) {
        /* Last token of each wanting sequence: gather (x as an f32 table), norm, project. */
        TRY(tl_cuda_get_rows(c, p->lx, p->x, TLC_F32, D, T, d + ps->o_last, ps->rows));
        TRY(tl_cuda_rmsnorm(c, p->lx, p->lx, p->output_norm, ps->rows, D, eps));
        TRY(mm(p, p->logits, p->lx, &p->output, ps->rows));
    }
    return 0;
}

int pl_forward(void *ctx, const tl_backend_batch *b, float *logits_host, char *msg, size_t cap) {
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

    REQ(!b->x_in || (b->vl_begin >= 0 && b->vl_begin < depth), "vl_begin %d outside [0, %d)", b->vl_begin, depth);
    REQ(!b->x_capture || (b->vl_capture >= 0 && b->vl_capture < depth), "vl_capture %d outside [0, %d)",
        b->vl_capture, depth);
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

    /* Pack the metadata: one upload. A decode step rounds its block tables
     * up to a bucket of logical blocks (a power of two, then multiples of
     * 64), so the table layout and the attention split that sizes follow
     * from it stay fixed for many steps and a captured graph fits them. */
    const int decode = T == n_seq; /* one new token per sequence */
    const int nl = decode ? table_bucket(max_nl) : max_nl;
    const size_t stride = (size_t)nl * depth; /* flattened tables (n_seq, stride) */
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
    /* decode: a bound on the positions, fixed with the bucket */
    int max_q = 0, rows = 0, max_pos = decode ? nl * bs : 0;
    for (int t = 0; !decode && t < T; t++)
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

    const pass ps = {p, b, T, n_seq, depth, rows, max_q, max_pos, (int)stride, /* in field order */
                     o_slot, o_qs, o_ql, o_p0, o_win, o_last, o_tab, msg, cap};
    if (decode && !b->x_in && !b->x_capture) {
        /* Everything enqueue_pass freezes into a graph: the offsets above
         * follow from T, n_seq, depth and the stride; the buffers are the
         * plugin's (a reallocation forgets the graphs). */
        const int64_t key[] = {T, n_seq, depth, (int64_t)stride, max_pos, rows, layer_map_id(p, b)};
        rc = tl_cuda_graph_run(c, key, (int)(sizeof key / sizeof key[0]), enqueue_pass, (void *)&ps);
        if (rc < 0) return msg && msg[0] ? rc : pl_fail(msg, cap, rc, "tl_cuda_graph_run", __FILE__, __LINE__, "%s",
                                                        tl_cuda_last_error());
        if (msg && cap) msg[0] = 0; /* a failed capture's message, when the eager rerun succeeded */
    } else {
        rc = enqueue_pass((void *)&ps);
        if (rc < 0) return rc;
    }

    if (rows) {
        if ((rc = finish_rows(p, b, rows, logits_host, msg, cap))) return rc; /* ends with a download */
    } else {
        TRY(tl_cuda_sync(c)); /* surface asynchronous faults of this batch here */
    }
    p->unfinished = 0;
    return 0;
}
