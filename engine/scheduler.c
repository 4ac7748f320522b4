/* scheduler.c - the scheduler step, and the request calls that need it.
 *
 * A step admits queued requests (longest cached prefix: share its blocks,
 * lock its path; reserve what they may still need), then runs one batched
 * forward pass per loop depth: prefilling requests contribute a chunk of
 * their prompt (a shared budget per step), running ones their last token,
 * a beam search one sequence per live beam. Requests whose prompt is done
 * sample a token; a build (register, pin) inserts and pins its prefix
 * instead, a search steps its beams from their rows. A resume request's
 * prompt runs in a pass of its own (it starts at the loop block). Finished
 * requests insert prompt + output into the cache and unlock their path.
 * Synchronous callers submit and wait (tl_sched_wait). */
#include "scheduler.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "beam.h"
#include "cache_tier.h"
#include "chat.h"
#include "forward.h"
#include "pool.h"
#include "util.h"

#define PREFILL_BUDGET 512
/* A queued request gains one priority level per this many steps waited. */
#define AGING_STEPS 64

int tl_sched_init(tl_model *m) {
    tl_sched *s = calloc(1, sizeof *s);
    if (!s) return tl_set_error(TL_ERR_NOMEM, "out of memory");
    m->sched = s;
    s->next_id = 1;
    s->prefill_budget = PREFILL_BUDGET;
    s->aging_steps = AGING_STEPS;
    s->max_queue = 1024;
    s->notify_rd = s->notify_wr = s->notify_ext = -1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->compute_mu, NULL);
    pthread_mutex_init(&s->ext_mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_cond_init(&s->done_cv, NULL);
    tl_sampling_params greedy = {.top_p = 1.0f, .repeat_penalty = 1.0f};
    return tl_sampler_init(&s->smp, &greedy, m->hp.n_vocab);
}

static void batch_free(tl_batch *b);

void tl_sched_compute_lock(tl_model *m) { pthread_mutex_lock(&m->sched->compute_mu); }
void tl_sched_compute_unlock(tl_model *m) { pthread_mutex_unlock(&m->sched->compute_mu); }

/* The engine thread is stopped (tl_model_close stops it first). */
void tl_sched_free(tl_model *m) {
    tl_sched *s = m->sched;
    if (!s) return;
    tl_sched_apply_msgs(m); /* any posted while the engine stopped */
    free(s->msgs);
    for (int i = 0; i < s->n; i++) tl_request_free(m, s->reqs[i]);
    for (int i = 0; i < s->n_in; i++) tl_request_free(m, s->incoming[i]);
    free(s->incoming);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->compute_mu);
    pthread_mutex_destroy(&s->ext_mu);
    pthread_cond_destroy(&s->cv);
    pthread_cond_destroy(&s->done_cv);
    tl_pool_detach_all(m);
    free(s->reqs);
    batch_free(&s->batch);
    free(s->logits);
    free(s->dev_smp);
    free(s->dev_ids);
    free(s->dev_pen);
    free(s->dev_rng);
    tl_sampler_free(&s->smp);
    free(s);
    m->sched = NULL;
}

void tl_sched_forget_pool(tl_model *m, tl_pool *pool) {
    tl_sched *s = m->sched;
    pthread_mutex_lock(&s->mu);
    /* requests in flight stop counting against a freed pool; its pending
     * registrations still cache their prefix, unpinned */
    for (int k = 0; k < 2; k++) {
        tl_request **v = k ? s->incoming : s->reqs;
        for (int i = 0, n = k ? s->n_in : s->n; i < n; i++) {
            if (v[i]->pool == pool) v[i]->pool = NULL;
            if (v[i]->reg_pool == pool) {
                v[i]->reg_pool = NULL;
                v[i]->reg_orphan = 1;
            }
        }
    }
    pthread_mutex_unlock(&s->mu);
}

/* The node of a match of L tokens (node contains position L - 1) seen as
 * a match of L - 1: the node containing position L - 2. */
static tl_radix_node *one_shorter(tl_radix_node *node, int L) {
    if (L <= 1) return NULL;
    return node->start < L - 1 ? node : node->parent;
}

static int ensure_logits(tl_sched *s, int rows, int n_vocab);

/* A prompt through a pool that ends exactly at a node keeping its last
 * logits (a pinned entry's) computes nothing: its first token is drawn
 * from a copy of them now and accepted once the request runs. */
static int full_match(tl_model *m, tl_request *r, tl_radix_node *node, int L) {
    tl_sched *s = m->sched;
    int nv = m->hp.n_vocab;
    if (r->kind != TL_RK_GENERATE || !r->pool || r->p.max_tokens < 1 || L != r->n_prompt || !node || !node->logits ||
        node->start + node->n_tokens != L || ensure_logits(s, 1, nv))
        return 0;
    memcpy(s->logits, node->logits, (size_t)nv * sizeof *s->logits); /* the sampler works in place */
    s->smp.p = r->p.sampling;
    s->smp.rng = r->rng;
    r->first_tok = tl_sampler_sample(&s->smp, s->logits, r->tokens, r->n_prompt);
    r->first_rng = s->smp.rng;
    return 1;
}

/* A resume request's sequence at its depth: the prelude layers share the
 * handle's blocks, the loop-block layers get fresh ones (room made through
 * the cache); KV full when they do not fit. */
static int resume_seq(tl_model *m, tl_request *r) {
    const tl_resume_view *v = &r->resume;
    int rc = tl_seq_new(m, r->p.loops, &r->seq);
    if (rc) return rc;
    tl_seq *seq = r->seq;
    int depth = seq->bt.depth, fresh = v->n_lb * (depth - v->prelude);
    if (!tl_cache_make_room(m, fresh))
        return tl_set_error(TL_ERR_KV_FULL, "KV cache full: resuming %d tokens at loops %d needs %d blocks, %d free",
                            r->n_prompt, r->p.loops, fresh, m->kv.n_free);
    seq->bt.ids = malloc((size_t)v->n_lb * (size_t)depth * sizeof *seq->bt.ids);
    if (!seq->bt.ids) return tl_set_error(TL_ERR_NOMEM, "out of memory");
    seq->bt.cap_logical = seq->bt.n_logical = v->n_lb;
    for (int lb = 0; lb < v->n_lb; lb++)
        for (int vl = 0; vl < depth; vl++) {
            int id = vl < v->prelude ? v->blocks[lb * v->prelude + vl] : tl_kv_alloc(&m->kv);
            if (vl < v->prelude) tl_kv_ref(&m->kv, id);
            seq->bt.ids[lb * depth + vl] = id;
        }
    return TL_OK;
}

/* Longest cached prefix: share its blocks and lock its path. The last
 * prompt token is computed for its logits unless a full match through a
 * pool finds them kept (full_match). */
static int admit(tl_model *m, tl_request *r) {
    tl_sched *s = m->sched;
    r->first_tok = -1;
    if (r->kind == TL_RK_RESUME) return resume_seq(m, r);
    if (r->kind == TL_RK_BEAM) {
        if (!(r->beam = tl_beam_new(r->beams, r->alpha, r->p.max_tokens, m->hp.n_vocab)))
            return tl_set_error(TL_ERR_NOMEM, "out of memory for %d beams over a vocab of %d", r->beams,
                                m->hp.n_vocab);
        r->beam->base = m->kv.n_blocks - m->kv.n_free;
    }
    int rc = tl_seq_new(m, r->p.loops, &r->seq);
    if (rc) return rc;
    r->seq->window = r->p.cache_window;
    if (r->p.no_cache) return TL_OK;
    r->ns = tl_cache_namespace(m, r->p.loops, r->p.cache_window, r->p.salt);
    if (r->ns < 0) return TL_ERR_NOMEM;
    tl_radix_node *node = NULL;
    int L = r->pool ? tl_pool_scoped_match(r->pool, r->tokens, r->n_prompt, r->p.loops, r->p.cache_window,
                                           r->p.salt, &node)
                    : -1;
    int scoped = L >= 0; /* scope "pool": only the pool's own entries */
    if (!scoped) L = tl_radix_match(&m->cache, r->ns, r->tokens, r->n_prompt, r->n_prompt, &node);
    /* what a tier below the arena holds after the match comes back up */
    if (!scoped && tl_cache_restore(m, r->ns, r->tokens, r->n_prompt, L, node, r->p.tenant))
        L = tl_radix_match(&m->cache, r->ns, r->tokens, r->n_prompt, r->n_prompt, &node);
    /* Without kept logits the last prompt token is computed for them. */
    if (L == r->n_prompt && !full_match(m, r, node, L)) node = one_shorter(node, L--);
    /* a salted request may also reuse shareable (operator) prefixes */
    if (r->p.salt != 0 && !scoped && r->first_tok < 0) {
        int ns0 = tl_cache_namespace(m, r->p.loops, r->p.cache_window, 0);
        tl_radix_node *n0 = NULL;
        int L0 = ns0 >= 0 ? tl_radix_match(&m->cache, ns0, r->tokens, r->n_prompt, r->n_prompt - 1, &n0) : 0;
        tl_radix_namespace_release(&m->cache, ns0); /* n0 stays: its nodes keep ns0 alive */
        /* the deepest shareable node whose tokens all matched */
        for (; n0 && n0->parent; n0 = n0->parent)
            if (n0->shareable > 0 && n0->start + n0->n_tokens <= L0) break;
        if (n0 && n0->parent && n0->start + n0->n_tokens > L) {
            L = n0->start + n0->n_tokens;
            node = n0;
        }
    }
    /* A build reuses what is cached but is no lookup of the cache's
     * users: it counts in no hit statistics. */
    int counted = !tl_request_is_build(r);
    s->st.lookups += counted;
    /* Any failure to reuse the cache falls through to computing everything.
     * The share may shorten the match where sliding-window layers dropped
     * positions the next token would read. */
    if (L > 0 && (L = tl_radix_share(&m->cache, &node, L, &r->seq->bt)) > 0) {
        if (counted) tl_pool_attribute_hit(m, node, L);
        node = tl_radix_cut(&m->cache, node, L);
        tl_radix_lock(node, 1);
        r->locked = node;
        r->seq->n_pos = L;
        r->n_cached = L;
        s->st.hits += counted;
        s->st.hit_tokens += counted ? L : 0;
        s->st.prefill_tokens_saved += L;
    }
    if (r->n_cached < r->n_prompt) r->first_tok = -1; /* the share failed: compute it all */
    if (r->pool) tl_pool_count_lookup(r->pool);
    return TL_OK;
}

/* ---- the step ------------------------------------------------------------------------------ */

static int ensure_logits(tl_sched *s, int rows, int n_vocab) {
    if (rows <= s->logits_rows) return 0;
    float *l = realloc(s->logits, (size_t)rows * (size_t)n_vocab * sizeof *l);
    if (!l) return -1;
    s->logits = l;
    s->logits_rows = rows;
    return 0;
}

static void accept_token(tl_model *m, tl_request *r, int tok) {
    tl_sched *s = m->sched;
    s->st.generated_tokens++;
    if (tl_model_is_eog(m, tok) && !r->p.ignore_eos) {
        tl_request_finish(m, r, TL_FINISH_EOS);
        return;
    }
    pthread_mutex_lock(&s->mu);
    r->tokens[r->n_prompt + r->n_gen++] = tok;
    r->news = 1;
    pthread_mutex_unlock(&s->mu);
    if (r->n_gen == r->p.max_tokens) tl_request_finish(m, r, TL_FINISH_LENGTH);
}

static void sample_into(tl_model *m, tl_request *r, float *logits) {
    tl_sched *s = m->sched;
    s->smp.p = r->p.sampling;
    s->smp.rng = r->rng;
    int tok = tl_sampler_sample(&s->smp, logits, r->tokens, r->n_prompt + r->n_gen);
    r->rng = s->smp.rng;
    accept_token(m, r, tok);
}

/* A registration's last prompt position: its logits go with the entry
 * (complete_register). Without memory the entry just keeps none. */
static void keep_reg_logits(tl_model *m, tl_request *r, const float *logits) {
    size_t bytes = (size_t)m->hp.n_vocab * sizeof *logits;
    if (!r->reg_logits) r->reg_logits = malloc(bytes);
    if (r->reg_logits) memcpy(r->reg_logits, logits, bytes);
}

/* The top_k a request's chain selects from (0 or > n_vocab: the vocab). */
static int effective_top_k(const tl_request *r, int n_vocab) {
    int k = r->p.sampling.top_k;
    return k <= 0 || k > n_vocab ? n_vocab : k;
}

/* Fills s->dev_smp for the wanted rows of a batch on a backend that
 * samples on its device: rows whose chain fits (greedy, or top_k within
 * the backend's limit) get their parameters, the host's draw and their
 * penalty ids; the others come back as logits. Each row's generator state
 * after the draw waits in dev_rng until its token is accepted, so a batch
 * retried after a failure draws the same numbers. */
static int device_sampling(tl_model *m, tl_request *const *rq, const int *want, int nb, int rows) {
    tl_sched *s = m->sched;
    int max_k = tl_backend_sample_k(m), nv = m->hp.n_vocab;
    size_t pen = 0;
    for (int i = 0; i < nb; i++)
        if (want[i]) pen += (size_t)(rq[i]->n_prompt + rq[i]->n_gen);
    if (pen > INT32_MAX) pen = INT32_MAX;
    if (rows > s->dev_rows_cap) {
        free(s->dev_smp);
        free(s->dev_ids);
        free(s->dev_rng);
        s->dev_smp = malloc((size_t)rows * sizeof *s->dev_smp);
        s->dev_ids = malloc((size_t)rows * sizeof *s->dev_ids);
        s->dev_rng = malloc((size_t)rows * sizeof *s->dev_rng);
        s->dev_rows_cap = s->dev_smp && s->dev_ids && s->dev_rng ? rows : 0;
    }
    if ((int)pen > s->dev_pen_cap) {
        free(s->dev_pen);
        s->dev_pen = malloc(pen * sizeof *s->dev_pen);
        s->dev_pen_cap = s->dev_pen ? (int)pen : 0;
    }
    if (s->dev_rows_cap < rows || s->dev_pen_cap < (int)pen)
        return tl_set_error(TL_ERR_NOMEM, "out of memory for device sampling of %d rows", rows);
    int row = 0, off = 0;
    for (int i = 0; i < nb; i++) {
        if (!want[i]) continue;
        const tl_request *r = rq[i];
        const tl_sampling_params *p = &r->p.sampling;
        tl_backend_sample *d = &s->dev_smp[row];
        memset(d, 0, sizeof *d);
        int k = effective_top_k(r, nv);
        /* a registration keeps its logits; a beam search reads all of them */
        if ((p->temperature > 0 && k > max_k) || tl_request_keeps_logits(r) || r->kind == TL_RK_BEAM) {
            row++;
            continue;
        }
        d->on_device = 1;
        d->top_k = p->temperature > 0 ? k : 1;
        d->temperature = p->temperature;
        d->top_p = p->top_p;
        d->min_p = p->min_p;
        d->repeat_penalty = p->repeat_penalty;
        uint64_t rng = r->rng;
        d->u = p->temperature > 0 ? tl_sampler_uniform(&rng) : 0.0f;
        s->dev_rng[row] = rng;
        s->smp.p = *p;
        d->n_penalty = tl_sampler_penalty_ids(&s->smp, r->tokens, r->n_prompt + r->n_gen, s->dev_pen + off);
        d->penalty_ids = s->dev_pen + off;
        off += d->n_penalty;
        row++;
    }
    return TL_OK;
}

/* A request with a cache_window never reads KV older than its window
 * again: once two whole blocks lie behind it, they are released, so its KV
 * stays proportional to the window. Its tokens are then no longer
 * inserted into the cache (the tree records the drops of sliding-window
 * layers, tl_seq_drop_behind_windows, not of whole logical blocks). */
static void drop_behind_window(tl_model *m, tl_request *r) {
    if (!r->seq || r->p.cache_window <= 0 || tl_request_is_build(r)) return;
    int lb_end = (r->seq->n_pos - r->p.cache_window + 1) / m->kv.block_size;
    if (lb_end >= 2) tl_block_table_drop_before(&r->seq->bt, &m->kv, lb_end);
}

/* Priority plus one level per aging_steps steps waited: a steady stream of
 * higher-priority requests delays a low-priority one, but cannot keep it out
 * forever (the clock starts when admission first sees it). */
static int64_t effective_priority(const tl_sched *s, tl_request *r) {
    if (!r->queued_step) r->queued_step = s->steps;
    return (int64_t)r->p.priority + (s->steps - r->queued_step) / s->aging_steps;
}

/* Adds one sequence's part of the pass to the batch. */
static void batch_add(tl_batch *b, int *nb, tl_request *r, tl_seq *seq, const int32_t *toks, int n, int want,
                      int prompt_part) {
    int i = (*nb)++;
    b->rq[i] = r;
    b->seqs[i] = seq;
    b->toks[i] = toks;
    b->ntok[i] = n;
    b->want[i] = want;
    b->prompt_part[i] = prompt_part;
}

/* Takes every entry of r out of the batch (a failed pass drops it). */
static void batch_drop(tl_batch *b, int *nb, const tl_request *r) {
    int k = 0;
    for (int i = 0; i < *nb; i++) {
        if (b->rq[i] == r) continue;
        b->rq[k] = b->rq[i];
        b->seqs[k] = b->seqs[i];
        b->toks[k] = b->toks[i];
        b->ntok[k] = b->ntok[i];
        b->want[k] = b->want[i];
        b->prompt_part[k] = b->prompt_part[i];
        k++;
    }
    *nb = k;
}

/* The batch arrays hold cap sequences: they grow when a step needs more
 * than any step before (doubling), so steady decoding allocates nothing. */
static int batch_reserve(tl_batch *b, int cap) {
    if (cap <= b->cap) return 0;
    if (cap < 2 * b->cap) cap = 2 * b->cap;
#define GROW(f)                                                        \
    do {                                                               \
        void *p_ = realloc((void *)b->f, (size_t)cap * sizeof *b->f); \
        if (!p_) return -1;                                            \
        b->f = p_;                                                     \
    } while (0)
    GROW(rq);
    GROW(seqs);
    GROW(toks);
    GROW(ntok);
    GROW(want);
    GROW(prompt_part);
#undef GROW
    b->cap = cap;
    return 0;
}

/* A beam search past its prompt runs one sequence per live beam. */
static int searching(const tl_request *r) { return r->kind == TL_RK_BEAM && r->beam && r->beam->n_cur > 0; }

/* Whether a request has delivered or chosen tokens (it cannot go back to
 * the queue without losing them). */
static int progressed(const tl_request *r) { return r->n_gen > 0 || searching(r); }

/* The prompt of a beam request is in KV: it goes into the cache (unless
 * no_cache) and becomes the search's first beam, which then steps from the
 * prompt's logits row. */
static void beam_begin(tl_model *m, tl_request *r) {
    if (r->ns >= 0) {
        tl_radix_insert(&m->cache, r->ns, r->tokens, r->n_prompt, &r->seq->bt, r->p.tenant);
        tl_radix_enforce_budget(&m->cache, r->p.tenant);
    }
    tl_beam_start(r->beam, r->seq);
    r->seq = NULL;
}

/* One step of a search from its live beams' rows; at the end the best
 * sequence is delivered as the request's tokens. */
static void beam_step(tl_model *m, tl_request *r, const float *rows) {
    tl_beam *b = r->beam;
    int rc = tl_beam_advance(m, b, rows, r->p.ignore_eos);
    tl_beam_note_peak(m, b);
    if (rc < 0) {
        tl_request_fail(m, r, rc, tl_last_error());
        return;
    }
    if (rc == 0) return;
    tl_beam_result res;
    int n = tl_beam_result_of(b, &res);
    res.n_cached = r->n_cached;
    pthread_mutex_lock(&m->sched->mu);
    memcpy(r->tokens + r->n_prompt, b->best_toks, (size_t)n * sizeof *r->tokens);
    r->n_gen = n;
    r->beam_res = res;
    pthread_mutex_unlock(&m->sched->mu);
    m->sched->st.generated_tokens += n;
    tl_request_finish(m, r, res.finish_reason);
}

/* A resume request's prompt runs alone: its first pass starts at the loop
 * block from the handle's hidden states (no other sequence could share
 * that pass); its decode steps then batch with everyone's. */
static int in_resume_prefill(const tl_request *r) {
    return r->kind == TL_RK_RESUME && r->seq && r->seq->n_pos < r->n_prompt;
}

static void run_resume_prefill(tl_model *m, tl_request *r) {
    tl_sched *s = m->sched;
    int n = r->n_prompt - r->seq->n_pos, want = 1;
    if (ensure_logits(s, 1, m->hp.n_vocab)) {
        tl_request_fail(m, r, TL_ERR_NOMEM, "out of memory for a row of logits");
        return;
    }
    int D = m->hp.n_embd;
    tl_forward_opts fo = {.want_logits = &want,
                          .vl_begin = r->resume.prelude,
                          .x_in = r->resume.x + (size_t)r->seq->n_pos * D,
                          .vl_capture = -1};
    const int32_t *t = r->tokens + r->seq->n_pos;
    tl_cache_reserve(m, &r->seq, &n, 1); /* short: the pass fails with KV full */
    int rc = tl_forward(m, &r->seq, &t, &n, 1, s->logits, &fo);
    if (rc) {
        tl_request_fail(m, r, rc, tl_last_error());
        return;
    }
    tl_seq_drop_behind_windows(m, r->seq);
    s->st.prefill_tokens += n;
    if (r->p.max_tokens > 0) sample_into(m, r, s->logits);
    else tl_request_finish(m, r, TL_FINISH_LENGTH);
}

/* One forward pass over the running requests of one loop depth. */
static int run_group(tl_model *m, int loops) {
    tl_sched *s = m->sched;
    tl_batch *b = &s->batch;
    int nb = 0, budget = s->prefill_budget, rc, need = 0;
    int room = tl_backend_max_tokens(m); /* a backend takes at most this many tokens per pass */
    for (int i = 0; i < s->n; i++) need += searching(s->reqs[i]) ? s->reqs[i]->beam->n_cur : 1;
    if (batch_reserve(b, need)) return tl_set_error(TL_ERR_NOMEM, "out of memory for a batch of %d sequences", need);
    for (int i = 0; i < s->n; i++) {
        tl_request *r = s->reqs[i];
        if (r->state != TL_REQ_RUNNING || r->p.loops != loops || in_resume_prefill(r)) continue;
        if (searching(r)) {
            tl_beam *bm = r->beam;
            if (room < bm->n_cur) continue; /* its beams wait for the next step, together */
            room -= bm->n_cur;
            for (int k = 0; k < bm->n_cur; k++)
                batch_add(b, &nb, r, bm->cur[k].seq, &bm->cur[k].toks[bm->cur[k].n - 1], 1, 1, 0);
            continue;
        }
        int pos = r->seq->n_pos, total = r->n_prompt + r->n_gen, n;
        if (pos < r->n_prompt) {
            n = r->n_prompt - pos;
            if (n > budget) n = budget > 0 ? budget : (nb == 0 ? n : 0);
            if (n == 0) continue;
            budget -= n;
        } else {
            n = 1;
        }
        if (n > room) n = r->seq->n_pos < r->n_prompt ? room : 0; /* the rest waits for the next step */
        if (n == 0) continue;
        room -= n;
        batch_add(b, &nb, r, r->seq, r->tokens + pos, n, pos + n == total && !r->reg_orphan,
                  pos < r->n_prompt ? n : 0);
    }
    rc = TL_OK;
    while (nb > 0) {
        int rows = 0;
        for (int i = 0; i < nb; i++) rows += b->want[i];
        if (ensure_logits(s, rows, m->hp.n_vocab))
            return tl_set_error(TL_ERR_NOMEM, "out of memory for %d rows of logits", rows);
        tl_forward_opts fo = {.want_logits = b->want, .vl_capture = -1};
        if (rows && tl_backend_sample_k(m) > 0) {
            if ((rc = device_sampling(m, b->rq, b->want, nb, rows))) return rc;
            fo.sample = s->dev_smp;
            fo.ids_out = s->dev_ids;
        }
        tl_cache_reserve(m, b->seqs, b->ntok, nb); /* short: the pass fails with KV full */
        double t0 = tl_now();
        rc = tl_forward(m, b->seqs, b->toks, b->ntok, nb, rows ? s->logits : NULL, &fo);
        if (rc == TL_OK) {
            int prompt = 0; /* the tiers weigh a restore against this speed */
            for (int i = 0; i < nb; i++) prompt += b->ntok[i] > 1 ? b->ntok[i] : 0;
            tl_cache_note_prefill(m, prompt, tl_now() - t0);
            break;
        }
        /* The batch does not fit. Locked cache paths go first: a running
         * request holds references on every block it uses, so its lock only
         * keeps the tree from evicting; dropping it can free memory. */
        int dropped = 0;
        for (int i = 0; i < nb; i++)
            if (b->rq[i]->locked) {
                tl_radix_lock(b->rq[i]->locked, -1);
                b->rq[i]->locked = NULL;
                dropped = 1;
            }
        if (dropped) continue;
        /* Then one request leaves the batch. One still in its prompt goes
         * back to the queue while others run (admission retries it when
         * blocks free up); one that has produced (or, searching, chosen)
         * tokens, or that is alone, fails with the error. Of those still in
         * their prompt, the lowest effective priority goes back (the
         * youngest among equals), so admission's order holds. */
        tl_request *victim = b->rq[nb - 1];
        for (int i = nb - 2; i >= 0; i--)
            if (!progressed(b->rq[i]) &&
                (progressed(victim) || effective_priority(s, b->rq[i]) < effective_priority(s, victim)))
                victim = b->rq[i];
        int alone = 1;
        for (int i = 0; i < nb; i++) alone &= b->rq[i] == victim;
        batch_drop(b, &nb, victim);
        if (!progressed(victim) && !alone) tl_request_requeue(m, victim);
        else tl_request_fail(m, victim, rc, tl_last_error());
        rc = TL_OK;
    }
    /* before anything finishes (inserting) or a search forks or frees its beams */
    for (int i = 0; i < nb; i++) tl_seq_drop_behind_windows(m, b->seqs[i]);
    const int nv = m->hp.n_vocab;
    int row = 0;
    for (int i = 0; i < nb; i++) {
        tl_request *r = b->rq[i];
        s->st.prefill_tokens += b->prompt_part[i];
        if (r->kind == TL_RK_BEAM && b->want[i]) {
            /* a search's rows are consecutive: its prompt's one, or one per live beam */
            int k = searching(r) ? r->beam->n_cur : 1;
            if (!searching(r)) beam_begin(m, r);
            beam_step(m, r, s->logits + (size_t)row * nv);
            row += k;
            i += k - 1;
            continue;
        }
        if (b->want[i] && tl_backend_sample_k(m) > 0 && s->dev_smp[row].on_device) {
            int tok = s->dev_ids[row++];
            if (tok < 0 || tok >= nv) {
                char msg[128];
                snprintf(msg, sizeof msg, "the %s backend sampled token id %d, outside the vocab [0, %d)",
                         tl_backend_name(m), tok, nv);
                tl_request_fail(m, r, TL_ERR_STATE, msg);
            } else {
                r->rng = s->dev_rng[row - 1];
                accept_token(m, r, tok);
            }
        } else if (b->want[i] && tl_request_keeps_logits(r)) {
            keep_reg_logits(m, r, s->logits + (size_t)row++ * nv);
        } else if (b->want[i]) {
            sample_into(m, r, s->logits + (size_t)row++ * nv);
        }
        if (tl_request_is_build(r) && r->seq && r->seq->n_pos == r->n_prompt) tl_request_complete_build(m, r);
        drop_behind_window(m, r);
    }
    return TL_OK;
}

static void batch_free(tl_batch *b) {
    free(b->rq);
    free(b->seqs);
    free((void *)b->toks);
    free(b->ntok);
    free(b->want);
    free(b->prompt_part);
}

/* Moves new submissions into the step's list and acts on cancel/release
 * flags set by other threads. */
static void merge_and_reap(tl_model *m) {
    tl_sched *s = m->sched;
    pthread_mutex_lock(&s->mu);
    if (s->n + s->n_in > s->cap) {
        int cap = s->cap ? s->cap : 16;
        while (cap < s->n + s->n_in) cap *= 2;
        tl_request **v = realloc(s->reqs, (size_t)cap * sizeof *v);
        if (v) {
            s->reqs = v;
            s->cap = cap;
        }
    }
    if (s->n_in > 0 && s->n + s->n_in <= s->cap) {
        memcpy(s->reqs + s->n, s->incoming, (size_t)s->n_in * sizeof *s->reqs);
        s->n += s->n_in;
        s->n_in = 0;
    }
    if (s->weights_pending) {
        m->cache.weights = s->weights;
        s->weights_pending = 0;
    }
    int pending = s->flags_pending;
    s->flags_pending = 0;
    pthread_mutex_unlock(&s->mu);
    if (!pending) return;
    for (int i = 0; i < s->n; i++) {
        tl_request *r = s->reqs[i];
        if ((r->cancel_req || r->release_req) && r->state <= TL_REQ_RUNNING) {
            tl_request_stop(m, r, 0);
            pthread_mutex_lock(&s->mu);
            if (r->state == TL_REQ_QUEUED) s->n_queued--;
            r->state = TL_REQ_CANCELLED;
            r->finish = TL_FINISH_CANCELLED;
            r->news = 1;
            pthread_mutex_unlock(&s->mu);
        }
        if (r->release_req) {
            pthread_mutex_lock(&s->mu);
            memmove(&s->reqs[i], &s->reqs[i + 1], (size_t)(s->n - i - 1) * sizeof *s->reqs);
            s->n--;
            pthread_mutex_unlock(&s->mu);
            tl_request_free(m, r);
            i--;
        }
    }
}

/* Most blocks a layer attending over the last w positions holds at once:
 * the window and one chunk written before the blocks behind it go.
 * Sliding-window layers release after every pass
 * (tl_seq_drop_behind_windows); a request's cache_window two blocks at a
 * time (drop_behind_window). */
static int window_blocks(int w, int chunk, int bs, int sliding) {
    return (w + chunk + bs - 1) / bs + (sliding ? 1 : 3);
}

/* Blocks a request may still allocate before it ends, per virtual layer:
 * the logical blocks of prompt + max_tokens less those it dropped, capped
 * by what a windowed layer holds at once, less those its table holds, plus
 * a private copy of a shared partial block it will write. */
static int blocks_to_come(const tl_model *m, const tl_request *r) {
    int bs = m->kv.block_size;
    if (searching(r)) { /* each live beam: the blocks its remaining tokens reach, plus a tail copy */
        const tl_beam *b = r->beam;
        return b->B * ((r->p.max_tokens - b->step + bs - 1) / bs + 1) * tl_model_depth(m, r->p.loops);
    }
    /* a search still in its prompt: every beam but the first may copy the
     * prompt's partial block and reach max_tokens further */
    int beam_tails = r->kind == TL_RK_BEAM ? (r->beams - 1) * ((r->n_prompt + r->p.max_tokens + bs - 1) / bs -
                                                                r->n_prompt / bs) * r->seq->bt.depth
                                           : 0;
    const tl_block_table *bt = &r->seq->bt;
    int chunk = r->n_prompt < m->sched->prefill_budget ? r->n_prompt : m->sched->prefill_budget;
    int total = (r->n_prompt + r->p.max_tokens + bs - 1) / bs, lb = r->seq->n_pos / bs, need = 0;
    for (int vl = 0; vl < bt->depth; vl++) {
        int held = tl_block_table_held(bt, vl), final = total - (bt->n_logical - held);
        int w = tl_model_vl_window(m, r->seq->loops, r->p.cache_window, vl);
        if (w > 0) {
            int sliding = tl_model_vl_window(m, r->seq->loops, 0, vl) > 0;
            int most = window_blocks(w, chunk, bs, sliding);
            if (final > most) final = most;
        }
        if (final > held) need += final - held;
        int id = lb < bt->n_logical ? bt->ids[lb * bt->depth + vl] : -1;
        need += id >= 0 && m->kv.refcnt[id] > 1;
    }
    return need + beam_tails;
}

/* Under KV pressure the running requests' locks on their matched cache
 * paths go, and also's: a request holds references on every block it
 * uses, so its lock only keeps the tree from evicting (run_group does the
 * same mid-step). Returns whether any lock was dropped. */
static int drop_path_locks(tl_model *m, tl_request *also) {
    int dropped = 0;
    for (int i = 0; i < m->sched->n; i++) {
        tl_request *r = m->sched->reqs[i];
        if (r->locked && (r->state == TL_REQ_RUNNING || r == also)) {
            tl_radix_lock(r->locked, -1);
            r->locked = NULL;
            dropped = 1;
        }
    }
    return dropped;
}

/* Admits queued requests by effective priority (aged), then submission order, while the
 * blocks they may need through max_tokens fit in KV memory next to what
 * the running requests still may need (evicting unused cache): a request
 * admitted never runs out of KV half-way. The rest wait. A request that
 * cannot fit even with nothing else running fails. */
static void admit_queued(tl_model *m) {
    tl_sched *s = m->sched;
    int running = 0, reserved = 0;
    for (int i = 0; i < s->n; i++)
        if (s->reqs[i]->state == TL_REQ_RUNNING && s->reqs[i]->seq) {
            running++;
            reserved += blocks_to_come(m, s->reqs[i]);
        }
    for (;;) {
        tl_request *best = NULL;
        for (int i = 0; i < s->n; i++) {
            tl_request *r = s->reqs[i];
            if (r->state == TL_REQ_QUEUED && (!best || effective_priority(s, r) > effective_priority(s, best)))
                best = r;
        }
        if (!best) return;
        int rc = admit(m, best);
        if (rc == TL_ERR_KV_FULL && running > 0) { /* a resume's fresh blocks: wait for the running ones */
            tl_request_stop(m, best, 0);
            return;
        }
        if (rc) {
            tl_request_fail(m, best, rc, tl_last_error());
            continue;
        }
        int need = blocks_to_come(m, best);
        if (!tl_cache_make_room(m, need + reserved) && drop_path_locks(m, best)) tl_cache_make_room(m, need + reserved);
        if (need + reserved > m->kv.n_free) {
            if (running == 0) {
                char msg[256];
                snprintf(msg, sizeof msg,
                         "KV cache full: a prompt of %d tokens + max_tokens %d needs %d blocks, %d of %d free with "
                         "nothing else running",
                         best->n_prompt, best->p.max_tokens, need, m->kv.n_free, m->kv.n_blocks);
                tl_request_fail(m, best, TL_ERR_KV_FULL, msg); /* still QUEUED: tl_request_fail() counts it out */
                continue;
            }
            tl_request_stop(m, best, 0); /* wait for running requests to free blocks */
            best->n_cached = 0;
            return;
        }
        pthread_mutex_lock(&s->mu);
        best->state = TL_REQ_RUNNING;
        s->n_queued--;
        pthread_mutex_unlock(&s->mu);
        running++;
        reserved += need;
        if (best->first_tok >= 0) { /* a full match: its first token is drawn already */
            best->rng = best->first_rng;
            accept_token(m, best, best->first_tok);
        }
    }
}

int tl_sched_step(tl_model *m) {
    tl_sched *s = m->sched;
    s->steps++;
    tl_sched_apply_msgs(m);
    merge_and_reap(m);
    admit_queued(m);
    for (int i = 0; i < s->n; i++)
        if (s->reqs[i]->state == TL_REQ_RUNNING && in_resume_prefill(s->reqs[i])) run_resume_prefill(m, s->reqs[i]);
    /* One pass per distinct loop depth among running requests. */
    for (int i = 0; i < s->n; i++) {
        tl_request *r = s->reqs[i];
        if (r->state != TL_REQ_RUNNING) continue;
        int seen = 0;
        for (int j = 0; j < i && !seen; j++)
            seen = s->reqs[j]->p.loops == r->p.loops && s->reqs[j]->state == TL_REQ_RUNNING;
        if (seen) continue;
        int rc = run_group(m, r->p.loops);
        if (rc) return rc;
    }
    int active = 0;
    for (int i = 0; i < s->n; i++) active += s->reqs[i]->state <= TL_REQ_RUNNING;
    pthread_mutex_lock(&s->mu);
    active += s->n_in;
    pthread_mutex_unlock(&s->mu);
    return active;
}

int tl_model_step(tl_model *m) {
    if (!m || !m->sched) return tl_set_error(TL_ERR_INVALID_ARG, "model must not be NULL");
    if (m->sched->engine_running)
        return tl_set_error(TL_ERR_STATE, "the engine thread steps this model; tl_model_step is for synchronous use");
    return tl_sched_step(m);
}

/* Sets a flag for the stepping thread, or acts at once without an engine. */
static int request_flag(tl_model *m, int64_t id, int release) {
    tl_sched *s = m ? m->sched : NULL;
    if (!s) return tl_set_error(TL_ERR_INVALID_ARG, "model must not be NULL");
    pthread_mutex_lock(&s->mu);
    tl_request *r = tl_request_find(m, id);
    if (!r) {
        pthread_mutex_unlock(&s->mu);
        return tl_set_error(TL_ERR_INVALID_ARG, "no request with id %lld", (long long)id);
    }
    if (release) r->release_req = 1;
    else r->cancel_req = 1;
    s->flags_pending = 1;
    int engine = s->engine_running;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (!engine) merge_and_reap(m); /* synchronous use: free its KV now */
    return TL_OK;
}

int tl_request_cancel(tl_model *m, int64_t id) { return request_flag(m, id, 0); }

int tl_request_release(tl_model *m, int64_t id) { return request_flag(m, id, 1); }

/* ---- synchronous helpers ------------------------------------------------------------------- */

int tl_sched_run(tl_model *m, const int32_t *prompt, int n_prompt, const tl_generate_params *p, tl_pool *pool,
                 int32_t *out, int cap, int *n_cached) {
    int64_t id;
    int rc = tl_request_submit(m, prompt, n_prompt, p, pool, &id);
    if (rc) return rc;
    tl_wait_result res = {0};
    rc = tl_sched_wait(m, id, out, cap, &res);
    if (n_cached) *n_cached = res.n_cached;
    return rc;
}

int tl_sched_wait(tl_model *m, int64_t id, int32_t *out, int cap, tl_wait_result *res) {
    tl_sched *s = m->sched;
    int n = 0, rc = 0;
    for (;;) {
        int finished = 0;
        int got = tl_request_take(m, id, n < cap ? out + n : NULL, cap - n, &finished);
        if (got < 0) {
            rc = got;
            break;
        }
        n += got;
        rc = n;
        if (finished) break;
        if (cap > 0 && n == cap) { /* the caller's buffer is full: stop here */
            tl_request_cancel(m, id);
            break;
        }
        if (s->engine_running) {
            if ((rc = tl_request_wait_news(m, id))) break;
            continue;
        }
        /* no engine thread: this caller steps the scheduler */
        tl_sched_compute_lock(m);
        int st = tl_sched_step(m);
        tl_sched_compute_unlock(m);
        if (st < 0) {
            rc = st;
            break;
        }
    }
    char msg[512];
    snprintf(msg, sizeof msg, "%s", tl_last_error());
    pthread_mutex_lock(&s->mu);
    tl_request *r = tl_request_find(m, id);
    if (r && res) {
        res->n_cached = r->n_cached;
        res->pinned = r->pinned; /* the caller's now */
        r->pinned = NULL;
        res->beam = r->beam_res;
    }
    pthread_mutex_unlock(&s->mu);
    tl_request_release(m, id);
    if (rc < 0) tl_set_error(rc, "%s", msg);
    return rc;
}

/* ---- statistics and checks ------------------------------------------------------------------ */

void tl_sched_stats_now(const tl_model *m, tl_cache_stats *o) {
    *o = m->sched->st;
    o->evictions = m->cache.evictions;
    o->evicted_tokens = m->cache.evicted_tokens;
    o->nodes = m->cache.n_nodes;
    o->cached_tokens = m->cache.cached_tokens;
    o->blocks_total = m->kv.n_blocks;
    o->blocks_free = m->kv.n_free;
    o->blocks_used = m->kv.n_blocks - m->kv.n_free;
    o->blocks_shared = 0;
    for (int i = 0; i < m->kv.n_blocks; i++) o->blocks_shared += m->kv.refcnt[i] > 1;
    tl_sched *s = m->sched;
    pthread_mutex_lock(&s->mu);
    o->requests_active = s->n_in;
    for (int i = 0; i < s->n; i++) o->requests_active += s->reqs[i]->state <= TL_REQ_RUNNING;
    o->requests_queued = s->n_queued;
    pthread_mutex_unlock(&s->mu);
    tl_cache_tier_stats(m, o);
}

int tl_model_get_stats(const tl_model *m, tl_cache_stats *o) {
    if (!m || !o) return tl_set_error(TL_ERR_INVALID_ARG, "model and out must not be NULL");
    tl_sched *s = m->sched;
    if (!s) {
        memset(o, 0, sizeof *o);
        return TL_OK;
    }
    /* With an engine thread, read the snapshot it publishes after each
     * step: never wait for a forward pass. */
    pthread_mutex_lock(&s->mu);
    int engine = s->engine_running;
    if (engine) *o = s->snap;
    pthread_mutex_unlock(&s->mu);
    if (!engine) tl_sched_stats_now(m, o);
    return TL_OK;
}

int tl_model_set_tenant_budget(tl_model *m, int tenant, int max_blocks) {
    if (!m || !m->sched) return tl_set_error(TL_ERR_INVALID_ARG, "model must not be NULL");
    if (tenant < 0) return tl_set_error(TL_ERR_INVALID_ARG, "tenant %d must be >= 0", tenant);
    if (max_blocks < 0) return tl_set_error(TL_ERR_INVALID_ARG, "max_blocks %d must be >= 0", max_blocks);
    /* With an engine thread the change waits for the step boundary, not
     * the caller: a handler setting a tenant's budget on its first request
     * must not stall the event loop for a whole step. */
    tl_sched_msg msg = {.kind = TL_MSG_BUDGET, .tenant = tenant, .max_blocks = max_blocks};
    int rc = tl_sched_post_msg(m, &msg);
    if (rc) return rc < 0 ? rc : TL_OK;
    tl_sched_compute_lock(m);
    rc = tl_cache_apply_budget(m, tenant, max_blocks);
    tl_sched_compute_unlock(m);
    return rc;
}

int tl_sched_post_msg(tl_model *m, const tl_sched_msg *msg) {
    tl_sched *s = m->sched;
    pthread_mutex_lock(&s->mu);
    int rc = 0;
    if (s->engine_running) {
        if (s->n_msgs == s->cap_msgs) {
            int cap = s->cap_msgs ? s->cap_msgs * 2 : 8;
            tl_sched_msg *v = realloc(s->msgs, (size_t)cap * sizeof *v);
            if (v) {
                s->msgs = v;
                s->cap_msgs = cap;
            }
        }
        if (s->n_msgs < s->cap_msgs) {
            s->msgs[s->n_msgs++] = *msg;
            pthread_cond_signal(&s->cv);
            rc = 1;
        } else {
            rc = TL_ERR_NOMEM;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return rc == TL_ERR_NOMEM ? tl_set_error(rc, "out of memory for an engine message") : rc;
}

void tl_sched_apply_msgs(tl_model *m) {
    tl_sched *s = m->sched;
    pthread_mutex_lock(&s->mu);
    tl_sched_msg *v = s->msgs;
    int n = s->n_msgs;
    s->msgs = NULL;
    s->n_msgs = s->cap_msgs = 0;
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < n; i++) {
        const tl_sched_msg *g = &v[i];
        if (g->kind == TL_MSG_BUDGET) tl_cache_apply_budget(m, g->tenant, g->max_blocks); /* no memory: the old budget stays */
        else if (g->kind == TL_MSG_POOL_FREE) {
            tl_sched_forget_pool(m, g->pool);
            tl_pool_free_now(g->pool);
        }
    }
    free(v);
}

int tl_model_tenant_blocks(tl_model *m, int tenant) {
    if (!m) return tl_set_error(TL_ERR_INVALID_ARG, "model must not be NULL");
    tl_sched_compute_lock(m);
    int n = tl_radix_tenant_usage(&m->cache, tenant);
    tl_sched_compute_unlock(m);
    return n;
}

int tl_model_cache_nodes(tl_model *m, tl_cache_node *out, int cap) {
    if (!m || cap < 0 || (cap > 0 && !out)) return tl_set_error(TL_ERR_INVALID_ARG, "cache_nodes: bad arguments");
    tl_sched_compute_lock(m);
    int n = tl_cache_nodes(m, out, cap);
    tl_sched_compute_unlock(m);
    return n;
}

int tl_model_set_evict_weights(tl_model *m, double recency, double hits, double tokens, double depth) {
    if (!m || !m->sched) return tl_set_error(TL_ERR_INVALID_ARG, "model must not be NULL");
    pthread_mutex_lock(&m->sched->mu);
    m->sched->weights = (tl_evict_weights){recency, hits, tokens, depth};
    m->sched->weights_pending = 1;
    int engine = m->sched->engine_running;
    pthread_mutex_unlock(&m->sched->mu);
    if (!engine) merge_and_reap(m);
    return TL_OK;
}

int tl_sched_check_invariants(tl_model *m, const int32_t *extra, int n_extra) {
    int32_t *count = calloc((size_t)m->kv.n_blocks, sizeof *count);
    if (!count) return tl_set_error(TL_ERR_NOMEM, "out of memory");
    for (int i = 0; i < m->sched->n; i++) {
        const tl_request *r = m->sched->reqs[i];
        int n_beams = searching(r) ? r->beam->n_cur : 0;
        for (int k = -1; k < n_beams; k++) {
            const tl_seq *s = k < 0 ? r->seq : r->beam->cur[k].seq;
            if (!s) continue;
            for (int j = s->bt.n_released * s->bt.depth; j < s->bt.n_logical * s->bt.depth; j++)
                if (s->bt.ids[j] >= 0) count[s->bt.ids[j]]++;
        }
    }
    for (int i = 0; i < n_extra; i++) count[extra[i]]++;
    int rc = tl_cache_check(m, count);
    free(count);
    return rc;
}
