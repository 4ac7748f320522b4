/* test_forward_ops.c - the forward pass's element-wise ops against their
 * scalar definitions, bit for bit (the vector loops must not change a
 * token: greedy output is compared with llama.cpp's).
 *
 *   rope     tl_rope_apply with tl_rope_table's pairs is bitwise tl_rope
 *            (one angle at a time, ggml's order) for NORM and NEOX pairs,
 *            n_rot 2..130 (whole vectors and tails), positions 0..70000,
 *            with and without frequency factors, rows with an inf and a
 *            NaN; elements past n_rot untouched; unscaled, linearly
 *            scaled and with an attn_factor.
 *   scaling  freq_scale 1/2 at position 2p is position p, attn_factor 2
 *            doubles the rotation (exact, so bitwise).
 *   yarn     the ramp's ends are the unscaled and the scaled rotations.
 *   rmsnorm  tl_rmsnorm is (x * scale) * w per element with scale from the
 *            double sum of squares, n 1..70, in place and not.
 *   add      tl_add_f32 is x[i] += o[i], n 0..37. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "forward_ops.h"
#include "model.h"
#include "quants.h"
#include "test.h"

static uint64_t rng = 0x243F6A8885A308D3ull;

static float gauss(void) { return test_gauss(&rng); }

/* Bitwise equality, where NaN equals a NaN. */
static int same(const float *a, const float *b, int n) {
    for (int i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof a[i]) && !(isnan(a[i]) && isnan(b[i]))) return 0;
    return 1;
}

static void test_rope(void) {
    float ff[65], cs[130], x[140], y[140];
    for (int i = 0; i < 65; i++) ff[i] = 1.0f + (float)(i % 7) * 0.5f;
    static const int pos[] = {0, 1, 17, 511, 4095, 70000};
    static const tl_rope_params rps[] = {
        {.base = 10000.0f, .freq_scale = 1.0f, .attn_factor = 1.0f},
        {.base = 1e6f, .freq_scale = 0.125f, .attn_factor = 1.0f},
        {.base = 500000.0f, .freq_scale = 0.3f, .attn_factor = 1.1f},
        {.base = 10000.0f, .freq_scale = 0.25f, .attn_factor = 1.2f, .ext_factor = 1.0f, .corr_lo = 3.0f, .corr_hi = 20.0f},
    };
    for (size_t r = 0; r < sizeof rps / sizeof rps[0]; r++)
        for (int type = 0; type < 2; type++) {
            const int rt = type ? TL_ROPE_NEOX : TL_ROPE_NORM;
            int bad = 0;
            for (int n_rot = 2; n_rot <= 130; n_rot += 2)
                for (size_t p = 0; p < sizeof pos / sizeof pos[0]; p++)
                    for (int f = 0; f < 2; f++) {
                        for (int i = 0; i < 140; i++) x[i] = 4.0f * gauss();
                        if (p == 2) x[n_rot / 2] = INFINITY, x[0] = NAN;
                        memcpy(y, x, sizeof x);
                        tl_rope_table(cs, pos[p], n_rot, &rps[r], f ? ff : NULL);
                        tl_rope_apply(x, cs, n_rot, rt);
                        tl_rope(y, pos[p], n_rot, &rps[r], rt, f ? ff : NULL);
                        bad += !same(x, y, 140);
                    }
            CHECK(bad == 0, "rope %s, base %g scale %g attn %g ext %g: the table's rotation is bitwise tl_rope's (%d differ)",
                  type ? "neox" : "norm", rps[r].base, rps[r].freq_scale, rps[r].attn_factor, rps[r].ext_factor, bad);
        }
}

/* Linear scaling by 1/2 turns position 2p by position p's angles, and an
 * attn_factor of 2 doubles the rotated head: both exact in float (powers
 * of two), so bitwise, which pins where the scale and the factor enter. */
static void test_rope_scaling(void) {
    float ff[64], x[128], y[128], z[128];
    for (int i = 0; i < 64; i++) ff[i] = 1.0f + (float)(i % 5) * 0.75f;
    const tl_rope_params plain = {.base = 10000.0f, .freq_scale = 1.0f, .attn_factor = 1.0f},
                         half = {.base = 10000.0f, .freq_scale = 0.5f, .attn_factor = 1.0f},
                         twice = {.base = 10000.0f, .freq_scale = 1.0f, .attn_factor = 2.0f};
    int bad_scale = 0, bad_attn = 0, same_plain = 0;
    for (int type = 0; type < 2; type++)
        for (int f = 0; f < 2; f++)
            for (int p = 1; p < 3000; p += 37) {
                const int rt = type ? TL_ROPE_NEOX : TL_ROPE_NORM;
                for (int i = 0; i < 128; i++) x[i] = 4.0f * gauss();
                memcpy(y, x, sizeof x);
                memcpy(z, x, sizeof x);
                tl_rope(x, 2 * p, 128, &half, rt, f ? ff : NULL);
                tl_rope(y, p, 128, &plain, rt, f ? ff : NULL);
                bad_scale += !same(x, y, 128);
                tl_rope(z, 2 * p, 128, &plain, rt, f ? ff : NULL);
                same_plain += same(x, z, 128);
                for (int i = 0; i < 128; i++) z[i] = y[i] = 4.0f * gauss();
                tl_rope(y, p, 128, &twice, rt, f ? ff : NULL);
                tl_rope(z, p, 128, &plain, rt, f ? ff : NULL);
                for (int i = 0; i < 128; i++) bad_attn += y[i] != 2.0f * z[i];
            }
    CHECK(bad_scale == 0 && same_plain == 0, "freq_scale 1/2 at 2p is bitwise position p (%d differ), and not 2p (%d same)",
          bad_scale, same_plain);
    CHECK(bad_attn == 0, "attn_factor 2 doubles the rotation exactly (%d elements differ)", bad_attn);
}

/* YaRN's ramp: pairs up to corr_lo turn by the unscaled angle, pairs from
 * corr_hi on by the linearly scaled one (mix 1 and 0: exact), and the
 * pairs between by neither. */
static void test_rope_yarn(void) {
    const tl_rope_params plain = {.base = 10000.0f, .freq_scale = 1.0f, .attn_factor = 1.0f},
                         lin = {.base = 10000.0f, .freq_scale = 0.25f, .attn_factor = 1.0f},
                         yarn = {.base = 10000.0f, .freq_scale = 0.25f, .attn_factor = 1.0f, .ext_factor = 1.0f,
                                 .corr_lo = 4.0f, .corr_hi = 10.0f};
    float x[64], a[64], b[64], c[64];
    int bad = 0, between_same = 0;
    for (int p = 1; p < 5000; p += 97) {
        for (int i = 0; i < 64; i++) x[i] = 4.0f * gauss();
        memcpy(a, x, sizeof x);
        memcpy(b, x, sizeof x);
        memcpy(c, x, sizeof x);
        tl_rope(a, p, 64, &yarn, TL_ROPE_NORM, NULL);
        tl_rope(b, p, 64, &plain, TL_ROPE_NORM, NULL);
        tl_rope(c, p, 64, &lin, TL_ROPE_NORM, NULL);
        for (int i = 0; i < 32; i++) {
            const float *want = i <= 4 ? b : i >= 10 ? c : NULL;
            if (want)
                bad += memcmp(a + 2 * i, want + 2 * i, 2 * sizeof(float)) != 0;
            else
                between_same += !memcmp(a + 2 * i, b + 2 * i, 8) || !memcmp(a + 2 * i, c + 2 * i, 8);
        }
    }
    CHECK(bad == 0, "YaRN: pairs <= corr_lo are unscaled, pairs >= corr_hi linearly scaled, bitwise (%d differ)", bad);
    CHECK(between_same == 0, "YaRN: the pairs between blend the two (%d equal one of them)", between_same);
}

static void test_rmsnorm(void) {
    float x[70], w[70], out[70], ref[70];
    for (int n = 1; n <= 70; n++)
        for (int inplace = 0; inplace < 2; inplace++) {
            for (int i = 0; i < n; i++) x[i] = 3.0f * gauss(), w[i] = 1.0f + 0.2f * gauss();
            const float scale = 1.0f / sqrtf((float)(tl_sum_sq(x, n) / n) + 1e-5f);
            for (int i = 0; i < n; i++) ref[i] = (x[i] * scale) * w[i];
            float *o = inplace ? x : out;
            tl_rmsnorm(o, x, w, n, 1e-5f);
            CHECK(same(o, ref, n), "rmsnorm n %d%s: (x * scale) * w per element, bitwise", n, inplace ? " in place" : "");
        }
}

static void test_add(void) {
    float x[40], o[40], ref[40];
    for (int n = 0; n <= 37; n++) {
        for (int i = 0; i < 40; i++) x[i] = gauss(), o[i] = gauss(), ref[i] = x[i];
        for (int i = 0; i < n; i++) ref[i] += o[i];
        tl_add_f32(x, o, n);
        CHECK(same(x, ref, 40), "add n %d: x[i] += o[i] for i < n, nothing past", n);
    }
}

int main(void) {
    tl_kernels_init();
    test_rope();
    test_rope_scaling();
    test_rope_yarn();
    test_rmsnorm();
    test_add();
    return test_summary();
}
