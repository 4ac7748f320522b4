/* tokenizer_bpe.c - byte-level BPE ("gpt2" vocabs), token for token as
 * llama.cpp's llm_tokenizer_bpe_session:
 *
 *   raw fragment --sanitize--> valid UTF-8 --pre-tokenizer regexes--> words
 *   word bytes --GPT-2 bytes_to_unicode--> one symbol per byte
 *   symbols --merge the lowest-rank adjacent pair, leftmost first--> ids
 *
 * Pre-tokenizers are llama-vocab.cpp's regex lists per tokenizer.ggml.pre,
 * run with PCRE2 (UTF + UCP, JIT when available). Each regex splits the
 * pieces the previous one produced: matches and the text between them both
 * become pieces, and a regex sees one piece as its whole subject (look-ahead
 * and $ stop at the piece's end), as llama.cpp's unicode_regex_split does.
 * Where llama.cpp rewrote a pattern for std::regex (the case-insensitive
 * contractions) we use its rewritten form; \s and \S are spelled out as
 * llama.cpp's whitespace set (Unicode White_Space; PCRE2's \s would add
 * U+180E).
 *
 * Invalid UTF-8 input is defined, not an error: every byte that does not
 * start a valid sequence (RFC 3629: no overlongs, surrogates or code points
 * past U+10FFFF) becomes U+FFFD before pre-tokenization, one per byte, as
 * llama.cpp's unicode_cpts_from_utf8 does (it differs only in letting
 * overlongs and surrogates through). Decoding then gives U+FFFD where the
 * bad bytes were, so only such input does not round-trip.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <stdlib.h>
#include <string.h>

#include "tinyloop.h"
#include "tokenizer_impl.h"
#include "util.h"

#define BPE_MAX_RE 8
#define BPE_MAX_MERGES (1 << 24)
#define MKEY_EMPTY UINT64_MAX

struct tok_bpe {
    pcre2_code *re[BPE_MAX_RE]; /* applied in order, each to the previous one's pieces */
    int n_re;
    int ignore_merges;           /* a word that is itself a token skips merging (llama3) */
    uint64_t *mkey;              /* merge map: left id << 32 | right id, MKEY_EMPTY when free */
    int32_t *mrank, *mres;       /* its rank (index in tokenizer.ggml.merges) and merged token */
    uint32_t mmask;
    int32_t byte_sym[256];       /* token whose text is the byte-level char of a byte, -1 none */
    uint8_t enc[256][2], enc_len[256]; /* the byte-level char of each byte, UTF-8 */
    int16_t dec[0x144];          /* the byte of a byte-level code point, -1 none */
};

/* ------------------------------------------------------------------------ */
/* pre-tokenizers (llama-vocab.cpp, llm_tokenizer_bpe)                      */
/* ------------------------------------------------------------------------ */

#define WS "\\t-\\r \\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}"
#define SP "[" WS "]"   /* \s */
#define NSP "[^" WS "]" /* \S */

#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" WS "\\p{L}\\p{N}]+|" SP "+(?!" NSP ")"
#define RE_CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define RE_LLAMA3_LIKE(NUM)                                                                        \
    RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|" NUM "| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*|" SP \
                    "*[\\r\\n]+|" SP "+(?!" NSP ")|" SP "+"
/* Mistral's tekken and OpenAI's o200k ("gpt-4o"): runs of capitals then
 * lower-case letters, in llama.cpp's rewrite for std::regex (any letter but
 * a-z, then any letter but A-Z: non-ASCII letters count as both, as there),
 * NUM digits at a time, CONTR an optional contraction after a word. */
#define RE_NOT_LOWER "[^\\P{L}a-z]"
#define RE_NOT_UPPER "[^\\P{L}A-Z]"
#define RE_CASED_WORDS(NUM, CONTR)                                                                               \
    "[^\\r\\n\\p{L}\\p{N}]?" RE_NOT_LOWER "*" RE_NOT_UPPER "+" CONTR "|[^\\r\\n\\p{L}\\p{N}]?" RE_NOT_LOWER \
    "+" RE_NOT_UPPER "*" CONTR "|" NUM "| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n/]*|" SP "*[\\r\\n]+|" SP "+(?!" NSP     \
    ")|" SP "+"
#define RE_CJK "[\\x{4e00}-\\x{9fa5}\\x{800}-\\x{4e00}\\x{ac00}-\\x{d7ff}]+"
#define RE_PORO " ?[^(" WS "|.,!?\\x{2026}\\x{3002}\\x{ff0c}\\x{3001}\\x{964}\\x{6d4}\\x{60c})]+"

/* deepseek-llm's letter class (cased letters), code points as in llama.cpp's source. */
#define DS_LETTERS                                                                                                   \
    "A-Za-z\\x{b5}\\x{c0}-\\x{d6}\\x{d8}-\\x{f6}\\x{f8}-\\x{1ba}\\x{1bc}-\\x{1bf}\\x{1c4}-\\x{293}\\x{295}-\\x{2af}"  \
    "\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37b}-\\x{37d}\\x{37f}\\x{386}\\x{388}-\\x{38a}\\x{38c}\\x{38e}-\\x{3a1}"     \
    "\\x{3a3}-\\x{3f5}\\x{3f7}-\\x{481}\\x{48a}-\\x{52f}\\x{531}-\\x{556}\\x{10a0}-\\x{10c5}\\x{13a0}-\\x{13f5}"       \
    "\\x{13f8}-\\x{13fd}\\x{1c90}-\\x{1cba}\\x{1cbd}-\\x{1cbf}\\x{1d00}-\\x{1d2b}\\x{1d6b}-\\x{1d77}\\x{1d79}-"         \
    "\\x{1d9a}\\x{1e00}-\\x{1f15}\\x{1f18}-\\x{1f1d}\\x{1f20}-\\x{1f45}\\x{1f48}-\\x{1f4d}\\x{1f50}-\\x{1f57}"         \
    "\\x{1f59}\\x{1f5b}\\x{1f5d}\\x{1f5f}-\\x{1f7d}\\x{1f80}-\\x{1fb4}\\x{1fb6}-\\x{1fbc}\\x{1fbe}\\x{1fc2}-"           \
    "\\x{1fc4}\\x{1fc6}-\\x{1fcc}\\x{1fd0}-\\x{1fd3}\\x{1fd6}-\\x{1fdb}\\x{1fe0}-\\x{1fec}\\x{1ff2}-\\x{1ff4}"         \
    "\\x{1ff6}-\\x{1ffc}\\x{2102}\\x{2107}\\x{210a}-\\x{2113}\\x{2115}\\x{2119}-\\x{211d}\\x{2124}\\x{2126}\\x{2128}"  \
    "\\x{212a}-\\x{212d}\\x{212f}-\\x{2134}\\x{2139}\\x{213c}-\\x{213f}\\x{2145}-\\x{2149}\\x{214e}\\x{2183}"         \
    "\\x{2184}\\x{2c00}-\\x{2c7b}\\x{2c7e}-\\x{2ce4}\\x{2ceb}-\\x{2cee}\\x{2cf2}\\x{2cf3}\\x{a640}-\\x{a66d}"           \
    "\\x{a680}-\\x{a69b}\\x{a722}-\\x{a76f}\\x{a771}-\\x{a787}\\x{a78b}-\\x{a78e}\\x{ab70}-\\x{abbf}\\x{fb00}-"         \
    "\\x{fb06}\\x{fb13}-\\x{fb17}\\x{ff21}-\\x{ff3a}\\x{ff41}-\\x{ff5a}\\x{10400}-\\x{1044f}\\x{104b0}-\\x{104d3}"     \
    "\\x{104d8}-\\x{104fb}\\x{10c80}-\\x{10cb2}\\x{10cc0}-\\x{10cf2}\\x{118a0}-\\x{118df}\\x{1e900}-\\x{1e943}"

static const char *const re_default[] = {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]", NULL};
static const char *const re_gpt2[] = {RE_GPT2, NULL};
static const char *const re_llama3[] = {RE_LLAMA3_LIKE("\\p{N}{1,3}"), NULL};
static const char *const re_qwen2[] = {RE_LLAMA3_LIKE("\\p{N}"), NULL};
static const char *const re_starcoder[] = {"\\p{N}", RE_GPT2, NULL};
static const char *const re_falcon[] = {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]", NULL};
static const char *const re_ds_coder[] = {"[\\r\\n]", SP "?\\p{L}+", SP "?\\p{P}+", RE_CJK, "\\p{N}", NULL};
static const char *const re_ds_llm[] = {
    "[\\r\\n]",
    SP "?[" DS_LETTERS "]+",
    SP "?[!-/:-~\\x{ff01}-\\x{ff0f}\\x{ff1a}-\\x{ff5e}\\x{2018}-\\x{201f}\\x{3000}-\\x{3002}]+",
    /* llama.cpp's "\s+$"; the look-behind starts it only at the start of a
     * whitespace run, which keeps long runs linear (same matches) */
    "(?<!" SP ")" SP "++$",
    RE_CJK,
    "\\p{N}+",
    NULL};
static const char *const re_poro[] = {RE_PORO, NULL};
static const char *const re_tekken[] = {RE_CASED_WORDS("\\p{N}", ""), NULL};
static const char *const re_gpt4o[] = {RE_CASED_WORDS("\\p{N}{1,3}", RE_CONTRACTIONS "?"), NULL};
static const char *const re_seed_coder[] = {RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^" WS
                                                            "\\p{L}\\p{N}\\r\\n]+|" SP "*[\\r\\n]+|" SP
                                                            "+(?!" NSP ")|" SP "+",
                                            NULL};
static const char *const re_qwen35[] = {RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^" WS
                                                        "\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|" SP "*[\\r\\n]+|" SP
                                                        "+(?!" NSP ")|" SP "+",
                                        NULL};
/* deepseek-v3: digits by three, kana and CJK runs, then words */
static const char *const re_ds3[] = {
    "\\p{N}{1,3}", "[\\x{4e00}-\\x{9fa5}\\x{3040}-\\x{309f}\\x{30a0}-\\x{30ff}]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
    "?[\\p{P}\\p{S}]+[\\r\\n]*|" SP "*[\\r\\n]+|" SP "+(?!" NSP ")|" SP "+",
    NULL};
static const char *const re_viking[] = {RE_PORO, "\\p{N}", NULL};

/* llama.cpp's flags per pre-tokenizer name (llama_vocab::impl::load); a
 * missing tokenizer.ggml.pre means "default" there too. */
static const struct pre_def {
    const char *name;
    const char *const *re;
    unsigned char add_bos, ignore_merges;
} pre_defs[] = {
    {"default", re_default, 0, 0},      {"gpt-2", re_gpt2, 0, 0},           {"phi-2", re_gpt2, 0, 0},
    {"mpt", re_gpt2, 0, 0},             {"olmo", re_gpt2, 0, 0},            {"jais", re_gpt2, 0, 0},
    {"llama3", re_llama3, 1, 1},        {"llama-v3", re_llama3, 1, 1},      {"llama-bpe", re_llama3, 1, 1},
    {"falcon3", re_llama3, 1, 1},       {"dbrx", re_llama3, 0, 0},          {"smaug-bpe", re_llama3, 0, 0},
    {"qwen2", re_qwen2, 0, 0},          {"deepseek-r1-qwen", re_qwen2, 0, 0}, {"stablelm2", re_qwen2, 0, 0},
    {"deepseek-llm", re_ds_llm, 0, 0},  {"deepseek-coder", re_ds_coder, 0, 0}, {"falcon", re_falcon, 0, 0},
    {"starcoder", re_starcoder, 0, 0},  {"refact", re_starcoder, 0, 0},     {"command-r", re_starcoder, 0, 0},
    {"smollm", re_starcoder, 0, 0},     {"codeshell", re_starcoder, 0, 0},  {"exaone", re_starcoder, 0, 0},
    {"minerva-7b", re_starcoder, 0, 0}, {"poro-chat", re_poro, 0, 0},       {"bloom", re_poro, 0, 0},
    {"gpt3-finnish", re_poro, 0, 0},    {"viking", re_viking, 0, 0},
    /* names llama.cpp maps to the same lists */
    {"pixtral", re_llama3, 1, 1},       {"midm-2.0", re_llama3, 1, 1},      {"laguna", re_llama3, 1, 1},
    {"falcon-h1", re_llama3, 1, 1},     {"lfm2", re_llama3, 1, 1},          {"jina-v5-nano", re_llama3, 1, 1},
    {"a.x-4.0", re_gpt2, 0, 0},         {"mellum", re_gpt2, 0, 0},          {"gigachat", re_gpt2, 0, 0},
    {"exaone4", re_gpt2, 0, 0},         {"trillion", re_gpt2, 0, 0},        {"granite-docling", re_gpt2, 0, 0},
    {"modern-bert", re_gpt2, 0, 0},     {"jina-es", re_gpt2, 0, 0},         {"jina-de", re_gpt2, 0, 0},
    {"jina-v2-es", re_gpt2, 0, 0},      {"jina-v2-de", re_gpt2, 0, 0},      {"mellum2", re_starcoder, 0, 0},
    {"cohere2_moe", re_starcoder, 0, 0}, {"kormo", re_qwen2, 0, 0},         {"openpangu", re_qwen2, 0, 0},
    {"f2llmv2", re_qwen2, 0, 0},        {"megrez", re_qwen2, 0, 0},         {"hunyuan", re_qwen2, 0, 0},
    {"solar-open", re_qwen2, 0, 0},     {"grok-2", re_qwen2, 0, 0},
    /* and lists of their own */
    {"tekken", re_tekken, 1, 1},        {"gpt-4o", re_gpt4o, 0, 0},         {"llama4", re_gpt4o, 0, 0},
    {"kanana2", re_gpt4o, 0, 0},        {"minimax-m2", re_gpt4o, 0, 0},     {"seed-coder", re_seed_coder, 0, 0},
    {"qwen35", re_qwen35, 0, 0},        {"deepseek-v3", re_ds3, 0, 0},      {"hunyuan-dense", re_ds3, 0, 0},
    {"joyai-llm", re_ds3, 0, 0},
};

static int compile_pre(struct tok_bpe *b, const struct pre_def *d) {
    for (int i = 0; d->re[i]; i++) {
        int err;
        PCRE2_SIZE at;
        pcre2_code *re = pcre2_compile((PCRE2_SPTR)d->re[i], PCRE2_ZERO_TERMINATED,
                                       PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &err, &at, NULL);
        if (!re) {
            PCRE2_UCHAR msg[128];
            pcre2_get_error_message(err, msg, sizeof msg);
            return tl_set_error(TL_ERR_UNSUPPORTED, "pre-tokenizer '%s': regex %d does not compile: %s (offset %zu)",
                                d->name, i, (const char *)msg, (size_t)at);
        }
        /* Without JIT (unsupported CPU, no executable memory) the interpreter runs it. */
        (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
        b->re[b->n_re++] = re;
    }
    return TL_OK;
}

/* ------------------------------------------------------------------------ */
/* loading                                                                  */
/* ------------------------------------------------------------------------ */

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves,
 * the other 68 bytes for U+0100.. in byte order. */
static void byte_tables(const tl_tokenizer *t, struct tok_bpe *b) {
    int extra = 0;
    for (int i = 0; i < 0x144; i++) b->dec[i] = -1;
    for (int c = 0; c < 256; c++) {
        int printable = (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || c >= 174;
        int cp = printable ? c : 256 + extra++;
        if (cp < 0x80) {
            b->enc[c][0] = (uint8_t)cp;
            b->enc_len[c] = 1;
        } else {
            b->enc[c][0] = (uint8_t)(0xC0 | (cp >> 6));
            b->enc[c][1] = (uint8_t)(0x80 | (cp & 0x3F));
            b->enc_len[c] = 2;
        }
        b->dec[cp] = (int16_t)c;
        b->byte_sym[c] = tok_vocab_find(t, (const char *)b->enc[c], b->enc_len[c]);
    }
}

static uint32_t merge_hash(uint64_t key) { return (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 32); }

/* The slot of (a, b), or the free slot where it would go (the map is at most half full). */
static uint32_t merge_slot(const struct tok_bpe *b, uint64_t key) {
    uint32_t i = merge_hash(key) & b->mmask;
    while (b->mkey[i] != MKEY_EMPTY && b->mkey[i] != key) i = (i + 1) & b->mmask;
    return i;
}

static int load_merges(tl_tokenizer *t, struct tok_bpe *b, const gguf_file *f) {
    const gguf_value *m;
    int rc = gguf_get_arr(f, "tokenizer.ggml.merges", GGUF_T_STRING, &m);
    if (rc < 0) return TL_ERR_FORMAT;
    if (rc == 0) return tl_set_error(TL_ERR_FORMAT, "missing tokenizer.ggml.merges (a gpt2 vocab needs its BPE merges)");
    uint64_t n = m->v.arr.n;
    if (n > BPE_MAX_MERGES)
        return tl_set_error(TL_ERR_FORMAT, "tokenizer.ggml.merges has %llu merges, more than %d",
                            (unsigned long long)n, BPE_MAX_MERGES);
    if (n && !m->v.arr.items) return tl_set_error(TL_ERR_FORMAT, "tokenizer.ggml.merges has no string items");
    uint32_t cap = 16;
    while (cap < 2 * n) cap <<= 1;
    b->mkey = malloc((size_t)cap * sizeof *b->mkey);
    b->mrank = malloc((size_t)cap * sizeof *b->mrank);
    b->mres = malloc((size_t)cap * sizeof *b->mres);
    if (!b->mkey || !b->mrank || !b->mres)
        return tl_set_error(TL_ERR_NOMEM, "tokenizer: cannot allocate a map for %llu merges", (unsigned long long)n);
    memset(b->mkey, 0xff, (size_t)cap * sizeof *b->mkey);
    b->mmask = cap - 1;

    char *cat = NULL;
    size_t cat_cap = 0;
    rc = TL_OK;
    for (uint64_t i = 0; i < n && rc == TL_OK; i++) {
        const gguf_value *v = &m->v.arr.items[i];
        if (v->type != GGUF_T_STRING) {
            rc = tl_set_error(TL_ERR_FORMAT, "tokenizer.ggml.merges[%llu] is not a string", (unsigned long long)i);
            break;
        }
        const char *s = v->v.str.ptr;
        size_t len = (size_t)v->v.str.len;
        int shown = len > 40 ? 40 : (int)len;
        /* as llama.cpp: the first space after the first byte separates the two texts */
        const char *sp = len > 1 ? memchr(s + 1, ' ', len - 1) : NULL;
        if (!sp) {
            rc = tl_set_error(TL_ERR_FORMAT, "tokenizer.ggml.merges[%llu] '%.*s' is not two tokens separated by a space",
                              (unsigned long long)i, shown, s);
            break;
        }
        size_t la = (size_t)(sp - s), lb = len - la - 1;
        int a = tok_vocab_find(t, s, la), c = tok_vocab_find(t, sp + 1, lb);
        if (a < 0 || c < 0) {
            rc = tl_set_error(TL_ERR_FORMAT, "tokenizer.ggml.merges[%llu] '%.*s': '%.*s' is not a token",
                              (unsigned long long)i, shown, s, a < 0 ? (int)(la > 40 ? 40 : la) : (int)(lb > 40 ? 40 : lb),
                              a < 0 ? s : sp + 1);
            break;
        }
        if (la + lb > cat_cap) {
            char *p = realloc(cat, la + lb);
            if (!p) {
                rc = tl_set_error(TL_ERR_NOMEM, "tokenizer: out of memory reading merges");
                break;
            }
            cat = p;
            cat_cap = la + lb;
        }
        memcpy(cat, s, la);
        memcpy(cat + la, sp + 1, lb);
        int r = tok_vocab_find(t, cat, la + lb);
        if (r < 0) {
            rc = tl_set_error(TL_ERR_FORMAT, "tokenizer.ggml.merges[%llu] '%.*s': the merged text is not a token",
                              (unsigned long long)i, shown, s);
            break;
        }
        uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)c;
        uint32_t slot = merge_slot(b, key);
        if (b->mkey[slot] == key) continue; /* a repeated pair keeps its first rank, as llama.cpp's emplace */
        b->mkey[slot] = key;
        b->mrank[slot] = (int32_t)i;
        b->mres[slot] = r;
    }
    free(cat);
    return rc;
}

int tok_bpe_load(tl_tokenizer *t, const gguf_file *f, int *add_bos) {
    struct tok_bpe *b = t->bpe = calloc(1, sizeof *b);
    if (!b) return tl_set_error(TL_ERR_NOMEM, "tokenizer: out of memory");
    gguf_str pre;
    int rc = gguf_get_str(f, "tokenizer.ggml.pre", &pre);
    if (rc < 0) return TL_ERR_FORMAT;
    const struct pre_def *d = rc == 0 ? &pre_defs[0] : NULL;
    for (size_t i = 0; !d && i < sizeof pre_defs / sizeof *pre_defs; i++)
        if (strlen(pre_defs[i].name) == pre.len && memcmp(pre_defs[i].name, pre.ptr, pre.len) == 0) d = &pre_defs[i];
    if (!d)
        return tl_set_error(TL_ERR_UNSUPPORTED, "unknown pre-tokenizer '%.*s' (tokenizer.ggml.pre)",
                            pre.len > 64 ? 64 : (int)pre.len, pre.ptr);
    *add_bos = d->add_bos;
    b->ignore_merges = d->ignore_merges;
    byte_tables(t, b);
    if ((rc = compile_pre(b, d)) != TL_OK) return rc;
    return load_merges(t, b, f);
}

void tok_bpe_free(struct tok_bpe *b) {
    if (!b) return;
    for (int i = 0; i < b->n_re; i++) pcre2_code_free(b->re[i]);
    free(b->mkey);
    free(b->mrank);
    free(b->mres);
    free(b);
}

/* ------------------------------------------------------------------------ */
/* UTF-8                                                                    */
/* ------------------------------------------------------------------------ */

/* Bounds for the second byte of a sequence led by c (RFC 3629 table). */
static void second_byte_range(uint8_t c, uint8_t *lo, uint8_t *hi) {
    *lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
    *hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
}

static size_t utf8_need(uint8_t c) {
    return c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
}

/* Length of the valid UTF-8 sequence at s[0..n) (n >= 1), 0 when none starts there. */
size_t tok_utf8_seq(const uint8_t *s, size_t n) {
    size_t need = utf8_need(s[0]);
    if (need <= 1) return need;
    if (n < need) return 0;
    uint8_t lo, hi;
    second_byte_range(s[0], &lo, &hi);
    if (s[1] < lo || s[1] > hi) return 0;
    for (size_t k = 2; k < need; k++)
        if ((s[k] & 0xC0) != 0x80) return 0;
    return need;
}

int tl_utf8_complete_prefix(const char *buf, int len) {
    if (!buf || len <= 0) return 0;
    const uint8_t *s = (const uint8_t *)buf;
    for (int k = 1; k <= 3 && k <= len; k++) {
        uint8_t c = s[len - k];
        if ((c & 0xC0) == 0x80) continue; /* a continuation byte: its lead is further back */
        if (utf8_need(c) <= (size_t)k) return len; /* ASCII, invalid, or complete */
        if (k >= 2) {
            uint8_t lo, hi;
            second_byte_range(c, &lo, &hi);
            if (s[len - k + 1] < lo || s[len - k + 1] > hi) return len; /* can never complete */
        }
        return len - k;
    }
    return len;
}

/* ------------------------------------------------------------------------ */
/* encoding                                                                 */
/* ------------------------------------------------------------------------ */

typedef struct span {
    size_t off, len;
} span;

typedef struct sym {
    int32_t id, prev, next; /* id -1: a byte whose byte-level char is no token */
    uint32_t len;           /* bytes covered; 0 once merged into its left neighbour */
} sym;

typedef struct pair {
    int32_t rank, left, right, a, b, res;
} pair;

struct tok_bpe_work {
    char *clean;
    size_t clean_cap;
    span *pa, *pb;
    size_t pa_cap, pb_cap;
    pcre2_match_data *md;
    sym *sym;
    size_t sym_cap;
    pair *heap;
    size_t n_heap, heap_cap;
    char *word; /* byte-level text of a word, for ignore_merges */
    size_t word_cap;
};

void tok_bpe_work_free(tok_bpe_work *w) {
    if (!w) return;
    free(w->clean);
    free(w->pa);
    free(w->pb);
    pcre2_match_data_free(w->md);
    free(w->sym);
    free(w->heap);
    free(w->word);
    free(w);
}

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return TL_OK;
    size_t n = *cap ? *cap : 64;
    while (n < need) n *= 2;
    void *q = realloc(*p, n * elem);
    if (!q) return tl_set_error(TL_ERR_NOMEM, "tokenizer: out of memory for %zu work items", n);
    *p = q;
    *cap = n;
    return TL_OK;
}

/* Returns s when it is valid UTF-8, else a copy in w->clean with U+FFFD
 * for each byte that starts no valid sequence; *n is updated. */
static const char *sanitize(tok_bpe_work *w, const char *s, size_t *n) {
    const uint8_t *u = (const uint8_t *)s;
    size_t len = *n, i = 0;
    while (i < len) {
        size_t k = u[i] < 0x80 ? 1 : tok_utf8_seq(u + i, len - i);
        if (!k) break;
        i += k;
    }
    if (i == len) return s;
    if (grow((void **)&w->clean, &w->clean_cap, 3 * len, 1)) return NULL;
    memcpy(w->clean, s, i);
    size_t o = i;
    while (i < len) {
        size_t k = tok_utf8_seq(u + i, len - i);
        if (k) {
            memcpy(w->clean + o, s + i, k);
            o += k;
            i += k;
        } else {
            memcpy(w->clean + o, "\xef\xbf\xbd", 3);
            o += 3;
            i++;
        }
    }
    *n = o;
    return w->clean;
}

/* Splits every piece of `in` by one regex into `out` (matches and the gaps
 * between them); returns the new count or a negative error. */
static long split(const pcre2_code *re, pcre2_match_data *md, const char *text, const span *in, size_t n_in,
                  span *out) {
    size_t m = 0;
    for (size_t i = 0; i < n_in; i++) {
        PCRE2_SPTR subj = (PCRE2_SPTR)(text + in[i].off);
        size_t sl = in[i].len, last = 0, pos = 0;
        while (pos < sl) {
            int rc = pcre2_match(re, subj, sl, pos, PCRE2_NO_UTF_CHECK, md, NULL);
            if (rc == PCRE2_ERROR_NOMATCH) break;
            if (rc < 0) {
                PCRE2_UCHAR msg[128];
                pcre2_get_error_message(rc, msg, sizeof msg);
                return tl_set_error(TL_ERR_UNSUPPORTED, "pre-tokenizer: regex match failed at byte %zu: %s",
                                    in[i].off + pos, (const char *)msg);
            }
            const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            size_t ms = ov[0], me = ov[1];
            if (me <= ms) { /* an empty match (none of our patterns has one): step over a character */
                size_t k = tok_utf8_seq(subj + ms, sl - ms);
                pos = ms + (k ? k : 1);
                continue;
            }
            if (ms > last) out[m++] = (span){in[i].off + last, ms - last};
            out[m++] = (span){in[i].off + ms, me - ms};
            last = pos = me;
        }
        if (last < sl) out[m++] = (span){in[i].off + last, sl - last};
    }
    return (long)m;
}

/* Min-heap of pairs: lowest rank first, then the leftmost. */
static int pair_before(const pair *x, const pair *y) {
    return x->rank < y->rank || (x->rank == y->rank && x->left < y->left);
}

static int heap_push(tok_bpe_work *w, pair p) {
    if (grow((void **)&w->heap, &w->heap_cap, w->n_heap + 1, sizeof *w->heap)) return TL_ERR_NOMEM;
    size_t i = w->n_heap++;
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (!pair_before(&p, &w->heap[up])) break;
        w->heap[i] = w->heap[up];
        i = up;
    }
    w->heap[i] = p;
    return TL_OK;
}

static pair heap_pop(tok_bpe_work *w) {
    pair top = w->heap[0], last = w->heap[--w->n_heap];
    size_t i = 0, n = w->n_heap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && pair_before(&w->heap[c + 1], &w->heap[c])) c++;
        if (!pair_before(&w->heap[c], &last)) break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n) w->heap[i] = last;
    return top;
}

static int add_pair(const struct tok_bpe *b, tok_bpe_work *w, int left, int right) {
    if (left < 0 || right < 0) return TL_OK;
    int32_t a = w->sym[left].id, c = w->sym[right].id;
    if (a < 0 || c < 0) return TL_OK;
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)c;
    uint32_t slot = merge_slot(b, key);
    if (b->mkey[slot] != key) return TL_OK;
    return heap_push(w, (pair){b->mrank[slot], left, right, a, c, b->mres[slot]});
}

/* A symbol whose char is no token: llama.cpp then tries each byte of its
 * byte-level text as a one-byte token and drops the rest. */
static int push_unknown_byte(const tl_tokenizer *t, uint8_t c, ids_vec *o) {
    const struct tok_bpe *b = t->bpe;
    for (int k = 0; k < b->enc_len[c]; k++) {
        int id = tok_vocab_find(t, (const char *)&b->enc[c][k], 1);
        if (id >= 0 && tok_ids_push(o, id)) return TL_ERR_NOMEM;
    }
    return TL_OK;
}

/* BPE on one pre-tokenized word of n raw bytes. */
static int bpe_word(const tl_tokenizer *t, tok_bpe_work *w, const uint8_t *s, size_t n, ids_vec *o) {
    const struct tok_bpe *b = t->bpe;
    if (b->ignore_merges) {
        if (grow((void **)&w->word, &w->word_cap, 2 * n, 1)) return TL_ERR_NOMEM;
        size_t L = 0;
        for (size_t i = 0; i < n; i++) {
            memcpy(w->word + L, b->enc[s[i]], b->enc_len[s[i]]);
            L += b->enc_len[s[i]];
        }
        int id = tok_vocab_find(t, w->word, L);
        if (id >= 0) return tok_ids_push(o, id);
    }
    if (n == 1) return b->byte_sym[s[0]] >= 0 ? tok_ids_push(o, b->byte_sym[s[0]]) : push_unknown_byte(t, s[0], o);
    if (grow((void **)&w->sym, &w->sym_cap, n, sizeof *w->sym)) return TL_ERR_NOMEM;
    for (size_t i = 0; i < n; i++)
        w->sym[i] = (sym){b->byte_sym[s[i]], (int32_t)i - 1, i + 1 == n ? -1 : (int32_t)i + 1, 1};
    w->n_heap = 0;
    for (size_t i = 1; i < n; i++)
        if (add_pair(b, w, (int)i - 1, (int)i)) return TL_ERR_NOMEM;
    while (w->n_heap) {
        pair p = heap_pop(w);
        sym *l = &w->sym[p.left], *r = &w->sym[p.right];
        /* stale: a side was merged away or grew since the pair was queued */
        if (l->len == 0 || r->len == 0 || l->id != p.a || r->id != p.b) continue;
        l->id = p.res;
        l->len += r->len;
        r->len = 0;
        l->next = r->next;
        if (r->next >= 0) w->sym[r->next].prev = p.left;
        if (add_pair(b, w, l->prev, p.left) || add_pair(b, w, p.left, l->next)) return TL_ERR_NOMEM;
    }
    for (int i = 0; i != -1; i = w->sym[i].next) {
        int rc = w->sym[i].id >= 0 ? tok_ids_push(o, w->sym[i].id) : push_unknown_byte(t, s[i], o);
        if (rc) return rc;
    }
    return TL_OK;
}

/* Sanitizes s[0..*len) and runs the pre-tokenizer: *text gets the
 * sanitized text (its length in *len), *pieces its words. Returns the word
 * count or a negative error. */
static long pretokenize(const tl_tokenizer *t, tok_bpe_work **wp, const char *s, size_t *len, const char **text,
                        const span **pieces) {
    const struct tok_bpe *b = t->bpe;
    if (!*wp && !(*wp = calloc(1, sizeof **wp))) return tl_set_error(TL_ERR_NOMEM, "tokenizer: out of memory");
    tok_bpe_work *w = *wp;
    if (!w->md && !(w->md = pcre2_match_data_create(1, NULL)))
        return tl_set_error(TL_ERR_NOMEM, "tokenizer: out of memory for regex match data");
    if (!(*text = sanitize(w, s, len))) return TL_ERR_NOMEM;
    /* pieces are non-empty and disjoint, so there are at most len of them */
    if (grow((void **)&w->pa, &w->pa_cap, *len + 1, sizeof *w->pa) ||
        grow((void **)&w->pb, &w->pb_cap, *len + 1, sizeof *w->pb))
        return TL_ERR_NOMEM;
    span *in = w->pa, *out = w->pb;
    in[0] = (span){0, *len};
    size_t n = *len ? 1 : 0;
    for (int r = 0; r < b->n_re; r++) {
        long m = split(b->re[r], w->md, *text, in, n, out);
        if (m < 0) return m;
        n = (size_t)m;
        span *tmp = in;
        in = out;
        out = tmp;
    }
    *pieces = in;
    return (long)n;
}

int tok_bpe_encode(const tl_tokenizer *t, tok_bpe_work **wp, const char *s, size_t len, ids_vec *o) {
    const char *text;
    const span *pieces;
    long n = pretokenize(t, wp, s, &len, &text, &pieces);
    if (n < 0) return (int)n;
    for (long i = 0; i < n; i++) {
        int rc = bpe_word(t, *wp, (const uint8_t *)text + pieces[i].off, pieces[i].len, o);
        if (rc) return rc;
    }
    return TL_OK;
}

long tok_bpe_split(const tl_tokenizer *t, const char *s, size_t len, size_t *ends, size_t cap) {
    if (!t || t->kind != TOK_BPE) return tl_set_error(TL_ERR_INVALID_ARG, "tok_bpe_split: not a BPE tokenizer");
    tok_bpe_work *w = NULL;
    const char *text;
    const span *pieces;
    long n = pretokenize(t, &w, s, &len, &text, &pieces);
    for (long i = 0; i < n && (size_t)i < cap; i++) ends[i] = pieces[i].off + pieces[i].len;
    tok_bpe_work_free(w);
    return n;
}

/* ------------------------------------------------------------------------ */
/* decoding                                                                 */
/* ------------------------------------------------------------------------ */

size_t tok_bpe_piece(const tl_tokenizer *t, int id, char *dst) {
    const struct tok_bpe *b = t->bpe;
    const uint8_t *s = (const uint8_t *)tok_text(t, id);
    size_t n = t->len[id], w = 0;
    for (size_t i = 0; i < n;) {
        size_t k = tok_utf8_seq(s + i, n - i);
        if (k == 1 || k == 2) {
            unsigned cp = k == 1 ? s[i] : (unsigned)(s[i] & 0x1F) << 6 | (s[i + 1] & 0x3F);
            if (cp < 0x144 && b->dec[cp] >= 0) {
                if (dst) dst[w] = (char)b->dec[cp];
                w++;
                i += k;
                continue;
            }
        }
        /* a char outside the byte-level alphabet (or a stray byte) is kept as it is;
         * llama.cpp writes "[UNK_BYTE_0x..]" there instead */
        if (!k) k = 1;
        if (dst) memcpy(dst + w, s + i, k);
        w += k;
        i += k;
    }
    return w;
}
