/* attention.c - attention over the paged KV cache for the CPU forward
 * pass (forward.c): each token's scores against its sequence's K rows, the
 * softmax and the weighted V sums, per query chunk and KV head, with the
 * K/V rows read in place where the kernels take them; the K/V stores;
 * store-h's recomputed K/V; the split of a decode step over the threads.
 * Every token's values come out bitwise the same whatever the batch, the
 * chunk or the thread count (the comments at each step say why). */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "forward_impl.h"
#include "forward_ops.h"
#include "kv_mode.h"
#include "quants.h"
#include "threadpool.h"
#include "util.h"

/* ---- attention over the paged KV ------------------------------------------- */

typedef struct {
    tl_model *m;
    tl_seq **seqs;
    int vl, T;
    int layer_window;  /* sliding window of this layer, 0 = none */
    float scale;
    int c0, c1;        /* the query chunks to run */
    int h_p0;          /* store-h: position of the first row of scratch hk / hv */
    int dynamic;       /* prefill: tasks taken from next_task (see take_task) */
    int parts;         /* decode: > 0 when runs are claimed from next_task (see claim_next) */
    atomic_int next_task;
} att_ctx;

/* K (v 0) or V (v 1) rows of head kh in logical block b, as f32 rows *ld
 * floats apart. The layout inside a block is [head][position][row], so a
 * head's slice is contiguous and converts in one call (into buf, which
 * holds block_size * head_dim floats). Store-h reads the sequence's K and
 * V recomputed for this layer (h_recompute). */
static const float *att_rows(const att_ctx *c, const tl_seq *seq, int b, int kh, int v, int rows, float *buf,
                             size_t *ld) {
    const tl_kv_pool *kv = &c->m->kv;
    const tl_kv_layout *l = &kv->layout;
    int hd = c->m->hp.head_dim, kv_dim = c->m->hp.n_head_kv * hd;
    if (l->store_h) {
        *ld = (size_t)kv_dim;
        const float *base = v ? c->m->scratch->hv : c->m->scratch->hk;
        return base + (size_t)(b * kv->block_size - c->h_p0) * kv_dim + (size_t)kh * hd;
    }
    *ld = (size_t)hd;
    int id = seq->bt.ids[b * seq->bt.depth + c->vl];
    int type = v ? l->type_v : l->type_k;
    size_t rb = v ? l->row_bytes_v : l->row_bytes_k;
    const uint8_t *src = (v ? tl_kv_v(kv, id) : tl_kv_k(kv, id)) + tl_kv_row_off(l, kh, 0, rb);
    if (type == TL_KVT_F32) return (const float *)(const void *)src;
    tl_kv_load_row(type, l->group, src, buf, rows * hd);
    return buf;
}

/* The same rows read in place when they are f16 and the level reads f16
 * rows directly (tl_attn_has_f16_rows), else NULL. */
static const uint16_t *att_rows_f16(const att_ctx *c, const tl_seq *seq, int b, int kh, int v) {
    const tl_kv_pool *kv = &c->m->kv;
    const tl_kv_layout *l = &kv->layout;
    if (l->store_h || (v ? l->type_v : l->type_k) != TL_KVT_F16 || c->m->hp.head_dim < 32 || !tl_attn_has_f16_rows())
        return NULL;
    int id = seq->bt.ids[b * seq->bt.depth + c->vl];
    size_t rb = v ? l->row_bytes_v : l->row_bytes_k;
    return (const uint16_t *)(const void *)((v ? tl_kv_v(kv, id) : tl_kv_k(kv, id)) + tl_kv_row_off(l, kh, 0, rb));
}

/* A task reads each block's K rows of its head, then each block's V rows:
 * a few KiB per block, scattered over the pool, which the hardware
 * prefetcher does not see coming (and would not follow across pages), so
 * for a decoding token each block started with misses to DRAM; attention
 * was a third of a decode step at 512 positions. The K blocks then the V
 * blocks are one stream of items, and the item PF_ITEMS ahead is asked
 * into L2 as each is read (pf_cursor), landing while earlier ones are
 * summed. Zen 4, one thread, 512-640 positions:
 * 110M Q4_0 attention 3.0-3.2 -> 1.7-2.0 ms a token, Gemma 3 270M (4
 * query heads a KV head, the converting path) 2.2-2.5 -> 1.6; prefill
 * unchanged. 32 items (64 KiB of f16 rows at head_dim 64) ahead rather
 * than 8: 16 sequences at positions to 144, one thread, 3.7-4.0 -> 3.0-3.7
 * ms a step; two threads and one sequence at 512 the same within the
 * noise (8 to 32). */
enum { PF_ITEMS = 32 };
/* Head kh's K (v 0) or V (v 1) rows of logical block b, into L2. */
static void prefetch_block(const att_ctx *c, const tl_seq *seq, int b, int kh, int v) {
    const tl_kv_pool *kv = &c->m->kv;
    const tl_kv_layout *l = &kv->layout;
    if (l->store_h) return; /* recomputed rows: not in the pool */
    int id = seq->bt.ids[b * seq->bt.depth + c->vl];
    size_t rb = v ? l->row_bytes_v : l->row_bytes_k;
    tl_prefetch((v ? tl_kv_v(kv, id) : tl_kv_k(kv, id)) + tl_kv_row_off(l, kh, 0, rb), (size_t)kv->block_size * rb);
}

/* The softmax of query head h's n scores, for keys j0.. of the query at
 * pos, which `scale` multiplies as they are read (1 when they were scaled
 * already). Gemma 2 first caps each scaled score, cap * tanh(s / cap), as
 * llama.cpp's ggml_softcap does; ALiBi (bloom, mpt) adds slope_h * (j -
 * pos), as ggml's soft_max adds slope times its -|i - j| mask. */
static void att_softmax(const att_ctx *c, float *x, int n, float scale, int h, int pos, int j0) {
    if (c->m->alibi) {
        const float slope = c->m->alibi[h];
        for (int i = 0; i < n; i++) x[i] = x[i] * scale + slope * (float)(j0 + i - pos);
        scale = 1.0f;
    }
    const float cap = c->m->hp.attn_softcap;
    if (cap > 0) {
        const float inv = 1.0f / cap;
        for (int i = 0; i < n; i++) x[i] = tanhf(x[i] * scale * inv) * cap;
        scale = 1.0f;
    }
    tl_softmax_f32(x, n, scale);
}

static float dot_small(const float *a, const float *b, int n) {
    if (n >= 32) return tl_dot_f32(a, b, n);
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* One query's scores against rows [r0, r1) of a block, into o[0, r1 - r0):
 * f16 rows read in place (k16) or f32 rows k, ld elements apart. */
static void query_scores(const att_ctx *c, const float *q, const uint16_t *k16, const float *k, size_t ld, int r0,
                         int r1, float *o) {
    int hd = c->m->hp.head_dim;
    if (k16)
        tl_dot_rows_f16(q, k16 + (size_t)r0 * ld, ld, r1 - r0, hd, c->scale, o);
    else if (hd >= 32) /* bitwise the dot_small calls, in one call */
        tl_dot_rows_f32(q, k + (size_t)r0 * ld, ld, r1 - r0, hd, c->scale, o);
    else
        for (int r = r0; r < r1; r++) o[r - r0] = dot_small(q, k + (size_t)r * ld, hd) * c->scale;
}

/* The window a sequence's tokens attend over in a layer: the narrower of
 * the request's cache_window and the layer's sliding window (0: none). */
static inline int seq_window(const tl_seq *seq, int layer_window) {
    return tl_window_narrower(layer_window, seq->window);
}

/* The blocks a token sees: logical blocks [b0, b1], from row r0 of b0 to
 * row r1 (exclusive) of b1; computed once per token of a task, as the
 * block loops ask for every (block, token) pair. */
typedef struct {
    int b0, r0, b1, r1;
} tok_span;

static inline tok_span token_span(int bs, int pos, int w) {
    int j0 = tl_window_first(pos, w);
    return (tok_span){j0 / bs, j0 % bs, pos / bs, pos % bs + 1};
}

/* What task i covers: tokens [ta, tb) of one chunk, KV head kh, their
 * sequence and window, and the logical blocks [b_first, b_first + nb). */
typedef struct {
    int ta, tb, kh, w, b_first, nb;
    const tl_seq *seq;
} att_where;

static att_where task_where(const att_ctx *c, int i) {
    const tl_scratch *s = c->m->scratch;
    const int n_kv = c->m->hp.n_head_kv, bs = c->m->kv.block_size, ci = c->c0 + i / n_kv;
    att_where a = {.ta = s->chunk_t0[ci], .tb = s->chunk_t0[ci + 1], .kh = i % n_kv};
    a.seq = c->seqs[s->tok_seq[a.ta]];
    a.w = seq_window(a.seq, c->layer_window);
    a.b_first = token_span(bs, s->tok_pos[a.ta], a.w).b0;
    a.nb = s->tok_pos[a.tb - 1] / bs - a.b_first + 1;
    return a;
}

/* Which tasks a thread runs: where the KV heads divide evenly among the
 * threads, each takes a contiguous run of heads of every chunk (its half
 * of each block's rows, one address range, with two threads), else every
 * nth task. Either way each sequence's heads are shared out evenly; dealt
 * one by one, two threads read alternate 2 KiB pieces of every block. 110M
 * Q8_0, 16 sequences at positions to 144, two threads, five interleaved
 * runs: attention 2.10-3.55 -> 1.83-2.35 ms a step; one sequence at 512
 * positions and Gemma (one KV head: every nth task) unchanged. */
typedef struct {
    int h0, h1, n_kv, nth; /* this thread's heads [h0, h1), or h1 < 0: every nth task */
} task_deal;

/* h0 is also the thread's first task in both ways of dealing. */
static task_deal deal_of(int n_kv, int ith, int nth) {
    if (n_kv % nth) return (task_deal){ith, -1, n_kv, nth};
    return (task_deal){n_kv * ith / nth, n_kv * (ith + 1) / nth, n_kv, nth};
}

static int deal_next(const task_deal *d, int i) {
    if (d->h1 < 0) return i + d->nth;
    return i % d->n_kv + 1 < d->h1 ? i + 1 : (i / d->n_kv + 1) * d->n_kv + d->h0;
}

/* A thread's prefetch cursor: the item PF_ITEMS ahead of the one it
 * reads, counted across its tasks (deal_next), so the stream runs on into
 * the next task's blocks (a decode step of many short sequences is many
 * tasks of a few blocks each) and one item is asked for per item read.
 * (Before, each task asked for its own first items and the next task's,
 * up to 9 each, at its start: bursts the core waited behind; 110M Q8_0, 16
 * sequences at positions to 144, one thread: attention read ~10 GB/s of
 * K/V, 4.1-5.2 ms a step, then 3.7-4.0 with the cursor at 8.) */
enum { PF_QUEUE = 64 }; /* runs claimed ahead of the reads: PF_ITEMS / 2 + 2 at most */
typedef struct {
    int task, item, total, nh;
    const task_deal *d;
    att_where a;
    att_ctx *claim;             /* claim_next's runs, or NULL: the deal's */
    int qt[PF_QUEUE], qn[PF_QUEUE], q0, q1; /* the runs claimed and not yet read: task, heads */
} pf_cursor;

/* A run: the tasks a thread takes together. A decoding token's (a chunk
 * of one) are its run of KV heads (decode_heads), at most att_qc (its
 * score rows and queries sit where att_task keeps a chunk's tokens'), else
 * one task. Returns the heads in the run from task i. */
static int run_heads(const att_ctx *c, const task_deal *d, int i) {
    const tl_scratch *s = c->m->scratch;
    const int n_kv = c->m->hp.n_head_kv, ci = c->c0 + i / n_kv, kh = i % n_kv;
    if (d->h1 < 0 || s->chunk_t0[ci + 1] - s->chunk_t0[ci] != 1) return 1;
    return d->h1 - kh < s->att_qc ? d->h1 - kh : s->att_qc;
}

static int run_next(const task_deal *d, int i, int nh) {
    while (nh--) i = deal_next(d, i);
    return i;
}

/* A decode step (every chunk one token) with two threads or more: the
 * runs a deal would give the threads (a token's KV heads in c->parts
 * parts, each in runs of att_qc at most) are taken from a shared counter
 * instead, since on a shared host one vCPU runs slower at times and the
 * step waits for the thread with the larger share. 110M Q8_0, 16
 * sequences, two threads: one thread's attention 1.45 ms a step against
 * the other's 1.89 in a fixed deal. The prefetch cursor claims them, so
 * that it can run on into the next run's blocks, and queues them for the
 * thread to read in that order. */
static void claim_next(pf_cursor *p) {
    const att_ctx *c = p->claim;
    const int n_kv = c->m->hp.n_head_kv, qc = c->m->scratch->att_qc, hpp = n_kv / c->parts;
    const int rpp = (hpp + qc - 1) / qc, r = atomic_fetch_add_explicit(&p->claim->next_task, 1, memory_order_relaxed);
    if (r >= (c->c1 - c->c0) * c->parts * rpp) {
        p->task = p->total;
        return;
    }
    const int sub = r % rpp, kh = r / rpp % c->parts * hpp + sub * qc;
    p->task = r / (c->parts * rpp) * n_kv + kh;
    p->nh = hpp - sub * qc < qc ? hpp - sub * qc : qc;
    p->qt[p->q1 % PF_QUEUE] = p->task;
    p->qn[p->q1++ % PF_QUEUE] = p->nh;
}

/* Item k of a run of nh heads over nb blocks, in the order it is read:
 * the K rows then the V rows, each block by block and, in a block, head by
 * head (one task: block by block). */
static void pf_step(const att_ctx *c, pf_cursor *p) {
    if (p->task >= p->total) return;
    if (p->item == 0) {
        p->a = task_where(c, p->task);
        if (!p->claim) p->nh = run_heads(c, p->d, p->task);
    }
    const int per = p->a.nb * p->nh, k = p->item % per;
    prefetch_block(c, p->a.seq, p->a.b_first + k / p->nh, p->a.kh + k % p->nh, p->item >= per);
    if (++p->item == 2 * per) {
        if (p->claim && p->q1 - p->q0 == PF_QUEUE) { /* (never: the queue has room) wait on the last item */
            p->item--;
            return;
        }
        p->item = 0;
        if (p->claim) claim_next(p);
        else p->task = run_next(p->d, p->task, p->nh);
    }
}

/* The next run a thread reads in claim mode: the cursor's oldest queued
 * one, the cursor stepped on until it claims one if none is queued;
 * total when the step has none left. */
static int claimed_run(const att_ctx *c, pf_cursor *p, int total, int *nh) {
    while (p->q0 == p->q1 && p->task < p->total) pf_step(c, p);
    if (p->q0 == p->q1) return total;
    *nh = p->qn[p->q0 % PF_QUEUE];
    return p->qt[p->q0++ % PF_QUEUE];
}

/* The rows [*r0, *r1) of logical block b a token sees; 0 when none. */
static inline int span_rows(const tok_span *sp, int b, int bs, int *r0, int *r1) {
    if (b < sp->b0 || b > sp->b1) return 0;
    *r0 = b == sp->b0 ? sp->r0 : 0;
    *r1 = b == sp->b1 ? sp->r1 : bs;
    return 1;
}

/* Scores of tokens [ta, tb) (queries quantized in qq, one q8_0 row per
 * token and query head of the group) against K rows of head kh in logical
 * block b, read as q8_0 / q4_1 rows in place. One tile call covers the rows
 * any token of the chunk sees; a token's cells outside its own window or
 * past its position are written but never read (its softmax runs over
 * [first, pos] only). Each cell is bitwise tl_vec_dot of its pair, so a
 * token's scores do not depend on the chunk it is in. With `prepared` the
 * queries are tl_gemm_prepare rows and q8 / q4 K goes through the GEMM
 * tiles (VNNI where present: 16 K rows per instruction), else
 * tl_vec_dot_tile.
 * The cells stay unscaled: the softmax multiplies by c->scale as it reads
 * them (a pass of its own over the cells, scalar, was as long as the int8
 * scores themselves in a 4,096-token q8 prefill). */
static void k_direct_scores(const att_ctx *c, const tl_seq *seq, int b, int kh, const tok_span *sp, int ta, int tb,
                            const uint8_t *qq, int prepared, void *work, float *scores) {
    const tl_kv_pool *kv = &c->m->kv;
    const tl_kv_layout *l = &kv->layout;
    const tl_scratch *s = c->m->scratch;
    int hd = c->m->hp.head_dim, bs = kv->block_size, group = c->m->hp.n_head / c->m->hp.n_head_kv;
    size_t msl = (size_t)c->m->max_seq_len;
    int lo = bs, hi = 0, r0, r1;
    for (int t = ta; t < tb; t++) {
        if (!span_rows(&sp[t - ta], b, bs, &r0, &r1)) continue;
        if (r0 < lo) lo = r0;
        if (r1 > hi) hi = r1;
    }
    if (lo >= hi) return;
    int id = seq->bt.ids[b * seq->bt.depth + c->vl];
    const uint8_t *k = tl_kv_k(kv, id) + tl_kv_row_off(l, kh, lo, l->row_bytes_k);
    int type = tl_kv_block_type(l->type_k);
    float *out = scores + (size_t)b * bs + lo;
    int nt = (tb - ta) * group;
    if (prepared) /* 16 rows per GEMM tile (bitwise tl_vec_dot as well) */
        for (int r = 0; r < hi - lo; r += 16)
            tl_gemm_tile(type, hd, hi - lo - r < 16 ? hi - lo - r : 16, nt, out + r, msl,
                         k + (size_t)r * l->row_bytes_k, l->row_bytes_k, qq, s->qq_bytes, work);
    else
        tl_vec_dot_tile(type, hd, hi - lo, nt, out, msl, k, l->row_bytes_k, qq, s->qq_bytes);
}

/* Scores of the chunk's queries (tokens [ta, tb), each head of the group)
 * that see logical block b, through K panels (tl_attn_has_panels): the
 * block's rows transposed once for the chunk, then several queries per
 * panel load. A token's cells outside its window or past its position are
 * written but never read, as in k_direct_scores; each cell is bitwise
 * tl_dot_rows_f32 of its pair, so the chunk changes no score. */
static void panel_scores(const att_ctx *c, const tl_seq *seq, int b, int kh, const tok_span *sp, int ta, int tb, int rows,
                         float *kbuf, float *kp, float *scores) {
    const tl_scratch *s = c->m->scratch;
    int hd = c->m->hp.head_dim, bs = c->m->kv.block_size, group = c->m->hp.n_head / c->m->hp.n_head_kv, r0, r1;
    size_t msl = (size_t)c->m->max_seq_len, q_dim = (size_t)c->m->hp.n_head * hd;
    const uint16_t *k16 = att_rows_f16(c, seq, b, kh, 0);
    if (k16) {
        tl_attn_k_panels_f16(k16, (size_t)hd, rows, hd, kp);
    } else {
        size_t ld;
        const float *k = att_rows(c, seq, b, kh, 0, rows, kbuf, &ld);
        tl_attn_k_panels_f32(k, ld, rows, hd, kp);
    }
    enum { BATCH = 32 };
    const float *qs[BATCH];
    float *outs[BATCH];
    int nq = 0;
    for (int t = ta; t < tb; t++) {
        if (!span_rows(&sp[t - ta], b, bs, &r0, &r1)) continue;
        for (int g = 0; g < group; g++) {
            qs[nq] = s->q + (size_t)t * q_dim + (size_t)(kh * group + g) * hd;
            outs[nq++] = scores + ((size_t)(t - ta) * group + g) * msl + (size_t)b * bs;
            if (nq == BATCH) {
                tl_attn_scores_panels(nq, qs, kp, rows, hd, c->scale, outs);
                nq = 0;
            }
        }
    }
    if (nq) tl_attn_scores_panels(nq, qs, kp, rows, hd, c->scale, outs);
}

/* ys[q] += the V rows [r0, r1) weighted by as[q], from f32 rows v or f16 rows v16. */
/* The same for heads under 32 lanes (no vector kernel): lanes [0, n) of
 * f32 rows, row by row. */
static void v_rows_scalar(int nq, float *const *ys, const float *const *as, const float *v, size_t ld, int r0, int r1,
                          int n) {
    for (int q = 0; q < nq; q++)
        for (int r = r0; r < r1; r++) {
            const float a = as[q][r - r0], *vr = v + (size_t)r * ld;
            for (int d = 0; d < n; d++) ys[q][d] += a * vr[d];
        }
}

static void v_rows(int nq, float *const *ys, const float *const *as, const float *v, const uint16_t *v16, size_t ld,
                   int r0, int r1, int hd) {
    if (v16)
        tl_axpy_rows_multi_f16(nq, ys, as, v16 + (size_t)r0 * ld, ld, r1 - r0, hd);
    else
        tl_axpy_rows_multi_f32(nq, ys, as, v + (size_t)r0 * ld, ld, r1 - r0, hd);
}

/* Every query of a task's chunk, (token, head of the group) in order: its
 * output row and its score row. A block that all of them see whole (rows
 * [0, rows): past the window start of the last token and before the block
 * of the first) takes one V call for the lot, where the per-token loop
 * (spans, batching by rows seen) was 7% of a 4,096-token q8 prefill. */
enum { QALL_MAX = 512 };
typedef struct {
    int n; /* 0 when the chunk has more queries than fit */
    float *y[QALL_MAX];
    const float *sc[QALL_MAX];
    const float *a[QALL_MAX]; /* the weights of the block at hand */
} chunk_queries;

static void chunk_queries_init(chunk_queries *cq, const att_ctx *c, int kh, int ta, int tb, float *scores) {
    const tl_hparams *hp = &c->m->hp;
    int hd = hp->head_dim, group = hp->n_head / hp->n_head_kv;
    size_t msl = (size_t)c->m->max_seq_len;
    cq->n = (tb - ta) * group <= QALL_MAX ? (tb - ta) * group : 0;
    for (int i = 0; i < cq->n; i++) {
        cq->y[i] = c->m->scratch->att + (size_t)(ta + i / group) * hp->n_head * hd + (size_t)(kh * group + i % group) * hd;
        cq->sc[i] = scores + (size_t)i * msl; /* = (t - ta) * tok_scores + g * msl */
    }
}

/* 1 when every token of the chunk sees rows [0, rows) of block b: spans
 * only move forward with the position, so the first token's end and the
 * last token's start decide. */
static int block_seen_whole(const tok_span *first, const tok_span *last, int b, int rows, int bs) {
    int r0, r1, s0, s1;
    return span_rows(first, b, bs, &r0, &r1) && span_rows(last, b, bs, &s0, &s1) && r1 >= rows && s0 == 0;
}

/* Queries gathered for one multi-query V call: those that see the same
 * rows [r0, r1) of a block (or piece), up to cap at a time. */
typedef struct {
    int n, cap, r0, r1;
    float *y[32];
    const float *a[32];
} v_batch;

static inline void vb_init(v_batch *vb, int cap) {
    vb->n = 0;
    vb->cap = cap;
}

/* 1 when the gathered queries must be summed before one that sees rows
 * [r0, r1) joins them. */
static inline int vb_must_run(const v_batch *vb, int r0, int r1) {
    return vb->n && (vb->n == vb->cap || r0 != vb->r0 || r1 != vb->r1);
}

static inline void vb_add(v_batch *vb, int r0, int r1, float *y, const float *a) {
    vb->r0 = r0;
    vb->r1 = r1;
    vb->y[vb->n] = y;
    vb->a[vb->n++] = a;
}

/* The V sums of logical block b for tokens [ta, tb) in int8 (v_int8): the
 * block's rows go in pieces of 16, each transposed once for the chunk
 * (tl_attn_v8_prep), then the queries that see the same rows of a piece
 * go through one tl_attn_v8_sum call, up to 32 at a time. A token's
 * weights are quantized per piece and group of 32 values, neither of which
 * depends on the chunk, and each sum is exact in integers, so the chunk
 * changes no result. */
static void v8_block(const att_ctx *c, const tl_seq *seq, int b, int kh, const tok_span *sp, int ta, int tb, int rows,
                     const float *scores, void *piece, chunk_queries *cq) {
    const tl_model *m = c->m;
    const tl_kv_layout *l = &m->kv.layout;
    int hd = m->hp.head_dim, bs = m->kv.block_size, group = m->hp.n_head / m->hp.n_head_kv, r0, r1;
    size_t msl = (size_t)m->max_seq_len, tok_scores = (size_t)group * msl;
    int id = seq->bt.ids[b * seq->bt.depth + c->vl];
    const uint8_t *v = tl_kv_v(&m->kv, id) + tl_kv_row_off(l, kh, 0, l->row_bytes_v);
    const int whole = cq->n && block_seen_whole(&sp[0], &sp[tb - 1 - ta], b, rows, bs);
    for (int p0 = 0; p0 < rows; p0 += 16) {
        int pr = rows - p0 < 16 ? rows - p0 : 16;
        tl_attn_v8_prep(v + (size_t)p0 * l->row_bytes_v, l->row_bytes_v, pr, hd, piece);
        if (whole) {
            for (int i = 0; i < cq->n; i++) cq->a[i] = cq->sc[i] + (size_t)b * bs + p0;
            tl_attn_v8_sum(cq->n, cq->y, cq->a, piece, 0, pr, hd);
            continue;
        }
        v_batch vb;
        vb_init(&vb, (int)(sizeof vb.y / sizeof vb.y[0]));
        for (int t = ta; t < tb; t++) {
            if (!span_rows(&sp[t - ta], b, bs, &r0, &r1)) continue;
            int lo = (r0 > p0 ? r0 : p0) - p0, hi = (r1 < p0 + pr ? r1 : p0 + pr) - p0;
            if (lo >= hi) continue;
            float *out = m->scratch->att + (size_t)t * m->hp.n_head * hd + (size_t)kh * group * hd;
            for (int g = 0; g < group; g++) {
                if (vb_must_run(&vb, lo, hi)) {
                    tl_attn_v8_sum(vb.n, vb.y, vb.a, piece, vb.r0, vb.r1, hd);
                    vb.n = 0;
                }
                vb_add(&vb, lo, hi, out + g * hd, scores + (size_t)(t - ta) * tok_scores + (size_t)g * msl + (size_t)b * bs + p0);
            }
        }
        if (vb.n) tl_attn_v8_sum(vb.n, vb.y, vb.a, piece, vb.r0, vb.r1, hd);
    }
}

/* A thread's attention buffers (att_task carves them from its scratch). */
typedef struct {
    float *scores, *kbuf;
    uint8_t *qq;  /* k_direct: the chunk's queries as q8_0 rows */
    void *piece;  /* v_int8: a transposed piece of V rows */
    void *work;   /* k_direct: the GEMM tile's work area */
} att_bufs;

/* k_direct: the queries of heads [kh, kh + nh) of tokens [ta, tb) as q8_0
 * rows (tl_gemm_prepare rows where the GEMM tiles take the K type), query i of
 * the chunk (token, then head of the group) at qq + i * qq_bytes. */
static int prepare_queries(const att_ctx *c, int ta, int tb, int kh, int nh, uint8_t *qq) {
    const tl_scratch *s = c->m->scratch;
    const tl_hparams *hp = &c->m->hp;
    int hd = hp->head_dim, group = hp->n_head / hp->n_head_kv, i = 0;
    const int type = tl_kv_block_type(c->m->kv.layout.type_k), prepared = tl_gemm_has(type);
    for (int t = ta; t < tb; t++)
        for (int j = 0; j < nh * group; j++, i++) {
            const float *q = s->q + (size_t)t * hp->n_head * hd + (size_t)(kh * group + j) * hd;
            uint8_t *dst = qq + (size_t)i * s->qq_bytes;
            if (prepared) tl_gemm_prepare(type, q, dst, hd);
            else tl_quantize_row(TL_TYPE_Q8_0, q, dst, hd);
        }
    return prepared;
}

/* A decoding token (a chunk of one) and its run of KV heads [a->kh, a->kh
 * + nh), block by block: a block's rows of those heads are one address
 * range (the layout is [head][position][row]), read in one pass for the
 * scores (K) and one for the sums (V), where a task per head read 2 KiB
 * of every block in turn. The prefetch cursor walks the same order (the
 * hardware prefetcher alone, or a block's heads asked for at once, was no
 * faster than a task per head). Zen 4, 110M Q8_0 (12 KV heads of 64, f16),
 * interleaved over 3 rounds, attention a decoded token after 2,048
 * positions: one thread 4.9-5.6 -> 3.7-4.0 ms (the step 8.8-10.0 ->
 * 7.7-8.2), two 2.7-3.6 -> 2.5-2.8; after 512: 1.4-1.6 -> 1.1-1.3 and
 * 0.82-0.96 -> 0.79-0.84. The same calls per head and block as att_task's
 * (f16 rows in place, widened rows, int8 scores, int8 sums), so bitwise
 * its results; head j's score rows and queries are where att_task keeps
 * a chunk's token j's. */
static void decode_heads(const att_ctx *c, const att_where *a, int nh, const att_bufs *tb, pf_cursor *pf) {
    tl_model *m = c->m;
    const tl_hparams *hp = &m->hp;
    tl_scratch *s = m->scratch;
    int hd = hp->head_dim, bs = m->kv.block_size, group = hp->n_head / hp->n_head_kv, r0, r1;
    size_t msl = (size_t)m->max_seq_len, tok_scores = (size_t)group * msl, q_dim = (size_t)hp->n_head * hd;
    const int t = a->ta, pos = s->tok_pos[t], in_place = group <= 2, j0 = tl_window_first(pos, a->w);
    const tok_span sp = token_span(bs, pos, a->w);
    float *out = s->att + (size_t)t * q_dim + (size_t)a->kh * group * hd;
    const int prepared = s->k_direct ? prepare_queries(c, t, t + 1, a->kh, nh, tb->qq) : 0;
    for (int b = sp.b0; b <= sp.b1; b++) {
        if (!span_rows(&sp, b, bs, &r0, &r1)) continue; /* (never: b is in the span) */
        for (int j = 0; j < nh; j++) {
            float *sc = tb->scores + (size_t)j * tok_scores;
            pf_step(c, pf);
            if (s->k_direct) {
                k_direct_scores(c, a->seq, b, a->kh + j, &sp, t, t + 1, tb->qq + (size_t)j * group * s->qq_bytes,
                                prepared, tb->work, sc);
                continue;
            }
            size_t ld = (size_t)hd;
            const uint16_t *k16 = in_place ? att_rows_f16(c, a->seq, b, a->kh + j, 0) : NULL;
            const float *k = k16 ? NULL : att_rows(c, a->seq, b, a->kh + j, 0, r1, tb->kbuf, &ld);
            const float *q = s->q + (size_t)t * q_dim + (size_t)(a->kh + j) * group * hd;
            for (int g = 0; g < group; g++)
                query_scores(c, q + g * hd, k16, k, ld, r0, r1, sc + (size_t)g * msl + (size_t)b * bs + r0);
        }
    }
    for (int i = 0; i < nh * group; i++) {
        att_softmax(c, tb->scores + (size_t)i * msl + j0, pos - j0 + 1, s->k_direct ? c->scale : 1.0f,
                    a->kh * group + i, pos, j0);
        memset(out + (size_t)i * hd, 0, (size_t)hd * sizeof(float));
    }
    chunk_queries cq;
    for (int b = sp.b0; b <= sp.b1; b++) {
        if (!span_rows(&sp, b, bs, &r0, &r1)) continue;
        for (int j = 0; j < nh; j++) {
            float *sc = tb->scores + (size_t)j * tok_scores;
            pf_step(c, pf);
            if (s->v_int8) {
                chunk_queries_init(&cq, c, a->kh + j, t, t + 1, sc);
                v8_block(c, a->seq, b, a->kh + j, &sp, t, t + 1, r1, sc, tb->piece, &cq);
                continue;
            }
            size_t ld = (size_t)hd;
            const uint16_t *v16 = in_place ? att_rows_f16(c, a->seq, b, a->kh + j, 1) : NULL;
            const float *v = v16 ? NULL : att_rows(c, a->seq, b, a->kh + j, 1, r1, tb->kbuf, &ld);
            for (int g0 = 0; g0 < group; g0 += 4) { /* up to 4 queries a call, bitwise one by one */
                float *ys[4];
                const float *as[4];
                int nq = group - g0 < 4 ? group - g0 : 4;
                for (int g = 0; g < nq; g++) {
                    ys[g] = out + ((size_t)j * group + g0 + g) * hd;
                    as[g] = sc + (size_t)(g0 + g) * msl + (size_t)b * bs + r0;
                }
                if (hd < 32)
                    v_rows_scalar(nq, ys, as, v, ld, r0, r1, hd);
                else
                    v_rows(nq, ys, as, v, v16, ld, r0, r1, hd);
            }
        }
    }
}

/* Prefill (every chunk two tokens or more, two threads or more): each
 * thread takes the next task when it finishes one, largest first (later
 * chunks attend to more positions), rather than a fixed deal, since on a
 * shared host one vCPU runs slower at times and the step waits for the
 * thread with the larger share. 110M Q4_0, 4,096 tokens, two threads: one
 * thread's attention 2.40 s against the other's 3.13 in the fixed deal.
 * Returns the task, or total when none is left. No prefetch cursor here:
 * it needs the thread's next task in advance, and prefill chunks ran as
 * fast without it. */
static int take_task(att_ctx *c, int total) {
    int k = atomic_fetch_add_explicit(&c->next_task, 1, memory_order_relaxed);
    return k < total ? total - 1 - k : total;
}

/* A thread's task after task i (i < 0: its first): the prefill counter's,
 * a claimed run, or the deal's after the run of *nh heads from i. */
static int next_task(att_ctx *c, pf_cursor *pf, int total, int i, int *nh) {
    if (c->dynamic) return take_task(c, total);
    if (pf->claim) return claimed_run(c, pf, total, nh);
    return i < 0 ? pf->d->h0 : run_next(pf->d, i, *nh);
}

/* One task = one KV head and one chunk of consecutive tokens of a
 * sequence: each K/V block is converted once for the chunk, and the query
 * heads of the group share it. Every token still computes its scores, its
 * softmax and its weighted sum of V rows with the same operations in the
 * same order as it would alone, so chunking changes no result, nor which
 * thread runs the task. */
static void att_task(void *p, int ith, int nth) {
    att_ctx *c = p;
    tl_model *m = c->m;
    const tl_hparams *hp = &m->hp;
    tl_scratch *s = m->scratch;
    int hd = hp->head_dim, bs = m->kv.block_size, group = hp->n_head / hp->n_head_kv;
    size_t msl = (size_t)m->max_seq_len, tok_scores = (size_t)group * msl;
    float *scores = s->scores + (size_t)ith * s->scores_stride;
    float *kbuf = scores + (size_t)s->att_qc * tok_scores, *kp = kbuf + (size_t)bs * hd;
    uint8_t *qq = (uint8_t *)(kp + s->kp_floats);
    void *piece = scores + s->v8_off, *work = s->gemm_work ? s->gemm_work + (size_t)ith * s->gemm_work_stride : NULL;
    const att_bufs bufs = {scores, kbuf, qq, piece, work};
    chunk_queries cq;
    int total = (c->c1 - c->c0) * hp->n_head_kv, nh = 0;
    const task_deal deal = deal_of(hp->n_head_kv, ith, nth);
    pf_cursor pf = {.task = deal.h0, .total = c->dynamic ? 0 : total, .d = &deal, .claim = c->parts ? c : NULL};
    if (pf.claim) claim_next(&pf);
    for (int k = 0; k < PF_ITEMS; k++) pf_step(c, &pf);
    for (int i = next_task(c, &pf, total, -1, &nh); i < total; i = next_task(c, &pf, total, i, &nh)) {
        const att_where a = task_where(c, i);
        if (!pf.claim) nh = run_heads(c, &deal, i);
        if (nh > 1) {
            decode_heads(c, &a, nh, &bufs, &pf);
            continue;
        }
        const int ta = a.ta, tb = a.tb, kh = a.kh, b_first = a.b_first, w = a.w;
        const tl_seq *seq = a.seq;
        tok_span sp[ATT_QC_MAX];
        for (int t = ta; t < tb; t++) sp[t - ta] = token_span(bs, s->tok_pos[t], w);
        int pos_last = s->tok_pos[tb - 1], r0, r1;
        /* A block seen by one or two queries (decode) is read in place as
         * f16 rather than widened to f32 first and read once; bitwise the
         * same scores and sums either way. */
        int in_place = (tb - ta) * group <= 2, panels = !in_place && s->kp_floats && tl_attn_has_panels(hd);
        if (s->k_direct) {
            int prepared = prepare_queries(c, ta, tb, kh, 1, qq);
            for (int b = b_first; b <= pos_last / bs; b++) {
                pf_step(c, &pf);
                k_direct_scores(c, seq, b, kh, sp, ta, tb, qq, prepared, work, scores);
            }
        }
        for (int b = b_first; !s->k_direct && b <= pos_last / bs; b++) {
            int rows = b == pos_last / bs ? pos_last % bs + 1 : bs;
            pf_step(c, &pf);
            if (panels) {
                panel_scores(c, seq, b, kh, sp, ta, tb, rows, kbuf, kp, scores);
                continue;
            }
            size_t ld = (size_t)hd;
            const uint16_t *k16 = in_place ? att_rows_f16(c, seq, b, kh, 0) : NULL;
            const float *k = k16 ? NULL : att_rows(c, seq, b, kh, 0, rows, kbuf, &ld);
            for (int t = ta; t < tb; t++) {
                if (!span_rows(&sp[t - ta], b, bs, &r0, &r1)) continue;
                const float *q = s->q + (size_t)t * hp->n_head * hd + (size_t)kh * group * hd;
                float *sc = scores + (size_t)(t - ta) * tok_scores;
                for (int g = 0; g < group; g++)
                    query_scores(c, q + g * hd, k16, k, ld, r0, r1, sc + (size_t)g * msl + b * bs + r0);
            }
        }
        for (int t = ta; t < tb; t++) {
            int pos = s->tok_pos[t], j0 = tl_window_first(pos, w);
            float *out = s->att + (size_t)t * hp->n_head * hd + (size_t)kh * group * hd;
            for (int g = 0; g < group; g++) {
                float *sc = scores + (size_t)(t - ta) * tok_scores + (size_t)g * msl;
                att_softmax(c, sc + j0, pos - j0 + 1, s->k_direct ? c->scale : 1.0f, kh * group + g, pos, j0);
                memset(out + g * hd, 0, (size_t)hd * sizeof(float));
            }
        }
        chunk_queries_init(&cq, c, kh, ta, tb, scores);
        for (int b = b_first; b <= pos_last / bs; b++) {
            int rows = b == pos_last / bs ? pos_last % bs + 1 : bs;
            size_t ld = (size_t)hd;
            pf_step(c, &pf);
            if (s->v_int8) {
                v8_block(c, seq, b, kh, sp, ta, tb, rows, scores, piece, &cq);
                continue;
            }
            const uint16_t *v16 = in_place ? att_rows_f16(c, seq, b, kh, 1) : NULL;
            const float *v = v16 ? NULL : att_rows(c, seq, b, kh, 1, rows, kbuf, &ld);
            if (cq.n && hd >= 32 && block_seen_whole(&sp[0], &sp[tb - 1 - ta], b, rows, bs)) {
                for (int i = 0; i < cq.n; i++) cq.a[i] = cq.sc[i] + (size_t)b * bs;
                v_rows(cq.n, cq.y, cq.a, v, v16, ld, 0, rows, hd); /* 4 queries a pass, bitwise one by one */
                continue;
            }
            /* queries (token, head of the group) that see the same rows go
             * through one multi-query call, up to 4 at a time */
            v_batch vb;
            vb_init(&vb, 4);
            for (int t = ta; t < tb; t++) {
                if (!span_rows(&sp[t - ta], b, bs, &r0, &r1)) continue;
                float *out = s->att + (size_t)t * hp->n_head * hd + (size_t)kh * group * hd;
                for (int g = 0; g < group; g++) {
                    const float *sc = scores + (size_t)(t - ta) * tok_scores + (size_t)g * msl + b * bs;
                    float *o = out + g * hd;
                    if (hd >= 32) { /* bitwise one tl_axpy_f32 per row */
                        if (vb_must_run(&vb, r0, r1)) {
                            v_rows(vb.n, vb.y, vb.a, v, v16, ld, vb.r0, vb.r1, hd);
                            vb.n = 0;
                        }
                        vb_add(&vb, r0, r1, o, sc + r0);
                        continue;
                    }
                    const float *a = sc + r0;
                    v_rows_scalar(1, &o, &a, v, ld, r0, r1, hd);
                }
            }
            if (vb.n) v_rows(vb.n, vb.y, vb.a, v, v16, ld, vb.r0, vb.r1, hd);
        }
    }
}

/* Writes token t's new rows into its block: K and V per head, or in
 * store-h the layer's normed input xb. Called per token from the pool
 * run that finishes the token's Q and K (forward.c), so the threads share
 * the stores: each token's rows are its own bytes. */
void tl_fwd_store_kv(tl_model *m, tl_seq **seqs, int vl, int t) {
    tl_scratch *s = m->scratch;
    tl_kv_pool *kv = &m->kv;
    const tl_kv_layout *l = &kv->layout;
    int hd = m->hp.head_dim, bs = kv->block_size, kv_dim = m->hp.n_head_kv * hd;
    const tl_seq *seq = seqs[s->tok_seq[t]];
    int pos = s->tok_pos[t];
    int id = seq->bt.ids[(pos / bs) * seq->bt.depth + vl];
    if (l->store_h) {
        tl_kv_store_row(l->type_k, l->group, s->xb + (size_t)t * m->hp.n_embd,
                        tl_kv_k(kv, id) + tl_kv_row_off(l, 0, pos % bs, l->row_bytes_k), m->hp.n_embd);
        return;
    }
    const float *k = s->k + (size_t)t * kv_dim, *v = s->v + (size_t)t * kv_dim;
    for (int h = 0; h < m->hp.n_head_kv; h++) {
        tl_kv_store_row(l->type_k, l->group, k + (size_t)h * hd,
                        tl_kv_k(kv, id) + tl_kv_row_off(l, h, pos % bs, l->row_bytes_k), hd);
        tl_kv_store_row(l->type_v, l->group, v + (size_t)h * hd,
                        tl_kv_v(kv, id) + tl_kv_row_off(l, h, pos % bs, l->row_bytes_v), hd);
    }
}

/* q/k norm (per head, or over the whole row) and RoPE of one token's K
 * heads (or Q heads), in place; cs: the
 * token's tl_rope_table of rp, or NULL to compute the angles here; rope 0: the
 * norm only (a NoPE layer, tl_model_layer_rope). */
void tl_fwd_k_finish(const tl_model *m, float *k, int n_heads, const float *norm, int pos, const tl_rope_params *rp,
                     const float *cs, int rope) {
    int hd = m->hp.head_dim, full = m->arch->qk_norm == TL_QKN_FULL;
    if (norm && full) tl_rmsnorm(k, k, norm, n_heads * hd, m->hp.norm_eps); /* the whole row (olmo2) */
    for (int h = 0; h < n_heads; h++) {
        float *x = k + (size_t)h * hd;
        if (norm && !full) tl_rmsnorm(x, x, norm, hd, m->hp.norm_eps);
        if (!rope) continue;
        if (cs)
            tl_rope_apply(x, cs, m->hp.n_rot, m->arch->rope_type);
        else
            tl_rope(x, pos, m->hp.n_rot, rp, m->arch->rope_type, m->rope_freqs);
    }
}

static int h_reserve(tl_scratch *s, const tl_hparams *hp, int n) {
    if (n <= s->h_cap) return TL_OK;
    int cap = s->h_cap ? s->h_cap : 64;
    while (cap < n) cap *= 2;
    size_t kv_dim = (size_t)hp->n_head_kv * hp->head_dim;
    tl_free_aligned(s->hx);
    tl_free_aligned(s->hk);
    tl_free_aligned(s->hv);
    s->hx = tl_alloc_aligned((size_t)cap * hp->n_embd * sizeof(float));
    s->hk = tl_alloc_aligned((size_t)cap * kv_dim * sizeof(float));
    s->hv = tl_alloc_aligned((size_t)cap * kv_dim * sizeof(float));
    s->h_cap = s->hx && s->hk && s->hv ? cap : 0;
    return s->h_cap ? TL_OK : tl_set_error(TL_ERR_NOMEM, "store-h: out of memory for K/V of %d positions", n);
}

/* Store-h: K and V of positions [p0, p1] of one sequence at virtual layer
 * vl, recomputed from the stored h rows with the layer's weights, in
 * pieces the matmul scratch holds. Every position goes through the same
 * rows of the same matmul whatever the batch, so a cached and an uncached
 * run read identical K and V. */
static int h_recompute(tl_model *m, const tl_seq *seq, int vl, const tl_layer *ly, int p0, int p1,
                       const tl_rope_params *rope) {
    const tl_hparams *hp = &m->hp;
    tl_scratch *s = m->scratch;
    const tl_kv_layout *l = &m->kv.layout;
    int bs = m->kv.block_size, D = hp->n_embd, kv_dim = hp->n_head_kv * hp->head_dim, n = p1 - p0 + 1;
    int rc = h_reserve(s, hp, n);
    if (rc) return rc;
    for (int p = p0; p <= p1; p++) {
        int id = seq->bt.ids[(p / bs) * seq->bt.depth + vl];
        tl_kv_load_row(l->type_k, l->group, tl_kv_k(&m->kv, id) + tl_kv_row_off(l, 0, p % bs, l->row_bytes_k),
                       s->hx + (size_t)(p - p0) * D, D);
    }
    for (int i = 0; i < n; i += s->cap) {
        int len = n - i < s->cap ? n - i : s->cap;
        tl_fwd_matmul(m, s->hk + (size_t)i * kv_dim, &ly->wk, s->hx + (size_t)i * D, len);
        tl_fwd_matmul_after(m, s->hv + (size_t)i * kv_dim, &ly->wv, s->hx + (size_t)i * D, len, &ly->wk);
    }
    tl_fwd_qkv_finish(m, s->hk, ly->bk, n, kv_dim);
    tl_fwd_qkv_finish(m, s->hv, ly->bv, n, kv_dim);
    for (int t = 0; t < n; t++)
        tl_fwd_k_finish(m, s->hk + (size_t)t * kv_dim, hp->n_head_kv, ly->k_norm, p0 + t, rope, NULL,
                        tl_model_layer_rope(m, (int)(ly - m->layers)));
    return TL_OK;
}

/* A decode step with fewer (sequence, KV head) tasks than threads (one
 * sequence of a model with one KV head, as Gemma 3: one task) would leave
 * the other threads idle through attention. It splits each task instead,
 * in three passes that keep every value's operations and their order, so
 * the split changes no bit: the scores by blocks (each score whole, by the
 * kernels att_task uses), the softmax per query, and the weighted V sums
 * by slices of head_dim (each output lane adds its rows in the same order;
 * slices start at multiples of 16 lanes, where the kernels' steps do). */
typedef struct {
    const att_ctx *ac;
    int pass; /* 0 scores, 1 softmax, 2 V sums */
} split_ctx;

typedef struct {
    const tl_seq *seq;
    int t, kh, pos, j0;
    tok_span sp;
    float *sc;   /* its group's score rows, max_seq_len apart */
    float *out;  /* its group's outputs in s->att */
} split_task;

static split_task split_task_of(const att_ctx *c, int i) {
    const tl_scratch *s = c->m->scratch;
    const tl_hparams *hp = &c->m->hp;
    split_task k;
    k.t = s->chunk_t0[i / hp->n_head_kv];
    k.kh = i % hp->n_head_kv;
    k.seq = c->seqs[s->tok_seq[k.t]];
    k.pos = s->tok_pos[k.t];
    int w = seq_window(k.seq, c->layer_window);
    k.j0 = tl_window_first(k.pos, w);
    k.sp = token_span(c->m->kv.block_size, k.pos, w);
    k.sc = s->scores + (size_t)i * s->scores_stride; /* task i < threads: thread i's score area */
    int group = hp->n_head / hp->n_head_kv;
    k.out = s->att + (size_t)k.t * hp->n_head * hp->head_dim + (size_t)k.kh * group * hp->head_dim;
    return k;
}

static void split_scores(const att_ctx *c, const split_task *k, int b, float *kbuf) {
    const tl_hparams *hp = &c->m->hp;
    int hd = hp->head_dim, bs = c->m->kv.block_size, group = hp->n_head / hp->n_head_kv, r0, r1;
    size_t msl = (size_t)c->m->max_seq_len, ld = (size_t)hd;
    if (!span_rows(&k->sp, b, bs, &r0, &r1)) return;
    const float *q = c->m->scratch->q + (size_t)k->t * hp->n_head * hd + (size_t)k->kh * group * hd;
    const uint16_t *k16 = att_rows_f16(c, k->seq, b, k->kh, 0);
    const float *kr = k16 ? NULL : att_rows(c, k->seq, b, k->kh, 0, r1, kbuf, &ld);
    for (int g = 0; g < group; g++)
        query_scores(c, q + g * hd, k16, kr, ld, r0, r1, k->sc + (size_t)g * msl + b * bs + r0);
}

/* Lanes [d0, d1) of the task's V sums over all its blocks. */
static void split_v(const att_ctx *c, const split_task *k, int d0, int d1, float *kbuf) {
    const tl_hparams *hp = &c->m->hp;
    int hd = hp->head_dim, bs = c->m->kv.block_size, group = hp->n_head / hp->n_head_kv, r0, r1;
    size_t msl = (size_t)c->m->max_seq_len;
    for (int b = k->sp.b0; b <= k->sp.b1; b++) {
        if (!span_rows(&k->sp, b, bs, &r0, &r1)) continue;
        for (int f = b == k->sp.b0 ? b : b + PF_ITEMS; f <= b + PF_ITEMS && f <= k->sp.b1; f++)
            prefetch_block(c, k->seq, f, k->kh, 1);
        size_t ld = (size_t)hd;
        const uint16_t *v16 = att_rows_f16(c, k->seq, b, k->kh, 1);
        const float *v = v16 ? NULL : att_rows(c, k->seq, b, k->kh, 1, r1, kbuf, &ld);
        for (int g0 = 0; g0 < group; g0 += 4) {
            float *ys[4];
            const float *as[4];
            int nq = group - g0 < 4 ? group - g0 : 4;
            for (int q = 0; q < nq; q++) {
                ys[q] = k->out + (size_t)(g0 + q) * hd + d0;
                as[q] = k->sc + (size_t)(g0 + q) * msl + b * bs + r0;
            }
            if (hd < 32) /* att_task's scalar loop */
                v_rows_scalar(nq, ys, as, v + d0, ld, r0, r1, d1 - d0);
            else
                v_rows(nq, ys, as, v ? v + d0 : NULL, v16 ? v16 + d0 : NULL, ld, r0, r1, d1 - d0);
        }
    }
}

static void split_pass(void *p, int ith, int nth) {
    const split_ctx *x = p;
    const att_ctx *c = x->ac;
    const tl_scratch *s = c->m->scratch;
    const tl_hparams *hp = &c->m->hp;
    int tasks = s->n_chunks * hp->n_head_kv, group = hp->n_head / hp->n_head_kv, hd = hp->head_dim;
    float *kbuf = s->scores + (size_t)ith * s->scores_stride + (size_t)s->att_qc * group * c->m->max_seq_len;
    if (x->pass == 0) { /* the (task, block) pairs in contiguous shares */
        int total = 0, j = 0;
        for (int i = 0; i < tasks; i++) {
            split_task k = split_task_of(c, i);
            total += k.sp.b1 - k.sp.b0 + 1;
        }
        int lo = (int)((int64_t)total * ith / nth), hi = (int)((int64_t)total * (ith + 1) / nth);
        for (int i = 0; i < tasks && j < hi; i++) {
            split_task k = split_task_of(c, i);
            for (int b = k.sp.b0; b <= k.sp.b1; b++, j++) {
                if (j < lo || j >= hi) continue;
                for (int f = j == lo ? b : b + PF_ITEMS; f <= b + PF_ITEMS && f <= k.sp.b1; f++)
                    prefetch_block(c, k.seq, f, k.kh, 0);
                split_scores(c, &k, b, kbuf);
            }
        }
    } else if (x->pass == 1) {
        for (int p = ith; p < tasks * group; p += nth) {
            split_task k = split_task_of(c, p / group);
            int g = p % group;
            att_softmax(c, k.sc + (size_t)g * c->m->max_seq_len + k.j0, k.pos - k.j0 + 1, 1.0f, k.kh * group + g,
                        k.pos, k.j0);
            memset(k.out + (size_t)g * hd, 0, (size_t)hd * sizeof(float));
        }
    } else {
        int d0 = (hd * ith / nth) & ~15, d1 = ith == nth - 1 ? hd : (hd * (ith + 1) / nth) & ~15;
        if (hd < 32) d0 = ith ? hd : 0, d1 = hd; /* too narrow to split: thread 0 */
        for (int i = 0; d1 > d0 && i < tasks; i++) {
            split_task k = split_task_of(c, i);
            split_v(c, &k, d0, d1, kbuf);
        }
    }
}

/* 1 when this step takes the split (see split_ctx). Not with int8 K
 * scores or int8 V sums: their kernels take whole rows. */
static int split_decode(const tl_model *m, int T) {
    const tl_scratch *s = m->scratch;
    int nth = tl_threadpool_size(m->tp);
    return nth > 1 && T == s->n_chunks && s->n_chunks * m->hp.n_head_kv < nth && !s->k_direct && !s->v_int8 &&
           !m->kv.layout.store_h;
}

/* Attention of the batch at virtual layer vl, after the new rows are
 * stored. Store-h runs one sequence at a time over its recomputed K/V. */
int tl_fwd_attend(tl_model *m, tl_seq **seqs, int vl, const tl_layer *ly, int T, int window,
                  const tl_rope_params *rope) {
    tl_scratch *s = m->scratch;
    const tl_hparams *hp = &m->hp;
    att_ctx ac = {.m = m, .seqs = seqs, .vl = vl, .T = T, .layer_window = window,
                  .scale = hp->attn_scale, .c0 = 0, .c1 = s->n_chunks};
    if (split_decode(m, T)) {
        int nth = tl_threadpool_size(m->tp);
        for (int pass = 0; pass < 3; pass++) {
            split_ctx x = {.ac = &ac, .pass = pass};
            tl_threadpool_run(m->tp, split_pass, &x, nth);
        }
        return TL_OK;
    }
    const int nth = tl_threadpool_size(m->tp);
    int decode = nth > 1;
    ac.dynamic = nth > 1;
    for (int i = 0; i < s->n_chunks; i++) {
        ac.dynamic &= s->chunk_t0[i + 1] - s->chunk_t0[i] > 1;
        decode &= s->chunk_t0[i + 1] - s->chunk_t0[i] == 1;
    }
    /* claim mode's parts: as deal_of shares a token's heads */
    if (decode) ac.parts = hp->n_head_kv % nth ? hp->n_head_kv : nth;
    if (!m->kv.layout.store_h) {
        tl_threadpool_run(m->tp, att_task, &ac, s->n_chunks * hp->n_head_kv);
        return TL_OK;
    }
    int bs = m->kv.block_size;
    for (int c0 = 0, c1; c0 < s->n_chunks; c0 = c1) {
        int seq_i = s->tok_seq[s->chunk_t0[c0]];
        for (c1 = c0 + 1; c1 < s->n_chunks && s->tok_seq[s->chunk_t0[c1]] == seq_i; c1++) {
        }
        const tl_seq *seq = seqs[seq_i];
        int w = seq_window(seq, window);
        int first = s->tok_pos[s->chunk_t0[c0]], last = s->tok_pos[s->chunk_t0[c1] - 1];
        int p0 = tl_window_first(first, w) / bs * bs;
        int rc = h_recompute(m, seq, vl, ly, p0, last, rope);
        if (rc) return rc;
        ac.c0 = c0;
        ac.c1 = c1;
        ac.h_p0 = p0;
        atomic_store_explicit(&ac.next_task, 0, memory_order_relaxed);
        tl_threadpool_run(m->tp, att_task, &ac, (c1 - c0) * hp->n_head_kv);
    }
    return TL_OK;
}
