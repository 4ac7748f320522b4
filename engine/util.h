/* util.h - internal helpers shared by the engine: error reporting, checked
 * arithmetic, allocation. Not part of the public API. */
#ifndef TL_UTIL_H
#define TL_UTIL_H

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define TL_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define TL_PRINTF(a, b)
#endif

/* Sets the calling thread's last-error message (read by tl_last_error()).
 * Always returns `code`, so callers can write `return tl_set_error(TL_ERR_X, ...)`. */
int tl_set_error(int code, const char *fmt, ...) TL_PRINTF(2, 3);

/* Last message set on this thread, "" when none. */
const char *tl_last_error(void);

/* Overflow-checked size arithmetic: return 0 on success, -1 on overflow. */
static inline int tl_mul_size(size_t a, size_t b, size_t *out) {
    return __builtin_mul_overflow(a, b, out) ? -1 : 0;
}
static inline int tl_add_size(size_t a, size_t b, size_t *out) {
    return __builtin_add_overflow(a, b, out) ? -1 : 0;
}

/* 64-byte aligned allocation for SIMD buffers; free with tl_free_aligned. */
void *tl_alloc_aligned(size_t size);
void tl_free_aligned(void *p);
/* Asks for [p, p + bytes) into L2 (prefetcht1), 64 bytes a line. */
void tl_prefetch(const void *p, size_t bytes);
/* tl_alloc_aligned for large buffers, on transparent huge pages where given. */
void *tl_alloc_huge(size_t size);

/* Monotonic time in seconds. */
double tl_now(void);

#endif
