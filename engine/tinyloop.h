/* tinyloop.h - the public C API of tinyloop, an LLM inference engine with a
 * longest-match prefix cache.
 *
 * Conventions: every function returns an int status (TL_OK = 0, negative =
 * error, message in tl_last_error()) unless documented otherwise; outputs go
 * through pointers marked out. Buffer-filling functions return the length
 * written, or the negative of the length they needed.
 *
 * Thread safety: a tl_model may be used from one thread at a time (callers
 * serialise); tl_last_error() is per thread. The model runs its own worker
 * threads for matmuls; no callback ever leaves the library.
 */
#ifndef TINYLOOP_H
#define TINYLOOP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The library is built with -fvisibility=hidden: only what this header
 * declares is exported from libtinyloop.so. */
#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

enum tl_status {
    TL_OK = 0,
    TL_ERR_INVALID_ARG = -1, /* a bad argument; the message names it and its value */
    TL_ERR_IO = -2,          /* file could not be opened / mapped */
    TL_ERR_FORMAT = -3,      /* malformed file */
    TL_ERR_UNSUPPORTED = -4, /* valid file, but an architecture/type we do not run */
    TL_ERR_NOMEM = -5,       /* host allocation failed */
    TL_ERR_KV_FULL = -6,     /* no free KV blocks even after eviction */
    TL_ERR_TOO_LONG = -7,    /* prompt + max_tokens exceeds max_seq_len */
    TL_ERR_BUFFER = -8,      /* output buffer too small */
    TL_ERR_STATE = -9,       /* object in the wrong state for the call */
    TL_ERR_BUSY = -10        /* the request queue is full; retry later */
};

/* Message for the last failure on this thread ("" if none). Owned by the
 * library; valid until the next failing call on this thread. */
const char *tl_last_error(void);
/* The TL_ERR_* code that went with that message (for calls that return
 * NULL on failure, and for bindings that read the code apart from the
 * return value). */
int tl_last_error_code(void);

/* Monotonic clock in seconds (for timings from Lua without declaring
 * clock_gettime in every module). */
double tl_clock(void);

typedef struct tl_model tl_model;
typedef struct tl_seq tl_seq;

/* KV cache element types (see engine/kv_layout.h for the block layout):
 * q8 = int8 with one f16 scale per group of 32 along the head dimension,
 * q4 = 4-bit with an f16 scale and minimum per group of 32. TL_KV_DEFAULT: the mode
 * comes from the environment at model construction (TINYLOOP_KV_INT8=1:
 * q8, TINYLOOP_KV_INT4=1: q4, TINYLOOP_KV_H_MODE=1: store-h), else f16. */
enum tl_kv_type { TL_KV_DEFAULT = -1, TL_KV_F16 = 0, TL_KV_F32 = 1, TL_KV_Q8 = 2, TL_KV_Q4 = 3 };

typedef struct tl_model_params {
    int n_threads;       /* worker threads for compute; <= 0: online cores */
    int max_seq_len;     /* tokens per sequence; <= 0: the model's context length */
    size_t kv_mem;       /* bytes for the KV block arena; 0: enough for 4 full sequences at default loops */
    int kv_block_size;   /* tokens per KV block; <= 0: 16 */
    int kv_type;         /* enum tl_kv_type for K and V; default TL_KV_DEFAULT (environment, else f16) */
    int loop_start;      /* first looped layer; < 0: from the file (tinyloop.loop_start) */
    int loop_end;        /* one past the last looped layer; < 0: from the file */
    int loop_default;    /* default loops; <= 0: from the file, else 1 */
    int vocab_only;      /* 1: load the tokenizer only (no tensors needed) */
    /* The KV mode as text; when set it wins over kv_type and the
     * environment: "f16" | "f32" | "q8" | "q4" (K and V), "<k>,<v>" for
     * different K and V types (e.g. "q8,f16"), "h" or "h:<type>" for
     * store-h (the layer's normed input is stored, K and V recomputed from
     * it when read; "h" = "h:f16"). NULL: use kv_type. */
    const char *kv_mode;
    /* KV tiers under the arena (an evicted prefix goes down a tier instead
     * of vanishing; a later match brings it back): kv_dir is tier 3, a
     * directory of block files that also survives restarts (NULL:
     * $TINYLOOP_KV_DIR; unset or empty: none); kv_host_mem is tier 2's
     * budget in bytes of host RAM (0: $TINYLOOP_KV_HOST_MEM, else none);
     * kv_disk_mem tier 3's (0: $TINYLOOP_KV_DISK_MEM, else unlimited). */
    const char *kv_dir;
    size_t kv_host_mem;
    size_t kv_disk_mem;
    /* Weight repacking on the CPU (README "Models and weight types"):
     * "on" (matmul weights moved to huge pages, q8_0/q4_0 repacked for the
     * kernels; bitwise the file's results), "off" (the file's layout),
     * "bf16" (also F32/F16 matrices rounded to BF16 and BF16 matmuls run
     * with BF16 activations: faster, lossy; needs AVX512_BF16). NULL:
     * $TINYLOOP_REPACK, else "on". */
    const char *repack;
} tl_model_params;
/* The compute backend is chosen when a model opens: TINYLOOP_BACKEND=cpu |
 * cuda | auto (default). auto uses the CUDA plugin (libtinyloop-cuda.so,
 * loaded with dlopen: $TINYLOOP_CUDA_LIB, next to this library, or the
 * system path) when it loads and finds a device, else the CPU; cuda fails
 * tl_model_open with the reason when it cannot. */

tl_model_params tl_model_default_params(void);

/* Opens a GGUF model. On success *out owns the model (free with
 * tl_model_close); on failure *out is NULL and nothing leaks. */
int tl_model_open(const char *path, tl_model_params params, tl_model **out);
void tl_model_close(tl_model *model);

typedef struct tl_model_info {
    char arch[32];
    int n_vocab, n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff;
    int n_ctx_train, max_seq_len;
    int loop_start, loop_end, loop_default; /* loop_start == loop_end: no loop block */
    float rope_freq_base, norm_eps;
    int bos, eos;
    int n_threads;
    int kv_block_size, kv_type, kv_blocks_total, kv_blocks_free;
    size_t weight_bytes, kv_bytes;
    const char *isa; /* CPU kernel level in use */
    const char *backend; /* "cpu" or the plugin's name ("cuda") */
    int kv_type_v;       /* V's type (kv_type is K's); store-h: h's type in both */
    int kv_store_h;      /* 1: store-h mode */
    char kv_mode[16];    /* canonical mode name: "f16", "q8,f16", "h:q8", ... */
    size_t kv_token_bytes; /* KV bytes one token costs over all layers at the default loops */
    float rope_freq_scale;  /* 1 / rope.scaling.factor under linear scaling, else 1 */
    float rope_attn_factor; /* rope.scaling.attn_factor, else 1 */
    int n_expert, n_expert_used; /* a mixture-of-experts FFN's experts and its top k; 0: dense */
    int n_ff_expert;             /* an expert's FFN width (n_ff: the dense one's, as the file says) */
} tl_model_info;

/* KV bytes one token costs in `mode` (a kv_mode string) on this model, over
 * all layers at the default loops, block rounding included; 0 with the
 * error set when the mode does not parse or does not fit the model. Lets
 * `info` print every mode's cost for capacity planning. */
size_t tl_model_kv_token_bytes(const tl_model *model, const char *mode);

int tl_model_get_info(const tl_model *model, tl_model_info *out);

/* ---- tokenizer ---------------------------------------------------------- */

/* Tokenizes len bytes of text. add_special: BOS/EOS as the vocab says;
 * parse_special: control-token texts in the input become single tokens.
 * Returns ids written, or -(needed) when cap is too small. */
int tl_tokenize(const tl_model *model, const char *text, int len, int add_special,
                int parse_special, int32_t *out, int cap);
/* Detokenizes ids (control tokens skipped). Returns bytes written (a NUL is
 * added when room), or -(needed including the NUL). */
int tl_detokenize(const tl_model *model, const int32_t *ids, int n, char *out, int cap);
/* Text of one token as it appears in output. Returns bytes or -(needed). */
int tl_token_to_piece(const tl_model *model, int32_t id, char *out, int cap);
/* Streaming helper: how many leading bytes of buf form complete UTF-8
 * sequences (invalid bytes count as complete, so they are never held
 * forever). Emit that many, keep the rest for the next piece. */
int tl_utf8_complete_prefix(const char *buf, int len);

/* ---- chat ----------------------------------------------------------------- */

typedef struct tl_chat_message {
    const char *role;    /* "system", "user" or "assistant" */
    const char *content;
} tl_chat_message;

/* Renders messages with the model's chat template (recognised from
 * tokenizer.chat_template: Gemma, ChatML, Llama 3, Llama 2, Phi-3, Phi-4,
 * Mistral v7 / v1 / v3 / v3-tekken, Falcon 3, Granite, DeepSeek V3 / R1;
 * else "role: content" lines). add_assistant appends the
 * opening of the assistant's turn. Several system messages are joined by a
 * blank line where the template folds them into the first user turn
 * (Gemma, Llama 2); system messages at the end render as that user turn
 * (closed with add_assistant = 1; left open with 0: the prefix every
 * conversation starting with them shares, for pinning). Returns bytes
 * written (NUL added) or -(needed).
 * Display only: tokenizing this text with parse_special = 1 turns control
 * texts inside message content into control tokens; use tl_chat_tokenize. */
int tl_chat_format(const tl_model *model, const tl_chat_message *msgs, int n_msgs, int add_assistant, char *out,
                   int cap);
/* Renders and tokenizes messages (BOS as the vocab says): only the
 * template's own markers become control tokens; message content is
 * tokenized as with parse_special = 0 and never becomes a template marker
 * (no forged turns). For content without control-token texts the ids equal
 * tokenizing tl_chat_format's text with parse_special = 1. Returns ids
 * written, or -(needed) when cap is too small. */
int tl_chat_tokenize(const tl_model *model, const tl_chat_message *msgs, int n_msgs, int add_assistant,
                     int32_t *out, int cap);
/* Bytes of the vocab's longest token text. No token covers more input bytes
 * (aside from whitespace a phi-3 special token strips), so text of B bytes
 * gives at least B / this many tokens: a server can refuse text longer than
 * max_seq_len x this before tokenizing it. */
int tl_model_max_token_bytes(const tl_model *model);

/* Tokenization off the caller's thread, for event loops: a job runs on the
 * model's tokenizer thread (started at the first job; the tokenizer is
 * immutable, so this is safe alongside the engine and other callers) and,
 * when it ends, its id is written to the engine's notification descriptors
 * like a request's (without an engine, poll). Job ids are negative, so they
 * never equal a request id. Text and messages are copied at submit. Jobs
 * live until taken or released; closing the model frees them all. Submit
 * fails with TL_ERR_BUSY while 64 jobs wait to run. */
int tl_tokenize_submit(tl_model *model, const char *text, int len, int add_special, int parse_special,
                       int64_t *id_out);
int tl_chat_tokenize_submit(tl_model *model, const tl_chat_message *msgs, int n_msgs, int add_assistant,
                            int64_t *id_out);
/* Polls job id. Running: TL_OK with *n_out = -1. Done: *n_out = its id
 * count; if cap >= *n_out the ids are copied to out, the job is freed and
 * TL_OK returned, else TL_ERR_BUFFER (the job stays). A failed job returns
 * its error (message in tl_last_error()) and is freed. Unknown id:
 * TL_ERR_INVALID_ARG. */
int tl_tokenize_take(tl_model *model, int64_t id, int32_t *out, int cap, int *n_out);
/* Forgets a job (a running one is freed when it ends). */
int tl_tokenize_release(tl_model *model, int64_t id);
/* The format in use ("plain", "gemma", "chatml", "llama3", "llama2", "phi3",
 * "phi4", "mistral-v7", "mistral-v1", "mistral-v3", "mistral-v3-tekken",
 * "falcon3", "granite", "deepseek3", "command-r")
 * and an override by name (TL_ERR_INVALID_ARG for an unknown name). */
const char *tl_model_chat_template(const tl_model *model);
int tl_model_set_chat_template(tl_model *model, const char *name);

/* ---- sampling and generation -------------------------------------------- */

typedef struct tl_sampling_params {
    float temperature;    /* <= 0: greedy (argmax) */
    int top_k;            /* <= 0: off */
    float top_p;          /* >= 1: off */
    float min_p;          /* <= 0: off */
    float repeat_penalty; /* 1: off */
    int repeat_last_n;    /* tokens looked back for the penalty; 0: off, < 0: whole context */
    uint64_t seed;        /* per-request RNG seed */
} tl_sampling_params;

typedef struct tl_generate_params {
    int max_tokens;       /* tokens to generate; must be >= 1 */
    int loops;            /* loop depth; <= 0: the model's default (1 without a loop block) */
    int ignore_eos;       /* 1: do not stop at EOS */
    int cache_window;     /* sliding window: attend to the last N positions; 0 = all. Part of the cache key */
    uint64_t salt;        /* cache isolation: requests only share KV with equal salt (0 = shared) */
    int no_cache;         /* 1: neither use nor fill the prefix cache */
    int priority;         /* admission order: higher first, then submission order */
    int tenant;           /* tenant id (>= 0) for per-tenant KV budgets and eviction; 0 = default */
    tl_sampling_params sampling;
} tl_generate_params;

tl_generate_params tl_generate_default_params(void);

/* Generates from prompt ids. Writes up to min(cap, max_tokens) ids to out
 * and returns how many (generation stops at EOS, which is not written).
 * Fails with TL_ERR_TOO_LONG when n_prompt + max_tokens > max_seq_len,
 * TL_ERR_INVALID_ARG for ids outside the vocab or an empty prompt. */
int tl_generate(tl_model *model, const int32_t *prompt, int n_prompt, tl_generate_params params,
                int32_t *out, int cap);

/* ---- sequences and batched forward (low level) ---------------------------- */

/* A sequence owns a block table into the model's KV pool. loops <= 0: the
 * model's default. */
int tl_seq_new(tl_model *model, int loops, tl_seq **out);
void tl_seq_free(tl_seq *seq);
int tl_seq_len(const tl_seq *seq);

/* Runs one forward step over a batch: sequence i gets n_tokens[i] new
 * tokens (prefill many or decode one; n_tokens[i] >= 1). logits (n_seq x
 * n_vocab) receives each sequence's last-token logits. On failure no
 * sequence advances (their KV is rolled back). */
int tl_batch_forward(tl_model *model, tl_seq **seqs, const int32_t *const *tokens,
                     const int *n_tokens, int n_seq, float *logits);

int tl_model_n_vocab(const tl_model *model);

/* ---- requests: non-blocking submit, step, pull ---------------------------------
 *
 * Every generation is a request. tl_request_submit copies the prompt and
 * returns at once; tl_model_step advances every active request by one
 * scheduler step (one batched forward pass: prefill chunks of new requests
 * and one decode token for each running one); tl_request_take pulls the
 * tokens produced since the last take. The prompt's longest cached prefix
 * (radix tree, namespace loops x cache_window x salt) is reused: full KV
 * blocks are shared, the partial tail block is copied on write. Finished
 * requests' prompt + output are inserted into the cache. A request stays
 * until released. All calls on one model from one thread at a time. */

enum tl_request_state {
    TL_REQ_QUEUED = 0, TL_REQ_RUNNING = 1, TL_REQ_DONE = 2, TL_REQ_CANCELLED = 3, TL_REQ_FAILED = 4
};
enum tl_finish_reason { TL_FINISH_NONE = 0, TL_FINISH_EOS = 1, TL_FINISH_LENGTH = 2, TL_FINISH_CANCELLED = 3,
                        TL_FINISH_ERROR = 4 };

typedef struct tl_pool tl_pool;

/* Submits a request. pool may be NULL; with a pool its statistics count
 * the lookup. Fails (nothing queued) on invalid arguments or when
 * n_prompt + max_tokens > max_seq_len. */
int tl_request_submit(tl_model *model, const int32_t *prompt, int n_prompt, const tl_generate_params *params,
                      tl_pool *pool, int64_t *id_out);
/* One scheduler step. Returns the number of requests still queued or
 * running (0: idle), or < 0 on a failure of the step itself. Requests that
 * fail (e.g. TL_ERR_KV_FULL) are marked failed; the step goes on. */
int tl_model_step(tl_model *model);
/* Copies up to cap tokens produced since the last take into out and
 * returns how many; *finished (may be NULL) is set to 1 once the request
 * has ended and every token was taken. A failed request returns its error
 * code (message in tl_last_error()) once its tokens are taken. */
int tl_request_take(tl_model *model, int64_t id, int32_t *out, int cap, int *finished);
/* Stops a request and frees its KV at once (tokens produced stay takeable). */
int tl_request_cancel(tl_model *model, int64_t id);
/* Forgets a request (cancelling it if running). */
int tl_request_release(tl_model *model, int64_t id);

typedef struct tl_request_info {
    int state;           /* enum tl_request_state */
    int finish_reason;   /* enum tl_finish_reason */
    int n_prompt, n_generated, n_taken;
    int n_cached;        /* prompt tokens served from the prefix cache */
    int error;           /* TL_ERR_* when failed */
} tl_request_info;

int tl_request_get_info(const tl_model *model, int64_t id, tl_request_info *out);

/* ---- the engine thread (serving) -------------------------------------------------
 *
 * tl_engine_start runs the scheduler on a background thread: it steps
 * whenever requests are queued or running and sleeps otherwise. From then
 * on every call on the model may come from any thread: submit, take,
 * cancel, release and get_info never wait for a forward pass (they take a
 * short lock); tl_model_get_stats reads a snapshot published after each
 * step; tl_model_set_tenant_budget and tl_pool_free post a message the
 * engine applies at its next step boundary, and tl_engine_notify_attach
 * waits at most for one non-blocking write, so they do not wait either;
 * the synchronous calls (generate, generate_with_pool, register,
 * prefix handles) wait for the engine. tl_model_step is refused.
 *
 * After each step the engine writes the 8-byte id (int64, host order) of
 * every request with news (new tokens or an end) to the notification
 * descriptor; the reader then pulls with tl_request_take. If the reader
 * falls behind and the pipe is full, ids are dropped: poll what you wait
 * for now and then. Admission reserves the KV blocks a request may need
 * through max_tokens next to what running requests may still take, and
 * queues requests that do not fit, so none runs out of KV half-way (one
 * that cannot fit even alone fails with TL_ERR_KV_FULL before it
 * generates); more than max_queue waiting requests make submit fail with TL_ERR_BUSY. */

int tl_engine_start(tl_model *model, int max_queue);   /* max_queue <= 0: 1024 */
/* Stops the thread after its current step; requests stay and can be
 * stepped synchronously again. */
void tl_engine_stop(tl_model *model);
/* Read end of the notification pipe (non-blocking), -1 without an engine. */
int tl_engine_notify_fd(const tl_model *model);
/* Also writes the ids to fd (e.g. a connected AF_UNIX socket an nginx
 * cosocket reads; the caller sets O_NONBLOCK). The engine keeps its own
 * dup of fd (the caller may close fd at once) and closes it in
 * tl_engine_stop; fd < 0 detaches (no write reaches the old descriptor
 * after the call returns). Never waits for a step. Returns
 * TL_ERR_STATE without a running engine. */
int tl_engine_notify_attach(tl_model *model, int fd);

/* ---- prefix pool (the explicit cache) -----------------------------------------
 *
 * A pool pins registered prefixes in the model's prefix cache. Entries are
 * keyed by (tokens, loops, cache_window). Semantics (docs/prefix-pool.md) of the
 * PrefixPool: capacity 0 is coerced to 1; registering an existing key is a
 * no-op; over capacity the policy's victim (shortest entry by default) is
 * dropped before the new entry goes in. A pool binds to the first model
 * that registers into it. Freeing the pool unpins its entries and releases
 * the KV nothing else references; closing the model first detaches the
 * pool (it then reports size 0). */

/* SHORTEST: the default (docs/prefix-pool.md). LRU: least recently used. COST: the lowest
 * estimated value of keeping it, tokens x (1 + hits) (recompute cost times
 * use), so long, popular prefixes stay. */
enum tl_pool_policy { TL_POOL_EVICT_SHORTEST = 0, TL_POOL_EVICT_LRU = 1, TL_POOL_EVICT_COST = 2 };

int tl_pool_new(int capacity, tl_pool **out);
/* The handle is invalid once this returns; with an engine thread running
 * on its model the entries are unpinned at the next step boundary. */
void tl_pool_free(tl_pool *pool);
int tl_pool_size(const tl_pool *pool);
int64_t tl_pool_total_cached_tokens(const tl_pool *pool);
int tl_pool_set_policy(tl_pool *pool, int policy);
/* What a call through the pool may reuse. SHARED (the default): the longest
 * cached prefix anywhere in the cache (other pools' entries, earlier
 * generations), as the radix cache is meant to share. POOL: only this
 * pool's own entries, the longest one the prompt starts with (docs/prefix-pool.md's
 * "only registered prefixes"; an empty pool then matches nothing).
 * Either way a hit is counted by the pool whose entry owns the reused
 * blocks. Can be changed at any time. */
enum tl_pool_scope { TL_POOL_SCOPE_SHARED = 0, TL_POOL_SCOPE_POOL = 1 };
int tl_pool_set_scope(tl_pool *pool, int scope);
/* Cache isolation for the pool's entries: they are built in the salt's
 * namespace and only requests with the same salt match them (0 = the
 * common namespace). Set before the first register. */
int tl_pool_set_salt(tl_pool *pool, uint64_t salt);
/* Marks the pool's entries shareable across salts: a request with any salt
 * may reuse the KV of a shareable entry (an operator's system prompt) while
 * everything after it stays in the request's own namespace. Only prefixes
 * registered this way cross tenants. Set before the first register. */
int tl_pool_set_shareable(tl_pool *pool, int shareable);
/* Tenant id charged for the pool's entries (per-tenant budgets). */
int tl_pool_set_tenant(tl_pool *pool, int tenant);

/* Prefills tokens once and pins them, with the logits of the last position
 * (a prompt equal to the entry then computes nothing). A full pool drops
 * its victim only after the new entry is built. Returns n_tokens (the
 * matchable length) on success, a TL_ERR_* code on failure like every other
 * call (TL_ERR_INVALID_ARG / TL_ERR_TOO_LONG for bad arguments,
 * TL_ERR_KV_FULL when the prefix cannot fit; message in tl_last_error(); the
 * pool is unchanged). */
int tl_pool_register(tl_model *model, tl_pool *pool, const int32_t *tokens, int n_tokens, int loops,
                     int cache_window);

/* The non-blocking register for servers: the prefill runs as a request on
 * the engine thread (or in the next tl_model_step) and, when it ends, the
 * entry is in the pool (request state TL_REQ_DONE; a failure ends it
 * TL_REQ_FAILED with the reason). Returns TL_OK and the request id
 * (release it when done), or an error with nothing queued. */
int tl_pool_register_submit(tl_model *model, tl_pool *pool, const int32_t *tokens, int n_tokens, int loops,
                            int cache_window, int64_t *id_out);

/* Generates from the longest cached prefix of the prompt (registered or
 * anything longer in the cache). Writes prompt + generated tokens to out
 * (cap >= n_prompt + max_tokens) and returns their count. */
int tl_generate_with_pool(tl_model *model, tl_pool *pool, const int32_t *prompt, int n_prompt,
                          tl_generate_params params, int32_t *out, int cap);

/* lookups: calls through this pool; hits, hit_tokens: reuses of this
 * pool's entries (the entry's tokens reused), whatever the call went
 * through (tl_pool_set_scope). */
typedef struct tl_pool_stats {
    int size, capacity, policy;
    int64_t total_cached_tokens;
    int64_t lookups, hits, hit_tokens, registrations, evictions;
} tl_pool_stats;

int tl_pool_get_stats(const tl_pool *pool, tl_pool_stats *out);

/* ---- single prefix handles ------------------------------------------------------ */

typedef struct tl_prefix tl_prefix;

/* Builds (prefills and pins) one prefix; free with tl_prefix_free. The
 * handle must not outlive its model. */
int tl_prefix_build(tl_model *model, const int32_t *tokens, int n_tokens, int loops, int cache_window,
                    tl_prefix **out);
void tl_prefix_free(tl_prefix *prefix);
/* Generates after prefix + suffix (suffix may be empty). Writes the
 * generated tokens only and returns their count. params.loops and
 * cache_window are taken from the prefix. */
int tl_generate_from_prefix(tl_model *model, tl_prefix *prefix, const int32_t *suffix, int n_suffix,
                            tl_generate_params params, int32_t *out, int cap);

/* Resume handles (looped models): run a prompt once, keep what does not
 * depend on the loop depth (the prelude layers' KV and the hidden states
 * entering the loop block), then generate at any depth recomputing only
 * the loop block and coda. */
int tl_resume_build(tl_model *model, const int32_t *prompt, int n_prompt, tl_prefix **out);
int tl_resume_generate(tl_model *model, tl_prefix *handle, tl_generate_params params, int32_t *out, int cap);

/* ---- beam search ----------------------------------------------------------- */

/* What a beam search found and what it cost. */
typedef struct tl_beam_result {
    float score;          /* the returned sequence's logprob / n_generated^length_penalty */
    float logprob;        /* its sum of token log-probabilities (EOS included when it ended there) */
    int n_generated;      /* tokens scored: those written, plus the EOS when finish_reason is EOS */
    int finish_reason;    /* enum tl_finish_reason: EOS or LENGTH */
    int n_cached;         /* prompt tokens served from the prefix cache */
    int kv_blocks_peak;   /* most KV blocks in use during the search, minus those in use before it */
} tl_beam_result;

/* Beam search from prompt ids: keeps the `beams` best partial sequences
 * by sum of log-probabilities (log-softmax of the logits; sampling params
 * are not used), extends each by every token each step, and returns the
 * finished sequence with the best score = logprob / n_generated^length_penalty
 * (length_penalty 1.0 as in Hugging Face; 0: raw sum; > 1 favours longer,
 * < 1 shorter). A beam ends at EOS (unless params.ignore_eos) or after
 * max_tokens; the search runs until max_tokens or until no beam is live.
 * beams = 1 is greedy decoding.
 *
 * Beams share KV blocks: the prompt is prefilled once (reusing the longest
 * cached prefix in the namespace of params.loops, cache_window and salt,
 * or pool's salt with a pool, which then counts the lookup), and a beam
 * forks by taking references on its parent's blocks; the partial tail
 * block is copied on write. B beams over a long prompt cost one prompt's
 * KV plus B tails. Unless params.no_cache the prompt is inserted into the
 * cache. The search is a request like any other: its beams run in the
 * scheduler's batches, one sequence each, beside other requests.
 *
 * Writes the generated tokens (EOS not written) to out and returns their
 * count; result (may be NULL) receives the scores. Fails with
 * TL_ERR_INVALID_ARG (beams < 1 or > 1024, a length_penalty that is not
 * finite, bad ids), TL_ERR_TOO_LONG, TL_ERR_BUFFER (cap < max_tokens),
 * TL_ERR_KV_FULL or TL_ERR_NOMEM; on failure every block it took is
 * released. */
int tl_generate_beam(tl_model *model, tl_pool *pool, const int32_t *prompt, int n_prompt,
                     tl_generate_params params, int beams, float length_penalty, int32_t *out, int cap,
                     tl_beam_result *result);

/* ---- statistics ---------------------------------------------------------------------- */

typedef struct tl_cache_stats {
    int64_t lookups, hits, hit_tokens;  /* prefix-cache lookups by requests */
    int64_t prefill_tokens;             /* prompt tokens computed */
    int64_t prefill_tokens_saved;       /* prompt tokens served from the cache */
    int64_t generated_tokens, requests_finished;
    int64_t evictions, evicted_tokens;
    int64_t nodes, cached_tokens;       /* radix tree size */
    int blocks_total, blocks_free, blocks_used, blocks_shared;
    int requests_active, requests_queued;
    /* KV tiers under the arena: [0] host RAM (tier 2), [1] disk (tier 3).
     * Counts are logical blocks (every layer's block for block_size
     * positions of a prefix). */
    int64_t tier_blocks[2], tier_bytes[2], tier_budget[2]; /* held now, budget (0: none / unlimited) */
    int64_t tier_spills[2], tier_spill_bytes[2];           /* written into the tier */
    int64_t tier_hits[2], tier_restore_bytes[2];           /* brought back up from it */
    int64_t tier_refused[2];                               /* entries refused (bad file, mismatch) */
    int64_t tier_dropped[2];                               /* pushed off its end (budget) */
    double tier_spill_ms[2], tier_restore_ms[2];           /* time spent moving blocks */
    int64_t tier_restored_tokens;                          /* prompt tokens served by a restore */
    int64_t tier_recomputed;                               /* restores skipped as dearer than prefill */
} tl_cache_stats;

int tl_model_get_stats(const tl_model *model, tl_cache_stats *out);
/* Eviction weights pushed from a policy: score = recency*last_access +
 * hits*hits + tokens*cached_tokens + depth*start_position; lowest first.
 * {1, 0, 0, 0} is LRU (the default). */
int tl_model_set_evict_weights(tl_model *model, double recency, double hits, double tokens, double depth);
/* What the eviction policy says about a node leaving the arena when a
 * tier is configured: nodes with at least min_tokens tokens and min_hits
 * hits spill down a tier, others are dropped. {0, 0}: spill all (default). */
int tl_model_set_spill_policy(tl_model *model, int min_tokens, int min_hits);

/* Warm restart. save_cache writes every cached prefix's full blocks (all
 * namespaces, pinned pool entries included) to dir as block files (NULL:
 * the model's kv_dir); files already there are kept. Returns the blocks
 * written, or < 0. With an engine thread it waits for the step boundary. */
int tl_model_save_cache(tl_model *model, const char *dir);

typedef struct tl_cache_load_report {
    int files;       /* block files seen */
    int loaded;      /* valid ones, now in the disk tier's index */
    int refused;     /* files refused */
    char why[1024];  /* a line per refused file: the file and the reason (truncated) */
} tl_cache_load_report;

/* Indexes dir's block files as the disk tier (dir NULL: rescan the
 * model's kv_dir; a model without one adopts dir). Each file is checked
 * whole: another model, KV mode, block size or format version, a
 * truncated file or a checksum mismatch is refused with a line in
 * rep->why and never loaded; the rest of the directory still loads. The
 * blocks come up when a prompt matches them. */
int tl_model_load_cache(tl_model *model, const char *dir, tl_cache_load_report *rep);

/* Per-tenant KV budget in blocks (0 = none). A tenant over its budget has
 * its own unpinned cache entries evicted first, so one tenant's burst does
 * not flush another tenant's cache; pinned entries are never evicted. Any
 * tenant id >= 0 works; the engine keeps an entry only while the tenant has
 * a budget or cached blocks. With an engine thread the budget applies at the
 * next step boundary (the call returns at once; if memory for it runs out
 * then, the old budget stays); without one, before the call returns. */
int tl_model_set_tenant_budget(tl_model *model, int tenant, int max_blocks);

/* One radix-tree node, for policies, shadow eviction and the REPL. */
typedef struct tl_cache_node {
    int64_t id;            /* stable while the node lives */
    int64_t parent;        /* 0 for a top-level node */
    int start, n_tokens;   /* positions [start, start + n_tokens) */
    int n_blocks;          /* block references it holds */
    uint32_t hits;
    uint64_t last_access;  /* cache clock */
    int tenant, pinned, locked, leaf, shareable;
    int loops, cache_window;
    uint64_t salt;
} tl_cache_node;

/* Copies up to cap nodes (depth first) and returns how many there are in
 * all (call with cap 0 to size the buffer). Takes the compute lock. */
int tl_model_cache_nodes(tl_model *model, tl_cache_node *out, int cap);
/* Blocks held by tenant's cache entries (shared blocks counted once per holder). */
int tl_model_tenant_blocks(tl_model *model, int tenant);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif
#endif
