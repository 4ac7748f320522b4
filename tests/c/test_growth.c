/* test_growth.c - what a server that derives tenants and salts from request
 * data must not grow without bound: cache namespaces are found by hash and
 * freed with their last node, tenant ids work far past 2^20 and their
 * accounting goes with their cache, a pool freed while the engine steps is
 * freed by the engine (the caller never waits for a step), and a
 * low-priority request is admitted while higher-priority ones keep
 * arriving (aging). */
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include "model.h"
#include "scheduler.h"
#include "test.h"
#include "testmodel.h"
#include "tinyloop.h"

#define AGING_STEPS_EXPECTED 64 /* scheduler.c's default */

static tl_model *open_model(const char *name, size_t kv_blocks) {
    tm_spec s = tm_default_spec();
    char path[128];
    snprintf(path, sizeof path, "/tmp/tl_growth_%d_%s.gguf", (int)getpid(), name);
    tm_write(&s, path);
    tl_model_params mp = tl_model_default_params();
    mp.n_threads = 1;
    mp.kv_type = TL_KV_F16; /* the arena is sized in f16 blocks, whatever TINYLOOP_KV_* says */
    if (kv_blocks) mp.kv_mem = kv_blocks * (2 * 16 * 32 * 2); /* blocks of 16 positions, one layer each */
    tl_model *m = NULL;
    tl_model_open(path, mp, &m);
    remove(path);
    CHECK(m != NULL, "the %s model opens (%s)", name, tl_last_error());
    return m;
}

static tl_generate_params params(int max_tokens) {
    tl_generate_params gp = tl_generate_default_params();
    gp.max_tokens = max_tokens;
    gp.ignore_eos = 1;
    return gp;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int invariants_ok(tl_model *m, const char *when) {
    int rc = tl_sched_check_invariants(m, NULL, 0);
    CHECK(rc == 0, "the KV, namespace and tenant invariants hold %s (%s)", when, rc ? tl_last_error() : "");
    return rc == 0;
}

/* ---- namespaces ---------------------------------------------------------------------------- */

static void test_namespaces_freed(void) {
    tl_model *m = open_model("ns", 2048); /* room for every salt's entry: no eviction by pressure */
    if (!m) return;
    enum { SALTS = 500 };
    int32_t prompt[12], out[4];
    int ok = 1;
    for (int i = 0; i < SALTS; i++) {
        for (int j = 0; j < 12; j++) prompt[j] = 3 + (i * 7 + j * 13) % 300;
        tl_generate_params gp = params(2);
        gp.salt = 1000 + (uint64_t)i; /* a salt per request, as a policy deriving it from a header would */
        ok &= tl_generate(m, prompt, 12, gp, out, 2) == 2;
    }
    CHECK(ok, "%d requests under %d distinct salts generate", SALTS, SALTS);
    int live = tl_radix_namespace_count(&m->cache);
    CHECK(live == SALTS, "each salt's cached tokens live in a namespace of their own (%d namespaces)", live);
    invariants_ok(m, "with 500 salted namespaces");
    tl_radix_evict(&m->cache, m->kv.n_blocks);
    live = tl_radix_namespace_count(&m->cache);
    CHECK(live == 0, "evicting every node frees every namespace (%d left)", live);
    CHECK(m->cache.n_nodes == 0, "nothing is cached after the eviction (%lld nodes)", (long long)m->cache.n_nodes);
    invariants_ok(m, "after every namespace was freed");
    int slots = m->cache.n_ns;
    for (int i = 0; i < SALTS; i++) {
        for (int j = 0; j < 12; j++) prompt[j] = 3 + (i * 11 + j * 5) % 300;
        tl_generate_params gp = params(2);
        gp.salt = 9000 + (uint64_t)i;
        tl_generate(m, prompt, 12, gp, out, 2);
        if (i % 50 == 49) tl_radix_evict(&m->cache, m->kv.n_blocks);
    }
    CHECK(m->cache.n_ns <= slots, "freed namespace slots are reused (%d slots after 500 more salts, %d before)",
          m->cache.n_ns, slots);
    invariants_ok(m, "after reusing namespace slots");

    /* A salted request with a cached prefix in its namespace hits it; a new salt misses. */
    for (int j = 0; j < 12; j++) prompt[j] = 3 + j;
    tl_generate_params gp = params(2);
    gp.salt = 77;
    int64_t id;
    tl_request_info info;
    tl_generate(m, prompt, 12, gp, out, 2);
    tl_request_submit(m, prompt, 12, &gp, NULL, &id);
    while (tl_model_step(m) > 0) {
    }
    tl_request_get_info(m, id, &info);
    CHECK(info.n_cached == 11, "a request finds its salt's cached prefix through the hash map (%d cached)",
          info.n_cached);
    tl_request_release(m, id);
    gp.salt = 78;
    tl_request_submit(m, prompt, 12, &gp, NULL, &id);
    while (tl_model_step(m) > 0) {
    }
    tl_request_get_info(m, id, &info);
    CHECK(info.n_cached == 0, "another salt does not see it (%d cached)", info.n_cached);
    tl_request_release(m, id);
    tl_model_close(m);
}

/* The table itself, without a model: many keys, each found again by its
 * hash; released and emptied, every one is freed. */
static void test_namespace_table(void) {
    tl_kv_pool kv = {.block_size = 16};
    tl_radix t;
    tl_radix_init(&t, &kv);
    enum { N = 50000 };
    static int idx[N];
    double t0 = now_s();
    int ok = 1;
    for (int i = 0; i < N; i++)
        ok &= (idx[i] = tl_radix_namespace(&t, i % 3, i % 5, (uint64_t)i * 0x100000001ull, 2, NULL)) >= 0;
    for (int i = 0; i < N; i++) {
        int again = tl_radix_namespace(&t, i % 3, i % 5, (uint64_t)i * 0x100000001ull, 2, NULL);
        ok &= again == idx[i];
        tl_radix_namespace_release(&t, again);
    }
    double dt = now_s() - t0;
    printf("  %d namespaces created and found again in %.1f ms\n", N, dt * 1e3);
    CHECK(ok, "%d distinct keys each get a namespace and find the same one again", N);
    CHECK(tl_radix_namespace_count(&t) == N, "%d namespaces are live while held (%d)", N, tl_radix_namespace_count(&t));
    char msg[256] = "";
    CHECK(tl_radix_check(&t, msg, sizeof msg) == 0, "the namespace table is consistent while full (%s)", msg);
    for (int i = 0; i < N; i += 2) tl_radix_namespace_release(&t, idx[i]);
    CHECK(tl_radix_namespace_count(&t) == N / 2, "releasing half the empty namespaces frees them (%d left)",
          tl_radix_namespace_count(&t));
    CHECK(tl_radix_check(&t, msg, sizeof msg) == 0, "the table is consistent after deletions (%s)", msg);
    ok = 1;
    for (int i = 1; i < N; i += 2) {
        int again = tl_radix_namespace(&t, i % 3, i % 5, (uint64_t)i * 0x100000001ull, 2, NULL);
        ok &= again == idx[i];
        tl_radix_namespace_release(&t, again);
    }
    CHECK(ok, "the remaining keys are still found after their neighbours were deleted");
    for (int i = 1; i < N; i += 2) tl_radix_namespace_release(&t, idx[i]);
    CHECK(tl_radix_namespace_count(&t) == 0, "no namespace is left after every release (%d)",
          tl_radix_namespace_count(&t));
    tl_radix_destroy(&t);
}

/* ---- tenants ---------------------------------------------------------------------------------- */

static void test_big_tenant_ids(void) {
    tl_model *m = open_model("tenants", 0);
    if (!m) return;
    const int ids[] = {(1 << 20) + 1, 1 << 30, INT_MAX};
    int32_t prompt[40], out[4];
    for (int j = 0; j < 40; j++) prompt[j] = 3 + (j * 17) % 300;
    for (int k = 0; k < 3; k++) {
        int rc = tl_model_set_tenant_budget(m, ids[k], 8);
        CHECK(rc == TL_OK, "tenant id %d takes a budget (%s)", ids[k], rc ? tl_last_error() : "ok");
        tl_generate_params gp = params(2);
        gp.tenant = ids[k];
        gp.salt = (uint64_t)k + 1;
        CHECK(tl_generate(m, prompt, 40, gp, out, 2) == 2, "tenant id %d generates (%s)", ids[k], tl_last_error());
        int used = tl_model_tenant_blocks(m, ids[k]);
        CHECK(used > 0 && used <= 8, "tenant %d's cache is charged to it and kept within its budget (%d blocks)",
              ids[k], used);
    }
    tl_generate_params gp = params(2);
    gp.tenant = -3;
    int64_t id;
    int rc = tl_request_submit(m, prompt, 40, &gp, NULL, &id);
    CHECK(rc == TL_ERR_INVALID_ARG && strstr(tl_last_error(), "tenant -3"), "a negative tenant id is refused (%s)",
          tl_last_error());
    rc = tl_model_set_tenant_budget(m, -1, 4);
    CHECK(rc == TL_ERR_INVALID_ARG && strstr(tl_last_error(), "tenant -1"),
          "a negative tenant budget id is refused (%s)", tl_last_error());
    invariants_ok(m, "with tenants past 2^20");

    /* Thousands of tenants come and go: their accounting goes with their cache. */
    for (int i = 0; i < 3000; i++) {
        for (int j = 0; j < 8; j++) prompt[j] = 3 + (i * 3 + j * 7) % 300;
        gp = params(1);
        gp.tenant = 5000000 + i * 977;
        tl_generate(m, prompt, 8, gp, out, 1);
    }
    CHECK(m->cache.n_tenants > 0, "tenants with cached blocks have entries (%d)", m->cache.n_tenants);
    invariants_ok(m, "after 3000 tenants");
    for (int k = 0; k < 3; k++) tl_model_set_tenant_budget(m, ids[k], 0);
    tl_radix_evict(&m->cache, m->kv.n_blocks);
    CHECK(m->cache.n_tenants == 0, "once their cache is evicted and budgets cleared, no tenant entry is left (%d)",
          m->cache.n_tenants);
    CHECK(m->cache.cap_tenants <= 8192, "the tenant table stayed proportional to the live tenants (%d slots)",
          m->cache.cap_tenants);
    invariants_ok(m, "after the tenants left");
    tl_model_close(m);
}

/* ---- aging -------------------------------------------------------------------------------------- */

static int state_of(tl_model *m, int64_t id) {
    tl_request_info info;
    return tl_request_get_info(m, id, &info) == TL_OK ? info.state : -1;
}

/* Eight blocks of KV: a priority-2 request (24 + 8 positions) holds 4, the
 * priority-0 one (56 + 8) needs all 8, so it only fits when no
 * high-priority request runs. High-priority requests keep arriving, one
 * submitted every step; the first two start a step apart, so one of them
 * is always running.
 * Returns the step the low-priority request was admitted at (-1: never in
 * `steps`) and the high-priority requests finished before. */
static int starve_run(int aging_steps, int steps, int *high_done_out) {
    tl_model *m = open_model("aging", 8);
    if (!m) return -2;
    if (aging_steps > 0) m->sched->aging_steps = aging_steps;
    int32_t prompt[64];
    for (int j = 0; j < 64; j++) prompt[j] = 3 + (j * 29) % 300;
    tl_generate_params lo = params(8), hi = params(8);
    hi.priority = 2;
    enum { MAX_HIGH = 64 };
    int64_t low, high[MAX_HIGH];
    int n_high = 0, admitted_at = -1, high_done = 0, serial = 0;
    for (int step = 0; step < steps && admitted_at < 0; step++) {
        for (int i = 0; i < n_high; i++)
            if (state_of(m, high[i]) >= TL_REQ_DONE) {
                tl_request_release(m, high[i]);
                high[i--] = high[--n_high];
                high_done++;
            }
        if (n_high < MAX_HIGH) {
            prompt[0] = 100 + serial % 150; /* distinct prompts: no request is served by another's cache */
            serial++;
            if (tl_request_submit(m, prompt, 24, &hi, NULL, &high[n_high]) == TL_OK) n_high++;
        }
        if (step == 1) {
            prompt[0] = 5;
            tl_request_submit(m, prompt, 56, &lo, NULL, &low);
        }
        tl_model_step(m);
        if (step >= 1 && state_of(m, low) != TL_REQ_QUEUED) admitted_at = step;
    }
    for (int i = 0; i < n_high; i++) tl_request_cancel(m, high[i]);
    while (tl_model_step(m) > 0) {
    }
    if (admitted_at >= 0)
        CHECK(state_of(m, low) == TL_REQ_DONE, "the aged request runs to its end (state %d)", state_of(m, low));
    for (int i = 0; i < n_high; i++) tl_request_release(m, high[i]);
    tl_request_release(m, low);
    tl_model_step(m);
    invariants_ok(m, "after a run of priorities");
    tl_model_close(m);
    *high_done_out = high_done;
    return admitted_at;
}

static void test_aging(void) {
    int done = 0;
    int at = starve_run(INT_MAX, 2000, &done);
    printf("  without aging: the priority-0 request %s after %d priority-2 requests\n",
           at < 0 ? "was still queued" : "was admitted", done);
    CHECK(at == -1 && done > 100,
          "without aging the scenario starves the priority-0 request (%d priority-2 requests ran, admitted at %d)",
          done, at);
    at = starve_run(0, 2000, &done);
    printf("  with aging (one level per %d steps): admitted at step %d, after %d priority-2 requests\n",
           AGING_STEPS_EXPECTED, at, done);
    CHECK(at >= 0, "with aging the priority-0 request is admitted while priority-2 requests keep arriving");
    CHECK(done > 0, "the priority-2 requests still went first for a while (%d before it)", done);
}

/* ---- freeing a pool never waits for an engine step ----------------------------------------- */

static volatile int pool_freed;

static void *free_pool_thread(void *p) {
    tl_pool_free(p);
    pool_freed = 1;
    return NULL;
}

static int pinned_nodes(tl_model *m) {
    tl_cache_node nodes[256];
    int n = tl_model_cache_nodes(m, nodes, 256), pinned = 0;
    for (int i = 0; i < n && i < 256; i++) pinned += nodes[i].pinned;
    return pinned;
}

static void test_pool_free_deferred(void) {
    tl_model *m = open_model("poolfree", 0);
    if (!m) return;
    int32_t prompt[20];
    for (int j = 0; j < 20; j++) prompt[j] = 3 + j * 5;
    tl_pool *pool;
    tl_pool_new(1, &pool);
    tl_pool_set_salt(pool, 42);
    CHECK(tl_pool_register(m, pool, prompt, 20, 0, 0) == 20, "a salted pool entry registers");
    CHECK(pinned_nodes(m) == 1, "its node is pinned (%d)", pinned_nodes(m));
    tl_engine_start(m, 0);
    tl_sched_compute_lock(m); /* stands for a long engine step */
    pthread_t th;
    pool_freed = 0;
    pthread_create(&th, NULL, free_pool_thread, pool);
    for (int i = 0; i < 500 && !pool_freed; i++) usleep(10000);
    CHECK(pool_freed, "tl_pool_free returns while the engine holds the compute lock (an event loop never waits)");
    tl_sched_compute_unlock(m);
    pthread_join(th, NULL);
    int pinned = 1;
    for (int i = 0; i < 500 && pinned; i++) {
        pinned = pinned_nodes(m);
        if (pinned) usleep(10000);
    }
    CHECK(pinned == 0, "the engine unpins the freed pool's entry between steps (%d pinned)", pinned);
    tl_engine_stop(m);
    tl_radix_evict(&m->cache, m->kv.n_blocks);
    CHECK(tl_radix_namespace_count(&m->cache) == 0, "its namespace goes with its last node (%d left)",
          tl_radix_namespace_count(&m->cache));
    invariants_ok(m, "after a deferred pool free");
    /* handed over just before the engine stops: the model's close frees it */
    tl_pool_new(1, &pool);
    tl_pool_register(m, pool, prompt, 20, 0, 0);
    tl_engine_start(m, 0);
    tl_sched_compute_lock(m);
    tl_pool_free(pool);
    tl_sched_compute_unlock(m);
    tl_model_close(m); /* ASan: nothing leaks */
}

int main(void) {
    test_namespace_table();
    test_namespaces_freed();
    test_big_tenant_ids();
    test_pool_free_deferred();
    test_aging();
    return test_summary();
}
