/* cache.h - the prefix cache as the request layers see it: namespaces,
 * room in the KV arena (the only place that evicts), tenant budgets, the
 * node listing and the refcount checker. Internal.
 *
 * Layering: cache.c sits on radix.c (the tree) and kv_blocks.c (the
 * arena); requests (request.c) and the scheduler step (scheduler.c) call it;
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

/* Sets a tenant's block budget and evicts its unpinned prefixes over it. */
int tl_cache_apply_budget(tl_model *m, int tenant, int max_blocks);
/* Up to cap nodes of every namespace into out (tinyloop.h's tl_cache_node);
 * returns the total. */
int tl_cache_nodes(tl_model *m, tl_cache_node *out, int cap);
/* count[b] holds block b's holders outside the tree (sequences, handles):
 * adds the tree's and checks every refcount, free + used = total and the
 * tree's own invariants. TL_OK or TL_ERR_STATE with the first violation. */
int tl_cache_check(tl_model *m, int32_t *count);

#endif
