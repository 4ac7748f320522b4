/* quants_extra_avx2.c - q2_K, q3_K and iq4_xs at the AVX2 level (q4_1,
 * q5_1 and iq4_nl have gemm_avx2.c's GEMM): 4 rows x 1 token micro-tiles
 * (TILE_DRIVER_RC), the 1 x 1 tile being vec_dot (prefill goes through
 * gemm_k_avx2.c's GEMM, which decodes with these tiles; the AVX-512 level
 * has gemm_k_avx512.c's; all sum the same way). The four rows
 * share each activation load, their integer sums are reduced together,
 * and their float ops, each row's in the reference's order, run as the
 * lanes of one vector, where one row at a time waited on a scalar chain
 * (110M-shaped files, one thread, prefill / decode tok/s, before -> after:
 * q3_K 97 / 74 -> 357 / 247, q2_K 322 / 252 -> 490 / 351, iq4_xs 195 /
 * 144 -> 244 / 171).
 *
 * q2_K / q3_K: elements 128c + 32j + p (p < 32) are bits 2j..2j+1 of qs byte 32c + p
 * (q3_K: plus bit 4c + j of hmask byte p), so one shift and mask of qs
 * chunk c makes the 32 values of (c, j) in element order, met by the
 * activation's bytes as they lie; the low and high 16 of them are
 * sub-blocks 8c + 2j and 8c + 2j + 1, whose int16 scales vpshufb picks
 * per 128-bit lane. The integer sums are the reference's (quants_ref.c)
 * exactly (maddubs pairs below 2^11, scaled sums below 2^17), and the
 * float ops its order per super-block, so each dot is bitwise
 * tl_vec_dot_ref's.
 *
 * iq4_xs: the nibbles through vpshufb to their signed levels, multiplied
 * with the activation by vpsignb + maddubs (|pairs| <= 2 * 127 * 127),
 * weighted by the sub-block's scale in vpmaddwd (|sums| < 2^22), the
 * float ops per super-block. */
#include "quants_impl.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define T2 __attribute__((target("avx2,fma,f16c")))
#define AI __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 4")
#include "avx2_bytes.h"
#include "gemm_q.h"

/* A super-block's 16 scales as int16 (q2_K: the low nibbles; q3_K: the
 * signed 6-bit values) and q2_K's 16 mins. */
static inline AI T2 __m256i scales16(int q3, const uint8_t *a, __m256i *mn) {
    if (!q3) {
        const __m128i b = _mm_loadu_si128((const __m128i *)(a + offsetof(block_q2_K, scales)));
        *mn = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0xF)));
        return _mm256_cvtepu8_epi16(_mm_and_si128(b, _mm_set1_epi8(0xF)));
    }
    return _mm256_cvtepi8_epi16(tl_q3_K_scales8(a));
}

/* Row a's super-block sum (q3_K's -4 not yet out) against activation qs. */
static inline AI T2 __m256i sb_q23(int q3, const uint8_t *a, __m256i sc16, const int8_t *yqs) {
    const __m256i m3 = _mm256_set1_epi8(3), m04 = _mm256_set1_epi8(4);
    const __m256i h = q3 ? _mm256_loadu_si256((const __m256i *)(a + offsetof(block_q3_K, hmask))) : m3;
    const uint8_t *qs = a + (q3 ? offsetof(block_q3_K, qs) : offsetof(block_q2_K, qs));
    __m256i acc = _mm256_setzero_si256();
    UNROLL for (int c = 0; c < 2; c++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
        /* the eight int16 scales of this chunk in both lanes */
        const __m256i half = _mm256_broadcastsi128_si256(c ? _mm256_extracti128_si256(sc16, 1) : _mm256_castsi256_si128(sc16));
        UNROLL for (int j = 0; j < 4; j++) {
            __m256i u = _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * j)), m3);
            if (q3) {
                const int b = 4 * c + j;
                const __m256i hb = b >= 2 ? _mm256_srl_epi16(h, _mm_cvtsi32_si128(b - 2)) : _mm256_sll_epi16(h, _mm_cvtsi32_si128(2 - b));
                u = _mm256_or_si256(u, _mm256_and_si256(hb, m04));
            }
            /* low lane: int16 scale 2j, high lane: 2j + 1 */
            const char lo = (char)(4 * j), hi = (char)(4 * j + 2);
            const __m256i scv = _mm256_shuffle_epi8(
                half, _mm256_setr_epi8(lo, lo + 1, lo, lo + 1, lo, lo + 1, lo, lo + 1, lo, lo + 1, lo, lo + 1, lo, lo + 1, lo,
                                       lo + 1, hi, hi + 1, hi, hi + 1, hi, hi + 1, hi, hi + 1, hi, hi + 1, hi, hi + 1, hi,
                                       hi + 1, hi, hi + 1));
            const __m256i yv = _mm256_loadu_si256((const __m256i *)(yqs + 128 * c + 32 * j));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(scv, _mm256_maddubs_epi16(u, yv)));
        }
    }
    return acc;
}

/* The fp16 words at offset off of four rows' block i, as floats. */
static inline AI T2 __m128 f16x4(const uint8_t *const row[4], size_t off) {
    uint64_t d4 = 0;
    UNROLL for (int k = 0; k < 4; k++) d4 |= (uint64_t)tl_ld16(row[k] + off) << (16 * k);
    return _mm_cvtph_ps(_mm_cvtsi64_si128((long long)d4));
}

/* The micro-tiles: R rows (R <= 4) x C tokens (TILE_DRIVER_RC's MK; the
 * drivers below take one token a step). The rows' integer sums are reduced
 * together and their float ops run as the lanes of one vector, each lane
 * the one-row dot's ops in its order; lanes past R read row R - 1 (valid
 * memory) and are not stored. */
#define ROWS4(R, w, ldw)                                                                 \
    const uint8_t *row[4];                                                               \
    UNROLL for (int k = 0; k < 4; k++) row[k] = (w) + (size_t)(k < (R) ? k : (R) - 1) * (ldw)
#define STORE4(R, s, out)                                                                \
    do {                                                                                 \
        float o_[4];                                                                     \
        _mm_storeu_ps(o_, s);                                                            \
        UNROLL for (int k = 0; k < (R); k++) (out)[k] = o_[k];                           \
    } while (0)

static inline AI T2 void mk_q23(int q3, int R, int C, int pf, int64_t n, float *out, size_t ldo, const uint8_t *w,
                                size_t ldw, const uint8_t *x, size_t ldx) {
    const size_t bw = q3 ? sizeof(block_q3_K) : sizeof(block_q2_K);
    const size_t dof = q3 ? offsetof(block_q3_K, d) : offsetof(block_q2_K, d);
    ROWS4(R, w, ldw);
    UNROLL for (int c = 0; c < C; c++) {
        const block_q8_K *y = (const block_q8_K *)(x + (size_t)c * ldx);
        __m128 s = _mm_setzero_ps();
        for (int64_t i = 0; i < n / QK_K; i++) {
            tl_prefetch_next_rows4(pf && c == 0, w, ldw, i, bw);
            const __m256i bs = _mm256_loadu_si256((const __m256i *)y[i].bsums);
            __m256i acc[4], pm[4];
            UNROLL for (int k = 0; k < 4; k++) {
                acc[k] = pm[k] = _mm256_setzero_si256();
                if (k >= R) continue;
                const uint8_t *a = row[k] + (size_t)i * bw;
                __m256i mn = _mm256_setzero_si256();
                const __m256i sc16 = scales16(q3, a, &mn);
                acc[k] = sb_q23(q3, a, sc16, y[i].qs);
                pm[k] = _mm256_madd_epi16(q3 ? sc16 : mn, bs);
            }
            const __m128 dy = _mm_set1_ps(y[i].d), dw = f16x4(row, (size_t)i * bw + dof);
            if (q3) { /* s += d_y * d * (sumi - 4 * sum sc * bsums) */
                const __m128i sumi = _mm_sub_epi32(tl_hsum4_i32(acc), _mm_slli_epi32(tl_hsum4_i32(pm), 2));
                s = _mm_add_ps(s, _mm_mul_ps(_mm_mul_ps(dy, dw), _mm_cvtepi32_ps(sumi)));
            } else { /* s += d_y * d * sumi - d_y * dmin * summ */
                const __m128 dm = f16x4(row, (size_t)i * bw + offsetof(block_q2_K, dmin));
                const __m128 t1 = _mm_mul_ps(_mm_mul_ps(dy, dw), _mm_cvtepi32_ps(tl_hsum4_i32(acc)));
                const __m128 t2 = _mm_mul_ps(_mm_mul_ps(dy, dm), _mm_cvtepi32_ps(tl_hsum4_i32(pm)));
                s = _mm_add_ps(s, _mm_sub_ps(t1, t2));
            }
        }
        STORE4(R, s, out + (size_t)c * ldo);
    }
}

/* An iq4_xs super-block's 8 scales (tl_iq4xs_scale) as int16 in both
 * lanes: the 4-bit low parts (nibble j of scales_l) and the 2-bit high
 * parts (bits 2j of scales_h) spread to byte j by shifts and masks. */
static inline AI T2 __m256i iq4xs_scales16(const block_iq4_xs *a) {
    uint64_t l = tl_ld32(a->scales_l), h = a->scales_h;
    l = (l | l << 16) & 0x0000FFFF0000FFFFull;
    l = (l | l << 8) & 0x00FF00FF00FF00FFull;
    l = (l | l << 4) & 0x0F0F0F0F0F0F0F0Full;
    h = (h & 0xFF) | (h & 0xFF00) << 24;
    h = (h | h << 12) & 0x000F000F000F000Full;
    h = (h | h << 6) & 0x0303030303030303ull;
    const __m128i b = _mm_sub_epi8(_mm_cvtsi64_si128((long long)(l | h << 4)), _mm_set1_epi8(32));
    return _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(b));
}

/* Two sub-blocks a step: 32 qs bytes are sub-block 2h's (low lane) and
 * 2h + 1's (high lane), their low nibbles elements 0..15 of each and their
 * high nibbles 16..31, met by the activation halves rearranged so once per
 * super-block (shared by the four rows); each lane weighted by its own
 * sub-block's scale. */
static inline AI T2 void mk_iq4_xs(int R, int C, int pf, int64_t n, float *out, size_t ldo, const uint8_t *w,
                                   size_t ldw, const uint8_t *x, size_t ldx) {
    const __m256i lut = tl_iq4nl_lut256();
    const __m256i m4 = _mm256_set1_epi8(0xF);
    const size_t bw = sizeof(block_iq4_xs);
    ROWS4(R, w, ldw);
    UNROLL for (int c = 0; c < C; c++) {
        const block_q8_K *y = (const block_q8_K *)(x + (size_t)c * ldx);
        __m128 s = _mm_setzero_ps();
        for (int64_t i = 0; i < n / QK_K; i++) {
            tl_prefetch_next_rows4(pf && c == 0, w, ldw, i, bw);
            __m256i ya[4], yb[4]; /* (2h: 0..15 | 2h+1: 0..15), (2h: 16..31 | 2h+1: 16..31) */
            UNROLL for (int h = 0; h < 4; h++) {
                const __m256i y0 = _mm256_loadu_si256((const __m256i *)(y[i].qs + 64 * h));
                const __m256i y1 = _mm256_loadu_si256((const __m256i *)(y[i].qs + 64 * h + 32));
                ya[h] = _mm256_permute2x128_si256(y0, y1, 0x20);
                yb[h] = _mm256_permute2x128_si256(y0, y1, 0x31);
            }
            __m256i acc[4];
            UNROLL for (int k = 0; k < 4; k++) {
                acc[k] = _mm256_setzero_si256();
                if (k >= R) continue;
                const block_iq4_xs *a = (const block_iq4_xs *)row[k] + i;
                const __m256i sc = iq4xs_scales16(a);
                UNROLL for (int h = 0; h < 4; h++) {
                    /* low lane: int16 scale 2h, high lane: 2h + 1 */
                    const __m256i scv = _mm256_shuffle_epi8(
                        sc, _mm256_set_m128i(_mm_set1_epi16((short)((4 * h + 3) << 8 | (4 * h + 2))),
                                             _mm_set1_epi16((short)((4 * h + 1) << 8 | 4 * h))));
                    const __m256i v = _mm256_loadu_si256((const __m256i *)(a->qs + 32 * h));
                    const __m256i lo = _mm256_shuffle_epi8(lut, _mm256_and_si256(v, m4));
                    const __m256i hi = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
                    const __m256i plo = _mm256_maddubs_epi16(_mm256_sign_epi8(lo, lo), _mm256_sign_epi8(ya[h], lo));
                    const __m256i phi = _mm256_maddubs_epi16(_mm256_sign_epi8(hi, hi), _mm256_sign_epi8(yb[h], hi));
                    acc[k] = _mm256_add_epi32(acc[k], _mm256_add_epi32(_mm256_madd_epi16(plo, scv), _mm256_madd_epi16(phi, scv)));
                }
            }
            /* s += d_y * d * sumi */
            const __m128 dw = f16x4(row, (size_t)i * bw + offsetof(block_iq4_xs, d));
            s = _mm_add_ps(s, _mm_mul_ps(_mm_mul_ps(_mm_set1_ps(y[i].d), dw), _mm_cvtepi32_ps(tl_hsum4_i32(acc))));
        }
        STORE4(R, s, out + (size_t)c * ldo);
    }
}

#define MK_Q2_K(R, C, ...) mk_q23(0, R, C, __VA_ARGS__)
#define MK_Q3_K(R, C, ...) mk_q23(1, R, C, __VA_ARGS__)
TILE_DRIVER_RC(tile_q2_K, T2, MK_Q2_K, 4, 1)
TILE_DRIVER_RC(tile_q3_K, T2, MK_Q3_K, 4, 1)
TILE_DRIVER_RC(tile_iq4_xs, T2, mk_iq4_xs, 4, 1)

void tl_extra_fill_avx2(tl_kernel_table *t) {
#define FILL(TYPE, SUF)                     \
    t->vec_dot[TYPE] = tile_##SUF##_1;      \
    t->vec_dot_tile[TYPE] = tile_##SUF;
    FILL(TL_TYPE_IQ4_XS, iq4_xs)
    FILL(TL_TYPE_Q2_K, q2_K)
    FILL(TL_TYPE_Q3_K, q3_K)
#undef FILL
}

#else
void tl_extra_fill_avx2(tl_kernel_table *t) { (void)t; }
#endif
