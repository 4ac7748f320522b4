/* avx512_dot.h - the f32 dot product's lanes, shared by quants_avx512.c
 * (tl_dot_f32) and attn_avx512.c (attention score rows) so that both sum
 * in exactly one order: a score row is bitwise tl_dot_f32 of its pair,
 * whether its K row is read as f32 or widened from f16 on the fly
 * (f16 -> f32 is exact); and the transposing tree that folds 16 vectors'
 * lanes at once (score rows' sums, the maxima of int8 V weights and of
 * q8_0 blocks). Include after defining T5 and AI. */
#ifndef TL_AVX512_DOT_H
#define TL_AVX512_DOT_H

#include <immintrin.h>
#include <stdint.h>

#define LDH16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))

/* The tail (n % 16) goes through a masked load, so there is no scalar loop. */
static inline AI T5 __mmask16 tail_mask(int64_t r) { return (__mmask16)((1u << r) - 1); }

/* Row element i..i+15 as floats; f16: b holds uint16_t halves. */
static inline AI T5 __m512 ld_f(int f16, const void *b, int64_t i) {
    return f16 ? LDH16((const uint16_t *)b + i) : _mm512_loadu_ps((const float *)b + i);
}
static inline AI T5 __m512 ld_f_tail(int f16, __mmask16 m, const void *b, int64_t i) {
    return f16 ? _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)b + i))
               : _mm512_maskz_loadu_ps(m, (const float *)b + i);
}

/* The transposing tree: lane i of the result folds lanes 0-15 of v[i]
 * (i < 16) with op (add, or max), in hsum512's pairing in every lane. */
static inline AI T5 __m512 fold16(const __m512 v[16], int max) {
#define OP(a, b) (max ? _mm512_max_ps(a, b) : _mm512_add_ps(a, b))
    const __m512i perm = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
    __m512 c[8], d[4], e[2];
    _Pragma("GCC unroll 8") for (int p = 0; p < 8; p++) /* t3: lanes 0-7 row 2p, 8-15 row 2p+1 */
        c[p] = OP(_mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                  _mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++) /* t6: 128-bit lane L = row 4p + L */
        d[p] = OP(_mm512_shuffle_f32x4(c[2 * p], c[2 * p + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                  _mm512_shuffle_f32x4(c[2 * p], c[2 * p + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    _Pragma("GCC unroll 2") for (int p = 0; p < 2; p++) /* t8: lane L = rows 8p + L (0, 1), 8p + 4 + L (2, 3) */
        e[p] = OP(_mm512_shuffle_ps(d[2 * p], d[2 * p + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                  _mm512_shuffle_ps(d[2 * p], d[2 * p + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    /* element 4L + m holds row 4m + L */
    const __m512 f = OP(_mm512_shuffle_ps(e[0], e[1], _MM_SHUFFLE(2, 0, 2, 0)),
                        _mm512_shuffle_ps(e[0], e[1], _MM_SHUFFLE(3, 1, 3, 1)));
#undef OP
    return _mm512_permutexvar_ps(perm, f);
}

/* tl_dot_f32's lanes before the horizontal sum: four accumulators over
 * 64-element steps, then 16-element steps into the first, the masked tail
 * into the second. */
static inline AI T5 __m512 dot_vec(int f16, const float *a, const void *b, int64_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), ld_f(f16, b, i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), ld_f(f16, b, i + 16), s1);
        s2 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 32), ld_f(f16, b, i + 32), s2);
        s3 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 48), ld_f(f16, b, i + 48), s3);
    }
    for (; i + 16 <= n; i += 16) s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), ld_f(f16, b, i), s0);
    if (i < n) {
        const __mmask16 m = tail_mask(n - i);
        s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), ld_f_tail(f16, m, b, i), s1);
    }
    return _mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3));
}

#endif
