/* fuzz_kv_file.c - libFuzzer target for the spilled KV block format
 * (engine/kv_file.h).
 *
 * Each input is parsed twice with tl_kvf_parse: as it is, and as an
 * exact-size copy whose checksums are recomputed (the header CRC, and when
 * the size fits the header's fields the tokens' and every block's), so
 * mutated fields reach the bounds checks and the accepting path instead of
 * stopping at a CRC. An accepted file has every token and the first and
 * last byte of every physical block read (ASan sees a pointer past the
 * image) and is checked against a fixed expected header, with and without
 * the namespace; an accepted file must agree with tl_kvf_file_size.
 *
 * Seeds: run with TL_FUZZ_WRITE_SEEDS=DIR and the binary writes a few valid
 * files to DIR with tl_kvf_write and exits; tests/fuzz/run_kv_file.sh does
 * that before fuzzing.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hash.h"
#include "kv_file.h"

static volatile uint8_t sink;

/* The header the first seed carries; the fuzzer's checks compare with it. */
static tl_kvf_meta expected(void) {
    tl_kvf_meta m;
    memset(&m, 0, sizeof m);
    tl_sha256("fuzz model", 10, m.model_id);
    strcpy(m.kv_mode, "q8,f16");
    m.block_size = 4, m.depth = 3, m.block_bytes = 40;
    m.loops = 1, m.window = 0, m.salt = 0x5eed, m.lb = 0;
    tl_sha256("block 0", 7, m.key);
    return m;
}

static uint32_t get32(const uint8_t *p) { return (uint32_t)p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t get64(const uint8_t *p) { return get32(p) | (uint64_t)get32(p + 4) << 32; }
static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> 8 * i);
}

static void parse_one(const uint8_t *buf, size_t n) {
    tl_kvf_meta got, want = expected();
    const int32_t *tok;
    const uint8_t *pay;
    char err[256];
    if (tl_kvf_parse(buf, n, &got, &tok, &pay, err, sizeof err)) {
        if (!err[0]) abort(); /* a refusal always says why */
        return;
    }
    if (tl_kvf_file_size(&got) != n) abort();
    uint8_t acc = 0;
    for (int32_t i = 0; i < got.block_size; i++) acc ^= (uint8_t)tok[i];
    for (size_t d = 0; d < (size_t)tl_kvf_n_present(&got); d++) /* the present blocks, and no byte more */
        acc ^= pay[d * got.block_bytes] ^ pay[(d + 1) * got.block_bytes - 1];
    acc ^= (uint8_t)tl_kvf_check(&got, &want, 0, err, sizeof err);
    acc ^= (uint8_t)tl_kvf_check(&got, &want, 1, err, sizeof err);
    acc ^= (uint8_t)strlen(got.kv_mode);
    sink = acc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    parse_one(data, size);
    if (size < TL_KVF_HEADER_BYTES) return 0;

    uint8_t *b = malloc(size);
    memcpy(b, data, size);
    put32(b + 164, tl_crc32c(0, b, 164));
    uint32_t bs = get32(b + 64), depth = get32(b + 68);
    uint64_t bb = get64(b + 72);
    if (bs && bs <= TL_KVF_MAX_BLOCK_SIZE && depth && depth <= TL_KVF_MAX_DEPTH && bb && bb <= TL_KVF_MAX_BLOCK_BYTES) {
        uint64_t bits = TL_KVF_HEADER_BYTES + 4ull * bs, nbits = (depth + 7) / 8, tcrc = bits + nbits;
        uint64_t crcs = tcrc + 4, payload = crcs + 4ull * depth, present = 0;
        for (uint32_t d = 0; bits + nbits <= size && d < depth; d++) present += !(b[bits + d / 8] >> (d % 8) & 1);
        if (bits + nbits <= size && payload + present * bb == size) {
            put32(b + tcrc, tl_crc32c(0, b + TL_KVF_HEADER_BYTES, 4ull * bs + nbits));
            for (uint32_t d = 0, at = 0; d < depth; d++) {
                int has = !(b[bits + d / 8] >> (d % 8) & 1);
                put32(b + crcs + 4 * d, has ? tl_crc32c(0, b + payload + (uint64_t)at++ * bb, bb) : 0);
            }
        }
    }
    parse_one(b, size);
    free(b);
    return 0;
}

/* ---- seed generation ---------------------------------------------------- */

static void write_seed(const char *dir, tl_kvf_meta *m, uint32_t seed) {
    int32_t tokens[TL_KVF_MAX_BLOCK_SIZE];
    static uint8_t payload[4096];
    const void *blocks[16];
    for (int i = 0; i < m->block_size; i++) tokens[i] = (int32_t)(seed * 100 + (uint32_t)i);
    for (size_t i = 0; i < sizeof payload; i++) payload[i] = (uint8_t)((i * 31 + seed) ^ (i >> 7));
    for (int d = 0; d < m->depth; d++) blocks[d] = payload + (size_t)d * m->block_bytes;
    char err[512];
    if (tl_kvf_write(dir, m, tokens, blocks, err, sizeof err)) fprintf(stderr, "fuzz_kv_file: %s\n", err);
}

static void write_seeds(const char *dir) {
    tl_kvf_meta m = expected();
    write_seed(dir, &m, 1); /* the expected header: the checks pass */

    m.block_size = 1, m.depth = 1, m.block_bytes = 1, m.lb = 7;
    strcpy(m.kv_mode, "f16");
    tl_sha256("block 7", 7, m.key);
    write_seed(dir, &m, 2);

    m = expected();
    memset(m.kv_mode, 0, sizeof m.kv_mode);
    strcpy(m.kv_mode, "h:q8");
    m.block_size = 16, m.depth = 6, m.block_bytes = 96, m.loops = 3, m.window = 64, m.lb = 2;
    memcpy(m.parent, m.key, 32);
    tl_sha256("block 2", 7, m.key);
    write_seed(dir, &m, 3);

    m.absent[0] = 0x1e; /* a sliding-window model: layers 1-4 released, 0 and 5 stored */
    tl_sha256("block 3", 7, m.key);
    write_seed(dir, &m, 4);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    const char *dir = getenv("TL_FUZZ_WRITE_SEEDS");
    if (dir) {
        write_seeds(dir);
        exit(0);
    }
    return 0;
}
