/* radix.c - the radix tree of cached KV (see radix.h for the picture). */
#include "radix.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- child table: open addressing on the first token ---------------------- */

static uint32_t tok_hash(int32_t t) { return (uint32_t)t * 2654435761u; }

static tl_radix_node *kid_find(const tl_radix_node *n, int32_t tok) {
    if (!n->cap_kids) return NULL;
    uint32_t mask = (uint32_t)n->cap_kids - 1;
    for (uint32_t i = tok_hash(tok) & mask;; i = (i + 1) & mask) {
        tl_radix_node *k = n->kids[i];
        if (!k) return NULL;
        if (k->tokens[0] == tok) return k;
    }
}

static void kid_put(tl_radix_node **tab, int cap, tl_radix_node *k) {
    uint32_t mask = (uint32_t)cap - 1, i = tok_hash(k->tokens[0]) & mask;
    while (tab[i]) i = (i + 1) & mask;
    tab[i] = k;
}

static int kid_rehash(tl_radix_node *n, int cap) {
    tl_radix_node **tab = calloc((size_t)cap, sizeof *tab);
    if (!tab) return -1;
    for (int i = 0; i < n->cap_kids; i++)
        if (n->kids[i]) kid_put(tab, cap, n->kids[i]);
    free(n->kids);
    n->kids = tab;
    n->cap_kids = cap;
    return 0;
}

static int kid_add(tl_radix_node *n, tl_radix_node *k) {
    if ((n->n_kids + 1) * 4 > n->cap_kids * 3 && kid_rehash(n, n->cap_kids ? n->cap_kids * 2 : 4)) return -1;
    kid_put(n->kids, n->cap_kids, k);
    n->n_kids++;
    return 0;
}

/* Same first token, so the slot is the same: swap in place. */
static void kid_replace(tl_radix_node *n, tl_radix_node *old, tl_radix_node *nu) {
    for (int i = 0; i < n->cap_kids; i++)
        if (n->kids[i] == old) {
            n->kids[i] = nu;
            return;
        }
    assert(0 && "kid_replace: not a child");
}

static void kid_remove(tl_radix_node *n, tl_radix_node *k) {
    for (int i = 0; i < n->cap_kids; i++)
        if (n->kids[i] == k) n->kids[i] = NULL;
    n->n_kids--;
    /* Rebuild so probe chains stay intact (removal is rare next to lookup). */
    if (n->n_kids == 0) {
        free(n->kids);
        n->kids = NULL;
        n->cap_kids = 0;
    } else {
        kid_rehash(n, n->cap_kids); /* same size: cannot need more memory than we had... */
    }
}

/* ---- nodes ----------------------------------------------------------------------- */

static int ns_depth(const tl_radix *t, int ns) { return t->ns[ns].depth; }

/* ---- per-tenant accounting: open addressing, deleted when empty -------------------- */

static uint32_t tenant_hash(int tenant) { return (uint32_t)tenant * 2654435761u; }

static tl_radix_tenant *tenant_find(const tl_radix *t, int tenant) {
    if (!t->cap_tenants || tenant < 0) return NULL;
    uint32_t mask = (uint32_t)t->cap_tenants - 1;
    for (uint32_t i = tenant_hash(tenant) & mask;; i = (i + 1) & mask) {
        tl_radix_tenant *e = &t->tenants[i];
        if (e->tenant == tenant) return e;
        if (e->tenant < 0) return NULL;
    }
}

static tl_radix_tenant *tenant_put(tl_radix_tenant *tab, int cap, int tenant) {
    uint32_t mask = (uint32_t)cap - 1, i = tenant_hash(tenant) & mask;
    while (tab[i].tenant >= 0) i = (i + 1) & mask;
    tab[i] = (tl_radix_tenant){.tenant = tenant};
    return &tab[i];
}

/* The tenant's entry, created on first use; NULL on no memory. */
static tl_radix_tenant *tenant_get(tl_radix *t, int tenant) {
    if (tenant < 0) return NULL;
    tl_radix_tenant *e = tenant_find(t, tenant);
    if (e) return e;
    if ((t->n_tenants + 1) * 2 > t->cap_tenants) {
        int cap = t->cap_tenants ? t->cap_tenants * 2 : 16;
        tl_radix_tenant *tab = malloc((size_t)cap * sizeof *tab);
        if (!tab) return NULL;
        for (int i = 0; i < cap; i++) tab[i].tenant = -1;
        for (int i = 0; i < t->cap_tenants; i++)
            if (t->tenants[i].tenant >= 0) *tenant_put(tab, cap, t->tenants[i].tenant) = t->tenants[i];
        free(t->tenants);
        t->tenants = tab;
        t->cap_tenants = cap;
    }
    t->n_tenants++;
    return tenant_put(t->tenants, t->cap_tenants, tenant);
}

/* Deletes an entry holding neither usage nor budget (backward-shift
 * deletion keeps every probe chain intact without tombstones). */
static void tenant_maybe_drop(tl_radix *t, tl_radix_tenant *e) {
    if (e->usage != 0 || e->budget != 0) return;
    uint32_t mask = (uint32_t)t->cap_tenants - 1, i = (uint32_t)(e - t->tenants);
    for (uint32_t j = (i + 1) & mask; t->tenants[j].tenant >= 0; j = (j + 1) & mask) {
        uint32_t home = tenant_hash(t->tenants[j].tenant) & mask;
        /* j's entry may fill the hole at i unless its home lies in (i, j] */
        if (((j - home) & mask) >= ((j - i) & mask)) {
            t->tenants[i] = t->tenants[j];
            i = j;
        }
    }
    t->tenants[i].tenant = -1;
    t->n_tenants--;
}

static void charge(tl_radix *t, const tl_radix_node *n, int blocks) {
    tl_radix_tenant *e = blocks > 0 ? tenant_get(t, n->tenant) : tenant_find(t, n->tenant);
    if (!e) return;
    e->usage += blocks;
    tenant_maybe_drop(t, e);
}

static int count_held(const int32_t *ids, int n) {
    int held = 0;
    for (int i = 0; i < n; i++) held += ids[i] >= 0;
    return held;
}

/* Drops the references of ids[0..n), skipping dropped blocks (-1);
 * returns how many it dropped. */
static int unref_held(tl_kv_pool *kv, const int32_t *ids, int n) {
    int held = 0;
    for (int i = 0; i < n; i++)
        if (ids[i] >= 0) {
            tl_kv_unref(kv, ids[i]);
            held++;
        }
    return held;
}

int tl_radix_node_blocks(const tl_radix_node *n, int depth) { return count_held(n->blocks, n->n_lb * depth); }

static void node_release_blocks(tl_radix *t, tl_radix_node *n) {
    charge(t, n, -unref_held(t->kv, n->blocks, n->n_lb * ns_depth(t, n->ns)));
    free(n->blocks);
    n->blocks = NULL;
    n->n_lb = 0;
}

static void node_free(tl_radix *t, tl_radix_node *n) {
    if (n->n_tokens) {
        t->n_nodes--;
        t->ns[n->ns].n_nodes--;
        t->cached_tokens -= n->n_tokens;
    }
    node_release_blocks(t, n);
    free(n->logits);
    free(n->kids);
    free(n->tokens);
    free(n);
}

static void free_subtree(tl_radix *t, tl_radix_node *n) {
    for (int i = 0; i < n->cap_kids; i++)
        if (n->kids[i]) free_subtree(t, n->kids[i]);
    node_free(t, n);
}

int tl_radix_init(tl_radix *t, tl_kv_pool *kv) {
    memset(t, 0, sizeof *t);
    t->kv = kv;
    t->weights.w_recency = 1.0;
    return 0;
}

void tl_radix_destroy(tl_radix *t) {
    for (int i = 0; i < t->n_ns; i++)
        if (t->ns[i].root) {
            free_subtree(t, t->ns[i].root);
            free(t->ns[i].windows);
        }
    free(t->ns);
    free(t->ns_free);
    free(t->ns_map);
    free(t->tenants);
    memset(t, 0, sizeof *t);
}

/* ---- namespaces: a hash map from key to slot; a slot is freed with its last node --- */

static uint32_t ns_hash(int loops, int cache_window, uint64_t salt) {
    uint64_t h = salt ^ ((uint64_t)(uint32_t)loops << 32) ^ (uint64_t)(uint32_t)cache_window * 0x9E3779B97F4A7C15ull;
    h ^= h >> 33;
    h *= 0xFF51AFD7ED558CCDull;
    h ^= h >> 33;
    return (uint32_t)h;
}

static uint32_t ns_home(const tl_radix *t, int slot) {
    const tl_radix_ns *k = &t->ns[slot];
    return ns_hash(k->loops, k->cache_window, k->salt) & ((uint32_t)t->cap_ns_map - 1);
}

static void ns_map_put(int *map, int cap, uint32_t h, int slot) {
    uint32_t mask = (uint32_t)cap - 1, i = h & mask;
    while (map[i] >= 0) i = (i + 1) & mask;
    map[i] = slot;
}

static int ns_map_grow(tl_radix *t) {
    int cap = t->cap_ns_map ? t->cap_ns_map * 2 : 16;
    int *map = malloc((size_t)cap * sizeof *map);
    if (!map) return -1;
    for (int i = 0; i < cap; i++) map[i] = -1;
    for (int i = 0; i < t->cap_ns_map; i++) {
        int slot = t->ns_map[i];
        if (slot >= 0) {
            const tl_radix_ns *k = &t->ns[slot];
            ns_map_put(map, cap, ns_hash(k->loops, k->cache_window, k->salt), slot);
        }
    }
    free(t->ns_map);
    t->ns_map = map;
    t->cap_ns_map = cap;
    return 0;
}

static void ns_map_remove(tl_radix *t, int slot) {
    uint32_t mask = (uint32_t)t->cap_ns_map - 1, i = ns_home(t, slot);
    while (t->ns_map[i] != slot) i = (i + 1) & mask;
    for (uint32_t j = (i + 1) & mask; t->ns_map[j] >= 0; j = (j + 1) & mask) {
        uint32_t home = ns_home(t, t->ns_map[j]);
        if (((j - home) & mask) >= ((j - i) & mask)) {
            t->ns_map[i] = t->ns_map[j];
            i = j;
        }
    }
    t->ns_map[i] = -1;
}

/* Frees the namespace once it has neither nodes nor holds. Its root goes
 * with it, so callers walking up from a leaf stop before the root. */
static void ns_maybe_free(tl_radix *t, int ns) {
    tl_radix_ns *k = &t->ns[ns];
    if (!k->root || k->n_nodes > 0 || k->holds > 0) return;
    assert(k->root->n_kids == 0);
    ns_map_remove(t, ns);
    free(k->root->kids);
    free(k->root);
    free(k->windows);
    k->root = NULL;
    k->windows = NULL;
    t->ns_free[t->n_ns_free++] = ns; /* room reserved when the slot was made */
    t->n_ns_live--;
}

int tl_radix_namespace(tl_radix *t, int loops, int cache_window, uint64_t salt, int depth, const int *windows) {
    if (t->cap_ns_map) {
        uint32_t mask = (uint32_t)t->cap_ns_map - 1;
        for (uint32_t i = ns_hash(loops, cache_window, salt) & mask; t->ns_map[i] >= 0; i = (i + 1) & mask) {
            tl_radix_ns *k = &t->ns[t->ns_map[i]];
            if (k->loops == loops && k->cache_window == cache_window && k->salt == salt) {
                k->holds++;
                return t->ns_map[i];
            }
        }
    }
    if ((t->n_ns_live + 1) * 2 > t->cap_ns_map && ns_map_grow(t)) return -1;
    int slot;
    if (t->n_ns_free == 0 && t->n_ns == t->cap_ns) {
        int cap = t->cap_ns ? t->cap_ns * 2 : 4;
        tl_radix_ns *ns = realloc(t->ns, (size_t)cap * sizeof *ns);
        if (!ns) return -1;
        t->ns = ns;
        int *fr = realloc(t->ns_free, (size_t)cap * sizeof *fr);
        if (!fr) return -1;
        t->ns_free = fr;
        t->cap_ns = cap;
    }
    tl_radix_node *root = calloc(1, sizeof *root);
    int32_t *win = windows ? malloc((size_t)depth * sizeof *win) : NULL;
    if (!root || (windows && !win)) {
        free(root);
        free(win);
        return -1;
    }
    for (int vl = 0; win && vl < depth; vl++) win[vl] = windows[vl];
    slot = t->n_ns_free > 0 ? t->ns_free[--t->n_ns_free] : t->n_ns++;
    root->ns = slot;
    t->ns[slot] = (tl_radix_ns){.loops = loops, .cache_window = cache_window, .salt = salt, .depth = depth,
                                .windows = win, .root = root, .holds = 1};
    ns_map_put(t->ns_map, t->cap_ns_map, ns_hash(loops, cache_window, salt), slot);
    t->n_ns_live++;
    return slot;
}

void tl_radix_namespace_release(tl_radix *t, int ns) {
    if (ns < 0 || ns >= t->n_ns || !t->ns[ns].root) return;
    assert(t->ns[ns].holds > 0);
    t->ns[ns].holds--;
    ns_maybe_free(t, ns);
}

int tl_radix_namespace_count(const tl_radix *t) { return t->n_ns_live; }

static void touch(tl_radix *t, tl_radix_node *n) {
    n->last_access = ++t->clock;
    n->hits++;
}

/* ---- match and share ---------------------------------------------------------------- */

int tl_radix_match(tl_radix *t, int ns, const int32_t *tokens, int n, int max_len, tl_radix_node **out) {
    tl_radix_node *node = t->ns[ns].root, *last = NULL;
    int limit = n < max_len ? n : max_len, pos = 0;
    while (pos < limit) {
        tl_radix_node *k = kid_find(node, tokens[pos]);
        if (!k) break;
        int i = 1;
        while (i < k->n_tokens && pos + i < limit && k->tokens[i] == tokens[pos + i]) i++;
        touch(t, k);
        pos += i;
        last = k;
        if (i < k->n_tokens) break;
        node = k;
    }
    if (out) *out = last;
    return pos;
}

void tl_radix_lock(tl_radix_node *node, int delta) {
    for (; node; node = node->parent) {
        node->lock += delta;
        assert(node->lock >= 0);
    }
}

static int ns_window(const tl_radix_ns *ns, int vl) { return ns->windows ? ns->windows[vl] : 0; }

/* The longest usable length L <= len of a match along path (root's child
 * first; *pi: the node containing len - 1), whose ids for len are in ids
 * (block lb from the node containing position min(len, (lb + 1) * bs) - 1).
 * The next token, at position L, reads positions [tl_window_first(L, w),
 * L - 1] at a layer of window w, so every block covering them must be
 * held. A full block below L's last comes from the same node for every L,
 * so each layer's last dropped block so far (hole) answers for all of
 * them; the last block comes from the node containing L - 1 (*pi then). */
static int usable_len(const tl_radix_ns *ns, tl_radix_node *const *path, int *pi, const int32_t *ids, int32_t *hole,
                      int len, int bs) {
    int depth = ns->depth, n_lb = (len + bs - 1) / bs;
    for (int lb = 0; lb < n_lb; lb++)
        for (int vl = 0; vl < depth; vl++)
            hole[lb * depth + vl] = ids[lb * depth + vl] < 0 ? lb : lb > 0 ? hole[(lb - 1) * depth + vl] : -1;
    for (int L = len; L > 0; L--) {
        while (path[*pi]->start > L - 1) (*pi)--;
        const tl_radix_node *src = path[*pi];
        int tail = (L - 1) / bs, ok = 1;
        for (int vl = 0; vl < depth && ok; vl++) {
            int lo = tl_window_first(L, ns_window(ns, vl)) / bs;
            ok = src->blocks[(tail - src->lb_first) * depth + vl] >= 0 &&
                 (tail == 0 || hole[(tail - 1) * depth + vl] < lo);
        }
        if (ok) return L;
    }
    return 0;
}

int tl_radix_share(tl_radix *t, tl_radix_node **node, int len, tl_block_table *bt) {
    assert(bt->n_logical == 0);
    tl_radix_node *end = *node;
    *node = NULL;
    if (len <= 0 || !end) return 0;
    const tl_radix_ns *ns = &t->ns[end->ns];
    int bs = t->kv->block_size, depth = ns->depth, n_lb = (len + bs - 1) / bs;
    /* The path root..end, top down. */
    int plen = 0;
    for (tl_radix_node *p = end; p->parent; p = p->parent) plen++;
    tl_radix_node **path = malloc((size_t)plen * sizeof *path);
    int32_t *ids = malloc((size_t)n_lb * (size_t)depth * sizeof *ids);
    int32_t *hole = malloc((size_t)n_lb * (size_t)depth * sizeof *hole);
    if (!path || !ids || !hole) {
        free(path);
        free(ids);
        free(hole);
        return -2;
    }
    int pi = plen;
    for (tl_radix_node *p = end; p->parent; p = p->parent) path[--pi] = p;
    for (int lb = 0; lb < n_lb; lb++) {
        int last = ((lb + 1) * bs < len ? (lb + 1) * bs : len) - 1;
        while (path[pi]->start + path[pi]->n_tokens <= last) pi++;
        const tl_radix_node *src = path[pi];
        assert(lb >= src->lb_first && lb < src->lb_first + src->n_lb);
        memcpy(ids + lb * depth, src->blocks + (lb - src->lb_first) * depth, (size_t)depth * sizeof *ids);
    }
    int L = usable_len(ns, path, &pi, ids, hole, len, bs);
    free(hole);
    if (L > 0) {
        const tl_radix_node *src = path[pi];
        int tail = (L - 1) / bs;
        n_lb = tail + 1;
        memcpy(ids + tail * depth, src->blocks + (tail - src->lb_first) * depth, (size_t)depth * sizeof *ids);
        /* blocks before a layer's window stay out: the sequence would drop them at once */
        for (int vl = 0; vl < depth; vl++) {
            int lo = tl_window_first(L, ns_window(ns, vl)) / bs;
            for (int lb = 0; lb < n_lb; lb++) {
                int32_t *id = &ids[lb * depth + vl];
                if (lb < lo) *id = -1;
                else tl_kv_ref(t->kv, *id);
            }
        }
        *node = path[pi];
        free(bt->ids);
        bt->ids = ids;
        bt->depth = depth;
        bt->n_logical = bt->cap_logical = n_lb;
    } else {
        free(ids);
    }
    free(path);
    return L;
}

/* ---- insert ---------------------------------------------------------------------------- */

/* A new node for tokens[0..n) at absolute position start, holding the
 * blocks of `bt` (or of `from`, a node covering a superset) that overlap it. */
static tl_radix_node *node_new(tl_radix *t, int ns, const int32_t *tokens, int n, int start,
                               const int32_t *src_ids, int src_lb_first, int tenant) {
    int bs = t->kv->block_size, depth = ns_depth(t, ns);
    tl_radix_node *k = calloc(1, sizeof *k);
    if (!k) return NULL;
    k->tokens = malloc((size_t)n * sizeof *k->tokens);
    k->lb_first = start / bs;
    k->n_lb = (start + n - 1) / bs - k->lb_first + 1;
    k->blocks = malloc((size_t)k->n_lb * (size_t)depth * sizeof *k->blocks);
    if (!k->tokens || !k->blocks) {
        free(k->tokens);
        free(k->blocks);
        free(k);
        return NULL;
    }
    memcpy(k->tokens, tokens, (size_t)n * sizeof *tokens);
    k->n_tokens = n;
    k->start = start;
    k->ns = ns;
    for (int i = 0; i < k->n_lb * depth; i++) {
        int id = src_ids[(k->lb_first - src_lb_first) * depth + i];
        if (id >= 0) tl_kv_ref(t->kv, id);
        k->blocks[i] = id;
    }
    k->last_access = ++t->clock;
    k->id = ++t->next_id;
    k->tenant = tenant >= 0 ? tenant : 0;
    charge(t, k, count_held(k->blocks, k->n_lb * depth));
    t->n_nodes++;
    t->ns[ns].n_nodes++;
    t->cached_tokens += n;
    return k;
}

/* Splits k after its first i tokens; returns the new upper node. */
static tl_radix_node *split(tl_radix *t, tl_radix_node *k, int i) {
    tl_radix_node *u = node_new(t, k->ns, k->tokens, i, k->start, k->blocks, k->lb_first, k->tenant);
    if (!u) return NULL;
    int bs = t->kv->block_size, depth = ns_depth(t, k->ns);
    /* k keeps only the blocks overlapping its new range. */
    int new_start = k->start + i, new_first = new_start / bs, drop = new_first - k->lb_first;
    int32_t *blocks = malloc((size_t)(k->n_lb - drop) * (size_t)depth * sizeof *blocks);
    int32_t *tokens = malloc((size_t)(k->n_tokens - i) * sizeof *tokens);
    if (!blocks || !tokens) {
        free(blocks);
        free(tokens);
        node_free(t, u);
        return NULL;
    }
    charge(t, k, -unref_held(t->kv, k->blocks, drop * depth));
    memcpy(blocks, k->blocks + drop * depth, (size_t)(k->n_lb - drop) * (size_t)depth * sizeof *blocks);
    memcpy(tokens, k->tokens + i, (size_t)(k->n_tokens - i) * sizeof *tokens);
    free(k->blocks);
    free(k->tokens);
    k->blocks = blocks;
    k->tokens = tokens;
    k->n_lb -= drop;
    k->lb_first = new_first;
    /* node_new counted i new cached tokens; k gives up the same i. */
    t->cached_tokens -= i;
    k->n_tokens -= i;
    k->start = new_start;
    u->lock = k->lock;
    u->hits = k->hits;
    u->last_access = k->last_access;
    u->parent = k->parent;
    kid_replace(k->parent, k, u);
    k->parent = u;
    if (kid_add(u, k)) {
        /* Undo is messy; a 4-slot table allocation failing means the process
         * is out of memory anyway. Keep the tree consistent: reattach k. */
        kid_replace(u->parent, u, k);
        k->parent = u->parent;
        u->lock = 0;
        node_free(t, u);
        return NULL;
    }
    return u;
}

tl_radix_node *tl_radix_cut(tl_radix *t, tl_radix_node *node, int len) {
    int i = len - node->start;
    if (i <= 0 || i >= node->n_tokens) return node;
    tl_radix_node *u = split(t, node, i);
    return u ? u : node;
}

/* A node on an inserted sequence's path takes the sequence's blocks where
 * it had dropped them (-1): the same tokens at the same positions, so the
 * same KV, and the node's positions are all among the sequence's. A
 * prefix recomputed after its local blocks went is usable again. */
static void fill_dropped(tl_radix *t, tl_radix_node *k, const tl_block_table *bt) {
    int depth = bt->depth, added = 0;
    for (int i = 0; i < k->n_lb * depth; i++) {
        int id = bt->ids[k->lb_first * depth + i];
        if (k->blocks[i] >= 0 || id < 0) continue;
        tl_kv_ref(t->kv, id);
        k->blocks[i] = id;
        added++;
    }
    charge(t, k, added);
}

tl_radix_node *tl_radix_insert(tl_radix *t, int ns, const int32_t *tokens, int n, const tl_block_table *bt,
                               int tenant) {
    tl_radix_node *node = t->ns[ns].root;
    int pos = 0;
    assert(bt->depth == ns_depth(t, ns));
    while (pos < n) {
        tl_radix_node *k = kid_find(node, tokens[pos]);
        if (!k) {
            tl_radix_node *leaf = node_new(t, ns, tokens + pos, n - pos, pos, bt->ids, 0, tenant);
            if (!leaf) return NULL;
            leaf->parent = node;
            if (kid_add(node, leaf)) {
                node_free(t, leaf);
                return NULL;
            }
            return leaf;
        }
        int i = 1;
        while (i < k->n_tokens && pos + i < n && k->tokens[i] == tokens[pos + i]) i++;
        k->last_access = ++t->clock;
        if (i < k->n_tokens) {
            k = split(t, k, i);
            if (!k) return NULL;
        }
        fill_dropped(t, k, bt);
        node = k;
        pos += i;
    }
    return node == t->ns[ns].root ? NULL : node;
}

/* ---- eviction ---------------------------------------------------------------------------- */

static void remove_leaf(tl_radix *t, tl_radix_node *n) {
    assert(n->n_kids == 0 && n->lock == 0 && n->pin == 0 && n->parent);
    int ns = n->ns;
    kid_remove(n->parent, n);
    node_free(t, n);
    ns_maybe_free(t, ns);
}

static void merge_into_child(tl_radix *t, tl_radix_node *u);

/* Evicts leaf n. A branch point it leaves with one pinned child joins it
 * (as on prune), dropping the branch point's copy of the straddling block:
 * that child is never evicted, so the join changes no eviction unit. With
 * an unpinned child the two stay apart, and eviction stays leaf by leaf
 * (the shadow trees of policy/shadow.lua model exactly that). */
static void evict_leaf(tl_radix *t, tl_radix_node *n) {
    tl_radix_node *p = n->parent;
    int below_root = p->parent != NULL; /* a root may go with its namespace */
    t->evictions++;
    t->evicted_tokens += n->n_tokens;
    if (t->on_evict) t->on_evict(t, n, t->evict_ud);
    remove_leaf(t, n);
    if (below_root && p->n_kids == 1) {
        tl_radix_node *c = NULL;
        for (int i = 0; i < p->cap_kids && !c; i++) c = p->kids[i];
        if (c->pin > 0) merge_into_child(t, p);
    }
}

static int over_budget(const tl_radix *t, int tenant) {
    const tl_radix_tenant *e = tenant_find(t, tenant);
    return e && e->budget > 0 && e->usage > e->budget;
}

static double score_of(const tl_radix *t, const tl_radix_node *n) {
    double s;
    if (t->score) {
        s = t->score(n, t->clock, t->score_ud);
    } else {
        const tl_evict_weights *w = &t->weights;
        s = w->w_recency * (double)n->last_access + w->w_hits * n->hits + w->w_tokens * n->n_tokens +
            w->w_depth * n->start;
    }
    /* A tenant over its KV budget pays first. */
    return over_budget(t, n->tenant) ? s - 1e30 : s;
}

typedef struct {
    tl_radix_node **v;
    double *s;
    int n, cap;
} cand_list;

static void collect(const tl_radix *t, tl_radix_node *n, cand_list *c) {
    if (n->n_kids == 0) {
        if (n->parent && n->lock == 0 && n->pin == 0 && c->n < c->cap) {
            c->v[c->n] = n;
            c->s[c->n++] = score_of(t, n);
        }
        return;
    }
    for (int i = 0; i < n->cap_kids; i++)
        if (n->kids[i]) collect(t, n->kids[i], c);
}

int tl_radix_evict(tl_radix *t, int need) {
    int freed0 = t->kv->n_free;
    while (t->kv->n_free < need) {
        cand_list c = {0};
        c.cap = (int)(t->n_nodes > 0 ? t->n_nodes : 1);
        c.v = malloc((size_t)c.cap * sizeof *c.v);
        c.s = malloc((size_t)c.cap * sizeof *c.s);
        if (!c.v || !c.s) {
            free(c.v);
            free(c.s);
            break;
        }
        for (int i = 0; i < t->n_ns; i++)
            if (t->ns[i].root) collect(t, t->ns[i].root, &c);
        if (c.n == 0) {
            free(c.v);
            free(c.s);
            break;
        }
        /* Evict this round's leaves lowest score first. A parent left
         * without children is a leaf from then on and competes in the same
         * round: were it left for the next, an old prefix whose suffix
         * leaves went first would outlive a newer leaf this round evicts
         * instead (LRU evicted the newest of 6 prefixes that way). Selection
         * by repeated minimum keeps it simple; rounds are short under real
         * pressure. */
        while (t->kv->n_free < need && c.n > 0) {
            int best = 0;
            for (int i = 1; i < c.n; i++)
                if (c.s[i] < c.s[best]) best = i;
            tl_radix_node *victim = c.v[best], *p = victim->parent;
            int p_leaf = p->parent && p->n_kids == 1; /* victim is its last child (then no join frees p) */
            c.v[best] = c.v[--c.n];
            c.s[best] = c.s[c.n];
            evict_leaf(t, victim); /* a joined parent was no leaf, its child is pinned: neither is in c */
            if (p_leaf && p->lock == 0 && p->pin == 0) {
                c.v[c.n] = p;
                c.s[c.n++] = score_of(t, p);
            }
        }
        free(c.v);
        free(c.s);
    }
    return t->kv->n_free - freed0;
}

int tl_radix_set_budget(tl_radix *t, int tenant, int max_blocks) {
    tl_radix_tenant *e = max_blocks > 0 ? tenant_get(t, tenant) : tenant_find(t, tenant);
    if (!e) return max_blocks > 0 ? -1 : 0;
    e->budget = max_blocks > 0 ? max_blocks : 0;
    tenant_maybe_drop(t, e);
    return 0;
}

int tl_radix_tenant_usage(const tl_radix *t, int tenant) {
    const tl_radix_tenant *e = tenant_find(t, tenant);
    return e ? e->usage : 0;
}

static void collect_tenant(tl_radix_node *n, int tenant, tl_radix_node **best) {
    if (n->n_kids == 0) {
        if (n->parent && n->lock == 0 && n->pin == 0 && n->tenant == tenant &&
            (!*best || n->last_access < (*best)->last_access))
            *best = n;
        return;
    }
    for (int i = 0; i < n->cap_kids; i++)
        if (n->kids[i]) collect_tenant(n->kids[i], tenant, best);
}

void tl_radix_enforce_budget(tl_radix *t, int tenant) {
    while (over_budget(t, tenant)) {
        tl_radix_node *victim = NULL;
        for (int i = 0; i < t->n_ns; i++)
            if (t->ns[i].root) collect_tenant(t->ns[i].root, tenant, &victim);
        if (!victim) return;
        evict_leaf(t, victim);
    }
}

/* Joins u to its only child c when nothing refers to u itself (no pin, no
 * lock ending at u): the reverse of a split. Where the two sequences wrote
 * different copies of the block straddling their boundary, u's copy serves
 * only matches ending inside u; c's copy is valid for those positions too
 * (radix.h), so the join drops u's and frees one block per virtual layer.
 * c keeps its identity (pool entries and handles point at it). */
static void merge_into_child(tl_radix *t, tl_radix_node *u) {
    if (!u->parent || u->n_kids != 1 || u->pin != 0) return;
    tl_radix_node *c = NULL;
    for (int i = 0; i < u->cap_kids && !c; i++) c = u->kids[i];
    if (u->lock != c->lock) return; /* a request's lock ends at u */
    int depth = ns_depth(t, u->ns);
    int keep = c->lb_first - u->lb_first; /* u's blocks before c's first */
    int n_lb = keep + c->n_lb, n_tok = u->n_tokens + c->n_tokens;
    int32_t *blocks = malloc((size_t)n_lb * (size_t)depth * sizeof *blocks);
    int32_t *tokens = malloc((size_t)n_tok * sizeof *tokens);
    if (!blocks || !tokens) { /* the tree stays valid unmerged */
        free(blocks);
        free(tokens);
        return;
    }
    memcpy(blocks, u->blocks, (size_t)keep * (size_t)depth * sizeof *blocks);
    memcpy(blocks + keep * depth, c->blocks, (size_t)c->n_lb * (size_t)depth * sizeof *blocks);
    memcpy(tokens, u->tokens, (size_t)u->n_tokens * sizeof *tokens);
    memcpy(tokens + u->n_tokens, c->tokens, (size_t)c->n_tokens * sizeof *tokens);
    /* u's blocks from c's first on are dropped; the ones kept move to c's tenant */
    int moved = count_held(u->blocks, keep * depth);
    charge(t, u, -(moved + unref_held(t->kv, u->blocks + keep * depth, (u->n_lb - keep) * depth)));
    charge(t, c, moved);
    free(u->blocks);
    u->blocks = NULL;
    u->n_lb = 0;
    free(c->blocks);
    free(c->tokens);
    c->blocks = blocks;
    c->tokens = tokens;
    c->n_lb = n_lb;
    c->lb_first = u->lb_first;
    c->start = u->start;
    c->n_tokens = n_tok;
    if (u->last_access > c->last_access) c->last_access = u->last_access;
    c->parent = u->parent;
    kid_replace(u->parent, u, c); /* same first token */
    u->n_kids = 0;
    t->cached_tokens += u->n_tokens; /* node_free subtracts them; c holds them now */
    node_free(t, u);
}

void tl_radix_prune(tl_radix *t, tl_radix_node *n) {
    while (n && n->parent && n->n_kids == 0 && n->lock == 0 && n->pin == 0) {
        tl_radix_node *p = n->parent;
        int at_root = p->parent == NULL; /* the root is freed with its namespace after its last node */
        remove_leaf(t, n);
        if (at_root) break;
        if (p->n_kids) { /* a branch point left with one child: join them */
            merge_into_child(t, p);
            break;
        }
        n = p;
    }
}

void tl_radix_unpin(tl_radix *t, tl_radix_node *n) {
    assert(n->pin > 0);
    if (--n->pin == 0) {
        free(n->logits);
        n->logits = NULL;
    }
    tl_radix_prune(t, n);
}

static void walk(tl_radix_node *n, const tl_radix_ns *ns, void (*fn)(const tl_radix_node *, const tl_radix_ns *, void *),
                 void *ud) {
    if (n->parent) fn(n, ns, ud);
    for (int i = 0; i < n->cap_kids; i++)
        if (n->kids[i]) walk(n->kids[i], ns, fn, ud);
}

void tl_radix_walk(tl_radix *t, void (*fn)(const tl_radix_node *, const tl_radix_ns *, void *), void *ud) {
    for (int i = 0; i < t->n_ns; i++)
        if (t->ns[i].root) walk(t->ns[i].root, &t->ns[i], fn, ud);
}

/* ---- consistency (tests) --------------------------------------------------------------- */

static int64_t count_nodes(const tl_radix_node *n) {
    int64_t c = n->parent ? 1 : 0;
    for (int i = 0; i < n->cap_kids; i++)
        if (n->kids[i]) c += count_nodes(n->kids[i]);
    return c;
}

/* acc[0]: a tenant; acc[1] += the blocks its nodes hold. */
static void sum_tenant(const tl_radix_node *n, const tl_radix_ns *ns, void *ud) {
    int64_t *acc = ud;
    if (n->tenant == (int)acc[0]) acc[1] += tl_radix_node_blocks(n, ns->depth);
}

/* *bad = a node holding a dropped block (-1) at a layer without a window. */
static void find_bad_drop(const tl_radix_node *n, const tl_radix_ns *ns, void *ud) {
    const tl_radix_node **bad = ud;
    for (int i = 0; !*bad && i < n->n_lb * ns->depth; i++)
        if (n->blocks[i] < 0 && ns_window(ns, i % ns->depth) == 0) *bad = n;
}

int tl_radix_check(tl_radix *t, char *msg, size_t cap) {
    int live = 0, mapped = 0;
    for (int i = 0; i < t->n_ns; i++) {
        const tl_radix_ns *k = &t->ns[i];
        if (!k->root) continue;
        live++;
        int64_t n = count_nodes(k->root);
        if (n != k->n_nodes) {
            snprintf(msg, cap, "namespace %d counts %lld nodes but holds %lld", i, (long long)k->n_nodes,
                     (long long)n);
            return -1;
        }
        if (n == 0 && k->holds == 0) {
            snprintf(msg, cap, "namespace %d (salt %llu) has no nodes and no holds but was not freed", i,
                     (unsigned long long)k->salt);
            return -1;
        }
        uint32_t mask = (uint32_t)t->cap_ns_map - 1, j = ns_home(t, i);
        while (t->ns_map[j] >= 0 && t->ns_map[j] != i) j = (j + 1) & mask;
        if (t->ns_map[j] != i) {
            snprintf(msg, cap, "namespace %d (salt %llu) is not found by its key", i, (unsigned long long)k->salt);
            return -1;
        }
    }
    for (int j = 0; j < t->cap_ns_map; j++) mapped += t->ns_map[j] >= 0;
    if (live != t->n_ns_live || mapped != live) {
        snprintf(msg, cap, "%d live namespaces, %d counted, %d in the map", live, t->n_ns_live, mapped);
        return -1;
    }
    const tl_radix_node *bad = NULL;
    tl_radix_walk(t, find_bad_drop, &bad);
    if (bad) {
        snprintf(msg, cap, "node %lld (start %d) dropped a block of a layer without a window", (long long)bad->id,
                 bad->start);
        return -1;
    }
    int entries = 0;
    for (int j = 0; j < t->cap_tenants; j++) {
        const tl_radix_tenant *e = &t->tenants[j];
        if (e->tenant < 0) continue;
        entries++;
        if (tenant_find(t, e->tenant) != e) {
            snprintf(msg, cap, "tenant %d is not found by its id", e->tenant);
            return -1;
        }
        int64_t acc[2] = {e->tenant, 0};
        tl_radix_walk(t, sum_tenant, acc);
        if (acc[1] != e->usage || (e->usage == 0 && e->budget == 0)) {
            snprintf(msg, cap, "tenant %d has usage %d (nodes hold %lld) and budget %d", e->tenant, e->usage,
                     (long long)acc[1], e->budget);
            return -1;
        }
    }
    if (entries != t->n_tenants) {
        snprintf(msg, cap, "%d tenant entries, %d counted", entries, t->n_tenants);
        return -1;
    }
    return 0;
}
