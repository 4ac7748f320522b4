/* test_iquants.c - the i-quants on grids (iq2_xxs, iq2_xs, iq2_s,
 * iq1_s, iq1_m, iq3_xxs, iq3_s) beyond test_quants.c's per-type round
 * trips and dots: hand-built blocks against ggml's layouts and grid
 * values, the grids' hashes, blocks of random bytes (every bit pattern is
 * a block; d finite, from subnormal to +-65504) whose vec_dot and tiles
 * are bitwise the scalar reference at every ISA level and that within a
 * stated tolerance of the dequantized dot in double, and rows (zero,
 * constant, tiny) that must quantize to finite values. */
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "iq1_grids.h"
#include "iq2_grids.h"
#include "iq3_grids.h"
#include "quants_check.h"

/* ------------------------------------------------------ the iq2 family */

/* nr random-byte rows w x nt q8_K rows x, n elements each: vec_dot and
 * the tiles (all nr rows, and 3 and 6 fewer: the 4-row groups' leftovers)
 * at every level are bitwise the scalar reference, and that is within
 * tol * sum |w x| of the double dot of the dequantized rows. */
static void check_random_dots(int type, int n, const uint8_t *w, int nr, const uint8_t *x, int nt, double tol) {
    const size_t rw = tl_row_size(type, n), rx = tl_row_size(TL_TYPE_Q8_K, n);
    float *wf = malloc(sizeof(float) * n), *xf = malloc(sizeof(float) * n), *out = malloc(sizeof(float) * nr * nt);
    int far = 0, bad_one = 0, bad_tile = 0;
    for (int r = 0; r < nr; r++) {
        tl_dequantize_row(type, w + rw * r, wf, n);
        for (int t = 0; t < nt; t++) {
            float ref;
            tl_vec_dot_ref(type)(n, &ref, w + rw * r, x + rx * t);
            tl_dequantize_row(TL_TYPE_Q8_K, x + rx * t, xf, n);
            double dot = 0;
            for (int i = 0; i < n; i++) dot += (double)wf[i] * xf[i];
            far += !(fabs(ref - dot) <= tol * sum_abs_prod(wf, xf, n));
            for (int lvl = 0; lvl <= isa_max; lvl++) {
                tl_kernels_set_isa(lvl);
                float one;
                tl_vec_dot(type)(n, &one, w + rw * r, x + rx * t);
                bad_one += memcmp(&one, &ref, 4) != 0;
            }
        }
    }
    for (int lvl = 0; lvl <= isa_max; lvl++) {
        tl_kernels_set_isa(lvl);
        for (int rows = nr; rows > 0 && rows > nr - 9; rows -= 3) {
            tl_vec_dot_tile(type, n, rows, nt, out, nr, w, rw, x, rx);
            for (int r = 0; r < rows; r++)
                for (int t = 0; t < nt; t++) {
                    float ref;
                    tl_vec_dot_ref(type)(n, &ref, w + rw * r, x + rx * t);
                    bad_tile += memcmp(&out[t * nr + r], &ref, 4) != 0;
                }
        }
    }
    tl_kernels_set_isa(isa_max);
    const char *name = tl_type_info(type)->name;
    CHECK(bad_one == 0 && bad_tile == 0, "%s random-byte blocks x q8_K rows: vec_dot and tiles at every level are the "
          "scalar reference bitwise (%d, %d differ)", name, bad_one, bad_tile);
    CHECK(far == 0, "%s random-byte blocks: the reference dot is within %g of the double dot of the dequantized rows "
          "(%d far)", name, tol, far);
    free(wf); free(xf); free(out);
}

/* Hand-built iq2 blocks, d = 1: the values follow from ggml's layout and
 * grid entries written out here (so a field read from the wrong place, or
 * a sign or scale bit misplaced, moves them), and the dots with all-ones
 * activations are their sums at every level. Sub-blocks left zero decode
 * to grid entry 0 (all 0x08), positive, at s = 0: 8 * 0.125 = 1. */
static void test_iq2_hand(void) {
    float want[QK_K], got[QK_K];
    int bad;

    /* iq2_xxs sub-block 0: groups 0..3 on entries 1, 2, 0, 0; sign indices
     * 1 (element 0, and 7 by parity) and 3 (elements 0, 1); s = 3 */
    block_iq2_xxs bx;
    memset(&bx, 0, sizeof bx);
    bx.d = 0x3C00;
    const uint32_t w0 = 1 | 2 << 8, w1 = 1 | 3 << 7 | 3u << 28;
    memcpy(bx.qs, &w0, 4);
    memcpy(bx.qs + 2, &w1, 4);
    for (int e = 0; e < QK_K; e++) want[e] = e < 32 ? 0.875f * 8 : 1.0f;
    want[0] = -0.875f * 43, want[7] = -0.875f * 8;                           /* entry 1: 0x2b, then 0x08s */
    want[8] = -0.875f * 25, want[9] = -0.875f * 25;                          /* entry 2: 0x19, 0x19, then 0x08s */
    tl_dequantize_row(TL_TYPE_IQ2_XXS, &bx, got, QK_K);
    bad = 0;
    for (int e = 0; e < QK_K; e++) bad += got[e] != want[e];
    CHECK(bad == 0, "iq2_xxs dequantizes a hand-built block exactly (%d wrong)", bad);
    check_block_dots("iq2_xxs", TL_TYPE_IQ2_XXS, &bx, want);

    /* iq2_xs: group 0 on entry 1 with sign index 1, group 2 (the second
     * half of sub-block 0) on entry 2, no signs; half scales 2 and 5 */
    block_iq2_xs bs;
    memset(&bs, 0, sizeof bs);
    bs.d = 0x3C00;
    bs.qs[0] = 1 | 1 << 9;
    bs.qs[2] = 2;
    bs.scales[0] = 0x52;
    for (int e = 0; e < QK_K; e++) want[e] = e < 16 ? 0.625f * 8 : e < 32 ? 1.375f * 8 : 1.0f;
    want[0] = -0.625f * 43, want[7] = -0.625f * 8, want[16] = want[17] = 1.375f * 25;
    tl_dequantize_row(TL_TYPE_IQ2_XS, &bs, got, QK_K);
    bad = 0;
    for (int e = 0; e < QK_K; e++) bad += got[e] != want[e];
    CHECK(bad == 0, "iq2_xs dequantizes a hand-built block exactly (%d wrong)", bad);
    check_block_dots("iq2_xs", TL_TYPE_IQ2_XS, &bs, want);

    /* iq2_s: group 5 (sub-block 1, l = 1) on entry 257 = 0x0819081919192b08
     * (its high bits in qh[1] bits 2..3), explicit signs 0x81; s = 7 */
    block_iq2_s b2;
    memset(&b2, 0, sizeof b2);
    b2.d = 0x3C00;
    b2.qs[5] = 1;
    b2.qh[1] = 1 << 2;
    b2.qs[32 + 5] = 0x81;
    b2.scales[0] = 0x70; /* sub-block 0's second half: elements 16..31 */
    b2.scales[1] = 0x07; /* sub-block 1's first half: elements 32..47 */
    static const int e257[8] = {8, 43, 25, 25, 25, 8, 25, 8};
    for (int e = 0; e < QK_K; e++) want[e] = (e >= 16 && e < 48) ? 1.875f * 8 : 1.0f;
    for (int j = 0; j < 8; j++) want[40 + j] = 1.875f * e257[j] * (j == 0 || j == 7 ? -1 : 1);
    tl_dequantize_row(TL_TYPE_IQ2_S, &b2, got, QK_K);
    bad = 0;
    for (int e = 0; e < QK_K; e++) bad += got[e] != want[e];
    CHECK(bad == 0, "iq2_s dequantizes a hand-built block exactly (%d wrong)", bad);
    check_block_dots("iq2_s", TL_TYPE_IQ2_S, &b2, want);
}

/* Random-byte iq2 blocks (every bit pattern is a valid block) with d
 * finite from the least subnormal to +-65504, against q8_K rows of random
 * bytes (-128 included, which the quantizer never makes), of +-127, and of
 * a quantized Gaussian: at every level vec_dot and every entry of the tiles
 * (4-row groups and a leftover row) are bitwise the scalar reference, and
 * that is within 2e-6 * sum |w x| of the double dot of the dequantized
 * rows (its only roundings: one product and one sum per super-block). */
static void test_iq2_random(void) {
    static const int types[] = {TL_TYPE_IQ2_XXS, TL_TYPE_IQ2_XS, TL_TYPE_IQ2_S};
    static const uint16_t ds[] = {0x0001, 0x03ff, 0x3c00, 0x7bff, 0xfbff, 0x0000, 0x8000, 0x2e66};
    enum { NR = 9, NT = 4, NB = 8, N = NB * QK_K };
    for (int ti = 0; ti < 3; ti++) {
        const int type = types[ti];
        const size_t bsz = tl_type_info(type)->type_size, rw = tl_row_size(type, N), rx = tl_row_size(TL_TYPE_Q8_K, N);
        uint8_t *w = malloc(rw * NR), *x = malloc(rx * NT);
        float *xf = malloc(sizeof(float) * N);
        for (size_t i = 0; i < rw * NR; i++) w[i] = (uint8_t)rng_u64();
        for (int b = 0; b < NR * NB; b++) {
            uint16_t d = b % 9 == 8 ? tl_f32_to_f16(rng_gauss()) : ds[b % 9];
            if (b == 3) memset(w + bsz * b, 0xFF, bsz); /* every index, sign and scale bit set */
            memcpy(w + bsz * b, &d, 2);
        }
        for (int t = 0; t < NT; t++) {
            block_q8_K *y = (block_q8_K *)(x + rx * t);
            for (int i = 0; i < N; i++) xf[i] = t == 1 ? (rng_u64() & 1 ? 1.0f : -1.0f) : rng_gauss();
            tl_quantize_row(TL_TYPE_Q8_K, xf, y, N);
            if (t == 0)
                for (int b = 0; b < NB; b++)
                    for (int j = 0; j < QK_K; j++) y[b].qs[j] = (int8_t)rng_u64();
        }
        check_random_dots(type, N, w, NR, x, NT, 2e-6);
        free(w); free(x); free(xf);
    }
}

/* The iq2 quantizers on rows that must not go wrong: all zeros, a constant,
 * a lone value, tiny values (scales below half precision): finite
 * values, zeros exactly back, and the constant within the format's grain. */
static void test_iq2_edges(void) {
    static const int types[] = {TL_TYPE_IQ2_XXS, TL_TYPE_IQ2_XS, TL_TYPE_IQ2_S};
    enum { N = 2 * QK_K };
    float x[N], y[N];
    uint8_t q[N];
    for (int ti = 0; ti < 3; ti++) {
        const int type = types[ti];
        int nonfinite = 0, zeros_off = 0;
        double cerr = 0;
        for (int kind = 0; kind < 4; kind++) {
            for (int i = 0; i < N; i++)
                x[i] = kind == 0 ? 0.0f : kind == 1 ? -0.37f : kind == 2 ? (i == 77 ? 5.0f : 0.0f) : 1e-9f * rng_gauss();
            tl_quantize_row(type, x, q, N);
            tl_dequantize_row(type, q, y, N);
            for (int i = 0; i < N; i++) {
                nonfinite += !isfinite(y[i]);
                if (kind == 0) zeros_off += y[i] != 0.0f;
                if (kind == 1) cerr = fmax(cerr, fabs(y[i] - x[i]) / 0.37);
            }
        }
        CHECK(nonfinite == 0 && zeros_off == 0, "%s quantizes zero, constant, lone-value and tiny rows to finite values, "
              "zeros to zeros (%d non-finite, %d zeros off)", tl_type_info(type)->name, nonfinite, zeros_off);
        CHECK(cerr < 0.1, "%s keeps a constant row within 10%% (worst %.3f)", tl_type_info(type)->name, cerr);
    }
}

/* ------------------------------------------------- iq1_s / iq1_m blocks */

/* Sets a random-byte iq1 block's f16 d (iq1_m: the words' top nibbles). */
static void iq1_set_d(int type, uint8_t *blk, uint16_t d) {
    if (type == TL_TYPE_IQ1_S) {
        memcpy(blk, &d, 2);
        return;
    }
    uint16_t w[4];
    memcpy(w, blk + offsetof(block_iq1_m, scales), 8);
    for (int k = 0; k < 4; k++) w[k] = (uint16_t)((w[k] & 0x0FFF) | ((d >> (4 * k)) & 0xF) << 12);
    memcpy(blk + offsetof(block_iq1_m, scales), w, 8);
}

/* Hand-built blocks against the format's rules (gguf-py's IQ1_S / IQ1_M):
 * grid entry 2047 is all +1, entry 0 all -1, entry 1 (+1, -1 x 7); iq1_s
 * qh[ib] bits 0..11 the entries' high index bits, 12..14 ls, 15 the
 * delta's sign; iq1_m d in the scale words' top nibbles, ls per 16, delta
 * per 8 in bit 3 of each qh nibble. Then random bytes (any bits are a
 * valid block) with d finite, tiny, huge and 0, against q8_K rows of
 * Gaussians, of +-127, of random bytes (-128 included; bsums left
 * garbage: the kernels read qs only) and of -128: every level's vec_dot
 * and tile entries are bitwise the scalar reference, which is within
 * 2e-5 * sum |w x| of dequantized weights . dequantized activations. */
static void test_iq1_blocks(void) {
    const uint64_t rng_saved = rng_state; /* the per-type data after this stays as it was */
    /* the grid is the format's: 2048 distinct entries of levels 0..2, and
     * the FNV-1a hash of its bytes (element j of entry i at 8i + j) that
     * gguf-py's IQ1_S grid_hex gives */
    uint64_t h = 0xcbf29ce484222325ull;
    int bad_level = 0, dup = 0;
    for (int i = 0; i < TL_IQ1S_GRID_SIZE; i++) {
        for (int j = 0; j < 8; j++) {
            const unsigned v = (unsigned)(tl_iq1s_grid[i] >> (8 * j)) & 0xFF;
            bad_level += v > 2;
            h = (h ^ v) * 0x100000001b3ull;
        }
        dup += i > 0 && tl_iq1s_grid[i] <= tl_iq1s_grid[i - 1]; /* stored in increasing order */
    }
    CHECK(bad_level == 0 && dup == 0 && h == 0xec28b6368f0c62e0ull,
          "the iq1 grid is the format's (levels 0..2: %d bad; increasing: %d not; hash %016llx)", bad_level, dup,
          (unsigned long long)h);
    float got[QK_K], want[QK_K];
    block_iq1_s s;
    memset(&s, 0, sizeof s);
    s.d = 0x3800; /* 0.5 */
    s.qs[0] = 0xFF, s.qs[1] = 0x00, s.qs[4] = 0x01; /* ib 0: entries 2047, 0; ib 1: entry 1 */
    s.qh[0] = 7 | 3 << 12 | 0x8000;                 /* ls 3 (dl 3.5), delta -1/8 */
    int bad = 0;
    tl_dequantize_row(TL_TYPE_IQ1_S, &s, got, QK_K);
    for (int e = 0; e < QK_K; e++) {
        const int ib = e / 32, l = e % 32 / 8;
        const int g = ib == 0 ? (l == 0 ? 1 : -1) : ib == 1 && l == 0 && e % 8 == 0 ? 1 : -1;
        want[e] = ib == 0 ? 3.5f * (g - 0.125f) : 0.5f * (g + 0.125f);
    }
    for (int e = 0; e < QK_K; e++) bad += got[e] != want[e];
    CHECK(bad == 0 && got[0] == 3.0625f && got[8] == -3.9375f && got[32] == 0.5625f && got[33] == -0.4375f,
          "iq1_s dequantizes a hand-built block as the format says (%d wrong)", bad);
    check_block_dots("iq1_s", TL_TYPE_IQ1_S, &s, want);

    block_iq1_m m;
    memset(&m, 0, sizeof m);
    const uint16_t words[4] = {3 | 0x0 << 12, 0x0 << 12, 0x8 << 12, 0x3 << 12}; /* d 0x3800 = 0.5, ls0 3, ls1 0 */
    memcpy(m.scales, words, 8);
    m.qs[0] = 0xFF, m.qs[1] = 0x00, m.qs[2] = 0x01;
    m.qh[0] = 7 | 8;      /* entry 0: high bits 7, delta -1/8; entry 1: 0, +1/8 */
    m.qh[1] = 0x80;       /* entry 3: delta -1/8 */
    tl_dequantize_row(TL_TYPE_IQ1_M, &m, got, QK_K);
    for (int e = 0; e < QK_K; e++) {
        const int k = e / 8, g = k == 0 || (k == 2 && e % 8 == 0) ? 1 : -1;
        const float dl = k < 2 ? 3.5f : 0.5f, delta = k == 0 || k == 3 ? -0.125f : 0.125f;
        want[e] = dl * (g + delta);
    }
    bad = 0;
    for (int e = 0; e < QK_K; e++) bad += got[e] != want[e];
    CHECK(bad == 0 && got[0] == 3.0625f && got[8] == -3.0625f && got[16] == 0.5625f && got[24] == -0.5625f,
          "iq1_m dequantizes a hand-built block as the format says (%d wrong)", bad);
    check_block_dots("iq1_m", TL_TYPE_IQ1_M, &m, want);

    enum { NB = 3, NR = 8, NT = 5, N = NB * QK_K };
    static const uint16_t ds[] = {0x7BFF, 0x0001, 0x0000, 0x8400, 0x03FF}; /* 65504, 2^-24, 0, -2^-14, subnormal */
    const int types[2] = {TL_TYPE_IQ1_S, TL_TYPE_IQ1_M};
    for (int ti = 0; ti < 2; ti++) {
        const int type = types[ti];
        const size_t rw = tl_row_size(type, N), rx = tl_row_size(TL_TYPE_Q8_K, N), bs = tl_type_info(type)->type_size;
        uint8_t *w = malloc(rw * NR), *x = malloc(rx * NT);
        for (size_t i = 0; i < rw * NR; i++) w[i] = (uint8_t)rng_u64();
        for (int b = 0; b < NB * NR; b++)
            iq1_set_d(type, w + bs * b, b < 5 ? ds[b] : tl_f32_to_f16(rng_gauss() * 0.01f));
        for (int t = 0; t < NT; t++) {
            float src[N];
            for (int i = 0; i < N; i++) src[i] = t == 0 ? rng_gauss() : rng_gauss() < 0 ? -1.0f : 1.0f;
            block_q8_K *y = (block_q8_K *)(x + rx * t);
            tl_quantize_row(TL_TYPE_Q8_K, src, y, N);
            if (t >= 2)
                for (int b = 0; b < NB; b++) {
                    for (int i = 0; i < QK_K; i++) y[b].qs[i] = t == 4 ? -128 : (int8_t)rng_u64();
                    for (int j = 0; j < 16; j++) y[b].bsums[j] = (int16_t)rng_u64();
                    y[b].d = t == 4 ? 1.0f : 0.0123f;
                }
        }
        check_random_dots(type, N, w, NR, x, NT, 2e-5);
        free(w); free(x);
    }

    /* the quantizer: all-zero and constant rows come back finite (zero stays zero) */
    for (int ti = 0; ti < 2; ti++) {
        float src[QK_K], back[QK_K];
        uint8_t blk[64];
        int nonfinite = 0, nonzero = 0;
        for (int c = 0; c < 3; c++) {
            for (int i = 0; i < QK_K; i++) src[i] = c == 0 ? 0.0f : c == 1 ? 0.75f : -1e-3f;
            tl_quantize_row(types[ti], src, blk, QK_K);
            tl_dequantize_row(types[ti], blk, back, QK_K);
            for (int i = 0; i < QK_K; i++) nonfinite += !isfinite(back[i]), nonzero += c == 0 && back[i] != 0;
            if (c > 0) CHECK(fabsf(back[7] - src[7]) <= 0.1f * fabsf(src[7]), "%s constant row %g comes back as %g",
                             tl_type_info(types[ti])->name, src[7], back[7]);
        }
        CHECK(nonfinite == 0 && nonzero == 0, "%s all-zero and constant rows quantize to finite values, zero to zero",
              tl_type_info(types[ti])->name);
    }
    rng_state = rng_saved;
}

/* ------------------------------------------------------ iq3_xxs, iq3_s */

/* h = 31 h + entry over a grid (the values were checked equal to ggml's
 * iq3xxs_grid / iq3s_grid entry by entry when the tables were generated). */
static uint32_t grid_hash(const uint32_t *g, int n) {
    uint32_t h = 0;
    for (int i = 0; i < n; i++) h = h * 31 + g[i];
    return h;
}

/* nb blocks of random bytes, each d (the first two bytes of both types) a
 * random finite half: subnormals up to 65504, either sign. */
static void iq3_random_blocks(int type, uint8_t *w, int nb) {
    const size_t bs = tl_type_info(type)->type_size;
    for (size_t i = 0; i < bs * (size_t)nb; i++) w[i] = (uint8_t)rng_u64();
    for (int b = 0; b < nb; b++) {
        uint16_t d;
        do d = (uint16_t)rng_u64(); while (((d >> 10) & 31) == 31);
        memcpy(w + bs * (size_t)b, &d, 2);
    }
}

static void test_iq3(void) {
    const uint64_t rng_saved = rng_state; /* the later tests' data as without this test */
    CHECK(grid_hash(tl_iq3xxs_grid, 256) == 0xeeeadeb6u && grid_hash(tl_iq3s_grid, 512) == 0x87034186u &&
              tl_iq3xxs_grid[0] == 0x04040404u && tl_iq3xxs_grid[255] == 0x3e341c04u &&
              tl_iq3s_grid[0] == 0x01010101u && tl_iq3s_grid[511] == 0x0f0f0101u,
          "the iq3_xxs and iq3_s grids hold the format's values");

    /* hand-built blocks, d = 1 (every value exact in float): iq3_xxs
     * element 8l + k of sub-block ib is (0.5 + s) / 2 * level, negative
     * where bit k of the group's 7-bit sign index is set, element 7 where
     * that index has odd parity; iq3_s's (1 + 2s) * level with the 9th
     * index bit from qh and the sign from its own bit */
    float want[QK_K], got[QK_K];
    block_iq3_xxs bx;
    memset(&bx, 0, sizeof bx);
    bx.d = 0x3C00;
    for (int ib = 0; ib < 8; ib++) {
        const int sc = (ib * 5 + 3) % 16;
        uint32_t aux = (uint32_t)sc << 28;
        for (int g = 0; g < 8; g++) bx.qs[8 * ib + g] = (uint8_t)(37 * (8 * ib + g) + 11);
        for (int l = 0; l < 4; l++) aux |= (uint32_t)((ib * 29 + l * 53 + 3) & 127) << (7 * l);
        memcpy(bx.qs + 64 + 4 * ib, &aux, 4);
        for (int e = 0; e < 32; e++) {
            const unsigned s7 = (aux >> (7 * (e / 8))) & 127, k = e % 8;
            const int neg = k < 7 ? (s7 >> k) & 1 : __builtin_parity(s7);
            const int level = (tl_iq3xxs_grid[bx.qs[8 * ib + e / 4]] >> (8 * (e % 4))) & 255;
            want[32 * ib + e] = (0.5f + sc) * 0.5f * level * (neg ? -1 : 1);
        }
    }
    tl_dequantize_row(TL_TYPE_IQ3_XXS, &bx, got, QK_K);
    int bad = 0;
    for (int e = 0; e < QK_K; e++) bad += got[e] != want[e];
    CHECK(bad == 0, "iq3_xxs dequantizes a hand-built block exactly (%d wrong)", bad);
    check_block_dots("iq3_xxs", TL_TYPE_IQ3_XXS, &bx, want);
    block_iq3_s bs;
    bs.d = 0x3C00;
    for (int j = 0; j < 64; j++) bs.qs[j] = (uint8_t)(91 * j + 5);
    for (int j = 0; j < 8; j++) bs.qh[j] = (uint8_t)(37 * j + 0x5A);
    for (int j = 0; j < 32; j++) bs.signs[j] = (uint8_t)(73 * j + 1);
    for (int j = 0; j < 4; j++) bs.scales[j] = (uint8_t)(0x37 * j + 0x1E);
    for (int e = 0; e < QK_K; e++) {
        const int ib = e / 32, g = e % 32 / 4, sc = (bs.scales[ib / 2] >> (4 * (ib % 2))) & 15;
        const int idx = bs.qs[8 * ib + g] | ((bs.qh[ib] >> g) & 1) << 8;
        const int level = (tl_iq3s_grid[idx] >> (8 * (e % 4))) & 255;
        want[e] = (float)((1 + 2 * sc) * level * ((bs.signs[e / 8] >> (e % 8)) & 1 ? -1 : 1));
    }
    tl_dequantize_row(TL_TYPE_IQ3_S, &bs, got, QK_K);
    bad = 0;
    for (int e = 0; e < QK_K; e++) bad += got[e] != want[e];
    CHECK(bad == 0, "iq3_s dequantizes a hand-built block exactly (%d wrong)", bad);
    check_block_dots("iq3_s", TL_TYPE_IQ3_S, &bs, want);

    /* random-byte rows x q8_K rows (Gaussian, all +127, alternating +-127) */
    enum { NB = 12, N = NB * QK_K, NR = 6, NT = 3 };
    const int types[2] = {TL_TYPE_IQ3_XXS, TL_TYPE_IQ3_S};
    const size_t rx = tl_row_size(TL_TYPE_Q8_K, N);
    uint8_t *x = malloc(rx * NT);
    float *wf = malloc(sizeof(float) * N), *xf = malloc(sizeof(float) * N);
    for (int t = 0; t < NT; t++) {
        for (int i = 0; i < N; i++) xf[i] = t == 0 ? rng_gauss() : t == 1 ? 1.0f : (i % 2 ? -1.0f : 1.0f);
        tl_quantize_row_ref(TL_TYPE_Q8_K, xf, x + rx * t, N);
    }
    for (int ti = 0; ti < 2; ti++) {
        const int type = types[ti];
        const size_t rw = tl_row_size(type, N);
        uint8_t *w = malloc(rw * NR);
        iq3_random_blocks(type, w, NB * NR);
        check_random_dots(type, N, w, NR, x, NT, 1e-5);
        const char *name = tl_type_info(type)->name;

        /* zeros, constants and a wide range quantize to finite values */
        static const float consts[] = {0.0f, -0.0f, 0.37f, -2.5e-3f, 1e4f};
        int nonfinite = 0, off = 0;
        for (size_t c = 0; c <= sizeof consts / sizeof consts[0]; c++) {
            for (int i = 0; i < 2 * QK_K; i++)
                xf[i] = c < sizeof consts / sizeof consts[0] ? consts[c] : (i == 77 ? 3e4f : 1e-3f * rng_gauss());
            tl_quantize_row(type, xf, w, 2 * QK_K);
            tl_dequantize_row(type, w, wf, 2 * QK_K);
            for (int i = 0; i < 2 * QK_K; i++) {
                nonfinite += !isfinite(wf[i]);
                if (c < sizeof consts / sizeof consts[0]) off += !(fabsf(wf[i] - xf[i]) <= 1e-3f * fabsf(xf[i]));
            }
        }
        CHECK(nonfinite == 0 && off == 0, "%s quantizes zero and constant rows within 1e-3 and wide rows finite (%d "
              "non-finite, %d off)", name, nonfinite, off);
        free(w);
    }
    free(x); free(wf); free(xf);
    rng_state = rng_saved;
}

int main(void) {
    tl_kernels_init();
    isa_max = tl_kernels_isa();
    printf("ISA levels tested: scalar..%s\n", tl_isa_name(isa_max));
    test_iq2_hand();
    test_iq2_random();
    test_iq2_edges();
    test_iq1_blocks();
    test_iq3();
    return test_summary();
}
