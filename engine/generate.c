/* generate.c - synchronous generation: prefill the prompt in chunks, then
 * decode one token at a time until EOS or max_tokens. */
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "sampler.h"
#include "util.h"

#define PREFILL_CHUNK 256

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

/* Checks a prompt against the model; messages name the offending value. */
static int check_prompt(const tl_model *m, const int32_t *prompt, int n_prompt, int max_tokens) {
    if (!prompt || n_prompt < 1)
        return tl_set_error(TL_ERR_INVALID_ARG, "prompt is empty (n_prompt %d)", n_prompt);
    if (max_tokens < 1) return tl_set_error(TL_ERR_INVALID_ARG, "max_tokens %d must be >= 1", max_tokens);
    if ((int64_t)n_prompt + max_tokens > m->max_seq_len)
        return tl_set_error(TL_ERR_TOO_LONG, "prompt length %d + max_tokens %d exceeds max_seq_len %d", n_prompt,
                            max_tokens, m->max_seq_len);
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= m->hp.n_vocab)
            return tl_set_error(TL_ERR_INVALID_ARG, "prompt token %d at index %d is outside the vocab [0, %d)",
                                prompt[i], i, m->hp.n_vocab);
    return TL_OK;
}

int tl_generate(tl_model *m, const int32_t *prompt, int n_prompt, tl_generate_params gp, int32_t *out, int cap) {
    if (!m) return tl_set_error(TL_ERR_INVALID_ARG, "model must not be NULL");
    if (!m->arch) return tl_set_error(TL_ERR_STATE, "model was opened vocab_only; it cannot generate");
    if (cap < 0 || (!out && cap > 0)) return tl_set_error(TL_ERR_INVALID_ARG, "out/cap invalid (cap %d)", cap);
    int rc = check_prompt(m, prompt, n_prompt, gp.max_tokens);
    if (rc) return rc;
    int n_vocab = m->hp.n_vocab, limit = gp.max_tokens < cap ? gp.max_tokens : cap;
    tl_sampler smp;
    if ((rc = tl_sampler_init(&smp, &gp.sampling, n_vocab))) return rc;
    float *logits = malloc((size_t)n_vocab * sizeof *logits);
    int32_t *hist = malloc(((size_t)n_prompt + (size_t)limit + 1) * sizeof *hist);
    tl_seq *seq = NULL;
    if (!logits || !hist) { rc = tl_set_error(TL_ERR_NOMEM, "out of memory"); goto done; }
    if ((rc = tl_seq_new(m, gp.loops, &seq))) goto done;
    memcpy(hist, prompt, (size_t)n_prompt * sizeof *hist);
    for (int done = 0; done < n_prompt;) {
        int n = n_prompt - done < PREFILL_CHUNK ? n_prompt - done : PREFILL_CHUNK;
        const int32_t *toks = prompt + done;
        if ((rc = tl_batch_forward(m, &seq, &toks, &n, 1, done + n == n_prompt ? logits : NULL))) goto done;
        done += n;
    }
    int n_out = 0, eos = tl_tokenizer_eos(m->tok);
    while (n_out < limit) {
        int tok = tl_sampler_sample(&smp, logits, hist, n_prompt + n_out);
        if (tok == eos && !gp.ignore_eos) break;
        out[n_out] = tok;
        hist[n_prompt + n_out] = tok;
        n_out++;
        if (n_out == limit) break;
        const int32_t *toks = &out[n_out - 1];
        int one = 1;
        if ((rc = tl_batch_forward(m, &seq, &toks, &one, 1, logits))) goto done;
    }
    rc = n_out;
done:
    tl_seq_free(seq);
    free(hist);
    free(logits);
    tl_sampler_free(&smp);
    return rc;
}
