/* radix.h - the automatic prefix cache: a radix tree over token ids whose
 * nodes own references to paged KV blocks.
 *
 * One tree per namespace (loops, cache_window, salt): KV computed under
 * another depth, window or tenant salt is never matched. Children are
 * found by their first token; a node's edge is a run of tokens.
 *
 *   before inserting [1 5 9 2 7]:          after (split at position 3):
 *
 *     (root)                                 (root)
 *       |                                      |
 *     [1 5 9 4 4 8]  pos 0..6                [1 5 9]  pos 0..3
 *                                             /     \
 *                                      [4 4 8]       [2 7]
 *                                      pos 3..6      pos 3..5
 *
 * A node covering positions [s, e) holds one reference on every KV block
 * that overlaps [s, e) (per virtual layer): logical blocks s/bs .. (e-1)/bs.
 * A block straddling a node boundary is therefore held by both nodes, and
 * the deeper node's copy is valid for every position up to its own end.
 * To serve a match of length L, logical block b comes from the node that
 * contains position min(L, (b+1)*bs) - 1; full blocks are shared by
 * reference, and the tail block is copied on first write (copy-on-write in
 * kv_blocks.c), so a block is only ever written by a sole owner.
 *
 * A sequence's sliding-window layers drop the blocks their window has
 * passed (kv_blocks.h), and it is inserted as it is: a node may hold -1
 * for a logical block at a windowed layer, recording which positions it
 * still holds there. A match of length L is only usable when the next
 * token (position L) finds every position its window reads, at every
 * layer; tl_radix_share shortens a match to the longest such length.
 *
 * lock counts requests whose matched path runs through a node; pin counts
 * pool entries ending exactly at a node. Only leaves with lock == 0 and
 * pin == 0 are evicted (leaf-first), lowest score first (LRU by default).
 * When a pruned leaf (an entry or handle let go) leaves its parent with one
 * child, or an evicted leaf leaves it with one pinned child, the two are
 * joined again: the reverse of the split, which drops the parent's copy of
 * a straddling block that the child's own copy makes redundant.
 * Match costs O(matched tokens): child lookup is a hash probe.
 */
#ifndef TL_RADIX_H
#define TL_RADIX_H

#include <stddef.h>
#include <stdint.h>

#include "kv_blocks.h"

typedef struct tl_radix_node tl_radix_node;
typedef struct tl_radix tl_radix;

struct tl_radix_node {
    tl_radix_node *parent;
    tl_radix_node **kids;   /* open-addressing table keyed by kid->tokens[0] */
    int n_kids, cap_kids;   /* cap is 0 or a power of two */
    int32_t *tokens;        /* edge label (n_tokens) */
    int n_tokens;
    int start;              /* absolute position of tokens[0] */
    int lb_first, n_lb;     /* logical blocks held: [lb_first, lb_first + n_lb) */
    int32_t *blocks;        /* (n_lb, depth) block ids */
    int lock, pin;
    float *logits;          /* (n_vocab) after the node's last position, kept for a pinned
                               entry so a prompt ending here needs no pass (NULL: none) */
    int shareable;          /* pins by shareable pool entries: reusable across salts */
    uint64_t last_access;   /* tree clock tick */
    uint32_t hits;
    int ns;                 /* namespace index */
    int tenant;             /* owner for budgets and the eviction score */
    int64_t id;             /* stable identifier (statistics, policies) */
};

typedef struct tl_radix_ns {
    int loops, cache_window;
    uint64_t salt;
    int depth;              /* virtual layers: blocks per logical block */
    int32_t *windows;       /* (depth) attention window of each virtual layer, 0 = all positions;
                               NULL: no windows. Only windowed layers may hold -1 blocks */
    tl_radix_node *root;    /* NULL: a free slot */
    int64_t n_nodes;        /* nodes below root */
    int holds;              /* users keeping the index (requests, registrations) */
} tl_radix_ns;

/* Per-tenant accounting: an open-addressing map from tenant id to its block
 * references and budget. An entry with neither is deleted, so the map's
 * size follows the tenants that hold cache, not every id ever seen. */
typedef struct tl_radix_tenant {
    int tenant;             /* -1: empty slot */
    int32_t usage, budget;
} tl_radix_tenant;

/* Scores an evictable leaf; the lowest score is evicted first. */
typedef double (*tl_evict_score_fn)(const tl_radix_node *n, uint64_t now, void *ud);

/* Weights for the built-in score (pushed from Lua as plain data):
 * score = w_recency * last_access + w_hits * hits + w_tokens * cached tokens
 *         + w_depth * start. LRU is {1, 0, 0, 0}. */
typedef struct tl_evict_weights {
    double w_recency, w_hits, w_tokens, w_depth;
} tl_evict_weights;

struct tl_radix {
    tl_kv_pool *kv;
    tl_radix_ns *ns;        /* slots; index = namespace id, stable while it lives */
    int n_ns, cap_ns;       /* slots in use or freed (n_ns), allocated (cap_ns) */
    int *ns_free, n_ns_free; /* freed slot indexes, reused first */
    int *ns_map, cap_ns_map; /* open addressing: key -> slot (-1 empty) */
    int n_ns_live;
    uint64_t clock;
    tl_evict_weights weights;
    tl_evict_score_fn score;  /* NULL: the weights */
    void *score_ud;
    /* Called with each leaf evicted, before its blocks go (the KV tiers
     * copy them down: cache_tier.c); NULL: none. */
    void (*on_evict)(tl_radix *t, const tl_radix_node *n, void *ud);
    void *evict_ud;
    /* statistics */
    int64_t n_nodes, cached_tokens, evictions, evicted_tokens;
    int64_t next_id;
    /* per-tenant block references held by nodes, and budgets (0 = none) */
    tl_radix_tenant *tenants;
    int cap_tenants, n_tenants;
};

int tl_radix_init(tl_radix *t, tl_kv_pool *kv);
void tl_radix_destroy(tl_radix *t);

/* Namespace index for a key, created on first use, with a hold the caller
 * gives back with tl_radix_namespace_release (-1: out of memory). Found by
 * a hash probe. A namespace lives while it has nodes or holds: when its
 * last node goes and nobody holds it, its slot is freed and may be reused
 * for another key, so an index is only kept while holding it. */
int tl_radix_namespace(tl_radix *t, int loops, int cache_window, uint64_t salt, int depth, const int *windows);
void tl_radix_namespace_release(tl_radix *t, int ns);
/* Live namespaces (statistics, tests). */
int tl_radix_namespace_count(const tl_radix *t);

/* Longest match of tokens[0..n) (at most max_len) in namespace ns. Returns
 * the matched length; *node receives the node containing the last matched
 * position (NULL when 0). Touches matched nodes (LRU, hits). */
int tl_radix_match(tl_radix *t, int ns, const int32_t *tokens, int n, int max_len, tl_radix_node **node);

/* Makes a node end exactly at position len on node's path (splitting
 * node, which contains position len - 1), so a lock can cover exactly the
 * matched tokens and the rest stays evictable. Returns that node, or node
 * itself when the split cannot be allocated. */
tl_radix_node *tl_radix_cut(tl_radix *t, tl_radix_node *node, int len);

/* Locks (lock = 1) or unlocks (-1) the path from node to the root. */
void tl_radix_lock(tl_radix_node *node, int delta);

/* Fills bt (depth of the namespace, empty on entry) with the blocks of the
 * first L positions along the path ending at *node, taking references: L
 * is the longest length <= len whose next token finds every position its
 * window reads at every layer (radix.h's picture); blocks before a layer's
 * window stay -1. Returns L (0: nothing usable, bt left empty) with *node
 * the node containing position L - 1 (NULL for 0), or -2 when out of
 * memory (bt left empty, *node NULL). */
int tl_radix_share(tl_radix *t, tl_radix_node **node, int len, tl_block_table *bt);

/* Blocks a node holds (its ids >= 0, over every virtual layer). */
int tl_radix_node_blocks(const tl_radix_node *n, int depth);

/* Inserts tokens[0..n) whose KV is in bt (positions 0..n-1). Existing
 * nodes are reused, split where the new tokens diverge, and a new leaf
 * takes references on bt's blocks for its positions. Returns the node
 * ending at position n (for pinning), or NULL when out of memory. */
tl_radix_node *tl_radix_insert(tl_radix *t, int ns, const int32_t *tokens, int n, const tl_block_table *bt,
                               int tenant);

/* Sets a tenant's budget in block references (0 = none); -1 on no memory.
 * Any tenant id >= 0 works: the accounting is a hash map. */
int tl_radix_set_budget(tl_radix *t, int tenant, int max_blocks);
int tl_radix_tenant_usage(const tl_radix *t, int tenant);
/* Evicts the tenant's own unlocked, unpinned leaves (LRU) while it is over
 * its budget. */
void tl_radix_enforce_budget(tl_radix *t, int tenant);

/* Evicts unlocked, unpinned leaves, lowest score first, until at least
 * `blocks_needed` blocks are free in the pool or nothing is evictable.
 * Returns the number of blocks freed. */
int tl_radix_evict(tl_radix *t, int blocks_needed);

/* Removes the chain of unlocked, unpinned leaves ending at node (used when
 * a pool drops an entry: its KV is released unless something else holds it). */
void tl_radix_prune(tl_radix *t, tl_radix_node *node);

/* Drops one pin of node; with the last, its kept logits go and the chain
 * of leaves ending at it is pruned. */
void tl_radix_unpin(tl_radix *t, tl_radix_node *node);

/* Checks the namespace and tenant tables against the tree (tests): each
 * namespace's node count, no empty unheld namespace, every key found by
 * its hash, each tenant's usage equal to its nodes' blocks, no empty
 * tenant entry. Returns 0, or -1 with a message in msg. */
int tl_radix_check(tl_radix *t, char *msg, size_t cap);

/* Calls fn on every node (depth first), for statistics and tests. */
void tl_radix_walk(tl_radix *t, void (*fn)(const tl_radix_node *n, const tl_radix_ns *ns, void *ud), void *ud);

#endif
