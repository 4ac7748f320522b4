/* beam.h - the beam search state of a TL_RK_BEAM request (beam.c).
 * Internal. The scheduler owns it and calls it from the stepping thread. */
#ifndef TL_BEAM_H
#define TL_BEAM_H

#include "model.h"

#define TL_BEAM_MAX 1024

typedef struct tl_beam_hyp {
    tl_seq *seq;
    int32_t *toks; /* generated so far (room for max_tokens) */
    int n;
    double lp;     /* sum of log-probabilities */
    int parent;    /* index in the previous step's beams (while forking) */
} tl_beam_hyp;

typedef struct tl_beam {
    int B, T, K;            /* beams, max_tokens, candidates per beam */
    float alpha;            /* length penalty */
    int step;               /* tokens chosen so far */
    tl_beam_hyp *cur, *nxt; /* live beams (n_cur) and the next step's */
    int n_cur;
    int32_t *tokbuf;
    struct beam_cand *cands;
    char *taken;
    double best_score, best_lp;
    int32_t *best_toks;
    int best_n, best_finish;
    int base, peak;         /* KV blocks in use before the search, and the most above it */
} tl_beam;

/* A search of `beams` over max_tokens new tokens, or NULL (out of memory). */
tl_beam *tl_beam_new(int beams, float alpha, int max_tokens, int n_vocab);
/* Frees the state and every live beam's sequence. */
void tl_beam_free(tl_beam *b);
/* The prompt's sequence becomes the first beam (the search owns it). */
void tl_beam_start(tl_beam *b, tl_seq *prompt_seq);
/* One step from the live beams' logits rows (n_cur rows of n_vocab, in
 * beam order): chooses the next beams and forks their sequences. Returns 1
 * when the search has ended (tl_beam_result_of), 0 to go on (each live
 * beam then runs its last token), or an error. */
int tl_beam_advance(tl_model *m, tl_beam *b, const float *logits, int ignore_eos);
/* Tracks the most KV blocks in use above b->base. */
void tl_beam_note_peak(tl_model *m, tl_beam *b);
/* The best finished sequence: its tokens are b->best_toks; returns how many
 * to deliver (EOS not included) and fills res (n_cached left to the caller). */
int tl_beam_result_of(const tl_beam *b, tl_beam_result *res);

#endif
