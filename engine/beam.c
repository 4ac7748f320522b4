/* beam.c - the beam search of a TL_RK_BEAM request, one step at a time.
 *
 * The scheduler prefills the prompt into one sequence and hands it over
 * (tl_beam_start); from then on each of its steps runs every live beam's
 * last token in the shared batch and calls tl_beam_advance with their
 * logits rows: every beam's children are chosen from its top tokens, and a
 * child forks its parent's block table by reference (the first child takes
 * the parent's table itself). The forward pass copies a shared partial tail
 * block on write, so B beams over a prompt of P blocks hold P + about B
 * tail blocks per layer:
 *
 *   prompt blocks      [ 0 ][ 1 ] ... [ 62 ]   refcount B (+1 in the cache)
 *   beam 0 tail                          [ 63a ]  private
 *   beam 1 tail                          [ 63b ]  private  ...
 *
 * Nothing here locks or calls the scheduler: the stepping thread owns the
 * search, as it owns every request's KV. */
#include "beam.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "util.h"

typedef struct beam_cand {
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

tl_beam *tl_beam_new(int beams, float alpha, int max_tokens, int n_vocab) {
    tl_beam *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    int B = beams, T = max_tokens, K = B < n_vocab ? B : n_vocab;
    b->B = B;
    b->T = T;
    b->K = K;
    b->alpha = alpha;
    b->best_score = -INFINITY;
    b->best_finish = TL_FINISH_NONE;
    b->cur = calloc((size_t)B, sizeof *b->cur);
    b->nxt = calloc((size_t)B, sizeof *b->nxt);
    b->tokbuf = malloc((size_t)2 * B * (T ? T : 1) * sizeof *b->tokbuf);
    b->best_toks = malloc((size_t)(T ? T : 1) * sizeof *b->best_toks);
    b->cands = malloc((size_t)B * K * sizeof *b->cands);
    b->taken = malloc((size_t)B);
    if (!b->cur || !b->nxt || !b->tokbuf || !b->best_toks || !b->cands || !b->taken) {
        tl_beam_free(b);
        return NULL;
    }
    for (int i = 0; i < B; i++) {
        b->cur[i].toks = b->tokbuf + (size_t)i * T;
        b->nxt[i].toks = b->tokbuf + (size_t)(B + i) * T;
    }
    return b;
}

void tl_beam_free(tl_beam *b) {
    if (!b) return;
    for (int i = 0; b->cur && i < b->n_cur; i++) tl_seq_free(b->cur[i].seq);
    free(b->cur);
    free(b->nxt);
    free(b->tokbuf);
    free(b->best_toks);
    free(b->cands);
    free(b->taken);
    free(b);
}

void tl_beam_start(tl_beam *b, tl_seq *prompt_seq) {
    b->cur[0] = (tl_beam_hyp){.seq = prompt_seq, .toks = b->cur[0].toks};
    b->n_cur = 1;
}

/* Keeps a finished hypothesis if it scores best so far. */
static void consider(tl_beam *b, const int32_t *toks, int n_toks, int n_scored, double lp, int finish) {
    double sc = norm_score(lp, n_scored, b->alpha);
    if (sc <= b->best_score) return;
    b->best_score = sc;
    b->best_lp = lp;
    b->best_n = n_scored;
    b->best_finish = finish;
    memcpy(b->best_toks, toks, (size_t)n_toks * sizeof *b->best_toks);
}

int tl_beam_advance(tl_model *m, tl_beam *b, const float *logits, int ignore_eos) {
    const int V = m->hp.n_vocab, B = b->B;
    /* Candidates: each live beam's K best continuations. */
    int nc = 0;
    for (int i = 0; i < b->n_cur; i++)
        nc += top_k_logprobs(logits + (size_t)i * V, V, b->K, i, b->cur[i].lp, b->cands + nc);
    qsort(b->cands, (size_t)nc, sizeof *b->cands, cand_cmp);
    /* EOS (any end-of-generation token) among the B best ends a
     * hypothesis; the B best others live on. */
    int n_next = 0;
    memset(b->taken, 0, (size_t)b->n_cur);
    for (int i = 0; i < nc && (n_next < B || i < B); i++) {
        const cand *c = &b->cands[i];
        const tl_beam_hyp *p = &b->cur[c->parent];
        if (!ignore_eos && tl_model_is_eog(m, c->tok)) {
            if (i < B) consider(b, p->toks, p->n, p->n + 1, c->lp, TL_FINISH_EOS);
            continue;
        }
        if (n_next == B) continue;
        tl_beam_hyp *q = &b->nxt[n_next++];
        memcpy(q->toks, p->toks, (size_t)p->n * sizeof *q->toks);
        q->toks[p->n] = c->tok;
        q->n = p->n + 1;
        q->lp = c->lp;
        q->parent = c->parent;
        q->seq = NULL;
    }
    b->step++;
    if (b->step == b->T || n_next == 0) { /* the live beams end by length */
        for (int i = 0; i < n_next; i++)
            consider(b, b->nxt[i].toks, b->nxt[i].n, b->nxt[i].n, b->nxt[i].lp, TL_FINISH_LENGTH);
        return 1;
    }
    /* Fork: the first child takes its parent's sequence, the others share
     * its blocks; parents without children free theirs. */
    int rc = 0;
    for (int i = 0; i < n_next; i++) {
        int pi = b->nxt[i].parent;
        if (!b->taken[pi]) {
            b->taken[pi] = 1;
            b->nxt[i].seq = b->cur[pi].seq;
        } else if (!(b->nxt[i].seq = seq_fork(m, b->cur[pi].seq))) {
            rc = tl_set_error(TL_ERR_NOMEM, "out of memory forking a beam");
        }
    }
    for (int i = 0; i < b->n_cur; i++) /* the taken ones now belong to nxt */
        if (!b->taken[i]) tl_seq_free(b->cur[i].seq);
    for (int i = 0; i < b->n_cur; i++) b->cur[i].seq = NULL;
    tl_beam_hyp *sw = b->cur;
    b->cur = b->nxt;
    b->nxt = sw;
    b->n_cur = n_next;
    return rc;
}

void tl_beam_note_peak(tl_model *m, tl_beam *b) {
    int used = m->kv.n_blocks - m->kv.n_free - b->base;
    if (used > b->peak) b->peak = used;
}

int tl_beam_result_of(const tl_beam *b, tl_beam_result *res) {
    int n = b->best_finish == TL_FINISH_EOS ? b->best_n - 1 : b->best_n;
    if (res)
        *res = (tl_beam_result){.score = (float)b->best_score, .logprob = (float)b->best_lp,
                                .n_generated = b->best_n, .finish_reason = b->best_finish,
                                .kv_blocks_peak = b->peak};
    return n;
}
