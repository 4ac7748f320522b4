#include "kv_blocks.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "tinyloop.h"
#include "util.h"

int tl_kv_pool_init(tl_kv_pool *p, int n_blocks, const tl_kv_layout *layout, int with_arena) {
    memset(p, 0, sizeof *p);
    if (n_blocks < 1 || layout->block_size < 1 || layout->block_bytes < 1)
        return tl_set_error(TL_ERR_INVALID_ARG, "kv pool: n_blocks %d, block_size %d, block_bytes %zu must be >= 1",
                            n_blocks, layout->block_size, layout->block_bytes);
    p->layout = *layout;
    p->block_size = layout->block_size;
    p->n_blocks = n_blocks;
    p->kv_type = layout->type_k;
    size_t total;
    if (tl_mul_size(layout->block_bytes, (size_t)n_blocks, &total))
        return tl_set_error(TL_ERR_NOMEM, "kv pool: %d blocks of %zu bytes overflow size_t", n_blocks,
                            layout->block_bytes);
    p->block_bytes = layout->block_bytes;
    p->arena = with_arena ? tl_alloc_huge(total) : NULL;
    p->refcnt = calloc((size_t)n_blocks, sizeof *p->refcnt);
    p->free_list = malloc((size_t)n_blocks * sizeof *p->free_list);
    if ((with_arena && !p->arena) || !p->refcnt || !p->free_list) {
        tl_kv_pool_destroy(p);
        return tl_set_error(TL_ERR_NOMEM, "kv pool: cannot allocate %zu bytes for %d blocks", total, n_blocks);
    }
    /* Hand out low ids first: pop from the end. */
    for (int i = 0; i < n_blocks; i++) p->free_list[i] = n_blocks - 1 - i;
    p->n_free = n_blocks;
    return TL_OK;
}

void tl_kv_pool_destroy(tl_kv_pool *p) {
    tl_free_aligned(p->arena);
    free(p->refcnt);
    free(p->free_list);
    memset(p, 0, sizeof *p);
}

int tl_kv_alloc(tl_kv_pool *p) {
    if (p->n_free == 0) return -1;
    int id = p->free_list[--p->n_free];
    assert(p->refcnt[id] == 0);
    p->refcnt[id] = 1;
    return id;
}

void tl_kv_ref(tl_kv_pool *p, int id) {
    assert(id >= 0 && id < p->n_blocks && p->refcnt[id] > 0);
    p->refcnt[id]++;
}

void tl_kv_unref(tl_kv_pool *p, int id) {
    assert(id >= 0 && id < p->n_blocks && p->refcnt[id] > 0);
    if (--p->refcnt[id] == 0) p->free_list[p->n_free++] = id;
}

int tl_kv_copy(tl_kv_pool *p, int dst, int src) {
    if (p->copy_hook) return p->copy_hook(p->hook_ud, dst, src);
    memcpy(tl_kv_k(p, dst), tl_kv_k(p, src), p->block_bytes);
    return 0;
}

int tl_block_table_reserve(tl_block_table *bt, tl_kv_pool *p, int n_pos) {
    int need = (n_pos + p->block_size - 1) / p->block_size;
    if (need <= bt->n_logical) return 0;
    if ((need - bt->n_logical) * bt->depth > p->n_free) return -1;
    if (need > bt->cap_logical) {
        int cap = bt->cap_logical ? bt->cap_logical : 4;
        while (cap < need) cap *= 2;
        int32_t *ids = realloc(bt->ids, (size_t)cap * (size_t)bt->depth * sizeof *ids);
        if (!ids) return -2;
        bt->ids = ids;
        bt->cap_logical = cap;
    }
    for (int lb = bt->n_logical; lb < need; lb++)
        for (int vl = 0; vl < bt->depth; vl++) bt->ids[lb * bt->depth + vl] = tl_kv_alloc(p);
    bt->n_logical = need;
    return 0;
}

void tl_block_table_truncate(tl_block_table *bt, tl_kv_pool *p, int n_pos) {
    int keep = (n_pos + p->block_size - 1) / p->block_size;
    for (int lb = keep > bt->n_released ? keep : bt->n_released; lb < bt->n_logical; lb++)
        for (int vl = 0; vl < bt->depth; vl++)
            if (bt->ids[lb * bt->depth + vl] >= 0) tl_kv_unref(p, bt->ids[lb * bt->depth + vl]);
    if (keep < bt->n_logical) bt->n_logical = keep;
    if (bt->n_released > bt->n_logical) bt->n_released = bt->n_logical;
}

int tl_block_table_drop_before(tl_block_table *bt, tl_kv_pool *p, int lb_end) {
    if (lb_end > bt->n_logical) lb_end = bt->n_logical;
    int dropped = 0;
    for (int lb = bt->n_released; lb < lb_end; lb++, dropped++)
        for (int vl = 0; vl < bt->depth; vl++) {
            if (bt->ids[lb * bt->depth + vl] >= 0) tl_kv_unref(p, bt->ids[lb * bt->depth + vl]);
            bt->ids[lb * bt->depth + vl] = -1;
        }
    if (lb_end > bt->n_released) bt->n_released = lb_end;
    return dropped;
}

int tl_block_table_drop_layer_before(tl_block_table *bt, tl_kv_pool *p, int vl, int lb_end) {
    if (lb_end > bt->n_logical) lb_end = bt->n_logical;
    int dropped = 0;
    /* the layer's dropped blocks are a prefix: walk down to its end */
    for (int lb = lb_end - 1; lb >= 0 && bt->ids[lb * bt->depth + vl] >= 0; lb--, dropped++) {
        tl_kv_unref(p, bt->ids[lb * bt->depth + vl]);
        bt->ids[lb * bt->depth + vl] = -1;
    }
    return dropped;
}

int tl_block_table_held(const tl_block_table *bt, int vl) {
    int n = 0;
    for (int lb = 0; lb < bt->n_logical; lb++) n += bt->ids[lb * bt->depth + vl] >= 0;
    return n;
}

void tl_block_table_release(tl_block_table *bt, tl_kv_pool *p) {
    tl_block_table_truncate(bt, p, 0);
    bt->n_released = 0;
    free(bt->ids);
    bt->ids = NULL;
    bt->cap_logical = 0;
}

int tl_block_table_make_writable(tl_block_table *bt, tl_kv_pool *p, int lb) {
    if (lb < 0 || lb >= bt->n_logical) return 0;
    int32_t *row = &bt->ids[lb * bt->depth];
    int shared = 0;
    for (int vl = 0; vl < bt->depth; vl++) shared += row[vl] >= 0 && p->refcnt[row[vl]] > 1;
    if (shared > p->n_free) return -1;
    for (int vl = 0; vl < bt->depth; vl++) {
        if (row[vl] < 0 || p->refcnt[row[vl]] <= 1) continue;
        int id = tl_kv_alloc(p);
        if (tl_kv_copy(p, id, row[vl]) != 0) {
            tl_kv_unref(p, id);
            return -3;
        }
        tl_kv_unref(p, row[vl]);
        row[vl] = id;
    }
    return 0;
}
