/* test_gemma.c - the gemma3 and gemma2 architectures: sliding-window
 * layers compose with the prefix cache (synthetic models with a small
 * window); gemma2's soft-capping, alternating windows and attention scale
 * against ik_llama.cpp and llama.cpp's rules; and, when the default model
 * has been fetched, Gemma 3 270M answers sensibly, has a low perplexity on
 * an English paragraph, gives identical greedy tokens cached and uncached,
 * and past its 512-token window keeps the local layers' KV for the window
 * only. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "model.h"
#include "ref_cases.h"
#include "shape.h"
#include "test.h"
#include "testmodel.h"
#include "tinyloop.h"

static tl_generate_params greedy(int n) {
    tl_generate_params gp = tl_generate_default_params();
    gp.max_tokens = n;
    gp.ignore_eos = 1;
    return gp;
}

/* gemma2 0: gemma3 (layers 0-4 and 6 local, 5 global); 1: gemma2 (layers
 * 0, 2, 4, 6 local). Without the key, gemma3 has no window and gemma2
 * llama.cpp's 4096, both past the 72 positions here. */
static void test_synthetic_window(int gemma2) {
    char path[2][128];
    tl_model *m[2] = {0};
    const char *arch = gemma2 ? "gemma2" : "gemma3";
    for (int i = 0; i < 2; i++) {
        tm_spec s = tm_default_spec();
        s.arch = arch;
        s.n_layer = 7;
        s.sliding_window = i == 0 ? 8 : 0;
        snprintf(path[i], sizeof path[i], "/tmp/tl_gemma_%d_%d.gguf", (int)getpid(), i);
        CHECK(tm_write(&s, path[i]) == 0, "a synthetic %s model is written", arch);
        tl_model_params mp = tl_model_default_params();
        mp.kv_block_size = 4;
        tl_model_open(path[i], mp, &m[i]);
        CHECK(m[i] != NULL, "the synthetic %s model opens (%s)", arch, tl_last_error());
    }
    if (!m[0] || !m[1]) return;
    int32_t prompt[60], a[12], b[72], c[12];
    for (int i = 0; i < 60; i++) prompt[i] = 3 + (i * 41 + 9) % 300;
    /* the window changes the result once the sequence is longer than it */
    tl_generate_params gp = greedy(12);
    gp.no_cache = 1;
    tl_generate(m[0], prompt, 40, gp, a, 12);
    tl_generate(m[1], prompt, 40, gp, c, 12);
    CHECK(memcmp(a, c, sizeof a) != 0, "%s: a sliding window of 8 changes what a 40-token prompt generates", arch);
    /* a cached prefix much longer than the window: pool and radix paths equal plain */
    tl_pool *pool;
    tl_pool_new(2, &pool);
    CHECK(tl_pool_register(m[0], pool, prompt, 33, 0, 0) == 33, "a 33-token prefix (window 8) registers");
    static const int lens[] = {33, 34, 40, 48, 60};
    for (int k = 0; k < 5; k++) {
        int n = lens[k];
        tl_generate(m[0], prompt, n, gp, a, 12);
        int nb = tl_generate_with_pool(m[0], pool, prompt, n, greedy(12), b, n + 12);
        int nc = tl_generate(m[0], prompt, n, greedy(12), c, 12);
        CHECK(nb == n + 12 && !memcmp(a, b + n, sizeof a) && nc == 12 && !memcmp(a, c, sizeof a),
              "%s: with a window of 8, a %d-token prompt over a cached 33-token prefix equals plain generation", arch, n);
    }
    tl_cache_stats st;
    tl_model_get_stats(m[0], &st);
    CHECK(st.hit_tokens >= 5 * 33, "%s: the cached paths were used (%lld hit tokens)", arch, (long long)st.hit_tokens);
    tl_pool_free(pool);
    for (int i = 0; i < 2; i++) {
        tl_model_close(m[i]);
        remove(path[i]);
    }
}

static const char *tmp_path(const char *name) {
    static char buf[256];
    snprintf(buf, sizeof buf, "/tmp/tl_gemma_%d_%s.gguf", (int)getpid(), name);
    return buf;
}

/* Gemma 2: greedy tokens against ik_llama.cpp's on a synthetic model (it
 * runs gemma2 files of 26, 42 or 46 layers only: 26 here, dims of 128);
 * the final cap bounds every logit; the attention cap changes them;
 * layers alternate local / global; the 27B shape's attention scale; and
 * the CUDA plugin, which caps nothing, refuses it when forced. */
static void test_gemma2(void) {
    tm_spec s = tm_default_spec();
    s.arch = "gemma2";
    s.n_layer = 26;
    s.n_embd = 128;
    s.n_head = 4;
    s.n_head_kv = 2;
    s.n_ff = 512;
    s.n_ctx = 2048;
    s.sliding_window = 8;
    s.seed = 6;
    const char *path = tmp_path("g2");
    CHECK(tm_write(&s, path) == 0, "a 26-layer gemma2 model is written");
    tl_model_params mp = tl_model_default_params();
    mp.kv_type = TL_KV_F16; /* as the reference ran */
    tl_model *m = NULL;
    tl_model_open(path, mp, &m);
    CHECK(m != NULL, "the gemma2 model opens (%s)", m ? "" : tl_last_error());
    if (m) {
        /* tl-gen-model g2.gguf --arch gemma2 --layers 26 --dim 128 --heads 4
         * --kv-heads 2 --ff 512 --ctx 2048 --window 8 --seed 6: llama-simple printed
         * these tokens' bytes after the prompt (2026-12-06) */
        static const int32_t want[24] = {160, 63, 14,  178, 178, 153, 153, 153, 204, 204, 51,  51,
                                         51,  51, 179, 179, 179, 179, 179, 179, 179, 179, 179, 179};
        int32_t ids[24], out[24];
        int ng = tm_greedy_ref(m, 24, ids, out);
        CHECK(ng == 24 && !memcmp(out, want, sizeof want), "greedy tokens on a gemma2 model equal ik_llama.cpp's (%d)", ng);
        CHECK(tl_model_layer_window(m, 0) == 8 && tl_model_layer_window(m, 1) == 0 && tl_model_layer_window(m, 24) == 8 &&
                  tl_model_layer_window(m, 25) == 0,
              "gemma2's even layers are local (window 8), odd layers global");
        tl_model_close(m);
    }
    setenv("TINYLOOP_BACKEND", "cuda", 1);
    m = NULL;
    int rc = tl_model_open(path, tl_model_default_params(), &m);
    unsetenv("TINYLOOP_BACKEND");
    CHECK(rc == TL_ERR_UNSUPPORTED && !m && strstr(tl_last_error(), "gemma2's soft-capping / LayerNorm / attention scale"),
          "TINYLOOP_BACKEND=cuda refuses gemma2, saying why (%s)", tl_last_error());
    remove(path);

    /* caps: the final one bounds the logits, the attention one moves them */
    float l[3][320];
    static const float caps[3][2] = {{50, 30}, {50, 2}, {0.5f, 30}};
    int32_t toks[30];
    for (int i = 0; i < 30; i++) toks[i] = (int32_t)(3 + (i * 37) % 300);
    for (int k = 0; k < 3; k++) {
        tm_spec c = tm_default_spec();
        c.arch = "gemma2";
        c.n_layer = 4;
        c.sliding_window = 8;
        c.attn_softcap = caps[k][0];
        c.final_softcap = caps[k][1];
        path = tmp_path("cap");
        tm_write(&c, path);
        m = NULL;
        tl_model_open(path, tl_model_default_params(), &m);
        tl_seq *q = NULL;
        const int32_t *p = toks;
        int nt = 30;
        rc = !m || tl_seq_new(m, 0, &q) || tl_batch_forward(m, &q, &p, &nt, 1, l[k]);
        CHECK(rc == 0, "the gemma2 model with caps %g / %g runs", caps[k][0], caps[k][1]);
        tl_seq_free(q);
        tl_model_close(m);
        remove(path);
    }
    float mx[3] = {0};
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < 320; i++) mx[k] = fabsf(l[k][i]) > mx[k] ? fabsf(l[k][i]) : mx[k];
    CHECK(mx[1] <= 2.0f && mx[0] > 2.0f, "a final cap of 2 bounds every logit (max |logit| %g; %g with 30)", mx[1], mx[0]);
    CHECK(test_nmse(l[2], l[0], 320) > 1e-6, "an attention cap of 0.5 changes the logits (nmse %g)",
          test_nmse(l[2], l[0], 320));

    /* 46 layers (llama.cpp's 27B): q.k scaled by 1/sqrt(n_embd / n_head),
     * not by 1/sqrt(head_dim), whatever key_length says */
    for (int layers = 45; layers <= 46; layers++) {
        tm_spec b = tm_default_spec();
        b.arch = "gemma2";
        b.n_layer = layers;
        b.head_dim = 32; /* n_embd / n_head is 16 */
        path = tmp_path("big");
        tm_write(&b, path);
        m = NULL;
        tl_model_open(path, tl_model_default_params(), &m);
        float want = 1.0f / sqrtf(layers == 46 ? 16.0f : 32.0f);
        CHECK(m && m->hp.attn_scale == want, "%d gemma2 layers: attention scale %g (want %g)", layers,
              m ? m->hp.attn_scale : 0.0f, want);
        tl_model_close(m);
        remove(path);
    }
}

static int ask(tl_model *m, const char *text, int n, char *answer, int cap, int no_cache) {
    int32_t ids[512], out[64];
    int np = tl_tokenize(m, text, (int)strlen(text), 1, 1, ids, 512);
    tl_generate_params gp = tl_generate_default_params();
    gp.max_tokens = n;
    gp.no_cache = no_cache;
    int ng = tl_generate(m, ids, np, gp, out, 64);
    if (ng < 0) return ng;
    return tl_detokenize(m, out, ng, answer, cap);
}

static void test_gemma_model(const char *path) {
    tl_model_params mp = tl_model_default_params();
    mp.max_seq_len = 2048;
    tl_model *m = NULL;
    tl_model_open(path, mp, &m);
    CHECK(m != NULL, "Gemma 3 270M opens (%s)", tl_last_error());
    if (!m) return;
    char ans[1024];
    ask(m, "Question: What is the capital of France?\nAnswer:", 8, ans, sizeof ans, 1);
    CHECK(strstr(ans, "Paris") != NULL, "asked for the capital of France, Gemma answers Paris ('%s')", ans);
    /* through the chat helper (a plain transcript for this base model) */
    tl_chat_message msgs[2] = {{"system", "You answer questions about geography."},
                               {"user", "What is the capital of France?"}};
    char prompt[512];
    tl_chat_format(m, msgs, 2, 1, prompt, sizeof prompt);
    ask(m, prompt, 8, ans, sizeof ans, 1);
    CHECK(strstr(ans, "Paris") != NULL, "through the chat helper it answers Paris too ('%s')", ans);
    /* cached and uncached paths agree */
    char a1[1024], a2[1024];
    const char *q = "Question: Which river flows through Paris?\nAnswer:";
    ask(m, q, 24, a1, sizeof a1, 1);
    ask(m, q, 24, a2, sizeof a2, 0); /* fills the cache */
    int same1 = !strcmp(a1, a2);
    ask(m, q, 24, a2, sizeof a2, 0); /* hits it */
    CHECK(same1 && !strcmp(a1, a2), "cached and uncached greedy answers are identical");

    /* perplexity of a short English paragraph, token by token */
    FILE *f = fopen("tests/data/paragraph.txt", "rb");
    if (!f) f = fopen("../tests/data/paragraph.txt", "rb");
    static char text[4096];
    size_t len = f ? fread(text, 1, sizeof text - 1, f) : 0;
    if (f) fclose(f);
    text[len] = 0;
    static int32_t ids[1024];
    int n = tl_tokenize(m, text, (int)len, 1, 0, ids, 1024);
    int nv = tl_model_n_vocab(m);
    float *logits = malloc((size_t)nv * sizeof *logits);
    tl_seq *s;
    tl_seq_new(m, 0, &s);
    double nll = 0;
    for (int i = 0; i + 1 < n; i++) {
        const int32_t *t = &ids[i];
        int one = 1;
        tl_batch_forward(m, &s, &t, &one, 1, logits);
        float mx = logits[0];
        for (int j = 1; j < nv; j++) mx = logits[j] > mx ? logits[j] : mx;
        double z = 0;
        for (int j = 0; j < nv; j++) z += exp((double)logits[j] - mx);
        nll += -((double)logits[ids[i + 1]] - mx - log(z));
    }
    tl_seq_free(s);
    free(logits);
    double ppl = exp(nll / (n - 1));
    printf("  Gemma 3 270M perplexity on tests/data/paragraph.txt (%d tokens): %.2f\n", n, ppl);
    /* measured 16.72 with this file (f16 KV, AVX-512 and scalar alike); the bound sits just above */
    CHECK(n > 50 && ppl < 18.0, "perplexity on an English paragraph is low (%.2f < 18)", ppl);
    tl_model_close(m);
}

/* Greedy tokens of a prompt and what the cache served of it. */
static int run(tl_model *m, const int32_t *p, int n, int no_cache, int32_t *out, int k) {
    tl_generate_params gp = greedy(k);
    gp.no_cache = no_cache;
    int n_cached = -1;
    int64_t id;
    tl_request_submit(m, p, n, &gp, NULL, &id);
    while (tl_model_step(m) > 0) {
    }
    int fin = 0;
    tl_request_info info = {0};
    tl_request_take(m, id, out, k, &fin);
    tl_request_get_info(m, id, &info);
    if (info.state == TL_REQ_DONE) n_cached = info.n_cached;
    tl_request_release(m, id);
    return n_cached;
}

/* 1,100 tokens, past twice the window: 15 local layers hold about 33
 * blocks each, the 3 global ones all 70; the next turn reuses everything,
 * a prompt sharing only an early prefix gets what the windows still hold,
 * and every path equals the uncached one. */
static void test_gemma_trim(const char *path) {
    enum { N = 1100, K = 8, SHARED = 600 };
    tl_model_params mp = tl_model_default_params();
    mp.max_seq_len = 2048;
    tl_model *m = NULL;
    tl_model_open(path, mp, &m);
    if (!m) return;
    tl_model_info mi;
    tl_model_get_info(m, &mi);
    static int32_t p[N + K + 4], q[N];
    for (int i = 0; i < N; i++) p[i] = 1000 + (i * 7919) % 200000;
    int32_t a[K], b[K], c[K];
    run(m, p, N, 1, a, K);
    run(m, p, N, 0, b, K); /* fills the cache */
    tl_cache_stats st;
    tl_model_get_stats(m, &st);
    int bs = mi.kv_block_size, lb = (N + K - 1 + bs - 1) / bs, bound = 3 * lb + 15 * (512 / bs + 2);
    CHECK(!memcmp(a, b, sizeof a) && st.blocks_used >= 3 * lb && st.blocks_used <= bound,
          "Gemma 3 270M: %d cached tokens hold %d KV blocks (<= %d; %d without dropping), tokens as uncached", N + K - 1,
          (int)st.blocks_used, bound, 18 * lb);
    memcpy(p + N, b, sizeof b);
    for (int i = 0; i < 4; i++) p[N + K + i] = 2000 + i;
    run(m, p, N + K + 4, 1, a, K);
    int turn = run(m, p, N + K + 4, 0, c, K);
    CHECK(turn == N + K - 1 && !memcmp(a, c, sizeof a),
          "Gemma 3 270M: the next turn reuses all %d tokens (%d) and equals uncached", N + K - 1, turn);
    memcpy(q, p, sizeof q);
    for (int i = SHARED; i < N; i++) q[i] = 3000 + i;
    run(m, q, N, 1, a, K);
    int shared = run(m, q, N, 0, c, K);
    CHECK(shared >= 0 && shared < SHARED && !memcmp(a, c, sizeof a),
          "Gemma 3 270M: a prompt sharing %d early tokens whose local KV was dropped matches %d and equals uncached",
          SHARED, shared);
    tl_model_close(m);
}

int main(void) {
    test_synthetic_window(0);
    test_synthetic_window(1);
    test_gemma2();
    const char *path = ref_default_model();
    if (path) test_gemma_model(path);
    if (path) test_gemma_trim(path);
    else printf("SKIP Gemma 3 270M tests: the default model is not fetched (make model)\n");
    return test_summary();
}
