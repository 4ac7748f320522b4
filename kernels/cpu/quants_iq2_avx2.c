/* quants_iq2_avx2.c - iq2_xxs, iq2_xs and iq2_s (layouts: iq2_grids.h) at
 * the AVX2 level. Every output is bitwise the reference dot
 * (quants_iq2_ref.c): the same exact int32 sum per super-block, then
 * (d_w * d_y) * sum added in the same order, times 0.125f at the end.
 *
 * A sub-block of 32 is one vector. Decoding it is the costly part: its
 * four grid entries (8 magnitude bytes each) gathered by table loads, its
 * 32 sign bits made byte masks and put on by vpsignb (the mask bytes are
 * 0xFF or 0x01, never 0), the scale(s) 2s + 1 made int16. iq2_xxs and
 * iq2_xs keep their signs as 7-bit indices with an even-parity eighth
 * bit; those become sign words for a whole block at once by vector ops
 * (prep), where per-entry loads from a 128-entry sign table had been. Each activation then
 * costs vpsignb (the signed weights times sign(y)), vpmaddubsw with |y|
 * (unsigned: y = -128 is 128, where putting the sign on y would leave
 * -128), and vpmaddwd with the scales. Bounds: pairs |2 * 128 * 43| <
 * 2^15, scaled pairs below 2^20, a super-block's sum below 2^26.
 *
 * Micro-tiles (tile_iq2): 4 rows x 1 token, the four rows sharing each
 * activation load and their float ops running as the lanes of one vector,
 * each lane the one-row order (decode; the 1 x 1 tile is vec_dot); and 1
 * row x 8 tokens, one decode of the weights serving eight activations
 * (prefill), the tokens the lanes of two vectors. */
#include "iq2_grids.h"
#include "quants_iq.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#include "gemm_q.h"

#define T2 __attribute__((target("avx2,fma,f16c")))
#define AI __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 8")
#define UNROLL4 _Pragma("GCC unroll 4")

#include "avx2_bytes.h"

/* Four table entries, entry i0 in bytes 0..7. */
static inline AI T2 __m256i gather4(const uint64_t *tab, unsigned i0, unsigned i1, unsigned i2, unsigned i3) {
    return _mm256_set_epi64x((long long)tab[i3], (long long)tab[i2], (long long)tab[i1], (long long)tab[i0]);
}

/* iq2_xs / iq2_s: a block's 16 half-sub-block scales 2s + 1 as bytes (the
 * nibbles in element order), in both 128-bit lanes; made once per row and
 * block, then spread per sub-block by one vpshufb (half_scales). */
static inline AI T2 __m256i scale_bytes(const uint8_t *scales) {
    const __m128i b = _mm_loadl_epi64((const __m128i *)scales), m4 = _mm_set1_epi8(15);
    const __m128i s = _mm_unpacklo_epi8(_mm_and_si128(b, m4), _mm_and_si128(_mm_srli_epi16(b, 4), m4));
    return _mm256_broadcastsi128_si256(_mm_or_si128(_mm_add_epi8(s, s), _mm_set1_epi8(1)));
}

/* Sub-block ib's int16 scales: half 2ib's in the low lane, 2ib + 1's in the high. */
static inline AI T2 __m256i half_scales(__m256i sb, int ib) {
    const short lo = (short)(0x8000 | 2 * ib), hi = (short)(0x8000 | (2 * ib + 1)); /* byte, then a zero byte */
    return _mm256_shuffle_epi8(sb, _mm256_set_m128i(_mm_set1_epi16(hi), _mm_set1_epi16(lo)));
}

/* The four rows' block i (of bw bytes) fp16 d, which every iq2 block starts with, as floats. */
static inline AI T2 __m128 d4(const uint8_t *const row[4], int64_t i, size_t bw) {
    uint64_t d = 0;
    UNROLL4 for (int k = 0; k < 4; k++) {
        uint16_t h;
        memcpy(&h, row[k] + (size_t)i * bw, 2);
        d |= (uint64_t)h << (16 * k);
    }
    return _mm_cvtph_ps(_mm_cvtsi64_si128((long long)d));
}

enum { XXS, XS, S };

/* A decoded sub-block of one row: the 32 signed magnitudes and the int16 scales. */
typedef struct {
    __m256i q, sc;
} sub32;

/* What decode reads of a row's block besides its bytes, laid out once per
 * block by vector ops: iq2_xxs / iq2_xs's sign words (bit 8l + j: element
 * 8l + j of sub-block ib negative; the 7-bit indices with their parity
 * bits) and iq2_xxs's ls pairs. (iq2_xs's grid indices stay shifts of one
 * 64-bit load: laid out here too, as 16-bit words, decode ran 1.3x slower.) */
typedef struct {
    uint32_t sw[8], lw[8];
} iq2_prep;

static inline AI T2 void prep(int kind, const uint8_t *a, iq2_prep *p) {
    if (kind == S) return; /* its signs are explicit bits */
    const __m256i q0 = _mm256_loadu_si256((const __m256i *)(a + 2)), q1 = _mm256_loadu_si256((const __m256i *)(a + 34));
    if (kind == XXS) {
        /* each sub-block's second word: the odd dwords */
        const __m256i odd = _mm256_setr_epi32(1, 3, 5, 7, 1, 3, 5, 7);
        tl_iq_xxs_signs(_mm256_permute2x128_si256(_mm256_permutevar8x32_epi32(q0, odd),
                                                  _mm256_permutevar8x32_epi32(q1, odd), 0x20),
                        p->sw, p->lw);
    } else {
        /* iq2_xs's 16-bit words: grid index in bits 0..8, sign index above */
        const __m256i si = _mm256_packus_epi16(_mm256_srli_epi16(q0, 9), _mm256_srli_epi16(q1, 9));
        _mm256_storeu_si256((__m256i *)p->sw, tl_iq_parity7(_mm256_permute4x64_epi64(si, 0xD8)));
    }
}

/* Sub-block ib of block a (kind's layout); sb: the block's scale_bytes
 * (iq2_xs / iq2_s), p: its prep (iq2_xxs / iq2_xs). */
static inline AI T2 sub32 decode(int kind, const uint8_t *a, int ib, __m256i sb, const iq2_prep *p) {
    sub32 r;
    const __m256i one = _mm256_set1_epi8(1);
    if (kind == XXS) {
        const uint8_t *g = a + 2 + 8 * ib;
        const __m256i mags = gather4(tl_iq2xxs_grid, g[0], g[1], g[2], g[3]);
        r.q = _mm256_sign_epi8(mags, _mm256_or_si256(bit_masks32(p->sw[ib]), one));
        r.sc = _mm256_set1_epi32((int)p->lw[ib]);
    } else if (kind == XS) {
        const uint64_t q = tl_ld64(a + 2 + 8 * ib);
        const __m256i mags = gather4(tl_iq2xs_grid, q & 511, q >> 16 & 511, q >> 32 & 511, q >> 48 & 511);
        r.q = _mm256_sign_epi8(mags, _mm256_or_si256(bit_masks32(p->sw[ib]), one));
        r.sc = half_scales(sb, ib);
    } else {
        const uint32_t w = tl_ld32(a + offsetof(block_iq2_s, qs) + 4 * ib), h = a[offsetof(block_iq2_s, qh) + ib];
        const __m256i mags = gather4(tl_iq2s_grid, (w & 255) | (h << 8 & 0x300), (w >> 8 & 255) | (h << 6 & 0x300),
                                     (w >> 16 & 255) | (h << 4 & 0x300), (w >> 24) | (h << 2 & 0x300));
        const __m256i neg = bits32(a + offsetof(block_iq2_s, qs) + 32 + 4 * ib);
        r.q = _mm256_sign_epi8(mags, _mm256_or_si256(neg, one));
        r.sc = half_scales(sb, ib);
    }
    return r;
}

/* acc + the scaled products of a decoded sub-block with activation y (|y| in ay). */
static inline AI T2 __m256i madd32(__m256i acc, sub32 w, __m256i y, __m256i ay) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(ay, _mm256_sign_epi8(w.q, y)), w.sc));
}

/* R rows (R <= 4) x 1 token: lanes past R read row R - 1 (valid memory)
 * and are not stored. */
static inline AI T2 void mk_rows(int kind, int R, int pf, int64_t n, float *out, const uint8_t *w, size_t ldw,
                                 const uint8_t *x) {
    const size_t bw = kind == XXS ? sizeof(block_iq2_xxs) : kind == XS ? sizeof(block_iq2_xs) : sizeof(block_iq2_s);
    const size_t sof = kind == XS ? offsetof(block_iq2_xs, scales) : offsetof(block_iq2_s, scales);
    const block_q8_K *y = (const block_q8_K *)x;
    const uint8_t *row[4];
    UNROLL4 for (int k = 0; k < 4; k++) row[k] = w + (size_t)(k < R ? k : R - 1) * ldw;
    __m128 s = _mm_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        tl_prefetch_next_rows4(pf, w, ldw, i, bw);
        __m256i acc[4], sb[4];
        iq2_prep p[4];
        UNROLL4 for (int k = 0; k < 4; k++) {
            acc[k] = sb[k] = _mm256_setzero_si256();
            if (k >= R) continue;
            if (kind != XXS) sb[k] = scale_bytes(row[k] + (size_t)i * bw + sof);
            prep(kind, row[k] + (size_t)i * bw, &p[k]);
        }
        TL_IN_MEMORY(p);
        UNROLL for (int ib = 0; ib < 8; ib++) {
            const __m256i yv = _mm256_loadu_si256((const __m256i *)(y[i].qs + 32 * ib)), ay = _mm256_abs_epi8(yv);
            UNROLL4 for (int k = 0; k < R; k++)
                acc[k] = madd32(acc[k], decode(kind, row[k] + (size_t)i * bw, ib, sb[k], &p[k]), yv, ay);
        }
        /* acc += (d_w * d_y) * (float)sum */
        const __m128 dd = _mm_mul_ps(d4(row, i, bw), _mm_set1_ps(y[i].d));
        s = _mm_add_ps(s, _mm_mul_ps(dd, _mm_cvtepi32_ps(tl_hsum4_i32(acc))));
    }
    float o[4];
    _mm_storeu_ps(o, _mm_mul_ps(s, _mm_set1_ps(0.125f)));
    UNROLL4 for (int k = 0; k < R; k++) out[k] = o[k];
}

/* 1 row x 8 tokens (ldx apart; outputs ldo apart). */
static inline AI T2 void mk_tokens8(int kind, int64_t n, float *out, size_t ldo, const uint8_t *w, const uint8_t *x,
                                    size_t ldx) {
    const size_t bw = kind == XXS ? sizeof(block_iq2_xxs) : kind == XS ? sizeof(block_iq2_xs) : sizeof(block_iq2_s);
    const size_t sof = kind == XS ? offsetof(block_iq2_xs, scales) : offsetof(block_iq2_s, scales);
    __m128 s[2] = {_mm_setzero_ps(), _mm_setzero_ps()};
    for (int64_t i = 0; i < n / QK_K; i++) {
        const uint8_t *a = w + (size_t)i * bw;
        const block_q8_K *y[8];
        UNROLL for (int c = 0; c < 8; c++) y[c] = (const block_q8_K *)(x + (size_t)c * ldx) + i;
        const __m256i sb = kind == XXS ? _mm256_setzero_si256() : scale_bytes(a + sof);
        iq2_prep p;
        prep(kind, a, &p);
        TL_IN_MEMORY(&p);
        __m256i acc[8];
        UNROLL for (int c = 0; c < 8; c++) acc[c] = _mm256_setzero_si256();
        for (int ib = 0; ib < 8; ib++) {
            const sub32 d = decode(kind, a, ib, sb, &p);
            UNROLL for (int c = 0; c < 8; c++) {
                const __m256i yv = _mm256_loadu_si256((const __m256i *)(y[c]->qs + 32 * ib));
                acc[c] = madd32(acc[c], d, yv, _mm256_abs_epi8(yv));
            }
        }
        /* acc += (d_w * d_y) * (float)sum, the tokens in the lanes */
        uint16_t dh;
        memcpy(&dh, a, 2);
        const __m128 dw = _mm_cvtph_ps(_mm_set1_epi16((short)dh));
        UNROLL for (int g = 0; g < 2; g++) {
            const __m128 dy = _mm_setr_ps(y[4 * g]->d, y[4 * g + 1]->d, y[4 * g + 2]->d, y[4 * g + 3]->d);
            s[g] = _mm_add_ps(s[g], _mm_mul_ps(_mm_mul_ps(dw, dy), _mm_cvtepi32_ps(tl_hsum4_i32(acc + 4 * g))));
        }
    }
    UNROLL for (int g = 0; g < 2; g++) {
        float o[4];
        _mm_storeu_ps(o, _mm_mul_ps(s[g], _mm_set1_ps(0.125f)));
        UNROLL4 for (int c = 0; c < 4; c++) out[(size_t)(4 * g + c) * ldo] = o[c];
    }
}

/* The tile: tokens in groups of 8 row by row, the rest 4 rows at a time
 * (the first token of a row group prefetching the next), leftover rows one
 * at a time. */
static inline AI T2 void tile_iq2(int kind, int64_t n, int nr, int nt, float *out, size_t ldo, const void *w,
                                  size_t ldw, const void *x, size_t ldx) {
    const uint8_t *W = w, *X = x;
    int t0 = 0;
    for (; t0 + 8 <= nt; t0 += 8)
        for (int r = 0; r < nr; r++) mk_tokens8(kind, n, out + (size_t)t0 * ldo + r, ldo, W + (size_t)r * ldw, X + (size_t)t0 * ldx, ldx);
    int r = 0;
    for (; r + 4 <= nr; r += 4)
        for (int t = t0; t < nt; t++) mk_rows(kind, 4, t == t0, n, out + (size_t)t * ldo + r, W + (size_t)r * ldw, ldw, X + (size_t)t * ldx);
    for (; r < nr; r++)
        for (int t = t0; t < nt; t++) mk_rows(kind, 1, 0, n, out + (size_t)t * ldo + r, W + (size_t)r * ldw, ldw, X + (size_t)t * ldx);
}

#define TILE(SUF, KIND)                                                                                                  \
    static T2 void tile_##SUF(int64_t n, int nr, int nt, float *out, size_t ldo, const void *w, size_t ldw,           \
                              const void *x, size_t ldx) {                                                            \
        tile_iq2(KIND, n, nr, nt, out, ldo, w, ldw, x, ldx);                                                          \
    }                                                                                                                 \
    static T2 void dot_##SUF(int64_t n, float *out, const void *w, const void *x) { mk_rows(KIND, 1, 0, n, out, w, 0, x); }
TILE(iq2_xxs, XXS)
TILE(iq2_xs, XS)
TILE(iq2_s, S)

/* The i-quant GEMM's unpack (quants_iq.h: signed values in element order,
 * a scale per 16, d) of one block, through the tiles' decode: a fifth of
 * the scalar unpack's time, which the GEMM pays once a group and chunk. */
static inline AI T2 void unpack_iq2(int kind, const uint8_t *a, uint64_t v[32], int16_t ls[16], float *d) {
    const size_t sof = kind == XS ? offsetof(block_iq2_xs, scales) : offsetof(block_iq2_s, scales);
    const __m256i sb = kind == XXS ? _mm256_setzero_si256() : scale_bytes(a + sof);
    iq2_prep p;
    prep(kind, a, &p);
    TL_IN_MEMORY(&p);
    UNROLL for (int ib = 0; ib < 8; ib++) {
        const sub32 r = decode(kind, a, ib, sb, &p);
        _mm256_storeu_si256((__m256i *)(v + 4 * ib), r.q);
        ls[2 * ib] = (int16_t)_mm256_extract_epi16(r.sc, 0);
        ls[2 * ib + 1] = (int16_t)_mm256_extract_epi16(r.sc, 8);
    }
    uint16_t dh;
    memcpy(&dh, a, 2);
    *d = TL_F16(dh);
}
#define UNPACK(SUF, KIND)                                                                      \
    static T2 void unpack_##SUF(const uint8_t *a, uint64_t v[32], int16_t ls[16], float *d) { \
        unpack_iq2(KIND, a, v, ls, d);                                                         \
    }
UNPACK(iq2_xxs, XXS)
UNPACK(iq2_xs, XS)
UNPACK(iq2_s, S)
#undef UNPACK

tl_iq_unpack_fn tl_iq2_unpack_avx2(int type) {
    return type == TL_TYPE_IQ2_XXS ? unpack_iq2_xxs : type == TL_TYPE_IQ2_XS ? unpack_iq2_xs
         : type == TL_TYPE_IQ2_S   ? unpack_iq2_s   : NULL;
}

void tl_iq2_fill_avx2(tl_kernel_table *t) {
    t->vec_dot[TL_TYPE_IQ2_XXS] = dot_iq2_xxs;
    t->vec_dot_tile[TL_TYPE_IQ2_XXS] = tile_iq2_xxs;
    t->vec_dot[TL_TYPE_IQ2_XS] = dot_iq2_xs;
    t->vec_dot_tile[TL_TYPE_IQ2_XS] = tile_iq2_xs;
    t->vec_dot[TL_TYPE_IQ2_S] = dot_iq2_s;
    t->vec_dot_tile[TL_TYPE_IQ2_S] = tile_iq2_s;
}

#else
tl_iq_unpack_fn tl_iq2_unpack_avx2(int type) { (void)type; return NULL; }
void tl_iq2_fill_avx2(tl_kernel_table *t) { (void)t; }
#endif
