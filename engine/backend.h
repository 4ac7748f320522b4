/* backend.h - what a compute backend plugin implements. The CPU path
 * (forward.c) is built in; other backends (CUDA) are shared libraries
 * loaded with dlopen, so libtinyloop.so itself runs without their
 * runtimes. The engine keeps doing all the bookkeeping (requests, radix
 * tree, block ids and reference counts); a backend owns the weights in its
 * memory and the KV arena, and computes one batched forward pass.
 *
 * A plugin exports `const tl_backend_ops *tl_backend_plugin_v1(void)`.
 * This header is plain C with no CUDA types; plugins include it. */
#ifndef TL_BACKEND_H
#define TL_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "kv_layout.h"

#define TL_BACKEND_ABI 7

/* Largest top_k a backend samples on its device; wider (or top_k 0 with a
 * temperature) rows come back as logits and are sampled on the host. */
#define TL_BACKEND_SAMPLE_MAX_K 256

typedef struct tl_weight {
    const void *data;      /* packed, host memory (the mapping) */
    int type;              /* ggml type id (TL_TYPE_*) */
    int64_t n_in, n_out;   /* ne[0] (row length), ne[1] (rows) */
    int packed;            /* G > 0: rows interleaved G at a time, TL_PACK8 / TL_PACK16 (CPU only, kernels/cpu/quants.h) */
} tl_weight;

typedef struct tl_layer {
    float *attn_norm;      /* (n_embd) */
    tl_weight wq;          /* (n_head*head_dim, n_embd) */
    tl_weight wk, wv;      /* (n_head_kv*head_dim, n_embd) */
    tl_weight wo;          /* (n_embd, n_head*head_dim) */
    float *bq, *bk, *bv;   /* optional Q/K/V biases (qwen2), or NULL */
    float *q_norm, *k_norm;           /* (head_dim), qk_norm archs, or NULL */
    float *post_attn_norm, *post_ffn_norm; /* (n_embd), post_norms archs, or NULL */
    float *ffn_norm;       /* (n_embd) */
    tl_weight w_gate, w_up; /* (n_ff, n_embd); w_gate unbound (data NULL) in a plain FFN */
    tl_weight w_down;      /* (n_embd, n_ff) */
    /* LayerNorm architectures (gpt2): the norms' biases, and the output
     * projection's and the FFN's biases; NULL elsewhere */
    float *attn_norm_b, *ffn_norm_b; /* (n_embd) */
    float *bo;                       /* (n_embd) */
    float *b_up;                     /* (n_ff) */
    float *b_down;                   /* (n_embd) */
    /* A mixture-of-experts FFN (n_expert > 0; the dense w_gate, w_up and
     * w_down unbound): the router, each expert's matrices as row views of
     * the file's 3-D tensors, and Qwen 2 MoE's shared expert with its gate
     * row (data NULL where absent). CPU only (backend.c). */
    tl_weight router;                /* (n_expert, n_embd) */
    tl_weight *x_gate, *x_up;        /* (n_expert) each: (n_ff_exp, n_embd) */
    tl_weight *x_down;               /* (n_expert): (n_embd, n_ff_exp) */
    tl_weight sh_gate, sh_up;        /* (n_ff_shexp, n_embd) */
    tl_weight sh_down;               /* (n_embd, n_ff_shexp) */
    tl_weight sh_router;             /* (1, n_embd) */
} tl_layer;

/* Everything a backend needs to build its copy of a model (host pointers,
 * valid while the model lives). All norm vectors are f32 and final (any
 * architecture offset already applied). Calls come from one thread at a
 * time (the engine's compute lock). */
typedef struct tl_backend_model {
    int abi;                       /* TL_BACKEND_ABI */
    int n_vocab, n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_rot;
    float norm_eps;
    float rope_base, rope_base_swa; /* rope_base_swa: sliding-window layers (0 = rope_base) */
    int rope_type;                 /* 0 NORM (pairs 2i, 2i+1), 2 NEOX (i, i + n_rot/2) */
    int ffn_act;                   /* 0 SiLU-gated, 1 GELU(tanh)-gated */
    int embd_scale;                /* 1: embeddings times sqrt(n_embd) */
    const int *layer_window;       /* (n_layer) sliding window per physical layer, 0 = none */
    const float *rope_freqs;       /* (n_rot/2) or NULL */
    tl_weight tok_embd, output;    /* output may equal tok_embd (tied) */
    const float *output_norm;      /* (n_embd) */
    const tl_layer *layers;        /* (n_layer) */
    /* KV arena: n_blocks blocks; a block holds one virtual layer's K then V
     * for block_size positions, each laid out [n_head_kv][block_size][head_dim]. */
    int kv_blocks, kv_block_size, kv_type; /* kv_type: K's row type (= kv_layout.type_k) */
    tl_kv_layout kv_layout;        /* the block's bytes in the KV mode (kv_layout.h) */
    size_t kv_mem;                 /* bytes the caller sized the arena for */
    /* kv_auto: the caller set no size; the backend may grow the arena to
     * what its memory holds (up to kv_blocks_max blocks, at least
     * kv_blocks) and reports the count through ops->kv_blocks. */
    int kv_auto, kv_blocks_max;
    int max_batch_tokens;          /* largest T the engine passes in one call */
    int max_seq_len;
} tl_backend_model;

/* One forward pass: T new tokens from n_seq sequences sharing one depth. */
typedef struct tl_backend_batch {
    int n_seq, T;
    const int32_t *tokens;         /* (T) */
    const int32_t *pos;            /* (T) position of each token */
    const int32_t *tok_seq;        /* (T) sequence index of each token */
    const int32_t *const *block_ids; /* (n_seq) each seq's table: ids[lb * depth + vl]; -1 for
                                        blocks dropped behind a cache_window (never read) */
    const int *n_logical;          /* (n_seq) logical blocks in each table */
    const int *window;             /* (n_seq) request cache_window, 0 = none (never NULL) */
    int depth;                     /* virtual layers */
    const int *phys_layer;         /* (depth) physical layer of each virtual layer */
    const int *want_logits;        /* (n_seq) 0/1; logits rows compacted in order (never NULL) */
    /* Sampling on the device (NULL: every row's logits go to the host).
     * One entry per logits row; rows with on_device get their token in
     * ids_out[row], the others their logits in logits_host (which may then
     * hold every row). */
    const struct tl_backend_sample *sample;
    int32_t *ids_out;              /* (rows) */
    /* Resume handles (looped models). x_in non-NULL: the pass starts at
     * virtual layer vl_begin from these (T, n_embd) host hidden states
     * instead of the token embeddings (tokens still give the positions'
     * ids). x_capture non-NULL: the hidden states entering virtual layer
     * vl_capture (< depth) are copied there, (T, n_embd). */
    const float *x_in;
    int vl_begin;
    float *x_capture;
    int vl_capture;
} tl_backend_batch;

/* The engine's sampling chain (sampler.c) for one row, the random draw
 * made by the host so a request's generator advances as on the CPU. */
typedef struct tl_backend_sample {
    int on_device;
    int top_k;                     /* 1..TL_BACKEND_SAMPLE_MAX_K (ignored when temperature <= 0) */
    float temperature, top_p, min_p, repeat_penalty;
    float u;                       /* uniform in [0, 1) (used when temperature > 0) */
    const int32_t *penalty_ids;    /* distinct recent tokens the penalty applies to */
    int n_penalty;
} tl_backend_sample;

typedef struct tl_backend_ops {
    const char *name;
    int abi;
    /* Returns 0 and a context, or < 0 with the reason in msg (msg_cap bytes). */
    int (*init)(const tl_backend_model *model, void **ctx, char *msg, size_t msg_cap);
    void (*free)(void *ctx);
    /* Computes the batch (writing K/V of the new positions into their
     * blocks) and copies the wanted last-token logits to logits_host
     * (rows x n_vocab). Returns 0 or < 0 with the reason in msg. */
    int (*forward)(void *ctx, const tl_backend_batch *batch, float *logits_host, char *msg, size_t msg_cap);
    /* Copy-on-write: block dst gets block src's contents. */
    int (*copy_block)(void *ctx, int dst, int src, char *msg, size_t msg_cap);
    /* Blocks in the arena after init (kv_auto may have grown it). */
    int (*kv_blocks)(void *ctx);
    /* The KV tiers (engine/cache_tier.c): copies block `block`'s bytes
     * (kv_layout.block_bytes) from the arena to `host` (to_device 0) or
     * from `host` into the arena (1). Ordered after every forward pass
     * and block copy already submitted; synchronous from the caller's
     * view: when it returns 0 the copy is complete and `host` may be
     * reused. Returns < 0 with the reason in msg. NULL: the backend
     * cannot, and the engine refuses KV tiers on it. */
    int (*kv_io)(void *ctx, int block, void *host, int to_device, char *msg, size_t msg_cap);
    int max_sample_k;              /* 0: no device sampling */
} tl_backend_ops;

typedef const tl_backend_ops *(*tl_backend_plugin_fn)(void);

#endif
