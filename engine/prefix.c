/* prefix.c - single-prefix handles (build_prefix_cache /
 * generate_from_prefix_cache, docs/prefix-pool.md) and resume handles for looped
 * models (the same prompt at another loop depth, reusing the prelude). */
#include <stdlib.h>
#include <string.h>

#include "forward.h"
#include "scheduler.h"
#include "util.h"

enum { KIND_PREFIX = 1, KIND_RESUME = 2 };

struct tl_prefix {
    int kind;
    tl_model *model;
    int32_t *tokens;
    int n, loops, window;
    tl_radix_node *node;   /* KIND_PREFIX: pinned cache node */
    int prelude;           /* KIND_RESUME: layers before the loop block */
    int n_lb;
    int32_t *blocks;       /* (n_lb, prelude) KV of the prelude layers */
    float *x;              /* (n, n_embd) hidden states entering the loop block */
};

static tl_prefix *handle_new(tl_model *m, int kind, const int32_t *tokens, int n) {
    tl_prefix *h = calloc(1, sizeof *h);
    if (h) h->tokens = malloc((size_t)n * sizeof *h->tokens);
    if (!h || !h->tokens) {
        free(h);
        tl_set_error(TL_ERR_NOMEM, "out of memory for a prefix of %d tokens", n);
        return NULL;
    }
    memcpy(h->tokens, tokens, (size_t)n * sizeof *tokens);
    h->kind = kind;
    h->model = m;
    h->n = n;
    return h;
}

void tl_prefix_free(tl_prefix *h) {
    if (!h) return;
    tl_model *m = h->model;
    tl_sched_compute_lock(m);
    if (h->node) tl_radix_unpin(&m->cache, h->node);
    for (int i = 0; h->blocks && i < h->n_lb * h->prelude; i++) tl_kv_unref(&m->kv, h->blocks[i]);
    tl_sched_compute_unlock(m);
    free(h->blocks);
    tl_free_aligned(h->x);
    free(h->tokens);
    free(h);
}

static int check_model(const tl_model *m, const void *out) {
    if (!m || !out) return tl_set_error(TL_ERR_INVALID_ARG, "model and out must not be NULL");
    if (!m->arch) return tl_set_error(TL_ERR_STATE, "model was opened vocab_only; it cannot run");
    return TL_OK;
}

int tl_prefix_build(tl_model *m, const int32_t *tokens, int n, int loops, int window, tl_prefix **out) {
    int rc = check_model(m, out);
    if (rc) return rc;
    *out = NULL;
    if ((rc = tl_request_check_tokens(m, tokens, n))) return rc;
    if (n > m->max_seq_len) return tl_set_error(TL_ERR_TOO_LONG, "prefix length %d exceeds max_seq_len %d", n, m->max_seq_len);
    if (loops < 0 || window < 0)
        return tl_set_error(TL_ERR_INVALID_ARG, "loops %d and cache_window %d must be >= 0", loops, window);
    tl_prefix *h = handle_new(m, KIND_PREFIX, tokens, n);
    if (!h) return TL_ERR_NOMEM;
    h->loops = tl_model_effective_loops(m, loops);
    h->window = window;
    /* A TL_RK_PIN request, waited for: it prefills in the scheduler's
     * batches and pins its node for us. */
    int64_t id;
    rc = tl_request_submit_build(m, NULL, tokens, n, h->loops, window, &id);
    tl_wait_result res = {0};
    if (rc == TL_OK) rc = tl_sched_wait(m, id, NULL, 0, &res);
    h->node = res.pinned;
    if (rc >= 0 && !h->node) rc = tl_set_error(TL_ERR_STATE, "build_prefix_cache: the prefix was not pinned");
    if (rc < 0) {
        tl_prefix_free(h);
        return rc;
    }
    *out = h;
    return TL_OK;
}

int tl_generate_from_prefix(tl_model *m, tl_prefix *h, const int32_t *suffix, int n_suffix, tl_generate_params gp,
                            int32_t *out, int cap) {
    int rc = check_model(m, out);
    if (rc) return rc;
    if (!h || h->kind != KIND_PREFIX || h->model != m)
        return tl_set_error(TL_ERR_INVALID_ARG, "prefix handle is NULL, of another kind, or of another model");
    if (n_suffix < 0 || (n_suffix > 0 && !suffix))
        return tl_set_error(TL_ERR_INVALID_ARG, "suffix of %d tokens is invalid", n_suffix);
    int n = h->n + n_suffix;
    int32_t *prompt = malloc((size_t)n * sizeof *prompt);
    if (!prompt) return tl_set_error(TL_ERR_NOMEM, "out of memory");
    memcpy(prompt, h->tokens, (size_t)h->n * sizeof *prompt);
    if (n_suffix) memcpy(prompt + h->n, suffix, (size_t)n_suffix * sizeof *prompt);
    gp.loops = h->loops;
    gp.cache_window = h->window;
    gp.salt = 0;
    gp.no_cache = 0;
    rc = tl_sched_run(m, prompt, n, &gp, NULL, out, cap, NULL);
    free(prompt);
    return rc;
}

/* ---- resume handles ---------------------------------------------------------------- */

int tl_resume_build(tl_model *m, const int32_t *prompt, int n, tl_prefix **out) {
    int rc = check_model(m, out);
    if (rc) return rc;
    *out = NULL;
    if ((rc = tl_request_check_prompt(m, prompt, n, 1))) return rc;
    tl_prefix *h = handle_new(m, KIND_RESUME, prompt, n);
    if (!h) return TL_ERR_NOMEM;
    h->prelude = m->loop_start < m->loop_end ? m->loop_start : 0;
    h->loops = m->loop_default;
    int D = m->hp.n_embd, bs = m->kv.block_size;
    h->n_lb = (n + bs - 1) / bs;
    h->x = tl_alloc_aligned((size_t)n * D * sizeof(float));
    h->blocks = malloc(((size_t)h->n_lb * h->prelude + 1) * sizeof *h->blocks);
    tl_seq *seq = NULL;
    if (!h->x || !h->blocks) {
        rc = tl_set_error(TL_ERR_NOMEM, "out of memory for a resume handle of %d tokens", n);
        goto fail;
    }
    if ((rc = tl_seq_new(m, h->loops, &seq))) goto fail;
    tl_forward_opts fo = {.vl_capture = h->prelude, .x_capture = h->x};
    tl_sched_compute_lock(m);
    tl_cache_reserve(m, &seq, &n, 1); /* short: the pass fails with KV full */
    rc = tl_forward(m, &seq, &prompt, &n, 1, NULL, &fo);
    for (int lb = 0; rc == TL_OK && lb < h->n_lb; lb++)
        for (int vl = 0; vl < h->prelude; vl++) {
            int id = seq->bt.ids[lb * seq->bt.depth + vl];
            tl_kv_ref(&m->kv, id);
            h->blocks[lb * h->prelude + vl] = id;
        }
    tl_seq_free(seq);
    seq = NULL;
    tl_sched_compute_unlock(m);
    if (rc) goto fail;
    *out = h;
    return TL_OK;
fail:
    tl_seq_free(seq);
    h->n_lb = 0;
    tl_prefix_free(h);
    return rc;
}

/* A request of kind TL_RK_RESUME, waited for: it batches with everything
 * else the scheduler runs and holds no lock across the generation. */
int tl_resume_generate(tl_model *m, tl_prefix *h, tl_generate_params gp, int32_t *out, int cap) {
    int rc = check_model(m, out);
    if (rc) return rc;
    if (!h || h->kind != KIND_RESUME || h->model != m)
        return tl_set_error(TL_ERR_INVALID_ARG, "resume handle is NULL, of another kind, or of another model");
    if ((rc = tl_request_check_prompt(m, h->tokens, h->n, gp.max_tokens))) return rc;
    if (h->prelude == 0) { /* nothing depth-independent to reuse */
        gp.no_cache = 1;
        return tl_sched_run(m, h->tokens, h->n, &gp, NULL, out, cap, NULL);
    }
    tl_resume_view v = {.prelude = h->prelude, .n_lb = h->n_lb, .blocks = h->blocks, .x = h->x};
    int64_t id;
    if ((rc = tl_request_submit_resume(m, h->tokens, h->n, &v, &gp, &id))) return rc;
    return tl_sched_wait(m, id, out, cap, NULL);
}
