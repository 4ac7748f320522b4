#define _POSIX_C_SOURCE 200809L
#include "util.h"

#include "tinyloop.h" /* tl_last_error is public */

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

static _Thread_local char last_error[512];
static _Thread_local int last_code;

int tl_set_error(int code, const char *fmt, ...) {
    va_list ap;
    last_code = code;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return code;
}

const char *tl_last_error(void) { return last_error; }

int tl_last_error_code(void) { return last_code; }

void *tl_alloc_aligned(size_t size) {
    void *p = NULL;
    if (size == 0) size = 64;
    size = (size + 63) & ~(size_t)63;
    if (posix_memalign(&p, 64, size) != 0) return NULL;
    return p;
}

void tl_free_aligned(void *p) { free(p); }

/* Out of line on purpose: GCC treats __builtin_prefetch as free of side
 * effects, so a static helper that only prefetches was judged pure and its
 * calls deleted (forward.c's KV prefetch compiled to nothing); a call into
 * another translation unit stays. */
void tl_prefetch(const void *p, size_t bytes) {
    for (size_t off = 0; off < bytes; off += 64) __builtin_prefetch((const char *)p + off, 0, 2);
}

/* Large buffers read in scattered pieces (the KV pool: a few KiB per
 * block and head) on 2 MiB pages where the kernel gives them (transparent
 * huge pages in madvise mode, else a no-op): one TLB entry per 2 MiB
 * instead of per 4 KiB. Freed with tl_free_aligned. */
void *tl_alloc_huge(size_t size) {
    const size_t huge = (size_t)2 << 20;
    if (size < huge) return tl_alloc_aligned(size);
    void *p = NULL;
    if (posix_memalign(&p, huge, size) != 0) return NULL;
    (void)madvise(p, size & ~(huge - 1), MADV_HUGEPAGE);
    return p;
}

double tl_clock(void) { return tl_now(); }

double tl_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
