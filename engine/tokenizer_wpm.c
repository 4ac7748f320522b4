/* tokenizer_wpm.c - WordPiece ("bert" vocabs), as llama.cpp's
 * llm_tokenizer_wpm_session does it:
 *
 *   raw fragment -> codepoints (an invalid byte is U+FFFD, which is dropped)
 *     -> each to the first codepoint of its NFD form (accents go), lowercased
 *     -> words: split at White_Space; punctuation, ASCII symbols and CJK
 *        ideographs are words of their own; controls, NUL and U+FFFD vanish
 *     -> per word, U+2581 + word, greedy longest match left to right over
 *        the vocab (the converter stored BERT's "##" pieces bare and the
 *        word starts with U+2581); a word with any unmatched position is
 *        one [UNK].
 *
 * Lossy by design (case and accents), so decoding does not give the text
 * back. The Unicode data is unicode_tables.c's.
 */
#include <stdlib.h>
#include <string.h>

#include "tinyloop.h"
#include "tokenizer_impl.h"
#include "unicode_tables.h"
#include "util.h"

/* ---- Unicode lookups (binary search over sorted ranges) ------------------ */

#define FIND_RANGE(tab, n, cp)                                                   \
    int lo = 0, hi = (n)-1, at = -1;                                             \
    while (lo <= hi) {                                                           \
        int mid = (lo + hi) / 2;                                                 \
        if ((tab)[mid].first <= (cp)) at = mid, lo = mid + 1; else hi = mid - 1; \
    }

uint32_t tl_uni_nfd_first(uint32_t cp) {
    FIND_RANGE(tl_uni_nfd, tl_uni_nfd_n, cp)
    return at >= 0 && cp <= tl_uni_nfd[at].last ? tl_uni_nfd[at].value : cp;
}

uint32_t tl_uni_tolower(uint32_t cp) {
    FIND_RANGE(tl_uni_lower, tl_uni_lower_n, cp)
    if (at < 0 || cp > tl_uni_lower[at].last || (cp - tl_uni_lower[at].first) % tl_uni_lower[at].stride) return cp;
    return (uint32_t)((int32_t)cp + tl_uni_lower[at].delta);
}

static int in_ranges(const tl_uni_range *tab, int n, uint32_t cp) {
    FIND_RANGE(tab, n, cp)
    return at >= 0 && cp <= tab[at].last;
}

int tl_uni_is_punct(uint32_t cp) { return in_ranges(tl_uni_punct, tl_uni_punct_n, cp); }
int tl_uni_is_control(uint32_t cp) { return in_ranges(tl_uni_ctrl, tl_uni_ctrl_n, cp); }

int tl_uni_is_space(uint32_t cp) {
    return (cp >= 0x9 && cp <= 0xD) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
           cp == 0x3000;
}

/* BERT's CJK ideograph blocks (with HF's 0x2B920 typo, as llama.cpp keeps it). */
static int is_cjk(uint32_t cp) {
    return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x20000 && cp <= 0x2A6DF) ||
           (cp >= 0x2A700 && cp <= 0x2B73F) || (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B920 && cp <= 0x2CEAF) ||
           (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

/* ASCII symbols (general category S below 0x7F): $ + < = > ^ ` | ~ */
static int is_ascii_symbol(uint32_t cp) { return cp < 0x7F && strchr("$+<=>^`|~", (int)cp) && cp; }

/* ---- UTF-8 ----------------------------------------------------------------- */

/* Decodes the codepoint at s[0..n) into *cp and returns its length; an
 * invalid or truncated sequence (tok_utf8_seq's rules) is one byte of
 * U+FFFD. */
static size_t utf8_next(const uint8_t *s, size_t n, uint32_t *cp) {
    const size_t k = tok_utf8_seq(s, n);
    if (k <= 1) return *cp = k ? s[0] : 0xFFFD, 1;
    uint32_t v = s[0] & (0x7F >> k);
    for (size_t i = 1; i < k; i++) v = v << 6 | (s[i] & 0x3F);
    *cp = v;
    return k;
}

static size_t utf8_put(uint32_t cp, char *o) {
    if (cp < 0x80) return o[0] = (char)cp, 1;
    if (cp < 0x800) return o[0] = (char)(0xC0 | cp >> 6), o[1] = (char)(0x80 | (cp & 0x3F)), 2;
    size_t n = cp < 0x10000 ? 3 : 4;
    o[0] = (char)(n == 3 ? 0xE0 | cp >> 12 : 0xF0 | cp >> 18);
    for (size_t k = 1; k < n; k++) o[k] = (char)(0x80 | (cp >> (6 * (n - 1 - k)) & 0x3F));
    return n;
}

/* ---- words ------------------------------------------------------------------ */

#define WPM_PREFIX "\xe2\x96\x81" /* U+2581 */

/* Greedy longest match of w[0..n) (U+2581 + word) onto o; the whole word
 * becomes [UNK] when some position matches no token. */
static int encode_word(const tl_tokenizer *t, const char *w, size_t n, ids_vec *o) {
    size_t start = o->n;
    for (size_t i = 0; i < n;) {
        size_t j = n - i > t->max_len ? i + t->max_len : n;
        int id = -1;
        for (; j > i && (id = tok_vocab_find(t, w + i, j - i)) < 0; j--) {
        }
        if (id < 0) {
            o->n = start;
            break;
        }
        int rc = tok_ids_push(o, id);
        if (rc) return rc;
        i = j;
    }
    if (o->n == start) return t->unk >= 0 ? tok_ids_push(o, t->unk) : TL_OK;
    return TL_OK;
}

int tok_wpm_encode(const tl_tokenizer *t, const char *s, size_t len, ids_vec *o) {
    /* a normalized codepoint never takes more than twice its input bytes
     * (lowercase can turn 2 bytes into 3), + the prefix */
    char *w = malloc(len * 2 + sizeof WPM_PREFIX);
    if (!w) return tl_set_error(TL_ERR_NOMEM, "tokenizer: out of memory for a %zu-byte fragment", len);
    const size_t p = sizeof WPM_PREFIX - 1;
    memcpy(w, WPM_PREFIX, p);
    size_t wn = p; /* the current word, after its prefix, is w[p..wn) */
    int rc = TL_OK;
    for (size_t i = 0; i < len && rc == TL_OK;) {
        uint32_t cp;
        i += utf8_next((const uint8_t *)s + i, len - i, &cp);
        cp = tl_uni_nfd_first(cp);
        int space = tl_uni_is_space(cp);
        if (!space && (cp == 0 || cp == 0xFFFD || tl_uni_is_control(cp))) continue;
        int alone = !space && (tl_uni_is_punct(cp) || is_ascii_symbol(cp) || is_cjk(cp));
        if ((space || alone) && wn > p) { /* finish the word before it */
            rc = encode_word(t, w, wn, o);
            wn = p;
        }
        if (space || rc) continue;
        wn += utf8_put(tl_uni_tolower(cp), w + wn);
        if (alone) {
            rc = encode_word(t, w, wn, o);
            wn = p;
        }
    }
    if (rc == TL_OK && wn > p) rc = encode_word(t, w, wn, o);
    free(w);
    return rc;
}
