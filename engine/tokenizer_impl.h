/* tokenizer_impl.h - internals shared by tokenizer.c (vocab, special-token
 * partition, SentencePiece, the public calls) and tokenizer_bpe.c (byte-level
 * BPE: merges, pre-tokenizer regexes, byte <-> unicode tables). Not part of
 * any public header.
 *
 *   tl_tokenizer_encode(text)
 *     -> partition around special tokens      (tokenizer.c)
 *     -> per raw fragment: spm_encode          (tokenizer.c, kind TOK_SPM)
 *                          tok_bpe_encode      (tokenizer_bpe.c, kind TOK_BPE)
 *                          tok_wpm_encode      (tokenizer_wpm.c, kind TOK_WPM)
 */
#ifndef TL_TOKENIZER_IMPL_H
#define TL_TOKENIZER_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "gguf.h"
#include "tokenizer.h"

enum tok_kind { TOK_SPM = 1, TOK_BPE = 2, TOK_WPM = 3 };

struct tok_bpe; /* merges + compiled pre-tokenizer, tokenizer_bpe.c */

struct tl_tokenizer {
    int kind;      /* enum tok_kind */
    int n_vocab;
    char *pool;    /* all token texts, each NUL-terminated (they may hold NULs too) */
    size_t *off;   /* (n_vocab) offset of each text in pool */
    uint32_t *len; /* (n_vocab) text length in bytes */
    float *score;  /* (n_vocab) */
    uint8_t *type; /* (n_vocab) enum tl_tok_type */
    uint8_t *byte; /* (n_vocab) value of a BYTE token */
    uint8_t *rstrip; /* (n_vocab) eat whitespace after this special token when matched */
    int bos, eos, unk, pad; /* -1 when none */
    int add_bos, add_eos, add_space_prefix;
    int byte_tok[256];  /* token for a fallback byte, -1 when none */
    int32_t *slots;     /* open-addressing map text -> id; -1 empty */
    uint32_t slot_mask;
    int32_t *special;   /* control/user-defined/unknown ids, longest text first */
    int n_special;
    uint32_t max_len;   /* longest token text: no token covers more input bytes */
    struct tok_bpe *bpe; /* kind TOK_BPE only */
};

typedef struct ids_vec {
    int32_t *v;
    size_t n, cap;
} ids_vec;

static inline const char *tok_text(const tl_tokenizer *t, int id) { return t->pool + t->off[id]; }

/* tokenizer.c: the id whose text is s[0..n), or -1; append an id (TL_ERR_NOMEM on failure). */
int tok_vocab_find(const tl_tokenizer *t, const char *s, size_t n);
int tok_ids_push(ids_vec *o, int32_t id);

/* tokenizer_bpe.c */

/* Reads tokenizer.ggml.pre and tokenizer.ggml.merges into t->bpe (the vocab
 * is loaded already). *add_bos gets the pre-tokenizer's default for
 * add_bos_token (llama.cpp: true for llama3). Returns TL_OK or an error
 * code with tl_last_error set; t->bpe may then be partial (freed with t). */
int tok_bpe_load(tl_tokenizer *t, const gguf_file *f, int *add_bos);
void tok_bpe_free(struct tok_bpe *b);

/* Per-call scratch; start from NULL, free with tok_bpe_work_free. */
typedef struct tok_bpe_work tok_bpe_work;
void tok_bpe_work_free(tok_bpe_work *w);

/* Encodes one raw text fragment (no special tokens in it) onto o. */
int tok_bpe_encode(const tl_tokenizer *t, tok_bpe_work **w, const char *s, size_t len, ids_vec *o);

/* Test hook: runs only the pre-tokenizer of a BPE tokenizer on s[0..len)
 * (after the U+FFFD replacement of invalid bytes) and writes the end offset
 * of each word to ends (at most cap). Returns the word count or an error. */
long tok_bpe_split(const tl_tokenizer *t, const char *s, size_t len, size_t *ends, size_t cap);

/* Length of the valid UTF-8 sequence at s[0..n) (n >= 1; RFC 3629: no
 * overlongs, surrogates or values past U+10FFFF), 0 when none starts there. */
size_t tok_utf8_seq(const uint8_t *s, size_t n);

/* Writes the raw bytes of NORMAL token `id` to dst (when not NULL); returns their count. */
size_t tok_bpe_piece(const tl_tokenizer *t, int id, char *dst);

/* tokenizer_wpm.c: WordPiece-encodes one raw text fragment onto o. */
int tok_wpm_encode(const tl_tokenizer *t, const char *s, size_t len, ids_vec *o);

#endif
