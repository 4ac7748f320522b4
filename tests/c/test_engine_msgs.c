/* test_engine_msgs.c - nothing a request handler calls waits for a step.
 * A thread holds the compute lock as a long step would (seconds on a CPU
 * with a big batch); meanwhile every call the Lua server makes from a
 * handler (budget, notify attach, stats, submit, take, info, cancel,
 * release, asynchronous register, pool free, eviction weights) must return
 * at once. The changes that touch state the step owns are messages the
 * engine applies at its next step boundary: once the lock is released the
 * budget is enforced, the notification descriptor gets ids and the pool is
 * gone. Without an engine thread they apply at once. */
#include <pthread.h>
#include <stdint.h>
#include <sys/socket.h>
#include <unistd.h>

#include "model.h"
#include "scheduler.h"
#include "test.h"
#include "testmodel.h"
#include "tinyloop.h"

/* The simulated step lasts HOLD seconds; a call that waited for it would
 * take all of it, so BOUND is generous for a loaded machine and still
 * tells the two apart. */
#define HOLD 2.0
#define BOUND 1.0

static tl_model *model;
static volatile int holding;

static void *long_step(void *arg) {
    (void)arg;
    tl_sched_compute_lock(model);
    __atomic_store_n(&holding, 1, __ATOMIC_RELEASE);
    usleep((useconds_t)(HOLD * 1e6));
    __atomic_store_n(&holding, 2, __ATOMIC_RELEASE);
    tl_sched_compute_unlock(model);
    return NULL;
}

static tl_generate_params params(int max_tokens, int tenant) {
    tl_generate_params gp = tl_generate_default_params();
    gp.max_tokens = max_tokens;
    gp.ignore_eos = 1;
    gp.tenant = tenant;
    return gp;
}

/* Fills the cache with entries of tenant (synchronous generation). */
static void fill_tenant(int tenant, int salt) {
    for (int k = 0; k < 4; k++) {
        int32_t p[40], out[8];
        for (int j = 0; j < 40; j++) p[j] = 3 + (j * 17 + k * 31 + salt) % 300;
        tl_generate(model, p, 40, params(8, tenant), out, 8);
    }
}

#define TIMED(expr, name)                                                                         \
    do {                                                                                          \
        double t0_ = tl_clock();                                                                  \
        int rc_ = (expr);                                                                         \
        double dt_ = tl_clock() - t0_;                                                            \
        CHECK(rc_ >= 0 && dt_ < BOUND, "%s returns while a step runs (rc %d, %.3f s)", name, rc_, dt_); \
    } while (0)

int main(void) {
    tm_spec s = tm_default_spec();
    char path[128];
    snprintf(path, sizeof path, "/tmp/tl_engine_msgs_%d.gguf", (int)getpid());
    tm_write(&s, path);
    tl_model_params mp = tl_model_default_params();
    tl_model_open(path, mp, &model);
    CHECK(model != NULL, "the model opens (%s)", tl_last_error());
    if (!model) return test_summary();

    /* without an engine thread a budget applies at once */
    fill_tenant(6, 0);
    int before6 = tl_model_tenant_blocks(model, 6);
    CHECK(tl_model_set_tenant_budget(model, 6, 2) == TL_OK && before6 > 2 && tl_model_tenant_blocks(model, 6) <= 2,
          "without an engine a budget is enforced at once (%d blocks before, %d after)", before6,
          tl_model_tenant_blocks(model, 6));

    fill_tenant(5, 100);
    int before5 = tl_model_tenant_blocks(model, 5);
    CHECK(before5 > 2, "tenant 5 holds cache entries (%d blocks)", before5);
    int32_t reg[32], p[24];
    for (int j = 0; j < 32; j++) reg[j] = 7 + j;
    for (int j = 0; j < 24; j++) p[j] = 20 + j;
    tl_pool *bound, *async_pool;
    tl_pool_new(2, &bound);
    tl_pool_new(2, &async_pool);
    CHECK(tl_pool_register(model, bound, reg, 20, 0, 0) == 20, "a pool entry is pinned (%s)", tl_last_error());
    CHECK(tl_engine_start(model, 0) == TL_OK, "the engine starts (%s)", tl_last_error());
    int sv[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) == 0, "a socket pair for notifications");

    pthread_t th;
    pthread_create(&th, NULL, long_step, NULL);
    while (__atomic_load_n(&holding, __ATOMIC_ACQUIRE) == 0) usleep(1000);
    double t_start = tl_clock();

    TIMED(tl_model_set_tenant_budget(model, 5, 2), "tl_model_set_tenant_budget");
    TIMED(tl_engine_notify_attach(model, sv[1]), "tl_engine_notify_attach");
    tl_cache_stats st;
    TIMED(tl_model_get_stats(model, &st), "tl_model_get_stats");
    int64_t id = -1, id2 = -1, rid = -1;
    tl_generate_params gp = params(4, 0);
    TIMED(tl_request_submit(model, p, 24, &gp, NULL, &id), "tl_request_submit");
    TIMED(tl_request_submit(model, reg, 24, &gp, NULL, &id2), "a second tl_request_submit");
    tl_request_info info;
    TIMED(tl_request_get_info(model, id, &info), "tl_request_get_info");
    int32_t out[8];
    int fin = 0;
    TIMED(tl_request_take(model, id, out, 8, &fin), "tl_request_take");
    TIMED(tl_request_cancel(model, id2), "tl_request_cancel");
    TIMED(tl_request_release(model, id2), "tl_request_release");
    TIMED(tl_pool_register_submit(model, async_pool, reg + 4, 16, 0, 0, &rid), "tl_pool_register_submit");
    double t0 = tl_clock();
    tl_pool_free(bound);
    double dt = tl_clock() - t0;
    CHECK(dt < BOUND, "tl_pool_free of a bound pool returns while a step runs (%.3f s)", dt);
    TIMED(tl_model_set_evict_weights(model, 1, 0, 0, 0), "tl_model_set_evict_weights");
    CHECK(__atomic_load_n(&holding, __ATOMIC_ACQUIRE) == 1 && tl_clock() - t_start < HOLD,
          "all those calls finished while the step still held the lock (%.3f s)", tl_clock() - t_start);
    pthread_join(th, NULL);

    /* after the step: the messages are applied at the next boundary */
    int after5 = before5;
    for (int k = 0; k < 5000 && after5 > 2; k++) {
        usleep(1000);
        after5 = tl_model_tenant_blocks(model, 5);
    }
    CHECK(after5 <= 2, "the budget is enforced at the next step (%d blocks before, %d after)", before5, after5);
    int got_id = 0;
    for (int k = 0; k < 5000 && !got_id; k++) {
        int64_t ids[64];
        ssize_t n = read(sv[0], ids, sizeof ids);
        for (ssize_t i = 0; i < n / 8; i++) got_id |= ids[i] == id;
        if (!got_id) usleep(1000);
    }
    CHECK(got_id, "the attached descriptor receives the id of the request submitted meanwhile");
    tl_request_info rinfo = {0};
    for (int k = 0; k < 5000; k++) {
        tl_request_get_info(model, rid, &rinfo);
        if (rinfo.state >= TL_REQ_DONE) break;
        usleep(1000);
    }
    CHECK(rinfo.state == TL_REQ_DONE && tl_pool_size(async_pool) == 1, "the registration completes (state %d)",
          rinfo.state);
    tl_request_release(model, rid);
    tl_request_release(model, id);
    tl_engine_stop(model);
    tl_model_step(model); /* acts on the releases */
    tl_cache_node nodes[256];
    int n_nodes = tl_model_cache_nodes(model, nodes, 256), pinned = 0;
    for (int i = 0; i < n_nodes && i < 256; i++) pinned += nodes[i].pinned;
    CHECK(pinned == 1, "the freed pool's entry is unpinned, the other pool's stays (%d pinned)", pinned);
    CHECK(tl_sched_check_invariants(model, NULL, 0) == 0, "KV invariants hold (%s)", tl_last_error());

    /* a message posted to a stopped engine is applied by its caller */
    CHECK(tl_engine_notify_attach(model, sv[1]) == TL_ERR_STATE, "notify attach without an engine is refused");
    tl_pool_free(async_pool);
    close(sv[0]);
    close(sv[1]);
    tl_model_close(model);
    remove(path);
    return test_summary();
}
