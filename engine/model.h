/* model.h - architectures as data, hyperparameters, weights and the model
 * object. Adding an architecture = one tl_arch entry (tensor names, keys,
 * block recipe flags) plus any new ops in forward.c. */
#ifndef TL_MODEL_H
#define TL_MODEL_H

#include <pthread.h>
#include <stdint.h>

#include "backend.h"
#include "forward_ops.h"
#include "gguf.h"
#include "kv_blocks.h"
#include "radix.h"
#include "shape.h"
#include "threadpool.h"
#include "tinyloop.h"
#include "tokenizer.h"

enum tl_rope_type { TL_ROPE_NORM = 0 /* adjacent pairs (llama) */, TL_ROPE_NEOX = 2 /* halves */ };
enum tl_ffn_act { TL_ACT_SILU = 0, TL_ACT_GELU_TANH = 1 };
enum { TL_QKN_HEAD = 1, TL_QKN_FULL = 2 };
enum { TL_LNB_REQUIRED = 0, TL_LNB_NONE = 1, TL_LNB_OPTIONAL = 2 };
enum tl_parallel { TL_PAR_NONE = 0, TL_PAR_KEY = 1, TL_PAR_SHARED = 2, TL_PAR_SHARED_X = 3 };
/* the FFN reads the attention's norm (phi2, falcon, command-r) */
static inline int tl_par_shared_norm(int parallel) { return parallel == TL_PAR_SHARED || parallel == TL_PAR_SHARED_X; }
/* tl_arch.moe: whether a file may route its FFN through experts */
#define TL_MAX_EXPERTS 512
enum { TL_SHEXP_NONE = 0, TL_SHEXP_GATED = 1, TL_SHEXP_KEY = 2 };
enum tl_moe { TL_MOE_NONE = 0, TL_MOE_MAY = 1 /* when expert_count says (llama: Mixtral) */,
              TL_MOE_ALWAYS = 2 /* expert_count required */ };

/* Block recipe and naming of one architecture. */
typedef struct tl_arch {
    const char *name;      /* general.architecture */
    int rope_type;
    int ffn_act;
    int qk_norm;           /* RMSNorm of Q and K (attn_q_norm / attn_k_norm): 1 per head,
                              TL_QKN_FULL over the whole Q / K row before RoPE (olmo2, olmoe) */
    int no_pre_norm;       /* 1: attention and FFN read the residual stream itself, no
                              attn_norm / ffn_norm (olmo2: post norms only) */
    int post_norms;        /* RMSNorm after attention and after the FFN (gemma) */
    int embd_scale;        /* multiply embeddings by sqrt(n_embd) */
    int norm_plus_one;     /* norm weight stored as w, applied as (1 + w) (not in GGUF: 0) */
    int swa_pattern;       /* > 0: of every swa_pattern layers the last is global, the others
                              use the sliding window (gemma3: 6) */
    float rope_base_swa;   /* RoPE base of sliding-window layers (0: the global one) */
    int nope_every;        /* > 0: layers nope_every - 1, 2 * nope_every - 1, ... (0-based) take
                              no RoPE (smollm3: 4) */
    int softcap;           /* 1: attn_logit_softcapping / final_logit_softcapping apply (gemma2) */
    int swa_default;       /* attention.sliding_window when the file has none (gemma2: 4096) */
    int swa_all;           /* 1: every layer attends over attention.sliding_window (phi3) */
    int layer_norm;        /* 1: LayerNorm (mean and variance, weight and bias) instead of RMSNorm
                              (gpt2, stablelm) */
    int learned_pos;       /* 1: learned absolute position embeddings (gpt2) */
    int plain_ffn;         /* 1: act(up) -> down, no gate (gpt2) */
    int ff_half;           /* 1: feed_forward_length is twice the FFN's width (qwen's converter
                              writes Hugging Face's intermediate_size) */
    int multipliers;       /* 1: embedding_scale, residual_scale, attention.scale and
                              logit_scale as the file sets them (granite) */
    int norm_free;         /* 1: LayerNorms without weight or bias, no norm tensors (olmo) */
    int ln_bias;           /* a LayerNorm's bias: TL_LNB_REQUIRED, TL_LNB_NONE (command-r),
                              TL_LNB_OPTIONAL (mpt) */
    int alibi;             /* 1: ALiBi, scores + slope_h * (j - pos), max bias from
                              attention.max_alibi_bias, else 8 (bloom, mpt); no RoPE */
    int tok_norm;          /* 1: a LayerNorm of the token embeddings (bloom's token_embd_norm) */
    int logit_scale;       /* 1: logits times logit_scale, a required key (command-r) */
    int clamp_kqv;         /* 1: attention.clamp_kqv clips Q, K and V when the file sets it (olmo) */
    int parallel;          /* attention and FFN both read the layer's input, x + attn + ffn:
                              TL_PAR_KEY as use_parallel_residual says (gptneox, each with
                              its own norm), TL_PAR_SHARED always, the FFN reading the
                              attention's norm (phi2), TL_PAR_SHARED_X the same, summed as
                              (x + ffn) + attn (command-r) */
    int moe;               /* TL_MOE_*: the FFN as a mixture of experts (moe.c) */
    int moe_norm;          /* 1: the chosen experts' softmax weights are divided by their sum
                              (Mixtral, Qwen 3 MoE); 0: used as they are (Qwen 2 MoE) */
    int moe_shared;        /* a shared expert beside the routed ones: TL_SHEXP_GATED always, gated
                              by sigmoid(x . g) (Qwen 2 MoE); TL_SHEXP_KEY added as it is where
                              expert_shared_feed_forward_length says (Granite MoE shared) */
    int big_layers;        /* n_layer of the size whose attention scale is 1/sqrt(n_embd / n_head)
                              rather than 1/sqrt(head_dim) (Gemma's 27B: llama.cpp keys it on
                              the layer count too); 0: none */
} tl_arch;

typedef struct tl_hparams {
    int n_vocab, n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_rot;
    int n_ctx_train;
    int n_ctx_orig;        /* rope.scaling.original_context_length, else n_ctx_train */
    int sliding_window;    /* attention window of local layers; 0 = none */
    float norm_eps;
    float attn_scale;        /* multiplies q.k: 1/sqrt(head_dim) but for tl_arch.big_layers */
    float attn_softcap;      /* > 0: scores become cap * tanh(score / cap) before the softmax */
    float final_softcap;     /* > 0: logits become cap * tanh(logit / cap) */
    float embd_mul;          /* 1: none; embeddings times it (gemma: sqrt(n_embd), granite's key) */
    float residual_mul;      /* 1: none; each branch's output times it before the residual add (granite) */
    float logit_mul;         /* 1: none; logits times it (granite: 1 / logit_scale, command-r: logit_scale) */
    float clamp_kqv;         /* > 0: Q, K and V clipped to [-clamp_kqv, clamp_kqv] after their biases */
    int n_expert, n_expert_used; /* experts a layer has and routes each token through; 0: a dense FFN */
    int n_ff_exp, n_ff_shexp;    /* an expert's FFN width, the shared expert's (0: none) */
    int parallel;            /* TL_PAR_NONE: x += attn, then x += ffn; TL_PAR_KEY: x + attn(norm(x))
                                + ffn(ffn_norm(x)); TL_PAR_SHARED(_X): x + attn(n) + ffn(n), n = norm(x) */
    tl_rope_params rope;     /* the layers' RoPE */
    tl_rope_params rope_swa; /* sliding-window layers' (gemma3: their own base, unscaled) */
} tl_hparams;

struct tl_model {
    const tl_arch *arch;
    tl_hparams hp;
    gguf_file *file;
    tl_tokenizer *tok;
    tl_model_params params;
    int max_seq_len;
    int loop_start, loop_end, loop_default; /* start == end: no loop block */

    tl_weight tok_embd;    /* (n_embd, n_vocab) */
    tl_weight output;      /* (n_embd, n_vocab); tok_embd when tied */
    float *output_norm;    /* (n_embd) */
    float *output_norm_b;  /* (n_embd) LayerNorm archs' bias, else NULL */
    float *tok_norm, *tok_norm_b; /* (n_embd) the embeddings' LayerNorm (bloom), else NULL */
    float *alibi;          /* (n_head) ALiBi slopes (tl_arch.alibi), else NULL */
    float *output_b;       /* (n_vocab) output.bias (phi2), else NULL */
    tl_weight pos_embd;    /* (n_embd, n_ctx_train) learned positions (gpt2), else data NULL */
    float *rope_freqs;     /* (n_rot/2) RoPE frequency divisors (Llama 3.1 long context), or NULL */
    tl_layer *layers;      /* (n_layer) */
    uint8_t *tensor_used;  /* while loading: 1 per file tensor the model reads (all must be) */
    float **owned_norms;   /* norm vectors we converted to f32 */
    int n_owned_norms, owned_cap;
    void *weight_arena;    /* the matmul weights moved off the file's mapping (weights.c), or NULL */
    int repack_mode;       /* weights.c: on, off or bf16 */
    int bf16_act;          /* repack "bf16": BF16 matmuls round their activations to BF16 (tl_bf16dot_tile) */
    size_t weight_bytes;

    int chat_kind;              /* chat.c */
#define TL_MAX_EOG 8
    int eog[TL_MAX_EOG];        /* end-of-generation ids: EOS and turn-closing tokens */
    int n_eog;
#define TL_MAX_CHAT_MARKERS 40
    int32_t chat_markers[TL_MAX_CHAT_MARKERS]; /* template marker ids content may never become */
    int n_chat_markers;
    struct tl_tokq *tokq;       /* tokenize_async.c: jobs off the caller's thread */

    struct tl_backend_state *backend; /* NULL: the CPU (backend.c) */
    const struct tl_compute_ops *compute; /* the forward pass: tl_cpu_compute or the plugin's */
    tl_threadpool *tp;
    tl_kv_pool kv;
    tl_radix cache;             /* the automatic prefix cache over kv */
    struct tl_cache_tiers *tiers; /* cache_tier.c: host RAM and disk tiers under kv (NULL: none) */
    int spill_min_tokens, spill_min_hits; /* the spill policy (atomic: set from any thread) */
    struct tl_scratch *scratch; /* forward.c */
    struct tl_sched *sched;     /* scheduler.c: requests */
    struct tl_pool **pools;     /* pool_entry.c: pools bound to this model (under pools_mu) */
    int n_pools, cap_pools;
    pthread_mutex_t pools_mu;
};

/* Layer L's bound matrices other than the experts (attention, the dense or
 * shared-expert FFN, the router) into out; returns how many (at most 12). */
static inline int tl_layer_matrices(tl_layer *L, tl_weight **out) {
    tl_weight *all[] = {&L->wq,     &L->wk,      &L->wv,      &L->wo,    &L->w_gate,  &L->w_up,
                        &L->w_down, &L->router, &L->sh_gate, &L->sh_up, &L->sh_down, &L->sh_router};
    int n = 0;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i]->data) out[n++] = all[i]; /* (a plain FFN has no gate, a MoE one no dense FFN) */
    return n;
}

/* model_hparams.c: the architecture named name[0..len) (NULL: none), the
 * table's names joined by ", " into out, and m's hyperparameters from its
 * file (m->arch set; TL_OK or an error naming the key and value). */
const tl_arch *tl_arch_find(const char *name, size_t len);
void tl_arch_names(char *out, size_t cap);
int tl_model_load_hparams(tl_model *m);

/* backend.c */
/* What a backend gets to build its copy of m (layer_window: n_layer ints the
 * caller owns). */
void tl_backend_describe(const tl_model *m, int n_blocks, const tl_kv_layout *kv, int *layer_window,
                         tl_backend_model *out);
/* Picks the backend; *n_blocks may grow when kv_auto and the backend's
 * memory holds more (up to kv_blocks_max). */
int tl_backend_select(tl_model *m, int *n_blocks, const tl_kv_layout *kv, int kv_auto, int kv_blocks_max);
/* Most tokens one forward pass may take (INT_MAX on the CPU). */
int tl_backend_max_tokens(const tl_model *m);
/* Largest top_k the backend samples on its device; 0 = none (CPU). */
int tl_backend_sample_k(const tl_model *m);
void tl_backend_attach_pool(tl_model *m);
void tl_backend_close(tl_model *m);
const char *tl_backend_name(const tl_model *m);

/* weights.c: the repack mode from the params or the environment (before
 * the KV tiers hash the model: the BF16 mode computes other KV), then the
 * matmul weights' move off the file's mapping, packed or converted. */
int tl_weights_resolve(tl_model *m);
void tl_weights_move(tl_model *m);

#endif
