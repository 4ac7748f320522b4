/* quants_iq1_ref.c - iq1_s and iq1_m (layouts: iq1_grids.h): the scalar
 * dequantize, the reference quantizer and the reference vec_dots against
 * q8_K activations.
 *
 * Dequantization is gguf-py's (and ggml's): dl * (g + delta), in float.
 *
 * The dots work in eighths, where a weight is the integer 8g + 8 delta
 * (8g +- 1) times dl / 8: per block the exact int32
 *   sumi = sum over scale groups of ls * sum (8g +- 1) * q
 * written as ls * (8 * sum g q + delta * sum q), the activation sums taken
 * from q itself (per 32 elements for iq1_s, per 8 for iq1_m, as the delta
 * goes) rather than from bsums, so the dot is a function of the bytes
 * alone; then s += (d_y * d_w) * sumi block by block, and the dot is
 * s / 8 (exact). |sumi| <= 15 * 9 * 128 * 256 < 2^23, so its float is
 * exact and equals ggml's sumi + IQ1S_DELTA * sumi1 times 8. The AVX2
 * tiles (quants_iq1_avx2.c) compute the same integers and float ops. */
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "iq1_grids.h"

static inline int nearest_int(float x) { return (int)lrintf(x); }

/* ------------------------------------------------------------ dequantize */

void tl_dequant_iq1_s(const void *src, float *y, int64_t nb) {
    const block_iq1_s *x = src;
    for (int64_t i = 0; i < nb; i++) {
        const float d = TL_F16(x[i].d);
        for (int ib = 0; ib < QK_K / 32; ib++) {
            const float dl = d * tl_iq1_s_ls(&x[i], ib), delta = tl_iq1_s_delta(&x[i], ib) * 0.125f;
            for (int l = 0; l < 4; l++, y += 8) {
                const unsigned idx = tl_iq1_s_index(&x[i], ib, l);
                for (int j = 0; j < 8; j++) y[j] = dl * (tl_iq1s_g(idx, j) + delta);
            }
        }
    }
}

void tl_dequant_iq1_m(const void *src, float *y, int64_t nb) {
    const block_iq1_m *x = src;
    for (int64_t i = 0; i < nb; i++) {
        const float d = TL_F16(tl_iq1_m_d(&x[i]));
        for (int k = 0; k < QK_K / 8; k++, y += 8) {
            const float dl = d * tl_iq1_m_ls(&x[i], k / 2), delta = tl_iq1_m_delta(&x[i], k) * 0.125f;
            const unsigned idx = tl_iq1_m_index(&x[i], k);
            for (int j = 0; j < 8; j++) y[j] = dl * (tl_iq1s_g(idx, j) + delta);
        }
    }
}

/* --------------------------------------------------------------- vec_dot */

/* sum g * q and sum q over the 8 elements of grid entry idx. */
static inline void entry_dot(unsigned idx, const int8_t *q, int *sgq, int *sq) {
    int a = 0, b = 0;
    for (int j = 0; j < 8; j++) {
        a += tl_iq1s_g(idx, j) * q[j];
        b += q[j];
    }
    *sgq = a, *sq = b;
}

static void dot_iq1_s(int64_t n, float *out, const void *w, const void *x) {
    const block_iq1_s *a = w;
    const block_q8_K *b = x;
    float s = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int sumi = 0;
        for (int ib = 0; ib < QK_K / 32; ib++) {
            int sgq = 0, sq = 0;
            for (int l = 0; l < 4; l++) {
                int t, u;
                entry_dot(tl_iq1_s_index(&a[i], ib, l), b[i].qs + 32 * ib + 8 * l, &t, &u);
                sgq += t, sq += u;
            }
            sumi += tl_iq1_s_ls(&a[i], ib) * (8 * sgq + tl_iq1_s_delta(&a[i], ib) * sq);
        }
        s += b[i].d * TL_F16(a[i].d) * (float)sumi;
    }
    *out = 0.125f * s;
}

static void dot_iq1_m(int64_t n, float *out, const void *w, const void *x) {
    const block_iq1_m *a = w;
    const block_q8_K *b = x;
    float s = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int sumi = 0;
        for (int j = 0; j < QK_K / 16; j++) {
            int t = 0;
            for (int k = 2 * j; k < 2 * j + 2; k++) {
                int sgq, sq;
                entry_dot(tl_iq1_m_index(&a[i], k), b[i].qs + 8 * k, &sgq, &sq);
                t += 8 * sgq + tl_iq1_m_delta(&a[i], k) * sq;
            }
            sumi += tl_iq1_m_ls(&a[i], j) * t;
        }
        s += b[i].d * TL_F16(tl_iq1_m_d(&a[i])) * (float)sumi;
    }
    *out = 0.125f * s;
}

void tl_iq1_fill_ref(tl_kernel_table *t) {
    t->vec_dot[TL_TYPE_IQ1_S] = dot_iq1_s;
    t->vec_dot[TL_TYPE_IQ1_M] = dot_iq1_m;
}

/* -------------------------------------------------------------- quantize */

/* The nearest grid entries of every point of {-1,0,1}^8 (key: element j's
 * level 0..2 the base-3 digit j): the point itself where it is on the
 * grid, else the entries at its least squared distance (1 or 2; at most
 * 34 of them, 5 on average). The quantizer rounds each scaled value to a
 * level and picks among its key's entries by the exact error. */
enum { NKEYS = 6561, NLIST = 2048 + 24008 };
static uint16_t nb_start[NKEYS + 1], nb_list[NLIST];
static int8_t grid_g[TL_IQ1S_GRID_SIZE][8];
static pthread_once_t nb_once = PTHREAD_ONCE_INIT;

static void build_neighbours(void) {
    static int16_t on_grid[NKEYS];
    memset(on_grid, -1, sizeof on_grid);
    for (int i = 0; i < TL_IQ1S_GRID_SIZE; i++) {
        int key = 0;
        for (int j = 7; j >= 0; j--) {
            grid_g[i][j] = (int8_t)tl_iq1s_g((unsigned)i, j);
            key = 3 * key + grid_g[i][j] + 1;
        }
        on_grid[key] = (int16_t)i;
    }
    int len = 0;
    for (int key = 0; key < NKEYS; key++) {
        nb_start[key] = (uint16_t)len;
        if (on_grid[key] >= 0) {
            nb_list[len++] = (uint16_t)on_grid[key];
            continue;
        }
        int p[8], best = 1 << 30;
        for (int j = 0, k = key; j < 8; j++, k /= 3) p[j] = k % 3 - 1;
        for (int i = 0; i < TL_IQ1S_GRID_SIZE; i++) {
            int dist = 0;
            for (int j = 0; j < 8; j++) dist += (p[j] - grid_g[i][j]) * (p[j] - grid_g[i][j]);
            if (dist < best) best = dist, len = nb_start[key]; /* a nearer one: the list restarts */
            if (dist == best && len < NLIST) nb_list[len++] = (uint16_t)i;
        }
    }
    nb_start[NKEYS] = (uint16_t)len;
}

/* The grid entry nearest the 8 level-unit values y; *err += its squared distance. */
static int nearest_entry(const float *y, float *err) {
    int key = 0;
    for (int j = 7; j >= 0; j--) key = 3 * key + (y[j] < -0.5f ? 0 : y[j] > 0.5f ? 2 : 1);
    int best = nb_list[nb_start[key]];
    float best_e = INFINITY;
    for (int c = nb_start[key]; c < nb_start[key + 1]; c++) {
        float e = 0;
        for (int j = 0; j < 8; j++) e += (y[j] - grid_g[nb_list[c]][j]) * (y[j] - grid_g[nb_list[c]][j]);
        if (e < best_e) best_e = e, best = nb_list[c];
    }
    *err += best_e;
    return best;
}

/* One scale group: ng entries of 8 values sharing a scale; their deltas
 * one sign for the group (iq1_s) or each its own (iq1_m). */
typedef struct {
    int ng, shared_delta;
    uint16_t idx[4];
    uint8_t neg[4]; /* delta -1/8 */
} group_fit;

/* Encodes x at scale s (> 0): per delta choice the nearest entries of
 * x / s - delta. Returns sum (x - s q)^2 and sets *sxq, *sqq (q = g + delta)
 * for the least-squares scale of the choice. */
static float encode_at(const float *x, float s, group_fit *f, float *sxq, float *sqq) {
    const float is = 1.0f / s;
    float err_sh[2] = {0, 0};
    uint16_t idx[2][4];
    for (int e = 0; e < f->ng; e++) {
        float err[2] = {0, 0};
        for (int neg = 0; neg < 2; neg++) {
            float y[8];
            for (int j = 0; j < 8; j++) y[j] = x[8 * e + j] * is - (neg ? -0.125f : 0.125f);
            idx[neg][e] = (uint16_t)nearest_entry(y, &err[neg]);
            err_sh[neg] += err[neg];
        }
        if (!f->shared_delta) f->neg[e] = err[1] < err[0], f->idx[e] = idx[f->neg[e]][e];
    }
    if (f->shared_delta)
        for (int e = 0; e < f->ng; e++) f->neg[e] = err_sh[1] < err_sh[0], f->idx[e] = idx[f->neg[e]][e];
    float a = 0, b = 0, err = 0;
    for (int e = 0; e < f->ng; e++)
        for (int j = 0; j < 8; j++) {
            const float q = grid_g[f->idx[e]][j] + (f->neg[e] ? -0.125f : 0.125f), v = x[8 * e + j];
            a += v * q, b += q * q, err += (v - s * q) * (v - s * q);
        }
    *sxq = a, *sqq = b;
    return err;
}

/* The group's best float scale: encodings at scales amax / t for t = 1.1,
 * 1.5, 1.9, each refit by least squares, the least error kept (0: all
 * zero). More starting points (18, t = 0.8 .. 2.5) gained 0.0003 of
 * relative squared error on Gaussian rows at 3x the time. */
static float best_scale(const float *x, group_fit *f) {
    float amax = 0, sxx = 0;
    for (int j = 0; j < 8 * f->ng; j++) amax = fmaxf(amax, fabsf(x[j])), sxx += x[j] * x[j];
    if (!(amax > 0)) return 0;
    float best_s = amax, best_e = INFINITY;
    for (int k = 0; k < 3; k++) {
        float a, b;
        encode_at(x, amax / (1.1f + 0.4f * k), f, &a, &b);
        if (a <= 0) continue;
        const float e = sxx - a * a / b;
        if (e < best_e) best_e = e, best_s = a / b;
    }
    return best_s;
}

/* A super-block: the groups' float scales, d = the largest / 15 (the top
 * odd multiple), each ls the nearest odd multiple or one either side,
 * whichever encodes the group best at the scale the decoder will see.
 * Returns the f16 d (0: every value 0) and each group's ls and fit. */
static uint16_t quant_super(const float *x, int ngroups, int ng, int shared_delta, int *ls, group_fit *fits) {
    pthread_once(&nb_once, build_neighbours);
    float sc[16], max_s = 0;
    for (int g = 0; g < ngroups; g++) {
        fits[g] = (group_fit){.ng = ng, .shared_delta = shared_delta};
        sc[g] = best_scale(x + 8 * ng * g, &fits[g]);
        max_s = fmaxf(max_s, sc[g]);
    }
    const uint16_t dh = tl_f32_to_f16_inl(fminf(max_s / 15, 65504.0f)); /* the largest finite half */
    const float d = TL_F16(dh);
    if (!(d > 0)) return 0;
    for (int g = 0; g < ngroups; g++) {
        const int l0 = nearest_int(fminf((sc[g] / d - 1) / 2, 7.0f));
        float best_e = INFINITY;
        for (int l = l0 - 1; l <= l0 + 1; l++) {
            if (l < 0 || l > 7) continue;
            group_fit f = fits[g];
            float a, b;
            const float e = encode_at(x + 8 * ng * g, d * (2 * l + 1), &f, &a, &b);
            if (e < best_e) best_e = e, ls[g] = l, fits[g] = f;
        }
    }
    return dh;
}

void tl_quant_iq1_s(const float *x, void *dst, int64_t nb) {
    block_iq1_s *y = dst;
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        int ls[8];
        group_fit f[8];
        memset(&y[i], 0, sizeof y[i]);
        y[i].d = quant_super(x, 8, 4, 1, ls, f);
        if (!y[i].d) continue;
        for (int ib = 0; ib < 8; ib++) {
            uint16_t qh = (uint16_t)(ls[ib] << 12 | f[ib].neg[0] << 15);
            for (int l = 0; l < 4; l++) {
                y[i].qs[4 * ib + l] = (uint8_t)f[ib].idx[l];
                qh |= (uint16_t)((f[ib].idx[l] >> 8) << (3 * l));
            }
            y[i].qh[ib] = qh;
        }
    }
}

void tl_quant_iq1_m(const float *x, void *dst, int64_t nb) {
    block_iq1_m *y = dst;
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        int ls[16];
        group_fit f[16];
        memset(&y[i], 0, sizeof y[i]);
        const uint16_t dh = quant_super(x, 16, 2, 0, ls, f);
        if (!dh) continue;
        uint16_t w[4] = {0, 0, 0, 0};
        for (int j = 0; j < 16; j++) {
            w[j / 4] |= (uint16_t)(ls[j] << (3 * (j % 4)));
            for (int e = 0; e < 2; e++) {
                const int k = 2 * j + e;
                y[i].qs[k] = (uint8_t)f[j].idx[e];
                y[i].qh[k / 2] |= (uint8_t)(((f[j].idx[e] >> 8) | f[j].neg[e] << 3) << (4 * (k % 2)));
            }
        }
        /* d's nibbles to the words' top nibbles (tl_iq1_m_d's inverse) */
        for (int q = 0; q < 4; q++) w[q] |= (uint16_t)(((dh >> (4 * q)) & 0xF) << 12);
        memcpy(y[i].scales, w, 8);
    }
}
