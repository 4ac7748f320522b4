/* hash.h - the two digests the on-disk KV blocks need: SHA-256 (FIPS 180-4)
 * names blocks and models, CRC32C (Castagnoli) guards their bytes.
 *
 * Both are plain functions of their input: no global state beyond the
 * CRC32C tables, built once (thread-safe) on first use. */
#ifndef TL_HASH_H
#define TL_HASH_H

#include <stddef.h>
#include <stdint.h>

/* An incremental SHA-256; init, update any number of times, final once.
 * (The type is tl_sha256_ctx, or struct tl_sha256: C gives a typedef and a
 * function the same namespace, and tl_sha256 is the one-shot function.) */
typedef struct tl_sha256 {
    uint32_t h[8];     /* chaining state */
    uint64_t len;      /* bytes consumed so far */
    uint8_t buf[64];   /* a partial 64-byte block */
    size_t nbuf;       /* bytes held in buf (< 64) */
} tl_sha256_ctx;

void tl_sha256_init(tl_sha256_ctx *s);
void tl_sha256_update(tl_sha256_ctx *s, const void *p, size_t n);
/* Writes the digest; s must be initialized again before reuse. */
void tl_sha256_final(tl_sha256_ctx *s, uint8_t out[32]);
/* One-shot digest of p[0..n). */
void tl_sha256(const void *p, size_t n, uint8_t out[32]);

/* CRC32C of p[0..n) continuing from crc: start with 0, and
 * tl_crc32c(tl_crc32c(0, a, na), b, nb) is the CRC of a||b. Uses SSE4.2's
 * crc32 instruction when the CPU has it, else slicing-by-8 tables; both
 * give the same value. */
uint32_t tl_crc32c(uint32_t crc, const void *p, size_t n);
/* The table-driven path alone (tests compare it with the hardware one). */
uint32_t tl_crc32c_sw(uint32_t crc, const void *p, size_t n);
/* 1 when tl_crc32c uses the SSE4.2 instruction on this CPU. */
int tl_crc32c_hw(void);

#endif
