/* blocks_avx512.h - what gemm_avx512.c (the VNNI tiles) and gemm_amx.c
 * (the AMX tiles) share: a 16-row group's block as the transposed
 * registers both read (q[k] lane r = bytes 4k..4k+3 of row r, unsigned),
 * from plain rows, the workspace or a TL_PACK16 group, and the prepared
 * activation row's offsets. Static inline, so each includer's object code
 * is what it was with the code in place. Include only under x86, after
 * <immintrin.h> and gemm_q.h. */
#ifndef TL_BLOCKS_AVX512_H
#define TL_BLOCKS_AVX512_H

#define TN __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c")))
#define AI __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 8")
#define UNROLL16 _Pragma("GCC unroll 16")

enum { GROUP_BYTES = 8 * 64 + 64 };
/* A block's bytes in the workspace: q[8], dw, and q4_1's / q5_1's dm. */
/* q4_1 and q5_1 carry a min per block (summed with two FMAs, below) */
static inline int has_min(int kind) { return kind == Q_4_1 || kind == Q_5_1; }
static inline size_t group_bytes(int kind) { return has_min(kind) ? GROUP_BYTES + 64 : GROUP_BYTES; }
#define TL_FUSED_TOKENS 2
#define TOK_BLOCK 8 /* tokens per micro-tile */
/* prefetch start past a group's first row: 16 rows on (roffs[1] is the
 * row stride, or 0 for a one-row group), plus 2 KiB measured best */
#define PF_AHEAD(roffs) (16 * (roffs)[1] + 2048)
/* The packed stream's prefetch distance. 16 tokens (two micro-tiles a
 * group, the second from L1/L2) stall on the first when it is short: a
 * 16-token GEMM over 65536 x 768 cold q8_0 rows, one thread, 71% -> 74%
 * of the vpdpbusd peak at 4 -> 16 KiB (77-79% with the rows in cache);
 * 512-token prefill the same either way. */
#ifndef PF_PACKED
#define PF_PACKED 16384
#endif

/* The prepared activation row's layout: tl_gemm_dy_off / tl_gemm_corr_off (quants_impl.h). */

static inline int off_of(int kind) {
    return kind == Q_8_0 || kind == Q_IQ4NL ? 128 : kind == Q_4_0 ? 8 : has_min(kind) ? 0 : 16;
}


/* Where a 32-element block's quants start (after d, q4_1's m, q5_0's qh, q5_1's m and qh). */
static inline size_t qoff_of(int kind) { return kind == Q_5_1 ? 8 : kind == Q_5_0 ? 6 : kind == Q_4_1 ? 4 : 2; }

/* Row block b's 32 weights as unsigned bytes (element i in byte i). */
static inline AI TN __m256i unpack_block(int kind, const uint8_t *wb) {
    if (kind == Q_8_0)
        return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(wb + 2)), _mm256_set1_epi8((char)0x80));
    const __m256i t = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(wb + qoff_of(kind))));
    __m256i q = _mm256_and_si256(_mm256_srlv_epi64(t, _mm256_set_epi64x(4, 4, 0, 0)), _mm256_set1_epi8(0xF));
    if (kind == Q_5_0 || kind == Q_5_1) /* qh: the 4 bytes before the nibbles */
        q = _mm256_mask_add_epi8(q, (__mmask32)tl_ld32(wb + qoff_of(kind) - 4), q, _mm256_set1_epi8(0x10));
    if (kind == Q_IQ4NL) q = _mm256_shuffle_epi8(_mm512_castsi512_si256(tl_iq4nl_lut128()), q);
    return q;
}

/* Block b of 16 rows (row r at w + roffs[r]) transposed: q[k] lane r =
 * bytes 4k..4k+3 of row r; dw lane r = row r's scale, dm (q4_1) its min.
 * The scales go through a small stack array (integer loads and stores,
 * ports the vector work leaves idle): measured faster than vpgatherdd on
 * Zen 4. */
static inline AI TN void transpose_block(int kind, const uint8_t *w, const size_t *roffs, int64_t b, __m512i q[8],
                                         __m512 *dw, __m512 *dm) {
    const size_t bw = bw_of(kind);
    const uint8_t *wb = w + (size_t)b * bw;
    /* 16 row streams are more than the hardware prefetcher follows: the
     * bytes after this group (the next group's rows, contiguous) are
     * fetched into L2 linearly, 16 blocks' worth per block. Measured on
     * Zen 4 (one 2048-wide q8_0 matrix from DRAM, nt = 1): 20-27 GB/s with
     * it, 10-11 without; into L1 it evicts this group's rows first. */
    const uint8_t *pf = w + PF_AHEAD(roffs) + (size_t)b * 16 * bw;
    UNROLL16 for (size_t k = 0; k < 16 * bw; k += 64) _mm_prefetch((const char *)(pf + k), _MM_HINT_T1);
    uint16_t dh[16];
    UNROLL16 for (int r = 0; r < 16; r++) memcpy(&dh[r], wb + roffs[r], 2);
    if (has_min(kind)) {
        uint16_t mh[16];
        UNROLL16 for (int r = 0; r < 16; r++) memcpy(&mh[r], wb + roffs[r] + 2, 2);
        *dm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)mh));
    }
    if (kind == Q_4_0 || kind == Q_4_1 || kind == Q_IQ4NL) {
        const size_t qo = qoff_of(kind);
        /* transpose the 16 packed bytes (4 dwords) per row, then split the
         * nibbles: dword j holds elements 4j..4j+3 (low) and 16+4j.. (high) */
        __m512i z[4], t[4];
        UNROLL for (int i = 0; i < 4; i++) {
            /* lane L: row i + 4L */
            __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(wb + roffs[i] + qo)));
            v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(wb + roffs[i + 4] + qo)), 1);
            v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(wb + roffs[i + 8] + qo)), 2);
            z[i] = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(wb + roffs[i + 12] + qo)), 3);
        }
        t[0] = _mm512_unpacklo_epi32(z[0], z[1]);
        t[1] = _mm512_unpackhi_epi32(z[0], z[1]);
        t[2] = _mm512_unpacklo_epi32(z[2], z[3]);
        t[3] = _mm512_unpackhi_epi32(z[2], z[3]);
        /* lane L of a 4x4 transpose holds rows 4L..4L+3 in order */
        const __m512i p[4] = {_mm512_unpacklo_epi64(t[0], t[2]), _mm512_unpackhi_epi64(t[0], t[2]),
                              _mm512_unpacklo_epi64(t[1], t[3]), _mm512_unpackhi_epi64(t[1], t[3])};
        const __m512i m4 = _mm512_set1_epi8(0xF);
        UNROLL for (int j = 0; j < 4; j++) {
            q[j] = _mm512_and_si512(p[j], m4);
            q[j + 4] = _mm512_and_si512(_mm512_srli_epi16(p[j], 4), m4);
        }
        if (kind == Q_IQ4NL) UNROLL for (int k = 0; k < 8; k++) q[k] = _mm512_shuffle_epi8(tl_iq4nl_lut128(), q[k]);
        *dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)dh));
        return;
    }
    __m256i v[16];
    UNROLL16 for (int r = 0; r < 16; r++) v[r] = unpack_block(kind, wb + roffs[r]);
    tl_tr16x8(v, q);
    *dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)dh));
}

/* Block b of a TL_PACK16 group g (pack.c): the 16 scales (q4_1: then the
 * 16 mins), then q[k] lane r = bytes 4k..4k+3 of row r (q8_0, made
 * unsigned here), or for q4_0 (q4_1) the
 * packed bytes 4j..4j+3 split into low (q[j]) and high (q[j + 4]) nibbles,
 * q5_0 the same with each register's 5th bits added from its 64-bit mask:
 * the registers transpose_block builds, read with one load each. (Plain
 * q5_0 rows cost decode a bit gather per row and block: Gemma 3 270M's
 * 640-wide q5_0 matrices streamed at ~12 GB/s, packed q8_0 at ~20.) */
static inline AI TN void load_packed(int kind, const uint8_t *g, int64_t b, __m512i q[8], __m512 *dw, __m512 *dm,
                                     int pf) {
    const uint8_t *gb = g + (size_t)b * 16 * bw_of(kind);
    /* pf (a full micro-tile of TOK_BLOCK tokens, each block's compute
     * long): the bytes PF_PACKED ahead go to L2 as this block is read, or
     * the stream starves. A short one (decode, a small batch) runs ahead
     * of the prefetches it would issue: the hardware prefetcher, on the
     * weights' huge pages, serves it better alone. 110M, one thread,
     * decode of one sequence: Q4_0 3.2-3.9 -> 2.3-3.1 ms a token, Q8_0
     * 4.7-5.2 -> 4.3-4.6; 2 sequences 6.8 -> 4.1-4.5 ms a step (Q8_0);
     * 16 need it (16 ms a step with, 22 without). */
    if (pf)
        UNROLL16 for (size_t k = 0; k < 16 * bw_of(kind); k += 64) _mm_prefetch((const char *)(gb + PF_PACKED + k), _MM_HINT_T1);
    *dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)gb));
    if (kind == Q_8_0) {
        UNROLL for (int k = 0; k < 8; k++)
            q[k] = _mm512_xor_si512(_mm512_loadu_si512(gb + 32 + 64 * k), _mm512_set1_epi8((char)0x80));
        return;
    }
    if (kind == Q_4_1) *dm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(gb + 32)));
    const __m512i m4 = _mm512_set1_epi8(0xF);
    const uint8_t *qs = gb + (kind == Q_5_0 ? 96 : kind == Q_4_1 ? 64 : 32);
    UNROLL for (int j = 0; j < 4; j++) {
        const __m512i p = _mm512_loadu_si512(qs + 64 * j);
        q[j] = _mm512_and_si512(p, m4);
        q[j + 4] = _mm512_and_si512(_mm512_srli_epi16(p, 4), m4);
    }
    if (kind == Q_IQ4NL) UNROLL for (int k = 0; k < 8; k++) q[k] = _mm512_shuffle_epi8(tl_iq4nl_lut128(), q[k]);
    if (kind == Q_5_0)
        UNROLL for (int k = 0; k < 8; k++) {
            uint64_t h;
            memcpy(&h, gb + 32 + 8 * k, 8);
            q[k] = _mm512_mask_add_epi8(q[k], (__mmask64)h, q[k], _mm512_set1_epi8(0x10));
        }
}

/* Block b's registers into a group workspace (group_bytes a block), where
 * the tiles read them for every token: gemm_avx512.c's transposed rows,
 * gemm_amx.c's packed group. */
static inline AI TN void store_block(int kind, uint8_t *wk, int64_t b, const __m512i q[8], __m512 dw, __m512 dm) {
    __m512i *g = (__m512i *)(wk + (size_t)b * group_bytes(kind));
    UNROLL for (int k = 0; k < 8; k++) _mm512_store_si512(g + k, q[k]);
    _mm512_store_ps((float *)(g + 8), dw);
    if (has_min(kind)) _mm512_store_ps((float *)(g + 9), dm);
}

/* One token's block term into its accumulator (lane r: row r), as the
 * scalar reference sums it: s the exact integer block sum with the
 * offset corrected, d = d_w * d_y; q4_1 / q5_1 add m_w * sy_b (the
 * prepared row's corr slot) by a second FMA. The VNNI and AMX tiles both
 * sum through this, so they agree bitwise. */
static inline AI TN __m512 block_sum(int kind, __m512 acc, __m512i s, __m512 d, __m512 dm, float sy) {
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), d, acc);
    return has_min(kind) ? _mm512_fmadd_ps(dm, _mm512_set1_ps(sy), acc) : acc;
}

/* Where mk finds a block's registers: transposed on the fly from plain
 * rows, from the workspace, or from a packed group. */
enum { SRC_ROWS, SRC_WORK, SRC_PACKED };

#endif
