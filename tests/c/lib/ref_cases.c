#include "ref_cases.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int parse_ids(const char *p, int32_t *out, int cap) {
    int n = 0;
    if (!p || !(p = strchr(p, '['))) return -1;
    p++;
    while (*p && *p != ']' && n < cap) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p) {
            p++;
            continue;
        }
        out[n++] = (int32_t)v;
        p = end;
    }
    return n;
}

int ref_load(const char *path, ref_case *cases, int cap) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    static char buf[1 << 16];
    size_t len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[len] = 0;
    int n = 0;
    for (char *p = buf; n < cap && (p = strstr(p, "\"prompt\": \"")); n++) {
        p += 11;
        char *q = strchr(p, '"');
        if (!q) break;
        snprintf(cases[n].prompt, sizeof cases[n].prompt, "%.*s", (int)(q - p), p);
        cases[n].n_prompt = parse_ids(strstr(q, "\"prompt_ids\""), cases[n].prompt_ids, 64);
        cases[n].n_gen = parse_ids(strstr(q, "\"gen_ids\""), cases[n].gen_ids, 64);
        p = q;
    }
    return n;
}

int ref_load_shared(const char *shared, char *model_path, size_t path_cap, ref_case *cases, int cap) {
    char ref_path[1024];
    snprintf(model_path, path_cap, "%s/models/stories260K.gguf", shared);
    snprintf(ref_path, sizeof ref_path, "%s/ref/stories260K_greedy.json", shared);
    return ref_load(ref_path, cases, cap);
}

int ref_generate(tl_model *m, const int32_t *prompt, int n_prompt, int max_tokens, int no_cache,
                 const tl_sampling_params *sp, int32_t *out) {
    tl_generate_params gp = tl_generate_default_params();
    gp.max_tokens = max_tokens;
    gp.ignore_eos = 1;
    gp.no_cache = no_cache;
    if (sp) gp.sampling = *sp;
    return tl_generate(m, prompt, n_prompt, gp, out, max_tokens);
}

const char *ref_default_model(void) {
    static char path[512];
    const char *dir = getenv("TINYLOOP_MODELS"), *home = getenv("HOME");
    if (dir) snprintf(path, sizeof path, "%s/gemma-3-270m-q4_k_m.gguf", dir);
    else snprintf(path, sizeof path, "%s/.cache/tinyloop/models/gemma-3-270m-q4_k_m.gguf", home ? home : "");
    return access(path, R_OK) == 0 ? path : NULL;
}

void ref_fill_tokens(int32_t *t, int n, int n_vocab, uint32_t seed) {
    for (int i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        t[i] = 3 + (int32_t)((seed >> 8) % (uint32_t)(n_vocab - 3));
    }
}

int ref_same_ids(const int32_t *a, int na, const int32_t *b, int nb) {
    return na == nb && memcmp(a, b, (size_t)na * sizeof *a) == 0;
}

int ref_first_diff(const int32_t *a, int na, const int32_t *b, int nb) {
    int d = 0;
    while (d < na && d < nb && a[d] == b[d]) d++;
    return d;
}
