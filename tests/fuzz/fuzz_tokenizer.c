/* fuzz_tokenizer.c - libFuzzer target for tokenize / detokenize of every
 * vocab in the shared test data ($TINYLOOP_SHARED/vocab, else
 * ../shared/vocab, else ../../shared/vocab; vocabs that do not load, like
 * the WordPiece one, are skipped).
 *
 * Each input is
 *   - encoded with parse_special 0 and 1 (add_special alternating), through
 *     the -(needed) buffer protocol, every id checked against the vocab;
 *   - for byte-level BPE vocabs with a token for each of the 256 bytes (all
 *     but falcon, which lacks 14 control characters) and valid UTF-8 input,
 *     decoded again and compared with the input: without parse_special the
 *     round trip is exact;
 *   - encoded with marker spans taken from its bytes (chat segments): ids in
 *     range, and without spans exactly the parse_special 0 ids;
 *   - read as little-endian int32 ids (modulo n_vocab), decoded and rendered
 *     piece by piece, the pieces streamed through tl_utf8_complete_prefix.
 * A broken invariant aborts, so libFuzzer reports it like a crash.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "tokenizer.h"
#include "util.h"

#define MAX_VOCABS 32

static tl_tokenizer *toks[MAX_VOCABS];
static int lossless[MAX_VOCABS]; /* byte-level BPE with a token for every byte */
static int n_toks = -1;

static int name_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Whether every byte value survives encode + decode: each ASCII byte alone,
 * each other byte inside some valid UTF-8 sequence. */
static int all_bytes(const tl_tokenizer *t) {
    for (int c = 0; c < 256; c++) {
        unsigned char s[4];
        int n = 0;
        if (c < 0x80) s[n++] = (unsigned char)c;
        else if (c < 0xC0) s[n++] = 0xC2, s[n++] = (unsigned char)c;
        else if (c < 0xC2 || c > 0xF4) continue; /* never in valid UTF-8 */
        else if (c < 0xE0) s[n++] = (unsigned char)c, s[n++] = 0x80;
        else if (c < 0xF0) s[n++] = (unsigned char)c, s[n++] = 0xA0, s[n++] = 0x80;
        else s[n++] = (unsigned char)c, s[n++] = 0x90, s[n++] = 0x80, s[n++] = 0x80;
        int32_t ids[16];
        char back[32];
        int ni = tl_tokenizer_encode(t, (const char *)s, (size_t)n, 0, 0, ids, 16);
        int dl = ni > 0 ? tl_tokenizer_decode(t, ids, ni, back, sizeof back) : -1;
        if (dl != n || memcmp(back, s, (size_t)n) != 0) return 0;
    }
    return 1;
}

static void load_all(void) {
    n_toks = 0;
    const char *env = getenv("TINYLOOP_SHARED");
    const char *cands[] = {env, "../shared", "../../shared"};
    for (int c = 0; c < 3; c++) {
        if (!cands[c]) continue;
        char dir[512];
        snprintf(dir, sizeof dir, "%s/vocab", cands[c]);
        DIR *d = opendir(dir);
        if (!d) continue;
        char *names[64];
        int nn = 0;
        struct dirent *e;
        while ((e = readdir(d)) && nn < 64) {
            size_t l = strlen(e->d_name);
            if (l > 5 && strcmp(e->d_name + l - 5, ".gguf") == 0) names[nn++] = strdup(e->d_name);
        }
        closedir(d);
        qsort(names, (size_t)nn, sizeof *names, name_cmp);
        for (int i = 0; i < nn; i++) {
            char path[1024];
            snprintf(path, sizeof path, "%s/%s", dir, names[i]);
            gguf_file *f = gguf_open(path);
            tl_tokenizer *t = f ? tl_tokenizer_load(f) : NULL;
            if (t && n_toks < MAX_VOCABS) {
                fprintf(stderr, "fuzz_tokenizer: %s loaded\n", names[i]);
                gguf_str model = {0};
                gguf_get_str(f, "tokenizer.ggml.model", &model);
                lossless[n_toks] = model.len == 4 && memcmp(model.ptr, "gpt2", 4) == 0 && all_bytes(t);
                toks[n_toks++] = t;
            } else {
                fprintf(stderr, "fuzz_tokenizer: skip %s: %s\n", path, t ? "too many vocabs" : tl_last_error());
                tl_tokenizer_free(t);
            }
            gguf_close(f);
            free(names[i]);
        }
        break;
    }
    if (!n_toks) fprintf(stderr, "fuzz_tokenizer: no vocab loaded (set TINYLOOP_SHARED); only UTF-8 checks run\n");
}

static int valid_utf8(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        uint8_t c = s[i];
        size_t need = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        if (!need || n - i < need) return 0;
        if (need > 1) {
            uint8_t lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80, hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
            if (s[i + 1] < lo || s[i + 1] > hi) return 0;
            for (size_t k = 2; k < need; k++)
                if ((s[i + k] & 0xC0) != 0x80) return 0;
        }
        i += need;
    }
    return 1;
}

/* Streams pieces through tl_utf8_complete_prefix: what it releases must be
 * all of the text in the end, and never more than 3 bytes may be held. */
static void stream(const tl_tokenizer *t, const int32_t *ids, int n, const char *whole, int whole_len) {
    char hold[512];
    int nh = 0, emitted = 0;
    for (int i = 0; i < n; i++) {
        char piece[256];
        int pl = tl_tokenizer_piece(t, ids[i], 0, piece, sizeof piece);
        if (pl < 0 || pl > (int)sizeof hold - nh) return; /* a long piece: nothing to stream-check */
        memcpy(hold + nh, piece, (size_t)pl);
        nh += pl;
        int ready = tl_utf8_complete_prefix(hold, nh);
        if (ready < 0 || ready > nh || nh - ready > 3) abort();
        if (whole && (emitted + ready > whole_len || memcmp(whole + emitted, hold, (size_t)ready) != 0)) abort();
        emitted += ready;
        memmove(hold, hold + ready, (size_t)(nh - ready));
        nh -= ready;
    }
    (void)emitted;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (n_toks < 0) load_all();
    if (size > (1 << 16)) return 0;
    int r = tl_utf8_complete_prefix((const char *)data, (int)size);
    if (r < 0 || r > (int)size || (int)size - r > 3) abort();
    int valid = valid_utf8(data, size);
    if (valid && r != (int)size) abort(); /* complete valid text is never held back */

    for (int v = 0; v < n_toks; v++) {
        const tl_tokenizer *t = toks[v];
        int nv = tl_tokenizer_n_vocab(t);
        for (int ps = 0; ps < 2; ps++) {
            int32_t small[2];
            int n = tl_tokenizer_encode(t, (const char *)data, size, ps, ps, small, 2);
            if (n < -(int)(8 * size + 8)) abort(); /* -(needed) stays near the input length */
            int cap = n < 0 ? -n : n;
            int32_t *ids = malloc(((size_t)cap + 1) * sizeof *ids);
            if (!ids) return 0;
            int m = n < 0 ? tl_tokenizer_encode(t, (const char *)data, size, ps, ps, ids, cap) : n;
            if (n >= 0) memcpy(ids, small, (size_t)n * sizeof *ids);
            if (m != cap) abort(); /* the second call must fit exactly */
            for (int i = 0; i < m; i++)
                if (ids[i] < 0 || ids[i] >= nv) abort();
            int need = tl_tokenizer_decode(t, ids, m, NULL, 0);
            if (need >= 0) abort();
            char *text = malloc((size_t)-need);
            if (!text) {
                free(ids);
                return 0;
            }
            int dl = tl_tokenizer_decode(t, ids, m, text, -need);
            if (dl != -need - 1 || text[dl] != 0) abort();
            if (lossless[v] && valid && !ps && ((size_t)dl != size || memcmp(text, data, size) != 0)) abort();
            stream(t, ids, m, lossless[v] ? text : NULL, dl); /* SPM's decode strips the dummy-prefix space */
            free(text);
            free(ids);
        }

        /* marked encoding (chat segments): marker spans from the input's
         * bytes; ids in range, and with no marker at all exactly the ids of
         * encoding the text with parse_special 0 */
        {
            tl_tok_span spans[4];
            int ns = size ? data[0] % 5 : 0;
            size_t pos = 0;
            for (int k = 0; k < ns && size; k++) {
                size_t off = pos + (size_t)data[(k + 1) % size] % (size - pos + 1);
                size_t len = (size_t)data[(k + 2) % size] % (size - off + 1);
                spans[k] = (tl_tok_span){off, len};
                pos = off + len;
            }
            int32_t forbid[1] = {tl_tokenizer_bos(t)};
            int n = tl_tokenizer_encode_marked(t, (const char *)data, size, 1, spans, ns, forbid, 1, NULL, 0);
            int cap = n < 0 ? -n : n;
            int32_t *ids = malloc(((size_t)cap + 1) * sizeof *ids);
            if (!ids) return 0;
            int m = n < 0 ? tl_tokenizer_encode_marked(t, (const char *)data, size, 1, spans, ns, forbid, 1, ids, cap)
                          : n;
            if (m != cap) abort();
            for (int i = 0; i < m; i++)
                if (ids[i] < 0 || ids[i] >= nv) abort();
            if (ns == 0) {
                int32_t *plain = malloc(((size_t)cap + 1) * sizeof *plain);
                if (plain && (tl_tokenizer_encode(t, (const char *)data, size, 1, 0, plain, cap) != m ||
                              memcmp(plain, ids, (size_t)m * sizeof *ids) != 0))
                    abort();
                free(plain);
            }
            free(ids);
        }

        /* the input as token ids */
        int nid = (int)(size / 4);
        if (nid > 4096) nid = 4096;
        int32_t *ids = malloc(((size_t)nid + 1) * sizeof *ids);
        if (!ids) return 0;
        for (int i = 0; i < nid; i++) {
            uint32_t x = (uint32_t)data[4 * i] | (uint32_t)data[4 * i + 1] << 8 | (uint32_t)data[4 * i + 2] << 16 |
                         (uint32_t)data[4 * i + 3] << 24;
            ids[i] = (int32_t)(x % (uint32_t)nv);
        }
        int need = tl_tokenizer_decode(t, ids, nid, NULL, 0);
        if (need >= 0) abort();
        char *text = malloc((size_t)-need);
        if (text) {
            int dl = tl_tokenizer_decode(t, ids, nid, text, -need);
            if (dl != -need - 1) abort();
            if (tl_tokenizer_decode(t, ids, nid, text, -need - 1) != need) abort(); /* one byte short */
            stream(t, ids, nid, NULL, 0);
            for (int i = 0; i < nid && i < 64; i++) {
                char piece[8];
                int pl = tl_tokenizer_piece(t, ids[i], i & 1, piece, sizeof piece);
                if (pl < -(1 << 20) || pl > (int)sizeof piece) abort();
            }
            free(text);
        }
        free(ids);
    }
    return 0;
}
