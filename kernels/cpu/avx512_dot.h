/* avx512_dot.h - the f32 dot product's lanes, shared by quants_avx512.c
 * (tl_dot_f32) and attn_avx512.c (attention score rows) so that both sum
 * in exactly one order: a score row is bitwise tl_dot_f32 of its pair,
 * whether its K row is read as f32 or widened from f16 on the fly
 * (f16 -> f32 is exact). Include after defining T5 and AI. */
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
