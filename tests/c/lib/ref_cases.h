/* ref_cases.h - reads ../shared/ref/stories260K_greedy.json (llama.cpp's
 * greedy outputs): a tiny reader for its fixed shape, shared by the CPU and
 * GPU end-to-end tests. */
#ifndef TL_REF_CASES_H
#define TL_REF_CASES_H

#include <stddef.h>
#include <stdint.h>

#include "tinyloop.h"

typedef struct {
    char prompt[256];
    int32_t prompt_ids[64];
    int n_prompt;
    int32_t gen_ids[64];
    int n_gen;
} ref_case;

/* Up to cap cases from path; returns how many, or -1 if unreadable. */
int ref_load(const char *path, ref_case *cases, int cap);
/* The same from <shared>/ref/stories260K_greedy.json, with the model's
 * path <shared>/models/stories260K.gguf into model_path. */
int ref_load_shared(const char *shared, char *model_path, size_t path_cap, ref_case *cases, int cap);
/* Generates up to max_tokens past EOS (ignore_eos), with or without the
 * prefix cache, greedy when sp is NULL; returns the count or < 0. */
int ref_generate(tl_model *m, const int32_t *prompt, int n_prompt, int max_tokens, int no_cache,
                 const tl_sampling_params *sp, int32_t *out);
/* The path of the default model (Gemma 3 270M, fetched by make model) if it
 * is there, else NULL: $TINYLOOP_MODELS or ~/.cache/tinyloop/models. */
const char *ref_default_model(void);
/* n pseudo-random ids in [3, n_vocab) from seed. */
void ref_fill_tokens(int32_t *t, int n, int n_vocab, uint32_t seed);
/* 1 when the two id lists are equal. */
int ref_same_ids(const int32_t *a, int na, const int32_t *b, int nb);
/* Index of the first difference (the shorter length when one is a prefix). */
int ref_first_diff(const int32_t *a, int na, const int32_t *b, int nb);

#endif
