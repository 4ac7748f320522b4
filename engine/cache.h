/* cache.h - the prefix cache as the request layers see it: namespaces,
 * room in the KV arena (the only place that evicts), tenant budgets,
 * eviction weights, statistics and the invariant checker. Internal.
 *
 * Layering: cache.c sits on radix.c (the tree) and kv_blocks.c (the
 * arena); requests (request.c) and the scheduler step (sched.c) call it;
 * forward.c never does: it computes over blocks the caller reserved. */
#ifndef TL_CACHE_H
#define TL_CACHE_H

#include "model.h"

/* Namespace for (loops, window, salt) at the model's depth for loops, held
 * by the caller until tl_radix_namespace_release. */
int tl_cache_namespace(tl_model *m, int loops, int window, uint64_t salt);

/* Evicts unlocked, unpinned cached prefixes (lowest eviction score first)
 * until `need` blocks are free. Returns whether they are. */
int tl_cache_make_room(tl_model *m, int need);
/* Room for one forward pass of these sequences (tl_forward_blocks_needed). */
int tl_cache_reserve(tl_model *m, tl_seq *const *seqs, const int *n_tokens, int n_seq);

#endif
