/* gemm_k_avx2.c - q2_K..q6_K and iq4_xs weights x q8_K activations with AVX2, 8
 * weight rows at a time: gemm_k_avx512.c's scheme (read its header first)
 * with ymm lanes and without VNNI.
 *
 * An 8-row group's super-block i is unpacked and transposed into the
 * workspace once per matmul (lane r of every ymm belongs to row r):
 *
 *   q[z], z = 0..63:  lane r = elements 4z..4z+3 of row r, unsigned
 *                     (q4_K: the nibble; q5_K: 0..31; q6_K: 0..63, not
 *                     yet less 32; q3_K: 0..7, not yet less 4; q2_K: 0..3)
 *   q4_K, q5_K (82):  sc[8] int16 pairs (sc_j, sc_j) | mn[8] pairs
 *                     (m_j, m_j) | d | dmin
 *   q6_K, q3_K (89):  sc[16] int16 pairs (sc_j, sc_j) | cw[8] pairs
 *                     (-32 sc_2k, -32 sc_2k+1), q3_K's with -4 | d
 *   q2_K (90):        sc[16] pairs | mn[8] pairs (m_2k, m_2k+1) | d | dmin
 *   iq4_xs (73):      q: the signed level (iq4_nl's, by vpshufb); sc[8]
 *                     pairs | d
 *
 * vpmaddubsw takes the weights as the unsigned operand (iq4_xs: their
 * magnitudes, the sign moved onto the activation: q8_0's sign trick) and 4
 * activation bytes broadcast as the signed one. Its int16 pairs are at most 2 * 15 *
 * 128 (q4_K), 2 * 31 * 128 (q5_K), 2 * 63 * 128 (q6_K), 2 * 7 * 128
 * (q3_K), so a sub-block's 8, 4, 2 or 4 k-steps add up in int16 without
 * saturating (30720, 31744, 32256, 7168), and one vpmaddwd by the (sc, sc)
 * pair widens and scales them at once:
 *
 *   q4_K, q5_K  sumi = sum_j sc_j * dot(q_j, y_j)        (q5_K: per half)
 *               summ = sum_j m_j * (bsums_2j + bsums_2j+1)
 *   q6_K, q3_K  sumi = sum_j sc_j * dot(q_j, y_j) + sum_j (-32 sc_j) bsums_j
 *                      (q3_K: -4)
 *   q2_K        sumi as q3_K's without the offset, summ = sum_j m_j bsums_j
 *   iq4_xs      sumi = sum_j sc_j * dot(level_j, y_j): each k-step's pairs
 *               (up to 2 * 127 * 127) widened by their own vpmaddwd
 *
 * Integer sums, so the grouping does not change them; then the float ops in
 * the reference's order (quants_ref.c), super-block by super-block:
 *
 *   q2/4/5  s += (d_y * d_w) * (float)sumi - (d_y * dmin_w) * (float)summ
 *   q3/6, iq4_xs  s += (d_y * d_w) * (float)sumi
 *
 * so every entry is bitwise tl_vec_dot_ref, whatever the token count. A
 * group with more tokens than TL_AVX2_FUSED_TOKENS is transposed once for all
 * its tokens (n = 2048: 23 KiB of workspace, in L1), 4-token micro-tiles reuse
 * it; fewer tokens (decode) read the 8 rows in place, each row's partial
 * sums folded into one ymm of 8 row sums by a vphaddd tree (q2_K, q3_K,
 * iq4_xs: quants_extra_avx2.c's 4-row tiles, as before their GEMM). One thread,
 * 110M-shaped files, prefill(256) tok/s before -> after this GEMM: q2_K
 * 375 -> 868, q3_K 280 -> 850, iq4_xs 297 -> 512-583; 8-sequence batched
 * decode 1.0x -> 1.4-2.0x one sequence. */
#include "quants_impl.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <stddef.h>

#define T2 __attribute__((target("avx2,fma,f16c")))
#define AI __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 8")
#define UNROLL16 _Pragma("GCC unroll 16")
/* q4_K/q5_K/iq4_xs k-steps unrolled by 2: fully unrolled, GCC issued every
 * broadcast early and spilled the int16 sums (one thread, 110M-shaped
 * prefill(512): q4_K 610-629 -> 749-765 tok/s, q5_K 633-660 -> 640-690;
 * iq4_xs 517-572 -> 551-590; two passes of 4 unrolled steps did not help) */
#define K_UNROLL _Pragma("GCC unroll 2")
/* q6_K decode one row at a time: unrolled, GCC hoists the 8 rows' scale
 * vectors and spills them (measured 0.75-0.8 of the speed) */
#define NO_UNROLL _Pragma("GCC unroll 1")
#include "avx2_bytes.h"
#include "gemm_q.h"

enum { K4, K5, K6, K3, K2, KX }; /* q3_K: q6_K's workspace layout; KX: iq4_xs */
enum { GB_K45 = 82 * 32, GB_K6 = 89 * 32, GB_K2 = 90 * 32, GB_KX = 73 * 32 }; /* workspace bytes per super-block */
#define TOK_BLOCK 4    /* tokens per micro-tile */

static inline size_t kbw(int kind) {
    return kind == K4 ? sizeof(block_q4_K) : kind == K5 ? sizeof(block_q5_K) : kind == K6 ? sizeof(block_q6_K)
         : kind == K3 ? sizeof(block_q3_K) : kind == K2 ? sizeof(block_q2_K) : sizeof(block_iq4_xs);
}
static inline size_t gb_of(int kind) {
    return kind == K2 ? GB_K2 : kind == K6 || kind == K3 ? GB_K6 : kind == KX ? GB_KX : GB_K45;
}
/* a min per sub-block, taken out by dmin (else one super-block scale d only) */
static inline int has_min(int kind) { return kind == K4 || kind == K5 || kind == K2; }

/* 32 bytes at offset off of each of the 8 rows' super-block, transposed. */
static inline AI T2 void tr_bytes(const uint8_t *wb, const size_t *roffs, size_t off, __m256i q[8]) {
    __m256i z[8];
    UNROLL for (int r = 0; r < 8; r++) z[r] = _mm256_loadu_si256((const __m256i *)(wb + roffs[r] + off));
    tl_tr8x8(z, q);
}

/* Lane by lane, int32 a and b (|a|, |b| < 2^15) as the int16 pair (a, b):
 * the vpmaddwd operand of a sub-block's scale. */
static inline AI T2 __m256i pair16_ab(__m256i a, __m256i b) {
    return _mm256_or_si256(_mm256_and_si256(a, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(b, 16));
}
static inline AI T2 __m256i pair16(__m256i v) { return pair16_ab(v, v); }

/* fill_sb for q2_K and q3_K: element 128c + 32j + p is bits 2j..2j+1 of
 * qs byte 32c + p, so the transposed chunk c gives ymm 32c + 8j + k by one
 * shift and mask (q3_K: bit 4c + j of hmask byte p moved to bit 2). */
static inline AI T2 void fill_sb_q23(int kind, const uint8_t *wb, const size_t *roffs, __m256i *G) {
    const size_t qo = kind == K2 ? offsetof(block_q2_K, qs) : offsetof(block_q3_K, qs);
    const __m256i m3 = _mm256_set1_epi8(3), m04 = _mm256_set1_epi8(4);
    __m256i hb[8];
    if (kind == K3) tr_bytes(wb, roffs, offsetof(block_q3_K, hmask), hb);
    UNROLL for (int c = 0; c < 2; c++) {
        __m256i p[8];
        tr_bytes(wb, roffs, qo + 32 * c, p);
        UNROLL for (int j = 0; j < 4; j++) UNROLL for (int k = 0; k < 8; k++) {
            __m256i v = _mm256_and_si256(_mm256_srli_epi16(p[k], 2 * j), m3);
            if (kind == K3) {
                const int b = 4 * c + j;
                const __m256i h = b >= 2 ? _mm256_srli_epi16(hb[k], b - 2) : _mm256_slli_epi16(hb[k], 2 - b);
                v = _mm256_or_si256(v, _mm256_and_si256(h, m04));
            }
            _mm256_store_si256(G + 32 * c + 8 * j + k, v);
        }
    }
    const __m256i ff = _mm256_set1_epi32(0xFF);
    __m256i h[8], sc[16];
    if (kind == K2) {
        /* scales bytes 0..15: scale j = low nibble of byte j, min j the high */
        tr_bytes(wb, roffs, offsetof(block_q2_K, scales), h);
        const __m256i f = _mm256_set1_epi32(0xF);
        __m256i mn[16];
        UNROLL16 for (int j = 0; j < 16; j++) {
            sc[j] = _mm256_and_si256(_mm256_srli_epi32(h[j / 4], 8 * (j % 4)), f);
            mn[j] = _mm256_and_si256(_mm256_srli_epi32(h[j / 4], 8 * (j % 4) + 4), f);
            _mm256_store_si256(G + 64 + j, pair16(sc[j]));
        }
        UNROLL for (int k = 0; k < 8; k++) _mm256_store_si256(G + 80 + k, pair16_ab(mn[2 * k], mn[2 * k + 1]));
        _mm256_store_ps((float *)(G + 88), tl_row_f16x8(wb + offsetof(block_q2_K, d), roffs));
        _mm256_store_ps((float *)(G + 89), tl_row_f16x8(wb + offsetof(block_q2_K, dmin), roffs));
        return;
    }
    /* q3_K: bytes 76..107 transposed, h[5..7] = the 12 scale bytes as three
     * words per row; tl_q3_K_scales on the 8 rows at once */
    tr_bytes(wb, roffs, offsetof(block_q3_K, scales) - 20, h);
    const __m256i k2 = _mm256_set1_epi32(0x0f0f0f0f), k1 = _mm256_set1_epi32(0x03030303);
    const __m256i w0 = h[5], w1 = h[6], w2 = h[7];
    const __m256i a[4] = {
        _mm256_or_si256(_mm256_and_si256(w0, k2), _mm256_slli_epi32(_mm256_and_si256(w2, k1), 4)),
        _mm256_or_si256(_mm256_and_si256(w1, k2), _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(w2, 2), k1), 4)),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(w0, 4), k2),
                        _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(w2, 4), k1), 4)),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(w1, 4), k2),
                        _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(w2, 6), k1), 4)),
    };
    UNROLL16 for (int j = 0; j < 16; j++) {
        sc[j] = _mm256_sub_epi32(_mm256_and_si256(_mm256_srli_epi32(a[j / 4], 8 * (j % 4)), ff), _mm256_set1_epi32(32));
        _mm256_store_si256(G + 64 + j, pair16(sc[j]));
    }
    UNROLL for (int k = 0; k < 8; k++)
        _mm256_store_si256(G + 80 + k, pair16_ab(_mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(sc[2 * k], 2)),
                                                 _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(sc[2 * k + 1], 2))));
    _mm256_store_ps((float *)(G + 88), tl_row_f16x8(wb + offsetof(block_q3_K, d), roffs));
}

/* fill_sb for iq4_xs: sub-block j is 16 bytes of qs (low nibbles elements
 * 0..15, high 16..31, as iq4_nl's block), so chunk c of 32 bytes holds
 * sub-blocks 2c and 2c + 1; each nibble becomes its signed level (the
 * sign trick's operand: levels and q8_K bytes are within +-127). */
static inline AI T2 void fill_sb_iq4xs(const uint8_t *wb, const size_t *roffs, __m256i *G) {
    const __m256i m4 = _mm256_set1_epi8(0xF), lut = tl_iq4nl_lut256();
    UNROLL for (int c = 0; c < 4; c++) {
        __m256i p[8];
        tr_bytes(wb, roffs, offsetof(block_iq4_xs, qs) + 32 * c, p);
        UNROLL for (int t = 0; t < 4; t++) {
            _mm256_store_si256(G + 16 * c + t, _mm256_shuffle_epi8(lut, _mm256_and_si256(p[t], m4)));
            _mm256_store_si256(G + 16 * c + 4 + t, _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(p[t], 4), m4)));
            _mm256_store_si256(G + 16 * c + 8 + t, _mm256_shuffle_epi8(lut, _mm256_and_si256(p[4 + t], m4)));
            _mm256_store_si256(G + 16 * c + 12 + t, _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(p[4 + t], 4), m4)));
        }
    }
    /* h[0] lane r = d | scales_h << 16, h[1] = scales_l: tl_iq4xs_scale on the 8 rows */
    __m256i h[8];
    tr_bytes(wb, roffs, 0, h);
    const __m256i f = _mm256_set1_epi32(0xF), k3 = _mm256_set1_epi32(3);
    UNROLL for (int j = 0; j < 8; j++) {
        const __m256i lo = _mm256_and_si256(_mm256_srli_epi32(h[1], 4 * j), f);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi32(h[0], 16 + 2 * j), k3);
        _mm256_store_si256(G + 64 + j, pair16(_mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), _mm256_set1_epi32(32))));
    }
    _mm256_store_ps((float *)(G + 72), tl_row_f16x8(wb + offsetof(block_iq4_xs, d), roffs));
}

/* Super-block i of the group (row r at w + roffs[r]) into g (gb_of bytes). */
static inline AI T2 void fill_sb(int kind, const uint8_t *w, const size_t *roffs, int64_t i, uint8_t *g) {
    const size_t bw = kbw(kind);
    const uint8_t *wb = w + (size_t)i * bw;
    __m256i *G = (__m256i *)g;
    if (kind == K2 || kind == K3) {
        fill_sb_q23(kind, wb, roffs, G);
        return;
    }
    if (kind == KX) {
        fill_sb_iq4xs(wb, roffs, G);
        return;
    }
    const __m256i m4 = _mm256_set1_epi8(0xF), m30 = _mm256_set1_epi8(0x30);
    if (kind != K6) {
        /* q5_K: qh byte l bit j = 5th bit of element l of sub-block j */
        __m256i qh[8];
        if (kind == K5) tr_bytes(wb, roffs, offsetof(block_q5_K, qh), qh);
        const __m256i m10 = _mm256_set1_epi8(0x10);
        UNROLL for (int c = 0; c < 4; c++) {
            /* qs chunk c: low nibbles sub-block 2c, high nibbles 2c + 1 */
            __m256i p[8];
            tr_bytes(wb, roffs, (kind == K5 ? offsetof(block_q5_K, qs) : offsetof(block_q4_K, qs)) + 32 * c, p);
            UNROLL for (int k = 0; k < 8; k++) {
                __m256i lo = _mm256_and_si256(p[k], m4), hi = _mm256_and_si256(_mm256_srli_epi16(p[k], 4), m4);
                if (kind == K5) {
                    /* bit 2c (2c + 1) of each byte to bit 4 of the same byte */
                    const __m256i b0 = 2 * c <= 4 ? _mm256_slli_epi16(qh[k], 4 - 2 * c) : _mm256_srli_epi16(qh[k], 2 * c - 4);
                    const __m256i b1 = 2 * c + 1 <= 4 ? _mm256_slli_epi16(qh[k], 3 - 2 * c) : _mm256_srli_epi16(qh[k], 2 * c - 3);
                    lo = _mm256_or_si256(lo, _mm256_and_si256(b0, m10));
                    hi = _mm256_or_si256(hi, _mm256_and_si256(b1, m10));
                }
                _mm256_store_si256(G + 16 * c + k, lo);
                _mm256_store_si256(G + 16 * c + 8 + k, hi);
            }
        }
        /* bytes 0..31 transposed: h[0] lane r = row r's d | dmin << 16,
         * h[1..3] its scale words; tl_get_scale_min_k4 for all j on the 8
         * rows at once (w[0..1] bytes = scales 0..7, w[2..3] = mins 0..7) */
        __m256i h[8];
        tr_bytes(wb, roffs, 0, h);
        const __m256i k1 = _mm256_set1_epi32(0x3f3f3f3f), k2 = _mm256_set1_epi32(0x0f0f0f0f);
        const __m256i k3 = _mm256_set1_epi32(0x03030303), ff = _mm256_set1_epi32(0xFF);
        const __m256i u0 = h[1], u1 = h[2], u2 = h[3];
        const __m256i w[4] = {
            _mm256_and_si256(u0, k1),
            _mm256_or_si256(_mm256_and_si256(u2, k2), _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u0, 6), k3), 4)),
            _mm256_and_si256(u1, k1),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u2, 4), k2),
                            _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u1, 6), k3), 4)),
        };
        UNROLL for (int j = 0; j < 8; j++) {
            const __m256i sc = _mm256_and_si256(_mm256_srli_epi32(w[j / 4], 8 * (j % 4)), ff);
            const __m256i mn = _mm256_and_si256(_mm256_srli_epi32(w[2 + j / 4], 8 * (j % 4)), ff);
            _mm256_store_si256(G + 64 + j, pair16(sc));
            _mm256_store_si256(G + 72 + j, pair16(mn));
        }
        /* the d and dmin halves packed (qwords 0 2 1 3 after packus) */
        const __m256i dd = _mm256_permute4x64_epi64(
            _mm256_packus_epi32(_mm256_and_si256(h[0], _mm256_set1_epi32(0xFFFF)), _mm256_srli_epi32(h[0], 16)), 0xD8);
        _mm256_store_ps((float *)(G + 80), _mm256_cvtph_ps(_mm256_castsi256_si128(dd)));
        _mm256_store_ps((float *)(G + 81), _mm256_cvtph_ps(_mm256_extracti128_si256(dd, 1)));
        return;
    }
    UNROLL for (int h = 0; h < 2; h++) {
        /* elements 128h + 32qq + p: ql byte 64h + 32(qq & 1) + p (low
         * nibble for qq < 2), qh byte 32h + p bits 2qq, 2qq + 1 */
        __m256i l0[8], l1[8], hb[8];
        tr_bytes(wb, roffs, offsetof(block_q6_K, ql) + 64 * h, l0);
        tr_bytes(wb, roffs, offsetof(block_q6_K, ql) + 64 * h + 32, l1);
        tr_bytes(wb, roffs, offsetof(block_q6_K, qh) + 32 * h, hb);
        UNROLL for (int k = 0; k < 8; k++) {
            const __m256i a = _mm256_and_si256(l0[k], m4), b = _mm256_and_si256(l1[k], m4);
            const __m256i c = _mm256_and_si256(_mm256_srli_epi16(l0[k], 4), m4);
            const __m256i d = _mm256_and_si256(_mm256_srli_epi16(l1[k], 4), m4);
            _mm256_store_si256(G + 32 * h + k, _mm256_or_si256(a, _mm256_and_si256(_mm256_slli_epi16(hb[k], 4), m30)));
            _mm256_store_si256(G + 32 * h + 8 + k, _mm256_or_si256(b, _mm256_and_si256(_mm256_slli_epi16(hb[k], 2), m30)));
            _mm256_store_si256(G + 32 * h + 16 + k, _mm256_or_si256(c, _mm256_and_si256(hb[k], m30)));
            _mm256_store_si256(G + 32 * h + 24 + k, _mm256_or_si256(d, _mm256_and_si256(_mm256_srli_epi16(hb[k], 2), m30)));
        }
    }
    /* bytes 176..207 transposed: h[4..7] lane r = row r's 16 int8 scales */
    __m256i h[8];
    tr_bytes(wb, roffs, offsetof(block_q6_K, scales) - 16, h);
    __m256i sc[16];
    UNROLL16 for (int j = 0; j < 16; j++) {
        sc[j] = _mm256_srai_epi32(_mm256_slli_epi32(h[4 + j / 4], 24 - 8 * (j % 4)), 24);
        _mm256_store_si256(G + 64 + j, pair16(sc[j]));
    }
    UNROLL for (int k = 0; k < 8; k++)
        _mm256_store_si256(G + 80 + k, pair16_ab(_mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(sc[2 * k], 5)),
                                                 _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(sc[2 * k + 1], 5))));
    _mm256_store_ps((float *)(G + 88), tl_row_f16x8(wb + offsetof(block_q6_K, d), roffs));
}

/* A super-block's term in the reference's float order, lane by lane
 * (quants_ref.c): acc + (d_y * d_w) * sumi, less (d_y * dmin_w) * summ for
 * q4_K/q5_K. The GEMM's micro-tiles and the decode rows both add through it. */
static inline AI T2 __m256 sb_term(int kind, __m256 acc, __m256 dy, __m256 dw, __m256 dm, __m256i sumi, __m256i summ) {
    const __m256 t1 = _mm256_mul_ps(_mm256_mul_ps(dy, dw), _mm256_cvtepi32_ps(sumi));
    if (!has_min(kind)) return _mm256_add_ps(acc, t1);
    return _mm256_add_ps(acc, _mm256_sub_ps(t1, _mm256_mul_ps(_mm256_mul_ps(dy, dm), _mm256_cvtepi32_ps(summ))));
}

static inline AI T2 __m256i bcast32(const void *p) { return _mm256_set1_epi32((int)tl_ld32(p)); }

/* C tokens (prepared q8_K rows at x + c*ldx) against super-block i of a
 * group transposed at g: acc[c] += that super-block's term, lane r = row r. */
static inline AI T2 void sb_dot(int kind, int C, const uint8_t *g, const uint8_t *x, size_t ldx, int64_t i,
                                __m256 acc[TOK_BLOCK]) {
    const __m256i *G = (const __m256i *)g;
    const block_q8_K *yb[TOK_BLOCK];
    UNROLL for (int c = 0; c < C; c++) yb[c] = (const block_q8_K *)(x + c * ldx) + i;
    __m256i sumi[TOK_BLOCK];
    UNROLL for (int c = 0; c < C; c++) sumi[c] = _mm256_setzero_si256();
    if (kind == KX) {
        /* the sign trick: |level| unsigned, the activation byte signed by
         * the level; a k-step's pairs reach 2 * 127 * 127, so each widens
         * and scales at once in vpmaddwd by the sub-block's (sc, sc) */
        for (int j = 0; j < 8; j++) {
            const __m256i sc = _mm256_load_si256(G + 64 + j);
            K_UNROLL for (int k = 0; k < 8; k++) {
                const __m256i q = _mm256_load_si256(G + 8 * j + k), aq = _mm256_abs_epi8(q);
                UNROLL for (int c = 0; c < C; c++) {
                    const __m256i p = _mm256_maddubs_epi16(aq, _mm256_sign_epi8(bcast32(yb[c]->qs + 32 * j + 4 * k), q));
                    sumi[c] = _mm256_add_epi32(sumi[c], _mm256_madd_epi16(p, sc));
                }
            }
        }
        const __m256 dw = _mm256_load_ps((const float *)(G + 72));
        UNROLL for (int c = 0; c < C; c++)
            acc[c] = sb_term(kind, acc[c], _mm256_set1_ps(yb[c]->d), dw, dw, sumi[c], sumi[c]);
        return;
    }
    if (kind == K6 || kind == K3 || kind == K2) {
        for (int j = 0; j < 16; j++) {
            const __m256i sc = _mm256_load_si256(G + 64 + j);
            __m256i q[4];
            UNROLL for (int k = 0; k < 4; k++) q[k] = _mm256_load_si256(G + 4 * j + k);
            UNROLL for (int c = 0; c < C; c++) {
                const int8_t *y = yb[c]->qs + 16 * j;
                const __m256i ha = _mm256_add_epi16(_mm256_maddubs_epi16(q[0], bcast32(y)), _mm256_maddubs_epi16(q[1], bcast32(y + 4)));
                const __m256i hb = _mm256_add_epi16(_mm256_maddubs_epi16(q[2], bcast32(y + 8)), _mm256_maddubs_epi16(q[3], bcast32(y + 12)));
                /* q2_K, q3_K: all 4 k-steps in int16 (at most 4 * 2 * 7 * 128) */
                const __m256i p = kind == K6 ? _mm256_add_epi32(_mm256_madd_epi16(ha, sc), _mm256_madd_epi16(hb, sc))
                                             : _mm256_madd_epi16(_mm256_add_epi16(ha, hb), sc);
                sumi[c] = _mm256_add_epi32(sumi[c], p);
            }
        }
        /* the offset's (-32 sc, -32 sc) or (-4 sc, -4 sc) pairs into sumi,
         * or q2_K's (m_2k, m_2k+1) into summ, against bsums 2k, 2k+1 */
        __m256i summ[TOK_BLOCK];
        UNROLL for (int c = 0; c < C; c++) summ[c] = _mm256_setzero_si256();
        UNROLL for (int k = 0; k < 8; k++) {
            const __m256i cw = _mm256_load_si256(G + 80 + k);
            UNROLL for (int c = 0; c < C; c++) {
                const __m256i p = _mm256_madd_epi16(cw, bcast32(yb[c]->bsums + 2 * k));
                if (kind == K2) summ[c] = _mm256_add_epi32(summ[c], p);
                else sumi[c] = _mm256_add_epi32(sumi[c], p);
            }
        }
        const __m256 dw = _mm256_load_ps((const float *)(G + 88));
        const __m256 dm = kind == K2 ? _mm256_load_ps((const float *)(G + 89)) : dw;
        UNROLL for (int c = 0; c < C; c++)
            acc[c] = sb_term(kind, acc[c], _mm256_set1_ps(yb[c]->d), dw, dm, sumi[c], summ[c]);
        return;
    }
    /* q4_K: a sub-block's 8 k-steps in int16; q5_K: two halves of 4 */
    const int half = kind == K5 ? 4 : 8;
    for (int j = 0; j < 8; j++) {
        const __m256i sc = _mm256_load_si256(G + 64 + j);
        for (int k0 = 0; k0 < 8; k0 += half) {
            __m256i h[TOK_BLOCK];
            UNROLL for (int c = 0; c < C; c++) h[c] = _mm256_setzero_si256();
            K_UNROLL for (int k = k0; k < k0 + half; k++) {
                const __m256i q = _mm256_load_si256(G + 8 * j + k);
                UNROLL for (int c = 0; c < C; c++)
                    h[c] = _mm256_add_epi16(h[c], _mm256_maddubs_epi16(q, bcast32(yb[c]->qs + 32 * j + 4 * k)));
            }
            UNROLL for (int c = 0; c < C; c++) sumi[c] = _mm256_add_epi32(sumi[c], _mm256_madd_epi16(h[c], sc));
        }
    }
    __m256i summ[TOK_BLOCK];
    UNROLL for (int c = 0; c < C; c++) summ[c] = _mm256_setzero_si256();
    UNROLL for (int j = 0; j < 8; j++) {
        const __m256i mn = _mm256_load_si256(G + 72 + j);
        UNROLL for (int c = 0; c < C; c++) summ[c] = _mm256_add_epi32(summ[c], _mm256_madd_epi16(mn, bcast32(yb[c]->bsums + 2 * j)));
    }
    const __m256 dw = _mm256_load_ps((const float *)(G + 80)), dm = _mm256_load_ps((const float *)(G + 81));
    UNROLL for (int c = 0; c < C; c++) acc[c] = sb_term(kind, acc[c], _mm256_set1_ps(yb[c]->d), dw, dm, sumi[c], summ[c]);
}

/* C tokens against one 8-row group, transposed in the workspace wk. */
static inline AI T2 void mk(int kind, int C, int64_t nb, const uint8_t *wk, const uint8_t *x, size_t ldx, float *out,
                            size_t ldo, int nr) {
    __m256 acc[TOK_BLOCK];
    UNROLL for (int c = 0; c < C; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) sb_dot(kind, C, wk + (size_t)i * gb_of(kind), x, ldx, i, acc);
    UNROLL for (int c = 0; c < C; c++) tl_store_rows8(out + c * ldo, acc[c], nr);
}

static inline AI T2 void mk_any(int kind, int C, int64_t nb, const uint8_t *wk, const uint8_t *x, size_t ldx,
                                float *out, size_t ldo, int nr) {
    switch (C) {
    case 1: mk(kind, 1, nb, wk, x, ldx, out, ldo, nr); break;
    case 2: mk(kind, 2, nb, wk, x, ldx, out, ldo, nr); break;
    case 3: mk(kind, 3, nb, wk, x, ldx, out, ldo, nr); break;
    case 4: mk(kind, 4, nb, wk, x, ldx, out, ldo, nr); break;
    }
}

/* ------------------------------------------- decode: rows read in place */

/* Shuffle that broadcasts int16 #i of a 128-bit lane to the whole lane. */
static inline AI T2 __m256i scale_shuffle16(int i) { return _mm256_set1_epi16((short)((2 * i) | ((2 * i + 1) << 8))); }

/* One q4_K/q5_K row's super-block a against one token yb: *ps gets int32
 * partials of its sumi, *pm of its summ (the lanes add up to them). */
static inline AI T2 void row_q45(int kind, const uint8_t *a, const block_q8_K *yb, __m256i *ps, __m256i *pm) {
    const __m256i m4 = _mm256_set1_epi8(0xF), x10 = _mm256_set1_epi8(0x10);
    const uint8_t *q = a + (kind == K5 ? offsetof(block_q5_K, qs) : offsetof(block_q4_K, qs));
    uint32_t u[4];
    tl_unpack_k4_scales(a + offsetof(block_q4_K, scales), u);
    const __m256i ms = _mm256_cvtepu8_epi16(_mm_set_epi32((int)u[3], (int)u[2], (int)u[1], (int)u[0]));
    const __m128i ysum = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)yb->bsums), _mm_loadu_si128((const __m128i *)yb->bsums + 1));
    *pm = _mm256_set_m128i(_mm_setzero_si128(), _mm_madd_epi16(_mm256_extracti128_si256(ms, 1), ysum));
    const __m128i sc128 = _mm256_castsi256_si128(ms);
    const __m256i sc = _mm256_inserti128_si256(_mm256_castsi128_si256(sc128), sc128, 1);
    const __m256i hbits = kind == K5 ? _mm256_loadu_si256((const __m256i *)(a + offsetof(block_q5_K, qh))) : _mm256_setzero_si256();
    __m256i s = _mm256_setzero_si256();
    UNROLL for (int j = 0; j < 4; j++) {
        const __m256i bits = _mm256_loadu_si256((const __m256i *)(q + 32 * j));
        __m256i ql = _mm256_and_si256(bits, m4), qhh = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
        if (kind == K5) {
            const __m256i m0 = _mm256_set1_epi8((char)(1 << (2 * j))), m1 = _mm256_set1_epi8((char)(2 << (2 * j)));
            ql = _mm256_or_si256(ql, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hbits, m0), m0), x10));
            qhh = _mm256_or_si256(qhh, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hbits, m1), m1), x10));
        }
        const int8_t *y = yb->qs + 64 * j;
        const __m256i p0 = _mm256_maddubs_epi16(ql, _mm256_loadu_si256((const __m256i *)y));
        const __m256i p1 = _mm256_maddubs_epi16(qhh, _mm256_loadu_si256((const __m256i *)(y + 32)));
        s = _mm256_add_epi32(s, _mm256_add_epi32(_mm256_madd_epi16(_mm256_shuffle_epi8(sc, scale_shuffle16(2 * j)), p0),
                                                 _mm256_madd_epi16(_mm256_shuffle_epi8(sc, scale_shuffle16(2 * j + 1)), p1)));
    }
    *ps = s;
}

/* One q6_K row's super-block against one token: int32 partials of its
 * sumi, the -32 offset taken out with the bsums. */
static inline AI T2 __m256i row_q6(const block_q6_K *a, const block_q8_K *yb) {
    const __m256i m4 = _mm256_set1_epi8(0xF), m2 = _mm256_set1_epi8(3);
    const __m128i sc8 = _mm_loadu_si128((const __m128i *)a->scales);
    const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
    const __m256i off = _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)yb->bsums));
    __m256i s = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(off, 5));
    /* scales 8j..8j+7 in both lanes (the permute's immediate a constant
     * at every optimization level) */
    const __m256i half_scales[2] = {_mm256_permute4x64_epi64(sc16, 0x44), _mm256_permute4x64_epi64(sc16, 0xEE)};
    const uint8_t *ql = a->ql, *qh = a->qh;
    UNROLL for (int j = 0; j < 2; j++, ql += 64, qh += 32) {
        const __m256i hb = _mm256_loadu_si256((const __m256i *)qh);
        const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql), l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
        __m256i q[4];
        q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(hb, m2), 4));
        q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), m2), 4));
        q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), m2), 4));
        q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), m2), 4));
        const __m256i scj = half_scales[j];
        UNROLL for (int k = 0; k < 4; k++) {
            /* int16 scales 8j+2k (low lane) and 8j+2k+1 (high lane) */
            const __m256i scv = _mm256_shuffle_epi8(scj, _mm256_set_m128i(_mm_set1_epi16((short)(((4 * k + 3) << 8) | (4 * k + 2))),
                                                                          _mm_set1_epi16((short)(((4 * k + 1) << 8) | (4 * k)))));
            const __m256i p = _mm256_maddubs_epi16(q[k], _mm256_loadu_si256((const __m256i *)(yb->qs + 128 * j + 32 * k)));
            s = _mm256_add_epi32(s, _mm256_madd_epi16(scv, p));
        }
    }
    return s;
}

/* One token y against 8 rows read in place; the rows' sums folded by
 * tl_sum8_epi32, then the reference's float ops on the 8 lanes. */
static inline AI T2 void rows(int kind, int64_t nb, const uint8_t *w, const size_t *roffs, const block_q8_K *y,
                              float *out, int nr, int pf) {
    const size_t bw = kbw(kind);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *wb = w + (size_t)i * bw;
        if (pf) tl_prefetch_next_group8(w, roffs, i, bw);
        const __m256 dy = _mm256_set1_ps(y[i].d);
        __m256i ps[8], pm[8];
        if (kind == K6) {
            NO_UNROLL for (int r = 0; r < 8; r++) ps[r] = row_q6((const block_q6_K *)(wb + roffs[r]), y + i);
            const __m256 dw = tl_row_f16x8(wb + offsetof(block_q6_K, d), roffs);
            const __m256i sumi = tl_sum8_epi32(ps);
            acc = sb_term(kind, acc, dy, dw, dw, sumi, sumi);
            continue;
        }
        UNROLL for (int r = 0; r < 8; r++) row_q45(kind, wb + roffs[r], y + i, &ps[r], &pm[r]);
        acc = sb_term(kind, acc, dy, tl_row_f16x8(wb, roffs), tl_row_f16x8(wb + 2, roffs), tl_sum8_epi32(ps), tl_sum8_epi32(pm));
    }
    tl_store_rows8(out, acc, nr);
}

/* q2_K, q3_K and iq4_xs decode: quants_extra_avx2.c's row tiles, which
 * read the prepared q8_K rows as they are and sum as the reference does */
static tl_vec_dot_tile_fn rows_q2_K, rows_q3_K, rows_iq4_xs;

static inline AI T2 void gemm_k(int kind, int64_t n, int nr, int nt, float *out, size_t ldo, const void *w, size_t ldw,
                                const void *x, size_t ldx, void *work) {
    const int64_t nb = n / QK_K;
    const uint8_t *X = x;
    if ((kind == K2 || kind == K3 || kind == KX) && nt <= TL_AVX2_FUSED_TOKENS) {
        (kind == K2 ? rows_q2_K : kind == K3 ? rows_q3_K : rows_iq4_xs)(n, nr, nt, out, ldo, w, ldw, x, ldx);
        return;
    }
    size_t roffs[8];
    for (int r0 = 0; r0 < nr; r0 += 8) {
        const uint8_t *W = (const uint8_t *)w + (size_t)r0 * ldw;
        const int g = tl_group_rows8(r0, nr, ldw, roffs);
        if (nt <= TL_AVX2_FUSED_TOKENS) {
            for (int t = 0; t < nt; t++)
                rows(kind, nb, W, roffs, (const block_q8_K *)(X + (size_t)t * ldx), out + (size_t)t * ldo + r0, g, t == 0);
            continue;
        }
        uint8_t *wk = work;
        for (int64_t i = 0; i < nb; i++) fill_sb(kind, W, roffs, i, wk + (size_t)i * gb_of(kind));
        int t = 0;
        for (; t + TOK_BLOCK <= nt; t += TOK_BLOCK)
            mk(kind, TOK_BLOCK, nb, wk, X + (size_t)t * ldx, ldx, out + (size_t)t * ldo + r0, ldo, g);
        if (t < nt) mk_any(kind, nt - t, nb, wk, X + (size_t)t * ldx, ldx, out + (size_t)t * ldo + r0, ldo, g);
    }
}

/* The table's entry points, one per type: the GEMM, and for q4_K..q6_K
 * vec_dot as its 1 x 1 case (one token reads the row in place: no
 * workspace). */
#define GEMM_K(SUF, KIND)                                                                                           \
    static T2 void gemm_##SUF(int64_t n, int nr, int nt, float *out, size_t ldo, const void *w, size_t ldw,        \
                              const void *x, size_t ldx, void *work) {                                            \
        gemm_k(KIND, n, nr, nt, out, ldo, w, ldw, x, ldx, work);                                                    \
    }
#define DOT1(SUF, KIND)                                                                                             \
    static T2 void dot1_##SUF(int64_t n, float *out, const void *w, const void *x) {                               \
        gemm_k(KIND, n, 1, 1, out, 1, w, 0, x, 0, NULL);                                                            \
    }
GEMM_K(q4_K, K4)
GEMM_K(q5_K, K5)
GEMM_K(q6_K, K6)
GEMM_K(q3_K, K3)
GEMM_K(q2_K, K2)
GEMM_K(iq4_xs, KX)
DOT1(q4_K, K4)
DOT1(q5_K, K5)
DOT1(q6_K, K6)
#undef GEMM_K
#undef DOT1

/* The prepared row is the q8_K row as tl_quantize_row makes it. */
static tl_quantize_fn quantize_q8_K_fn;
static void prepare_q8_K(const float *src, void *dst, int64_t n) { quantize_q8_K_fn(src, dst, n); }

void tl_gemm_k_fill_avx2(tl_kernel_table *t) {
    quantize_q8_K_fn = t->quantize_q8_K;
    /* q2_K, q3_K, iq4_xs decode on the level's tiles (quants_extra_avx2.c,
     * filled before), which sum as the GEMM does and stay */
    rows_q2_K = t->vec_dot_tile[TL_TYPE_Q2_K];
    rows_q3_K = t->vec_dot_tile[TL_TYPE_Q3_K];
    rows_iq4_xs = t->vec_dot_tile[TL_TYPE_IQ4_XS];
#define FILL(TYPE, SUF)              \
    t->gemm_tile[TYPE] = gemm_##SUF; \
    t->gemm_prepare[TYPE] = prepare_q8_K;
    FILL(TL_TYPE_Q4_K, q4_K)
    FILL(TL_TYPE_Q5_K, q5_K)
    FILL(TL_TYPE_Q6_K, q6_K)
    FILL(TL_TYPE_Q3_K, q3_K)
    FILL(TL_TYPE_Q2_K, q2_K)
    FILL(TL_TYPE_IQ4_XS, iq4_xs)
#undef FILL
    /* q4_K..q6_K: vec_dot is the GEMM's 1 x 1 case, and the tiles loop over it */
    t->vec_dot[TL_TYPE_Q4_K] = dot1_q4_K;
    t->vec_dot[TL_TYPE_Q5_K] = dot1_q5_K;
    t->vec_dot[TL_TYPE_Q6_K] = dot1_q6_K;
    t->vec_dot_tile[TL_TYPE_Q4_K] = t->vec_dot_tile[TL_TYPE_Q5_K] = t->vec_dot_tile[TL_TYPE_Q6_K] = NULL;
}

#else
void tl_gemm_k_fill_avx2(tl_kernel_table *t) { (void)t; }
#endif
