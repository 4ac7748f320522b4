/* tokenizer.c - text <-> token ids from a GGUF vocab.
 *
 * Behaviour follows llama.cpp's llama-vocab.cpp token for token:
 *   - special-token partition (tokenizer_st_partition): control / unknown
 *     token texts become single tokens when parse_special is set;
 *     user-defined ones always do;
 *   - SentencePiece (llm_tokenizer_spm): per text fragment, spaces become
 *     U+2581, a dummy U+2581 is prepended at the start and after every
 *     special token, UTF-8 characters are merged pairwise by best score,
 *     and leftovers fall back to <0xNN> byte tokens.
 *
 * The vocab (texts, scores, types, hash map, specials) is common to every
 * algorithm; `kind` picks the fragment encoder and the NORMAL-piece decoder.
 * Byte-level BPE ("gpt2" vocabs: merges, pre-tokenizer regexes) lives in
 * tokenizer_bpe.c, WordPiece ("bert" vocabs) in tokenizer_wpm.c, both
 * behind tokenizer_impl.h.
 *
 * A loaded tokenizer is immutable: encode/decode may run concurrently from
 * any number of threads (each call allocates its own scratch).
 */
#include "tokenizer_impl.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "tinyloop.h"
#include "util.h"

#define TOK_MAX_VOCAB (1 << 24)
#define TOK_MAX_TEXT ((size_t)1 << 28) /* bytes of input per encode call */

/* ------------------------------------------------------------------------ */
/* hash map: token text -> id                                               */
/* ------------------------------------------------------------------------ */

static uint32_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return (uint32_t)(h ^ (h >> 32));
}

/* The slot holding the id whose text is s[0..n), or the empty (-1) slot
 * where it would go. The table is at most half full, so probing ends. */
static int32_t *vocab_slot(const tl_tokenizer *t, const char *s, size_t n) {
    uint32_t i = hash_bytes(s, n) & t->slot_mask;
    for (;; i = (i + 1) & t->slot_mask) {
        int32_t id = t->slots[i];
        if (id < 0 || (t->len[id] == n && memcmp(tok_text(t, id), s, n) == 0)) return &t->slots[i];
    }
}

/* Returns the id whose text is s[0..n), or -1. */
static int vocab_find(const tl_tokenizer *t, const char *s, size_t n) { return *vocab_slot(t, s, n); }
int tok_vocab_find(const tl_tokenizer *t, const char *s, size_t n) { return vocab_find(t, s, n); }

/* ------------------------------------------------------------------------ */
/* loading                                                                  */
/* ------------------------------------------------------------------------ */

static int is_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'F') || (c >= 'a' && c <= 'f'); }
static int hex_val(char c) { return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10; }

/* Reads an optional u32 token id. An absent key, or 0xFFFFFFFF (how
 * converters write "none"), keeps `dflt` when that is in range (llama.cpp
 * keeps its default for any bad id), else -1. Other ids past the vocab are
 * refused. */
static int load_id(const gguf_file *f, const char *key, int dflt, int n_vocab, int *out) {
    uint32_t v;
    int rc = gguf_get_u32(f, key, &v);
    if (rc < 0) return TL_ERR_FORMAT;
    if (rc == 0 || v == UINT32_MAX) {
        *out = dflt < n_vocab ? dflt : -1;
        return TL_OK;
    }
    if (v >= (uint32_t)n_vocab)
        return tl_set_error(TL_ERR_FORMAT, "%s = %u is out of range (vocab has %d tokens)", key, v, n_vocab);
    *out = (int)v;
    return TL_OK;
}

static int load_bool(const gguf_file *f, const char *key, int dflt, int *out) {
    int rc = gguf_get_bool(f, key, out);
    if (rc < 0) return TL_ERR_FORMAT;
    if (rc == 0) *out = dflt;
    return TL_OK;
}

/* An optional per-token array must hold one element of the given type per token. */
static int load_arr(const gguf_file *f, const char *key, int type, int n_vocab, const gguf_value **out) {
    *out = NULL;
    int rc = gguf_get_arr(f, key, type, out);
    if (rc < 0) return TL_ERR_FORMAT;
    if (rc == 0) {
        *out = NULL;
        return TL_OK;
    }
    if ((*out)->v.arr.n != (uint64_t)n_vocab)
        return tl_set_error(TL_ERR_FORMAT, "%s has %llu entries but tokenizer.ggml.tokens has %d", key,
                            (unsigned long long)(*out)->v.arr.n, n_vocab);
    return TL_OK;
}

typedef struct len_id {
    uint32_t len;
    int32_t id;
} len_id;

/* Longest text first; ties by id (llama.cpp's std::sort leaves ties unspecified). */
static int cmp_special(const void *a, const void *b) {
    const len_id *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* Vocab fix-ups llama.cpp applies from token texts and the model name. */
static void apply_quirks(tl_tokenizer *t, const gguf_file *f) {
    /* End-of-generation-looking texts are forced to CONTROL. */
    static const char *eog[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                                "<|eom_id|>", "<EOT>"};
    for (size_t i = 0; i < sizeof eog / sizeof *eog; i++) {
        int id = vocab_find(t, eog[i], strlen(eog[i]));
        if (id >= 0) t->type[id] = TL_TOK_CONTROL;
    }
    if (!gguf_find_kv(f, "tokenizer.ggml.eot_token_id")) {
        const char *ds = "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>";
        int id = vocab_find(t, ds, strlen(ds));
        if (id >= 0) t->type[id] = TL_TOK_CONTROL;
    }
}

static void apply_phi3_strip(tl_tokenizer *t, const gguf_file *f) {
    /* llama.cpp: a model named phi-3/phi3 eats whitespace after its specials,
     * except after <unk>, <s> and <|endoftext|>; </s> too. */
    gguf_str name;
    if (gguf_get_str(f, "general.name", &name) != 1) return;
    char low[256];
    size_t n = name.len < sizeof low - 1 ? (size_t)name.len : sizeof low - 1;
    for (size_t i = 0; i < n; i++) {
        char c = name.ptr[i];
        low[i] = (c >= 'A' && c <= 'Z') ? (char)(c + 32) : (c ? c : ' ');
    }
    low[n] = 0;
    if (!strstr(low, "phi-3") && !strstr(low, "phi3")) return;
    for (int i = 0; i < t->n_special; i++) t->rstrip[t->special[i]] = 1;
    int id = vocab_find(t, "</s>", 4);
    if (id >= 0) t->rstrip[id] = 1;
    static const char *keep[] = {"<unk>", "<s>", "<|endoftext|>"};
    for (size_t i = 0; i < 3; i++)
        if ((id = vocab_find(t, keep[i], strlen(keep[i]))) >= 0) t->rstrip[id] = 0;
}

static int load_vocab(tl_tokenizer *t, const gguf_file *f) {
    const gguf_value *toks, *scores, *types;
    int rc = gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_T_STRING, &toks);
    if (rc < 0) return TL_ERR_FORMAT;
    if (rc == 0) return tl_set_error(TL_ERR_FORMAT, "missing tokenizer.ggml.tokens");
    uint64_t n64 = toks->v.arr.n;
    if (n64 == 0) return tl_set_error(TL_ERR_FORMAT, "tokenizer.ggml.tokens is empty");
    if (!toks->v.arr.items) return tl_set_error(TL_ERR_FORMAT, "tokenizer.ggml.tokens has no string items");
    if (n64 > TOK_MAX_VOCAB)
        return tl_set_error(TL_ERR_FORMAT, "tokenizer.ggml.tokens has %llu tokens, more than %d",
                            (unsigned long long)n64, TOK_MAX_VOCAB);
    int n = t->n_vocab = (int)n64;
    if ((rc = load_arr(f, "tokenizer.ggml.scores", GGUF_T_FLOAT32, n, &scores)) ||
        (rc = load_arr(f, "tokenizer.ggml.token_type", GGUF_T_INT32, n, &types)))
        return rc;

    size_t pool = 0;
    for (int i = 0; i < n; i++) {
        const gguf_value *s = &toks->v.arr.items[i];
        if (s->type != GGUF_T_STRING || s->v.str.len > UINT32_MAX ||
            tl_add_size(pool, (size_t)s->v.str.len + 1, &pool))
            return tl_set_error(TL_ERR_FORMAT, "tokenizer.ggml.tokens[%d] is not a valid string", i);
    }
    uint32_t cap = 1;
    while (cap < 2 * (uint32_t)n) cap <<= 1;
    t->pool = malloc(pool);
    t->off = malloc((size_t)n * sizeof *t->off);
    t->len = malloc((size_t)n * sizeof *t->len);
    t->score = malloc((size_t)n * sizeof *t->score);
    t->type = malloc((size_t)n);
    t->byte = calloc((size_t)n, 1);
    t->rstrip = calloc((size_t)n, 1);
    t->special = malloc((size_t)n * sizeof *t->special);
    t->slots = malloc((size_t)cap * sizeof *t->slots);
    if (!t->pool || !t->off || !t->len || !t->score || !t->type || !t->byte || !t->rstrip ||
        !t->special || !t->slots)
        return tl_set_error(TL_ERR_NOMEM, "tokenizer: cannot allocate a vocab of %d tokens (%zu text bytes)", n,
                            pool);
    memset(t->slots, 0xff, (size_t)cap * sizeof *t->slots);
    t->slot_mask = cap - 1;

    size_t at = 0;
    for (int i = 0; i < n; i++) {
        const gguf_str *s = &toks->v.arr.items[i].v.str;
        t->off[i] = at;
        t->len[i] = (uint32_t)s->len;
        if (s->len) memcpy(t->pool + at, s->ptr, s->len);
        t->pool[at + s->len] = 0;
        at += s->len + 1;
        t->score[i] = scores ? gguf_arr_f32(scores, (uint64_t)i) : 0.0f;
        int32_t ty = types ? gguf_arr_i32(types, (uint64_t)i) : TL_TOK_NORMAL;
        t->type[i] = (uint8_t)(ty >= TL_TOK_UNDEFINED && ty <= TL_TOK_BYTE ? ty : TL_TOK_UNDEFINED);
        if (t->type[i] == TL_TOK_BYTE) {
            const char *p = tok_text(t, i);
            if (t->len[i] != 6 || memcmp(p, "<0x", 3) != 0 || !is_hex(p[3]) || !is_hex(p[4]) || p[5] != '>')
                return tl_set_error(TL_ERR_FORMAT, "byte token %d has text '%.32s', expected <0xNN>", i, p);
            t->byte[i] = (uint8_t)(hex_val(p[3]) * 16 + hex_val(p[4]));
        }
        /* An empty text can never match input; leave it out of the map. */
        if (t->len[i] == 0) continue;
        int32_t *slot = vocab_slot(t, tok_text(t, i), t->len[i]);
        if (*slot >= 0) /* llama.cpp asserts on this (id_to_token.size() == token_to_id.size()) */
            return tl_set_error(TL_ERR_FORMAT, "tokenizer.ggml.tokens: ids %d and %d have the same text '%.32s'",
                                *slot, i, tok_text(t, i));
        *slot = i;
    }
    return TL_OK;
}

tl_tokenizer *tl_tokenizer_load(const gguf_file *f) {
    if (!f) {
        tl_set_error(TL_ERR_INVALID_ARG, "tl_tokenizer_load: file is NULL");
        return NULL;
    }
    gguf_str model;
    int rc = gguf_get_str(f, "tokenizer.ggml.model", &model);
    if (rc < 0) return NULL;
    if (rc == 0) {
        tl_set_error(TL_ERR_FORMAT, "missing tokenizer.ggml.model");
        return NULL;
    }
    int kind = model.len == 5 && memcmp(model.ptr, "llama", 5) == 0  ? TOK_SPM
               : model.len == 4 && memcmp(model.ptr, "gpt2", 4) == 0 ? TOK_BPE
               : model.len == 4 && memcmp(model.ptr, "bert", 4) == 0 ? TOK_WPM
                                                                      : 0;
    if (!kind) {
        tl_set_error(TL_ERR_UNSUPPORTED, "unsupported tokenizer model '%.*s'", model.len > 64 ? 64 : (int)model.len,
                     model.ptr);
        return NULL;
    }
    tl_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        tl_set_error(TL_ERR_NOMEM, "tokenizer: out of memory");
        return NULL;
    }
    t->kind = kind;
    if (load_vocab(t, f) != TL_OK) goto fail;
    if (kind == TOK_BPE) {
        /* llama.cpp's BPE defaults: bos = eos = 11, no unk; add_bos per
         * pre-tokenizer. No dummy prefix: the space belongs to the text, so
         * decoding never strips one. */
        int add_bos = 0;
        if (tok_bpe_load(t, f, &add_bos) ||
            load_id(f, "tokenizer.ggml.bos_token_id", 11, t->n_vocab, &t->bos) ||
            load_id(f, "tokenizer.ggml.eos_token_id", 11, t->n_vocab, &t->eos) ||
            load_id(f, "tokenizer.ggml.unknown_token_id", -1, t->n_vocab, &t->unk) ||
            load_id(f, "tokenizer.ggml.padding_token_id", -1, t->n_vocab, &t->pad) ||
            load_bool(f, "tokenizer.ggml.add_bos_token", add_bos, &t->add_bos) ||
            load_bool(f, "tokenizer.ggml.add_eos_token", 0, &t->add_eos))
            goto fail;
    } else if (kind == TOK_WPM) {
        /* llama.cpp's WordPiece: [CLS] (101, or the file's bos / cls id)
         * opens and [SEP] (102) closes a text with add_special; unk 100 */
        int cls = -1;
        if (load_id(f, "tokenizer.ggml.cls_token_id", 101, t->n_vocab, &cls) ||
            load_id(f, "tokenizer.ggml.bos_token_id", cls, t->n_vocab, &t->bos) ||
            load_id(f, "tokenizer.ggml.seperator_token_id", 102, t->n_vocab, &t->eos) ||
            load_id(f, "tokenizer.ggml.unknown_token_id", 100, t->n_vocab, &t->unk) ||
            load_id(f, "tokenizer.ggml.padding_token_id", 0, t->n_vocab, &t->pad))
            goto fail;
        t->add_bos = t->add_eos = 1;
    } else if (/* SentencePiece defaults (llama.cpp: bos 1, eos 2, unk 0; add BOS, not EOS, dummy prefix) */
               load_id(f, "tokenizer.ggml.bos_token_id", 1, t->n_vocab, &t->bos) ||
               load_id(f, "tokenizer.ggml.eos_token_id", 2, t->n_vocab, &t->eos) ||
               load_id(f, "tokenizer.ggml.unknown_token_id", 0, t->n_vocab, &t->unk) ||
               load_id(f, "tokenizer.ggml.padding_token_id", -1, t->n_vocab, &t->pad) ||
               load_bool(f, "tokenizer.ggml.add_bos_token", 1, &t->add_bos) ||
               load_bool(f, "tokenizer.ggml.add_eos_token", 0, &t->add_eos) ||
               load_bool(f, "tokenizer.ggml.add_space_prefix", 1, &t->add_space_prefix)) {
        goto fail;
    }

    apply_quirks(t, f);
    len_id *sp = malloc((size_t)t->n_vocab * sizeof *sp);
    if (!sp) {
        tl_set_error(TL_ERR_NOMEM, "tokenizer: out of memory");
        goto fail;
    }
    for (int i = 0; i < t->n_vocab; i++) {
        int ty = t->type[i];
        if ((ty == TL_TOK_CONTROL || ty == TL_TOK_USER_DEFINED || ty == TL_TOK_UNKNOWN) && t->len[i] > 0)
            sp[t->n_special++] = (len_id){t->len[i], i};
    }
    qsort(sp, (size_t)t->n_special, sizeof *sp, cmp_special);
    for (int i = 0; i < t->n_special; i++) t->special[i] = sp[i].id;
    free(sp);
    apply_phi3_strip(t, f);
    for (int i = 0; i < t->n_vocab; i++)
        if (t->len[i] > t->max_len) t->max_len = t->len[i];

    static const char hex[] = "0123456789ABCDEF";
    for (int b = 0; b < 256; b++) {
        char s[7] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>', 0};
        char c = (char)b;
        int id = vocab_find(t, s, 6);
        t->byte_tok[b] = id >= 0 ? id : vocab_find(t, &c, 1);
    }
    return t;
fail:
    tl_tokenizer_free(t);
    return NULL;
}

void tl_tokenizer_free(tl_tokenizer *t) {
    if (!t) return;
    free(t->pool);
    free(t->off);
    free(t->len);
    free(t->score);
    free(t->type);
    free(t->byte);
    free(t->rstrip);
    free(t->special);
    free(t->slots);
    tok_bpe_free(t->bpe);
    free(t);
}

int tl_tokenizer_n_vocab(const tl_tokenizer *t) { return t->n_vocab; }
int tl_tokenizer_bos(const tl_tokenizer *t) { return t->bos; }
int tl_tokenizer_eos(const tl_tokenizer *t) { return t->eos; }
int tl_tokenizer_add_bos(const tl_tokenizer *t) { return t->add_bos && t->bos >= 0; }
int tl_tokenizer_add_eos(const tl_tokenizer *t) { return t->add_eos && t->eos >= 0; }

int tl_tokenizer_token_type(const tl_tokenizer *t, int id) {
    return id >= 0 && id < t->n_vocab ? t->type[id] : -1;
}

const char *tl_tokenizer_token_text(const tl_tokenizer *t, int id) {
    return id >= 0 && id < t->n_vocab ? tok_text(t, id) : NULL;
}

/* ------------------------------------------------------------------------ */
/* encoding                                                                 */
/* ------------------------------------------------------------------------ */

static int ids_push(ids_vec *o, int32_t id) {
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 64;
        int32_t *v = realloc(o->v, cap * sizeof *v);
        if (!v) return tl_set_error(TL_ERR_NOMEM, "tokenizer: out of memory for %zu ids", cap);
        o->v = v;
        o->cap = cap;
    }
    o->v[o->n++] = id;
    return TL_OK;
}
int tok_ids_push(ids_vec *o, int32_t id) { return ids_push(o, id); }

/* A piece of the input: raw text [off, off+len) or one special token. Raw
 * text is either marker text, where control tokens may be matched, or
 * content, where only user-defined tokens (not forbidden ones) may be. */
enum { FRAG_MARKER = -1, FRAG_CONTENT = -2 };
typedef struct frag {
    int32_t id; /* >= 0: a special token; else FRAG_MARKER or FRAG_CONTENT */
    size_t off, len;
} frag;

/* Which specials may match in content: neither control/unknown ones (as
 * parse_special = 0) nor the ids a chat template uses as markers. */
typedef struct special_filter {
    const int32_t *forbid;
    int n_forbid;
} special_filter;

static int content_may_match(const tl_tokenizer *t, const special_filter *f, int id) {
    if (t->type[id] == TL_TOK_CONTROL || t->type[id] == TL_TOK_UNKNOWN) return 0;
    for (int i = 0; f && i < f->n_forbid; i++)
        if (f->forbid[i] == id) return 0;
    return 1;
}

static int is_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

/* Which specials a partition pass matches: all (content fragments only
 * those content may hold), only those content may not hold (control
 * tokens and markers: the marker pass), or only those content may hold
 * (user-defined: the pass over whole runs of raw text). */
enum { MATCH_ALL, MATCH_MARKERS, MATCH_CONTENT };

/* Splits raw fragments around every special-token text, longest texts
 * first (llama.cpp's tokenizer_st_partition). `a` holds n fragments; `b` is
 * scratch of the same capacity; returns the new count, result in *a.
 * Content fragments only split where content_may_match allows. */
static size_t partition(const tl_tokenizer *t, const char *text, frag **a, frag **b, size_t n,
                        const special_filter *filter, int match) {
    for (int s = 0; s < t->n_special; s++) {
        int id = t->special[s];
        int in_content = content_may_match(t, filter, id);
        if ((match == MATCH_MARKERS && in_content) || (match == MATCH_CONTENT && !in_content)) continue;
        const char *st = tok_text(t, id);
        size_t sl = t->len[id], m = 0;
        frag *in = *a, *out = *b;
        /* A stripping special whose whitespace ran to its fragment's end
         * eats on into the raw text right after it, as it would in one
         * unbroken text (a marker's end and the content's start). */
        size_t eat_at = SIZE_MAX;
        for (size_t i = 0; i < n; i++) {
            frag f = in[i];
            if (f.id < 0 && f.off == eat_at) {
                size_t k = 0;
                while (k < f.len && is_space(text[f.off + k])) k++;
                f.off += k;
                f.len -= k;
                if (!f.len) {
                    eat_at = f.off;
                    continue;
                }
            }
            eat_at = SIZE_MAX;
            if (f.id >= 0 || (f.id == FRAG_CONTENT && !in_content)) {
                out[m++] = f;
                continue;
            }
            size_t pos = f.off, end = f.off + f.len;
            const char *hit;
            while (pos < end && (hit = memmem(text + pos, end - pos, st, sl)) != NULL) {
                size_t at = (size_t)(hit - text);
                if (at > pos) out[m++] = (frag){f.id, pos, at - pos};
                out[m++] = (frag){id, 0, 0};
                pos = at + sl;
                if (t->rstrip[id]) {
                    while (pos < end && is_space(text[pos])) pos++;
                    if (pos == end) eat_at = end;
                }
            }
            if (pos < end) out[m++] = (frag){f.id, pos, end - pos};
        }
        *a = out;
        *b = in;
        n = m;
    }
    return n;
}

/* SentencePiece bigram: the heap top is the best score, then the left-most. */
typedef struct bigram {
    int left, right;
    float score;
    size_t size;
} bigram;

static int bigram_before(const bigram *x, const bigram *y) {
    return x->score > y->score || (x->score == y->score && x->left < y->left);
}

typedef struct spm_work {
    char *esc;            /* escaped fragment */
    int *prev, *next, *n; /* symbols: a linked list of byte runs of esc */
    size_t *off;
    size_t cap;           /* bytes of esc, and symbols, allocated */
    bigram *heap;
    size_t n_heap, heap_cap;
} spm_work;

static int spm_reserve(spm_work *w, size_t bytes) {
    if (bytes <= w->cap) return TL_OK;
    char *esc = realloc(w->esc, bytes);
    if (esc) w->esc = esc;
    int *prev = realloc(w->prev, bytes * sizeof *prev);
    if (prev) w->prev = prev;
    int *next = realloc(w->next, bytes * sizeof *next);
    if (next) w->next = next;
    int *n = realloc(w->n, bytes * sizeof *n);
    if (n) w->n = n;
    size_t *off = realloc(w->off, bytes * sizeof *off);
    if (off) w->off = off;
    if (!esc || !prev || !next || !n || !off)
        return tl_set_error(TL_ERR_NOMEM, "tokenizer: out of memory for a %zu-byte fragment", bytes);
    w->cap = bytes;
    return TL_OK;
}

static void spm_free(spm_work *w) {
    free(w->esc);
    free(w->prev);
    free(w->next);
    free(w->n);
    free(w->off);
    free(w->heap);
}

static int heap_push(spm_work *w, bigram b) {
    if (w->n_heap == w->heap_cap) {
        size_t cap = w->heap_cap ? 2 * w->heap_cap : 256;
        bigram *h = realloc(w->heap, cap * sizeof *h);
        if (!h) return tl_set_error(TL_ERR_NOMEM, "tokenizer: out of memory for %zu bigrams", cap);
        w->heap = h;
        w->heap_cap = cap;
    }
    size_t i = w->n_heap++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!bigram_before(&b, &w->heap[p])) break;
        w->heap[i] = w->heap[p];
        i = p;
    }
    w->heap[i] = b;
    return TL_OK;
}

static bigram heap_pop(spm_work *w) {
    bigram top = w->heap[0], last = w->heap[--w->n_heap];
    size_t i = 0, n = w->n_heap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && bigram_before(&w->heap[c + 1], &w->heap[c])) c++;
        if (!bigram_before(&w->heap[c], &last)) break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n) w->heap[i] = last;
    return top;
}

static int try_add_bigram(const tl_tokenizer *t, spm_work *w, int left, int right) {
    if (left < 0 || right < 0) return TL_OK;
    size_t size = (size_t)w->n[left] + (size_t)w->n[right];
    int id = vocab_find(t, w->esc + w->off[left], size);
    return id < 0 ? TL_OK : heap_push(w, (bigram){left, right, t->score[id], size});
}

static int utf8_len(uint8_t c) {
    static const int lut[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lut[c >> 4];
}

/* Encodes one raw fragment (llm_tokenizer_spm_session::tokenize). */
static int spm_encode(const tl_tokenizer *t, spm_work *w, const char *s, size_t len, int prefix, ids_vec *o) {
    size_t L = 0, need = prefix ? 3 : 0;
    for (size_t i = 0; i < len; i++) need += s[i] == ' ' ? 3 : 1;
    if (spm_reserve(w, need)) return TL_ERR_NOMEM;
    if (prefix) {
        memcpy(w->esc, "\xe2\x96\x81", 3);
        L = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (s[i] == ' ') {
            memcpy(w->esc + L, "\xe2\x96\x81", 3);
            L += 3;
        } else {
            w->esc[L++] = s[i];
        }
    }
    int ns = 0;
    for (size_t at = 0; at < L; ns++) {
        size_t cl = (size_t)utf8_len((uint8_t)w->esc[at]);
        if (cl > L - at) cl = L - at;
        w->off[ns] = at;
        w->n[ns] = (int)cl;
        w->prev[ns] = ns - 1;
        at += cl;
        w->next[ns] = at == L ? -1 : ns + 1;
    }
    if (ns == 0) return TL_OK;

    w->n_heap = 0;
    for (int i = 1; i < ns; i++)
        if (try_add_bigram(t, w, i - 1, i)) return TL_ERR_NOMEM;
    while (w->n_heap) {
        bigram b = heap_pop(w);
        int l = b.left, r = b.right;
        /* stale: one side was merged away, or grew since the pair was queued */
        if (w->n[l] == 0 || w->n[r] == 0 || (size_t)w->n[l] + (size_t)w->n[r] != b.size) continue;
        w->n[l] += w->n[r];
        w->n[r] = 0;
        w->next[l] = w->next[r];
        if (w->next[r] >= 0) w->prev[w->next[r]] = l;
        if (try_add_bigram(t, w, w->prev[l], l) || try_add_bigram(t, w, l, w->next[l])) return TL_ERR_NOMEM;
    }

    for (int i = 0; i != -1; i = w->next[i]) {
        const char *sym = w->esc + w->off[i];
        int id = vocab_find(t, sym, (size_t)w->n[i]);
        if (id >= 0) {
            if (ids_push(o, id)) return TL_ERR_NOMEM;
            continue;
        }
        for (int j = 0; j < w->n[i]; j++) {
            uint8_t c = (uint8_t)sym[j];
            int bt = t->byte_tok[c] >= 0 ? t->byte_tok[c] : t->unk;
            if (bt < 0)
                return tl_set_error(TL_ERR_UNSUPPORTED,
                                    "byte 0x%02X has no token: the vocab has neither <0x%02X> nor an unknown token",
                                    c, c);
            if (ids_push(o, bt)) return TL_ERR_NOMEM;
        }
    }
    return TL_OK;
}

/* Encodes text cut into initial raw fragments: n_marked marker ranges
 * (sorted, disjoint) and content around them; with markers == NULL the
 * whole text is one fragment, marker text when parse_special. */
static int encode_all(const tl_tokenizer *t, const char *text, size_t len, int add_special, int parse_special,
                      const tl_tok_span *markers, int n_markers, const special_filter *filter, ids_vec *o) {
    int rc = TL_OK;
    /* specials are >= 1 byte: each initial fragment splits into raw, special, raw, ... */
    size_t nf_cap = 2 * len + 2 * (size_t)n_markers + 2;
    frag *fa = malloc(nf_cap * sizeof *fa), *fb = malloc(nf_cap * sizeof *fb);
    spm_work w = {0};
    tok_bpe_work *bw = NULL;
    if (!fa || !fb) {
        rc = tl_set_error(TL_ERR_NOMEM, "tokenizer: out of memory for %zu bytes of text", len);
        goto out;
    }
    size_t nf = 0;
    if (markers) {
        size_t pos = 0;
        for (int k = 0; k < n_markers; k++) {
            if (markers[k].off > pos) fa[nf++] = (frag){FRAG_CONTENT, pos, markers[k].off - pos};
            if (markers[k].len) fa[nf++] = (frag){FRAG_MARKER, markers[k].off, markers[k].len};
            pos = markers[k].off + markers[k].len;
        }
        if (pos < len) fa[nf++] = (frag){FRAG_CONTENT, pos, len - pos};
    } else if (len) {
        fa[nf++] = (frag){parse_special ? FRAG_MARKER : FRAG_CONTENT, 0, len};
    }
    if (markers && nf) {
        /* Markers first, inside the template's own text only; then the
         * tokens content may hold over whole runs of raw text, so that one
         * (Gemma's "   ") may span a marker's end and the content's start
         * as it would in the whole text. */
        nf = partition(t, text, &fa, &fb, nf, filter, MATCH_MARKERS);
        size_t m = 0;
        for (size_t i = 0; i < nf; i++) {
            if (m && fa[i].id < 0 && fa[m - 1].id < 0 && fa[m - 1].off + fa[m - 1].len == fa[i].off)
                fa[m - 1].len += fa[i].len;
            else
                fa[m++] = fa[i];
        }
        nf = partition(t, text, &fa, &fb, m, filter, MATCH_CONTENT);
    } else if (nf) {
        nf = partition(t, text, &fa, &fb, nf, filter, MATCH_ALL);
    }
    if (add_special && t->add_bos && t->bos >= 0 && (rc = ids_push(o, t->bos))) goto out;
    int prev_special = 1; /* the dummy prefix goes at the start and after every special token */
    for (size_t i = 0; i < nf && rc == TL_OK; i++) {
        if (fa[i].id >= 0) {
            rc = ids_push(o, fa[i].id);
            prev_special = 1;
            continue;
        }
        size_t off = fa[i].off, end = fa[i].off + fa[i].len;
        switch (t->kind) {
        case TOK_SPM:
            rc = spm_encode(t, &w, text + off, end - off, t->add_space_prefix && prev_special, o);
            break;
        case TOK_BPE:
            rc = tok_bpe_encode(t, &bw, text + off, end - off, o);
            break;
        case TOK_WPM:
            rc = tok_wpm_encode(t, text + off, end - off, o);
            break;
        default:
            assert(0);
        }
        prev_special = 0;
    }
    if (rc == TL_OK && add_special && t->add_eos && t->eos >= 0) rc = ids_push(o, t->eos);
out:
    free(fa);
    free(fb);
    spm_free(&w);
    tok_bpe_work_free(bw);
    return rc;
}

static int encode_out(ids_vec *o, int rc, int32_t *out, int cap) {
    if (rc == TL_OK) {
        /* at most 3*len + a few ids, far below INT_MAX given TOK_MAX_TEXT */
        rc = (int)o->n;
        if (o->n > (size_t)cap)
            rc = -rc;
        else if (o->n)
            memcpy(out, o->v, o->n * sizeof *out);
    }
    free(o->v);
    return rc;
}

int tl_tokenizer_encode(const tl_tokenizer *t, const char *text, size_t len, int add_special, int parse_special,
                        int32_t *out, int cap) {
    if (!t || (!text && len) || (!out && cap > 0) || cap < 0)
        return tl_set_error(TL_ERR_INVALID_ARG, "tl_tokenizer_encode: bad arguments (len %zu, cap %d)", len, cap);
    if (len > TOK_MAX_TEXT)
        return tl_set_error(TL_ERR_INVALID_ARG, "tl_tokenizer_encode: text of %zu bytes exceeds %zu", len,
                            TOK_MAX_TEXT);
    ids_vec o = {0};
    int rc = encode_all(t, text, len, add_special, parse_special, NULL, 0, NULL, &o);
    return encode_out(&o, rc, out, cap);
}

int tl_tokenizer_encode_marked(const tl_tokenizer *t, const char *text, size_t len, int add_special,
                               const tl_tok_span *markers, int n_markers, const int32_t *forbid, int n_forbid,
                               int32_t *out, int cap) {
    if (!t || (!text && len) || (!out && cap > 0) || cap < 0 || n_markers < 0 || (n_markers && !markers) ||
        n_forbid < 0 || (n_forbid && !forbid))
        return tl_set_error(TL_ERR_INVALID_ARG,
                            "tl_tokenizer_encode_marked: bad arguments (len %zu, %d markers, cap %d)", len,
                            n_markers, cap);
    if (len > TOK_MAX_TEXT)
        return tl_set_error(TL_ERR_INVALID_ARG, "tl_tokenizer_encode_marked: text of %zu bytes exceeds %zu", len,
                            TOK_MAX_TEXT);
    for (int k = 0; k < n_markers; k++) {
        size_t from = k ? markers[k - 1].off + markers[k - 1].len : 0;
        if (markers[k].off < from || markers[k].len > len || markers[k].off > len - markers[k].len)
            return tl_set_error(TL_ERR_INVALID_ARG,
                                "tl_tokenizer_encode_marked: marker %d [%zu, +%zu) is out of order or past %zu bytes",
                                k, markers[k].off, markers[k].len, len);
    }
    static const tl_tok_span no_markers = {0, 0};
    special_filter filter = {forbid, n_forbid};
    ids_vec o = {0};
    int rc = encode_all(t, text, len, add_special, 0, n_markers ? markers : &no_markers, n_markers, &filter, &o);
    return encode_out(&o, rc, out, cap);
}

int tl_tokenizer_max_token_bytes(const tl_tokenizer *t) { return t ? (int)t->max_len : 0; }

/* ------------------------------------------------------------------------ */
/* decoding                                                                 */
/* ------------------------------------------------------------------------ */

/* Writes the piece of `id` to dst (when not NULL), skipping one leading
 * space when lstrip; returns its length. id must be in range. */
static size_t piece(const tl_tokenizer *t, int id, int render_special, int lstrip, char *dst) {
    const char *s = tok_text(t, id);
    size_t n = t->len[id], w = 0;
    switch (t->type[id]) {
    case TL_TOK_UNKNOWN:
    case TL_TOK_CONTROL:
        if (!render_special) return 0;
        /* fall through */
    case TL_TOK_USER_DEFINED: /* verbatim, no unescaping */
        if (lstrip && n && s[0] == ' ') s++, n--;
        if (dst && n) memcpy(dst, s, n);
        return n;
    case TL_TOK_BYTE:
        if (lstrip && t->byte[id] == ' ') return 0;
        if (dst) dst[0] = (char)t->byte[id];
        return 1;
    case TL_TOK_NORMAL:
        break;
    default: /* UNDEFINED, UNUSED */
        return 0;
    }
    switch (t->kind) {
    case TOK_SPM:
    case TOK_WPM: /* U+2581 back to a space, as llama.cpp's token_to_piece */
        for (size_t i = 0; i < n; i++) {
            char c = s[i];
            if (c == '\xe2' && i + 2 < n && s[i + 1] == '\x96' && s[i + 2] == '\x81') {
                c = ' ';
                i += 2;
            }
            if (lstrip && w == 0 && c == ' ') {
                lstrip = 0;
                continue;
            }
            lstrip = 0;
            if (dst) dst[w] = c;
            w++;
        }
        return w;
    case TOK_BPE:
        return tok_bpe_piece(t, id, dst);
    default:
        assert(0);
        return 0;
    }
}

int tl_tokenizer_piece(const tl_tokenizer *t, int id, int render_special, char *out, int cap) {
    if (!t || id < 0 || id >= t->n_vocab)
        return tl_set_error(TL_ERR_INVALID_ARG, "tl_tokenizer_piece: token id %d out of range [0, %d)", id,
                            t ? t->n_vocab : 0);
    size_t n = piece(t, id, render_special, 0, NULL);
    if (n > (size_t)(cap > 0 ? cap : 0)) return -(int)n;
    piece(t, id, render_special, 0, out);
    return (int)n;
}

int tl_tokenizer_decode(const tl_tokenizer *t, const int32_t *ids, int n, char *out, int cap) {
    if (!t || (!ids && n > 0) || n < 0 || (!out && cap > 0))
        return tl_set_error(TL_ERR_INVALID_ARG, "tl_tokenizer_decode: bad arguments (n %d, cap %d)", n, cap);
    /* the dummy prefix sits on the first token, or the one after a leading BOS */
    int first = n > 0 && t->bos >= 0 && ids[0] == t->bos ? 1 : 0;
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab)
            return tl_set_error(TL_ERR_INVALID_ARG, "tl_tokenizer_decode: ids[%d] = %d out of range [0, %d)", i,
                                ids[i], t->n_vocab);
        total += piece(t, ids[i], 0, t->add_space_prefix && i == first, NULL);
        if (total >= INT32_MAX)
            return tl_set_error(TL_ERR_INVALID_ARG, "tl_tokenizer_decode: text longer than %d bytes", INT32_MAX);
    }
    if (total + 1 > (size_t)(cap > 0 ? cap : 0)) return -(int)(total + 1);
    size_t w = 0;
    for (int i = 0; i < n; i++) w += piece(t, ids[i], 0, t->add_space_prefix && i == first, out + w);
    out[w] = 0;
    return (int)w;
}
