/* quants_iq3_avx2.c - iq3_xxs and iq3_s at the AVX2 level: 4 rows x 4
 * tokens micro-tiles (TILE_DRIVER_RC; leftover tokens one at a time), the
 * 1 x 1 tile being vec_dot. Prefill has no GEMM for these types and goes
 * through the same tiles, each weight sub-block decoded once for the
 * tile's tokens.
 *
 * Per super-block and row, the sign words, the ls and the grid indices
 * are laid out once by vector ops (iq3_xxs's even-parity sign bytes by a
 * nibble-parity vpshufb); per sub-block of 32 (one vector) the 8 grid
 * entries are table loads (scalar loads and inserts: vpgatherdd ran
 * slower on this Zen 3), the sign bits become byte masks put on the
 * activation bytes (vpsignb), vpmaddubsw multiplies the unsigned levels
 * with them (|pair| <= 2 * 62 * 127, no saturation) and vpmaddwd weights
 * the pairs by the sub-block's ls = 2s + 1 into int32 lanes (|lane| <
 * 2^20 a sub-block). The lanes' sum is the reference's bsum exactly, and
 * the float ops per super-block are quants_iq3_ref.c's in its order (d =
 * d_w * d_y; sumf += d * bsum; iq3_xxs then 0.25f * sumf), four rows in
 * the lanes of one vector, so every output is bitwise tl_vec_dot_ref's,
 * whatever the tile. The rows share each activation load. (Activation
 * bytes are never -128, which vpsignb could not negate: q8_K rows span
 * -127..127.)
 *
 * 4096-wide rows in L2, one thread on this loaded Zen 3: about 0.1 ns a
 * weight and token alone, 0.037 ns in 16-token tiles (the per-sub-block
 * prep took decode from 0.12 / 0.15 ns for iq3_xxs / iq3_s). */
#include "iq3_grids.h"
#include "quants_iq.h"
#include "quants_impl.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#include "gemm_q.h"

#define T2 __attribute__((target("avx2,fma,f16c")))
#define AI __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 8")

#include "avx2_bytes.h"

/* Tokens a micro-tile: one decode of a weight sub-block serves them all
 * (16-token tiles ran 2.7x as fast as one token at a time; 8 ran 1.3x
 * faster again but leaves up to 7 tokens to the 1-token tail) */
enum { TB = 4 };

/* The fp16 words at offset off of four rows' block i, as floats. */
static inline AI T2 __m128 f16x4(const uint8_t *const row[4], size_t off) {
    uint16_t h[4];
    UNROLL for (int k = 0; k < 4; k++) memcpy(&h[k], row[k] + off, 2);
    uint64_t d4;
    memcpy(&d4, h, 8);
    return _mm_cvtph_ps(_mm_cvtsi64_si128((long long)d4));
}

/* What a row's super-block needs per sub-block ib, laid out once per
 * super-block: sw[ib] its 32 sign bits (bit 8l + k: element 8l + k),
 * lw[ib] its ls in both int16 halves, and the 64 grid indices. */
typedef struct {
    uint32_t sw[8], lw[8];
    uint16_t ix[64];
} sb_prep;

/* iq3_xxs: the sign and scale words (tl_iq_xxs_signs), the 8-bit indices. */
static inline AI T2 void prep_xxs(const block_iq3_xxs *a, sb_prep *p) {
    tl_iq_xxs_signs(_mm256_loadu_si256((const __m256i *)(a->qs + 64)), p->sw, p->lw);
    UNROLL for (int h = 0; h < 4; h++)
        _mm256_storeu_si256((__m256i *)(p->ix + 16 * h),
                            _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(a->qs + 16 * h))));
}

/* iq3_s: the sign words as they lie; s from the scale nibbles; the 9-bit
 * indices: bit j of qh's 16-bit word h is the 9th bit of index 16h + j
 * (masked to the table's 512 by construction). */
static inline AI T2 void prep_s(const block_iq3_s *a, sb_prep *p) {
    _mm256_storeu_si256((__m256i *)p->sw, _mm256_loadu_si256((const __m256i *)a->signs));
    const __m256i s4 = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)tl_ld32(a->scales)),
                                                          _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                                        _mm256_set1_epi32(0xF));
    _mm256_storeu_si256((__m256i *)p->lw, tl_iq_ls_pairs(s4));
    const __m256i bit = _mm256_setr_epi16(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384,
                                          (short)32768);
    UNROLL for (int h = 0; h < 4; h++) {
        uint16_t qh;
        memcpy(&qh, a->qh + 2 * h, 2);
        const __m256i hi = _mm256_cmpeq_epi16(_mm256_and_si256(_mm256_set1_epi16((short)qh), bit), bit);
        const __m256i lo = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(a->qs + 16 * h)));
        _mm256_storeu_si256((__m256i *)(p->ix + 16 * h),
                            _mm256_or_si256(lo, _mm256_and_si256(hi, _mm256_set1_epi16(256))));
    }
}

/* Sub-block ib of a prepared row: the 8 entries' levels, its sign bytes
 * (0xFF: negative) and its ls pairs. */
static inline AI T2 __m256i levels(const uint32_t *grid, const sb_prep *p, int ib, __m256i *sgn, __m256i *ls) {
    *sgn = bit_masks32(p->sw[ib]);
    *ls = _mm256_set1_epi32((int)p->lw[ib]);
    const uint16_t *ix = p->ix + 8 * ib;
    return _mm256_setr_epi32((int)grid[ix[0]], (int)grid[ix[1]], (int)grid[ix[2]], (int)grid[ix[3]], (int)grid[ix[4]],
                             (int)grid[ix[5]], (int)grid[ix[6]], (int)grid[ix[7]]);
}

/* R rows (R <= 4) x C tokens (C <= TB, TILE_DRIVER_RC's MK): each
 * sub-block of each row is decoded once for the C tokens. Lanes past R
 * read row R - 1 (valid memory) and are not stored. */
static inline AI T2 void mk_iq3(int xxs, int R, int C, int pf, int64_t n, float *out, size_t ldo, const uint8_t *w,
                                size_t ldw, const uint8_t *x, size_t ldx) {
    const size_t bw = xxs ? sizeof(block_iq3_xxs) : sizeof(block_iq3_s);
    const uint32_t *grid = xxs ? tl_iq3xxs_grid : tl_iq3s_grid;
    const __m256i one = _mm256_set1_epi8(1);
    const uint8_t *row[4];
    for (int k = 0; k < 4; k++) row[k] = w + (size_t)(k < R ? k : R - 1) * ldw;
    const block_q8_K *y[TB];
    __m128 sumf[TB];
    UNROLL for (int c = 0; c < C; c++) {
        y[c] = (const block_q8_K *)(x + (size_t)c * ldx);
        sumf[c] = _mm_setzero_ps();
    }
    for (int64_t i = 0; i < n / QK_K; i++) {
        tl_prefetch_next_rows4(pf, w, ldw, i, bw);
        sb_prep p[4];
        UNROLL for (int k = 0; k < R; k++) {
            const uint8_t *a = row[k] + (size_t)i * bw;
            if (xxs) prep_xxs((const block_iq3_xxs *)a, &p[k]);
            else prep_s((const block_iq3_s *)a, &p[k]);
        }
        __m256i acc[TB][4];
        UNROLL for (int c = 0; c < C; c++)
            UNROLL for (int k = 0; k < 4; k++) acc[c][k] = _mm256_setzero_si256();
        for (int ib = 0; ib < 8; ib++) {
            __m256i yv[TB];
            UNROLL for (int c = 0; c < C; c++) yv[c] = _mm256_loadu_si256((const __m256i *)(y[c][i].qs + 32 * ib));
            UNROLL for (int k = 0; k < 4; k++) {
                if (k >= R) continue;
                __m256i sgn, ls;
                const __m256i q = levels(grid, &p[k], ib, &sgn, &ls);
                sgn = _mm256_or_si256(sgn, one);
                UNROLL for (int c = 0; c < C; c++) {
                    const __m256i prod = _mm256_maddubs_epi16(q, _mm256_sign_epi8(yv[c], sgn));
                    acc[c][k] = _mm256_add_epi32(acc[c][k], _mm256_madd_epi16(prod, ls));
                }
            }
        }
        /* sumf += (d_w * d_y) * bsum, as the reference */
        const __m128 dw = f16x4(row, (size_t)i * bw);
        UNROLL for (int c = 0; c < C; c++) {
            const __m128 d = _mm_mul_ps(dw, _mm_set1_ps(y[c][i].d));
            sumf[c] = _mm_add_ps(sumf[c], _mm_mul_ps(d, _mm_cvtepi32_ps(tl_hsum4_i32(acc[c]))));
        }
    }
    UNROLL for (int c = 0; c < C; c++) {
        if (xxs) sumf[c] = _mm_mul_ps(_mm_set1_ps(0.25f), sumf[c]);
        float o[4];
        _mm_storeu_ps(o, sumf[c]);
        for (int k = 0; k < R; k++) out[(size_t)c * ldo + k] = o[k];
    }
}

#define MK_XXS(R, C, ...) mk_iq3(1, R, C, __VA_ARGS__)
#define MK_S(R, C, ...) mk_iq3(0, R, C, __VA_ARGS__)
TILE_DRIVER_RC(tile_iq3_xxs, T2, MK_XXS, 4, TB)
TILE_DRIVER_RC(tile_iq3_s, T2, MK_S, 4, TB)

/* The i-quant GEMM's unpack (quants_iq.h) through the tiles' decode:
 * each sub-block's levels with its signs put on them, its ls, d. */
static inline AI T2 void unpack_iq3(int xxs, const uint8_t *a, uint64_t v[32], int16_t ls[16], float *d) {
    sb_prep p;
    if (xxs) prep_xxs((const block_iq3_xxs *)a, &p);
    else prep_s((const block_iq3_s *)a, &p);
    const uint32_t *grid = xxs ? tl_iq3xxs_grid : tl_iq3s_grid;
    UNROLL for (int ib = 0; ib < 8; ib++) {
        __m256i sgn, lw;
        const __m256i q = levels(grid, &p, ib, &sgn, &lw);
        _mm256_storeu_si256((__m256i *)(v + 4 * ib), _mm256_sub_epi8(_mm256_xor_si256(q, sgn), sgn));
        ls[2 * ib] = ls[2 * ib + 1] = (int16_t)p.lw[ib];
    }
    uint16_t dh;
    memcpy(&dh, a, 2);
    *d = TL_F16(dh);
}
static T2 void unpack_iq3_xxs(const uint8_t *a, uint64_t v[32], int16_t ls[16], float *d) {
    unpack_iq3(1, a, v, ls, d);
}
static T2 void unpack_iq3_s(const uint8_t *a, uint64_t v[32], int16_t ls[16], float *d) { unpack_iq3(0, a, v, ls, d); }

tl_iq_unpack_fn tl_iq3_unpack_avx2(int type) {
    return type == TL_TYPE_IQ3_XXS ? unpack_iq3_xxs : type == TL_TYPE_IQ3_S ? unpack_iq3_s : NULL;
}

void tl_iq3_fill_avx2(tl_kernel_table *t) {
    t->vec_dot[TL_TYPE_IQ3_XXS] = tile_iq3_xxs_1;
    t->vec_dot_tile[TL_TYPE_IQ3_XXS] = tile_iq3_xxs;
    t->vec_dot[TL_TYPE_IQ3_S] = tile_iq3_s_1;
    t->vec_dot_tile[TL_TYPE_IQ3_S] = tile_iq3_s;
}

#else
tl_iq_unpack_fn tl_iq3_unpack_avx2(int type) { (void)type; return NULL; }
void tl_iq3_fill_avx2(tl_kernel_table *t) { (void)t; }
#endif
