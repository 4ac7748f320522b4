/* request.c - the request state machine: creation and queueing (every
 * kind: GENERATE, REGISTER, PIN, RESUME), the transitions the step makes
 * (finish, fail, requeue, a build's completion), and what other threads
 * read (take, info, waiting for news). The step itself is scheduler.c. */
#include "request.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "beam.h"
#include "cache_tier.h"
#include "pool.h"
#include "scheduler.h"
#include "util.h"

tl_generate_params tl_generate_default_params(void) {
    tl_generate_params p;
    memset(&p, 0, sizeof p);
    p.max_tokens = 128;
    p.sampling.temperature = 0.0f;
    p.sampling.top_p = 1.0f;
    p.sampling.repeat_penalty = 1.0f;
    p.sampling.repeat_last_n = 64;
    return p;
}

int tl_request_check_tokens(const tl_model *m, const int32_t *tokens, int n) {
    if (!tokens || n < 1) return tl_set_error(TL_ERR_INVALID_ARG, "prompt is empty (n_prompt %d)", n);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= m->hp.n_vocab)
            return tl_set_error(TL_ERR_INVALID_ARG, "prompt token %d at index %d is outside the vocab [0, %d)",
                                tokens[i], i, m->hp.n_vocab);
    return TL_OK;
}

int tl_request_check_prompt(const tl_model *m, const int32_t *prompt, int n_prompt, int max_tokens) {
    if (!prompt || n_prompt < 1) return tl_set_error(TL_ERR_INVALID_ARG, "prompt is empty (n_prompt %d)", n_prompt);
    if (max_tokens < 1) return tl_set_error(TL_ERR_INVALID_ARG, "max_tokens %d must be >= 1", max_tokens);
    if ((int64_t)n_prompt + max_tokens > m->max_seq_len)
        return tl_set_error(TL_ERR_TOO_LONG, "prompt length %d + max_tokens %d exceeds max_seq_len %d", n_prompt,
                            max_tokens, m->max_seq_len);
    return tl_request_check_tokens(m, prompt, n_prompt);
}

/* ---- request lifetime ----------------------------------------------------------- */

/* Caller holds mu. */
tl_request *tl_request_find(const tl_model *m, int64_t id) {
    const tl_sched *s = m->sched;
    for (int i = 0; i < s->n; i++)
        if (s->reqs[i]->id == id) return s->reqs[i];
    for (int i = 0; i < s->n_in; i++)
        if (s->incoming[i]->id == id) return s->incoming[i];
    return NULL;
}

/* Drops the request's KV and cache lock; with insert, its tokens go into
 * the cache first. */
void tl_request_stop(tl_model *m, tl_request *r, int insert) {
    if (r->seq) {
        if (insert && r->ns >= 0 && r->seq->n_pos > 0 && r->seq->bt.n_released == 0) {
            tl_radix_insert(&m->cache, r->ns, r->tokens, r->seq->n_pos, &r->seq->bt, r->p.tenant);
            tl_radix_enforce_budget(&m->cache, r->p.tenant);
        }
        tl_seq_free(r->seq);
        r->seq = NULL;
    }
    tl_beam_free(r->beam); /* and every live beam's sequence */
    r->beam = NULL;
    if (r->locked) {
        tl_radix_lock(r->locked, -1);
        r->locked = NULL;
    }
    if (r->ns >= 0) { /* after the insert: an emptied namespace can go */
        tl_radix_namespace_release(&m->cache, r->ns);
        r->ns = -1;
    }
}

void tl_request_free(tl_model *m, tl_request *r) {
    tl_request_stop(m, r, 0);
    if (r->pinned) tl_radix_unpin(&m->cache, r->pinned); /* its caller never took it */
    free(r->reg_logits);
    free(r->tokens);
    free(r);
}

/* Ended well: the state readers see (under mu) and news for the notifier. */
static void set_done(tl_model *m, tl_request *r, int reason) {
    pthread_mutex_lock(&m->sched->mu);
    r->state = TL_REQ_DONE;
    r->finish = reason;
    r->news = 1;
    pthread_mutex_unlock(&m->sched->mu);
}

void tl_request_finish(tl_model *m, tl_request *r, int reason) {
    tl_request_stop(m, r, 1);
    set_done(m, r, reason);
    m->sched->st.requests_finished++;
}

void tl_request_fail(tl_model *m, tl_request *r, int code, const char *msg) {
    tl_request_stop(m, r, 0);
    pthread_mutex_lock(&m->sched->mu);
    if (r->state == TL_REQ_QUEUED) m->sched->n_queued--;
    r->state = TL_REQ_FAILED;
    r->finish = TL_FINISH_ERROR;
    r->error = code;
    r->news = 1;
    snprintf(r->errmsg, sizeof r->errmsg, "%s", msg);
    pthread_mutex_unlock(&m->sched->mu);
}

/* Back to the queue (KV short): its KV is dropped and recomputed later. */
void tl_request_requeue(tl_model *m, tl_request *r) {
    tl_request_stop(m, r, 0);
    r->n_cached = 0;
    pthread_mutex_lock(&m->sched->mu);
    r->state = TL_REQ_QUEUED;
    m->sched->n_queued++;
    pthread_mutex_unlock(&m->sched->mu);
}


/* The sampling fields are valid (a sampler accepts them); TL_OK or the error. */
static int check_sampling(const tl_sampling_params *sp) {
    tl_sampler probe;
    int rc = tl_sampler_init(&probe, sp, 1);
    if (rc == TL_OK) tl_sampler_free(&probe);
    return rc;
}

int tl_request_submit(tl_model *m, const int32_t *prompt, int n_prompt, const tl_generate_params *p, tl_pool *pool,
                      int64_t *id_out) {
    if (!m || !p || !id_out) return tl_set_error(TL_ERR_INVALID_ARG, "model, params and id_out must not be NULL");
    if (!m->arch) return tl_set_error(TL_ERR_STATE, "model was opened vocab_only; it cannot generate");
    int rc = tl_request_check_prompt(m, prompt, n_prompt, p->max_tokens);
    if (rc) return rc;
    if (p->loops < 0) return tl_set_error(TL_ERR_INVALID_ARG, "loops %d must be >= 0", p->loops);
    if (p->cache_window < 0) return tl_set_error(TL_ERR_INVALID_ARG, "cache_window %d must be >= 0", p->cache_window);
    if (p->tenant < 0) return tl_set_error(TL_ERR_INVALID_ARG, "tenant %d must be >= 0", p->tenant);
    if (pool && (rc = tl_pool_bind(pool, m))) return rc;
    if ((rc = check_sampling(&p->sampling))) return rc;
    tl_request *r = tl_request_new(m, prompt, n_prompt, p);
    if (!r) return TL_ERR_NOMEM;
    r->pool = pool;
    return tl_request_enqueue(m, r, id_out);
}

/* A queued request for prompt (room for max_tokens more), or NULL with the
 * error set. */
tl_request *tl_request_new(tl_model *m, const int32_t *prompt, int n_prompt, const tl_generate_params *p) {
    tl_request *r = calloc(1, sizeof *r);
    if (r) r->tokens = malloc(((size_t)n_prompt + (size_t)p->max_tokens) * sizeof *r->tokens);
    if (!r || !r->tokens) {
        free(r);
        tl_set_error(TL_ERR_NOMEM, "out of memory for a request of %d tokens", n_prompt);
        return NULL;
    }
    memcpy(r->tokens, prompt, (size_t)n_prompt * sizeof *prompt);
    r->n_prompt = n_prompt;
    r->p = *p;
    r->p.loops = tl_model_effective_loops(m, p->loops);
    r->rng = p->sampling.seed;
    r->ns = -1;
    r->state = TL_REQ_QUEUED;
    return r;
}

/* Queues r (taking it) unless the queue is full; wakes the engine. */
int tl_request_enqueue(tl_model *m, tl_request *r, int64_t *id_out) {
    tl_sched *s = m->sched;
    pthread_mutex_lock(&s->mu);
    int rc = TL_OK;
    if (s->n_queued >= s->max_queue) {
        rc = tl_set_error(TL_ERR_BUSY, "queue full: %d requests waiting (max_queue %d)", s->max_queue, s->max_queue);
    } else if (s->n_in == s->cap_in) {
        int cap = s->cap_in ? s->cap_in * 2 : 16;
        tl_request **v = realloc(s->incoming, (size_t)cap * sizeof *v);
        if (!v) rc = tl_set_error(TL_ERR_NOMEM, "out of memory for requests");
        else {
            s->incoming = v;
            s->cap_in = cap;
        }
    }
    if (rc) {
        pthread_mutex_unlock(&s->mu);
        free(r->tokens);
        free(r);
        return rc;
    }
    r->id = s->next_id++;
    s->incoming[s->n_in++] = r;
    s->n_queued++;
    *id_out = r->id;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return TL_OK;
}

int tl_request_submit_build(tl_model *m, tl_pool *pool, const int32_t *tokens, int n, int loops, int window,
                            int64_t *id_out) {
    tl_generate_params p = tl_generate_default_params();
    p.max_tokens = 0;
    p.loops = loops;
    p.cache_window = window;
    if (pool) tl_pool_key(pool, &p.salt, &p.tenant);
    tl_request *r = tl_request_new(m, tokens, n, &p);
    if (!r) return TL_ERR_NOMEM;
    r->kind = pool ? TL_RK_REGISTER : TL_RK_PIN;
    r->reg_pool = pool;
    return tl_request_enqueue(m, r, id_out);
}

int tl_request_submit_beam(tl_model *m, const int32_t *prompt, int n, const tl_generate_params *p, tl_pool *pool,
                           int beams, float alpha, int64_t *id_out) {
    tl_request *r = tl_request_new(m, prompt, n, p);
    if (!r) return TL_ERR_NOMEM;
    r->kind = TL_RK_BEAM;
    r->beams = beams;
    r->alpha = alpha;
    r->pool = pool;
    return tl_request_enqueue(m, r, id_out);
}

int tl_request_submit_resume(tl_model *m, const int32_t *prompt, int n, const tl_resume_view *v,
                             const tl_generate_params *p, int64_t *id_out) {
    int rc = check_sampling(&p->sampling);
    if (rc) return rc;
    tl_request *r = tl_request_new(m, prompt, n, p);
    if (!r) return TL_ERR_NOMEM;
    r->kind = TL_RK_RESUME;
    r->resume = *v;
    r->p.no_cache = 1; /* its KV is the handle's plus private blocks: nothing to insert */
    return tl_request_enqueue(m, r, id_out);
}

/* A build request (TL_RK_REGISTER, TL_RK_PIN) has its prefix in KV:
 * insert it with its last logits, pin it (in its pool, whose policy then
 * makes room, or for the waiting caller) and end the request. */
void tl_request_complete_build(tl_model *m, tl_request *r) {
    tl_radix_node *node = tl_radix_insert(&m->cache, r->ns, r->tokens, r->n_prompt, &r->seq->bt, r->p.tenant);
    if (!node) {
        tl_request_fail(m, r, TL_ERR_NOMEM, "out of memory inserting a prefix into the cache");
        return;
    }
    if (!node->logits) { /* a prompt equal to the entry then computes nothing */
        node->logits = r->reg_logits;
        r->reg_logits = NULL;
    }
    if (r->kind == TL_RK_PIN) {
        node->pin++;
        r->pinned = node;
    } else if (r->reg_pool &&
               tl_pool_add_built(r->reg_pool, r->tokens, r->n_prompt, r->p.loops, r->p.cache_window, node) < 0) {
        tl_request_fail(m, r, tl_last_error_code(), tl_last_error());
        return;
    }
    tl_cache_persist_path(m, node); /* a pinned prefix survives a restart */
    tl_request_stop(m, r, 0);
    set_done(m, r, TL_FINISH_LENGTH);
}

int tl_request_take(tl_model *m, int64_t id, int32_t *out, int cap, int *finished) {
    if (finished) *finished = 0;
    if (!m || (cap > 0 && !out) || cap < 0) return tl_set_error(TL_ERR_INVALID_ARG, "take: bad arguments (cap %d)", cap);
    tl_sched *s = m->sched;
    pthread_mutex_lock(&s->mu);
    tl_request *r = tl_request_find(m, id);
    if (!r) {
        pthread_mutex_unlock(&s->mu);
        return tl_set_error(TL_ERR_INVALID_ARG, "no request with id %lld", (long long)id);
    }
    int n = r->n_gen - r->n_taken;
    if (n > cap) n = cap;
    if (n > 0) memcpy(out, r->tokens + r->n_prompt + r->n_taken, (size_t)n * sizeof *out);
    r->n_taken += n;
    int ended = r->state >= TL_REQ_DONE && r->n_taken == r->n_gen;
    int failed = ended && r->state == TL_REQ_FAILED && n == 0, err = r->error;
    char msg[256];
    if (failed) snprintf(msg, sizeof msg, "%s", r->errmsg);
    pthread_mutex_unlock(&s->mu);
    if (finished) *finished = ended;
    if (failed) return tl_set_error(err, "%s", msg);
    return n;
}

int tl_request_get_info(const tl_model *m, int64_t id, tl_request_info *o) {
    if (!m || !o) return tl_set_error(TL_ERR_INVALID_ARG, "model and out must not be NULL");
    tl_sched *s = m->sched;
    pthread_mutex_lock(&s->mu);
    const tl_request *r = tl_request_find(m, id);
    if (r)
        *o = (tl_request_info){.state = r->state, .finish_reason = r->finish, .n_prompt = r->n_prompt,
                               .n_generated = r->n_gen, .n_taken = r->n_taken, .n_cached = r->n_cached,
                               .error = r->error};
    pthread_mutex_unlock(&s->mu);
    if (!r) return tl_set_error(TL_ERR_INVALID_ARG, "no request with id %lld", (long long)id);
    return TL_OK;
}

int tl_request_wait_news(tl_model *m, int64_t id) {
    tl_sched *s = m->sched;
    int rc = TL_OK;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        tl_request *r = tl_request_find(m, id);
        if (!r) {
            rc = tl_set_error(TL_ERR_INVALID_ARG, "no request with id %lld", (long long)id);
            break;
        }
        if (r->n_gen > r->n_taken || r->state >= TL_REQ_DONE) break;
        if (!s->engine_running) {
            rc = tl_set_error(TL_ERR_STATE, "the engine stopped while request %lld was running", (long long)id);
            break;
        }
        pthread_cond_wait(&s->done_cv, &s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}
