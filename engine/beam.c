/* beam.c - beam search over sequences that share KV blocks.
 *
 * The prompt is prefilled once into one sequence; each step every live
 * beam's children are chosen from its top tokens, and a child forks its
 * parent's block table by reference (the first child takes the parent's
 * table itself). The forward pass copies a shared partial tail block on
 * write (forward.c's reserve_blocks), so B beams over a prompt of P blocks
 * hold P + about B tail blocks per layer:
 *
 *   prompt blocks      [ 0 ][ 1 ] ... [ 62 ]   refcount B (+1 in the cache)
 *   beam 0 tail                          [ 63a ]  private
 *   beam 1 tail                          [ 63b ]  private  ...
 *
 * The compute lock is taken per step (fork + forward), never across the
 * search; selection runs outside it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "pool.h"
#include "scheduler.h"
#include "util.h"

#define BEAM_MAX 1024
#define BEAM_PREFILL_CHUNK 512

typedef struct beam {
    tl_seq *seq;
    int32_t *toks; /* generated so far (max_tokens) */
    int n;
    double lp;     /* sum of log-probabilities */
    int parent;    /* index in the previous step's beams (while forking) */
} beam;

typedef struct cand {
    double lp;
    int parent, tok;
} cand;

/* Best first; ties to the lower parent, then the lower token (argmax's order). */
static int cand_cmp(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->lp != y->lp) return x->lp > y->lp ? -1 : 1;
    if (x->parent != y->parent) return x->parent - y->parent;
    return x->tok - y->tok;
}

/* worse(a, b): a ranks below b (lower lp, or equal lp and higher token). */
static int worse(const cand *a, const cand *b) { return a->lp < b->lp || (a->lp == b->lp && a->tok > b->tok); }

static void heap_down(cand *h, int n, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && worse(&h[l], &h[w])) w = l;
        if (r < n && worse(&h[r], &h[w])) w = r;
        if (w == i) return;
        cand t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

/* The k best tokens of one row of logits as log-probabilities, into out
 * (a min-heap, unordered); returns how many (min(k, V)). */
static int top_k_logprobs(const float *logits, int V, int k, int parent, double parent_lp, cand *out) {
    float mx = logits[0];
    for (int i = 1; i < V; i++)
        if (logits[i] > mx) mx = logits[i];
    double sum = 0;
    for (int i = 0; i < V; i++) sum += exp((double)logits[i] - mx);
    double lse = mx + log(sum);
    if (k > V) k = V;
    int n = 0;
    for (int i = 0; i < V; i++) {
        cand c = {(double)logits[i] - lse, parent, i};
        if (n < k) {
            out[n++] = c;
            if (n == k)
                for (int j = k / 2 - 1; j >= 0; j--) heap_down(out, k, j);
        } else if (worse(&out[0], &c)) {
            out[0] = c;
            heap_down(out, k, 0);
        }
    }
    for (int j = 0; j < n; j++) out[j].lp += parent_lp;
    return n;
}

/* A second sequence over the same blocks (one more reference each). */
static tl_seq *seq_fork(tl_model *m, const tl_seq *src) {
    tl_seq *s = malloc(sizeof *s);
    if (!s) return NULL;
    *s = *src;
    size_t n = (size_t)src->bt.n_logical * src->bt.depth;
    s->bt.cap_logical = src->bt.n_logical;
    s->bt.ids = malloc((n ? n : 1) * sizeof *s->bt.ids);
    if (!s->bt.ids) {
        free(s);
        return NULL;
    }
    memcpy(s->bt.ids, src->bt.ids, n * sizeof *s->bt.ids);
    for (size_t i = 0; i < n; i++)
        if (s->bt.ids[i] >= 0) tl_kv_ref(&m->kv, s->bt.ids[i]);
    return s;
}

static double norm_score(double lp, int n, float alpha) { return alpha == 0.0f ? lp : lp / pow((double)n, alpha); }

static void note_peak(tl_model *m, int base, int *peak) {
    int used = m->kv.n_blocks - m->kv.n_free - base;
    if (used > *peak) *peak = used;
}

/* Prefills the prompt into a new sequence (cache match first, prompt
 * inserted after unless no_cache) and leaves its last-token logits in
 * logits. Takes the compute lock per chunk. */
static int prefill(tl_model *m, const int32_t *prompt, int n_prompt, const tl_generate_params *gp, int base,
                   int *peak, tl_seq **seq_out, float *logits, int *n_cached) {
    tl_seq *seq = NULL;
    int ns = -1, rc;
    *n_cached = 0;
    tl_sched_compute_lock(m);
    rc = tl_seq_new(m, gp->loops, &seq);
    if (rc) goto out;
    seq->window = gp->cache_window;
    if (!gp->no_cache) {
        ns = tl_cache_namespace(m, gp->loops, gp->cache_window, gp->salt);
        if (ns < 0) {
            rc = TL_ERR_NOMEM;
            goto out;
        }
        tl_radix_node *node = NULL;
        /* at most n - 1: the last token is computed for its logits */
        int L = tl_radix_match(&m->cache, ns, prompt, n_prompt, n_prompt - 1, &node);
        m->sched->st.lookups++;
        /* our references keep the shared blocks alive; no lock needed */
        if (L > 0 && tl_radix_share(&m->cache, node, L, &seq->bt) == 0) {
            tl_pool_attribute_hit(m, node, L); /* the pool whose entry owns the blocks */
            seq->n_pos = L;
            *n_cached = L;
            m->sched->st.hits++;
            m->sched->st.hit_tokens += L;
            m->sched->st.prefill_tokens_saved += L;
        }
    }
    while (seq->n_pos < n_prompt) {
        int chunk = n_prompt - seq->n_pos < BEAM_PREFILL_CHUNK ? n_prompt - seq->n_pos : BEAM_PREFILL_CHUNK;
        const int32_t *t = prompt + seq->n_pos;
        int last = seq->n_pos + chunk == n_prompt;
        tl_cache_reserve(m, &seq, &chunk, 1); /* short: the pass fails with KV full */
        rc = tl_forward(m, &seq, &t, &chunk, 1, last ? logits : NULL, NULL);
        if (rc) goto out;
        m->sched->st.prefill_tokens += chunk;
        note_peak(m, base, peak);
        if (!last) { /* let the engine thread step between chunks */
            tl_sched_compute_unlock(m);
            tl_sched_compute_lock(m);
        }
    }
    if (ns >= 0) tl_radix_insert(&m->cache, ns, prompt, n_prompt, &seq->bt, gp->tenant); /* best effort */
out:
    if (ns >= 0) tl_radix_namespace_release(&m->cache, ns);
    if (rc && seq) {
        tl_seq_free(seq);
        seq = NULL;
    }
    tl_sched_compute_unlock(m);
    *seq_out = seq;
    return rc;
}

int tl_generate_beam(tl_model *m, tl_pool *pool, const int32_t *prompt, int n_prompt, tl_generate_params gp,
                     int beams, float alpha, int32_t *out, int cap, tl_beam_result *res) {
    if (!m) return tl_set_error(TL_ERR_INVALID_ARG, "model must not be NULL");
    if (!m->arch) return tl_set_error(TL_ERR_STATE, "model was opened vocab_only; it cannot generate");
    if (beams < 1 || beams > BEAM_MAX)
        return tl_set_error(TL_ERR_INVALID_ARG, "beams %d must be in [1, %d]", beams, BEAM_MAX);
    if (!isfinite(alpha)) return tl_set_error(TL_ERR_INVALID_ARG, "length_penalty %g must be finite", (double)alpha);
    int rc = tl_request_check_prompt(m, prompt, n_prompt, gp.max_tokens);
    if (rc) return rc;
    if (!out || cap < gp.max_tokens)
        return tl_set_error(TL_ERR_BUFFER, "output buffer of %d tokens is smaller than max_tokens %d", cap,
                            gp.max_tokens);
    if (pool) {
        if ((rc = tl_pool_bind(pool, m))) return rc;
        uint64_t salt;
        int tenant;
        tl_pool_key(pool, &salt, &tenant);
        if (!gp.salt) gp.salt = salt;
        if (!gp.tenant) gp.tenant = tenant;
    }

    const int V = m->hp.n_vocab, B = beams, T = gp.max_tokens;
    const int K = B < V ? B : V;
    beam *cur = calloc((size_t)B, sizeof *cur), *nxt = calloc((size_t)B, sizeof *nxt);
    int32_t *tokbuf = malloc((size_t)2 * B * T * sizeof *tokbuf), *best_toks = malloc((size_t)T * sizeof *best_toks);
    float *logits = malloc((size_t)B * V * sizeof *logits);
    cand *cands = malloc((size_t)B * K * sizeof *cands);
    tl_seq **seqs = malloc((size_t)B * sizeof *seqs);
    const int32_t **tok_ptrs = malloc((size_t)B * sizeof *tok_ptrs);
    int *ones = malloc((size_t)B * sizeof *ones);
    char *taken = malloc((size_t)B);
    int n_cur = 0, n_cached = 0, peak = 0;
    double best_score = -INFINITY, best_lp = 0;
    int best_n = 0, best_finish = TL_FINISH_NONE;
    if (!cur || !nxt || !tokbuf || !best_toks || !logits || !cands || !seqs || !tok_ptrs || !ones || !taken) {
        rc = tl_set_error(TL_ERR_NOMEM, "out of memory for %d beams over a vocab of %d", B, V);
        goto out;
    }
    for (int i = 0; i < B; i++) {
        cur[i].toks = tokbuf + (size_t)i * T;
        nxt[i].toks = tokbuf + (size_t)(B + i) * T;
        ones[i] = 1;
    }

    tl_sched_compute_lock(m);
    int base = m->kv.n_blocks - m->kv.n_free;
    tl_sched_compute_unlock(m);
    if ((rc = prefill(m, prompt, n_prompt, &gp, base, &peak, &cur[0].seq, logits, &n_cached))) goto out;
    n_cur = 1;
    if (pool) {
        tl_sched_compute_lock(m);
        tl_pool_count_lookup(pool);
        tl_sched_compute_unlock(m);
    }

    for (int t = 0; t < T && n_cur > 0; t++) {
        /* Candidates: each live beam's K best continuations. */
        int nc = 0;
        for (int b = 0; b < n_cur; b++) nc += top_k_logprobs(logits + (size_t)b * V, V, K, b, cur[b].lp, cands + nc);
        qsort(cands, (size_t)nc, sizeof *cands, cand_cmp);
        /* EOS (any end-of-generation token) among the B best ends a hypothesis; the B best others live on. */
        int n_next = 0;
        memset(taken, 0, (size_t)n_cur);
        for (int i = 0; i < nc && (n_next < B || i < B); i++) {
            const cand *c = &cands[i];
            const beam *p = &cur[c->parent];
            if (!gp.ignore_eos && tl_model_is_eog(m, c->tok)) {
                if (i >= B) continue;
                double sc = norm_score(c->lp, p->n + 1, alpha);
                if (sc > best_score) {
                    best_score = sc, best_lp = c->lp, best_n = p->n + 1, best_finish = TL_FINISH_EOS;
                    memcpy(best_toks, p->toks, (size_t)p->n * sizeof *best_toks);
                }
                continue;
            }
            if (n_next == B) continue;
            beam *q = &nxt[n_next++];
            memcpy(q->toks, p->toks, (size_t)p->n * sizeof *q->toks);
            q->toks[p->n] = c->tok;
            q->n = p->n + 1;
            q->lp = c->lp;
            q->parent = c->parent;
            q->seq = NULL;
        }
        if (t + 1 == T || n_next == 0) { /* the live beams end by length */
            for (int i = 0; i < n_next; i++) {
                double sc = norm_score(nxt[i].lp, nxt[i].n, alpha);
                if (sc > best_score) {
                    best_score = sc, best_lp = nxt[i].lp, best_n = nxt[i].n, best_finish = TL_FINISH_LENGTH;
                    memcpy(best_toks, nxt[i].toks, (size_t)nxt[i].n * sizeof *best_toks);
                }
            }
            break;
        }
        /* Fork: the first child takes its parent's sequence, the others
         * share its blocks; parents without children free theirs. */
        tl_sched_compute_lock(m);
        for (int i = 0; i < n_next; i++) {
            int pi = nxt[i].parent;
            tl_seq *ps = cur[pi].seq;
            if (!taken[pi]) {
                taken[pi] = 1;
                nxt[i].seq = ps;
            } else if (!(nxt[i].seq = seq_fork(m, ps))) {
                rc = tl_set_error(TL_ERR_NOMEM, "out of memory forking a beam");
            }
        }
        for (int b = 0; b < n_cur; b++) /* the taken ones now belong to nxt */
            if (!taken[b]) tl_seq_free(cur[b].seq);
        for (int b = 0; b < n_cur; b++) cur[b].seq = NULL;
        beam *sw = cur;
        cur = nxt;
        nxt = sw;
        n_cur = n_next;
        if (!rc) {
            for (int i = 0; i < n_cur; i++) {
                seqs[i] = cur[i].seq;
                tok_ptrs[i] = &cur[i].toks[cur[i].n - 1];
            }
            tl_cache_reserve(m, seqs, ones, n_cur);
            rc = tl_forward(m, seqs, tok_ptrs, ones, n_cur, logits, NULL);
            note_peak(m, base, &peak);
        }
        tl_sched_compute_unlock(m);
        if (rc) goto out;
    }

    memcpy(out, best_toks, (size_t)(best_finish == TL_FINISH_EOS ? best_n - 1 : best_n) * sizeof *out);
    rc = best_finish == TL_FINISH_EOS ? best_n - 1 : best_n;
    if (res) {
        res->score = (float)best_score;
        res->logprob = (float)best_lp;
        res->n_generated = best_n;
        res->finish_reason = best_finish;
        res->n_cached = n_cached;
        res->kv_blocks_peak = peak;
    }
    tl_sched_compute_lock(m);
    m->sched->st.generated_tokens += rc;
    tl_sched_compute_unlock(m);

out:
    if (n_cur > 0 && cur) {
        tl_sched_compute_lock(m);
        for (int b = 0; b < n_cur; b++) tl_seq_free(cur[b].seq);
        tl_sched_compute_unlock(m);
    }
    free(tokbuf);
    free(cur);
    free(nxt);
    free(best_toks);
    free(logits);
    free(cands);
    free(seqs);
    free(tok_ptrs);
    free(ones);
    free(taken);
    return rc;
}
