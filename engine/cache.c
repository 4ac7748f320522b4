/* cache.c - namespaces, room in the KV arena, tenant budgets, the node
 * listing and the refcount checker (see cache.h). */
#include "cache.h"

#include <stdlib.h>
#include <string.h>

#include "forward.h"
#include "util.h"

int tl_cache_namespace(tl_model *m, int loops, int window, uint64_t salt) {
    int eff = tl_model_effective_loops(m, loops), depth = tl_model_depth(m, eff);
    int *windows = malloc((size_t)depth * sizeof *windows);
    if (!windows) return tl_set_error(TL_ERR_NOMEM, "out of memory for a cache namespace");
    /* the tree checks a match against what each layer's window reads */
    for (int vl = 0; vl < depth; vl++) windows[vl] = tl_model_vl_window(m, eff, window, vl);
    int ns = tl_radix_namespace(&m->cache, eff, window, salt, depth, windows);
    free(windows);
    return ns < 0 ? tl_set_error(TL_ERR_NOMEM, "out of memory for a cache namespace") : ns;
}

int tl_cache_make_room(tl_model *m, int need) {
    if (need > m->kv.n_free) tl_radix_evict(&m->cache, need);
    return need <= m->kv.n_free;
}

int tl_cache_reserve(tl_model *m, tl_seq *const *seqs, const int *n_tokens, int n_seq) {
    return tl_cache_make_room(m, tl_forward_blocks_needed(m, seqs, n_tokens, n_seq));
}

/* The public one-pass entry point (tinyloop.h): room first, as the
 * scheduler makes it, then the pure forward pass; the sliding-window
 * layers then release what they passed, as in the scheduler. */
int tl_batch_forward(tl_model *m, tl_seq **seqs, const int32_t *const *tokens, const int *n_tokens, int n_seq,
                     float *logits) {
    int T;
    if (tl_forward_check(m, seqs, tokens, n_tokens, n_seq, &T)) return tl_last_error_code();
    tl_cache_reserve(m, seqs, n_tokens, n_seq);
    int rc = tl_forward(m, seqs, tokens, n_tokens, n_seq, logits, NULL);
    for (int i = 0; rc == TL_OK && i < n_seq; i++) tl_seq_drop_behind_windows(m, seqs[i]);
    return rc;
}

int tl_cache_apply_budget(tl_model *m, int tenant, int max_blocks) {
    if (tl_radix_set_budget(&m->cache, tenant, max_blocks))
        return tl_set_error(TL_ERR_NOMEM, "out of memory for tenant budgets");
    tl_radix_enforce_budget(&m->cache, tenant);
    return TL_OK;
}

typedef struct {
    tl_cache_node *out;
    int cap, n;
} nodes_ctx;

static void add_node(const tl_radix_node *n, const tl_radix_ns *ns, void *ud) {
    nodes_ctx *c = ud;
    if (c->n < c->cap)
        c->out[c->n] = (tl_cache_node){.id = n->id, .parent = n->parent && n->parent->parent ? n->parent->id : 0,
                                       .start = n->start, .n_tokens = n->n_tokens,
                                       .n_blocks = tl_radix_node_blocks(n, ns->depth),
                                       .hits = n->hits, .last_access = n->last_access, .tenant = n->tenant,
                                       .pinned = n->pin > 0, .locked = n->lock > 0, .leaf = n->n_kids == 0,
                                       .shareable = n->shareable > 0, .loops = ns->loops,
                                       .cache_window = ns->cache_window, .salt = ns->salt};
    c->n++;
}

int tl_cache_nodes(tl_model *m, tl_cache_node *out, int cap) {
    nodes_ctx c = {out, cap, 0};
    tl_radix_walk(&m->cache, add_node, &c);
    return c.n;
}

static void count_node(const tl_radix_node *n, const tl_radix_ns *ns, void *ud) {
    int32_t *count = ud;
    for (int i = 0; i < n->n_lb * ns->depth; i++)
        if (n->blocks[i] >= 0) count[n->blocks[i]]++;
}

int tl_cache_check(tl_model *m, int32_t *count) {
    tl_kv_pool *kv = &m->kv;
    tl_radix_walk(&m->cache, count_node, count);
    int used = 0;
    for (int b = 0; b < kv->n_blocks; b++) {
        used += kv->refcnt[b] > 0;
        if (kv->refcnt[b] != count[b])
            return tl_set_error(TL_ERR_STATE, "block %d has refcount %d but %d holders", b, kv->refcnt[b], count[b]);
    }
    if (used + kv->n_free != kv->n_blocks)
        return tl_set_error(TL_ERR_STATE, "%d used + %d free != %d blocks", used, kv->n_free, kv->n_blocks);
    char msg[256];
    if (tl_radix_check(&m->cache, msg, sizeof msg)) return tl_set_error(TL_ERR_STATE, "%s", msg);
    return TL_OK;
}
