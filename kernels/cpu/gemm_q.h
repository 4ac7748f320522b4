/* gemm_q.h - shared by the GEMM files (gemm_avx2.c, gemm_avx512.c,
 * gemm_k_avx512.c): the 32-element weight kinds against q8_0 activations
 * (q4_1 at AVX-512 only), their block sizes, and small loads and sums.
 * Include after <immintrin.h>. */
#ifndef TL_GEMM_Q_H
#define TL_GEMM_Q_H

enum { Q_8_0, Q_4_0, Q_5_0, Q_4_1, Q_IQ4NL, Q_5_1 }; /* iq4_nl (q4_0's bytes), q5_1: AVX-512 only */

static inline size_t bw_of(int kind) {
    return kind == Q_8_0   ? sizeof(block_q8_0)
           : kind == Q_4_0 || kind == Q_IQ4NL ? sizeof(block_q4_0)
           : kind == Q_4_1 ? sizeof(block_q4_1)
           : kind == Q_5_1 ? sizeof(block_q5_1)
                           : sizeof(block_q5_0);
}

static inline uint32_t ld32(const void *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline uint16_t ld16(const void *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* iq4_nl's nibbles to its levels plus 128 (tl_iq4nl_values + 128, as
 * unsigned bytes) in every 128-bit lane: the vpdpbusd operand of the iq4_nl
 * and iq4_xs tiles (gemm_avx512.c, gemm_k_avx512.c). */
static inline __attribute__((always_inline, target("avx512f"))) __m512i tl_iq4nl_lut128(void) {
    return _mm512_broadcast_i32x4(_mm_setr_epi8(1, 24, 45, 63, 79, 93, 106, 118, (char)129, (char)141, (char)153,
                                                (char)166, (char)181, (char)197, (char)217, (char)241));
}

/* The sum of the 8 int32 lanes (exact). */
static inline __attribute__((always_inline, target("avx2"))) int hsum_epi32(__m256i p) {
    const __m128i h = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
    const __m128i h2 = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4E));
    return _mm_cvtsi128_si32(_mm_add_epi32(h2, _mm_shuffle_epi32(h2, 0xB1)));
}

#endif
