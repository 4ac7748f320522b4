/* test_cache_prop.c - a randomized property test of the prefix cache:
 * 100,000 operations (register, generate, submit/step/cancel/release,
 * free pool, prefix handles, forced eviction) on a small KV arena under
 * memory pressure, checked after every step against a reference model of
 * the pools and against the KV invariants: free + used = total, each
 * block's reference count equals its holders, pinned entries stay fully
 * cached, nothing leaks at the end. */
#include <stdint.h>
#include <unistd.h>

#include "model.h"
#include "scheduler.h"
#include "test.h"
#include "testmodel.h"
#include "tinyloop.h"

#define N_POOLS 3
#define MAX_ENT 4
#define MAX_TOK 24

typedef struct {
    int32_t t[MAX_TOK];
    int n, loops, window;
    uint64_t order; /* insertion order: ties in length evict the oldest */
} ref_entry;

typedef struct {
    tl_pool *p;
    int cap;
    ref_entry e[MAX_ENT];
    int n;
} ref_pool;

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(uint32_t n) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

/* Prompts share a few stems so the tree branches and matches. */
static int random_tokens(int32_t *t, int max) {
    static const int32_t stems[4][6] = {{5, 6, 7, 8, 9, 10}, {5, 6, 7, 20, 21, 22}, {30, 31, 32, 33, 34, 35}, {5, 40, 41, 42, 43, 44}};
    int n = 1 + (int)rnd((uint32_t)max);
    const int32_t *s = stems[rnd(4)];
    for (int i = 0; i < n; i++) t[i] = i < 6 && rnd(8) ? s[i] : (int32_t)(3 + rnd(12));
    return n;
}

static uint64_t order_clock;

static void ref_register(ref_pool *rp, const int32_t *t, int n, int loops, int window, int returned) {
    for (int i = 0; i < rp->n; i++)
        if (rp->e[i].n == n && rp->e[i].loops == loops && rp->e[i].window == window && !memcmp(rp->e[i].t, t, (size_t)n * 4))
            return;
    if (returned <= 0) return; /* the build failed (memory): nothing new, the victim stays (build first, evict after) */
    if (rp->n == rp->cap) {
        int v = 0;
        for (int i = 1; i < rp->n; i++)
            if (rp->e[i].n < rp->e[v].n || (rp->e[i].n == rp->e[v].n && rp->e[i].order < rp->e[v].order)) v = i;
        rp->e[v] = rp->e[--rp->n];
    }
    ref_entry *e = &rp->e[rp->n++];
    memcpy(e->t, t, (size_t)n * 4);
    e->n = n;
    e->loops = loops;
    e->window = window;
    e->order = ++order_clock;
}

int main(void) {
    int ops = getenv("TL_PROP_OPS") ? atoi(getenv("TL_PROP_OPS")) : 100000;
    tm_spec s = tm_default_spec();
    s.n_embd = 16;
    s.n_head = 2;
    s.n_head_kv = 1;
    s.n_ff = 32;
    s.n_layer = 3;
    s.loop_start = 1;
    s.loop_end = 2;
    s.loop_default = 2;
    s.n_ctx = 64;
    char path[128];
    snprintf(path, sizeof path, "/tmp/tl_prop_%d.gguf", (int)getpid());
    tm_write(&s, path);
    tl_model_params mp = tl_model_default_params();
    mp.kv_block_size = 4;
    mp.n_threads = 1;
    mp.kv_mem = 128 * (2 * 4 * 8 * 2); /* 128 blocks of 4 positions: frequent pressure */
    tl_model *m = NULL;
    tl_model_open(path, mp, &m);
    CHECK(m != NULL, "the property model opens (%s)", tl_last_error());
    if (!m) return test_summary();

    ref_pool pools[N_POOLS];
    for (int i = 0; i < N_POOLS; i++) {
        pools[i].cap = 1 + i;
        pools[i].n = 0;
        tl_pool_new(pools[i].cap, &pools[i].p);
    }
    int64_t live[64];
    int n_live = 0;
    tl_prefix *handles[4] = {0};
    int bad_invariant = 0, bad_pool = 0, bad_pin = 0, failures = 0;
    int32_t t[MAX_TOK], out[MAX_TOK + 8];
    for (int op = 0; op < ops; op++) {
        int kind = (int)rnd(100);
        int loops = 1 + (int)rnd(2), window = rnd(4) == 0 ? 8 : 0;
        tl_generate_params gp = tl_generate_default_params();
        gp.max_tokens = 1 + (int)rnd(3);
        gp.loops = loops;
        gp.cache_window = window;
        gp.ignore_eos = 1;
        if (kind < 12) { /* register */
            ref_pool *rp = &pools[rnd(N_POOLS)];
            int n = random_tokens(t, MAX_TOK);
            int r = tl_pool_register(m, rp->p, t, n, loops, window);
            if (r >= 0 && r != n) bad_pool++;
            ref_register(rp, t, n, loops, window, r);
            failures += r < 0;
        } else if (kind < 20) { /* asynchronous register, stepped to its end */
            ref_pool *rp = &pools[rnd(N_POOLS)];
            int n = random_tokens(t, MAX_TOK);
            int64_t id;
            if (tl_pool_register_submit(m, rp->p, t, n, loops, window, &id) == TL_OK) {
                tl_request_info info = {0};
                for (int k = 0; k < 64; k++) {
                    tl_request_get_info(m, id, &info);
                    if (info.state >= TL_REQ_DONE) break;
                    tl_model_step(m);
                }
                /* the pool makes room only once the build succeeded */
                if (info.state == TL_REQ_DONE) ref_register(rp, t, n, loops, window, 1);
                else failures++;
                tl_request_release(m, id);
            }
        } else if (kind < 35) { /* generate_with_pool */
            int n = random_tokens(t, MAX_TOK - 4);
            int r = tl_generate_with_pool(m, pools[rnd(N_POOLS)].p, t, n, gp, out, MAX_TOK + 8);
            failures += r < 0;
        } else if (kind < 45) { /* plain generate through the radix cache */
            int n = random_tokens(t, MAX_TOK - 4);
            failures += tl_generate(m, t, n, gp, out, gp.max_tokens) < 0;
        } else if (kind < 60) { /* submit */
            if (n_live < 64) {
                int n = random_tokens(t, MAX_TOK - 4);
                if (tl_request_submit(m, t, n, &gp, rnd(2) ? pools[0].p : NULL, &live[n_live]) == TL_OK) n_live++;
            }
        } else if (kind < 78) { /* step */
            tl_model_step(m);
        } else if (kind < 84) { /* take + release a random request */
            if (n_live) {
                int i = (int)rnd((uint32_t)n_live);
                int fin = 0;
                tl_request_take(m, live[i], out, MAX_TOK, &fin);
                if (fin || rnd(3) == 0) {
                    tl_request_release(m, live[i]);
                    live[i] = live[--n_live];
                }
            }
        } else if (kind < 88) { /* cancel */
            if (n_live) tl_request_cancel(m, live[rnd((uint32_t)n_live)]);
        } else if (kind < 90) { /* free a pool and start a new one */
            ref_pool *rp = &pools[rnd(N_POOLS)];
            tl_pool_free(rp->p);
            tl_pool_new(rp->cap, &rp->p);
            rp->n = 0;
        } else if (kind < 95) { /* prefix handle build / free */
            int i = (int)rnd(4);
            if (handles[i]) {
                tl_prefix_free(handles[i]);
                handles[i] = NULL;
            } else {
                int n = random_tokens(t, MAX_TOK);
                if (tl_prefix_build(m, t, n, loops, window, &handles[i]) != TL_OK) failures++;
            }
        } else { /* forced eviction */
            tl_radix_evict(&m->cache, (int)rnd((uint32_t)m->kv.n_blocks + 1));
        }
        if (tl_sched_check_invariants(m, NULL, 0) != 0 && bad_invariant++ < 3)
            printf("  op %d (kind %d): %s\n", op, kind, tl_last_error());
        for (int i = 0; i < N_POOLS; i++) {
            ref_pool *rp = &pools[i];
            int64_t tot = 0;
            for (int j = 0; j < rp->n; j++) tot += rp->e[j].n;
            if (tl_pool_size(rp->p) != rp->n || tl_pool_total_cached_tokens(rp->p) != tot) {
                if (bad_pool++ < 3)
                    printf("  op %d: pool %d has size %d / %lld tokens, reference %d / %lld\n", op, i,
                           tl_pool_size(rp->p), (long long)tl_pool_total_cached_tokens(rp->p), rp->n, (long long)tot);
                rp->n = 0; /* resynchronise is impossible; stop counting this pool */
            }
            for (int j = 0; j < rp->n; j++) {
                ref_entry *e = &rp->e[j];
                int ns = tl_cache_namespace(m, e->loops, e->window, 0);
                if (tl_radix_match(&m->cache, ns, e->t, e->n, e->n, NULL) != e->n && bad_pin++ < 3)
                    printf("  op %d: a pinned entry of %d tokens is no longer fully cached\n", op, e->n);
                tl_radix_namespace_release(&m->cache, ns); /* an emptied namespace is then freed */
            }
        }
    }
    printf("  %d operations, %d expected failures under memory pressure (registers/builds/generates)\n", ops, failures);
    CHECK(bad_invariant == 0, "block refcounts equal their holders and free + used = total after every step (%d bad)",
          bad_invariant);
    CHECK(bad_pool == 0, "pool sizes and cached tokens follow the reference model (%d bad)", bad_pool);
    CHECK(bad_pin == 0, "pinned entries are never evicted (%d bad)", bad_pin);
    for (int i = 0; i < n_live; i++) tl_request_release(m, live[i]);
    for (int i = 0; i < 4; i++) tl_prefix_free(handles[i]);
    for (int i = 0; i < N_POOLS; i++) tl_pool_free(pools[i].p);
    tl_radix_evict(&m->cache, m->kv.n_blocks);
    tl_cache_stats st;
    tl_model_get_stats(m, &st);
    CHECK(st.blocks_free == st.blocks_total && st.nodes == 0,
          "with everything released and the cache evicted, all %d blocks are free (%d) and the tree is empty (%lld nodes)",
          st.blocks_total, st.blocks_free, (long long)st.nodes);
    tl_model_close(m);
    remove(path);
    return test_summary();
}
