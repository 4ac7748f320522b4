/* gemm_q.h - shared by the GEMM files (gemm_avx2.c, gemm_avx512.c,
 * gemm_k_avx512.c, gemm_k_avx2.c): the 32-element weight kinds against q8_0 activations,
 * their block sizes, and small sums.
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

/* 16 rows of 8 dwords -> q[j] lane r = dword j of row r: rows r and r+8
 * share a zmm, then 32- and 64-bit unpacks and a cross-lane permute (the
 * VNNI tiles' block transpose, blocks_avx512.h and gemm_k_avx512.c). */
static inline __attribute__((always_inline, target("avx512f"))) void tl_tr16x8(const __m256i v[16], __m512i q[8]) {
    __m512i z[8], t[8], u[8];
    _Pragma("GCC unroll 8") for (int r = 0; r < 8; r++) z[r] = _mm512_inserti64x4(_mm512_castsi256_si512(v[r]), v[r + 8], 1);
    _Pragma("GCC unroll 8") for (int r = 0; r < 8; r += 2) {
        t[r] = _mm512_unpacklo_epi32(z[r], z[r + 1]);
        t[r + 1] = _mm512_unpackhi_epi32(z[r], z[r + 1]);
    }
    _Pragma("GCC unroll 8") for (int h = 0; h < 8; h += 4) {
        u[h + 0] = _mm512_unpacklo_epi64(t[h + 0], t[h + 2]);
        u[h + 1] = _mm512_unpackhi_epi64(t[h + 0], t[h + 2]);
        u[h + 2] = _mm512_unpacklo_epi64(t[h + 1], t[h + 3]);
        u[h + 3] = _mm512_unpackhi_epi64(t[h + 1], t[h + 3]);
    }
    const __m512i lo = _mm512_set_epi64(13, 12, 5, 4, 9, 8, 1, 0), hi = _mm512_set_epi64(15, 14, 7, 6, 11, 10, 3, 2);
    _Pragma("GCC unroll 8") for (int j = 0; j < 4; j++) {
        q[j] = _mm512_permutex2var_epi64(u[j], lo, u[j + 4]);
        q[j + 4] = _mm512_permutex2var_epi64(u[j], hi, u[j + 4]);
    }
}

/* The AVX2 GEMM files' 8-row groups (gemm_avx2.c, gemm_k_avx2.c): lane r
 * of a ymm belongs to row r of the group. */
#define TL_AVX2_AI __attribute__((always_inline, target("avx2,fma,f16c")))

/* The four sums of four rows' int32 lanes (exact), row k in lane k: the
 * 4-row tiles' reduction (quants_extra_avx2.c, quants_iq*_avx2.c). */
static inline TL_AVX2_AI __m128i tl_hsum4_i32(const __m256i p[4]) {
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

/* 7-bit sign indices in bytes (bit 7 clear) to tl_iq_signs8's sign bytes:
 * bit 7 set to the parity of the other seven, by a nibble-parity vpshufb
 * (the i-quants' even-parity signs: iq2_xxs, iq2_xs, iq3_xxs). */
static inline TL_AVX2_AI __m256i tl_iq_parity7(__m256i b) {
    const __m256i par = _mm256_setr_epi8(0, -128, -128, 0, -128, 0, 0, -128, -128, 0, 0, -128, 0, -128, -128, 0,
                                         0, -128, -128, 0, -128, 0, 0, -128, -128, 0, 0, -128, 0, -128, -128, 0);
    const __m256i m4 = _mm256_set1_epi8(0xF);
    return _mm256_or_si256(b, _mm256_xor_si256(_mm256_shuffle_epi8(par, _mm256_and_si256(b, m4)),
                                               _mm256_shuffle_epi8(par, _mm256_and_si256(_mm256_srli_epi16(b, 4), m4))));
}

/* ls = 2s + 1 in both int16 halves of each int32 lane, from the 4-bit s
 * in the lanes: the i-quants' sub-block scales as vpmaddwd operands. */
static inline TL_AVX2_AI __m256i tl_iq_ls_pairs(__m256i s4) {
    const __m256i ls = _mm256_or_si256(_mm256_slli_epi32(s4, 1), _mm256_set1_epi32(1));
    return _mm256_or_si256(ls, _mm256_slli_epi32(ls, 16));
}

/* The 8 sign-and-scale words of an iq2_xxs / iq3_xxs super-block (four
 * 7-bit sign indices, then a 4-bit s at bits 28..31): sw[ib] the sub-block's
 * 32 sign bits (byte l: index l and its parity bit), lw[ib] its ls = 2s + 1
 * in both int16 halves. */
static inline TL_AVX2_AI void tl_iq_xxs_signs(__m256i aux, uint32_t sw[8], uint32_t lw[8]) {
    const __m256i b = _mm256_or_si256(
        _mm256_or_si256(_mm256_and_si256(aux, _mm256_set1_epi32(0x7F)),
                        _mm256_and_si256(_mm256_slli_epi32(aux, 1), _mm256_set1_epi32(0x7F00))),
        _mm256_or_si256(_mm256_and_si256(_mm256_slli_epi32(aux, 2), _mm256_set1_epi32(0x7F0000)),
                        _mm256_and_si256(_mm256_slli_epi32(aux, 3), _mm256_set1_epi32(0x7F000000))));
    _mm256_storeu_si256((__m256i *)sw, tl_iq_parity7(b));
    _mm256_storeu_si256((__m256i *)lw, tl_iq_ls_pairs(_mm256_srli_epi32(aux, 28)));
}

/* Four interleaved row streams lose the hardware prefetcher (q2_K / q3_K
 * decode: the d loads waited on DRAM, a third of the time): the first
 * token (pf) of a 4-row tile asks for the next 4 rows' bytes (one address
 * range after these), block i's share of them (blocks of bw bytes) a step,
 * 4 KiB ahead. */
static inline TL_AVX2_AI void tl_prefetch_next_rows4(int pf, const uint8_t *w, size_t ldw, int64_t i, size_t bw) {
    if (!pf) return;
    const uint8_t *p = w + 4 * ldw + 4096 + (size_t)i * 4 * bw;
    for (size_t k = 0; k < 4 * bw; k += 64) _mm_prefetch((const char *)(p + k), _MM_HINT_T0);
}

/* 8 rows of 8 dwords -> q[j] lane r = dword j of row r: 32- and 64-bit
 * unpacks, then a cross-lane permute. */
static inline TL_AVX2_AI void tl_tr8x8(const __m256i z[8], __m256i q[8]) {
    __m256i t[8], u[8];
    _Pragma("GCC unroll 8") for (int r = 0; r < 8; r += 2) {
        t[r] = _mm256_unpacklo_epi32(z[r], z[r + 1]);     /* r.0 r+1.0 r.1 r+1.1 | .4 .5 */
        t[r + 1] = _mm256_unpackhi_epi32(z[r], z[r + 1]); /* .2 .3 | .6 .7 */
    }
    _Pragma("GCC unroll 8") for (int h = 0; h < 8; h += 4) {
        u[h + 0] = _mm256_unpacklo_epi64(t[h + 0], t[h + 2]); /* rows h..h+3 of dword 0 | 4 */
        u[h + 1] = _mm256_unpackhi_epi64(t[h + 0], t[h + 2]); /* 1 | 5 */
        u[h + 2] = _mm256_unpacklo_epi64(t[h + 1], t[h + 3]); /* 2 | 6 */
        u[h + 3] = _mm256_unpackhi_epi64(t[h + 1], t[h + 3]); /* 3 | 7 */
    }
    _Pragma("GCC unroll 8") for (int j = 0; j < 4; j++) {
        q[j] = _mm256_permute2x128_si256(u[j], u[j + 4], 0x20);
        q[j + 4] = _mm256_permute2x128_si256(u[j], u[j + 4], 0x31);
    }
}

/* 8 vectors of int32 partials -> lane r = the sum of p[r]'s lanes (exact). */
static inline TL_AVX2_AI __m256i tl_sum8_epi32(const __m256i p[8]) {
    const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
    const __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

/* The 8 rows' fp16 words at wb + roffs[r] as floats, inserted one by one:
 * 8 2-byte stores read back as one 16-byte load would miss store
 * forwarding, once per block in the decode paths. */
static inline TL_AVX2_AI __m256 tl_row_f16x8(const uint8_t *wb, const size_t *roffs) {
    uint16_t dh;
    memcpy(&dh, wb + roffs[0], 2);
    __m128i d = _mm_cvtsi32_si128(dh);
#define TL_INS(R) memcpy(&dh, wb + roffs[R], 2); d = _mm_insert_epi16(d, dh, R);
    TL_INS(1) TL_INS(2) TL_INS(3) TL_INS(4) TL_INS(5) TL_INS(6) TL_INS(7)
#undef TL_INS
    return _mm256_cvtph_ps(d);
}

/* Stores the first nr lanes of v to out. */
static inline TL_AVX2_AI void tl_store_rows8(float *out, __m256 v, int nr) {
    if (nr == 8) {
        _mm256_storeu_ps(out, v);
        return;
    }
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    _mm256_maskstore_ps(out, _mm256_cmpgt_epi32(_mm256_set1_epi32(nr), idx), v);
}

/* Up to this many tokens an AVX2 GEMM reads a group's rows in place
 * (decode); more transpose it once for all of them. */
#define TL_AVX2_FUSED_TOKENS 2

/* 8 row streams are more than the hardware prefetcher follows: at block b
 * of a group (row r at w + roffs[r], blocks of bw bytes) the next group's
 * rows, contiguous after these, go to L2 linearly, 8 * bw bytes a block,
 * from 1 KiB past its start. */
static inline TL_AVX2_AI void tl_prefetch_next_group8(const uint8_t *w, const size_t *roffs, int64_t b, size_t bw) {
    const uint8_t *p = w + 8 * roffs[1] + 1024 + (size_t)b * 8 * bw;
    _Pragma("GCC unroll 8") for (size_t k = 0; k < 8 * bw; k += 64) _mm_prefetch((const char *)(p + k), _MM_HINT_T1);
}

/* roffs for the 8 rows from r0: rows past nr repeat the last row (valid
 * memory); their lanes are not stored. Returns the rows stored. */
static inline int tl_group_rows8(int r0, int nr, size_t ldw, size_t roffs[8]) {
    const int g = nr - r0 < 8 ? nr - r0 : 8;
    for (int r = 0; r < 8; r++) roffs[r] = (size_t)(r < g ? r : g - 1) * ldw;
    return g;
}

#endif
