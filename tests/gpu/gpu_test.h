/* gpu_test.h - how a GPU test that drives the launchers starts: without a
 * device it prints "SKIP: no CUDA device" (and, through test_summary,
 * "0 passed, 0 failed"); with one it opens a context on device 0. Also
 * the tests' shared random numbers. */
#ifndef TL_GPU_TEST_H
#define TL_GPU_TEST_H

#include <stdint.h>

#include "test.h"
#include "tl_cuda.h"

/* Uniform in [-1, 1) from an xorshift64 state (each test seeds its own). */
static inline float gpu_frand(uint64_t *state) {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return (float)((*state >> 40) * (1.0 / (1 << 23)) - 1.0);
}

/* 1 with *ctx open, 0 to skip or on failure (a failed CHECK). */
static inline int gpu_test_open(tl_cuda **ctx) {
    int n_dev = 0;
    tl_cuda_device_count(&n_dev);
    if (n_dev == 0) {
        printf("SKIP: no CUDA device\n");
        return 0;
    }
    int rc = tl_cuda_init(0, ctx);
    CHECK(rc == TL_CUDA_OK, "tl_cuda_init(0): %s", tl_cuda_last_error());
    return rc == TL_CUDA_OK;
}

#endif
