/* test_tokenizer_bpe.c - byte-level BPE ("gpt2" vocabs) against llama.cpp's
 * vocab test vectors, pre-tokenizer splits (llama3, qwen2, gpt-2,
 * deepseek-llm) on synthetic vocabs, special tokens, streaming UTF-8,
 * invalid input, hostile vocab files and speed. */
#include <stdint.h>

#include "gguf.h"
#include "test.h"
#include "tinyloop.h"
#include "tokenizer.h"
#include "tokenizer_impl.h"
#include "util.h"

#include "gguf_writer.h"
#include "tok_util.h"
#include "vocab_check.h"

static tl_tokenizer *load_tok(const char *dir, const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/vocab/%s", dir, name);
    return load_tok_path(path);
}

static int ids_eq(const int32_t *a, int na, const int32_t *b, int nb) {
    return na == nb && (na == 0 || memcmp(a, b, (size_t)na * sizeof *a) == 0);
}

/* ---- llama.cpp test vectors --------------------------------------------- */

static void test_vocab_vectors(const char *dir, const char *name) {
    char path[600];
    snprintf(path, sizeof path, "%s/vocab/%s", dir, name);
    tl_tokenizer *t = load_tok(dir, name);
    int done = 0, n_tests = t ? check_vocab_file(path, name, t, &done) : -1;
    CHECK(t && n_tests >= 0, "%s and its .inp/.out test vectors load", name);
    if (t && n_tests >= 0)
        CHECK(n_tests >= 40 && done, "%s: every test string was read, one .out line each (%d)", name, n_tests);
    tl_tokenizer_free(t);
}

/* ---- real-vocab details -------------------------------------------------- */

static void test_gpt2_details(const char *dir) {
    tl_tokenizer *t = load_tok(dir, "ggml-vocab-gpt-2.gguf");
    if (!t) return;
    CHECK(tl_tokenizer_n_vocab(t) == 50257, "gpt-2 has 50257 tokens");
    CHECK(tl_tokenizer_bos(t) == 50256 && tl_tokenizer_eos(t) == 50256, "gpt-2's BOS and EOS are <|endoftext|>");
    CHECK(!tl_tokenizer_add_bos(t) && !tl_tokenizer_add_eos(t), "gpt-2 adds neither BOS nor EOS by default");

    int32_t ids[64];
    const char *s = "Hello<|endoftext|>world";
    int n = tl_tokenizer_encode(t, s, strlen(s), 0, 1, ids, 64);
    CHECK(n == 3 && ids[1] == 50256, "with parse_special, <|endoftext|> is one token (n %d)", n);
    n = tl_tokenizer_encode(t, s, strlen(s), 0, 0, ids, 64);
    int found = 0;
    for (int i = 0; i < n; i++) found |= ids[i] == 50256;
    CHECK(n > 3 && !found, "without parse_special, <|endoftext|> is plain text (n %d)", n);
    char buf[256];
    int dl = tl_tokenizer_decode(t, ids, n, buf, sizeof buf);
    CHECK(dl == (int)strlen(s) && memcmp(buf, s, (size_t)dl) == 0, "the plain-text special decodes back to its text");
    n = tl_tokenizer_encode(t, "Hi", 2, 1, 0, ids, 64);
    CHECK(n == 1, "add_special adds nothing to gpt-2 text (n %d)", n);

    char piece[64];
    CHECK(tl_tokenizer_piece(t, 50256, 0, piece, 64) == 0, "<|endoftext|> renders as \"\" by default");
    n = tl_tokenizer_piece(t, 50256, 1, piece, 64);
    CHECK(n == 13 && memcmp(piece, "<|endoftext|>", 13) == 0, "<|endoftext|> renders its text with render_special");
    int32_t sp = -1;
    tl_tokenizer_encode(t, " the", 4, 0, 0, &sp, 1);
    n = tl_tokenizer_piece(t, sp, 0, piece, 64);
    CHECK(n == 4 && memcmp(piece, " the", 4) == 0, "the piece of 'Ġthe' is ' the' (byte-level decoding)");
    CHECK(tl_tokenizer_piece(t, sp, 0, piece, 2) == -4, "a short piece buffer gets -(needed)");
    {
        int32_t nl = -1;
        CHECK(tl_tokenizer_encode(t, "\n", 1, 0, 0, &nl, 1) == 1 && tl_tokenizer_piece(t, nl, 0, piece, 4) == 1 &&
                  piece[0] == '\n',
              "'\\n' is one token whose piece is the byte 0x0A ('Ċ' in the vocab)");
    }

    /* Streaming: an emoji split across tokens is held back until it completes. */
    const char *emo = "ok \xf0\x9f\xa6\x99\xf0\x9f\x98\x80 \xe2\x80\x94 caf\xc3\xa9";
    int32_t *e;
    int ne = encode(t, emo, strlen(emo), 0, 0, &e);
    char acc[256], outb[256];
    int na = 0, no = 0, partial_seen = 0, chunks_valid = 1;
    for (int i = 0; i < ne; i++) {
        int got = tl_tokenizer_piece(t, e[i], 0, acc + na, (int)sizeof acc - na);
        if (got < 0) {
            chunks_valid = 0;
            break;
        }
        na += got;
        int ready = tl_utf8_complete_prefix(acc, na);
        if (ready < 0 || ready > na || no + ready > (int)sizeof outb) {
            chunks_valid = 0;
            break;
        }
        partial_seen |= ready < na;
        for (int k = 0; k < ready;) { /* every emitted chunk is valid UTF-8 */
            unsigned char c = (unsigned char)acc[k];
            int l = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
            for (int j = 1; j < l; j++)
                if (k + j >= ready || ((unsigned char)acc[k + j] & 0xC0) != 0x80) chunks_valid = 0;
            k += l;
        }
        memcpy(outb + no, acc, (size_t)ready);
        no += ready;
        memmove(acc, acc + ready, (size_t)(na - ready));
        na -= ready;
    }
    CHECK(partial_seen, "some gpt-2 token of the emoji text ends inside a UTF-8 character");
    CHECK(chunks_valid && na == 0 && no == (int)strlen(emo) && memcmp(outb, emo, (size_t)no) == 0,
          "streamed pieces, emitted by tl_utf8_complete_prefix, are valid UTF-8 and give the text back");
    free(e);
    tl_tokenizer_free(t);
}

static void test_other_vocab_details(const char *dir) {
    tl_tokenizer *t = load_tok(dir, "ggml-vocab-deepseek-coder.gguf");
    if (t) {
        int32_t ids[16];
        CHECK(tl_tokenizer_add_bos(t) && tl_tokenizer_bos(t) == 32013,
              "deepseek-coder adds BOS 32013 (tokenizer.ggml.add_bos_token)");
        int n = tl_tokenizer_encode(t, "a", 1, 1, 0, ids, 16);
        CHECK(n == 2 && ids[0] == 32013, "add_special prepends deepseek-coder's BOS (n %d)", n);
        tl_tokenizer_free(t);
    }
    t = load_tok(dir, "ggml-vocab-mpt.gguf");
    if (t) {
        /* mpt's runs of spaces are USER_DEFINED tokens: matched even without parse_special */
        int32_t ids[16];
        const char *s = "a    b";
        int n = tl_tokenizer_encode(t, s, strlen(s), 0, 0, ids, 16);
        int user = 0;
        for (int i = 0; i < n; i++) user |= tl_tokenizer_token_type(t, ids[i]) == TL_TOK_USER_DEFINED;
        CHECK(n > 0 && user, "mpt matches a user-defined whitespace token without parse_special (n %d)", n);
        char buf[32];
        int dl = tl_tokenizer_decode(t, ids, n, buf, sizeof buf);
        CHECK(dl == 6 && memcmp(buf, s, 6) == 0, "user-defined tokens decode verbatim");
        tl_tokenizer_free(t);
    }
}

/* ---- random round trip over every BPE vocab ------------------------------ */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}

static size_t put_utf8(char *o, uint32_t cp) {
    if (cp < 0x80) return o[0] = (char)cp, 1;
    if (cp < 0x800) return o[0] = (char)(0xC0 | cp >> 6), o[1] = (char)(0x80 | (cp & 63)), 2;
    if (cp < 0x10000)
        return o[0] = (char)(0xE0 | cp >> 12), o[1] = (char)(0x80 | (cp >> 6 & 63)), o[2] = (char)(0x80 | (cp & 63)), 3;
    o[0] = (char)(0xF0 | cp >> 18), o[1] = (char)(0x80 | (cp >> 12 & 63));
    o[2] = (char)(0x80 | (cp >> 6 & 63)), o[3] = (char)(0x80 | (cp & 63));
    return 4;
}

static size_t random_text(char *o, size_t max_chars) {
    static const uint32_t pool[] = {' ', ' ', ' ', '\n', '\t', '\r', 'a', 'e', 'Z', '0', '7', '\'', '.', '$', '~',
                                    0xA0, 0xE9, 0x3A9, 0x416, 0x5D0, 0x627, 0x905, 0x3000, 0x4E2D, 0xAC00, 0x2581,
                                    0x2014, 0xFF01, 0x1F600, 0x1F999, 0x10400, 0x200D, 0xFFFD, 0};
    size_t n = 0, chars = rnd() % max_chars;
    for (size_t i = 0; i < chars; i++) {
        uint32_t r = rnd();
        uint32_t cp = r % 4 == 0 ? 0x20 + rnd() % 0x5F : pool[rnd() % (sizeof pool / sizeof *pool)];
        n += put_utf8(o + n, cp);
    }
    return n;
}

static void test_random_roundtrip(const char *dir, const char *name) {
    tl_tokenizer *t = load_tok(dir, name);
    if (!t) return;
    int ok = 0, total = 300;
    char text[4 * 200];
    for (int k = 0; k < total; k++) {
        size_t n = random_text(text, 200);
        int32_t *ids;
        int ni = encode(t, text, n, 0, 0, &ids);
        int dl = 0;
        char *back = ni >= 0 ? decode(t, ids, ni, &dl) : NULL;
        int good = back && (size_t)dl == n && memcmp(back, text, n) == 0;
        if (!good && ok == k) printf("  %s round trip failed on '%.*s' -> '%s'\n", name, (int)n, text, back ? back : "");
        ok += good;
        free(back);
        free(ids);
    }
    CHECK(ok == total, "%s: %d/%d random valid UTF-8 strings decode back to themselves", name, ok, total);
    tl_tokenizer_free(t);
}

/* ---- invalid UTF-8 ------------------------------------------------------- */

static void test_invalid_utf8(const char *dir) {
    tl_tokenizer *t = load_tok(dir, "ggml-vocab-gpt-2.gguf");
    if (!t) return;
    /* \xff: never valid; \xc3 followed by '(': truncated; \xed\xa0\x80: a surrogate;
     * \xc0\xaf: overlong; \xf0\x9f: truncated at the end. One U+FFFD per bad byte. */
    static const char bad[] = "ab\xff\xc3(x\xed\xa0\x80y\xc0\xafz\xf0\x9f";
    static const char fixed[] = "ab\xef\xbf\xbd\xef\xbf\xbd(x\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbdy"
                                "\xef\xbf\xbd\xef\xbf\xbdz\xef\xbf\xbd\xef\xbf\xbd";
    int32_t *a, *b;
    int na = encode(t, bad, sizeof bad - 1, 0, 0, &a), nb = encode(t, fixed, sizeof fixed - 1, 0, 0, &b);
    CHECK(na > 0 && ids_eq(a, na, b, nb), "invalid UTF-8 tokenizes as the text with U+FFFD for each bad byte");
    int dl = 0;
    char *back = decode(t, a, na, &dl);
    CHECK(back && dl == (int)sizeof fixed - 1 && memcmp(back, fixed, (size_t)dl) == 0,
          "and decodes to that replaced text");
    free(back);
    free(a);
    free(b);
    int32_t ids[8];
    int n = tl_tokenizer_encode(t, "\0\0", 2, 0, 0, ids, 8);
    CHECK(n >= 1, "NUL bytes tokenize (n %d)", n);
    tl_tokenizer_free(t);
}

static void test_utf8_prefix(void) {
    static const struct {
        const char *s;
        int len, want;
        const char *what;
    } cases[] = {
        {"", 0, 0, "an empty buffer"},
        {"abc", 3, 3, "ASCII"},
        {"a\xc3", 2, 1, "a lone 2-byte lead"},
        {"a\xc3\xa9", 3, 3, "a complete 2-byte char"},
        {"\xe2\x80", 2, 0, "2 of 3 bytes"},
        {"x\xe2\x80\x94", 4, 4, "a complete 3-byte char"},
        {"\xf0\x9f\xa6", 3, 0, "3 of 4 bytes"},
        {"\xf0\x9f\xa6\x99", 4, 4, "a complete 4-byte char"},
        {"ab\x80", 3, 3, "a stray continuation byte (invalid: emitted)"},
        {"ab\xff", 3, 3, "0xFF (invalid: emitted)"},
        {"ab\xc0", 3, 3, "0xC0, which only starts overlongs (emitted)"},
        {"ab\xe0\x80", 4, 4, "an overlong 3-byte prefix (emitted)"},
        {"ab\xed\xa0", 4, 4, "a surrogate prefix (emitted)"},
        {"ab\xf4\x90", 4, 4, "a prefix past U+10FFFF (emitted)"},
        {"ab\xc3(", 4, 4, "a lead followed by ASCII (emitted)"},
        {"\xe2\x80\x94\xe2", 4, 3, "a complete char, then a lone lead"},
        {"\xf0\x9f\x98\x80\x80", 5, 5, "a char and one extra continuation"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int got = tl_utf8_complete_prefix(cases[i].s, cases[i].len);
        CHECK(got == cases[i].want, "tl_utf8_complete_prefix of %s is %d (got %d)", cases[i].what, cases[i].want, got);
    }
    CHECK(tl_utf8_complete_prefix(NULL, 5) == 0 && tl_utf8_complete_prefix("a", -1) == 0,
          "tl_utf8_complete_prefix of NULL or a negative length is 0");
}

/* ---- synthetic vocabs ---------------------------------------------------- */

/* GPT-2's byte-level form of raw text. */
static void byte_level(const char *s, size_t n, char *out) {
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        int c = (unsigned char)s[i], cp = c, extra = 0;
        if (!((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || c >= 174)) {
            for (int d = 0; d < c; d++)
                if (!((d >= 33 && d <= 126) || (d >= 161 && d <= 172) || d >= 174)) extra++;
            cp = 256 + extra;
        }
        o += put_utf8(out + o, (uint32_t)cp);
    }
    out[o] = 0;
}

/* A vocab-only gpt2 GGUF: the 256 byte chars, then `extra` (raw text, stored
 * byte-level), then <|eot|> (CONTROL); `merges` as given (NULL: no key). */
typedef struct syn {
    const char *pre;          /* NULL: no tokenizer.ggml.pre */
    const char *const *extra; /* raw texts */
    int n_extra;
    const char *const *merges; /* as written into the file */
    int n_merges;
    int merges_as_int; /* write merges as an int32 array instead */
} syn;

/* The tokenizer of a vocab-only file built in memory (NULL when it does
 * not load); frees the writer. */
static tl_tokenizer *load_written(gguf_writer *gw) {
    uint8_t *buf;
    size_t len;
    tl_tokenizer *t = NULL;
    if (gw_write_mem(gw, &buf, &len) == 0) {
        gguf_file *f = gguf_open_buffer(buf, len);
        if (f) {
            CHECK(f->n_tensors == 0, "the synthetic vocab file has no tensors");
            t = tl_tokenizer_load(f);
        }
        gguf_close(f);
        free(buf);
    }
    gw_free(gw);
    return t;
}

static tl_tokenizer *syn_load(const syn *v, int *n_tok_out) {
    int n = 256 + v->n_extra + 1;
    char **tok = calloc((size_t)n, sizeof *tok);
    int32_t *type = malloc((size_t)n * sizeof *type);
    for (int i = 0; i < n; i++) {
        tok[i] = malloc(256);
        type[i] = TL_TOK_NORMAL;
        if (i < 256) {
            char c = (char)i;
            byte_level(&c, 1, tok[i]);
        } else if (i < n - 1) {
            byte_level(v->extra[i - 256], strlen(v->extra[i - 256]), tok[i]);
        } else {
            strcpy(tok[i], "<|eot|>");
            type[i] = TL_TOK_CONTROL;
        }
    }
    gguf_writer *gw = gw_new();
    gw_set_str(gw, "general.architecture", "llama");
    gw_set_str(gw, "tokenizer.ggml.model", "gpt2");
    if (v->pre) gw_set_str(gw, "tokenizer.ggml.pre", v->pre);
    gw_set_arr_str(gw, "tokenizer.ggml.tokens", (const char *const *)tok, (size_t)n);
    gw_set_arr_i32(gw, "tokenizer.ggml.token_type", type, (size_t)n);
    if (v->merges_as_int) gw_set_arr_i32(gw, "tokenizer.ggml.merges", type, 3);
    else if (v->merges) gw_set_arr_str(gw, "tokenizer.ggml.merges", v->merges, (size_t)v->n_merges);
    gw_set_u32(gw, "tokenizer.ggml.bos_token_id", (uint32_t)(n - 1));
    gw_set_u32(gw, "tokenizer.ggml.eos_token_id", (uint32_t)(n - 1));
    tl_tokenizer *t = load_written(gw);
    for (int i = 0; i < n; i++) free(tok[i]);
    free(tok);
    free(type);
    if (n_tok_out) *n_tok_out = n;
    return t;
}

static const char *const no_merges[] = {NULL};

/* Pieces of s as "a|b|c". */
static void split_str(const tl_tokenizer *t, const char *s, char *out, size_t cap) {
    size_t ends[256];
    long n = tok_bpe_split(t, s, strlen(s), ends, 256);
    size_t o = 0, prev = 0;
    out[0] = 0;
    for (long i = 0; i < n && i < 256; i++) {
        o += (size_t)snprintf(out + o, cap - o, "%s%.*s", i ? "|" : "", (int)(ends[i] - prev), s + prev);
        prev = ends[i];
        if (o >= cap) break;
    }
}

static void check_splits(const char *pre, const char *const (*cases)[2], int n) {
    syn v = {pre, NULL, 0, no_merges, 0, 0};
    tl_tokenizer *t = syn_load(&v, NULL);
    CHECK(t != NULL, "a byte-only vocab with pre-tokenizer '%s' loads (%s)", pre, t ? "ok" : tl_last_error());
    if (!t) return;
    for (int i = 0; i < n; i++) {
        char got[1024];
        split_str(t, cases[i][0], got, sizeof got);
        CHECK(strcmp(got, cases[i][1]) == 0, "%s splits '%s' as '%s' (got '%s')", pre, cases[i][0], cases[i][1], got);
    }
    tl_tokenizer_free(t);
}

static void test_pretokenizer_splits(void) {
    /* Derived by hand from the regexes (tokenizer.json of each model). */
    static const char *const llama3[][2] = {
        {"Hello world", "Hello| world"},
        {"I'm fine, you're OK", "I|'m| fine|,| you|'re| OK"},
        {"HE'LL DO'T", "HE|'LL| DO|'T"},
        {"12345678", "123|456|78"},
        {"$hello", "$hello"},
        {"a...\n\nb", "a|...\n\n|b"},
        {"  \n\n  x", "  \n\n| | x"},
        {"x   ", "x|   "},
        {"3.14", "3|.|14"},
        {" ;)", " ;)"},
        {"\xe4\xbd\xa0\xe5\xa5\xbd world", "\xe4\xbd\xa0\xe5\xa5\xbd| world"},
        {"caf\xc3\xa9 na\xc3\xafve", "caf\xc3\xa9| na\xc3\xafve"},
        {"a\xc2\xa0\xc2\xa0" "b", "a|\xc2\xa0|\xc2\xa0" "b"},
    };
    check_splits("llama-bpe", llama3, (int)(sizeof llama3 / sizeof *llama3));
    static const char *const qwen2[][2] = {
        {"12345", "1|2|3|4|5"},
        {"I'M here", "I|'M| here"},
        {"a\n\n\tb", "a|\n\n|\tb"},
    };
    check_splits("qwen2", qwen2, (int)(sizeof qwen2 / sizeof *qwen2));
    static const char *const gpt2[][2] = {
        {"Hello world", "Hello| world"},
        {"I'M it's", "I|'|M| it|'s"},
        {"   x", "  | x"},
        {"12345 67", "12345| 67"},
        {"a\n\nb", "a|\n|\n|b"}, /* \s+(?!\S) leaves the last newline, which then matches nothing */
        {"x  \n", "x|  \n"},
    };
    check_splits("gpt-2", gpt2, (int)(sizeof gpt2 / sizeof *gpt2));
    static const char *const ds_llm[][2] = {
        {"a  ", "a|  "},
        {"1  2", "1|  |2"},
        {"Hi!!", "Hi|!!"},
    };
    check_splits("deepseek-llm", ds_llm, (int)(sizeof ds_llm / sizeof *ds_llm));
    static const char *const starcoder[][2] = {{"ab 123", "ab| |1|2|3"}};
    check_splits("starcoder", starcoder, 1);
    static const char *const dflt[][2] = {{"a 1234", "a| |123|4"}};
    check_splits("default", dflt, 1);
    {
        /* a missing tokenizer.ggml.pre means llama.cpp's "default" too */
        syn v = {NULL, NULL, 0, no_merges, 0, 0};
        tl_tokenizer *t = syn_load(&v, NULL);
        char got[64] = "";
        if (t) split_str(t, "a 1234", got, sizeof got);
        CHECK(t && strcmp(got, "a| |123|4") == 0, "no tokenizer.ggml.pre splits as 'default' (got '%s')", got);
        tl_tokenizer_free(t);
    }
}

static void test_synthetic_bpe(void) {
    /* merges build "low" and " lower" step by step; ranks decide the order */
    enum { LO = 256, LOW, ER, SP_LOW, SP_LOWER, OW, HEY, N_EXTRA = 7, N_MERGES = 6 };
    static const char *const extra[] = {"lo", "low", "er", " low", " lower", "ow", "Hey"};
    char m[N_MERGES][32];
    static const char *const raw[][2] = {{"l", "o"}, {"lo", "w"}, {"e", "r"}, {" ", "low"}, {" low", "er"}, {"o", "w"}};
    const char *merges[N_MERGES];
    for (int i = 0; i < N_MERGES; i++) {
        char a[16], b[16];
        byte_level(raw[i][0], strlen(raw[i][0]), a);
        byte_level(raw[i][1], strlen(raw[i][1]), b);
        snprintf(m[i], sizeof m[i], "%s %s", a, b);
        merges[i] = m[i];
    }
    int n_tok;
    syn v = {"gpt-2", extra, N_EXTRA, merges, N_MERGES, 0};
    tl_tokenizer *t = syn_load(&v, &n_tok);
    CHECK(t != NULL, "a synthetic gpt-2 vocab with merges loads (%s)", t ? "ok" : tl_last_error());
    if (!t) return;
    int32_t ids[16];
    int n = tl_tokenizer_encode(t, "low lower", 9, 0, 0, ids, 16);
    CHECK(n == 2 && ids[0] == LOW && ids[1] == SP_LOWER, "'low lower' merges to [low][ lower] (n %d)", n);
    n = tl_tokenizer_encode(t, "lowow", 5, 0, 0, ids, 16);
    /* rank 0 (l o) first, then (lo w) beats (o w): low + ow */
    CHECK(n == 2 && ids[0] == LOW && ids[1] == OW, "lower ranks merge first: 'lowow' is [low][ow] (n %d)", n);
    n = tl_tokenizer_encode(t, "Hey", 3, 0, 0, ids, 16);
    CHECK(n == 3, "without merges for it, 'Hey' stays 3 byte tokens even though it is a token (n %d)", n);
    n = tl_tokenizer_encode(t, "x<|eot|>", 8, 1, 1, ids, 16);
    CHECK(n == 2 && ids[0] == 'x' && ids[1] == n_tok - 1, "gpt-2 adds no BOS; <|eot|> parses as one token (n %d)", n);
    tl_tokenizer_free(t);

    /* llama3: ignore_merges takes a whole-word token as is, and BOS is added by default */
    syn v3 = {"llama3", extra, N_EXTRA, merges, N_MERGES, 0};
    t = syn_load(&v3, &n_tok);
    CHECK(t != NULL, "a synthetic llama3 vocab loads (%s)", t ? "ok" : tl_last_error());
    if (!t) return;
    n = tl_tokenizer_encode(t, "Hey", 3, 1, 0, ids, 16);
    CHECK(n == 2 && ids[0] == n_tok - 1 && ids[1] == HEY,
          "llama3 adds BOS and takes the word 'Hey' as its token without merges (n %d)", n);
    tl_tokenizer_free(t);
}

#define EXPECT_REJECT(what, msg, ...)                                                                      \
    do {                                                                                                   \
        syn v_ = {__VA_ARGS__};                                                                            \
        tl_tokenizer *t_ = syn_load(&v_, NULL);                                                            \
        CHECK(!t_ && strstr(tl_last_error(), msg), "a vocab with %s is refused with \"%s\" (got \"%s\")", what, \
              msg, t_ ? "loaded" : tl_last_error());                                                       \
        tl_tokenizer_free(t_);                                                                             \
    } while (0)

static void test_hostile_vocabs(void) {
    static const char *const extra[] = {"ab"};
    static const char *const unknown[] = {"a b", "a q"}; /* "aq" is no token, nor "q"? q is a byte token */
    static const char *const no_space[] = {"ab"};
    static const char *const lead_space[] = {" ab"};
    static const char *const unknown_part[] = {"a zz"};
    EXPECT_REJECT("no merges key", "missing tokenizer.ggml.merges", "gpt-2", extra, 1, NULL, 0, 0);
    EXPECT_REJECT("merges of the wrong type", "tokenizer.ggml.merges", "gpt-2", extra, 1, NULL, 0, 1);
    EXPECT_REJECT("a merge without a space", "tokenizer.ggml.merges[0] 'ab' is not two tokens separated by a space",
                  "gpt-2", extra, 1, no_space, 1, 0);
    EXPECT_REJECT("a merge that is only a leading space", "tokenizer.ggml.merges[0] ' ab' is not two tokens", "gpt-2",
                  extra, 1, lead_space, 1, 0);
    EXPECT_REJECT("a merge of an unknown token", "tokenizer.ggml.merges[0] 'a zz': 'zz' is not a token", "gpt-2", extra,
                  1, unknown_part, 1, 0);
    EXPECT_REJECT("a merge whose result is no token", "tokenizer.ggml.merges[1] 'a q': the merged text is not a token",
                  "gpt-2", extra, 1, unknown, 2, 0);
    EXPECT_REJECT("an unknown pre-tokenizer", "unknown pre-tokenizer 'gpt-5' (tokenizer.ggml.pre)", "gpt-5", extra, 1,
                  no_merges, 0, 0);
    {
        /* a merges array that claims far more strings than the file holds */
        gguf_writer *gw = gw_new();
        gw_set_str(gw, "tokenizer.ggml.model", "gpt2");
        const char *toks[] = {"a", "b"};
        gw_set_arr_str(gw, "tokenizer.ggml.tokens", toks, 2);
        gw_set_arr_str(gw, "tokenizer.ggml.merges", toks, 2);
        uint8_t *buf;
        size_t len;
        gw_write_mem(gw, &buf, &len);
        /* patch the merges count (the u64 after the element type) to 2^40 */
        const char key[] = "tokenizer.ggml.merges";
        uint8_t *p = memmem(buf, len, key, sizeof key - 1);
        if (p) {
            uint64_t huge = (uint64_t)1 << 40;
            memcpy(p + sizeof key - 1 + 4 + 4, &huge, 8);
        }
        gguf_file *f = p ? gguf_open_buffer(buf, len) : NULL;
        tl_tokenizer *t = f ? tl_tokenizer_load(f) : NULL;
        CHECK(p && !t && tl_last_error()[0], "a merges count of 2^40 is refused with an error (%s)", tl_last_error());
        tl_tokenizer_free(t);
        gguf_close(f);
        free(buf);
        gw_free(gw);
    }
}

/* ---- speed --------------------------------------------------------------- */

/* Complexity guards, not speed figures: each case takes well under 1 s here
 * unloaded (about 3 s under ASan on a loaded 2-core machine), while a
 * quadratic path over a 256 KB piece takes minutes. The bound is set far
 * above the first and far below the second, so noise and sanitizers do not
 * trip it and a regression does. */
#define HANG_GUARD_S 30.0

static void test_speed(const char *dir) {
    tl_tokenizer *t = load_tok(dir, "ggml-vocab-gpt-2.gguf");
    if (!t) return;
    static const char para[] =
        "The quick brown fox jumps over the lazy dog. It's 3.14159 o'clock, and we'll see 42 sheep! "
        "Tokenizers split text into words, then merge bytes by rank.\n\n";
    size_t pl = sizeof para - 1, n = 0, cap = 1 << 20;
    char *text = malloc(cap);
    while (n + pl <= cap) memcpy(text + n, para, pl), n += pl;
    int32_t *ids;
    double t0 = tl_now();
    int ni = encode(t, text, n, 0, 0, &ids);
    double dt = tl_now() - t0;
    printf("gpt-2: %zu bytes -> %d tokens in %.3f s (%.0f tokens/s)\n", n, ni, dt, ni / (dt > 0 ? dt : 1e-9));
    CHECK(ni > 0 && dt < HANG_GUARD_S, "gpt-2 tokenizes 1 MB of English without a superlinear path (%.3f s)", dt);
    free(ids);

    /* long pieces must not be quadratic: 256 KB of one letter, of spaces, of digits */
    const char fill[] = {'a', ' ', '7'};
    for (int k = 0; k < 3; k++) {
        memset(text, fill[k], 256 << 10);
        t0 = tl_now();
        ni = encode(t, text, 256 << 10, 0, 0, &ids);
        dt = tl_now() - t0;
        CHECK(ni > 0 && dt < HANG_GUARD_S, "256 KB of '%c' tokenizes without a superlinear path (%.3f s, %d tokens)", fill[k], dt, ni);
        free(ids);
    }
    tl_tokenizer_free(t);
    t = load_tok(dir, "ggml-vocab-deepseek-llm.gguf");
    if (t) {
        memset(text, ' ', 256 << 10);
        text[(256 << 10) - 1] = '1';
        t0 = tl_now();
        ni = encode(t, text, 256 << 10, 0, 0, &ids);
        dt = tl_now() - t0;
        CHECK(ni > 0 && dt < HANG_GUARD_S, "deepseek-llm tokenizes 256 KB of spaces then a digit without a superlinear path (%.3f s)", dt);
        free(ids);
        tl_tokenizer_free(t);
    }
    free(text);
}

/* The gpt-2 vocab's tokens and merges under another tokenizer.ggml.pre. */
static tl_tokenizer *gpt2_vocab_with_pre(const char *dir, const char *pre) {
    char path[1024];
    snprintf(path, sizeof path, "%s/vocab/ggml-vocab-gpt-2.gguf", dir);
    gguf_file *f = gguf_open(path);
    const gguf_value *toks = NULL, *types = NULL, *merges = NULL;
    uint32_t bos = 0, eos = 0;
    if (!f || gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_T_STRING, &toks) != 1 ||
        gguf_get_arr(f, "tokenizer.ggml.token_type", GGUF_T_INT32, &types) != 1 ||
        gguf_get_arr(f, "tokenizer.ggml.merges", GGUF_T_STRING, &merges) != 1 ||
        gguf_get_u32(f, "tokenizer.ggml.bos_token_id", &bos) != 1 || gguf_get_u32(f, "tokenizer.ggml.eos_token_id", &eos) != 1) {
        gguf_close(f);
        return NULL;
    }
    const gguf_value *arrs[2] = {toks, merges};
    char **strs[2];
    for (int a = 0; a < 2; a++) {
        strs[a] = malloc(arrs[a]->v.arr.n * sizeof *strs[a]);
        for (uint64_t i = 0; i < arrs[a]->v.arr.n; i++) {
            const gguf_str *g = &arrs[a]->v.arr.items[i].v.str;
            strs[a][i] = strndup(g->ptr, (size_t)g->len);
        }
    }
    gguf_writer *gw = gw_new();
    gw_set_str(gw, "general.architecture", "gpt2");
    gw_set_str(gw, "tokenizer.ggml.model", "gpt2");
    gw_set_str(gw, "tokenizer.ggml.pre", pre);
    gw_set_arr_str(gw, "tokenizer.ggml.tokens", (const char *const *)strs[0], toks->v.arr.n);
    gw_set_arr_i32(gw, "tokenizer.ggml.token_type", types->v.arr.data, types->v.arr.n);
    gw_set_arr_str(gw, "tokenizer.ggml.merges", (const char *const *)strs[1], merges->v.arr.n);
    gw_set_u32(gw, "tokenizer.ggml.bos_token_id", bos);
    gw_set_u32(gw, "tokenizer.ggml.eos_token_id", eos);
    for (int a = 0; a < 2; a++) {
        for (uint64_t i = 0; i < arrs[a]->v.arr.n; i++) free(strs[a][i]);
        free(strs[a]);
    }
    gguf_close(f);
    return load_written(gw);
}

/* Pre-tokenizers with lists of their own, on the gpt-2 vocab's tokens and
 * merges: ik_llama.cpp's llama-tokenize gave exactly these ids for the
 * same vocab with tokenizer.ggml.pre rewritten (2026-12-07; on llama-bpe's
 * tokens and merges, 77 strings, llama.cpp's vocab inputs and more, gave
 * its ids for each of these and pixtral, trillion and grok-2 too). The
 * strings pick what each list does its own way: capitals starting a word
 * (tekken, gpt-4o), digits one or three at a time, newline runs kept
 * whole, kana / CJK runs (deepseek-v3). */
static void test_pretokenizer_lists(const char *dir) {
    static const char *const text[4] = {"HelloWorld iPhone McDonald's XMLHttpRequest", "1234567 89 3,141,592",
                                        "/usr/bin\n\n/a/b.txt",
                                        "\xe4\xb8\xad\xe6\x96\x87 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae"
                                        "\xe3\x83\x86\xe3\x82\xad\xe3\x82\xb9\xe3\x83\x88"};
    static const struct {
        const char *pre;
        int32_t want[4][20];
        int n[4];
    } lists[] = {
        {"tekken",
         {{15496, 10603, 1312, 6132, 1982, 7371, 338, 23735, 43481, 18453},
          {16, 17, 18, 19, 20, 21, 22, 220, 23, 24, 220, 18, 11, 16, 19, 16, 11, 20, 24, 17},
          {14, 14629, 14, 8800, 628, 14, 64, 14, 65, 13, 14116},
          {40792, 23877, 229, 10545, 245, 98, 17312, 105, 45739, 252, 5641, 24336, 25084, 43302}},
         {10, 20, 11, 14}},
        {"gpt-4o",
         {{15496, 10603, 1312, 6132, 1982, 7371, 338, 23735, 43481, 18453},
          {10163, 29228, 22, 220, 4531, 220, 18, 11, 23756, 11, 45839},
          {14, 14629, 14, 8800, 628, 14, 64, 14, 65, 13, 14116},
          {40792, 23877, 229, 10545, 245, 98, 17312, 105, 45739, 252, 5641, 24336, 25084, 43302}},
         {10, 11, 11, 14}},
        {"seed-coder",
         {{15496, 10603, 7133, 14115, 338, 23735, 43481, 18453},
          {16, 17, 18, 19, 20, 21, 22, 220, 23, 24, 220, 18, 11, 16, 19, 16, 11, 20, 24, 17},
          {14, 14629, 14, 8800, 628, 14, 64, 14, 65, 13, 14116},
          {40792, 23877, 229, 10545, 245, 98, 17312, 105, 45739, 252, 5641, 24336, 25084, 43302}},
         {8, 20, 11, 14}},
        {"qwen35",
         {{15496, 10603, 7133, 14115, 338, 23735, 43481, 18453},
          {16, 17, 18, 19, 20, 21, 22, 220, 23, 24, 220, 18, 11, 16, 19, 16, 11, 20, 24, 17},
          {14, 14629, 14, 8800, 628, 14, 64, 14, 65, 13, 14116},
          {40792, 23877, 229, 10545, 245, 98, 17312, 105, 45739, 252, 5641, 24336, 25084, 43302}},
         {8, 20, 11, 14}},
        {"deepseek-v3",
         {{15496, 10603, 7133, 14115, 338, 23735, 43481, 18453},
          {10163, 29228, 22, 220, 4531, 220, 18, 11, 23756, 11, 45839},
          {14, 14629, 14, 8800, 628, 14, 64, 14, 65, 13, 14116},
          {40792, 23877, 229, 220, 33768, 98, 17312, 105, 45739, 252, 5641, 24336, 25084, 43302}},
         {8, 11, 11, 14}},
    };
    for (size_t l = 0; l < sizeof lists / sizeof *lists; l++) {
        tl_tokenizer *t = gpt2_vocab_with_pre(dir, lists[l].pre);
        CHECK(t != NULL, "the gpt-2 vocab loads as '%s' (%s)", lists[l].pre, t ? "ok" : tl_last_error());
        for (int i = 0; i < 4 && t; i++) {
            int32_t *ids = NULL;
            int n = encode(t, text[i], strlen(text[i]), 0, 0, &ids);
            CHECK(n == lists[l].n[i] && !memcmp(ids, lists[l].want[i], (size_t)n * sizeof *ids),
                  "'%s' tokenizes string %d as ik_llama.cpp does (%d ids, want %d)", lists[l].pre, i, n,
                  lists[l].n[i]);
            if (n != lists[l].n[i]) print_ids("  got", ids, n);
            free(ids);
        }
        tl_tokenizer_free(t);
    }
}

/* Every pre-tokenizer name loads, and long uniform runs (one huge piece for
 * some regex) split in linear time without regex-engine errors. */
static void test_all_pretokenizers_long_runs(void) {
    static const char *names[] = {"default", "gpt-2", "phi-2", "mpt", "olmo", "jais", "llama3", "llama-v3",
                                  "llama-bpe", "falcon3", "dbrx", "smaug-bpe", "qwen2", "deepseek-r1-qwen",
                                  "stablelm2", "deepseek-llm", "deepseek-coder", "falcon", "starcoder", "refact",
                                  "command-r", "smollm", "codeshell", "exaone", "minerva-7b", "poro-chat", "bloom",
                                  "gpt3-finnish", "viking", "tekken", "gpt-4o", "seed-coder", "qwen35",
                                  "deepseek-v3", "pixtral", "trillion", "grok-2"};
    static const char *units[] = {" ", "\n", "a", "7", ".", "\xe4\xb8\xad", " \n", "\xc2\xa0", "'s", "a1.", "\xff"};
    enum { RUN = 64 << 10 };
    char *text = malloc(RUN + 8);
    size_t *ends = malloc((RUN + 8) * 3 * sizeof *ends);
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        syn v = {names[i], NULL, 0, no_merges, 0, 0};
        tl_tokenizer *t = syn_load(&v, NULL);
        CHECK(t != NULL, "pre-tokenizer '%s' loads (%s)", names[i], t ? "ok" : tl_last_error());
        if (!t) continue;
        double worst = 0;
        int all_ok = 1;
        for (size_t u = 0; u < sizeof units / sizeof *units; u++) {
            size_t ul = strlen(units[u]), n = 0;
            while (n + ul <= RUN) memcpy(text + n, units[u], ul), n += ul;
            text[n++] = 'x';
            double t0 = tl_now();
            long np = tok_bpe_split(t, text, n, ends, (RUN + 8) * 3);
            double dt = tl_now() - t0;
            if (dt > worst) worst = dt;
            if (np <= 0) {
                all_ok = 0;
                printf("  %s on runs of '%s': %s\n", names[i], units[u], tl_last_error());
            }
        }
        CHECK(all_ok && worst < HANG_GUARD_S / 3, "'%s' splits 64 KB runs without errors in linear time (worst %.3f s)", names[i],
              worst);
        tl_tokenizer_free(t);
    }
    free(text);
    free(ends);
}

int main(void) {
    test_utf8_prefix();
    test_pretokenizer_splits();
    test_all_pretokenizers_long_runs();
    test_synthetic_bpe();
    test_hostile_vocabs();
    const char *dir = test_shared_dir();
    if (!dir) {
        printf("skip: shared test data not found (set TINYLOOP_SHARED)\n");
        return test_summary();
    }
    static const char *vocabs[] = {"ggml-vocab-gpt-2.gguf",    "ggml-vocab-deepseek-coder.gguf",
                                   "ggml-vocab-deepseek-llm.gguf", "ggml-vocab-falcon.gguf",
                                   "ggml-vocab-starcoder.gguf", "ggml-vocab-refact.gguf",
                                   "ggml-vocab-mpt.gguf"};
    for (size_t i = 0; i < sizeof vocabs / sizeof *vocabs; i++) test_vocab_vectors(dir, vocabs[i]);
    test_gpt2_details(dir);
    test_pretokenizer_lists(dir);
    test_other_vocab_details(dir);
    for (size_t i = 0; i < sizeof vocabs / sizeof *vocabs; i++) test_random_roundtrip(dir, vocabs[i]);
    test_invalid_utf8(dir);
    test_speed(dir);
    return test_summary();
}
