/* quants_impl.h - private to kernels/cpu: ggml block layouts, the scalar
 * helpers every kernel file shares, and the kernel table that dispatch.c
 * fills per ISA level.
 *
 * Block layouts (little-endian, byte-exact with ggml-common.h; a row is an
 * array of blocks, element i of block b is row element b*block_size + i):
 *
 *   q4_0  | d:f16 | qs[16]: byte j = elem j (low nibble), elem j+16 (high) |
 *   q4_1  | d:f16 | m:f16 | qs[16] as q4_0                                 |
 *   q5_0  | d:f16 | qh[4]: bit j = 5th bit of elem j | qs[16] as q4_0      |
 *   q5_1  | d:f16 | m:f16 | qh[4] as q5_0 | qs[16] as q4_0                 |
 *   q8_0  | d:f16 | qs[32]: int8                                          |
 *   iq4_nl  as q4_0, each nibble an index into tl_iq4nl_values          |
 *   iq4_xs | d | scales_h: 2 high bits per sub-block | scales_l[4]: 4 low
 *           bits per sub-block | qs[128]: 8 sub-blocks of 32 as iq4_nl's |
 *           value d * (ls - 32) * level, ls the 6-bit scale
 *   q2_K  | scales[16]: scale (low nibble), min (high) per 16 elems |
 *           qs[64] | d | dmin; element 128c + 32j + p (p < 32) is bits
 *           2j..2j+1 of qs[32c + p]: value d*sc*q - dmin*m
 *   q3_K  | hmask[32] | qs[64] | scales[12]: 16 x 6-bit, biased by 32 | d |
 *           element 128c + 32j + p: bits 2j..2j+1 of qs[32c + p], less 4
 *           unless bit 4c + j of hmask[p] is set: value d*(sc-32)*q
 *   q4_K  | d | dmin | scales[12]: 8 x (6-bit scale, 6-bit min) | qs[128] |
 *           qs chunk c (32 bytes) holds sub-block 2c (low) and 2c+1 (high)
 *   q5_K  | d | dmin | scales[12] | qh[32]: bit 2c/2c+1 of byte l = 5th bit
 *           of elem l of sub-block 2c/2c+1 | qs[128] as q4_K              |
 *   q6_K  | ql[128] | qh[64] | scales[16]: int8 per 16 elems | d:f16 |
 *   q8_K  | d:f32 | qs[256]: int8 | bsums[16]: int16 sums of 16 qs |
 */
#ifndef TL_QUANTS_IMPL_H
#define TL_QUANTS_IMPL_H

#include <stdint.h>
#include <string.h>

#include "quants.h"

#define QK4_0 32
#define QK8_0 32
#define QK_K 256

typedef struct { uint16_t d; uint8_t qs[16]; } block_q4_0;
typedef struct { uint16_t d, m; uint8_t qs[16]; } block_q4_1;
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; } block_q5_0;
typedef struct { uint16_t d, m; uint8_t qh[4]; uint8_t qs[16]; } block_q5_1;
typedef struct { uint16_t d; int8_t qs[32]; } block_q8_0;
typedef struct { uint8_t scales[16]; uint8_t qs[64]; uint16_t d, dmin; } block_q2_K;
typedef struct { uint16_t d, scales_h; uint8_t scales_l[4]; uint8_t qs[128]; } block_iq4_xs;
typedef struct { uint8_t hmask[32]; uint8_t qs[64]; uint8_t scales[12]; uint16_t d; } block_q3_K;
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; } block_q4_K;
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; } block_q5_K;
typedef struct { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; } block_q6_K;
typedef struct { float d; int8_t qs[256]; int16_t bsums[16]; } block_q8_K;
/* The i-quants' super-blocks of 256 (ggml-common.h's layouts; the kernels
 * that read them say what each field holds). */
typedef struct { uint16_t d; uint16_t qs[QK_K / 8]; } block_iq2_xxs;
typedef struct { uint16_t d; uint16_t qs[QK_K / 8]; uint8_t scales[QK_K / 32]; } block_iq2_xs;
typedef struct { uint16_t d; uint8_t qs[QK_K / 4]; uint8_t qh[QK_K / 32]; uint8_t scales[QK_K / 32]; } block_iq2_s;
typedef struct { uint16_t d; uint8_t qs[3 * QK_K / 8]; } block_iq3_xxs;
typedef struct { uint16_t d; uint8_t qs[QK_K / 4]; uint8_t qh[QK_K / 32]; uint8_t signs[QK_K / 8]; uint8_t scales[QK_K / 64]; } block_iq3_s;
typedef struct { uint16_t d; uint8_t qs[QK_K / 8]; uint16_t qh[QK_K / 32]; } block_iq1_s;
typedef struct { uint8_t qs[QK_K / 8]; uint8_t qh[QK_K / 16]; uint8_t scales[QK_K / 32]; } block_iq1_m;

_Static_assert(sizeof(block_q4_0) == 18, "q4_0 layout");
_Static_assert(sizeof(block_q4_1) == 20, "q4_1 layout");
_Static_assert(sizeof(block_q5_0) == 22, "q5_0 layout");
_Static_assert(sizeof(block_q5_1) == 24, "q5_1 layout");
_Static_assert(sizeof(block_q8_0) == 34, "q8_0 layout");
_Static_assert(sizeof(block_q2_K) == 84, "q2_K layout");
_Static_assert(sizeof(block_iq4_xs) == 136, "iq4_xs layout");
_Static_assert(sizeof(block_q3_K) == 110, "q3_K layout");
_Static_assert(sizeof(block_q4_K) == 144, "q4_K layout");
_Static_assert(sizeof(block_q5_K) == 176, "q5_K layout");
_Static_assert(sizeof(block_q6_K) == 210, "q6_K layout");
_Static_assert(sizeof(block_q8_K) == 292, "q8_K layout");
_Static_assert(sizeof(block_iq2_xxs) == 66, "iq2_xxs layout");
_Static_assert(sizeof(block_iq2_xs) == 74, "iq2_xs layout");
_Static_assert(sizeof(block_iq2_s) == 82, "iq2_s layout");
_Static_assert(sizeof(block_iq3_xxs) == 98, "iq3_xxs layout");
_Static_assert(sizeof(block_iq3_s) == 110, "iq3_s layout");
_Static_assert(sizeof(block_iq1_s) == 50, "iq1_s layout");
_Static_assert(sizeof(block_iq1_m) == 56, "iq1_m layout");

/* The i-quants' 7-bit sign index (iq2_xxs, iq2_xs, iq3_xxs): bits 0..6 are
 * the signs of elements 0..6 (1 = negative), element 7's sign makes the
 * count of negatives even. Returns the 8 sign bits. */
static inline uint8_t tl_iq_signs8(unsigned s7) {
    s7 &= 0x7F;
    return (uint8_t)(s7 | (unsigned)__builtin_parity(s7) << 7);
}

/* Exact IEEE half -> float (subnormals, inf; a NaN keeps its payload and
 * comes out quiet, as F16C's vcvtph2ps does). */
static inline float tl_f16_to_f32_inl(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff, bits;
    if (e == 0x1f) {
        bits = sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0);
    } else if (e != 0) {
        bits = sign | ((e + 112) << 23) | (m << 13);
    } else if (m == 0) {
        bits = sign;
    } else { /* subnormal: normalise the mantissa */
        e = 113;
        while (!(m & 0x400)) { m <<= 1; e--; }
        bits = sign | (e << 23) | ((m & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* float -> half, round to nearest even; NaN stays NaN (quietened like F16C). */
static inline uint16_t tl_f32_to_f16_inl(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    x &= 0x7fffffffu;
    if (x > 0x7f800000u) return (uint16_t)(sign | 0x7e00 | ((x >> 13) & 0x3ff));
    if (x >= 0x47800000u) return (uint16_t)(sign | 0x7c00); /* >= 65536 or inf */
    if (x < 0x38800000u) {                                  /* half subnormal */
        if (x < 0x33000000u) return sign;                   /* <= 2^-25 -> 0 */
        uint32_t e = x >> 23, m = (x & 0x7fffff) | 0x800000, sh = 126 - e;
        uint32_t r = m >> sh, rem = m & ((1u << sh) - 1), half = 1u << (sh - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t h = (((x >> 23) - 112) << 10) | ((x >> 13) & 0x3ff);
    uint32_t rem = x & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++; /* may carry into inf */
    return (uint16_t)(sign | h);
}

static inline float tl_bf16_to_f32_inl(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Round to nearest even like ggml's GGML_FP32_TO_BF16; NaN is quietened. */
static inline uint16_t tl_f32_to_bf16_inl(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 64);
    return (uint16_t)((u + (0x7fffu + ((u >> 16) & 1))) >> 16);
}

#define TL_F16(h) tl_f16_to_f32_inl(h)

/* Unaligned little-endian loads from block bytes (packed structs' fields
 * and row strides need not be aligned). */
static inline uint16_t tl_ld16(const void *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* Keeps an array the kernels stored by vector ops in memory, to be read
 * back by loads: left to itself GCC forwards such stores in registers and
 * takes the parts out by shuffles, with spills (iq2_xxs decode: a tenth of
 * its time in vpsrldq for a block's prepared words, where a broadcast from
 * memory is one load; attn_avx2.c's lane sums). */
#define TL_IN_MEMORY(p) __asm__ volatile("" : : "r"(p) : "memory")

static inline uint32_t tl_ld32(const void *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline uint64_t tl_ld64(const void *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* Unpacks the j-th (0..7) 6-bit scale and min of a q4_K/q5_K block. */
static inline void tl_get_scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
    }
}

/* All 8 at once: 12 packed bytes -> bytes 0..7 scales, 8..15 mins (ggml's
 * utmp shuffle; the SIMD decode rows). */
static inline void tl_unpack_k4_scales(const uint8_t *s, uint32_t u[4]) {
    const uint32_t k1 = 0x3f3f3f3f, k2 = 0x0f0f0f0f, k3 = 0x03030303;
    memcpy(u, s, 12);
    u[3] = ((u[2] >> 4) & k2) | (((u[1] >> 6) & k3) << 4);
    const uint32_t aux = u[1] & k1;
    u[1] = (u[2] & k2) | (((u[0] >> 6) & k3) << 4);
    u[2] = aux;
    u[0] &= k1;
}

/* iq4_nl's 16 non-uniform levels (ggml's kvalues_iq4nl). */
static const int8_t tl_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* Sub-block j's (0..7) signed scale (-32..31) of an iq4_xs block. */
static inline int tl_iq4xs_scale(const uint8_t *blk, int j) {
    const uint16_t h = (uint16_t)(blk[2] | blk[3] << 8);
    return (((blk[4 + j / 2] >> (4 * (j % 2))) & 0xF) | ((h >> (2 * j)) & 3) << 4) - 32;
}

/* The 16 signed scales (-32..31) of a q3_K block: the low 4 bits of scale
 * j in byte j % 8 (low nibble for j < 8), its high 2 bits in byte 8 + j %
 * 4 at bit 2 * (j / 4), as ggml packs them. */
static inline void tl_q3_K_scales(const uint8_t *q, int sc[16]) {
    for (int j = 0; j < 16; j++) {
        const int lo = j < 8 ? q[j] & 0xF : q[j - 8] >> 4, hi = (q[8 + j % 4] >> (2 * (j / 4))) & 3;
        sc[j] = (lo | hi << 4) - 32;
    }
}

/* Kernel table: one per ISA level, filled by dispatch.c from the per-ISA
 * fill functions (each only overrides what it implements). */
typedef void (*tl_quantize_fn)(const float *src, void *dst, int64_t n);
/* tl_vec_dot_tile without the type; NULL means "loop over vec_dot". */
typedef void (*tl_vec_dot_tile_fn)(int64_t n, int nr, int nt, float *out, size_t ldo, const void *w, size_t ldw,
                                   const void *x, size_t ldx);
typedef void (*tl_gemm_tile_fn)(int64_t n, int nr, int nt, float *out, size_t ldo, const void *w, size_t ldw,
                                const void *xp, size_t ldx, void *work);
typedef struct tl_kernel_table {
    tl_vec_dot_fn vec_dot[TL_TYPE_COUNT];
    /* Set by a level together with its vec_dot; inherited from the level
     * below only with that level's vec_dot (dispatch.c drops it where the
     * vec_dot was replaced, as the new one may sum in another order). */
    tl_vec_dot_tile_fn vec_dot_tile[TL_TYPE_COUNT];
    tl_quantize_fn quantize_q8_0, quantize_q8_K;
    /* GEMM path (tl_gemm_*): a tile kernel over prepared activations and
     * the function preparing one activation row; NULL where the level has
     * none for the type (matmuls then use vec_dot_tile). Dropped by a level
     * that replaces the type's vec_dot without its own gemm (dispatch.c). */
    tl_gemm_tile_fn gemm_tile[TL_TYPE_COUNT];
    tl_quantize_fn gemm_prepare[TL_TYPE_COUNT];
    /* gemm_tile on rows packed pack_rows at a time (pack.c), over the same
     * prepared rows; NULL where the level has none (tl_packed_tile's
     * generic loop). */
    tl_gemm_tile_fn gemm_tile_pk[TL_TYPE_COUNT];
    int pack_rows;
    /* tl_bf16dot_tile (bf16dot_avx512.c, at amx bf16_amx.c); NULL where the CPU has no AVX512_BF16. */
    tl_gemm_tile_fn bf16dot_tile;
    float (*dot_f32)(const float *a, const float *b, int64_t n);
    float (*dot_f16_f32)(const uint16_t *a, const float *b, int64_t n);
    void (*axpy_f32)(float *y, float a, const float *x, int64_t n);
    void (*axpy_f16)(float *y, float a, const uint16_t *x, int64_t n);
    void (*gelu_tanh_mul)(float *h, const float *g, int64_t n);
    void (*silu_mul)(float *h, const float *g, int64_t n);
    double (*sum_sq)(const float *x, int64_t n);
    /* Row loops: axpy_rows_f32 bitwise axpy_f32 per row; dot_rows_f32 the
     * level's attention scores, bitwise dot_f32 per row times the scale
     * except at AVX-512 (its own order, attn_avx512.c). A level that
     * replaces dot_f32 or axpy_f32 without its own row version gets the
     * generic loop (dispatch.c). */
    void (*dot_rows_f32)(const float *q, const float *k, size_t ldk, int rows, int64_t n, float scale, float *out);
    void (*axpy_rows_f32)(float *y, const float *a, const float *x, size_t ldx, int rows, int64_t n);
    /* Attention: softmax (a level's own numerics, within 1e-6 of the scalar
     * level's), and axpy_rows_f32 for several queries, bitwise one
     * axpy_rows_f32 call per query (quants_avx2.c, attn_avx512.c; dispatch.c's generic
     * loop where a level replaced axpy_rows_f32 without it). */
    void (*softmax_f32)(float *x, int64_t n, float scale);
    void (*axpy_rows_multi_f32)(int nq, float *const *y, const float *const *a, const float *x, size_t ldx, int rows,
                                int64_t n);
    /* dot_rows_f32 / axpy_rows_multi_f32 over f16 rows, bitwise those on
     * the widened rows; NULL where a level has none (scalar). */
    void (*dot_rows_f16)(const float *q, const uint16_t *k, size_t ldk, int rows, int64_t n, float scale, float *out);
    void (*axpy_rows_multi_f16)(int nq, float *const *y, const float *const *a, const uint16_t *x, size_t ldx,
                                int rows, int64_t n);
    /* Prefill scores from K rows transposed into 16-row panels, bitwise the
     * level's dot_rows_f32 (attn_avx2.c, attn_avx512.c); NULL where a level has none.
     * A level that replaces dot_rows_f32 without them drops them (dispatch.c). */
    void (*k_panels_f32)(const float *k, size_t ldk, int rows, int64_t n, float *kp);
    void (*k_panels_f16)(const uint16_t *k, size_t ldk, int rows, int64_t n, float *kp);
    void (*scores_panels)(int nq, const float *const *q, const float *kp, int rows, int64_t n, float scale,
                          float *const *out);
    /* tl_attn_v8_prep / tl_attn_v8_sum (quants.h): the scalar level's in
     * dispatch.c, the VNNI level's in attn_avx512.c; bitwise the same. */
    void (*attn_v8_prep)(const uint8_t *v, size_t row_bytes, int rows, int hd, void *vp);
    void (*attn_v8_sum)(int nq, float *const *y, const float *const *a, const void *vp, int r0, int r1, int hd);
    void (*f16_to_f32_row)(const uint16_t *src, float *dst, int64_t n);
    void (*f32_to_f16_row)(const float *src, uint16_t *dst, int64_t n);
    /* nb q8_0 / q4_0 / q4_1 blocks to floats (tl_dequantize_row; attention
     * widens q8 / q4 V rows with q8_0 / q4_1); every level gives d * q
     * (q4_0: (q - 8) * d; q4_1: q * d + m, one product then one sum),
     * bitwise the scalar code. */
    void (*dequant_q8_0)(const void *src, float *dst, int64_t nb);
    void (*dequant_q4_0)(const void *src, float *dst, int64_t nb);
    void (*dequant_q4_1)(const void *src, float *dst, int64_t nb);
} tl_kernel_table;

void tl_kernels_fill_ref(tl_kernel_table *t);
/* The active level's dequant_q8_0 / _q4_0 / _q4_1 (tl_dequantize_row's). */
void tl_dequant_q8_0_blocks(const void *src, float *dst, int64_t nb);
void tl_dequant_q4_0_blocks(const void *src, float *dst, int64_t nb);
void tl_dequant_q4_1_blocks(const void *src, float *dst, int64_t nb);
void tl_kernels_fill_avx2(tl_kernel_table *t);
/* gemm_avx2.c: the AVX2 GEMM path for q8_0/q4_0/q5_0 and the vec_dots it
 * is bitwise with (called by tl_kernels_fill_avx2). */
void tl_gemm_fill_avx2(tl_kernel_table *t);
/* gemm_k_avx2.c: the AVX2 GEMM path for q4_K/q5_K/q6_K and the vec_dots it
 * is bitwise with (the scalar reference's sums; called by tl_kernels_fill_avx2). */
void tl_gemm_k_fill_avx2(tl_kernel_table *t);
void tl_gemm_iq_fill_avx2(tl_kernel_table *t);
/* attn_avx2.c: prefill scores through K panels, bitwise the level's
 * dot_rows_f32 (called by tl_kernels_fill_avx2). */
void tl_attn_fill_avx2(tl_kernel_table *t);
/* quants_extra_avx2.c: q2_K/q3_K/iq4_nl one-row dots (called by tl_kernels_fill_avx2). */
void tl_extra_fill_avx2(tl_kernel_table *t);
/* A prepared activation row of nb blocks (tl_gemm_prepare, both GEMM
 * files): the q8_0 row, then at these offsets the nb block scales as
 * floats and the nb int32 bias corrections -off * sum(y). */
static inline size_t tl_gemm_dy_off(int64_t nb) { return ((size_t)nb * sizeof(block_q8_0) + 3) & ~(size_t)3; }
static inline size_t tl_gemm_corr_off(int64_t nb) { return tl_gemm_dy_off(nb) + (size_t)nb * 4; }
/* attn_avx512.c: softmax_f32 and axpy_rows_multi_f32 (called by
 * tl_kernels_fill_avx512), and with VNNI the int8 V sums. */
void tl_attn_fill_avx512(tl_kernel_table *t, int vnni);
/* One 32-value group of a tl_attn_v8_prep piece: 16 scales, 4 quads of rows. */
enum { TL_V8_GROUP_BYTES = 16 * 4 + 4 * 128 };
/* vnni: the CPU has AVX512-VNNI; quant kernels need it (else they keep AVX2). */
void tl_kernels_fill_avx512(tl_kernel_table *t, int vnni);
/* gemm_avx512.c: the VNNI GEMM path and the vec_dots it is bitwise with. */
void tl_gemm_fill_avx512(tl_kernel_table *t);
/* gemm_k_avx512.c: the same for q4_K/q6_K (called by tl_gemm_fill_avx512),
 * and its workspace bytes for rows of n elements. */
void tl_gemm_k_fill_avx512(tl_kernel_table *t);
size_t tl_gemm_k_work_size(int64_t n);
/* gemm_amx.c: the packed 32-element kinds' GEMM on AMX-INT8 tiles, over
 * an AVX-512 table (its VNNI kernels stay for a few tokens), and its
 * workspace bytes for rows of n elements. */
void tl_gemm_fill_amx(tl_kernel_table *t);
size_t tl_gemm_amx_work_size(int64_t n);
/* bf16_amx.c: the BF16 mode's tile on AMX-BF16 tiles, over an AVX-512
 * table's (kept for rows not a multiple of 32), and its workspace. */
void tl_bf16_fill_amx(tl_kernel_table *t);
size_t tl_bf16_amx_work_size(int64_t n);
/* bf16dot_avx512.c: the BF16 mode's tile (when the CPU has AVX512_BF16). */
void tl_bf16dot_fill_avx512(tl_kernel_table *t);

/* Scalar reference quantizer for any type tl_quantize_row accepts (the
 * dispatched tl_quantize_row uses SIMD for Q8_0/Q8_K); for tests. */
void tl_quantize_row_ref(int type, const float *src, void *dst, int64_t n);

/* Shared by the SIMD files: walks an nr x nt tile in 4-row (RB-row with
 * TILE_DRIVER_RC) x CB-token micro-tiles of the file's MK kernel; leftover
 * tokens go one at a time, leftover rows one at a time. Only the first token group of a row group
 * prefetches. NAME##_1 is the single-row vec_dot: the 1x1 tile, so both
 * sum in the same order. The MK_* shorthands name each file's own static
 * mk_float / mk_q kernels. */
#define TILE_DRIVER(NAME, ATTR, MK, CB) TILE_DRIVER_RC(NAME, ATTR, MK, 4, CB)
#define TILE_DRIVER_RC(NAME, ATTR, MK, RB, CB)                                                                        \
    static ATTR void NAME(int64_t n, int nr, int nt, float *out, size_t ldo, const void *w, size_t ldw,              \
                          const void *x, size_t ldx) {                                                                \
        const uint8_t *W = w, *X = x;                                                                                 \
        int r = 0;                                                                                                    \
        for (; r + RB <= nr; r += RB) {                                                                               \
            const uint8_t *wr = W + (size_t)r * ldw;                                                                  \
            int t = 0;                                                                                                \
            for (; t + CB <= nt; t += CB) MK(RB, CB, t == 0, n, out + (size_t)t * ldo + r, ldo, wr, ldw, X + (size_t)t * ldx, ldx); \
            for (; t < nt; t++) MK(RB, 1, t == 0, n, out + (size_t)t * ldo + r, ldo, wr, ldw, X + (size_t)t * ldx, ldx);         \
        }                                                                                                             \
        for (; r < nr; r++)                                                                                           \
            for (int t = 0; t < nt; t++)                                                                              \
                MK(1, 1, t == 0, n, out + (size_t)t * ldo + r, ldo, W + (size_t)r * ldw, ldw, X + (size_t)t * ldx, ldx);      \
    }                                                                                                                 \
    static ATTR void NAME##_1(int64_t n, float *out, const void *w, const void *x) { NAME(n, 1, 1, out, 1, w, 0, x, 0); }

#define MK_F32(R, C, ...) mk_float(W_F32, R, C, __VA_ARGS__)
#define MK_F16(R, C, ...) mk_float(W_F16, R, C, __VA_ARGS__)
#define MK_BF16(R, C, ...) mk_float(W_BF16, R, C, __VA_ARGS__)

#endif
