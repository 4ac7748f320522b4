/* kv_file.c - writing, parsing and checking spilled KV block files (the
 * layout is drawn in kv_file.h). */
#include "kv_file.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "hash.h"
#include "util.h"

/* Tokens and the payload are handed out as pointers into the image. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kv_file.c assumes a little-endian host"
#endif

/* A checksum computed over the bytes, then the one the file stores. */
#define CRC_DIFF "0x%08" PRIx32 " != 0x%08" PRIx32 " in the file"

static const uint8_t MAGIC[8] = {'T', 'L', 'K', 'V', 'B', 'L', 'K', 0};

TL_PRINTF(3, 4) static int fail(char *err, size_t cap, const char *fmt, ...) {
    if (err && cap) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, cap, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static const char *errtext(int e, char *buf, size_t cap) { return strerror_r(e, buf, cap); } /* GNU variant */

static void hex(const uint8_t *p, size_t n, char *out) {
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) out[2 * i] = digits[p[i] >> 4], out[2 * i + 1] = digits[p[i] & 15];
    out[2 * n] = 0;
}

/* ---- the header, field by field ----------------------------------------- */

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> 8 * i);
}
static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> 8 * i);
}
static uint32_t get32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32; }

static void encode_header(uint8_t h[TL_KVF_HEADER_BYTES], const tl_kvf_meta *m) {
    memcpy(h, MAGIC, 8);
    put32(h + 8, TL_KVF_VERSION);
    put32(h + 12, TL_KVF_HEADER_BYTES);
    memcpy(h + 16, m->model_id, 32);
    memset(h + 48, 0, 16);
    memcpy(h + 48, m->kv_mode, strnlen(m->kv_mode, 16));
    put32(h + 64, (uint32_t)m->block_size);
    put32(h + 68, (uint32_t)m->depth);
    put64(h + 72, m->block_bytes);
    put32(h + 80, (uint32_t)m->loops);
    put32(h + 84, (uint32_t)m->window);
    put64(h + 88, m->salt);
    put32(h + 96, (uint32_t)m->lb);
    memcpy(h + 100, m->key, 32);
    memcpy(h + 132, m->parent, 32);
    put32(h + 164, tl_crc32c(0, h, 164));
}

static void decode_header(const uint8_t *h, tl_kvf_meta *m) {
    memcpy(m->model_id, h + 16, 32);
    memcpy(m->kv_mode, h + 48, 16);
    m->block_size = (int32_t)get32(h + 64);
    m->depth = (int32_t)get32(h + 68);
    m->block_bytes = get64(h + 72);
    m->loops = (int32_t)get32(h + 80);
    m->window = (int32_t)get32(h + 84);
    m->salt = get64(h + 88);
    m->lb = (int32_t)get32(h + 96);
    memcpy(m->key, h + 100, 32);
    memcpy(m->parent, h + 132, 32);
}

/* The bounds both the writer and the reader hold a header to. kv_mode must
 * be a non-empty printable name, NUL-terminated; in a file also zero-filled
 * (the writer zero-fills, so bytes after a caller's NUL do not matter). */
static int meta_valid(const tl_kvf_meta *m, int from_file, char *err, size_t cap) {
    size_t len = strnlen(m->kv_mode, 16);
    if (len == 0 || len == 16) return fail(err, cap, len ? "KV mode is not NUL-terminated" : "KV mode is empty");
    for (size_t i = 0; i < (from_file ? 16 : len); i++) {
        unsigned char c = (unsigned char)m->kv_mode[i];
        if (i < len ? (c < 0x21 || c > 0x7e) : c != 0)
            return fail(err, cap, "KV mode byte %zu is 0x%02x, not %s", i, c, i < len ? "printable" : "zero");
    }
    if (m->block_size < 1 || m->block_size > TL_KVF_MAX_BLOCK_SIZE)
        return fail(err, cap, "block size %" PRId32 " outside 1..%d", m->block_size, TL_KVF_MAX_BLOCK_SIZE);
    if (m->depth < 1 || m->depth > TL_KVF_MAX_DEPTH)
        return fail(err, cap, "depth %" PRId32 " outside 1..%d", m->depth, TL_KVF_MAX_DEPTH);
    if (m->block_bytes < 1 || m->block_bytes > TL_KVF_MAX_BLOCK_BYTES)
        return fail(err, cap, "block bytes %" PRIu64 " outside 1..%" PRIu64, m->block_bytes, TL_KVF_MAX_BLOCK_BYTES);
    if (m->loops < 0 || m->window < 0)
        return fail(err, cap, "loops %" PRId32 " and window %" PRId32 " must be >= 0", m->loops, m->window);
    if (m->lb < 0 || (int64_t)(m->lb + (int64_t)1) * m->block_size > INT32_MAX)
        return fail(err, cap, "logical block %" PRId32 " x block size %" PRId32 " is outside the positions",
                    m->lb, m->block_size);
    return 0;
}

int tl_kvf_n_present(const tl_kvf_meta *m) {
    int n = 0;
    for (int d = 0; d < m->depth && d < TL_KVF_MAX_DEPTH; d++) n += tl_kvf_has(m, d);
    return n;
}

static size_t bitmap_bytes(const tl_kvf_meta *m) { return ((size_t)m->depth + 7) / 8; }

/* Offsets of the sections after the header; 0 on overflow. The bitmap
 * starts at tcrc_off - bitmap_bytes. */
static size_t layout(const tl_kvf_meta *m, size_t *tcrc_off, size_t *crcs_off, size_t *payload_off) {
    size_t tok, crcs, pay, total, bits;
    if (m->block_size < 0 || m->depth < 0 || m->depth > TL_KVF_MAX_DEPTH || m->block_bytes > SIZE_MAX) return 0;
    if (tl_mul_size((size_t)m->block_size, 4, &tok) || tl_add_size(tok, TL_KVF_HEADER_BYTES, &bits) ||
        tl_add_size(bits, bitmap_bytes(m), tcrc_off) || tl_add_size(*tcrc_off, 4, crcs_off) ||
        tl_mul_size((size_t)m->depth, 4, &crcs) || tl_add_size(*crcs_off, crcs, payload_off) ||
        tl_mul_size((size_t)tl_kvf_n_present(m), (size_t)m->block_bytes, &pay) ||
        tl_add_size(*payload_off, pay, &total))
        return 0;
    return total;
}

size_t tl_kvf_file_size(const tl_kvf_meta *m) {
    size_t a, b, c;
    return layout(m, &a, &b, &c);
}

void tl_kvf_name(const uint8_t key[32], char *out) {
    hex(key, 32, out);
    memcpy(out + 64, ".tlkv", 6);
}

/* ---- parse and check ---------------------------------------------------- */

int tl_kvf_parse(const uint8_t *buf, size_t n, tl_kvf_meta *got, const int32_t **tokens, const uint8_t **payload,
                 char *err, size_t cap) {
    if ((uintptr_t)buf & 3) return fail(err, cap, "buffer is not 4-byte aligned");
    if (n >= 8 && memcmp(buf, MAGIC, 8)) return fail(err, cap, "bad magic");
    if (n >= 12 && get32(buf + 8) != TL_KVF_VERSION)
        return fail(err, cap, "format version %" PRIu32 ", expected %d", get32(buf + 8), TL_KVF_VERSION);
    if (n >= 16 && get32(buf + 12) != TL_KVF_HEADER_BYTES)
        return fail(err, cap, "header length %" PRIu32 ", expected %d", get32(buf + 12), TL_KVF_HEADER_BYTES);
    if (n < TL_KVF_HEADER_BYTES)
        return fail(err, cap, "file is %zu bytes, shorter than the %d-byte header", n, TL_KVF_HEADER_BYTES);
    uint32_t want = get32(buf + 164), have = tl_crc32c(0, buf, 164);
    if (want != have) return fail(err, cap, "header checksum " CRC_DIFF, have, want);

    tl_kvf_meta m;
    memset(&m, 0, sizeof m);
    decode_header(buf, &m);
    if (meta_valid(&m, 1, err, cap)) return -1;
    size_t bits_off = TL_KVF_HEADER_BYTES + 4 * (size_t)m.block_size; /* both bounded by meta_valid */
    if (n < bits_off + bitmap_bytes(&m))
        return fail(err, cap, "file is %zu bytes, shorter than its tokens and bitmap", n);
    memcpy(m.absent, buf + bits_off, bitmap_bytes(&m));
    if (m.depth % 8 && m.absent[m.depth / 8] >> (m.depth % 8))
        return fail(err, cap, "absent bits set past depth %" PRId32, m.depth);
    if (tl_kvf_n_present(&m) == 0) return fail(err, cap, "every block is absent");
    size_t tcrc_off, crcs_off, payload_off, total = layout(&m, &tcrc_off, &crcs_off, &payload_off);
    if (!total) return fail(err, cap, "sizes in the header overflow (depth %" PRId32 " x %" PRIu64 " bytes)", m.depth,
                            m.block_bytes);
    if (n != total) return fail(err, cap, "file is %zu bytes, header says %zu", n, total);

    want = get32(buf + tcrc_off), have = tl_crc32c(0, buf + TL_KVF_HEADER_BYTES, tcrc_off - TL_KVF_HEADER_BYTES);
    if (want != have) return fail(err, cap, "tokens checksum " CRC_DIFF, have, want);
    const uint8_t *pay = buf + payload_off;
    size_t at = 0;
    for (int32_t d = 0; d < m.depth; d++) {
        want = get32(buf + crcs_off + 4 * (size_t)d);
        have = tl_kvf_has(&m, d) ? tl_crc32c(0, pay + at++ * m.block_bytes, m.block_bytes) : 0;
        if (want != have)
            return fail(err, cap, "block %" PRId32 " checksum " CRC_DIFF, d, have, want);
    }
    *got = m;
    *tokens = (const int32_t *)(const void *)(buf + TL_KVF_HEADER_BYTES);
    *payload = pay;
    return 0;
}

int tl_kvf_check(const tl_kvf_meta *got, const tl_kvf_meta *expect, int check_ns, char *err, size_t cap) {
    char a[65], b[65];
    if (memcmp(got->model_id, expect->model_id, 32)) {
        hex(got->model_id, 32, a), hex(expect->model_id, 32, b);
        return fail(err, cap, "another model (id %s, expected %s)", a, b);
    }
    if (strncmp(got->kv_mode, expect->kv_mode, 16))
        return fail(err, cap, "KV mode %.16s, expected %.16s", got->kv_mode, expect->kv_mode);
    if (got->block_size != expect->block_size)
        return fail(err, cap, "block size %" PRId32 ", expected %" PRId32, got->block_size, expect->block_size);
    if (got->depth != expect->depth)
        return fail(err, cap, "depth %" PRId32 ", expected %" PRId32, got->depth, expect->depth);
    if (got->block_bytes != expect->block_bytes)
        return fail(err, cap, "block bytes %" PRIu64 ", expected %" PRIu64, got->block_bytes, expect->block_bytes);
    if (!check_ns) return 0;
    if (got->loops != expect->loops)
        return fail(err, cap, "loops %" PRId32 ", expected %" PRId32, got->loops, expect->loops);
    if (got->window != expect->window)
        return fail(err, cap, "window %" PRId32 ", expected %" PRId32, got->window, expect->window);
    if (got->salt != expect->salt)
        return fail(err, cap, "salt 0x%016" PRIx64 ", expected 0x%016" PRIx64, got->salt, expect->salt);
    if (memcmp(got->key, expect->key, 32)) {
        hex(got->key, 32, a), hex(expect->key, 32, b);
        return fail(err, cap, "key %s, expected %s", a, b);
    }
    return 0;
}

/* ---- files -------------------------------------------------------------- */

static int write_all(int fd, const void *p, size_t n) {
    const uint8_t *q = p;
    while (n) {
        ssize_t w = write(fd, q, n > ((size_t)1 << 30) ? (size_t)1 << 30 : n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return w < 0 ? -1 : (errno = EIO, -1);
        q += w, n -= (size_t)w;
    }
    return 0;
}

/* Creates dir/.<name>.<pid>.<counter>.<random>.tmp with O_EXCL; the
 * counter separates this process's calls, the random part pid reuse. */
static int open_temp(const char *dir, const char *name, char *path, size_t cap) {
    static unsigned long counter;
    for (int tries = 0; tries < 16; tries++) {
        uint64_t r;
        if (getrandom(&r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            r = (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull ^ (uint64_t)(uintptr_t)&r ^ (uint64_t)tries;
        }
        unsigned long c = __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED);
        int len = snprintf(path, cap, "%s/.%s.%ld.%lu.%016" PRIx64 ".tmp", dir, name, (long)getpid(), c, r);
        if (len < 0 || (size_t)len >= cap)
            return errno = ENAMETOOLONG, -1;
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd >= 0 || errno != EEXIST) return fd;
    }
    return -1;
}

int tl_kvf_write(const char *dir, const tl_kvf_meta *m, const int32_t *tokens, const void *const *blocks, char *err,
                 size_t cap) {
    char name[TL_KVF_NAME_BYTES], path[PATH_MAX], tmp[PATH_MAX], why[256], e[128];
    tl_kvf_name(m->key, name);
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, name) >= sizeof path)
        return fail(err, cap, "%s/%s: path too long", dir, name);
    if (meta_valid(m, 0, why, sizeof why)) return fail(err, cap, "%s: %s", path, why);
    if (tl_kvf_n_present(m) == 0 || (m->depth % 8 && m->absent[m->depth / 8] >> (m->depth % 8)))
        return fail(err, cap, "%s: the absent bitmap leaves no block or marks blocks past depth %d", path,
                    (int)m->depth);
    size_t tcrc_off, crcs_off, payload_off;
    if (!layout(m, &tcrc_off, &crcs_off, &payload_off)) return fail(err, cap, "%s: file size overflows", path);

    uint8_t *head = malloc(payload_off);
    if (!head) return fail(err, cap, "%s: out of memory for a %zu-byte header", path, payload_off);
    encode_header(head, m);
    for (int32_t i = 0; i < m->block_size; i++) put32(head + TL_KVF_HEADER_BYTES + 4 * (size_t)i, (uint32_t)tokens[i]);
    memcpy(head + tcrc_off - bitmap_bytes(m), m->absent, bitmap_bytes(m));
    put32(head + tcrc_off, tl_crc32c(0, head + TL_KVF_HEADER_BYTES, tcrc_off - TL_KVF_HEADER_BYTES));
    for (int32_t d = 0; d < m->depth; d++)
        put32(head + crcs_off + 4 * (size_t)d, tl_kvf_has(m, d) ? tl_crc32c(0, blocks[d], m->block_bytes) : 0);

    int fd = open_temp(dir, name, tmp, sizeof tmp), rc = -1;
    if (fd < 0) {
        int en = errno;
        free(head);
        return fail(err, cap, "%s: cannot create a temp file: %s", path, errtext(en, e, sizeof e));
    }
    const char *step = "write";
    if (write_all(fd, head, payload_off) == 0) {
        int32_t d = 0;
        while (d < m->depth && (!tl_kvf_has(m, d) || write_all(fd, blocks[d], m->block_bytes) == 0)) d++;
        if (d == m->depth) rc = 0;
    }
    int en = errno;
    if (close(fd) && rc == 0) rc = -1, en = errno, step = "close";
    if (rc == 0 && rename(tmp, path)) rc = -1, en = errno, step = "rename";
    if (rc) {
        unlink(tmp);
        fail(err, cap, "%s: %s failed: %s", path, step, errtext(en, e, sizeof e));
    }
    free(head);
    return rc;
}

static int read_whole(const char *path, size_t max_bytes, uint8_t **out, size_t *n, char *err, size_t cap) {
    char e[128];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return fail(err, cap, "%s: %s", path, errtext(errno, e, sizeof e));
    struct stat st;
    int rc = -1;
    uint8_t *buf = NULL;
    if (fstat(fd, &st)) fail(err, cap, "%s: %s", path, errtext(errno, e, sizeof e));
    else if (S_ISDIR(st.st_mode)) fail(err, cap, "%s: is a directory", path);
    else if (!S_ISREG(st.st_mode)) fail(err, cap, "%s: not a regular file", path);
    else if ((uint64_t)st.st_size > max_bytes)
        fail(err, cap, "%s: file is %lld bytes, over the limit of %zu", path, (long long)st.st_size, max_bytes);
    else if (!(buf = malloc(st.st_size ? (size_t)st.st_size : 1)))
        fail(err, cap, "%s: out of memory for %lld bytes", path, (long long)st.st_size);
    else {
        size_t got = 0, want = (size_t)st.st_size;
        int en = 0;
        while (got < want) {
            ssize_t r = read(fd, buf + got, want - got);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) {
                en = r < 0 ? errno : 0;
                break;
            }
            got += (size_t)r;
        }
        if (got == want) rc = 0, *out = buf, *n = want;
        else
            fail(err, cap, "%s: read %zu of %zu bytes: %s", path, got, want,
                 en ? errtext(en, e, sizeof e) : "end of file");
    }
    if (rc) free(buf);
    close(fd);
    return rc;
}

int tl_kvf_read(const char *path, const tl_kvf_meta *expect, int check_ns, size_t max_bytes, int32_t *tokens_out,
                void *payload_out, size_t payload_cap, char *err, size_t cap) {
    uint8_t *buf = NULL;
    size_t n = 0;
    if (read_whole(path, max_bytes, &buf, &n, err, cap)) return -1;
    char why[256];
    tl_kvf_meta got;
    const int32_t *tok;
    const uint8_t *pay;
    int rc = tl_kvf_parse(buf, n, &got, &tok, &pay, why, sizeof why) ||
             tl_kvf_check(&got, expect, check_ns, why, sizeof why);
    if (!rc) {
        size_t bytes = (size_t)tl_kvf_n_present(&got) * got.block_bytes; /* parse bounded both, n holds them */
        if (bytes > payload_cap) {
            snprintf(why, sizeof why, "payload is %zu bytes, room for %zu", bytes, payload_cap);
            rc = 1;
        } else {
            memcpy(tokens_out, tok, (size_t)got.block_size * sizeof *tok);
            memcpy(payload_out, pay, bytes);
        }
    }
    free(buf);
    return rc ? fail(err, cap, "%s: %s", path, why) : 0;
}
