/* cuda_emu.h - runs the CUDA backend's own kernels on the CPU, so a machine
 * without a GPU (CI) executes kernels/cuda/*.cu rather than only compiling
 * them. Built with a host C++ compiler and -DTLC_EMU: cuda_impl.h then
 * includes this header instead of the CUDA toolkit's.
 *
 * What it models: every CUDA thread of a block is a fiber (ucontext) in one
 * OS thread; __syncthreads is a barrier over the block's live threads and
 * a warp shuffle a barrier over the warp's 32 lanes, so code that forgets
 * a barrier reads stale values here too, and a barrier not every thread
 * reaches is reported as a deadlock. Blocks run one after another, so
 * __shared__ (made `static`) is the block's. Device memory is host memory;
 * launches and copies complete before they return (a stream is in order
 * anyway). cublasGemmEx is a plain column-major GEMM with the same
 * argument rules (types, transposes, leading dimensions), checked.
 *
 * What it does not model: timing, memory coalescing, the memory model of
 * concurrent blocks (blocks never overlap here), and the device's exp/sqrt
 * rounding (the host's libm is used); tests compare with tolerances anyway.
 *
 * Graphs: a stream between cudaStreamBeginCapture and cudaStreamEndCapture
 * records its launches, copies, memsets and GEMMs (arguments by value, as
 * a kernel node keeps them) instead of running them; cudaGraphLaunch
 * replays the record. A synchronisation or an allocation while this thread
 * captures invalidates the capture, as in CUDA's thread-local mode (the
 * emulation also refuses cudaMallocAsync there, which CUDA would turn into
 * a graph-owned allocation: the backend must never grow scratch in one).
 *
 * Events: a stream runs its work as it is queued, so a recorded event has
 * completed and a stream waiting on it waits for nothing; both refuse a
 * capturing stream (CUDA would add graph nodes; the backend never does).
 *
 * Launch syntax: the build rewrites `kernel<<<g, b, smem, stream>>>(args)`
 * into `tlemu::launch(kernel)(g, b, smem, stream)(args)` with sed
 * (kernels/cuda/Makefile.inc). */
#ifndef TL_CUDA_EMU_H
#define TL_CUDA_EMU_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <functional>
#include <tuple>

/* ---- language ----------------------------------------------------------- */

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static /* blocks run one at a time: a static is the block's */

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
typedef dim3 uint3;

struct tlemu_fiber;
extern tlemu_fiber *tlemu_cur;
extern dim3 tlemu_block_idx, tlemu_block_dim, tlemu_grid_dim;
const dim3 &tlemu_thread_idx(void);
#define threadIdx (tlemu_thread_idx())
#define blockIdx tlemu_block_idx
#define blockDim tlemu_block_dim
#define gridDim tlemu_grid_dim

void __syncthreads(void);
uint64_t tlemu_shfl_bits(uint64_t bits, int src_lane);
float *tlemu_dyn_smem(void);

template <typename T> static inline T tlemu_shfl(T v, int src) {
    uint64_t b = 0;
    memcpy(&b, &v, sizeof v);
    b = tlemu_shfl_bits(b, src);
    T r;
    memcpy(&r, &b, sizeof r);
    return r;
}
int tlemu_lane(void);
template <typename T> static inline T __shfl_sync(unsigned, T v, int src) { return tlemu_shfl(v, src & 31); }
template <typename T> static inline T __shfl_xor_sync(unsigned, T v, int mask) {
    return tlemu_shfl(v, (tlemu_lane() ^ mask) & 31);
}

static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __uint_as_float(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---- half precision (round to nearest even, as __float2half_rn) ------------ */

struct __half {
    uint16_t x;
};
static inline __half __ushort_as_half(unsigned short u) { return __half{(uint16_t)u}; }
static inline unsigned short __half_as_ushort(__half h) { return h.x; }
static inline float __half2float(__half h) {
    const uint32_t s = (uint32_t)(h.x & 0x8000) << 16, e = (h.x >> 10) & 0x1f, m = h.x & 0x3ff;
    uint32_t u;
    if (e == 0x1f) u = s | 0x7f800000u | (m << 13);
    else if (e) u = s | ((e + 112) << 23) | (m << 13);
    else if (!m) u = s;
    else { /* subnormal */
        int sh = 0;
        uint32_t mm = m;
        while (!(mm & 0x400)) mm <<= 1, sh++;
        u = s | ((uint32_t)(113 - sh) << 23) | ((mm & 0x3ff) << 13);
    }
    return __uint_as_float(u);
}
static inline __half __float2half_rn(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    const uint16_t s = (uint16_t)((u >> 16) & 0x8000);
    const uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return __half{(uint16_t)(s | 0x7e00)}; /* NaN */
    if (a >= 0x477ff000u) return __half{(uint16_t)(s | 0x7c00)}; /* rounds to inf */
    if (a < 0x38800000u) {                                      /* subnormal or zero */
        if (a < 0x33000000u) return __half{s};                  /* below half the smallest subnormal */
        const uint32_t m = (a & 0x7fffff) | 0x800000;
        const int shift = 126 - (int)(a >> 23);                  /* 14 .. 24 */
        uint32_t r = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return __half{(uint16_t)(s | r)};
    }
    uint32_t r = ((a >> 13) - (112u << 10));
    const uint32_t rem = a & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) r++;
    return __half{(uint16_t)(s | r)};
}

/* ---- runtime -------------------------------------------------------------- */

typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevice = 101,
    cudaErrorLaunchFailure = 719,
    cudaErrorStreamCaptureUnsupported = 900,
    cudaErrorStreamCaptureInvalidated = 901,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorIllegalState = 401,
} cudaError_t;
typedef struct tlemu_stream *cudaStream_t;
typedef struct tlemu_event *cudaEvent_t;
typedef struct tlemu_graph *cudaGraph_t;
typedef struct tlemu_graph *cudaGraphExec_t;
enum cudaStreamCaptureMode {
    cudaStreamCaptureModeGlobal = 0,
    cudaStreamCaptureModeThreadLocal = 1,
    cudaStreamCaptureModeRelaxed = 2
};
enum cudaMemcpyKind { cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2, cudaMemcpyDeviceToDevice = 3 };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
#define cudaStreamNonBlocking 0x01
#define cudaEventDefault 0x00
#define cudaEventDisableTiming 0x02
#define cudaHostAllocDefault 0x00
#define cudaHostAllocPortable 0x01
#define cudaHostAllocMapped 0x02
#define cudaHostAllocWriteCombined 0x04

struct cudaDeviceProp {
    char name[256];
    int major, minor;
    size_t totalGlobalMem;
};

const char *cudaGetErrorString(cudaError_t e);
const char *cudaGetErrorName(cudaError_t e);
cudaError_t cudaGetLastError(void);
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaGetDevice(int *d);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d);
cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocAsync(void **p, size_t bytes, cudaStream_t s);
cudaError_t cudaFreeAsync(void *p, cudaStream_t s);
cudaError_t cudaMallocHost(void **p, size_t bytes);
cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = 0);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags = 0);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s);
cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes, cudaStream_t s);
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long flags = 0);
cudaError_t cudaGraphUpload(cudaGraphExec_t e, cudaStream_t s);
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s);
cudaError_t cudaGraphDestroy(cudaGraph_t g);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e);
cudaError_t tlemu_set_smem_limit(int bytes);
template <typename F> static inline cudaError_t cudaFuncSetAttribute(F, cudaFuncAttribute, int bytes) {
    return tlemu_set_smem_limit(bytes);
}

/* Runs body once per thread of every block of the grid, or records that
 * for a replay when the stream is capturing. */
void tlemu_launch(const char *name, dim3 grid, dim3 block, size_t smem, cudaStream_t s, std::function<void()> body);

namespace tlemu {
template <typename... P> struct config {
    void (*f)(P...);
    const char *name;
    dim3 g, b;
    size_t smem;
    cudaStream_t stream;
    void operator()(P... a) const { /* the kernel's parameter types: the call converts, as a launch does */
        const std::tuple<P...> args(a...);
        void (*fn)(P...) = f;
        tlemu_launch(name, g, b, smem, stream, [fn, args]() { std::apply(fn, args); });
    }
};
template <typename... P> struct kernel {
    void (*f)(P...);
    const char *name;
    config<P...> operator()(dim3 g, dim3 b, size_t smem = 0, cudaStream_t s = 0) const {
        return {f, name, g, b, smem, s};
    }
};
template <typename... P> kernel<P...> launch(void (*f)(P...), const char *name) { return {f, name}; }
} // namespace tlemu

/* ---- cuBLAS (cublasGemmEx only) ------------------------------------------- */

typedef struct tlemu_blas *cublasHandle_t;
typedef enum { CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_INVALID_VALUE = 7, CUBLAS_STATUS_NOT_SUPPORTED = 15 } cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
typedef enum { CUDA_R_32F = 0, CUDA_R_16F = 2 } cudaDataType;
typedef enum { CUBLAS_COMPUTE_32F = 68 } cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;

cublasStatus_t cublasCreate(cublasHandle_t *h);
cublasStatus_t cublasDestroy(cublasHandle_t h);
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s);
cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void *workspace, size_t bytes);
const char *cublasGetStatusString(cublasStatus_t s);
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType at, int lda, const void *B,
                            cudaDataType bt, int ldb, const void *beta, void *C, cudaDataType ct, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t algo);

#endif
