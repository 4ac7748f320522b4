/* ops.cu - element-wise and row-wise kernels: RMSNorm, RoPE, gated
 * activations, residual add, argmax. The formulas follow engine/forward.c
 * so the CPU backend is the reference. */
#include <math.h>

#include "cuda_impl.h"

static __global__ void kernel_rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    __shared__ float red[32];
    const float *xr = x + (size_t)blockIdx.x * n;
    float *o = out + (size_t)blockIdx.x * n;
    float s = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s = fmaf(xr[i], xr[i], s);
    s = tlc_block_reduce<false>(s, red);
    const float scale = 1.0f / sqrtf(s / n + eps); /* as forward.c (rsqrtf is off by up to 2 ulp) */
    for (int i = threadIdx.x; i < n; i += blockDim.x) o[i] = (xr[i] * scale) * w[i];
}

/* A block per (token, head); thread i rotates pair i. theta advances by
 * repeated multiplication, as the CPU loop does, so angles match bitwise. */
static __global__ void kernel_rope(float *x, int tok_stride, int n_head, int head_dim, int n_rot, const int32_t *pos,
                                   float theta_scale, int neox, const float *freq_factors) {
    const int t = blockIdx.x / n_head, h = blockIdx.x % n_head;
    float *v = x + (size_t)t * tok_stride + (size_t)h * head_dim;
    const float p = (float)pos[t];
    for (int i = threadIdx.x; i < n_rot / 2; i += blockDim.x) {
        float theta = p;
        for (int k = 0; k < i; k++) theta *= theta_scale;
        const float th = freq_factors ? theta / freq_factors[i] : theta;
        float s, c;
        sincosf(th, &s, &c);
        const int a = neox ? i : 2 * i, b = neox ? i + n_rot / 2 : 2 * i + 1;
        const float x0 = v[a], x1 = v[b];
        v[a] = x0 * c - x1 * s;
        v[b] = x0 * s + x1 * c;
    }
}

enum { ACT_SILU, ACT_GELU, ACT_ADD };

template <int ACT> static __global__ void kernel_binary(float *out, const float *a, const float *b, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float g = a[i], u = b[i];
        float r;
        if (ACT == ACT_SILU) {
            r = g / (1.0f + expf(-g)) * u;
        } else if (ACT == ACT_GELU) {
            const float k = 0.79788456080286535587989211986876f; /* sqrt(2/pi) */
            r = 0.5f * g * (1.0f + tanhf(k * g * (1.0f + 0.044715f * g * g))) * u;
        } else {
            r = g + u;
        }
        out[i] = r;
    }
}

/* A block per row: the largest value, lowest index on ties, NaN skipped. */
static __global__ void kernel_argmax(int32_t *ids, const float *x, int n) {
    __shared__ float sv[32];
    __shared__ int si[32];
    const float *xr = x + (size_t)blockIdx.x * n;
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = xr[i];
        if (v > bv || (v == bv && i < bi)) bv = v, bi = i;
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
    }
    if (lane == 0) sv[warp] = bv, si[warp] = bi;
    __syncthreads();
    if (warp == 0) {
        const int nw = blockDim.x >> 5;
        bv = lane < nw ? sv[lane] : -INFINITY;
        bi = lane < nw ? si[lane] : 0x7fffffff;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
        }
        if (lane == 0) ids[blockIdx.x] = bi == 0x7fffffff ? 0 : bi;
    }
}

/* ---- launchers --------------------------------------------------------------- */

extern "C" TL_CUDA_API int tl_cuda_rmsnorm(tl_cuda *c, float *out, const float *x, const float *w, int n_rows, int n,
                                           float eps) {
    TLC_ARG(c && out && x && w && n_rows >= 0 && n > 0, "bad arguments (n_rows %d, n %d)", n_rows, n);
    if (n_rows == 0) return TL_CUDA_OK;
    TLC_BIND(c);
    kernel_rmsnorm<<<n_rows, n >= 1024 ? 1024 : 256, 0, c->stream>>>(out, x, w, n, eps);
    TLC_LAUNCHED(kernel_rmsnorm);
    return TL_CUDA_OK;
}

extern "C" TL_CUDA_API int tl_cuda_rope(tl_cuda *c, float *x, int n_tok, int tok_stride, int n_head, int head_dim,
                                        int n_rot, const int32_t *pos, float base, int rope_type,
                                        const float *freq_factors) {
    TLC_ARG(c && x && pos && n_tok >= 0 && n_head > 0, "bad arguments");
    TLC_ARG(n_rot > 0 && n_rot % 2 == 0 && n_rot <= head_dim && tok_stride >= n_head * head_dim,
            "bad rope shape (n_rot %d, head_dim %d, n_head %d, tok_stride %d)", n_rot, head_dim, n_head, tok_stride);
    TLC_ARG(rope_type == TL_CUDA_ROPE_NORM || rope_type == TL_CUDA_ROPE_NEOX, "unknown rope type %d", rope_type);
    if (n_tok == 0) return TL_CUDA_OK;
    TLC_BIND(c);
    /* Same host powf as the CPU path, so theta_scale is bitwise equal. */
    const float theta_scale = powf(base, -2.0f / (float)n_rot);
    const int threads = n_rot / 2 < 128 ? ((n_rot / 2 + 31) / 32) * 32 : 128;
    kernel_rope<<<(unsigned)n_tok * n_head, threads, 0, c->stream>>>(x, tok_stride, n_head, head_dim, n_rot, pos,
                                                                     theta_scale, rope_type == TL_CUDA_ROPE_NEOX,
                                                                     freq_factors);
    TLC_LAUNCHED(kernel_rope);
    return TL_CUDA_OK;
}

template <int ACT> static int binary(tl_cuda *c, float *out, const float *a, const float *b, int64_t n) {
    TLC_ARG(c && out && a && b && n >= 0, "bad arguments");
    if (n == 0) return TL_CUDA_OK;
    TLC_BIND(c);
    kernel_binary<ACT><<<tlc_grid_for(n), 256, 0, c->stream>>>(out, a, b, n);
    TLC_LAUNCHED(kernel_binary);
    return TL_CUDA_OK;
}

extern "C" TL_CUDA_API int tl_cuda_swiglu(tl_cuda *c, float *out, const float *gate, const float *up, int64_t n) {
    return binary<ACT_SILU>(c, out, gate, up, n);
}

extern "C" TL_CUDA_API int tl_cuda_geglu(tl_cuda *c, float *out, const float *gate, const float *up, int64_t n) {
    return binary<ACT_GELU>(c, out, gate, up, n);
}

extern "C" TL_CUDA_API int tl_cuda_add(tl_cuda *c, float *out, const float *a, const float *b, int64_t n) {
    return binary<ACT_ADD>(c, out, a, b, n);
}

extern "C" TL_CUDA_API int tl_cuda_argmax(tl_cuda *c, int32_t *ids_host, const float *x, int n_rows, int n) {
    TLC_ARG(c && ids_host && x && n_rows >= 0 && n > 0, "bad arguments (n_rows %d, n %d)", n_rows, n);
    if (n_rows == 0) return TL_CUDA_OK;
    TLC_BIND(c);
    if (c->ids_cap < n_rows) {
        if (c->ids) TLC_CHECK(cudaFreeAsync(c->ids, c->stream));
        c->ids = NULL;
        c->ids_cap = 0;
        void *p = NULL; /* c->ids stays NULL after a failure */
        TLC_CHECK(cudaMallocAsync(&p, (size_t)n_rows * sizeof(int32_t), c->stream));
        c->ids = (int32_t *)p;
        c->ids_cap = n_rows;
    }
    kernel_argmax<<<n_rows, 256, 0, c->stream>>>(c->ids, x, n);
    TLC_LAUNCHED(kernel_argmax);
    TLC_CHECK(cudaMemcpyAsync(ids_host, c->ids, (size_t)n_rows * sizeof(int32_t), cudaMemcpyDeviceToHost, c->stream));
    TLC_CHECK(cudaStreamSynchronize(c->stream));
    return TL_CUDA_OK;
}
