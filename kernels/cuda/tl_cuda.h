/* tl_cuda.h - the CUDA backend's launchers (libtinyloop-cuda.so), plain C.
 *
 * No CUDA type appears here: device pointers are void * (or typed host-side
 * views such as float * that point to device memory), and a context
 * (`tl_cuda`) owns one device, one stream and one cuBLAS handle. Every
 * launcher enqueues work on the context's stream and returns without
 * waiting, except where a result must reach the host (tl_cuda_download,
 * tl_cuda_argmax, tl_cuda_sync).
 *
 * Errors: every function returns TL_CUDA_OK (0) or a negative
 * enum tl_cuda_status; tl_cuda_last_error() then gives a thread-local,
 * library-owned message naming the failing call, file and line. A failed
 * launcher has enqueued nothing new, but an asynchronous fault from earlier
 * work may surface in any later call (CUDA semantics); after such a fault
 * the context is unusable and should be freed.
 *
 * Thread-safety: a context is used by one thread at a time.
 *
 * Weight types are ggml type ids (enum tl_type in kernels/cpu/quants.h):
 * F32 0, F16 1, Q4_0 2, Q4_1 3, Q5_0 6, Q8_0 8, Q4_K 12, Q5_K 13, Q6_K 14,
 * BF16 30, in the GGUF block layouts. A weight matrix W (n_out, n_in) is
 * n_out rows of tl_row_size(type, n_in) bytes, as stored in the GGUF file.
 *
 * Paged KV arena (the engine's, engine/kv_layout.h):
 *   block id:  [ K region | V region ], each region (n_head_kv, block_size)
 *   rows of head_dim values, row (h, r) at (h * block_size + r) * row_bytes;
 *   the V region starts at the K region's size rounded up to 16 bytes.
 *   K and V rows each have their own type: f16 (TL_CUDA_KV_F16), f32
 *   (TL_CUDA_KV_F32), or q8 / q4 (TL_CUDA_KV_Q8 / _Q4: per group of
 *   G = gcd(head_dim, 32) values an f16 scale then G int8, resp. G/2 bytes
 *   of two nibbles; ggml's q8_0 / q4_0 blocks when G = 32). Block b of the
 *   arena starts at arena + b * tl_cuda_kv_block_bytes(kv).
 * A block table gives, for sequence s and logical block lb (positions
 * lb*block_size ..), the physical id at ids[s*seq_stride + lb*blk_stride].
 * The engine's table (ids[lb*depth + vl]) maps to blk_stride = depth with
 * ids pre-offset by vl.
 */
#ifndef TL_CUDA_H
#define TL_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define TL_CUDA_API __attribute__((visibility("default")))
#else
#define TL_CUDA_API
#endif

typedef struct tl_cuda tl_cuda;

enum tl_cuda_status {
    TL_CUDA_OK = 0,
    TL_CUDA_ERR_CUDA = -1,    /* a CUDA runtime call failed */
    TL_CUDA_ERR_CUBLAS = -2,  /* a cuBLAS call failed */
    TL_CUDA_ERR_ARG = -3,     /* bad argument (unsupported type, size, NULL) */
    TL_CUDA_ERR_NOMEM = -4,   /* device or host allocation failed */
    TL_CUDA_ERR_NODEV = -5    /* no CUDA device (or no usable driver) */
};

/* = enum tl_kv_type (tinyloop.h) = TL_KVT_* (kv_layout.h) */
enum tl_cuda_kv_type { TL_CUDA_KV_F16 = 0, TL_CUDA_KV_F32 = 1, TL_CUDA_KV_Q8 = 2, TL_CUDA_KV_Q4 = 3 };
enum tl_cuda_rope_type { TL_CUDA_ROPE_NORM = 0, TL_CUDA_ROPE_NEOX = 2 }; /* = enum tl_rope_type */
enum tl_cuda_mm_path { TL_CUDA_MM_AUTO = 0, TL_CUDA_MM_DIRECT = 1, TL_CUDA_MM_GEMM = 2 };

/* Batches of more than this many rows go through cuBLAS in TL_CUDA_MM_AUTO. */
#define TL_CUDA_GEMM_MIN_T 9

/* ---- context and memory ------------------------------------------------- */

/* Message for the last failure on this thread ("" when none). Valid until
 * the next failing call on this thread. */
TL_CUDA_API const char *tl_cuda_last_error(void);

/* Number of devices into *out; 0 (and TL_CUDA_OK) when the driver is
 * missing or reports none, so callers can fall back to the CPU. */
TL_CUDA_API int tl_cuda_device_count(int *out);

/* Creates a context on `device` (0-based): a non-blocking stream and a
 * cuBLAS handle bound to it. *out is NULL after a failure. */
TL_CUDA_API int tl_cuda_init(int device, tl_cuda **out);
/* Waits for the stream, then frees the context and its scratch buffers
 * (not the buffers from tl_cuda_alloc). NULL is a no-op. */
TL_CUDA_API void tl_cuda_free(tl_cuda *c);
/* Device name into buf (truncated to n); returns TL_CUDA_OK. */
TL_CUDA_API int tl_cuda_device_name(tl_cuda *c, char *buf, size_t n);

/* Device memory (cudaMalloc, 256-byte aligned). *out is NULL after a failure. */
TL_CUDA_API int tl_cuda_alloc(tl_cuda *c, size_t bytes, void **out);
/* Frees a tl_cuda_alloc buffer; synchronises the device (do it at teardown). */
TL_CUDA_API int tl_cuda_dealloc(tl_cuda *c, void *p);
/* Host -> device on the stream; src may be reused when this returns. */
TL_CUDA_API int tl_cuda_upload(tl_cuda *c, void *dst, const void *src, size_t bytes);
/* Device -> host; waits for the stream, so dst is filled on return. */
TL_CUDA_API int tl_cuda_download(tl_cuda *c, void *dst, const void *src, size_t bytes);
/* Device -> device on the stream. */
TL_CUDA_API int tl_cuda_copy(tl_cuda *c, void *dst, const void *src, size_t bytes);
/* Waits for all work on the context's stream. */
TL_CUDA_API int tl_cuda_sync(tl_cuda *c);
/* Copies `bytes` between device memory and pageable host memory (to_device
 * 1: host -> dev, 0: dev -> host) for the KV tiers: after all work queued
 * on the context's stream (an event it waits on), on a stream of its own,
 * through a page-locked staging buffer (made on first use, grown to the
 * largest copy). Waits for the copy: host may be reused, and work queued
 * later on the context's stream sees dev's new bytes, when it returns.
 * Never inside a graph capture. */
TL_CUDA_API int tl_cuda_io(tl_cuda *c, void *dev, void *host, size_t bytes, int to_device);

/* ---- CUDA graphs ---------------------------------------------------------- */

#define TL_CUDA_GRAPH_KEY_MAX 16
typedef int (*tl_cuda_enqueue_fn)(void *arg);

/* Runs fn(arg), which enqueues work on c's stream through the launchers,
 * through a CUDA graph when graphs are on (tl_cuda_graph_enable; off in a
 * new context): the first run of a key is eager, the second is captured,
 * and every later one replays the capture with one launch. The key
 * (n_key <= TL_CUDA_GRAPH_KEY_MAX int64s) must determine every host value
 * fn passes to a launcher: pointers, sizes, grid shapes. Device memory fn's
 * kernels read may change between runs; a replay reads it as it is then.
 * fn must not wait for the device or allocate when called with a key seen
 * before. If a capture fails where eager launches of the same work
 * succeed, graphs turn off for the context and the work runs eagerly; work
 * that fails eagerly too returns its error. Returns fn's result or a
 * launch failure. */
TL_CUDA_API int tl_cuda_graph_run(tl_cuda *c, const int64_t *key, int n_key, tl_cuda_enqueue_fn fn, void *arg);
/* Graphs on (1) or off (0; forgets them). */
TL_CUDA_API void tl_cuda_graph_enable(tl_cuda *c, int on);
/* Forgets every graph: call after reallocating a buffer they read. Waits for the stream. */
TL_CUDA_API void tl_cuda_graph_reset(tl_cuda *c);

typedef struct tl_cuda_graph_stats {
    long long captures; /* graphs captured */
    long long replays;  /* runs served by a graph */
    long long eager;    /* runs launched one kernel at a time */
    long long failures; /* captures that failed (graphs then turned off) */
    char last_failure[256];
} tl_cuda_graph_stats;
/* Totals over every context of the process (for tests and benchmarks). */
TL_CUDA_API void tl_cuda_graph_totals(tl_cuda_graph_stats *out);

/* ---- weights -------------------------------------------------------------- */

/* 1 when `type` is a weight type these kernels read. */
TL_CUDA_API int tl_cuda_type_supported(int type);

/* dst (n_rows, n) f32 = dequantize(src (n_rows rows of type)); n is a
 * multiple of the type's block size. For tests and debugging. */
TL_CUDA_API int tl_cuda_dequantize(tl_cuda *c, float *dst, const void *src, int type, int n_rows, int n);

/* dst (n_rows, n) f16 (device, 2 bytes each) = dequantize(src); for a
 * persistent f16 copy of a weight that the GEMM path then reads directly
 * (type TL_TYPE_F16) instead of dequantizing it on every call. */
TL_CUDA_API int tl_cuda_dequantize_f16(tl_cuda *c, void *dst, const void *src, int type, int n_rows, int n);

/* out (T, n_out) f32 = x (T, n_in) f32 . W^T, W (n_out, n_in) of `type` in
 * device memory. n_in is a multiple of the type's block size (any n_in for
 * F32/F16/BF16). T <= 8 rows read W once per 8 rows, dequantizing on the
 * fly; larger T dequantize W into an f16 scratch (grown on demand, n_out *
 * n_in * 2 bytes; F16 weights use W directly, F32 weights run in f32) and
 * call cublasGemmEx with f16 inputs (x converted) and f32 accumulation; a
 * row of x larger than 32768 in magnitude is divided by a power of two for
 * the conversion and its output multiplied back, so it cannot overflow f16.
 * out must not alias x. */
TL_CUDA_API int tl_cuda_matmul(tl_cuda *c, float *out, const float *x, const void *w, int type, int n_in, int n_out,
                               int T);
/* Same, with the path forced (enum tl_cuda_mm_path); for tests and tuning. */
TL_CUDA_API int tl_cuda_matmul_path(tl_cuda *c, float *out, const float *x, const void *w, int type, int n_in,
                                    int n_out, int T, int path);

/* ---- element-wise -------------------------------------------------------- */

/* out (n_rows, n) = x * rsqrt(mean(x^2) + eps) * w (n); out may alias x. */
TL_CUDA_API int tl_cuda_rmsnorm(tl_cuda *c, float *out, const float *x, const float *w, int n_rows, int n, float eps);

/* Rotates, in place, the first n_rot dims of each head of x: token t's
 * head h starts at x + t*tok_stride + h*head_dim. pos (device, n_tok) are
 * the positions; NORM pairs (2i, 2i+1), NEOX pairs (i, i + n_rot/2);
 * angle_i = pos * base^(-2i/n_rot) / freq_factors[i] (freq_factors: device
 * (n_rot/2) or NULL). */
TL_CUDA_API int tl_cuda_rope(tl_cuda *c, float *x, int n_tok, int tok_stride, int n_head, int head_dim, int n_rot,
                             const int32_t *pos, float base, int rope_type, const float *freq_factors);

/* out (n) = silu(gate) * up, resp. gelu_tanh(gate) * up; out may alias either. */
TL_CUDA_API int tl_cuda_swiglu(tl_cuda *c, float *out, const float *gate, const float *up, int64_t n);
TL_CUDA_API int tl_cuda_geglu(tl_cuda *c, float *out, const float *gate, const float *up, int64_t n);
/* out (n) = a + b (residual); out may alias either. */
TL_CUDA_API int tl_cuda_add(tl_cuda *c, float *out, const float *a, const float *b, int64_t n);

/* out (n_ids, dim) f32 = rows ids (device, n_ids) of table (n_rows, dim) of
 * `type`. Ids outside [0, n_rows) give zero rows. */
TL_CUDA_API int tl_cuda_get_rows(tl_cuda *c, float *out, const void *table, int type, int dim, int n_rows,
                                 const int32_t *ids, int n_ids);

/* ids_host (n_rows) = argmax of each row of x (n_rows, n) on the device
 * (lowest index on ties, NaN ignored); waits for the stream. */
TL_CUDA_API int tl_cuda_argmax(tl_cuda *c, int32_t *ids_host, const float *x, int n_rows, int n);

/* ---- sampling ---------------------------------------------------------------- */

/* Largest top_k tl_cuda_sample selects. */
#define TL_CUDA_SAMPLE_MAX_K 256

/* One row's sampling chain, as engine/sampler.c runs it: repetition penalty
 * on pen_ids[pen_off .. pen_off+pen_len) (distinct ids), then argmax when
 * temperature <= 0; else the top_k best (descending, lower id first on
 * ties), softmax, top-p cut (first prefix whose mass reaches top_p, when
 * top_p < 1), min-p cut (when min_p > 0), softmax at the temperature, and
 * the candidate where u * total first falls below the running sum. */
typedef struct tl_cuda_sample_row {
    int top_k;                 /* 1..TL_CUDA_SAMPLE_MAX_K when temperature > 0 */
    float temperature, top_p, min_p, repeat_penalty, u;
    int pen_off, pen_len;
} tl_cuda_sample_row;

/* ids_host (n_rows) = one token per row of logits (n_rows, n_vocab), on the
 * device; rows and pen_ids (n_pen) are host arrays, uploaded here. The
 * penalty is applied to logits in place. Only the ids cross to the host;
 * waits for the stream. */
TL_CUDA_API int tl_cuda_sample(tl_cuda *c, int32_t *ids_host, float *logits, int n_rows, int n_vocab,
                               const tl_cuda_sample_row *rows, const int32_t *pen_ids, int n_pen);

/* (vals, ids) (n_rows, k) = the k largest of each row of x (n_rows, n),
 * descending, lower index first on ties, NaN as -inf; device outputs,
 * k <= TL_CUDA_SAMPLE_MAX_K and k <= n. For tests. */
TL_CUDA_API int tl_cuda_topk(tl_cuda *c, float *vals, int32_t *ids, const float *x, int n_rows, int n, int k);

/* ---- paged KV attention --------------------------------------------------- */

typedef struct tl_cuda_kv {
    void *arena;        /* device: n_blocks * tl_cuda_kv_block_bytes */
    int type_k, type_v; /* row types of K and V: enum tl_cuda_kv_type */
    int block_size;     /* positions per block */
    int n_head_kv;
    int head_dim;       /* <= 256; even for q4 rows */
} tl_cuda_kv;

/* Bytes of one block (K and V regions); 0 for an invalid description. */
TL_CUDA_API size_t tl_cuda_kv_block_bytes(const tl_cuda_kv *kv);

/* Writes K and V of n_tok tokens: token t's rows k + t*src_stride and
 * v + t*src_stride (n_head_kv*head_dim f32 each) go to slot slots[t]
 * (device) = block_id * block_size + row. f16 rows round to nearest; q8 /
 * q4 rows are quantized as engine/kv_mode.c's tl_kv_store_row does (the
 * same bytes for the same input). */
TL_CUDA_API int tl_cuda_kv_store(tl_cuda *c, const tl_cuda_kv *kv, const float *k, const float *v, int src_stride,
                                 int n_tok, const int32_t *slots);

/* Copy-on-write: block dst = block src (whole block, K and V). */
TL_CUDA_API int tl_cuda_kv_copy(tl_cuda *c, const tl_cuda_kv *kv, int dst, int src);

/* Which positions a query row sees, and where its sequence's blocks are. */
typedef struct tl_cuda_attn_seqs {
    int n_seq;
    const int32_t *q_start;   /* device (n_seq): first query row of the sequence (prefill) */
    const int32_t *q_len;     /* device (n_seq): its query rows = new tokens (prefill) */
    const int32_t *pos0;      /* device (n_seq): position of its first query row; for decode the
                                 position of the single query (so it sees pos0+1 positions) */
    const int32_t *block_ids; /* device: block of (s, lb) at block_ids[s*seq_stride + lb*blk_stride] */
    int seq_stride, blk_stride;
    const int32_t *window;    /* device (n_seq) per-sequence sliding window, 0 = none; NULL = none */
    int max_q_len;            /* host: max of q_len (sizes the grid) (prefill) */
    /* Decode only: split each sequence's positions into ranges of `split`
     * (a multiple of 32) that separate blocks reduce, then combine them
     * (flash-decoding: few long sequences still fill the device). 0 = the
     * launcher decides from max_pos and the grid, -1 = never (the exact
     * mode: one summation order whatever the batch). */
    int split;
    int max_pos;              /* host: > every pos0 (positions a query sees at most); 0 = unknown (no split) */
} tl_cuda_attn_seqs;

/* Decode: one query per sequence, row s of q. Query row s, head h sees
 * positions [lo, pos0[s]] of its sequence through KV head h / (n_head /
 * n_head_kv), lo = pos - W + 1 for the narrower nonzero W of `window` and
 * seqs->window[s] (0 otherwise). q (n_seq rows, q_stride floats apart,
 * n_head*head_dim each), out (n_seq, n_head*head_dim). The K/V of the query
 * position itself must already be stored (tl_cuda_kv_store). scale is
 * usually 1/sqrt(head_dim). q_start / q_len / max_q_len are ignored. */
TL_CUDA_API int tl_cuda_attn_decode(tl_cuda *c, float *out, const float *q, int q_stride, const tl_cuda_kv *kv,
                                    const tl_cuda_attn_seqs *seqs, int n_head, int window, float scale);

/* Prefill (causal, chunked): sequence s's query rows q_start[s] ..
 * q_start[s]+q_len[s]-1 are positions pos0[s] ..; each sees its cached
 * prefix and the new tokens up to itself (all stored beforehand), with the
 * same window rule as decode. Flash-style: K/V stream through shared memory
 * in tiles with an online softmax, so memory does not grow with length.
 * out (rows, n_head*head_dim) at the same rows as q. */
TL_CUDA_API int tl_cuda_attn_prefill(tl_cuda *c, float *out, const float *q, int q_stride, const tl_cuda_kv *kv,
                                     const tl_cuda_attn_seqs *seqs, int n_head, int window, float scale);

/* ---- the backend plugin (tests) ------------------------------------------- */

/* Copies `bytes` (at most one block) of block `id` of the plugin's KV
 * arena to host dst; ctx is a context from the plugin's ops->init. For
 * tests that compare the stored K/V with the CPU engine's blocks. */
TL_CUDA_API int tl_cuda_plugin_read_kv_block(void *ctx, int id, void *dst, size_t bytes);

#ifdef __cplusplus
}
#endif

#endif
