/* quants_extra_avx2.c - q2_K, q3_K, iq4_nl, iq4_xs and q5_1 one-row dots
 * for the AVX2 level (the AVX-512 level adds their GEMM, gemm_k_avx512.c and
 * gemm_avx512.c, which sum the same way).
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
 * iq4_nl: the nibbles through vpshufb to their signed levels, multiplied
 * with the activation by vpsignb + maddubs (|pairs| <= 2 * 127 * 127),
 * then the reference's float ops per block; iq4_xs the same per sub-block,
 * weighted by its scale in vpmaddwd (|sums| < 2^22), float per super-block.
 *
 * q5_1: the 5-bit values by maddubs against the activation (pairs <= 2 *
 * 31 * 127), the activation's own sum beside, then the reference's two
 * FMAs per block. */
#include "quants_impl.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define T2 __attribute__((target("avx2,fma,f16c")))
#define AI __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 4")
#include "avx2_bytes.h"

static inline AI T2 int hsum_i32(__m256i v) {
    const __m128i h = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    const __m128i h2 = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4E));
    return _mm_cvtsi128_si32(_mm_add_epi32(h2, _mm_shuffle_epi32(h2, 0xB1)));
}

/* A super-block's 16 scales as int16 (q2_K: the low nibbles; q3_K: the
 * signed 6-bit values) and q2_K's 16 mins. */
static inline AI T2 __m256i scales16(int q3, const uint8_t *a, __m256i *mn) {
    if (!q3) {
        const __m128i b = _mm_loadu_si128((const __m128i *)(a + offsetof(block_q2_K, scales)));
        *mn = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0xF)));
        return _mm256_cvtepu8_epi16(_mm_and_si128(b, _mm_set1_epi8(0xF)));
    }
    int sc[16];
    tl_q3_K_scales(a + offsetof(block_q3_K, scales), sc);
    int8_t s8[16];
    for (int j = 0; j < 16; j++) s8[j] = (int8_t)sc[j];
    return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)s8));
}

static inline AI T2 void dot_q23(int q3, int64_t n, float *out, const void *w, const void *x) {
    const size_t bw = q3 ? sizeof(block_q3_K) : sizeof(block_q2_K);
    const block_q8_K *y = x;
    const __m256i m3 = _mm256_set1_epi8(3), m04 = _mm256_set1_epi8(4);
    float s = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const uint8_t *a = (const uint8_t *)w + (size_t)i * bw;
        __m256i mn = _mm256_setzero_si256();
        const __m256i sc16 = scales16(q3, a, &mn);
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
                const __m256i yv = _mm256_loadu_si256((const __m256i *)(y[i].qs + 128 * c + 32 * j));
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(scv, _mm256_maddubs_epi16(u, yv)));
            }
        }
        const __m256i bs = _mm256_loadu_si256((const __m256i *)y[i].bsums);
        if (q3) {
            const int sumi = hsum_i32(acc) - 4 * hsum_i32(_mm256_madd_epi16(sc16, bs));
            s += y[i].d * _cvtsh_ss(((const block_q3_K *)a)->d) * sumi;
        } else {
            const block_q2_K *b = (const block_q2_K *)a;
            const int sumi = hsum_i32(acc), summ = hsum_i32(_mm256_madd_epi16(mn, bs));
            s += y[i].d * _cvtsh_ss(b->d) * sumi - y[i].d * _cvtsh_ss(b->dmin) * summ;
        }
    }
    *out = s;
}

/* 32 iq4_nl nibbles (16 bytes) times 32 activation bytes: int16 pair sums. */
static inline AI T2 __m256i iq4_pairs(__m128i lut, const uint8_t *qs, const int8_t *y) {
    const __m128i b = _mm_loadu_si128((const __m128i *)qs), m4 = _mm_set1_epi8(0xF);
    const __m256i q = _mm256_set_m128i(_mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(b, 4), m4)),
                                       _mm_shuffle_epi8(lut, _mm_and_si128(b, m4)));
    const __m256i yv = _mm256_loadu_si256((const __m256i *)y);
    return _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(yv, q));
}

static T2 void dot_iq4_xs_avx2(int64_t n, float *out, const void *w, const void *x) {
    const block_iq4_xs *a = w;
    const block_q8_K *y = x;
    const __m128i lut = _mm_loadu_si128((const __m128i *)tl_iq4nl_values);
    float s = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        __m256i acc = _mm256_setzero_si256();
        UNROLL for (int j = 0; j < 8; j++) {
            const __m256i sc = _mm256_set1_epi16((short)tl_iq4xs_scale((const uint8_t *)&a[i], j));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(iq4_pairs(lut, a[i].qs + 16 * j, y[i].qs + 32 * j), sc));
        }
        s += y[i].d * f16(a[i].d) * hsum_i32(acc);
    }
    *out = s;
}

static T2 void dot_iq4_nl_avx2(int64_t n, float *out, const void *w, const void *x) {
    const block_q4_0 *a = w;
    const block_q8_0 *y = x;
    const __m128i lut = _mm_loadu_si128((const __m128i *)tl_iq4nl_values);
    const __m256i ones = _mm256_set1_epi16(1);
    float s = 0;
    for (int64_t i = 0; i < n / 32; i++) {
        const int sumi = hsum_i32(_mm256_madd_epi16(iq4_pairs(lut, a[i].qs, y[i].qs), ones));
        s += sumi * (_cvtsh_ss(a[i].d) * _cvtsh_ss(y[i].d));
    }
    *out = s;
}

static T2 void dot_q5_1_avx2(int64_t n, float *out, const void *w, const void *x) {
    const block_q5_1 *a = w;
    const block_q8_0 *y = x;
    const __m256i ones16 = _mm256_set1_epi16(1), ones8 = _mm256_set1_epi8(1);
    __m128 s = _mm_setzero_ps();
    for (int64_t i = 0; i < n / 32; i++) {
        const __m256i q = _mm256_or_si256(nibbles32(a[i].qs), _mm256_and_si256(bits32(a[i].qh), _mm256_set1_epi8(0x10)));
        const __m256i yv = _mm256_loadu_si256((const __m256i *)y[i].qs);
        const int sumi = hsum_i32(_mm256_madd_epi16(_mm256_maddubs_epi16(q, yv), ones16));
        const int sumy = hsum_i32(_mm256_madd_epi16(_mm256_maddubs_epi16(ones8, yv), ones16));
        const float dy = f16(y[i].d);
        s = _mm_fmadd_ss(_mm_set_ss((float)sumi), _mm_set_ss(f16(a[i].d) * dy), s);
        s = _mm_fmadd_ss(_mm_set_ss(f16(a[i].m)), _mm_set_ss((float)sumy * dy), s);
    }
    *out = _mm_cvtss_f32(s);
}

static T2 void dot_q2_K_avx2(int64_t n, float *out, const void *w, const void *x) { dot_q23(0, n, out, w, x); }
static T2 void dot_q3_K_avx2(int64_t n, float *out, const void *w, const void *x) { dot_q23(1, n, out, w, x); }

void tl_extra_fill_avx2(tl_kernel_table *t) {
    t->vec_dot[TL_TYPE_IQ4_NL] = dot_iq4_nl_avx2;
    t->vec_dot[TL_TYPE_IQ4_XS] = dot_iq4_xs_avx2;
    t->vec_dot[TL_TYPE_Q5_1] = dot_q5_1_avx2;
    t->vec_dot[TL_TYPE_Q2_K] = dot_q2_K_avx2;
    t->vec_dot[TL_TYPE_Q3_K] = dot_q3_K_avx2;
}

#else
void tl_extra_fill_avx2(tl_kernel_table *t) { (void)t; }
#endif
