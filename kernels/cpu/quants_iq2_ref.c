/* quants_iq2_ref.c - iq2_xxs, iq2_xs and iq2_s (layouts: iq2_grids.h): the
 * scalar reference. Dequantization is bitwise ggml's (and gguf-py's); the
 * dot products are ggml's reference sums and float order, which the AVX2
 * tiles (quants_iq2_avx2.c) reproduce bitwise; the quantizers are ours
 * (no importance matrix). */
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "iq2_grids.h"
#include "quants_impl.h"

/* Byte j of a grid entry: element j's magnitude. */
static inline int mag(uint64_t g, int j) { return (int)(g >> (8 * j) & 0xFF); }

/* One group of 8: y[j] = db * magnitude * (bit j of signs ? -1 : 1), the
 * decoder's products in its order. */
static inline void put8(float *y, float db, uint64_t g, unsigned signs) {
    for (int j = 0; j < 8; j++) y[j] = db * (float)mag(g, j) * (signs >> j & 1 ? -1.0f : 1.0f);
}

/* The sub-block scale's decoded value. */
static inline float db_of(float d, unsigned s) { return d * (0.5f + (float)(s & 15)) * 0.25f; }

/* ------------------------------------------------------------ dequantize */

void tl_dequant_iq2_xxs(const void *src, float *y, int64_t nb) {
    const block_iq2_xxs *x = src;
    for (int64_t i = 0; i < nb; i++) {
        const float d = TL_F16(x[i].d);
        for (int ib = 0; ib < 8; ib++) {
            uint32_t aux[2];
            memcpy(aux, x[i].qs + 4 * ib, 8);
            const float db = db_of(d, aux[1] >> 28);
            for (int l = 0; l < 4; l++, y += 8)
                put8(y, db, tl_iq2xxs_grid[aux[0] >> (8 * l) & 0xFF], tl_iq_signs8(aux[1] >> (7 * l)));
        }
    }
}

void tl_dequant_iq2_xs(const void *src, float *y, int64_t nb) {
    const block_iq2_xs *x = src;
    for (int64_t i = 0; i < nb; i++) {
        const float d = TL_F16(x[i].d);
        for (int g = 0; g < 32; g++, y += 8) {
            const unsigned q = x[i].qs[g];
            put8(y, db_of(d, x[i].scales[g / 4] >> (g & 2 ? 4 : 0)), tl_iq2xs_grid[q & 511], tl_iq_signs8(q >> 9));
        }
    }
}

/* Group g's 10-bit grid index in an iq2_s block. */
static inline unsigned iq2s_index(const block_iq2_s *b, int g) {
    return b->qs[g] | (unsigned)(b->qh[g / 4] >> (2 * (g % 4)) & 3) << 8;
}

void tl_dequant_iq2_s(const void *src, float *y, int64_t nb) {
    const block_iq2_s *x = src;
    for (int64_t i = 0; i < nb; i++) {
        const float d = TL_F16(x[i].d);
        for (int g = 0; g < 32; g++, y += 8)
            put8(y, db_of(d, x[i].scales[g / 4] >> (g & 2 ? 4 : 0)), tl_iq2s_grid[iq2s_index(&x[i], g)], x[i].qs[32 + g]);
    }
}

/* --------------------------------------------------------------- vec_dot */

/* sum_j magnitude_j * q8_j, negated where bit j of signs is set (exact). */
static inline int dot8(uint64_t g, unsigned signs, const int8_t *q8) {
    int s = 0;
    for (int j = 0; j < 8; j++) {
        const int v = mag(g, j) * q8[j];
        s += signs >> j & 1 ? -v : v;
    }
    return s;
}

/* Per super-block: the int32 sum of (2s + 1) * dot over sub-blocks (below
 * 2^26 in magnitude: 256 * 43 * 128 * 31), then acc += (d_w * d_y) * sum;
 * the dot is 0.125f * acc. */
void tl_dot_iq2_xxs(int64_t n, float *out, const void *w, const void *x) {
    const block_iq2_xxs *a = w;
    const block_q8_K *b = x;
    float acc = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const int8_t *q8 = b[i].qs;
        int32_t sum = 0;
        for (int ib = 0; ib < 8; ib++) {
            uint32_t aux[2];
            memcpy(aux, a[i].qs + 4 * ib, 8);
            int32_t sumi = 0;
            for (int l = 0; l < 4; l++, q8 += 8)
                sumi += dot8(tl_iq2xxs_grid[aux[0] >> (8 * l) & 0xFF], tl_iq_signs8(aux[1] >> (7 * l)), q8);
            sum += (int32_t)(2 * (aux[1] >> 28) + 1) * sumi;
        }
        acc += (TL_F16(a[i].d) * b[i].d) * (float)sum;
    }
    *out = 0.125f * acc;
}

/* iq2_xs and iq2_s: as iq2_xxs with a scale per 16 elements; they differ
 * only in where group g's grid entry and sign bits come from. */
static inline int dot8_group(int is_s, const void *blk, int g, const int8_t *q8) {
    if (is_s) {
        const block_iq2_s *a = blk;
        return dot8(tl_iq2s_grid[iq2s_index(a, g)], a->qs[32 + g], q8);
    }
    const unsigned q = ((const block_iq2_xs *)blk)->qs[g];
    return dot8(tl_iq2xs_grid[q & 511], tl_iq_signs8(q >> 9), q8);
}

static void dot_iq2_16(int is_s, int64_t n, float *out, const void *w, const void *x) {
    const size_t bw = is_s ? sizeof(block_iq2_s) : sizeof(block_iq2_xs);
    const block_q8_K *b = x;
    float acc = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const uint8_t *blk = (const uint8_t *)w + (size_t)i * bw;
        const uint8_t *scales = is_s ? ((const block_iq2_s *)blk)->scales : ((const block_iq2_xs *)blk)->scales;
        uint16_t dh;
        memcpy(&dh, blk, 2); /* d leads both layouts */
        int32_t sum = 0;
        for (int h = 0; h < 16; h++) {
            int32_t sumi = 0;
            for (int g = 2 * h; g < 2 * h + 2; g++) sumi += dot8_group(is_s, blk, g, b[i].qs + 8 * g);
            sum += (int32_t)(2 * (scales[h / 2] >> (4 * (h % 2)) & 15) + 1) * sumi;
        }
        acc += (TL_F16(dh) * b[i].d) * (float)sum;
    }
    *out = 0.125f * acc;
}

void tl_dot_iq2_xs(int64_t n, float *out, const void *w, const void *x) { dot_iq2_16(0, n, out, w, x); }
void tl_dot_iq2_s(int64_t n, float *out, const void *w, const void *x) { dot_iq2_16(1, n, out, w, x); }

/* -------------------------------------------------------------- quantize */

/* Per group of 8: the signs are the elements' (iq2_xxs / iq2_xs keep an
 * even count of negatives: the odd one out is the smallest magnitude,
 * which then costs least), the magnitudes go to a grid entry. For a scale
 * sc, each magnitude / sc rounds to its nearest level (one of 3^8
 * combinations); the NCAND grid entries nearest that combination (a table
 * built once per grid) are scored on the unrounded values. Per sub-block
 * NSCALES scales are tried (the largest magnitude on 0x08, on 0x19, and
 * from 0.7 to 1.5 times 0x2b: a constant group needs the first), each
 * refit by least squares to the entries it chose; the sub-block scales then become 4-bit steps of
 * an fp16 d, and the entries are chosen again at the step (and the ones
 * beside it) the decoder will see. */
enum { NCOMBO = 6561, NCAND = 4, NSCALES = 10 };

typedef struct {
    const uint64_t *grid;
    int n;
    float g[1024][8];           /* entry k's magnitudes */
    float gsq[1024];            /* their sums of squares */
    uint16_t cand[NCOMBO][NCAND]; /* per level combination (element j: digit j in base 3), nearest entries first */
} codebook;

static codebook cb_xxs = {.grid = tl_iq2xxs_grid, .n = 256}, cb_xs = {.grid = tl_iq2xs_grid, .n = 512},
                cb_s = {.grid = tl_iq2s_grid, .n = 1024};

static void build(codebook *cb) {
    static const float level[3] = {8, 25, 43};
    for (int k = 0; k < cb->n; k++) {
        cb->gsq[k] = 0;
        for (int j = 0; j < 8; j++) {
            cb->g[k][j] = (float)mag(cb->grid[k], j);
            cb->gsq[k] += cb->g[k][j] * cb->g[k][j];
        }
    }
    for (int c = 0; c < NCOMBO; c++) {
        float v[8], dist[NCAND];
        for (int j = 0, r = c; j < 8; j++, r /= 3) v[j] = level[r % 3];
        for (int m = 0; m < NCAND; m++) dist[m] = INFINITY, cb->cand[c][m] = 0;
        for (int k = 0; k < cb->n; k++) {
            float e = 0;
            for (int j = 0; j < 8; j++) e += (v[j] - cb->g[k][j]) * (v[j] - cb->g[k][j]);
            int m = NCAND; /* insert k into the sorted candidates */
            while (m > 0 && e < dist[m - 1]) {
                if (m < NCAND) dist[m] = dist[m - 1], cb->cand[c][m] = cb->cand[c][m - 1];
                m--;
            }
            if (m < NCAND) dist[m] = e, cb->cand[c][m] = (uint16_t)k;
        }
    }
}

static pthread_once_t once_xxs = PTHREAD_ONCE_INIT, once_xs = PTHREAD_ONCE_INIT, once_s = PTHREAD_ONCE_INIT;
static void build_xxs(void) { build(&cb_xxs); }
static void build_xs(void) { build(&cb_xs); }
static void build_s(void) { build(&cb_s); }

static inline float dot8f(const float *a, const float *g) {
    float s = 0;
    for (int j = 0; j < 8; j++) s += a[j] * g[j];
    return s;
}

/* The entry for magnitudes a (negative where a sign had to be flipped) at
 * scale sc > 0; *score = its squared error less sum a^2. */
static int nearest_entry(const codebook *cb, const float *a, float sc, float *score) {
    const float isc = 1.0f / sc;
    int c = 0;
    for (int j = 7; j >= 0; j--) {
        const float v = a[j] * isc;
        c = 3 * c + (v >= 16.5f) + (v >= 34.0f); /* midpoints of 8, 25, 43 */
    }
    int best = cb->cand[c][0];
    float bs = INFINITY;
    for (int m = 0; m < NCAND; m++) {
        const int k = cb->cand[c][m];
        const float e = sc * (sc * cb->gsq[k] - 2 * dot8f(a, cb->g[k]));
        if (e < bs) bs = e, best = k;
    }
    *score = bs;
    return best;
}

/* ng groups sharing one scale: returns the scale (0 for zeros), idx[ng] their entries. */
static float fit_scale(const codebook *cb, const float *a, int ng, uint16_t *idx) {
    float amax = 0;
    for (int j = 0; j < 8 * ng; j++) amax = fmaxf(amax, fabsf(a[j]));
    memset(idx, 0, (size_t)ng * sizeof *idx);
    if (!(amax > 0)) return 0;
    float best_sc = 0, best = INFINITY;
    static const float top[NSCALES] = {8.5f, 25.5f, 30, 34, 38, 42, 47, 53, 60, 66}; /* amax / sc */
    for (int k = 0; k < NSCALES; k++) {
        const float sc = amax / top[k];
        uint16_t t[4];
        float num = 0, den = 0, e;
        for (int gi = 0; gi < ng; gi++) {
            t[gi] = (uint16_t)nearest_entry(cb, a + 8 * gi, sc, &e);
            num += dot8f(a + 8 * gi, cb->g[t[gi]]);
            den += cb->gsq[t[gi]];
        }
        if (!(num > 0)) continue;
        const float score = -num * num / den; /* error less sum a^2 at the least-squares scale num / den */
        if (score < best) best = score, best_sc = num / den, memcpy(idx, t, (size_t)ng * sizeof *idx);
    }
    return best_sc;
}

/* One super-block's choices, before packing. */
typedef struct {
    uint16_t d;
    uint8_t s[16];     /* sub-block scales (8 of 32 or 16 of 16) */
    uint16_t idx[32];  /* per group: the grid entry */
    uint8_t sign[32];  /* per group: 8 sign bits (even parity where asked) */
} iq2_choice;

static void fit_superblock(const codebook *cb, const float *x, int sub, int parity, iq2_choice *f) {
    float a[QK_K], sc[16], max_sc = 0;
    const int nsub = QK_K / sub, ng = sub / 8;
    memset(f, 0, sizeof *f);
    for (int g = 0; g < 32; g++) {
        unsigned s8 = 0;
        int jmin = 0;
        for (int j = 0; j < 8; j++) {
            a[8 * g + j] = fabsf(x[8 * g + j]);
            if (x[8 * g + j] < 0) s8 |= 1u << j;
            if (a[8 * g + j] < a[8 * g + jmin]) jmin = j;
        }
        if (parity && __builtin_parity(s8)) s8 ^= 1u << jmin, a[8 * g + jmin] = -a[8 * g + jmin];
        f->sign[g] = (uint8_t)s8;
    }
    for (int b = 0; b < nsub; b++) {
        sc[b] = fit_scale(cb, a + sub * b, ng, f->idx + ng * b);
        max_sc = fmaxf(max_sc, sc[b]);
    }
    f->d = tl_f32_to_f16_inl(fminf(max_sc * 8 / 31, 65504.0f)); /* the largest scale on s = 15 */
    const float d = TL_F16(f->d);
    if (!(d > 0)) { /* zeros, or scales below half precision: an all-zero block */
        memset(f, 0, sizeof *f);
        return;
    }
    for (int b = 0; b < nsub; b++) {
        const int s0 = (int)lrintf((sc[b] * 8 / d - 1) * 0.5f);
        float best = INFINITY;
        for (int s = s0 - 1; s <= s0 + 1; s++) {
            if (s < 0 || s > 15) continue;
            const float db = db_of(d, (unsigned)s);
            uint16_t t[4];
            float score = 0, e;
            for (int gi = 0; gi < ng; gi++) {
                t[gi] = (uint16_t)nearest_entry(cb, a + sub * b + 8 * gi, db, &e);
                score += e;
            }
            if (score < best) best = score, f->s[b] = (uint8_t)s, memcpy(f->idx + ng * b, t, (size_t)ng * sizeof *t);
        }
    }
}

void tl_quant_iq2_xxs(const float *x, void *dst, int64_t nb) {
    pthread_once(&once_xxs, build_xxs);
    block_iq2_xxs *y = dst;
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        iq2_choice f;
        fit_superblock(&cb_xxs, x, 32, 1, &f);
        y[i].d = f.d;
        for (int ib = 0; ib < 8; ib++) {
            uint32_t aux[2] = {0, (uint32_t)f.s[ib] << 28};
            for (int l = 0; l < 4; l++) {
                aux[0] |= (uint32_t)f.idx[4 * ib + l] << (8 * l);
                aux[1] |= (uint32_t)(f.sign[4 * ib + l] & 127) << (7 * l);
            }
            memcpy(y[i].qs + 4 * ib, aux, 8);
        }
    }
}

void tl_quant_iq2_xs(const float *x, void *dst, int64_t nb) {
    pthread_once(&once_xs, build_xs);
    block_iq2_xs *y = dst;
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        iq2_choice f;
        fit_superblock(&cb_xs, x, 16, 1, &f);
        y[i].d = f.d;
        for (int g = 0; g < 32; g++) y[i].qs[g] = (uint16_t)(f.idx[g] | (f.sign[g] & 127) << 9);
        for (int ib = 0; ib < 8; ib++) y[i].scales[ib] = (uint8_t)(f.s[2 * ib] | f.s[2 * ib + 1] << 4);
    }
}

void tl_quant_iq2_s(const float *x, void *dst, int64_t nb) {
    pthread_once(&once_s, build_s);
    block_iq2_s *y = dst;
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        iq2_choice f;
        fit_superblock(&cb_s, x, 16, 0, &f);
        memset(&y[i], 0, sizeof y[i]);
        y[i].d = f.d;
        for (int g = 0; g < 32; g++) {
            y[i].qs[g] = (uint8_t)f.idx[g];
            y[i].qs[32 + g] = f.sign[g];
            y[i].qh[g / 4] |= (uint8_t)((f.idx[g] >> 8) << (2 * (g % 4)));
        }
        for (int ib = 0; ib < 8; ib++) y[i].scales[ib] = (uint8_t)(f.s[2 * ib] | f.s[2 * ib + 1] << 4);
    }
}
