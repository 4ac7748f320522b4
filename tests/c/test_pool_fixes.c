/* test_pool_fixes.c - PrefixPool edge cases of issue 16: registering where
 * generate fits, the block a dropped entry left on its branch point, a
 * failed register keeping its victim, a full match prefilling nothing, and
 * the pool's match scope. Each check failed before its fix. */
#include <stdint.h>
#include <unistd.h>

#include "model.h"
#include "scheduler.h"
#include "test.h"
#include "testmodel.h"
#include "tinyloop.h"

enum { BS = 16 }; /* KV block size of every model here; the default model has 2 layers (depth 2) */

static char model_path[256];

static tl_generate_params greedy(int max_tokens) {
    tl_generate_params gp = tl_generate_default_params();
    gp.max_tokens = max_tokens;
    gp.ignore_eos = 1;
    return gp;
}

/* The test model with a KV arena of exactly `blocks` blocks (0: default). */
static tl_model *open_blocks(int blocks) {
    tl_model_params mp = tl_model_default_params();
    mp.kv_block_size = BS;
    tl_model *m = NULL;
    if (blocks > 0) {
        if (tl_model_open(model_path, mp, &m)) return NULL;
        size_t per = m->kv.block_bytes;
        tl_model_close(m);
        mp.kv_mem = per * (size_t)blocks;
    }
    if (tl_model_open(model_path, mp, &m)) return NULL;
    return m;
}

static int blocks_used(const tl_model *m) {
    tl_cache_stats st;
    tl_model_get_stats(m, &st);
    return st.blocks_used;
}

static void fill(int32_t *t, int n, int seed) {
    for (int i = 0; i < n; i++) t[i] = 3 + (i * 37 + seed * 101 + 11) % 300;
}

static void check_invariants(tl_model *m, const char *when) {
    int rc = tl_sched_check_invariants(m, NULL, 0);
    CHECK(rc == 0, "KV invariants hold %s (%s)", when, tl_last_error());
}

/* ---- 1. the build path locks only what it matched ------------------------------------------- */

/* 16 blocks (8 logical at depth 2). A generation leaves a 100-token node
 * (7 logical blocks) unpinned; the prefix shares its first 20 tokens and
 * needs 4 logical blocks more. Only by evicting the node's unmatched tail
 * does it fit: locking the whole node kept the tail. */
static tl_model *oom_scenario(int32_t *prefix, int n_prefix) {
    tl_model *m = open_blocks(16);
    if (!m) return NULL;
    int32_t s[100], out[4];
    fill(s, 100, 1);
    tl_generate(m, s, 96, greedy(4), out, 4);
    memcpy(prefix, s, 20 * sizeof *s);
    fill(prefix + 20, n_prefix - 20, 2);
    return m;
}

static void test_register_fits_where_generate_does(void) {
    enum { N = 80 };
    int32_t prefix[N], out[N + 1];
    tl_model *m = oom_scenario(prefix, N);
    CHECK(m != NULL, "the 16-block model opens (%s)", tl_last_error());
    if (!m) return;
    int got = tl_generate(m, prefix, N, greedy(1), out, 1);
    CHECK(got == 1, "generate of the 80 tokens succeeds next to a cached 100-token node (%d: %s)", got,
          tl_last_error());
    tl_model_close(m);

    m = oom_scenario(prefix, N);
    tl_pool *pool;
    tl_pool_new(2, &pool);
    got = tl_pool_register(m, pool, prefix, N, 0, 0);
    CHECK(got == N, "register_prefix of the same 80 tokens succeeds too (%d: %s)", got, tl_last_error());
    check_invariants(m, "after the register");
    tl_pool_free(pool);
    tl_model_close(m);

    m = oom_scenario(prefix, N);
    tl_prefix *h = NULL;
    int rc = tl_prefix_build(m, prefix, N, 0, 0, &h);
    CHECK(rc == TL_OK && h, "build_prefix_cache of the same 80 tokens succeeds too (%d: %s)", rc, tl_last_error());
    tl_prefix_free(h);
    check_invariants(m, "after the prefix handle is freed");
    tl_model_close(m);
}

/* ---- 2. a dropped entry's branch point gives its block back ---------------------------------- */

/* A and B share 24 tokens (a split in the middle of logical block 1), so
 * the branch node holds A's copy of that block and B holds its own. When
 * the pool drops A, the branch node and B join and A's copy goes. */
static void test_dropped_first_child_frees_its_block(void) {
    enum { N = 40 };
    int32_t a[N], b[N], c[N], d[N];
    fill(a, N, 3);
    memcpy(b, a, 24 * sizeof *a);
    fill(b + 24, N - 24, 4);
    fill(c, N, 5);
    fill(d, N, 6);
    /* reference: a fresh cache holding only B and C */
    tl_model *m = open_blocks(0);
    CHECK(m != NULL, "the model opens (%s)", tl_last_error());
    if (!m) return;
    tl_pool *pool;
    tl_pool_new(2, &pool);
    tl_pool_register(m, pool, b, N, 0, 0);
    tl_pool_register(m, pool, c, N, 0, 0);
    int ref = blocks_used(m);
    tl_pool_free(pool);
    tl_model_close(m);

    /* 18 blocks: A, B and C, then D while B and C stay pinned */
    m = open_blocks(18);
    tl_pool_new(2, &pool);
    int ok = tl_pool_register(m, pool, a, N, 0, 0) == N && tl_pool_register(m, pool, b, N, 0, 0) == N;
    CHECK(ok, "A and B (sharing 24 tokens) register (%s)", tl_last_error());
    CHECK(tl_pool_register(m, pool, c, N, 0, 0) == N, "C registers into the full pool, dropping A (%s)",
          tl_last_error());
    CHECK(blocks_used(m) == ref, "with A dropped the cache holds B and C's %d blocks, not %d", ref, blocks_used(m));
    check_invariants(m, "after A is dropped");
    CHECK(tl_pool_register(m, pool, d, N, 0, 0) == N, "a fourth prefix of the same size registers (%s)",
          tl_last_error());
    check_invariants(m, "after D registers");
    /* the joined node still serves B exactly */
    int32_t x[N + 8], y[8];
    int nb = tl_generate_with_pool(m, pool, c, N, greedy(8), x, N + 8);
    tl_generate_params gp = greedy(8);
    gp.no_cache = 1;
    int ny = tl_generate(m, c, N, gp, y, 8);
    CHECK(nb == N + 8 && ny == 8 && !memcmp(x + N, y, sizeof y), "C still generates what plain generation does");
    tl_pool_free(pool);
    tl_model_close(m);
}

/* The same when the other branch is an unpinned generation the cache
 * evicts later (as when an entry is dropped while a request locks it):
 * the branch point joins its pinned child. */
static void test_evicted_branch_frees_its_block(void) {
    enum { N = 40 };
    int32_t a[N], b[N], out[1];
    fill(a, N, 13);
    memcpy(b, a, 24 * sizeof *a);
    fill(b + 24, N - 24, 14);
    tl_model *m = open_blocks(0);
    if (!m) return;
    tl_pool *pool;
    tl_pool_new(2, &pool);
    tl_pool_register(m, pool, b, N, 0, 0);
    int only_b = blocks_used(m); /* B alone */
    tl_pool_free(pool);
    tl_generate(m, a, N, greedy(1), out, 1); /* A's run is cached, unpinned */
    tl_pool_new(2, &pool);
    tl_pool_register(m, pool, b, N, 0, 0); /* B splits it after 24 tokens */
    tl_radix_evict(&m->cache, m->kv.n_blocks);
    CHECK(blocks_used(m) == only_b, "evicting A's unpinned branch leaves B's %d blocks, not %d", only_b,
          blocks_used(m));
    check_invariants(m, "after evicting the other branch");
    int32_t again[N + 1];
    int n1 = tl_generate_with_pool(m, pool, b, N, greedy(1), again, N + 1);
    CHECK(n1 == N + 1, "the joined entry still serves a generation (%d)", n1);
    tl_pool_free(pool);
    tl_model_close(m);
}

/* ---- 3. a failed register keeps the pool as it was ---------------------------------------------- */

static void test_failed_register_keeps_victim(void) {
    enum { N = 40, BIG = 200 };
    int32_t a[N], big[BIG];
    fill(a, N, 7);
    fill(big, BIG, 8);
    tl_model *m = open_blocks(18); /* 9 logical blocks: 144 tokens at most */
    CHECK(m != NULL, "the 18-block model opens (%s)", tl_last_error());
    if (!m) return;
    tl_pool *pool;
    tl_pool_new(1, &pool);
    CHECK(tl_pool_register(m, pool, a, N, 0, 0) == N, "A registers (%s)", tl_last_error());
    int got = tl_pool_register(m, pool, big, BIG, 0, 0);
    CHECK(got == TL_ERR_KV_FULL, "a 200-token prefix does not fit 18 blocks (%d)", got);
    CHECK(tl_last_error_code() == TL_ERR_KV_FULL, "... and says the KV cache is full (%s)", tl_last_error());
    tl_pool_stats st;
    tl_pool_get_stats(m ? pool : NULL, &st);
    CHECK(st.size == 1 && st.evictions == 0, "the failed register left A in the pool (size %d, %lld evictions)",
          st.size, (long long)st.evictions);
    int32_t out[N + 4];
    tl_generate_with_pool(m, pool, a, N, greedy(4), out, N + 4);
    tl_pool_get_stats(pool, &st);
    CHECK(st.hits == 1 && st.hit_tokens >= N - 1, "A still serves its prompt (%lld hits, %lld tokens)",
          (long long)st.hits, (long long)st.hit_tokens);
    check_invariants(m, "after the failed register");
    tl_pool_free(pool);
    tl_model_close(m);
}

/* ---- 4. a fully cached prompt prefills nothing ------------------------------------------------ */

static int64_t prefill_tokens(const tl_model *m) {
    tl_cache_stats st;
    tl_model_get_stats(m, &st);
    return st.prefill_tokens;
}

static void test_full_match_prefills_nothing(void) {
    enum { N = 40, GEN = 8 };
    int32_t p[N], a[GEN], b[N + GEN];
    fill(p, N, 10);
    tl_model *m = open_blocks(0);
    CHECK(m != NULL, "the model opens (%s)", tl_last_error());
    if (!m) return;
    tl_generate_params gp = greedy(GEN);
    gp.no_cache = 1;
    tl_generate(m, p, N, gp, a, GEN);
    tl_pool *pool;
    tl_pool_new(2, &pool);
    tl_pool_register(m, pool, p, N, 0, 0);
    for (int k = 0; k < 2; k++) { /* twice: the first pass must not use up the kept logits */
        int64_t p0 = prefill_tokens(m);
        int nb = tl_generate_with_pool(m, pool, p, N, greedy(GEN), b, N + GEN);
        CHECK(prefill_tokens(m) - p0 == 0, "a prompt equal to a registered entry prefills %lld tokens, not 1 (call %d)",
              (long long)(prefill_tokens(m) - p0), k + 1);
        CHECK(nb == N + GEN && !memcmp(a, b + N, sizeof a), "... and generates what plain generation does (call %d)",
              k + 1);
    }
    /* registering a prefix already cached by a generation computes its last token once, then never again */
    int32_t q[N];
    fill(q, N, 11);
    int32_t out[GEN];
    tl_generate(m, q, N, greedy(GEN), out, GEN);
    int64_t p0 = prefill_tokens(m);
    tl_pool_register(m, pool, q, N, 0, 0);
    int64_t reg = prefill_tokens(m) - p0;
    p0 = prefill_tokens(m);
    tl_generate_with_pool(m, pool, q, N, greedy(GEN), b, N + GEN);
    CHECK(reg == 1 && prefill_tokens(m) - p0 == 0,
          "an entry over cached tokens computes 1 token at register (%lld) and none per call (%lld)", (long long)reg,
          (long long)(prefill_tokens(m) - p0));
    /* the non-blocking register (the server's) keeps them too */
    int32_t r[N];
    fill(r, N, 12);
    int64_t id;
    int rc = tl_pool_register_submit(m, pool, r, N, 0, 0, &id);
    while (rc == TL_OK && tl_model_step(m) > 0) {
    }
    tl_request_release(m, id);
    p0 = prefill_tokens(m);
    int nr = tl_generate_with_pool(m, pool, r, N, greedy(GEN), b, N + GEN);
    int64_t pre = prefill_tokens(m) - p0;
    gp.no_cache = 1;
    tl_generate(m, r, N, gp, a, GEN);
    CHECK(rc == TL_OK && pre == 0 && nr == N + GEN && !memcmp(a, b + N, sizeof a),
          "an entry registered with register_submit serves its full match with no prefill (%lld) and plain's tokens",
          (long long)pre);
    /* with a temperature, the kept logits draw what a computed pass draws */
    tl_generate_params t = greedy(GEN);
    t.sampling.temperature = 0.8f;
    t.sampling.seed = 42;
    int32_t c[N + GEN];
    tl_generate_with_pool(m, pool, p, N, t, b, N + GEN);
    t.no_cache = 1;
    tl_generate(m, p, N, t, c, GEN);
    CHECK(!memcmp(b + N, c, GEN * sizeof *c), "a sampled generation from a full match equals the computed one (seed 42)");
    check_invariants(m, "after full matches");
    tl_pool_free(pool);
    tl_model_close(m);
}

/* ---- 5. the pool's match scope and whose hit it is ------------------------------------------------- */

static int n_cached_via(tl_model *m, tl_pool *pool, const int32_t *prompt, int n) {
    tl_generate_params gp = greedy(4);
    int64_t id;
    if (tl_request_submit(m, prompt, n, &gp, pool, &id)) return -1;
    while (tl_model_step(m) > 0) {
    }
    tl_request_info info;
    tl_request_get_info(m, id, &info);
    tl_request_release(m, id);
    return info.n_cached;
}

static void test_scope_and_attribution(void) {
    enum { N = 40, S = 10 };
    int32_t p[N + S], out[N + S + 4];
    fill(p, N + S, 9);
    tl_model *m = open_blocks(0);
    CHECK(m != NULL, "the model opens (%s)", tl_last_error());
    if (!m) return;
    tl_pool *a, *b, *scoped;
    tl_pool_new(4, &a);
    tl_pool_new(4, &b);
    tl_pool_new(4, &scoped);
    CHECK(tl_pool_set_scope(scoped, TL_POOL_SCOPE_POOL) == TL_OK, "set_scope(POOL) is accepted");
    CHECK(tl_pool_set_scope(scoped, 7) == TL_ERR_INVALID_ARG &&
              strstr(tl_last_error(), "pool scope 7 is not TL_POOL_SCOPE_SHARED (0) or _POOL (1)"),
          "an unknown scope is refused with its value (%s)", tl_last_error());
    tl_pool_register(m, a, p, N, 0, 0);

    /* shared (default): B reuses A's entry, and the hit is A's */
    tl_generate_with_pool(m, b, p, N + S, greedy(4), out, N + S + 4);
    tl_pool_stats sa, sb;
    tl_pool_get_stats(a, &sa);
    tl_pool_get_stats(b, &sb);
    CHECK(sb.lookups == 1 && sb.hits == 0 && sb.hit_tokens == 0,
          "an empty shared pool counts the lookup but not A's hit (%lld lookups, %lld hits)", (long long)sb.lookups,
          (long long)sb.hits);
    CHECK(sa.lookups == 0 && sa.hits == 1 && sa.hit_tokens == N,
          "the hit goes to A, whose entry owns the %d reused tokens (%lld hits, %lld tokens)", N, (long long)sa.hits,
          (long long)sa.hit_tokens);

    /* scope POOL: an empty pool matches nothing, though the prompt is cached */
    int c = n_cached_via(m, scoped, p, N + S);
    CHECK(c == 0, "an empty pool with scope POOL reuses nothing (%d cached tokens)", c);
    c = n_cached_via(m, b, p, N + S);
    CHECK(c == N + S - 1, "the same prompt through a shared pool reuses %d tokens (%d)", N + S - 1, c);
    /* with its own entry it reuses exactly that entry, not the longer cached run */
    tl_pool_register(m, scoped, p, 20, 0, 0);
    c = n_cached_via(m, scoped, p, N + S);
    CHECK(c == 20, "scope POOL reuses only its own 20-token entry (%d cached tokens)", c);
    tl_pool_stats ss;
    tl_pool_get_stats(scoped, &ss);
    CHECK(ss.hits == 1 && ss.hit_tokens == 20, "... and counts that hit (%lld hits, %lld tokens)", (long long)ss.hits,
          (long long)ss.hit_tokens);
    int32_t x[N + S + 4], y[4];
    tl_generate_with_pool(m, scoped, p, N + S, greedy(4), x, N + S + 4);
    tl_generate_params gp = greedy(4);
    gp.no_cache = 1;
    tl_generate(m, p, N + S, gp, y, 4);
    CHECK(!memcmp(x + N + S, y, sizeof y), "scope POOL generates what plain generation does");
    check_invariants(m, "after the scope checks");
    tl_pool_free(a);
    tl_pool_free(b);
    tl_pool_free(scoped);
    tl_model_close(m);
}

int main(void) {
    tm_spec s = tm_default_spec();
    s.n_ctx = 512;
    snprintf(model_path, sizeof model_path, "/tmp/tl_poolfix_%d.gguf", (int)getpid());
    if (tm_write(&s, model_path)) return 1;
    test_register_fits_where_generate_does();
    test_dropped_first_child_frees_its_block();
    test_evicted_branch_frees_its_block();
    test_failed_register_keeps_victim();
    test_full_match_prefills_nothing();
    test_scope_and_attribution();
    remove(model_path);
    return test_summary();
}
