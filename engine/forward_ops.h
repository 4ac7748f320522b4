/* forward_ops.h - the forward pass's per-token element-wise ops (RMSNorm,
 * RoPE), shared by forward.c's layer steps and store-h's recompute.
 *
 * Numerics follow ggml's CPU ops so greedy tokens match llama.cpp: RMSNorm
 * sums squares in double, RoPE iterates theta in float. */
#ifndef TL_FORWARD_OPS_H
#define TL_FORWARD_OPS_H

#include <stddef.h>

/* out = x / rms(x) * w over n elements (out may be x). */
void tl_rmsnorm(float *out, const float *x, const float *w, int n, float eps);

/* LayerNorm as ggml_norm then the weight and bias: out = (x - mean) /
 * sqrt(var + eps) * w + b, mean and variance summed in double (out may be x). */
void tl_layernorm(float *out, const float *x, const float *w, const float *b, int n, float eps);

/* x[i] = gelu_tanh(x[i]): the GeGLU kernel's GELU, times 1 (exact). */
void tl_gelu_tanh(float *x, int n);

/* x[i] += o[i] over n elements. */
void tl_add_f32(float *x, const float *o, int n);
/* x *= s over n elements (ggml_scale's rounding: one product each). */
void tl_scale_f32(float *x, float s, size_t n);

/* RoPE's angles for one kind of layer, as ggml's rope_yarn computes them:
 * pair i's unscaled angle is e = pos * base^(-2i/n_rot) / freq_factors[i];
 * it turns by freq_scale * e (linear scaling), or under YaRN (ext_factor
 * 1) by a mix of that and e, all e for pairs below corr_lo, all
 * freq_scale * e above corr_hi; cos and sin are multiplied by attn_factor.
 * freq_scale 1, ext_factor 0 and attn_factor 1 (a file without
 * rope.scaling keys) are the plain rotation, bit for bit. */
typedef struct tl_rope_params {
    float base;
    float freq_scale;       /* 1 / rope.scaling.factor, else 1 */
    float attn_factor;      /* rope.scaling.attn_factor, times YaRN's 1 + 0.1 ln(factor) */
    float ext_factor;       /* 1 under YaRN, else 0 */
    float corr_lo, corr_hi; /* YaRN's ramp between these pairs (ggml_rope_yarn_corr_dims) */
} tl_rope_params;

/* YaRN: sets rp's ramp (ggml_rope_yarn_corr_dims for n_rot dimensions,
 * the training context n_ctx_orig and rp->base) and folds its magnitude
 * factor 1 + 0.1 ln(1 / freq_scale) into attn_factor (ggml applies that
 * factor whenever ext_factor is not 0). */
void tl_rope_yarn_prepare(tl_rope_params *rp, int n_rot, int n_ctx_orig, float beta_fast, float beta_slow);

/* Rotates one head in place. NORM pairs (2i, 2i+1); NEOX pairs (i, i + n_rot/2).
 * freq_factors (Llama 3.1's rope_freqs) divide each pair's angle. */
void tl_rope(float *x, int pos, int n_rot, const tl_rope_params *rp, int type, const float *freq_factors);

/* The n_rot/2 (cos, sin) pairs tl_rope computes for pos, into cs[0..n_rot):
 * a token's heads and layers share one table (sincosf per pair was 3% of a
 * prefill when every head computed its own), and tl_rope_apply with it is
 * bitwise tl_rope. */
void tl_rope_table(float *cs, int pos, int n_rot, const tl_rope_params *rp, const float *freq_factors);
void tl_rope_apply(float *x, const float *cs, int n_rot, int type);

#endif
