/* bench.c - `tinyloop bench` and the tensor-type summary of `tinyloop info`.
 * Prints prefill and decode tokens/s for one sequence and for a batch of
 * sequences decoding together, and the batch/single ratio, measured in one
 * run on this machine. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "forward.h"
#include "gguf.h"
#include "model.h"
#include "quants.h"
#include "tinyloop.h"
#include "util.h"

int tl_cli_print_tensor_types(const char *path) {
    gguf_file *f = gguf_open(path);
    if (!f) return -1;
    int64_t count[TL_TYPE_COUNT] = {0};
    for (uint64_t i = 0; i < f->n_tensors; i++) count[f->tensors[i].type]++;
    printf("tensor types ");
    for (int t = 0; t < TL_TYPE_COUNT; t++)
        if (count[t]) printf(" %s:%lld", tl_type_info(t)->name, (long long)count[t]);
    printf("  (%llu tensors, GGUF v%u)\n", (unsigned long long)f->n_tensors, f->version);
    gguf_close(f);
    return 0;
}

/* The same batch through requests (the scheduler, sampling where the
 * backend does it, greedy): generated tokens/s from the first step on. */
static double serve_rate(tl_model *m, const int32_t *prompt, int n_prompt, int n_gen, int batch) {
    tl_generate_params gp = tl_generate_default_params();
    gp.max_tokens = n_gen;
    gp.ignore_eos = 1;
    gp.no_cache = 1;
    int64_t *ids = malloc((size_t)batch * sizeof *ids);
    if (!ids) return -1;
    double t0 = tl_now();
    int n = 0;
    for (; n < batch; n++)
        if (tl_request_submit(m, prompt + (n % 4), n_prompt - (n % 4) > 0 ? n_prompt - (n % 4) : 1, &gp, NULL,
                              &ids[n]))
            break;
    while (n == batch && tl_model_step(m) > 0) {
    }
    double dt = tl_now() - t0;
    long got = 0;
    for (int i = 0; i < n; i++) {
        tl_request_info ri;
        if (tl_request_get_info(m, ids[i], &ri) == TL_OK) got += ri.n_generated;
        tl_request_release(m, ids[i]);
    }
    free(ids);
    return n == batch ? got / dt : -1;
}

/* CPU seconds of the whole process: on a shared machine the wall clock
 * counts other processes' turns, CPU time (mostly) does not. */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* n_seq new sequences, sequence b prefilled with the short prompt from its
 * (b % 4)th token, then n_gen decode steps of all of them together; returns
 * the seconds of the steps (-1 on an error) and frees the sequences. With
 * ph, the steps' phases (matmul, attention, all) are added to it. */
static double decode_short(tl_model *m, tl_seq **seqs, int n_seq, const int32_t *prompt, int short_len, int n_gen,
                           int nv, const int32_t **toks, int32_t *next, const int *ones, float *logits, double ph[3]) {
    double dt = -1;
    int made = 0;
    for (; made < n_seq; made++) {
        if (tl_seq_new(m, 0, &seqs[made])) goto out;
        const int32_t *p = prompt + (made % 4);
        int n = short_len - (made % 4) > 0 ? short_len - (made % 4) : 1;
        if (tl_batch_forward(m, &seqs[made], &p, &n, 1, NULL)) {
            made++;
            goto out;
        }
    }
    if (ph) tl_forward_profile(m, 1, NULL);
    double t0 = tl_now();
    for (int i = 0; i < n_gen; i++) {
        for (int b = 0; b < n_seq; b++) {
            next[b] = (int32_t)((i * 131 + b * 17 + 3) % nv);
            toks[b] = &next[b];
        }
        if (tl_batch_forward(m, seqs, toks, ones, n_seq, logits)) goto out;
    }
    dt = tl_now() - t0;
    if (ph) tl_forward_profile(m, 0, ph);
out:
    if (ph && dt < 0) tl_forward_profile(m, 0, NULL);
    for (int b = 0; b < made; b++) {
        tl_seq_free(seqs[b]);
        seqs[b] = NULL;
    }
    return dt;
}

/* n_gen single-token steps of seq, tokens from first by a fixed rule;
 * returns their seconds, or -1 on an error. */
static double decode_one(tl_model *m, tl_seq *seq, int32_t first, int n_gen, int nv, float *logits) {
    int32_t next = first;
    const int32_t *tok = &next;
    int one = 1;
    double t0 = tl_now();
    for (int i = 0; i < n_gen; i++) {
        next = (int32_t)((next * 31 + 7) % nv);
        if (tl_batch_forward(m, &seq, &tok, &one, 1, logits)) return -1;
    }
    return tl_now() - t0;
}

/* One "phases" line (tl_forward_profile's seconds), if any were timed. */
static void print_phases(const char *name, const char *what, const double ph[3]) {
    if (ph[2] > 0)
        printf("%-34s phases of %s:  matmul %.0f%%  attention %.0f%%  other %.0f%%  (%.3f s)\n", name, what,
               100 * ph[0] / ph[2], 100 * ph[1] / ph[2], 100 * (ph[2] - ph[0] - ph[1]) / ph[2], ph[2]);
}

static int bench_one(const char *path, tl_model_params mp, int n_gen, int prompt_len, int batch) {
    tl_model *m;
    if (tl_model_open(path, mp, &m) != TL_OK) {
        fprintf(stderr, "bench: %s\n", tl_last_error());
        return -1;
    }
    tl_model_info info;
    tl_model_get_info(m, &info);
    if (prompt_len + n_gen > info.max_seq_len) prompt_len = info.max_seq_len - n_gen;
    if (prompt_len < 1) prompt_len = 1;
    /* The batch needs room for every sequence at once: reopen with enough KV. */
    int depth_blocks = info.n_layer, bs = info.kv_block_size;
    size_t need = (size_t)(batch + 1) * (size_t)((prompt_len + n_gen + bs - 1) / bs + 1) * (size_t)depth_blocks;
    if (mp.kv_mem == 0 && need > (size_t)info.kv_blocks_total) {
        mp.kv_mem = need * (info.kv_bytes / (size_t)info.kv_blocks_total);
        tl_model_close(m);
        if (tl_model_open(path, mp, &m) != TL_OK) {
            fprintf(stderr, "bench: %s\n", tl_last_error());
            return -1;
        }
        tl_model_get_info(m, &info);
    }
    int nv = info.n_vocab, rc = -1;
    int32_t *prompt = malloc((size_t)prompt_len * sizeof *prompt);
    float *logits = malloc((size_t)nv * batch * sizeof *logits);
    tl_seq **seqs = calloc((size_t)batch, sizeof *seqs);
    const int32_t **toks = calloc((size_t)batch, sizeof *toks);
    int32_t *next = malloc((size_t)batch * sizeof *next);
    int *ones = malloc((size_t)batch * sizeof *ones);
    if (!prompt || !logits || !seqs || !toks || !next || !ones) goto out;
    uint32_t r = 12345;
    for (int i = 0; i < prompt_len; i++) prompt[i] = (int32_t)((r = r * 1103515245u + 12345u) >> 8) % nv;
    for (int i = 0; i < batch; i++) ones[i] = 1;

    /* single sequence: prefill then decode */
    /* prefill: best of 3 (the first also warms caches and scratch) */
    double t_prefill = 1e30, c_prefill = 1e30, t0;
    for (int rep = 0; rep < 3; rep++) {
        if (tl_seq_new(m, 0, &seqs[0])) goto out;
        t0 = tl_now();
        double c0 = cpu_now();
        const int32_t *pp = prompt;
        if (tl_batch_forward(m, seqs, &pp, &prompt_len, 1, logits)) goto fail;
        double dt = tl_now() - t0, dc = cpu_now() - c0;
        if (dt < t_prefill) t_prefill = dt;
        if (dc < c_prefill) c_prefill = dc;
        if (rep < 2) {
            tl_seq_free(seqs[0]);
            seqs[0] = NULL;
        }
    }
    /* one more prefill with the phases timed (CPU backend only) */
    double ph[3] = {0, 0, 0};
    const int cpu = strcmp(info.backend, "cpu") == 0; /* phases are timed on the CPU backend only */
    if (cpu) {
        tl_seq_free(seqs[0]);
        if (tl_seq_new(m, 0, &seqs[0])) goto fail;
        tl_forward_profile(m, 1, NULL);
        const int32_t *pp = prompt;
        if (tl_batch_forward(m, seqs, &pp, &prompt_len, 1, logits)) goto fail;
        tl_forward_profile(m, 0, ph);
    }
    double dph[3] = {0, 0, 0}; /* its phases: the clock reads are ~100 ns a layer */
    if (cpu) tl_forward_profile(m, 1, NULL);
    double t_decode = decode_one(m, seqs[0], 0, n_gen, nv, logits);
    if (cpu) tl_forward_profile(m, 0, t_decode < 0 ? NULL : dph);
    if (t_decode < 0) goto fail;
    tl_seq_free(seqs[0]);
    seqs[0] = NULL;

    /* Decode as llama-bench's tg test measures it, the figure its -n N is
     * compared with: N single-token steps from an empty context, the mean
     * of 3 runs. The run above decodes after the whole prompt, reading its
     * K/V on top of the weights every step (on the 110M models ~19 MB
     * after 512 tokens, 16% of the Q8_0 weights); it is printed too. */
    double t_tg = 0;
    for (int rep = 0; rep < 3; rep++) {
        if (tl_seq_new(m, 0, &seqs[0])) goto fail;
        double dt = decode_one(m, seqs[0], 1, n_gen, nv, logits);
        if (dt < 0) goto fail;
        t_tg += dt;
        tl_seq_free(seqs[0]);
        seqs[0] = NULL;
    }
    t_tg /= 3;

    /* Batch against one sequence at the same contexts (the short prompts),
     * interleaved over 3 rounds, best of each: the ratio does not drift
     * with the host between the two, and the single sequence is not
     * slowed by the long prompt's K/V. The last round's batch steps are
     * also timed by phase. */
    int short_len = prompt_len < 16 ? prompt_len : 16;
    double t_one = 1e30, t_batch = 1e30, bph[3] = {0, 0, 0};
    for (int round = 0; round < 3; round++) {
        for (int n_seq = 1; n_seq <= batch; n_seq += batch > 1 ? batch - 1 : 1) {
            double dt = decode_short(m, seqs, n_seq, prompt, short_len, n_gen, nv, toks, next, ones, logits,
                                     round == 2 && n_seq == batch && cpu ? bph : NULL);
            if (dt < 0) goto fail;
            if (n_seq == 1 && dt < t_one) t_one = dt;
            if (n_seq == batch && dt < t_batch) t_batch = dt;
        }
    }
    double srv = serve_rate(m, prompt, short_len, n_gen, batch);
    if (srv < 0) goto fail;
    double pf = prompt_len / t_prefill, tg = n_gen / t_tg, dec = n_gen / t_decode, one = n_gen / t_one, bat = (double)n_gen * batch / t_batch;
    const char *name = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    /* A decode step reads every weight once, except the token embedding,
     * of which it reads one row unless the embedding is also the output
     * matrix: those bytes x steps/s is the bandwidth it achieves (a lower
     * bound; KV reads come on top). (Counting the whole embedding of an
     * untied model overstated it, by 18% on the 110M models.) */
    size_t step_bytes = info.weight_bytes;
    if (m->output.data != m->tok_embd.data)
        step_bytes -= tl_row_size(m->tok_embd.type, m->tok_embd.n_in) * (size_t)(m->tok_embd.n_out - 1);
    /* and of a mixture-of-experts layer, the n_expert_used experts a token chose */
    for (int l = 0; m->hp.n_expert && l < m->hp.n_layer; l++) {
        const tl_weight *x[3] = {&m->layers[l].x_gate[0], &m->layers[l].x_up[0], &m->layers[l].x_down[0]};
        size_t one = 0;
        for (int i = 0; i < 3; i++) one += tl_row_size(x[i]->type, x[i]->n_in) * (size_t)x[i]->n_out;
        step_bytes -= one * (size_t)(m->hp.n_expert - m->hp.n_expert_used);
    }
    char where[96]; /* what ran it: the CPU's threads and ISA, or the plugin (and its graphs setting) */
    if (cpu) {
        snprintf(where, sizeof where, "cpu, %d threads, %s, kv %s", info.n_threads, info.isa, info.kv_mode);
    } else {
        const char *g = getenv("TINYLOOP_CUDA_GRAPHS");
        snprintf(where, sizeof where, "%s%s, kv %s", info.backend,
                 strcmp(info.backend, "cuda") ? "" : g && !strcmp(g, "0") ? ", graphs off" : ", graphs on", info.kv_mode);
    }
    /* before the main line: tools read the last line */
    char what[64];
    snprintf(what, sizeof what, "one prefill(%d)", prompt_len);
    print_phases(name, what, ph);
    snprintf(what, sizeof what, "%d decode steps after it", n_gen);
    print_phases(name, what, dph);
    snprintf(what, sizeof what, "decode steps of %d sequences", batch);
    print_phases(name, what, bph);
    /* Where batching must stop: a batch step is the prefill's matmuls on
     * fewer tokens (each weight read once for the batch instead of once
     * for the prompt), so once the weights' reads are shared the batch
     * runs at about the prefill's rate. The batch goal is judged against
     * this: on AVX2 without VNNI (the int8 products bound by the multiply
     * ports) prefill is 4-5x a memory-bound decode of the 110M Q8_0 model,
     * and no batch reaches 6x; with VNNI or AMX it is far above. (The
     * second figure counts the logits rows: 110M, 16 sequences, 3.1x.) */
    /* The prefill computes one logits row for its prompt, a batch step
     * one a sequence: at the prefill's multiply-add rate the batch makes
     * pf * (L + O / prompt_len) / (L + O) tokens a second (L: a token's
     * layer multiply-adds, O: the output matrix's). */
    double lay = 0, outm = (double)m->output.n_in * (double)m->output.n_out;
    for (int l = 0; l < m->hp.n_layer; l++) {
        tl_layer *L = &m->layers[l];
        tl_weight *ws[12];
        for (int i = 0, n = tl_layer_matrices(L, ws); i < n; i++) lay += (double)ws[i]->n_in * (double)ws[i]->n_out;
        if (L->x_gate) /* the experts a token runs through */
            lay += 3.0 * m->hp.n_expert_used * (double)L->x_gate[0].n_in * (double)L->x_gate[0].n_out;
    }
    const double cap = pf * (lay + outm / prompt_len) / (lay + outm);
    printf("%-34s batch bound: prefill(%d) %.1f tok/s / one sequence %.1f tok/s = %.2fx; at the prefill's multiply-add "
           "rate with a logits row a sequence %.2fx; batch%d reached %.2fx of that\n",
           name, prompt_len, pf, one, pf / one, cap / one, batch, bat / cap);
    printf("%-34s %5.1f MiB  prefill(%d) %9.1f tok/s (%.1f per CPU-s)  decode %8.1f tok/s (%.1f GB/s of weights; after "
           "the prompt %.1f tok/s)  batch%d decode %9.1f tok/s  batch/single %.2fx (one sequence at the batch's contexts %.1f "
           "tok/s; %.2fx the decode after the prompt)  requests%d %9.1f tok/s  [%s]\n",
           name, (double)info.weight_bytes / (1 << 20), prompt_len, pf, prompt_len / c_prefill, tg, (double)step_bytes * tg / 1e9,
           dec, batch, bat, bat / one, one, bat / dec, batch, srv, where);
    rc = 0;
    goto out;
fail:
    fprintf(stderr, "bench: %s: %s\n", path, tl_last_error());
out:
    for (int b = 0; seqs && b < batch; b++) tl_seq_free(seqs[b]);
    free(prompt);
    free(logits);
    free(seqs);
    free(toks);
    free(next);
    free(ones);
    tl_model_close(m);
    return rc;
}

/* STREAM-like read bandwidth of one thread over 256 MiB (what a decode
 * step does with the weights), best of 3. */
static double read_bandwidth(void) {
    const size_t n = (size_t)64 << 20;
    float *a = tl_alloc_aligned(n * sizeof(float));
    if (!a) return 0;
    for (size_t i = 0; i < n; i++) a[i] = (float)(i & 7);
    double best = 1e30;
    volatile float sink = 0;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = tl_now();
        sink += tl_dot_f32(a, a, (int64_t)n); /* same pointer: each line is fetched once */
        double dt = tl_now() - t0;
        if (dt < best) best = dt;
    }
    (void)sink;
    tl_free_aligned(a);
    return n * sizeof(float) / best / 1e9;
}

int tl_cli_bench(int n_models, const char *const *models, tl_model_params mp, int n_gen, int prompt_len, int batch) {
    static const char *defaults[] = {"../shared/models/stories260K.gguf"};
    if (n_models == 0) {
        models = defaults;
        n_models = 1;
    }
    printf("memory read bandwidth (STREAM-like, one thread, 256 MiB): %.1f GB/s\n", read_bandwidth());
    int fails = 0;
    for (int i = 0; i < n_models; i++) fails += bench_one(models[i], mp, n_gen, prompt_len, batch) != 0;
    return fails ? 1 : 0;
}
