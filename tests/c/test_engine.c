/* test_engine.c - the background engine thread: requests submitted from
 * several threads complete with the tokens synchronous generation gives,
 * news arrives on the notification pipe, cancellation frees KV, a full
 * queue is refused, KV pressure queues instead of failing, and synchronous
 * calls keep working while the engine runs. */
#include <poll.h>
#include <sys/socket.h>
#include <pthread.h>
#include <stdint.h>
#include <unistd.h>

#include "test.h"
#include "testmodel.h"
#include "tinyloop.h"

enum { N_REQ = 32, GEN = 8 };

static tl_model *model;
static int32_t prompts[N_REQ][24];
static int32_t expect[N_REQ][GEN];

static tl_generate_params greedy(void) {
    tl_generate_params gp = tl_generate_default_params();
    gp.max_tokens = GEN;
    gp.ignore_eos = 1;
    return gp;
}

/* Waits on the pipe until request id ends, collecting its tokens. */
static int collect(int64_t id, int32_t *out) {
    int n = 0, fd = tl_engine_notify_fd(model);
    for (int spins = 0; spins < 100000; spins++) {
        int fin = 0;
        int got = tl_request_take(model, id, out + n, GEN - n, &fin);
        if (got < 0) return got;
        n += got;
        if (fin) return n;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 50) > 0) {
            int64_t ids[64];
            while (read(fd, ids, sizeof ids) > 0) {
            }
        }
    }
    return -1;
}

typedef struct {
    int first, count, bad;
} worker;

static void *client(void *p) {
    worker *w = p;
    for (int i = w->first; i < w->first + w->count; i++) {
        int64_t id;
        tl_generate_params gp = greedy();
        if (tl_request_submit(model, prompts[i], 24, &gp, NULL, &id)) {
            w->bad++;
            continue;
        }
        int32_t out[GEN];
        int n = collect(id, out);
        if (n != GEN || memcmp(out, expect[i], sizeof out)) w->bad++;
        tl_request_release(model, id);
    }
    return NULL;
}

int main(void) {
    tm_spec s = tm_default_spec();
    char path[128];
    snprintf(path, sizeof path, "/tmp/tl_engine_%d.gguf", (int)getpid());
    tm_write(&s, path);
    tl_model_params mp = tl_model_default_params();
    mp.kv_mem = 48 * (2 * 16 * 32 * 2); /* 48 blocks: 32 requests of 32 positions x 2 layers do not fit at once */
    tl_model_open(path, mp, &model);
    CHECK(model != NULL, "the engine model opens (%s)", tl_last_error());
    if (!model) return test_summary();
    for (int i = 0; i < N_REQ; i++)
        for (int j = 0; j < 24; j++) prompts[i][j] = 3 + (i * 7 + j * 13 + (j < 10 ? 0 : i)) % 300;
    for (int i = 0; i < N_REQ; i++) {
        tl_generate_params gp = greedy();
        gp.no_cache = 1;
        tl_generate(model, prompts[i], 24, gp, expect[i], GEN);
    }
    CHECK(tl_engine_notify_fd(model) == -1, "without an engine there is no notification descriptor");
    CHECK(tl_engine_start(model, 0) == TL_OK, "the engine thread starts (%s)", tl_last_error());
    CHECK(tl_engine_notify_fd(model) >= 0, "the engine has a notification descriptor");
    CHECK(tl_model_step(model) == TL_ERR_STATE, "tl_model_step is refused while the engine runs");

    /* 4 client threads x 8 requests, under KV pressure */
    pthread_t th[4];
    worker w[4];
    for (int t = 0; t < 4; t++) {
        w[t] = (worker){.first = t * 8, .count = 8};
        pthread_create(&th[t], NULL, client, &w[t]);
    }
    int bad = 0;
    for (int t = 0; t < 4; t++) {
        pthread_join(th[t], NULL);
        bad += w[t].bad;
    }
    CHECK(bad == 0, "32 requests from 4 threads all complete with the synchronous tokens (%d bad)", bad);

    /* all 32 at once from one thread: more than KV holds, so admission queues */
    int64_t ids[N_REQ];
    for (int i = 0; i < N_REQ; i++) {
        tl_generate_params gp = greedy();
        gp.no_cache = 1;
        tl_request_submit(model, prompts[i], 24, &gp, NULL, &ids[i]);
    }
    bad = 0;
    for (int i = 0; i < N_REQ; i++) {
        int32_t out[GEN];
        int n = collect(ids[i], out);
        if (n != GEN || memcmp(out, expect[i], sizeof out)) bad++;
        tl_request_release(model, ids[i]);
    }
    CHECK(bad == 0, "32 concurrent requests that exceed KV memory queue and all complete (%d bad)", bad);

    /* an attached socket receives the same ids */
    int sv[2];
    socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
    CHECK(tl_engine_notify_attach(model, sv[0]) == TL_OK, "a socket attaches to the engine's notifications");
    close(sv[0]);
    int64_t aid;
    tl_generate_params agp = greedy();
    tl_request_submit(model, prompts[1], 24, &agp, NULL, &aid);
    int64_t got_id = -1; /* ids of earlier requests may come first */
    struct pollfd pfd = {.fd = sv[1], .events = POLLIN};
    for (int k = 0; k < 64 && got_id != aid && poll(&pfd, 1, 5000) > 0; k++)
        if (read(sv[1], &got_id, sizeof got_id) != sizeof got_id) got_id = -1;
    CHECK(got_id == aid, "the attached socket receives the request id with news (%lld vs %lld)", (long long)got_id,
          (long long)aid);
    int32_t aout[GEN];
    CHECK(collect(aid, aout) == GEN && !memcmp(aout, expect[1], sizeof aout), "... and the request completes");
    tl_request_release(model, aid);
    tl_engine_notify_attach(model, -1);
    close(sv[1]);

    /* asynchronous registration while the engine runs */
    tl_pool *apool;
    tl_pool_new(2, &apool);
    int64_t rid;
    CHECK(tl_pool_register_submit(model, apool, prompts[7], 20, 0, 0, &rid) == TL_OK,
          "a registration is submitted without waiting (%s)", tl_last_error());
    tl_request_info rinfo = {0};
    for (int k = 0; k < 2000; k++) {
        tl_request_get_info(model, rid, &rinfo);
        if (rinfo.state >= TL_REQ_DONE) break;
        usleep(1000);
    }
    tl_request_release(model, rid);
    CHECK(rinfo.state == TL_REQ_DONE && tl_pool_size(apool) == 1 && tl_pool_total_cached_tokens(apool) == 20,
          "the engine prefills it and pins it in the pool (state %d, size %d)", rinfo.state, tl_pool_size(apool));
    int32_t afull[24 + GEN];
    tl_pool_stats aps;
    int an = tl_generate_with_pool(model, apool, prompts[7], 24, greedy(), afull, 24 + GEN);
    tl_pool_get_stats(apool, &aps);
    CHECK(an == 24 + GEN && !memcmp(afull + 24, expect[7], GEN * sizeof(int32_t)) && aps.hit_tokens >= 20,
          "a request then reuses the registered prefix (%lld tokens) with unchanged output", (long long)aps.hit_tokens);
    tl_pool_register_submit(model, apool, prompts[8], 20, 0, 0, &rid);
    tl_pool_free(apool); /* freed while its registration may still be queued */
    for (int k = 0; k < 2000; k++) {
        tl_request_get_info(model, rid, &rinfo);
        if (rinfo.state >= TL_REQ_DONE) break;
        usleep(1000);
    }
    CHECK(rinfo.state == TL_REQ_DONE, "a registration whose pool was freed still ends cleanly (state %d)", rinfo.state);
    tl_request_release(model, rid);

    /* synchronous calls while the engine runs */
    int32_t out[GEN];
    int n = tl_generate(model, prompts[3], 24, greedy(), out, GEN);
    CHECK(n == GEN && !memcmp(out, expect[3], sizeof out), "tl_generate works while the engine runs (%d)", n);
    tl_pool *pool;
    tl_pool_new(2, &pool);
    CHECK(tl_pool_register(model, pool, prompts[5], 16, 0, 0) == 16, "register_prefix works while the engine runs");
    int32_t full[24 + GEN];
    n = tl_generate_with_pool(model, pool, prompts[5], 24, greedy(), full, 24 + GEN);
    CHECK(n == 24 + GEN && !memcmp(full + 24, expect[5], sizeof out), "generate_with_pool works while the engine runs");
    tl_pool_free(pool);

    /* cancel: KV comes back */
    tl_generate_params long_gp = greedy();
    long_gp.max_tokens = 200;
    int64_t id;
    tl_request_submit(model, prompts[0], 24, &long_gp, NULL, &id);
    /* At once: 200 tokens take hundreds of steps, and every step first acts
     * on cancel flags, so the request cannot finish before it is seen. */
    tl_request_cancel(model, id);
    /* up to 10 s: a loaded machine may not run the engine thread for a while */
    for (int i = 0; i < 10000; i++) {
        tl_request_info info;
        tl_request_get_info(model, id, &info);
        if (info.state == TL_REQ_CANCELLED) break;
        usleep(1000);
    }
    tl_request_info info;
    tl_request_get_info(model, id, &info);
    CHECK(info.state == TL_REQ_CANCELLED && info.finish_reason == TL_FINISH_CANCELLED, "a cancelled request ends as cancelled");
    tl_request_release(model, id);
    tl_engine_stop(model);
    tl_cache_stats st;
    tl_model_get_stats(model, &st);
    CHECK(st.requests_active == 0, "no request is left active (%d)", st.requests_active);

    /* a full queue: max_queue 2 with the engine stopped, so nothing drains */
    tl_engine_start(model, 2);
    tl_engine_stop(model);
    int64_t q[3];
    int r0 = tl_request_submit(model, prompts[0], 24, &long_gp, NULL, &q[0]);
    int r1 = tl_request_submit(model, prompts[1], 24, &long_gp, NULL, &q[1]);
    int r2 = tl_request_submit(model, prompts[2], 24, &long_gp, NULL, &q[2]);
    CHECK(r0 == 0 && r1 == 0 && r2 == TL_ERR_BUSY && strstr(tl_last_error(), "queue full"),
          "a full queue refuses with TL_ERR_BUSY (%s)", tl_last_error());
    tl_request_release(model, q[0]);
    tl_request_release(model, q[1]);
    /* synchronous stepping resumes after stop */
    n = tl_generate(model, prompts[3], 24, greedy(), out, GEN);
    CHECK(n == GEN && !memcmp(out, expect[3], sizeof out), "after stopping the engine, synchronous generation works");
    tl_model_get_stats(model, &st);
    CHECK(st.requests_finished >= 2 * N_REQ, "statistics count the finished requests (%lld)", (long long)st.requests_finished);
    tl_model_close(model);
    remove(path);
    return test_summary();
}
