/* gemm_iq_avx2.c - the i-quants on grids (iq2_xxs/xs/s, iq3_xxs/s,
 * iq1_s/m) x q8_K activations with AVX2, 8 weight rows at a time, for
 * prefill and batched decode (gemm_k_avx2.c's scheme; read its header).
 *
 * Their weights are grid entries, signs and small scales, too irregular to
 * transpose with byte shuffles, so each row's super-block is first made
 * integers by the type's unpack (quants_iq.h: the signed value of every
 * element as an int8, a scale per 16 elements, the f16 super-scale) and
 * those are transposed into the workspace, once per matmul for all tokens:
 *
 *   q[z], z = 0..63:  lane r = the values of elements 4z..4z+3 of row r
 *   sc[16]:           int16 pairs (ls_h, ls_h), lane r = row r's scale of
 *                     elements 16h..16h+15
 *   d:                8 floats, row r's super-scale
 *
 * Then the sign trick (|v| unsigned, the activation byte signed by v) in
 * vpmaddubsw, k-steps added in int16 while they cannot saturate (the
 * type's largest |v| says how many: 2 * kg * vmax * 127 < 2^15), one
 * vpmaddwd by (ls, ls) per sub-block, and per super-block the reference's
 * float ops, acc += (d_w * d_y) * (float)sumi, the type's power-of-two
 * factor (1/8, 1/4, 1) at the end. The integers are the reference dot's
 * (quants_iq*_ref.c) whatever their grouping, so every output is bitwise
 * tl_vec_dot_ref's. Fewer tokens than min_tokens_of (decode, small
 * batches) take the type's tiles instead (quants_iq*_avx2.c), which sum
 * the same way. */
#include "iq2_grids.h"
#include "quants_iq.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <stddef.h>

#define T2 __attribute__((target("avx2,fma,f16c")))
#define AI __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 8")
#include "gemm_q.h"

enum { GB_IQ = 81 * 32 }; /* workspace bytes per super-block: q[64] | sc[16] | d */
#define TOK_BLOCK 4

/* What the GEMM needs of a type: its unpack, block bytes, the factor the
 * reference applies last, k-steps per vpmaddwd, its decode tiles, and the
 * fewest tokens it takes from them (min_tokens). */
typedef struct {
    tl_iq_unpack_fn unpack;
    size_t bw;
    float post;
    int kg;
    tl_vec_dot_tile_fn rows;
    int min_tokens;
} iq_kind;

/* Where the GEMM overtakes each family's tiles, batched decode of 110M
 * files, one thread, this Zen 3: the iq1 tiles go one token at a time
 * (GEMM 1.6x faster at 8 tokens, even at 4, 0.6x at 2); the iq2 tiles
 * have 8-token tiles (even at 8, GEMM 1.5x at 10); the iq3 tiles 4-token
 * ones (even at 12, GEMM 1.2-2.4x at 16). */
static int min_tokens_of(int type) {
    if (type == TL_TYPE_IQ1_S || type == TL_TYPE_IQ1_M) return 6;
    return type == TL_TYPE_IQ3_XXS || type == TL_TYPE_IQ3_S ? 13 : 9;
}

static iq_kind kinds[TL_TYPE_COUNT];

/* Super-block i of the 8 rows (row r at w + roffs[r]) into the workspace
 * g: each row unpacked in element order, then 32-byte columns transposed
 * (lane r of q[8c + k] = elements 32c + 4k.. of row r). */
static T2 void fill_sb(const iq_kind *k, const uint8_t *w, const size_t *roffs, int64_t i, uint8_t *g) {
    _Alignas(32) uint64_t v[8][32];
    int16_t ls[8][16];
    __m256i *G = (__m256i *)g;
    uint32_t *sc = (uint32_t *)(G + 64);
    float *d = (float *)(G + 80);
    for (int r = 0; r < 8; r++) k->unpack(w + roffs[r] + (size_t)i * k->bw, v[r], ls[r], &d[r]);
    for (int c = 0; c < 8; c++) {
        __m256i z[8];
        UNROLL for (int r = 0; r < 8; r++) z[r] = _mm256_load_si256((const __m256i *)&v[r][4 * c]);
        tl_tr8x8(z, G + 8 * c);
    }
    for (int h = 0; h < 16; h++)
        for (int r = 0; r < 8; r++) sc[8 * h + r] = (uint16_t)ls[r][h] | (uint32_t)(uint16_t)ls[r][h] << 16;
}

static inline AI T2 __m256i bcast32(const void *p) {
    int v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* C tokens (q8_K rows at x + c*ldx) against super-block i of the group
 * transposed at g: acc[c] += its term, lane r = row r. kg is 2 or 4. */
static inline AI T2 void sb_dot(int kg, int C, const uint8_t *g, const uint8_t *x, size_t ldx, int64_t i,
                                __m256 acc[TOK_BLOCK]) {
    const __m256i *G = (const __m256i *)g;
    const block_q8_K *yb[TOK_BLOCK];
    __m256i sumi[TOK_BLOCK];
    UNROLL for (int c = 0; c < C; c++) {
        yb[c] = (const block_q8_K *)(x + c * ldx) + i;
        sumi[c] = _mm256_setzero_si256();
    }
    for (int h = 0; h < 16; h++) {
        const __m256i sc = _mm256_load_si256(G + 64 + h);
        UNROLL for (int k0 = 0; k0 < 4; k0 += kg) {
            __m256i s16[TOK_BLOCK];
            UNROLL for (int c = 0; c < C; c++) s16[c] = _mm256_setzero_si256();
            UNROLL for (int k = k0; k < k0 + kg; k++) {
                const __m256i q = _mm256_load_si256(G + 4 * h + k), aq = _mm256_abs_epi8(q);
                UNROLL for (int c = 0; c < C; c++)
                    s16[c] = _mm256_add_epi16(
                        s16[c], _mm256_maddubs_epi16(aq, _mm256_sign_epi8(bcast32(yb[c]->qs + 16 * h + 4 * k), q)));
            }
            UNROLL for (int c = 0; c < C; c++) sumi[c] = _mm256_add_epi32(sumi[c], _mm256_madd_epi16(s16[c], sc));
        }
    }
    const __m256 dw = _mm256_load_ps((const float *)(G + 80));
    UNROLL for (int c = 0; c < C; c++)
        acc[c] = _mm256_add_ps(acc[c], _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(yb[c]->d), dw),
                                                     _mm256_cvtepi32_ps(sumi[c])));
}

/* C tokens against one 8-row group transposed at wk. */
static inline AI T2 void mk(int kg, int C, float post, int64_t nb, const uint8_t *wk, const uint8_t *x, size_t ldx,
                            float *out, size_t ldo, int nr) {
    __m256 acc[TOK_BLOCK];
    UNROLL for (int c = 0; c < C; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) sb_dot(kg, C, wk + (size_t)i * GB_IQ, x, ldx, i, acc);
    UNROLL for (int c = 0; c < C; c++) tl_store_rows8(out + c * ldo, _mm256_mul_ps(acc[c], _mm256_set1_ps(post)), nr);
}

/* The micro-tiles by k-steps per vpmaddwd and token count. */
static T2 void mk_any(int kg, int C, float post, int64_t nb, const uint8_t *wk, const uint8_t *x, size_t ldx,
                      float *out, size_t ldo, int nr) {
#define MK_C(KG)                                                     \
    switch (C) {                                                     \
    case 1: mk(KG, 1, post, nb, wk, x, ldx, out, ldo, nr); break;     \
    case 2: mk(KG, 2, post, nb, wk, x, ldx, out, ldo, nr); break;     \
    case 3: mk(KG, 3, post, nb, wk, x, ldx, out, ldo, nr); break;     \
    default: mk(KG, TOK_BLOCK, post, nb, wk, x, ldx, out, ldo, nr);  \
    }
    if (kg == 4) MK_C(4) else MK_C(2)
#undef MK_C
}

static void gemm_iq(int type, int64_t n, int nr, int nt, float *out, size_t ldo, const void *w, size_t ldw,
                    const void *x, size_t ldx, void *work) {
    const iq_kind *k = &kinds[type];
    if (nt < k->min_tokens) {
        k->rows(n, nr, nt, out, ldo, w, ldw, x, ldx);
        return;
    }
    const int64_t nb = n / QK_K;
    const uint8_t *X = x;
    uint8_t *wk = work;
    size_t roffs[8];
    for (int r0 = 0; r0 < nr; r0 += 8) {
        const uint8_t *W = (const uint8_t *)w + (size_t)r0 * ldw;
        const int g = tl_group_rows8(r0, nr, ldw, roffs);
        for (int64_t i = 0; i < nb; i++) fill_sb(k, W, roffs, i, wk + (size_t)i * GB_IQ);
        for (int t = 0; t < nt; t += TOK_BLOCK) {
            const int c = nt - t < TOK_BLOCK ? nt - t : TOK_BLOCK;
            mk_any(k->kg, c, k->post, nb, wk, X + (size_t)t * ldx, ldx, out + (size_t)t * ldo + r0, ldo, g);
        }
    }
}

#define GEMM_IQ(SUF, TYPE)                                                                                         \
    static void gemm_##SUF(int64_t n, int nr, int nt, float *out, size_t ldo, const void *w, size_t ldw,          \
                           const void *x, size_t ldx, void *work) {                                              \
        gemm_iq(TYPE, n, nr, nt, out, ldo, w, ldw, x, ldx, work);                                                \
    }
GEMM_IQ(iq2_xxs, TL_TYPE_IQ2_XXS)
GEMM_IQ(iq2_xs, TL_TYPE_IQ2_XS)
GEMM_IQ(iq2_s, TL_TYPE_IQ2_S)
GEMM_IQ(iq3_xxs, TL_TYPE_IQ3_XXS)
GEMM_IQ(iq3_s, TL_TYPE_IQ3_S)
GEMM_IQ(iq1_s, TL_TYPE_IQ1_S)
GEMM_IQ(iq1_m, TL_TYPE_IQ1_M)
#undef GEMM_IQ

static tl_quantize_fn quantize_q8_K_fn;
static void prepare_q8_K(const float *src, void *dst, int64_t n) { quantize_q8_K_fn(src, dst, n); }

/* After the level's tiles are filled (they serve decode). */
void tl_gemm_iq_fill_avx2(tl_kernel_table *t) {
    quantize_q8_K_fn = t->quantize_q8_K;
    static const struct {
        int type;
        tl_gemm_tile_fn gemm;
    } all[] = {
        {TL_TYPE_IQ2_XXS, gemm_iq2_xxs}, {TL_TYPE_IQ2_XS, gemm_iq2_xs}, {TL_TYPE_IQ2_S, gemm_iq2_s},
        {TL_TYPE_IQ3_XXS, gemm_iq3_xxs}, {TL_TYPE_IQ3_S, gemm_iq3_s},   {TL_TYPE_IQ1_S, gemm_iq1_s},
        {TL_TYPE_IQ1_M, gemm_iq1_m},
    };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        const int type = all[i].type;
        const tl_iq_info *info = tl_iq_info_of(type);
        /* int16 sums of two k-steps hold 4 * 63 * 127; vmax of 31 or less: all 4 */
        if (!info || info->vmax > 63 || !t->vec_dot_tile[type]) continue;
        tl_iq_unpack_fn fast = tl_iq2_unpack_avx2(type);
        if (!fast) fast = tl_iq3_unpack_avx2(type);
        if (!fast) fast = tl_iq1_unpack_avx2(type);
        kinds[type] = (iq_kind){fast ? fast : info->unpack, tl_type_info(type)->type_size, info->post, info->vmax <= 31 ? 4 : 2,
                                t->vec_dot_tile[type], min_tokens_of(type)};
        t->gemm_tile[type] = all[i].gemm;
        t->gemm_prepare[type] = prepare_q8_K;
    }
}

#else
void tl_gemm_iq_fill_avx2(tl_kernel_table *t) { (void)t; }
#endif
