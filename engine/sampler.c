#include "sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

int tl_argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* splitmix64: small, fast, and good enough for sampling. */
static uint64_t next_u64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static float next_f32(uint64_t *s) { return (float)(next_u64(s) >> 40) / (float)(1ull << 24); }

int tl_sampler_init(tl_sampler *s, const tl_sampling_params *p, int n_vocab) {
    memset(s, 0, sizeof *s);
    if (!isfinite(p->temperature))
        return tl_set_error(TL_ERR_INVALID_ARG, "temperature %g is not finite", p->temperature);
    if (!(p->top_p >= 0) || !isfinite(p->top_p))
        return tl_set_error(TL_ERR_INVALID_ARG, "top_p %g must be >= 0", p->top_p);
    if (!(p->min_p >= 0 && p->min_p <= 1) && !(p->min_p <= 0))
        return tl_set_error(TL_ERR_INVALID_ARG, "min_p %g must be in [0, 1]", p->min_p);
    if (!(p->repeat_penalty > 0) || !isfinite(p->repeat_penalty))
        return tl_set_error(TL_ERR_INVALID_ARG, "repeat_penalty %g must be > 0", p->repeat_penalty);
    s->p = *p;
    s->rng = p->seed;
    s->n_vocab = n_vocab;
    s->idx = malloc((size_t)n_vocab * sizeof *s->idx);
    s->val = malloc((size_t)n_vocab * sizeof *s->val);
    s->pairs = malloc((size_t)n_vocab * sizeof(tl_cand));
    s->pen = malloc((size_t)n_vocab * sizeof *s->pen);
    if (!s->idx || !s->val || !s->pairs || !s->pen) {
        tl_sampler_free(s);
        return tl_set_error(TL_ERR_NOMEM, "out of memory for a sampler over %d tokens", n_vocab);
    }
    return TL_OK;
}

void tl_sampler_free(tl_sampler *s) {
    free(s->idx);
    free(s->val);
    free(s->pairs);
    free(s->pen);
    s->pairs = NULL;
    s->pen = NULL;
    s->idx = NULL;
    s->val = NULL;
}

float tl_sampler_uniform(uint64_t *rng) { return next_f32(rng); }

/* Each distinct token of the window once, as llama.cpp penalises them
 * (idx marks the ones seen). */
int tl_sampler_penalty_ids(tl_sampler *s, const int32_t *hist, int n, int32_t *out) {
    const tl_sampling_params *p = &s->p;
    if (p->repeat_penalty == 1.0f || p->repeat_last_n == 0 || n == 0) return 0;
    int from = p->repeat_last_n < 0 || p->repeat_last_n > n ? 0 : n - p->repeat_last_n, k = 0;
    for (int i = from; i < n; i++) s->idx[hist[i]] = -1;
    for (int i = from; i < n; i++)
        if (s->idx[hist[i]] == -1) {
            s->idx[hist[i]] = 0;
            out[k++] = hist[i];
        }
    return k;
}

static void apply_penalty(tl_sampler *s, float *logits, const int32_t *hist, int n) {
    const float rp = s->p.repeat_penalty;
    const int k = tl_sampler_penalty_ids(s, hist, n, s->pen);
    for (int i = 0; i < k; i++) {
        const int id = s->pen[i];
        logits[id] = logits[id] <= 0 ? logits[id] * rp : logits[id] / rp;
    }
}

static int cmp_desc(const void *a, const void *b) {
    const tl_cand *x = a, *y = b;
    if (x->v != y->v) return x->v < y->v ? 1 : -1;
    return x->id - y->id;
}

/* Sorts candidate ids by logit, descending, keeping the best k. */
static int top_candidates(tl_sampler *s, float *logits, int k) {
    int n = s->n_vocab;
    if (k <= 0 || k > n) k = n;
    for (int i = 0; i < n; i++) s->idx[i] = i;
    if (k < n) {
        /* Partial selection: keep a sorted window of the k best. */
        int m = 0;
        for (int i = 0; i < n; i++) {
            float v = logits[i];
            if (m == k && v <= logits[s->idx[k - 1]]) continue;
            int j = m < k ? m++ : k - 1;
            while (j > 0 && logits[s->idx[j - 1]] < v) {
                s->idx[j] = s->idx[j - 1];
                j--;
            }
            s->idx[j] = i;
        }
        return k;
    }
    for (int i = 0; i < n; i++) s->pairs[i] = (tl_cand){logits[i], i};
    qsort(s->pairs, (size_t)n, sizeof(tl_cand), cmp_desc);
    for (int i = 0; i < n; i++) s->idx[i] = s->pairs[i].id;
    return n;
}

/* u: the draw, or NULL to take it from s->rng. */
static int sample(tl_sampler *s, float *logits, const int32_t *hist, int n_hist, const float *u) {
    const tl_sampling_params *p = &s->p;
    apply_penalty(s, logits, hist, n_hist);
    if (p->temperature <= 0) return tl_argmax(logits, s->n_vocab);

    int n = top_candidates(s, logits, p->top_k);
    /* Softmax over the candidates (sorted descending). */
    float maxv = logits[s->idx[0]];
    double sum = 0;
    for (int i = 0; i < n; i++) {
        s->val[i] = expf(logits[s->idx[i]] - maxv);
        sum += s->val[i];
    }
    if (p->top_p < 1.0f) {
        double cum = 0;
        int keep = n;
        for (int i = 0; i < n; i++) {
            cum += s->val[i] / sum;
            if (cum >= p->top_p) { keep = i + 1; break; }
        }
        n = keep;
    }
    if (p->min_p > 0) {
        int keep = 1;
        while (keep < n && s->val[keep] >= p->min_p * s->val[0]) keep++;
        n = keep;
    }
    /* Temperature on the surviving logits, then draw. */
    sum = 0;
    for (int i = 0; i < n; i++) {
        s->val[i] = expf((logits[s->idx[i]] - maxv) / p->temperature);
        sum += s->val[i];
    }
    double r = (u ? *u : next_f32(&s->rng)) * sum, acc = 0;
    for (int i = 0; i < n; i++) {
        acc += s->val[i];
        if (r < acc) return s->idx[i];
    }
    return s->idx[n - 1];
}

int tl_sampler_sample(tl_sampler *s, float *logits, const int32_t *hist, int n_hist) {
    return sample(s, logits, hist, n_hist, NULL);
}

int tl_sampler_sample_u(tl_sampler *s, float *logits, const int32_t *hist, int n_hist, float u) {
    return sample(s, logits, hist, n_hist, &u);
}
