/* test_model.c - the engine end to end: llama.cpp's greedy tokens on
 * stories260K, batch == single, quantized == dequantized twin, looped ==
 * unrolled, and clear errors for bad input. */
#include <stdint.h>
#include <unistd.h>

#include "quants.h"
#include "ref_cases.h"
#include "shape.h"
#include "test.h"
#include "testmodel.h"
#include "tinyloop.h"

/* The references (llama.cpp's, ik_llama.cpp's) ran with f16 KV: these
 * params pin it, whatever TINYLOOP_KV_* says. */
static tl_model_params f16_params(void) {
    tl_model_params p = tl_model_default_params();
    p.kv_type = TL_KV_F16;
    return p;
}

static void test_reference(const char *shared) {
    char path[512];
    ref_case cases[8];
    int n_cases = ref_load_shared(shared, path, sizeof path, cases, 8);
    CHECK(n_cases == 5, "the reference file holds 5 prompts (got %d)", n_cases);
    for (int kv = 0; kv < 2; kv++) {
        tl_model_params mp = tl_model_default_params();
        mp.kv_type = kv ? TL_KV_F32 : TL_KV_F16;
        tl_model *m = NULL;
        int rc = tl_model_open(path, mp, &m);
        CHECK(rc == TL_OK, "stories260K opens (%s)", tl_last_error());
        if (rc) return;
        for (int c = 0; c < n_cases; c++) {
            int32_t ids[64], gen[64];
            int n = tl_tokenize(m, cases[c].prompt, (int)strlen(cases[c].prompt), 1, 0, ids, 64);
            CHECK(ref_same_ids(ids, n, cases[c].prompt_ids, cases[c].n_prompt), "'%s' tokenizes to the reference ids",
                  cases[c].prompt);
            tl_generate_params gp = tl_generate_default_params();
            gp.max_tokens = cases[c].n_gen;
            int ng = tl_generate(m, cases[c].prompt_ids, cases[c].n_prompt, gp, gen, 64);
            CHECK(ref_same_ids(gen, ng, cases[c].gen_ids, cases[c].n_gen),
                  "greedy generation of '%s' with %s KV equals llama.cpp's 48 tokens (got %d tokens, first diff at %d)",
                  cases[c].prompt, kv ? "f32" : "f16", ng, ref_first_diff(gen, ng, cases[c].gen_ids, cases[c].n_gen));
        }
        tl_model_close(m);
    }
    /* every ISA level gives the same greedy tokens on the first prompt */
    int best = tl_kernels_isa();
    const tl_model_params f16 = f16_params();
    for (int isa = TL_ISA_SCALAR; isa <= best; isa++) {
        if (tl_kernels_set_isa(isa) != isa) continue;
        tl_model *m = NULL;
        if (tl_model_open(path, f16, &m)) continue;
        int32_t gen[64];
        tl_generate_params gp = tl_generate_default_params();
        gp.max_tokens = cases[0].n_gen;
        int ng = tl_generate(m, cases[0].prompt_ids, cases[0].n_prompt, gp, gen, 64);
        CHECK(ref_same_ids(gen, ng, cases[0].gen_ids, cases[0].n_gen), "the %s kernels reproduce the reference",
              tl_isa_name(isa));
        tl_model_close(m);
    }
    tl_kernels_set_isa(best);

    /* max_seq_len 512 although the file says 128 */
    tl_model_params mp = tl_model_default_params();
    mp.max_seq_len = 512;
    tl_model *m = NULL;
    CHECK(tl_model_open(path, mp, &m) == TL_OK, "stories260K opens with max_seq_len 512");
    if (m) {
        static int32_t gen[512];
        tl_generate_params gp = tl_generate_default_params();
        gp.max_tokens = 400;
        gp.ignore_eos = 1;
        int ng = tl_generate(m, cases[0].prompt_ids, cases[0].n_prompt, gp, gen, 512);
        CHECK(ng == 400, "it generates 400 tokens past the file's 128 context (got %d: %s)", ng, tl_last_error());
        gp.max_tokens = 512;
        int rc = tl_generate(m, cases[0].prompt_ids, cases[0].n_prompt, gp, gen, 512);
        CHECK(rc == TL_ERR_TOO_LONG && strstr(tl_last_error(), "prompt length 5 + max_tokens 512 exceeds max_seq_len 512"),
              "prompt + max_tokens past max_seq_len fails with a message naming the values (%s)", tl_last_error());
        tl_model_close(m);
    }
}

/* ---- synthetic models ------------------------------------------------------ */

static const char *tmp_path(const char *name) {
    static char buf[8][256];
    static int k;
    char *p = buf[k++ % 8];
    snprintf(p, 256, "/tmp/tl_test_%d_%s.gguf", (int)getpid(), name);
    return p;
}

/* Logits of the last token after feeding `toks` to a fresh sequence. */
static int logits_of(tl_model *m, int loops, const int32_t *toks, int n, float *out) {
    tl_seq *s;
    if (tl_seq_new(m, loops, &s)) return -1;
    int rc = tl_batch_forward(m, &s, &toks, &n, 1, out);
    tl_seq_free(s);
    return rc;
}

static void test_batch_equals_single(void) {
    tm_spec s = tm_default_spec();
    const char *path = tmp_path("batch");
    CHECK(tm_write(&s, path) == 0, "the synthetic model is written");
    tl_model *m;
    tl_model_params mp = tl_model_default_params();
    mp.kv_block_size = 4; /* many block boundaries */
    if (tl_model_open(path, mp, &m)) { CHECK(0, "synthetic model opens: %s", tl_last_error()); return; }
    int nv = tl_model_n_vocab(m);
    int32_t seqtok[3][40];
    int lens[3] = {37, 5, 1};
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 40; j++) seqtok[i][j] = (int32_t)((i * 97 + j * 31 + 7) % nv);
    /* alone: prefill lens[i], then 3 decode steps, keep all logits */
    float *alone = malloc(sizeof(float) * (size_t)nv * 3 * 4), *batch = malloc(sizeof(float) * (size_t)nv * 3);
    for (int i = 0; i < 3; i++) {
        tl_seq *sq;
        tl_seq_new(m, 0, &sq);
        const int32_t *p = seqtok[i];
        int n = lens[i];
        tl_batch_forward(m, &sq, &p, &n, 1, alone + ((size_t)i * 4) * nv);
        for (int st = 1; st < 4; st++) {
            p = &seqtok[i][lens[i] + st - 1];
            n = 1;
            tl_batch_forward(m, &sq, &p, &n, 1, alone + ((size_t)i * 4 + st) * nv);
        }
        tl_seq_free(sq);
    }
    /* together: seq 0 and 1 prefill in one batch; seq 2 joins at step 1 with
     * its prefill while the others decode */
    tl_seq *sq[3];
    for (int i = 0; i < 3; i++) tl_seq_new(m, 0, &sq[i]);
    const int32_t *p[3] = {seqtok[0], seqtok[1], seqtok[2]};
    int n[3] = {lens[0], lens[1], lens[2]};
    int rc = tl_batch_forward(m, sq, p, n, 2, batch);
    double worst = 0;
    for (int i = 0; i < 2; i++) { double e = test_nmse(batch + (size_t)i * nv, alone + ((size_t)i * 4) * nv, nv); if (e > worst) worst = e; }
    int step_of[3] = {1, 1, 0};
    for (int st = 1; st < 5 && rc == 0; st++) {
        tl_seq *bs[3];
        int k = 0, who[3];
        for (int i = 0; i < 3; i++) {
            if (i == 2 && st == 1) { bs[k] = sq[2]; p[k] = seqtok[2]; n[k] = lens[2]; who[k++] = 2; continue; }
            if (step_of[i] >= 4) continue;
            bs[k] = sq[i];
            p[k] = &seqtok[i][lens[i] + step_of[i] - 1];
            n[k] = 1;
            who[k++] = i;
        }
        if (!k) break;
        rc = tl_batch_forward(m, bs, p, n, k, batch);
        for (int j = 0; j < k; j++) {
            int i = who[j];
            double e = test_nmse(batch + (size_t)j * nv, alone + ((size_t)i * 4 + step_of[i]) * nv, nv);
            if (e > worst) worst = e;
            step_of[i]++;
        }
    }
    CHECK(rc == 0, "mixed prefill/decode batches run (%s)", tl_last_error());
    CHECK(worst == 0.0, "a batch of sequences gives the same logits as each sequence alone (nmse %g)", worst);
    for (int i = 0; i < 3; i++) tl_seq_free(sq[i]);
    tl_model_info info;
    tl_model_get_info(m, &info);
    CHECK(info.kv_blocks_free == info.kv_blocks_total, "freeing sequences returns every KV block (%d of %d free)",
          info.kv_blocks_free, info.kv_blocks_total);
    free(alone);
    free(batch);
    tl_model_close(m);
    remove(path);
}

/* A decoding token (a chunk of one: its KV heads read block by block,
 * decode_heads) gives bitwise the logits of the same token at the end of
 * a prefill chunk (one task per head), for head shapes that take each
 * attention path (f16 rows in place, rows widened for a group of 4, heads
 * under 32 lanes), one to three threads (a run of all heads, of half, one
 * head a task) and every K/V type (f16 / f32 / h, and q8 / q4, whose
 * heads of 32 lanes or more take the int8 scores and sums), over many
 * blocks and a window. */
static void test_decode_equals_chunk(void) {
    static const struct { int embd, head, head_kv; } shapes[] = {{128, 4, 4}, {128, 4, 2}, {256, 8, 2}, {64, 4, 2}};
    static const char *modes[] = {"f16", "f32", "h:f16", "q8", "q4", "q8,f16", "f16,q8"};
    enum { N = 45 };
    int bad = 0, runs = 0;
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        tm_spec sp = tm_default_spec();
        sp.n_embd = shapes[k].embd;
        sp.n_head = shapes[k].head;
        sp.n_head_kv = shapes[k].head_kv;
        sp.n_ff = 2 * sp.n_embd;
        const char *path = tmp_path("decode_chunk");
        if (tm_write(&sp, path)) { CHECK(0, "the model of shape %zu is written", k); continue; }
        for (int nth = 1; nth <= 3; nth++)
            for (size_t md = 0; md < sizeof modes / sizeof modes[0]; md++)
                for (int win = 0; win <= 24; win += 24) {
                    tl_model_params mp = tl_model_default_params();
                    mp.n_threads = nth;
                    mp.kv_block_size = 8;
                    mp.kv_mode = modes[md];
                    tl_model *m;
                    if (tl_model_open(path, mp, &m)) { CHECK(0, "open %s: %s", modes[md], tl_last_error()); continue; }
                    int nv = tl_model_n_vocab(m);
                    int32_t tok[N];
                    for (int j = 0; j < N; j++) tok[j] = (int32_t)((j * 37 + 11) % nv);
                    float *whole = calloc((size_t)nv, sizeof(float)), *step = calloc((size_t)nv, sizeof(float));
                    if (!whole || !step) { CHECK(0, "logits buffers"); free(whole); free(step); tl_model_close(m); continue; }
                    tl_seq *a = NULL, *b = NULL;
                    const int32_t *p = tok;
                    int n = N, rc = tl_seq_new(m, 0, &a) | tl_seq_new(m, 0, &b);
                    if (!rc) {
                        a->window = b->window = win;
                        rc = tl_batch_forward(m, &a, &p, &n, 1, whole);
                        n = N - 3;
                        rc |= tl_batch_forward(m, &b, &p, &n, 1, step);
                    }
                    for (int j = N - 3; j < N && !rc; j++) {
                        p = tok + j;
                        n = 1;
                        rc = tl_batch_forward(m, &b, &p, &n, 1, step);
                    }
                    if (rc || memcmp(whole, step, sizeof(float) * (size_t)nv)) {
                        bad++;
                        printf("  differs: %d/%d/%d heads, %d threads, kv %s, window %d (rc %d)\n", shapes[k].embd,
                               shapes[k].head, shapes[k].head_kv, nth, modes[md], win, rc);
                    }
                    runs++;
                    tl_seq_free(a);
                    tl_seq_free(b);
                    free(whole);
                    free(step);
                    tl_model_close(m);
                }
        remove(path);
    }
    CHECK(bad == 0 && runs == 168, "a decoding token's logits are bitwise those at the end of a prefill chunk (%d of %d differ)",
          bad, runs);
}

static void test_quant_twins(void) {
    static const int types[] = {TL_TYPE_F16,  TL_TYPE_BF16, TL_TYPE_Q8_0, TL_TYPE_Q4_0, TL_TYPE_Q4_1, TL_TYPE_Q5_0,
                                TL_TYPE_Q5_1, TL_TYPE_IQ4_NL, TL_TYPE_IQ4_XS, TL_TYPE_Q2_K, TL_TYPE_Q3_K, TL_TYPE_Q4_K, TL_TYPE_Q5_K, TL_TYPE_Q6_K,
                                TL_TYPE_IQ2_XXS, TL_TYPE_IQ2_XS, TL_TYPE_IQ2_S, TL_TYPE_IQ1_S, TL_TYPE_IQ1_M, TL_TYPE_IQ3_XXS,
                                TL_TYPE_IQ3_S};
    /* Weights are identical in both files; the remaining error comes from
     * quantizing activations to Q8_0 / Q8_K in the packed dot products. */
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        int type = types[ti];
        tm_spec s = tm_default_spec();
        s.n_embd = 256;
        s.n_ff = 512;
        s.n_vocab = 512;
        s.n_head = 4;
        s.n_head_kv = 2;
        s.type = type;
        const char *qp = tmp_path("q"), *fp = tmp_path("f");
        if (tm_write(&s, qp)) { CHECK(0, "write %s model", tl_type_info(type)->name); continue; }
        s.twin_f32 = 1;
        tm_write(&s, fp);
        tl_model *mq = NULL, *mf = NULL;
        tl_model_params mp = tl_model_default_params();
        mp.kv_type = TL_KV_F16; /* the tolerance is the weights' quantization alone */
        tl_model_open(qp, mp, &mq);
        tl_model_open(fp, mp, &mf);
        CHECK(mq && mf, "%s model and its f32 twin open (%s)", tl_type_info(type)->name, tl_last_error());
        if (mq && mf) {
            int32_t toks[20];
            for (int i = 0; i < 20; i++) toks[i] = (int32_t)((i * 53 + 11) % 512);
            float lq[512], lf[512];
            logits_of(mq, 0, toks, 20, lq);
            logits_of(mf, 0, toks, 20, lf);
            double e = test_nmse(lq, lf, 512);
            double tol = tl_type_info(type)->vec_dot_type == TL_TYPE_F32 ? 1e-5 : 4e-3;
            printf("  %-5s model vs f32 twin: logits nmse %.2e (tolerance %.0e)\n", tl_type_info(type)->name, e, tol);
            CHECK(e < tol, "%s model matches its dequantized f32 twin (nmse %.3g < %.0g)", tl_type_info(type)->name, e,
                  tol);
        }
        tl_model_close(mq);
        tl_model_close(mf);
        remove(qp);
        remove(fp);
    }
}

static void test_loops(void) {
    tm_spec s = tm_default_spec();
    s.n_layer = 4;
    s.loop_start = 1;
    s.loop_end = 3;
    s.loop_default = 2;
    const char *lp = tmp_path("loop"), *up = tmp_path("unroll"), *pp = tmp_path("plain");
    CHECK(tm_write(&s, lp) == 0, "a looped model is written");
    tl_model *ml = NULL;
    tl_model_open(lp, tl_model_default_params(), &ml);
    CHECK(ml != NULL, "the looped model opens (%s)", tl_last_error());
    if (!ml) return;
    tl_model_info info;
    tl_model_get_info(ml, &info);
    CHECK(info.loop_start == 1 && info.loop_end == 3 && info.loop_default == 2, "loop keys are read ([%d,%d) x %d)",
          info.loop_start, info.loop_end, info.loop_default);
    int32_t toks[21];
    for (int i = 0; i < 21; i++) toks[i] = (int32_t)((i * 7 + 3) % 320);
    for (int k = 1; k <= 3; k++) {
        tm_spec u = s;
        u.unroll = k;
        tm_write(&u, up);
        tl_model *mu = NULL;
        tl_model_open(up, tl_model_default_params(), &mu);
        float a[320], b[320];
        int ra = logits_of(ml, k, toks, 21, a), rb = mu ? logits_of(mu, 0, toks, 21, b) : -1;
        CHECK(ra == 0 && rb == 0 && test_nmse(a, b, 320) == 0.0,
              "loops=%d gives the same logits as the weights unrolled %d times (nmse %g)", k, k, test_nmse(a, b, 320));
        tl_model_close(mu);
    }
    /* KV memory follows the depth in use: 2 + 2*loops blocks per logical block */
    for (int k = 1; k <= 3; k += 2) {
        tl_seq *sq;
        tl_seq_new(ml, k, &sq);
        const int32_t *p = toks;
        int n = 16;
        tl_model_get_info(ml, &info);
        int before = info.kv_blocks_free;
        tl_batch_forward(ml, &sq, &p, &n, 1, NULL);
        tl_model_get_info(ml, &info);
        CHECK(before - info.kv_blocks_free == 2 + 2 * k, "16 tokens at loops=%d take %d blocks (took %d)", k, 2 + 2 * k,
              before - info.kv_blocks_free);
        tl_seq_free(sq);
    }
    tl_model_close(ml);
    /* a load option sets a loop block on a plain model */
    tm_spec plain = tm_default_spec();
    plain.n_layer = 4;
    tm_write(&plain, pp);
    tl_model_params mp = tl_model_default_params();
    mp.loop_start = 1;
    mp.loop_end = 3;
    mp.loop_default = 2;
    tl_model *mo = NULL;
    CHECK(tl_model_open(pp, mp, &mo) == TL_OK, "loop_start/loop_end load options are accepted");
    if (mo) {
        tl_model_get_info(mo, &info);
        CHECK(info.loop_default == 2 && info.loop_end == 3, "the options set the loop block");
        tl_model_close(mo);
    }
    mp.loop_end = 9;
    int rc = tl_model_open(pp, mp, &mo);
    CHECK(rc == TL_ERR_INVALID_ARG && strstr(tl_last_error(), "[1, 9)"), "a loop block past the layers is rejected (%s)",
          tl_last_error());
    /* without a loop block, loops is 1 whatever the caller says */
    tl_model_open(pp, tl_model_default_params(), &mo);
    if (mo) {
        float a[320], b[320];
        logits_of(mo, 1, toks, 9, a);
        logits_of(mo, 5, toks, 9, b);
        CHECK(test_nmse(a, b, 320) == 0.0, "a model without a loop block ignores loops");
        tl_model_close(mo);
    }
    remove(lp);
    remove(up);
    remove(pp);
}

static void test_qwen2(void) {
    float l[3][320];
    int32_t toks[17];
    for (int i = 0; i < 17; i++) toks[i] = (int32_t)((i * 19 + 4) % 320);
    for (int k = 0; k < 3; k++) {
        tm_spec s = tm_default_spec();
        s.arch = "qwen2";
        s.bias = k; /* none, random, zero */
        const char *path = tmp_path("qwen2");
        tm_write(&s, path);
        tl_model *m = NULL;
        tl_model_open(path, tl_model_default_params(), &m);
        CHECK(m != NULL, "a qwen2 model (bias mode %d) opens (%s)", k, tl_last_error());
        if (m) logits_of(m, 0, toks, 17, l[k]);
        tl_model_close(m);
        remove(path);
    }
    CHECK(test_nmse(l[2], l[0], 320) == 0.0, "zero Q/K/V biases give the logits of no biases");
    CHECK(test_nmse(l[1], l[0], 320) > 1e-6, "random Q/K/V biases change the logits (nmse %g)", test_nmse(l[1], l[0], 320));
}

/* The cross-engine references' prompt and their greedy 24 tokens after it. */
static int greedy24(tl_model *m, int32_t ids[24], int32_t out[24]) { return tm_greedy_ref(m, 24, ids, out); }

/* qwen3: per-head Q/K norms before RoPE, a head size of its own. The
 * reference: ik_llama.cpp's llama-simple (greedy) printed, on this
 * synthetic model and prompt, exactly the bytes of these 24 tokens
 * (2026-12-06; at f32 the two engines differ only in summation order, and
 * the smallest top-2 logit gap over these steps is far above it). */
static void test_qwen3(void) {
    tm_spec s = tm_default_spec();
    s.arch = "qwen3";
    s.n_embd = 256;
    s.n_head = 4;
    s.n_head_kv = 2;
    s.head_dim = 96; /* q_dim 384 on a width of 256 */
    s.n_ff = 512;
    s.n_layer = 4;
    s.seed = 5;
    const char *path = tmp_path("qwen3");
    CHECK(tm_write(&s, path) == 0, "a synthetic qwen3 model is written");
    tl_model *m = NULL;
    tl_model_open(path, f16_params(), &m);
    CHECK(m != NULL, "a qwen3 model with heads of 96 on a width of 256 opens (%s)", m ? "" : tl_last_error());
    if (m) {
        tl_model_info info;
        tl_model_get_info(m, &info);
        CHECK(!strcmp(info.arch, "qwen3"), "its architecture reads qwen3 (%s)", info.arch);
        static const int32_t want_prompt[24] = {1,   260, 292, 271, 313, 265, 313, 262, 113, 260, 292, 272,
                                                313, 261, 113, 103, 260, 292, 113, 263, 119, 267, 100, 113};
        static const int32_t want[24] = {216, 216, 216, 216, 216, 216, 216, 216, 216, 216, 216, 216,
                                         236, 316, 316, 316, 316, 316, 316, 316, 36,  213, 36,  213};
        int32_t ids[24], out[24];
        int ng = greedy24(m, ids, out);
        CHECK(ng >= 0 && !memcmp(ids, want_prompt, sizeof want_prompt), "the prompt tokenizes as it did");
        CHECK(ng == 24 && !memcmp(out, want, sizeof want), "greedy tokens on a qwen3 model equal ik_llama.cpp's (%d)", ng);
        tl_model_close(m);
    }
    remove(path);

    /* a qwen3 file without the Q/K norms (a qwen2 model renamed) is refused, naming the tensor */
    tm_spec q2 = tm_default_spec();
    q2.arch = "qwen2";
    path = tmp_path("qwen3_nonorm");
    tm_write(&q2, path);
    CHECK(tm_patch_bytes(path, "qwen2", "qwen3") > 3, "a qwen2 file is renamed qwen3");
    m = NULL;
    int rc = tl_model_open(path, tl_model_default_params(), &m);
    CHECK(rc == TL_ERR_FORMAT && !m && strstr(tl_last_error(), "blk.0.attn_q_norm.weight"),
          "a qwen3 file without Q/K norms is refused, naming the tensor (%s)", tl_last_error());
    remove(path);

    /* a value head size other than the key's is refused, naming both */
    s.n_layer = 1;
    path = tmp_path("qwen3_vlen");
    tm_write(&s, path);
    CHECK(tm_patch_u32_key(path, "qwen3.attention.value_length", 64), "the file has a value_length key");
    m = NULL;
    rc = tl_model_open(path, tl_model_default_params(), &m);
    CHECK(rc == TL_ERR_UNSUPPORTED && !m && strstr(tl_last_error(), "value_length 64 differs from key_length 96"),
          "a value head size other than the key's is refused, naming both (%s)", tl_last_error());
    remove(path);
}

/* smollm3: llama's block, every 4th layer without RoPE. Three layers
 * (none of them NoPE) are a llama model bitwise; a fourth (NoPE) changes
 * the logits; greedy tokens of an 8-layer model (layers 3 and 7 NoPE)
 * printed ik_llama.cpp's llama-simple bytes exactly (2026-12-06); and the
 * CUDA backend, which ropes every layer, refuses it when forced. */
static void test_smollm3(void) {
    float l[2][2][320];
    int32_t toks[23];
    for (int i = 0; i < 23; i++) toks[i] = (int32_t)((i * 29 + 5) % 320);
    for (int layers = 3; layers <= 4; layers++)
        for (int a = 0; a < 2; a++) {
            tm_spec s = tm_default_spec();
            s.arch = a ? "smollm3" : NULL;
            s.n_layer = layers;
            const char *path = tmp_path("smollm3");
            tm_write(&s, path);
            tl_model *m = NULL;
            tl_model_open(path, tl_model_default_params(), &m);
            CHECK(m != NULL, "a %d-layer %s model opens (%s)", layers, a ? "smollm3" : "llama", m ? "" : tl_last_error());
            if (m) logits_of(m, 0, toks, 23, l[layers - 3][a]);
            tl_model_close(m);
            remove(path);
        }
    CHECK(!memcmp(l[0][0], l[0][1], sizeof l[0][0]), "3 smollm3 layers (all with RoPE) give llama's logits bitwise");
    CHECK(test_nmse(l[1][1], l[1][0], 320) > 1e-6, "a 4th smollm3 layer (no RoPE) changes the logits (nmse %g)",
          test_nmse(l[1][1], l[1][0], 320));

    tm_spec s = tm_default_spec();
    s.arch = "smollm3";
    s.n_embd = 256;
    s.n_head = 4;
    s.n_head_kv = 2;
    s.n_ff = 512;
    s.n_layer = 8;
    s.seed = 8;
    const char *path = tmp_path("smollm3_ref");
    CHECK(tm_write(&s, path) == 0, "an 8-layer smollm3 model is written");
    tl_model *m = NULL;
    tl_model_open(path, f16_params(), &m);
    if (m) {
        static const int32_t want[24] = {75,  241, 218, 218, 218, 218, 218, 218, 218, 218, 218, 218,
                                         239, 182, 182, 182, 241, 241, 241, 252, 182, 241, 252, 241};
        int32_t ids[24], out[24];
        int ng = greedy24(m, ids, out);
        CHECK(ng == 24 && !memcmp(out, want, sizeof want), "greedy tokens on a smollm3 model equal ik_llama.cpp's (%d)", ng);
        tl_model_close(m);
        /* store-h recomputes K from h through the same per-layer RoPE choice */
        tl_model_params mp = tl_model_default_params();
        mp.kv_mode = "h"; /* its own rounding, not f16 K/V's; the tokens are the same here */
        m = NULL;
        tl_model_open(path, mp, &m);
        ng = m ? greedy24(m, ids, out) : -1;
        CHECK(ng == 24 && !memcmp(out, want, sizeof want), "... and with store-h KV (%d)", ng);
        tl_model_close(m);
    }
    setenv("TINYLOOP_BACKEND", "cuda", 1);
    m = NULL;
    int rc = tl_model_open(path, tl_model_default_params(), &m);
    unsetenv("TINYLOOP_BACKEND");
    CHECK(rc == TL_ERR_UNSUPPORTED && !m && strstr(tl_last_error(), "smollm3's layers without RoPE run on the CPU only"),
          "TINYLOOP_BACKEND=cuda refuses smollm3, saying why (%s)", tl_last_error());
    tl_model_close(m);
    remove(path);
}

/* A block_count the file's tensors cannot back (a fuzzer found one that
 * made the loader size 20 GB of layers) is refused before any allocation. */
static void test_hostile_block_count(void) {
    tm_spec s = tm_default_spec();
    const char *path = tmp_path("blocks");
    tm_write(&s, path);
    CHECK(tm_patch_u32_key(path, "llama.block_count", 67174401), "the model has a block_count key");
    tl_model *m = NULL;
    int rc = tl_model_open(path, tl_model_default_params(), &m);
    CHECK(rc == TL_ERR_FORMAT && m == NULL && strstr(tl_last_error(), "block_count 67174401"),
          "a block_count the tensors cannot back is refused, naming it (%d: %s)", rc, tl_last_error());
    remove(path);
}

/* A weight in a type the file format names but tinyloop has no kernels
 * for (q8_K is an activation type) is refused at load, naming the tensor,
 * the type's name and its id. */
static void test_unsupported_weight_type(void) {
    tm_spec s = tm_default_spec();
    s.n_embd = 256, s.n_ff = 256, s.type = TL_TYPE_Q8_K;
    const char *path = tmp_path("q8k");
    CHECK(tm_write(&s, path) == 0, "a model with q8_K weights is written");
    tl_model *m = NULL;
    int rc = tl_model_open(path, tl_model_default_params(), &m);
    CHECK(rc == TL_ERR_UNSUPPORTED && m == NULL && strstr(tl_last_error(), "has type q8_K (15), which tinyloop cannot"),
          "a weight type without kernels is refused, naming it (%d: %s)", rc, tl_last_error());
    tl_model_close(m);
    remove(path);
}

static void test_errors_and_sampling(void) {
    tm_spec s = tm_default_spec();
    const char *path = tmp_path("err");
    tm_write(&s, path);
    tl_model_params mp = tl_model_default_params();
    mp.kv_type = TL_KV_F16; /* the arena is sized in f16 blocks, whatever TINYLOOP_KV_* says */
    mp.kv_mem = 6 * (2 * 16 * 32 * 2); /* 6 blocks of K+V (16 x kv_dim 32, f16): 3 logical blocks at 2 layers */
    mp.max_seq_len = 200;
    tl_model *m = NULL;
    tl_model_open(path, mp, &m);
    CHECK(m != NULL, "small-KV model opens (%s)", tl_last_error());
    if (!m) return;
    int32_t toks[100], out[100];
    for (int i = 0; i < 100; i++) toks[i] = (int32_t)(i % 300) + 3;
    tl_generate_params gp = tl_generate_default_params();
    gp.max_tokens = 10;
    int rc = tl_generate(m, toks, 60, gp, out, 100);
    CHECK(rc == TL_ERR_KV_FULL && strstr(tl_last_error(), "KV cache full"), "exhausted KV memory is a clear error (%s)",
          tl_last_error());
    tl_model_info info;
    tl_model_get_info(m, &info);
    CHECK(info.kv_blocks_free == info.kv_blocks_total, "a failed request leaks no blocks");
    rc = tl_generate(m, toks, 20, gp, out, 100);
    CHECK(rc == 10, "a request that fits still runs afterwards (%d: %s)", rc, tl_last_error());
    toks[3] = 320;
    rc = tl_generate(m, toks, 5, gp, out, 100);
    CHECK(rc == TL_ERR_INVALID_ARG && strstr(tl_last_error(), "token 320 at index 3"),
          "an out-of-vocab id names the id and index (%s)", tl_last_error());
    toks[3] = 5;
    rc = tl_generate(m, toks, 0, gp, out, 100);
    CHECK(rc == TL_ERR_INVALID_ARG && strstr(tl_last_error(), "empty"), "an empty prompt is rejected (%s)",
          tl_last_error());
    gp.max_tokens = 0;
    rc = tl_generate(m, toks, 3, gp, out, 100);
    CHECK(rc == TL_ERR_INVALID_ARG && strstr(tl_last_error(), "max_tokens 0"), "max_tokens 0 is rejected (%s)",
          tl_last_error());

    /* sampling: seeded and reproducible; top_k 1 is greedy */
    gp = tl_generate_default_params();
    gp.max_tokens = 20;
    gp.ignore_eos = 1;
    int32_t g[20], a[20], b[20], c[20];
    int ng = tl_generate(m, toks, 5, gp, g, 20);
    CHECK(ng == 20, "greedy generation on a small KV arena runs (%d: %s)", ng, tl_last_error());
    gp.sampling.temperature = 1.0f;
    gp.sampling.top_k = 1;
    ng = tl_generate(m, toks, 5, gp, a, 20);
    CHECK(ng == 20 && memcmp(a, g, sizeof a) == 0, "top_k 1 at temperature 1 equals greedy (%d: %s)", ng,
          tl_last_error());
    gp.sampling.top_k = 0;
    gp.sampling.top_p = 0.95f;
    gp.sampling.min_p = 0.01f;
    gp.sampling.repeat_penalty = 1.1f;
    gp.sampling.seed = 42;
    tl_generate(m, toks, 5, gp, a, 20);
    tl_generate(m, toks, 5, gp, b, 20);
    gp.sampling.seed = 43;
    tl_generate(m, toks, 5, gp, c, 20);
    CHECK(memcmp(a, b, sizeof a) == 0, "the same seed gives the same tokens");
    CHECK(memcmp(a, c, sizeof a) != 0, "another seed gives other tokens");
    gp.sampling.repeat_penalty = -1;
    rc = tl_generate(m, toks, 5, gp, a, 20);
    CHECK(rc == TL_ERR_INVALID_ARG && strstr(tl_last_error(), "repeat_penalty"), "a bad sampling parameter is named (%s)",
          tl_last_error());
    tl_model_close(m);

    /* vocab_only models tokenize but cannot run */
    mp = tl_model_default_params();
    mp.vocab_only = 1;
    tl_model_open(path, mp, &m);
    CHECK(m != NULL, "vocab_only open works");
    if (m) {
        rc = tl_generate(m, toks, 3, tl_generate_default_params(), out, 10);
        CHECK(rc == TL_ERR_STATE, "a vocab_only model refuses to generate");
        tl_model_close(m);
    }
    const char *shared = test_shared_dir();
    if (shared) {
        char vp[512];
        snprintf(vp, sizeof vp, "%s/vocab/ggml-vocab-llama-spm.gguf", shared);
        rc = tl_model_open(vp, tl_model_default_params(), &m);
        CHECK(rc < 0 && m == NULL && strstr(tl_last_error(), "ggml-vocab-llama-spm.gguf"),
              "a vocab-only file opened as a model fails with a message naming it (%s)", tl_last_error());
    }
    rc = tl_model_open("/nonexistent/model.gguf", tl_model_default_params(), &m);
    CHECK(rc < 0 && m == NULL && strstr(tl_last_error(), "/nonexistent/model.gguf"), "a missing file names the path (%s)",
          tl_last_error());
    remove(path);
}

int main(void) {
    const char *shared = test_shared_dir();
    if (shared) test_reference(shared);
    else printf("SKIP reference tests: ../shared/models/stories260K.gguf not found\n");
    test_batch_equals_single();
    test_decode_equals_chunk();
    test_quant_twins();
    test_loops();
    test_qwen2();
    test_qwen3();
    test_smollm3();
    test_hostile_block_count();
    test_unsupported_weight_type();
    test_errors_and_sampling();
    return test_summary();
}
