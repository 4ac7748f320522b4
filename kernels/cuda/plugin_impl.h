/* plugin_impl.h - shared by plugin.cu (init, teardown, the ops table) and
 * forward.cu (the forward pass): the plugin's state and its error macros.
 * The .cu files include engine/backend.h before this header. */
#ifndef TL_CUDA_PLUGIN_IMPL_H
#define TL_CUDA_PLUGIN_IMPL_H

#include "cuda_impl.h"

/* Writes "cuda: call failed at file:line: detail" to msg; returns rc (< 0). */
TLC_HIDDEN int pl_fail(char *msg, size_t cap, int rc, const char *call, const char *file, int line, const char *fmt,
                       ...) __attribute__((format(printf, 7, 8)));

/* A tl_cuda_* call; its own message (call, file, line inside the library) follows ours. */
#define TRY(call)                                                                                       \
    do {                                                                                                \
        int rc_ = (call);                                                                               \
        if (rc_ < 0) return pl_fail(msg, cap, rc_, #call, __FILE__, __LINE__, "%s", tl_cuda_last_error()); \
    } while (0)

/* A precondition; the message says what was wrong. */
#define REQ(cond, ...)                                                                                  \
    do {                                                                                                \
        if (!(cond)) return pl_fail(msg, cap, TL_CUDA_ERR_ARG, "check (" #cond ")", __FILE__, __LINE__, __VA_ARGS__); \
    } while (0)

/* ---- state ------------------------------------------------------------------ */

enum { TL_CUDA_LAYER_MAPS = 8 };

typedef struct dev_w {
    const void *d;   /* device, packed */
    const void *d16; /* device f16 copy for the GEMM path, or NULL */
    int type, n_in, n_out;
} dev_w;

typedef struct dev_layer {
    float *attn_norm, *bq, *bk, *bv, *q_norm, *k_norm, *post_attn_norm, *post_ffn_norm, *ffn_norm;
    dev_w wq, wk, wv, wo, w_gate, w_up, w_down;
} dev_layer;

typedef struct uploaded {
    const void *host;
    size_t bytes;
    void *dev;
} uploaded;

typedef struct plugin {
    tl_cuda *c;
    int n_vocab, n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_rot;
    float norm_eps, rope_base, rope_base_swa;
    int rope_type, ffn_act, embd_scale;
    int *layer_window; /* host (n_layer) */
    int kv_blocks, max_batch_tokens, max_seq_len;
    int exact; /* TINYLOOP_CUDA_EXACT=1: batch-invariant arithmetic (see mm) */
    int attn_split; /* TINYLOOP_CUDA_ATTN_SPLIT: decode attention split length, 0 auto, -1 never */

    dev_w tok_embd, output;
    float *output_norm, *rope_freqs;
    dev_layer *layers;

    uploaded *up; /* every init-time device buffer (freed at the end) */
    int n_up, cap_up;

    tl_cuda_kv kv;
    float *x, *xb, *q, *k, *v, *att, *hb, *hb2, *o, *lx;

    /* grown on demand (freed and reallocated) */
    float *logits;
    size_t logits_cap; /* floats */
    int32_t *meta_d, *meta_h;
    size_t meta_cap; /* int32s, both buffers */
    /* device sampling staging (host), grown on demand */
    tl_cuda_sample_row *smp_rows;
    int32_t *smp_pen;
    int smp_rows_cap, smp_pen_cap;
    int unfinished; /* a forward failed after enqueuing work that may still read the staging */
    /* virtual-to-physical layer maps seen by decode steps (one per loop
     * depth in use), each with a number that stands for it in graph keys */
    int *maps[TL_CUDA_LAYER_MAPS], map_len[TL_CUDA_LAYER_MAPS];
    int64_t map_id[TL_CUDA_LAYER_MAPS], next_map_id;
    int n_maps, map_victim;
} plugin;

/* Page-locked host memory (NULL on failure) and its release. */
TLC_HIDDEN void *pinned_alloc(size_t bytes);
TLC_HIDDEN void pinned_free(void *h);

/* ops->forward (forward.cu). */
TLC_HIDDEN int pl_forward(void *ctx, const tl_backend_batch *b, float *logits_host, char *msg, size_t cap);

#endif
