/* kv_mode.c - KV modes: parsing, the environment, and the row codecs. */
#include "kv_mode.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quants.h"
#include "util.h"

static const char *const type_names[TL_KVT_COUNT] = {"f16", "f32", "q8", "q4"};

const char *tl_kv_type_name(int type) { return type >= 0 && type < TL_KVT_COUNT ? type_names[type] : "?"; }

static int type_of(const char *s, size_t len) {
    for (int t = 0; t < TL_KVT_COUNT; t++)
        if (strlen(type_names[t]) == len && memcmp(type_names[t], s, len) == 0) return t;
    return -1;
}

int tl_kv_mode_parse(const char *s, const char *what, tl_kv_mode *out) {
#define BAD()                                                                                                   \
    tl_set_error(TL_ERR_INVALID_ARG,                                                                            \
                 "%s '%.40s' is not a KV mode (f16, f32, q8, q4, '<k>,<v>' such as q8,f16, h or h:<type>)", what, \
                 s)
    if (!s) return tl_set_error(TL_ERR_INVALID_ARG, "%s must not be NULL", what);
    size_t n = strlen(s);
    tl_kv_mode m = {0, 0, 0};
    if (s[0] == 'h' && (n == 1 || s[1] == ':')) {
        m.store_h = 1;
        m.type_k = n == 1 ? TL_KVT_F16 : type_of(s + 2, n - 2);
        m.type_v = m.type_k;
    } else {
        const char *comma = memchr(s, ',', n);
        size_t kn = comma ? (size_t)(comma - s) : n;
        m.type_k = type_of(s, kn);
        m.type_v = comma ? type_of(comma + 1, n - kn - 1) : m.type_k;
    }
    if (m.type_k < 0 || m.type_v < 0) return BAD();
    *out = m;
    return TL_OK;
#undef BAD
}

/* 1 / 0 for a set boolean variable, -1 when unset or empty, error when unparsable. */
static int env_flag(const char *name, int *out) {
    const char *v = getenv(name);
    *out = -1;
    if (!v || !*v) return TL_OK;
    static const char *const on[] = {"1", "true", "yes", "on"}, *const off[] = {"0", "false", "no", "off"};
    for (int i = 0; i < 4; i++) {
        if (!strcmp(v, on[i])) *out = 1;
        if (!strcmp(v, off[i])) *out = 0;
    }
    if (*out < 0)
        return tl_set_error(TL_ERR_INVALID_ARG, "%s='%.40s' is not a boolean (1/0, true/false, yes/no, on/off)", name,
                            v);
    return TL_OK;
}

int tl_kv_mode_resolve(const tl_model_params *p, tl_kv_mode *out) {
    if (p->kv_mode) return tl_kv_mode_parse(p->kv_mode, "kv_mode", out);
    if (p->kv_type != TL_KV_DEFAULT) {
        if (p->kv_type < 0 || p->kv_type >= TL_KVT_COUNT)
            return tl_set_error(TL_ERR_INVALID_ARG, "kv_type %d is not one of TL_KV_F16 (0), TL_KV_F32 (1), "
                                "TL_KV_Q8 (2), TL_KV_Q4 (3)", p->kv_type);
        *out = (tl_kv_mode){p->kv_type, p->kv_type, 0};
        return TL_OK;
    }
    int i8, i4, h, rc;
    if ((rc = env_flag("TINYLOOP_KV_INT8", &i8)) || (rc = env_flag("TINYLOOP_KV_INT4", &i4)) ||
        (rc = env_flag("TINYLOOP_KV_H_MODE", &h)))
        return rc;
    if (i8 == 1 && i4 == 1)
        return tl_set_error(TL_ERR_INVALID_ARG, "TINYLOOP_KV_INT8 and TINYLOOP_KV_INT4 are both set; choose one");
    int t = i8 == 1 ? TL_KVT_Q8 : i4 == 1 ? TL_KVT_Q4 : TL_KVT_F16;
    *out = (tl_kv_mode){t, t, h == 1};
    return TL_OK;
}

void tl_kv_mode_name(const tl_kv_mode *mode, char *out, size_t cap) {
    if (mode->store_h)
        snprintf(out, cap, "h:%s", tl_kv_type_name(mode->type_k));
    else if (mode->type_k == mode->type_v)
        snprintf(out, cap, "%s", tl_kv_type_name(mode->type_k));
    else
        snprintf(out, cap, "%s,%s", tl_kv_type_name(mode->type_k), tl_kv_type_name(mode->type_v));
}

/* ---- row codecs ---------------------------------------------------------------- */

/* The rounding of ggml's reference q8_0 / q4_1 quantizers, for any group
 * size: q8 scales by the largest magnitude, q4 spans [min, max] in 15 steps. */
static void store_q8(int g, const float *x, uint8_t *dst, int n) {
    if (g == 32) { /* exactly ggml's q8_0 blocks: the SIMD quantizer, bitwise this loop's */
        tl_quantize_row(TL_TYPE_Q8_0, x, dst, n);
        return;
    }
    for (int b = 0; b < n / g; b++, x += g) {
        float amax = 0.0f;
        for (int i = 0; i < g; i++) amax = fmaxf(amax, fabsf(x[i]));
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        uint16_t dh = tl_f32_to_f16(d);
        memcpy(dst, &dh, 2);
        int8_t *q = (int8_t *)(dst + 2);
        for (int i = 0; i < g; i++) q[i] = (int8_t)roundf(x[i] * id);
        dst += 2 + (size_t)g;
    }
}

static void store_q4(int g, const float *x, uint8_t *dst, int n) {
    for (int b = 0; b < n / g; b++, x += g) {
        float min = FLT_MAX, max = -FLT_MAX;
        for (int i = 0; i < g; i++) {
            if (x[i] < min) min = x[i];
            if (x[i] > max) max = x[i];
        }
        float d = (max - min) / 15.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        uint16_t dh = tl_f32_to_f16(d), mh = tl_f32_to_f16(min);
        memcpy(dst, &dh, 2);
        memcpy(dst + 2, &mh, 2);
        uint8_t *q = dst + 4;
        for (int i = 0; i < g / 2; i++) {
            int lo = (int)((x[i] - min) * id + 0.5f), hi = (int)((x[i + g / 2] - min) * id + 0.5f);
            lo = lo < 0 ? 0 : lo > 15 ? 15 : lo;
            hi = hi < 0 ? 0 : hi > 15 ? 15 : hi;
            q[i] = (uint8_t)(lo | hi << 4);
        }
        dst += 4 + (size_t)g / 2;
    }
}

void tl_kv_store_row(int type, int group, const float *src, uint8_t *dst, int n) {
    switch (type) {
    case TL_KVT_F32: memcpy(dst, src, (size_t)n * sizeof(float)); break;
    case TL_KVT_Q8: store_q8(group, src, dst, n); break;
    case TL_KVT_Q4: store_q4(group, src, dst, n); break;
    default: tl_f32_to_f16_row(src, (uint16_t *)(void *)dst, n); /* f16 rows are 2-byte aligned */
    }
}

int tl_kv_block_type(int type) { return type == TL_KVT_Q8 ? TL_TYPE_Q8_0 : TL_TYPE_Q4_1; }

void tl_kv_load_row(int type, int group, const uint8_t *src, float *dst, int n) {
    if (type == TL_KVT_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    }
    if (type == TL_KVT_F16) {
        tl_f16_to_f32_row((const uint16_t *)(const void *)src, dst, n);
        return;
    }
    if (group == 32) { /* exactly ggml's q8_0 / q4_1 blocks: the SIMD dequantizers */
        tl_dequantize_row(tl_kv_block_type(type), src, dst, n);
        return;
    }
    for (int b = 0; b < n / group; b++, dst += group) {
        uint16_t dh;
        memcpy(&dh, src, 2);
        float d = tl_f16_to_f32(dh);
        if (type == TL_KVT_Q8) {
            const int8_t *q = (const int8_t *)(src + 2);
            for (int i = 0; i < group; i++) dst[i] = d * (float)q[i];
            src += 2 + (size_t)group;
        } else {
            uint16_t mh;
            memcpy(&mh, src + 2, 2);
            float m = tl_f16_to_f32(mh);
            const uint8_t *q = src + 4;
            for (int i = 0; i < group / 2; i++) { /* as ggml's q4_1: q * d + m */
                dst[i] = (float)(q[i] & 15) * d + m;
                dst[i + group / 2] = (float)(q[i] >> 4) * d + m;
            }
            src += 4 + (size_t)group / 2;
        }
    }
}
