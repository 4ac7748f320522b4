/* test_cache.c - the prefix cache: cached paths produce exactly the tokens
 * of plain generation; blocks are shared, not copied; the PrefixPool keeps
 * the semantics of docs/prefix-pool.md; handles and windows compose. */
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
    snprintf(p, 256, "/tmp/tl_cache_%d_%s.gguf", (int)getpid(), name);
    return p;
}

static tl_generate_params greedy(int max_tokens, int loops) {
    tl_generate_params gp = tl_generate_default_params();
    gp.max_tokens = max_tokens;
    gp.loops = loops;
    gp.ignore_eos = 1;
    return gp;
}

static int plain(tl_model *m, const int32_t *p, int n, tl_generate_params gp, int32_t *out) {
    gp.no_cache = 1;
    return tl_generate(m, p, n, gp, out, gp.max_tokens);
}

static int64_t hit_tokens(const tl_model *m) {
    tl_cache_stats st;
    tl_model_get_stats(m, &st);
    return st.hit_tokens;
}

static void check_invariants(tl_model *m, const char *when) {
    int rc = tl_sched_check_invariants(m, NULL, 0);
    CHECK(rc == 0, "KV invariants hold %s (%s)", when, tl_last_error());
}

/* Equivalence: every cached path gives plain generation's tokens. */
static void equivalence(tl_model *m, const char *name, int loops, int looped) {
    enum { PREFIX = 40, GEN = 12 };
    int nv = tl_model_n_vocab(m);
    int32_t prefix[PREFIX], prompt[PREFIX + 100], a[GEN], b[PREFIX + 100 + GEN];
    for (int i = 0; i < PREFIX; i++) prefix[i] = 3 + (i * 37 + 11) % (nv - 3);
    prefix[0] = 1;
    tl_pool *pool;
    tl_pool_new(4, &pool);
    int r = tl_pool_register(m, pool, prefix, PREFIX, loops, 0);
    CHECK(r == PREFIX, "%s: register_prefix returns the token count (%d: %s)", name, r, tl_last_error());
    static const int suffixes[] = {0, 1, 15, 16, 17, 100};
    for (size_t k = 0; k < sizeof suffixes / sizeof *suffixes; k++) {
        int n = PREFIX + suffixes[k];
        memcpy(prompt, prefix, sizeof prefix);
        for (int i = PREFIX; i < n; i++) prompt[i] = 3 + (i * 53 + 7) % (nv - 3);
        tl_generate_params gp = greedy(GEN, loops);
        int na = plain(m, prompt, n, gp, a);
        int64_t h0 = hit_tokens(m);
        int nb = tl_generate_with_pool(m, pool, prompt, n, gp, b, n + GEN);
        int64_t hit = hit_tokens(m) - h0;
        CHECK(na == GEN && nb == n + GEN && !memcmp(b, prompt, (size_t)n * 4) && !memcmp(a, b + n, sizeof a),
              "%s: generate_with_pool with a suffix of %d equals plain generation", name, suffixes[k]);
        CHECK(hit >= (suffixes[k] ? PREFIX : PREFIX - 1), "%s: ... and reused %lld cached tokens", name, (long long)hit);
        /* the radix path: the same prompt again hits prompt + output */
        int32_t c[GEN];
        h0 = hit_tokens(m);
        int nc = tl_generate(m, prompt, n, gp, c, GEN);
        CHECK(nc == GEN && !memcmp(a, c, sizeof a) && hit_tokens(m) - h0 == n - 1,
              "%s: a repeated prompt (suffix %d) hits %d tokens of the radix tree and equals plain", name,
              suffixes[k], n - 1);
    }
    /* miss */
    for (int i = 0; i < 30; i++) prompt[i] = 3 + (i * 29 + 5) % (nv - 3);
    int na = plain(m, prompt, 30, greedy(GEN, loops), a);
    int nb = tl_generate_with_pool(m, pool, prompt, 30, greedy(GEN, loops), b, 30 + GEN);
    CHECK(na == GEN && nb == 30 + GEN && !memcmp(a, b + 30, sizeof a), "%s: a miss falls through to plain", name);
    /* window mismatch: the prefix registered at window 0 is not used at window 24 */
    memcpy(prompt, prefix, sizeof prefix);
    prompt[PREFIX] = 5;
    tl_generate_params gw = greedy(GEN, loops);
    gw.cache_window = 24;
    na = plain(m, prompt, PREFIX + 1, gw, a);
    int64_t h0 = hit_tokens(m);
    nb = tl_generate_with_pool(m, pool, prompt, PREFIX + 1, gw, b, PREFIX + 1 + GEN);
    CHECK(hit_tokens(m) == h0, "%s: another cache_window misses (hit %lld)", name, (long long)(hit_tokens(m) - h0));
    CHECK(nb == PREFIX + 1 + GEN && !memcmp(a, b + PREFIX + 1, sizeof a), "%s: ... and equals plain windowed generation",
          name);
    /* a windowed prefix: register and hit at window 24 */
    r = tl_pool_register(m, pool, prefix, PREFIX, loops, 24);
    h0 = hit_tokens(m);
    nb = tl_generate_with_pool(m, pool, prompt, PREFIX + 1, gw, b, PREFIX + 1 + GEN);
    CHECK(r == PREFIX && hit_tokens(m) - h0 >= PREFIX && !memcmp(a, b + PREFIX + 1, sizeof a),
          "%s: a prefix registered at window 24 is hit at window 24 and equals plain", name);
    if (looped) {
        int other = loops + 1;
        na = plain(m, prompt, PREFIX + 1, greedy(GEN, other), a);
        h0 = hit_tokens(m);
        nb = tl_generate_with_pool(m, pool, prompt, PREFIX + 1, greedy(GEN, other), b, PREFIX + 1 + GEN);
        CHECK(hit_tokens(m) == h0 && !memcmp(a, b + PREFIX + 1, sizeof a),
              "%s: loops %d misses a prefix built at loops %d and equals plain", name, other, loops);
    }
    check_invariants(m, name);
    tl_pool_free(pool);
    check_invariants(m, "after freeing the pool");
}

static void test_equivalence(void) {
    const char *shared = test_shared_dir();
    if (shared) {
        char path[512];
        snprintf(path, sizeof path, "%s/models/stories260K.gguf", shared);
        tl_model_params mp = tl_model_default_params();
        mp.max_seq_len = 512;
        tl_model *m = NULL;
        tl_model_open(path, mp, &m);
        CHECK(m != NULL, "stories260K opens (%s)", tl_last_error());
        if (m) equivalence(m, "stories260K", 0, 0);
        tl_model_close(m);
    } else {
        printf("SKIP stories260K equivalence: ../shared not found\n");
    }
    tm_spec s = tm_default_spec();
    s.n_layer = 4;
    s.loop_start = 1;
    s.loop_end = 3;
    s.loop_default = 2;
    const char *path = tmp_path("looped");
    tm_write(&s, path);
    tl_model *m = NULL;
    tl_model_open(path, tl_model_default_params(), &m);
    CHECK(m != NULL, "the synthetic looped model opens (%s)", tl_last_error());
    if (m) equivalence(m, "looped synthetic", 2, 1);
    tl_model_close(m);
    remove(path);
}

/* ---- sharing ----------------------------------------------------------------------- */

static void test_sharing(void) {
    tm_spec s = tm_default_spec();
    s.n_ctx = 2048;
    const char *path = tmp_path("share");
    tm_write(&s, path);
    tl_model_params mp = tl_model_default_params();
    mp.kv_mem = (size_t)8 << 20;
    tl_model *m = NULL;
    tl_model_open(path, mp, &m);
    CHECK(m != NULL, "the sharing model opens (%s)", tl_last_error());
    if (!m) return;
    enum { PREFIX = 1500, N = 100 };
    static int32_t prompt[PREFIX + 8];
    for (int i = 0; i < PREFIX; i++) prompt[i] = 3 + (i * 7919) % 300;
    tl_pool *pool;
    tl_pool_new(1, &pool);
    CHECK(tl_pool_register(m, pool, prompt, PREFIX, 0, 0) == PREFIX, "a 1500-token prefix registers");
    tl_cache_stats st0, st1;
    tl_model_get_stats(m, &st0);
    /* snapshot the prefix's blocks */
    tl_radix_node *node = NULL;
    int ns = tl_cache_namespace(m, 0, 0, 0);
    tl_radix_match(&m->cache, ns, prompt, PREFIX, PREFIX, &node);
    int n_ids = node ? node->n_lb * 2 : 0;
    size_t bytes = m->kv.block_bytes;
    uint8_t *snap = malloc((size_t)n_ids * bytes);
    for (int i = 0; i < n_ids; i++) memcpy(snap + i * bytes, tl_kv_k(&m->kv, node->blocks[i]), bytes);

    int64_t ids[N];
    for (int r = 0; r < N; r++) {
        for (int j = 0; j < 8; j++) prompt[PREFIX + j] = 3 + (r * 31 + j * 17) % 300;
        tl_generate_params gp = greedy(4, 0);
        tl_request_submit(m, prompt, PREFIX + 8, &gp, NULL, &ids[r]);
    }
    for (int all = 0; !all;) { /* step until every request has prefilled its suffix */
        tl_model_step(m);
        all = 1;
        for (int r = 0; r < N; r++) {
            tl_request_info ri;
            tl_request_get_info(m, ids[r], &ri);
            all &= ri.n_generated >= 1;
        }
    }
    tl_model_get_stats(m, &st1);
    int prefix_blocks = st0.blocks_used;
    int per_request = 2 * 2; /* its copy of the tail block + at most one new block, 2 layers */
    int used = st1.blocks_used - prefix_blocks;
    printf("  100 requests on a 1500-token prefix: %d blocks for the prefix, %d more for 100 requests "
           "(%d without sharing)\n", prefix_blocks, used, N * ((PREFIX + 8 + 15) / 16) * 2);
    CHECK(used <= N * per_request, "100 requests hold the prefix's blocks once (%d extra blocks <= %d)", used,
          N * per_request);
    CHECK(st1.blocks_shared >= prefix_blocks - 2, "the prefix's blocks are shared (%d shared)", st1.blocks_shared);
    int active = 1;
    while (active > 0) active = tl_model_step(m);
    int same = 1;
    for (int i = 0; i < n_ids; i++) same &= !memcmp(snap + i * bytes, tl_kv_k(&m->kv, node->blocks[i]), bytes);
    CHECK(same, "copy-on-write leaves the shared blocks byte-identical");
    check_invariants(m, "after 100 shared requests");
    for (int r = 0; r < N; r++) tl_request_release(m, ids[r]);
    free(snap);
    tl_pool_free(pool);
    tl_model_close(m);
    remove(path);
}

/* ---- the PrefixPool contract (docs/prefix-pool.md) ------------------------------------------- */

static void test_pool_semantics(void) {
    tm_spec s = tm_default_spec();
    s.n_layer = 3;
    s.loop_start = 1;
    s.loop_end = 2;
    s.loop_default = 2;
    const char *path = tmp_path("pool");
    tm_write(&s, path);
    tl_model *m = NULL;
    tl_model_open(path, tl_model_default_params(), &m);
    if (!m) { CHECK(0, "pool model opens: %s", tl_last_error()); return; }
    int32_t t[64];
    for (int i = 0; i < 64; i++) t[i] = 3 + (i * 13) % 300;
    tl_pool *p;
    CHECK(tl_pool_new(0, &p) == TL_OK, "PrefixPool(0) is created");
    tl_pool_stats ps;
    tl_pool_get_stats(p, &ps);
    CHECK(ps.capacity == 1, "capacity 0 is coerced to 1 (%d)", ps.capacity);
    tl_pool_register(m, p, t, 10, 2, 0);
    tl_pool_register(m, p, t + 20, 12, 2, 0);
    CHECK(tl_pool_size(p) == 1 && tl_pool_total_cached_tokens(p) == 12, "a capacity-1 pool keeps the newest entry");
    tl_pool_free(p);

    tl_pool_new(2, &p);
    CHECK(tl_pool_size(p) == 0 && tl_pool_total_cached_tokens(p) == 0, "a new pool is empty");
    CHECK(tl_pool_register(m, p, t, 10, 2, 0) == 10, "register returns the matchable length");
    CHECK(tl_pool_register(m, p, t, 10, 2, 0) == 10 && tl_pool_size(p) == 1, "registering the same key is a no-op");
    CHECK(tl_pool_register(m, p, t, 10, 3, 0) == 10 && tl_pool_size(p) == 2, "loops is part of the key");
    tl_pool_register(m, p, t, 20, 2, 0); /* over capacity: the shortest (10 at loops 2 or 3, oldest first) goes */
    CHECK(tl_pool_size(p) == 2 && tl_pool_total_cached_tokens(p) == 30, "over capacity the shortest entry is evicted (%lld)",
          (long long)tl_pool_total_cached_tokens(p));
    tl_pool_register(m, p, t, 15, 2, 7);
    CHECK(tl_pool_total_cached_tokens(p) == 35, "cache_window is part of the key, and the new entry always goes in (%lld)",
          (long long)tl_pool_total_cached_tokens(p));
    tl_pool_get_stats(p, &ps);
    CHECK(ps.evictions == 2, "the pool counts its evictions (%lld)", (long long)ps.evictions);
    /* longest match wins: entries of 15 (window 7) and 20 (window 0) both prefix t */
    int32_t out[80];
    tl_pool_get_stats(p, &ps);
    int64_t before = ps.hit_tokens;
    tl_generate_with_pool(m, p, t, 30, greedy(4, 2), out, 34);
    tl_pool_get_stats(p, &ps);
    CHECK(ps.hit_tokens - before >= 20, "the longest registered prefix wins (%lld tokens reused)",
          (long long)(ps.hit_tokens - before));
    /* errors: a negative code and a message, like every other call */
    CHECK(tl_pool_register(m, p, t, 0, 2, 0) == TL_ERR_INVALID_ARG && strstr(tl_last_error(), "empty"),
          "an empty prefix returns TL_ERR_INVALID_ARG (%s)",
          tl_last_error());
    t[3] = 100000;
    CHECK(tl_pool_register(m, p, t, 5, 2, 0) == TL_ERR_INVALID_ARG && strstr(tl_last_error(), "100000"),
          "an out-of-vocab prefix returns TL_ERR_INVALID_ARG naming the id (%s)", tl_last_error());
    t[3] = 3 + 39 % 300;
    CHECK(tl_pool_register(m, NULL, t, 5, 2, 0) == TL_ERR_INVALID_ARG, "a NULL pool returns TL_ERR_INVALID_ARG");
    int rc = tl_generate_with_pool(m, p, t, 250, greedy(10, 2), out, 80);
    CHECK(rc == TL_ERR_TOO_LONG && strstr(tl_last_error(), "prompt length 250 + max_tokens 10 exceeds max_seq_len 256"),
          "prompt + max_tokens past max_seq_len names the numbers (%s)", tl_last_error());
    /* LRU policy */
    tl_pool *q;
    tl_pool_new(2, &q);
    tl_pool_set_policy(q, TL_POOL_EVICT_LRU);
    tl_pool_register(m, q, t, 30, 2, 0);
    tl_pool_register(m, q, t + 1, 5, 2, 0);
    tl_generate_with_pool(m, q, t + 1, 8, greedy(2, 2), out, 10); /* touches the 5-token entry */
    tl_pool_register(m, q, t + 2, 6, 2, 0);
    CHECK(tl_pool_total_cached_tokens(q) == 11, "the LRU policy drops the least recently used entry (%lld)",
          (long long)tl_pool_total_cached_tokens(q));
    /* an empty pool falls through */
    tl_pool *e;
    tl_pool_new(3, &e);
    int32_t a[8];
    int na = plain(m, t, 9, greedy(8, 2), a);
    int nb = tl_generate_with_pool(m, e, t, 9, greedy(8, 2), out, 17);
    CHECK(na == 8 && nb == 17 && !memcmp(a, out + 9, sizeof a), "an empty pool falls through to plain generation");
    check_invariants(m, "after the pool semantics");
    /* pools outlive or predecease the model */
    tl_pool_free(e);
    tl_pool_free(p);
    tl_model_close(m);
    CHECK(tl_pool_size(q) == 0, "closing the model detaches its pools");
    tl_pool_free(q);
    remove(path);
}

/* ---- handles ------------------------------------------------------------------------------ */

static void test_handles(void) {
    tm_spec s = tm_default_spec();
    s.n_layer = 4;
    s.loop_start = 1;
    s.loop_end = 3;
    s.loop_default = 2;
    const char *path = tmp_path("handles");
    tm_write(&s, path);
    tl_model *m = NULL;
    tl_model_open(path, tl_model_default_params(), &m);
    if (!m) { CHECK(0, "handle model opens: %s", tl_last_error()); return; }
    int32_t t[40], a[10], b[10];
    for (int i = 0; i < 40; i++) t[i] = 3 + (i * 11) % 300;
    tl_prefix *h;
    CHECK(tl_prefix_build(m, t, 30, 3, 0, &h) == TL_OK, "build_prefix_cache works (%s)", tl_last_error());
    int na = plain(m, t, 30, greedy(10, 3), a);
    int nb = tl_generate_from_prefix(m, h, NULL, 0, greedy(10, 0), b, 10);
    CHECK(na == 10 && nb == 10 && !memcmp(a, b, sizeof a), "generate_from_prefix_cache equals plain generation");
    na = plain(m, t, 37, greedy(10, 3), a);
    nb = tl_generate_from_prefix(m, h, t + 30, 7, greedy(10, 0), b, 10);
    CHECK(na == 10 && nb == 10 && !memcmp(a, b, sizeof a), "... also with a suffix");
    tl_prefix_free(h);
    tl_prefix *rh;
    CHECK(tl_resume_build(m, t, 33, &rh) == TL_OK, "build_resume_handle works (%s)", tl_last_error());
    for (int k = 1; k <= 4; k++) {
        na = plain(m, t, 33, greedy(10, k), a);
        nb = tl_resume_generate(m, rh, greedy(10, k), b, 10);
        CHECK(na == 10 && nb == 10 && !memcmp(a, b, sizeof a), "resume_generate at loops %d equals plain generation (%d)",
              k, nb);
    }
    /* extra holders: the handle's prelude blocks */
    tl_prefix_free(rh);
    check_invariants(m, "after the handles");
    tl_model_info info;
    tl_model_get_info(m, &info);
    tl_radix_evict(&m->cache, info.kv_blocks_total);
    tl_model_get_info(m, &info);
    CHECK(info.kv_blocks_free == info.kv_blocks_total, "with handles freed and the cache evicted, every block is free");
    tl_model_close(m);
    remove(path);
}

/* LRU across a round: prefix A served two suffixes (a branch point with
 * two leaves), then B arrived. Freeing all but B's blocks at once must take
 * A's leaves and then A's prefix, which becomes a leaf in the same round
 * and is older than B; B stays whole. (The round took B instead, and left
 * the older prefix for a next round it never needed.) */
static void test_lru_across_round(void) {
    tm_spec s = tm_default_spec();
    s.n_ctx = 512;
    const char *path = tmp_path("lru");
    tm_write(&s, path);
    tl_model *m = NULL, *mb = NULL;
    tl_model_params mp = tl_model_default_params();
    mp.kv_block_size = 16;
    tl_model_open(path, mp, &m);
    tl_model_open(path, mp, &mb);
    if (!m || !mb) {
        CHECK(0, "LRU model opens: %s", tl_last_error());
        tl_model_close(m);
        tl_model_close(mb);
        return;
    }
    enum { P = 96, S = 16 };
    int32_t a1[P + S], a2[P + S], b[P + S], out[1];
    for (int i = 0; i < P + S; i++) {
        a1[i] = 3 + (i * 37 + 11) % 300;
        b[i] = 3 + (i * 53 + 29) % 300;
    }
    memcpy(a2, a1, sizeof a1);
    for (int i = P; i < P + S; i++) a2[i] = 3 + (i * 71 + 5) % 300;
    tl_generate(mb, b, P + S, greedy(1, 0), out, 1);
    tl_cache_stats st;
    tl_model_get_stats(mb, &st);
    const int b_blocks = st.blocks_used; /* B alone */
    tl_generate(m, a1, P + S, greedy(1, 0), out, 1);
    tl_generate(m, a2, P + S, greedy(1, 0), out, 1); /* splits A after P tokens */
    tl_generate(m, b, P + S, greedy(1, 0), out, 1);  /* B, the newest */
    tl_model_get_stats(m, &st);
    tl_radix_evict(&m->cache, m->kv.n_free + st.blocks_used - b_blocks);
    tl_model_get_stats(m, &st);
    CHECK(st.blocks_used == b_blocks, "freeing all but B's blocks leaves B's %d (%d used)", b_blocks, st.blocks_used);
    int64_t h0 = hit_tokens(m);
    tl_generate(m, b, P + S, greedy(1, 0), out, 1);
    CHECK(hit_tokens(m) - h0 == P + S - 1, "B, the newest, still matches whole (%lld of %d tokens)",
          (long long)(hit_tokens(m) - h0), P + S - 1);
    check_invariants(m, "after evicting the older prefix");
    tl_model_close(m);
    tl_model_close(mb);
    remove(path);
}

/* ---- tenants: salts with a shared operator prompt, budgets, the cost policy ---- */

static void test_tenants(void) {
    tm_spec s = tm_default_spec();
    const char *path = tmp_path("tenants");
    tm_write(&s, path);
    tl_model_params mp = tl_model_default_params();
    mp.kv_block_size = 4;
    tl_model *m = NULL;
    tl_model_open(path, mp, &m);
    if (!m) { CHECK(0, "tenant model opens: %s", tl_last_error()); return; }
    int32_t op[20], prompt[60], out[8];
    for (int i = 0; i < 20; i++) op[i] = 3 + (i * 17) % 300;
    memcpy(prompt, op, sizeof op);
    for (int i = 20; i < 50; i++) prompt[i] = 3 + (i * 29 + 1) % 300;
    tl_pool *shared;
    tl_pool_new(2, &shared);
    tl_pool_set_shareable(shared, 1);
    CHECK(tl_pool_register(m, shared, op, 20, 0, 0) == 20, "the operator prompt registers in a shareable pool");
    tl_generate_params a = greedy(4, 0), b = greedy(4, 0);
    a.salt = 11, a.tenant = 1;
    b.salt = 22, b.tenant = 2;
    int64_t h0 = hit_tokens(m);
    tl_generate(m, prompt, 50, a, out, 4);
    int64_t ha1 = hit_tokens(m) - h0;
    h0 = hit_tokens(m);
    tl_generate(m, prompt, 50, a, out, 4);
    int64_t ha2 = hit_tokens(m) - h0;
    h0 = hit_tokens(m);
    tl_generate(m, prompt, 50, b, out, 4);
    int64_t hb = hit_tokens(m) - h0;
    CHECK(ha1 == 20, "tenant A's first request reuses the shared operator prompt (%lld tokens)", (long long)ha1);
    CHECK(ha2 == 49, "tenant A's repeat reuses its own private continuation (%lld tokens)", (long long)ha2);
    CHECK(hb == 20, "tenant B with the same tokens only reuses the operator prompt, never A's blocks (%lld)",
          (long long)hb);
    int n = tl_model_cache_nodes(m, NULL, 0);
    tl_cache_node *nodes = calloc((size_t)n, sizeof *nodes);
    tl_model_cache_nodes(m, nodes, n);
    int salted = 0, shareable = 0;
    for (int i = 0; i < n; i++) {
        salted += nodes[i].salt == 11 && nodes[i].tenant == 1;
        shareable += nodes[i].shareable && nodes[i].pinned;
    }
    CHECK(n > 0 && salted > 0 && shareable == 1, "cache_nodes lists tenant A's nodes and the shared pinned prompt");
    free(nodes);
    CHECK(tl_model_tenant_blocks(m, 1) > 0, "tenant A is charged for its blocks (%d)", tl_model_tenant_blocks(m, 1));

    /* budgets: tenant 3 bursting stays within 12 blocks and leaves tenant 1's cache alone */
    tl_model_set_tenant_budget(m, 3, 12);
    tl_generate_params c = greedy(4, 0);
    c.tenant = 3;
    for (int k = 0; k < 10; k++) {
        int32_t p3[30];
        for (int i = 0; i < 30; i++) p3[i] = 3 + (k * 31 + i * 7) % 300;
        tl_generate(m, p3, 30, c, out, 4);
    }
    CHECK(tl_model_tenant_blocks(m, 3) <= 12, "a tenant over its KV budget evicts its own entries (%d <= 12 blocks)",
          tl_model_tenant_blocks(m, 3));
    h0 = hit_tokens(m);
    tl_generate(m, prompt, 50, a, out, 4);
    CHECK(hit_tokens(m) - h0 == 49, "another tenant's cached conversation survives the burst");
    check_invariants(m, "after the tenant tests");

    /* the cost-aware pool policy keeps a short, popular entry over a long, unused one */
    tl_pool *p;
    tl_pool_new(2, &p);
    tl_pool_set_policy(p, TL_POOL_EVICT_COST);
    int32_t t[64], full[64];
    for (int i = 0; i < 64; i++) t[i] = 3 + (i * 5 + 2) % 300;
    tl_pool_register(m, p, t, 10, 0, 0);
    tl_pool_register(m, p, t + 30, 20, 0, 0);
    for (int k = 0; k < 5; k++) tl_generate_with_pool(m, p, t, 12, greedy(2, 0), full, 14);
    tl_pool_register(m, p, t + 1, 8, 0, 0);
    CHECK(tl_pool_total_cached_tokens(p) == 18, "the cost policy drops the long unused entry, not the popular one (%lld)",
          (long long)tl_pool_total_cached_tokens(p));
    tl_pool_free(p);
    tl_pool_free(shared);
    tl_model_close(m);
    remove(path);
}

/* ---- cache_window: KV stays proportional to the window ---- */

static void test_window_memory(void) {
    tm_spec s = tm_default_spec();
    const char *path = tmp_path("window");
    tm_write(&s, path);
    tl_model_params mp = tl_model_default_params();
    mp.kv_block_size = 4;
    tl_model *m = NULL;
    tl_model_open(path, mp, &m);
    if (!m) { CHECK(0, "window model opens: %s", tl_last_error()); return; }
    enum { W = 8, P = 10, G = 100 };
    int32_t prompt[P], ref[G], out[G];
    for (int i = 0; i < P; i++) prompt[i] = 3 + (i * 23) % 300;
    /* reference: greedy by hand on a sequence that keeps all its KV */
    tl_seq *seq;
    tl_seq_new(m, 0, &seq);
    seq->window = W;
    float logits[320];
    const int32_t *p = prompt;
    int n = P;
    tl_batch_forward(m, &seq, &p, &n, 1, logits);
    for (int i = 0; i < G; i++) {
        int best = 0;
        for (int j = 1; j < 320; j++) best = logits[j] > logits[best] ? j : best;
        ref[i] = best;
        p = &ref[i];
        n = 1;
        if (i + 1 < G) tl_batch_forward(m, &seq, &p, &n, 1, logits);
    }
    int full_blocks = seq->bt.n_logical * seq->bt.depth;
    tl_seq_free(seq);
    /* the scheduler's windowed request drops what the window passed */
    tl_generate_params gp = greedy(G, 0);
    gp.cache_window = W;
    int64_t id;
    tl_request_submit(m, prompt, P, &gp, NULL, &id);
    int peak = 0, active = 1;
    tl_cache_stats st;
    while (active > 0) {
        active = tl_model_step(m);
        tl_model_get_stats(m, &st);
        peak = st.blocks_used > peak ? st.blocks_used : peak;
    }
    int got = tl_request_take(m, id, out, G, NULL);
    tl_request_release(m, id);
    CHECK(got == G && !memcmp(out, ref, sizeof ref), "a windowed request that drops old blocks generates the same tokens");
    CHECK(peak <= (W / 4 + 4) * 2, "its KV stays bounded by the window (%d blocks at peak, %d without dropping)", peak,
          full_blocks);
    check_invariants(m, "after a windowed request");
    tl_model_close(m);
    remove(path);
}

int main(void) {
    test_window_memory();
    test_tenants();
    test_equivalence();
    test_sharing();
    test_pool_semantics();
    test_handles();
    test_lru_across_round();
    return test_summary();
}
