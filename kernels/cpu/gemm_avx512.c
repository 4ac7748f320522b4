/* gemm_avx512.c - q8_0/q4_0/q5_0/q4_1/q5_1/iq4_nl weights x q8_0 activations with
 * AVX512-VNNI, 16 weight rows at a time, for the matmuls of the forward
 * pass (prefill and decode alike).
 *
 * The row-dot kernels this replaces (quants_avx512.c before) kept one
 * 8-lane accumulator per (row, token) and paid a convert, a multiply and an
 * FMA for every 32 products. Here the 16 rows of a group are transposed
 * per block so that lane r of a zmm belongs to row r:
 *
 *   work, one block b of a 16-row group (576 bytes):
 *     q[k], k = 0..7:  64 bytes, lane r = bytes 4k..4k+3 of row r's block,
 *                      as unsigned (q8_0: q ^ 0x80, q4_0: nibble, q5_0:
 *                      nibble | 5th bit << 4, iq4_nl: its level + 128,
 *                      one vpshufb of the nibble)
 *     dw:              16 floats, row r's block scale
 *     dm (q4_1, q5_1): 16 floats, row r's block min
 *
 * and one vpdpbusd of q[k] with 4 activation bytes broadcast ({1to16})
 * feeds 16 rows. After the 8 of a block each lane holds the exact integer
 * block sum of its row, so a token costs 8 vpdpbusd + 3 float ops per 16
 * rows x 32 elements. Each output is then summed exactly as the scalar
 * reference does it, block by block, with one FMA:
 *
 *   s = fma((float)isum_b, d_w,b * d_y,b, s)
 *
 * (the scale product of two f16 values is exact in f32; ggml's AVX2 q8_0
 * dot also adds with an FMA, there per lane of the block), so every tile
 * entry is bitwise tl_vec_dot_ref's result, whatever the tile shape, token
 * count or thread split. q4_1 (nibbles q, scale d, min m; q5_1 the same
 * with q5_0's 5th bits) takes a second FMA for its min:
 *
 *   s = fma((float)isum_b, d_w,b * d_y,b, s);  s = fma(m_b, sy_b, s)
 *
 * sy_b = (float)sum(y_b) * d_y,b coming prepared (ggml's q4_1 x q8_1 reads
 * a stored f16 d * sum(y) instead).
 *
 * The activation rows are prepared once per matmul (tl_gemm_prepare): the
 * q8_0 row (as tl_quantize_row makes it), then the block scales as floats
 * and the offset correction -off * sum(y) per block (off = 128, 8, 16: the
 * unsigned weight's bias), so the kernel never recomputes them per row
 * group. A group with more tokens than TL_FUSED_TOKENS is transposed once
 * into the caller's workspace and reused for every token; fewer tokens
 * (decode) use the transposed registers directly. */
#include "quants_impl.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <math.h>

#include "gemm_q.h"
#include "blocks_avx512.h"

/* C tokens (C <= TOK_BLOCK, a constant after inlining) against one 16-row
 * group; wk: the workspace or the packed group. */
static inline AI TN void mk(int kind, int src, int C, int64_t nb, const uint8_t *wk, const uint8_t *w,
                            const size_t *roffs, const uint8_t *x, size_t ldx, float *out, size_t ldo, __mmask16 m) {
    const size_t dyo = tl_gemm_dy_off(nb), co = tl_gemm_corr_off(nb);
    __m512 acc[TOK_BLOCK];
    UNROLL for (int c = 0; c < C; c++) acc[c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m512i q[8];
        __m512 dw, dm = _mm512_setzero_ps();
        if (src == SRC_WORK) {
            const __m512i *g = (const __m512i *)(wk + (size_t)b * group_bytes(kind));
            UNROLL for (int k = 0; k < 8; k++) q[k] = _mm512_load_si512(g + k);
            dw = _mm512_load_ps((const float *)(g + 8));
            if (has_min(kind)) dm = _mm512_load_ps((const float *)(g + 9));
        } else if (src == SRC_PACKED) {
            load_packed(kind, wk, b, q, &dw, &dm, C == TOK_BLOCK);
        } else {
            transpose_block(kind, w, roffs, b, q, &dw, &dm);
        }
        __m512i s[TOK_BLOCK];
        UNROLL for (int c = 0; c < C; c++) {
            const int32_t *corr = (const int32_t *)(x + c * ldx + co);
            s[c] = has_min(kind) ? _mm512_setzero_si512() : _mm512_set1_epi32(corr[b]);
        }
        UNROLL for (int k = 0; k < 8; k++) UNROLL for (int c = 0; c < C; c++) {
            const uint8_t *yq = x + c * ldx + (size_t)b * sizeof(block_q8_0) + 2 + 4 * k;
            s[c] = _mm512_dpbusd_epi32(s[c], q[k], _mm512_set1_epi32((int)tl_ld32(yq)));
        }
        UNROLL for (int c = 0; c < C; c++) {
            const float *dy = (const float *)(x + c * ldx + dyo);
            const __m512 d = _mm512_mul_ps(dw, _mm512_set1_ps(dy[b]));
            /* q4_1 / q5_1: the corr slot holds sy_b (prepare) */
            const float sy = has_min(kind) ? ((const float *)(x + c * ldx + co))[b] : 0.0f;
            acc[c] = block_sum(kind, acc[c], s[c], d, dm, sy);
        }
    }
    UNROLL for (int c = 0; c < C; c++) _mm512_mask_storeu_ps(out + c * ldo, m, acc[c]);
}

static inline AI TN void mk_any(int kind, int src, int C, int64_t nb, const uint8_t *wk, const uint8_t *w,
                                const size_t *roffs, const uint8_t *x, size_t ldx, float *out, size_t ldo, __mmask16 m) {
    switch (C) {
#define MK_CASE(N) \
    case N: mk(kind, src, N, nb, wk, w, roffs, x, ldx, out, ldo, m); break;
        MK_CASE(1) MK_CASE(2) MK_CASE(3) MK_CASE(4) MK_CASE(5) MK_CASE(6) MK_CASE(7) MK_CASE(8)
#undef MK_CASE
    }
}

static inline AI TN void gemm_q(int kind, int64_t n, int nr, int nt, float *out, size_t ldo, const void *w, size_t ldw,
                                const void *x, size_t ldx, void *work) {
    const int64_t nb = n / 32;
    const uint8_t *W = w, *X = x;
    /* rows past nr repeat the last row (valid memory); their lanes are not stored */
    size_t roffs[16];
    for (int r = 0; r < 16; r++) roffs[r] = (size_t)(r < nr ? r : nr - 1) * ldw;
    const __mmask16 m = (__mmask16)((1u << nr) - 1);
    if (nt <= TL_FUSED_TOKENS) {
        mk_any(kind, SRC_ROWS, nt, nb, NULL, W, roffs, X, ldx, out, ldo, m);
        return;
    }
    uint8_t *wk = work;
    for (int64_t b = 0; b < nb; b++) {
        __m512i q[8];
        __m512 dw, dm;
        transpose_block(kind, W, roffs, b, q, &dw, &dm);
        store_block(kind, wk, b, q, dw, dm);
    }
    int t = 0;
    for (; t + TOK_BLOCK <= nt; t += TOK_BLOCK)
        mk(kind, SRC_WORK, TOK_BLOCK, nb, wk, W, roffs, X + (size_t)t * ldx, ldx, out + (size_t)t * ldo, ldo, m);
    if (t < nt)
        mk_any(kind, SRC_WORK, nt - t, nb, wk, W, roffs, X + (size_t)t * ldx, ldx, out + (size_t)t * ldo, ldo, m);
}

/* The GEMM on TL_PACK16 rows (pack.c): each group read as it lies, by
 * decode and prefill alike (nr is a multiple of 16: a matrix is packed
 * only with a multiple of 16 rows, and the matmul's tiles are groups). */
static inline AI TN void gemm_pk(int kind, int64_t n, int nr, int nt, float *out, size_t ldo, const void *w,
                                 size_t ldw, const void *x, size_t ldx) {
    const int64_t nb = n / 32;
    const uint8_t *X = x;
    for (int r0 = 0; r0 < nr; r0 += 16) {
        const uint8_t *g = (const uint8_t *)w + (size_t)r0 * ldw;
        float *o = out + r0;
        int t = 0;
        for (; t + TOK_BLOCK <= nt; t += TOK_BLOCK)
            mk(kind, SRC_PACKED, TOK_BLOCK, nb, g, NULL, NULL, X + (size_t)t * ldx, ldx, o + (size_t)t * ldo, ldo,
               0xFFFF);
        if (t < nt)
            mk_any(kind, SRC_PACKED, nt - t, nb, g, NULL, NULL, X + (size_t)t * ldx, ldx, o + (size_t)t * ldo, ldo,
                   0xFFFF);
    }
}

/* The table's entry points, one per type: the GEMM on plain rows (gemm_q)
 * and on TL_PACK16 rows (gemm_pk). */
#define GEMM_Q(NAME, KIND)                                                                                       \
    static TN void NAME(int64_t n, int nr, int nt, float *out, size_t ldo, const void *w, size_t ldw, const void *x, \
                        size_t ldx, void *work) {                                                                 \
        gemm_q(KIND, n, nr, nt, out, ldo, w, ldw, x, ldx, work);                                                 \
    }
#define GEMM_PK(NAME, KIND)                                                                                      \
    static TN void NAME(int64_t n, int nr, int nt, float *out, size_t ldo, const void *w, size_t ldw, const void *x, \
                        size_t ldx, void *work) {                                                                 \
        (void)work;                                                                                              \
        gemm_pk(KIND, n, nr, nt, out, ldo, w, ldw, x, ldx);                                                      \
    }
GEMM_Q(gemm_q8_0, Q_8_0)
GEMM_Q(gemm_q4_0, Q_4_0)
GEMM_Q(gemm_q5_0, Q_5_0)
GEMM_Q(gemm_q4_1, Q_4_1)
GEMM_Q(gemm_q5_1, Q_5_1)
GEMM_Q(gemm_iq4_nl, Q_IQ4NL)
GEMM_PK(gemm_pk_q8_0, Q_8_0)
GEMM_PK(gemm_pk_q4_0, Q_4_0)
GEMM_PK(gemm_pk_q5_0, Q_5_0)
GEMM_PK(gemm_pk_q4_1, Q_4_1)
GEMM_PK(gemm_pk_iq4_nl, Q_IQ4NL)
#undef GEMM_Q
#undef GEMM_PK

/* The prepared row: the q8_0 row, then per block its scale as a float and
 * -off * sum(y), or for q4_1 the float sy = (float)sum(y) * scale. */
static inline AI TN void prepare(int kind, const float *src, void *dst, int64_t n, tl_quantize_fn quantize) {
    const int64_t nb = n / 32;
    uint8_t *p = dst;
    quantize(src, p, n);
    float *dy = (float *)(p + tl_gemm_dy_off(nb));
    int32_t *corr = (int32_t *)(p + tl_gemm_corr_off(nb));
    const __m256i ones = _mm256_set1_epi8(1);
    for (int64_t b = 0; b < nb; b++) {
        const block_q8_0 *yb = (const block_q8_0 *)p + b;
        dy[b] = _cvtsh_ss(yb->d);
        const __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, _mm256_loadu_si256((const __m256i *)yb->qs));
        if (has_min(kind)) {
            const float sy = (float)hsum_epi32(s) * dy[b];
            memcpy(&corr[b], &sy, 4);
        } else {
            corr[b] = -off_of(kind) * hsum_epi32(s);
        }
    }
}

static tl_quantize_fn quantize_q8_0_fn;
static TN void prepare_q8_0(const float *src, void *dst, int64_t n) { prepare(Q_8_0, src, dst, n, quantize_q8_0_fn); }
static TN void prepare_q4_0(const float *src, void *dst, int64_t n) { prepare(Q_4_0, src, dst, n, quantize_q8_0_fn); }
static TN void prepare_q5_0(const float *src, void *dst, int64_t n) { prepare(Q_5_0, src, dst, n, quantize_q8_0_fn); }
static TN void prepare_q4_1(const float *src, void *dst, int64_t n) { prepare(Q_4_1, src, dst, n, quantize_q8_0_fn); }
static TN void prepare_iq4_nl(const float *src, void *dst, int64_t n) { prepare(Q_IQ4NL, src, dst, n, quantize_q8_0_fn); }
static TN void prepare_q5_1(const float *src, void *dst, int64_t n) { prepare(Q_5_1, src, dst, n, quantize_q8_0_fn); }

/* vec_dot for one row, summed as the reference and the tiles sum (exact
 * integer block sums, then multiply and add in block order). */
static inline AI TN void dot1(int kind, int64_t n, float *out, const void *w, const void *x) {
    const uint8_t *wb = w;
    const block_q8_0 *y = x;
    const __m256i off = _mm256_set1_epi8((char)off_of(kind));
    float s = 0;
    for (int64_t b = 0; b < n / 32; b++, wb += bw_of(kind)) {
        const __m256i yv = _mm256_loadu_si256((const __m256i *)y[b].qs);
        const __m256i base = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_dpbusd_epi32(_mm256_setzero_si256(), off, yv));
        const int isum = hsum_epi32(_mm256_dpbusd_epi32(base, unpack_block(kind, wb), yv));
        uint16_t dh;
        memcpy(&dh, wb, 2);
        s = fmaf((float)isum, _cvtsh_ss(dh) * _cvtsh_ss(y[b].d), s);
    }
    *out = s;
}

static TN void dot1_q8_0(int64_t n, float *out, const void *w, const void *x) { dot1(Q_8_0, n, out, w, x); }
static TN void dot1_q4_0(int64_t n, float *out, const void *w, const void *x) { dot1(Q_4_0, n, out, w, x); }
static TN void dot1_q5_0(int64_t n, float *out, const void *w, const void *x) { dot1(Q_5_0, n, out, w, x); }
static TN void dot1_iq4_nl(int64_t n, float *out, const void *w, const void *x) { dot1(Q_IQ4NL, n, out, w, x); }

/* q4_1's / q5_1's one row, as the reference and the tiles sum it (two FMAs
 * a block; d and m lead both blocks). */
static inline AI TN void dot1_min(int kind, int64_t n, float *out, const void *w, const void *x) {
    const uint8_t *wb = w;
    const block_q8_0 *y = x;
    const __m256i ones = _mm256_set1_epi8(1);
    __m128 s = _mm_setzero_ps();
    for (int64_t b = 0; b < n / 32; b++, wb += bw_of(kind)) {
        const __m256i yv = _mm256_loadu_si256((const __m256i *)y[b].qs), z = _mm256_setzero_si256();
        const int isum = hsum_epi32(_mm256_dpbusd_epi32(z, unpack_block(kind, wb), yv));
        const int sumy = hsum_epi32(_mm256_dpbusd_epi32(z, ones, yv));
        const float dy = _cvtsh_ss(y[b].d);
        s = _mm_fmadd_ss(_mm_set_ss((float)isum), _mm_set_ss(_cvtsh_ss(tl_ld16(wb)) * dy), s);
        s = _mm_fmadd_ss(_mm_set_ss(_cvtsh_ss(tl_ld16(wb + 2))), _mm_set_ss((float)sumy * dy), s);
    }
    *out = _mm_cvtss_f32(s);
}

static TN void dot1_q4_1(int64_t n, float *out, const void *w, const void *x) { dot1_min(Q_4_1, n, out, w, x); }
static TN void dot1_q5_1(int64_t n, float *out, const void *w, const void *x) { dot1_min(Q_5_1, n, out, w, x); }

void tl_gemm_fill_avx512(tl_kernel_table *t) {
    quantize_q8_0_fn = t->quantize_q8_0;
    t->vec_dot[TL_TYPE_Q8_0] = dot1_q8_0;
    t->vec_dot[TL_TYPE_Q4_0] = dot1_q4_0;
    t->vec_dot[TL_TYPE_Q5_0] = dot1_q5_0;
    t->vec_dot[TL_TYPE_Q4_1] = dot1_q4_1;
    /* vec_dot_tile stays the loop over vec_dot; matmuls go through gemm */
    t->gemm_tile[TL_TYPE_Q8_0] = gemm_q8_0;
    t->gemm_tile[TL_TYPE_Q4_0] = gemm_q4_0;
    t->gemm_tile[TL_TYPE_Q5_0] = gemm_q5_0;
    t->gemm_tile[TL_TYPE_Q4_1] = gemm_q4_1;
    t->gemm_prepare[TL_TYPE_Q8_0] = prepare_q8_0;
    t->gemm_prepare[TL_TYPE_Q4_0] = prepare_q4_0;
    t->gemm_prepare[TL_TYPE_Q5_0] = prepare_q5_0;
    t->gemm_prepare[TL_TYPE_Q4_1] = prepare_q4_1;
    t->gemm_tile_pk[TL_TYPE_Q8_0] = gemm_pk_q8_0;
    t->gemm_tile_pk[TL_TYPE_Q4_0] = gemm_pk_q4_0;
    t->gemm_tile_pk[TL_TYPE_Q5_0] = gemm_pk_q5_0;
    t->gemm_tile_pk[TL_TYPE_Q4_1] = gemm_pk_q4_1;
    t->vec_dot[TL_TYPE_IQ4_NL] = dot1_iq4_nl;
    /* q5_1: transposed per call (not packed at load) */
    t->vec_dot[TL_TYPE_Q5_1] = dot1_q5_1;
    t->gemm_tile[TL_TYPE_Q5_1] = gemm_q5_1;
    t->gemm_prepare[TL_TYPE_Q5_1] = prepare_q5_1;
    t->gemm_tile[TL_TYPE_IQ4_NL] = gemm_iq4_nl;
    t->gemm_prepare[TL_TYPE_IQ4_NL] = prepare_iq4_nl;
    t->gemm_tile_pk[TL_TYPE_IQ4_NL] = gemm_pk_iq4_nl;
    t->pack_rows = 16;
    tl_gemm_k_fill_avx512(t); /* q4_K/q6_K: gemm_k_avx512.c */
}

#else
void tl_gemm_fill_avx512(tl_kernel_table *t) { (void)t; }
#endif

size_t tl_gemm_x_size(int64_t n) {
    const int64_t nb = n / 32;
    const size_t a = ((size_t)nb * sizeof(block_q8_0) + 3) / 4 * 4 + (size_t)nb * 8;
    const size_t k = (size_t)(n / QK_K) * sizeof(block_q8_K); /* q4_K/q6_K: the q8_K row */
    return ((a > k ? a : k) + 63) & ~(size_t)63;
}

size_t tl_gemm_work_size(int64_t n) {
    /* a block's q[8] and dw, and q4_1's dm (group_bytes); the K-quant
     * tiles' and the AMX tiles' (int8 and BF16) needs */
    const size_t a = (size_t)(n / 32) * (8 * 64 + 2 * 64), k = tl_gemm_k_work_size(n), x = tl_gemm_amx_work_size(n),
                 h = tl_bf16_amx_work_size(n);
    const size_t ak = a > k ? a : k, xh = x > h ? x : h;
    return ak > xh ? ak : xh;
}
