/* kv_tier.h - the tiers under the KV arena: evicted logical blocks go down
 * to host RAM (tier 2) and a directory on disk (tier 3) instead of
 * vanishing, and come back up when a later prompt matches them.
 *
 *   tier 1  the KV arena (kv_blocks.c; device memory on CUDA)
 *     | evict (radix.c -> cache.c spill)           ^ restore (admission)
 *     v                                            |
 *   tier 2  host RAM: copies of logical blocks, LRU, a byte budget
 *     | LRU overflow                               ^
 *     v                                            |
 *   tier 3  kv_dir: one file per logical block (kv_file.h), LRU, a budget
 *
 * A logical block is every virtual layer's physical block for positions
 * [lb * bs, (lb + 1) * bs) of one prefix. It is named by a chain hash,
 * key(lb) = SHA-256(key(lb - 1) || tokens of block lb), starting from a
 * namespace key over the model's identity, the KV mode, the block size and
 * depth, loops, window and salt: equal keys mean equal token prefixes in
 * equal namespaces of the same model, so a block is stored once however
 * many prefixes share it, files written by another process (another nginx
 * worker, the previous server) are found by name, and a salted tenant's
 * blocks can never be reached from another salt.
 *
 * Tier 2 is exclusive (a restored block leaves it; it comes back on the
 * next eviction); tier 3 is persistent (a restored block stays on disk, so
 * a restart finds it). Internal; not thread safe: the caller holds the
 * model's compute lock. */
#ifndef TL_KV_TIER_H
#define TL_KV_TIER_H

#include <stddef.h>
#include <stdint.h>

#include "kv_file.h"
#include "tinyloop.h"

enum { TL_TIER_HOST = 0, TL_TIER_DISK = 1 };

typedef struct tl_tier_item {
    uint8_t key[32];
    size_t bytes;                        /* what it costs in its tier */
    struct tl_tier_item *prev, *next;    /* LRU list, head = most recent */
    struct tl_tier_item *hnext;          /* hash bucket chain */
    /* host tier only: the block itself */
    tl_kvf_meta meta;
    int32_t *tokens;
    uint8_t *data;                       /* depth * block_bytes */
} tl_tier_item;

typedef struct tl_tier {
    tl_tier_item **buckets;
    size_t n_buckets, n_items;
    tl_tier_item *head, *tail;
    size_t bytes, budget;
    /* statistics */
    int64_t spills, spill_bytes, hits, restore_bytes, refused, dropped;
    double spill_s, restore_s;
} tl_tier;

typedef struct tl_kv_tiers {
    tl_kvf_meta ident;        /* model_id, kv_mode, block_size, block_bytes */
    tl_tier tier[2];          /* TL_TIER_HOST, TL_TIER_DISK */
    char *dir;                /* NULL: no disk tier */
    double prefill_s_per_tok; /* measured (EWMA) on this model; 0: not yet */
    int64_t restored_tokens, recompute_chosen;
    uint8_t *scratch;         /* one logical block read from disk */
    size_t scratch_cap;
    char report[1024];        /* refusals of the last directory scan */
    int scanned, scan_refused;
} tl_kv_tiers;

/* host_budget 0: no host tier; dir NULL: no disk tier (disk_budget 0:
 * unlimited). The directory is created (0700) when missing and scanned:
 * valid block files are indexed, others refused into t->report. */
int tl_tiers_open(tl_kv_tiers *t, const tl_kvf_meta *ident, size_t host_budget, const char *dir,
                  size_t disk_budget);
void tl_tiers_close(tl_kv_tiers *t);
/* Adds dir's valid block files to the disk index (dir must be the disk
 * tier's); refusals, one line each naming the file and reason, go into
 * t->report (truncated with a count). Returns files indexed. */
int tl_tiers_scan(tl_kv_tiers *t);

/* The namespace key and the chain step (see the header comment). */
void tl_tiers_ns_key(const tl_kv_tiers *t, int depth, int loops, int window, uint64_t salt, uint8_t out[32]);
void tl_tiers_next_key(const tl_kv_tiers *t, const uint8_t prev[32], const int32_t *tokens, uint8_t out[32]);

/* Where a block is: -1 nowhere, else TL_TIER_HOST or TL_TIER_DISK (a file
 * another process wrote counts). */
int tl_tiers_find(tl_kv_tiers *t, const uint8_t key[32]);
/* Spills one logical block: into host RAM when it has a budget (the least
 * recently used there move down to disk, or are dropped without one), else
 * onto disk. blocks[d] is virtual layer d's block (meta->depth of them;
 * those meta->absent marks, released by a sliding window, are not read). */
int tl_tiers_put(tl_kv_tiers *t, const tl_kvf_meta *meta, const int32_t *tokens, const void *const *blocks);
/* Writes a block through to disk unless it is there (save_cache, pinned
 * prefixes). Returns 1 written, 0 already there or no disk tier, -1 error. */
int tl_tiers_persist(tl_kv_tiers *t, const tl_kvf_meta *meta, const int32_t *tokens, const void *const *blocks);
/* Brings block `expect->key` up into blocks[d] (expect: the namespace,
 * lb and depth the caller needs). Checks the tokens and, from disk, the
 * whole file. Only the layers it stored are written (got->absent says
 * which it lacks). Returns the tier it came from, or -1 (not found,
 * refused: t->report says why). */
int tl_tiers_take(tl_kv_tiers *t, const tl_kvf_meta *expect, const int32_t *tokens, void *const *blocks,
                  tl_kvf_meta *got);

/* Restore or recompute: the seconds moving n_blocks logical blocks (bytes
 * in all) up from `tier` is expected to cost (measured bandwidth;
 * optimistic before the first measurement) against prefilling their
 * tokens. */
int tl_tiers_restore_pays(const tl_kv_tiers *t, int tier, int n_blocks, size_t bytes);
void tl_tiers_note_prefill(tl_kv_tiers *t, int tokens, double seconds);

void tl_tiers_stats(const tl_kv_tiers *t, tl_cache_stats *o);

#endif
