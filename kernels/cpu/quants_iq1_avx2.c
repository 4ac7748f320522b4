/* quants_iq1_avx2.c - iq1_s and iq1_m at the AVX2 level (the AVX-512
 * levels inherit them): 4 rows x 1 token micro-tiles (TILE_DRIVER_RC), the
 * 1 x 1 tile being vec_dot; prefill goes through the same tiles.
 *
 * The integers are quants_iq1_ref.c's, regrouped so vpmaddubsw can take
 * the grid unsigned: with lev = g + 1 in {0, 1, 2} (the grid's bytes as
 * stored), A = sum lev * q and B = sum q over an entry (or sub-block),
 *   ls * (8 * sum g q + delta * B) = 8 * ls * A + ls * (delta - 8) * B.
 * The first term: the 4 entries of 32 elements gathered by 4 table loads,
 * vpmaddubsw against the activation (|pairs| <= 2 * 2 * 128), vpmaddwd by
 * the scale; the second: one vpmaddwd per row of the per-row factors
 * ls * (delta - 8) against the activation sums, taken from q once per
 * super-block for the four rows (iq1_s: per 32 elements, iq1_m: per 8,
 * as the delta goes). Integer sums are exact (lanes below 2^21, totals
 * below 2^24), so any grouping gives the reference's sumi; the float ops
 * are its order per super-block: s += (d_y * d_w) * sumi, then s / 8.
 * Every output is bitwise tl_vec_dot_ref's, for any activation bytes
 * (-128 included; bsums are not read).
 *
 * The grid indices (8 + 3 bits) of all 32 entries are assembled with
 * vector ops and read back from the stack: no index can leave the grid.
 * The table loads bound the speed (about 21 ns a row's super-block here,
 * one Zen 3 core, both types; vpgatherqq instead ran 1.5x slower). */
#include <stddef.h>

#include "iq1_grids.h"
#include "quants_iq.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#include "gemm_q.h"

#define T2 __attribute__((target("avx2,fma,f16c")))
#define AI __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 8")

/* Per 32 activation bytes the 8 int32 lanes of their sums of 4. */
static inline AI T2 __m256i sums_of4(const int8_t *q) {
    const __m256i y = _mm256_loadu_si256((const __m256i *)q);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), y), _mm256_set1_epi16(1));
}

/* The 8 sums of 32 activation values of a super-block, as int16 (|B| <= 4096). */
static inline AI T2 __m128i sums32(const int8_t *q) {
    __m256i m[8];
    UNROLL for (int ib = 0; ib < 8; ib++) m[ib] = sums_of4(q + 32 * ib);
    const __m256i h0 = _mm256_hadd_epi32(_mm256_hadd_epi32(m[0], m[1]), _mm256_hadd_epi32(m[2], m[3]));
    const __m256i h1 = _mm256_hadd_epi32(_mm256_hadd_epi32(m[4], m[5]), _mm256_hadd_epi32(m[6], m[7]));
    const __m128i t0 = _mm_add_epi32(_mm256_castsi256_si128(h0), _mm256_extracti128_si256(h0, 1));
    const __m128i t1 = _mm_add_epi32(_mm256_castsi256_si128(h1), _mm256_extracti128_si256(h1, 1));
    return _mm_packs_epi32(t0, t1);
}

/* The 32 sums of 8 activation values, as int16 (|B| <= 1024), in the
 * order vpunpck{l,h}wd lays out per-16 scales (iq1m_factors): P holds
 * entries 0,1,4,5,8,9,12,13 (low lane) and 2,3,6,7,..,15 (high), Q the
 * same plus 16. hadd of two sub-blocks' sums of 4 gives (k, k+1, k+4,
 * k+5 | k+2, k+3, k+6, k+7) already. */
static inline AI T2 void sums8(const int8_t *q, __m256i *P, __m256i *Q) {
    __m256i m[8];
    UNROLL for (int ib = 0; ib < 8; ib++) m[ib] = sums_of4(q + 32 * ib);
    *P = _mm256_packs_epi32(_mm256_hadd_epi32(m[0], m[1]), _mm256_hadd_epi32(m[2], m[3]));
    *Q = _mm256_packs_epi32(_mm256_hadd_epi32(m[4], m[5]), _mm256_hadd_epi32(m[6], m[7]));
}

/* The vpshufb selector of 16-bit word k of each 128-bit lane. */
#define WORD(k) ((short)((2 * (k) + 1) << 8 | 2 * (k)))

/* 32 elements of grid levels: entries ix[0..3] (16-bit indices < 2048). */
static inline AI T2 __m256i grid4(const uint16_t *ix) {
    return _mm256_set_epi64x((long long)tl_iq1s_grid[ix[3]], (long long)tl_iq1s_grid[ix[2]],
                             (long long)tl_iq1s_grid[ix[1]], (long long)tl_iq1s_grid[ix[0]]);
}

/* sum over sub-blocks of scale * A: sub-block ib's levels against its 32
 * activation bytes, weighted per lane by word ib of ls's 128-bit lane
 * (iq1_s: ls_ib in both; iq1_m: ls_2ib in the low, ls_2ib+1 in the high). */
static inline AI T2 __m256i levels_x_scales(const uint16_t *ix, const int8_t *q, __m256i ls) {
    __m256i acc = _mm256_setzero_si256();
    UNROLL for (int ib = 0; ib < 8; ib++) {
        const __m256i y = _mm256_loadu_si256((const __m256i *)(q + 32 * ib));
        const __m256i sv = _mm256_shuffle_epi8(ls, _mm256_set1_epi16(WORD(ib)));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(grid4(ix + 4 * ib), y), sv));
    }
    return acc;
}

/* An iq1_s block's 32 grid indices: the qs byte and 3 bits of qh. */
static inline AI T2 void indices_iq1_s(const block_iq1_s *a, uint16_t ix[32]) {
    const __m128i qh = _mm_loadu_si128((const __m128i *)a->qh);
    const __m256i qhb = _mm256_broadcastsi128_si256(qh);
    /* word ib 4 times (entries 4ib..4ib+3), times 2^(13 - 3l) so field l
     * tops the word, then moved to bits 8..10 under the qs byte */
    const __m256i mul = _mm256_set1_epi64x(0x0010008004002000ll), m7 = _mm256_set1_epi16(0x700);
    UNROLL for (int h = 0; h < 2; h++) {
        const short w0 = WORD(4 * h), w1 = WORD(4 * h + 1), w2 = WORD(4 * h + 2), w3 = WORD(4 * h + 3);
        const __m256i w = _mm256_shuffle_epi8(qhb, _mm256_setr_epi16(w0, w0, w0, w0, w1, w1, w1, w1, w2, w2, w2, w2,
                                                                     w3, w3, w3, w3));
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(_mm256_mullo_epi16(w, mul), 5), m7);
        const __m256i lo = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(a->qs + 16 * h)));
        _mm256_store_si256((__m256i *)(ix + 16 * h), _mm256_or_si256(lo, hi));
    }
}

/* One iq1_s row's block: 8 * sum ls * A + sum ls * (delta - 8) * B32. */
static inline AI T2 __m256i row_iq1_s(const block_iq1_s *a, const int8_t *q, __m128i b32) {
    _Alignas(32) uint16_t ix[32];
    indices_iq1_s(a, ix);
    const __m128i qh = _mm_loadu_si128((const __m128i *)a->qh);
    const __m128i fl = _mm_and_si128(_mm_srli_epi16(qh, 12), _mm_set1_epi16(7));
    const __m128i ls = _mm_or_si128(_mm_slli_epi16(fl, 1), _mm_set1_epi16(1));
    const __m256i acc = levels_x_scales(ix, q, _mm256_broadcastsi128_si256(ls));
    /* delta - 8: -7, or -9 where bit 15 is set */
    const __m128i f = _mm_sub_epi16(_mm_set1_epi16(-7), _mm_slli_epi16(_mm_srli_epi16(qh, 15), 1));
    const __m128i corr = _mm_madd_epi16(_mm_mullo_epi16(ls, f), b32);
    return _mm256_add_epi32(_mm256_slli_epi32(acc, 3), _mm256_zextsi128_si256(corr));
}

/* An iq1_m block's ls * (delta - 8) per entry in sums8's P / Q order, from
 * the per-16 scales (ls_eo: even j in the low lane, odd j in the high) and
 * the delta bits (bit 3 / 7 of qh byte k / 2). */
static inline AI T2 __m256i iq1m_factors(__m256i ls_dup, __m256i qhb, int upper) {
    const char o = (char)(upper ? 8 : 0), z = (char)0x80;
#define W4(b) (char)(o + (b)), z, (char)(o + (b)), z
    const __m256i ctl = _mm256_setr_epi8(W4(0), W4(2), W4(4), W4(6), W4(1), W4(3), W4(5), W4(7));
#undef W4
    const __m256i bits = _mm256_and_si256(_mm256_shuffle_epi8(qhb, ctl), _mm256_set1_epi32(0x00800008));
    const __m256i clear = _mm256_cmpeq_epi16(bits, _mm256_setzero_si256());
    const __m256i f = _mm256_add_epi16(_mm256_and_si256(clear, _mm256_set1_epi16(2)), _mm256_set1_epi16(-9));
    return _mm256_mullo_epi16(ls_dup, f);
}

/* An iq1_m block's 32 grid indices: the qs byte and a nibble of qh. */
static inline AI T2 void indices_iq1_m(const block_iq1_m *a, uint16_t ix[32]) {
    const __m128i qh = _mm_loadu_si128((const __m128i *)a->qh), m7 = _mm_set1_epi8(7);
    /* entry k's 3 high bits: nibble k % 2 of qh byte k / 2 */
    const __m128i nl = _mm_and_si128(qh, m7), nh = _mm_and_si128(_mm_srli_epi16(qh, 4), m7);
    UNROLL for (int h = 0; h < 2; h++) {
        const __m128i hb = h ? _mm_unpackhi_epi8(nl, nh) : _mm_unpacklo_epi8(nl, nh);
        const __m128i qs = _mm_loadu_si128((const __m128i *)(a->qs + 16 * h));
        _mm_store_si128((__m128i *)(ix + 16 * h), _mm_unpacklo_epi8(qs, hb));
        _mm_store_si128((__m128i *)(ix + 16 * h + 8), _mm_unpackhi_epi8(qs, hb));
    }
}

/* One iq1_m row's block: 8 * sum ls * A + sum ls * (delta - 8) * B8. */
static inline AI T2 __m256i row_iq1_m(const block_iq1_m *a, const int8_t *q, __m256i bP, __m256i bQ) {
    _Alignas(32) uint16_t ix[32];
    indices_iq1_m(a, ix);
    const __m128i qh = _mm_loadu_si128((const __m128i *)a->qh);
    /* the 16 scales: words twice each, field 0/2 (low lane) or 1/3 (high)
     * of each word moved to the top by a multiply, then 2 * f + 1 */
    long long wd;
    memcpy(&wd, a->scales, 8);
    const __m128i w = _mm_cvtsi64_si128(wd);
    const __m256i wb = _mm256_broadcastsi128_si256(_mm_unpacklo_epi16(w, w));
    const __m256i mul = _mm256_setr_epi16(8192, 128, 8192, 128, 8192, 128, 8192, 128,  /* fields 0, 2 */
                                          1024, 16, 1024, 16, 1024, 16, 1024, 16); /* fields 1, 3 */
    const __m256i fld = _mm256_srli_epi16(_mm256_mullo_epi16(wb, mul), 13);
    const __m256i ls_eo = _mm256_or_si256(_mm256_slli_epi16(fld, 1), _mm256_set1_epi16(1));
    const __m256i acc = levels_x_scales(ix, q, ls_eo);
    const __m256i qhb = _mm256_broadcastsi128_si256(qh);
    const __m256i cP = iq1m_factors(_mm256_unpacklo_epi16(ls_eo, ls_eo), qhb, 0);
    const __m256i cQ = iq1m_factors(_mm256_unpackhi_epi16(ls_eo, ls_eo), qhb, 1);
    const __m256i corr = _mm256_add_epi32(_mm256_madd_epi16(cP, bP), _mm256_madd_epi16(cQ, bQ));
    return _mm256_add_epi32(_mm256_slli_epi32(acc, 3), corr);
}

/* R rows (R <= 4) x C tokens; lanes past R read row R - 1 and are not
 * stored. m: 0 iq1_s, 1 iq1_m. */
static inline AI T2 void mk_iq1(int m, int R, int C, int pf, int64_t n, float *out, size_t ldo, const uint8_t *w,
                                size_t ldw, const uint8_t *x, size_t ldx) {
    const size_t bw = m ? sizeof(block_iq1_m) : sizeof(block_iq1_s);
    const uint8_t *row[4];
    for (int k = 0; k < 4; k++) row[k] = w + (size_t)(k < R ? k : R - 1) * ldw;
    for (int c = 0; c < C; c++) {
        const block_q8_K *y = (const block_q8_K *)(x + (size_t)c * ldx);
        __m128 s = _mm_setzero_ps();
        for (int64_t i = 0; i < n / QK_K; i++) {
            tl_prefetch_next_rows4(pf && c == 0, w, ldw, i, bw);
            const int8_t *q = y[i].qs;
            __m256i acc[4], bP = _mm256_setzero_si256(), bQ = bP;
            __m128i b32 = _mm_setzero_si128();
            if (m) sums8(q, &bP, &bQ);
            else b32 = sums32(q);
            uint64_t d4 = 0;
            for (int k = 0; k < 4; k++) {
                const uint8_t *a = row[k] + (size_t)i * bw;
                const uint16_t dh = m ? tl_iq1_m_d((const block_iq1_m *)a) : ((const block_iq1_s *)a)->d;
                d4 |= (uint64_t)dh << (16 * k);
                acc[k] = k >= R ? _mm256_setzero_si256()
                         : m    ? row_iq1_m((const block_iq1_m *)a, q, bP, bQ)
                                : row_iq1_s((const block_iq1_s *)a, q, b32);
            }
            /* s += (d_y * d_w) * sumi */
            const __m128 dw = _mm_cvtph_ps(_mm_cvtsi64_si128((long long)d4));
            s = _mm_add_ps(s, _mm_mul_ps(_mm_mul_ps(_mm_set1_ps(y[i].d), dw), _mm_cvtepi32_ps(tl_hsum4_i32(acc))));
        }
        float o[4];
        _mm_storeu_ps(o, _mm_mul_ps(s, _mm_set1_ps(0.125f)));
        for (int k = 0; k < R; k++) out[(size_t)c * ldo + k] = o[k];
    }
}

#define MK_IQ1_S(R, C, ...) mk_iq1(0, R, C, __VA_ARGS__)
#define MK_IQ1_M(R, C, ...) mk_iq1(1, R, C, __VA_ARGS__)
TILE_DRIVER_RC(tile_iq1_s, T2, MK_IQ1_S, 4, 1)
TILE_DRIVER_RC(tile_iq1_m, T2, MK_IQ1_M, 4, 1)

/* The i-quant GEMM's unpack (quants_iq.h): values in eighths, 8 * lev +
 * (delta - 8) byte by byte (lev <= 2, so no byte carries), from the
 * tiles' vector indices; delta per 32 (iq1_s) or per entry (iq1_m). */
static inline AI T2 void unpack_iq1(int m, const uint8_t *blk, uint64_t v[32], int16_t ls[16], float *d) {
    _Alignas(32) uint16_t ix[32];
    const block_iq1_s *s = (const block_iq1_s *)blk;
    const block_iq1_m *b = (const block_iq1_m *)blk;
    if (m) indices_iq1_m(b, ix);
    else indices_iq1_s(s, ix);
    UNROLL for (int ib = 0; ib < 8; ib++) {
        __m256i dv;
        if (m) {
            long long e[4];
            UNROLL for (int l = 0; l < 4; l++)
                e[l] = (long long)(0x0101010101010101ull * (uint8_t)(tl_iq1_m_delta(b, 4 * ib + l) - 8));
            dv = _mm256_setr_epi64x(e[0], e[1], e[2], e[3]);
        } else {
            dv = _mm256_set1_epi8((char)(tl_iq1_s_delta(s, ib) - 8));
        }
        _mm256_storeu_si256((__m256i *)(v + 4 * ib), _mm256_add_epi8(_mm256_slli_epi16(grid4(ix + 4 * ib), 3), dv));
    }
    for (int j = 0; j < 16; j++) ls[j] = (int16_t)(m ? tl_iq1_m_ls(b, j) : tl_iq1_s_ls(s, j / 2));
    *d = TL_F16(m ? tl_iq1_m_d(b) : s->d);
}
static T2 void unpack_iq1_s(const uint8_t *a, uint64_t v[32], int16_t ls[16], float *d) { unpack_iq1(0, a, v, ls, d); }
static T2 void unpack_iq1_m(const uint8_t *a, uint64_t v[32], int16_t ls[16], float *d) { unpack_iq1(1, a, v, ls, d); }

tl_iq_unpack_fn tl_iq1_unpack_avx2(int type) {
    return type == TL_TYPE_IQ1_S ? unpack_iq1_s : type == TL_TYPE_IQ1_M ? unpack_iq1_m : NULL;
}

void tl_iq1_fill_avx2(tl_kernel_table *t) {
    t->vec_dot[TL_TYPE_IQ1_S] = tile_iq1_s_1;
    t->vec_dot_tile[TL_TYPE_IQ1_S] = tile_iq1_s;
    t->vec_dot[TL_TYPE_IQ1_M] = tile_iq1_m_1;
    t->vec_dot_tile[TL_TYPE_IQ1_M] = tile_iq1_m;
}

#else
tl_iq_unpack_fn tl_iq1_unpack_avx2(int type) { (void)type; return NULL; }
void tl_iq1_fill_avx2(tl_kernel_table *t) { (void)t; }
#endif
