/* forward_ops.c - RMSNorm and RoPE (forward_ops.h). */
#include "forward_ops.h"

#include <math.h>
#include <string.h>

#include "model.h"
#include "quants.h"

/* Four floats at a time (the GCC/Clang vector extension): each lane does
 * exactly the scalar loop's operations, so the results are bitwise its.
 * Written out because -O2 leaves loops of unknown length over possibly
 * aliased rows scalar: RMSNorm, RoPE and the residual adds were 5% of a
 * decode step of 16 sequences (110M, one thread), ~1 ns an element. */
typedef float v4f __attribute__((vector_size(16)));
static inline v4f ld4(const float *p) {
    v4f v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline void st4(float *p, v4f v) { memcpy(p, &v, sizeof v); }

void tl_rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    double sum = tl_sum_sq(x, n);
    float scale = 1.0f / sqrtf((float)(sum / n) + eps);
    int i = 0;
    for (; i + 4 <= n; i += 4) st4(out + i, ld4(x + i) * scale * ld4(w + i));
    for (; i < n; i++) out[i] = (x[i] * scale) * w[i];
}

void tl_layernorm(float *out, const float *x, const float *w, const float *b, int n, float eps) {
    double sum = 0.0, sum2 = 0.0;
    for (int i = 0; i < n; i++) sum += (double)x[i];
    const float mean = (float)(sum / n);
    for (int i = 0; i < n; i++) {
        const float v = x[i] - mean;
        out[i] = v;
        sum2 += (double)(v * v);
    }
    const float scale = 1.0f / sqrtf((float)(sum2 / n) + eps);
    if (!w) { /* non-parametric (olmo) */
        for (int i = 0; i < n; i++) out[i] = out[i] * scale;
        return;
    }
    if (!b) { /* a weight and no bias (command-r) */
        for (int i = 0; i < n; i++) out[i] = out[i] * scale * w[i];
        return;
    }
    for (int i = 0; i < n; i++) out[i] = out[i] * scale * w[i] + b[i];
}

void tl_gelu_tanh(float *x, int n) {
    float ones[256];
    for (int i = 0; i < 256; i++) ones[i] = 1.0f;
    for (int i = 0; i < n; i += 256) tl_gelu_tanh_mul(x + i, ones, n - i < 256 ? n - i : 256);
}

void tl_scale_f32(float *x, float s, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

void tl_add_f32(float *x, const float *o, int n) {
    int i = 0;
    for (; i + 4 <= n; i += 4) st4(x + i, ld4(x + i) + ld4(o + i));
    for (; i < n; i++) x[i] += o[i];
}

/* Pair i's angle as ggml's rope_yarn takes it (theta / ff, then times
 * freq_scale: 1.0f * x is x, so unscaled files keep their bits; YaRN mixes
 * in the unscaled angle by its ramp). */
static inline float rope_angle(float theta, int i, const tl_rope_params *rp, const float *freq_factors) {
    const float extrap = freq_factors ? theta / freq_factors[i] : theta, interp = rp->freq_scale * extrap;
    if (rp->ext_factor == 0.0f) return interp;
    const float y = ((float)i - rp->corr_lo) / fmaxf(0.001f, rp->corr_hi - rp->corr_lo);
    const float mix = (1.0f - fminf(1.0f, fmaxf(0.0f, y))) * rp->ext_factor;
    return interp * (1.0f - mix) + extrap * mix;
}

/* The pair index at which `n_rotations` full turns fit in n_ctx_orig. */
static float yarn_corr_dim(int n_dims, int n_ctx_orig, float n_rotations, float base) {
    return n_dims * logf(n_ctx_orig / (n_rotations * 2 * (float)M_PI)) / (2 * logf(base));
}

void tl_rope_yarn_prepare(tl_rope_params *rp, int n_rot, int n_ctx_orig, float beta_fast, float beta_slow) {
    const float start = floorf(yarn_corr_dim(n_rot, n_ctx_orig, beta_fast, rp->base));
    const float end = ceilf(yarn_corr_dim(n_rot, n_ctx_orig, beta_slow, rp->base));
    rp->corr_lo = fmaxf(0.0f, start);
    rp->corr_hi = fminf((float)(n_rot - 1), end);
    rp->attn_factor *= 1.0f + 0.1f * logf(1.0f / rp->freq_scale);
}

void tl_rope_table(float *cs, int pos, int n_rot, const tl_rope_params *rp, const float *freq_factors) {
    float theta_scale = powf(rp->base, -2.0f / (float)n_rot);
    float theta = (float)pos;
    for (int i = 0; i < n_rot / 2; i++) {
        float th = rope_angle(theta, i, rp, freq_factors);
        cs[2 * i] = cosf(th) * rp->attn_factor;
        cs[2 * i + 1] = sinf(th) * rp->attn_factor;
        theta *= theta_scale;
    }
}

/* Vector lanes of a pair as the scalar loop computes them: x[a] = x0 c -
 * x1 s, x[b] = x0 s + x1 c (the same products, the same sum or difference;
 * adding the negated product is the subtraction, bit for bit). */
void tl_rope_apply(float *x, const float *cs, int n_rot, int type) {
    int i = 0;
    if (type == TL_ROPE_NEOX) { /* pairs (i, i + half): two runs of 4 */
        const int half = n_rot / 2;
        for (; i + 4 <= half; i += 4) {
            const v4f cs0 = ld4(cs + 2 * i), cs1 = ld4(cs + 2 * i + 4);
            const v4f c = __builtin_shufflevector(cs0, cs1, 0, 2, 4, 6), s = __builtin_shufflevector(cs0, cs1, 1, 3, 5, 7);
            const v4f x0 = ld4(x + i), x1 = ld4(x + i + half);
            st4(x + i, x0 * c - x1 * s);
            st4(x + i + half, x0 * s + x1 * c);
        }
    } else { /* pairs (2i, 2i + 1): two pairs a vector */
        const v4f sign = {-1.0f, 1.0f, -1.0f, 1.0f};
        for (; i + 2 <= n_rot / 2; i += 2) {
            const v4f xv = ld4(x + 2 * i), csv = ld4(cs + 2 * i);
            const v4f c = __builtin_shufflevector(csv, csv, 0, 0, 2, 2), s = __builtin_shufflevector(csv, csv, 1, 1, 3, 3);
            const v4f sw = __builtin_shufflevector(xv, xv, 1, 0, 3, 2);
            st4(x + 2 * i, xv * c + sw * s * sign);
        }
    }
    for (; i < n_rot / 2; i++) {
        float c = cs[2 * i], s = cs[2 * i + 1];
        int a = type == TL_ROPE_NEOX ? i : 2 * i, b = type == TL_ROPE_NEOX ? i + n_rot / 2 : 2 * i + 1;
        float x0 = x[a], x1 = x[b];
        x[a] = x0 * c - x1 * s;
        x[b] = x0 * s + x1 * c;
    }
}

void tl_rope(float *x, int pos, int n_rot, const tl_rope_params *rp, int type, const float *freq_factors) {
    float theta_scale = powf(rp->base, -2.0f / (float)n_rot);
    float theta = (float)pos;
    for (int i = 0; i < n_rot / 2; i++) {
        float th = rope_angle(theta, i, rp, freq_factors);
        float c = cosf(th) * rp->attn_factor, s = sinf(th) * rp->attn_factor;
        int a = type == TL_ROPE_NEOX ? i : 2 * i, b = type == TL_ROPE_NEOX ? i + n_rot / 2 : 2 * i + 1;
        float x0 = x[a], x1 = x[b];
        x[a] = x0 * c - x1 * s;
        x[b] = x0 * s + x1 * c;
        theta *= theta_scale;
    }
}
