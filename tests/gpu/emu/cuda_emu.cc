/* cuda_emu.cc - the runtime behind cuda_emu.h: fibers for CUDA threads,
 * barriers for __syncthreads and warp shuffles, host memory for device
 * memory, and a reference GEMM for cublasGemmEx. */
#include "cuda_emu.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <ucontext.h>

#include <vector>

/* ---- fibers ----------------------------------------------------------------- */

enum { MAX_THREADS = 1024, STACK = 128 << 10, WARP = 32 };

struct barrier {
    int live, arrived;
    unsigned gen;
};

struct tlemu_fiber {
    void *sp;          /* saved stack pointer (x86-64 switch) */
    ucontext_t ctx;    /* elsewhere */
    dim3 tid;
    int lane, warp, done;
    barrier *waiting; /* NULL when runnable */
    unsigned wait_gen;
};

struct warp_state {
    barrier bar;
    uint64_t slot[2][WARP]; /* alternate shuffles use alternate rows */
    int parity[WARP];       /* each lane's next row */
};

tlemu_fiber *tlemu_cur;
dim3 tlemu_block_idx, tlemu_block_dim, tlemu_grid_dim;

static pthread_mutex_t launch_mu = PTHREAD_MUTEX_INITIALIZER;
static tlemu_fiber fibers[MAX_THREADS];
static warp_state warps[MAX_THREADS / WARP];
static barrier block_bar;
static char *stacks;
static const std::function<void()> *cur_body;
static std::vector<float> dyn_smem;
static int smem_limit = 48 << 10;
static const char *cur_kernel = "";

const dim3 &tlemu_thread_idx(void) { return tlemu_cur->tid; }
int tlemu_lane(void) { return tlemu_cur->lane; }
float *tlemu_dyn_smem(void) { return dyn_smem.data(); }

/* A context switch is the emulation's inner loop (every barrier of every
 * thread): on x86-64 a six-register switch, elsewhere swapcontext (which
 * also saves the signal mask with a system call, ~50x slower). */
#if defined(__x86_64__)
extern "C" void tlemu_switch(void **save_sp, void *load_sp);
__asm__(".text\n"
        ".p2align 4\n"
        "tlemu_switch:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
        "  ret\n");
static void *sched_sp;
#define FAST_SWITCH 1
#else
#define FAST_SWITCH 0
static ucontext_t sched_ctx;
#endif

static void yield_to_scheduler(void) {
#if FAST_SWITCH
    tlemu_switch(&tlemu_cur->sp, sched_sp);
#else
    swapcontext(&tlemu_cur->ctx, &sched_ctx);
#endif
}

/* Arrive; wait until every live participant has. */
static void arrive(barrier *b) {
    const unsigned gen = b->gen;
    if (++b->arrived >= b->live) {
        b->arrived = 0;
        b->gen++;
        return;
    }
    tlemu_cur->waiting = b;
    tlemu_cur->wait_gen = gen;
    yield_to_scheduler();
}

/* A participant left (its thread returned): the others no longer wait for it. */
static void leave(barrier *b) {
    b->live--;
    if (b->arrived > 0 && b->arrived >= b->live) {
        b->arrived = 0;
        b->gen++;
    }
}

void __syncthreads(void) { arrive(&block_bar); }

/* One barrier per shuffle: a lane writes row p, waits for the warp, reads
 * row p. Its next shuffle writes the other row, and the one after that can
 * only come after the next barrier, which every lane reaches only once it
 * has read row p, so no value is overwritten before it is read. */
uint64_t tlemu_shfl_bits(uint64_t bits, int src) {
    warp_state *w = &warps[tlemu_cur->warp];
    const int lane = tlemu_cur->lane, p = w->parity[lane];
    w->parity[lane] = p ^ 1;
    w->slot[p][lane] = bits;
    arrive(&w->bar);
    return w->slot[p][src];
}

static void trampoline(void) {
    (*cur_body)();
    tlemu_fiber *f = tlemu_cur;
    f->done = 1;
    leave(&block_bar);
    leave(&warps[f->warp].bar);
#if FAST_SWITCH
    yield_to_scheduler(); /* never resumed */
    abort();
#endif
    /* returning resumes uc_link = the scheduler */
}

/* A new fiber's stack: six zero registers under trampoline's address, so
 * the first switch "returns" into trampoline with the stack aligned as
 * after a call. */
static void start_fiber(tlemu_fiber *f, char *stack) {
#if FAST_SWITCH
    uintptr_t top = ((uintptr_t)stack + STACK) & ~(uintptr_t)15;
    void **sp = (void **)(top - 64);
    for (int r = 0; r < 6; r++) sp[r] = NULL;
    sp[6] = (void *)trampoline;
    f->sp = sp;
#else
    getcontext(&f->ctx);
    f->ctx.uc_stack.ss_sp = stack;
    f->ctx.uc_stack.ss_size = STACK;
    f->ctx.uc_link = &sched_ctx;
    makecontext(&f->ctx, trampoline, 0);
#endif
}

static void resume(tlemu_fiber *f) {
#if FAST_SWITCH
    tlemu_switch(&sched_sp, f->sp);
#else
    swapcontext(&sched_ctx, &f->ctx);
#endif
}

static void run_block(int n_threads) {
    block_bar = barrier{n_threads, 0, 0};
    for (int w = 0; w * WARP < n_threads; w++) {
        const int lanes = n_threads - w * WARP < WARP ? n_threads - w * WARP : WARP;
        warps[w].bar = barrier{lanes, 0, 0};
        memset(warps[w].parity, 0, sizeof warps[w].parity);
    }
    const dim3 bd = tlemu_block_dim;
    for (int i = 0; i < n_threads; i++) {
        tlemu_fiber *f = &fibers[i];
        f->tid = dim3(i % bd.x, (i / bd.x) % bd.y, i / (bd.x * bd.y));
        f->lane = i % WARP;
        f->warp = i / WARP;
        f->done = 0;
        f->waiting = NULL;
        start_fiber(f, stacks + (size_t)i * STACK);
    }
    /* Passes alternate between ascending and descending thread order, so a
     * read of another thread's write that lacks a barrier sees a stale value
     * one way or the other (on a device the order is anyone's). */
    for (int left = n_threads, pass = 0;; pass++) {
        int progress = 0;
        for (int k = 0; k < n_threads; k++) {
            const int i = (pass + tlemu_block_idx.x + tlemu_block_idx.y) & 1 ? n_threads - 1 - k : k;
            tlemu_fiber *f = &fibers[i];
            if (f->done || (f->waiting && f->waiting->gen == f->wait_gen)) continue;
            f->waiting = NULL;
            tlemu_cur = f;
            resume(f);
            progress = 1;
            if (f->done) left--;
        }
        if (left == 0) return;
        if (!progress) {
            fprintf(stderr, "cuda_emu: deadlock in %s block (%u,%u,%u): %d threads wait at a barrier the others "
                            "never reach\n",
                    cur_kernel, tlemu_block_idx.x, tlemu_block_idx.y, tlemu_block_idx.z, left);
            abort();
        }
    }
}

/* ---- streams and graphs ------------------------------------------------------- */

typedef std::vector<std::function<void()>> op_list;

struct tlemu_stream {
    op_list *capture; /* non-NULL while capturing */
    bool invalid;     /* the capture met an operation a graph cannot hold */
};

struct tlemu_graph {
    op_list ops;
};

static thread_local tlemu_stream *capturing; /* this thread's capture (thread-local mode) */
static cudaError_t last_error = cudaSuccess;

/* An operation that may not happen during this thread's capture (a host
 * wait, an allocation): invalidates it and reports why, as CUDA does. */
static bool refused_in_capture(void) {
    if (!capturing) return false;
    capturing->invalid = true;
    return true;
}

/* Runs op now, or records it when s is capturing. */
static void enqueue(cudaStream_t s, std::function<void()> op) {
    if (s && s->capture) s->capture->push_back(std::move(op));
    else op();
}

static bool launch_ok(const char *name, dim3 grid, dim3 block, size_t smem) {
    const size_t nt = (size_t)block.x * block.y * block.z;
    if (nt == 0 || nt > MAX_THREADS || block.z > 64 || grid.x == 0 || grid.y == 0 || grid.z == 0 ||
        grid.y > 65535 || grid.z > 65535 || (int)smem > smem_limit || smem > (227 << 10)) {
        fprintf(stderr, "cuda_emu: invalid launch of %s: grid (%u,%u,%u) block (%u,%u,%u) smem %zu (limit %d)\n",
                name, grid.x, grid.y, grid.z, block.x, block.y, block.z, smem, smem_limit);
        last_error = cudaErrorInvalidConfiguration;
        return false;
    }
    return true;
}

static void run_grid(const char *name, dim3 grid, dim3 block, size_t smem, const std::function<void()> &body) {
    const size_t nt = (size_t)block.x * block.y * block.z;
    pthread_mutex_lock(&launch_mu);
    if (!stacks) {
        stacks = (char *)mmap(NULL, (size_t)MAX_THREADS * STACK, PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (stacks == MAP_FAILED) abort();
    }
    cur_kernel = name;
    cur_body = &body;
    dyn_smem.assign(smem / sizeof(float) + 1, NAN); /* garbage, as on a device */
    tlemu_grid_dim = grid;
    tlemu_block_dim = block;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                tlemu_block_idx = dim3(x, y, z);
                run_block((int)nt);
            }
    tlemu_cur = NULL;
    pthread_mutex_unlock(&launch_mu);
}

void tlemu_launch(const char *name, dim3 grid, dim3 block, size_t smem, cudaStream_t s, std::function<void()> body) {
    if (!launch_ok(name, grid, block, smem)) return; /* a bad configuration fails at launch, captured or not */
    enqueue(s, [=]() { run_grid(name, grid, block, smem, body); });
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode) {
    if (!s || s->capture || capturing) return cudaErrorIllegalState;
    s->capture = new op_list;
    s->invalid = false;
    capturing = s;
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g) {
    *g = NULL;
    if (!s || !s->capture || capturing != s) return cudaErrorIllegalState;
    op_list *ops = s->capture;
    s->capture = NULL;
    capturing = NULL;
    if (s->invalid) {
        delete ops;
        return cudaErrorStreamCaptureInvalidated;
    }
    *g = new tlemu_graph{std::move(*ops)};
    delete ops;
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long) {
    *e = NULL;
    if (!g) return cudaErrorInvalidValue;
    *e = new tlemu_graph{g->ops};
    return cudaSuccess;
}

cudaError_t cudaGraphUpload(cudaGraphExec_t e, cudaStream_t) { return e ? cudaSuccess : cudaErrorInvalidValue; }

cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s) {
    if (!e) return cudaErrorInvalidValue;
    for (const auto &op : e->ops) enqueue(s, op);
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t g) {
    delete g;
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) {
    delete e;
    return cudaSuccess;
}

/* ---- runtime ------------------------------------------------------------------ */

static size_t allocated;
static const size_t emu_total = (size_t)4 << 30; /* what the emulated device claims to have */

/* Each code's name and message, as the CUDA runtime words them; the last
 * entry stands for any other code. */
static const struct {
    cudaError_t code;
    const char *name, *text;
} errors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration", "invalid configuration argument"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported",
     "operation not permitted when stream is capturing"},
    {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated",
     "operation failed due to a previous error during capture"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorIllegalState, "cudaErrorIllegalState", "the operation cannot be performed in the present state"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
};
enum { N_ERRORS = sizeof errors / sizeof errors[0] };

static int error_index(cudaError_t e) {
    for (int i = 0; i < N_ERRORS - 1; i++)
        if (errors[i].code == e) return i;
    return N_ERRORS - 1;
}

const char *cudaGetErrorString(cudaError_t e) { return errors[error_index(e)].text; }
const char *cudaGetErrorName(cudaError_t e) { return errors[error_index(e)].name; }

cudaError_t cudaGetLastError(void) {
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

cudaError_t cudaGetDeviceCount(int *n) {
    *n = 1;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : (last_error = cudaErrorInvalidDevice); }

cudaError_t cudaGetDevice(int *d) {
    *d = 0;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d) {
    if (d != 0) return last_error = cudaErrorInvalidDevice;
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "cuda_emu (CPU emulation)");
    p->major = 9;
    p->totalGlobalMem = emu_total;
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b) {
    if (refused_in_capture()) return cudaErrorStreamCaptureUnsupported;
    *total_b = emu_total;
    *free_b = allocated < emu_total ? emu_total - allocated : 0;
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned) {
    *s = new tlemu_stream{NULL, false};
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if (s) delete s->capture;
    delete s;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t) {
    return refused_in_capture() ? cudaErrorStreamCaptureUnsupported : cudaSuccess;
}

/* Allocations carry their size in front, for cudaMemGetInfo. */
cudaError_t cudaMalloc(void **p, size_t bytes) {
    *p = NULL;
    if (refused_in_capture()) return cudaErrorStreamCaptureUnsupported;
    if (bytes > emu_total - (allocated < emu_total ? allocated : emu_total)) return cudaErrorMemoryAllocation;
    size_t *b = (size_t *)malloc(bytes + 64);
    if (!b) return cudaErrorMemoryAllocation;
    b[0] = bytes;
    allocated += bytes;
    *p = (char *)b + 64;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p) {
    if (refused_in_capture()) return cudaErrorStreamCaptureUnsupported;
    if (!p) return cudaSuccess;
    size_t *b = (size_t *)((char *)p - 64);
    allocated -= b[0];
    free(b);
    return cudaSuccess;
}

cudaError_t cudaMallocAsync(void **p, size_t bytes, cudaStream_t) { return cudaMalloc(p, bytes); }
/* Freed at once: everything queued before it has already run (nothing is
 * queued here except in a capture, where cudaFree refuses). */
cudaError_t cudaFreeAsync(void *p, cudaStream_t) { return cudaFree(p); }

cudaError_t cudaMallocHost(void **p, size_t bytes) {
    if (refused_in_capture()) return cudaErrorStreamCaptureUnsupported;
    *p = malloc(bytes ? bytes : 1);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags) {
    *p = NULL;
    if (flags & ~(unsigned)(cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined))
        return cudaErrorInvalidValue;
    return cudaMallocHost(p, bytes);
}

cudaError_t cudaFreeHost(void *p) {
    if (refused_in_capture()) return cudaErrorStreamCaptureUnsupported;
    free(p);
    return cudaSuccess;
}

/* ---- events ------------------------------------------------------------------- */

struct tlemu_event {
    unsigned flags;
};

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) {
    *e = NULL;
    if (flags & ~(unsigned)(cudaEventDisableTiming | 0x01 /* BlockingSync */ | 0x04 /* Interprocess */))
        return cudaErrorInvalidValue;
    *e = new tlemu_event{flags};
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t e) {
    if (!e) return cudaErrorInvalidResourceHandle;
    delete e;
    return cudaSuccess;
}

/* Everything queued on s before has run: the event completes now. */
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    if (!e) return cudaErrorInvalidResourceHandle;
    if (s && s->capture) {
        s->invalid = true;
        return cudaErrorStreamCaptureUnsupported;
    }
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) {
    if (!e) return cudaErrorInvalidResourceHandle;
    if (flags & ~1u) return cudaErrorInvalidValue;
    if (s && s->capture) {
        s->invalid = true;
        return cudaErrorStreamCaptureUnsupported;
    }
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind, cudaStream_t s) {
    if (bytes && (!dst || !src)) return cudaErrorInvalidValue;
    enqueue(s, [=]() { memmove(dst, src, bytes); }); /* a replay reads src as it is then */
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes, cudaStream_t s) {
    enqueue(s, [=]() { memset(p, v, bytes); });
    return cudaSuccess;
}

cudaError_t tlemu_set_smem_limit(int bytes) {
    if (bytes > (227 << 10)) return cudaErrorInvalidValue;
    if (bytes > smem_limit) smem_limit = bytes;
    return cudaSuccess;
}

/* ---- cuBLAS ------------------------------------------------------------------ */

struct tlemu_blas {
    cudaStream_t stream;
    void *workspace;
};

cublasStatus_t cublasCreate(cublasHandle_t *h) {
    *h = new tlemu_blas{NULL, NULL};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t h) {
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) {
    h->stream = s;
    h->workspace = NULL; /* as cuBLAS: a new stream goes back to the default workspace */
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void *workspace, size_t bytes) {
    if (bytes && !workspace) return CUBLAS_STATUS_INVALID_VALUE;
    h->workspace = workspace;
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasGetStatusString(cublasStatus_t s) {
    return s == CUBLAS_STATUS_SUCCESS ? "success" : s == CUBLAS_STATUS_INVALID_VALUE ? "invalid value" : "not supported";
}

static float load(const void *p, cudaDataType t, size_t i) {
    return t == CUDA_R_32F ? ((const float *)p)[i] : __half2float(((const __half *)p)[i]);
}

static void gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float a, const void *A,
                 cudaDataType at, int lda, const void *B, cudaDataType bt, int ldb, float b, float *c, int ldc) {
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double s = 0;
            for (int l = 0; l < k; l++) {
                const size_t ia = ta == CUBLAS_OP_N ? (size_t)i + (size_t)l * lda : (size_t)l + (size_t)i * lda;
                const size_t ib = tb == CUBLAS_OP_N ? (size_t)l + (size_t)j * ldb : (size_t)j + (size_t)l * ldb;
                s += (double)load(A, at, ia) * load(B, bt, ib);
            }
            float *o = &c[(size_t)i + (size_t)j * ldc];
            *o = (float)(a * s + (b != 0 ? b * *o : 0));
        }
}

/* C (m x n, column-major, ldc) = alpha op(A) op(B) + beta C; op(A) m x k. */
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType at, int lda, const void *B,
                            cudaDataType bt, int ldb, const void *beta, void *C, cudaDataType ct, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t) {
    if (!h || m < 0 || n < 0 || k < 0 || !A || !B || !C || !alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
    if (lda < (ta == CUBLAS_OP_N ? m : k) || ldb < (tb == CUBLAS_OP_N ? k : n) || ldc < m || lda < 1 || ldb < 1)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (ct != CUDA_R_32F || compute != CUBLAS_COMPUTE_32F || at != bt) return CUBLAS_STATUS_NOT_SUPPORTED;
    const float a = *(const float *)alpha, b = *(const float *)beta; /* host scalars: read at the call */
    enqueue(h->stream, [=]() { gemm(ta, tb, m, n, k, a, A, at, lda, B, bt, ldb, b, (float *)C, ldc); });
    return CUBLAS_STATUS_SUCCESS;
}
