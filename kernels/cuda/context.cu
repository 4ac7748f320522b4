/* context.cu - the CUDA context (device, stream, cuBLAS handle), device
 * memory, and error reporting for the tl_cuda_* launchers. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_impl.h"

/* ---- errors ---------------------------------------------------------------- */

static thread_local char last_error[512];

extern "C" int tlc_fail(int code, const char *call, const char *file, int line, const char *fmt, ...) {
    int n = snprintf(last_error, sizeof last_error, "%s failed at %s:%d: ", call, file, line);
    if (n < 0 || (size_t)n >= sizeof last_error) return code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error + n, sizeof last_error - (size_t)n, fmt, ap);
    va_end(ap);
    return code;
}

extern "C" TL_CUDA_API const char *tl_cuda_last_error(void) { return last_error; }

/* ---- context --------------------------------------------------------------- */

extern "C" TL_CUDA_API int tl_cuda_device_count(int *out) {
    TLC_ARG(out, "out is NULL");
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        /* No driver / no device: not an error for the caller, who falls back. */
        (void)cudaGetLastError();
        n = 0;
    }
    *out = n;
    return TL_CUDA_OK;
}

extern "C" TL_CUDA_API int tl_cuda_init(int device, tl_cuda **out) {
    TLC_ARG(out, "out is NULL");
    *out = NULL;
    int n = 0;
    tl_cuda_device_count(&n);
    if (n == 0) return tlc_fail(TL_CUDA_ERR_NODEV, "tl_cuda_init", __FILE__, __LINE__, "no CUDA device");
    TLC_ARG(device >= 0 && device < n, "device %d out of range (%d devices)", device, n);
    tl_cuda *c = (tl_cuda *)calloc(1, sizeof *c);
    if (!c) return tlc_fail(TL_CUDA_ERR_NOMEM, "calloc", __FILE__, __LINE__, "%zu bytes", sizeof *c);
    c->device = device;
    int rc = TL_CUDA_OK;
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        rc = tlc_fail(TL_CUDA_ERR_CUDA, "cudaSetDevice/cudaStreamCreateWithFlags", __FILE__, __LINE__, "%s",
                      cudaGetErrorString(e));
        free(c);
        return rc;
    }
    /* cuBLAS's own workspace is allocated on first use, inside a graph
     * capture if that comes first: an explicit one (32 MiB, what cuBLAS
     * asks for on Hopper) keeps captured GEMMs allocation-free. */
    e = cudaMalloc(&c->blas_ws, TLC_BLAS_WORKSPACE);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        rc = tlc_fail(TL_CUDA_ERR_NOMEM, "cudaMalloc", __FILE__, __LINE__, "cuBLAS workspace of %d bytes: %s",
                      TLC_BLAS_WORKSPACE, cudaGetErrorString(e));
        cudaStreamDestroy(c->stream);
        free(c);
        return rc;
    }
    cublasStatus_t s = cublasCreate(&c->blas);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasSetStream(c->blas, c->stream);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasSetWorkspace(c->blas, c->blas_ws, TLC_BLAS_WORKSPACE);
    if (s != CUBLAS_STATUS_SUCCESS) {
        rc = tlc_fail(TL_CUDA_ERR_CUBLAS, "cublasCreate/cublasSetStream/cublasSetWorkspace", __FILE__, __LINE__, "%s",
                      cublasGetStatusString(s));
        if (c->blas) cublasDestroy(c->blas);
        cudaFree(c->blas_ws);
        cudaStreamDestroy(c->stream);
        free(c);
        return rc;
    }
    *out = c;
    return TL_CUDA_OK;
}

extern "C" TL_CUDA_API void tl_cuda_free(tl_cuda *c) {
    if (!c) return;
    cudaSetDevice(c->device);
    tl_cuda_graph_reset(c);
    cudaStreamSynchronize(c->stream);
    if (c->w16) cudaFree(c->w16);
    if (c->x16) cudaFree(c->x16);
    if (c->ids) cudaFree(c->ids);
    if (c->smp) cudaFree(c->smp);
    if (c->att_part) cudaFree(c->att_part);
    if (c->io_stream) {
        cudaStreamSynchronize(c->io_stream);
        cudaStreamDestroy(c->io_stream);
    }
    if (c->io_after) cudaEventDestroy(c->io_after);
    if (c->io_stage) cudaFreeHost(c->io_stage);
    cublasDestroy(c->blas);
    cudaFree(c->blas_ws);
    cudaStreamDestroy(c->stream);
    free(c);
}

extern "C" TL_CUDA_API int tl_cuda_device_name(tl_cuda *c, char *buf, size_t n) {
    TLC_ARG(c && buf && n > 0, "bad arguments");
    cudaDeviceProp p;
    TLC_CHECK(cudaGetDeviceProperties(&p, c->device));
    snprintf(buf, n, "%s (sm_%d%d, %.1f GiB)", p.name, p.major, p.minor, (double)p.totalGlobalMem / (1 << 30));
    return TL_CUDA_OK;
}

/* Scratch grows in the stream's order: the old buffer is released after
 * the work already queued that reads it, without a host wait. Graphs that
 * captured the old buffer are forgotten; a capture never grows one (its
 * key's eager first run did). */
extern "C" int tlc_scratch(tl_cuda *c, void **buf, size_t *cap, size_t bytes) {
    if (*cap >= bytes) return TL_CUDA_OK;
    if (c->capturing)
        return tlc_fail(TL_CUDA_ERR_ARG, "tlc_scratch", __FILE__, __LINE__,
                        "scratch of %zu bytes must grow to %zu inside a graph capture", *cap, bytes);
    if (buf != &c->smp) tl_cuda_graph_reset(c); /* sampling runs after a replay, never inside one */
    if (*buf) {
        TLC_CHECK(cudaFreeAsync(*buf, c->stream));
        *buf = NULL;
        *cap = 0;
    }
    size_t want = bytes + bytes / 4;
    void *p = NULL; /* *buf stays NULL after a failure (tl_cuda_free frees it) */
    TLC_CHECK(cudaMallocAsync(&p, want, c->stream));
    *buf = p;
    *cap = want;
    return TL_CUDA_OK;
}

/* ---- memory ---------------------------------------------------------------- */

extern "C" TL_CUDA_API int tl_cuda_alloc(tl_cuda *c, size_t bytes, void **out) {
    TLC_ARG(c && out, "bad arguments");
    *out = NULL;
    TLC_BIND(c);
    void *p = NULL; /* *out stays NULL after a failure, whatever cudaMalloc leaves */
    TLC_CHECK(cudaMalloc(&p, bytes ? bytes : 1));
    *out = p;
    return TL_CUDA_OK;
}

extern "C" TL_CUDA_API int tl_cuda_dealloc(tl_cuda *c, void *p) {
    TLC_ARG(c, "context is NULL");
    if (!p) return TL_CUDA_OK;
    TLC_BIND(c);
    TLC_CHECK(cudaFree(p));
    return TL_CUDA_OK;
}

extern "C" TL_CUDA_API int tl_cuda_upload(tl_cuda *c, void *dst, const void *src, size_t bytes) {
    TLC_ARG(c && (bytes == 0 || (dst && src)), "bad arguments");
    TLC_BIND(c);
    if (bytes) TLC_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream));
    return TL_CUDA_OK;
}

extern "C" TL_CUDA_API int tl_cuda_download(tl_cuda *c, void *dst, const void *src, size_t bytes) {
    TLC_ARG(c && (bytes == 0 || (dst && src)), "bad arguments");
    TLC_BIND(c);
    if (bytes) TLC_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream));
    TLC_CHECK(cudaStreamSynchronize(c->stream));
    return TL_CUDA_OK;
}

extern "C" TL_CUDA_API int tl_cuda_copy(tl_cuda *c, void *dst, const void *src, size_t bytes) {
    TLC_ARG(c && (bytes == 0 || (dst && src)), "bad arguments");
    TLC_BIND(c);
    if (bytes) TLC_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->stream));
    return TL_CUDA_OK;
}

extern "C" TL_CUDA_API int tl_cuda_sync(tl_cuda *c) {
    TLC_ARG(c, "context is NULL");
    TLC_BIND(c);
    TLC_CHECK(cudaStreamSynchronize(c->stream));
    return TL_CUDA_OK;
}

/* Tier copies have a stream of their own, outside the compute stream's
 * order and its graphs; an event puts each after the work queued there.
 * Pageable memory cannot be copied asynchronously: staging is pinned. */
static int io_ready(tl_cuda *c, size_t bytes) {
    if (!c->io_stream) TLC_CHECK(cudaStreamCreateWithFlags(&c->io_stream, cudaStreamNonBlocking));
    if (!c->io_after) TLC_CHECK(cudaEventCreateWithFlags(&c->io_after, cudaEventDisableTiming));
    if (c->io_stage_bytes >= bytes) return TL_CUDA_OK;
    if (c->io_stage) TLC_CHECK(cudaFreeHost(c->io_stage));
    c->io_stage = NULL;
    c->io_stage_bytes = 0;
    void *h = NULL;
    TLC_CHECK(cudaHostAlloc(&h, bytes, cudaHostAllocDefault));
    c->io_stage = h;
    c->io_stage_bytes = bytes;
    return TL_CUDA_OK;
}

extern "C" TL_CUDA_API int tl_cuda_io(tl_cuda *c, void *dev, void *host, size_t bytes, int to_device) {
    TLC_ARG(c && (bytes == 0 || (dev && host)), "bad arguments");
    TLC_ARG(!c->capturing, "a tier copy of %zu bytes inside a graph capture", bytes);
    if (!bytes) return TL_CUDA_OK;
    TLC_BIND(c);
    int rc = io_ready(c, bytes);
    if (rc) return rc;
    if (to_device) memcpy(c->io_stage, host, bytes);
    /* after whatever the compute stream has queued: the pass that wrote the
     * block (device -> host), or one still reading a block now reused (host -> device) */
    TLC_CHECK(cudaEventRecord(c->io_after, c->stream));
    TLC_CHECK(cudaStreamWaitEvent(c->io_stream, c->io_after, 0));
    if (to_device) TLC_CHECK(cudaMemcpyAsync(dev, c->io_stage, bytes, cudaMemcpyHostToDevice, c->io_stream));
    else TLC_CHECK(cudaMemcpyAsync(c->io_stage, dev, bytes, cudaMemcpyDeviceToHost, c->io_stream));
    TLC_CHECK(cudaStreamSynchronize(c->io_stream));
    if (!to_device) memcpy(host, c->io_stage, bytes);
    return TL_CUDA_OK;
}

extern "C" TL_CUDA_API int tl_cuda_type_supported(int type) { return tlc_row_bytes(type, 256) != 0; }
