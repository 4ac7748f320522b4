/* pool_entry.c - a PrefixPool's entries as the request layers use them:
 * adding a built entry (the policy's victim dropped after, never before),
 * attributing cache hits to the entries that own the matched blocks, the
 * "pool" scope's match, and freeing. Nothing here calls the scheduler; the
 * public pool API over it is pool.c. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "pool.h"
#include "util.h"

static void drop_entry(tl_pool *p, int i) {
    pool_entry *e = &p->e[i];
    if (e->node && p->model) {
        e->node->shareable -= p->shareable;
        tl_radix_unpin(&p->model->cache, e->node);
    }
    free(e->tokens);
    p->e[i] = p->e[--p->n];
    memset(&p->e[p->n], 0, sizeof p->e[p->n]);
}

void tl_pool_free_now(tl_pool *p) {
    pthread_mutex_lock(&p->mu);
    while (p->n) drop_entry(p, p->n - 1);
    pthread_mutex_unlock(&p->mu);
    tl_pool_unbind(p);
    pthread_mutex_destroy(&p->mu);
    free(p->e);
    free(p);
}

void tl_pool_detach_model(tl_pool *p) {
    /* The tree is going away with its model: forget the nodes. */
    pthread_mutex_lock(&p->mu);
    for (int i = 0; i < p->n; i++) {
        free(p->e[i].tokens);
        memset(&p->e[i], 0, sizeof p->e[i]);
    }
    p->n = 0;
    p->model = NULL;
    pthread_mutex_unlock(&p->mu);
}

void tl_pool_key(const tl_pool *p, uint64_t *salt, int *tenant) {
    *salt = p->shareable ? 0 : p->salt;
    *tenant = p->tenant;
}

void tl_pool_count_lookup(tl_pool *p) {
    pthread_mutex_lock(&p->mu);
    p->st.lookups++;
    pthread_mutex_unlock(&p->mu);
}

void tl_pool_attribute_hit(tl_model *m, const tl_radix_node *node, int matched) {
    /* The pool entries pinning a node on the matched path own the reused
     * blocks, whichever pool (or none) the request came through. */
    enum { MAX_PINNED = 32 };
    const tl_radix_node *pinned[MAX_PINNED];
    int n_pinned = 0;
    for (const tl_radix_node *x = node; x && x->parent && n_pinned < MAX_PINNED; x = x->parent)
        if (x->pin > 0) pinned[n_pinned++] = x;
    if (!n_pinned) return;
    pthread_mutex_lock(&m->pools_mu); /* lock order: the list, then a pool's mu */
    for (int k = 0; k < m->n_pools; k++) {
        tl_pool *p = m->pools[k];
        int served = 0;
        pthread_mutex_lock(&p->mu);
        for (int i = 0; i < p->n; i++)
            for (int j = 0; j < n_pinned; j++)
                if (p->e[i].node == pinned[j]) {
                    p->e[i].last_use = ++p->clock;
                    p->e[i].hits++;
                    int tok = p->e[i].n < matched ? p->e[i].n : matched;
                    if (tok > served) served = tok;
                }
        if (served) {
            p->st.hits++;
            p->st.hit_tokens += served;
        }
        pthread_mutex_unlock(&p->mu);
    }
    pthread_mutex_unlock(&m->pools_mu);
}

int tl_pool_scoped_match(tl_pool *p, const int32_t *prompt, int n, int loops, int window, uint64_t salt,
                         tl_radix_node **node) {
    pthread_mutex_lock(&p->mu);
    int scoped = p->scope == TL_POOL_SCOPE_POOL, best = -1;
    /* only entries of the request's namespace (or shareable ones) */
    if (scoped && (p->shareable || p->salt == salt))
        for (int i = 0; i < p->n; i++) {
            const pool_entry *e = &p->e[i];
            if (e->node && e->n <= n && e->loops == loops && e->window == window &&
                !memcmp(e->tokens, prompt, (size_t)e->n * 4) && (best < 0 || e->n > p->e[best].n))
                best = i;
        }
    *node = best >= 0 ? p->e[best].node : NULL;
    int len = best >= 0 ? p->e[best].n : 0;
    pthread_mutex_unlock(&p->mu);
    return scoped ? len : -1;
}

int tl_pool_find_entry(const tl_pool *p, const int32_t *tokens, int n, int loops, int window) {
    for (int i = 0; i < p->n; i++) {
        const pool_entry *e = &p->e[i];
        if (e->n == n && e->loops == loops && e->window == window && !memcmp(e->tokens, tokens, (size_t)n * 4))
            return i;
    }
    return -1;
}

/* The entry the policy drops: the shortest (the first registered among
 * equals), or the least recently used. */
static int victim(const tl_pool *p) {
    int v = 0;
    for (int i = 1; i < p->n; i++) {
        const pool_entry *a = &p->e[i], *b = &p->e[v];
        int worse;
        if (p->policy == TL_POOL_EVICT_LRU) worse = a->last_use < b->last_use;
        else if (p->policy == TL_POOL_EVICT_COST)
            worse = (double)a->n * (1.0 + (double)a->hits) < (double)b->n * (1.0 + (double)b->hits);
        else worse = a->n < b->n || (a->n == b->n && a->order < b->order);
        if (worse) v = i;
    }
    return v;
}

int tl_pool_add_built(tl_pool *p, const int32_t *tokens, int n, int loops, int window, tl_radix_node *node) {
    int32_t *copy = malloc((size_t)n * sizeof *copy);
    if (!copy) return tl_set_error(TL_ERR_NOMEM, "out of memory copying a prefix of %d tokens", n);
    memcpy(copy, tokens, (size_t)n * sizeof *copy);
    pthread_mutex_lock(&p->mu);
    if (tl_pool_find_entry(p, tokens, n, loops, window) >= 0) { /* registered meanwhile */
        pthread_mutex_unlock(&p->mu);
        free(copy);
        return TL_OK;
    }
    /* Pin first: dropping the victim prunes its path, which may run through
     * the new node (a shorter prefix of the victim's tokens). */
    node->pin++;
    node->shareable += p->shareable;
    if (p->n == p->capacity) {
        p->st.evictions++;
        drop_entry(p, victim(p));
    }
    uint64_t now = ++p->clock;
    p->e[p->n++] = (pool_entry){.tokens = copy, .n = n, .loops = loops, .window = window, .node = node,
                                .order = now, .last_use = now};
    p->st.registrations++;
    pthread_mutex_unlock(&p->mu);
    return TL_OK;
}

/* The list changes from a caller's thread (a first register binds, a free
 * unbinds) and is read by the stepping thread: under the model's pools_mu. */
int tl_pool_bind(tl_pool *p, tl_model *m) {
    if (p->model == m) return TL_OK;
    if (p->model) return tl_set_error(TL_ERR_INVALID_ARG, "pool is bound to another model");
    pthread_mutex_lock(&m->pools_mu);
    if (m->n_pools == m->cap_pools) {
        int cap = m->cap_pools ? m->cap_pools * 2 : 4;
        tl_pool **v = realloc(m->pools, (size_t)cap * sizeof *v);
        if (!v) {
            pthread_mutex_unlock(&m->pools_mu);
            return tl_set_error(TL_ERR_NOMEM, "out of memory binding a pool");
        }
        m->pools = v;
        m->cap_pools = cap;
    }
    m->pools[m->n_pools++] = p;
    p->model = m;
    pthread_mutex_unlock(&m->pools_mu);
    return TL_OK;
}

void tl_pool_unbind(tl_pool *p) {
    tl_model *m = p->model;
    if (!m) return;
    pthread_mutex_lock(&m->pools_mu);
    for (int i = 0; i < m->n_pools; i++)
        if (m->pools[i] == p) m->pools[i--] = m->pools[--m->n_pools];
    pthread_mutex_unlock(&m->pools_mu);
}

void tl_pool_detach_all(tl_model *m) {
    pthread_mutex_lock(&m->pools_mu);
    for (int i = 0; i < m->n_pools; i++) tl_pool_detach_model(m->pools[i]);
    free(m->pools);
    m->pools = NULL;
    m->n_pools = m->cap_pools = 0;
    pthread_mutex_unlock(&m->pools_mu);
}
