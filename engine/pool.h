/* pool.h - the PrefixPool's entries (pool_entry.c) and the checks of its
 * API (pool.c).
 * Internal; the pool's public API is tinyloop.h and docs/prefix-pool.md. */
#ifndef TL_POOL_H
#define TL_POOL_H

#include <pthread.h>

#include "model.h"

typedef struct pool_entry {
    int32_t *tokens;
    int n, loops, window;
    tl_radix_node *node;   /* pinned node ending at n */
    uint64_t order;        /* registration order: ties in length drop the oldest */
    uint64_t last_use;     /* for the LRU policy */
    int64_t hits;          /* prompts that started with it (the COST policy) */
} pool_entry;

/* Entries change from the caller's thread (register, free) and from the
 * engine thread (asynchronous registrations, lookups): `mu` guards them.
 * Lock order: the model's compute lock, then mu. */
struct tl_pool {
    pthread_mutex_t mu;
    int capacity, policy;
    int scope;             /* TL_POOL_SCOPE_SHARED or _POOL */
    uint64_t salt;         /* namespace of the entries */
    int shareable, tenant;
    tl_model *model;       /* bound on first register */
    pool_entry *e;
    int n;
    uint64_t clock;
    tl_pool_stats st;
};

/* Unpins every entry, unbinds and frees the pool (the caller holds
 * compute_mu, or no engine thread runs). */
void tl_pool_free_now(tl_pool *pool);
/* The index of the entry (tokens, loops, window), or -1 (caller holds its mu). */
int tl_pool_find_entry(const tl_pool *p, const int32_t *tokens, int n, int loops, int window);
/* The argument checks of register and register_submit (binds the
 * pool to m); TL_OK or the error with its message. */
int tl_pool_check_register(tl_model *m, tl_pool *pool, const int32_t *tokens, int n, int loops, int window);
/* Binds an unbound pool to m, adding it to m's list (error if bound to
 * another model); unbind takes it off the list; detach_all forgets every
 * pool's nodes when m closes. */
int tl_pool_bind(tl_pool *pool, tl_model *m);
void tl_pool_unbind(tl_pool *pool);
void tl_pool_detach_all(tl_model *m);
/* The namespace salt and tenant of the pool's entries. */
void tl_pool_key(const tl_pool *pool, uint64_t *salt, int *tenant);
/* Adds a built entry whose node ends at n (pinning it), making room
 * by the pool's policy; a key already present only drops the new build.
 * Runs with the compute lock held. */
int tl_pool_add_built(tl_pool *pool, const int32_t *tokens, int n, int loops, int window, tl_radix_node *node);
/* Counts a lookup made through the pool. */
void tl_pool_count_lookup(tl_pool *pool);
/* A request reused `matched` tokens along the path ending at node:
 * the entries (of any pool bound to m) pinning a node on that path are
 * used now (LRU, hits) and their pools count the hit. Runs in the
 * stepping thread. */
void tl_pool_attribute_hit(tl_model *m, const tl_radix_node *node, int matched);
/* With scope TL_POOL_SCOPE_POOL, the length of the longest entry of
 * the pool that the prompt starts with in the request's namespace (0: none)
 * and its node in *node; -1 when the pool's scope is shared (match the
 * whole cache). */
int tl_pool_scoped_match(tl_pool *pool, const int32_t *prompt, int n, int loops, int window, uint64_t salt,
                         tl_radix_node **node);
/* Called by the model on close. */
void tl_pool_detach_model(tl_pool *pool);

#endif
