/* tok_util.c - see tok_util.h. */
#include "tok_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "util.h"

char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    if (buf) buf[n] = 0;
    fclose(f);
    if (len) *len = (size_t)n;
    return buf;
}

/* Opens a vocab, builds its tokenizer and closes the file again (the
 * tokenizer must not point into it). */
tl_tokenizer *load_tok_path(const char *path) {
    gguf_file *f = gguf_open(path);
    if (!f) {
        printf("cannot open %s: %s\n", path, tl_last_error());
        return NULL;
    }
    tl_tokenizer *t = tl_tokenizer_load(f);
    if (!t) printf("cannot load tokenizer of %s: %s\n", path, tl_last_error());
    gguf_close(f);
    return t;
}

/* Encodes, growing the buffer on -(needed). Returns count (ids in *out, malloc'ed) or < 0. */
int encode(const tl_tokenizer *t, const char *s, size_t len, int add_special, int parse_special,
                  int32_t **out) {
    int32_t small[4];
    int n = tl_tokenizer_encode(t, s, len, add_special, parse_special, small, 4);
    int cap = n >= 0 ? n : -n;
    *out = malloc(((size_t)cap + 1) * sizeof **out);
    if (n >= 0) {
        memcpy(*out, small, (size_t)n * sizeof *small);
        return n;
    }
    int m = tl_tokenizer_encode(t, s, len, add_special, parse_special, *out, cap);
    return m == cap ? m : -1;
}

/* Decodes to a malloc'ed NUL-terminated string; *len gets its length. */
char *decode(const tl_tokenizer *t, const int32_t *ids, int n, int *len) {
    int need = tl_tokenizer_decode(t, ids, n, NULL, 0);
    if (need >= 0) return NULL;
    char *buf = malloc((size_t)-need);
    *len = tl_tokenizer_decode(t, ids, n, buf, -need);
    if (*len != -need - 1) {
        free(buf);
        return NULL;
    }
    return buf;
}

void print_ids(const char *what, const int32_t *ids, int n) {
    printf("  %s:", what);
    for (int i = 0; i < n; i++) printf(" %d", ids[i]);
    printf("\n");
}

void vv_init(vocab_vectors *v, char *inp, size_t nin, char *out, size_t nout) {
    v->ip = inp;
    v->iend = inp + nin;
    v->op = out;
    v->oend = out + nout;
}

int vv_next(vocab_vectors *v, const char **text, size_t *len, int32_t *want, int cap, int *n_want) {
    static const char sep[] = "\n__ggml_vocab_test__\n";
    const size_t sl = sizeof sep - 1;
    if (v->ip >= v->iend) return 0;
    char *s = memmem(v->ip, (size_t)(v->iend - v->ip), sep, sl);
    if (!s) return 0;
    char *eol = memchr(v->op, '\n', (size_t)(v->oend - v->op));
    if (!eol) return -1;
    *eol = 0;
    int nw = 0;
    for (char *p = v->op, *e; nw < cap; p = e) {
        long x = strtol(p, &e, 10);
        if (e == p) break;
        want[nw++] = (int32_t)x;
    }
    *text = v->ip;
    *len = (size_t)(s - v->ip);
    *n_want = nw;
    v->op = eol + 1;
    v->ip = s + sl;
    return 1;
}
