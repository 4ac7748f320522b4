/* test_beam.c - beam search: one beam is greedy decoding; enough beams
 * find what an exhaustive search finds; beams share the prompt's KV. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <unistd.h>

#include "model.h"
#include "scheduler.h"
#include "test.h"
#include "testmodel.h"
#include "tinyloop.h"

static const char *tmp_path(const char *name) {
    static char buf[4][256];
    static int k;
    char *p = buf[k++ % 4];
    snprintf(p, 256, "/tmp/tl_beam_%d_%s.gguf", (int)getpid(), name);
    return p;
}

static tl_model *open_spec(tm_spec s, const char *name, int max_seq_len, size_t kv_mem) {
    const char *path = tmp_path(name);
    if (tm_write(&s, path)) return NULL;
    tl_model_params mp = tl_model_default_params();
    mp.max_seq_len = max_seq_len;
    mp.kv_mem = kv_mem;
    tl_model *m = NULL;
    tl_model_open(path, mp, &m);
    remove(path);
    CHECK(m != NULL, "the synthetic model %s opens (%s)", name, tl_last_error());
    return m;
}

static void check_invariants(tl_model *m, const char *when) {
    int rc = tl_sched_check_invariants(m, NULL, 0);
    CHECK(rc == 0, "KV invariants hold %s (%s)", when, tl_last_error());
}

static void fill_prompt(int32_t *p, int n, int nv) {
    p[0] = 1;
    for (int i = 1; i < n; i++) p[i] = 3 + (i * 37 + 11) % (nv - 3);
}

/* ---- B = 1 is greedy ---------------------------------------------------- */

static void greedy_case(tl_model *m, int ignore_eos, int max_tokens, const char *what) {
    enum { N = 24, MAXT = 64 };
    int32_t prompt[N], a[MAXT], b[MAXT];
    fill_prompt(prompt, N, tl_model_n_vocab(m));
    tl_generate_params gp = tl_generate_default_params();
    gp.max_tokens = max_tokens;
    gp.ignore_eos = ignore_eos;
    gp.no_cache = 1;
    int na = tl_generate(m, prompt, N, gp, a, MAXT);
    tl_beam_result res;
    int nb = tl_generate_beam(m, NULL, prompt, N, gp, 1, 1.0f, b, MAXT, &res);
    CHECK(na > 0 && na == nb && memcmp(a, b, (size_t)na * sizeof *a) == 0,
          "one beam returns greedy's tokens (%s: greedy %d tokens, beam %d: %s)", what, na, nb,
          nb < 0 ? tl_last_error() : "");
    CHECK(res.finish_reason == (na < max_tokens ? TL_FINISH_EOS : TL_FINISH_LENGTH),
          "one beam ends as greedy does (%s: finish %d)", what, res.finish_reason);
    gp.no_cache = 0; /* the second run matches the first one's prompt in the cache */
    nb = tl_generate_beam(m, NULL, prompt, N, gp, 1, 1.0f, b, MAXT, &res);
    nb = tl_generate_beam(m, NULL, prompt, N, gp, 1, 1.0f, b, MAXT, &res);
    CHECK(na == nb && memcmp(a, b, (size_t)na * sizeof *a) == 0 && res.n_cached == N - 1,
          "one beam over a cached prompt still returns greedy's tokens (%s: %d cached)", what, res.n_cached);
    check_invariants(m, "after one-beam searches");
}

static void test_one_beam_is_greedy(void) {
    tl_model *m = open_spec(tm_default_spec(), "greedy", 256, 0);
    if (!m) return;
    greedy_case(m, 1, 40, "ignore_eos");
    greedy_case(m, 0, 40, "eos");
    tl_model_close(m);
}

/* ---- exhaustive search over an 8-token vocabulary ---------------------------- */

enum { V8 = 8, NP = 5 };

/* Log-softmax of the logits after prompt + ext (fresh sequence, no cache):
 * the engine's own forward pass. */
static void logprobs_after(tl_model *m, const int32_t *prompt, const int32_t *ext, int n_ext, double *lp) {
    int32_t toks[NP + 3];
    memcpy(toks, prompt, NP * sizeof *toks);
    if (n_ext) memcpy(toks + NP, ext, (size_t)n_ext * sizeof *toks);
    int n = NP + n_ext;
    tl_seq *seq = NULL;
    float logits[V8];
    tl_seq_new(m, 0, &seq);
    const int32_t *tp = toks;
    int rc = tl_batch_forward(m, &seq, &tp, &n, 1, logits);
    tl_seq_free(seq);
    if (rc) {
        CHECK(0, "forward for the exhaustive search runs (%s)", tl_last_error());
        return;
    }
    double mx = logits[0], sum = 0;
    for (int i = 1; i < V8; i++) mx = logits[i] > mx ? logits[i] : mx;
    for (int i = 0; i < V8; i++) sum += exp(logits[i] - mx);
    for (int i = 0; i < V8; i++) lp[i] = logits[i] - mx - log(sum);
}

/* Scores of all 512 three-token continuations, best first by the beam's
 * rule: with eos_ends, a sequence ends at its first EOS (length 1, 2 or 3)
 * and is scored logprob / length^alpha. */
static void exhaustive(tl_model *m, const int32_t *prompt, int eos_ends, float alpha, int32_t best[3], int *best_n,
                       double *best_score, double *second_score) {
    double lp0[V8], lp1[V8][V8], lp2[V8][V8][V8];
    logprobs_after(m, prompt, NULL, 0, lp0);
    for (int a = 0; a < V8; a++) {
        int32_t e1[1] = {a};
        logprobs_after(m, prompt, e1, 1, lp1[a]);
        for (int b = 0; b < V8; b++) {
            int32_t e2[2] = {a, b};
            logprobs_after(m, prompt, e2, 2, lp2[a][b]);
        }
    }
    *best_score = *second_score = -INFINITY;
    for (int a = 0; a < V8; a++)
        for (int b = 0; b < V8; b++)
            for (int c = 0; c < V8; c++) {
                int32_t seq[3] = {a, b, c};
                double sum = lp0[a];
                int n = 1;
                if (!(eos_ends && a == 2)) {
                    sum += lp1[a][b];
                    n = 2;
                    if (!(eos_ends && b == 2)) {
                        sum += lp2[a][b][c];
                        n = 3;
                    }
                }
                /* a sequence ended early stands for all its extensions: count it once */
                if (n < 3 && (c != 0 || (n == 1 && b != 0))) continue;
                double sc = sum / pow(n, alpha);
                if (sc > *best_score) {
                    *second_score = *best_score;
                    *best_score = sc;
                    memcpy(best, seq, sizeof seq);
                    *best_n = n;
                } else if (sc > *second_score) {
                    *second_score = sc;
                }
            }
}

static void exhaustive_case(tl_model *m, int eos_ends, float alpha, const char *what) {
    int32_t prompt[NP] = {1, 3, 4, 5, 6}, best[3], got[3];
    int best_n = 0;
    double best_score, second;
    exhaustive(m, prompt, eos_ends, alpha, best, &best_n, &best_score, &second);
    tl_generate_params gp = tl_generate_default_params();
    gp.max_tokens = 3;
    gp.ignore_eos = !eos_ends;
    tl_beam_result res;
    int n = tl_generate_beam(m, NULL, prompt, NP, gp, 64, alpha, got, 3, &res);
    int want_n = best_n == 3 || !eos_ends ? best_n : best_n - 1; /* EOS is not written */
    CHECK(n == want_n && memcmp(got, best, (size_t)(n > 0 ? n : 0) * sizeof *got) == 0,
          "64 beams return the exhaustive search's best of 512 (%s: want %d tokens [%d %d %d], got %d [%d %d %d], "
          "margin %.3g)",
          what, want_n, best[0], best[1], best[2], n, n > 0 ? got[0] : -1, n > 1 ? got[1] : -1, n > 2 ? got[2] : -1,
          best_score - second);
    CHECK(fabs(res.score - best_score) < 1e-4 && res.n_generated == best_n,
          "the beam's score is the exhaustive best (%s: %.6f vs %.6f, length %d vs %d)", what, res.score, best_score,
          res.n_generated, best_n);
}

static void test_exhaustive(void) {
    tm_spec s = tm_default_spec();
    s.n_vocab = V8;
    s.seed = 7;
    tl_model *m = open_spec(s, "v8", 64, (size_t)8 << 20) /* 64 beams: 64 private tail blocks per layer */;
    if (!m) return;
    CHECK(tl_model_n_vocab(m) == V8, "the synthetic model has an 8-token vocabulary (%d)", tl_model_n_vocab(m));
    exhaustive_case(m, 0, 1.0f, "ignore_eos");
    exhaustive_case(m, 1, 1.0f, "EOS ends, length_penalty 1");
    exhaustive_case(m, 1, 0.0f, "EOS ends, length_penalty 0");
    exhaustive_case(m, 1, 2.0f, "EOS ends, length_penalty 2");
    check_invariants(m, "after the 64-beam searches");
    tl_model_close(m);
}

/* ---- beams share the prompt's KV ------------------------------------------------ */

static void test_shared_kv(void) {
    enum { N = 1000, B = 16, GEN = 24 };
    tl_model *m = open_spec(tm_default_spec(), "kv", 1100, 0);
    if (!m) return;
    tl_model_info info;
    tl_model_get_info(m, &info);
    int depth = info.n_layer, bs = info.kv_block_size;
    int prompt_blocks = (N + bs - 1) / bs * depth;
    /* each beam's tail: the partial prompt block copied, plus the blocks GEN tokens reach */
    int tail = ((N + GEN + bs - 1) / bs - N / bs) * depth;
    static int32_t prompt[N];
    int32_t out[GEN];
    fill_prompt(prompt, N, info.n_vocab);
    tl_generate_params gp = tl_generate_default_params();
    gp.max_tokens = GEN;
    gp.ignore_eos = 1;
    tl_beam_result res;
    int n = tl_generate_beam(m, NULL, prompt, N, gp, B, 1.0f, out, GEN, &res);
    CHECK(n == GEN, "16 beams over a 1,000-token prompt generate %d tokens (%d: %s)", GEN, n, tl_last_error());
    CHECK(res.kv_blocks_peak >= prompt_blocks && res.kv_blocks_peak <= prompt_blocks + B * tail,
          "16 beams hold one prompt + 16 tails of KV at most (peak %d blocks; prompt %d, tails %d x %d; unshared "
          "would be %d)",
          res.kv_blocks_peak, prompt_blocks, B, tail, B * prompt_blocks);
    printf("16 beams x %d tokens over a %d-token prompt: peak %d KV blocks (prompt %d, unshared %d)\n", GEN, N,
           res.kv_blocks_peak, prompt_blocks, B * prompt_blocks);
    tl_cache_stats st;
    tl_model_get_stats(m, &st);
    CHECK(st.blocks_used == prompt_blocks,
          "after the search only the cached prompt holds KV (%d blocks used, prompt %d)", st.blocks_used,
          prompt_blocks);
    check_invariants(m, "after a 16-beam search");
    /* the same search again reuses the cached prompt: no new prompt blocks */
    n = tl_generate_beam(m, NULL, prompt, N, gp, B, 1.0f, out, GEN, &res);
    CHECK(n == GEN && res.n_cached == N - 1 && res.kv_blocks_peak <= B * tail + depth,
          "a second search over the cached prompt takes only tails (%d cached, peak %d blocks)", res.n_cached,
          res.kv_blocks_peak);
    tl_model_close(m);
}

/* ---- composition: pools, engine thread, bad arguments ------------------------------ */

static void test_pool_and_engine(void) {
    enum { N = 60, PRE = 40, GEN = 10, B = 4 };
    tl_model *m = open_spec(tm_default_spec(), "pool", 256, 0);
    if (!m) return;
    int32_t prompt[N], a[GEN], b[GEN];
    fill_prompt(prompt, N, tl_model_n_vocab(m));
    tl_generate_params gp = tl_generate_default_params();
    gp.max_tokens = GEN;
    gp.ignore_eos = 1;
    gp.no_cache = 1;
    tl_beam_result ra, rb;
    int na = tl_generate_beam(m, NULL, prompt, N, gp, B, 1.0f, a, GEN, &ra);
    tl_pool *pool = NULL;
    tl_pool_new(2, &pool);
    CHECK(tl_pool_register(m, pool, prompt, PRE, 0, 0) == PRE, "a prefix registers (%s)", tl_last_error());
    gp.no_cache = 0;
    int nb = tl_generate_beam(m, pool, prompt, N, gp, B, 1.0f, b, GEN, &rb);
    tl_pool_stats ps;
    tl_pool_get_stats(pool, &ps);
    CHECK(nb == na && memcmp(a, b, sizeof a) == 0 && rb.n_cached == PRE && ps.lookups == 1 && ps.hits == 1,
          "a beam search over a pooled prefix hits it and returns the uncached search's tokens (%d cached, pool "
          "%lld lookups %lld hits)",
          rb.n_cached, (long long)ps.lookups, (long long)ps.hits);
    check_invariants(m, "after a pooled beam search");

    int32_t other[N];
    fill_prompt(other, N, tl_model_n_vocab(m));
    for (int i = 1; i < N; i++) other[i] = 3 + (i * 53 + 7) % (tl_model_n_vocab(m) - 3);
    tl_prefix *h = NULL;
    CHECK(tl_prefix_build(m, other, PRE, 0, 0, &h) == TL_OK, "a prefix handle builds (%s)", tl_last_error());
    nb = tl_generate_beam(m, NULL, other, N, gp, B, 1.0f, b, GEN, &rb);
    CHECK(nb == GEN && rb.n_cached == PRE, "a beam search over a prefix handle's tokens hits it (%d cached)",
          rb.n_cached);
    tl_prefix_free(h);

    CHECK(tl_engine_start(m, 0) == TL_OK, "the engine thread starts (%s)", tl_last_error());
    int64_t id;
    gp.max_tokens = 30;
    int sub = tl_request_submit(m, prompt, N, &gp, NULL, &id);
    gp.max_tokens = GEN;
    gp.no_cache = 1;
    nb = tl_generate_beam(m, NULL, prompt, N, gp, B, 1.0f, b, GEN, &rb);
    CHECK(sub == TL_OK && nb == na && memcmp(a, b, sizeof a) == 0,
          "a beam search alongside the engine thread returns the same tokens (%d: %s)", nb, tl_last_error());
    int32_t t[64];
    int fin = 0, got = 0;
    for (int i = 0; i < 10000 && !fin; i++) {
        int r = tl_request_take(m, id, t, 64, &fin);
        if (r > 0) got += r;
        if (!fin) tl_request_wait_news(m, id);
    }
    CHECK(fin && got == 30, "the engine's request finishes alongside it (%d tokens)", got);
    tl_request_release(m, id);
    tl_engine_stop(m);
    tl_pool_free(pool);
    check_invariants(m, "after the engine ran beside a beam search");
    tl_model_close(m);
}

/* ---- the compute lock is taken per step --------------------------------------------- */

typedef struct long_search {
    tl_model *m;
    int rc;
    volatile int done;
} long_search;

static void *run_long_search(void *arg) {
    long_search *ls = arg;
    int32_t prompt[8] = {1, 5, 6, 7, 8, 9, 10, 11}, out[200];
    tl_generate_params gp = tl_generate_default_params();
    gp.max_tokens = 200;
    gp.ignore_eos = 1;
    ls->rc = tl_generate_beam(ls->m, NULL, prompt, 8, gp, 16, 1.0f, out, 200, NULL);
    __atomic_store_n(&ls->done, 1, __ATOMIC_SEQ_CST);
    return NULL;
}

/* A short request submitted while a long search runs finishes first: the
 * search lets the engine thread step between its own steps. */
static void test_short_request_passes_a_long_search(void) {
    tl_model *m = open_spec(tm_default_spec(), "lock", 256, (size_t)16 << 20);
    if (!m) return;
    tl_engine_start(m, 0);
    long_search ls = {m, 0, 0};
    pthread_t th;
    pthread_create(&th, NULL, run_long_search, &ls);
    int32_t prompt[6] = {1, 20, 21, 22, 23, 24}, t[8];
    tl_generate_params gp = tl_generate_default_params();
    gp.max_tokens = 2;
    gp.ignore_eos = 1;
    int n = tl_generate(m, prompt, 6, gp, t, 8);
    int search_done = __atomic_load_n(&ls.done, __ATOMIC_SEQ_CST);
    pthread_join(th, NULL);
    CHECK(n == 2 && !search_done && ls.rc == 200,
          "a 2-token request finishes while a 200-token, 16-beam search still runs (request %d, search done %d, "
          "search %d)",
          n, search_done, ls.rc);
    tl_engine_stop(m);
    check_invariants(m, "after a search beside the engine thread");
    tl_model_close(m);
}

static void test_bad_arguments(void) {
    tl_model *m = open_spec(tm_default_spec(), "args", 64, 0);
    if (!m) return;
    int32_t prompt[4] = {1, 5, 6, 7}, out[8];
    tl_generate_params gp = tl_generate_default_params();
    gp.max_tokens = 8;
    int rc = tl_generate_beam(m, NULL, prompt, 4, gp, 0, 1.0f, out, 8, NULL);
    CHECK(rc == TL_ERR_INVALID_ARG && strstr(tl_last_error(), "beams 0 must be in [1, 1024]"),
          "beams 0 is refused by name and value (%s)", tl_last_error());
    rc = tl_generate_beam(m, NULL, prompt, 4, gp, 5000, 1.0f, out, 8, NULL);
    CHECK(rc == TL_ERR_INVALID_ARG && strstr(tl_last_error(), "beams 5000"), "beams 5000 is refused (%s)",
          tl_last_error());
    rc = tl_generate_beam(m, NULL, prompt, 4, gp, 2, NAN, out, 8, NULL);
    CHECK(rc == TL_ERR_INVALID_ARG && strstr(tl_last_error(), "length_penalty"),
          "a length_penalty that is not a number is refused (%s)", tl_last_error());
    rc = tl_generate_beam(m, NULL, prompt, 4, gp, 2, 1.0f, out, 4, NULL);
    CHECK(rc == TL_ERR_BUFFER && strstr(tl_last_error(), "smaller than max_tokens 8"),
          "an output buffer under max_tokens is refused (%s)", tl_last_error());
    gp.max_tokens = 100;
    rc = tl_generate_beam(m, NULL, prompt, 4, gp, 2, 1.0f, out, 100, NULL);
    CHECK(rc == TL_ERR_TOO_LONG, "prompt + max_tokens past max_seq_len is refused (%s)", tl_last_error());
    prompt[1] = 99999;
    gp.max_tokens = 8;
    rc = tl_generate_beam(m, NULL, prompt, 4, gp, 2, 1.0f, out, 8, NULL);
    CHECK(rc == TL_ERR_INVALID_ARG && strstr(tl_last_error(), "99999"), "a token outside the vocab is refused (%s)",
          tl_last_error());
    /* 64 beams each copy the prompt's partial block: more than this model's 32 blocks */
    prompt[1] = 5;
    rc = tl_generate_beam(m, NULL, prompt, 4, gp, 64, 1.0f, out, 8, NULL);
    CHECK(rc == TL_ERR_KV_FULL && strstr(tl_last_error(), "KV cache full"),
          "a search that does not fit in KV memory fails with TL_ERR_KV_FULL (%d: %s)", rc, tl_last_error());
    tl_cache_stats st;
    tl_model_get_stats(m, &st);
    tl_model_info info;
    tl_model_get_info(m, &info);
    CHECK(st.blocks_used <= info.n_layer, "a failed search leaves at most the cached prompt in KV (%d blocks used)",
          st.blocks_used);
    check_invariants(m, "after refused searches");
    tl_model_close(m);
}

int main(void) {
    test_one_beam_is_greedy();
    test_exhaustive();
    test_shared_kv();
    test_pool_and_engine();
    test_short_request_passes_a_long_search();
    test_bad_arguments();
    return test_summary();
}
