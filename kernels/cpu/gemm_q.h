/* gemm_q.h - shared by the GEMM files (gemm_avx2.c, gemm_avx512.c,
 * gemm_k_avx512.c): the 32-element weight kinds against q8_0 activations,
 * their block sizes, and small loads and sums.
 * Include after <immintrin.h>. */
#ifndef TL_GEMM_Q_H
#define TL_GEMM_Q_H

enum { Q_8_0, Q_4_0, Q_5_0, Q_4_1, Q_IQ4NL, Q_5_1 }; /* iq4_nl: q4_0's bytes */

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

/* iq4_nl's 16 signed levels (tl_iq4nl_values) in both 128-bit lanes: the
 * vpshufb table of the AVX2 iq4_nl and iq4_xs kernels. */
static inline __attribute__((always_inline, target("avx2"))) __m256i tl_iq4nl_lut256(void) {
    return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)tl_iq4nl_values));
}

/* The sum of the 8 int32 lanes (exact). */
static inline __attribute__((always_inline, target("avx2"))) int hsum_epi32(__m256i p) {
    const __m128i h = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
    const __m128i h2 = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4E));
    return _mm_cvtsi128_si32(_mm_add_epi32(h2, _mm_shuffle_epi32(h2, 0xB1)));
}

/* A q3_K super-block's 16 scales as signed bytes (tl_q3_K_scales): the 12
 * scale bytes are read as 16 from 2 before them, d's bytes after them
 * being the block's last. */
static inline __attribute__((always_inline, target("avx2"))) __m128i tl_q3_K_scales8(const uint8_t *block) {
    const __m128i v = _mm_loadu_si128((const __m128i *)(block + offsetof(block_q3_K, scales) - 2));
    const __m128i t = _mm_shuffle_epi8(v, _mm_set_epi8(9, 8, 7, 6, 5, 4, 3, 2, 9, 8, 7, 6, 5, 4, 3, 2));
    const __m128i lo = _mm_and_si128(_mm_blend_epi16(t, _mm_srli_epi16(t, 4), 0xF0), _mm_set1_epi8(0xF));
    const __m128i u = _mm_shuffle_epi8(v, _mm_set_epi8(13, 12, 11, 10, 13, 12, 11, 10, 13, 12, 11, 10, 13, 12, 11, 10));
    const __m128i hi = _mm_and_si128(_mm_srlv_epi32(u, _mm_set_epi32(6, 4, 2, 0)), _mm_set1_epi8(3));
    return _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), _mm_set1_epi8(32));
}

#endif
