/* test_bf16.c - the lossy BF16 repack mode (repack "bf16", weights.c and
 * bf16dot_avx512.c): the tile kernel against an exact sum and against
 * itself one entry at a time; the forward pass in that mode (matrices
 * really BF16, prefill == one token at a time and batch == alone bitwise,
 * logits near the exact mode's); llama.cpp's greedy tokens on stories260K
 * teacher-forced; and the option's errors. Where the CPU has no
 * AVX512_BF16 the mode must refuse to open, and that is what is checked. */
#include "test.h"

#include <unistd.h>

#include "model.h"
#include "quants.h"
#include "ref_cases.h"
#include "testmodel.h"
#include "tinyloop.h"

static uint64_t rng = 0xB16B00B5ull;

static float gauss(void) { return test_gauss(&rng); }

/* Every entry of tiles of many shapes equals the 1x1 call bitwise, and is
 * within 1e-5 * sum |w x| (+ 1e-30) of the f64 sum of the same products. */
static void test_tile(void) {
    if (!tl_bf16dot_has()) {
        CHECK(1, "bf16dot tile: no AVX512_BF16 at this level (nothing to check)");
        return;
    }
    /* token counts: the AVX-512 kernel's micro-tiles and tails; the AMX
     * kernel's one tile, two, a narrower last one, parts of 64; rows up to
     * 17, and 32 and 35 (AMX decode: 32 rows in two chains, then the rest) */
    enum { MAXR = 35, MAXT = 70, PAD = 3 };
    static const int nts[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 33, 70};
    static const int64_t ns[] = {1, 2, 31, 32, 33, 64, 100, 768};
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        const int64_t n = ns[k];
        uint16_t *w = malloc(sizeof(uint16_t) * n * MAXR), *x = malloc(sizeof(uint16_t) * n * MAXT);
        float *out = malloc(sizeof(float) * (MAXR + PAD) * MAXT);
        void *work = aligned_alloc(64, (tl_gemm_work_size(n) + 63) & ~(size_t)63);
        for (int64_t i = 0; i < n * MAXR; i++) w[i] = tl_f32_to_bf16(gauss() * (1 + i % 3));
        for (int64_t i = 0; i < n * MAXT; i++) x[i] = tl_f32_to_bf16(gauss() * (i / n == 2 ? 30.0f : 1.0f));
        int differ = 0, far = 0, spill = 0;
        for (int nr = 1; nr <= MAXR; nr++)
            for (size_t ti = 0; ti < sizeof nts / sizeof nts[0]; ti++) {
                if (nr > 17 && nr != 32 && nr != MAXR) continue;
                const int nt = nts[ti];
                for (int i = 0; i < (MAXR + PAD) * MAXT; i++) out[i] = -777.0f;
                tl_bf16dot_tile(n, nr, nt, out, MAXR + PAD, w, 2 * (size_t)n, x, 2 * (size_t)n, work);
                for (int t = 0; t < MAXT; t++) {
                    for (int r = t < nt ? nr : 0; r < MAXR + PAD; r++) spill += out[t * (MAXR + PAD) + r] != -777.0f;
                    if (t >= nt) continue;
                    for (int r = 0; r < nr; r++) {
                        float one;
                        tl_bf16dot_tile(n, 1, 1, &one, 1, w + n * r, 0, x + n * t, 0, work);
                        const float got = out[t * (MAXR + PAD) + r];
                        differ += memcmp(&one, &got, sizeof one) != 0;
                        double exact = 0, mag = 0;
                        for (int64_t i = 0; i < n; i++) {
                            double p = (double)tl_bf16_to_f32(w[n * r + i]) * tl_bf16_to_f32(x[n * t + i]);
                            exact += p;
                            mag += fabs(p);
                        }
                        far += !(fabs(got - exact) <= 1e-5 * mag + 1e-30);
                    }
                }
            }
        CHECK(differ == 0, "bf16dot n=%lld: every tile entry equals the single-entry call bitwise (%d differ)",
              (long long)n, differ);
        CHECK(far == 0, "bf16dot n=%lld: every entry within 1e-5 of sum |w x| of the exact sum (%d outside)",
              (long long)n, far);
        CHECK(spill == 0, "bf16dot n=%lld: nothing written outside the tile (%d)", (long long)n, spill);
        free(w);
        free(x);
        free(out);
        free(work);
    }
}

static int open_mode(const char *path, const char *repack, tl_model **m) {
    tl_model_params mp = tl_model_default_params();
    mp.kv_block_size = 4;
    mp.n_threads = 2;
    mp.repack = repack;
    return tl_model_open(path, mp, m);
}

static int argmax(const float *v, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

/* Synthetic llama F32, llama F16 and gemma3 F16 (tied output: the
 * embeddings convert too, and lookups read them as BF16). */
static void test_forward(void) {
    tm_spec specs[3];
    const char *names[3] = {"llama f32", "llama f16", "gemma3 f16 tied"};
    specs[0] = tm_default_spec();
    specs[1] = tm_default_spec();
    specs[1].type = TL_TYPE_F16;
    specs[1].seed = 9;
    specs[2] = tm_default_spec();
    specs[2].arch = "gemma3";
    specs[2].sliding_window = 8;
    specs[2].n_layer = 6;
    specs[2].type = TL_TYPE_F16;
    specs[2].seed = 11;
    enum { N = 37, N2 = 13 };
    int32_t prompt[N], prompt2[N2];
    for (int i = 0; i < N; i++) prompt[i] = 3 + (i * 41 + 5) % 300;
    for (int i = 0; i < N2; i++) prompt2[i] = 7 + (i * 29 + 3) % 300;
    for (int ci = 0; ci < 3; ci++) {
        char path[128];
        snprintf(path, sizeof path, "/tmp/tl_bf16_%d_%d.gguf", (int)getpid(), ci);
        if (tm_write(&specs[ci], path)) {
            CHECK(0, "%s: the synthetic model is written", names[ci]);
            continue;
        }
        tl_model *m = NULL, *exact = NULL;
        int rc = open_mode(path, "bf16", &m);
        open_mode(path, "on", &exact);
        unlink(path);
        if (!tl_bf16dot_has()) {
            CHECK(rc == TL_ERR_UNSUPPORTED && strstr(tl_last_error(), "AVX512_BF16"),
                  "%s: without AVX512_BF16 repack \"bf16\" refuses to open, naming it (%s)", names[ci], tl_last_error());
            tl_model_close(m);
            tl_model_close(exact);
            continue;
        }
        CHECK(m && exact, "%s: opens in both modes (%s)", names[ci], tl_last_error());
        if (!m || !exact) {
            tl_model_close(m);
            tl_model_close(exact);
            continue;
        }
        const int tied = tm_spec_tied(&specs[ci]);
        CHECK(m->layers[0].wq.type == TL_TYPE_BF16 && m->layers[0].w_down.type == TL_TYPE_BF16 &&
                  m->output.type == TL_TYPE_BF16 && (m->tok_embd.type == TL_TYPE_BF16) == tied,
              "%s: the matrices are BF16 (the embeddings only when tied)", names[ci]);
        const int nv = specs[ci].n_vocab;
        float *all = malloc(sizeof(float) * nv * 2), *step = malloc(sizeof(float) * nv), *ref = malloc(sizeof(float) * nv);
        tl_seq *s[2] = {0};
        const int32_t *p = prompt;
        int n = N, one = 1, ok = tl_seq_new(m, 0, &s[0]) == TL_OK && tl_batch_forward(m, s, &p, &n, 1, all) == TL_OK;
        tl_seq_free(s[0]);
        ok = ok && tl_seq_new(m, 0, &s[0]) == TL_OK;
        for (int i = 0; ok && i < N; i++) {
            const int32_t *pi = prompt + i;
            ok = tl_batch_forward(m, s, &pi, &one, 1, step) == TL_OK;
        }
        tl_seq_free(s[0]);
        CHECK(ok && !memcmp(all, step, sizeof(float) * nv),
              "%s: a %d-token prompt in one forward gives bitwise the logits of one token at a time", names[ci], N);
        tl_seq *se = NULL;
        ok = ok && tl_seq_new(exact, 0, &se) == TL_OK && tl_batch_forward(exact, &se, &p, &n, 1, ref) == TL_OK;
        tl_seq_free(se);
        float d = 0, mag = 0;
        for (int i = 0; i < nv; i++) {
            d = fmaxf(d, fabsf(all[i] - ref[i]));
            mag = fmaxf(mag, fabsf(ref[i]));
        }
        CHECK(ok && d <= 0.05f * mag && argmax(all, nv) == argmax(ref, nv),
              "%s: logits within 5%% of the largest of the exact mode's, same argmax (max diff %g of %g)", names[ci],
              d, mag);
        const int32_t *pp[2] = {prompt, prompt2};
        int nn[2] = {N, N2};
        ok = tl_seq_new(m, 0, &s[0]) == TL_OK && tl_seq_new(m, 0, &s[1]) == TL_OK &&
             tl_batch_forward(m, s, pp, nn, 2, all) == TL_OK;
        tl_seq_free(s[0]);
        tl_seq_free(s[1]);
        ok = ok && tl_seq_new(m, 0, &s[1]) == TL_OK && tl_batch_forward(m, &s[1], &pp[1], &nn[1], 1, step) == TL_OK;
        tl_seq_free(s[1]);
        CHECK(ok && !memcmp(all + nv, step, sizeof(float) * nv),
              "%s: a sequence prefilled next to another gives bitwise its logits alone", names[ci]);
        free(all);
        free(step);
        free(ref);
        tl_model_close(m);
        tl_model_close(exact);
    }
}

/* llama.cpp's greedy continuations, teacher-forced in the BF16 mode: the
 * mode's argmax at each step against llama.cpp's token (the exact mode
 * matches all of them: test_model). */
static void test_reference(void) {
    const char *shared = test_shared_dir();
    char path[512];
    static ref_case cases[16];
    int nc = shared ? ref_load_shared(shared, path, sizeof path, cases, 16) : -1;
    if (nc <= 0) {
        printf("SKIP bf16 reference: ../shared/ref not found\n");
        return;
    }
    tl_model *m = NULL;
    tl_model_params mp = tl_model_default_params();
    mp.repack = "bf16";
    int rc = tl_model_open(path, mp, &m);
    if (!tl_bf16dot_has()) {
        CHECK(rc == TL_ERR_UNSUPPORTED, "stories260K: repack \"bf16\" refuses without AVX512_BF16");
        tl_model_close(m);
        return;
    }
    CHECK(rc == TL_OK, "stories260K opens with repack \"bf16\" (%s)", tl_last_error());
    if (rc) return;
    tl_model_info info;
    tl_model_get_info(m, &info);
    float *logits = malloc(sizeof(float) * info.n_vocab);
    int agree = 0, total = 0;
    for (int c = 0; c < nc; c++) {
        tl_seq *s = NULL;
        const int32_t *p = cases[c].prompt_ids;
        int n = cases[c].n_prompt, one = 1;
        if (tl_seq_new(m, 0, &s) || tl_batch_forward(m, &s, &p, &n, 1, logits)) break;
        for (int i = 0; i < cases[c].n_gen; i++) {
            agree += argmax(logits, info.n_vocab) == cases[c].gen_ids[i];
            total++;
            const int32_t *t = &cases[c].gen_ids[i];
            if (i + 1 < cases[c].n_gen && tl_batch_forward(m, &s, &t, &one, 1, logits)) break;
        }
        tl_seq_free(s);
    }
    CHECK(total > 0 && agree >= total * 9 / 10,
          "stories260K, repack \"bf16\": llama.cpp's greedy token is the argmax at >= 90%% of %d teacher-forced steps "
          "(%d)", total, agree);
    free(logits);
    tl_model_close(m);
}

static void test_errors(void) {
    tm_spec spec = tm_default_spec();
    char path[128];
    snprintf(path, sizeof path, "/tmp/tl_bf16_err_%d.gguf", (int)getpid());
    if (tm_write(&spec, path)) {
        CHECK(0, "the synthetic model is written");
        return;
    }
    tl_model *m = NULL;
    int rc = open_mode(path, "fast", &m);
    CHECK(rc == TL_ERR_INVALID_ARG && !m && strstr(tl_last_error(), "\"fast\"") && strstr(tl_last_error(), "bf16"),
          "repack \"fast\" is refused, naming the value and the choices (%s)", tl_last_error());
    setenv("TINYLOOP_REPACK", "turbo", 1);
    rc = open_mode(path, NULL, &m);
    unsetenv("TINYLOOP_REPACK");
    CHECK(rc == TL_ERR_INVALID_ARG && !m && strstr(tl_last_error(), "TINYLOOP_REPACK") &&
              strstr(tl_last_error(), "\"turbo\""),
          "TINYLOOP_REPACK=turbo is refused, naming the variable and the value (%s)", tl_last_error());
    rc = open_mode(path, "off", &m);
    CHECK(rc == TL_OK && m && m->layers[0].wq.type == TL_TYPE_F32 && !m->weight_arena,
          "repack \"off\" leaves the weights in the file's mapping and type");
    tl_model_close(m);
    m = NULL;
    const int isa = tl_kernels_isa();
    tl_kernels_set_isa(TL_ISA_AVX2);
    rc = open_mode(path, "bf16", &m);
    tl_kernels_set_isa(isa);
    CHECK(rc == TL_ERR_UNSUPPORTED && !m && strstr(tl_last_error(), "AVX512_BF16"),
          "repack \"bf16\" at a level without AVX512_BF16 is refused, naming it (%s)", tl_last_error());
    unlink(path);
}

int main(void) {
    tl_kernels_init();
    test_tile();
    test_forward();
    test_reference();
    test_errors();
    return test_summary();
}
