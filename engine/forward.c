/* forward.c - the batched forward pass over the paged KV cache.
 *
 * One call runs every layer once over all new tokens of all sequences in
 * the batch (T tokens in total): prefilling sequences contribute many
 * tokens, decoding ones a single token. Each token attends to its own
 * sequence's KV (cached positions plus the batch's own, causally).
 * Numerics follow ggml's CPU ops (double accumulation in RMSNorm and
 * softmax sums, float RoPE with an iterated theta) so greedy tokens match
 * llama.cpp. */
#include "forward.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "forward_impl.h"
#include "forward_ops.h"
#include "kv_mode.h"
#include "model.h"
#include "quants.h"
#include "util.h"


static void scratch_free_bufs(tl_scratch *s) {
    float **bufs[] = {&s->x,        &s->xb,      &s->q,      &s->k,     &s->v,     &s->att,
                      &s->hb,       &s->hb2,     &s->o,      &s->o_attn, &s->logits_x, &s->rope_cs,
                      &s->moe_logits, &s->moe_w, &s->moe_rw, &s->moe_x, &s->moe_o};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        tl_free_aligned(*bufs[i]);
        *bufs[i] = NULL;
    }
    tl_free_aligned(s->xq);
    free(s->tok_seq);
    free(s->tok_pos);
    free(s->chunk_t0);
    free(s->moe_sel);
    free(s->moe_rows);
    s->xq = NULL;
    s->tok_seq = s->tok_pos = s->chunk_t0 = s->moe_sel = s->moe_rows = NULL;
    s->cap = 0;
}

/* The widest FFN: the dense one, or a MoE model's experts and shared expert. */
static int ffn_width(const tl_hparams *hp) {
    int w = hp->n_ff;
    if (hp->n_expert && hp->n_ff_exp > w) w = hp->n_ff_exp;
    if (hp->n_expert && hp->n_ff_shexp > w) w = hp->n_ff_shexp;
    return w;
}

/* A MoE model's buffers (moe.c), or none. */
static int moe_reserve(tl_scratch *s, const tl_hparams *hp, size_t n) {
    if (!hp->n_expert) return 1;
    const size_t E = (size_t)hp->n_expert, K = (size_t)hp->n_expert_used;
    s->moe_logits = tl_alloc_aligned(n * E * sizeof(float));
    s->moe_w = tl_alloc_aligned(n * K * sizeof(float));
    s->moe_rw = tl_alloc_aligned(n * sizeof(float));
    s->moe_x = tl_alloc_aligned(n * hp->n_embd * sizeof(float));
    s->moe_o = tl_alloc_aligned(n * hp->n_embd * sizeof(float));
    s->moe_sel = malloc(n * K * sizeof(int32_t));
    s->moe_rows = malloc(n * sizeof(int32_t));
    return s->moe_logits && s->moe_w && s->moe_rw && s->moe_x && s->moe_o && s->moe_sel && s->moe_rows;
}

static int64_t widest_input(const tl_model *m) {
    const tl_hparams *hp = &m->hp;
    int widest = hp->n_embd;
    if (ffn_width(hp) > widest) widest = ffn_width(hp);
    if (hp->n_head * hp->head_dim > widest) widest = hp->n_head * hp->head_dim;
    return ((int64_t)widest + 255) / 256 * 256; /* whole blocks of any type */
}

static size_t max_xq_row(const tl_model *m) {
    /* Q8_K rows or the GEMM path's prepared rows are the largest encoding. */
    int64_t n = widest_input(m);
    size_t a = tl_row_size(TL_TYPE_Q8_K, n), b = tl_row_size(TL_TYPE_Q8_0, n), c = (size_t)n * sizeof(float);
    size_t r = a > b ? a : b, g = tl_gemm_x_size(n);
    if (g > r) r = g;
    return (r > c ? r : c) + 64;
}

static int scratch_reserve(tl_model *m, int T, int n_seq) {
    tl_scratch *s = m->scratch;
    if (T <= s->cap && n_seq <= s->cap) return TL_OK;
    int cap = s->cap ? s->cap : 16;
    while (cap < T || cap < n_seq) cap *= 2;
    scratch_free_bufs(s);
    const tl_hparams *hp = &m->hp;
    size_t n = (size_t)cap, q_dim = (size_t)hp->n_head * hp->head_dim, kv_dim = (size_t)hp->n_head_kv * hp->head_dim;
    size_t wide = (size_t)hp->n_embd > q_dim ? (size_t)hp->n_embd : q_dim;
    s->x = tl_alloc_aligned(n * hp->n_embd * sizeof(float));
    s->xb = tl_alloc_aligned(n * wide * sizeof(float));
    s->q = tl_alloc_aligned(n * q_dim * sizeof(float));
    s->k = tl_alloc_aligned(n * kv_dim * sizeof(float));
    s->v = tl_alloc_aligned(n * kv_dim * sizeof(float));
    s->att = tl_alloc_aligned(n * q_dim * sizeof(float));
    s->hb = tl_alloc_aligned(n * ffn_width(hp) * sizeof(float));
    s->hb2 = tl_alloc_aligned(n * ffn_width(hp) * sizeof(float));
    s->o = tl_alloc_aligned(n * wide * sizeof(float));
    if (hp->parallel) s->o_attn = tl_alloc_aligned(n * hp->n_embd * sizeof(float));
    s->logits_x = tl_alloc_aligned(n * hp->n_embd * sizeof(float));
    s->rope_cs = tl_alloc_aligned(2 * n * (size_t)hp->n_rot * sizeof(float) + 64);
    s->xq_stride = max_xq_row(m);
    s->xq = tl_alloc_aligned(n * s->xq_stride);
    s->tok_seq = malloc(n * sizeof(int32_t));
    s->tok_pos = malloc(n * sizeof(int32_t));
    s->chunk_t0 = malloc((n + 1) * sizeof(int32_t));
    if (!s->x || !s->xb || !s->q || !s->k || !s->v || !s->att || !s->hb || !s->hb2 || !s->o || !s->logits_x ||
        !s->rope_cs || (hp->parallel && !s->o_attn) || !s->xq || !s->tok_seq || !s->tok_pos || !s->chunk_t0 ||
        !moe_reserve(s, hp, n)) {
        scratch_free_bufs(s);
        return tl_set_error(TL_ERR_NOMEM, "out of memory for a batch of %d tokens", T);
    }
    s->cap = cap;
    return TL_OK;
}

int tl_forward_init(tl_model *m) {
    m->scratch = calloc(1, sizeof *m->scratch);
    if (!m->scratch) return tl_set_error(TL_ERR_NOMEM, "out of memory");
    int group = m->hp.n_head / m->hp.n_head_kv;
    /* Prefill tokens of one sequence share each converted K/V block in
     * chunks of att_qc; their score rows (a max_seq_len row per query head)
     * are kept to about 4 MiB per thread. */
    int64_t qc = ((int64_t)1 << 20) / ((int64_t)group * m->max_seq_len);
    m->scratch->att_qc = qc < 1 ? 1 : qc > ATT_QC_MAX ? ATT_QC_MAX : (int)qc;
    /* q8 / q4 K in groups of 32 is, row for row, ggml's q8_0 / q4_1: the
     * queries are quantized to q8_0 once per chunk and the scores come from
     * the weight kernels' int8 dot products (VNNI where present), so K is
     * never widened to f32 (as llama.cpp's CPU path does for a q8_0 cache). */
    const tl_kv_layout *l = &m->kv.layout;
    m->scratch->k_direct = !l->store_h && l->group == 32 && (l->type_k == TL_KVT_Q8 || l->type_k == TL_KVT_Q4);
    /* (room for a tl_gemm_prepare row, which starts with the q8_0 row) */
    m->scratch->qq_bytes = m->scratch->k_direct ? tl_gemm_x_size(m->hp.head_dim) : 0;
    size_t qq_floats = ((size_t)m->scratch->att_qc * group * m->scratch->qq_bytes + 3) / 4;
    /* (head_dim >= 32: narrower heads take dot_small's scalar loop, in its own order) */
    m->scratch->kp_floats = !m->scratch->k_direct && m->hp.head_dim >= 32 && tl_attn_has_panels(m->hp.head_dim)
                                ? tl_attn_panels_floats(m->kv.block_size, m->hp.head_dim)
                                : 0;
    /* q8 V in groups of 32 (ggml's q8_0 rows) is summed in int8: each
     * block's rows transposed once into a piece for the chunk's queries,
     * whose weights are quantized to u8 per 16 rows (tl_attn_v8_sum). */
    m->scratch->v_int8 = !l->store_h && l->group == 32 && l->type_v == TL_KVT_Q8;
    m->scratch->v8_off = (size_t)m->scratch->att_qc * group * m->max_seq_len + (size_t)m->kv.block_size * m->hp.head_dim +
                         m->scratch->kp_floats + qq_floats;
    size_t v8_floats = m->scratch->v_int8 ? (tl_attn_v8_bytes(m->hp.head_dim) + 3) / 4 : 0;
    m->scratch->scores_stride = (m->scratch->v8_off + v8_floats + 15) & ~(size_t)15;
    size_t n = (size_t)tl_threadpool_size(m->tp) * m->scratch->scores_stride;
    m->scratch->scores = tl_alloc_aligned(n * sizeof(float));
    if (!m->scratch->scores) return tl_set_error(TL_ERR_NOMEM, "out of memory for attention scores");
    m->scratch->gemm_work_stride = (tl_gemm_work_size(widest_input(m)) + 63) & ~(size_t)63;
    m->scratch->gemm_work = tl_alloc_aligned((size_t)tl_threadpool_size(m->tp) * m->scratch->gemm_work_stride);
    if (!m->scratch->gemm_work) return tl_set_error(TL_ERR_NOMEM, "out of memory for the matmul workspace");
    return scratch_reserve(m, 1, 1);
}

void tl_forward_free(tl_model *m) {
    if (!m->scratch) return;
    scratch_free_bufs(m->scratch);
    tl_free_aligned(m->scratch->scores);
    tl_free_aligned(m->scratch->gemm_work);
    tl_free_aligned(m->scratch->hx);
    tl_free_aligned(m->scratch->hk);
    tl_free_aligned(m->scratch->hv);
    free(m->scratch);
    m->scratch = NULL;
}

/* ---- element-wise ops ------------------------------------------------------ */

void tl_fwd_add_bias(float *x, const float *b, int T, int n) {
    for (int t = 0; t < T; t++) tl_add_f32(x + (size_t)t * n, b, n);
}

void tl_fwd_qkv_finish(const tl_model *m, float *x, const float *b, int T, int n) {
    if (b) tl_fwd_add_bias(x, b, T, n);
    const float c = m->hp.clamp_kqv;
    if (c > 0)
        for (size_t i = 0; i < (size_t)T * n; i++) x[i] = x[i] < -c ? -c : x[i] > c ? c : x[i];
}

/* ---- matmul: out (T, n_out) = x (T, n_in) . W^T ------------------------------ */

enum { MM_MAX_THREADS = 64 }; /* mm_steal's shares; more threads keep fixed shares */

/* The matrices one run multiplies the same activations by (a layer's Q,
 * K and V; gate and up): their tiles numbered one after the other, so the
 * threads share out all of them at once - one wake-up, one wait for the
 * slower thread and one weight stream a thread where there were three.
 * Measured in one process, the two ways alternating step by step, two
 * threads: 110M Q8_0, 16 sequences 0.975-0.98 of the step time, one
 * sequence 0.984-0.989; prefill(512) Gemma 3 270M 0.94-0.96, the 110M
 * models 0.96-0.98 (with the pieces below per part). */
enum { MM_PARTS_MAX = 3 };
typedef struct {
    const tl_weight *w;
    float *out;
    int64_t tile0; /* the part's first tile in the run's numbering */
} mm_part;

typedef struct {
    mm_part part[MM_PARTS_MAX];
    int n_parts;
    int64_t tiles; /* every part's */
    const uint8_t *xq;
    size_t xq_stride;
    int T;
    int gemm;          /* xq holds tl_gemm_prepare rows; tiles go through tl_gemm_tile */
    int bf16;          /* xq holds BF16 rows; tiles go through tl_bf16dot_tile (repack "bf16") */
    int chunk;         /* tokens a pass over the rows (mm_chunk) */
    uint8_t *work;     /* gemm: thread i's workspace at work + i * work_stride */
    size_t work_stride;
    atomic_int next_piece; /* prefill: the next row piece to take (mm_task) */
    int deal;              /* how the threads split the rows: MM_FIXED, MM_PIECES, MM_STEAL (mm_deal) */
    _Atomic uint64_t span[MM_MAX_THREADS]; /* MM_STEAL: thread i's tiles left, front << 32 | end */
} mm_ctx;

/* Tiles [t0, t1) (16 rows each) of part pt's rows for every token, chunk
 * tokens at a time, on thread ith's workspace. Each tile kernel output
 * equals the single (row, token) dot bitwise, so neither the split, the
 * chunks, the parts run together nor T changes any logit. */
static void mm_part_tiles(const mm_ctx *c, const mm_part *pt, int ith, int64_t t0, int64_t t1, int chunk) {
    const tl_weight *w = pt->w;
    int64_t rows = w->n_out, r0 = t0 * 16, r1 = t1 * 16 < rows ? t1 * 16 : rows;
    size_t row_size = tl_row_size(w->type, w->n_in);
    const uint8_t *base = w->data;
    uint8_t *work = c->work + (size_t)ith * c->work_stride;
    /* packed rows (whole groups) and BF16 rows: the rows in one call (the
     * AMX tiles rearrange or copy the activations once a call) */
    int64_t step = w->packed || c->bf16 ? r1 - r0 : 16;
    for (int t0 = 0; t0 < c->T; t0 += chunk) {
        int nt = c->T - t0 < chunk ? c->T - t0 : chunk;
        for (int64_t rt = r0; rt < r1; rt += step) {
            int nr = (int)((rt + step < r1 ? rt + step : r1) - rt);
            float *out = pt->out + (size_t)t0 * rows + rt;
            const uint8_t *wr = base + (size_t)rt * row_size, *xq = c->xq + (size_t)t0 * c->xq_stride;
            if (c->bf16)
                tl_bf16dot_tile(w->n_in, nr, nt, out, (size_t)rows, wr, row_size, xq, c->xq_stride, work);
            else if (w->packed)
                tl_packed_tile(w->type, w->packed, c->gemm, w->n_in, nr, nt, out, (size_t)rows, wr, row_size, xq,
                               c->xq_stride, work);
            else if (c->gemm)
                tl_gemm_tile(w->type, w->n_in, nr, nt, out, (size_t)rows, wr, row_size, xq, c->xq_stride, work);
            else
                tl_vec_dot_tile(w->type, w->n_in, nr, nt, out, (size_t)rows, wr, row_size, xq, c->xq_stride);
        }
    }
}

static int64_t mm_tile_count(const tl_weight *w) { return (w->n_out + 15) / 16; }

/* Tiles [t0, t1) of the run's numbering, part by part. */
static void mm_tiles(const mm_ctx *c, int ith, int64_t t0, int64_t t1, int chunk) {
    for (int i = 0; i < c->n_parts; i++) {
        const mm_part *pt = &c->part[i];
        const int64_t a = t0 > pt->tile0 ? t0 : pt->tile0, e = pt->tile0 + mm_tile_count(pt->w), b = t1 < e ? t1 : e;
        if (a < b) mm_part_tiles(c, pt, ith, a - pt->tile0, b - pt->tile0, chunk);
    }
}

/* Piece k of n: whole 16-row tiles. */
static void mm_piece(const mm_ctx *c, int ith, int64_t k, int64_t n, int chunk) {
    mm_tiles(c, ith, c->tiles * k / n, c->tiles * (k + 1) / n, chunk);
}

/* MM_PIECES: row pieces a thread and part, taken in turn by whichever
 * thread is free. (A piece's rows are read again for each chunk of
 * tokens, from L2 while they fit there with the chunk; pieces of three
 * parts' rows did not: 110M F32 prefill(512), two threads, 1.02-1.05x the
 * time of one matmul per part.) */
enum { PIECES_A_THREAD = 4 };
static int64_t mm_pieces(const mm_ctx *c, int nth) { return (int64_t)PIECES_A_THREAD * nth * c->n_parts; }

/* The activations a chunk may hold when they are the f32 rows themselves
 * (float weights): half the core's L2 (sysconf; 192 KiB where it is not
 * known), at most 2 MiB. The float weights are the largest (110M F32: 340
 * MB, beyond the L3 here) and are re-read per chunk: 2 MiB L2 (Emerald
 * Rapids VM), 110M F32 prefill(512) one thread, interleaved pairs, 1 MiB
 * chunks against 192 KiB 1.078 of the tokens/s (8 pairs) and 1.105 (6),
 * two threads 1.05, F16 1.02; Q8_0 with it (its prepared rows) 0.99, so
 * the quantized kinds keep 192 KiB. */
static size_t float_chunk_bytes(void) {
    static _Atomic long bytes; /* every thread computes the same value */
    long b = atomic_load_explicit(&bytes, memory_order_relaxed);
    if (!b) {
#ifdef _SC_LEVEL2_CACHE_SIZE
        long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
#else
        long l2 = 0;
#endif
        b = l2 > 0 ? l2 / 2 : 0;
        b = b < 192 * 1024 ? 192 * 1024 : b > 2048 * 1024 ? 2048 * 1024 : b;
        atomic_store_explicit(&bytes, b, memory_order_relaxed);
    }
    return (size_t)b;
}

/* Tokens go in chunks whose activations stay in L2 while every row tile
 * passes over them (a whole long prompt would be re-read from L3 for each
 * tile); weights are re-read per chunk. float_x: the activations are the
 * f32 rows themselves (PREP_NONE). */
static int mm_chunk(const mm_ctx *c, int float_x) {
    int chunk = (int)((float_x ? float_chunk_bytes() : 192 * 1024) / c->xq_stride);
    return chunk < 16 ? 16 : chunk / 16 * 16; /* whole 16-token AMX tiles */
}

/* Takes tiles [*a, *b) from the front (back = 0: half of what is left,
 * at least 2 tiles) or the back (half, at least 2) of span s; 0 when none
 * is left. */
static int mm_claim(_Atomic uint64_t *s, int back, int64_t *a, int64_t *b) {
    uint64_t v = atomic_load_explicit(s, memory_order_relaxed);
    for (;;) {
        const uint32_t f = (uint32_t)(v >> 32), e = (uint32_t)v;
        if (f >= e) return 0;
        uint32_t run = (e - f) / 2 < 2 ? 2 : (e - f) / 2, nf = f, ne = e;
        if (run > e - f) run = e - f;
        if (back) ne = e - run;
        else nf = f + run;
        if (atomic_compare_exchange_weak_explicit(s, &v, (uint64_t)nf << 32 | ne, memory_order_relaxed,
                                                  memory_order_relaxed)) {
            *a = back ? ne : f;
            *b = back ? e : nf;
            return 1;
        }
    }
}

/* One chunk of MM_STEAL_TOKENS or more tokens (a batch of sequences, a
 * short prompt): thread i owns the i-th contiguous share of the tiles and
 * takes it front to back, half of what is left at a time - one weight
 * stream a thread, which the hardware prefetcher follows - and a thread
 * done with its own takes halves from the back of the others', so the
 * step does not wait for a vCPU that runs slower. 110M Q8_0, 16
 * sequences, two threads, 4 interleaved runs: the threads' matmul times
 * 8.07 / 5.73 ... 9.50 / 7.41 ms a step in fixed halves, even with
 * stealing, the matmuls' wall time 8.6 -> 8.1 ms (mean). Dealt in small
 * pieces instead, the streams broke up and nothing was gained. One or a
 * few tokens (decode: bound by reading the weights) keep fixed shares:
 * stealing evened the threads there too but added thread time. */
enum { MM_STEAL_TOKENS = 8 };
static void mm_steal(mm_ctx *c, int ith, int nth, int chunk) {
    int64_t a, b;
    while (mm_claim(&c->span[ith], 0, &a, &b)) mm_tiles(c, ith, a, b, chunk);
    for (int k = 1; k < nth; k++)
        while (mm_claim(&c->span[(ith + k) % nth], 1, &a, &b)) mm_tiles(c, ith, a, b, chunk);
}

/* How nth threads split c's rows, chosen once per matmul (MM_STEAL's
 * spans are set before the run).
 * MM_PIECES: several chunks of tokens (prefill): the rows go in pieces of
 *   whole 16-row tiles that the threads take as they finish, not in one
 *   fixed share each, since on a shared host one vCPU runs slower at times
 *   and a fixed half waits for it. 110M F32 prefill of 512 tokens, two
 *   threads, Emerald Rapids VM: one thread's matmul time 0.49 s against
 *   the other's 0.39 in one run, 0.41 against 0.53 in the next; in pieces
 *   the prefill took 1/1.12 the time (median of 10 interleaved pairs),
 *   Q8_0 / Q4_0 / Gemma 3 the same within 2%.
 * MM_STEAL: one chunk of several tokens (mm_steal).
 * MM_FIXED: one or a few tokens, or too few tiles: a fixed share each. */
enum { MM_FIXED, MM_PIECES, MM_STEAL };
static int mm_deal(const mm_ctx *c, int nth) {
    const int64_t tiles = c->tiles;
    const int chunk = c->chunk;
    if (nth == 1) return MM_FIXED;
    if (c->T > chunk) return tiles < mm_pieces(c, nth) ? MM_FIXED : MM_PIECES;
    return nth <= MM_MAX_THREADS && c->T >= MM_STEAL_TOKENS && tiles >= 2 * nth ? MM_STEAL : MM_FIXED;
}

static void mm_task(void *p, int ith, int nth) {
    mm_ctx *c = p;
    const int chunk = c->chunk;
    const int64_t pieces = mm_pieces(c, nth);
    /* the thread's calls all read c->xq, unchanged until the run ends */
    const int keep = c->gemm && c->part[0].w->packed;
    if (keep) tl_gemm_work_keep(c->work + (size_t)ith * c->work_stride, 1);
    if (c->deal == MM_STEAL)
        mm_steal(c, ith, nth, chunk);
    else if (c->deal == MM_FIXED)
        mm_piece(c, ith, ith, nth, chunk);
    else
        for (int64_t k; (k = atomic_fetch_add_explicit(&c->next_piece, 1, memory_order_relaxed)) < pieces;)
            mm_piece(c, ith, k, pieces, chunk);
    if (keep) tl_gemm_work_keep(c->work + (size_t)ith * c->work_stride, 0);
}

typedef struct {
    int type;
    int gemm;       /* tl_gemm_prepare for weights of `type`, else tl_quantize_row to `type` */
    const float *x;
    int64_t n;
    uint8_t *xq;
    size_t stride;
    int T;
} quant_ctx;

/* Thread ith's contiguous share [*t0, *t1) of T tokens: tok_task's and
 * quant_task's, the same so that the rows quant_task reads (the normed
 * inputs tok_task wrote) are on its own core; dealt every nth token, half
 * came from the other core's cache. 110M Q8_0, two threads, in one process
 * alternating step by step: a 16-sequence decode step 0.975-0.98 of the
 * time, prefill(512) 0.96. */
static void token_share(int T, int ith, int nth, int *t0, int *t1) {
    *t0 = (int)((int64_t)T * ith / nth);
    *t1 = (int)((int64_t)T * (ith + 1) / nth);
}

static void quant_task(void *p, int ith, int nth) {
    const quant_ctx *c = p;
    int t0, t1;
    token_share(c->T, ith, nth, &t0, &t1);
    for (int t = t0; t < t1; t++) {
        const float *x = c->x + (size_t)t * c->n;
        if (c->gemm)
            tl_gemm_prepare(c->type, x, c->xq + (size_t)t * c->stride, c->n);
        else
            tl_quantize_row(c->type, x, c->xq + (size_t)t * c->stride, c->n);
    }
}

void tl_forward_profile(tl_model *m, int on, double out[3]) {
    tl_scratch *s = m->scratch;
    if (out) memcpy(out, s->prof, sizeof s->prof);
    if (on) memset(s->prof, 0, sizeof s->prof);
    s->profile = on;
}

/* How w's activations are made ready (in s->xq, or x itself): two weights
 * with the same key read the same prepared rows of the same x. */
enum { PREP_NONE, PREP_BF16, PREP_GEMM, PREP_QUANT };
static int prep_kind(const tl_model *m, const tl_weight *w) {
    int vt = tl_type_info(w->type)->vec_dot_type;
    if (w->type == TL_TYPE_BF16 && m->bf16_act) return PREP_BF16;
    if (vt == TL_TYPE_F32) return PREP_NONE;
    if (tl_gemm_has(w->type) && m->scratch->gemm_work_stride >= tl_gemm_work_size(w->n_in)) return PREP_GEMM;
    return PREP_QUANT;
}

/* Whether b's activations, prepared as `kind`, are the bytes a's are. */
static int same_prep(const tl_model *m, const tl_weight *a, const tl_weight *b, int kind) {
    if (prep_kind(m, a) != kind || a->n_in != b->n_in) return 0;
    /* a GEMM's prepared row depends on the weight type (its offset
     * correction), a plain quantization only on the type it quantizes to */
    return kind == PREP_GEMM ? a->type == b->type
                             : tl_type_info(a->type)->vec_dot_type == tl_type_info(b->type)->vec_dot_type;
}

/* outs[i] = x . ws[i]^T for n parts that read the same prepared
 * activations (mm_group), as one run; prev as in tl_fwd_matmul_after. */
static void mm_run(tl_model *m, int n, float *const *outs, const tl_weight *const *ws, const float *x, int T,
                   const tl_weight *prev) {
    tl_scratch *s = m->scratch;
    double t0 = s->profile ? tl_now() : 0;
    const tl_weight *w = ws[0];
    int kind = prep_kind(m, w), reuse = prev && same_prep(m, prev, w, kind);
    mm_ctx c = {.n_parts = n, .T = T, .work = s->gemm_work, .work_stride = s->gemm_work_stride};
    int64_t work = 0; /* multiply-adds */
    for (int i = 0; i < n; i++) {
        c.part[i] = (mm_part){ws[i], outs[i], c.tiles};
        c.tiles += mm_tile_count(ws[i]);
        work += ws[i]->n_out * ws[i]->n_in * (int64_t)T;
    }
    quant_ctx q = {.x = x, .n = w->n_in, .xq = s->xq, .T = T};
    if (kind == PREP_BF16) {
        /* the lossy BF16 mode: activations rounded to BF16 once per matmul */
        q.type = TL_TYPE_BF16;
        q.stride = (tl_row_size(TL_TYPE_BF16, w->n_in) + 63) & ~(size_t)63;
        c.bf16 = 1;
    } else if (kind == PREP_GEMM) {
        /* rows prepared back to back: a chunk of tokens is contiguous */
        q.type = w->type;
        q.gemm = 1;
        q.stride = tl_gemm_x_size(w->n_in);
        c.gemm = 1;
    } else if (kind == PREP_QUANT) {
        q.type = tl_type_info(w->type)->vec_dot_type;
        q.stride = s->xq_stride;
    }
    if (kind == PREP_NONE) {
        c.xq = (const uint8_t *)x;
        c.xq_stride = (size_t)w->n_in * sizeof(float);
    } else {
        if (!reuse) tl_threadpool_run(m->tp, quant_task, &q, T);
        c.xq = s->xq;
        c.xq_stride = q.stride;
    }
    /* Small matrices are not worth waking the workers. */
    int tasks = work < 64 * 1024 ? 1 : tl_threadpool_size(m->tp);
    /* tasks is the pool's size or 1: the threads the run uses */
    c.chunk = mm_chunk(&c, kind == PREP_NONE);
    if ((c.deal = mm_deal(&c, tasks)) == MM_STEAL)
        for (int i = 0; i < tasks; i++)
            atomic_init(&c.span[i], (uint64_t)(c.tiles * i / tasks) << 32 | (uint64_t)(c.tiles * (i + 1) / tasks));
    tl_threadpool_run(m->tp, mm_task, &c, tasks);
    if (s->profile) s->prof[0] += tl_now() - t0;
}

void tl_fwd_matmul_after(tl_model *m, float *out, const tl_weight *w, const float *x, int T, const tl_weight *prev) {
    mm_run(m, 1, &out, &w, x, T, prev);
}

void tl_fwd_matmul(tl_model *m, float *out, const tl_weight *w, const float *x, int T) {
    mm_run(m, 1, &out, &w, x, T, NULL);
}

/* Whether b runs in one matmul with a: the same prepared activations and
 * the same kind of rows (packed or not) for the tile calls. */
static int mm_group(const tl_model *m, const tl_weight *a, const tl_weight *b) {
    return a->n_in == b->n_in && a->packed == b->packed && same_prep(m, a, b, prep_kind(m, a));
}

void tl_fwd_matmul_multi(tl_model *m, int n, float *const *outs, const tl_weight *const *ws, const float *x, int T) {
    int i = 0;
    while (i < n) {
        int k = 1; /* parts [i, i + k) go together */
        while (i + k < n && k < MM_PARTS_MAX && mm_group(m, ws[i], ws[i + k])) k++;
        mm_run(m, k, outs + i, ws + i, x, T, i ? ws[i - 1] : NULL);
        i += k;
    }
}

/* ---- one layer ------------------------------------------------------------------ */

/* The architecture's norm of one row: RMSNorm, or LayerNorm with bias b. */
void tl_fwd_norm(const tl_model *m, float *out, const float *x, const float *w, const float *b) {
    if (m->arch->layer_norm)
        tl_layernorm(out, x, w, b, m->hp.n_embd, m->hp.norm_eps);
    else
        tl_rmsnorm(out, x, w, m->hp.n_embd, m->hp.norm_eps);
}

void tl_fwd_gated_act(const tl_model *m, float *h, const float *g, int n) {
    if (m->arch->ffn_act == TL_ACT_GELU_TANH)
        tl_gelu_tanh_mul(h, g, n);
    else
        tl_silu_mul(h, g, n);
}

/* The input of attention or the FFN: the norm of the residual stream, or
 * the stream itself where the architecture norms only after (olmo2). */
static void pre_norm(const tl_model *m, float *out, const float *x, const float *w, const float *b) {
    if (m->arch->no_pre_norm)
        memcpy(out, x, (size_t)m->hp.n_embd * sizeof(float));
    else
        tl_fwd_norm(m, out, x, w, b);
}

/* A layer's element-wise steps between its matmuls, split over the pool
 * by tokens: each token's arithmetic is the same whichever thread runs it
 * (these ran on the calling thread alone before, 10-15% of a prefill that
 * the second thread did not share). */
enum { TOK_ATTN_IN, TOK_QK_FINISH, TOK_ATTN_OUT, TOK_FFN_ACT, TOK_FFN_OUT };

typedef struct {
    tl_model *m;
    const tl_layer *ly;
    int T, step;
    const tl_rope_params *rope;
    int tab;         /* TOK_QK_FINISH: the RoPE table for rope (0: global layers', 1: sliding-window layers') */
    tl_seq **seqs;   /* TOK_QK_FINISH: where the tokens' K/V rows go, */
    int vl;          /* at virtual layer vl */
} tok_ctx;

static void tok_task(void *p, int ith, int nth) {
    const tok_ctx *c = p;
    tl_model *m = c->m;
    const tl_hparams *hp = &m->hp;
    const tl_layer *ly = c->ly;
    tl_scratch *s = m->scratch;
    int D = hp->n_embd, q_dim = hp->n_head * hp->head_dim, kv_dim = hp->n_head_kv * hp->head_dim;
    int t0, t1;
    token_share(c->T, ith, nth, &t0, &t1);
    for (int t = t0; t < t1; t++) {
        float *x = s->x + (size_t)t * D, *xb = s->xb + (size_t)t * D, *o = s->o + (size_t)t * D;
        switch (c->step) {
        case TOK_ATTN_IN: pre_norm(m, xb, x, ly->attn_norm, ly->attn_norm_b); break;
        case TOK_QK_FINISH: {
            float *cs = s->rope_cs + ((size_t)c->tab * s->cap + t) * hp->n_rot;
            if (!s->rope_ok[c->tab]) tl_rope_table(cs, s->tok_pos[t], hp->n_rot, c->rope, m->rope_freqs);
            const int rope = tl_model_layer_rope(m, (int)(ly - m->layers));
            tl_fwd_k_finish(m, s->q + (size_t)t * q_dim, hp->n_head, ly->q_norm, s->tok_pos[t], c->rope, cs, rope);
            if (!m->kv.layout.store_h)
                tl_fwd_k_finish(m, s->k + (size_t)t * kv_dim, hp->n_head_kv, ly->k_norm, s->tok_pos[t], c->rope, cs,
                                rope);
            /* here rather than in a loop of its own on the calling thread:
             * 0.3-0.4 ms of a 16-sequence decode step (110M Q8_0) that the
             * other thread did not share */
            tl_fwd_store_kv(m, c->seqs, c->vl, t);
            break;
        }
        case TOK_ATTN_OUT:
            if (tl_par_shared_norm(hp->parallel)) break; /* the FFN reads xb as attention did */
            if (hp->parallel) { /* the FFN's own norm of the layer's input */
                tl_fwd_norm(m, xb, x, ly->ffn_norm, ly->ffn_norm_b);
                break;
            }
            if (ly->post_attn_norm) tl_rmsnorm(o, o, ly->post_attn_norm, D, hp->norm_eps);
            if (hp->residual_mul != 1.0f) tl_scale_f32(o, hp->residual_mul, D);
            tl_add_f32(x, o, D);
            pre_norm(m, xb, x, ly->ffn_norm, ly->ffn_norm_b);
            break;
        case TOK_FFN_ACT: {
            float *h = s->hb + (size_t)t * hp->n_ff, *g = s->hb2 + (size_t)t * hp->n_ff;
            if (!ly->w_gate.data) /* a plain FFN: act(up), in hb */
                tl_gelu_tanh(h, hp->n_ff);
            else
                tl_fwd_gated_act(m, h, g, hp->n_ff);
            break;
        }
        case TOK_FFN_OUT: {
            if (ly->post_ffn_norm) tl_rmsnorm(o, o, ly->post_ffn_norm, D, hp->norm_eps);
            if (hp->residual_mul != 1.0f) tl_scale_f32(o, hp->residual_mul, D);
            /* the parallel branches add up in llama.cpp's order: phi2
             * (attn + ffn) + x, gptneox and command-r (ffn + x) + attn */
            if (hp->parallel == TL_PAR_SHARED) tl_add_f32(o, s->o_attn + (size_t)t * D, D);
            tl_add_f32(x, o, D);
            if (hp->parallel == TL_PAR_KEY || hp->parallel == TL_PAR_SHARED_X)
                tl_add_f32(x, s->o_attn + (size_t)t * D, D);
            break;
        }
        }
    }
}

static void per_token_kv(tl_model *m, const tl_layer *ly, int T, int step, const tl_rope_params *rope, int tab,
                         tl_seq **seqs, int vl) {
    tok_ctx c = {.m = m, .ly = ly, .T = T, .step = step, .rope = rope, .tab = tab, .seqs = seqs, .vl = vl};
    tl_threadpool_run(m->tp, tok_task, &c, T);
}

static void per_token(tl_model *m, const tl_layer *ly, int T, int step) {
    per_token_kv(m, ly, T, step, NULL, 0, NULL, 0);
}


static int layer_forward(tl_model *m, tl_seq **seqs, int vl, int L, int T) {
    const tl_hparams *hp = &m->hp;
    const tl_layer *ly = &m->layers[L];
    tl_scratch *s = m->scratch;
    int hd = hp->head_dim, q_dim = hp->n_head * hd, kv_dim = hp->n_head_kv * hd;
    int window = tl_model_layer_window(m, L), store_h = m->kv.layout.store_h;
    const int tab = window ? 1 : 0;
    const tl_rope_params *rope = tab ? &hp->rope_swa : &hp->rope;

    per_token(m, ly, T, TOK_ATTN_IN);
    {
        /* store-h computes K and V from the stored h when it reads them */
        float *const outs[3] = {s->q, s->k, s->v};
        const tl_weight *const ws[3] = {&ly->wq, &ly->wk, &ly->wv};
        tl_fwd_matmul_multi(m, store_h ? 1 : 3, outs, ws, s->xb, T);
    }
    tl_fwd_qkv_finish(m, s->q, ly->bq, T, q_dim);
    if (!store_h) {
        tl_fwd_qkv_finish(m, s->k, ly->bk, T, kv_dim);
        tl_fwd_qkv_finish(m, s->v, ly->bv, T, kv_dim);
    }
    per_token_kv(m, ly, T, TOK_QK_FINISH, rope, tab, seqs, vl); /* and the K/V stores */
    s->rope_ok[tab] = 1; /* filled for every token of the batch */
    double t0 = s->profile ? tl_now() : 0;
    int rc = tl_fwd_attend(m, seqs, vl, ly, T, window, rope);
    if (s->profile) s->prof[1] += tl_now() - t0;
    if (rc) return rc;
    float *attn_out = hp->parallel ? s->o_attn : s->o; /* kept apart while the FFN runs */
    tl_fwd_matmul(m, attn_out, &ly->wo, s->att, T);
    if (ly->bo) tl_fwd_add_bias(attn_out, ly->bo, T, hp->n_embd);
    per_token(m, ly, T, TOK_ATTN_OUT);
    if (ly->x_gate) {
        tl_moe_ffn(m, ly, T);
        per_token(m, ly, T, TOK_FFN_OUT);
        return TL_OK;
    }
    if (ly->w_gate.data) {
        float *const outs[2] = {s->hb, s->hb2};
        const tl_weight *const ws[2] = {&ly->w_gate, &ly->w_up};
        tl_fwd_matmul_multi(m, 2, outs, ws, s->xb, T);
    } else {
        tl_fwd_matmul(m, s->hb, &ly->w_up, s->xb, T);
    }
    if (ly->b_up) tl_fwd_add_bias(ly->w_gate.data ? s->hb2 : s->hb, ly->b_up, T, hp->n_ff); /* on up, not gate */
    per_token(m, ly, T, TOK_FFN_ACT);
    tl_fwd_matmul(m, s->o, &ly->w_down, s->hb, T);
    if (ly->b_down) tl_fwd_add_bias(s->o, ly->b_down, T, hp->n_embd);
    per_token(m, ly, T, TOK_FFN_OUT);
    return TL_OK;
}

/* ---- the batch ---------------------------------------------------------------------- */

int tl_forward_check(const tl_model *m, tl_seq *const *seqs, const int32_t *const *tokens, const int *n_tokens,
                     int n_seq, int *T_out) {
    if (!m || !seqs || !tokens || !n_tokens || n_seq < 1)
        return tl_set_error(TL_ERR_INVALID_ARG, "forward: NULL argument or n_seq %d < 1", n_seq);
    int64_t T = 0;
    int nv = m->hp.n_vocab;
    for (int i = 0; i < n_seq; i++) {
        if (!seqs[i] || seqs[i]->model != m)
            return tl_set_error(TL_ERR_INVALID_ARG, "sequence %d does not belong to this model", i);
        if (n_tokens[i] < 1 || !tokens[i])
            return tl_set_error(TL_ERR_INVALID_ARG, "sequence %d has n_tokens %d (must be >= 1)", i, n_tokens[i]);
        if ((int64_t)seqs[i]->n_pos + n_tokens[i] > m->max_seq_len)
            return tl_set_error(TL_ERR_TOO_LONG, "sequence %d: length %d + %d new tokens exceeds max_seq_len %d", i,
                                seqs[i]->n_pos, n_tokens[i], m->max_seq_len);
        if (seqs[i]->loops != seqs[0]->loops)
            return tl_set_error(TL_ERR_INVALID_ARG, "sequences in one batch must share loops (%d vs %d)",
                                seqs[0]->loops, seqs[i]->loops);
        for (int j = 0; j < i; j++)
            if (seqs[j] == seqs[i]) return tl_set_error(TL_ERR_INVALID_ARG, "sequence %d appears twice in the batch", i);
        for (int j = 0; j < n_tokens[i]; j++)
            if (tokens[i][j] < 0 || tokens[i][j] >= nv)
                return tl_set_error(TL_ERR_INVALID_ARG, "token id %d (sequence %d, index %d) is outside the vocab [0, %d)",
                                    tokens[i][j], i, j, nv);
        T += n_tokens[i];
    }
    if (T > (1 << 20)) return tl_set_error(TL_ERR_INVALID_ARG, "batch of %lld tokens is too large", (long long)T);
    *T_out = (int)T;
    return TL_OK;
}

/* Blocks a sequence needs for n more positions: new logical blocks plus
 * private copies of shared blocks in the partial block it writes into. */
static int blocks_needed(const tl_kv_pool *kv, const tl_seq *s, int n) {
    const tl_block_table *bt = &s->bt;
    int need = ((s->n_pos + n + kv->block_size - 1) / kv->block_size - bt->n_logical) * bt->depth;
    int lb = s->n_pos / kv->block_size;
    if (need < 0) need = 0;
    if (lb < bt->n_logical)
        for (int vl = 0; vl < bt->depth; vl++) {
            int id = bt->ids[lb * bt->depth + vl];
            need += id >= 0 && kv->refcnt[id] > 1;
        }
    return need;
}

int tl_forward_blocks_needed(const tl_model *m, tl_seq *const *seqs, const int *n_tokens, int n_seq) {
    int need = 0;
    for (int i = 0; i < n_seq; i++) need += blocks_needed(&m->kv, seqs[i], n_tokens[i]);
    return need;
}

/* Gives every sequence the blocks its new positions need (copying shared
 * partial blocks first); all or nothing. The forward pass never evicts:
 * the caller made room through the cache (tl_cache_make_room), which owns
 * what may be dropped. */
static int reserve_blocks(tl_model *m, tl_seq **seqs, const int *n_tokens, int n_seq) {
    tl_kv_pool *kv = &m->kv;
    int need = tl_forward_blocks_needed(m, seqs, n_tokens, n_seq);
    if (need > kv->n_free)
        return tl_set_error(TL_ERR_KV_FULL,
                            "KV cache full: the batch needs %d more blocks (%d sequences, depth %d), %d of %d blocks "
                            "free after evicting unused cache",
                            need, n_seq, seqs[0]->bt.depth, kv->n_free, kv->n_blocks);
    for (int i = 0; i < n_seq; i++) {
        tl_seq *s = seqs[i];
        int r = tl_block_table_make_writable(&s->bt, kv, s->n_pos / kv->block_size);
        if (r == 0) r = tl_block_table_reserve(&s->bt, kv, s->n_pos + n_tokens[i]);
        if (r != 0) {
            /* -3: the backend's block copy failed and set the message */
            int code = r == -3 ? tl_last_error_code() : tl_set_error(TL_ERR_NOMEM, "out of memory for a block table");
            for (int j = 0; j <= i; j++) tl_block_table_truncate(&seqs[j]->bt, kv, seqs[j]->n_pos);
            return code;
        }
    }
    return TL_OK;
}

/* The backend's pass over blocks already reserved; on success every
 * sequence advances by its tokens, on failure the blocks taken for the new
 * positions go back. */
int tl_forward(tl_model *m, tl_seq **seqs, const int32_t *const *tokens, const int *n_tokens, int n_seq,
               float *logits, const tl_forward_opts *opts) {
    static const tl_forward_opts no_opts = {.vl_capture = -1};
    if (!opts) opts = &no_opts;
    int T = 0, rc;
    if ((rc = tl_forward_check(m, seqs, tokens, n_tokens, n_seq, &T))) return rc;
    if ((rc = reserve_blocks(m, seqs, n_tokens, n_seq))) return rc;
    rc = m->compute->forward(m, seqs, tokens, n_tokens, n_seq, T, logits, opts);
    if (rc) {
        for (int i = 0; i < n_seq; i++) tl_block_table_truncate(&seqs[i]->bt, &m->kv, seqs[i]->n_pos);
        return rc;
    }
    for (int i = 0; i < n_seq; i++) seqs[i]->n_pos += n_tokens[i];
    return TL_OK;
}

/* The CPU backend's pass (tl_cpu_compute). */
static int cpu_forward(tl_model *m, tl_seq **seqs, const int32_t *const *tokens, const int *n_tokens, int n_seq,
                       int T, float *logits, const tl_forward_opts *opts) {
    int rc = scratch_reserve(m, T, n_seq);
    if (rc) return rc;
    const tl_hparams *hp = &m->hp;
    tl_scratch *s = m->scratch;
    double t_start = s->profile ? tl_now() : 0;
    int D = hp->n_embd;
    size_t emb_row = tl_row_size(m->tok_embd.type, D);
    const float emb_scale = hp->embd_mul;
    int t = 0;
    for (int i = 0; i < n_seq; i++) {
        for (int j = 0; j < n_tokens[i]; j++, t++) {
            s->tok_seq[t] = i;
            s->tok_pos[t] = seqs[i]->n_pos + j;
            if (opts->vl_begin > 0) continue;
            float *x = s->x + (size_t)t * D;
            const tl_weight *e = &m->tok_embd;
            if (e->packed) /* tied to the output matrix, packed for its matmul */
                tl_packed_row_dequantize(e->type, e->packed, e->data, tokens[i][j], D, x);
            else
                tl_dequantize_row(e->type, (const uint8_t *)e->data + (size_t)tokens[i][j] * emb_row, x, D);
            if (emb_scale != 1.0f) tl_scale_f32(x, emb_scale, (size_t)D);
            if (m->pos_embd.data) { /* learned positions (gpt2), via xb as scratch */
                float *p = s->xb + (size_t)t * D;
                tl_dequantize_row(m->pos_embd.type,
                                  (const uint8_t *)m->pos_embd.data +
                                      (size_t)s->tok_pos[t] * tl_row_size(m->pos_embd.type, D),
                                  p, D);
                tl_add_f32(x, p, D);
            }
            if (m->tok_norm) tl_layernorm(x, x, m->tok_norm, m->tok_norm_b, D, hp->norm_eps); /* bloom */
        }
    }
    if (opts->vl_begin > 0) memcpy(s->x, opts->x_in, (size_t)T * D * sizeof(float));
    s->rope_ok[0] = s->rope_ok[1] = 0; /* new positions */
    /* Query chunks of att_qc tokens at most: longer chunks convert each
     * K/V block for more queries, but fewer than 4 tasks per thread leave
     * threads idle (later chunks attend to more positions). */
    int qc = s->att_qc, nth = tl_threadpool_size(m->tp);
    while (qc > 16 && (int64_t)hp->n_head_kv * ((T + qc - 1) / qc) < 4 * nth) qc /= 2;
    s->n_chunks = 0;
    for (t = 0; t < T; t++)
        if (t == 0 || s->tok_seq[t] != s->tok_seq[t - 1] || t - s->chunk_t0[s->n_chunks - 1] >= qc)
            s->chunk_t0[s->n_chunks++] = t;
    s->chunk_t0[s->n_chunks] = T;
    int loops0 = seqs[0]->loops;
    int depth = seqs[0]->bt.depth;
    for (int vl = opts->vl_begin; vl < depth; vl++) {
        if (vl == opts->vl_capture) memcpy(opts->x_capture, s->x, (size_t)T * D * sizeof(float));
        if ((rc = layer_forward(m, seqs, vl, tl_model_phys_layer(m, loops0, vl), T))) return rc;
    }

    if (logits) {
        int rows = 0;
        t = 0;
        for (int i = 0; i < n_seq; i++) {
            t += n_tokens[i];
            if (opts->want_logits && !opts->want_logits[i]) continue;
            tl_fwd_norm(m, s->logits_x + (size_t)rows++ * D, s->x + (size_t)(t - 1) * D, m->output_norm,
                        m->output_norm_b);
        }
        if (rows) tl_fwd_matmul(m, logits, &m->output, s->logits_x, rows);
        if (rows && m->output_b) tl_fwd_add_bias(logits, m->output_b, rows, hp->n_vocab);
        if (hp->logit_mul != 1.0f) /* granite, command-r: as llama.cpp's ggml_scale */
            tl_scale_f32(logits, hp->logit_mul, (size_t)rows * hp->n_vocab);
        const float cap = hp->final_softcap; /* Gemma 2: as llama.cpp's ggml_softcap */
        if (cap > 0)
            for (size_t i = 0; i < (size_t)rows * hp->n_vocab; i++) logits[i] = tanhf(logits[i] * (1.0f / cap)) * cap;
    }
    if (s->profile) s->prof[2] += tl_now() - t_start;
    return TL_OK;
}

const tl_compute_ops tl_cpu_compute = {"cpu", cpu_forward};
