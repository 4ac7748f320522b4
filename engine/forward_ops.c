/* forward_ops.c - RMSNorm and RoPE (forward_ops.h). */
#include "forward_ops.h"

#include <math.h>

#include "model.h"
#include "quants.h"

void tl_rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    double sum = tl_sum_sq(x, n);
    float scale = 1.0f / sqrtf((float)(sum / n) + eps);
    for (int i = 0; i < n; i++) out[i] = (x[i] * scale) * w[i];
}

void tl_rope_table(float *cs, int pos, int n_rot, float base, const float *freq_factors) {
    float theta_scale = powf(base, -2.0f / (float)n_rot);
    float theta = (float)pos;
    for (int i = 0; i < n_rot / 2; i++) {
        float th = freq_factors ? theta / freq_factors[i] : theta;
        cs[2 * i] = cosf(th);
        cs[2 * i + 1] = sinf(th);
        theta *= theta_scale;
    }
}

void tl_rope_apply(float *x, const float *cs, int n_rot, int type) {
    for (int i = 0; i < n_rot / 2; i++) {
        float c = cs[2 * i], s = cs[2 * i + 1];
        int a = type == TL_ROPE_NEOX ? i : 2 * i, b = type == TL_ROPE_NEOX ? i + n_rot / 2 : 2 * i + 1;
        float x0 = x[a], x1 = x[b];
        x[a] = x0 * c - x1 * s;
        x[b] = x0 * s + x1 * c;
    }
}

void tl_rope(float *x, int pos, int n_rot, float base, int type, const float *freq_factors) {
    float theta_scale = powf(base, -2.0f / (float)n_rot);
    float theta = (float)pos;
    for (int i = 0; i < n_rot / 2; i++) {
        float th = freq_factors ? theta / freq_factors[i] : theta;
        float c = cosf(th), s = sinf(th);
        int a = type == TL_ROPE_NEOX ? i : 2 * i, b = type == TL_ROPE_NEOX ? i + n_rot / 2 : 2 * i + 1;
        float x0 = x[a], x1 = x[b];
        x[a] = x0 * c - x1 * s;
        x[b] = x0 * s + x1 * c;
        theta *= theta_scale;
    }
}
