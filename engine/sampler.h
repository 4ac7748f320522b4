/* sampler.h - turning logits into a token: repetition penalty, top-k,
 * top-p, min-p, temperature, then a draw from a per-request seeded RNG
 * (argmax when temperature <= 0). The order matches llama.cpp's default
 * chain (penalties, top-k, top-p, min-p, temperature, draw). */
#ifndef TL_SAMPLER_H
#define TL_SAMPLER_H

#include <stdint.h>

#include "tinyloop.h"

typedef struct tl_cand { float v; int32_t id; } tl_cand;

typedef struct tl_sampler {
    tl_sampling_params p;
    uint64_t rng;
    int n_vocab;
    int32_t *idx;   /* (n_vocab) candidate ids */
    float *val;     /* (n_vocab) candidate logits / probabilities */
    tl_cand *pairs; /* (n_vocab) sort scratch */
    int32_t *pen;   /* (n_vocab) the distinct tokens the penalty applies to */
} tl_sampler;

/* Validates params (message names the bad field) and allocates scratch. */
int tl_sampler_init(tl_sampler *s, const tl_sampling_params *p, int n_vocab);
void tl_sampler_free(tl_sampler *s);
/* Samples from logits (n_vocab; modified in place by the penalty).
 * history: the tokens seen so far (prompt + generated), for the penalty. */
int tl_sampler_sample(tl_sampler *s, float *logits, const int32_t *history, int n_history);
/* The same chain with the draw u given (s->rng untouched); for checking
 * a device's sampler against this one. */
int tl_sampler_sample_u(tl_sampler *s, float *logits, const int32_t *history, int n_history, float u);
/* The uniform draw in [0, 1) tl_sampler_sample makes (once, when the
 * temperature is > 0), advancing *rng the same way. */
float tl_sampler_uniform(uint64_t *rng);
/* The distinct tokens of history the penalty of s->p applies to (none when
 * it is off) into out (room for n_history); returns their count. */
int tl_sampler_penalty_ids(tl_sampler *s, const int32_t *history, int n_history, int32_t *out);
/* Index of the largest value (the first on ties). */
int tl_argmax(const float *x, int n);

#endif
