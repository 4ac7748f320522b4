#include "ref_cases.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int ref_same_ids(const int32_t *a, int na, const int32_t *b, int nb) {
    return na == nb && memcmp(a, b, (size_t)na * sizeof *a) == 0;
}

int ref_first_diff(const int32_t *a, int na, const int32_t *b, int nb) {
    int d = 0;
    while (d < na && d < nb && a[d] == b[d]) d++;
    return d;
}
