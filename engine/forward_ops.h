/* forward_ops.h - the forward pass's per-token element-wise ops (RMSNorm,
 * RoPE), shared by forward.c's layer steps and store-h's recompute.
 *
 * Numerics follow ggml's CPU ops so greedy tokens match llama.cpp: RMSNorm
 * sums squares in double, RoPE iterates theta in float. */
#ifndef TL_FORWARD_OPS_H
#define TL_FORWARD_OPS_H

/* out = x / rms(x) * w over n elements (out may be x). */
void tl_rmsnorm(float *out, const float *x, const float *w, int n, float eps);

/* x[i] += o[i] over n elements. */
void tl_add_f32(float *x, const float *o, int n);

/* Rotates one head in place. NORM pairs (2i, 2i+1); NEOX pairs (i, i + n_rot/2).
 * freq_factors (Llama 3.1's rope_freqs) divide each pair's angle. */
void tl_rope(float *x, int pos, int n_rot, float base, int type, const float *freq_factors);

/* The n_rot/2 (cos, sin) pairs tl_rope computes for pos, into cs[0..n_rot):
 * a token's heads and layers share one table (sincosf per pair was 3% of a
 * prefill when every head computed its own), and tl_rope_apply with it is
 * bitwise tl_rope. */
void tl_rope_table(float *cs, int pos, int n_rot, float base, const float *freq_factors);
void tl_rope_apply(float *x, const float *cs, int n_rot, int type);

#endif
