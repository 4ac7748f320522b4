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
 * row (rows_k_avx512.h), the transposition costing more than the rows'
 * bytes take to arrive. */
#include <stddef.h>

#include "quants_impl.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#include "gemm_q.h"

#include "gemm_k_avx512.h"
#include "rows_k_avx512.h"

enum { GB_K4 = 82 * 64, GB_K6 = 89 * 64, GB_K2 = 90 * 64 }; /* workspace bytes per super-block of a group */
#define TOK_BLOCK 8
#define PF_AHEAD(roffs) (16 * (roffs)[1] + 2048)

static inline size_t gb_of(int kind) { return kind == K_2 ? GB_K2 : kind == K_6 || kind == K_3 ? GB_K6 : GB_K4; }
/* 16 sub-blocks of 16 (q2_K, q3_K, q6_K), or 8 of 32 (q4_K, q5_K, iq4_xs) */
static inline int nsub_of(int kind) { return kind == K_4 || kind == K_5 || kind == K_X ? 8 : 16; }


/* 32 bytes at offset off of each of the 16 rows' super-block, transposed. */
static inline AI TN void tr_bytes(const uint8_t *wb, const size_t *roffs, size_t off, __m512i q[8]) {
    __m256i v[16];
    UNROLL16 for (int r = 0; r < 16; r++) v[r] = _mm256_loadu_si256((const __m256i *)(wb + roffs[r] + off));
    tl_tr16x8(v, q);
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
            const __m512i y = _mm512_set1_epi32((int)tl_ld32(yb[c]->qs + 4 * (zps * j + k)));
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
                summ[c] = _mm512_dpwssd_epi32(summ[c], mn, _mm512_set1_epi32((int)tl_ld32(yb[c]->bsums + 2 * j)));
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
            sumi[c] = _mm512_dpwssd_epi32(sumi[c], cw, _mm512_set1_epi32((int)tl_ld32(yb[c]->bsums + 2 * k)));
    }
    const __m512 dw = _mm512_load_ps((const float *)(G + co + 8));
    UNROLL for (int c = 0; c < C; c++) {
        const __m512 dy = _mm512_set1_ps(yb[c]->d);
        acc[c] = _mm512_add_ps(acc[c], _mm512_mul_ps(_mm512_mul_ps(dy, dw), _mm512_cvtepi32_ps(sumi[c])));
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
    if (nt <= TL_FUSED_TOKENS && kind == K_6) { /* decode: row by row, rows_k_avx512.h */
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
