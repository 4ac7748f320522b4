/* quants_ref.c - the scalar reference for every weight type: half/bfloat
 * conversions, dequantize, quantize and vec_dot. Dequantization is
 * bit-exact with ggml; the dot products sum an integer dot per block and
 * scale it once, like ggml, so SIMD kernels can match them closely. */
#include <assert.h>
#include <float.h>
#include <math.h>
#include <string.h>

#include "iq2_grids.h"
#include "iq3_grids.h"
#include "iq1_grids.h"
#include "quants_impl.h"

/* ---------------------------------------------------------------- halves */

float tl_f16_to_f32(uint16_t h) { return tl_f16_to_f32_inl(h); }
uint16_t tl_f32_to_f16(float f) { return tl_f32_to_f16_inl(f); }
float tl_bf16_to_f32(uint16_t h) { return tl_bf16_to_f32_inl(h); }
uint16_t tl_f32_to_bf16(float f) { return tl_f32_to_bf16_inl(f); }

static void f16_to_f32_row_ref(const uint16_t *src, float *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = tl_f16_to_f32_inl(src[i]);
}

static void f32_to_f16_row_ref(const float *src, uint16_t *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = tl_f32_to_f16_inl(src[i]);
}

/* Round half to even, like ggml's nearest_int (valid for |x| < 2^22). */
static inline int nearest_int(float x) { return (int)lrintf(x); }

/* ------------------------------------------------------------ dequantize */

static void dequant_q4_0(const void *src, float *y, int64_t nb) {
    const block_q4_0 *x = src;
    for (int64_t i = 0; i < nb; i++, y += 32) {
        const float d = TL_F16(x[i].d);
        for (int j = 0; j < 16; j++) {
            y[j] = ((x[i].qs[j] & 0xF) - 8) * d;
            y[j + 16] = ((x[i].qs[j] >> 4) - 8) * d;
        }
    }
}

static void dequant_q4_1(const void *src, float *y, int64_t nb) {
    const block_q4_1 *x = src;
    for (int64_t i = 0; i < nb; i++, y += 32) {
        const float d = TL_F16(x[i].d), m = TL_F16(x[i].m);
        for (int j = 0; j < 16; j++) {
            y[j] = (x[i].qs[j] & 0xF) * d + m;
            y[j + 16] = (x[i].qs[j] >> 4) * d + m;
        }
    }
}

static void dequant_q5_0(const block_q5_0 *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += 32) {
        const float d = TL_F16(x[i].d);
        uint32_t qh;
        memcpy(&qh, x[i].qh, 4);
        for (int j = 0; j < 16; j++) {
            const int h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
            y[j] = (((x[i].qs[j] & 0xF) | h0) - 16) * d;
            y[j + 16] = (((x[i].qs[j] >> 4) | h1) - 16) * d;
        }
    }
}

static void dequant_q5_1(const block_q5_1 *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += 32) {
        const float d = TL_F16(x[i].d), m = TL_F16(x[i].m);
        uint32_t qh;
        memcpy(&qh, x[i].qh, 4);
        for (int j = 0; j < 16; j++) {
            const int h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
            y[j] = ((x[i].qs[j] & 0xF) | h0) * d + m;
            y[j + 16] = ((x[i].qs[j] >> 4) | h1) * d + m;
        }
    }
}

static void dequant_iq4_nl(const block_q4_0 *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += 32) {
        const float d = TL_F16(x[i].d);
        for (int j = 0; j < 16; j++) {
            y[j] = d * tl_iq4nl_values[x[i].qs[j] & 0xF];
            y[j + 16] = d * tl_iq4nl_values[x[i].qs[j] >> 4];
        }
    }
}

static void dequant_iq4_xs(const block_iq4_xs *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float d = TL_F16(x[i].d);
        for (int j = 0; j < 8; j++, y += 32) {
            const float dl = d * tl_iq4xs_scale((const uint8_t *)&x[i], j);
            const uint8_t *qs = x[i].qs + 16 * j;
            for (int l = 0; l < 16; l++) {
                y[l] = dl * tl_iq4nl_values[qs[l] & 0xF];
                y[l + 16] = dl * tl_iq4nl_values[qs[l] >> 4];
            }
        }
    }
}

static void dequant_q8_0(const void *src, float *y, int64_t nb) {
    const block_q8_0 *x = src;
    for (int64_t i = 0; i < nb; i++, y += 32) {
        const float d = TL_F16(x[i].d);
        for (int j = 0; j < 32; j++) y[j] = x[i].qs[j] * d;
    }
}

/* Element e (0..255) of a q2_K block: the 2-bit value 0..3. */
static inline int q2_K_get(const block_q2_K *b, int e) {
    return (b->qs[32 * (e / 128) + e % 32] >> (2 * (e % 128 / 32))) & 3;
}

/* Element e of a q3_K block: the signed 3-bit value -4..3. */
static inline int q3_K_get(const block_q3_K *b, int e) {
    const int c = e / 128, j = e % 128 / 32, p = e % 32;
    return ((b->qs[32 * c + p] >> (2 * j)) & 3) - ((b->hmask[p] >> (4 * c + j)) & 1 ? 0 : 4);
}

static void dequant_q2_K(const block_q2_K *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK_K) {
        const float d = TL_F16(x[i].d), dmin = TL_F16(x[i].dmin);
        for (int e = 0; e < QK_K; e++) {
            const int sc = x[i].scales[e / 16];
            y[e] = d * (sc & 0xF) * q2_K_get(&x[i], e) - dmin * (sc >> 4);
        }
    }
}

static void dequant_q3_K(const block_q3_K *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK_K) {
        const float d = TL_F16(x[i].d);
        int sc[16];
        tl_q3_K_scales(x[i].scales, sc);
        for (int e = 0; e < QK_K; e++) y[e] = d * sc[e / 16] * q3_K_get(&x[i], e);
    }
}

static void dequant_q4_K(const block_q4_K *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float d = TL_F16(x[i].d), dmin = TL_F16(x[i].dmin);
        const uint8_t *q = x[i].qs;
        for (int j = 0; j < 4; j++, q += 32) {
            uint8_t sc, m;
            tl_get_scale_min_k4(2 * j, x[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = dmin * m;
            tl_get_scale_min_k4(2 * j + 1, x[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = dmin * m;
            for (int l = 0; l < 32; l++) *y++ = d1 * (q[l] & 0xF) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (q[l] >> 4) - m2;
        }
    }
}

static void dequant_q5_K(const block_q5_K *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float d = TL_F16(x[i].d), dmin = TL_F16(x[i].dmin);
        const uint8_t *ql = x[i].qs, *qh = x[i].qh;
        uint8_t u1 = 1, u2 = 2;
        for (int j = 0; j < 4; j++, ql += 32, u1 <<= 2, u2 <<= 2) {
            uint8_t sc, m;
            tl_get_scale_min_k4(2 * j, x[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = dmin * m;
            tl_get_scale_min_k4(2 * j + 1, x[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = dmin * m;
            for (int l = 0; l < 32; l++) *y++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
        }
    }
}

/* Element l (0..255) of a q6_K block as a signed 6-bit value. */
static inline int q6_K_get(const block_q6_K *b, int l) {
    const int half = l / 128, r = l % 128, quarter = r / 32, p = r % 32;
    const uint8_t *ql = b->ql + 64 * half, *qh = b->qh + 32 * half;
    const int lo = (quarter & 1) ? ql[p + 32] : ql[p];
    const int lo4 = (quarter & 2) ? lo >> 4 : lo & 0xF;
    return (lo4 | (((qh[p] >> (2 * quarter)) & 3) << 4)) - 32;
}

static void dequant_q6_K(const block_q6_K *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK_K) {
        const float d = TL_F16(x[i].d);
        for (int l = 0; l < QK_K; l++) y[l] = d * x[i].scales[l / 16] * q6_K_get(&x[i], l);
    }
}

void tl_dequantize_row(int type, const void *src, float *dst, int64_t n) {
    const tl_type_traits *t = tl_type_info(type);
    assert(t->name && n % t->block_size == 0);
    const int64_t nb = n / t->block_size;
    switch (type) {
    case TL_TYPE_F32: memcpy(dst, src, (size_t)n * sizeof(float)); break;
    case TL_TYPE_F16: tl_f16_to_f32_row(src, dst, n); break;
    case TL_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) dst[i] = tl_bf16_to_f32_inl(((const uint16_t *)src)[i]);
        break;
    case TL_TYPE_Q4_0: tl_dequant_q4_0_blocks(src, dst, nb); break;
    case TL_TYPE_Q4_1: tl_dequant_q4_1_blocks(src, dst, nb); break;
    case TL_TYPE_Q5_0: dequant_q5_0(src, dst, nb); break;
    case TL_TYPE_Q8_0: tl_dequant_q8_0_blocks(src, dst, nb); break;
    case TL_TYPE_IQ4_NL: dequant_iq4_nl(src, dst, nb); break;
    case TL_TYPE_IQ4_XS: dequant_iq4_xs(src, dst, nb); break;
    case TL_TYPE_IQ2_XXS: tl_dequant_iq2_xxs(src, dst, nb); break;
    case TL_TYPE_IQ2_XS: tl_dequant_iq2_xs(src, dst, nb); break;
    case TL_TYPE_IQ2_S: tl_dequant_iq2_s(src, dst, nb); break;
    case TL_TYPE_IQ3_XXS: tl_dequant_iq3_xxs(src, dst, nb); break;
    case TL_TYPE_IQ3_S: tl_dequant_iq3_s(src, dst, nb); break;
    case TL_TYPE_IQ1_S: tl_dequant_iq1_s(src, dst, nb); break;
    case TL_TYPE_IQ1_M: tl_dequant_iq1_m(src, dst, nb); break;
    case TL_TYPE_Q5_1: dequant_q5_1(src, dst, nb); break;
    case TL_TYPE_Q2_K: dequant_q2_K(src, dst, nb); break;
    case TL_TYPE_Q3_K: dequant_q3_K(src, dst, nb); break;
    case TL_TYPE_Q4_K: dequant_q4_K(src, dst, nb); break;
    case TL_TYPE_Q5_K: dequant_q5_K(src, dst, nb); break;
    case TL_TYPE_Q6_K: dequant_q6_K(src, dst, nb); break;
    case TL_TYPE_Q8_K:
        for (int64_t i = 0; i < nb; i++) {
            const block_q8_K *b = (const block_q8_K *)src + i;
            for (int j = 0; j < QK_K; j++) dst[i * QK_K + j] = b->d * b->qs[j];
        }
        break;
    default: assert(!"tl_dequantize_row: unsupported type"); break;
    }
}

/* -------------------------------------------------------------- quantize */

/* Activation quantizers: byte-exact with ggml's quantize_row_q8_0_ref and
 * quantize_row_q8_K_ref. The SIMD versions must reproduce these. */
static void quant_q8_0(const float *x, block_q8_0 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 32) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127, id = d ? 1.0f / d : 0.0f;
        y[i].d = tl_f32_to_f16_inl(d);
        for (int j = 0; j < 32; j++) y[i].qs[j] = (int8_t)roundf(x[j] * id);
    }
}

static void quant_q8_K(const float *x, block_q8_K *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        float max = 0, amax = 0;
        for (int j = 0; j < QK_K; j++) {
            const float ax = fabsf(x[j]);
            if (ax > amax) { amax = ax; max = x[j]; }
        }
        if (!amax) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        const float iscale = -127.f / max;
        for (int j = 0; j < QK_K; j++) {
            const int v = nearest_int(iscale * x[j]);
            y[i].qs[j] = (int8_t)(v < 127 ? v : 127);
        }
        for (int j = 0; j < QK_K / 16; j++) {
            int sum = 0;
            for (int l = 0; l < 16; l++) sum += y[i].qs[j * 16 + l];
            y[i].bsums[j] = (int16_t)sum;
        }
        y[i].d = 1 / iscale;
    }
}

/* ggml's reference q4_0/q4_1/q5_0 quantizers. */
static void quant_q4_0(const float *x, block_q4_0 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 32) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < 32; j++)
            if (amax < fabsf(x[j])) { amax = fabsf(x[j]); max = x[j]; }
        const float d = max / -8, id = d ? 1.0f / d : 0.0f;
        y[i].d = tl_f32_to_f16_inl(d);
        for (int j = 0; j < 16; j++) {
            const int a = (int8_t)(x[j] * id + 8.5f), b = (int8_t)(x[j + 16] * id + 8.5f);
            y[i].qs[j] = (uint8_t)((a < 15 ? a : 15) | (b < 15 ? b : 15) << 4);
        }
    }
}

/* iq4_nl: the level nearest x / d for d = max / -127 (the extreme on the
 * outermost level), then d refit by least squares to the levels chosen. */
static int iq4nl_nearest(float v) {
    int best = 0;
    for (int k = 1; k < 16; k++)
        if (fabsf(v - tl_iq4nl_values[k]) < fabsf(v - tl_iq4nl_values[best])) best = k;
    return best;
}

static void quant_iq4_nl(const float *x, block_q4_0 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 32) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < 32; j++)
            if (amax < fabsf(x[j])) { amax = fabsf(x[j]); max = x[j]; }
        const float d0 = max / -127, id = d0 ? 1.0f / d0 : 0.0f;
        int L[32];
        float sxl = 0, sll = 0;
        for (int j = 0; j < 32; j++) {
            L[j] = iq4nl_nearest(x[j] * id);
            sxl += x[j] * tl_iq4nl_values[L[j]];
            sll += (float)tl_iq4nl_values[L[j]] * tl_iq4nl_values[L[j]];
        }
        y[i].d = tl_f32_to_f16_inl(sll > 0 ? sxl / sll : 0.0f);
        for (int j = 0; j < 16; j++) y[i].qs[j] = (uint8_t)(L[j] | L[j + 16] << 4);
    }
}

/* iq4_xs: per sub-block iq4_nl's fit (a float scale), the scales then
 * quantized to 6 signed bits against d = max / -32, the elements
 * requantized against the scales the decoder will see. */
static void quant_iq4_xs(const float *x, block_iq4_xs *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        float sc[8], max_sc = 0, amax_sc = 0;
        for (int j = 0; j < 8; j++) {
            block_q4_0 t;
            quant_iq4_nl(x + 32 * j, &t, 1);
            sc[j] = TL_F16(t.d);
            if (fabsf(sc[j]) > amax_sc) { amax_sc = fabsf(sc[j]); max_sc = sc[j]; }
        }
        memset(&y[i], 0, sizeof y[i]);
        const float d = max_sc / -32;
        y[i].d = tl_f32_to_f16_inl(d);
        const float dh = TL_F16(y[i].d), id = dh ? 1.0f / dh : 0.0f;
        for (int j = 0; j < 8; j++) {
            int ls = nearest_int(sc[j] * id);
            ls = (ls < -32 ? -32 : ls > 31 ? 31 : ls) + 32;
            y[i].scales_l[j / 2] |= (uint8_t)((ls & 0xF) << (4 * (j % 2)));
            y[i].scales_h |= (uint16_t)((ls >> 4) << (2 * j));
            const float dl = dh * (ls - 32), il = dl ? 1.0f / dl : 0.0f;
            for (int l = 0; l < 16; l++)
                y[i].qs[16 * j + l] = (uint8_t)(iq4nl_nearest(x[32 * j + l] * il) | iq4nl_nearest(x[32 * j + l + 16] * il) << 4);
        }
    }
}

/* The least and greatest of a 32-element block (q4_1, q5_1). */
static void min_max32(const float *x, float *min, float *max) {
    *min = FLT_MAX, *max = -FLT_MAX;
    for (int j = 0; j < 32; j++) {
        if (x[j] < *min) *min = x[j];
        if (x[j] > *max) *max = x[j];
    }
}

static void quant_q4_1(const float *x, block_q4_1 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 32) {
        float min, max;
        min_max32(x, &min, &max);
        const float d = (max - min) / 15, id = d ? 1.0f / d : 0.0f;
        y[i].d = tl_f32_to_f16_inl(d);
        y[i].m = tl_f32_to_f16_inl(min);
        for (int j = 0; j < 16; j++) {
            const int a = (int8_t)((x[j] - min) * id + 0.5f);
            const int b = (int8_t)((x[j + 16] - min) * id + 0.5f);
            y[i].qs[j] = (uint8_t)((a < 15 ? a : 15) | (b < 15 ? b : 15) << 4);
        }
    }
}

static void quant_q5_1(const float *x, block_q5_1 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 32) {
        float min, max;
        min_max32(x, &min, &max);
        const float d = (max - min) / 31, id = d ? 1.0f / d : 0.0f;
        y[i].d = tl_f32_to_f16_inl(d);
        y[i].m = tl_f32_to_f16_inl(min);
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            const int a = (int)((x[j] - min) * id + 0.5f), b = (int)((x[j + 16] - min) * id + 0.5f);
            y[i].qs[j] = (uint8_t)((a & 0xF) | ((b & 0xF) << 4));
            qh |= (uint32_t)((a & 0x10) >> 4) << j;
            qh |= (uint32_t)((b & 0x10) >> 4) << (j + 16);
        }
        memcpy(y[i].qh, &qh, 4);
    }
}

static void quant_q5_0(const float *x, block_q5_0 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 32) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < 32; j++)
            if (amax < fabsf(x[j])) { amax = fabsf(x[j]); max = x[j]; }
        const float d = max / -16, id = d ? 1.0f / d : 0.0f;
        y[i].d = tl_f32_to_f16_inl(d);
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            int a = (int8_t)(x[j] * id + 16.5f), b = (int8_t)(x[j + 16] * id + 16.5f);
            a = a < 31 ? a : 31;
            b = b < 31 ? b : 31;
            y[i].qs[j] = (uint8_t)((a & 0xF) | ((b & 0xF) << 4));
            qh |= (uint32_t)((a & 0x10) >> 4) << j;
            qh |= (uint32_t)((b & 0x10) >> 4) << (j + 16);
        }
        memcpy(y[i].qh, &qh, 4);
    }
}

/* Fits x ~ scale*L - min with L in [0, nmax], min >= 0: tries a few grid
 * steps around the min/max fit and refines each by least squares (a
 * weight-free cut of ggml's make_qkx2_quants). Returns scale, sets *the_min. */
static float fit_scale_min(int n, int nmax, const float *x, uint8_t *L, float *the_min) {
    float xmin = x[0], xmax = x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < xmin) xmin = x[i];
        if (x[i] > xmax) xmax = x[i];
    }
    if (xmin > 0) xmin = 0;
    if (xmax == xmin) {
        memset(L, 0, (size_t)n);
        *the_min = -xmin;
        return 0.0f;
    }
    float best_scale = (xmax - xmin) / nmax, best_min = xmin, best_err = INFINITY;
    for (int step = -6; step <= 12; step++) {
        const float iscale = (nmax + 0.1f * step) / (xmax - xmin);
        float sl = 0, sl2 = 0, sx = 0, slx = 0;
        uint8_t Lt[32];
        for (int i = 0; i < n; i++) {
            int l = nearest_int(iscale * (x[i] - xmin));
            l = l < 0 ? 0 : l > nmax ? nmax : l;
            Lt[i] = (uint8_t)l;
            sl += l; sl2 += (float)l * l; sx += x[i]; slx += l * x[i];
        }
        const float det = n * sl2 - sl * sl;
        float scale, min;
        if (det > 0) {
            scale = (n * slx - sl * sx) / det;
            min = (sl2 * sx - sl * slx) / det; /* offset b in x ~ scale*L + b */
            if (min > 0) { min = 0; scale = slx / sl2; }
        } else {
            continue;
        }
        float err = 0;
        for (int i = 0; i < n; i++) {
            const float e = scale * Lt[i] + min - x[i];
            err += e * e;
        }
        if (err < best_err) {
            best_err = err; best_scale = scale; best_min = min;
            memcpy(L, Lt, (size_t)n);
        }
    }
    *the_min = -best_min;
    return best_scale;
}

/* Shared by q4_K (nmax 15) and q5_K (nmax 31): per 32-element sub-block
 * scale and min, both quantized to 6 bits against fp16 super-scales. */
static void quant_k_scales(const float *x, int nmax, uint16_t *dh, uint16_t *dminh, uint8_t scales[12],
                           uint8_t L[QK_K]) {
    float sc[8], mn[8], max_sc = 0, max_mn = 0;
    for (int j = 0; j < 8; j++) {
        sc[j] = fit_scale_min(32, nmax, x + 32 * j, L + 32 * j, &mn[j]);
        if (sc[j] > max_sc) max_sc = sc[j];
        if (mn[j] > max_mn) max_mn = mn[j];
    }
    const float inv_sc = max_sc > 0 ? 63.f / max_sc : 0.f, inv_mn = max_mn > 0 ? 63.f / max_mn : 0.f;
    uint8_t ls[8], lm[8];
    for (int j = 0; j < 8; j++) {
        int a = nearest_int(inv_sc * sc[j]), b = nearest_int(inv_mn * mn[j]);
        ls[j] = (uint8_t)(a < 0 ? 0 : a > 63 ? 63 : a);
        lm[j] = (uint8_t)(b < 0 ? 0 : b > 63 ? 63 : b);
    }
    memset(scales, 0, 12);
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            scales[j] = ls[j];
            scales[j + 4] = lm[j];
        } else {
            scales[j + 4] = (uint8_t)((ls[j] & 0xF) | ((lm[j] & 0xF) << 4));
            scales[j - 4] |= (uint8_t)((ls[j] >> 4) << 6);
            scales[j] |= (uint8_t)((lm[j] >> 4) << 6);
        }
    }
    *dh = tl_f32_to_f16_inl(max_sc / 63.f);
    *dminh = tl_f32_to_f16_inl(max_mn / 63.f);
    /* Requantize against the scales the decoder will actually see. */
    const float d = TL_F16(*dh), dmin = TL_F16(*dminh);
    for (int j = 0; j < 8; j++) {
        uint8_t s, m;
        tl_get_scale_min_k4(j, scales, &s, &m);
        const float ds = d * s, dm = dmin * m;
        for (int l = 0; l < 32; l++) {
            int q = ds ? nearest_int((x[32 * j + l] + dm) / ds) : 0;
            L[32 * j + l] = (uint8_t)(q < 0 ? 0 : q > nmax ? nmax : q);
        }
    }
}

static void quant_q4_K(const float *x, block_q4_K *y, int64_t nb) {
    uint8_t L[QK_K];
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        quant_k_scales(x, 15, &y[i].d, &y[i].dmin, y[i].scales, L);
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 32; l++)
                y[i].qs[32 * j + l] = (uint8_t)(L[64 * j + l] | (L[64 * j + 32 + l] << 4));
    }
}

static void quant_q5_K(const float *x, block_q5_K *y, int64_t nb) {
    uint8_t L[QK_K];
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        quant_k_scales(x, 31, &y[i].d, &y[i].dmin, y[i].scales, L);
        memset(y[i].qh, 0, 32);
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 32; l++) {
                const int a = L[64 * j + l], b = L[64 * j + 32 + l];
                y[i].qs[32 * j + l] = (uint8_t)((a & 0xF) | ((b & 0xF) << 4));
                y[i].qh[l] |= (uint8_t)(((a >> 4) << (2 * j)) | ((b >> 4) << (2 * j + 1)));
            }
    }
}

/* Symmetric fit of 16 values with L in [-nmax, nmax - 1] (q6_K: 32, q3_K:
 * 4): grid of scales around max/-nmax, each refined by least squares. */
static float fit_scale_sym(const float *x, int nmax, int8_t *L) {
    float amax = 0, max = 0;
    for (int i = 0; i < 16; i++)
        if (fabsf(x[i]) > amax) { amax = fabsf(x[i]); max = x[i]; }
    if (amax == 0) {
        memset(L, 0, 16);
        return 0;
    }
    float best = 0, best_err = INFINITY;
    for (int step = -9; step <= 9; step++) {
        const float iscale = -(nmax + 0.1f * step) / max;
        float slx = 0, sl2 = 0;
        int8_t Lt[16];
        for (int i = 0; i < 16; i++) {
            int l = nearest_int(iscale * x[i]);
            l = l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l;
            Lt[i] = (int8_t)l;
            slx += l * x[i];
            sl2 += (float)l * l;
        }
        if (sl2 == 0) continue;
        const float scale = slx / sl2;
        float err = 0;
        for (int i = 0; i < 16; i++) err += (scale * Lt[i] - x[i]) * (scale * Lt[i] - x[i]);
        if (err < best_err) { best_err = err; best = scale; memcpy(L, Lt, 16); }
    }
    return best;
}

static void quant_q6_K(const float *x, block_q6_K *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        int8_t Ls[QK_K];
        uint8_t L[QK_K];
        float sc[16], max_sc = 0, amax_sc = 0;
        for (int j = 0; j < 16; j++) {
            sc[j] = fit_scale_sym(x + 16 * j, 32, Ls + 16 * j);
            if (fabsf(sc[j]) > amax_sc) { amax_sc = fabsf(sc[j]); max_sc = sc[j]; }
        }
        if (amax_sc == 0) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        const float iscale = -128.f / max_sc;
        y[i].d = tl_f32_to_f16_inl(1 / iscale);
        const float d = TL_F16(y[i].d);
        for (int j = 0; j < 16; j++) {
            const int s = nearest_int(iscale * sc[j]);
            y[i].scales[j] = (int8_t)(s < -128 ? -128 : s > 127 ? 127 : s);
            const float ds = d * y[i].scales[j];
            for (int l = 0; l < 16; l++) {
                int q = ds ? nearest_int(x[16 * j + l] / ds) : 0;
                q = q < -32 ? -32 : q > 31 ? 31 : q;
                L[16 * j + l] = (uint8_t)(q + 32);
            }
        }
        uint8_t *ql = y[i].ql, *qh = y[i].qh;
        for (int j = 0; j < QK_K; j += 128, ql += 64, qh += 32)
            for (int l = 0; l < 32; l++) {
                const uint8_t *p = L + j + l;
                ql[l] = (uint8_t)((p[0] & 0xF) | ((p[64] & 0xF) << 4));
                ql[l + 32] = (uint8_t)((p[32] & 0xF) | ((p[96] & 0xF) << 4));
                qh[l] = (uint8_t)((p[0] >> 4) | ((p[32] >> 4) << 2) | ((p[64] >> 4) << 4) | ((p[96] >> 4) << 6));
            }
    }
}

/* q2_K: per 16 elements a (scale, min) fit with L in [0, 3], both
 * quantized to 4 bits against fp16 super-scales, then the elements
 * requantized against the scales the decoder will see. */
static void quant_q2_K(const float *x, block_q2_K *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        uint8_t L[QK_K];
        float sc[16], mn[16], max_sc = 0, max_mn = 0;
        for (int j = 0; j < 16; j++) {
            sc[j] = fit_scale_min(16, 3, x + 16 * j, L + 16 * j, &mn[j]);
            if (sc[j] > max_sc) max_sc = sc[j];
            if (mn[j] > max_mn) max_mn = mn[j];
        }
        y[i].d = tl_f32_to_f16_inl(max_sc / 15.f);
        y[i].dmin = tl_f32_to_f16_inl(max_mn / 15.f);
        const float d = TL_F16(y[i].d), dmin = TL_F16(y[i].dmin);
        memset(y[i].qs, 0, sizeof y[i].qs);
        for (int j = 0; j < 16; j++) {
            int ls = d > 0 ? nearest_int(sc[j] / d) : 0, lm = dmin > 0 ? nearest_int(mn[j] / dmin) : 0;
            ls = ls < 0 ? 0 : ls > 15 ? 15 : ls;
            lm = lm < 0 ? 0 : lm > 15 ? 15 : lm;
            y[i].scales[j] = (uint8_t)(ls | lm << 4);
            const float ds = d * ls, dm = dmin * lm;
            for (int l = 0; l < 16; l++) {
                const int e = 16 * j + l, q = ds ? nearest_int((x[e] + dm) / ds) : 0;
                y[i].qs[32 * (e / 128) + e % 32] |= (uint8_t)((q < 0 ? 0 : q > 3 ? 3 : q) << (2 * (e % 128 / 32)));
            }
        }
    }
}

/* q3_K: per 16 elements a symmetric fit with L in [-4, 3], the scales
 * quantized to 6 bits (biased by 32) against an fp16 super-scale. */
static void quant_q3_K(const float *x, block_q3_K *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        int8_t Ls[QK_K];
        float sc[16], max_sc = 0, amax_sc = 0;
        for (int j = 0; j < 16; j++) {
            sc[j] = fit_scale_sym(x + 16 * j, 4, Ls + 16 * j);
            if (fabsf(sc[j]) > amax_sc) { amax_sc = fabsf(sc[j]); max_sc = sc[j]; }
        }
        memset(&y[i], 0, sizeof y[i]);
        if (amax_sc == 0) continue;
        const float iscale = -32.f / max_sc;
        y[i].d = tl_f32_to_f16_inl(1 / iscale);
        const float d = TL_F16(y[i].d);
        for (int j = 0; j < 16; j++) {
            int s = nearest_int(iscale * sc[j]);
            s = s < -32 ? -32 : s > 31 ? 31 : s;
            const int u = s + 32;
            y[i].scales[j % 8] |= (uint8_t)((u & 0xF) << (j < 8 ? 0 : 4));
            y[i].scales[8 + j % 4] |= (uint8_t)((u >> 4) << (2 * (j / 4)));
            const float ds = d * s;
            for (int l = 0; l < 16; l++) {
                const int e = 16 * j + l, c = e / 128, jj = e % 128 / 32, p = e % 32;
                int q = ds ? nearest_int(x[e] / ds) : 0;
                q = (q < -4 ? -4 : q > 3 ? 3 : q) + 4;
                y[i].qs[32 * c + p] |= (uint8_t)((q & 3) << (2 * jj));
                if (q > 3) y[i].hmask[p] |= (uint8_t)(1 << (4 * c + jj));
            }
        }
    }
}

void tl_quantize_row_ref(int type, const float *src, void *dst, int64_t n) {
    const tl_type_traits *t = tl_type_info(type);
    assert(t->name && n % t->block_size == 0);
    const int64_t nb = n / t->block_size;
    switch (type) {
    case TL_TYPE_F32: memcpy(dst, src, (size_t)n * sizeof(float)); break;
    case TL_TYPE_F16: f32_to_f16_row_ref(src, dst, n); break;
    case TL_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = tl_f32_to_bf16_inl(src[i]);
        break;
    case TL_TYPE_Q4_0: quant_q4_0(src, dst, nb); break;
    case TL_TYPE_Q4_1: quant_q4_1(src, dst, nb); break;
    case TL_TYPE_Q5_0: quant_q5_0(src, dst, nb); break;
    case TL_TYPE_Q8_0: quant_q8_0(src, dst, nb); break;
    case TL_TYPE_IQ4_NL: quant_iq4_nl(src, dst, nb); break;
    case TL_TYPE_IQ4_XS: quant_iq4_xs(src, dst, nb); break;
    case TL_TYPE_IQ2_XXS: tl_quant_iq2_xxs(src, dst, nb); break;
    case TL_TYPE_IQ2_XS: tl_quant_iq2_xs(src, dst, nb); break;
    case TL_TYPE_IQ2_S: tl_quant_iq2_s(src, dst, nb); break;
    case TL_TYPE_IQ3_XXS: tl_quant_iq3_xxs(src, dst, nb); break;
    case TL_TYPE_IQ3_S: tl_quant_iq3_s(src, dst, nb); break;
    case TL_TYPE_IQ1_S: tl_quant_iq1_s(src, dst, nb); break;
    case TL_TYPE_IQ1_M: tl_quant_iq1_m(src, dst, nb); break;
    case TL_TYPE_Q5_1: quant_q5_1(src, dst, nb); break;
    case TL_TYPE_Q2_K: quant_q2_K(src, dst, nb); break;
    case TL_TYPE_Q3_K: quant_q3_K(src, dst, nb); break;
    case TL_TYPE_Q4_K: quant_q4_K(src, dst, nb); break;
    case TL_TYPE_Q5_K: quant_q5_K(src, dst, nb); break;
    case TL_TYPE_Q6_K: quant_q6_K(src, dst, nb); break;
    case TL_TYPE_Q8_K: quant_q8_K(src, dst, nb); break;
    default: assert(!"tl_quantize_row: unsupported type"); break;
    }
}

/* --------------------------------------------------------------- vec_dot */

static void dot_f32_w(int64_t n, float *out, const void *w, const void *x) {
    const float *a = w, *b = x;
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    *out = s;
}

static void dot_f16_w(int64_t n, float *out, const void *w, const void *x) {
    const uint16_t *a = w;
    const float *b = x;
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += tl_f16_to_f32_inl(a[i]) * b[i];
    *out = s;
}

static void dot_bf16_w(int64_t n, float *out, const void *w, const void *x) {
    const uint16_t *a = w;
    const float *b = x;
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += tl_bf16_to_f32_inl(a[i]) * b[i];
    *out = s;
}

/* The 32-element block types against q8_0 activations: the exact integer
 * block sum times the scale product (two f16 values: exact in f32), added
 * with one FMA, block by block - the SIMD tiles' epilogue is then a
 * convert, a multiply and an FMA (a multiply and an add here before: the
 * AMX q8_0 GEMM ran 0.92 of the time with the FMA). */
static void dot_q4_0(int64_t n, float *out, const void *w, const void *x) {
    const block_q4_0 *a = w;
    const block_q8_0 *b = x;
    float s = 0;
    for (int64_t i = 0; i < n / 32; i++) {
        int sumi = 0;
        for (int j = 0; j < 16; j++)
            sumi += ((a[i].qs[j] & 0xF) - 8) * b[i].qs[j] + ((a[i].qs[j] >> 4) - 8) * b[i].qs[j + 16];
        s = fmaf((float)sumi, TL_F16(a[i].d) * TL_F16(b[i].d), s);
    }
    *out = s;
}

static void dot_iq4_nl(int64_t n, float *out, const void *w, const void *x) {
    const block_q4_0 *a = w;
    const block_q8_0 *b = x;
    float s = 0;
    for (int64_t i = 0; i < n / 32; i++) {
        int sumi = 0;
        for (int j = 0; j < 16; j++)
            sumi += tl_iq4nl_values[a[i].qs[j] & 0xF] * b[i].qs[j] + tl_iq4nl_values[a[i].qs[j] >> 4] * b[i].qs[j + 16];
        s = fmaf((float)sumi, TL_F16(a[i].d) * TL_F16(b[i].d), s);
    }
    *out = s;
}

/* iq4_xs: as q6_K (signed sub-block scales, one super-scale), 8 sub-blocks of 32. */
static void dot_iq4_xs(int64_t n, float *out, const void *w, const void *x) {
    const block_iq4_xs *a = w;
    const block_q8_K *b = x;
    float s = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int sumi = 0;
        for (int j = 0; j < 8; j++) {
            const uint8_t *qs = a[i].qs + 16 * j;
            const int8_t *y = b[i].qs + 32 * j;
            int d = 0;
            for (int l = 0; l < 16; l++) d += tl_iq4nl_values[qs[l] & 0xF] * y[l] + tl_iq4nl_values[qs[l] >> 4] * y[l + 16];
            sumi += tl_iq4xs_scale((const uint8_t *)&a[i], j) * d;
        }
        s += b[i].d * TL_F16(a[i].d) * sumi;
    }
    *out = s;
}

/* q4_1, and q5_1 (five: its 5th bits added), two FMAs a block, the form
 * the AVX-512 GEMM tiles take at the cost of Q4_0's epilogue
 * (gemm_avx512.c). Both blocks start with d and m. */
static void dot_q41_51(int64_t n, float *out, const void *w, const void *x, int five) {
    const block_q8_0 *b = x;
    const size_t bw = five ? sizeof(block_q5_1) : sizeof(block_q4_1);
    float s = 0;
    for (int64_t i = 0; i < n / 32; i++) {
        const uint8_t *blk = (const uint8_t *)w + (size_t)i * bw, *qs = blk + (five ? 8 : 4);
        uint16_t dh, mh;
        uint32_t qh = 0;
        memcpy(&dh, blk, 2);
        memcpy(&mh, blk + 2, 2);
        if (five) memcpy(&qh, blk + 4, 4);
        int sumi = 0, sumy = 0;
        for (int j = 0; j < 16; j++) {
            const int h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
            sumi += ((qs[j] & 0xF) | h0) * b[i].qs[j] + ((qs[j] >> 4) | h1) * b[i].qs[j + 16];
            sumy += b[i].qs[j] + b[i].qs[j + 16];
        }
        const float dy = TL_F16(b[i].d);
        s = fmaf((float)sumi, TL_F16(dh) * dy, s);
        s = fmaf(TL_F16(mh), (float)sumy * dy, s);
    }
    *out = s;
}

static void dot_q4_1(int64_t n, float *out, const void *w, const void *x) { dot_q41_51(n, out, w, x, 0); }
static void dot_q5_1(int64_t n, float *out, const void *w, const void *x) { dot_q41_51(n, out, w, x, 1); }

static void dot_q5_0(int64_t n, float *out, const void *w, const void *x) {
    const block_q5_0 *a = w;
    const block_q8_0 *b = x;
    float s = 0;
    for (int64_t i = 0; i < n / 32; i++) {
        uint32_t qh;
        memcpy(&qh, a[i].qh, 4);
        int sumi = 0;
        for (int j = 0; j < 16; j++) {
            const int h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
            sumi += (((a[i].qs[j] & 0xF) | h0) - 16) * b[i].qs[j];
            sumi += (((a[i].qs[j] >> 4) | h1) - 16) * b[i].qs[j + 16];
        }
        s = fmaf((float)sumi, TL_F16(a[i].d) * TL_F16(b[i].d), s);
    }
    *out = s;
}

static void dot_q8_0(int64_t n, float *out, const void *w, const void *x) {
    const block_q8_0 *a = w, *b = x;
    float s = 0;
    for (int64_t i = 0; i < n / 32; i++) {
        int sumi = 0;
        for (int j = 0; j < 32; j++) sumi += a[i].qs[j] * b[i].qs[j];
        s = fmaf((float)sumi, TL_F16(a[i].d) * TL_F16(b[i].d), s);
    }
    *out = s;
}

/* q4_K/q5_K: sum_j d*sc_j*dot(q_j, y_j) - dmin*sum_j m_j*sum(y_j), with the
 * y sums taken from the activation's bsums (as ggml does). */
static void dot_q45_K(int64_t n, float *out, const void *w, const void *x, int five) {
    const block_q8_K *b = x;
    float s = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const uint8_t *scales, *qs, *qh = NULL;
        uint16_t dh, dminh;
        if (five) {
            const block_q5_K *a = (const block_q5_K *)w + i;
            scales = a->scales; qs = a->qs; qh = a->qh; dh = a->d; dminh = a->dmin;
        } else {
            const block_q4_K *a = (const block_q4_K *)w + i;
            scales = a->scales; qs = a->qs; dh = a->d; dminh = a->dmin;
        }
        int sumi = 0, summ = 0;
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            tl_get_scale_min_k4(j, scales, &sc, &m);
            const uint8_t *q = qs + 32 * (j / 2);
            const int8_t *y = b[i].qs + 32 * j;
            int d = 0;
            for (int l = 0; l < 32; l++) {
                int v = (j & 1) ? q[l] >> 4 : q[l] & 0xF;
                if (qh && (qh[l] >> j) & 1) v += 16;
                d += v * y[l];
            }
            sumi += sc * d;
            summ += m * (b[i].bsums[2 * j] + b[i].bsums[2 * j + 1]);
        }
        s += b[i].d * TL_F16(dh) * sumi - b[i].d * TL_F16(dminh) * summ;
    }
    *out = s;
}

static void dot_q4_K(int64_t n, float *out, const void *w, const void *x) { dot_q45_K(n, out, w, x, 0); }
static void dot_q5_K(int64_t n, float *out, const void *w, const void *x) { dot_q45_K(n, out, w, x, 1); }

/* q2_K: as q4_K with 16 sub-blocks of 16 (4-bit scales and mins). */
static void dot_q2_K(int64_t n, float *out, const void *w, const void *x) {
    const block_q2_K *a = w;
    const block_q8_K *b = x;
    float s = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int sumi = 0, summ = 0;
        for (int j = 0; j < 16; j++) {
            int d = 0;
            for (int l = 16 * j; l < 16 * j + 16; l++) d += q2_K_get(&a[i], l) * b[i].qs[l];
            sumi += (a[i].scales[j] & 0xF) * d;
            summ += (a[i].scales[j] >> 4) * b[i].bsums[j];
        }
        s += b[i].d * TL_F16(a[i].d) * sumi - b[i].d * TL_F16(a[i].dmin) * summ;
    }
    *out = s;
}

/* q3_K: as q6_K (16 signed sub-block scales, one super-scale). */
static void dot_q3_K(int64_t n, float *out, const void *w, const void *x) {
    const block_q3_K *a = w;
    const block_q8_K *b = x;
    float s = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int sc[16], sumi = 0;
        tl_q3_K_scales(a[i].scales, sc);
        for (int j = 0; j < 16; j++) {
            int d = 0;
            for (int l = 16 * j; l < 16 * j + 16; l++) d += q3_K_get(&a[i], l) * b[i].qs[l];
            sumi += sc[j] * d;
        }
        s += b[i].d * TL_F16(a[i].d) * sumi;
    }
    *out = s;
}

static void dot_q6_K(int64_t n, float *out, const void *w, const void *x) {
    const block_q6_K *a = w;
    const block_q8_K *b = x;
    float s = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int sumi = 0;
        for (int j = 0; j < 16; j++) {
            int d = 0;
            for (int l = 16 * j; l < 16 * j + 16; l++) d += q6_K_get(&a[i], l) * b[i].qs[l];
            sumi += a[i].scales[j] * d;
        }
        s += b[i].d * TL_F16(a[i].d) * sumi;
    }
    *out = s;
}

/* ---------------------------------------------------- attention helpers */

static float dot_f32_ref(const float *a, const float *b, int64_t n) {
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static float dot_f16_f32_ref(const uint16_t *a, const float *b, int64_t n) {
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += tl_f16_to_f32_inl(a[i]) * b[i];
    return s;
}

static void axpy_f32_ref(float *y, float a, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

static void axpy_f16_ref(float *y, float a, const uint16_t *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * tl_f16_to_f32_inl(x[i]);
}

static void quantize_q8_0_ref(const float *src, void *dst, int64_t n) { quant_q8_0(src, dst, n / 32); }
static void quantize_q8_K_ref(const float *src, void *dst, int64_t n) { quant_q8_K(src, dst, n / QK_K); }

static void gelu_tanh_mul_ref(float *h, const float *g, int64_t n) {
    const float k = 0.79788456080286535587989211986876f; /* sqrt(2/pi) */
    for (int64_t i = 0; i < n; i++) {
        const float x = h[i];
        h[i] = 0.5f * x * (1.0f + tanhf(k * x * (1.0f + 0.044715f * x * x))) * g[i];
    }
}

/* silu(x) = x / (1 + e^-x), libm's expf: the formula the vector levels
 * are checked against. */
static void silu_mul_ref(float *h, const float *g, int64_t n) {
    for (int64_t i = 0; i < n; i++) h[i] = h[i] / (1.0f + expf(-h[i])) * g[i];
}

static double sum_sq_ref(const float *x, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += (double)(x[i] * x[i]);
    return s;
}

void tl_kernels_fill_ref(tl_kernel_table *t) {
    memset(t, 0, sizeof *t);
    t->vec_dot[TL_TYPE_F32] = dot_f32_w;
    t->vec_dot[TL_TYPE_F16] = dot_f16_w;
    t->vec_dot[TL_TYPE_BF16] = dot_bf16_w;
    t->vec_dot[TL_TYPE_Q4_0] = dot_q4_0;
    t->vec_dot[TL_TYPE_IQ4_NL] = dot_iq4_nl;
    t->vec_dot[TL_TYPE_IQ4_XS] = dot_iq4_xs;
    t->vec_dot[TL_TYPE_IQ2_XXS] = tl_dot_iq2_xxs;
    t->vec_dot[TL_TYPE_IQ2_XS] = tl_dot_iq2_xs;
    t->vec_dot[TL_TYPE_IQ2_S] = tl_dot_iq2_s;
    t->vec_dot[TL_TYPE_IQ3_XXS] = tl_dot_iq3_xxs;
    t->vec_dot[TL_TYPE_IQ3_S] = tl_dot_iq3_s;
    t->vec_dot[TL_TYPE_Q5_1] = dot_q5_1;
    t->vec_dot[TL_TYPE_Q4_1] = dot_q4_1;
    t->vec_dot[TL_TYPE_Q5_0] = dot_q5_0;
    t->vec_dot[TL_TYPE_Q8_0] = dot_q8_0;
    t->vec_dot[TL_TYPE_Q2_K] = dot_q2_K;
    t->vec_dot[TL_TYPE_Q3_K] = dot_q3_K;
    t->vec_dot[TL_TYPE_Q4_K] = dot_q4_K;
    t->vec_dot[TL_TYPE_Q5_K] = dot_q5_K;
    t->vec_dot[TL_TYPE_Q6_K] = dot_q6_K;
    tl_iq1_fill_ref(t); /* iq1_s, iq1_m: quants_iq1_ref.c */
    t->quantize_q8_0 = quantize_q8_0_ref;
    t->quantize_q8_K = quantize_q8_K_ref;
    t->dot_f32 = dot_f32_ref;
    t->dot_f16_f32 = dot_f16_f32_ref;
    t->axpy_f32 = axpy_f32_ref;
    t->axpy_f16 = axpy_f16_ref;
    t->gelu_tanh_mul = gelu_tanh_mul_ref;
    t->silu_mul = silu_mul_ref;
    t->sum_sq = sum_sq_ref;
    t->f16_to_f32_row = f16_to_f32_row_ref;
    t->dequant_q8_0 = dequant_q8_0;
    t->dequant_q4_0 = dequant_q4_0;
    t->dequant_q4_1 = dequant_q4_1;
    t->f32_to_f16_row = f32_to_f16_row_ref;
}
