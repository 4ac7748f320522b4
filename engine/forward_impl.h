/* forward_impl.h - private to the CPU forward pass (forward.c, the layers
 * and the batch; attention.c, attention over the paged KV): the scratch
 * buffers and the steps one file calls in the other. */
#ifndef TL_FORWARD_IMPL_H
#define TL_FORWARD_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"

enum { ATT_QC_MAX = 64 }; /* tokens per attention query chunk at most */

typedef struct tl_scratch {
    int cap;                 /* token capacity of the buffers below */
    float *x;                /* (cap, n_embd) residual stream */
    float *xb;               /* (cap, n_embd) normed input */
    float *q;                /* (cap, q_dim) */
    float *k, *v;            /* (cap, kv_dim) */
    float *att;              /* (cap, q_dim) attention output */
    float *hb, *hb2;         /* (cap, n_ff) */
    float *o;                /* (cap, max(n_embd, ...)) projection output */
    float *o_attn;           /* (cap, n_embd) parallel-residual archs: the attention branch's
                                output while the FFN runs, else NULL */
    void *xq;                /* (cap, quantized row of the widest input) */
    size_t xq_stride;
    int32_t *tok_seq, *tok_pos;
    int32_t *chunk_t0;       /* attention query chunks: tokens [chunk_t0[i], chunk_t0[i+1]), n_chunks + 1 entries */
    int n_chunks;
    int att_qc;              /* tokens per query chunk at most */
    float *scores;           /* per thread: (att_qc, group, max_seq_len) scores + (block_size, head_dim) K/V rows
                              * + kp_floats of K panels + with k_direct, (att_qc, group) queries as q8_0 rows of qq_bytes
                              * + with v_int8, a tl_attn_v8_prep piece at float v8_off */
    int k_direct;            /* K rows are ggml q8_0 / q4_1 rows: scores from the int8 dot kernels */
    int v_int8;              /* V rows are ggml q8_0 rows: V sums through tl_attn_v8_sum */
    size_t v8_off;
    size_t qq_bytes;
    uint8_t *gemm_work;      /* per thread: tl_gemm_work_size(widest input) bytes */
    size_t gemm_work_stride;
    size_t scores_stride;
    size_t kp_floats;        /* per thread, after the K/V rows: K panels of a block (0: no panel kernels) */
    float *logits_x;         /* (n_seq, n_embd) */
    /* mixture of experts (moe.c), NULL in dense models */
    float *moe_logits;       /* (cap, n_expert): router logits, then probabilities */
    int32_t *moe_sel;        /* (cap, n_expert_used): each token's experts */
    float *moe_w;            /* (cap, n_expert_used): their weights */
    int32_t *moe_rows;       /* (cap): the tokens routed to one expert, */
    float *moe_rw;           /* (cap): their weights for it, */
    float *moe_x, *moe_o;    /* (cap, n_embd): their inputs, the expert's outputs */
    /* store-h: one sequence's recomputed K and V, (h_cap, kv_dim) each,
     * from its h rows (h_cap, n_embd); grown to the longest context read. */
    float *hx, *hk, *hv;
    int h_cap;
    float *rope_cs;          /* (2, cap, n_rot): tl_rope_table of each token, for hp.rope and hp.rope_swa */
    int rope_ok[2];          /* table i holds this batch's angles */
    int profile;             /* tl_forward_profile: accumulate prof[] */
    double prof[3];          /* seconds: matmul, attention, whole forward */
} tl_scratch;

/* forward.c: out (T, n_out) = x (T, n_in) . W^T on the pool; x += b per token. */
void tl_fwd_matmul(tl_model *m, float *out, const tl_weight *w, const float *x, int T);
/* The same, right after the matmul of prev on the same, unchanged x: its
 * prepared activations are reused where w's would be the same bytes. */
void tl_fwd_matmul_after(tl_model *m, float *out, const tl_weight *w, const float *x, int T, const tl_weight *prev);
/* outs[i] (T, ws[i]->n_out) = x . ws[i]^T, i < n, for weights of one
 * input width: those that read the same prepared activations as one run
 * (the threads share out all their rows at once), the rest in turn. */
void tl_fwd_matmul_multi(tl_model *m, int n, float *const *outs, const tl_weight *const *ws, const float *x, int T);
void tl_fwd_add_bias(float *x, const float *b, int T, int n);
/* Q, K or V rows (T, n) fresh from their matmul: plus the bias b (NULL:
 * none), then clipped to +-clamp_kqv where the model sets it (olmo). */
void tl_fwd_qkv_finish(const tl_model *m, float *x, const float *b, int T, int n);

/* forward.c: h = act(h) * g over n (the gated FFN's activation: SiLU, or GELU). */
void tl_fwd_gated_act(const tl_model *m, float *h, const float *g, int n);

/* moe.c: s->o (T, n_embd) = the mixture-of-experts FFN of s->xb. */
void tl_moe_ffn(tl_model *m, const tl_layer *ly, int T);

/* attention.c: token t's new K/V rows into its block; q/k norm and
 * RoPE of one token's heads in place (cs: its RoPE table, or NULL); the
 * attention of the batch at virtual layer vl into scratch->att. */
void tl_fwd_store_kv(tl_model *m, tl_seq **seqs, int vl, int t);
/* The architecture's norm of one n_embd row (RMSNorm, or LayerNorm + bias b). */
void tl_fwd_norm(const tl_model *m, float *out, const float *x, const float *w, const float *b);
void tl_fwd_k_finish(const tl_model *m, float *k, int n_heads, const float *norm, int pos, const tl_rope_params *rp,
                     const float *cs, int rope);
int tl_fwd_attend(tl_model *m, tl_seq **seqs, int vl, const tl_layer *ly, int T, int window,
                  const tl_rope_params *rope);

#endif
