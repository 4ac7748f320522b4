/* pool.c - the PrefixPool's public API: registered prefixes pinned in the
 * model's radix cache, with a capacity and an eviction policy (shortest
 * entry first, as docs/prefix-pool.md defines it, least recently used, or
 * cost). Registering is a TL_RK_REGISTER request (request.c, scheduler.c);
 * the entries themselves are pool_entry.c. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pool.h"
#include "scheduler.h"
#include "util.h"

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
    tl_sched_forget_pool(m, p);
    tl_pool_free_now(p);
    tl_sched_compute_unlock(m);
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

int tl_pool_register_submit(tl_model *m, tl_pool *pool, const int32_t *tokens, int n, int loops, int window,
                            int64_t *id_out) {
    if (!id_out) return tl_set_error(TL_ERR_INVALID_ARG, "id_out must not be NULL");
    int rc = tl_pool_check_register(m, pool, tokens, n, loops, window);
    if (rc) return rc;
    return tl_request_submit_build(m, pool, tokens, n, loops, window, id_out);
}

int tl_pool_register(tl_model *m, tl_pool *p, const int32_t *tokens, int n, int loops, int window) {
    int rc = tl_pool_check_register(m, p, tokens, n, loops, window);
    if (rc) return rc;
    int eff = tl_model_effective_loops(m, loops);
    pthread_mutex_lock(&p->mu);
    int hit = tl_pool_find_entry(p, tokens, n, eff, window);
    if (hit >= 0) p->e[hit].last_use = ++p->clock;
    pthread_mutex_unlock(&p->mu);
    if (hit >= 0) return n;
    /* A TL_RK_REGISTER request, waited for: it prefills in the
     * scheduler's batches, and only once the entry is built does the pool
     * drop a victim (tl_pool_add_built), so a failed register leaves the
     * pool as it was. */
    int64_t id;
    rc = tl_pool_register_submit(m, p, tokens, n, loops, window, &id);
    if (rc == TL_OK) rc = tl_sched_wait(m, id, NULL, 0, NULL);
    return rc < 0 ? rc : n;
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
