/* gemm_k_avx512.c - q2_K..q6_K weights x q8_K activations with
 * AVX512-VNNI, 16 weight rows at a time: gemm_avx512.c's scheme (read its
 * header first) for the 256-element K-quant super-blocks.
 *
 * A 16-row group's super-block i is unpacked and transposed into the
 * workspace once per matmul (lane r of every zmm belongs to row r):
 *
 *   q[z], z = 0..63:  lane r = elements 4z..4z+3 of row r, unsigned
 *                     (q4_K: the nibble 0..15; q5_K: 0..31; q6_K: the
 *                     6-bit value 0..63, not yet less 32)
 *   q4_K, q5_K (82):  sc[8] int32 sub-block scales | mn[8] int16 pairs
 *                     (m_j, m_j) | d | dmin
 *   q6_K (89 zmm):    sc[16] int32 sub-block scales | cw[8] int16 pairs
 *                     (-32 sc_2k, -32 sc_2k+1) | d
 *   q3_K (89):        q: the 3-bit value 0..7 (not yet less 4); sc[16]
 *                     signed scales | cw pairs (-4 sc_2k, -4 sc_2k+1) | d
 *   q2_K (90):        q: 0..3; sc[16] | mn[8] int16 pairs (m_2k, m_2k+1)
 *                     | d | dmin
 *   iq4_xs (81):      q: the level + 128 (iq4_nl's, by vpshufb); sc[8]
 *                     signed | cw[8] pairs (-128 sc_j, -128 sc_j) | d
 *
 * vpdpbusd takes the weights as the unsigned operand and 4 activation
 * bytes broadcast ({1to16}) as the signed one, so q4_K and q5_K (its 5th
 * bit added in) need no bias at all. Per (row, token) and super-block the
 * kernel forms the reference's integers exactly (quants_ref.c):
 *
 *   q4_K, q5_K
 *         sumi = sum_j sc_j * dot(q_j, y_j)          (8 sub-blocks of 32:
 *               8 vpdpbusd, then vpmulld by sc_j and an add)
 *         summ = sum_j m_j * (bsums_2j + bsums_2j+1) (8 vpdpwssd of the
 *               (m_j, m_j) pairs with the q8_K row's own bsums)
 *   q6_K  sumi = sum_j sc_j * dot(q_j - 32, y_j)     (16 sub-blocks of 16:
 *               4 vpdpbusd and a vpmulld each; the -32 comes out as
 *               sum_k (-32 sc) . bsums pairs, 8 vpdpwssd; q3_K the same
 *               with -4)
 *   q2_K  sumi as q3_K's without the offset, summ = sum_j m_j * bsums_j
 *               (8 vpdpwssd of the (m_2k, m_2k+1) pairs)
 *   iq4_xs sumi = sum_j sc_j * dot(level_j, y_j), the +128 out as q6_K's -32
 *
 * (integer sums: the grouping does not change them; every partial sum is
 * below 2^29 in magnitude) and then applies the float ops in the
 * reference's order, super-block by super-block:
 *
 *   q2/4/5  s += (d_y * d_w) * (float)sumi - (d_y * dmin_w) * (float)summ
 *   q3/6, iq4_xs  s += (d_y * d_w) * (float)sumi
 *
 * so every tile entry is bitwise tl_vec_dot_ref. The prepared activation
 * row is the q8_K row itself (its bsums serve both corrections). A group
 * with more tokens than TL_FUSED_TOKENS is transposed once for all its
 * tokens, 8-token micro-tiles reuse it; fewer tokens (decode) go row by
 * row with maddubs/madd, the transposition costing more than the rows'
 * bytes take to arrive (q6_K: 49152x2048 from DRAM, one token, 5.5 ms
 * against 7.5-8.9 transposed and 6.5 for the old row-dot kernel; q4_K and
 * q5_K four rows in step, rows_K, as q2_K, q3_K and iq4_xs). */
#include <stddef.h>

#include "quants_impl.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#include "gemm_q.h"

/* bmi2 (pdep, row_iq4xs): every VNNI CPU has it; dispatch.c checks it beside VNNI */
#define TN __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c,bmi2")))
#define AI __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 8")
#define UNROLL16 _Pragma("GCC unroll 16")

enum { K_4, K_5, K_6, K_3, K_2, K_X }; /* q4_K, q5_K (the q4_K layout in the workspace), q6_K, q3_K (q6_K's), q2_K, iq4_xs */
enum { GB_K4 = 82 * 64, GB_K6 = 89 * 64, GB_K2 = 90 * 64 }; /* workspace bytes per super-block of a group */
#define TL_FUSED_TOKENS 2
#define TOK_BLOCK 8
#define PF_AHEAD(roffs) (16 * (roffs)[1] + 2048)

static inline size_t gb_of(int kind) { return kind == K_2 ? GB_K2 : kind == K_6 || kind == K_3 ? GB_K6 : GB_K4; }
static inline size_t kbw_of(int kind) {
    return kind == K_4 ? sizeof(block_q4_K) : kind == K_5 ? sizeof(block_q5_K) : kind == K_6 ? sizeof(block_q6_K)
         : kind == K_3 ? sizeof(block_q3_K) : kind == K_2 ? sizeof(block_q2_K) : sizeof(block_iq4_xs);
}
/* 16 sub-blocks of 16 (q2_K, q3_K, q6_K), or 8 of 32 (q4_K, q5_K, iq4_xs) */
static inline int nsub_of(int kind) { return kind == K_4 || kind == K_5 || kind == K_X ? 8 : 16; }


/* 16 rows of 8 dwords -> q[j] lane r = dword j of row r (gemm_avx512.c's
 * transpose: rows r and r+8 share a zmm, then 32- and 64-bit unpacks and a
 * cross-lane permute). */
static inline AI TN void tr16x8(const __m256i v[16], __m512i q[8]) {
    __m512i z[8], t[8], u[8];
    UNROLL for (int r = 0; r < 8; r++) z[r] = _mm512_inserti64x4(_mm512_castsi256_si512(v[r]), v[r + 8], 1);
    UNROLL for (int r = 0; r < 8; r += 2) {
        t[r] = _mm512_unpacklo_epi32(z[r], z[r + 1]);
        t[r + 1] = _mm512_unpackhi_epi32(z[r], z[r + 1]);
    }
    UNROLL for (int h = 0; h < 8; h += 4) {
        u[h + 0] = _mm512_unpacklo_epi64(t[h + 0], t[h + 2]);
        u[h + 1] = _mm512_unpackhi_epi64(t[h + 0], t[h + 2]);
        u[h + 2] = _mm512_unpacklo_epi64(t[h + 1], t[h + 3]);
        u[h + 3] = _mm512_unpackhi_epi64(t[h + 1], t[h + 3]);
    }
    const __m512i lo = _mm512_set_epi64(13, 12, 5, 4, 9, 8, 1, 0), hi = _mm512_set_epi64(15, 14, 7, 6, 11, 10, 3, 2);
    UNROLL for (int j = 0; j < 4; j++) {
        q[j] = _mm512_permutex2var_epi64(u[j], lo, u[j + 4]);
        q[j + 4] = _mm512_permutex2var_epi64(u[j], hi, u[j + 4]);
    }
}

/* 32 bytes at offset off of each of the 16 rows' super-block, transposed. */
static inline AI TN void tr_bytes(const uint8_t *wb, const size_t *roffs, size_t off, __m512i q[8]) {
    __m256i v[16];
    UNROLL16 for (int r = 0; r < 16; r++) v[r] = _mm256_loadu_si256((const __m256i *)(wb + roffs[r] + off));
    tr16x8(v, q);
}

/* The 16 rows' fp16 words at offset off as floats. */
static inline AI TN __m512 gather_f16(const uint8_t *wb, const size_t *roffs, size_t off) {
    uint16_t h[16];
    UNROLL16 for (int r = 0; r < 16; r++) memcpy(&h[r], wb + roffs[r] + off, 2);
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h));
}

/* fill_sb for q2_K and q3_K: element 128c + 32j + p is bits 2j..2j+1 of
 * qs byte 32c + p, so the transposed chunk c gives zmm 32c + 8j + k by one
 * shift and mask (q3_K: bit 4c + j of hmask byte p moved to bit 2). */
static inline AI TN void fill_sb_q23(int kind, const uint8_t *wb, const size_t *roffs, __m512i *G) {
    const size_t qo = kind == K_2 ? offsetof(block_q2_K, qs) : offsetof(block_q3_K, qs);
    const __m512i m3 = _mm512_set1_epi8(3), m04 = _mm512_set1_epi8(4);
    __m512i hb[8];
    if (kind == K_3) tr_bytes(wb, roffs, offsetof(block_q3_K, hmask), hb);
    UNROLL for (int c = 0; c < 2; c++) {
        __m512i p[8];
        tr_bytes(wb, roffs, qo + 32 * c, p);
        UNROLL for (int j = 0; j < 4; j++) UNROLL for (int k = 0; k < 8; k++) {
            __m512i v = _mm512_and_si512(_mm512_srli_epi16(p[k], 2 * j), m3);
            if (kind == K_3) {
                const int b = 4 * c + j;
                const __m512i h = b >= 2 ? _mm512_srli_epi16(hb[k], b - 2) : _mm512_slli_epi16(hb[k], 2 - b);
                v = _mm512_or_si512(v, _mm512_and_si512(h, m04));
            }
            _mm512_store_si512(G + 32 * c + 8 * j + k, v);
        }
    }
    const __m512i ff = _mm512_set1_epi32(0xFF), lo16 = _mm512_set1_epi32(0xFFFF);
    __m512i h[8], sc[16];
    if (kind == K_2) {
        /* scales bytes 0..15: scale j = low nibble of byte j, min j the high */
        tr_bytes(wb, roffs, offsetof(block_q2_K, scales), h);
        const __m512i f = _mm512_set1_epi32(0xF);
        __m512i mn[16];
        UNROLL16 for (int j = 0; j < 16; j++) {
            sc[j] = _mm512_and_si512(_mm512_srli_epi32(h[j / 4], 8 * (j % 4)), f);
            mn[j] = _mm512_and_si512(_mm512_srli_epi32(h[j / 4], 8 * (j % 4) + 4), f);
            _mm512_store_si512(G + 64 + j, sc[j]);
        }
        UNROLL for (int k = 0; k < 8; k++) _mm512_store_si512(G + 80 + k, _mm512_or_si512(mn[2 * k], _mm512_slli_epi32(mn[2 * k + 1], 16)));
        _mm512_store_ps((float *)(G + 88), gather_f16(wb, roffs, offsetof(block_q2_K, d)));
        _mm512_store_ps((float *)(G + 89), gather_f16(wb, roffs, offsetof(block_q2_K, dmin)));
        return;
    }
    /* q3_K: bytes 76..107 transposed, h[5..7] = the 12 scale bytes as three
     * words per row; tl_q3_K_scales on all 16 rows at once */
    tr_bytes(wb, roffs, offsetof(block_q3_K, scales) - 20, h);
    const __m512i k2 = _mm512_set1_epi32(0x0f0f0f0f), k1 = _mm512_set1_epi32(0x03030303);
    const __m512i w0 = h[5], w1 = h[6], w2 = h[7];
    const __m512i a[4] = {
        _mm512_or_si512(_mm512_and_si512(w0, k2), _mm512_slli_epi32(_mm512_and_si512(w2, k1), 4)),
        _mm512_or_si512(_mm512_and_si512(w1, k2), _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(w2, 2), k1), 4)),
        _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(w0, 4), k2),
                        _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(w2, 4), k1), 4)),
        _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(w1, 4), k2),
                        _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(w2, 6), k1), 4)),
    };
    UNROLL16 for (int j = 0; j < 16; j++) {
        sc[j] = _mm512_sub_epi32(_mm512_and_si512(_mm512_srli_epi32(a[j / 4], 8 * (j % 4)), ff), _mm512_set1_epi32(32));
        _mm512_store_si512(G + 64 + j, sc[j]);
    }
    UNROLL for (int k = 0; k < 8; k++) {
        const __m512i x = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sc[2 * k], 2));
        const __m512i y = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sc[2 * k + 1], 2));
        _mm512_store_si512(G + 80 + k, _mm512_or_si512(_mm512_and_si512(x, lo16), _mm512_slli_epi32(y, 16)));
    }
    _mm512_store_ps((float *)(G + 88), gather_f16(wb, roffs, offsetof(block_q3_K, d)));
}

/* fill_sb for iq4_xs: sub-block j is 16 bytes of qs (low nibbles elements
 * 0..15, high 16..31, as iq4_nl's block), so chunk c of 32 bytes holds
 * sub-blocks 2c and 2c + 1; each nibble becomes its level + 128. */
static inline AI TN void fill_sb_iq4xs(const uint8_t *wb, const size_t *roffs, __m512i *G) {
    const __m512i m4 = _mm512_set1_epi8(0xF);
    const __m512i lut = tl_iq4nl_lut128();
    UNROLL for (int c = 0; c < 4; c++) {
        __m512i p[8];
        tr_bytes(wb, roffs, offsetof(block_iq4_xs, qs) + 32 * c, p);
        UNROLL for (int t = 0; t < 4; t++) {
            _mm512_store_si512(G + 16 * c + t, _mm512_shuffle_epi8(lut, _mm512_and_si512(p[t], m4)));
            _mm512_store_si512(G + 16 * c + 4 + t, _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(p[t], 4), m4)));
            _mm512_store_si512(G + 16 * c + 8 + t, _mm512_shuffle_epi8(lut, _mm512_and_si512(p[4 + t], m4)));
            _mm512_store_si512(G + 16 * c + 12 + t, _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(p[4 + t], 4), m4)));
        }
    }
    /* h[0] lane r = d | scales_h << 16, h[1] = scales_l: tl_iq4xs_scale on all rows */
    __m512i h[8];
    tr_bytes(wb, roffs, 0, h);
    const __m512i f = _mm512_set1_epi32(0xF), k3 = _mm512_set1_epi32(3), lo16 = _mm512_set1_epi32(0xFFFF);
    UNROLL for (int j = 0; j < 8; j++) {
        const __m512i lo = _mm512_and_si512(_mm512_srli_epi32(h[1], 4 * j), f);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi32(h[0], 16 + 2 * j), k3);
        const __m512i sc = _mm512_sub_epi32(_mm512_or_si512(lo, _mm512_slli_epi32(hi, 4)), _mm512_set1_epi32(32));
        const __m512i cw = _mm512_and_si512(_mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sc, 7)), lo16);
        _mm512_store_si512(G + 64 + j, sc);
        _mm512_store_si512(G + 72 + j, _mm512_or_si512(cw, _mm512_slli_epi32(cw, 16)));
    }
    _mm512_store_ps((float *)(G + 80), _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h[0])));
}

/* Super-block i of the group (row r at w + roffs[r]) into g (gb_of bytes). */
static inline AI TN void fill_sb(int kind, const uint8_t *w, const size_t *roffs, int64_t i, uint8_t *g) {
    const size_t bw = kbw_of(kind);
    const uint8_t *wb = w + (size_t)i * bw;
    __m512i *G = (__m512i *)g;
    /* the next group's rows into L2 linearly (see gemm_avx512.c) */
    const uint8_t *pf = w + PF_AHEAD(roffs) + (size_t)i * 16 * bw;
    for (size_t k = 0; k < 16 * bw; k += 64) _mm_prefetch((const char *)(pf + k), _MM_HINT_T1);
    const __m512i m4 = _mm512_set1_epi8(0xF), m30 = _mm512_set1_epi8(0x30);
    if (kind == K_2 || kind == K_3) {
        fill_sb_q23(kind, wb, roffs, G);
        return;
    }
    if (kind == K_X) {
        fill_sb_iq4xs(wb, roffs, G);
        return;
    }
    if (kind != K_6) {
        /* q5_K: qh byte l bit j = 5th bit of element l of sub-block j */
        __m512i qh[8];
        if (kind == K_5) tr_bytes(wb, roffs, offsetof(block_q5_K, qh), qh);
        const __m512i m10 = _mm512_set1_epi8(0x10);
        UNROLL for (int c = 0; c < 4; c++) {
            /* qs chunk c: low nibbles sub-block 2c, high nibbles 2c + 1 */
            __m512i p[8];
            tr_bytes(wb, roffs, (kind == K_5 ? offsetof(block_q5_K, qs) : offsetof(block_q4_K, qs)) + 32 * c, p);
            UNROLL for (int k = 0; k < 8; k++) {
                __m512i lo = _mm512_and_si512(p[k], m4), hi = _mm512_and_si512(_mm512_srli_epi16(p[k], 4), m4);
                if (kind == K_5) {
                    /* bit 2c (2c + 1) of each byte to bit 4 of the same byte */
                    const __m512i b0 = 2 * c <= 4 ? _mm512_slli_epi16(qh[k], 4 - 2 * c) : _mm512_srli_epi16(qh[k], 2 * c - 4);
                    const __m512i b1 = 2 * c + 1 <= 4 ? _mm512_slli_epi16(qh[k], 3 - 2 * c) : _mm512_srli_epi16(qh[k], 2 * c - 3);
                    lo = _mm512_or_si512(lo, _mm512_and_si512(b0, m10));
                    hi = _mm512_or_si512(hi, _mm512_and_si512(b1, m10));
                }
                _mm512_store_si512(G + 16 * c + k, lo);
                _mm512_store_si512(G + 16 * c + 8 + k, hi);
            }
        }
        /* d, dmin and the 12 scale bytes, transposed: h[0] lane r = row r's
         * d | dmin << 16, h[1..3] its scale words; then
         * tl_get_scale_min_k4 for all j, on all 16 rows at once (as 32-bit
         * words: w[0..1] bytes = scales 0..7, w[2..3] = mins 0..7) */
        __m512i h[8];
        tr_bytes(wb, roffs, 0, h);
        const __m512i k1 = _mm512_set1_epi32(0x3f3f3f3f), k2 = _mm512_set1_epi32(0x0f0f0f0f);
        const __m512i k3 = _mm512_set1_epi32(0x03030303), ff = _mm512_set1_epi32(0xFF);
        const __m512i u0 = h[1], u1 = h[2], u2 = h[3];
        const __m512i w[4] = {
            _mm512_and_si512(u0, k1),
            _mm512_or_si512(_mm512_and_si512(u2, k2), _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u0, 6), k3), 4)),
            _mm512_and_si512(u1, k1),
            _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u2, 4), k2),
                            _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u1, 6), k3), 4)),
        };
        UNROLL for (int j = 0; j < 8; j++) {
            const __m512i sc = _mm512_and_si512(_mm512_srli_epi32(w[j / 4], 8 * (j % 4)), ff);
            const __m512i mn = _mm512_and_si512(_mm512_srli_epi32(w[2 + j / 4], 8 * (j % 4)), ff);
            _mm512_store_si512(G + 64 + j, sc);
            _mm512_store_si512(G + 72 + j, _mm512_or_si512(mn, _mm512_slli_epi32(mn, 16)));
        }
        _mm512_store_ps((float *)(G + 80), _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h[0])));
        _mm512_store_ps((float *)(G + 81), _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(h[0], 16))));
        return;
    }
    UNROLL for (int h = 0; h < 2; h++) {
        /* elements 128h + 32qq + p: ql byte 64h + 32(qq & 1) + p (low
         * nibble for qq < 2), qh byte 32h + p bits 2qq, 2qq + 1 */
        __m512i l0[8], l1[8], hb[8];
        tr_bytes(wb, roffs, offsetof(block_q6_K, ql) + 64 * h, l0);
        tr_bytes(wb, roffs, offsetof(block_q6_K, ql) + 64 * h + 32, l1);
        tr_bytes(wb, roffs, offsetof(block_q6_K, qh) + 32 * h, hb);
        UNROLL for (int k = 0; k < 8; k++) {
            const __m512i a = _mm512_and_si512(l0[k], m4), b = _mm512_and_si512(l1[k], m4);
            const __m512i c = _mm512_and_si512(_mm512_srli_epi16(l0[k], 4), m4);
            const __m512i d = _mm512_and_si512(_mm512_srli_epi16(l1[k], 4), m4);
            _mm512_store_si512(G + 32 * h + k, _mm512_or_si512(a, _mm512_and_si512(_mm512_slli_epi16(hb[k], 4), m30)));
            _mm512_store_si512(G + 32 * h + 8 + k, _mm512_or_si512(b, _mm512_and_si512(_mm512_slli_epi16(hb[k], 2), m30)));
            _mm512_store_si512(G + 32 * h + 16 + k, _mm512_or_si512(c, _mm512_and_si512(hb[k], m30)));
            _mm512_store_si512(G + 32 * h + 24 + k, _mm512_or_si512(d, _mm512_and_si512(_mm512_srli_epi16(hb[k], 2), m30)));
        }
    }
    /* bytes 176..207 transposed: h[4..7] lane r = row r's 16 int8 scales */
    __m512i h[8];
    tr_bytes(wb, roffs, offsetof(block_q6_K, scales) - 16, h);
    __m512i sc[16];
    UNROLL16 for (int j = 0; j < 16; j++) {
        sc[j] = _mm512_srai_epi32(_mm512_slli_epi32(h[4 + j / 4], 24 - 8 * (j % 4)), 24);
        _mm512_store_si512(G + 64 + j, sc[j]);
    }
    const __m512i lo16 = _mm512_set1_epi32(0xFFFF);
    UNROLL for (int k = 0; k < 8; k++) {
        const __m512i a = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sc[2 * k], 5));
        const __m512i b = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sc[2 * k + 1], 5));
        _mm512_store_si512(G + 80 + k, _mm512_or_si512(_mm512_and_si512(a, lo16), _mm512_slli_epi32(b, 16)));
    }
    uint16_t dh[16];
    UNROLL16 for (int r = 0; r < 16; r++) memcpy(&dh[r], wb + roffs[r] + offsetof(block_q6_K, d), 2);
    _mm512_store_ps((float *)(G + 88), _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)dh)));
}

/* C tokens (prepared q8_K rows at x + c*ldx) against super-block i of a
 * group transposed at g: acc[c] += that super-block's term, lane r = row r. */
static inline AI TN void sb_dot(int kind, int C, const uint8_t *g, const uint8_t *x, size_t ldx, int64_t i,
                                __m512 acc[TOK_BLOCK]) {
    const __m512i *G = (const __m512i *)g;
    const block_q8_K *yb[TOK_BLOCK];
    UNROLL for (int c = 0; c < C; c++) yb[c] = (const block_q8_K *)(x + c * ldx) + i;
    const int nsub = nsub_of(kind), zps = 64 / nsub; /* sub-blocks, zmm per sub-block */
    __m512i sumi[TOK_BLOCK];
    UNROLL for (int c = 0; c < C; c++) sumi[c] = _mm512_setzero_si512();
    for (int j = 0; j < nsub; j++) {
        __m512i q[8], s[TOK_BLOCK];
        UNROLL for (int k = 0; k < zps; k++) q[k] = _mm512_load_si512(G + zps * j + k);
        UNROLL for (int c = 0; c < C; c++) s[c] = _mm512_setzero_si512();
        UNROLL for (int k = 0; k < zps; k++) UNROLL for (int c = 0; c < C; c++) {
            const __m512i y = _mm512_set1_epi32((int)ld32(yb[c]->qs + 4 * (zps * j + k)));
            s[c] = _mm512_dpbusd_epi32(s[c], q[k], y);
        }
        const __m512i sc = _mm512_load_si512(G + 64 + j);
        UNROLL for (int c = 0; c < C; c++) sumi[c] = _mm512_add_epi32(sumi[c], _mm512_mullo_epi32(s[c], sc));
    }
    if (kind != K_6 && kind != K_3 && kind != K_X) {
        /* q4_K/q5_K: (m_j, m_j) pairs, q2_K (m_2j, m_2j+1), against bsums 2j, 2j+1 */
        const int mo = kind == K_2 ? 80 : 72, dof = kind == K_2 ? 88 : 80;
        __m512i summ[TOK_BLOCK];
        UNROLL for (int c = 0; c < C; c++) summ[c] = _mm512_setzero_si512();
        UNROLL for (int j = 0; j < 8; j++) {
            const __m512i mn = _mm512_load_si512(G + mo + j);
            UNROLL for (int c = 0; c < C; c++)
                summ[c] = _mm512_dpwssd_epi32(summ[c], mn, _mm512_set1_epi32((int)ld32(yb[c]->bsums + 2 * j)));
        }
        const __m512 dw = _mm512_load_ps((const float *)(G + dof)), dm = _mm512_load_ps((const float *)(G + dof + 1));
        UNROLL for (int c = 0; c < C; c++) {
            const __m512 dy = _mm512_set1_ps(yb[c]->d);
            const __m512 t1 = _mm512_mul_ps(_mm512_mul_ps(dy, dw), _mm512_cvtepi32_ps(sumi[c]));
            const __m512 t2 = _mm512_mul_ps(_mm512_mul_ps(dy, dm), _mm512_cvtepi32_ps(summ[c]));
            acc[c] = _mm512_add_ps(acc[c], _mm512_sub_ps(t1, t2));
        }
        return;
    }
    /* the offset out through the bsums pairs (q6_K, q3_K after 16 scales, iq4_xs after 8) */
    const int co = kind == K_X ? 72 : 80;
    UNROLL for (int k = 0; k < 8; k++) {
        const __m512i cw = _mm512_load_si512(G + co + k);
        UNROLL for (int c = 0; c < C; c++)
            sumi[c] = _mm512_dpwssd_epi32(sumi[c], cw, _mm512_set1_epi32((int)ld32(yb[c]->bsums + 2 * k)));
    }
    const __m512 dw = _mm512_load_ps((const float *)(G + co + 8));
    UNROLL for (int c = 0; c < C; c++) {
        const __m512 dy = _mm512_set1_ps(yb[c]->d);
        acc[c] = _mm512_add_ps(acc[c], _mm512_mul_ps(_mm512_mul_ps(dy, dw), _mm512_cvtepi32_ps(sumi[c])));
    }
}

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
    } else { /* tl_q3_K_scales on 16 bytes from 94 (12 scale bytes at 2..13) */
        const __m128i v = _mm_loadu_si128((const __m128i *)(a + offsetof(block_q3_K, scales) - 2));
        const __m128i t = _mm_shuffle_epi8(v, _mm_set_epi8(9, 8, 7, 6, 5, 4, 3, 2, 9, 8, 7, 6, 5, 4, 3, 2));
        const __m128i lo = _mm_and_si128(_mm_blend_epi16(t, _mm_srli_epi16(t, 4), 0xF0), _mm_set1_epi8(0xF));
        const __m128i u = _mm_shuffle_epi8(v, _mm_set_epi8(13, 12, 11, 10, 13, 12, 11, 10, 13, 12, 11, 10, 13, 12, 11, 10));
        const __m128i hi = _mm_and_si128(_mm_srlv_epi32(u, _mm_set_epi32(6, 4, 2, 0)), _mm_set1_epi8(3));
        sc8 = _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), _mm_set1_epi8(32));
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
    const uint64_t ls = _pdep_u64(ld32(a + offsetof(block_iq4_xs, scales_l)), 0x0F0F0F0F0F0F0F0Full) |
                        _pdep_u64(ld16(a + offsetof(block_iq4_xs, scales_h)), 0x3030303030303030ull);
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
                    UNROLL for (int k = 0; k < 4; k++) d4 |= (uint64_t)ld16(row[k] + (size_t)i * bw + dof) << (16 * k);
                    s = _mm_add_ps(s, _mm_mul_ps(_mm_mul_ps(dy, _mm_cvtph_ps(_mm_cvtsi64_si128((long long)d4))), _mm_cvtepi32_ps(sumi)));
                    continue;
                }
                const __m256i wm = _mm256_hadd_epi32(_mm256_hadd_epi32(pm[0], pm[1]), _mm256_hadd_epi32(pm[2], pm[3]));
                const __m128i summ = _mm_add_epi32(_mm256_castsi256_si128(wm), _mm256_extracti128_si256(wm, 1));
                const uint64_t d01 = ld32(row[0] + (size_t)i * bw + dof) | (uint64_t)ld32(row[1] + (size_t)i * bw + dof) << 32;
                const uint64_t d23 = ld32(row[2] + (size_t)i * bw + dof) | (uint64_t)ld32(row[3] + (size_t)i * bw + dof) << 32;
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

/* C tokens against one 16-row group, transposed in the workspace wk. */
static inline AI TN void mk(int kind, int C, int64_t nb, const uint8_t *wk, const uint8_t *x, size_t ldx, float *out,
                            size_t ldo, __mmask16 m) {
    __m512 acc[TOK_BLOCK];
    UNROLL for (int c = 0; c < C; c++) acc[c] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i++) sb_dot(kind, C, wk + (size_t)i * gb_of(kind), x, ldx, i, acc);
    UNROLL for (int c = 0; c < C; c++) _mm512_mask_storeu_ps(out + c * ldo, m, acc[c]);
}

static inline AI TN void mk_any(int kind, int C, int64_t nb, const uint8_t *wk, const uint8_t *x, size_t ldx,
                                float *out, size_t ldo, __mmask16 m) {
    switch (C) {
#define MK_CASE(N) \
    case N: mk(kind, N, nb, wk, x, ldx, out, ldo, m); break;
        MK_CASE(1) MK_CASE(2) MK_CASE(3) MK_CASE(4) MK_CASE(5) MK_CASE(6) MK_CASE(7) MK_CASE(8)
#undef MK_CASE
    }
}

static inline AI TN void gemm_k(int kind, int64_t n, int nr, int nt, float *out, size_t ldo, const void *w, size_t ldw,
                                const void *x, size_t ldx, void *work) {
    const int64_t nb = n / QK_K;
    const uint8_t *W = w, *X = x;
    uint8_t *wk = work;
    if (nt <= TL_FUSED_TOKENS && kind == K_6) {
        if (nt == 1) rows_q6_K(1, nr, nb, W, ldw, X, ldx, out, ldo);
        else rows_q6_K(2, nr, nb, W, ldw, X, ldx, out, ldo);
        return;
    }
    if (nt <= TL_FUSED_TOKENS) {
        if (nt == 1) rows_K(kind, 1, nr, nb, W, ldw, X, ldx, out, ldo);
        else rows_K(kind, 2, nr, nb, W, ldw, X, ldx, out, ldo);
        return;
    }
    /* rows past nr repeat the last row (valid memory); their lanes are not stored */
    size_t roffs[16];
    for (int r = 0; r < 16; r++) roffs[r] = (size_t)(r < nr ? r : nr - 1) * ldw;
    const __mmask16 m = (__mmask16)((1u << nr) - 1);
    for (int64_t i = 0; i < nb; i++) fill_sb(kind, W, roffs, i, wk + (size_t)i * gb_of(kind));
    int t = 0;
    for (; t + TOK_BLOCK <= nt; t += TOK_BLOCK)
        mk(kind, TOK_BLOCK, nb, wk, X + (size_t)t * ldx, ldx, out + (size_t)t * ldo, ldo, m);
    if (t < nt) mk_any(kind, nt - t, nb, wk, X + (size_t)t * ldx, ldx, out + (size_t)t * ldo, ldo, m);
}

/* The table's entry points, one per type. */
#define GEMM_K(NAME, KIND)                                                                                       \
    static TN void NAME(int64_t n, int nr, int nt, float *out, size_t ldo, const void *w, size_t ldw, const void *x, \
                        size_t ldx, void *work) {                                                                 \
        gemm_k(KIND, n, nr, nt, out, ldo, w, ldw, x, ldx, work);                                                 \
    }
GEMM_K(gemm_q4_K, K_4)
GEMM_K(gemm_q5_K, K_5)
GEMM_K(gemm_q6_K, K_6)
GEMM_K(gemm_q3_K, K_3)
GEMM_K(gemm_q2_K, K_2)
GEMM_K(gemm_iq4_xs, K_X)
#undef GEMM_K

/* vec_dot for one row: the 1 x 1 tile, so both sum in the same order (one
 * token goes row by row: no workspace). Only tests and the vec_dot_tile
 * fallback call it; matmuls go through gemm. */
static TN void dot1_q4_K(int64_t n, float *out, const void *w, const void *x) {
    gemm_k(K_4, n, 1, 1, out, 1, w, 0, x, 0, NULL);
}
static TN void dot1_q5_K(int64_t n, float *out, const void *w, const void *x) {
    gemm_k(K_5, n, 1, 1, out, 1, w, 0, x, 0, NULL);
}
static TN void dot1_q6_K(int64_t n, float *out, const void *w, const void *x) {
    gemm_k(K_6, n, 1, 1, out, 1, w, 0, x, 0, NULL);
}

/* The prepared row is the q8_K row as tl_quantize_row makes it. */
static tl_quantize_fn quantize_q8_K_fn;
static void prepare_q8_K(const float *src, void *dst, int64_t n) { quantize_q8_K_fn(src, dst, n); }

void tl_gemm_k_fill_avx512(tl_kernel_table *t) {
    quantize_q8_K_fn = t->quantize_q8_K;
    t->vec_dot[TL_TYPE_Q4_K] = dot1_q4_K;
    t->vec_dot[TL_TYPE_Q5_K] = dot1_q5_K;
    t->vec_dot[TL_TYPE_Q6_K] = dot1_q6_K;
    /* the level's row-dot tiles sum in another order: tiles loop over vec_dot */
    t->vec_dot_tile[TL_TYPE_Q4_K] = NULL;
    t->vec_dot_tile[TL_TYPE_Q5_K] = NULL;
    t->vec_dot_tile[TL_TYPE_Q6_K] = NULL;
    t->gemm_tile[TL_TYPE_Q4_K] = gemm_q4_K;
    t->gemm_tile[TL_TYPE_Q5_K] = gemm_q5_K;
    t->gemm_tile[TL_TYPE_Q6_K] = gemm_q6_K;
    t->gemm_prepare[TL_TYPE_Q4_K] = prepare_q8_K;
    t->gemm_prepare[TL_TYPE_Q5_K] = prepare_q8_K;
    t->gemm_prepare[TL_TYPE_Q6_K] = prepare_q8_K;
    /* q2_K, q3_K: the GEMM sums as the reference vec_dot, which stays */
    t->gemm_tile[TL_TYPE_Q2_K] = gemm_q2_K;
    t->gemm_tile[TL_TYPE_Q3_K] = gemm_q3_K;
    t->gemm_prepare[TL_TYPE_Q2_K] = prepare_q8_K;
    t->gemm_prepare[TL_TYPE_Q3_K] = prepare_q8_K;
    t->gemm_tile[TL_TYPE_IQ4_XS] = gemm_iq4_xs;
    t->gemm_prepare[TL_TYPE_IQ4_XS] = prepare_q8_K;
}

#else
void tl_gemm_k_fill_avx512(tl_kernel_table *t) { (void)t; }
#endif

/* the largest workspace super-block, q2_K's (GB_K2) */
size_t tl_gemm_k_work_size(int64_t n) { return (size_t)(n / 256) * (90 * 64); }
