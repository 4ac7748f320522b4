/* pool.c - the PrefixPool: registered prefixes pinned in the model's radix
 * cache, with a capacity and an eviction policy (shortest entry first, as
 * docs/prefix-pool.md defines it, or least recently used). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pool.h"
#include "scheduler.h"
#include "util.h"

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

int tl_pool_new(int capacity, tl_pool **out) {
    if (!out) return tl_set_error(TL_ERR_INVALID_ARG, "out must not be NULL");
    *out = NULL;
    if (capacity < 0) return tl_set_error(TL_ERR_INVALID_ARG, "capacity %d must be >= 0", capacity);
    tl_pool *p = calloc(1, sizeof *p);
    if (p) p->capacity = capacity > 0 ? capacity : 1; /* 0 is coerced to 1 (docs/prefix-pool.md) */
    if (p) p->e = calloc((size_t)p->capacity, sizeof *p->e);
    if (!p || !p->e) {
        free(p);
        return tl_set_error(TL_ERR_NOMEM, "out of memory for a pool of %d entries", capacity);
    }
    pthread_mutex_init(&p->mu, NULL);
    *out = p;
    return TL_OK;
}

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
    tl_model *m = p->model;
    pthread_mutex_lock(&p->mu);
    while (p->n) drop_entry(p, p->n - 1);
    pthread_mutex_unlock(&p->mu);
    if (m) tl_sched_detach_pool(m, p);
    pthread_mutex_destroy(&p->mu);
    free(p->e);
    free(p);
}

void tl_pool_free(tl_pool *p) {
    if (!p) return;
    tl_model *m = p->model;
    if (!m) {
        tl_pool_free_now(p);
        return;
    }
    /* Unpinning touches the tree the engine steps over: with an engine
     * thread the pool goes between steps, so a caller (a Lua finalizer in
     * a request handler) never waits for a forward pass. */
    tl_sched_msg msg = {.kind = TL_MSG_POOL_FREE, .pool = p};
    if (tl_sched_post_msg(m, &msg) == 1) return;
    tl_sched_compute_lock(m);
    tl_pool_free_now(p);
    tl_sched_compute_unlock(m);
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

int tl_pool_bind(tl_pool *p, tl_model *m) {
    if (p->model == m) return TL_OK;
    if (p->model) return tl_set_error(TL_ERR_INVALID_ARG, "pool is bound to another model");
    p->model = m;
    tl_sched_attach_pool(m, p);
    return TL_OK;
}

int tl_pool_size(const tl_pool *p) {
    if (!p) return 0;
    pthread_mutex_lock((pthread_mutex_t *)&p->mu);
    int n = p->n;
    pthread_mutex_unlock((pthread_mutex_t *)&p->mu);
    return n;
}

static int64_t total_locked(const tl_pool *p) {
    int64_t t = 0;
    for (int i = 0; i < p->n; i++) t += p->e[i].n;
    return t;
}

int64_t tl_pool_total_cached_tokens(const tl_pool *p) {
    if (!p) return 0;
    pthread_mutex_lock((pthread_mutex_t *)&p->mu);
    int64_t t = total_locked(p);
    pthread_mutex_unlock((pthread_mutex_t *)&p->mu);
    return t;
}

int tl_pool_set_policy(tl_pool *p, int policy) {
    if (!p) return tl_set_error(TL_ERR_INVALID_ARG, "pool must not be NULL");
    if (policy != TL_POOL_EVICT_SHORTEST && policy != TL_POOL_EVICT_LRU && policy != TL_POOL_EVICT_COST)
        return tl_set_error(TL_ERR_INVALID_ARG,
                            "pool policy %d is not TL_POOL_EVICT_SHORTEST (0), _LRU (1) or _COST (2)", policy);
    p->policy = policy;
    return TL_OK;
}

int tl_pool_set_scope(tl_pool *p, int scope) {
    if (!p) return tl_set_error(TL_ERR_INVALID_ARG, "pool must not be NULL");
    if (scope != TL_POOL_SCOPE_SHARED && scope != TL_POOL_SCOPE_POOL)
        return tl_set_error(TL_ERR_INVALID_ARG, "pool scope %d is not TL_POOL_SCOPE_SHARED (0) or _POOL (1)", scope);
    pthread_mutex_lock(&p->mu);
    p->scope = scope;
    pthread_mutex_unlock(&p->mu);
    return TL_OK;
}

static int before_first_register(const tl_pool *p, const char *what) {
    if (!p) return tl_set_error(TL_ERR_INVALID_ARG, "pool must not be NULL");
    if (p->n) return tl_set_error(TL_ERR_STATE, "set the pool's %s before registering entries (it has %d)", what, p->n);
    return TL_OK;
}

int tl_pool_set_salt(tl_pool *p, uint64_t salt) {
    int rc = before_first_register(p, "salt");
    if (!rc) p->salt = salt;
    return rc;
}

int tl_pool_set_shareable(tl_pool *p, int shareable) {
    int rc = before_first_register(p, "shareable flag");
    if (!rc) p->shareable = shareable ? 1 : 0;
    return rc;
}

int tl_pool_set_tenant(tl_pool *p, int tenant) {
    if (tenant < 0) return tl_set_error(TL_ERR_INVALID_ARG, "tenant %d must be >= 0", tenant);
    int rc = before_first_register(p, "tenant");
    if (!rc) p->tenant = tenant;
    return rc;
}

int tl_pool_get_stats(const tl_pool *p, tl_pool_stats *o) {
    if (!p || !o) return tl_set_error(TL_ERR_INVALID_ARG, "pool and out must not be NULL");
    pthread_mutex_lock((pthread_mutex_t *)&p->mu);
    *o = p->st;
    o->size = p->n;
    o->capacity = p->capacity;
    o->policy = p->policy;
    o->total_cached_tokens = total_locked(p);
    pthread_mutex_unlock((pthread_mutex_t *)&p->mu);
    return TL_OK;
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
    tl_sched *s = m->sched;
    pthread_mutex_lock(&s->mu); /* the pool list; lock order: s->mu, then a pool's mu */
    for (int k = 0; k < s->n_pools; k++) {
        tl_pool *p = s->pools[k];
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
    pthread_mutex_unlock(&s->mu);
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

static int find_entry(const tl_pool *p, const int32_t *tokens, int n, int loops, int window) {
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

int tl_pool_check_register(tl_model *m, tl_pool *p, const int32_t *tokens, int n, int loops, int window) {
    if (!m || !p) return tl_set_error(TL_ERR_INVALID_ARG, "model and pool must not be NULL");
    if (!m->arch) return tl_set_error(TL_ERR_STATE, "model was opened vocab_only; it cannot build a prefix");
    int rc = tl_pool_bind(p, m);
    if (rc) return rc;
    if (loops < 0 || window < 0)
        return tl_set_error(TL_ERR_INVALID_ARG, "loops %d and cache_window %d must be >= 0", loops, window);
    if (n > m->max_seq_len)
        return tl_set_error(TL_ERR_TOO_LONG, "prefix length %d exceeds max_seq_len %d", n, m->max_seq_len);
    return tl_request_check_tokens(m, tokens, n);
}

int tl_pool_register(tl_model *m, tl_pool *p, const int32_t *tokens, int n, int loops, int window) {
    int rc = tl_pool_check_register(m, p, tokens, n, loops, window);
    if (rc) return rc;
    int eff = tl_model_effective_loops(m, loops);
    pthread_mutex_lock(&p->mu);
    int hit = find_entry(p, tokens, n, eff, window);
    if (hit >= 0) p->e[hit].last_use = ++p->clock;
    pthread_mutex_unlock(&p->mu);
    if (hit >= 0) return n;
    /* A TL_RK_REGISTER request, waited for: it prefills in the
     * scheduler's batches, and only once the entry is built does the pool
     * drop a victim (tl_pool_add_built), so a failed register leaves the
     * pool as it was. */
    int64_t id;
    rc = tl_pool_register_submit(m, p, tokens, n, loops, window, &id);
    if (rc == TL_OK) rc = tl_sched_wait(m, id, NULL, 0, NULL, NULL);
    return rc < 0 ? rc : n;
}

int tl_pool_add_built(tl_pool *p, const int32_t *tokens, int n, int loops, int window, tl_radix_node *node) {
    int32_t *copy = malloc((size_t)n * sizeof *copy);
    if (!copy) return tl_set_error(TL_ERR_NOMEM, "out of memory copying a prefix of %d tokens", n);
    memcpy(copy, tokens, (size_t)n * sizeof *copy);
    pthread_mutex_lock(&p->mu);
    if (find_entry(p, tokens, n, loops, window) >= 0) { /* registered meanwhile */
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

int tl_generate_with_pool(tl_model *m, tl_pool *p, const int32_t *prompt, int n_prompt, tl_generate_params gp,
                          int32_t *out, int cap) {
    if (!m || !p) return tl_set_error(TL_ERR_INVALID_ARG, "model and pool must not be NULL");
    if (!m->arch) return tl_set_error(TL_ERR_STATE, "model was opened vocab_only; it cannot generate");
    int rc = tl_pool_bind(p, m);
    if (rc) return rc;
    rc = tl_request_check_prompt(m, prompt, n_prompt, gp.max_tokens);
    if (rc) return rc;
    if (!out || cap < n_prompt + gp.max_tokens)
        return tl_set_error(TL_ERR_BUFFER, "output buffer of %d tokens is smaller than prompt %d + max_tokens %d", cap,
                            n_prompt, gp.max_tokens);
    memmove(out, prompt, (size_t)n_prompt * sizeof *out);
    /* A salted pool looks in its own namespace; its tenant is charged. */
    if (!gp.salt && !p->shareable) gp.salt = p->salt;
    if (!gp.tenant) gp.tenant = p->tenant;
    rc = tl_sched_run(m, out, n_prompt, &gp, p, out + n_prompt, cap - n_prompt, NULL);
    if (rc < 0 && rc != TL_ERR_INVALID_ARG && rc != TL_ERR_TOO_LONG && !gp.no_cache) {
        /* Any failure on the cached path falls through to plain generation. */
        gp.no_cache = 1;
        rc = tl_sched_run(m, out, n_prompt, &gp, NULL, out + n_prompt, cap - n_prompt, NULL);
    }
    return rc < 0 ? rc : n_prompt + rc;
}
