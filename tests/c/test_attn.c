/* test_attn.c - attention's score kernels at every ISA level.
 *
 *   order    tl_dot_rows_f32 (f32 and f16 rows, 0..33 rows, n = 8 .. 264,
 *            scale applied) is bitwise the level's stated score order:
 *            tl_dot_f32(q, row) * scale, or at AVX-512 one FMA chain per
 *            lane then hsum512's tree (score_chain_ref below writes it out
 *            in scalar C), and within 1e-5 * sum |q_i k_i| of the exact
 *            dot product at every level.
 *   panels   where a level has them, K rows transposed into panels (from
 *            f32 and f16 rows, 1..33 rows: whole and partial panels) and
 *            scored for 1..9 queries give bitwise tl_dot_rows_f32 of each
 *            pair, write nothing past the rows asked for, and fill exactly
 *            tl_attn_panels_floats floats.
 *   v8       int8 V sums (q8 V rows, 1..16 of a piece, windows [r0, r1),
 *            1..6 queries, head dims 32..256, weights from one-hot to
 *            flat, a zero, a NaN and a negative row scale): every level
 *            bitwise the scalar level, nothing written outside each
 *            query's head, and within 1/255 of the weights' mass times the
 *            largest |value| of the exact f32 sum (u8 weights per piece). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "quants.h"
#include "test.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static float gauss(void) { return test_gauss(&rng); }

/* The AVX-512 score order, element by element: lane j chains the products
 * of elements j, j+16, ... (a multiply, then FMAs); lanes pair as
 * ((j, j+8), (j+4, j+12)) for j < 4, then (0, 2) + (1, 3); times scale. */
static float score_chain_ref(const float *q, const float *k, int n, float scale) {
    float L[16];
    for (int j = 0; j < 16; j++) {
        L[j] = j < n ? q[j] * k[j] : 0.0f;
        for (int d = j + 16; d < n; d += 16) L[j] = fmaf(q[d], k[d], L[j]);
    }
    float quad[4];
    for (int i = 0; i < 4; i++) quad[i] = (L[i] + L[i + 8]) + (L[i + 4] + L[i + 12]);
    const float sum = (quad[0] + quad[2]) + (quad[1] + quad[3]);
    return sum * scale;
}

enum { MAXN = 264, MAXROWS = 33, MAXQ = 9 };
static float q[MAXQ][MAXN], k[MAXROWS * (MAXN + 16)], kw[MAXROWS * (MAXN + 16)];
static uint16_t kh[MAXROWS * (MAXN + 16)];

static void test_order(void) {
    static const int ns[] = {8, 16, 32, 40, 64, 72, 128, 256, 264};
    static float o[MAXROWS];
    const int isa_max = tl_kernels_isa();
    for (int lvl = 0; lvl <= isa_max; lvl++) {
        tl_kernels_set_isa(lvl);
        int bad = 0, far = 0, cases = 0;
        for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
            for (int rows = 0; rows <= MAXROWS; rows++) {
                const int n = ns[ni];
                tl_dot_rows_f32(q[0], k, (size_t)n, rows, n, 0.125f, o);
                for (int r = 0; r < rows; r++, cases++) {
                    const float *kr = k + (size_t)r * n;
                    const float want = lvl >= TL_ISA_AVX512 ? score_chain_ref(q[0], kr, n, 0.125f)
                                                            : tl_dot_f32(q[0], kr, n) * 0.125f;
                    bad += memcmp(&o[r], &want, sizeof want) != 0;
                    double exact = 0, mag = 0;
                    for (int i = 0; i < n; i++) {
                        exact += (double)q[0][i] * kr[i];
                        mag += fabs((double)q[0][i] * kr[i]);
                    }
                    far += fabs(o[r] / 0.125 - exact) > 1e-5 * mag + 1e-30;
                }
            }
        CHECK(bad == 0, "%s dot_rows is bitwise the level's score order (%d of %d scores differ)", tl_isa_name(lvl),
              bad, cases);
        CHECK(far == 0, "%s dot_rows within 1e-5 * sum |q k| of the exact dot (%d of %d off)", tl_isa_name(lvl), far,
              cases);
    }
    tl_kernels_set_isa(isa_max);
}

static void test_panels(void) {
    static const int ns[] = {16, 32, 64, 80, 128, 256};
    static float kp[((MAXROWS + 15) / 16) * 16 * MAXN + 16], out[MAXQ][MAXROWS + 16], want[MAXROWS];
    const float guard = -12345.0f;
    const int isa_max = tl_kernels_isa();
    for (int lvl = 0; lvl <= isa_max; lvl++) {
        tl_kernels_set_isa(lvl);
        int bad = 0, spill = 0, cases = 0, size_bad = 0;
        for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
            const int n = ns[ni];
            if (!tl_attn_has_panels(n)) continue;
            for (int rows = 1; rows <= MAXROWS; rows++)
                for (int f16 = 0; f16 <= 1; f16++) {
                    const size_t ld = (size_t)n + 16, floats = tl_attn_panels_floats(rows, n);
                    if (f16) {
                        tl_f32_to_f16_row(k, kh, (int64_t)rows * (int64_t)ld);
                        tl_f16_to_f32_row(kh, kw, (int64_t)rows * (int64_t)ld);
                    } else {
                        memcpy(kw, k, sizeof(float) * (size_t)rows * ld);
                    }
                    for (size_t i = 0; i < sizeof kp / sizeof kp[0]; i++) kp[i] = guard;
                    if (f16) tl_attn_k_panels_f16(kh, ld, rows, n, kp);
                    else tl_attn_k_panels_f32(kw, ld, rows, n, kp);
                    size_bad += floats != (size_t)((rows + 15) / 16) * 16 * n || kp[floats] != guard ||
                                kp[floats - 1] == guard;
                    for (int nq = 1; nq <= MAXQ; nq++) {
                        const float *qp[MAXQ];
                        float *op[MAXQ];
                        for (int i = 0; i < nq; i++) {
                            qp[i] = q[i];
                            op[i] = out[i];
                            for (int r = 0; r < MAXROWS + 16; r++) out[i][r] = guard;
                        }
                        tl_attn_scores_panels(nq, qp, kp, rows, n, 0.125f, op);
                        for (int i = 0; i < nq; i++) {
                            tl_dot_rows_f32(q[i], kw, ld, rows, n, 0.125f, want);
                            bad += memcmp(out[i], want, sizeof(float) * (size_t)rows) != 0;
                            for (int r = rows; r < MAXROWS + 16; r++) spill += out[i][r] != guard;
                            cases++;
                        }
                    }
                }
        }
        if (!cases) continue;
        CHECK(bad == 0, "%s panel scores are bitwise dot_rows (%d of %d query rows differ)", tl_isa_name(lvl), bad,
              cases);
        CHECK(spill == 0, "%s panel scores write nothing past the rows (%d cells)", tl_isa_name(lvl), spill);
        CHECK(size_bad == 0, "%s K panels fill exactly tl_attn_panels_floats floats (%d cases off)", tl_isa_name(lvl),
              size_bad);
    }
    tl_kernels_set_isa(isa_max);
}

/* A q8_0 row of n values (one f16 scale and 32 int8 per group). */
static void q8_row(uint8_t *row, int n, float amp) {
    for (int g = 0; g < n / 32; g++, row += 34) {
        const uint16_t d = tl_f32_to_f16(amp * (0.5f + fabsf(gauss())) / 127.0f);
        memcpy(row, &d, 2);
        for (int e = 0; e < 32; e++) row[2 + e] = (uint8_t)(int8_t)((int)(gauss() * 50.0f) % 128);
    }
}

static void test_v8(void) {
    enum { HD = 256, RB = HD / 32 * 34, NQ = 6 };
    static uint8_t v[16 * RB];
    static float w[NQ][16], y[NQ][HD + 16], want[NQ][HD + 16];
    static uint8_t piece[HD / 32 * 576], piece_ref[HD / 32 * 576];
    const int isa_max = tl_kernels_isa();
    static const int hds[] = {32, 64, 128, 256};
    int bad = 0, prep_bad = 0, far = 0, past = 0, cases = 0;
    for (int it = 0; it < 400; it++) {
        const int hd = hds[it % 4], rows = 1 + it % 16, nq = 1 + it % NQ;
        const int r0 = it % 3 == 0 ? 0 : (it / 3) % rows, r1 = r0 + 1 + (it / 7) % (rows - r0);
        for (int r = 0; r < 16; r++) q8_row(v + (size_t)r * RB, hd, 1.0f + (float)(r % 5));
        if (it % 17 == 5) { /* a row with a zero scale, one with NaN, one negative */
            const uint16_t z = 0, nan = 0x7e00, neg = tl_f32_to_f16(-0.01f);
            memcpy(v + (size_t)r0 * RB, &z, 2);
            memcpy(v + (size_t)(r1 - 1) * RB + (hd > 32 ? 34 : 0), &nan, 2);
            if (r1 - r0 > 2) memcpy(v + (size_t)(r0 + 1) * RB, &neg, 2);
        }
        for (int qi = 0; qi < nq; qi++)
            for (int r = 0; r < 16; r++) { /* softmax-like: one-hot, peaked, flat */
                const int shape = (it + qi) % 3;
                w[qi][r] = shape == 0 ? (r == r0 ? 1.0f : 1e-7f) : shape == 1 ? expf(4.0f * gauss()) / 64.0f : 1.0f / 4096.0f;
            }
        float *ys[NQ];
        const float *as[NQ];
        for (int qi = 0; qi < nq; qi++) ys[qi] = y[qi], as[qi] = w[qi];
        for (int lvl = 0; lvl <= isa_max; lvl++) {
            tl_kernels_set_isa(lvl);
            for (int qi = 0; qi < nq; qi++)
                for (int d = 0; d < HD + 16; d++) y[qi][d] = d < hd ? 0.25f * (float)(d % 7) : -777.0f;
            memset(piece, 0xAB, sizeof piece);
            tl_attn_v8_prep(v, RB, rows, hd, piece);
            tl_attn_v8_sum(nq, ys, as, piece, r0, r1, hd);
            if (lvl == 0) {
                memcpy(want, y, sizeof y);
                memcpy(piece_ref, piece, tl_attn_v8_bytes(hd));
            } else {
                bad += memcmp(want, y, sizeof y) != 0;
                prep_bad += memcmp(piece_ref, piece, tl_attn_v8_bytes(hd)) != 0;
            }
            for (int qi = 0; qi < nq; qi++)
                for (int d = hd; d < HD + 16; d++) past += y[qi][d] != -777.0f;
        }
        if (it % 17 == 5) continue; /* (no exact sum to compare with) */
        for (int qi = 0; qi < nq; qi++)
            for (int g = 0; g < hd / 32; g++) {
                double mass = 0, vmax = 0;
                for (int r = r0; r < r1; r++) {
                    const uint8_t *row = v + (size_t)r * RB + g * 34;
                    uint16_t dh;
                    memcpy(&dh, row, 2);
                    mass += w[qi][r];
                    for (int e = 0; e < 32; e++) vmax = fmax(vmax, fabs(tl_f16_to_f32(dh) * (int8_t)row[2 + e]));
                }
                for (int e = 0; e < 32; e++, cases++) {
                    double exact = 0.25 * ((g * 32 + e) % 7);
                    for (int r = r0; r < r1; r++) {
                        const uint8_t *row = v + (size_t)r * RB + g * 34;
                        uint16_t dh;
                        memcpy(&dh, row, 2);
                        exact += (double)w[qi][r] * tl_f16_to_f32(dh) * (int8_t)row[2 + e];
                    }
                    far += !(fabs(want[qi][g * 32 + e] - exact) <= mass * vmax / 255.0 + 1e-6);
                }
            }
    }
    tl_kernels_set_isa(isa_max);
    CHECK(bad == 0 && prep_bad == 0, "int8 V sums are bitwise the scalar level's at every level (%d sums, %d pieces differ)",
          bad, prep_bad);
    CHECK(past == 0, "int8 V sums write nothing past the head (%d)", past);
    CHECK(far == 0, "int8 V sums are within mass * max|v| / 255 of the exact sum (%d of %d far)", far, cases);
}

int main(void) {
    for (int i = 0; i < MAXQ; i++)
        for (int j = 0; j < MAXN; j++) q[i][j] = gauss();
    for (int i = 0; i < MAXROWS * (MAXN + 16); i++) k[i] = gauss();
    test_order();
    test_panels();
    test_v8();
    return test_summary();
}
