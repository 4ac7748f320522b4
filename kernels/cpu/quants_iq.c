/* quants_iq.c - the i-quants on grids as integers (quants_iq.h): each
 * type's unpack of a super-block, the view the AVX2 GEMM transposes. The
 * reference dots (quants_iq*_ref.c) make the same integers group by group. */
#include <string.h>

#include "iq1_grids.h"
#include "iq2_grids.h"
#include "iq3_grids.h"
#include "quants_iq.h"

/* The 8 bytes of g with byte j negated where bit j of s is set. Grid
 * bytes are never 0, so no byte's negation carries into the next. */
static inline uint64_t signed8(uint64_t g, unsigned s) {
    const uint64_t bits = ((uint64_t)(s & 0xFF) * 0x0101010101010101ull) & 0x8040201008040201ull;
    const uint64_t neg = (((bits + 0x7F7F7F7F7F7F7F7Full) & 0x8080808080808080ull) >> 7) * 0xFF;
    return (g ^ neg) + (neg & 0x0101010101010101ull);
}

static void unpack_iq2_xxs(const uint8_t *blk, uint64_t v[32], int16_t ls[16], float *d) {
    const block_iq2_xxs *b = (const block_iq2_xxs *)blk;
    *d = TL_F16(tl_ld16(blk));
    for (int ib = 0; ib < 8; ib++) {
        const uint32_t idx = tl_ld32((const uint8_t *)b->qs + 8 * ib), aux = tl_ld32((const uint8_t *)b->qs + 8 * ib + 4);
        ls[2 * ib] = ls[2 * ib + 1] = (int16_t)(2 * (aux >> 28) + 1);
        for (int l = 0; l < 4; l++) v[4 * ib + l] = signed8(tl_iq2xxs_grid[idx >> (8 * l) & 0xFF], tl_iq_signs8(aux >> (7 * l)));
    }
}

/* iq2_xs / iq2_s: a 4-bit scale per 16 elements, low nibble first */
static inline int16_t ls16(const uint8_t *scales, int h) { return (int16_t)(2 * (scales[h / 2] >> (4 * (h % 2)) & 15) + 1); }

static void unpack_iq2_xs(const uint8_t *blk, uint64_t v[32], int16_t ls[16], float *d) {
    const block_iq2_xs *b = (const block_iq2_xs *)blk;
    *d = TL_F16(tl_ld16(blk));
    for (int g = 0; g < 32; g++) {
        const unsigned q = tl_ld16((const uint8_t *)b->qs + 2 * g);
        v[g] = signed8(tl_iq2xs_grid[q & 511], tl_iq_signs8(q >> 9));
    }
    for (int h = 0; h < 16; h++) ls[h] = ls16(b->scales, h);
}

static void unpack_iq2_s(const uint8_t *blk, uint64_t v[32], int16_t ls[16], float *d) {
    const block_iq2_s *b = (const block_iq2_s *)blk;
    *d = TL_F16(tl_ld16(blk));
    for (int g = 0; g < 32; g++)
        v[g] = signed8(tl_iq2s_grid[b->qs[g] | (unsigned)(b->qh[g / 4] >> (2 * (g % 4)) & 3) << 8], b->qs[32 + g]);
    for (int h = 0; h < 16; h++) ls[h] = ls16(b->scales, h);
}

static void unpack_iq3_xxs(const uint8_t *blk, uint64_t v[32], int16_t ls[16], float *d) {
    const block_iq3_xxs *b = (const block_iq3_xxs *)blk;
    *d = TL_F16(tl_ld16(blk));
    for (int ib = 0; ib < 8; ib++) {
        const uint32_t aux = tl_ld32(b->qs + 64 + 4 * ib);
        ls[2 * ib] = ls[2 * ib + 1] = (int16_t)(2 * (aux >> 28) + 1);
        for (int l = 0; l < 4; l++) {
            const uint8_t *q = b->qs + 8 * ib + 2 * l;
            const uint64_t g = tl_iq3xxs_grid[q[0]] | (uint64_t)tl_iq3xxs_grid[q[1]] << 32;
            v[4 * ib + l] = signed8(g, tl_iq_signs8(aux >> (7 * l)));
        }
    }
}

static void unpack_iq3_s(const uint8_t *blk, uint64_t v[32], int16_t ls[16], float *d) {
    const block_iq3_s *b = (const block_iq3_s *)blk;
    *d = TL_F16(tl_ld16(blk));
    for (int ib = 0; ib < 8; ib++) {
        ls[2 * ib] = ls[2 * ib + 1] = (int16_t)(2 * (b->scales[ib / 2] >> (4 * (ib % 2)) & 15) + 1);
        for (int l = 0; l < 4; l++) {
            const int g0 = 2 * l, g1 = 2 * l + 1;
            const uint32_t e0 = tl_iq3s_grid[b->qs[8 * ib + g0] | (b->qh[ib] >> g0 & 1) << 8];
            const uint32_t e1 = tl_iq3s_grid[b->qs[8 * ib + g1] | (b->qh[ib] >> g1 & 1) << 8];
            v[4 * ib + l] = signed8(e0 | (uint64_t)e1 << 32, b->signs[4 * ib + l]);
        }
    }
}

/* iq1: values in eighths, 8g + delta (g in -1..1, delta +-1), which is
 * how the reference dots count them (post 1/8) */
static inline uint64_t eighths8(unsigned idx, int delta) {
    /* grid bytes are levels 0..2 (g + 1): 8 * level, then plus delta - 8 in
     * every byte, added byte by byte without carries between them */
    const uint64_t a = tl_iq1s_grid[idx & 2047] << 3, b = delta > 0 ? 0xF9F9F9F9F9F9F9F9ull : 0xF7F7F7F7F7F7F7F7ull;
    const uint64_t lo = 0x7F7F7F7F7F7F7F7Full;
    return ((a & lo) + (b & lo)) ^ ((a ^ b) & ~lo);
}

static void unpack_iq1_s(const uint8_t *blk, uint64_t v[32], int16_t ls[16], float *d) {
    const block_iq1_s *b = (const block_iq1_s *)blk;
    *d = TL_F16(tl_ld16(blk));
    for (int ib = 0; ib < 8; ib++) {
        ls[2 * ib] = ls[2 * ib + 1] = (int16_t)tl_iq1_s_ls(b, ib);
        for (int l = 0; l < 4; l++) v[4 * ib + l] = eighths8(tl_iq1_s_index(b, ib, l), tl_iq1_s_delta(b, ib));
    }
}

static void unpack_iq1_m(const uint8_t *blk, uint64_t v[32], int16_t ls[16], float *d) {
    const block_iq1_m *b = (const block_iq1_m *)blk;
    *d = TL_F16(tl_iq1_m_d(b));
    for (int k = 0; k < 32; k++) v[k] = eighths8(tl_iq1_m_index(b, k), tl_iq1_m_delta(b, k));
    for (int j = 0; j < 16; j++) ls[j] = (int16_t)tl_iq1_m_ls(b, j);
}

const tl_iq_info *tl_iq_info_of(int type) {
    static const tl_iq_info iq2_xxs = {unpack_iq2_xxs, 0.125f, 43}, iq2_xs = {unpack_iq2_xs, 0.125f, 43},
                            iq2_s = {unpack_iq2_s, 0.125f, 43}, iq3_xxs = {unpack_iq3_xxs, 0.25f, 62},
                            iq3_s = {unpack_iq3_s, 1.0f, 15}, iq1_s = {unpack_iq1_s, 0.125f, 9},
                            iq1_m = {unpack_iq1_m, 0.125f, 9};
    switch (type) {
    case TL_TYPE_IQ2_XXS: return &iq2_xxs;
    case TL_TYPE_IQ2_XS: return &iq2_xs;
    case TL_TYPE_IQ2_S: return &iq2_s;
    case TL_TYPE_IQ3_XXS: return &iq3_xxs;
    case TL_TYPE_IQ3_S: return &iq3_s;
    case TL_TYPE_IQ1_S: return &iq1_s;
    case TL_TYPE_IQ1_M: return &iq1_m;
    default: return NULL;
    }
}
