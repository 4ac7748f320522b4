/* matmul.cu - everything that reads packed weights: dequantize, the
 * dequantize-on-the-fly matrix-vector / small-batch kernel, the cuBLAS
 * GEMM path for prefill batches, and the embedding row gather.
 *
 * out (T, n_out) = x (T, n_in) . W^T with W row-major (n_out, n_in), the
 * GGUF layout. In cuBLAS's column-major terms W is (n_in, n_out) with
 * ld n_in, x is (n_in, T) with ld n_in, and out is (n_out, T) with ld n_out,
 * so out = op_T(W) . x. */
#include "cuda_impl.h"

#define MV_WARPS 4 /* output rows per block (one warp each) */
#define MV_MAX_T 8 /* rows of x per pass over W */

/* One element of a float-typed row (the tail past the last group of 8). */
template <int TYPE> static __device__ __forceinline__ float load1(const uint8_t *row, int e) {
    if (TYPE == TLC_F32) return ((const float *)row)[e];
    if (TYPE == TLC_F16) return __half2float(__ushort_as_half(((const uint16_t *)row)[e]));
    if (TYPE == TLC_BF16) return __uint_as_float((uint32_t)((const uint16_t *)row)[e] << 16);
    return 0.0f;
}

/* A warp per output row, lanes striding over groups of 8 weights; up to
 * MV_MAX_T rows of x share each dequantized group. */
template <int TYPE>
static __global__ void kernel_matvec(float *out, const float *x, const uint8_t *w, size_t row_bytes, int n_in,
                                     int n_out, int T) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r = blockIdx.x * MV_WARPS + warp;
    if (r >= n_out) return;
    const int t0 = blockIdx.y * MV_MAX_T, nt = min(MV_MAX_T, T - t0);
    const uint8_t *row = w + (size_t)r * row_bytes;
    const float *xt = x + (size_t)t0 * n_in;
    float acc[MV_MAX_T];
#pragma unroll
    for (int t = 0; t < MV_MAX_T; t++) acc[t] = 0.0f;
    const int ng = n_in / 8;
    for (int g = lane; g < ng; g += 32) {
        float v[8];
        tlc_load8<TYPE>(row, g, v);
#pragma unroll
        for (int t = 0; t < MV_MAX_T; t++) {
            if (t < nt) {
                const float *xr = xt + (size_t)t * n_in + 8 * g;
                float s = 0.0f;
#pragma unroll
                for (int j = 0; j < 8; j++) s = fmaf(v[j], xr[j], s);
                acc[t] += s;
            }
        }
    }
    for (int e = ng * 8 + lane; e < n_in; e += 32) {
        const float wv = load1<TYPE>(row, e);
#pragma unroll
        for (int t = 0; t < MV_MAX_T; t++)
            if (t < nt) acc[t] = fmaf(wv, xt[(size_t)t * n_in + e], acc[t]);
    }
#pragma unroll
    for (int t = 0; t < MV_MAX_T; t++) {
        if (t >= nt) break; /* warp-uniform: decode (nt = 1) reduces one sum, not eight */
        float s = acc[t];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0) out[(size_t)(t0 + t) * n_out + r] = s;
    }
}

template <typename OUT> static __device__ __forceinline__ OUT to_out(float v);
template <> __device__ __forceinline__ float to_out<float>(float v) { return v; }
template <> __device__ __forceinline__ __half to_out<__half>(float v) { return __float2half_rn(v); }

/* A block per row: dst row i = dequantize(src row rows ? rows[i] : i);
 * rows outside [0, n_src_rows) give zeros (the embedding gather). */
template <int TYPE, typename OUT>
static __global__ void kernel_dequantize(OUT *dst, const uint8_t *src, size_t row_bytes, int n, const int32_t *rows,
                                         int n_src_rows) {
    const int i = blockIdx.x;
    const int sr = rows ? rows[i] : i;
    OUT *d = dst + (size_t)i * n;
    if (sr < 0 || sr >= n_src_rows) {
        for (int e = threadIdx.x; e < n; e += blockDim.x) d[e] = to_out<OUT>(0.0f);
        return;
    }
    const uint8_t *row = src + (size_t)sr * row_bytes;
    const int ng = n / 8;
    for (int g = threadIdx.x; g < ng; g += blockDim.x) {
        float v[8];
        tlc_load8<TYPE>(row, g, v);
#pragma unroll
        for (int j = 0; j < 8; j++) d[8 * g + j] = to_out<OUT>(v[j]);
    }
    for (int e = ng * 8 + threadIdx.x; e < n; e += blockDim.x) d[e] = to_out<OUT>(load1<TYPE>(row, e));
}

/* Block r: row r of x (n floats) to f16 for the GEMM. A row whose largest
 * magnitude exceeds TLC_F16_ROW_MAX would overflow f16 (65504) on some
 * models' FFN activations; it is divided by a power of two scale[r] first
 * (exact), and kernel_unscale_rows multiplies its output row back. Rows in
 * range get scale 1 and convert exactly as a plain cast would. */
#define TLC_F16_ROW_MAX 32768.0f
static __global__ void kernel_rows_to_f16(__half *dst, float *scale, const float *src, int n) {
    __shared__ float red[32];
    const float *x = src + (size_t)blockIdx.x * n;
    float m = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, fabsf(x[i]));
    m = tlc_block_reduce<true>(m, red);
    float s = 1.0f;
    if (m > TLC_F16_ROW_MAX && isfinite(m)) { /* an inf stays inf, as on the CPU */
        int e;
        frexpf(m / TLC_F16_ROW_MAX, &e); /* m / MAX < 2^e */
        s = ldexpf(1.0f, e);
    }
    const float inv = 1.0f / s;
    __half *d = dst + (size_t)blockIdx.x * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) d[i] = __float2half_rn(x[i] * inv);
    if (threadIdx.x == 0) scale[blockIdx.x] = s;
}

static __global__ void kernel_unscale_rows(float *out, const float *scale, int n) {
    const float s = scale[blockIdx.x];
    if (s == 1.0f) return;
    float *o = out + (size_t)blockIdx.x * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) o[i] *= s;
}

/* ---- launchers --------------------------------------------------------------- */

static int check_weights(int type, int64_t n_in, size_t *row_bytes) {
    *row_bytes = tlc_row_bytes(type, n_in);
    if (*row_bytes == 0)
        return tlc_fail(TL_CUDA_ERR_ARG, "check_weights", __FILE__, __LINE__,
                        "type %d unsupported or row length %lld not a multiple of its block", type, (long long)n_in);
    return TL_CUDA_OK;
}

/* dst (n_rows, n) of OUT = dequantize(src). */
template <typename OUT> static int dequantize_rows(tl_cuda *c, OUT *dst, const void *src, int type, int n_rows, int n) {
    TLC_ARG(c && dst && src && n_rows >= 0, "bad arguments");
    size_t rb;
    int rc = check_weights(type, n, &rb);
    if (rc) return rc;
    if (n_rows == 0) return TL_CUDA_OK;
    TLC_BIND(c);
    TLC_DISPATCH_TYPE(type, (kernel_dequantize<T_, OUT><<<n_rows, 128, 0, c->stream>>>(dst, (const uint8_t *)src, rb, n,
                                                                                       NULL, n_rows)));
    TLC_LAUNCHED(kernel_dequantize);
    return TL_CUDA_OK;
}

extern "C" TL_CUDA_API int tl_cuda_dequantize(tl_cuda *c, float *dst, const void *src, int type, int n_rows, int n) {
    return dequantize_rows(c, dst, src, type, n_rows, n);
}

extern "C" TL_CUDA_API int tl_cuda_dequantize_f16(tl_cuda *c, void *dst, const void *src, int type, int n_rows,
                                                  int n) {
    return dequantize_rows(c, (__half *)dst, src, type, n_rows, n);
}

extern "C" TL_CUDA_API int tl_cuda_get_rows(tl_cuda *c, float *out, const void *table, int type, int dim, int n_rows,
                                            const int32_t *ids, int n_ids) {
    TLC_ARG(c && out && table && ids && n_ids >= 0, "bad arguments");
    size_t rb;
    int rc = check_weights(type, dim, &rb);
    if (rc) return rc;
    if (n_ids == 0) return TL_CUDA_OK;
    TLC_BIND(c);
    TLC_DISPATCH_TYPE(type, (kernel_dequantize<T_, float><<<n_ids, 128, 0, c->stream>>>(out, (const uint8_t *)table, rb,
                                                                                        dim, ids, n_rows)));
    TLC_LAUNCHED(kernel_dequantize);
    return TL_CUDA_OK;
}

static int matvec(tl_cuda *c, float *out, const float *x, const void *w, int type, size_t rb, int n_in, int n_out,
                  int T) {
    dim3 grid((n_out + MV_WARPS - 1) / MV_WARPS, (T + MV_MAX_T - 1) / MV_MAX_T);
    TLC_ARG(grid.y <= 65535, "T %d too large for the direct path", T);
    TLC_DISPATCH_TYPE(type, (kernel_matvec<T_><<<grid, 32 * MV_WARPS, 0, c->stream>>>(out, x, (const uint8_t *)w, rb,
                                                                                      n_in, n_out, T)));
    TLC_LAUNCHED(kernel_matvec);
    return TL_CUDA_OK;
}

static int gemm(tl_cuda *c, float *out, const float *x, const void *w, int type, size_t rb, int n_in, int n_out,
                int T) {
    const float one = 1.0f, zero = 0.0f;
    if (type == TLC_F32) {
        TLC_CHECK_BLAS(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, n_out, T, n_in, &one, w, CUDA_R_32F, n_in, x,
                                    CUDA_R_32F, n_in, &zero, out, CUDA_R_32F, n_out, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT));
        return TL_CUDA_OK;
    }
    const void *a = w;
    int rc;
    if (type != TLC_F16) {
        rc = tlc_scratch(c, &c->w16, &c->w16_bytes, (size_t)n_out * n_in * sizeof(__half));
        if (rc) return rc;
        __half *w16 = (__half *)c->w16;
        TLC_DISPATCH_TYPE(type, (kernel_dequantize<T_, __half><<<n_out, 128, 0, c->stream>>>(
                                    w16, (const uint8_t *)w, rb, n_in, NULL, n_out)));
        TLC_LAUNCHED(kernel_dequantize);
        a = w16;
    }
    /* x16 scratch: T rows of f16, then T row scales */
    const size_t scales_off = ((size_t)T * n_in * sizeof(__half) + 255) / 256 * 256;
    rc = tlc_scratch(c, &c->x16, &c->x16_bytes, scales_off + (size_t)T * sizeof(float));
    if (rc) return rc;
    float *scales = (float *)((char *)c->x16 + scales_off);
    kernel_rows_to_f16<<<T, 256, 0, c->stream>>>((__half *)c->x16, scales, x, n_in);
    TLC_LAUNCHED(kernel_rows_to_f16);
    TLC_CHECK_BLAS(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, n_out, T, n_in, &one, a, CUDA_R_16F, n_in, c->x16,
                                CUDA_R_16F, n_in, &zero, out, CUDA_R_32F, n_out, CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT));
    kernel_unscale_rows<<<T, 256, 0, c->stream>>>(out, scales, n_out);
    TLC_LAUNCHED(kernel_unscale_rows);
    return TL_CUDA_OK;
}

extern "C" TL_CUDA_API int tl_cuda_matmul_path(tl_cuda *c, float *out, const float *x, const void *w, int type,
                                               int n_in, int n_out, int T, int path) {
    TLC_ARG(c && out && x && w && n_out >= 0 && T >= 0, "bad arguments");
    size_t rb;
    int rc = check_weights(type, n_in, &rb);
    if (rc) return rc;
    if (n_out == 0 || T == 0) return TL_CUDA_OK;
    TLC_BIND(c);
    if (path == TL_CUDA_MM_AUTO) path = T >= TL_CUDA_GEMM_MIN_T ? TL_CUDA_MM_GEMM : TL_CUDA_MM_DIRECT;
    if (path == TL_CUDA_MM_GEMM) return gemm(c, out, x, w, type, rb, n_in, n_out, T);
    TLC_ARG(path == TL_CUDA_MM_DIRECT, "unknown matmul path %d", path);
    return matvec(c, out, x, w, type, rb, n_in, n_out, T);
}

extern "C" TL_CUDA_API int tl_cuda_matmul(tl_cuda *c, float *out, const float *x, const void *w, int type, int n_in,
                                          int n_out, int T) {
    return tl_cuda_matmul_path(c, out, x, w, type, n_in, n_out, T, TL_CUDA_MM_AUTO);
}
