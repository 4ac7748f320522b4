/* bench_tokenize.c - `tinyloop bench tokenize [-m VOCAB]... [-f TEXTFILE] [-r RUNS]`.
 *
 * Tokenizes about 1 MB of English text with each vocab (default: the
 * shared gpt-2 and llama-spm vocabs) and prints tokens/s and MB/s, best of
 * RUNS (default 3) after one warm-up run. Without -f the text is made up
 * deterministically from an embedded word list, so runs compare across
 * machines and commits.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "tokenizer.h"
#include "util.h"

#define BENCH_TEXT_BYTES (1 << 20)

static const char *const bench_words[] = {
    "the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be", "by", "on", "not",
    "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an", "had", "they", "you", "were",
    "their", "one", "all", "we", "can", "her", "has", "there", "been", "if", "more", "when", "will", "would", "who",
    "so", "no", "time", "people", "year", "way", "day", "man", "thing", "woman", "life", "child", "world", "school",
    "state", "family", "student", "group", "country", "problem", "hand", "part", "place", "case", "week", "company",
    "system", "program", "question", "work", "government", "number", "night", "point", "home", "water", "room",
    "mother", "area", "money", "story", "fact", "month", "lot", "right", "study", "book", "eye", "job", "word",
    "business", "issue", "side", "kind", "head", "house", "service", "friend", "father", "power", "hour", "game",
    "line", "end", "member", "law", "car", "city", "community", "name", "president", "team", "minute", "idea",
    "kid", "body", "information", "back", "parent", "face", "others", "level", "office", "door", "health",
    "person", "art", "war", "history", "party", "result", "change", "morning", "reason", "research", "girl",
    "guy", "moment", "air", "teacher", "force", "education", "tokenizer", "inference", "quickly", "wonderful",
    "it's", "don't", "we'll", "they're", "I've", "1984", "3.14", "42", "e-mail", "(see", "below)", "\"quoted\"",
    "naïve", "café", "résumé", "über", "déjà", "vu", "—", "…",
};

/* ~BENCH_TEXT_BYTES of sentences from the word list (a fixed LCG, so the
 * text is the same on every run and machine). */
static char *make_text(size_t *len) {
    char *s = malloc(BENCH_TEXT_BYTES + 64);
    if (!s) return NULL;
    size_t n = 0, nw = sizeof bench_words / sizeof *bench_words;
    uint32_t r = 20240601u;
    int in_sentence = 0, words = 0;
    while (n < BENCH_TEXT_BYTES) {
        r = r * 1664525u + 1013904223u;
        const char *w = bench_words[(r >> 8) % nw];
        size_t wl = strlen(w);
        if (in_sentence) s[n++] = ' ';
        memcpy(s + n, w, wl);
        if (!in_sentence && s[n] >= 'a' && s[n] <= 'z') s[n] = (char)(s[n] - 32);
        n += wl;
        in_sentence = 1;
        words++;
        uint32_t p = (r >> 24) % 16;
        if (p == 0) s[n++] = ',';
        else if (p == 1 || words > 24) {
            s[n++] = (r & 0x10000) ? '.' : (r & 0x20000) ? '!' : '?';
            in_sentence = 0;
            words = 0;
            s[n++] = ((r >> 12) % 6 == 0) ? '\n' : ' ';
            if (s[n - 1] == '\n' && (r & 0x40000)) s[n++] = '\n';
        }
    }
    *len = n;
    return s;
}

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        long n = ftell(f);
        if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1))) {
            if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
                free(buf);
                buf = NULL;
            } else {
                *len = (size_t)n;
            }
        }
    }
    fclose(f);
    return buf;
}

static int bench_vocab(const char *path, const char *text, size_t len, int runs) {
    gguf_file *f = gguf_open(path);
    tl_tokenizer *t = f ? tl_tokenizer_load(f) : NULL;
    gguf_close(f);
    if (!t) {
        fprintf(stderr, "bench tokenize: %s: %s\n", path, tl_last_error());
        return -1;
    }
    int need = tl_tokenizer_encode(t, text, len, 0, 0, NULL, 0); /* also the warm-up run */
    int cap = need < 0 ? -need : need;
    int32_t *ids = malloc(((size_t)cap + 1) * sizeof *ids);
    int n = -1;
    double best = 0;
    for (int i = 0; ids && i < runs; i++) {
        double t0 = tl_now();
        n = tl_tokenizer_encode(t, text, len, 0, 0, ids, cap);
        double dt = tl_now() - t0;
        if (n < 0) break;
        if (i == 0 || dt < best) best = dt;
    }
    if (n < 0) {
        fprintf(stderr, "bench tokenize: %s: %s\n", path, ids ? tl_last_error() : "out of memory");
    } else {
        const char *name = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
        if (best <= 0) best = 1e-9;
        printf("%-36s %8zu bytes -> %7d tokens  %8.1f ms  %10.0f tokens/s  %7.2f MB/s\n", name, len, n,
               best * 1e3, n / best, len / best / 1e6);
    }
    free(ids);
    tl_tokenizer_free(t);
    return n < 0 ? -1 : 0;
}

/* argv holds the options after `bench tokenize` (argv[0] is the first option).
 * Returns the process exit code: 0, 1 when a vocab failed, 2 on bad usage. */
int tl_cli_bench_tokenize(int argc, char **argv) {
    const char *vocabs[16], *file = NULL;
    int n_vocabs = 0, runs = 3;
    for (int i = 0; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "-m") && v && n_vocabs < 16) vocabs[n_vocabs++] = v, i++;
        else if (!strcmp(argv[i], "-f") && v) file = v, i++;
        else if (!strcmp(argv[i], "-r") && v && atoi(v) > 0) runs = atoi(v), i++;
        else {
            fprintf(stderr, "usage: tinyloop bench tokenize [-m VOCAB]... [-f TEXTFILE] [-r RUNS]\n");
            return 2;
        }
    }
    static char defaults[2][512];
    if (!n_vocabs) {
        const char *shared = getenv("TINYLOOP_SHARED");
        snprintf(defaults[0], sizeof defaults[0], "%s/vocab/ggml-vocab-gpt-2.gguf", shared ? shared : "../shared");
        snprintf(defaults[1], sizeof defaults[1], "%s/vocab/ggml-vocab-llama-spm.gguf", shared ? shared : "../shared");
        vocabs[0] = defaults[0];
        vocabs[1] = defaults[1];
        n_vocabs = 2;
    }
    size_t len = 0;
    char *text = file ? read_file(file, &len) : make_text(&len);
    if (!text) {
        fprintf(stderr, "bench tokenize: cannot read %s\n", file ? file : "(built-in text: out of memory)");
        return 1;
    }
    printf("tokenizing %zu bytes of %s, best of %d runs\n", len, file ? file : "built-in English text", runs);
    int rc = 0;
    for (int i = 0; i < n_vocabs; i++)
        if (bench_vocab(vocabs[i], text, len, runs)) rc = 1;
    free(text);
    return rc;
}
