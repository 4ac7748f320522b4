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
 * block sum of its row, so a token costs 8 vpdpbusd + 4 float ops per 16
 * rows x 32 elements. Each output is then summed exactly as the scalar
 * reference does it, block by block:
 *
 *   s += (float)isum_b * (d_w,b * d_y,b)        (multiply, then add)
 *
 * so every tile entry is bitwise tl_vec_dot_ref's result, whatever the
 * tile shape, token count or thread split. q4_1 (nibbles q, scale d, min
 * m; q5_1 the same with q5_0's 5th bits) is summed as its reference sums
 * it, with two FMAs a block:
 *
 *   s = fma((float)isum_b, d_w,b * d_y,b, s);  s = fma(m_b, sy_b, s)
 *
 * sy_b = (float)sum(y_b) * d_y,b coming prepared; multiply-then-add there
 * would be 7 float ops a block beside the 8 vpdpbusd (ggml's q4_1 x q8_1
 * reads a stored f16 d * sum(y) instead).
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

#include "gemm_q.h"

#define TN __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c")))
#define AI __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 8")
#define UNROLL16 _Pragma("GCC unroll 16")

enum { GROUP_BYTES = 8 * 64 + 64 };
/* A block's bytes in the workspace: q[8], dw, and q4_1's / q5_1's dm. */
/* q4_1 and q5_1 carry a min per block (summed with two FMAs, below) */
static inline int has_min(int kind) { return kind == Q_4_1 || kind == Q_5_1; }
static inline size_t group_bytes(int kind) { return has_min(kind) ? GROUP_BYTES + 64 : GROUP_BYTES; }
#define TL_FUSED_TOKENS 2
#define TOK_BLOCK 8 /* tokens per micro-tile */
/* prefetch start past a group's first row: 16 rows on (roffs[1] is the
 * row stride, or 0 for a one-row group), plus 2 KiB measured best */
#define PF_AHEAD(roffs) (16 * (roffs)[1] + 2048)
/* The packed stream's prefetch distance. 16 tokens (two micro-tiles a
 * group, the second from L1/L2) stall on the first when it is short: a
 * 16-token GEMM over 65536 x 768 cold q8_0 rows, one thread, 71% -> 74%
 * of the vpdpbusd peak at 4 -> 16 KiB (77-79% with the rows in cache);
 * 512-token prefill the same either way. */
#ifndef PF_PACKED
#define PF_PACKED 16384
#endif

/* The prepared activation row's layout: tl_gemm_dy_off / tl_gemm_corr_off (quants_impl.h). */

static inline int off_of(int kind) {
    return kind == Q_8_0 || kind == Q_IQ4NL ? 128 : kind == Q_4_0 ? 8 : has_min(kind) ? 0 : 16;
}


/* Where a 32-element block's quants start (after d, q4_1's m, q5_0's qh, q5_1's m and qh). */
static inline size_t qoff_of(int kind) { return kind == Q_5_1 ? 8 : kind == Q_5_0 ? 6 : kind == Q_4_1 ? 4 : 2; }

/* Row block b's 32 weights as unsigned bytes (element i in byte i). */
static inline AI TN __m256i unpack_block(int kind, const uint8_t *wb) {
    if (kind == Q_8_0)
        return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(wb + 2)), _mm256_set1_epi8((char)0x80));
    const __m256i t = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(wb + qoff_of(kind))));
    __m256i q = _mm256_and_si256(_mm256_srlv_epi64(t, _mm256_set_epi64x(4, 4, 0, 0)), _mm256_set1_epi8(0xF));
    if (kind == Q_5_0 || kind == Q_5_1) /* qh: the 4 bytes before the nibbles */
        q = _mm256_mask_add_epi8(q, (__mmask32)ld32(wb + qoff_of(kind) - 4), q, _mm256_set1_epi8(0x10));
    if (kind == Q_IQ4NL) q = _mm256_shuffle_epi8(_mm512_castsi512_si256(tl_iq4nl_lut128()), q);
    return q;
}

/* Block b of 16 rows (row r at w + roffs[r]) transposed: q[k] lane r =
 * bytes 4k..4k+3 of row r; dw lane r = row r's scale, dm (q4_1) its min.
 * The scales go through a small stack array (integer loads and stores,
 * ports the vector work leaves idle): measured faster than vpgatherdd on
 * Zen 4. */
static inline AI TN void transpose_block(int kind, const uint8_t *w, const size_t *roffs, int64_t b, __m512i q[8],
                                         __m512 *dw, __m512 *dm) {
    const size_t bw = bw_of(kind);
    const uint8_t *wb = w + (size_t)b * bw;
    /* 16 row streams are more than the hardware prefetcher follows: the
     * bytes after this group (the next group's rows, contiguous) are
     * fetched into L2 linearly, 16 blocks' worth per block. Measured on
     * Zen 4 (one 2048-wide q8_0 matrix from DRAM, nt = 1): 20-27 GB/s with
     * it, 10-11 without; into L1 it evicts this group's rows first. */
    const uint8_t *pf = w + PF_AHEAD(roffs) + (size_t)b * 16 * bw;
    UNROLL16 for (size_t k = 0; k < 16 * bw; k += 64) _mm_prefetch((const char *)(pf + k), _MM_HINT_T1);
    uint16_t dh[16];
    UNROLL16 for (int r = 0; r < 16; r++) memcpy(&dh[r], wb + roffs[r], 2);
    if (has_min(kind)) {
        uint16_t mh[16];
        UNROLL16 for (int r = 0; r < 16; r++) memcpy(&mh[r], wb + roffs[r] + 2, 2);
        *dm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)mh));
    }
    if (kind == Q_4_0 || kind == Q_4_1 || kind == Q_IQ4NL) {
        const size_t qo = qoff_of(kind);
        /* transpose the 16 packed bytes (4 dwords) per row, then split the
         * nibbles: dword j holds elements 4j..4j+3 (low) and 16+4j.. (high) */
        __m512i z[4], t[4];
        UNROLL for (int i = 0; i < 4; i++) {
            /* lane L: row i + 4L */
            __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(wb + roffs[i] + qo)));
            v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(wb + roffs[i + 4] + qo)), 1);
            v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(wb + roffs[i + 8] + qo)), 2);
            z[i] = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(wb + roffs[i + 12] + qo)), 3);
        }
        t[0] = _mm512_unpacklo_epi32(z[0], z[1]);
        t[1] = _mm512_unpackhi_epi32(z[0], z[1]);
        t[2] = _mm512_unpacklo_epi32(z[2], z[3]);
        t[3] = _mm512_unpackhi_epi32(z[2], z[3]);
        /* lane L of a 4x4 transpose holds rows 4L..4L+3 in order */
        const __m512i p[4] = {_mm512_unpacklo_epi64(t[0], t[2]), _mm512_unpackhi_epi64(t[0], t[2]),
                              _mm512_unpacklo_epi64(t[1], t[3]), _mm512_unpackhi_epi64(t[1], t[3])};
        const __m512i m4 = _mm512_set1_epi8(0xF);
        UNROLL for (int j = 0; j < 4; j++) {
            q[j] = _mm512_and_si512(p[j], m4);
            q[j + 4] = _mm512_and_si512(_mm512_srli_epi16(p[j], 4), m4);
        }
        if (kind == Q_IQ4NL) UNROLL for (int k = 0; k < 8; k++) q[k] = _mm512_shuffle_epi8(tl_iq4nl_lut128(), q[k]);
        *dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)dh));
        return;
    }
    __m512i z[8], t[8], u[8];
    UNROLL for (int r = 0; r < 8; r++)
        z[r] = _mm512_inserti64x4(_mm512_castsi256_si512(unpack_block(kind, wb + roffs[r])),
                                  unpack_block(kind, wb + roffs[r + 8]), 1);
    /* z[r]: 128-bit lanes = row r dwords 0-3, 4-7, row r+8 dwords 0-3, 4-7 */
    UNROLL for (int r = 0; r < 8; r += 2) {
        t[r] = _mm512_unpacklo_epi32(z[r], z[r + 1]);
        t[r + 1] = _mm512_unpackhi_epi32(z[r], z[r + 1]);
    }
    UNROLL for (int h = 0; h < 8; h += 4) {
        u[h + 0] = _mm512_unpacklo_epi64(t[h + 0], t[h + 2]);
        u[h + 1] = _mm512_unpackhi_epi64(t[h + 0], t[h + 2]);
        u[h + 2] = _mm512_unpacklo_epi64(t[h + 1], t[h + 3]);
        u[h + 3] = _mm512_unpackhi_epi64(t[h + 1], t[h + 3]);
    }
    /* u[j] (j < 4), lane L: rows 0-3 (L0, L1) / 8-11 (L2, L3) of dword j
     * (L0, L2) and j + 4 (L1, L3); u[j + 4] the same for rows 4-7 / 12-15 */
    const __m512i lo = _mm512_set_epi64(13, 12, 5, 4, 9, 8, 1, 0), hi = _mm512_set_epi64(15, 14, 7, 6, 11, 10, 3, 2);
    UNROLL for (int j = 0; j < 4; j++) {
        q[j] = _mm512_permutex2var_epi64(u[j], lo, u[j + 4]);
        q[j + 4] = _mm512_permutex2var_epi64(u[j], hi, u[j + 4]);
    }
    *dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)dh));
}

/* Block b of a TL_PACK16 group g (pack.c): the 16 scales (q4_1: then the
 * 16 mins), then q[k] lane r = bytes 4k..4k+3 of row r (q8_0, made
 * unsigned here), or for q4_0 (q4_1) the
 * packed bytes 4j..4j+3 split into low (q[j]) and high (q[j + 4]) nibbles,
 * q5_0 the same with each register's 5th bits added from its 64-bit mask:
 * the registers transpose_block builds, read with one load each. (Plain
 * q5_0 rows cost decode a bit gather per row and block: Gemma 3 270M's
 * 640-wide q5_0 matrices streamed at ~12 GB/s, packed q8_0 at ~20.) */
static inline AI TN void load_packed(int kind, const uint8_t *g, int64_t b, __m512i q[8], __m512 *dw, __m512 *dm,
                                     int pf) {
    const uint8_t *gb = g + (size_t)b * 16 * bw_of(kind);
    /* pf (a full micro-tile of TOK_BLOCK tokens, each block's compute
     * long): the bytes PF_PACKED ahead go to L2 as this block is read, or
     * the stream starves. A short one (decode, a small batch) runs ahead
     * of the prefetches it would issue: the hardware prefetcher, on the
     * weights' huge pages, serves it better alone. 110M, one thread,
     * decode of one sequence: Q4_0 3.2-3.9 -> 2.3-3.1 ms a token, Q8_0
     * 4.7-5.2 -> 4.3-4.6; 2 sequences 6.8 -> 4.1-4.5 ms a step (Q8_0);
     * 16 need it (16 ms a step with, 22 without). */
    if (pf)
        UNROLL16 for (size_t k = 0; k < 16 * bw_of(kind); k += 64) _mm_prefetch((const char *)(gb + PF_PACKED + k), _MM_HINT_T1);
    *dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)gb));
    if (kind == Q_8_0) {
        UNROLL for (int k = 0; k < 8; k++)
            q[k] = _mm512_xor_si512(_mm512_loadu_si512(gb + 32 + 64 * k), _mm512_set1_epi8((char)0x80));
        return;
    }
    if (kind == Q_4_1) *dm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(gb + 32)));
    const __m512i m4 = _mm512_set1_epi8(0xF);
    const uint8_t *qs = gb + (kind == Q_5_0 ? 96 : kind == Q_4_1 ? 64 : 32);
    UNROLL for (int j = 0; j < 4; j++) {
        const __m512i p = _mm512_loadu_si512(qs + 64 * j);
        q[j] = _mm512_and_si512(p, m4);
        q[j + 4] = _mm512_and_si512(_mm512_srli_epi16(p, 4), m4);
    }
    if (kind == Q_IQ4NL) UNROLL for (int k = 0; k < 8; k++) q[k] = _mm512_shuffle_epi8(tl_iq4nl_lut128(), q[k]);
    if (kind == Q_5_0)
        UNROLL for (int k = 0; k < 8; k++) {
            uint64_t h;
            memcpy(&h, gb + 32 + 8 * k, 8);
            q[k] = _mm512_mask_add_epi8(q[k], (__mmask64)h, q[k], _mm512_set1_epi8(0x10));
        }
}

/* Where mk finds a block's registers: transposed on the fly from plain
 * rows, from the workspace, or from a packed group. */
enum { SRC_ROWS, SRC_WORK, SRC_PACKED };

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
            s[c] = _mm512_dpbusd_epi32(s[c], q[k], _mm512_set1_epi32((int)ld32(yq)));
        }
        UNROLL for (int c = 0; c < C; c++) {
            const float *dy = (const float *)(x + c * ldx + dyo);
            const __m512 d = _mm512_mul_ps(dw, _mm512_set1_ps(dy[b]));
            if (has_min(kind)) { /* the corr slot holds sy_b (prepare) */
                const float *sy = (const float *)(x + c * ldx + co);
                acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[c]), d, acc[c]);
                acc[c] = _mm512_fmadd_ps(dm, _mm512_set1_ps(sy[b]), acc[c]);
            } else {
                acc[c] = _mm512_add_ps(acc[c], _mm512_mul_ps(_mm512_cvtepi32_ps(s[c]), d));
            }
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
        __m512i *g = (__m512i *)(wk + (size_t)b * group_bytes(kind));
        UNROLL for (int k = 0; k < 8; k++) _mm512_store_si512(g + k, q[k]);
        _mm512_store_ps((float *)(g + 8), dw);
        if (has_min(kind)) _mm512_store_ps((float *)(g + 9), dm);
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
        s += (float)isum * (_cvtsh_ss(dh) * _cvtsh_ss(y[b].d));
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
        s = _mm_fmadd_ss(_mm_set_ss((float)isum), _mm_set_ss(_cvtsh_ss(ld16(wb)) * dy), s);
        s = _mm_fmadd_ss(_mm_set_ss(_cvtsh_ss(ld16(wb + 2))), _mm_set_ss((float)sumy * dy), s);
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
    /* a block's q[8] and dw, and q4_1's dm (group_bytes) */
    const size_t a = (size_t)(n / 32) * (8 * 64 + 2 * 64), k = tl_gemm_k_work_size(n);
    return a > k ? a : k;
}
