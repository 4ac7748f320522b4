/* avx2_bytes.h - byte unpacking shared by the AVX2 files (quants_avx2.c,
 * gemm_avx2.c, the i-quants'). Include after <immintrin.h> with T2 defined. */
#ifndef TL_AVX2_BYTES_H
#define TL_AVX2_BYTES_H

static inline T2 float f16(uint16_t h) { return _cvtsh_ss(h); }

/* 32 nibbles -> 32 bytes: low nibbles in the low lane, high in the high. */
static inline T2 __m256i nibbles32(const uint8_t *qs) {
    const __m128i t = _mm_loadu_si128((const __m128i *)qs);
    const __m256i b = _mm256_inserti128_si256(_mm256_castsi128_si256(t), _mm_srli_epi16(t, 4), 1);
    return _mm256_and_si256(b, _mm256_set1_epi8(0xF));
}

/* Byte k = 0xFF where bit k of x is set, else 0: byte k / 8 of x spread
 * over 8 bytes, every bit but the k-th set by an or. */
static inline T2 __m256i bit_masks32(uint32_t x) {
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    const __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x), shuf);
    return _mm256_cmpeq_epi8(_mm256_or_si256(b, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe)), _mm256_set1_epi64x(-1));
}

/* The same of the 32-bit word at p. */
static inline T2 __m256i bits32(const uint8_t *p) {
    uint32_t x;
    memcpy(&x, p, 4);
    return bit_masks32(x);
}

#endif
