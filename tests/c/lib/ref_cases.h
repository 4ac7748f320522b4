/* ref_cases.h - reads ../shared/ref/stories260K_greedy.json (llama.cpp's
 * greedy outputs): a tiny reader for its fixed shape, shared by the CPU and
 * GPU end-to-end tests. */
#ifndef TL_REF_CASES_H
#define TL_REF_CASES_H

#include <stdint.h>

typedef struct {
    char prompt[256];
    int32_t prompt_ids[64];
    int n_prompt;
    int32_t gen_ids[64];
    int n_gen;
} ref_case;

/* Up to cap cases from path; returns how many, or -1 if unreadable. */
int ref_load(const char *path, ref_case *cases, int cap);
/* 1 when the two id lists are equal. */
int ref_same_ids(const int32_t *a, int na, const int32_t *b, int nb);
/* Index of the first difference (the shorter length when one is a prefix). */
int ref_first_diff(const int32_t *a, int na, const int32_t *b, int nb);

#endif
