/* test_resume_sched.c - the synchronous calls are requests: a long
 * resume_generate (a loop model's prompt at another depth) runs in the
 * scheduler's batches and holds no lock across its generation, so a short
 * generate submitted while it runs finishes first; build_prefix_cache and
 * register_prefix prefill as requests too, with the engine thread running,
 * and every result equals plain generation. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "test.h"
#include "testmodel.h"
#include "tinyloop.h"

enum { LONG_GEN = 1500, PROMPT = 33 };

static tl_model *model;
static tl_prefix *handle;
static int32_t prompt[PROMPT];
static int32_t long_out[LONG_GEN];
static int long_n;
static volatile int long_done;

static tl_generate_params greedy(int max_tokens, int loops) {
    tl_generate_params gp = tl_generate_default_params();
    gp.max_tokens = max_tokens;
    gp.loops = loops;
    gp.ignore_eos = 1;
    return gp;
}

static void *run_long(void *arg) {
    (void)arg;
    long_n = tl_resume_generate(model, handle, greedy(LONG_GEN, 4), long_out, LONG_GEN);
    __atomic_store_n(&long_done, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* Generated tokens so far, from the engine's published statistics. */
static int64_t generated(void) {
    tl_cache_stats st;
    tl_model_get_stats(model, &st);
    return st.generated_tokens;
}

int main(void) {
    tm_spec s = tm_default_spec();
    s.n_layer = 4;
    s.loop_start = 1;
    s.loop_end = 3;
    s.loop_default = 2;
    s.n_ctx = 2048;
    char path[] = "/tmp/tl_resume_sched_XXXXXX";
    int fd = mkstemp(path);
    if (fd >= 0) close(fd);
    CHECK(fd >= 0 && tm_write(&s, path) == 0, "a loop model is written");
    tl_model_params mp = tl_model_default_params();
    mp.max_seq_len = 2048;
    CHECK(tl_model_open(path, mp, &model) == TL_OK, "the loop model opens (%s)", tl_last_error());
    if (!model) return test_summary();
    for (int i = 0; i < PROMPT; i++) prompt[i] = 3 + (i * 13) % 300;

    /* references without the engine thread */
    static int32_t plain_long[LONG_GEN];
    int32_t plain_short[4], out[4];
    int n_plain = tl_generate(model, prompt, PROMPT, greedy(LONG_GEN, 4), plain_long, LONG_GEN);
    CHECK(n_plain == LONG_GEN, "plain generation at loops 4 gives %d tokens (%d)", LONG_GEN, n_plain);
    int n_short = tl_generate(model, prompt + 3, 20, greedy(4, 2), plain_short, 4);
    CHECK(n_short == 4, "plain short generation gives 4 tokens (%d)", n_short);
    CHECK(tl_resume_build(model, prompt, PROMPT, &handle) == TL_OK, "the resume handle builds (%s)", tl_last_error());

    CHECK(tl_engine_start(model, 0) == TL_OK, "the engine thread starts (%s)", tl_last_error());
    pthread_t th;
    pthread_create(&th, NULL, run_long, NULL);
    /* wait until the resume request is generating */
    int64_t g0 = generated();
    for (int spins = 0; spins < 20000 && generated() < g0 + 8 && !__atomic_load_n(&long_done, __ATOMIC_ACQUIRE); spins++)
        usleep(100);
    CHECK(!__atomic_load_n(&long_done, __ATOMIC_ACQUIRE), "the long resume_generate is still running when the short "
                                                          "request is submitted");
    int got = tl_generate(model, prompt + 3, 20, greedy(4, 2), out, 4);
    int long_was_running = !__atomic_load_n(&long_done, __ATOMIC_ACQUIRE);
    CHECK(got == 4 && !memcmp(out, plain_short, sizeof out), "the short generate gives plain generation's tokens (%d)",
          got);
    CHECK(long_was_running, "the short generate finished while the long resume_generate was still running");
    pthread_join(th, NULL);
    CHECK(long_n == LONG_GEN && !memcmp(long_out, plain_long, sizeof long_out),
          "the long resume_generate, batched with it, equals plain generation at loops 4 (%d)", long_n);

    /* the other synchronous calls are requests too, with the engine running */
    tl_prefix *ph = NULL;
    CHECK(tl_prefix_build(model, prompt, 30, 3, 0, &ph) == TL_OK, "build_prefix_cache runs as a request (%s)",
          tl_last_error());
    int32_t a[8], b[8];
    int na = tl_generate(model, prompt, 30, greedy(8, 3), a, 8);
    int nb = ph ? tl_generate_from_prefix(model, ph, NULL, 0, greedy(8, 0), b, 8) : -1;
    CHECK(na == 8 && nb == 8 && !memcmp(a, b, sizeof a), "generate_from_prefix_cache equals plain generation");
    tl_pool *pool = NULL;
    tl_pool_new(2, &pool);
    CHECK(pool && tl_pool_register(model, pool, prompt + 1, 25, 0, 0) == 25,
          "register_prefix runs as a request (%s)", tl_last_error());
    CHECK(pool && tl_pool_size(pool) == 1, "the registered entry is in the pool");
    tl_engine_stop(model);
    tl_prefix_free(ph);
    tl_prefix_free(handle);
    tl_pool_free(pool);
    tl_model_close(model);
    remove(path);
    return test_summary();
}
