/* test_tokenizer.c - SentencePiece tokenizer against llama.cpp's vocab test
 * vectors, the stories260K reference prompts, buffer conventions, hostile
 * inputs and a random encode/decode round trip. */
#include <stdint.h>

#include "gguf.h"
#include "test.h"
#include "tokenizer.h"
#include "tokenizer_impl.h"
#include "unicode_tables.h"
#include "util.h"

#include "gguf_writer.h"
#include "tok_util.h"
#include "vocab_check.h"

/* ---- llama.cpp test vectors --------------------------------------------- */

static void test_vocab_vectors(const char *dir, const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/vocab/%s", dir, name);
    tl_tokenizer *t = load_tok_path(path);
    int n_tests = t ? check_vocab_file(path, name, t, NULL) : -1;
    CHECK(t && n_tests >= 0, "%s and its .inp/.out test vectors load", name);
    if (t && n_tests >= 0) {
        CHECK(tl_tokenizer_n_vocab(t) >= 32000, "%s has its 32000+ tokens (%d)", name, tl_tokenizer_n_vocab(t));
        CHECK(n_tests == 46, "%s: all 46 test strings were read (%d)", name, n_tests);
    }
    tl_tokenizer_free(t);
}

/* The generated tables (checked once against Python's unicodedata for
 * every codepoint): ends of ranges, stride-2 case runs, negative deltas,
 * Hangul, values past the BMP, and neighbours that must not match. */
static void test_unicode_tables(void) {
    static const uint32_t nfd[][2] = {{0xC0, 'A'}, {0xC5, 'A'}, {0xC6, 0xC6}, {0x1E9B, 0x17F}, {0xAC00, 0x1100},
                                      {0xD7A3, 0x1112}, {0xD7A4, 0xD7A4}, {0x1D15E, 0x1D157}, {'a', 'a'}, {0x10FFFF, 0x10FFFF}};
    static const uint32_t low[][2] = {{'A', 'a'}, {'Z', 'z'}, {'[', '['}, {0x100, 0x101}, {0x101, 0x101},
                                      {0x12E, 0x12F}, {0x130, 'i'}, {0x178, 0xFF}, {0x3A3, 0x3C3}, {0x212A, 'k'},
                                      {0xFF21, 0xFF41}, {0x10400, 0x10428}, {0x1E900, 0x1E922}, {0x1E922, 0x1E922}};
    int bad = 0;
    for (size_t i = 0; i < sizeof nfd / sizeof nfd[0]; i++) bad += tl_uni_nfd_first(nfd[i][0]) != nfd[i][1];
    for (size_t i = 0; i < sizeof low / sizeof low[0]; i++) bad += tl_uni_tolower(low[i][0]) != low[i][1];
    bad += !tl_uni_is_punct('!') + tl_uni_is_punct('$') + !tl_uni_is_punct(0x3002) + tl_uni_is_punct('a');
    bad += !tl_uni_is_control(0x1) + !tl_uni_is_control(0x200B) + !tl_uni_is_control(0xE000) + tl_uni_is_control(' ');
    bad += !tl_uni_is_space(0x3000) + !tl_uni_is_space(0x85) + tl_uni_is_space(0x200B);
    CHECK(bad == 0, "the Unicode tables give NFD heads, lowercase and categories (%d wrong)", bad);
}

/* WordPiece (BERT's vocab, bert-bge): llama.cpp's vectors (ids only: the
 * algorithm lowercases and drops accents), [CLS] ... [SEP] around a text
 * with add_special, [UNK] for a word no pieces cover, invalid bytes and
 * controls dropped, special texts parsed only when asked. */
static void test_wordpiece(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/vocab/ggml-vocab-bert-bge.gguf", dir);
    tl_tokenizer *t = load_tok_path(path);
    CHECK(t != NULL, "the WordPiece vocab bert-bge loads (%s)", t ? "" : tl_last_error());
    if (!t) return;
    int n = check_vocab_file(path, "ggml-vocab-bert-bge.gguf", t, NULL);
    if (n >= 0) CHECK(n == 46, "bert-bge: all 46 test strings were read (%d)", n);

    int32_t *a, *b;
    int na = encode(t, "Hello world", 11, 1, 0, &a), nb;
    CHECK(na == 4 && a[0] == 101 && a[3] == 102, "add_special puts [CLS] first and [SEP] last (%d ids)", na);
    free(a);
    na = encode(t, "caf\xc3\xa9 \xf0\x9f\x98\x80!", 11, 0, 0, &a);
    nb = encode(t, "cafe", 4, 0, 0, &b);
    CHECK(na == nb + 2 && na > 0 && !memcmp(a, b, (size_t)nb * sizeof *a) && a[nb] == 100,
          "an accent is dropped (cafe == caf\\u00e9), an emoji no piece covers is [UNK], '!' a word of its own (%d, %d)", na,
          nb);
    free(a);
    free(b);
    na = encode(t, "AB\xff\x01" "C", 5, 0, 0, &a);
    nb = encode(t, "abc", 3, 0, 0, &b);
    CHECK(na == nb && na > 0 && !memcmp(a, b, (size_t)na * sizeof *a),
          "an invalid byte and a control character vanish, and case folds (%d vs %d ids)", na, nb);
    free(a);
    free(b);
    na = encode(t, "[CLS]", 5, 0, 1, &a);
    nb = encode(t, "[CLS]", 5, 0, 0, &b);
    CHECK(na == 1 && a[0] == 101 && nb > 1, "[CLS] is one token only with parse_special (%d, %d ids)", na, nb);
    free(a);
    free(b);
    tl_tokenizer_free(t);
}

/* ---- special tokens, flags, buffers, hostile text ------------------------ */

static int enc1(const tl_tokenizer *t, const char *s) {
    int32_t ids[8];
    int n = tl_tokenizer_encode(t, s, strlen(s), 0, 0, ids, 8);
    return n == 1 ? ids[0] : -1;
}

static int ids_eq(const int32_t *a, int na, const int32_t *b, int nb) {
    return na == nb && (na == 0 || memcmp(a, b, (size_t)na * sizeof *a) == 0);
}

static void test_llama_spm_details(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/vocab/ggml-vocab-llama-spm.gguf", dir);
    tl_tokenizer *t = load_tok_path(path);
    if (!t) return;
    CHECK(tl_tokenizer_bos(t) == 1 && tl_tokenizer_eos(t) == 2, "llama-spm: BOS 1, EOS 2");
    CHECK(tl_tokenizer_add_bos(t) == 1 && tl_tokenizer_add_eos(t) == 0, "llama-spm: adds BOS, not EOS");
    CHECK(tl_tokenizer_token_type(t, 1) == TL_TOK_CONTROL && tl_tokenizer_token_type(t, 0) == TL_TOK_UNKNOWN,
          "llama-spm: <s> is control, <unk> unknown");
    CHECK(strcmp(tl_tokenizer_token_text(t, 15043), "\xe2\x96\x81Hello") == 0, "llama-spm: token 15043 is '▁Hello'");
    CHECK(tl_tokenizer_token_text(t, 32000) == NULL && tl_tokenizer_token_type(t, -1) == -1,
          "llama-spm: out-of-range ids have no text or type");

    int32_t *ids, want[8];
    int n = encode(t, "Hello", 5, 1, 0, &ids);
    want[0] = 1, want[1] = 15043;
    CHECK(ids_eq(ids, n, want, 2), "llama-spm: 'Hello' with add_special is [1, 15043]");
    free(ids);
    n = encode(t, "<s>Hello</s>", 12, 0, 1, &ids);
    want[0] = 1, want[1] = 15043, want[2] = 2;
    CHECK(ids_eq(ids, n, want, 3), "llama-spm: parse_special makes '<s>Hello</s>' [1, 15043, 2] "
                                  "(dummy prefix after a special token, as llama.cpp)");
    free(ids);
    n = encode(t, "<s>", 3, 0, 0, &ids);
    CHECK(n > 1 && ids[0] != 1, "llama-spm: without parse_special '<s>' is plain text (%d ids)", n);
    free(ids);

    /* buffer conventions */
    int32_t one[1];
    int r = tl_tokenizer_encode(t, "Hello world", 11, 1, 0, one, 1);
    CHECK(r == -3, "llama-spm: encode into a 1-id buffer returns -(3 needed) (got %d)", r);
    r = tl_tokenizer_encode(t, "Hello world", 11, 1, 0, NULL, 0);
    CHECK(r == -3, "llama-spm: encode with no buffer returns -(needed) (got %d)", r);
    r = tl_tokenizer_encode(t, "", 0, 0, 0, NULL, 0);
    CHECK(r == 0, "llama-spm: the empty string has no tokens (got %d)", r);
    r = tl_tokenizer_encode(t, "", 0, 1, 0, one, 1);
    CHECK(r == 1 && one[0] == 1, "llama-spm: the empty string with add_special is [BOS]");
    char pb[16];
    r = tl_tokenizer_piece(t, 15043, 0, pb, 3);
    CHECK(r == -6, "llama-spm: piece of ' Hello' into 3 bytes returns -6 (got %d)", r);
    r = tl_tokenizer_piece(t, 15043, 0, pb, 16);
    CHECK(r == 6 && memcmp(pb, " Hello", 6) == 0, "llama-spm: piece of 15043 is ' Hello'");
    r = tl_tokenizer_piece(t, 1, 0, pb, 16);
    CHECK(r == 0, "llama-spm: BOS has an empty piece");
    r = tl_tokenizer_piece(t, 1, 1, pb, 16);
    CHECK(r == 3 && memcmp(pb, "<s>", 3) == 0, "llama-spm: BOS renders as '<s>' with render_special");
    r = tl_tokenizer_piece(t, 3 + 0x41, 0, pb, 16);
    CHECK(r == 1 && pb[0] == 'A', "llama-spm: byte token <0x41> gives 'A'");
    r = tl_tokenizer_piece(t, 40000, 0, pb, 16);
    CHECK(r < 0 && strstr(tl_last_error(), "40000"), "llama-spm: piece of id 40000 fails naming it");
    int32_t hello[3] = {1, 15043, 2787};
    r = tl_tokenizer_decode(t, hello, 3, pb, 5);
    CHECK(r == -12, "llama-spm: decode into 5 bytes returns -(11 + NUL) (got %d)", r);
    r = tl_tokenizer_decode(t, hello, 3, pb, 12);
    CHECK(r == 11 && strcmp(pb, "Hello World") == 0, "llama-spm: [BOS, 15043, 2787] decodes to 'Hello World'");
    r = tl_tokenizer_decode(t, hello + 1, 2, pb, 12);
    CHECK(r == 11 && strcmp(pb, "Hello World") == 0, "llama-spm: the leading dummy space is stripped without BOS");
    r = tl_tokenizer_decode(t, hello + 2, 1, pb, 12);
    CHECK(r == 5 && strcmp(pb, "World") == 0, "llama-spm: a lone ' World' decodes to 'World'");

    /* invalid UTF-8 and NULs go through byte fallback and come back intact */
    static const char bad[] = "\xff\xfe" "ab\x80" "cd\0e\xc3(xyz\xe2\x82qq \xf0\x9f\x98\0";
    size_t blen = sizeof bad - 1;
    n = encode(t, bad, blen, 0, 0, &ids);
    CHECK(n > 0, "llama-spm: invalid UTF-8 and NULs tokenize (%d ids)", n);
    int has_ff = 0, has_00 = 0;
    for (int i = 0; i < n; i++) has_ff |= ids[i] == 3 + 0xff, has_00 |= ids[i] == 3;
    CHECK(has_ff && has_00, "llama-spm: bytes 0xFF and 0x00 become <0xFF> and <0x00>");
    int dl;
    char *back = decode(t, ids, n, &dl);
    CHECK(back && (size_t)dl == blen && memcmp(back, bad, blen) == 0, "llama-spm: invalid UTF-8 round-trips");
    free(back);
    free(ids);
    /* A bad lead byte takes its full UTF-8 length in bytes (llama.cpp's
     * unicode_len_utf8), so "\xc3 a" splits the escaped space: the U+2581
     * bytes fall back to byte tokens and decode as themselves. */
    n = encode(t, "\xc3 a", 3, 0, 0, &ids);
    back = decode(t, ids, n, &dl);
    CHECK(back && strcmp(back, "\xc3\xe2\x96\x81" "a") == 0,
          "llama-spm: '\\xc3 a' decodes to '\\xc3' U+2581 'a', as in llama.cpp");
    free(back);
    free(ids);
    tl_tokenizer_free(t);
}

static void test_phi3_details(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/vocab/ggml-vocab-phi-3.gguf", dir);
    tl_tokenizer *t = load_tok_path(path);
    if (!t) return;
    CHECK(tl_tokenizer_eos(t) == 32000, "phi-3: EOS is 32000 (%d)", tl_tokenizer_eos(t));
    CHECK(tl_tokenizer_token_type(t, 2) == TL_TOK_USER_DEFINED, "phi-3: </s> is user-defined");
    int a = enc1(t, "a"), b = enc1(t, "b"), hi = enc1(t, "Hi");
    CHECK(a >= 0 && b >= 0 && hi >= 0, "phi-3: 'a', 'b' and 'Hi' are single tokens");
    int32_t *ids, want[4];
    /* user-defined tokens are matched even without parse_special; the
     * phi3 model name makes llama.cpp eat whitespace after them */
    int n = encode(t, "a</s> b", 7, 0, 0, &ids);
    want[0] = a, want[1] = 2, want[2] = b;
    CHECK(ids_eq(ids, n, want, 3), "phi-3: 'a</s> b' is ['▁a', </s>, '▁b'] without parse_special");
    free(ids);
    n = encode(t, "<|user|>\nHi", 11, 0, 1, &ids);
    want[0] = 32010, want[1] = hi;
    CHECK(ids_eq(ids, n, want, 2), "phi-3: '<|user|>\\nHi' with parse_special is [32010, '▁Hi']");
    free(ids);
    n = encode(t, "<|user|>", 8, 0, 0, &ids);
    CHECK(n > 1, "phi-3: control '<|user|>' is plain text without parse_special (%d ids)", n);
    free(ids);
    tl_tokenizer_free(t);
}

/* ---- stories260K --------------------------------------------------------- */

/* Copies the JSON string value after "key": at p into buf (simple escapes only). */
static const char *json_str(const char *p, const char *key, char *buf, size_t cap) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": \"", key);
    const char *s = strstr(p, pat);
    if (!s) return NULL;
    s += strlen(pat);
    size_t n = 0;
    for (; *s && *s != '"' && n + 1 < cap; s++) {
        char c = *s;
        if (c == '\\') {
            c = *++s;
            c = c == 'n' ? '\n' : c == 't' ? '\t' : c;
        }
        buf[n++] = c;
    }
    buf[n] = 0;
    return s;
}

static const char *json_ids(const char *p, const char *key, int32_t *ids, int *n, int cap) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": [", key);
    const char *s = strstr(p, pat);
    if (!s) return NULL;
    s += strlen(pat);
    *n = 0;
    while (*s && *s != ']' && *n < cap) {
        char *e;
        long v = strtol(s, &e, 10);
        if (e == s) break;
        ids[(*n)++] = (int32_t)v;
        s = e;
        while (*s == ',' || *s == ' ') s++;
    }
    return s;
}

static void test_stories(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/models/stories260K.gguf", dir);
    tl_tokenizer *t = load_tok_path(path);
    CHECK(t != NULL, "stories260K's vocab loads (padding id 0xFFFFFFFF means none)");
    if (!t) return;
    CHECK(tl_tokenizer_n_vocab(t) == 512, "stories260K has 512 tokens");
    snprintf(path, sizeof path, "%s/ref/stories260K_greedy.json", dir);
    char *json = read_all(path, NULL);
    CHECK(json != NULL, "stories260K_greedy.json is readable");
    if (!json) goto done;
    int n_prompts = 0;
    for (const char *p = json; (p = strstr(p, "{\"prompt\"")) != NULL; n_prompts++) {
        char prompt[256], gen[2048], all[2304];
        int32_t want[64], gen_ids[128], *ids;
        int nw = 0, ng = 0;
        const char *q = json_str(p, "prompt", prompt, sizeof prompt);
        q = q ? json_ids(q, "prompt_ids", want, &nw, 64) : NULL;
        q = q ? json_ids(q, "gen_ids", gen_ids, &ng, 128) : NULL;
        q = q ? json_str(q, "gen_text", gen, sizeof gen) : NULL;
        CHECK(q != NULL, "prompt %d of the reference parses", n_prompts);
        if (!q) break;
        p = q;
        int n = encode(t, prompt, strlen(prompt), 1, 0, &ids);
        CHECK(ids_eq(ids, n, want, nw), "stories260K: '%s' with BOS tokenizes to the reference ids", prompt);
        if (!ids_eq(ids, n, want, nw)) print_ids("got", ids, n);
        free(ids);

        /* generated text is the concatenation of the pieces */
        size_t gl = 0;
        for (int i = 0; i < ng; i++) {
            int r = tl_tokenizer_piece(t, gen_ids[i], 0, all + gl, (int)(sizeof all - gl));
            if (r < 0) break;
            gl += (size_t)r;
        }
        CHECK(gl == strlen(gen) && memcmp(all, gen, gl) == 0, "stories260K: pieces of gen_ids for '%s' are gen_text",
              prompt);
        /* and the whole sequence decodes to prompt + gen_text */
        int32_t seq[192];
        memcpy(seq, want, (size_t)nw * sizeof *seq);
        memcpy(seq + nw, gen_ids, (size_t)ng * sizeof *seq);
        int dl;
        char *back = decode(t, seq, nw + ng, &dl);
        snprintf(all, sizeof all, "%s%s", prompt, gen);
        CHECK(back && strcmp(back, all) == 0, "stories260K: prompt_ids + gen_ids decode to prompt + gen_text");
        free(back);
    }
    CHECK(n_prompts == 5, "stories260K: all 5 reference prompts were checked (%d)", n_prompts);
    free(json);
done:
    tl_tokenizer_free(t);
}

/* ---- random round trip --------------------------------------------------- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

static size_t put_utf8(char *o, uint32_t cp) {
    if (cp < 0x80) return o[0] = (char)cp, 1;
    if (cp < 0x800) return o[0] = (char)(0xC0 | cp >> 6), o[1] = (char)(0x80 | (cp & 63)), 2;
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12), o[1] = (char)(0x80 | (cp >> 6 & 63)), o[2] = (char)(0x80 | (cp & 63));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18), o[1] = (char)(0x80 | (cp >> 12 & 63));
    o[2] = (char)(0x80 | (cp >> 6 & 63)), o[3] = (char)(0x80 | (cp & 63));
    return 4;
}

/* Random text: ASCII words, runs of spaces, tabs/newlines and 2-4 byte
 * characters. U+2581 is left out: the vocab uses it for space, so it
 * cannot come back as itself. */
static size_t random_text(char *o, size_t max_chars) {
    size_t n = 0, k = 1 + rnd() % max_chars;
    for (size_t i = 0; i < k; i++) {
        uint32_t r = rnd() % 100, cp;
        if (r < 45) cp = 'a' + rnd() % 26;
        else if (r < 60) cp = ' ';
        else if (r < 70) cp = 0x21 + rnd() % 94;
        else if (r < 74) cp = "\t\n\r"[rnd() % 3];
        else if (r < 84) cp = 0x80 + rnd() % (0x800 - 0x80);
        else if (r < 94) {
            do cp = 0x800 + rnd() % (0x10000 - 0x800);
            while ((cp >= 0xD800 && cp < 0xE000) || cp == 0x2581);
        } else cp = 0x10000 + rnd() % (0x110000 - 0x10000);
        n += put_utf8(o + n, cp);
    }
    return n;
}

static void test_random_roundtrip(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/vocab/ggml-vocab-llama-spm.gguf", dir);
    tl_tokenizer *t = load_tok_path(path);
    if (!t) return;
    int fails = 0, total = 3000;
    char buf[64 * 4 + 1];
    for (int i = 0; i < total; i++) {
        size_t len = random_text(buf, 64);
        int add_special = i & 1;
        int32_t *ids;
        int n = encode(t, buf, len, add_special, 0, &ids);
        int dl = 0;
        char *back = n >= 0 ? decode(t, ids, n, &dl) : NULL;
        int ok = back && (size_t)dl == len && memcmp(back, buf, len) == 0;
        if (!ok && fails++ < 5) printf("  round trip %d failed: '%.*s' -> '%s'\n", i, (int)len, buf, back);
        free(back);
        free(ids);
    }
    CHECK(fails == 0, "llama-spm: %d random strings round-trip through encode/decode (%d fail)", total, fails);
    tl_tokenizer_free(t);
}

/* ---- hostile vocab files ------------------------------------------------- */

/* A tiny SentencePiece vocab: <unk> <s> </s>, 256 byte tokens, then these. */
enum { V_SP = 259, V_A, V_B, V_SPA, V_AB, V_SPAB, V_AA, V_USER, V_N };
static const char *tiny_extra[] = {"\xe2\x96\x81", "a", "b", "\xe2\x96\x81" "a", "ab", "\xe2\x96\x81" "ab", "aa",
                                   "<|x|>"};
static const float tiny_extra_score[] = {-5, -6, -7, -1, -2, -0.5f, -3, 0};

typedef struct tiny {
    gguf_writer *gw;
    const char *tok[V_N];
    char bytes[256][7];
    float score[V_N];
    int32_t type[V_N];
} tiny;

static void tiny_init(tiny *v) {
    v->gw = gw_new();
    gw_set_str(v->gw, "tokenizer.ggml.model", "llama");
    const char *head[] = {"<unk>", "<s>", "</s>"};
    for (int i = 0; i < V_N; i++) {
        v->score[i] = 0;
        v->type[i] = i == 0 ? TL_TOK_UNKNOWN : i < 3 ? TL_TOK_CONTROL : i < V_SP ? TL_TOK_BYTE : TL_TOK_NORMAL;
        if (i < 3) v->tok[i] = head[i];
        else if (i < V_SP) snprintf(v->bytes[i - 3], 7, "<0x%02X>", i - 3), v->tok[i] = v->bytes[i - 3];
        else v->tok[i] = tiny_extra[i - V_SP], v->score[i] = tiny_extra_score[i - V_SP];
    }
    v->type[V_USER] = TL_TOK_USER_DEFINED;
}

/* Writes tokens/scores/types (n of each, unless < 0: left out) and loads. */
static tl_tokenizer *tiny_load(tiny *v, int n_tok, int n_score, int n_type) {
    if (n_tok >= 0) gw_set_arr_str(v->gw, "tokenizer.ggml.tokens", v->tok, (size_t)n_tok);
    if (n_score >= 0) gw_set_arr_f32(v->gw, "tokenizer.ggml.scores", v->score, (size_t)n_score);
    if (n_type >= 0) gw_set_arr_i32(v->gw, "tokenizer.ggml.token_type", v->type, (size_t)n_type);
    uint8_t *buf;
    size_t len;
    tl_tokenizer *t = NULL;
    if (gw_write_mem(v->gw, &buf, &len) == 0) {
        gguf_file *f = gguf_open_buffer(buf, len);
        if (f) t = tl_tokenizer_load(f);
        else printf("  gguf_open_buffer: %s\n", tl_last_error());
        gguf_close(f);
        free(buf);
    }
    gw_free(v->gw);
    v->gw = NULL;
    return t;
}

/* Loads a tiny vocab after `edit`, expecting failure with `msg` in the error. */
#define EXPECT_REJECT(what, msg, edit)                                                                 \
    do {                                                                                               \
        tiny v;                                                                                        \
        tiny_init(&v);                                                                                 \
        int nt = V_N, ns = V_N, ny = V_N;                                                              \
        edit;                                                                                          \
        tl_tokenizer *t_ = tiny_load(&v, nt, ns, ny);                                                  \
        CHECK(!t_ && strstr(tl_last_error(), msg), "a vocab with %s is refused with \"%s\" (got \"%s\")", \
              what, msg, t_ ? "loaded" : tl_last_error());                                            \
        tl_tokenizer_free(t_);                                                                         \
        (void)nt, (void)ns, (void)ny;                                                                  \
    } while (0)

static void test_vocab_rejects(void) {
    EXPECT_REJECT("a mismatched scores length", "tokenizer.ggml.scores has 10 entries but tokenizer.ggml.tokens has",
                  ns = 10);
    EXPECT_REJECT("a mismatched token_type length", "tokenizer.ggml.token_type has 10 entries", ny = 10);
    EXPECT_REJECT("no tokens", "missing tokenizer.ggml.tokens", nt = -1);
    EXPECT_REJECT("an empty token list", "tokenizer.ggml.tokens is empty", (nt = 0, ns = 0, ny = 0));
    EXPECT_REJECT("a BOS id past the vocab", "tokenizer.ggml.bos_token_id = 5000 is out of range",
                  gw_set_u32(v.gw, "tokenizer.ggml.bos_token_id", 5000));
    EXPECT_REJECT("a negative UNK id", "tokenizer.ggml.unknown_token_id",
                  gw_set_i32(v.gw, "tokenizer.ggml.unknown_token_id", -2));
    EXPECT_REJECT("a string EOS id", "tokenizer.ggml.eos_token_id",
                  gw_set_str(v.gw, "tokenizer.ggml.eos_token_id", "2"));
    EXPECT_REJECT("a u32 add_bos_token", "tokenizer.ggml.add_bos_token",
                  gw_set_u32(v.gw, "tokenizer.ggml.add_bos_token", 1));
    EXPECT_REJECT("integer scores", "tokenizer.ggml.scores",
                  (ns = -1, gw_set_arr_i32(v.gw, "tokenizer.ggml.scores", v.type, V_N)));
    EXPECT_REJECT("a duplicate token text", "ids 260 and 262 have the same text", v.tok[V_SPA] = "a");
    EXPECT_REJECT("a malformed byte token", "byte token 5 has text '<0xZZ>'", v.tok[5] = "<0xZZ>");
    EXPECT_REJECT("tokenizer model 't5'", "unsupported tokenizer model 't5'",
                  gw_set_str(v.gw, "tokenizer.ggml.model", "t5"));
    EXPECT_REJECT("no tokenizer model", "tokenizer.ggml.model", gw_set_u32(v.gw, "tokenizer.ggml.model", 1));
}

static void test_tiny_vocab(void) {
    tiny v;
    tiny_init(&v);
    tl_tokenizer *t = tiny_load(&v, V_N, V_N, V_N);
    CHECK(t != NULL, "the tiny test vocab loads (%s)", t ? "" : tl_last_error());
    if (t) {
        int32_t ids[8];
        int n = tl_tokenizer_encode(t, "ab", 2, 0, 0, ids, 8);
        CHECK(n == 1 && ids[0] == V_SPAB, "tiny: 'ab' merges to '▁ab' (best score first: ▁a, then ▁ab)");
        n = tl_tokenizer_encode(t, "aaa", 3, 0, 0, ids, 8);
        CHECK(n == 2 && ids[0] == V_SPA && ids[1] == V_AA, "tiny: 'aaa' is ▁a aa ('▁a' outscores 'aa')");
        n = tl_tokenizer_encode(t, "baaa", 4, 0, 0, ids, 8);
        CHECK(n == 4 && ids[0] == V_SP && ids[1] == V_B && ids[2] == V_AA && ids[3] == V_A,
              "tiny: equal-score pairs merge left-most first ('baaa' is ▁ b aa a)");
        n = tl_tokenizer_encode(t, "c", 1, 1, 0, ids, 8);
        CHECK(n == 3 && ids[0] == 1 && ids[1] == V_SP && ids[2] == 3 + 'c',
              "tiny: BOS by default, 'c' falls back to <0x63>");
        n = tl_tokenizer_encode(t, "a<|x|>b", 7, 0, 0, ids, 8);
        CHECK(n == 4 && ids[0] == V_SPA && ids[1] == V_USER && ids[2] == V_SP && ids[3] == V_B,
              "tiny: user-defined '<|x|>' is one token even without parse_special, '▁' prefix after it");
        tl_tokenizer_free(t);
    }

    /* accepted oddities: 0xFFFFFFFF ids, unknown types, empty texts, NULs in texts */
    tiny_init(&v);
    gw_set_u32(v.gw, "tokenizer.ggml.bos_token_id", UINT32_MAX);
    gw_set_bool(v.gw, "tokenizer.ggml.add_bos_token", 0);
    gw_set_bool(v.gw, "tokenizer.ggml.add_space_prefix", 0);
    v.type[V_B] = 99;
    v.tok[V_AA] = "";
    t = tiny_load(&v, V_N, V_N, V_N);
    CHECK(t != NULL, "a vocab with bos 0xFFFFFFFF, a type 99 and an empty text loads (%s)", t ? "" : tl_last_error());
    if (t) {
        int32_t ids[8];
        char buf[8];
        CHECK(tl_tokenizer_bos(t) == 1, "bos 0xFFFFFFFF keeps the SentencePiece default 1, as llama.cpp");
        int n = tl_tokenizer_encode(t, "a", 1, 1, 0, ids, 8);
        CHECK(n == 1 && ids[0] == V_A, "with add_bos_token and add_space_prefix false, 'a' is just 'a' (n %d)", n);
        CHECK(tl_tokenizer_token_type(t, V_B) == TL_TOK_UNDEFINED && tl_tokenizer_piece(t, V_B, 0, buf, 8) == 0,
              "type 99 becomes UNDEFINED, with an empty piece");
        n = tl_tokenizer_encode(t, "aa", 2, 0, 0, ids, 8);
        CHECK(n == 2 && ids[0] == V_A && ids[1] == V_A, "an empty token text never matches");
        tl_tokenizer_free(t);
    }

    /* token texts with NUL bytes, written raw: ["<unk>", "x\0y", "x"], no byte tokens */
    gguf_writer *gw = gw_new();
    gw_set_str(gw, "tokenizer.ggml.model", "llama");
    uint8_t raw[128];
    size_t rl = 0;
    uint32_t et = GGUF_T_STRING;
    uint64_t cnt = 3;
    const char *txt[3] = {"<unk>", "x\0y", "x"};
    const uint64_t tl[3] = {5, 3, 1};
    memcpy(raw, &et, 4), rl += 4;
    memcpy(raw + rl, &cnt, 8), rl += 8;
    for (int i = 0; i < 3; i++) memcpy(raw + rl, &tl[i], 8), rl += 8, memcpy(raw + rl, txt[i], tl[i]), rl += tl[i];
    gw_set_raw(gw, "tokenizer.ggml.tokens", GGUF_T_ARRAY, raw, rl);
    gw_set_bool(gw, "tokenizer.ggml.add_space_prefix", 0);
    uint8_t *buf;
    size_t len;
    t = NULL;
    if (gw_write_mem(gw, &buf, &len) == 0) {
        gguf_file *f = gguf_open_buffer(buf, len);
        t = f ? tl_tokenizer_load(f) : NULL;
        gguf_close(f);
        free(buf);
    }
    gw_free(gw);
    CHECK(t != NULL, "a vocab whose token holds a NUL loads (%s)", t ? "" : tl_last_error());
    if (t) {
        int32_t ids[8];
        char out[8];
        int n = tl_tokenizer_encode(t, "x\0y", 3, 0, 0, ids, 8);
        /* symbols x, \0, y: 'x\0' is no token, so no merge; \0 and y have no byte token: UNK */
        CHECK(n == 3 && ids[0] == 2 && ids[1] == 0 && ids[2] == 0, "'x\\0y' is x <unk> <unk> (no pairwise merge)");
        n = tl_tokenizer_piece(t, 1, 0, out, 8);
        CHECK(n == 3 && memcmp(out, "x\0y", 3) == 0, "the piece of 'x\\0y' keeps all 3 bytes");
        n = tl_tokenizer_encode(t, "x", 1, 0, 0, ids, 8);
        CHECK(n == 1 && ids[0] == 2, "'x' is still found next to 'x\\0y'");
        tl_tokenizer_free(t);
    }
}

int main(void) {
    const char *dir = test_shared_dir();
    if (!dir) {
        printf("skip: shared test data not found (set TINYLOOP_SHARED)\n");
        return test_summary();
    }
    test_vocab_vectors(dir, "ggml-vocab-llama-spm.gguf");
    test_vocab_vectors(dir, "ggml-vocab-phi-3.gguf");
    test_wordpiece(dir);
    test_unicode_tables();
    test_llama_spm_details(dir);
    test_phi3_details(dir);
    test_stories(dir);
    test_random_roundtrip(dir);
    test_vocab_rejects();
    test_tiny_vocab();
    return test_summary();
}
