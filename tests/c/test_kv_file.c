/* test_kv_file.c - the tier-3 KV block files (engine/kv_file.c) and their
 * digests (engine/hash.c): SHA-256 against the FIPS 180-4 vectors, CRC32C
 * hardware against tables, write/read round trips, a refusal with its own
 * reason for every kind of damaged or foreign file (truncation at every
 * byte, every bit flipped), and concurrent writers of one key beside a
 * reader that must never see a half-written file. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "hash.h"
#include "kv_file.h"
#include "test.h"

/* ---- helpers ------------------------------------------------------------ */

static void fill(void *p, size_t n, uint32_t seed) {
    uint8_t *b = p;
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        b[i] = (uint8_t)(seed >> 24);
    }
}

static void tohex(const uint8_t *d, size_t n, char *out) {
    for (size_t i = 0; i < n; i++) sprintf(out + 2 * i, "%02x", d[i]);
}

static int sha_is(const void *p, size_t n, const char *hexd) {
    uint8_t d[32];
    char h[65];
    tl_sha256(p, n, d);
    tohex(d, 32, h);
    return strcmp(h, hexd) == 0;
}

/* A block's meta and contents; every array is sized for the largest case. */
typedef struct {
    tl_kvf_meta m;
    int32_t *tokens;
    uint8_t *payload; /* depth * block_bytes */
    const void **blocks;
} fixture;

static fixture make(int bs, int depth, uint64_t bb, uint32_t seed) {
    fixture f;
    memset(&f.m, 0, sizeof f.m);
    fill(f.m.model_id, 32, seed + 1);
    snprintf(f.m.kv_mode, sizeof f.m.kv_mode, "q8,f16");
    f.m.block_size = bs, f.m.depth = depth, f.m.block_bytes = bb;
    f.m.loops = 2, f.m.window = 128, f.m.salt = 0x0123456789abcdefull + seed, f.m.lb = 3;
    fill(f.m.key, 32, seed + 2);
    fill(f.m.parent, 32, seed + 3);
    f.tokens = malloc((size_t)bs * sizeof *f.tokens);
    for (int i = 0; i < bs; i++) f.tokens[i] = (int32_t)(seed * 1000 + (uint32_t)i);
    f.payload = malloc((size_t)depth * bb);
    fill(f.payload, (size_t)depth * bb, seed + 4);
    f.blocks = malloc((size_t)depth * sizeof *f.blocks);
    for (int d = 0; d < depth; d++) f.blocks[d] = f.payload + (size_t)d * bb;
    return f;
}

static void unmake(fixture *f) { free(f->tokens), free(f->payload), free(f->blocks); }

static void file_path(const char *dir, const uint8_t key[32], char *out, size_t cap) {
    char name[TL_KVF_NAME_BYTES];
    tl_kvf_name(key, name);
    snprintf(out, cap, "%s/%s", dir, name);
}

static uint8_t *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    rewind(f);
    uint8_t *b = malloc(*n ? *n : 1);
    if (fread(b, 1, *n, f) != *n) *n = 0;
    fclose(f);
    return b;
}

/* Parses an exact-size heap copy (ASan sees any over-read); 0 when refused
 * with a non-empty reason, which goes to why. */
static int refused_here(const uint8_t *img, size_t n, char *why, size_t cap) {
    tl_kvf_meta got;
    const int32_t *tok;
    const uint8_t *pay;
    why[0] = 0;
    return tl_kvf_parse(img, n, &got, &tok, &pay, why, cap) == -1 && why[0] ? 0 : -1;
}

static int refused(const uint8_t *img, size_t n, char *why, size_t cap) {
    uint8_t *copy = malloc(n ? n : 1);
    memcpy(copy, img, n);
    int rc = refused_here(copy, n, why, cap);
    free(copy);
    return rc;
}

static void expect_refusal(const uint8_t *img, size_t n, const char *phrase, const char *what) {
    char why[256];
    int rc = refused(img, n, why, sizeof why);
    if (getenv("TL_TEST_VERBOSE")) printf("  %s: %s\n", what, why);
    CHECK(rc == 0 && strstr(why, phrase), "%s is refused with \"%s\" (got \"%s\")", what, phrase, why);
}

static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static void fix_header_crc(uint8_t *img) { put32(img + 164, tl_crc32c(0, img, 164)); }

/* Entries of dir other than finished .tlkv files (temp files left behind). */
static int stray_files(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && (len < 5 || strcmp(e->d_name + len - 5, ".tlkv")))
            n++;
    }
    if (d) closedir(d);
    return n;
}

static void remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    char p[1024];
    for (struct dirent *e; d && (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (rmdir(p)) unlink(p);
    }
    if (d) closedir(d);
    rmdir(dir);
}

/* ---- 1. SHA-256 and CRC32C ---------------------------------------------- */

static void test_sha256(void) {
    CHECK(sha_is("", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"), "SHA-256 of \"\"");
    CHECK(sha_is("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"), "SHA-256 of \"abc\"");
    const char *m448 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    CHECK(sha_is(m448, strlen(m448), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"),
          "SHA-256 of the 448-bit message");
    const char *m896 = "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmno"
                       "ijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu";
    CHECK(sha_is(m896, strlen(m896), "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"),
          "SHA-256 of the 896-bit message");
    size_t n = 1000000;
    char *a = malloc(n);
    memset(a, 'a', n);
    CHECK(sha_is(a, n, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"),
          "SHA-256 of one million 'a'");

    /* Incremental updates of odd sizes (across the 55/56/64-byte padding edges) equal one shot. */
    fill(a, 5000, 7);
    int bad = 0;
    for (size_t len = 0; len < 300 + 4700 * (len > 200); len += 1 + (len > 200) * 37) {
        uint8_t one[32], inc[32];
        tl_sha256(a, len, one);
        tl_sha256_ctx s;
        tl_sha256_init(&s);
        for (size_t off = 0, step = 1; off < len; off += step, step = step * 3 % 71 + 1)
            tl_sha256_update(&s, a + off, step < len - off ? step : len - off);
        tl_sha256_final(&s, inc);
        if (memcmp(one, inc, 32)) bad++;
    }
    CHECK(bad == 0, "incremental SHA-256 in odd pieces equals one shot (%d lengths differ)", bad);
    free(a);
}

static void test_crc32c(void) {
    CHECK(tl_crc32c(0, "123456789", 9) == 0xE3069283u, "CRC32C(\"123456789\") is 0xE3069283 (got 0x%08X)",
          tl_crc32c(0, "123456789", 9));
    CHECK(tl_crc32c_sw(0, "123456789", 9) == 0xE3069283u, "table CRC32C(\"123456789\") is 0xE3069283");
    CHECK(tl_crc32c(0, "", 0) == 0 && tl_crc32c(0x1234, "", 0) == 0x1234, "an empty input leaves the CRC as it was");
    printf("  CRC32C: %s path\n", tl_crc32c_hw() ? "SSE4.2" : "table");

    size_t cap = 70000;
    uint8_t *buf = malloc(cap + 16);
    fill(buf, cap + 16, 99);
    int bad = 0, lengths = 0;
    for (size_t len = 0; len <= cap; len = len < 300 ? len + 1 : len * 3 / 2 + 7) {
        for (size_t al = 0; al < 16; al++) {
            uint32_t hw = tl_crc32c(0, buf + al, len), sw = tl_crc32c_sw(0, buf + al, len);
            if (hw != sw) bad++;
        }
        lengths++;
    }
    CHECK(bad == 0, "tl_crc32c equals the table path on %d lengths x 16 alignments (%d differ)", lengths, bad);

    bad = 0;
    for (size_t cut = 0; cut <= 1000; cut += 7) {
        uint32_t whole = tl_crc32c(0, buf, 1000);
        if (tl_crc32c(tl_crc32c(0, buf, cut), buf + cut, 1000 - cut) != whole) bad++;
        if (tl_crc32c_sw(tl_crc32c(0, buf, cut), buf + cut, 1000 - cut) != whole) bad++;
    }
    CHECK(bad == 0, "chained CRC32C over a||b equals the CRC of the whole, mixing both paths (%d differ)", bad);
    free(buf);
}

/* ---- 2. round trip ------------------------------------------------------ */

static void test_round_trip(const char *dir) {
    fixture f = make(16, 5, 1000, 1);
    char err[512], path[1024], name[TL_KVF_NAME_BYTES];
    tl_kvf_name(f.m.key, name);
    CHECK(strlen(name) == 69 && !strcmp(name + 64, ".tlkv") && strspn(name, "0123456789abcdef") == 64,
          "the file name is 64 lowercase hex digits + .tlkv (%s)", name);
    CHECK(tl_kvf_file_size(&f.m) == 168 + 16 * 4 + 1 + 4 + 5 * 4 + 5000, "the file size adds up (%zu)",
          tl_kvf_file_size(&f.m));

    int rc = tl_kvf_write(dir, &f.m, f.tokens, f.blocks, err, sizeof err);
    CHECK(rc == 0, "a block is written (%s)", rc ? err : "");
    file_path(dir, f.m.key, path, sizeof path);
    struct stat st;
    CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0600, "the file has mode 0600 (%o)", st.st_mode & 0777);
    CHECK((size_t)st.st_size == tl_kvf_file_size(&f.m), "the file is tl_kvf_file_size bytes");
    CHECK(stray_files(dir) == 0, "no temp file is left behind");

    int32_t tok[16];
    uint8_t *pay = malloc(5000);
    rc = tl_kvf_read(path, &f.m, 1, 1 << 20, tok, pay, 5000, err, sizeof err);
    CHECK(rc == 0, "the block reads back (%s)", rc ? err : "");
    CHECK(!memcmp(tok, f.tokens, sizeof tok) && !memcmp(pay, f.payload, 5000), "tokens and payload round-trip");

    size_t n;
    uint8_t *img = slurp(path, &n);
    tl_kvf_meta got;
    const int32_t *t;
    const uint8_t *p;
    rc = tl_kvf_parse(img, n, &got, &t, &p, err, sizeof err);
    CHECK(rc == 0 && !memcmp(&got.model_id, f.m.model_id, 32) && !strcmp(got.kv_mode, "q8,f16") &&
              got.block_size == 16 && got.depth == 5 && got.block_bytes == 1000 && got.loops == 2 &&
              got.window == 128 && got.salt == f.m.salt && got.lb == 3 && !memcmp(got.key, f.m.key, 32) &&
              !memcmp(got.parent, f.m.parent, 32),
          "every header field parses back");
    CHECK(rc == 0 && (const uint8_t *)t == img + 168 && p == img + n - 5000, "tokens and payload point into the image");

    /* Rewriting the same key replaces the file whole. */
    fill(f.payload, 5000, 4242);
    rc = tl_kvf_write(dir, &f.m, f.tokens, f.blocks, err, sizeof err);
    CHECK(rc == 0 && tl_kvf_read(path, &f.m, 1, 1 << 20, tok, pay, 5000, err, sizeof err) == 0 &&
              !memcmp(pay, f.payload, 5000),
          "a second write of the key replaces the first");
    CHECK(stray_files(dir) == 0, "no temp file is left after the rewrite");

    /* Limits the writer shares with the reader. */
    tl_kvf_meta bad = f.m;
    bad.block_size = 0;
    CHECK(tl_kvf_write(dir, &bad, f.tokens, f.blocks, err, sizeof err) == -1 && strstr(err, "block size 0"),
          "a writer refuses block size 0 (%s)", err);
    bad = f.m;
    memset(bad.kv_mode, 'x', 16);
    CHECK(tl_kvf_write(dir, &bad, f.tokens, f.blocks, err, sizeof err) == -1 && strstr(err, "NUL-terminated"),
          "a writer refuses an unterminated KV mode (%s)", err);
    bad = f.m;
    memcpy(bad.kv_mode, "f16\0junk", 8);
    char path2[1024];
    file_path(dir, bad.key, path2, sizeof path2);
    CHECK(tl_kvf_write(dir, &bad, f.tokens, f.blocks, err, sizeof err) == 0 &&
              tl_kvf_read(path2, &bad, 1, 1 << 20, tok, pay, 5000, err, sizeof err) == 0,
          "bytes after the KV mode's NUL in the caller's meta are not written (%s)", err);
    char missing[1100];
    snprintf(missing, sizeof missing, "%s/no/such/dir", dir);
    rc = tl_kvf_write(missing, &f.m, f.tokens, f.blocks, err, sizeof err);
    CHECK(rc == -1 && strstr(err, missing) && strstr(err, "No such file or directory"),
          "writing into a missing directory names the path and the errno text (%s)", err);
    CHECK(stray_files(dir) == 0, "failed writes leave no temp file");
    free(img), free(pay);
    unmake(&f);
}

/* ---- 3. refusals -------------------------------------------------------- */

/* Every truncation and every bit flipped in the header, tokens and CRCs is
 * refused, and so is every payload bit and truncation inside the payload
 * (or, with payload_samples, that many flips and every 997th length). */
static void damage_everywhere(const uint8_t *img, size_t n, size_t payload_off, int payload_samples, const char *what) {
    char why[256];
    int accepted = 0;
    size_t first = 0;
    size_t lengths = 0;
    for (size_t len = 0; len < n; len += payload_samples && len > payload_off ? 997 : 1, lengths++)
        if (refused(img, len, why, sizeof why) && !accepted++) first = len;
    CHECK(accepted == 0, "%s: each of %zu truncations (0..%zu bytes) is refused (%d accepted, first at %zu)", what,
          lengths, n - 1, accepted, first);
    uint8_t *copy = malloc(n + 1);
    memcpy(copy, img, n);
    copy[n] = 0;
    CHECK(refused_here(copy, n + 1, why, sizeof why) == 0 && strstr(why, "header says"),
          "%s: a byte appended is refused (%s)", what, why);
    free(copy);
    copy = malloc(n); /* exact size, flipped in place: ASan sees any over-read */
    memcpy(copy, img, n);

    accepted = 0;
    size_t bits = payload_samples ? payload_off * 8 + (size_t)payload_samples : n * 8, flips = 0;
    uint32_t seed = 12345;
    for (size_t i = 0; i < bits; i++, flips++) {
        size_t bit = i;
        if (i >= payload_off * 8 && payload_samples) {
            seed = seed * 1664525u + 1013904223u;
            bit = payload_off * 8 + (size_t)seed % ((n - payload_off) * 8);
        }
        copy[bit / 8] ^= (uint8_t)(1u << bit % 8);
        if (refused_here(copy, n, why, sizeof why) && !accepted++) first = bit;
        copy[bit / 8] ^= (uint8_t)(1u << bit % 8);
    }
    CHECK(accepted == 0, "%s: each of %zu single-bit flips is refused (%d accepted, first bit %zu)", what, flips,
          accepted, first);
    free(copy);
}

static void test_refusals(const char *dir) {
    fixture f = make(4, 3, 40, 2);
    char err[512], path[1024];
    CHECK(tl_kvf_write(dir, &f.m, f.tokens, f.blocks, err, sizeof err) == 0, "the small block is written (%s)", err);
    file_path(dir, f.m.key, path, sizeof path);
    size_t n;
    uint8_t *img = slurp(path, &n), *b = malloc(n + 4);
    CHECK(n == 321, "the small file is 321 bytes (%zu)", n);
    damage_everywhere(img, n, 201, 0, "small file");

#define MUTATE(stmt, fix, phrase, what)                                                                              \
    do {                                                                                                             \
        memcpy(b, img, n);                                                                                           \
        stmt;                                                                                                        \
        if (fix) fix_header_crc(b);                                                                                  \
        expect_refusal(b, n, phrase, what);                                                                          \
    } while (0)
    MUTATE(b[0] = 'X', 0, "bad magic", "a wrong magic");
    MUTATE(put32(b + 8, 7), 0, "format version 7, expected 1", "format version 7");
    MUTATE(put32(b + 12, 200), 0, "header length 200, expected 168", "a header length of 200");
    MUTATE(b[20] ^= 1, 0, "header checksum", "a changed model id without its CRC");
    MUTATE(memset(b + 48, 'a', 16), 1, "not NUL-terminated", "an unterminated KV mode");
    MUTATE(memset(b + 48, 0, 16), 1, "KV mode is empty", "an empty KV mode");
    MUTATE(b[48] = 1, 1, "not printable", "a KV mode with a control byte");
    MUTATE(b[48 + 10] = 'x', 1, "not zero", "a KV mode with bytes after its NUL");
    MUTATE(put32(b + 64, 0), 1, "block size 0 outside 1..4096", "block size 0");
    MUTATE(put32(b + 64, 4097), 1, "block size 4097 outside", "block size 4097");
    MUTATE(put32(b + 68, 0), 1, "depth 0 outside", "depth 0");
    MUTATE(put32(b + 68, 0xffffffffu), 1, "depth -1 outside", "depth -1");
    MUTATE(put64(b + 72, 0), 1, "block bytes 0 outside", "block bytes 0");
    MUTATE(put64(b + 72, ((uint64_t)1 << 30) + 1), 1, "block bytes 1073741825 outside", "block bytes 2^30 + 1");
    MUTATE(put64(b + 72, UINT64_MAX), 1, "block bytes 18446744073709551615 outside", "block bytes 2^64 - 1");
    MUTATE(put32(b + 80, 0xffffffffu), 1, "loops -1 and window 128 must be >= 0", "loops -1");
    MUTATE(put32(b + 96, 0xffffffffu), 1, "logical block -1", "logical block -1");
    MUTATE(put32(b + 96, 0x7fffffffu), 1, "outside the positions", "a logical block past INT32_MAX positions");
    MUTATE(put32(b + 64, 5), 1, "", "a block size the size disagrees with"); /* moves the bitmap: any reason */
    MUTATE(put32(b + 68, 4096), 1, "shorter than its tokens and bitmap", "depth 4096 in a small file");
    MUTATE(put64(b + 72, (uint64_t)1 << 30), 1, "header says 3221225673", "block bytes 2^30 in a small file");
    MUTATE(b[170] ^= 0x80, 0, "tokens checksum 0x", "a changed token");
    MUTATE(b[201 + 2 * 40 + 5] ^= 4, 0, "block 2 checksum 0x", "a changed byte in block 2");
    MUTATE(b[189 + 4] ^= 1, 0, "block 1 checksum 0x", "a changed CRC of block 1");
#undef MUTATE
    memcpy(b + 1, img, n - 1);
    tl_kvf_meta got;
    const int32_t *t;
    const uint8_t *p;
    CHECK(tl_kvf_parse(b + 1, n - 1, &got, &t, &p, err, sizeof err) == -1 && strstr(err, "4-byte aligned"),
          "a misaligned buffer is refused (%s)", err);
    free(b), free(img);
    unmake(&f);

    f = make(16, 8, 32768, 3);
    CHECK(tl_kvf_write(dir, &f.m, f.tokens, f.blocks, err, sizeof err) == 0, "the big block is written (%s)", err);
    file_path(dir, f.m.key, path, sizeof path);
    img = slurp(path, &n);
    damage_everywhere(img, n, n - 8 * 32768, 400, "big file (payload sampled)");
    free(img);
    unmake(&f);
}

static void test_check(void) {
    fixture f = make(4, 3, 40, 5);
    tl_kvf_meta e;
    char err[512];
    CHECK(tl_kvf_check(&f.m, &f.m, 1, err, sizeof err) == 0, "a header matches itself");
#define EXPECT(stmt, ns, phrase, what)                                                                               \
    do {                                                                                                             \
        e = f.m;                                                                                                     \
        stmt;                                                                                                        \
        err[0] = 0;                                                                                                  \
        int rc_ = tl_kvf_check(&f.m, &e, ns, err, sizeof err);                                                       \
        if (getenv("TL_TEST_VERBOSE")) printf("  %s: %s\n", what, err);                                              \
        if (phrase) CHECK(rc_ == -1 && strstr(err, phrase ? phrase : ""), "%s is refused with \"%s\" (got \"%s\")", \
                          what, phrase ? phrase : "", err);                                                          \
        else CHECK(rc_ == 0, "%s is accepted (%s)", what, err);                                                      \
    } while (0)
    EXPECT(e.model_id[31] ^= 1, 0, "another model", "another model id");
    EXPECT(strcpy(e.kv_mode, "f16"), 0, "KV mode q8,f16, expected f16", "another KV mode");
    EXPECT(e.block_size = 32, 0, "block size 4, expected 32", "another block size");
    EXPECT(e.depth = 6, 0, "depth 3, expected 6", "another depth");
    EXPECT(e.block_bytes = 48, 0, "block bytes 40, expected 48", "another block_bytes");
    EXPECT(e.loops = 3, 1, "loops 2, expected 3", "other loops with check_ns");
    EXPECT(e.window = 0, 1, "window 128, expected 0", "another window with check_ns");
    EXPECT(e.salt = 7, 1, "expected 0x0000000000000007", "another salt with check_ns");
    EXPECT(e.key[0] ^= 1, 1, "key ", "another key with check_ns");
    EXPECT((e.loops = 3, e.window = 0, e.salt = 7, e.key[0] ^= 1), 0, NULL,
           "another namespace and key without check_ns");
    EXPECT((e.lb = 9, e.parent[0] ^= 1), 1, NULL, "another lb and parent");
#undef EXPECT
    unmake(&f);
}

static void test_read_errors(const char *dir) {
    fixture f = make(4, 3, 40, 6);
    char err[1024], path[1024];
    int32_t tok[4];
    uint8_t pay[120];
    tl_kvf_write(dir, &f.m, f.tokens, f.blocks, err, sizeof err);
    file_path(dir, f.m.key, path, sizeof path);
#define READ_FAILS(p, e, ns, max, cap, phrase, what)                                                                 \
    do {                                                                                                             \
        err[0] = 0;                                                                                                  \
        int rc_ = tl_kvf_read(p, e, ns, max, tok, pay, cap, err, sizeof err);                                        \
        if (getenv("TL_TEST_VERBOSE")) printf("  %s: %s\n", what, err);                                              \
        CHECK(rc_ == -1 && strstr(err, p) && strstr(err, phrase), "%s: refused with the path and \"%s\" (got \"%s\")", \
              what, phrase, err);                                                                                    \
    } while (0)
    READ_FAILS(path, &f.m, 1, 319, sizeof pay, "file is 321 bytes, over the limit of 319", "a file over max_bytes");
    READ_FAILS(path, &f.m, 1, 1 << 20, 119, "payload is 120 bytes, room for 119", "a payload buffer too small");
    READ_FAILS(dir, &f.m, 1, 1 << 20, sizeof pay, "is a directory", "a directory");
    char missing[1100];
    snprintf(missing, sizeof missing, "%s/missing.tlkv", dir);
    READ_FAILS(missing, &f.m, 1, 1 << 20, sizeof pay, "No such file or directory", "a missing path");
    tl_kvf_meta e = f.m;
    strcpy(e.kv_mode, "f16");
    READ_FAILS(path, &e, 1, 1 << 20, sizeof pay, "KV mode q8,f16, expected f16", "another KV mode");
    e = f.m;
    e.salt ^= 1;
    READ_FAILS(path, &e, 1, 1 << 20, sizeof pay, "salt 0x", "another salt with check_ns");
    CHECK(tl_kvf_read(path, &e, 0, 1 << 20, tok, pay, sizeof pay, err, sizeof err) == 0,
          "another salt reads without check_ns (%s)", err);
    char junk[1100];
    snprintf(junk, sizeof junk, "%s/junk.tlkv", dir);
    FILE *fp = fopen(junk, "wb");
    fputs("not a KV block file, but long enough to hold a magic and a version", fp);
    fclose(fp);
    READ_FAILS(junk, &f.m, 1, 1 << 20, sizeof pay, "bad magic", "a file of text");
    fp = fopen(junk, "wb");
    fclose(fp);
    READ_FAILS(junk, &f.m, 1, 1 << 20, sizeof pay, "file is 0 bytes, shorter than", "an empty file");
    unlink(junk);
#undef READ_FAILS
    unmake(&f);
}

/* ---- 4. concurrent writers and a reader --------------------------------- */

/* Two processes write the same key 200 times each, each with contents of
 * its own; the parent reads it all the while: every read must succeed and
 * give one writer's tokens and payload, never a mix or a partial file. */
static void test_concurrency(const char *dir) {
    enum { BS = 16, DEPTH = 4, BB = 16384, WRITES = 200 };
    fixture w[2] = {make(BS, DEPTH, BB, 10), make(BS, DEPTH, BB, 11)};
    memcpy(w[1].m.model_id, w[0].m.model_id, 32); /* same identity, different contents */
    memcpy(w[1].m.key, w[0].m.key, 32);
    memcpy(w[1].m.parent, w[0].m.parent, 32);
    w[1].m.salt = w[0].m.salt;
    char err[512], path[1024];
    file_path(dir, w[0].m.key, path, sizeof path);
    CHECK(tl_kvf_write(dir, &w[0].m, w[0].tokens, w[0].blocks, err, sizeof err) == 0,
          "the shared key is written first (%s)", err);

    pid_t pid[2];
    for (int i = 0; i < 2; i++) {
        pid[i] = fork();
        if (pid[i] == 0) {
            for (int k = 0; k < WRITES; k++)
                if (tl_kvf_write(dir, &w[i].m, w[i].tokens, w[i].blocks, err, sizeof err)) {
                    fprintf(stderr, "writer %d: %s\n", i, err);
                    _exit(1);
                }
            _exit(0);
        }
    }
    int32_t tok[BS];
    uint8_t *pay = malloc(DEPTH * BB);
    int reads = 0, failed = 0, mixed = 0, seen[2] = {0, 0}, live = 2, status[2] = {0, 0}, done[2] = {0, 0};
    char first_err[512] = "";
    while (live) {
        if (tl_kvf_read(path, &w[0].m, 1, 1 << 20, tok, pay, DEPTH * BB, err, sizeof err)) {
            if (!failed++) snprintf(first_err, sizeof first_err, "%s", err);
        } else {
            int which = tok[0] == w[1].tokens[0];
            if (memcmp(tok, w[which].tokens, sizeof tok) || memcmp(pay, w[which].payload, DEPTH * BB)) mixed++;
            seen[which]++;
        }
        reads++;
        for (int i = 0; i < 2; i++)
            if (!done[i] && waitpid(pid[i], &status[i], WNOHANG) == pid[i]) done[i] = 1, live--;
    }
    printf("  concurrency: %d reads (%d of writer 0, %d of writer 1)\n", reads, seen[0], seen[1]);
    CHECK(WIFEXITED(status[0]) && WEXITSTATUS(status[0]) == 0 && WIFEXITED(status[1]) && WEXITSTATUS(status[1]) == 0,
          "both writers finish their %d writes", WRITES);
    CHECK(failed == 0, "every one of %d reads during the writes parses and checks (%d failed: %s)", reads, failed,
          first_err);
    CHECK(mixed == 0, "every read gives one writer's whole block (%d mixed)", mixed);
    CHECK(stray_files(dir) == 0, "the writers leave no temp files");
    free(pay);
    unmake(&w[0]), unmake(&w[1]);
}

/* A sliding-window model's block: released layers are marked absent, not
 * stored, and come back as exactly the present blocks in layer order. */
static void test_absent(const char *dir) {
    fixture f = make(8, 6, 100, 77);
    f.m.absent[0] = 0x0e; /* layers 1, 2, 3 released */
    char err[512], path[512];
    CHECK(tl_kvf_n_present(&f.m) == 3 && !tl_kvf_has(&f.m, 2) && tl_kvf_has(&f.m, 4), "three of six blocks present");
    CHECK(tl_kvf_file_size(&f.m) == 168 + 8 * 4 + 1 + 4 + 6 * 4 + 3 * 100, "only present blocks take room (%zu)",
          tl_kvf_file_size(&f.m));
    f.blocks[1] = f.blocks[2] = f.blocks[3] = NULL; /* never read */
    int rc = tl_kvf_write(dir, &f.m, f.tokens, f.blocks, err, sizeof err);
    CHECK(rc == 0, "a block with absent layers is written (%s)", rc ? err : "");
    file_path(dir, f.m.key, path, sizeof path);
    size_t n;
    uint8_t *img = slurp(path, &n);
    tl_kvf_meta got;
    const int32_t *t;
    const uint8_t *p;
    rc = img ? tl_kvf_parse(img, n, &got, &t, &p, err, sizeof err) : -1;
    CHECK(rc == 0 && got.absent[0] == 0x0e && !memcmp(p, f.payload, 100) && !memcmp(p + 100, f.payload + 400, 200),
          "the bitmap parses back and the payload is blocks 0, 4, 5 (%s)", rc ? err : "");
    if (img) {
        size_t bits = 168 + 8 * 4;
        img[bits] ^= 0x10; /* claim layer 4 absent too */
        CHECK(tl_kvf_parse(img, n, &got, &t, &p, err, sizeof err) != 0, "a flipped bitmap bit is refused (%s)", err);
        img[bits] ^= 0x10;
        img[bits] |= 0x80; /* past depth 6 */
        CHECK(tl_kvf_parse(img, n, &got, &t, &p, err, sizeof err) != 0, "a bit past depth is refused (%s)", err);
        free(img);
    }
    f.m.absent[0] = 0x3f;
    CHECK(tl_kvf_write(dir, &f.m, f.tokens, f.blocks, err, sizeof err) != 0 && strstr(err, "absent"),
          "a block with every layer absent is not written (%s)", err);
    f.m.absent[0] = 0x41;
    CHECK(tl_kvf_write(dir, &f.m, f.tokens, f.blocks, err, sizeof err) != 0 && strstr(err, "absent"),
          "an absent bit past depth is not written (%s)", err);
    f.blocks[1] = f.blocks[2] = f.blocks[3] = f.payload;
    unmake(&f);
}

int main(void) {
    char dir[] = "/tmp/tl_kv_file_XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_sha256();
    test_crc32c();
    test_round_trip(dir);
    test_absent(dir);
    test_refusals(dir);
    test_check();
    test_read_errors(dir);
    test_concurrency(dir);
    remove_dir(dir);
    return test_summary();
}
