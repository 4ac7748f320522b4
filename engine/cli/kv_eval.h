/* kv_eval.h - what a KV mode does to a model's output, measured through the
 * public API: perplexity over text segments and greedy agreement between
 * two runs. Shared by `tinyloop bench kv` and tests/c/test_kv_quality.c. */
#ifndef TL_KV_EVAL_H
#define TL_KV_EVAL_H

#include <stddef.h>
#include <stdint.h>

#include "tinyloop.h"

/* ids[0, n_prefill) are context; the next n_score tokens are scored. */
typedef struct {
    const int32_t *ids;
    int n_prefill, n_score;
    double nll; /* out: summed negative log-likelihood of the scored tokens */
} kv_segment;

/* Scores every segment: one batched prefill of their contexts, then one
 * batched decode step per scored position (the API gives last-token logits
 * only; finished segments drop out). Returns TL_OK or the forward's error. */
int kv_score_segments(tl_model *m, kv_segment *sg, int n_seg);

/* Greedy continuations of n tokens (ignore_eos, no cache) for every prompt,
 * submitted together so they decode as one batch; prompt p's tokens go to
 * out + p * ld. Returns TL_OK or an error code. */
int kv_greedy_batch(tl_model *m, const int32_t *const *prompts, const int *n_prompt, int n_prompts, int n,
                    int32_t *out, size_t ld);

/* Mean over prompts of the leading tokens gen and ref share (of n, rows ld
 * apart); *worst gets the smallest. */
double kv_agreement(const int32_t *ref, const int32_t *gen, size_t ld, int n_prompts, int n, int *worst);

#endif
