/* prefix.h - what the scheduler reads of a resume handle (prefix.c).
 * Internal. A TL_RK_RESUME request builds its sequence here: the prelude
 * layers share the handle's blocks, the loop-block layers get fresh ones,
 * and its first pass starts at the loop block from the stored hidden
 * states. */
#ifndef TL_PREFIX_H
#define TL_PREFIX_H

#include "model.h"

/* The handle's prompt. */
const int32_t *tl_resume_tokens(const tl_prefix *h, int *n);
/* First virtual layer the first pass runs, and the (n, n_embd) hidden
 * states entering it. */
int tl_resume_prelude(const tl_prefix *h);
const float *tl_resume_x(const tl_prefix *h);
/* A sequence at depth(loops) over the handle's prelude blocks, making room
 * through the cache for the fresh ones; KV full or out of memory
 * otherwise. The caller holds the compute lock. */
int tl_resume_seq(tl_model *m, const tl_prefix *h, int loops, tl_seq **out);

#endif
