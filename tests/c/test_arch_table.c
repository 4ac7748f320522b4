/* test_arch_table.c - the architectures that are entries of the table in
 * engine/model_hparams.c with no test file of their own.
 * - llama's block under other names (internlm2, xverse, ernie4_5,
 *   mistral3): bitwise the llama file of the same weights, and greedy
 *   tokens against ik_llama.cpp's; Mistral 3's attention temperature
 *   refused.
 * - gptneox (gpt2's fused, biased tensors with partial NEOX RoPE; attention
 *   and FFN side by side when use_parallel_residual says), phi2 (the same
 *   with one LayerNorm a layer and an output bias), falcon (phi2's block
 *   without biases, grouped K/V heads) and gemma (llama's block with GeGLU
 *   and sqrt(n_embd)-scaled embeddings): greedy tokens against
 *   ik_llama.cpp's, also through store-h.
 * - qwen (fused Q/K/V with their bias, the FFN half of feed_forward_length),
 *   command-r (LayerNorms with a weight only, attention and FFN side by
 *   side on one norm, logit_scale) and cohere2 (command-r's block, three
 *   sliding-window layers with RoPE to each global one without): greedy
 *   tokens against ik_llama.cpp's.
 * - olmo (LayerNorms without parameters, clipped Q/K/V), starcoder (gpt2's
 *   graph with one K/V head) and granite (embedding, residual, attention
 *   and logit multipliers): logits against an independent forward pass
 *   (ik's olmo graph ropes K twice, its granite graph scales the residual
 *   sum).
 * - starcoder2 (LayerNorms, biased separate Q/K/V, a plain FFN): bitwise
 *   the sequential gptneox of the same weights (ik's starcoder2 graph norms
 *   the FFN input with RMSNorm).
 * - batch == alone and thread counts on quantized parallel models, the
 *   parallel key's default, and the CUDA plugin's refusal. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "quants.h"
#include "ref_logits.h"
#include "test.h"
#include "testmodel.h"
#include "tinyloop.h"

static const char *tmp_path(const char *name) {
    static char buf[256];
    snprintf(buf, sizeof buf, "/tmp/tl_test_%d_archs_%s.gguf", (int)getpid(), name);
    return buf;
}

static tm_spec ref_spec(const char *arch, int kv_heads, int rope_dims, int seed) {
    tm_spec s = tm_default_spec();
    s.arch = arch;
    s.n_embd = 256;
    s.n_layer = 4;
    s.n_head = 4;
    s.n_head_kv = kv_heads;
    s.n_ff = 512;
    s.n_ctx = 2048;
    s.rope_dims = rope_dims;
    s.seed = (uint64_t)seed;
    return s;
}

static tl_model *open_model(const char *path, int kv_type, const char *kv_mode, int threads) {
    tl_model_params p = tl_model_default_params();
    p.kv_type = kv_type;
    p.kv_mode = kv_mode;
    p.n_threads = threads;
    p.max_seq_len = 256;
    tl_model *m = NULL;
    tl_model_open(path, p, &m);
    return m;
}

/* The last position's logits of a 30-token prompt. */
static int prompt_logits(const char *path, int kv_type, float *out) {
    tl_model *m = open_model(path, kv_type, NULL, 1);
    if (!m) return -1;
    int32_t ids[30];
    for (int i = 0; i < 30; i++) ids[i] = (int32_t)((i * 37 + 11) % 320);
    tl_seq *q = NULL;
    const int32_t *p = ids;
    int n = 30, rc = tl_seq_new(m, 0, &q) || tl_batch_forward(m, &q, &p, &n, 1, out);
    tl_seq_free(q);
    tl_model_close(m);
    return rc ? -1 : 0;
}

/* tl-gen-model ref.gguf --arch A --dim 256 --layers 4 --heads 4 --kv-heads
 * K --ff 512 --ctx 2048 --rope-dims R --seed S [--sequential] [--embd-gain
 * G] [--bias 1] [--window W --layers L]: ik_llama.cpp's llama-simple printed
 * exactly these tokens' bytes after the prompt (f16 KV, 2026-12-07). */
static void test_references(void) {
    static const struct {
        const char *arch;
        int kv_heads, rope_dims, seed, sequential;
        float embd_gain;
        int bias;
        int32_t want[24];
        int window, layers; /* 0: none, 4 */
    } refs[] = {
        {"gptneox", 4, 16, 1, 0, 0, 0,
         {20, 240, 267, 239, 268, 116, 75, 268, 236, 268, 236, 268, 236, 268, 236, 268, 236, 268, 236, 268, 236, 268,
          249, 240}, 0, 0},
        {"gptneox", 4, 64, 3, 1, 0, 0,
         {201, 219, 218, 218, 218, 218, 218, 218, 218, 292, 218, 278, 292, 298, 310, 278, 218, 278, 218, 278, 218, 278,
          218, 165}, 0, 0},
        {"phi2", 4, 32, 1, 0, 0, 0,
         {20, 240, 267, 116, 75, 268, 200, 302, 184, 20, 240, 267, 116, 262, 39, 267, 116, 8, 54, 167, 177, 240, 267,
          184}, 0, 0},
        {"phi2", 4, 16, 3, 0, 0, 0,
         {134, 19, 44, 206, 110, 36, 110, 36, 110, 36, 110, 36, 110, 36, 110, 110, 110, 110, 110, 110, 110, 110, 110,
          110}, 0, 0},
        {"gemma", 2, 0, 1, 0, 0.0625f, 0,
         {99, 78, 78, 78, 78, 232, 270, 64, 99, 136, 76, 290, 249, 84, 99, 290, 153, 99, 59, 99, 59, 99, 264, 153}, 0, 0},
        {"internlm2", 2, 0, 1, 0, 0, 0,
         {38, 102, 38, 102, 79, 286, 265, 38, 102, 191, 249, 38, 35, 231, 83, 38, 35, 231, 38, 235, 38, 38, 38, 235}, 0, 0},
        {"ernie4_5", 2, 0, 3, 0, 0, 1,
         {42, 42, 42, 180, 42, 42, 42, 42, 42, 42, 6, 6, 6, 6, 93, 260, 93, 164, 164, 164, 164, 164, 164, 164}, 0, 0},
        {"falcon", 4, 0, 2, 0, 0, 0,
         {98, 88, 152, 134, 134, 134, 134, 134, 254, 220, 254, 220, 254, 220, 254, 220, 254, 220, 97, 290, 220, 97, 290,
          220}, 0, 0},
        {"falcon", 2, 0, 3, 0, 0, 0,
         {72, 72, 72, 72, 236, 18, 72, 72, 72, 72, 72, 72, 72, 72, 72, 72, 229, 72, 229, 72, 72, 72, 72, 72}, 0, 0},
        {"qwen", 4, 0, 1, 0, 0, 0, /* fused Q/K/V with their bias; feed_forward_length twice the FFN */
         {206, 206, 206, 206, 206, 206, 206, 206, 206, 307, 206, 81, 174, 206, 81, 174, 206, 81, 174, 213, 213, 213, 213,
          213}, 0, 0},
        {"command-r", 2, 0, 5, 0, 0, 0, /* weight-only LayerNorm, one norm a parallel layer, logits x 0.0625 */
         {197, 70, 297, 134, 263, 263, 263, 302, 302, 302, 302, 302, 302, 302, 302, 302, 302, 212, 173, 214, 254, 214, 26,
          143}, 0, 0},
        {"cohere2", 2, 0, 3, 0, 0, 0, /* command-r's with windows of 5 on three layers of four, the fourth unroped */
         {199, 263, 153, 153, 310, 310, 310, 56, 56, 246, 246, 246, 246, 105, 78, 303, 310, 285, 188, 283, 126, 216, 218,
          86}, 5, 8},
    };
    for (size_t r = 0; r < sizeof refs / sizeof refs[0]; r++) {
        tm_spec s = ref_spec(refs[r].arch, refs[r].kv_heads, refs[r].rope_dims, refs[r].seed);
        s.sequential = refs[r].sequential;
        s.embd_gain = refs[r].embd_gain;
        s.bias = refs[r].bias;
        s.sliding_window = refs[r].window;
        if (refs[r].layers) s.n_layer = refs[r].layers;
        const char *path = tmp_path("ref");
        CHECK(tm_write(&s, path) == 0, "%s reference %zu is written", refs[r].arch, r);
        for (int h = 0; h < 2; h++) {
            tl_model *m = open_model(path, TL_KV_F16, h ? "h" : NULL, 1);
            int32_t ids[24], out[24];
            int ng = m ? tm_greedy_ref(m, 24, ids, out) : -1;
            CHECK(ng == 24 && !memcmp(out, refs[r].want, sizeof out),
                  "%s %zu (rope over %d%s): greedy tokens equal ik_llama.cpp's (%s, %d; %s)", refs[r].arch, r,
                  refs[r].rope_dims ? refs[r].rope_dims : 64, refs[r].sequential ? ", sequential" : "",
                  h ? "store-h KV" : "f16 KV", ng, m ? "" : tl_last_error());
            tl_model_close(m);
        }
        remove(path);
    }
}

/* internlm2, xverse, ernie4_5 (here with Q/K/V biases) and mistral3 are
 * llama under other names: their logits equal the llama file's bitwise
 * (internlm2 and ernie4_5 are also in the references above; xverse and
 * mistral3's greedy tokens equalled ik_llama.cpp's on such files too,
 * 2026-12-07). Mistral 3's attention temperature scaling is refused. */
static void test_llama_names(void) {
    static const char *const names[4] = {"internlm2", "xverse", "ernie4_5", "mistral3"};
    for (int c = 0; c < 4; c++) {
        tm_spec a = ref_spec(names[c], 2, 0, 11 + c), b = a;
        b.arch = "llama";
        a.bias = b.bias = c == 2;
        a.type = b.type = c % 2 ? TL_TYPE_Q8_0 : TL_TYPE_F32;
        char pa[256], pb[256];
        snprintf(pa, sizeof pa, "%s", tmp_path("name"));
        snprintf(pb, sizeof pb, "%s", tmp_path("llama"));
        static float la[320], lb[320];
        int ra = tm_write(&a, pa) || prompt_logits(pa, TL_KV_F32, la);
        int rb = tm_write(&b, pb) || prompt_logits(pb, TL_KV_F32, lb);
        CHECK(ra == 0 && rb == 0 && !memcmp(la, lb, sizeof la), "%s: logits equal the llama file's bitwise (%s)",
              names[c], tl_last_error());
        remove(pb);
        if (c == 3) { /* Mistral 3 / Llama 4's attention temperature: refused, naming it */
            a.extra_key = "attention.temperature_scale";
            a.extra_value = 0.1f;
            tm_write(&a, pa);
            tl_model *m = open_model(pa, TL_KV_F16, NULL, 1);
            CHECK(!m && strstr(tl_last_error(), "mistral3.attention.temperature_scale 0.1 is not supported"),
                  "mistral3's attention temperature scaling is refused (%s)", tl_last_error());
            tl_model_close(m);
        }
        remove(pa);
    }
}

/* Small specs (width 64, 2 layers) against tools/ref_forward.py's logits
 * on the same files (2026-12-07; tinyloop agreed to 1e-5 everywhere):
 * - olmo: LayerNorms without weight or bias, Q/K/V clipped to +-0.3
 *   (ik_llama.cpp's olmo graph ropes K twice; with that emulated,
 *   tinyloop's greedy tokens equalled ik's on three such files);
 * - starcoder (GPT-BigCode): gpt2's graph, here with one K/V head;
 * - granite: embeddings x12, each branch x0.22 before its residual add,
 *   q.k x0.2 and logits / 4 (the recipe's keys), embeddings drawn 10x
 *   smaller so the scaled ones do not drown the layers (ik's graph scales
 *   the residual sum instead of the branch);
 * - olmo2: no norm before attention or FFN, RMSNorm after each, Q and K
 *   RMS-normed over their whole rows (ik_llama.cpp has no olmo2);
 * - bloom (gpt2's tensors, ALiBi over 6 heads - slopes from both of
 *   ggml's series -, the embeddings' LayerNorm) and mpt (the same without
 *   biases or that norm; 6 heads, and 4 with Q/K/V clipped to +-0.4):
 *   ik's graphs norm their FFN input with RMSNorm.
 * olmo's store-h recomputes clipped K/V too, olmo2's whole-row normed K:
 * their greedy tokens equal the f16 KV's. */
static void test_reference_logits(void) {
    static const struct {
        const char *arch;
        int kv_heads, seed;
        float embd_gain, clamp;
        float want[8];
        int best;
        float best_value;
        int heads; /* 0: 4 over a width of 64; else heads of 16 */
    } cases[] = {
        {"olmo", 2, 5, 0, 0.3f, {0.820419f, 0.0163524f, -0.264025f, 0.74679f, 0.358345f, 0.332367f, 0.802436f,
                                 -0.0658007f}, 280, 2.37628f, 0},
        {"starcoder", 1, 7, 0, 0, {-0.751879f, 0.0657546f, -2.12413f, 1.91347f, -0.115344f, 0.54601f, -0.315959f,
                                   1.91933f}, 305, 3.28476f, 0},
        {"granite", 2, 9, 0.1f, 0, {0.531774f, 0.483382f, -0.031692f, 0.0253852f, -0.0426154f, -0.453058f, 0.135138f,
                                    0.0310475f}, 63, 0.897031f, 0},
        {"olmo2", 2, 31, 0, 0, {-0.130548f, 0.489429f, -0.179601f, 0.409096f, 2.16067f, -0.116551f, -0.530966f,
                                0.276945f}, 208, 2.69264f, 0},
        {"bloom", 6, 41, 0, 0, {0.590114f, -0.863461f, 2.09289f, -1.03046f, 0.150054f, 0.918878f, -0.29581f,
                                0.962624f}, 27, 7.06344f, 6},
        {"mpt", 6, 42, 0, 0, {-2.13082f, 0.17639f, -0.286902f, -0.690079f, 0.67567f, 1.24221f, 0.10862f, 0.997934f},
         27, 2.45423f, 6},
        {"mpt", 2, 43, 0, 0.4f, {0.110228f, 0.179152f, 0.716146f, 0.825724f, -1.26089f, 1.70715f, -0.265345f,
                                 -0.922317f}, 252, 3.00725f, 0},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        tm_spec s = tm_default_spec();
        s.arch = cases[c].arch;
        s.n_head_kv = cases[c].kv_heads;
        s.n_ctx = 64;
        s.seed = (uint64_t)cases[c].seed;
        s.embd_gain = cases[c].embd_gain;
        if (cases[c].heads) s.n_head = cases[c].heads, s.n_embd = 16 * cases[c].heads;
        if (cases[c].clamp > 0) s.extra_key = "attention.clamp_kqv", s.extra_value = cases[c].clamp;
        const char *path = tmp_path("ref_logits");
        CHECK(tm_write(&s, path) == 0, "the %s model is written", s.arch);
        check_ref_logits(s.arch, path, cases[c].want, cases[c].best, cases[c].best_value);
        int32_t out[2][16];
        const int h_check = cases[c].clamp > 0 || !strcmp(s.arch, "olmo2");
        for (int h = 0; h < 2 && h_check; h++) {
            tl_model *m = open_model(path, TL_KV_F16, h ? "h" : NULL, 1);
            tl_generate_params gp = tl_generate_default_params();
            gp.max_tokens = 16;
            gp.ignore_eos = 1;
            int ng = m ? tl_generate(m, ref_ids, 20, gp, out[h], 16) : -1;
            CHECK(ng == 16, "%s generates 16 tokens (%s, %d)", s.arch, h ? "store-h" : "f16 KV", ng);
            tl_model_close(m);
        }
        if (h_check)
            CHECK(!memcmp(out[0], out[1], sizeof out[0]), "... the same through store-h's recomputed K/V (%s)", s.arch);
        remove(path);
    }
}

/* ALiBi goes through each attention path's softmax: a query decoding one
 * token at a time (one thread; and two threads over one K/V head, the
 * split-K path) must see the logits a prefill of the same prefix gives
 * (f32 KV; the paths sum in their own orders, so within 1e-4). */
static void test_alibi_paths(void) {
    static const struct { const char *arch; int heads, kv, threads; } cfg[] = {
        {"bloom", 6, 6, 1}, {"mpt", 4, 1, 2}, {"bloom", 4, 1, 2}};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        tm_spec sp = tm_default_spec();
        sp.arch = cfg[c].arch;
        sp.n_head = cfg[c].heads;
        sp.n_embd = 16 * cfg[c].heads;
        sp.n_head_kv = cfg[c].kv;
        sp.n_ctx = 64;
        sp.seed = 50 + (uint64_t)c;
        const char *path = tmp_path("alibi");
        tm_write(&sp, path);
        tl_model *m = open_model(path, TL_KV_F32, NULL, cfg[c].threads);
        CHECK(m != NULL, "%s opens (%s)", sp.arch, m ? "" : tl_last_error());
        int32_t ids[20];
        for (int i = 0; i < 20; i++) ids[i] = (int32_t)((i * 41 + 9) % 320);
        static float dec[320], pre[320];
        tl_seq *a = NULL;
        float worst = 0;
        int rc = m ? tl_seq_new(m, 0, &a) : -1;
        for (int k = 12; k <= 20 && rc == 0; k++) {
            /* the decoding sequence: 12 tokens at once, then one at a time */
            const int32_t *p = k == 12 ? ids : ids + k - 1;
            int n = k == 12 ? 12 : 1;
            rc = tl_batch_forward(m, &a, &p, &n, 1, dec);
            tl_seq *b = NULL;
            const int32_t *q = ids;
            int nk = k;
            if (!rc) rc = tl_seq_new(m, 0, &b) || tl_batch_forward(m, &b, &q, &nk, 1, pre);
            tl_seq_free(b);
            for (int i = 0; i < 320 && rc == 0; i++) worst = fmaxf(worst, fabsf(dec[i] - pre[i]));
        }
        tl_seq_free(a);
        CHECK(rc == 0 && worst < 1e-4f, "%s, %d heads over %d K/V, %d thread(s): decode's logits equal a prefill's (%g)",
              sp.arch, cfg[c].heads, cfg[c].kv, cfg[c].threads, worst);
        tl_model_close(m);
        remove(path);
    }
}

/* starcoder2's specs draw Q/K/V as gptneox's fused rows, split: with RoPE
 * over the whole head and use_parallel_residual false the two files are
 * one network, and the logits must agree bit for bit. */
static void test_starcoder2(void) {
    static const int types[2] = {TL_TYPE_F32, TL_TYPE_Q8_0};
    for (int t = 0; t < 2; t++) {
        tm_spec a = ref_spec("starcoder2", 4, 0, 3), b = ref_spec("gptneox", 4, 0, 3);
        a.type = b.type = types[t];
        b.sequential = 1;
        char pa[256], pb[256];
        snprintf(pa, sizeof pa, "%s", tmp_path("starcoder2"));
        snprintf(pb, sizeof pb, "%s", tmp_path("seq"));
        CHECK(tm_write(&a, pa) == 0 && tm_write(&b, pb) == 0, "starcoder2 and gptneox files are written");
        static float la[320], lb[320];
        int ra = prompt_logits(pa, TL_KV_F32, la), rb = prompt_logits(pb, TL_KV_F32, lb);
        CHECK(ra == 0 && rb == 0 && !memcmp(la, lb, sizeof la),
              "%s: starcoder2 logits equal the sequential gptneox's bitwise (%d %d; %s)", t ? "q8_0" : "f32", ra,
              rb, tl_last_error());
        /* sabotage: the parallel gptneox of the same weights differs */
        b.sequential = 0;
        CHECK(tm_write(&b, pb) == 0 && prompt_logits(pb, TL_KV_F32, lb) == 0 && memcmp(la, lb, sizeof la),
              "%s: ... and the parallel one's do not", t ? "q8_0" : "f32");
        remove(pa);
        remove(pb);
    }
    /* grouped-query attention (two K/V heads) and Q/K/V without biases load too */
    tm_spec g = ref_spec("starcoder2", 2, 0, 4);
    const char *path = tmp_path("starcoder2_gqa");
    tm_write(&g, path);
    tl_model *m = open_model(path, TL_KV_F16, NULL, 1);
    int32_t ids[24], out[8];
    int ng = m ? tm_greedy_ref(m, 8, ids, out) : -1;
    CHECK(ng == 8, "starcoder2 with 2 K/V heads generates (%d; %s)", ng, m ? "" : tl_last_error());
    tl_model_info info;
    CHECK(m && tl_model_get_info(m, &info) == 0 && !strcmp(info.arch, "starcoder2"), "info names starcoder2");
    tl_model_close(m);
    remove(path);
}

/* Quantized parallel models: two sequences in one batch give their logits
 * alone, bitwise, and greedy tokens are the same at 1 and 2 threads. */
static void test_batch_threads(void) {
    static const char *const archs[2] = {"phi2", "gptneox"};
    static const int types[2] = {TL_TYPE_Q8_0, TL_TYPE_Q4_0};
    for (int c = 0; c < 2; c++) {
        tm_spec s = ref_spec(archs[c], 4, 32, 5 + c);
        s.type = types[c];
        const char *path = tmp_path("batch");
        tm_write(&s, path);
        tl_model *m = open_model(path, TL_KV_F16, NULL, 2);
        CHECK(m != NULL, "%s opens (%s)", archs[c], m ? "" : tl_last_error());
        if (!m) continue;
        int32_t ids[40];
        for (int i = 0; i < 40; i++) ids[i] = (int32_t)((i * 53 + 7) % 320);
        static float a[2][320], b[2][320];
        const int32_t *ps[2] = {ids, ids + 9};
        int ns[2] = {31, 17};
        tl_seq *qs[2] = {NULL, NULL};
        int rc = tl_seq_new(m, 0, &qs[0]) || tl_seq_new(m, 0, &qs[1]) || tl_batch_forward(m, qs, ps, ns, 2, &a[0][0]);
        tl_seq_free(qs[0]);
        tl_seq_free(qs[1]);
        for (int k = 0; k < 2 && !rc; k++) {
            tl_seq *one = NULL;
            rc = tl_seq_new(m, 0, &one) || tl_batch_forward(m, &one, &ps[k], &ns[k], 1, b[k]);
            tl_seq_free(one);
        }
        CHECK(rc == 0 && !memcmp(a, b, sizeof a), "%s: two sequences in one batch give their logits alone, bitwise",
              archs[c]);
        tl_model_close(m);

        int32_t out[2][16];
        for (int th = 1; th <= 2; th++) {
            m = open_model(path, TL_KV_F16, NULL, th);
            tl_generate_params gp = tl_generate_default_params();
            gp.max_tokens = 16;
            gp.ignore_eos = 1;
            int ng = m ? tl_generate(m, ids, 20, gp, out[th - 1], 16) : -1;
            CHECK(ng == 16, "%s generates 16 tokens at %d thread(s) (%d)", archs[c], th, ng);
            tl_model_close(m);
        }
        CHECK(!memcmp(out[0], out[1], sizeof out[0]), "%s: ... the same ones", archs[c]);
        remove(path);
    }
}

/* A gptneox file without use_parallel_residual runs in parallel (Hugging
 * Face's default); qwen's odd feed_forward_length is refused; the CUDA
 * plugin refuses gptneox, phi2 and granite, saying why. */
static void test_keys_and_refusals(void) {
    tm_spec s = ref_spec("gptneox", 4, 16, 1);
    const char *path = tmp_path("key");
    static float want[320], got[320];
    tm_write(&s, path);
    int rw = prompt_logits(path, TL_KV_F32, want);
    CHECK(tm_patch_bytes(path, "use_parallel_residual", "use_parallel_residuaX") == 1,
          "the key is renamed away");
    int rg = prompt_logits(path, TL_KV_F32, got);
    CHECK(rw == 0 && rg == 0 && !memcmp(want, got, sizeof want),
          "gptneox without use_parallel_residual runs in parallel, as with the key true");
    remove(path);

    /* qwen's FFN is half of feed_forward_length: an odd one is refused */
    tm_spec q = ref_spec("qwen", 4, 0, 1);
    tm_write(&q, path);
    CHECK(tm_patch_u32_key(path, "qwen.feed_forward_length", 1023) == 1, "qwen's feed_forward_length is patched");
    tl_model *qm = open_model(path, TL_KV_F16, NULL, 1);
    CHECK(!qm && strstr(tl_last_error(), "qwen.feed_forward_length 1023 is odd"), "an odd one is refused (%s)",
          tl_last_error());
    tl_model_close(qm);
    remove(path);

    /* command-r's logits are times logit_scale (greedy tokens cannot tell):
     * 0.125 doubles the file's 0.0625 exactly; a file without it is refused */
    tm_spec c = ref_spec("command-r", 2, 0, 5);
    tm_write(&c, path);
    int r1 = prompt_logits(path, TL_KV_F32, want);
    const float eighth = 0.125f;
    uint32_t bits;
    memcpy(&bits, &eighth, 4);
    CHECK(tm_patch_u32_key(path, "command-r.logit_scale", bits) == 1, "command-r's logit_scale is patched to 0.125");
    int r2 = prompt_logits(path, TL_KV_F32, got);
    int doubled = r1 == 0 && r2 == 0;
    for (int i = 0; i < 320 && doubled; i++) doubled = got[i] == 2 * want[i] && want[i] != 0;
    CHECK(doubled, "... and its logits double, exactly");
    CHECK(tm_patch_bytes(path, "command-r.logit_scale", "command-r.logit_scalX") == 1, "the key is renamed away");
    tl_model *cm = open_model(path, TL_KV_F16, NULL, 1);
    CHECK(!cm && strstr(tl_last_error(), "missing required key 'command-r.logit_scale'"),
          "command-r without logit_scale is refused (%s)", tl_last_error());
    tl_model_close(cm);
    remove(path);

    /* an unknown name is refused listing every one the table has */
    tm_spec u = ref_spec("gemma", 2, 0, 1);
    tm_write(&u, path);
    CHECK(tm_patch_bytes(path, "gemma", "gammy") > 0, "the architecture is renamed gammy");
    tl_model *um = open_model(path, TL_KV_F16, NULL, 1);
    CHECK(!um && strstr(tl_last_error(), "unsupported architecture 'gammy' (supported: llama, ") &&
              strstr(tl_last_error(), ", gemma3)"),
          "an unknown architecture is refused, naming all the supported ones (%s)", tl_last_error());
    tl_model_close(um);
    remove(path);

    static const char *const archs[6] = {"phi2", "gptneox", "granite", "olmo2", "command-r", "bloom"};
    for (int c = 0; c < 6; c++) {
        tm_spec p = ref_spec(archs[c], 4, c >= 3 ? 0 : 16, 2);
        tm_write(&p, path);
        tl_model *m = NULL;
        setenv("TINYLOOP_BACKEND", "cuda", 1);
        int rc = tl_model_open(path, tl_model_default_params(), &m);
        unsetenv("TINYLOOP_BACKEND");
        CHECK(rc == TL_ERR_UNSUPPORTED && !m && strstr(tl_last_error(), "run on the CPU only"),
              "TINYLOOP_BACKEND=cuda refuses %s, saying why (%s)", archs[c], tl_last_error());
        tl_model_close(m);
        remove(path);
    }
}

int main(void) {
    test_references();
    test_llama_names();
    test_reference_logits();
    test_alibi_paths();
    test_starcoder2();
    test_batch_threads();
    test_keys_and_refusals();
    return test_summary();
}
