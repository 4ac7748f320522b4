/* quants.h - weight types (ggml block layouts as GGUF stores them), their
 * reference dequantize/quantize, and dot-product kernels that work on the
 * packed data. SIMD variants (AVX2, AVX-512) are compiled per function with
 * target attributes and chosen once at start-up from CPUID; the scalar
 * reference path is always built.
 *
 * Dot products take the weight row in its own type and the activation row
 * already converted to the type's `vec_dot_type` (F32 for float weights,
 * Q8_0 for Q4_0/Q4_1/Q5_0/Q8_0, Q8_K for the K-quants).
 */
#ifndef TL_QUANTS_H
#define TL_QUANTS_H

#include <stddef.h>
#include <stdint.h>

/* ggml type ids as stored in GGUF tensor infos. */
enum tl_type {
    TL_TYPE_F32 = 0, TL_TYPE_F16 = 1, TL_TYPE_Q4_0 = 2, TL_TYPE_Q4_1 = 3,
    TL_TYPE_Q5_0 = 6, TL_TYPE_Q5_1 = 7, TL_TYPE_Q8_0 = 8, TL_TYPE_Q8_1 = 9,
    TL_TYPE_Q2_K = 10, TL_TYPE_Q3_K = 11, TL_TYPE_Q4_K = 12, TL_TYPE_Q5_K = 13,
    TL_TYPE_Q6_K = 14, TL_TYPE_Q8_K = 15, TL_TYPE_IQ2_XXS = 16, TL_TYPE_IQ2_XS = 17,
    TL_TYPE_IQ3_XXS = 18, TL_TYPE_IQ1_S = 19, TL_TYPE_IQ4_NL = 20, TL_TYPE_IQ3_S = 21, TL_TYPE_IQ2_S = 22,
    TL_TYPE_IQ4_XS = 23, TL_TYPE_IQ1_M = 29, TL_TYPE_BF16 = 30, TL_TYPE_TQ1_0 = 34, TL_TYPE_TQ2_0 = 35,
    TL_TYPE_MXFP4 = 39,
    TL_TYPE_COUNT = 40
};

typedef struct tl_type_traits {
    const char *name;   /* "q4_K" etc.; NULL for ids we do not know */
    int block_size;     /* elements per block */
    size_t type_size;   /* bytes per block */
    int vec_dot_type;   /* activation type the dot product wants */
    int supported;      /* 1 when dequantize + vec_dot exist (weights may use it) */
} tl_type_traits;

/* Traits for a type id; a zeroed struct (name NULL) for unknown ids. */
const tl_type_traits *tl_type_info(int type);

/* Bytes for a row of n elements (n must be a multiple of block_size);
 * returns 0 when n is not a multiple or the type is unknown. */
size_t tl_row_size(int type, int64_t n);

/* Reference conversions. n is a multiple of the block size. */
void tl_dequantize_row(int type, const void *src, float *dst, int64_t n);
/* Quantizes f32 into `type` (any supported weight type and the two
 * activation types Q8_0/Q8_K). Used for activations and by the test
 * model generator; accuracy comparable to ggml's reference quantizers. */
void tl_quantize_row(int type, const float *src, void *dst, int64_t n);

/* out = dot(w_row (type), x_row (vec_dot_type of type)), n elements. */
typedef void (*tl_vec_dot_fn)(int64_t n, float *out, const void *w_row, const void *x_row);

/* The kernel selected for this CPU (after tl_kernels_init). */
tl_vec_dot_fn tl_vec_dot(int type);
/* Scalar reference kernel, for tests. */
tl_vec_dot_fn tl_vec_dot_ref(int type);

/* A tile of dot products: for r < nr, t < nt,
 *   out[t*ldo + r] = dot(w + r*ldw bytes (type), x + t*ldx bytes (vec_dot_type)).
 * Register-blocked (several rows share each activation load, several
 * tokens share each weight load). Every output is bitwise what
 * tl_vec_dot(type) gives for that (row, token) pair, whatever nr, nt and
 * the pair's place in the tile, so batched and single-token forwards agree. */
void tl_vec_dot_tile(int type, int64_t n, int nr, int nt, float *out, size_t ldo, const void *w, size_t ldw,
                     const void *x, size_t ldx);

/* The GEMM path: weight rows x tokens for the forward pass's matmuls, on
 * levels that have one for the type (AVX2: q8_0, q4_0, q5_0; AVX512-VNNI:
 * those and q4_K, q5_K, q6_K with q8_K activations).
 * Activations are prepared once per matmul, TL_GEMM_ROWS weight rows are
 * transposed into a per-thread workspace and reused for every token. Every
 * output is bitwise tl_vec_dot(type) of its (row, token) pair with the
 * token quantized by tl_quantize_row, and on these levels that is bitwise
 * the scalar reference (tl_vec_dot_ref). */
enum { TL_GEMM_ROWS = 16 };
/* 1 when the active level has a GEMM path for weights of this type. */
int tl_gemm_has(int type);
/* Bytes of one prepared activation row of n elements (a multiple of 64),
 * and of one thread's workspace for rows of up to n elements. */
size_t tl_gemm_x_size(int64_t n);
size_t tl_gemm_work_size(int64_t n);
/* xp = the activation row x prepared for weights of `type`. */
void tl_gemm_prepare(int type, const float *x, void *xp, int64_t n);
/* out[t*ldo + r] = dot(w + r*ldw bytes, prepared row xp + t*ldx bytes) for
 * r < nr <= TL_GEMM_ROWS, t < nt. work: tl_gemm_work_size(n) bytes,
 * 64-byte aligned, private to the calling thread. */
void tl_gemm_tile(int type, int64_t n, int nr, int nt, float *out, size_t ldo, const void *w, size_t ldw,
                  const void *xp, size_t ldx, void *work);

/* TL_PACK8 / TL_PACK16 (pack.c): q8_0 / q4_0 / q5_0 weight rows interleaved G =
 * 8 (AVX2) or 16 (AVX-512) at a time per block, in place and the same
 * size, as that level's GEMM reads them. A matrix is packed at load when
 * the active level reads packed rows natively (tl_pack_rows: its G, else
 * 0) and it has a multiple of G rows. */
int tl_pack_supported(int type);
int tl_pack_rows(int type);
/* G consecutive rows of n elements (G * tl_row_size bytes at group) to
 * the packed layout in place (tmp: as many bytes), and back to plain rows. */
void tl_pack_group(int type, int G, uint8_t *group, int64_t n, uint8_t *tmp);
void tl_unpack_group(int type, int G, const uint8_t *group, int64_t n, uint8_t *rows);
/* Row `row` of a matrix w packed G rows at a time, dequantized into y[0, n)
 * (bitwise tl_dequantize_row of the plain row): lookups in a packed tied
 * token_embd. */
void tl_packed_row_dequantize(int type, int G, const uint8_t *w, int64_t row, int64_t n, float *y);
/* tl_gemm_tile (prepared != 0: rows from tl_gemm_prepare) or
 * tl_vec_dot_tile (plain activation rows) on weight rows w packed G at a
 * time (nr a multiple of G, group-aligned); bitwise the same outputs as on
 * the rows unpacked, at any level. work: tl_gemm_work_size(n) bytes, at
 * least 16 rows' worth (G * tl_row_size). */
void tl_packed_tile(int type, int G, int prepared, int64_t n, int nr, int nt, float *out, size_t ldo, const void *w,
                    size_t ldw, const void *x, size_t ldx, void *work);
/* on = 1: until the next call with on = 0, tl_packed_tile calls on this
 * work area may reuse what an earlier one copied from the same x (same
 * pointer, stride and token count), the caller promising that the bytes at
 * x do not change meanwhile: one matmul's row ranges taken one by one.
 * Without it every call copies what it needs. */
void tl_gemm_work_keep(void *work, int on);

/* The lossy BF16 mode's matmul (repack "bf16"): out[t*ldo + r] = the dot
 * of BF16 weight row r (w + r*ldw bytes) and BF16 activation row t (x +
 * t*ldx bytes), products exact, summed in f32 in one fixed order per entry
 * whatever nr and nt (bf16dot_avx512.c; at the amx level bf16_amx.c, its
 * own order); within 1e-5 of sum |w x| of the exact sum. Only where
 * tl_bf16dot_has(): the active level is AVX-512 or amx and the CPU has
 * AVX512_BF16. work: tl_gemm_work_size(n) bytes, 64-byte aligned. */
int tl_bf16dot_has(void);
void tl_bf16dot_tile(int64_t n, int nr, int nt, float *out, size_t ldo, const void *w, size_t ldw, const void *x,
                     size_t ldx, void *work);

/* Half/bfloat conversions. */
float tl_f16_to_f32(uint16_t h);
uint16_t tl_f32_to_f16(float f);
float tl_bf16_to_f32(uint16_t h);
uint16_t tl_f32_to_bf16(float f);
void tl_f16_to_f32_row(const uint16_t *src, float *dst, int64_t n);
void tl_f32_to_f16_row(const float *src, uint16_t *dst, int64_t n);

/* f32 dot product and axpy (y += a*x) for attention; SIMD-dispatched. */
float tl_dot_f32(const float *a, const float *b, int64_t n);
float tl_dot_f16_f32(const uint16_t *a, const float *b, int64_t n);
void tl_axpy_f32(float *y, float a, const float *x, int64_t n);
void tl_axpy_f16(float *y, float a, const uint16_t *x, int64_t n);
/* h[i] = gelu_tanh(h[i]) * g[i] (GeGLU). The scalar level computes
 * 0.5x(1 + tanhf(sqrt(2/pi)(x + 0.044715x^3))); SIMD levels use the
 * identity 0.5(1 + tanh(u)) = 1 / (1 + exp(-2u)) with a vector exp, within
 * 1e-6 * (|x| + 1) * |g| of the scalar result (test_gemm). */
void tl_gelu_tanh_mul(float *h, const float *g, int64_t n);
/* h[i] = silu(h[i]) * g[i] (SwiGLU), within 1e-6 (|x| + 1) |g| of x / (1 + expf(-x)) * g. */
void tl_silu_mul(float *h, const float *g, int64_t n);
/* The sum of x[i] * x[i] (each product a float, summed in double) for
 * RMSNorm: the scalar level in index order, the vector levels in double
 * lanes (within 1e-12 relative of it, test_gemm). */
double tl_sum_sq(const float *x, int64_t n);
/* Attention's scores: out[r] = q . (k + r*ldk) * scale for r < rows, summed
 * in the level's score order: bitwise tl_dot_f32(q, row) * scale, except at
 * AVX-512, whose order (one FMA chain per lane, then its horizontal tree;
 * attn_avx512.c) costs fewer operations per score. Whatever the order, a
 * score depends on its pair only. And y += a[r] * x_r for r < rows in
 * order, bitwise the per-row tl_axpy_f32 calls (attention's V sums). */
void tl_dot_rows_f32(const float *q, const float *k, size_t ldk, int rows, int64_t n, float scale, float *out);
void tl_axpy_rows_f32(float *y, const float *a, const float *x, size_t ldx, int rows, int64_t n);

/* The softmax of x[i] * scale over n > 0 elements: with y[i] = x[i] *
 * scale (one rounding; scale 1 leaves x as it is), x[i] = exp(y[i] - max) /
 * sum_j exp(y[j] - max). The scalar level is libm expf with the sum in
 * double (as ggml's soft_max); the AVX-512 level a polynomial exp with the
 * sum in double lanes, within 1e-6 relative of the scalar level
 * (test_gemm). The scale rides along for scores that come unscaled from
 * the int8 tiles: one pass over them fewer. */
void tl_softmax_f32(float *x, int64_t n, float scale);
/* tl_axpy_rows_f32(y[q], a[q], x, ldx, rows, n) for q < nq, bitwise, with
 * each row of x loaded once for all queries (attention's V rows). */
void tl_axpy_rows_multi_f32(int nq, float *const *y, const float *const *a, const float *x, size_t ldx, int rows,
                            int64_t n);

/* 1 when the active level reads f16 K/V rows directly: then the two below
 * are bitwise tl_dot_rows_f32 / tl_axpy_rows_multi_f32 on the rows widened
 * to f32 (exact), without the widened copy. Not to be called otherwise. */
int tl_attn_has_f16_rows(void);
void tl_dot_rows_f16(const float *q, const uint16_t *k, size_t ldk, int rows, int64_t n, float scale, float *out);
void tl_axpy_rows_multi_f16(int nq, float *const *y, const float *const *a, const uint16_t *x, size_t ldx, int rows,
                            int64_t n);

/* Prefill scores through K panels, where tl_attn_has_panels(n) (the level
 * has them and n % 16 == 0): tl_attn_k_panels_* transposes K rows [0, rows)
 * (f32 or f16, ldk elements apart) into tl_attn_panels_floats(rows, n)
 * floats at kp, and tl_attn_scores_panels writes out[i][r] for queries
 * i < nq and rows r < rows, each bitwise tl_dot_rows_f32(q[i], row r). */
int tl_attn_has_panels(int64_t n);
size_t tl_attn_panels_floats(int rows, int64_t n);
void tl_attn_k_panels_f32(const float *k, size_t ldk, int rows, int64_t n, float *kp);
void tl_attn_k_panels_f16(const uint16_t *k, size_t ldk, int rows, int64_t n, float *kp);
void tl_attn_scores_panels(int nq, const float *const *q, const float *kp, int rows, int64_t n, float scale,
                           float *const *out);

/* Weighted sums of q8 V rows in int8 (q8 V in ggml's q8_0 blocks): the
 * weights of 16 rows are quantized to u8 per 32-value group, with the
 * rows' scales folded in, so the sums are vpdpbusd's (64 products an
 * instruction against 16 for f32 FMAs).
 * tl_attn_v8_prep: rows [0, rows), rows <= 16, of q8_0 rows of hd values
 * (hd % 32 == 0) row_bytes apart, into tl_attn_v8_bytes(hd) bytes at vp:
 * per group, the 16 row scales as floats, then the values transposed in
 * quads of rows (byte 4d + j of quad k: value d of row 4k + j); rows past
 * `rows` zero. tl_attn_v8_sum: for q < nq, y[q][0, hd) += rows [r0, r1) of
 * the piece weighted by a[q][r] (a[q] indexed from the piece's row 0). Per
 * query and group: p_r = a[q][r] * scale_r (0 outside [r0, r1), and for
 * NaN or below 0), m = max p_r, and where m > 0, u_r = p_r * (255 / m)
 * clamped to [0, 255] and rounded to nearest even, then y[d] = fmaf(sum_r
 * u_r * v_rd, m / 255, y[d]). The integer sums are exact, so every level is
 * bitwise the scalar code. */
size_t tl_attn_v8_bytes(int hd);
void tl_attn_v8_prep(const uint8_t *v, size_t row_bytes, int rows, int hd, void *vp);
void tl_attn_v8_sum(int nq, float *const *y, const float *const *a, const void *vp, int r0, int r1, int hd);

/* CPU feature level: 0 scalar, 1 AVX2+FMA+F16C, 2 AVX-512 (F, BW, VL),
 * 3 AVX-512 with AMX-INT8 tiles the OS grants (Sapphire Rapids on). */
enum { TL_ISA_SCALAR = 0, TL_ISA_AVX2 = 1, TL_ISA_AVX512 = 2, TL_ISA_AMX = 3 };
/* Detects the CPU and selects kernels; idempotent and thread-safe.
 * TINYLOOP_ISA=scalar|avx2|avx512|amx caps the level (for testing). */
void tl_kernels_init(void);
/* Forces a level (capped to what the CPU supports); returns the level in use. */
int tl_kernels_set_isa(int level);
int tl_kernels_isa(void);
const char *tl_isa_name(int level);

#endif
