/* kv_eval.c - perplexity and greedy agreement through the public API (see kv_eval.h). */
#include "kv_eval.h"

#include <math.h>
#include <stdlib.h>

static double token_nll(const float *logits, int nv, int32_t target) {
    float mx = logits[0];
    for (int j = 1; j < nv; j++) mx = logits[j] > mx ? logits[j] : mx;
    double z = 0;
    for (int j = 0; j < nv; j++) z += exp((double)logits[j] - mx);
    return -((double)logits[target] - mx - log(z));
}

int kv_score_segments(tl_model *m, kv_segment *sg, int n_seg) {
    int nv = tl_model_n_vocab(m), rc = TL_OK, max_score = 0;
    tl_seq **seqs = calloc((size_t)n_seg, sizeof *seqs), **act = calloc((size_t)n_seg, sizeof *act);
    const int32_t **tok = calloc((size_t)n_seg, sizeof *tok);
    int *nt = calloc((size_t)n_seg, sizeof *nt), *idx = calloc((size_t)n_seg, sizeof *idx);
    float *logits = malloc((size_t)n_seg * nv * sizeof *logits);
    if (!seqs || !act || !tok || !nt || !idx || !logits) { rc = TL_ERR_NOMEM; goto out; }
    for (int i = 0; i < n_seg; i++) {
        if ((rc = tl_seq_new(m, 0, &seqs[i]))) goto out;
        sg[i].nll = 0;
        if (sg[i].n_score > max_score) max_score = sg[i].n_score;
    }
    for (int j = 0; j < max_score; j++) {
        int n = 0;
        for (int i = 0; i < n_seg; i++) {
            if (j >= sg[i].n_score) continue;
            act[n] = seqs[i];
            /* step 0 feeds the whole context, later steps the last scored token */
            tok[n] = j == 0 ? sg[i].ids : sg[i].ids + sg[i].n_prefill + j - 1;
            nt[n] = j == 0 ? sg[i].n_prefill : 1;
            idx[n++] = i;
        }
        if ((rc = tl_batch_forward(m, act, tok, nt, n, logits))) goto out;
        for (int k = 0; k < n; k++) {
            kv_segment *s = &sg[idx[k]];
            s->nll += token_nll(logits + (size_t)k * nv, nv, s->ids[s->n_prefill + j]);
        }
    }
out:
    for (int i = 0; seqs && i < n_seg; i++) tl_seq_free(seqs[i]);
    free(seqs); free(act); free(tok); free(nt); free(idx); free(logits);
    return rc;
}

int kv_greedy_batch(tl_model *m, const int32_t *const *prompts, const int *n_prompt, int n_prompts, int n,
                    int32_t *out, size_t ld) {
    tl_generate_params gp = tl_generate_default_params();
    gp.max_tokens = n;
    gp.ignore_eos = 1;
    gp.no_cache = 1;
    int64_t *ids = calloc((size_t)n_prompts, sizeof *ids);
    int *got = calloc((size_t)n_prompts, sizeof *got), rc = TL_OK, live = 0, n_sub = 0;
    if (!ids || !got) rc = TL_ERR_NOMEM;
    for (; !rc && n_sub < n_prompts; n_sub++)
        if ((rc = tl_request_submit(m, prompts[n_sub], n_prompt[n_sub], &gp, NULL, &ids[n_sub]))) break;
    while (!rc) {
        if ((live = tl_model_step(m)) < 0) { rc = live; break; }
        for (int p = 0; p < n_sub; p++) {
            int k = tl_request_take(m, ids[p], out + (size_t)p * ld + got[p], n - got[p], NULL);
            if (k < 0) { rc = k; break; }
            got[p] += k;
        }
        if (live == 0) break;
    }
    for (int p = 0; p < n_sub; p++) {
        if (!rc && got[p] != n) rc = TL_ERR_STATE;
        tl_request_release(m, ids[p]);
    }
    free(ids);
    free(got);
    return rc;
}

double kv_agreement(const int32_t *ref, const int32_t *gen, size_t ld, int n_prompts, int n, int *worst) {
    double sum = 0;
    *worst = n;
    for (int p = 0; p < n_prompts; p++) {
        int a = 0;
        while (a < n && gen[(size_t)p * ld + a] == ref[(size_t)p * ld + a]) a++;
        sum += a;
        if (a < *worst) *worst = a;
    }
    return n_prompts > 0 ? sum / n_prompts : n;
}
