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
    TL_ERR_STATE = -9        /* object in the wrong state for the call */
};

/* Message for the last failure on this thread ("" if none). Owned by the
 * library; valid until the next failing call on this thread. */
const char *tl_last_error(void);

typedef struct tl_model tl_model;
typedef struct tl_seq tl_seq;

enum tl_kv_type { TL_KV_F16 = 0, TL_KV_F32 = 1 };

typedef struct tl_model_params {
    int n_threads;       /* worker threads for compute; <= 0: online cores */
    int max_seq_len;     /* tokens per sequence; <= 0: the model's context length */
    size_t kv_mem;       /* bytes for the KV block arena; 0: enough for 4 full sequences at default loops */
    int kv_block_size;   /* tokens per KV block; <= 0: 16 */
    int kv_type;         /* enum tl_kv_type; default TL_KV_F16 */
    int loop_start;      /* first looped layer; < 0: from the file (tinyloop.loop_start) */
    int loop_end;        /* one past the last looped layer; < 0: from the file */
    int loop_default;    /* default loops; <= 0: from the file, else 1 */
    int vocab_only;      /* 1: load the tokenizer only (no tensors needed) */
} tl_model_params;

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
} tl_model_info;

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

#ifdef __cplusplus
}
#endif
#endif
