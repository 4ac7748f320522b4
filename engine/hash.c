/* hash.c - SHA-256 from FIPS 180-4 and CRC32C (hardware and tables). */
#include "hash.h"

#include <pthread.h>
#include <string.h>

/* ---- SHA-256 (FIPS 180-4, sections 4.1.2, 4.2.2, 5.3.3, 6.2) ------------ */

static const uint32_t K256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static inline uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static void sha256_block(uint32_t h[8], const uint8_t *p) {
    uint32_t w[64];
    for (int t = 0; t < 16; t++)
        w[t] = (uint32_t)p[4 * t] << 24 | (uint32_t)p[4 * t + 1] << 16 | (uint32_t)p[4 * t + 2] << 8 | p[4 * t + 3];
    for (int t = 16; t < 64; t++) {
        uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
        uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
        w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
    for (int t = 0; t < 64; t++) {
        uint32_t t1 = k + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + K256[t] + w[t];
        uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        k = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
    }
    h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += k;
}

void tl_sha256_init(tl_sha256_ctx *s) {
    static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, h0, sizeof h0);
    s->len = 0;
    s->nbuf = 0;
}

void tl_sha256_update(tl_sha256_ctx *s, const void *data, size_t n) {
    const uint8_t *p = data;
    s->len += n;
    if (s->nbuf) {
        size_t take = 64 - s->nbuf < n ? 64 - s->nbuf : n;
        memcpy(s->buf + s->nbuf, p, take);
        s->nbuf += take, p += take, n -= take;
        if (s->nbuf < 64) return;
        sha256_block(s->h, s->buf);
        s->nbuf = 0;
    }
    for (; n >= 64; p += 64, n -= 64) sha256_block(s->h, p);
    if (n) memcpy(s->buf, p, n);
    s->nbuf = n;
}

void tl_sha256_final(tl_sha256_ctx *s, uint8_t out[32]) {
    uint64_t bits = s->len * 8; /* the message length mod 2^64, as the padding wants */
    s->buf[s->nbuf++] = 0x80;
    if (s->nbuf > 56) {
        memset(s->buf + s->nbuf, 0, 64 - s->nbuf);
        sha256_block(s->h, s->buf);
        s->nbuf = 0;
    }
    memset(s->buf + s->nbuf, 0, 56 - s->nbuf);
    for (int i = 0; i < 8; i++) s->buf[56 + i] = (uint8_t)(bits >> (56 - 8 * i));
    sha256_block(s->h, s->buf);
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 4; j++) out[4 * i + j] = (uint8_t)(s->h[i] >> (24 - 8 * j));
}

void tl_sha256(const void *p, size_t n, uint8_t out[32]) {
    tl_sha256_ctx s;
    tl_sha256_init(&s);
    tl_sha256_update(&s, p, n);
    tl_sha256_final(&s, out);
}

/* ---- CRC32C ------------------------------------------------------------- */

/* The reflected Castagnoli polynomial; the running state is the inverted
 * CRC, as the SSE4.2 instruction keeps it. */
#define CRC32C_POLY 0x82F63B78u

static uint32_t crc_tab[8][256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_tables(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ CRC32C_POLY : c >> 1;
        crc_tab[0][i] = c;
    }
    for (int t = 1; t < 8; t++)
        for (int i = 0; i < 256; i++) crc_tab[t][i] = (crc_tab[t - 1][i] >> 8) ^ crc_tab[0][crc_tab[t - 1][i] & 0xff];
}

uint32_t tl_crc32c_sw(uint32_t crc, const void *data, size_t n) {
    const uint8_t *p = data;
    uint32_t c = ~crc;
    pthread_once(&crc_once, crc_tables);
    for (; n >= 8; p += 8, n -= 8) {
        uint32_t lo = c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        uint32_t hi = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 | (uint32_t)p[7] << 24;
        c = crc_tab[7][lo & 0xff] ^ crc_tab[6][(lo >> 8) & 0xff] ^ crc_tab[5][(lo >> 16) & 0xff] ^
            crc_tab[4][lo >> 24] ^ crc_tab[3][hi & 0xff] ^ crc_tab[2][(hi >> 8) & 0xff] ^
            crc_tab[1][(hi >> 16) & 0xff] ^ crc_tab[0][hi >> 24];
    }
    while (n--) c = (c >> 8) ^ crc_tab[0][(c ^ *p++) & 0xff];
    return ~c;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>

__attribute__((target("sse4.2"))) static uint32_t crc32c_hw(uint32_t crc, const void *data, size_t n) {
    const uint8_t *p = data;
    uint64_t c = ~crc;
    for (; n && ((uintptr_t)p & 7); n--) c = _mm_crc32_u8((uint32_t)c, *p++);
    for (; n >= 8; p += 8, n -= 8) {
        uint64_t w;
        memcpy(&w, p, 8); /* little-endian, as the instruction reads it */
        c = _mm_crc32_u64(c, w);
    }
    for (; n; n--) c = _mm_crc32_u8((uint32_t)c, *p++);
    return ~(uint32_t)c;
}

int tl_crc32c_hw(void) {
    static int have = -1; /* racing first calls store the same value */
    if (__atomic_load_n(&have, __ATOMIC_RELAXED) < 0) {
        __builtin_cpu_init();
        __atomic_store_n(&have, __builtin_cpu_supports("sse4.2") ? 1 : 0, __ATOMIC_RELAXED);
    }
    return __atomic_load_n(&have, __ATOMIC_RELAXED);
}

uint32_t tl_crc32c(uint32_t crc, const void *p, size_t n) {
    return tl_crc32c_hw() ? crc32c_hw(crc, p, n) : tl_crc32c_sw(crc, p, n);
}
#else
int tl_crc32c_hw(void) { return 0; }
uint32_t tl_crc32c(uint32_t crc, const void *p, size_t n) { return tl_crc32c_sw(crc, p, n); }
#endif
