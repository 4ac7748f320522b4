/* test_quants.c - weight types: half/bfloat conversions, ggml block layouts,
 * quantize round trips, and every vec_dot kernel at every ISA level against
 * the "dequantize both, dot in double" reference. Ends with an informational
 * GB/s table (weight bytes streamed by a matvec), no thresholds.
 *
 * Tolerances (stated per check below):
 *   round trip     sum (x-x')^2 / sum x^2 under a per-type bound (table)
 *   vec_dot        |got - ref| / sum |w_i x_i| <= 2e-5 against the double
 *                  reference on the dequantized rows (any ISA)
 *   SIMD vs scalar |simd - scalar| / sum |w_i x_i| <= 1e-5 float types,
 *                  1e-5 quants (integer block dots are exact; only the
 *                  float accumulation order differs)
 *   Q8_0/Q8_K      SIMD activation quantization byte-identical to scalar
 *   fp16           exhaustive round trip; f32->f16 equal to a nearest-even
 *                  search over all half values, and to every SIMD row path
 *   i-quants       their own checks: test_iquants.c
 *   iq1_s / iq1_m  the grid's hash is gguf-py's; hand-built blocks decode as
 *                  the format says; random-byte blocks (extreme d, -128
 *                  activations): every level bitwise the scalar dot, which
 *                  is within 2e-5 of the dequantized rows' */
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quants.h"
#include "quants_impl.h"
#include "quants_check.h"
#include "test.h"
#include "util.h"

/* Gaussian data with some structure real weights have: per-32 offsets
 * (exercise the mins), a few outliers, and one all-zero block. */
static void fill_data(float *x, int64_t n, int with_zero_block) {
    for (int64_t i = 0; i < n; i++) x[i] = rng_gauss();
    for (int64_t b = 0; b + 32 <= n; b += 32) {
        const float off = (b / 32) % 3 == 1 ? 0.7f * rng_gauss() : 0.0f;
        const float sc = 0.5f + (float)rng_unif();
        for (int j = 0; j < 32; j++) x[b + j] = x[b + j] * sc + off;
    }
    if (n >= 64) x[n / 2] *= 6.0f;
    if (with_zero_block && n >= 512) memset(x + 256, 0, 32 * sizeof(float));
}

static const int weight_types[] = {TL_TYPE_F32,  TL_TYPE_F16,  TL_TYPE_BF16, TL_TYPE_Q4_0, TL_TYPE_Q4_1,
                                   TL_TYPE_Q5_0, TL_TYPE_Q5_1, TL_TYPE_Q8_0, TL_TYPE_IQ4_NL, TL_TYPE_IQ4_XS, TL_TYPE_Q2_K, TL_TYPE_Q3_K,
                                   TL_TYPE_Q4_K, TL_TYPE_Q5_K, TL_TYPE_Q6_K, TL_TYPE_IQ2_XXS, TL_TYPE_IQ2_XS, TL_TYPE_IQ2_S,
                                   TL_TYPE_IQ1_S, TL_TYPE_IQ1_M, TL_TYPE_IQ3_XXS, TL_TYPE_IQ3_S};
#define N_WTYPES ((int)(sizeof weight_types / sizeof weight_types[0]))

/* Round-trip bounds: about 1.5x the worst the quantizers measure on
 * fill_data (the 6-sigma outlier dominates the 32-element types at n=96). */
static double rt_bound(int type) {
    switch (type) {
    case TL_TYPE_F32: return 0.0;
    case TL_TYPE_F16: return 1e-7;
    case TL_TYPE_BF16: return 1e-5;
    case TL_TYPE_Q8_0: return 1.2e-4;
    case TL_TYPE_Q4_0: return 5e-2;
    case TL_TYPE_Q4_1: return 1.2e-2;
    case TL_TYPE_Q5_0: return 7e-3;
    case TL_TYPE_Q5_1: return 3e-3;
    case TL_TYPE_IQ4_NL: return 1.1e-2;
    case TL_TYPE_IQ4_XS: return 1.5e-2;
    case TL_TYPE_Q2_K: return 1.1e-1;
    case TL_TYPE_Q3_K: return 5e-2;
    case TL_TYPE_IQ3_XXS: return 5e-2;
    case TL_TYPE_IQ3_S: return 3e-2;
    case TL_TYPE_Q4_K: return 8e-3;
    case TL_TYPE_Q5_K: return 2e-3;
    case TL_TYPE_Q6_K: return 8e-4;
    /* iq1: 0.208 / 0.178 on this data, at worst 0.327 / 0.249 over 200
     * seeds of it (ggml's quantizer with a unit imatrix: 0.445 / 0.301) */
    case TL_TYPE_IQ1_S: return 0.4;
    case TL_TYPE_IQ1_M: return 0.3;
    case TL_TYPE_IQ2_XXS: return 1.9e-1;
    case TL_TYPE_IQ2_XS: return 1.6e-1;
    case TL_TYPE_IQ2_S: return 1.4e-1;
    default: return 0.0;
    }
}

/* ------------------------------------------------------------- halves */

static double half_value(uint16_t h) {
    const int e = (h >> 10) & 31, m = h & 1023;
    const double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    return (h & 0x8000) ? -v : v;
}

/* Nearest half by search over all finite magnitudes, ties to even. */
static uint16_t ref_f32_to_f16(float f) {
    const uint16_t sign = signbit(f) ? 0x8000 : 0;
    const double a = fabs((double)f);
    if (isnan(f)) return 0x7e00;
    if (a >= 65520.0) return sign | 0x7c00;
    int lo = 0, hi = 0x7bff;
    while (lo < hi) { /* largest h with value(h) <= a */
        const int mid = (lo + hi + 1) / 2;
        if (half_value((uint16_t)mid) <= a) lo = mid;
        else hi = mid - 1;
    }
    const double vlo = half_value((uint16_t)lo), vhi = lo == 0x7bff ? 65536.0 : half_value((uint16_t)(lo + 1));
    uint16_t h;
    if (a - vlo < vhi - a) h = (uint16_t)lo;
    else if (a - vlo > vhi - a) h = (uint16_t)(lo + 1);
    else h = (uint16_t)((lo & 1) ? lo + 1 : lo);
    return sign | h;
}

static float bits_f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t f_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static void test_halves(void) {
    int bad_val = 0, bad_rt = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        const float f = tl_f16_to_f32((uint16_t)h);
        const int e = (h >> 10) & 31;
        if (e == 31) {
            const int is_nan = (h & 1023) != 0;
            if (is_nan != !!isnan(f) || (!is_nan && (isinf(f) == 0 || !!signbit(f) != !!(h & 0x8000)))) bad_val++;
            const uint16_t back = tl_f32_to_f16(f);
            if (back != (is_nan ? (h | 0x200) : h)) bad_rt++;
        } else {
            if ((double)f != half_value((uint16_t)h) || !!signbit(f) != !!(h & 0x8000)) bad_val++;
            if (tl_f32_to_f16(f) != h) bad_rt++;
        }
    }
    CHECK(bad_val == 0, "f16->f32 matches the exact value of all 65536 halves (%d wrong)", bad_val);
    CHECK(bad_rt == 0, "f16->f32->f16 returns every half (NaNs quietened) (%d wrong)", bad_rt);

    /* Random floats across the half range, plus exact ties between halves. */
    enum { NR = 200000 };
    float *v = malloc(NR * sizeof(float));
    for (int i = 0; i < NR; i++) {
        if (i % 4 == 0) { /* midpoint of two adjacent halves: a tie */
            const uint16_t h = (uint16_t)(rng_u64() % 0x7bff);
            v[i] = (float)((half_value(h) + half_value((uint16_t)(h + 1))) / 2);
        } else {
            const uint32_t e = 95 + (uint32_t)(rng_u64() % 56); /* 2^-32 .. 2^23 */
            v[i] = bits_f((uint32_t)(rng_u64() & 0x80000000u) | (e << 23) | (uint32_t)(rng_u64() & 0x7fffff));
        }
        if (rng_u64() & 1) v[i] = -v[i];
    }
    int bad = 0;
    for (int i = 0; i < NR; i++)
        if (tl_f32_to_f16(v[i]) != ref_f32_to_f16(v[i])) {
            if (bad++ < 3) printf("  f32 %a -> %04x, want %04x\n", v[i], tl_f32_to_f16(v[i]), ref_f32_to_f16(v[i]));
        }
    CHECK(bad == 0, "f32->f16 rounds to nearest even like a search over all halves (%d of %d wrong)", bad, NR);
    CHECK(tl_f32_to_f16(INFINITY) == 0x7c00 && tl_f32_to_f16(-INFINITY) == 0xfc00 && tl_f32_to_f16(1e6f) == 0x7c00 &&
              (tl_f32_to_f16(NAN) & 0x7fff) > 0x7c00 && tl_f32_to_f16(65519.99f) == 0x7bff &&
              tl_f32_to_f16(0x1p-25f) == 0 && tl_f32_to_f16(0x1.000002p-25f) == 1,
          "f32->f16 handles inf, overflow, nan and the subnormal edges");

    /* bfloat16: all non-NaN values round trip; ties go to even. */
    int bad_bf = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        if (((h >> 7) & 0xff) == 0xff && (h & 0x7f)) continue;
        if (tl_f32_to_bf16(tl_bf16_to_f32((uint16_t)h)) != h) bad_bf++;
    }
    CHECK(bad_bf == 0, "bf16->f32->bf16 returns every non-NaN bfloat (%d wrong)", bad_bf);
    CHECK(tl_f32_to_bf16(bits_f(0x3f808000)) == 0x3f80 && tl_f32_to_bf16(bits_f(0x3f818000)) == 0x3f82 &&
              tl_f32_to_bf16(bits_f(0x3f808001)) == 0x3f81 && tl_f32_to_bf16(NAN) != 0x7f80,
          "f32->bf16 rounds ties to even and keeps NaN a NaN");

    /* Every ISA's row conversions agree with the scalar ones bit for bit. */
    uint16_t *all = malloc(65536 * 2), *h2 = malloc(NR * 2);
    float *f2 = malloc(65536 * sizeof(float));
    for (uint32_t h = 0; h < 65536; h++) all[h] = (uint16_t)h;
    for (int lvl = 0; lvl <= isa_max; lvl++) {
        tl_kernels_set_isa(lvl);
        for (int n = 1; n <= 67; n += 2) { /* odd tails */
            tl_f16_to_f32_row(all + 1000, f2, n);
            tl_f32_to_f16_row(v, h2, n);
            int ok = 1;
            for (int i = 0; i < n; i++)
                ok &= f_bits(f2[i]) == f_bits(tl_f16_to_f32(all[1000 + i])) && h2[i] == tl_f32_to_f16(v[i]);
            if (!ok) { CHECK(0, "%s f16 row conversions at n=%d match scalar", tl_isa_name(lvl), n); break; }
        }
        tl_f16_to_f32_row(all, f2, 65536);
        int badr = 0;
        for (uint32_t h = 0; h < 65536; h++) badr += f_bits(f2[h]) != f_bits(tl_f16_to_f32((uint16_t)h));
        tl_f32_to_f16_row(v, h2, NR);
        for (int i = 0; i < NR; i++) badr += h2[i] != tl_f32_to_f16(v[i]);
        CHECK(badr == 0, "%s f16 row conversions match scalar over all halves and %d floats (%d wrong)",
              tl_isa_name(lvl), NR, badr);
    }
    tl_kernels_set_isa(isa_max);
    free(all); free(h2); free(f2); free(v);

    /* q8_0 / q4_0 / q4_1 rows widen to d * q (+ m) at every level, bit for bit the
     * scalar code (attention reads quantized V through these) */
    enum { NB = 37 };
    static uint8_t raw[NB * 34];
    static float want[NB * 32], got[NB * 32];
    uint32_t r = 12345;
    const int types[3] = {TL_TYPE_Q8_0, TL_TYPE_Q4_0, TL_TYPE_Q4_1};
    for (int ti = 0; ti < 3; ti++) {
        size_t bb = tl_type_info(types[ti])->type_size;
        for (size_t i = 0; i < NB * bb; i++) raw[i] = (uint8_t)((r = r * 1664525u + 1013904223u) >> 24);
        for (int b = 0; b < NB; b++) raw[b * bb + 1] &= 0x7b, raw[b * bb + 3] &= 0x7b; /* finite d (and m), some subnormal */
        tl_kernels_set_isa(TL_ISA_SCALAR);
        tl_dequantize_row(types[ti], raw, want, NB * 32);
        for (int lvl = 1; lvl <= isa_max; lvl++) {
            tl_kernels_set_isa(lvl);
            tl_dequantize_row(types[ti], raw, got, NB * 32);
            int bad = 0;
            for (int i = 0; i < NB * 32; i++) bad += f_bits(got[i]) != f_bits(want[i]);
            CHECK(bad == 0, "%s %s rows dequantize bitwise as the scalar code (%d wrong)", tl_isa_name(lvl),
                  tl_type_info(types[ti])->name, bad);
        }
    }
    tl_kernels_set_isa(isa_max);
}

/* ------------------------------------------------ hand-built blocks */

/* Packs 8 (scale, min) 6-bit pairs the way ggml's quantize_row_q4_K does. */
static void pack_k4(uint8_t out[12], const int sc[8], const int mn[8]) {
    memset(out, 0, 12);
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            out[j] = (uint8_t)sc[j];
            out[j + 4] = (uint8_t)mn[j];
        } else {
            out[j + 4] = (uint8_t)((sc[j] & 0xF) | ((mn[j] & 0xF) << 4));
            out[j - 4] |= (uint8_t)((sc[j] >> 4) << 6);
            out[j] |= (uint8_t)((mn[j] >> 4) << 6);
        }
    }
}

/* An all-ones q8_K block with d = 1: dot(w, it) is the sum of w. */
static void test_hand_blocks(void) {
    static const int sc[8] = {1, 2, 3, 4, 33, 45, 63, 17}, mn[8] = {0, 5, 10, 63, 7, 40, 2, 33};
    float want[QK_K], got[QK_K];
    int bad;

    /* q4_K: d = 1, dmin = 0.5; element e of sub-block s holds (e*7)%16. */
    block_q4_K b4;
    memset(&b4, 0, sizeof b4);
    b4.d = 0x3C00;
    b4.dmin = 0x3800;
    pack_k4(b4.scales, sc, mn);
    for (int e = 0; e < QK_K; e++) {
        const int s = e / 32, l = e % 32, v = (e * 7) % 16;
        b4.qs[32 * (s / 2) + l] |= (uint8_t)((s & 1) ? v << 4 : v);
        want[e] = 1.0f * sc[s] * v - 0.5f * mn[s];
    }
    tl_dequantize_row(TL_TYPE_Q4_K, &b4, got, QK_K);
    bad = 0;
    for (int e = 0; e < QK_K; e++) bad += got[e] != want[e];
    CHECK(bad == 0, "q4_K dequantizes a hand-built block exactly (%d wrong)", bad);
    check_block_dots("q4_K", TL_TYPE_Q4_K, &b4, want);

    /* q5_K: as q4_K with the 5th bit set on every third element. */
    block_q5_K b5;
    memset(&b5, 0, sizeof b5);
    b5.d = 0x3C00;
    b5.dmin = 0x3800;
    pack_k4(b5.scales, sc, mn);
    for (int e = 0; e < QK_K; e++) {
        const int s = e / 32, l = e % 32, v = (e * 7) % 16, h = e % 3 == 0;
        b5.qs[32 * (s / 2) + l] |= (uint8_t)((s & 1) ? v << 4 : v);
        if (h) b5.qh[l] |= (uint8_t)(1 << s);
        want[e] = 1.0f * sc[s] * (v + 16 * h) - 0.5f * mn[s];
    }
    tl_dequantize_row(TL_TYPE_Q5_K, &b5, got, QK_K);
    bad = 0;
    for (int e = 0; e < QK_K; e++) bad += got[e] != want[e];
    CHECK(bad == 0, "q5_K dequantizes a hand-built block exactly (%d wrong)", bad);
    check_block_dots("q5_K", TL_TYPE_Q5_K, &b5, want);

    /* q6_K: d = 0.25, signed 8-bit scales; packed like ggml's quantizer. */
    static const int s6[16] = {-3, 5, 127, -128, 1, 0, 9, -17, 64, 2, -1, 33, 100, -50, 7, 11};
    block_q6_K b6;
    memset(&b6, 0, sizeof b6);
    b6.d = 0x3400;
    uint8_t L[QK_K];
    for (int e = 0; e < QK_K; e++) {
        L[e] = (uint8_t)((e * 5 + e / 64) % 64);
        want[e] = 0.25f * s6[e / 16] * (L[e] - 32);
    }
    for (int j = 0; j < 16; j++) b6.scales[j] = (int8_t)s6[j];
    for (int j = 0; j < QK_K; j += 128)
        for (int l = 0; l < 32; l++) {
            b6.ql[j / 2 + l] = (uint8_t)((L[j + l] & 0xF) | ((L[j + l + 64] & 0xF) << 4));
            b6.ql[j / 2 + l + 32] = (uint8_t)((L[j + l + 32] & 0xF) | ((L[j + l + 96] & 0xF) << 4));
            b6.qh[j / 4 + l] = (uint8_t)((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4) |
                                         ((L[j + l + 96] >> 4) << 6));
        }
    tl_dequantize_row(TL_TYPE_Q6_K, &b6, got, QK_K);
    bad = 0;
    for (int e = 0; e < QK_K; e++) bad += got[e] != want[e];
    CHECK(bad == 0, "q6_K dequantizes a hand-built block exactly (%d wrong)", bad);
    check_block_dots("q6_K", TL_TYPE_Q6_K, &b6, want);

    /* 32-element types: one block each, byte by byte. */
    uint8_t raw[34];
    float w32[32];
    memset(raw, 0, sizeof raw);
    raw[0] = 0x00; raw[1] = 0x40; /* d = 2 */
    for (int j = 0; j < 16; j++) raw[2 + j] = (uint8_t)(j | ((15 - j) << 4));
    tl_dequantize_row(TL_TYPE_Q4_0, raw, w32, 32);
    bad = 0;
    for (int j = 0; j < 16; j++) bad += w32[j] != 2.0f * (j - 8) || w32[j + 16] != 2.0f * (7 - j);
    CHECK(bad == 0, "q4_0 dequantizes low nibbles to 0..15 and high nibbles to 16..31 (%d wrong)", bad);
    raw[6] = 0x80; raw[7] = 0xBC; /* q4_1 m = -1.125 (bytes 2..3 of the block) */
    {
        uint8_t q41[20];
        q41[0] = 0x00; q41[1] = 0x40;  /* d = 2 */
        q41[2] = 0x80; q41[3] = 0xBC;  /* m = -1.125 */
        for (int j = 0; j < 16; j++) q41[4 + j] = (uint8_t)(j | ((15 - j) << 4));
        tl_dequantize_row(TL_TYPE_Q4_1, q41, w32, 32);
        bad = 0;
        for (int j = 0; j < 16; j++) bad += w32[j] != 2.0f * j - 1.125f || w32[j + 16] != 2.0f * (15 - j) - 1.125f;
        CHECK(bad == 0, "q4_1 dequantizes q*d + m (%d wrong)", bad);
        uint8_t q50[22];
        q50[0] = 0x00; q50[1] = 0x3C;                 /* d = 1 */
        q50[2] = 0x05; q50[3] = 0x00; q50[4] = 0x01; q50[5] = 0x80; /* bits 0, 2, 16, 31 */
        for (int j = 0; j < 16; j++) q50[6 + j] = (uint8_t)(j | ((15 - j) << 4));
        tl_dequantize_row(TL_TYPE_Q5_0, q50, w32, 32);
        bad = 0;
        for (int j = 0; j < 32; j++) {
            const int hb = j == 0 || j == 2 || j == 16 || j == 31;
            const int q = (j < 16 ? j : 31 - j) + 16 * hb;
            bad += w32[j] != (float)(q - 16);
        }
        CHECK(bad == 0, "q5_0 takes the 5th bit of element j from bit j of qh (%d wrong)", bad);
    }
}

/* --------------------------------------------- per-type correctness */

static void test_type(int type, const int64_t *sizes, int nsizes) {
    const tl_type_traits *t = tl_type_info(type);
    const int vt = t->vec_dot_type;
    double worst_rt = 0, worst_ref[TL_ISA_AMX + 1] = {0}, worst_simd[TL_ISA_AMX + 1] = {0};
    for (int si = 0; si < nsizes; si++) {
        const int64_t n = sizes[si];
        float *x = malloc((size_t)n * sizeof(float)), *xr = malloc((size_t)n * sizeof(float));
        float *a = malloc((size_t)n * sizeof(float)), *ar = malloc((size_t)n * sizeof(float));
        void *wq = malloc(tl_row_size(type, n) + 1), *aq = malloc(tl_row_size(vt, n) + 1);
        fill_data(x, n, 1);
        for (int64_t i = 0; i < n; i++) a[i] = rng_gauss();

        /* (a) round trip */
        tl_quantize_row(type, x, wq, n);
        tl_dequantize_row(type, wq, xr, n);
        double num = 0, den = 0;
        for (int64_t i = 0; i < n; i++) {
            num += ((double)x[i] - xr[i]) * ((double)x[i] - xr[i]);
            den += (double)x[i] * x[i];
        }
        const double rt = num / den;
        if (rt > worst_rt) worst_rt = rt;
        CHECK(rt <= rt_bound(type), "%s n=%lld round trip error %.3g is under %.3g", t->name, (long long)n, rt,
              rt_bound(type));

        /* (b) vec_dot at every level vs double reference and vs scalar */
        tl_quantize_row_ref(vt, a, aq, n);
        tl_dequantize_row(vt, aq, ar, n);
        double ref = 0;
        for (int64_t i = 0; i < n; i++) ref += (double)xr[i] * ar[i];
        const double scale = sum_abs_prod(xr, ar, n) + 1e-30;
        float scalar = 0;
        tl_vec_dot_ref(type)(n, &scalar, wq, aq);
        for (int lvl = 0; lvl <= isa_max; lvl++) {
            tl_kernels_set_isa(lvl);
            float got = NAN;
            tl_vec_dot(type)(n, &got, wq, aq);
            const double e_ref = fabs(got - ref) / scale, e_s = fabs((double)got - scalar) / scale;
            if (!(e_ref <= worst_ref[lvl])) worst_ref[lvl] = e_ref;
            if (!(e_s <= worst_simd[lvl])) worst_simd[lvl] = e_s;
            CHECK(e_ref <= 2e-5, "%s %s n=%lld vec_dot %.8g is within 2e-5 of the reference %.8g (err %.3g)",
                  tl_isa_name(lvl), t->name, (long long)n, got, ref, e_ref);
            CHECK(e_s <= 1e-5, "%s %s n=%lld vec_dot %.8g is within 1e-5 of scalar %.8g (err %.3g)", tl_isa_name(lvl),
                  t->name, (long long)n, got, scalar, e_s);
        }
        tl_kernels_set_isa(isa_max);
        free(x); free(xr); free(a); free(ar); free(wq); free(aq);
    }
    printf("  %-5s round-trip nrmse %.3e | vec_dot err/sum|wx| vs double ref:", t->name, worst_rt);
    for (int lvl = 0; lvl <= isa_max; lvl++) printf(" %s %.1e", tl_isa_name(lvl), worst_ref[lvl]);
    printf(" | vs scalar:");
    for (int lvl = 1; lvl <= isa_max; lvl++) printf(" %s %.1e", tl_isa_name(lvl), worst_simd[lvl]);
    printf("\n");
}

/* ------------------------------------------- activation quantizers */

static void test_act_quant(void) {
    enum { N = QK_K * 9 };
    float *x = malloc(N * sizeof(float));
    fill_data(x, N, 1);
    /* Block 1 (elements 32..63 / 256..511): exact .5 ties after scaling. */
    for (int j = 0; j < 32; j++) x[32 + j] = (float)(j - 16) + 0.5f;
    x[32] = 127.0f; /* amax 127 -> d = 1, id = 1: x*id keeps the .5 */
    for (int j = 0; j < QK_K; j++) x[512 + j] = (float)((j % 200) - 100) + 0.5f;
    x[512] = -127.0f; /* max = -127 -> iscale = 1: RNE on ties */
    for (int j = 0; j < QK_K; j++) x[768 + j] = (j == 5) ? -3.0f : (j == 9 ? 3.0f : 0.25f * j / QK_K);
    void *ref = malloc(tl_row_size(TL_TYPE_Q8_K, N)), *got = malloc(tl_row_size(TL_TYPE_Q8_K, N));
    const int types[2] = {TL_TYPE_Q8_0, TL_TYPE_Q8_K};
    for (int k = 0; k < 2; k++) {
        const size_t sz = tl_row_size(types[k], N);
        tl_quantize_row_ref(types[k], x, ref, N);
        for (int lvl = 0; lvl <= isa_max; lvl++) {
            tl_kernels_set_isa(lvl);
            memset(got, 0xAB, sz);
            tl_quantize_row(types[k], x, got, N);
            CHECK(memcmp(ref, got, sz) == 0, "%s %s activation quantization is byte-identical to scalar",
                  tl_isa_name(lvl), tl_type_info(types[k])->name);
        }
    }
    /* q8_0 rows whose blocks end in a partial group of 16 (the SIMD
     * quantizers take 16 blocks at a time) */
    static const int64_t widths[] = {32, 32 * 5, 32 * 17, 32 * 24, 32 * 31};
    for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++) {
        const int64_t n = widths[wi];
        const size_t sz = tl_row_size(TL_TYPE_Q8_0, n);
        tl_quantize_row_ref(TL_TYPE_Q8_0, x + 32, ref, n);
        for (int lvl = 0; lvl <= isa_max; lvl++) {
            tl_kernels_set_isa(lvl);
            memset(got, 0xAB, sz);
            tl_quantize_row(TL_TYPE_Q8_0, x + 32, got, n);
            CHECK(memcmp(ref, got, sz) == 0, "%s q8_0 activation quantization of %lld elements is byte-identical to "
                  "scalar", tl_isa_name(lvl), (long long)n);
        }
    }
    /* Spot checks of the ggml rules themselves. */
    tl_quantize_row_ref(TL_TYPE_Q8_0, x, ref, N);
    const block_q8_0 *b0 = (const block_q8_0 *)ref + 1;
    CHECK(b0->qs[0] == 127 && b0->qs[1] == -15 && b0->qs[17] == 2 && b0->qs[15] == -1,
          "q8_0 rounds x/d half away from zero (roundf), as ggml does");
    tl_quantize_row_ref(TL_TYPE_Q8_K, x, ref, N);
    const block_q8_K *bk = (const block_q8_K *)ref + 2;
    int sum0 = 0;
    for (int j = 0; j < 16; j++) sum0 += bk->qs[j];
    CHECK(bk->d == 1.0f && bk->qs[0] == -127 && bk->qs[2] == -98 && bk->qs[3] == -96 &&
              bk->bsums[0] == sum0,
          "q8_K uses iscale = -127/max, rounds ties to even, and fills bsums");
    const block_q8_K *bk3 = (const block_q8_K *)ref + 3;
    CHECK(bk3->qs[5] == -127 && bk3->qs[9] == 127, "q8_K picks the first element of largest magnitude as max");
    tl_kernels_set_isa(isa_max);
    free(x); free(ref); free(got);
}

/* ----------------------------------------------- attention helpers */

static void test_helpers(void) {
    enum { NMAX = 67 };
    float a[NMAX], b[NMAX], y0[NMAX], y1[NMAX];
    uint16_t h[NMAX];
    for (int i = 0; i < NMAX; i++) {
        a[i] = rng_gauss();
        b[i] = rng_gauss();
        h[i] = tl_f32_to_f16(rng_gauss());
    }
    double worst = 0;
    for (int lvl = 0; lvl <= isa_max; lvl++) {
        tl_kernels_set_isa(lvl);
        int bad = 0;
        for (int n = 1; n <= NMAX; n += 2) {
            double r1 = 0, r2 = 0, s1 = 0, s2 = 0;
            for (int i = 0; i < n; i++) {
                r1 += (double)a[i] * b[i];
                s1 += fabs((double)a[i] * b[i]);
                r2 += (double)tl_f16_to_f32(h[i]) * b[i];
                s2 += fabs((double)tl_f16_to_f32(h[i]) * b[i]);
            }
            const double e1 = fabs(tl_dot_f32(a, b, n) - r1) / s1, e2 = fabs(tl_dot_f16_f32(h, b, n) - r2) / s2;
            if (e1 > worst) worst = e1;
            if (e2 > worst) worst = e2;
            bad += !(e1 <= 1e-6) + !(e2 <= 1e-6);
            memcpy(y0, b, sizeof b);
            memcpy(y1, b, sizeof b);
            tl_axpy_f32(y0, 0.37f, a, n);
            tl_axpy_f16(y1, -1.25f, h, n);
            for (int i = 0; i < NMAX; i++) {
                const double w0 = i < n ? b[i] + 0.37 * a[i] : b[i];
                const double w1 = i < n ? b[i] - 1.25 * tl_f16_to_f32(h[i]) : b[i];
                bad += fabs(y0[i] - w0) > 1e-6 * (fabs(w0) + 1) || fabs(y1[i] - w1) > 1e-6 * (fabs(w1) + 1);
            }
        }
        CHECK(bad == 0, "%s dot_f32/dot_f16_f32/axpy_f32/axpy_f16 match double at n=1..67 odd, tails untouched (%d bad)",
              tl_isa_name(lvl), bad);
    }
    printf("  attention helpers: worst dot error / sum|ab| %.2e\n", worst);
    tl_kernels_set_isa(isa_max);
}

/* --------------------------------------------------------- timing */

/* tl_vec_dot_tile: every entry of an nr x nt tile (odd shapes, so every
 * micro-tile and tail path runs) is bitwise tl_vec_dot of its pair at the
 * same ISA level, and within 1e-5 of the scalar kernel. */
static void test_tile(void) {
    static const int shapes[][2] = {{1, 1}, {3, 1}, {4, 1}, {7, 1}, {16, 1}, {5, 2}, {4, 3}, {9, 5}, {13, 8}, {2, 7}};
    for (int ti = 0; ti < N_WTYPES; ti++) {
        const int type = weight_types[ti], vt = tl_type_info(type)->vec_dot_type, bs = tl_type_info(type)->block_size;
        const int64_t n = bs == 1 ? 67 : bs == 32 ? 32 * 7 : 256 * 3;
        const size_t rw = tl_row_size(type, n), rx = tl_row_size(vt, n);
        const int maxr = 16, maxt = 8;
        uint8_t *w = malloc(rw * maxr), *x = malloc(rx * maxt);
        float *src = malloc(sizeof(float) * (size_t)n), *out = malloc(sizeof(float) * maxr * maxt);
        for (int r = 0; r < maxr; r++) {
            fill_data(src, n, r == 0);
            tl_quantize_row_ref(type, src, w + rw * r, n);
        }
        for (int t = 0; t < maxt; t++) {
            for (int64_t i = 0; i < n; i++) src[i] = rng_gauss();
            tl_quantize_row_ref(vt, src, x + rx * t, n);
        }
        int bad = 0, badref = 0;
        for (int lvl = 0; lvl <= isa_max; lvl++) {
            tl_kernels_set_isa(lvl);
            for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
                const int nr = shapes[k][0], nt = shapes[k][1], ldo = nr + 3;
                tl_vec_dot_tile(type, n, nr, nt, out, (size_t)ldo, w, rw, x, rx);
                for (int r = 0; r < nr; r++)
                    for (int t = 0; t < nt; t++) {
                        float one, ref;
                        tl_vec_dot(type)(n, &one, w + rw * r, x + rx * t);
                        tl_vec_dot_ref(type)(n, &ref, w + rw * r, x + rx * t);
                        const float got = out[t * ldo + r];
                        if (memcmp(&got, &one, sizeof got)) bad++;
                        if (fabsf(got - ref) > 1e-4f * (fabsf(ref) + 1) * sqrtf((float)n)) badref++;
                    }
            }
        }
        tl_kernels_set_isa(isa_max);
        CHECK(bad == 0, "%s tile entries equal vec_dot bitwise at every ISA level (%d differ)", tl_type_info(type)->name,
              bad);
        CHECK(badref == 0, "%s tile entries are close to the scalar kernel (%d far)", tl_type_info(type)->name, badref);
        free(w); free(x); free(src); free(out);
    }
}

static volatile float bench_sink;

static void bench(void) {
    const int quick = getenv("TL_TEST_QUICK") != NULL;
    const int64_t n = 4096;
    const size_t target = quick ? ((size_t)1 << 20) : ((size_t)64 << 20);
    float *src = malloc(n * sizeof(float)), *act = malloc(n * sizeof(float));
    fill_data(src, n, 0);
    for (int64_t i = 0; i < n; i++) act[i] = rng_gauss();
    void *aq = malloc(tl_row_size(TL_TYPE_Q8_K, n) + tl_row_size(TL_TYPE_F32, n));
    printf("  matvec GB/s of weight bytes, 1 thread, n=%lld, %zu MiB of weights (L2-hot 256 KiB in parens):\n",
           (long long)n, target >> 20);
    printf("  %-6s", "type");
    for (int lvl = 0; lvl <= isa_max; lvl++) printf(" %18s", tl_isa_name(lvl));
    printf("\n");
    for (int ti = 0; ti < N_WTYPES; ti++) {
        const int type = weight_types[ti], vt = tl_type_info(type)->vec_dot_type;
        const size_t rs = tl_row_size(type, n);
        const int64_t rows = (int64_t)(target / rs);
        uint8_t *w = malloc(rs * (size_t)rows);
        tl_quantize_row(type, src, w, n);
        for (int64_t r = 1; r < rows; r++) memcpy(w + rs * r, w, rs);
        tl_quantize_row(vt, act, aq, n);
        printf("  %-6s", tl_type_info(type)->name);
        for (int lvl = 0; lvl <= isa_max; lvl++) {
            tl_kernels_set_isa(lvl);
            const tl_vec_dot_fn fn = tl_vec_dot(type);
            double gbs[2];
            for (int hot = 0; hot < 2; hot++) {
                const int64_t nr = hot ? ((int64_t)(256 << 10) / (int64_t)rs > 0 ? (256 << 10) / (int64_t)rs : 1) : rows;
                double best = 1e30;
                for (int rep = 0; rep < (quick ? 1 : (hot ? 20 : 3)); rep++) {
                    const double t0 = tl_now();
                    for (int k = 0; k < (hot ? 8 : 1); k++)
                        for (int64_t r = 0; r < nr; r++) {
                            float o;
                            fn(n, &o, w + rs * r, aq);
                            bench_sink += o;
                        }
                    const double dt = (tl_now() - t0) / (hot ? 8 : 1);
                    if (dt < best) best = dt;
                }
                gbs[hot] = (double)rs * nr / best / 1e9;
            }
            printf(" %8.1f (%7.1f)", gbs[0], gbs[1]);
        }
        printf("\n");
        free(w);
    }
    tl_kernels_set_isa(isa_max);
    free(src); free(act); free(aq);
}

int main(void) {
    tl_kernels_init();
    isa_max = tl_kernels_isa(); /* CPU level, capped by TINYLOOP_ISA */
    printf("ISA levels tested: scalar..%s\n", tl_isa_name(isa_max));

    test_halves();
    test_hand_blocks();
    test_act_quant();
    test_helpers();

    static const int64_t sz32[] = {32, 96, 32 * 7, 4096 + 32 * 3};
    static const int64_t sz256[] = {256, 768, 256 * 5, 4096 + 256};
    static const int64_t szf[] = {1, 3, 17, 33, 67, 96, 1000, 4099};
    printf("per-type errors (worst over sizes):\n");
    for (int ti = 0; ti < N_WTYPES; ti++) {
        const int type = weight_types[ti], bs = tl_type_info(type)->block_size;
        CHECK(tl_type_info(type)->supported, "%s is marked supported", tl_type_info(type)->name);
        if (bs == 1) test_type(type, szf, 8);
        else if (bs == 32) test_type(type, sz32, 4);
        else test_type(type, sz256, 4);
    }
    test_tile();
    bench();
    return test_summary();
}
