/* radix.c - the radix tree of cached KV (see radix.h for the picture). */
#include "radix.h"

#include <assert.h>
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

/* Grows the per-tenant tables to cover tenant; -1 on no memory. */
static int tenant_slot(tl_radix *t, int tenant) {
    if (tenant < 0) return -1;
    if (tenant < t->n_tenants) return 0;
    int n = t->n_tenants ? t->n_tenants : 8;
    while (n <= tenant) n *= 2;
    int32_t *u = realloc(t->usage, (size_t)n * sizeof *u);
    if (!u) return -1;
    t->usage = u;
    int32_t *b = realloc(t->budget, (size_t)n * sizeof *b);
    if (!b) return -1;
    t->budget = b;
    for (int i = t->n_tenants; i < n; i++) t->usage[i] = t->budget[i] = 0;
    t->n_tenants = n;
    return 0;
}

static void charge(tl_radix *t, const tl_radix_node *n, int blocks) {
    if (n->tenant >= 0 && n->tenant < t->n_tenants) t->usage[n->tenant] += blocks;
}

static void node_release_blocks(tl_radix *t, tl_radix_node *n) {
    int depth = ns_depth(t, n->ns);
    charge(t, n, -n->n_lb * depth);
    for (int i = 0; i < n->n_lb * depth; i++) tl_kv_unref(t->kv, n->blocks[i]);
    free(n->blocks);
    n->blocks = NULL;
    n->n_lb = 0;
}

static void node_free(tl_radix *t, tl_radix_node *n) {
    if (n->n_tokens) {
        t->n_nodes--;
        t->cached_tokens -= n->n_tokens;
    }
    node_release_blocks(t, n);
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
    for (int i = 0; i < t->n_ns; i++) free_subtree(t, t->ns[i].root);
    free(t->ns);
    free(t->usage);
    free(t->budget);
    memset(t, 0, sizeof *t);
}

int tl_radix_namespace(tl_radix *t, int loops, int cache_window, uint64_t salt, int depth) {
    for (int i = 0; i < t->n_ns; i++)
        if (t->ns[i].loops == loops && t->ns[i].cache_window == cache_window && t->ns[i].salt == salt) return i;
    if (t->n_ns == t->cap_ns) {
        int cap = t->cap_ns ? t->cap_ns * 2 : 4;
        tl_radix_ns *ns = realloc(t->ns, (size_t)cap * sizeof *ns);
        if (!ns) return -1;
        t->ns = ns;
        t->cap_ns = cap;
    }
    tl_radix_node *root = calloc(1, sizeof *root);
    if (!root) return -1;
    root->ns = t->n_ns;
    t->ns[t->n_ns] = (tl_radix_ns){.loops = loops, .cache_window = cache_window, .salt = salt, .depth = depth, .root = root};
    return t->n_ns++;
}

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

int tl_radix_share(tl_radix *t, tl_radix_node *node, int len, tl_block_table *bt) {
    assert(bt->n_logical == 0);
    if (len <= 0 || !node) return 0;
    int bs = t->kv->block_size, depth = ns_depth(t, node->ns), n_lb = (len + bs - 1) / bs;
    /* The path root..node, top down. */
    int plen = 0;
    for (tl_radix_node *p = node; p->parent; p = p->parent) plen++;
    tl_radix_node **path = malloc((size_t)plen * sizeof *path);
    int32_t *ids = malloc((size_t)n_lb * (size_t)depth * sizeof *ids);
    if (!path || !ids) {
        free(path);
        free(ids);
        return -2;
    }
    int i = plen;
    for (tl_radix_node *p = node; p->parent; p = p->parent) path[--i] = p;
    int pi = 0;
    for (int lb = 0; lb < n_lb; lb++) {
        int last = ((lb + 1) * bs < len ? (lb + 1) * bs : len) - 1;
        while (path[pi]->start + path[pi]->n_tokens <= last) pi++;
        const tl_radix_node *src = path[pi];
        assert(lb >= src->lb_first && lb < src->lb_first + src->n_lb);
        for (int vl = 0; vl < depth; vl++) {
            int id = src->blocks[(lb - src->lb_first) * depth + vl];
            tl_kv_ref(t->kv, id);
            ids[lb * depth + vl] = id;
        }
    }
    free(path);
    free(bt->ids);
    bt->ids = ids;
    bt->depth = depth;
    bt->n_logical = bt->cap_logical = n_lb;
    return 0;
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
        tl_kv_ref(t->kv, id);
        k->blocks[i] = id;
    }
    k->last_access = ++t->clock;
    k->id = ++t->next_id;
    k->tenant = tenant_slot(t, tenant) == 0 ? tenant : 0;
    charge(t, k, k->n_lb * depth);
    t->n_nodes++;
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
    for (int j = 0; j < drop * depth; j++) tl_kv_unref(t->kv, k->blocks[j]);
    charge(t, k, -drop * depth);
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
        node = k;
        pos += i;
    }
    return node == t->ns[ns].root ? NULL : node;
}

/* ---- eviction ---------------------------------------------------------------------------- */

static void remove_leaf(tl_radix *t, tl_radix_node *n) {
    assert(n->n_kids == 0 && n->lock == 0 && n->pin == 0 && n->parent);
    kid_remove(n->parent, n);
    node_free(t, n);
}

static int over_budget(const tl_radix *t, int tenant) {
    return tenant >= 0 && tenant < t->n_tenants && t->budget[tenant] > 0 && t->usage[tenant] > t->budget[tenant];
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
        for (int i = 0; i < t->n_ns; i++) collect(t, t->ns[i].root, &c);
        if (c.n == 0) {
            free(c.v);
            free(c.s);
            break;
        }
        /* Evict this round's leaves lowest score first; parents that become
         * leaves are candidates in the next round. Selection by repeated
         * minimum keeps it simple; rounds are short under real pressure. */
        while (t->kv->n_free < need && c.n > 0) {
            int best = 0;
            for (int i = 1; i < c.n; i++)
                if (c.s[i] < c.s[best]) best = i;
            tl_radix_node *victim = c.v[best];
            c.v[best] = c.v[--c.n];
            c.s[best] = c.s[c.n];
            t->evictions++;
            t->evicted_tokens += victim->n_tokens;
            remove_leaf(t, victim);
        }
        free(c.v);
        free(c.s);
    }
    return t->kv->n_free - freed0;
}

int tl_radix_set_budget(tl_radix *t, int tenant, int max_blocks) {
    if (tenant_slot(t, tenant)) return -1;
    t->budget[tenant] = max_blocks > 0 ? max_blocks : 0;
    return 0;
}

int tl_radix_tenant_usage(const tl_radix *t, int tenant) {
    return tenant >= 0 && tenant < t->n_tenants ? t->usage[tenant] : 0;
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
        for (int i = 0; i < t->n_ns; i++) collect_tenant(t->ns[i].root, tenant, &victim);
        if (!victim) return;
        t->evictions++;
        t->evicted_tokens += victim->n_tokens;
        remove_leaf(t, victim);
    }
}

void tl_radix_prune(tl_radix *t, tl_radix_node *n) {
    while (n && n->parent && n->n_kids == 0 && n->lock == 0 && n->pin == 0) {
        tl_radix_node *p = n->parent;
        remove_leaf(t, n);
        n = p;
    }
}

static void walk(tl_radix_node *n, const tl_radix_ns *ns, void (*fn)(const tl_radix_node *, const tl_radix_ns *, void *),
                 void *ud) {
    if (n->parent) fn(n, ns, ud);
    for (int i = 0; i < n->cap_kids; i++)
        if (n->kids[i]) walk(n->kids[i], ns, fn, ud);
}

void tl_radix_walk(tl_radix *t, void (*fn)(const tl_radix_node *, const tl_radix_ns *, void *), void *ud) {
    for (int i = 0; i < t->n_ns; i++) walk(t->ns[i].root, &t->ns[i], fn, ud);
}
