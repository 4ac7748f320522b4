/* quants_iq3_avx2.c - iq3_xxs and iq3_s at the AVX2 level: 4 rows x 1
 * token micro-tiles (TILE_DRIVER_RC), the 1 x 1 tile being vec_dot.
 * Prefill has no GEMM for these types and goes through the same tiles.
 *
 * A sub-block of 32 is one vector: its 8 grid entries are loaded from the
 * table by index (4 levels each, in element order; scalar loads and
 * inserts ran 1.2x (iq3_xxs) and 1.05x (iq3_s) as fast as vpgatherdd
 * on this Zen 3, 4-row tiles of 4096-wide rows in L2), the weights' signs
 * become byte masks and are put on the activation bytes (vpsignb), and
 * vpmaddubsw multiplies the unsigned levels with them (|pair| <= 2 * 62 *
 * 127, no saturation); vpmaddwd weights the pairs by the sub-block's ls =
 * 2s + 1 into int32 lanes (|lane| < 2^20 a sub-block). The lanes' sum is
 * the reference's bsum exactly, and the float ops per super-block are
 * quants_iq3_ref.c's in its order (d = d_w * d_y; sumf += d * bsum; iq3_xxs
 * then 0.25f * sumf), four rows in the lanes of one vector, so every
 * output is bitwise tl_vec_dot_ref's. The four rows share each activation
 * load. (Activation bytes are never -128, which vpsignb could not negate:
 * q8_K rows span -127..127.) */
#include "iq3_grids.h"
#include "quants_impl.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define T2 __attribute__((target("avx2,fma,f16c")))
#define AI __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 8")

static inline uint32_t rd32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* iq3_xxs's 7-bit sign index s to its 8 sign bytes (0xFF: negative), as
 * one 64-bit word: bits 0..6 of s, bit 7 the parity of s (tl_iq_signs8). */
#define SB(s, j) ((((s) >> (j)) & 1ull) * (0xFFull << (8 * (j))))
#define PAR7(s) (((s) ^ (s) >> 1 ^ (s) >> 2 ^ (s) >> 3 ^ (s) >> 4 ^ (s) >> 5 ^ (s) >> 6) & 1ull)
#define SIGNS8(s) \
    (SB(s, 0) | SB(s, 1) | SB(s, 2) | SB(s, 3) | SB(s, 4) | SB(s, 5) | SB(s, 6) | PAR7(s) * (0xFFull << 56))
#define S4(s) SIGNS8(s), SIGNS8((s) + 1), SIGNS8((s) + 2), SIGNS8((s) + 3)
#define S16(s) S4(s), S4((s) + 4), S4((s) + 8), S4((s) + 12)
static const uint64_t signs_xxs[128] = {S16(0), S16(16), S16(32), S16(48), S16(64), S16(80), S16(96), S16(112)};

/* The fp16 words at offset off of four rows' block i, as floats. */
static inline AI T2 __m128 f16x4(const uint8_t *const row[4], size_t off) {
    uint16_t h[4];
    UNROLL for (int k = 0; k < 4; k++) memcpy(&h[k], row[k] + off, 2);
    uint64_t d4;
    memcpy(&d4, h, 8);
    return _mm_cvtph_ps(_mm_cvtsi64_si128((long long)d4));
}

/* The four sums of four rows' int32 lanes (exact), row k in lane k. */
static inline AI T2 __m128i hsum4_i32(const __m256i p[4]) {
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

/* Four interleaved row streams lose the hardware prefetcher: the first
 * token of a row group asks for the next group's bytes (the 4 rows after
 * these, one address range), block i's share of them a step, 4 KiB ahead. */
static inline AI T2 void pf_next(int pf, const uint8_t *w, size_t ldw, int64_t i, size_t bw) {
    if (!pf) return;
    const uint8_t *p = w + 4 * ldw + 4096 + (size_t)i * 4 * bw;
    for (size_t k = 0; k < 4 * bw; k += 64) _mm_prefetch((const char *)(p + k), _MM_HINT_T0);
}

/* Sub-block ib of an iq3_xxs block: the 8 entries' levels, the sign bytes
 * (0xFF: negative) and ls. */
static inline AI T2 __m256i xxs_levels(const block_iq3_xxs *a, int ib, __m256i *sgn, int *ls) {
    const uint8_t *q = a->qs + 8 * ib;
    const uint32_t aux = rd32(a->qs + 64 + 4 * ib);
    *sgn = _mm256_setr_epi64x((long long)signs_xxs[aux & 127], (long long)signs_xxs[(aux >> 7) & 127],
                              (long long)signs_xxs[(aux >> 14) & 127], (long long)signs_xxs[(aux >> 21) & 127]);
    *ls = (int)(2 * (aux >> 28) + 1);
    return _mm256_setr_epi32((int)tl_iq3xxs_grid[q[0]], (int)tl_iq3xxs_grid[q[1]], (int)tl_iq3xxs_grid[q[2]],
                             (int)tl_iq3xxs_grid[q[3]], (int)tl_iq3xxs_grid[q[4]], (int)tl_iq3xxs_grid[q[5]],
                             (int)tl_iq3xxs_grid[q[6]], (int)tl_iq3xxs_grid[q[7]]);
}

/* The same for iq3_s: 9-bit indices (qh bit g the 9th of entry g, masked
 * to the table's 512), its sign bits as they lie (bit k of byte j: element
 * 8j + k) spread to bytes. */
static inline AI T2 __m256i s_levels(const block_iq3_s *a, int ib, __m256i *sgn, int *ls) {
    const uint8_t *q = a->qs + 8 * ib;
    const unsigned h = a->qh[ib];
    const __m256i bits = _mm256_shuffle_epi8(_mm256_set1_epi32((int)rd32(a->signs + 4 * ib)),
                                             _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                                               0x0101010101010101, 0));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    *sgn = _mm256_cmpeq_epi8(_mm256_and_si256(bits, bit), bit);
    *ls = 2 * ((a->scales[ib / 2] >> (4 * (ib % 2))) & 0xF) + 1;
#define IX(g) (int)tl_iq3s_grid[q[g] | (h << (8 - (g)) & 256)]
    return _mm256_setr_epi32(IX(0), IX(1), IX(2), IX(3), IX(4), IX(5), IX(6), IX(7));
#undef IX
}

/* R rows (R <= 4) x C tokens (TILE_DRIVER_RC's MK; the drivers take one
 * token a step). Lanes past R read row R - 1 (valid memory) and are not
 * stored. */
static inline AI T2 void mk_iq3(int xxs, int R, int C, int pf, int64_t n, float *out, size_t ldo, const uint8_t *w,
                                size_t ldw, const uint8_t *x, size_t ldx) {
    const size_t bw = xxs ? sizeof(block_iq3_xxs) : sizeof(block_iq3_s);
    const __m256i one = _mm256_set1_epi8(1);
    const uint8_t *row[4];
    for (int k = 0; k < 4; k++) row[k] = w + (size_t)(k < R ? k : R - 1) * ldw;
    for (int c = 0; c < C; c++) {
        const block_q8_K *y = (const block_q8_K *)(x + (size_t)c * ldx);
        __m128 sumf = _mm_setzero_ps();
        for (int64_t i = 0; i < n / QK_K; i++) {
            pf_next(pf && c == 0, w, ldw, i, bw);
            __m256i acc[4];
            for (int k = 0; k < 4; k++) acc[k] = _mm256_setzero_si256();
            for (int ib = 0; ib < 8; ib++) {
                const __m256i yv = _mm256_loadu_si256((const __m256i *)(y[i].qs + 32 * ib));
                UNROLL for (int k = 0; k < 4; k++) {
                    if (k >= R) continue;
                    const uint8_t *a = row[k] + (size_t)i * bw;
                    __m256i sgn;
                    int ls;
                    const __m256i q = xxs ? xxs_levels((const block_iq3_xxs *)a, ib, &sgn, &ls)
                                          : s_levels((const block_iq3_s *)a, ib, &sgn, &ls);
                    const __m256i p = _mm256_maddubs_epi16(q, _mm256_sign_epi8(yv, _mm256_or_si256(sgn, one)));
                    acc[k] = _mm256_add_epi32(acc[k], _mm256_madd_epi16(p, _mm256_set1_epi16((short)ls)));
                }
            }
            /* sumf += (d_w * d_y) * bsum, as the reference */
            const __m128 d = _mm_mul_ps(f16x4(row, (size_t)i * bw), _mm_set1_ps(y[i].d));
            sumf = _mm_add_ps(sumf, _mm_mul_ps(d, _mm_cvtepi32_ps(hsum4_i32(acc))));
        }
        if (xxs) sumf = _mm_mul_ps(_mm_set1_ps(0.25f), sumf);
        float o[4];
        _mm_storeu_ps(o, sumf);
        for (int k = 0; k < R; k++) out[(size_t)c * ldo + k] = o[k];
    }
}

#define MK_XXS(R, C, ...) mk_iq3(1, R, C, __VA_ARGS__)
#define MK_S(R, C, ...) mk_iq3(0, R, C, __VA_ARGS__)
TILE_DRIVER_RC(tile_iq3_xxs, T2, MK_XXS, 4, 1)
TILE_DRIVER_RC(tile_iq3_s, T2, MK_S, 4, 1)

void tl_iq3_fill_avx2(tl_kernel_table *t) {
    t->vec_dot[TL_TYPE_IQ3_XXS] = tile_iq3_xxs_1;
    t->vec_dot_tile[TL_TYPE_IQ3_XXS] = tile_iq3_xxs;
    t->vec_dot[TL_TYPE_IQ3_S] = tile_iq3_s_1;
    t->vec_dot_tile[TL_TYPE_IQ3_S] = tile_iq3_s;
}

#else
void tl_iq3_fill_avx2(tl_kernel_table *t) { (void)t; }
#endif
