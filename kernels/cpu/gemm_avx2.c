/* gemm_avx2.c - q8_0/q4_0/q5_0/q4_1/q5_1/iq4_nl weights x q8_0 activations with AVX2, 8
 * weight rows at a time, for the matmuls of the forward pass (prefill and
 * decode alike). The AVX2 counterpart of gemm_avx512.c, without VNNI.
 *
 * The row-dot tiles this replaces (quants_avx2.c's mk_q) kept one 8-lane
 * accumulator per (row, token) and paid a vpmaddwd, a convert, a multiply
 * and an FMA per 32 products and output. Here the 8 rows of a group are
 * transposed per block so that lane r of a ymm belongs to row r:
 *
 *   work, one block b of an 8-row group (288 bytes; 320 with dm):
 *     q[k], k = 0..7:  32 bytes, lane r = bytes 4k..4k+3 of row r's block
 *                      (q8_0: signed; iq4_nl: its signed level, one
 *                      vpshufb of the nibble; q4_0, q4_1: nibble; q5_0,
 *                      q5_1: nibble | 5th bit << 4, unsigned)
 *     dw:              8 floats, row r's block scale
 *     dm (q4_1, q5_1): 8 floats, row r's block min
 *
 * and vpmaddubsw of q[k] with 4 activation bytes broadcast feeds 8 rows.
 * vpmaddubsw multiplies unsigned by signed bytes into saturating int16
 * pairs, so the types differ in how they stay exact:
 *   q8_0, iq4_nl: the sign trick, |w| x (y signed by w); a pair is at
 *         most 2 * 128 * 127 < 32767, widened (vpmaddwd) per k;
 *   q4_0, q4_1: nibbles x y; a pair is at most 2 * 15 * 127, so all 8 k
 *         of a block add up in int16 (30480) before one vpmaddwd;
 *   q5_0, q5_1: values to 31; 4 k add up in int16 (31496), two vpmaddwd.
 * The unsigned types' bias (8, 16) comes back as -off * sum(y) per block,
 * from the prepared activation row. After a block each lane holds the exact
 * integer block sum of its row, and each output is summed exactly as the
 * scalar reference does it, block by block:
 *
 *   s = fma((float)isum_b, d_w,b * d_y,b, s)
 *
 * (q4_1, q5_1: then s = fma(m_b, sy_b, s) with sy_b = (float)sum(y_b) *
 * d_y,b, prepared in the bias slot), so every entry is bitwise
 * tl_vec_dot_ref's result, whatever the tile shape, token count or thread
 * split.
 *
 * Few tokens (decode: nothing to share a transposition with) read the rows
 * in place: each row's block gives 8 int32 partial sums, and a vphaddd
 * tree turns the 8 rows' partials into one ymm of 8 block sums, the same
 * integers. vec_dot and vec_dot_tile (q8_0 rows read in place, as the
 * attention's quantized-K scores do) are that path on raw q8_0 rows. */
#include "quants_impl.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <math.h>

#define T2 __attribute__((target("avx2,fma,f16c")))
#define AI __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 8")
/* the k loop of a micro-tile: fully unrolled, GCC interleaves the 8 steps
 * and spills the accumulators */
#define K_UNROLL _Pragma("GCC unroll 2")
#define NO_UNROLL _Pragma("GCC unroll 1")
#include "avx2_bytes.h"
#include "gemm_q.h"

enum { GROUP_BYTES = 8 * 32 + 32 };
#define TOK_BLOCK 4    /* tokens per micro-tile: 4 int and 4 float accumulators */

static inline int off_of(int kind) { return kind == Q_4_0 ? 8 : kind == Q_5_0 ? 16 : 0; }
/* signed weight bytes: the sign trick */
static inline int is_signed(int kind) { return kind == Q_8_0 || kind == Q_IQ4NL; }
/* a min per block, summed by a second FMA */
static inline int has_min(int kind) { return kind == Q_4_1 || kind == Q_5_1; }
static inline size_t group_bytes(int kind) { return has_min(kind) ? GROUP_BYTES + 32 : GROUP_BYTES; }

/* Row block wb's 32 weights as bytes (element i in byte i). */
static inline AI T2 __m256i unpack_block(int kind, const uint8_t *wb) {
    if (kind == Q_8_0) return _mm256_loadu_si256((const __m256i *)(wb + 2));
    if (kind == Q_4_0) return nibbles32(wb + 2);
    if (kind == Q_4_1) return nibbles32(wb + 4);
    if (kind == Q_IQ4NL)
        return _mm256_shuffle_epi8(tl_iq4nl_lut256(), nibbles32(wb + 2));
    const size_t qh = kind == Q_5_1 ? 4 : 2; /* then the nibbles */
    return _mm256_or_si256(nibbles32(wb + qh + 4), _mm256_and_si256(bits32(wb + qh), _mm256_set1_epi8(0x10)));
}

/* The exact int32 block sums of the products of 4-byte groups: lane i of
 * the result sums elements 4i..4i+3 of q (as unpack_block gives it) times
 * y, less the bias (q4_0/q5_0: off * y, through `base`, the same maddubs
 * of the bias bytes, so the int16 difference cannot saturate). */
static inline AI T2 __m256i block_partials(int kind, __m256i q, __m256i y, __m256i base) {
    const __m256i ones = _mm256_set1_epi16(1);
    if (is_signed(kind)) return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(q), _mm256_sign_epi8(y, q)), ones);
    if (!off_of(kind)) return _mm256_madd_epi16(_mm256_maddubs_epi16(q, y), ones);
    return _mm256_madd_epi16(_mm256_sub_epi16(_mm256_maddubs_epi16(q, y), base), ones);
}

/* fma(isum, dw * dy, s), lane by lane, as the reference sums a block;
 * with a min (q4_1, q5_1) a second FMA, of dm and sy. */
static inline AI T2 __m256 scale_add(int kind, __m256 s, __m256i isum, __m256 dw, float dy, __m256 dm, float sy) {
    s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, _mm256_set1_ps(dy)), s);
    return has_min(kind) ? _mm256_fmadd_ps(dm, _mm256_set1_ps(sy), s) : s;
}

/* (float)sum(y) * d_y: the min's factor (q4_1, q5_1). */
static inline AI T2 float sum_y(__m256i yv, float dy) {
    return (float)hsum_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), yv), _mm256_set1_epi16(1))) * dy;
}

/* One token (a q8_0 row y, raw or the prefix of a prepared row) against 8
 * rows read in place. */
static inline AI T2 void mk_direct(int kind, int64_t nb, const uint8_t *w, const size_t *roffs, const block_q8_0 *y,
                                   float *out, int nr, int pf) {
    const size_t bw = bw_of(kind);
    const __m256i offv = _mm256_set1_epi8((char)off_of(kind));
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *wb = w + (size_t)b * bw;
        if (pf) tl_prefetch_next_group8(w, roffs, b, bw);
        const __m256i yv = _mm256_loadu_si256((const __m256i *)y[b].qs);
        const __m256i base = off_of(kind) ? _mm256_maddubs_epi16(offv, yv) : _mm256_setzero_si256();
        __m256i p[8];
        UNROLL for (int r = 0; r < 8; r++) p[r] = block_partials(kind, unpack_block(kind, wb + roffs[r]), yv, base);
        const float dy = f16(y[b].d);
        const __m256 dm = has_min(kind) ? tl_row_f16x8(wb + 2, roffs) : _mm256_setzero_ps();
        acc = scale_add(kind, acc, tl_sum8_epi32(p), tl_row_f16x8(wb, roffs), dy, dm, has_min(kind) ? sum_y(yv, dy) : 0);
    }
    tl_store_rows8(out, acc, nr);
}

/* Block b of 8 rows transposed into g (GROUP_BYTES): q[k] lane r = bytes
 * 4k..4k+3 of row r, then the 8 scales as floats. */
static inline AI T2 void transpose_block(int kind, const uint8_t *w, const size_t *roffs, int64_t b, uint8_t *g) {
    const uint8_t *wb = w + (size_t)b * bw_of(kind);
    __m256i z[8];
    UNROLL for (int r = 0; r < 8; r++) z[r] = unpack_block(kind, wb + roffs[r]);
    tl_tr8x8(z, (__m256i *)g);
    __m256i *q = (__m256i *)g;
    _mm256_store_ps((float *)(q + 8), tl_row_f16x8(wb, roffs));
    if (has_min(kind)) _mm256_store_ps((float *)(q + 9), tl_row_f16x8(wb + 2, roffs));
}

/* q[k] of a packed block g (pack.c): q8_0 32 bytes per k; the others
 * the nibbles of 32 bytes per k % 4 (low for k < 4, high after), after the
 * 8 scales (16 bytes), q4_1's 8 mins (16) or q5_0's 8 bit masks (32: mask
 * k's bit 4r + e is byte e of lane r's 5th bit); iq4_nl's nibbles to its
 * levels. */
static inline AI T2 __m256i load_p8(int kind, const uint8_t *g, int k) {
    if (kind == Q_8_0) return _mm256_loadu_si256((const __m256i *)(g + 16 + 32 * k));
    const size_t head = kind == Q_4_1 ? 32 : kind == Q_5_0 ? 48 : 16;
    const __m256i v = _mm256_loadu_si256((const __m256i *)(g + head + 32 * (k & 3)));
    const __m256i q = _mm256_and_si256(k < 4 ? v : _mm256_srli_epi16(v, 4), _mm256_set1_epi8(0xF));
    if (kind == Q_IQ4NL)
        return _mm256_shuffle_epi8(tl_iq4nl_lut256(), q);
    if (kind == Q_5_0) return _mm256_or_si256(q, _mm256_and_si256(bits32(g + 16 + 4 * k), _mm256_set1_epi8(0x10)));
    return q;
}

/* k-step k of block b (4 weight bytes a row, 4 activation bytes a token)
 * into the int accumulators: q8_0 / iq4_nl's int32 s, the unsigned kinds'
 * int16 h. */
static inline AI T2 void k_step(int kind, int p8, int C, const uint8_t *g, const uint8_t *x, size_t ldx, int64_t b,
                                int k, __m256i *s, __m256i *h) {
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i q = p8 ? load_p8(kind, g, k) : _mm256_load_si256((const __m256i *)g + k);
    const __m256i aq = is_signed(kind) ? _mm256_abs_epi8(q) : q;
    UNROLL for (int c = 0; c < C; c++) {
        const uint8_t *yq = x + c * ldx + (size_t)b * sizeof(block_q8_0) + 2 + 4 * k;
        const __m256i y = _mm256_set1_epi32((int)tl_ld32(yq));
        if (is_signed(kind))
            s[c] = _mm256_add_epi32(s[c], _mm256_madd_epi16(_mm256_maddubs_epi16(aq, _mm256_sign_epi8(y, q)), ones));
        else
            h[c] = _mm256_add_epi16(h[c], _mm256_maddubs_epi16(q, y));
    }
}

/* C tokens (C <= TOK_BLOCK, a constant after inlining) of prepared rows x
 * against one transposed 8-row group wk. Per token one int accumulator
 * (q8_0: int32; q4_0: int16; q5_0: both) and one float accumulator, so
 * that with the weights and the broadcast they stay in the 16 registers. */
static inline AI T2 void mk(int kind, int p8, int C, int64_t nb, const uint8_t *wk, const uint8_t *x, size_t ldx,
                            float *out, size_t ldo, int nr) {
    const size_t dyo = tl_gemm_dy_off(nb), co = tl_gemm_corr_off(nb);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[TOK_BLOCK];
    UNROLL for (int c = 0; c < C; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *g = wk + (size_t)b * (p8 ? 8 * bw_of(kind) : group_bytes(kind));
        __m256i s[TOK_BLOCK], h[TOK_BLOCK];
        UNROLL for (int c = 0; c < C; c++) s[c] = h[c] = _mm256_setzero_si256();
        if (kind == Q_5_0 || kind == Q_5_1) {
            /* two halves of 4 k-steps, each unrolled and widened into s:
             * a rolled 8-step loop tested k == 3 every step (Gemma 3
             * 270M's q5_0 matrices, a third of its prefill) */
            NO_UNROLL for (int k0 = 0; k0 < 8; k0 += 4) {
                UNROLL for (int k = k0; k < k0 + 4; k++) k_step(kind, p8, C, g, x, ldx, b, k, s, h);
                UNROLL for (int c = 0; c < C; c++) {
                    s[c] = _mm256_add_epi32(s[c], _mm256_madd_epi16(h[c], ones));
                    h[c] = _mm256_setzero_si256();
                }
            }
        } else {
            K_UNROLL for (int k = 0; k < 8; k++) k_step(kind, p8, C, g, x, ldx, b, k, s, h);
        }
        const __m256 dw = p8 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)g)) : _mm256_load_ps((const float *)(g + 256));
        const __m256 dm = !has_min(kind) ? _mm256_setzero_ps()
                          : p8 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g + 16)))
                               : _mm256_load_ps((const float *)(g + 288));
        UNROLL for (int c = 0; c < C; c++) {
            /* the bias slot: -off * sum(y) (int32), or sy (q4_1, q5_1: a float) */
            const uint8_t *slot = x + c * ldx + co + 4 * (size_t)b;
            const __m256i corr = _mm256_set1_epi32((int)tl_ld32(slot));
            __m256i isum;
            if (is_signed(kind)) isum = s[c];
            else if (kind == Q_4_1) isum = _mm256_madd_epi16(h[c], ones);
            else if (kind == Q_5_1) isum = s[c];
            else if (kind == Q_4_0) isum = _mm256_add_epi32(_mm256_madd_epi16(h[c], ones), corr);
            else isum = _mm256_add_epi32(s[c], corr);
            float sy = 0;
            if (has_min(kind)) memcpy(&sy, slot, 4);
            acc[c] = scale_add(kind, acc[c], isum, dw, ((const float *)(x + c * ldx + dyo))[b], dm, sy);
        }
    }
    UNROLL for (int c = 0; c < C; c++) tl_store_rows8(out + c * ldo, acc[c], nr);
}

static inline AI T2 void mk_any(int kind, int p8, int C, int64_t nb, const uint8_t *wk, const uint8_t *x, size_t ldx,
                                float *out, size_t ldo, int nr) {
    switch (C) {
    case 1: mk(kind, p8, 1, nb, wk, x, ldx, out, ldo, nr); break;
    case 2: mk(kind, p8, 2, nb, wk, x, ldx, out, ldo, nr); break;
    case 3: mk(kind, p8, 3, nb, wk, x, ldx, out, ldo, nr); break;
    case 4: mk(kind, p8, 4, nb, wk, x, ldx, out, ldo, nr); break;
    }
}

/* All nt tokens against one 8-row group wk (transposed, or packed). */
static inline AI T2 void mk_tokens(int kind, int p8, int nt, int64_t nb, const uint8_t *wk, const uint8_t *x,
                                   size_t ldx, float *out, size_t ldo, int nr) {
    int t = 0;
    for (; t + TOK_BLOCK <= nt; t += TOK_BLOCK)
        mk(kind, p8, TOK_BLOCK, nb, wk, x + (size_t)t * ldx, ldx, out + (size_t)t * ldo, ldo, nr);
    if (t < nt) mk_any(kind, p8, nt - t, nb, wk, x + (size_t)t * ldx, ldx, out + (size_t)t * ldo, ldo, nr);
}

static inline AI T2 void gemm_q(int kind, int64_t n, int nr, int nt, float *out, size_t ldo, const void *w,
                                size_t ldw, const void *x, size_t ldx, void *work) {
    const int64_t nb = n / 32;
    const uint8_t *X = x;
    size_t roffs[8];
    for (int r0 = 0; r0 < nr; r0 += 8) {
        const uint8_t *W = (const uint8_t *)w + (size_t)r0 * ldw;
        const int g = tl_group_rows8(r0, nr, ldw, roffs);
        if (nt <= TL_AVX2_FUSED_TOKENS) {
            for (int t = 0; t < nt; t++)
                mk_direct(kind, nb, W, roffs, (const block_q8_0 *)(X + (size_t)t * ldx), out + (size_t)t * ldo + r0, g,
                          t == 0);
            continue;
        }
        uint8_t *wk = work;
        for (int64_t b = 0; b < nb; b++) transpose_block(kind, W, roffs, b, wk + (size_t)b * group_bytes(kind));
        mk_tokens(kind, 0, nt, nb, wk, X, ldx, out + r0, ldo, g);
    }
}

/* The GEMM on TL_PACK8 rows (pack.c): the groups are read as they lie,
 * for every token count. */
static inline AI T2 void gemm_p8(int kind, int64_t n, int nr, int nt, float *out, size_t ldo, const void *w,
                                 size_t ldw, const void *x, size_t ldx, void *work) {
    const int64_t nb = n / 32;
    for (int r0 = 0; r0 < nr; r0 += 8) {
        const uint8_t *wg = (const uint8_t *)w + (size_t)r0 * ldw;
        if (nt <= TL_AVX2_FUSED_TOKENS || kind == Q_8_0) {
            mk_tokens(kind, 1, nt, nb, wg, x, ldx, out + r0, ldo, 8);
            continue;
        }
        /* q4_0 (and the other nibble kinds) prefill: the nibbles split
         * once into the workspace layout rather than once per micro-tile
         * (q4_0: measured ~10% faster) */
        uint8_t *wk = work;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *g = wg + (size_t)b * 8 * bw_of(kind);
            __m256i *q = (__m256i *)(wk + (size_t)b * group_bytes(kind));
            UNROLL for (int k = 0; k < 8; k++) _mm256_store_si256(q + k, load_p8(kind, g, k));
            _mm256_store_ps((float *)(q + 8), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)g)));
            if (has_min(kind)) _mm256_store_ps((float *)(q + 9), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g + 16))));
        }
        mk_tokens(kind, 0, nt, nb, wk, x, ldx, out + r0, ldo, 8);
    }
}

/* vec_dot_tile on raw q8_0 activation rows: every entry through mk_direct. */
static inline AI T2 void tile_direct(int kind, int64_t n, int nr, int nt, float *out, size_t ldo, const void *w,
                                     size_t ldw, const void *x, size_t ldx) {
    size_t roffs[8];
    for (int r0 = 0; r0 < nr; r0 += 8) {
        const int g = tl_group_rows8(r0, nr, ldw, roffs);
        for (int t = 0; t < nt; t++)
            mk_direct(kind, n / 32, (const uint8_t *)w + (size_t)r0 * ldw, roffs,
                      (const block_q8_0 *)((const uint8_t *)x + (size_t)t * ldx), out + (size_t)t * ldo + r0, g, 0);
    }
}

/* vec_dot for one row, summed as the reference and the tiles sum (exact
 * integer block sums, then multiply and add in block order). */
static inline AI T2 void dot1(int kind, int64_t n, float *out, const void *w, const void *x) {
    const uint8_t *wb = w;
    const block_q8_0 *y = x;
    const __m256i offv = _mm256_set1_epi8((char)off_of(kind));
    float s = 0;
    for (int64_t b = 0; b < n / 32; b++, wb += bw_of(kind)) {
        const __m256i yv = _mm256_loadu_si256((const __m256i *)y[b].qs);
        const __m256i base = off_of(kind) ? _mm256_maddubs_epi16(offv, yv) : _mm256_setzero_si256();
        const int isum = hsum_epi32(block_partials(kind, unpack_block(kind, wb), yv, base));
        const float dy = f16(y[b].d);
        s = fmaf((float)isum, f16(tl_ld16(wb)) * dy, s);
        if (has_min(kind)) s = fmaf(f16(tl_ld16(wb + 2)), sum_y(yv, dy), s);
    }
    *out = s;
}

/* The prepared row: the q8_0 row, then per block its scale as a float and
 * -off * sum(y). */
static tl_quantize_fn quantize_q8_0_fn;
static inline AI T2 void prepare(int kind, const float *src, void *dst, int64_t n) {
    const int64_t nb = n / 32;
    uint8_t *p = dst;
    quantize_q8_0_fn(src, p, n);
    float *dy = (float *)(p + tl_gemm_dy_off(nb));
    int32_t *corr = (int32_t *)(p + tl_gemm_corr_off(nb));
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    for (int64_t b = 0; b < nb; b++) {
        const block_q8_0 *yb = (const block_q8_0 *)p + b;
        dy[b] = f16(yb->d);
        const __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, _mm256_loadu_si256((const __m256i *)yb->qs)), ones16);
        if (has_min(kind)) {
            const float sy = (float)hsum_epi32(s) * dy[b];
            memcpy(&corr[b], &sy, 4);
        } else {
            corr[b] = -off_of(kind) * hsum_epi32(s);
        }
    }
}

#define GEMM_KIND(SUF, KIND)                                                                                          \
    static T2 void gemm_##SUF(int64_t n, int nr, int nt, float *out, size_t ldo, const void *w, size_t ldw,          \
                              const void *x, size_t ldx, void *work) {                                              \
        gemm_q(KIND, n, nr, nt, out, ldo, w, ldw, x, ldx, work);                                                      \
    }                                                                                                                 \
    static T2 void tile_##SUF(int64_t n, int nr, int nt, float *out, size_t ldo, const void *w, size_t ldw,          \
                              const void *x, size_t ldx) {                                                          \
        tile_direct(KIND, n, nr, nt, out, ldo, w, ldw, x, ldx);                                                       \
    }                                                                                                                 \
    static T2 void dot1_##SUF(int64_t n, float *out, const void *w, const void *x) { dot1(KIND, n, out, w, x); }     \
    static T2 void prepare_##SUF(const float *src, void *dst, int64_t n) { prepare(KIND, src, dst, n); }
GEMM_KIND(q8_0, Q_8_0)
GEMM_KIND(q4_0, Q_4_0)
GEMM_KIND(q5_0, Q_5_0)
GEMM_KIND(q4_1, Q_4_1)
GEMM_KIND(q5_1, Q_5_1)
GEMM_KIND(iq4_nl, Q_IQ4NL)
static T2 void gemm_p8_q8_0(int64_t n, int nr, int nt, float *out, size_t ldo, const void *w, size_t ldw, const void *x,
                            size_t ldx, void *work) {
    gemm_p8(Q_8_0, n, nr, nt, out, ldo, w, ldw, x, ldx, work);
}
#define GEMM_P8(SUF, KIND)                                                                                            \
    static T2 void gemm_p8_##SUF(int64_t n, int nr, int nt, float *out, size_t ldo, const void *w, size_t ldw,        \
                                 const void *x, size_t ldx, void *work) {                                            \
        gemm_p8(KIND, n, nr, nt, out, ldo, w, ldw, x, ldx, work);                                                     \
    }
GEMM_P8(q4_0, Q_4_0)
GEMM_P8(q5_0, Q_5_0)
GEMM_P8(q4_1, Q_4_1)
GEMM_P8(iq4_nl, Q_IQ4NL)
#undef GEMM_P8

void tl_gemm_fill_avx2(tl_kernel_table *t) {
    quantize_q8_0_fn = t->quantize_q8_0;
#define FILL(TYPE, SUF)                      \
    t->vec_dot[TYPE] = dot1_##SUF;           \
    t->vec_dot_tile[TYPE] = tile_##SUF;      \
    t->gemm_tile[TYPE] = gemm_##SUF;         \
    t->gemm_prepare[TYPE] = prepare_##SUF;
    FILL(TL_TYPE_Q8_0, q8_0)
    FILL(TL_TYPE_Q4_0, q4_0)
    FILL(TL_TYPE_Q5_0, q5_0)
    FILL(TL_TYPE_Q4_1, q4_1)
    FILL(TL_TYPE_Q5_1, q5_1)
    FILL(TL_TYPE_IQ4_NL, iq4_nl)
#undef FILL
    t->gemm_tile_pk[TL_TYPE_Q8_0] = gemm_p8_q8_0;
    t->gemm_tile_pk[TL_TYPE_Q4_0] = gemm_p8_q4_0;
    t->gemm_tile_pk[TL_TYPE_Q5_0] = gemm_p8_q5_0;
    t->gemm_tile_pk[TL_TYPE_Q4_1] = gemm_p8_q4_1;
    t->gemm_tile_pk[TL_TYPE_IQ4_NL] = gemm_p8_iq4_nl;
    t->pack_rows = 8;
}

#else
void tl_gemm_fill_avx2(tl_kernel_table *t) { (void)t; }
#endif
