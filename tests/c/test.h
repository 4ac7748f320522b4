/* test.h - a tiny test harness: one sentence per check, a summary line
 * "N passed, N failed" at the end (the Makefile's runner adds them up). */
#ifndef TL_TEST_H
#define TL_TEST_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int test_passed, test_failed;

#define CHECK(cond, ...)                                                      \
    do {                                                                      \
        if (cond) {                                                           \
            test_passed++;                                                    \
        } else {                                                              \
            test_failed++;                                                    \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                        \
            printf(__VA_ARGS__);                                              \
            printf("\n");                                                     \
        }                                                                     \
    } while (0)

/* Prints the summary and returns the process exit code. */
static inline int test_summary(void) {
    printf("%d passed, %d failed\n", test_passed, test_failed);
    return test_failed ? 1 : 0;
}

/* Directory holding the shared test data (../shared relative to the repo
 * root), or NULL when absent; tests that need it skip with a message. */
/* Normalized mean squared error of a against ref: sum (a - ref)^2 / sum
 * ref^2 (the plain sum when ref is all zero), as llama.cpp's op tests. */
static inline double test_nmse(const float *a, const float *ref, size_t n) {
    double e = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - ref[i];
        e += d * d;
        r += (double)ref[i] * ref[i];
    }
    return r > 0 ? e / r : e;
}

/* A deterministic, roughly normal sample (sum of 4 uniforms from a 64-bit
 * LCG, sd ~1): test data that depends only on the seed in *rng. */
static inline float test_gauss(uint64_t *rng) {
    float s = 0;
    for (int i = 0; i < 4; i++) {
        *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
        s += (float)((*rng >> 40) & 0xFFFF) / 65536.0f - 0.5f;
    }
    return s * 1.7f;
}

static inline const char *test_shared_dir(void) {
    static const char *cands[] = {"../shared", "../../shared", NULL};
    const char *env = getenv("TINYLOOP_SHARED");
    if (env) return env;
    for (int i = 0; cands[i]; i++) {
        char p[512];
        snprintf(p, sizeof p, "%s/models/stories260K.gguf", cands[i]);
        FILE *f = fopen(p, "rb");
        if (f) { fclose(f); return cands[i]; }
    }
    return NULL;
}

#endif
