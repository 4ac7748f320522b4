/* quants_check.h - what test_quants.c and test_iquants.c share: a
 * seeded splitmix64 stream for test data, the ISA levels under test, and
 * the dot of a hand-built super-block with all-ones activations at every
 * level. Static definitions: each test binary has its own copy. */
#ifndef TL_QUANTS_CHECK_H
#define TL_QUANTS_CHECK_H

#include <math.h>
#include <string.h>

#include "quants.h"
#include "quants_impl.h"
#include "test.h"
#include "util.h"

static int isa_max; /* the CPU's level, capped by TINYLOOP_ISA (main sets it) */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t rng_u64(void) {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double rng_unif(void) { return (double)(rng_u64() >> 11) * 0x1.0p-53; }

static float rng_gauss(void) {
    double u = rng_unif(), v = rng_unif();
    if (u < 1e-300) u = 1e-300;
    return (float)(sqrt(-2.0 * log(u)) * cos(2.0 * M_PI * v));
}

static void ones_q8_K(block_q8_K *b) {
    b->d = 1.0f;
    memset(b->qs, 1, sizeof b->qs);
    for (int j = 0; j < 16; j++) b->bsums[j] = 16;
}

static void check_block_dots(const char *name, int type, const void *blk, const float *want) {
    block_q8_K ones;
    ones_q8_K(&ones);
    double s = 0;
    for (int i = 0; i < QK_K; i++) s += want[i];
    for (int lvl = 0; lvl <= isa_max; lvl++) {
        tl_kernels_set_isa(lvl);
        float got = 0;
        tl_vec_dot(type)(QK_K, &got, blk, &ones);
        CHECK(fabs(got - s) <= 1e-4 * fabs(s) + 1e-3, "%s %s vec_dot of a hand-built block with ones is %g (got %g)",
              tl_isa_name(lvl), name, s, got);
    }
    tl_kernels_set_isa(isa_max);
}

/* sum |a_i b_i| in double: the scale a dot's rounding error is measured against. */
static double sum_abs_prod(const float *a, const float *b, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += fabs((double)a[i] * b[i]);
    return s;
}

#endif
