/* test_admission.c - admission reserves the KV blocks a request needs
 * through max_tokens: two requests whose prompts fit together but whose
 * completions do not run one after the other and both finish (none fails
 * half-way), and a request that cannot fit even alone fails before it
 * generates anything. Synchronous stepping, the tiny synthetic model. */
#include <stdint.h>
#include <unistd.h>

#include "model.h"
#include "scheduler.h"
#include "test.h"
#include "testmodel.h"
#include "tinyloop.h"

enum { PROMPT = 24, GEN = 56 };

static tl_model *model;

static tl_generate_params params(int max_tokens, int no_cache) {
    tl_generate_params gp = tl_generate_default_params();
    gp.max_tokens = max_tokens;
    gp.ignore_eos = 1;
    gp.no_cache = no_cache;
    return gp;
}

/* Steps until both requests end (bounded); returns the steps taken. */
static int run_both(int64_t a, int64_t b, int *b_waited) {
    *b_waited = 0;
    for (int step = 0; step < 1000; step++) {
        tl_request_info ia, ib;
        tl_request_get_info(model, a, &ia);
        tl_request_get_info(model, b, &ib);
        if (ia.state >= TL_REQ_DONE && ib.state >= TL_REQ_DONE) return step;
        if (ia.state == TL_REQ_RUNNING && ib.state == TL_REQ_QUEUED) *b_waited = 1;
        if (tl_model_step(model) < 0) return -1;
    }
    return -1;
}

static void two_that_do_not_fit_together(int no_cache) {
    int32_t pa[PROMPT], pb[PROMPT], ea[GEN], eb[GEN];
    for (int j = 0; j < PROMPT; j++) {
        pa[j] = 3 + (j * 13) % 300;
        pb[j] = 5 + (j * 29 + 7) % 300;
    }
    /* each alone: 80 positions = 5 logical blocks x 2 layers = 10 of the 16 blocks */
    int na = tl_generate(model, pa, PROMPT, params(GEN, 1), ea, GEN);
    int nb = tl_generate(model, pb, PROMPT, params(GEN, 1), eb, GEN);
    CHECK(na == GEN && nb == GEN, "each request alone generates %d tokens (%d, %d: %s)", GEN, na, nb, tl_last_error());
    int64_t a, b;
    tl_generate_params gp = params(GEN, no_cache);
    CHECK(tl_request_submit(model, pa, PROMPT, &gp, NULL, &a) == TL_OK &&
              tl_request_submit(model, pb, PROMPT, &gp, NULL, &b) == TL_OK,
          "both requests are accepted (%s)", tl_last_error());
    int waited = 0;
    int steps = run_both(a, b, &waited);
    int32_t oa[GEN], ob[GEN];
    int fa = 0, fb = 0;
    int ga = tl_request_take(model, a, oa, GEN, &fa);
    int gb = tl_request_take(model, b, ob, GEN, &fb);
    tl_request_info ia = {0}, ib = {0};
    tl_request_get_info(model, a, &ia);
    tl_request_get_info(model, b, &ib);
    CHECK(steps > 0 && ia.state == TL_REQ_DONE && ib.state == TL_REQ_DONE,
          "(no_cache %d) prompts that fit together but completions that do not both finish: none fails half-way "
          "(states %d %d, errors %d %d)",
          no_cache, ia.state, ib.state, ia.error, ib.error);
    CHECK(ga == GEN && gb == GEN && !memcmp(oa, ea, sizeof oa) && !memcmp(ob, eb, sizeof ob),
          "(no_cache %d) both produce the tokens they produce alone (%d, %d)", no_cache, ga, gb);
    CHECK(waited, "(no_cache %d) the second waits in the queue while the first holds the blocks it reserved", no_cache);
    tl_request_release(model, a);
    tl_request_release(model, b);
    CHECK(tl_sched_check_invariants(model, NULL, 0) == 0, "(no_cache %d) KV invariants hold afterwards (%s)", no_cache,
          tl_last_error());
}

int main(void) {
    tm_spec s = tm_default_spec();
    char path[128];
    snprintf(path, sizeof path, "/tmp/tl_admission_%d.gguf", (int)getpid());
    tm_write(&s, path);
    tl_model_params mp = tl_model_default_params();
    mp.kv_type = TL_KV_F16; /* the arena is sized in f16 blocks, whatever TINYLOOP_KV_* says */
    mp.kv_mem = 16 * (2 * 16 * 32 * 2); /* 16 blocks of 16 positions x 2 layers: 128 positions */
    tl_model_open(path, mp, &model);
    CHECK(model != NULL, "the model opens (%s)", tl_last_error());
    if (!model) return test_summary();
    tl_cache_stats st;
    tl_model_get_stats(model, &st);
    CHECK(st.blocks_total == 16, "the KV arena has 16 blocks (%d)", st.blocks_total);

    two_that_do_not_fit_together(1);
    two_that_do_not_fit_together(0);

    /* 24 + 150 positions = 11 logical blocks x 2 = 22 blocks > 16: the
     * prompt alone fits, the completion never can */
    int32_t p[PROMPT];
    for (int j = 0; j < PROMPT; j++) p[j] = 11 + j;
    tl_generate_params big = params(150, 1);
    int64_t id;
    CHECK(tl_request_submit(model, p, PROMPT, &big, NULL, &id) == TL_OK, "a request larger than KV is accepted");
    for (int i = 0; i < 400; i++) {
        tl_request_info info;
        tl_request_get_info(model, id, &info);
        if (info.state >= TL_REQ_DONE) break;
        tl_model_step(model);
    }
    tl_request_info info = {0};
    tl_request_get_info(model, id, &info);
    int32_t out[150];
    int fin = 0;
    int rc = tl_request_take(model, id, out, 150, &fin);
    CHECK(info.state == TL_REQ_FAILED && info.error == TL_ERR_KV_FULL && info.n_generated == 0,
          "it fails at admission with TL_ERR_KV_FULL before generating anything (state %d, error %d, %d generated)",
          info.state, info.error, info.n_generated);
    CHECK(rc == TL_ERR_KV_FULL && strstr(tl_last_error(), "max_tokens 150") && strstr(tl_last_error(), "22 blocks"),
          "the error names max_tokens and the blocks it needs (%s)", tl_last_error());
    tl_request_release(model, id);

    /* the same completion with a 16-token window holds about 6 logical
     * blocks at a time (it releases what the window passed): admitted */
    big.cache_window = 16;
    CHECK(tl_request_submit(model, p, PROMPT, &big, NULL, &id) == TL_OK, "a windowed request is accepted");
    int got = 0;
    for (int i = 0; i < 400; i++) {
        tl_request_get_info(model, id, &info);
        if (info.state >= TL_REQ_DONE) break;
        tl_model_step(model);
        int n = tl_request_take(model, id, out + got, 150 - got, &fin);
        if (n > 0) got += n;
    }
    tl_request_get_info(model, id, &info);
    CHECK(info.state == TL_REQ_DONE && info.n_generated == 150,
          "a sliding window's reservation is bounded by its window: 150 tokens in a 128-position arena (state %d, "
          "%d generated, error %d)",
          info.state, info.n_generated, info.error);
    tl_request_release(model, id);
    tl_model_step(model);
    tl_model_get_stats(model, &st);
    CHECK(tl_sched_check_invariants(model, NULL, 0) == 0 && st.requests_active == 0,
          "nothing is left running and KV invariants hold (%s)", tl_last_error());
    tl_model_close(model);
    remove(path);
    return test_summary();
}
