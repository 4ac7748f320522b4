/* quants_iq3_ref.c - iq3_xxs and iq3_s, the scalar reference: dequantize
 * (bitwise ggml's values), quantize (no importance matrix) and the dot
 * product with q8_K activations.
 *
 * Both split a super-block of 256 into 8 sub-blocks of 32, each 8 groups
 * of 4 elements that name one grid entry (4 unsigned levels), with a sign
 * per element and a 4-bit scale s per sub-block:
 *   iq3_xxs | d | qs[0..63]: grid indices, 8 per sub-block (entry g holds
 *           elements 4g..4g+3) | qs[64..95]: a uint32 per sub-block: bits
 *           7l..7l+6 the sign index of elements 8l..8l+7 (tl_iq_signs8),
 *           bits 28..31 s; value d * (0.5 + s) * 0.5 * grid * sign
 *   iq3_s  | d | qs[64]: low 8 bits of the 9-bit grid indices | qh[8]: bit
 *           g of byte ib the 9th bit of index 8ib + g | signs[32]: bit k
 *           of byte j the sign of element 8j + k | scales[4]: s of
 *           sub-block ib in nibble ib % 2 of byte ib / 2; value
 *           d * (1 + 2s) * grid * sign */
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "iq3_grids.h"
#include "quants_impl.h"

/* Level j (0..3) of grid entry e. */
#define LEVEL(e, j) ((int)(((e) >> (8 * (j))) & 0xFF))

/* ------------------------------------------------------------ dequantize */

void tl_dequant_iq3_xxs(const void *src, float *y, int64_t nb) {
    const block_iq3_xxs *x = src;
    for (int64_t i = 0; i < nb; i++) {
        const float d = TL_F16(x[i].d);
        for (int ib = 0; ib < 8; ib++) {
            const uint32_t aux = tl_ld32(x[i].qs + 64 + 4 * ib);
            const float db = d * (0.5f + (aux >> 28)) * 0.5f;
            for (int l = 0; l < 4; l++, y += 8) {
                const unsigned signs = tl_iq_signs8(aux >> (7 * l));
                for (int k = 0; k < 8; k++) {
                    const uint32_t e = tl_iq3xxs_grid[x[i].qs[8 * ib + 2 * l + k / 4]];
                    y[k] = db * LEVEL(e, k % 4) * (signs >> k & 1 ? -1.f : 1.f);
                }
            }
        }
    }
}

/* Grid index g (0..7) of iq3_s sub-block ib: 8 bits from qs, the 9th from qh. */
static inline int iq3s_index(const block_iq3_s *b, int ib, int g) {
    return b->qs[8 * ib + g] | ((b->qh[ib] >> g) & 1) << 8;
}

static inline int iq3s_scale(const block_iq3_s *b, int ib) { return (b->scales[ib / 2] >> (4 * (ib % 2))) & 0xF; }

void tl_dequant_iq3_s(const void *src, float *y, int64_t nb) {
    const block_iq3_s *x = src;
    for (int64_t i = 0; i < nb; i++) {
        const float d = TL_F16(x[i].d);
        for (int ib = 0; ib < 8; ib++) {
            const float db = d * (1 + 2 * iq3s_scale(&x[i], ib));
            for (int k = 0; k < 32; k++) {
                const uint32_t e = tl_iq3s_grid[iq3s_index(&x[i], ib, k / 4)];
                y[k] = db * LEVEL(e, k % 4) * (x[i].signs[4 * ib + k / 8] >> (k % 8) & 1 ? -1.f : 1.f);
            }
            y += 32;
        }
    }
}

/* --------------------------------------------------------------- vec_dot */

/* Both dots: per sub-block the exact int32 sum of grid * sign * q8, times
 * ls = 2s + 1, summed into an exact int32 bsum per super-block (|bsum| <
 * 8 * 31 * 32 * 62 * 127 < 2^31), then as ggml: sumf += (d_w * d_y) *
 * bsum, super-block by super-block; iq3_xxs's db is d * ls / 4, so its
 * result is 0.25f * sumf. The AVX2 tiles (quants_iq3_avx2.c) make the
 * same integers and these float ops in this order. */
void tl_dot_iq3_xxs(int64_t n, float *out, const void *w, const void *x) {
    const block_iq3_xxs *a = w;
    const block_q8_K *b = x;
    float sumf = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int32_t bsum = 0;
        for (int ib = 0; ib < 8; ib++) {
            const uint32_t aux = tl_ld32(a[i].qs + 64 + 4 * ib);
            const int8_t *q8 = b[i].qs + 32 * ib;
            int32_t sumi = 0;
            for (int l = 0; l < 4; l++) {
                const unsigned signs = tl_iq_signs8(aux >> (7 * l));
                for (int k = 0; k < 8; k++) {
                    const int v = LEVEL(tl_iq3xxs_grid[a[i].qs[8 * ib + 2 * l + k / 4]], k % 4) * q8[8 * l + k];
                    sumi += signs >> k & 1 ? -v : v;
                }
            }
            bsum += (int32_t)(2 * (aux >> 28) + 1) * sumi;
        }
        const float d = TL_F16(a[i].d) * b[i].d;
        sumf += d * (float)bsum;
    }
    *out = 0.25f * sumf;
}

void tl_dot_iq3_s(int64_t n, float *out, const void *w, const void *x) {
    const block_iq3_s *a = w;
    const block_q8_K *b = x;
    float sumf = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int32_t bsum = 0;
        for (int ib = 0; ib < 8; ib++) {
            const int8_t *q8 = b[i].qs + 32 * ib;
            int32_t sumi = 0;
            for (int k = 0; k < 32; k++) {
                const int v = LEVEL(tl_iq3s_grid[iq3s_index(&a[i], ib, k / 4)], k % 4) * q8[k];
                sumi += a[i].signs[4 * ib + k / 8] >> (k % 8) & 1 ? -v : v;
            }
            bsum += (2 * iq3s_scale(&a[i], ib) + 1) * sumi;
        }
        const float d = TL_F16(a[i].d) * b[i].d;
        sumf += d * (float)bsum;
    }
    *out = sumf;
}

/* -------------------------------------------------------------- quantize */

/* A grid and what the quantizer derives from it once: for each of the
 * 8^4 points of level indices (point u: index of element j in bits
 * 3j..3j+2), the grid entries nearest it (squared distance in level
 * values), just its own entry when the point is on the grid. */
enum { NEAR = 6, TRIES = 4 };
typedef struct {
    const uint32_t *grid;
    int ngrid;
    float level[8];     /* the level values */
    float inv_step;     /* 1 / (level[1] - level[0]) */
    float mid67;        /* (level[6] + level[7]) / 2 */
    float top, step;    /* the tries put a sub-block's largest magnitude at top + k step, |k| <= TRIES */
    float (*gf)[4];     /* the grid's levels as floats */
    float *gn;          /* and their squared norms */
    uint16_t (*near)[NEAR];
    uint8_t *nnear;
} iq3_kind;

static float gf_xxs[256][4], gf_s[512][4], gn_xxs[256], gn_s[512];
static uint16_t near_xxs[4096][NEAR], near_s[4096][NEAR];
static uint8_t nnear_xxs[4096], nnear_s[4096];
static iq3_kind kind_xxs = {tl_iq3xxs_grid, 256, {4, 12, 20, 28, 36, 44, 52, 62}, 1 / 8.f, 57, 62, 2.0f,
                            gf_xxs, gn_xxs, near_xxs, nnear_xxs};
static iq3_kind kind_s = {tl_iq3s_grid, 512, {1, 3, 5, 7, 9, 11, 13, 15}, 1 / 2.f, 14, 15, 0.5f, gf_s, gn_s, near_s, nnear_s};

static void build_kind(iq3_kind *k) {
    for (int e = 0; e < k->ngrid; e++) {
        k->gn[e] = 0;
        for (int j = 0; j < 4; j++) {
            k->gf[e][j] = (float)LEVEL(k->grid[e], j);
            k->gn[e] += k->gf[e][j] * k->gf[e][j];
        }
    }
    for (int u = 0; u < 4096; u++) {
        float dist[NEAR];
        int n = 0;
        for (int e = 0; e < k->ngrid; e++) {
            float dd = 0;
            for (int j = 0; j < 4; j++) {
                const float t = k->level[(u >> (3 * j)) & 7] - k->gf[e][j];
                dd += t * t;
            }
            /* insertion into the sorted NEAR best (ties: the lower index first) */
            int at = n < NEAR ? n++ : NEAR;
            while (at > 0 && dist[at - 1] > dd) {
                if (at < NEAR) { dist[at] = dist[at - 1]; k->near[u][at] = k->near[u][at - 1]; }
                at--;
            }
            if (at < NEAR) { dist[at] = dd; k->near[u][at] = (uint16_t)e; }
        }
        k->nnear[u] = dist[0] == 0 ? 1 : NEAR;
    }
}

static pthread_once_t kinds_once = PTHREAD_ONCE_INIT;
static void build_kinds(void) {
    build_kind(&kind_xxs);
    build_kind(&kind_s);
}

/* The nearest level index of a scaled magnitude v (NaN: 0): levels 0..6
 * are evenly spaced, level 7 is taken past its midpoint with level 6. */
static inline int level_index(const iq3_kind *k, float v) {
    const float f = fminf(fmaxf((v - k->level[0]) * k->inv_step + 0.5f, 0.0f), 6.0f);
    return (int)f + (v > k->mid67);
}

/* The grid entry nearest the 4 targets t scaled by inv, among the
 * candidates of the point their rounded levels name. */
static int nearest_entry(const iq3_kind *k, const float *t, float inv) {
    float v[4];
    int u = 0;
    for (int j = 0; j < 4; j++) {
        v[j] = t[j] * inv;
        u |= level_index(k, v[j]) << (3 * j);
    }
    int best = k->near[u][0];
    if (k->nnear[u] == 1) return best;
    float be = INFINITY;
    for (int c = 0; c < k->nnear[u]; c++) { /* |v - g|^2 less |v|^2 */
        const int e = k->near[u][c];
        const float *g = k->gf[e];
        const float dd = k->gn[e] - 2 * (v[0] * g[0] + v[1] * g[1] + v[2] * g[2] + v[3] * g[3]);
        if (dd < be) { be = dd; best = e; }
    }
    return best;
}

/* The entries nearest the 32 targets t of a sub-block at inverse scale
 * inv, and the least-squares fit t ~ scale * q of them: returns sum(t q)^2 /
 * sum(q q) (the error it removes; -1 where there is no positive scale),
 * *scale = sum(t q) / sum(q q). */
static float fit_at(const iq3_kind *k, const float *t, float inv, float *scale) {
    float sqx = 0, sqq = 0;
    for (int g = 0; g < 8; g++) {
        const float *q = k->gf[nearest_entry(k, t + 4 * g, inv)];
        for (int j = 0; j < 4; j++) {
            sqx += t[4 * g + j] * q[j];
            sqq += q[j] * q[j];
        }
    }
    *scale = sqx / sqq;
    return sqx > 0 ? sqx * sqx / sqq : -1.0f;
}

/* A sub-block's scale (in grid units; 0 for a sub-block of zeros):
 * inverse scales that put the largest target near the top level are
 * tried, and the one that puts it on the lowest (equal magnitudes: the
 * grids have no all-top entry, but all have the all-lowest one), each with
 * its entries' least-squares scale, the best then refit once at its own
 * scale. */
static float fit_sub(const iq3_kind *k, const float *t) {
    float max = 0;
    for (int i = 0; i < 32; i++) max = fmaxf(max, t[i]);
    if (!(max > 1e-30f)) return 0;
    float s0, best = fit_at(k, t, k->level[0] / max, &s0), scale = s0, s;
    for (int is = -TRIES; is <= TRIES; is++) {
        const float e = fit_at(k, t, (k->top + is * k->step) / max, &s);
        if (e > best) { best = e; scale = s; }
    }
    if (best > 0 && fit_at(k, t, 1 / scale, &s) > best) scale = s;
    return best > 0 ? scale : 0;
}

/* A super-block's code: d, the sub-blocks' 4-bit scales, the entries. */
typedef struct {
    uint16_t d;
    int s[8];
    uint16_t idx[64];
} iq3_code;

/* The code at super-scale dh: the 4-bit scales nearest the sub-blocks'
 * scales sc (in grid units; the decoder's is unit * (2s + 1), unit = d *
 * mul), then per group the entry nearest the targets at the scale the
 * decoder will see. Returns the squared error. */
static float encode_at(const iq3_kind *k, const float *t, const float sc[8], float mul, uint16_t dh, iq3_code *c) {
    const float unit = TL_F16(dh) * mul;
    float err = 0;
    c->d = dh;
    for (int ib = 0; ib < 8; ib++) {
        const int l = (int)lrintf((sc[ib] / unit - 1) / 2);
        c->s[ib] = l < 0 ? 0 : l > 15 ? 15 : l;
        const float db = unit * (2 * c->s[ib] + 1);
        for (int g = 0; g < 8; g++) {
            const float *tg = t + 32 * ib + 4 * g;
            const int e = nearest_entry(k, tg, 1 / db);
            c->idx[8 * ib + g] = (uint16_t)e;
            for (int j = 0; j < 4; j++) err += (tg[j] - db * k->gf[e][j]) * (tg[j] - db * k->gf[e][j]);
        }
    }
    return err;
}

/* The best code of super-scales around the one that gives the largest
 * sub-block scale s = 15; all zeros (d = 0) where the scales are zero or
 * d would not be a finite f16. */
static void encode(const iq3_kind *k, const float *t, const float sc[8], float mul, iq3_code *c) {
    static const float tries[] = {1.0f, 0.96f};
    float max = 0, best = INFINITY;
    for (int ib = 0; ib < 8; ib++) max = fmaxf(max, sc[ib]);
    memset(c, 0, sizeof *c);
    for (size_t n = 0; n < sizeof tries / sizeof tries[0]; n++) {
        const uint16_t dh = tl_f32_to_f16_inl(max * tries[n] / (31 * mul));
        const float d = TL_F16(dh);
        if (!(d > 0) || !isfinite(d * mul * 31)) continue;
        iq3_code tc;
        const float e = encode_at(k, t, sc, mul, dh, &tc);
        if (e < best) { best = e; *c = tc; }
    }
}

/* iq3_xxs: per group of 8 the signs, the count of negatives made even by
 * flipping the smallest magnitude (its target then -|x|, met by the
 * lowest level), per sub-block a scale fit, then the block's code. */
void tl_quant_iq3_xxs(const float *x, void *dst, int64_t nb) {
    pthread_once(&kinds_once, build_kinds);
    const iq3_kind *k = &kind_xxs;
    block_iq3_xxs *y = dst;
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        float t[QK_K], sc[8];
        uint32_t sgn[8] = {0};
        for (int ib = 0; ib < 8; ib++) {
            for (int l = 0; l < 4; l++) {
                const float *xg = x + 32 * ib + 8 * l;
                float *tg = t + 32 * ib + 8 * l;
                unsigned bits = 0;
                int imin = 0;
                for (int j = 0; j < 8; j++) {
                    tg[j] = fabsf(xg[j]);
                    if (xg[j] < 0) bits |= 1u << j;
                    if (tg[j] < tg[imin]) imin = j;
                }
                if (__builtin_parity(bits)) {
                    bits ^= 1u << imin;
                    tg[imin] = -tg[imin];
                }
                sgn[ib] |= (bits & 0x7F) << (7 * l);
            }
            sc[ib] = fit_sub(k, t + 32 * ib);
        }
        iq3_code c;
        encode(k, t, sc, 0.25f, &c);
        y[i].d = c.d;
        for (int ib = 0; ib < 8; ib++) {
            for (int g = 0; g < 8; g++) y[i].qs[8 * ib + g] = (uint8_t)c.idx[8 * ib + g];
            const uint32_t aux = sgn[ib] | (uint32_t)c.s[ib] << 28;
            memcpy(y[i].qs + 64 + 4 * ib, &aux, 4);
        }
    }
}

/* iq3_s: the signs as they are, the magnitudes fit as iq3_xxs's. */
void tl_quant_iq3_s(const float *x, void *dst, int64_t nb) {
    pthread_once(&kinds_once, build_kinds);
    const iq3_kind *k = &kind_s;
    block_iq3_s *y = dst;
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        float t[QK_K], sc[8];
        memset(&y[i], 0, sizeof y[i]);
        for (int e = 0; e < QK_K; e++) {
            t[e] = fabsf(x[e]);
            if (x[e] < 0) y[i].signs[e / 8] |= (uint8_t)(1u << (e % 8));
        }
        for (int ib = 0; ib < 8; ib++) sc[ib] = fit_sub(k, t + 32 * ib);
        iq3_code c;
        encode(k, t, sc, 1.0f, &c);
        y[i].d = c.d;
        for (int ib = 0; ib < 8; ib++) {
            y[i].scales[ib / 2] |= (uint8_t)(c.s[ib] << (4 * (ib % 2)));
            for (int g = 0; g < 8; g++) {
                y[i].qs[8 * ib + g] = (uint8_t)c.idx[8 * ib + g];
                y[i].qh[ib] |= (uint8_t)((c.idx[8 * ib + g] >> 8) << g);
            }
        }
    }
}
