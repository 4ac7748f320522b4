/* tokenizer.h - text <-> token ids from a GGUF vocab.
 *
 * SentencePiece ("llama" vocab model: scores, byte-fallback <0xNN> tokens,
 * dummy-prefix space, control tokens) and byte-level BPE ("gpt2": merges,
 * a pre-tokenizer per tokenizer.ggml.pre) behind the same calls.
 */
#ifndef TL_TOKENIZER_H
#define TL_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "gguf.h"

/* Token attributes from tokenizer.ggml.token_type. */
enum tl_tok_type {
    TL_TOK_UNDEFINED = 0, TL_TOK_NORMAL = 1, TL_TOK_UNKNOWN = 2, TL_TOK_CONTROL = 3,
    TL_TOK_USER_DEFINED = 4, TL_TOK_UNUSED = 5, TL_TOK_BYTE = 6
};

typedef struct tl_tokenizer tl_tokenizer;

/* Builds a tokenizer from the GGUF's tokenizer.ggml.* keys. Returns NULL
 * with tl_last_error() set on a missing/malformed vocab or an unsupported
 * tokenizer model. The tokenizer copies what it needs; the file may be
 * closed afterwards. */
tl_tokenizer *tl_tokenizer_load(const gguf_file *f);
void tl_tokenizer_free(tl_tokenizer *t);

int tl_tokenizer_n_vocab(const tl_tokenizer *t);
int tl_tokenizer_bos(const tl_tokenizer *t);   /* -1 when none */
int tl_tokenizer_eos(const tl_tokenizer *t);   /* -1 when none */
int tl_tokenizer_add_bos(const tl_tokenizer *t); /* vocab's default */
int tl_tokenizer_add_eos(const tl_tokenizer *t);
int tl_tokenizer_token_type(const tl_tokenizer *t, int id);
/* Raw vocab string of a token (SentencePiece form, with U+2581 for space;
 * for byte-level BPE the byte-level form, e.g. U+0120 'Ġ' for space). */
const char *tl_tokenizer_token_text(const tl_tokenizer *t, int id);

/* Tokenizes `len` bytes of `text`. add_special: prepend BOS (and append
 * EOS) as the vocab says; parse_special: match control/user-defined token
 * texts in the input as single tokens. Returns the number of ids written,
 * or -(needed) when `cap` is too small (nothing useful written), or
 * TL_ERR_* (< 0 too, but with tl_last_error set) on failure; callers tell
 * the two apart by calling again with a larger buffer. */
int tl_tokenizer_encode(const tl_tokenizer *t, const char *text, size_t len,
                        int add_special, int parse_special, int32_t *out, int cap);

/* A byte range [off, off + len) of an input text. */
typedef struct tl_tok_span {
    size_t off, len;
} tl_tok_span;

/* Tokenizes text in which only the `markers` ranges (sorted, disjoint; a
 * chat template's own turn markers) may become control tokens. The rest is
 * content: tokenized as with parse_special = 0, and none of the `forbid`
 * ids (user-defined tokens a template uses as markers) may appear in it.
 * Raw text on both sides of a range boundary is encoded as one run, so
 * text whose content holds no special-token text gets exactly the ids of
 * tl_tokenizer_encode(parse_special = 1). Returns as tl_tokenizer_encode. */
int tl_tokenizer_encode_marked(const tl_tokenizer *t, const char *text, size_t len, int add_special,
                               const tl_tok_span *markers, int n_markers, const int32_t *forbid, int n_forbid,
                               int32_t *out, int cap);

/* Bytes of the longest token text. No token covers more input bytes (a
 * SentencePiece space is 3 bytes in the text, a BPE byte 1 or 2), so text
 * of B bytes gives at least B / this many tokens. */
int tl_tokenizer_max_token_bytes(const tl_tokenizer *t);

/* Appends the text piece of one token to out (at most cap bytes). Control
 * tokens give "" (unless render_special), byte tokens their raw byte, the
 * SentencePiece space marker becomes ' '. Returns bytes written, or
 * -(needed) when cap is too small. */
int tl_tokenizer_piece(const tl_tokenizer *t, int id, int render_special, char *out, int cap);

/* Detokenizes ids to text. Strips the leading space the dummy prefix added
 * when the first id follows BOS or starts the sequence (as llama.cpp does
 * with remove_special/unparse). Returns the length written (not counting
 * the NUL it always adds when room), or -(needed incl. NUL). */
int tl_tokenizer_decode(const tl_tokenizer *t, const int32_t *ids, int n, char *out, int cap);

/* Streaming output: how many leading bytes of buf[0..len) form complete
 * UTF-8 characters and can be emitted now. A valid but unfinished sequence
 * at the end (1-3 bytes, e.g. the first byte of an emoji whose other bytes
 * come with the next token) is held back; bytes that can never become valid
 * UTF-8 count as complete, so nothing is held forever. Returns a value in
 * [len - 3, len] (0 when len <= 0). */
int tl_utf8_complete_prefix(const char *buf, int len);

#endif
