/* bench_cache.h - prompt and timing helpers the cache benchmarks share
 * (bench_cache.c, bench_tiers.c). */
#ifndef TL_BENCH_CACHE_H
#define TL_BENCH_CACHE_H

#include <stdint.h>

#include "tinyloop.h"

/* n pseudo-random ids in [3, nv) from seed. */
void tl_bench_fill(int32_t *t, int n, int nv, uint32_t seed);
/* Seconds from submit to the first generated token (a request of one
 * token, stepped synchronously); -1 when it cannot be submitted. */
double tl_bench_ttft(tl_model *m, const int32_t *p, int n, int no_cache);

#endif
