/* tok_util.h - helpers shared by the tokenizer tests: whole-file reads,
 * loading a vocab's tokenizer, encode/decode into malloc'ed buffers. */
#ifndef TL_TOK_UTIL_H
#define TL_TOK_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "tokenizer.h"

/* Reads a whole file into a malloc'ed NUL-terminated buffer (NULL on error). */
char *read_all(const char *path, size_t *len);
/* Opens a vocab GGUF, builds its tokenizer and closes the file again (the
 * tokenizer must not point into it). Prints why on failure. */
tl_tokenizer *load_tok_path(const char *path);
/* Encodes, growing the buffer on -(needed). Returns count (ids in *out, malloc'ed) or < 0. */
int encode(const tl_tokenizer *t, const char *s, size_t len, int add_special, int parse_special, int32_t **out);
/* Decodes to a malloc'ed NUL-terminated string; *len gets its length. */
char *decode(const tl_tokenizer *t, const int32_t *ids, int n, int *len);
void print_ids(const char *what, const int32_t *ids, int n);

/* llama.cpp's vocab test vectors: NAME.inp holds test strings each followed
 * by "\n__ggml_vocab_test__\n"; NAME.out one line of expected ids per string. */
typedef struct vocab_vectors {
    char *ip, *iend, *op, *oend;
} vocab_vectors;

void vv_init(vocab_vectors *v, char *inp, size_t nin, char *out, size_t nout);
/* The next test: its text (not NUL-terminated) and expected ids. Returns 1,
 * 0 at the end, -1 when .out has no line for it. */
int vv_next(vocab_vectors *v, const char **text, size_t *len, int32_t *want, int cap, int *n_want);

#endif
