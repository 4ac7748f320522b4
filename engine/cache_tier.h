/* cache_tier.h - the radix cache over the KV tiers (kv_tier.h): evicted
 * nodes spill their full blocks down a tier, admission brings matching
 * blocks back up into the tree, pinned prefixes are written through to
 * disk, and save/load of the whole cache for a warm restart. Internal.
 *
 * Layering: beside cache.c (the one place that evicts calls the spill
 * through the radix tree's eviction hook); the scheduler's admission calls
 * tl_cache_restore before its match. */
#ifndef TL_CACHE_TIER_H
#define TL_CACHE_TIER_H

#include "model.h"

/* Opens the tiers the params and environment ask for (none: m->tiers
 * stays NULL) and hooks eviction. */
int tl_cache_tiers_open(tl_model *m);
void tl_cache_tiers_close(tl_model *m);

/* Brings the blocks after a match of L tokens (ending in node) of
 * tokens[0..n) up from the tiers into namespace ns, when they are there
 * and moving them is cheaper than prefilling them. Returns 1 when it
 * inserted some (the caller matches again), 0 otherwise. */
int tl_cache_restore(tl_model *m, int ns, const int32_t *tokens, int n, int L, tl_radix_node *node, int tenant);

/* Writes the full blocks of the path ending at node through to disk (a
 * pinned entry, so a restart finds it). */
void tl_cache_persist_path(tl_model *m, const tl_radix_node *node);

/* A prefill step of `tokens` prompt tokens took `seconds` (restore or
 * recompute). */
void tl_cache_note_prefill(tl_model *m, int tokens, double seconds);
/* The tiers' figures into o (nothing without tiers). */
void tl_cache_tier_stats(const tl_model *m, tl_cache_stats *o);

#endif
