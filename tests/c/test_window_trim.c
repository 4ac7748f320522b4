/* test_window_trim.c - gemma3's sliding-window layers keep KV only for the
 * positions their window can still see. On synthetic gemma3 models
 * (layers 0-4 and 6 local, 5 global) with small windows and blocks:
 * generation, cached prefixes around the window boundary, prefixes whose
 * early local blocks were dropped, batches and pools give exactly the
 * tokens of a pass that never drops a block; the refcount checker holds
 * after every step; the blocks held shrink to the windows, and admission
 * reserves only what a sequence will hold. The KV mode comes from the
 * environment (tests/kv_modes.sh runs it in every lossy one). */
#include <stdint.h>
#include <unistd.h>

#include "model.h"
#include "scheduler.h"
#include "test.h"
#include "testmodel.h"
#include "tinyloop.h"

#define N_LOCAL 6
#define N_GLOBAL 1
#define MAX_TOK 256
#define GEN 20

typedef struct {
    int window, bs;
} config;

static char model_path[128];

static tl_model *open_model(const config *c, size_t kv_mem) {
    tm_spec s = tm_default_spec();
    s.arch = "gemma3";
    s.n_layer = N_LOCAL + N_GLOBAL;
    s.sliding_window = c->window;
    s.n_ctx = 512;
    snprintf(model_path, sizeof model_path, "/tmp/tl_window_trim_%d.gguf", (int)getpid());
    if (tm_write(&s, model_path) != 0) return NULL;
    tl_model_params mp = tl_model_default_params();
    mp.kv_block_size = c->bs;
    mp.kv_mem = kv_mem;
    tl_model *m = NULL;
    tl_model_open(model_path, mp, &m);
    remove(model_path);
    return m;
}

static tl_generate_params greedy(int n, int no_cache) {
    tl_generate_params gp = tl_generate_default_params();
    gp.max_tokens = n;
    gp.ignore_eos = 1;
    gp.no_cache = no_cache;
    return gp;
}

/* Prompts of one family share their tokens up to diverge_at; each test
 * has a family of its own, so the cache holds nothing of another's. */
static void base_prompt(int32_t *t, int n, int diverge_at, int family) {
    for (int i = 0; i < n; i++)
        t[i] = i < diverge_at ? 3 + (i * 41 + 9 + family * 97) % 300 : 3 + (i * 17 + 5 + family * 89) % 300;
}

/* Greedy tokens from passes that never read a dropped block: each token
 * comes from one pass over the whole sequence in a fresh one (a sequence
 * drops blocks only after a pass). */
static void reference(tl_model *m, const int32_t *prompt, int n, int32_t *out, int k) {
    int32_t seq_toks[MAX_TOK + GEN];
    int nv = tl_model_n_vocab(m);
    float *logits = malloc((size_t)nv * sizeof *logits);
    memcpy(seq_toks, prompt, (size_t)n * sizeof *prompt);
    for (int i = 0; i < k; i++) {
        tl_seq *s = NULL;
        tl_seq_new(m, 0, &s);
        const int32_t *t = seq_toks;
        int len = n + i, best = 0;
        tl_batch_forward(m, &s, &t, &len, 1, logits);
        tl_seq_free(s);
        for (int j = 1; j < nv; j++)
            if (logits[j] > logits[best]) best = j;
        out[i] = seq_toks[n + i] = best;
    }
    free(logits);
}

/* Submits the requests together and steps until all end, checking the
 * refcount invariants after every step; each request's tokens go to
 * outs[i] (k each), its cached prompt tokens to n_cached[i]. Returns
 * whether every step kept the invariants. */
static int run_batch(tl_model *m, int32_t *const *prompts, const int *lens, int n_req, tl_generate_params gp,
                     tl_pool *pool, int32_t **outs, int *n_cached) {
    int64_t ids[8];
    int ok = 1;
    for (int i = 0; i < n_req; i++) tl_request_submit(m, prompts[i], lens[i], &gp, pool, &ids[i]);
    while (tl_model_step(m) > 0) ok &= tl_sched_check_invariants(m, NULL, 0) == 0;
    for (int i = 0; i < n_req; i++) {
        int fin = 0;
        tl_request_info info = {0};
        tl_request_take(m, ids[i], outs[i], gp.max_tokens, &fin);
        tl_request_get_info(m, ids[i], &info);
        n_cached[i] = info.n_cached;
        ok &= info.state == TL_REQ_DONE && info.n_generated == gp.max_tokens;
        tl_request_release(m, ids[i]);
    }
    return ok && tl_sched_check_invariants(m, NULL, 0) == 0;
}

static int run_one(tl_model *m, int32_t *prompt, int n, int no_cache, tl_pool *pool, int32_t *out, int *n_cached) {
    int32_t *outs[1] = {out};
    return run_batch(m, &prompt, &n, 1, greedy(GEN, no_cache), pool, outs, n_cached);
}

/* Prompt lengths around the window, each once: W - 1, W, W + 1, the
 * block multiples beside W, 2W, 3W and 3W + 1. */
static int boundary_lens(const config *c, int *lens) {
    int W = c->window, bs = c->bs, n = 0;
    int v[] = {W - 1, W, W + 1, W / bs * bs + bs, W / bs * bs > bs ? W / bs * bs - bs : bs, 2 * W, 3 * W, 3 * W + 1};
    for (int i = 0; i < (int)(sizeof v / sizeof *v); i++) {
        int seen = 0;
        for (int j = 0; j < n; j++) seen |= lens[j] == v[i];
        if (!seen) lens[n++] = v[i];
    }
    return n;
}

static void test_uncached(tl_model *m, const config *c) {
    int lens[8], n_lens = boundary_lens(c, lens), all = 1, ok = 1;
    for (int i = 0; i < n_lens; i++) {
        int32_t p[MAX_TOK], ref[GEN], got[GEN];
        int n_cached;
        base_prompt(p, lens[i], lens[i], 1);
        reference(m, p, lens[i], ref, GEN);
        ok &= run_one(m, p, lens[i], 1, NULL, got, &n_cached);
        all &= !memcmp(ref, got, sizeof ref);
    }
    CHECK(all && ok, "window %d, block %d: uncached generation with dropped local blocks equals the reference at every "
                     "boundary length (invariants %d)", c->window, c->bs, ok);
}

/* A prompt repeated, and one extending a whole earlier sequence (the next
 * turn of a chat): the first may lose its match to the dropped blocks,
 * the second keeps all of it. */
static void test_cached_repeat(tl_model *m, const config *c) {
    int lens[8], n_lens = boundary_lens(c, lens), all = 1, ok = 1, turn_all = 1;
    for (int i = 0; i < n_lens; i++) {
        int32_t p[MAX_TOK], ref[GEN], got[GEN];
        int n = lens[i], n_cached;
        base_prompt(p, n, n, 2);
        reference(m, p, n, ref, GEN);
        ok &= run_one(m, p, n, 0, NULL, got, &n_cached);
        all &= !memcmp(ref, got, sizeof ref);
        ok &= run_one(m, p, n, 0, NULL, got, &n_cached);
        all &= !memcmp(ref, got, sizeof ref);
        /* the next turn: prompt + answer + 3 more tokens */
        int32_t turn[MAX_TOK], tref[GEN];
        int tn = n + GEN + 3;
        memcpy(turn, p, (size_t)n * sizeof *p);
        memcpy(turn + n, ref, sizeof ref);
        base_prompt(turn + n + GEN, 3, 0, 2);
        reference(m, turn, tn, tref, GEN);
        ok &= run_one(m, turn, tn, 0, NULL, got, &n_cached);
        turn_all &= !memcmp(tref, got, sizeof tref) && n_cached == n + GEN - 1;
    }
    CHECK(all && ok, "window %d, block %d: a repeated prompt equals the reference whatever its match (invariants %d)",
          c->window, c->bs, ok);
    CHECK(turn_all, "window %d, block %d: the next turn of a conversation reuses all of the previous one and equals "
                    "the reference", c->window, c->bs);
}

/* A 3W-token sequence in the cache has dropped its early local blocks; a
 * second prompt sharing its first P tokens gets a match no longer than
 * what the windows still hold, and the right tokens. */
static void test_shared_dropped(tl_model *m, const config *c) {
    int W = c->window, ok = 1, all = 1, shorter = 1;
    int32_t fill[MAX_TOK], got[GEN];
    int n_cached;
    base_prompt(fill, 3 * W, 3 * W, 3);
    ok &= run_one(m, fill, 3 * W, 0, NULL, got, &n_cached);
    int ps[] = {W - 1, W, W + 1, 2 * W, 3 * W - 1, 3 * W};
    for (int i = 0; i < 6; i++) {
        int32_t p[MAX_TOK], ref[GEN];
        int n = 3 * W + 5;
        base_prompt(p, n, ps[i], 3);
        reference(m, p, n, ref, GEN);
        ok &= run_one(m, p, n, 0, NULL, got, &n_cached);
        all &= !memcmp(ref, got, sizeof ref) && n_cached <= ps[i];
        /* the fill kept its local blocks only from about 3W + GEN - W on */
        if (ps[i] <= 2 * W) shorter &= n_cached < ps[i];
    }
    CHECK(all && ok, "window %d, block %d: prompts sharing 3W-sequence prefixes of W-1 .. 3W tokens equal the "
                     "reference (invariants %d)", W, c->bs, ok);
    CHECK(shorter, "window %d, block %d: a shared prefix whose early local blocks were dropped is matched shorter",
          W, c->bs);
}

/* A pool entry keeps the window at its own end: a prompt extending it
 * reuses all of it; requests batched together equal each alone. */
static void test_pool_and_batch(tl_model *m, const config *c) {
    int W = c->window, ok = 1;
    tl_pool *pool = NULL;
    tl_pool_new(2, &pool);
    int32_t entry[MAX_TOK];
    base_prompt(entry, 3 * W, 3 * W, 4);
    CHECK(tl_pool_register(m, pool, entry, 3 * W, 0, 0) == 3 * W, "window %d: a 3W-token prefix registers", W);
    int32_t p[4][MAX_TOK], ref[4][GEN], got[4][GEN], *prompts[4], *outs[4];
    /* a prefix of the entry, two diverging inside it, one extending it */
    int lens[4] = {W + 1, 2 * W + 3, 3 * W + 5, 3 * W + 1}, diverge[4] = {W + 1, W, 3 * W, 2 * W};
    int n_cached[4], all = 1;
    for (int i = 0; i < 4; i++) {
        base_prompt(p[i], lens[i], diverge[i], 4);
        reference(m, p[i], lens[i], ref[i], GEN);
        prompts[i] = p[i];
        outs[i] = got[i];
    }
    ok &= run_one(m, p[2], lens[2], 0, pool, got[2], &n_cached[2]);
    CHECK(!memcmp(ref[2], got[2], sizeof ref[2]) && n_cached[2] == 3 * W,
          "window %d: a prompt extending the pool entry reuses all %d tokens (%d) and equals the reference", W, 3 * W,
          n_cached[2]);
    ok &= run_batch(m, prompts, lens, 4, greedy(GEN, 0), NULL, outs, n_cached);
    for (int i = 0; i < 4; i++) all &= !memcmp(ref[i], got[i], sizeof ref[i]);
    CHECK(all && ok, "window %d, block %d: four requests batched (cached and not) equal the reference (invariants %d)",
          W, c->bs, ok);
    tl_pool_free(pool);
    CHECK(tl_sched_check_invariants(m, NULL, 0) == 0, "window %d: invariants hold after the pool goes (%s)", W,
          tl_last_error());
}

/* A long sequence holds its global layer's blocks for every position and
 * each local layer's only for its window. */
static void test_blocks_shrink(tl_model *m, const config *c) {
    int W = c->window, bs = c->bs, len = 400, used0 = m->kv.n_blocks - m->kv.n_free;
    int32_t p[400];
    base_prompt(p, len, len, 5);
    tl_seq *s = NULL;
    tl_seq_new(m, 0, &s);
    for (int pos = 0; pos < len; pos += 7) {
        const int32_t *t = p + pos;
        int n = len - pos < 7 ? len - pos : 7;
        tl_batch_forward(m, &s, &t, &n, 1, NULL);
    }
    int used = m->kv.n_blocks - m->kv.n_free - used0, lb = (len + bs - 1) / bs;
    int bound = N_GLOBAL * lb + N_LOCAL * ((W + bs - 1) / bs + 2);
    CHECK(tl_seq_len(s) == len && used >= N_GLOBAL * lb && used <= bound,
          "window %d, block %d: a %d-token sequence holds %d blocks (global %d + local <= %d; %d without dropping)", W,
          bs, len, used, N_GLOBAL * lb, bound - N_GLOBAL * lb, (N_GLOBAL + N_LOCAL) * lb);
    tl_seq_free(s);
}

/* An arena too small for a long request at full length but big enough
 * for what its windows hold: admitted and completed. */
static void test_admission(const config *c, size_t block_bytes) {
    int W = c->window, bs = c->bs, prompt = 100, max_tokens = 300;
    int lb = (prompt + max_tokens + bs - 1) / bs;
    int blocks = N_GLOBAL * lb + N_LOCAL * ((W + prompt + bs - 1) / bs + 1) + 8;
    tl_model *m = open_model(c, (size_t)blocks * block_bytes);
    if (!m) return;
    int32_t p[100];
    base_prompt(p, prompt, prompt, 6);
    int64_t id;
    tl_generate_params gp = greedy(max_tokens, 1);
    tl_request_submit(m, p, prompt, &gp, NULL, &id);
    int ok = 1;
    while (tl_model_step(m) > 0) ok &= tl_sched_check_invariants(m, NULL, 0) == 0;
    tl_request_info info = {0};
    tl_request_get_info(m, id, &info);
    CHECK(info.state == TL_REQ_DONE && info.n_generated == max_tokens && ok && blocks < (N_GLOBAL + N_LOCAL) * lb,
          "window %d, block %d: %d + %d tokens run in %d blocks (%d at full length; state %d, error %d)", W, bs, prompt,
          max_tokens, blocks, (N_GLOBAL + N_LOCAL) * lb, info.state, info.error);
    tl_request_release(m, id);
    tl_model_close(m);
}

int main(void) {
    static const config configs[] = {{16, 4}, {12, 8}, {8, 16}, {32, 16}};
    int quick = getenv("TL_TEST_QUICK") != NULL;
    for (int i = 0; i < (quick ? 2 : 4); i++) {
        const config *c = &configs[i];
        tl_model *m = open_model(c, 0);
        CHECK(m != NULL, "a synthetic gemma3 model with window %d opens (%s)", c->window, tl_last_error());
        if (!m) continue;
        test_blocks_shrink(m, c); /* first: nothing cached to evict */
        test_uncached(m, c);
        test_cached_repeat(m, c);
        test_shared_dropped(m, c);
        test_pool_and_batch(m, c);
        size_t block_bytes = m->kv.block_bytes;
        tl_model_close(m);
        test_admission(c, block_bytes);
    }
    return test_summary();
}
