/* rows_k_avx512.h - the decode side of gemm_k_avx512.c (read its header
 * first): a matmul of at most TL_FUSED_TOKENS tokens against K-quant rows
 * goes row by row with maddubs/madd, since transposing 16 rows into the
 * workspace costs more than the rows' bytes take to arrive (q6_K:
 * 49152x2048 from DRAM, one token, 5.5 ms against 7.5-8.9 transposed and
 * 6.5 for the old row-dot kernel). q6_K one row at a time; q4_K, q5_K,
 * q2_K, q3_K and iq4_xs four rows in step (rows_K). The integers are the
 * reference's exact sums and the float ops its order, so every output is
 * bitwise the tiles and tl_vec_dot_ref.
 *
 * A header of static inline functions, included by gemm_k_avx512.c alone,
 * so that each type's entry point inlines its rows as before the split:
 * moved out of line into their own file, one-thread decode moved by code
 * placement alone (q4_K +6%, q2_K -5%, q3_K -3..-12%). */
#ifndef TL_ROWS_K_AVX512_H
#define TL_ROWS_K_AVX512_H

#include <string.h>

#include "gemm_k_avx512.h"
#include "gemm_q.h"

/* q6_K decode (nt <= TL_FUSED_TOKENS): one row at a time, the 16 rows'
 * transposition costing more than the row's bytes take to arrive. The
 * integers are the same exact sums (64 elements per zmm with
 * maddubs/madd: |q * y| pairs stay below 2^14, so nothing saturates), the
 * float ops the reference's, so it is bitwise the tiles. */
static inline AI TN void rows_q6_K(int C, int nr, int64_t nb, const uint8_t *w, size_t ldw, const uint8_t *x,
                                   size_t ldx, float *out, size_t ldo) {
    const __m512i m4 = _mm512_set1_epi8(0xF), m30 = _mm512_set1_epi8(0x30);
    const __m512i shl = _mm512_set_epi64(2, 2, 2, 2, 4, 4, 4, 4), shr = _mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0);
    /* int16 scale index per lane: 8 lanes per 16-element group */
    const __m512i sidx = _mm512_set_epi64(0x0003000300030003, 0x0003000300030003, 0x0002000200020002,
                                          0x0002000200020002, 0x0001000100010001, 0x0001000100010001, 0, 0);
    for (int r = 0; r < nr; r++) {
        float s[TL_FUSED_TOKENS] = {0};
        for (int64_t i = 0; i < nb; i++) {
            const block_q6_K *a = (const block_q6_K *)(w + (size_t)r * ldw) + i;
            const block_q8_K *yb[TL_FUSED_TOKENS];
            UNROLL for (int c = 0; c < C; c++) yb[c] = (const block_q8_K *)(x + c * ldx) + i;
            const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)a->scales));
            const __m512i sc = _mm512_castsi256_si512(sc16);
            __m512i sum[TL_FUSED_TOKENS];
            UNROLL for (int c = 0; c < C; c++) sum[c] = _mm512_setzero_si512();
            UNROLL for (int j = 0; j < 2; j++) {
                const __m512i l = _mm512_loadu_si512(a->ql + 64 * j);
                const __m512i hb = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(a->qh + 32 * j)));
                /* elements 128j + 0..63: ql low nibbles, qh bits 0-1 / 2-3 */
                const __m512i q0 = _mm512_or_si512(_mm512_and_si512(l, m4), _mm512_and_si512(_mm512_sllv_epi64(hb, shl), m30));
                /* elements 128j + 64..127: ql high nibbles, qh bits 4-5 / 6-7 */
                const __m512i q1 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi64(l, 4), m4),
                                                   _mm512_and_si512(_mm512_srlv_epi64(hb, shr), m30));
                const __m512i base = _mm512_set1_epi16((short)(8 * j));
                const __m512i s0 = _mm512_permutexvar_epi16(_mm512_add_epi16(sidx, base), sc);
                const __m512i s1 = _mm512_permutexvar_epi16(_mm512_add_epi16(sidx, _mm512_add_epi16(base, _mm512_set1_epi16(4))), sc);
                UNROLL for (int c = 0; c < C; c++) {
                    const __m512i p0 = _mm512_maddubs_epi16(q0, _mm512_loadu_si512(yb[c]->qs + 128 * j));
                    const __m512i p1 = _mm512_maddubs_epi16(q1, _mm512_loadu_si512(yb[c]->qs + 128 * j + 64));
                    sum[c] = _mm512_add_epi32(sum[c], _mm512_add_epi32(_mm512_madd_epi16(s0, p0), _mm512_madd_epi16(s1, p1)));
                }
            }
            const float dw = _cvtsh_ss(a->d);
            UNROLL for (int c = 0; c < C; c++) {
                const __m256i pm = _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)yb[c]->bsums));
                const int sumi = _mm512_reduce_add_epi32(sum[c]) - 32 * _mm512_reduce_add_epi32(_mm512_zextsi256_si512(pm));
                s[c] += (yb[c]->d * dw) * (float)sumi;
            }
        }
        UNROLL for (int c = 0; c < C; c++) out[c * ldo + r] = s[c];
    }
}

/* q4_K / q5_K decode (nt <= TL_FUSED_TOKENS): row by row, four rows in
 * step, where transposing 16 rows per super-block held decode to ~11 GB/s
 * (110M-shaped Q4_K, one thread: 178 tok/s against ik_llama.cpp's 240). A
 * zmm of nibbles holds sub-blocks (2c, 2c + 2) in its halves (lo) or
 * (2c + 1, 2c + 3) (hi), met by the activation halves of those sub-blocks
 * (one lane shuffle, shared by the four rows); maddubs pairs stay below
 * 2^13 (q5_K: 2 * 31 * 127) and vpmaddwd / vpdpwssd weight them by the
 * sub-block scales (at most 63). The four rows' integer sums are reduced together (hadd trees)
 * and their float ops run as lanes of one vector. The integers are the
 * reference's exact sums, the float ops its order per lane, so it is
 * bitwise the tiles. */

/* Row a's super-block as the four nibble registers and their scale
 * registers (the 8 scales as int16 in lanes of the sub-blocks they
 * weight); mn: the (m_j, m_j) int16 pairs for the bsums. */
static inline AI TN void row_sb(int kind, const uint8_t *a, __m512i q[4], __m512i scv[4], __m256i *mn) {
    const __m512i m4 = _mm512_set1_epi8(0xF), m10 = _mm512_set1_epi8(0x10);
    uint32_t u[3];
    memcpy(u, a + 4, 12); /* the scales: after d and dmin in both types */
    const uint32_t sc_lo = u[0] & 0x3f3f3f3f, mn_lo = u[1] & 0x3f3f3f3f;
    const uint32_t sc_hi = (u[2] & 0x0f0f0f0f) | ((u[0] >> 6) & 0x03030303) << 4;
    const uint32_t mn_hi = ((u[2] >> 4) & 0x0f0f0f0f) | ((u[1] >> 6) & 0x03030303) << 4;
    /* the 8 int16 scales in every 128-bit lane, picked by vpshufb */
    const __m512i sc =
        _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)((uint64_t)sc_hi << 32 | sc_lo))));
    const __m128i mn8 = _mm_cvtsi64_si128((long long)((uint64_t)mn_hi << 32 | mn_lo));
    *mn = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn8, mn8));
    UNROLL for (int k = 0; k < 4; k++) {
        const uint64_t ja = (uint64_t)(k / 2 * 4 + k % 2), jb = ja + 2; /* sub-blocks of the low, high half */
        const uint64_t wa = ((2 * ja + 1) << 8 | 2 * ja) * 0x0001000100010001ull;
        const uint64_t wb = ((2 * jb + 1) << 8 | 2 * jb) * 0x0001000100010001ull;
        scv[k] = _mm512_shuffle_epi8(sc, _mm512_set_epi64((long long)wb, (long long)wb, (long long)wb, (long long)wb,
                                                          (long long)wa, (long long)wa, (long long)wa, (long long)wa));
    }
    const size_t qo = kind == K_5 ? offsetof(block_q5_K, qs) : offsetof(block_q4_K, qs);
    const __m512i l0 = _mm512_loadu_si512(a + qo), l1 = _mm512_loadu_si512(a + qo + 64);
    q[0] = _mm512_and_si512(l0, m4);
    q[1] = _mm512_and_si512(_mm512_srli_epi16(l0, 4), m4);
    q[2] = _mm512_and_si512(l1, m4);
    q[3] = _mm512_and_si512(_mm512_srli_epi16(l1, 4), m4);
    if (kind == K_5) { /* bit j of a qh byte to bit 4, j the sub-block of each half */
        const __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(a + offsetof(block_q5_K, qh))));
        q[0] = _mm512_or_si512(q[0], _mm512_and_si512(_mm512_sllv_epi64(h, _mm512_set_epi64(2, 2, 2, 2, 4, 4, 4, 4)), m10));
        q[1] = _mm512_or_si512(q[1], _mm512_and_si512(_mm512_sllv_epi64(h, _mm512_set_epi64(1, 1, 1, 1, 3, 3, 3, 3)), m10));
        q[2] = _mm512_or_si512(q[2], _mm512_and_si512(_mm512_srlv_epi64(h, _mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0)), m10));
        q[3] = _mm512_or_si512(q[3], _mm512_and_si512(_mm512_srlv_epi64(h, _mm512_set_epi64(3, 3, 3, 3, 1, 1, 1, 1)), m10));
    }
}

#ifndef K_PF_AHEAD
/* 110M-shaped q4_K/q5_K matrices from DRAM, one token, one thread: none
 * 7.4-12 GB/s; the next group 17; + 2 KiB 17.5-19.7; + 8 KiB 18.5-20 */
#define K_PF_AHEAD(ldw) (4 * (ldw) + 8192)
#endif
/* q2_K / q3_K decode (nt <= TL_FUSED_TOKENS): q4_K's scheme (rows_K). The
 * 64 qs bytes are one load; register j is bits 2j..2j+1 of every byte:
 * elements 32j..32j+31 in its low half (chunk 0), 128 + 32j.. in its high
 * half (chunk 1), met by the activation rearranged so once per super-block
 * (rows_K). Its lanes are sub-blocks 2j, 2j + 1, 8 + 2j, 9 + 2j, their
 * int16 scales picked by vpshufb. maddubs pairs stay below 2^11 (7 * 127 *
 * 2), scaled sums below 2^17. q3_K's -4 comes out as 4 * sum_j sc_j *
 * bsums_j (vpmaddwd). */
static inline AI TN void row_sb23(int kind, const uint8_t *a, __m512i q[4], __m512i scv[4], __m256i *mn) {
    const __m512i m3 = _mm512_set1_epi8(3), m04 = _mm512_set1_epi8(4);
    __m128i sc8, mn8 = _mm_setzero_si128();
    if (kind == K_2) {
        const __m128i b = _mm_loadu_si128((const __m128i *)(a + offsetof(block_q2_K, scales)));
        sc8 = _mm_and_si128(b, _mm_set1_epi8(0xF));
        mn8 = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0xF));
    } else {
        sc8 = tl_q3_K_scales8(a);
    }
    const __m256i sc16 = kind == K_2 ? _mm256_cvtepu8_epi16(sc8) : _mm256_cvtepi8_epi16(sc8);
    *mn = kind == K_2 ? _mm256_cvtepu8_epi16(mn8) : sc16;
    /* int16 scales 0-7 in lanes 0 and 1, 8-15 in lanes 2 and 3 */
    const __m512i S = _mm512_shuffle_i64x2(_mm512_castsi256_si512(sc16), _mm512_castsi256_si512(sc16), 0x50);
    const size_t qo = kind == K_2 ? offsetof(block_q2_K, qs) : offsetof(block_q3_K, qs);
    const __m512i v = _mm512_loadu_si512(a + qo); /* both chunks: c = 0 low half, c = 1 high */
    __m512i h = _mm512_setzero_si512();
    if (kind == K_3) h = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(a + offsetof(block_q3_K, hmask))));
    UNROLL for (int j = 0; j < 4; j++) { /* register j: elements 32j + p (low half), 128 + 32j + p (high) */
        q[j] = _mm512_and_si512(j ? _mm512_srli_epi16(v, 2 * j) : v, m3);
        if (kind == K_3) { /* hmask bit j (low half), 4 + j (high half) set: + 4 */
            const long long lo = (long long)(0x0101010101010101ull << j), hi = (long long)(0x0101010101010101ull << (4 + j));
            const __mmask64 hm = _mm512_test_epi8_mask(h, _mm512_set_epi64(hi, hi, hi, hi, lo, lo, lo, lo));
            q[j] = _mm512_mask_add_epi8(q[j], hm, q[j], m04);
        }
        /* lanes 0, 2: int16 scale 2j (of their eight), lanes 1, 3: 2j + 1 */
        const long long w0 = (long long)(((uint64_t)(4 * j + 1) << 8 | 4 * j) * 0x0001000100010001ull);
        const long long w1 = w0 + 0x0202020202020202ll;
        scv[j] = _mm512_shuffle_epi8(S, _mm512_set_epi64(w1, w1, w0, w0, w1, w1, w0, w0));
    }
}

/* Row a's super-block sum for q2_K..q5_K as 8 int32 lanes (q3_K's -4
 * taken out), and its min sums (q2_K, q4_K, q5_K) against the bsums in
 * *pm: two chains, added at the end (integers: exact). */
static inline AI TN __m256i row_t(int kind, const uint8_t *a, const __m512i y[4], __m256i bsums, __m256i *pm) {
    __m512i q[4], scv[4];
    __m256i mn;
    if (kind == K_4 || kind == K_5) row_sb(kind, a, q, scv, &mn);
    else row_sb23(kind, a, q, scv, &mn);
    const __m512i a0 = _mm512_dpwssd_epi32(_mm512_madd_epi16(_mm512_maddubs_epi16(q[0], y[0]), scv[0]),
                                           _mm512_maddubs_epi16(q[1], y[1]), scv[1]);
    const __m512i a1 = _mm512_dpwssd_epi32(_mm512_madd_epi16(_mm512_maddubs_epi16(q[2], y[2]), scv[2]),
                                           _mm512_maddubs_epi16(q[3], y[3]), scv[3]);
    const __m512i acc = _mm512_add_epi32(a0, a1);
    const __m256i t = _mm256_add_epi32(_mm512_castsi512_si256(acc), _mm512_extracti64x4_epi64(acc, 1));
    *pm = _mm256_madd_epi16(mn, bsums);
    return kind == K_3 ? _mm256_sub_epi32(t, _mm256_slli_epi32(*pm, 2)) : t;
}

/* iq4_xs decode (nt <= TL_FUSED_TOKENS): q4_K's scheme (rows_K). Register
 * (h, lo) of a row holds the low nibbles of qs bytes 64h..64h+63: lane L
 * is elements 0..15 of sub-block 4h + L; (h, hi) the high nibbles, its
 * elements 16..31. The activation is rearranged to match once per
 * super-block (y[2h], y[2h + 1]), shared by the four rows. maddubs takes
 * the levels' magnitudes (vpshufb of the nibble) against the activation
 * negated where the level is negative (nibbles below 8), so pairs stay
 * below 2^15 (2 * 127 * 127) and the sums need no offset; vpdpwssd weights
 * each lane by its sub-block's int16 scale. */
static inline AI TN __m512i row_iq4xs(const uint8_t *a, const __m512i y[4]) {
    const __m512i m4 = _mm512_set1_epi8(0xF), b8 = _mm512_set1_epi8(8), zero = _mm512_setzero_si512();
    const __m512i lut = _mm512_broadcast_i32x4(_mm_setr_epi8(127, 104, 83, 65, 49, 35, 22, 10, 1, 13, 25, 38, 53, 69, 89, 113));
    /* byte j = the 6-bit scale j (4 low bits from scales_l, 2 from scales_h), by pdep */
    const uint64_t ls = _pdep_u64(tl_ld32(a + offsetof(block_iq4_xs, scales_l)), 0x0F0F0F0F0F0F0F0Full) |
                        _pdep_u64(tl_ld16(a + offsetof(block_iq4_xs, scales_h)), 0x3030303030303030ull);
    const __m128i sc8 = _mm_sub_epi8(_mm_cvtsi64_si128((long long)ls), _mm_set1_epi8(32));
    const __m512i sc16 = _mm512_broadcast_i32x4(_mm_cvtepi8_epi16(sc8)); /* 8 int16 scales per 128-bit lane */
    __m512i acc = zero;
    UNROLL for (int h = 0; h < 2; h++) {
        const __m512i l = _mm512_loadu_si512(a + offsetof(block_iq4_xs, qs) + 64 * h);
        /* lane L: int16 scale 4h + L */
        const long long w0 = (long long)(((uint64_t)(8 * h + 1) << 8 | 8 * h) * 0x0001000100010001ull);
        const long long w1 = w0 + 0x0202020202020202ll, w2 = w0 + 0x0404040404040404ll, w3 = w0 + 0x0606060606060606ll;
        const __m512i scv = _mm512_shuffle_epi8(sc16, _mm512_set_epi64(w3, w3, w2, w2, w1, w1, w0, w0));
        UNROLL for (int e = 0; e < 2; e++) {
            const __m512i nib = _mm512_and_si512(e ? _mm512_srli_epi16(l, 4) : l, m4);
            const __m512i ys = _mm512_mask_sub_epi8(y[2 * h + e], _mm512_testn_epi8_mask(nib, b8), zero, y[2 * h + e]);
            acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(_mm512_shuffle_epi8(lut, nib), ys), scv);
        }
    }
    return acc;
}

/* Decode (nt <= TL_FUSED_TOKENS) of every kind but q6_K: four rows in
 * step (row_t, row_iq4xs), their integer sums reduced together (hadd
 * tree) and their float ops, the reference's, as the lanes of one vector.
 * Four interleaved row streams lose the hardware prefetcher (as
 * gemm_avx512.c's 16): the bytes past this group go to L2 linearly, a
 * super-block's worth of four rows a step. */
static inline AI TN void rows_K(int kind, int C, int nr, int64_t nb, const uint8_t *w, size_t ldw,
                                const uint8_t *x, size_t ldx, float *out, size_t ldo) {
    const size_t bw = kbw_of(kind);
    /* d (then dmin: q2_K, q4_K, q5_K) */
    const size_t dof = kind == K_2 ? offsetof(block_q2_K, d) : kind == K_3 ? offsetof(block_q3_K, d) : 0;
    const int has_dmin = kind == K_2 || kind == K_4 || kind == K_5;
    for (int r0 = 0; r0 < nr; r0 += 4) {
        const uint8_t *row[4]; /* rows past nr repeat the last (valid memory); not stored */
        UNROLL for (int k = 0; k < 4; k++) row[k] = w + (size_t)(r0 + k < nr ? r0 + k : nr - 1) * ldw;
        for (int c = 0; c < C; c++) { /* the second token reads the four rows from L1 */
            __m128 s = _mm_setzero_ps();
            for (int64_t i = 0; i < nb; i++) {
                if (c == 0) {
                    const uint8_t *pf = w + (size_t)r0 * ldw + K_PF_AHEAD(ldw) + (size_t)i * 4 * bw;
                    for (size_t k = 0; k < 4 * bw; k += 64) _mm_prefetch((const char *)(pf + k), _MM_HINT_T1);
                }
                const block_q8_K *yb = (const block_q8_K *)(x + c * ldx) + i;
                __m512i y[4];
                if (kind == K_4 || kind == K_5) /* sub-blocks (4h, 4h + 2), (4h + 1, 4h + 3) */
                    UNROLL for (int h = 0; h < 2; h++) {
                        const __m512i y0 = _mm512_loadu_si512(yb->qs + 128 * h), y1 = _mm512_loadu_si512(yb->qs + 128 * h + 64);
                        y[2 * h] = _mm512_shuffle_i64x2(y0, y1, _MM_SHUFFLE(1, 0, 1, 0));
                        y[2 * h + 1] = _mm512_shuffle_i64x2(y0, y1, _MM_SHUFFLE(3, 2, 3, 2));
                    }
                else if (kind == K_X) /* (h, lo), (h, hi): lane L elements 0..15 / 16..31 of sub-block 4h + L */
                    UNROLL for (int h = 0; h < 2; h++) {
                        const __m512i y0 = _mm512_loadu_si512(yb->qs + 128 * h), y1 = _mm512_loadu_si512(yb->qs + 128 * h + 64);
                        y[2 * h] = _mm512_shuffle_i64x2(y0, y1, 0x88);
                        y[2 * h + 1] = _mm512_shuffle_i64x2(y0, y1, 0xDD);
                    }
                else { /* q2_K, q3_K: register j = elements 32j.. (low half), 128 + 32j.. (high) */
                    const __m512i y0 = _mm512_loadu_si512(yb->qs), y1 = _mm512_loadu_si512(yb->qs + 64);
                    const __m512i y2 = _mm512_loadu_si512(yb->qs + 128), y3 = _mm512_loadu_si512(yb->qs + 192);
                    y[0] = _mm512_shuffle_i64x2(y0, y2, _MM_SHUFFLE(1, 0, 1, 0));
                    y[1] = _mm512_shuffle_i64x2(y0, y2, _MM_SHUFFLE(3, 2, 3, 2));
                    y[2] = _mm512_shuffle_i64x2(y1, y3, _MM_SHUFFLE(1, 0, 1, 0));
                    y[3] = _mm512_shuffle_i64x2(y1, y3, _MM_SHUFFLE(3, 2, 3, 2));
                }
                const __m256i bsums = _mm256_loadu_si256((const __m256i *)yb->bsums);
                __m256i t[4], pm[4];
                UNROLL for (int k = 0; k < 4; k++) {
                    const uint8_t *a = row[k] + (size_t)i * bw;
                    if (kind == K_X) {
                        const __m512i acc = row_iq4xs(a, y);
                        t[k] = _mm256_add_epi32(_mm512_castsi512_si256(acc), _mm512_extracti64x4_epi64(acc, 1));
                    } else {
                        t[k] = row_t(kind, a, y, bsums, &pm[k]);
                    }
                }
                const __m256i wi = _mm256_hadd_epi32(_mm256_hadd_epi32(t[0], t[1]), _mm256_hadd_epi32(t[2], t[3]));
                const __m128i sumi = _mm_add_epi32(_mm256_castsi256_si128(wi), _mm256_extracti128_si256(wi, 1));
                const __m128 dy = _mm_set1_ps(yb->d);
                if (!has_dmin) { /* s += (d_y * d_w) * sumi */
                    uint64_t d4 = 0; /* the four rows' d words in one integer, then one move */
                    UNROLL for (int k = 0; k < 4; k++) d4 |= (uint64_t)tl_ld16(row[k] + (size_t)i * bw + dof) << (16 * k);
                    s = _mm_add_ps(s, _mm_mul_ps(_mm_mul_ps(dy, _mm_cvtph_ps(_mm_cvtsi64_si128((long long)d4))), _mm_cvtepi32_ps(sumi)));
                    continue;
                }
                const __m256i wm = _mm256_hadd_epi32(_mm256_hadd_epi32(pm[0], pm[1]), _mm256_hadd_epi32(pm[2], pm[3]));
                const __m128i summ = _mm_add_epi32(_mm256_castsi256_si128(wm), _mm256_extracti128_si256(wm, 1));
                const uint64_t d01 = tl_ld32(row[0] + (size_t)i * bw + dof) | (uint64_t)tl_ld32(row[1] + (size_t)i * bw + dof) << 32;
                const uint64_t d23 = tl_ld32(row[2] + (size_t)i * bw + dof) | (uint64_t)tl_ld32(row[3] + (size_t)i * bw + dof) << 32;
                const __m256 f = _mm256_cvtph_ps(_mm_set_epi64x((long long)d23, (long long)d01)); /* d0 m0 d1 m1 | d2 m2 d3 m3 */
                const __m128 flo = _mm256_castps256_ps128(f), fhi = _mm256_extractf128_ps(f, 1);
                const __m128 dw = _mm_shuffle_ps(flo, fhi, _MM_SHUFFLE(2, 0, 2, 0));
                const __m128 dm = _mm_shuffle_ps(flo, fhi, _MM_SHUFFLE(3, 1, 3, 1));
                const __m128 t1 = _mm_mul_ps(_mm_mul_ps(dy, dw), _mm_cvtepi32_ps(sumi));
                const __m128 t2 = _mm_mul_ps(_mm_mul_ps(dy, dm), _mm_cvtepi32_ps(summ));
                s = _mm_add_ps(s, _mm_sub_ps(t1, t2));
            }
            float o[4];
            _mm_storeu_ps(o, s);
            for (int k = 0; k < 4 && r0 + k < nr; k++) out[c * ldo + r0 + k] = o[k];
        }
    }
}

#endif
