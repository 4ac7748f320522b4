/* kv_blocks.h - the paged KV cache: one arena of fixed-size blocks with
 * per-block reference counts, and per-sequence block tables.
 *
 * A physical block holds K and V of `block_size` positions for ONE virtual
 * layer, so a sequence run at depth D uses D blocks per logical block and
 * KV memory per token is proportional to the depth actually in use.
 *
 *   arena:  [ blk 0: K(n_head_kv, bs, head_dim) V(same) ][ blk 1 ] ... [ blk N-1 ]
 *           (K and V rows in the pool's KV mode; store-h blocks hold h rows)
 *   refcnt: [ 1 ][ 2 ][ 0 ] ...        0 = on the free list
 *
 *   seq (depth D = 3, len 37, block_size 16):
 *     logical block:   0          1          2 (partial: 5 of 16 used)
 *     vlayer 0:      [ 12 ]     [  4 ]     [ 30 ]
 *     vlayer 1:      [  7 ]     [ 19 ]     [ 31 ]
 *     vlayer 2:      [  9 ]     [ 22 ]     [  2 ]
 *
 *   the same, vlayer 1 a sliding-window layer (window 8) at len 37:
 *     vlayer 1:      [ -1 ]     [ 19 ]     [ 31 ]
 *   block 0 (positions 0..15) lies wholly before the window of the next
 *   token (positions 30..37), so it was released: id -1.
 *
 * A block with refcount > 1 is shared and read-only; a writer owning it
 * alone may append to it. Sharing (radix tree) takes extra references.
 * Id -1 marks a dropped block: per virtual layer the dropped blocks of a
 * sequence form a prefix of its table, and everything that walks a table
 * skips them. */
#ifndef TL_KV_BLOCKS_H
#define TL_KV_BLOCKS_H

#include <stddef.h>
#include <stdint.h>

#include "kv_layout.h"

typedef struct tl_kv_pool {
    tl_kv_layout layout; /* the bytes of a block in this pool's KV mode */
    int block_size;     /* positions per block */
    int n_blocks;
    int kv_type;        /* K's row type (enum tl_kv_type); V's is layout.type_v */
    size_t block_bytes; /* K and V (or h) */
    uint8_t *arena;
    int32_t *refcnt;    /* (n_blocks) */
    int32_t *free_list; /* stack of free ids */
    int n_free;
    /* A backend with its own arena (device memory): no host arena, and
     * copy-on-write goes through the hook. */
    int (*copy_hook)(void *ud, int dst, int src);
    /* Copies a block between the backend's arena and host memory
     * (block_bytes; to_device 1: host -> arena), for the KV tiers; NULL:
     * the backend cannot. */
    int (*io_hook)(void *ud, int id, void *host, int to_device);
    void *hook_ud;
} tl_kv_pool;

/* with_arena 0: block bookkeeping only (the arena lives in a backend). */
int tl_kv_pool_init(tl_kv_pool *p, int n_blocks, const tl_kv_layout *layout, int with_arena);
void tl_kv_pool_destroy(tl_kv_pool *p);
/* Returns a block id with refcount 1, or -1 when none is free. */
int tl_kv_alloc(tl_kv_pool *p);
void tl_kv_ref(tl_kv_pool *p, int id);
void tl_kv_unref(tl_kv_pool *p, int id);
/* Base of a block's K (or h) region and of its V region; rows inside a
 * region as kv_layout.h says. */
static inline uint8_t *tl_kv_k(const tl_kv_pool *p, int id) {
    return p->arena + (size_t)id * p->block_bytes;
}
static inline uint8_t *tl_kv_v(const tl_kv_pool *p, int id) {
    return p->arena + (size_t)id * p->block_bytes + p->layout.k_bytes;
}
/* Copies a block's contents (copy-on-write). Returns 0 or < 0 when a
 * backend's copy failed. */
int tl_kv_copy(tl_kv_pool *p, int dst, int src);

/* The first position a token at pos attends to under window w (0: all). */
static inline int tl_window_first(int pos, int w) { return w > 0 && pos >= w ? pos - w + 1 : 0; }

/* A sequence's block table: table[lb * depth + vl] is the block of logical
 * block lb at virtual layer vl. */
typedef struct tl_block_table {
    int depth;
    int n_logical;   /* logical blocks in use */
    int cap_logical;
    int n_released;  /* leading logical blocks dropped behind a sliding window (ids -1) */
    int32_t *ids;
} tl_block_table;

/* Grows the table so it covers n_pos positions, allocating blocks. On
 * failure (-1: no free blocks, -2: no memory) allocates nothing. */
int tl_block_table_reserve(tl_block_table *bt, tl_kv_pool *p, int n_pos);
/* Shrinks to cover n_pos positions, releasing blocks no longer needed. */
void tl_block_table_truncate(tl_block_table *bt, tl_kv_pool *p, int n_pos);
/* Copy-on-write: gives logical block lb private copies of any shared
 * blocks, so the caller may write into it. -1 when blocks run out (then
 * nothing changed). */
int tl_block_table_make_writable(tl_block_table *bt, tl_kv_pool *p, int lb);
void tl_block_table_release(tl_block_table *bt, tl_kv_pool *p);
/* Drops logical blocks [n_released, lb_end) that a sliding window will
 * never read again; their ids become -1. Returns how many were dropped. */
int tl_block_table_drop_before(tl_block_table *bt, tl_kv_pool *p, int lb_end);
/* Drops the blocks of virtual layer vl in logical blocks [0, lb_end) (a
 * sliding-window layer past them); their ids become -1. Returns how many
 * were dropped. */
int tl_block_table_drop_layer_before(tl_block_table *bt, tl_kv_pool *p, int vl, int lb_end);
/* Blocks of virtual layer vl the table holds (ids >= 0). */
int tl_block_table_held(const tl_block_table *bt, int vl);

#endif
