/* cuda_impl.h - shared by the kernels/cuda/*.cu files only (never by the
 * engine): the context struct, error macros, and the per-type device
 * dequantizers (ggml block layouts, byte offsets as in quants_impl.h). */
#ifndef TL_CUDA_IMPL_H
#define TL_CUDA_IMPL_H

#ifdef TLC_EMU /* the CPU emulation (tests/gpu/emu) */
#include "cuda_emu.h"
#else
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#endif
#include <stdint.h>

#include "tl_cuda.h"
#include "../../engine/kv_layout.h" /* the KV block layout, shared with the engine */

#define TLC_HIDDEN __attribute__((visibility("hidden")))

enum {
    TLC_GRAPHS = 64,                /* executable graphs kept per context (LRU) */
    TLC_BLAS_WORKSPACE = 32 << 20,  /* bytes */
    TLC_MAX_DEVICES = 16            /* per-device state kept in statics */
};

typedef struct tlc_graph {
    int64_t key[TL_CUDA_GRAPH_KEY_MAX];
    int n_key;
    cudaGraphExec_t exec; /* NULL until the key's second run */
    uint64_t used;        /* LRU clock */
} tlc_graph;

struct tl_cuda {
    int device;
    cudaStream_t stream;
    cublasHandle_t blas;
    void *w16;           /* f16 scratch for dequantized weights (GEMM path) */
    size_t w16_bytes;
    void *x16;           /* f16 scratch for activations (GEMM path) */
    size_t x16_bytes;
    int32_t *ids;        /* device argmax results */
    int ids_cap;
    void *smp;           /* sampling scratch (sample.cu) */
    size_t smp_bytes;
    void *att_part;      /* split decode attention partials (attention.cu) */
    size_t att_part_bytes;
    void *blas_ws;       /* cuBLAS workspace, set explicitly so a capture never allocates one */
    /* tl_cuda_io, made on first use: its stream, the event that orders it
     * after the compute stream, and page-locked staging */
    cudaStream_t io_stream;
    cudaEvent_t io_after;
    void *io_stage;
    size_t io_stage_bytes;
    /* graph.cu */
    int graphs_on, capturing;
    tlc_graph graphs[TLC_GRAPHS];
    int n_graphs;
    uint64_t graph_clock;
};

/* Blocks of 256 threads for a grid-stride loop over n elements (at least
 * 1, at most 8192: each thread then takes several). */
static inline unsigned tlc_grid_for(int64_t n) {
    const int64_t b = (n + 255) / 256;
    return (unsigned)(b < 8192 ? (b > 0 ? b : 1) : 8192);
}

/* Records "call failed at file:line: detail" and returns code. */
extern "C" TLC_HIDDEN int tlc_fail(int code, const char *call, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* Grows a stream-ordered scratch buffer to at least `bytes`. */
extern "C" TLC_HIDDEN int tlc_scratch(tl_cuda *c, void **buf, size_t *cap, size_t bytes);

#define TLC_CHECK(call)                                                                               \
    do {                                                                                              \
        cudaError_t e_ = (call);                                                                      \
        if (e_ != cudaSuccess) {                                                                      \
            (void)cudaGetLastError(); /* clear a non-sticky error so later launch checks see their own */ \
            return tlc_fail(e_ == cudaErrorMemoryAllocation ? TL_CUDA_ERR_NOMEM : TL_CUDA_ERR_CUDA,  \
                            #call, __FILE__, __LINE__, "%s (%s)", cudaGetErrorString(e_),             \
                            cudaGetErrorName(e_));                                                    \
        }                                                                                             \
    } while (0)

#define TLC_CHECK_BLAS(call)                                                                          \
    do {                                                                                              \
        cublasStatus_t s_ = (call);                                                                   \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                              \
            return tlc_fail(TL_CUDA_ERR_CUBLAS, #call, __FILE__, __LINE__, "%s (%d)",                 \
                            cublasGetStatusString(s_), (int)s_);                                      \
    } while (0)

/* After a <<<>>> launch: catches bad configurations at once, naming the kernel. */
#define TLC_LAUNCHED(name)                                                                            \
    do {                                                                                              \
        cudaError_t e_ = cudaGetLastError(); /* also clears a non-sticky launch error */              \
        if (e_ != cudaSuccess)                                                                        \
            return tlc_fail(TL_CUDA_ERR_CUDA, #name " launch", __FILE__, __LINE__, "%s (%s)",         \
                            cudaGetErrorString(e_), cudaGetErrorName(e_));                            \
    } while (0)

/* Makes the context's device current on the calling thread. A context may
 * be used from several threads in turn (one at a time), and its stream and
 * cuBLAS handle only work while their device is current; a thread that
 * never chose one runs on device 0 (TINYLOOP_CUDA_DEVICE=1 would fail). */
#define TLC_BIND(c)                                                                                   \
    do {                                                                                              \
        int cur_ = -1;                                                                                \
        if (cudaGetDevice(&cur_) != cudaSuccess || cur_ != (c)->device) TLC_CHECK(cudaSetDevice((c)->device)); \
    } while (0)

#define TLC_ARG(cond, ...)                                                                            \
    do {                                                                                              \
        if (!(cond)) return tlc_fail(TL_CUDA_ERR_ARG, __func__, __FILE__, __LINE__, __VA_ARGS__);    \
    } while (0)

/* ---- reductions -------------------------------------------------------------- */

/* Sum, or maximum when MAX, of v over a block of blockDim.x threads (a
 * multiple of 32, <= 1024); every thread gets the result. red: 32 floats
 * of shared memory. (For a maximum, the padding 0 must be neutral: values
 * >= 0, such as magnitudes.) */
template <bool MAX> static __device__ __forceinline__ float tlc_block_reduce(float v, float *red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float w = __shfl_xor_sync(0xffffffffu, v, o);
        v = MAX ? fmaxf(v, w) : v + w;
    }
    __syncthreads(); /* red may still be read from a previous call */
    if (lane == 0) red[warp] = v;
    __syncthreads();
    const int nw = blockDim.x >> 5;
    v = threadIdx.x < nw ? red[threadIdx.x] : 0.0f;
    if (warp == 0) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float w = __shfl_xor_sync(0xffffffffu, v, o);
            v = MAX ? fmaxf(v, w) : v + w;
        }
        if (lane == 0) red[0] = v;
    }
    __syncthreads();
    return red[0];
}

/* ---- dequantization: 8 consecutive elements (8-aligned) of a row --------- */

enum {
    TLC_F32 = 0, TLC_F16 = 1, TLC_Q4_0 = 2, TLC_Q4_1 = 3, TLC_Q5_0 = 6, TLC_Q8_0 = 8,
    TLC_Q4_K = 12, TLC_Q5_K = 13, TLC_Q6_K = 14, TLC_BF16 = 30
};

static __device__ __forceinline__ float tlc_h(const uint8_t *p) {
    return __half2float(__ushort_as_half(*(const uint16_t *)p));
}

static __device__ __forceinline__ void tlc_scale_min_k4(int j, const uint8_t *q, int *d, int *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* v[0..7] = elements 8g .. 8g+7 of the row starting at `row`. Rows of the
 * quantized types are even-sized, so the f16 scales are 2-byte aligned. */
template <int TYPE> static __device__ __forceinline__ void tlc_load8(const uint8_t *row, int g, float *v) {
    if (TYPE == TLC_F32) {
        const float *r = (const float *)row + 8 * g;
#pragma unroll
        for (int j = 0; j < 8; j++) v[j] = r[j];
    } else if (TYPE == TLC_F16) {
        const uint16_t *r = (const uint16_t *)row + 8 * g;
#pragma unroll
        for (int j = 0; j < 8; j++) v[j] = __half2float(__ushort_as_half(r[j]));
    } else if (TYPE == TLC_BF16) {
        const uint16_t *r = (const uint16_t *)row + 8 * g;
#pragma unroll
        for (int j = 0; j < 8; j++) v[j] = __uint_as_float((uint32_t)r[j] << 16);
    } else if (TYPE == TLC_Q8_0) {
        const uint8_t *b = row + (g >> 2) * 34;
        const float d = tlc_h(b);
        const int8_t *qs = (const int8_t *)(b + 2) + (g & 3) * 8;
#pragma unroll
        for (int j = 0; j < 8; j++) v[j] = qs[j] * d;
    } else if (TYPE == TLC_Q4_0 || TYPE == TLC_Q4_1) {
        const int bsz = TYPE == TLC_Q4_0 ? 18 : 20, qoff = TYPE == TLC_Q4_0 ? 2 : 4;
        const uint8_t *b = row + (g >> 2) * bsz;
        const float d = tlc_h(b);
        const int o = (g & 3) * 8;
        const uint8_t *qs = b + qoff + (o & 15);
        const int sh = o >= 16 ? 4 : 0;
        if (TYPE == TLC_Q4_0) {
#pragma unroll
            for (int j = 0; j < 8; j++) v[j] = (((qs[j] >> sh) & 0xF) - 8) * d;
        } else {
            const float m = tlc_h(b + 2);
            /* __fmul_rn: no fma contraction, so the values equal quants_ref.c's bit for bit */
#pragma unroll
            for (int j = 0; j < 8; j++) v[j] = __fmul_rn((float)((qs[j] >> sh) & 0xF), d) + m;
        }
    } else if (TYPE == TLC_Q5_0) {
        const uint8_t *b = row + (g >> 2) * 22;
        const float d = tlc_h(b);
        const uint32_t qh = b[2] | (b[3] << 8) | (b[4] << 16) | ((uint32_t)b[5] << 24);
        const int o = (g & 3) * 8;
        const uint8_t *qs = b + 6 + (o & 15);
        const int sh = o >= 16 ? 4 : 0;
#pragma unroll
        for (int j = 0; j < 8; j++) v[j] = ((int)(((qs[j] >> sh) & 0xF) | (((qh >> (o + j)) & 1) << 4)) - 16) * d;
    } else if (TYPE == TLC_Q4_K || TYPE == TLC_Q5_K) {
        const int bsz = TYPE == TLC_Q4_K ? 144 : 176, qoff = TYPE == TLC_Q4_K ? 16 : 48;
        const uint8_t *b = row + (g >> 5) * bsz;
        const int o = (g & 31) * 8, j64 = o >> 6, l = o & 63, sub = 2 * j64 + (l >= 32);
        int sc, mn;
        tlc_scale_min_k4(sub, b + 4, &sc, &mn);
        const float d = tlc_h(b) * sc, m = tlc_h(b + 2) * mn;
        const uint8_t *qs = b + qoff + 32 * j64 + (l & 31);
        const int sh = l >= 32 ? 4 : 0;
        if (TYPE == TLC_Q4_K) {
#pragma unroll
            for (int j = 0; j < 8; j++) v[j] = __fmul_rn(d, (float)((qs[j] >> sh) & 0xF)) - m; /* no fma, as Q4_1 */
        } else {
            const uint8_t *qh = b + 16 + (l & 31);
#pragma unroll
            for (int j = 0; j < 8; j++)
                v[j] = __fmul_rn(d, (float)(((qs[j] >> sh) & 0xF) + ((qh[j] >> sub) & 1 ? 16 : 0))) - m;
        }
    } else if (TYPE == TLC_Q6_K) {
        const uint8_t *b = row + (g >> 5) * 210;
        const int o = (g & 31) * 8, half = o >> 7, r = o & 127, quarter = r >> 5, p = r & 31;
        const float d = tlc_h(b + 208) * (float)((const int8_t *)(b + 192))[o >> 4];
        const uint8_t *ql = b + 64 * half + ((quarter & 1) ? 32 : 0) + p, *qh = b + 128 + 32 * half + p;
        const int sh = (quarter & 2) ? 4 : 0;
#pragma unroll
        for (int j = 0; j < 8; j++) v[j] = d * (float)((int)(((ql[j] >> sh) & 0xF) | (((qh[j] >> (2 * quarter)) & 3) << 4)) - 32);
    }
}

/* Bytes per block and elements per block (host side). */
static inline int tlc_type_block(int type, size_t *bytes) {
    switch (type) {
    case TLC_F32: *bytes = 4; return 1;
    case TLC_F16: case TLC_BF16: *bytes = 2; return 1;
    case TLC_Q4_0: *bytes = 18; return 32;
    case TLC_Q4_1: *bytes = 20; return 32;
    case TLC_Q5_0: *bytes = 22; return 32;
    case TLC_Q8_0: *bytes = 34; return 32;
    case TLC_Q4_K: *bytes = 144; return 256;
    case TLC_Q5_K: *bytes = 176; return 256;
    case TLC_Q6_K: *bytes = 210; return 256;
    default: *bytes = 0; return 0;
    }
}

/* Row bytes of n elements, 0 when unsupported or n is not a block multiple. */
static inline size_t tlc_row_bytes(int type, int64_t n) {
    size_t bytes;
    int bs = tlc_type_block(type, &bytes);
    if (bs == 0 || n <= 0 || n % bs) return 0;
    return (size_t)(n / bs) * bytes;
}

/* Calls F<TYPE>::run(args...) for the runtime type; TL_CUDA_ERR_ARG otherwise. */
#define TLC_DISPATCH_TYPE(type, EXPR)                                                                 \
    switch (type) {                                                                                   \
    case TLC_F32: { constexpr int T_ = TLC_F32; EXPR; } break;                                        \
    case TLC_F16: { constexpr int T_ = TLC_F16; EXPR; } break;                                        \
    case TLC_BF16: { constexpr int T_ = TLC_BF16; EXPR; } break;                                      \
    case TLC_Q4_0: { constexpr int T_ = TLC_Q4_0; EXPR; } break;                                      \
    case TLC_Q4_1: { constexpr int T_ = TLC_Q4_1; EXPR; } break;                                      \
    case TLC_Q5_0: { constexpr int T_ = TLC_Q5_0; EXPR; } break;                                      \
    case TLC_Q8_0: { constexpr int T_ = TLC_Q8_0; EXPR; } break;                                      \
    case TLC_Q4_K: { constexpr int T_ = TLC_Q4_K; EXPR; } break;                                      \
    case TLC_Q5_K: { constexpr int T_ = TLC_Q5_K; EXPR; } break;                                      \
    case TLC_Q6_K: { constexpr int T_ = TLC_Q6_K; EXPR; } break;                                      \
    default: return tlc_fail(TL_CUDA_ERR_ARG, __func__, __FILE__, __LINE__, "unsupported type %d", type); \
    }

#endif
