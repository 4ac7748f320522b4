/* test_gpt2.c - the LayerNorm architectures. gpt2 (LayerNorm with
 * biases, learned positions, fused attn_qkv with its bias, biases on every
 * matmul, a plain GELU FFN, no RoPE): logits against an independent
 * reference, batch == alone, thread counts, the learned-position limit,
 * and the CUDA plugin's refusal. stablelm (LayerNorms with biases over
 * llama's block, partial NEOX RoPE): greedy tokens against ik_llama.cpp's,
 * also through store-h.
 *
 * The reference: tools/ref_forward.py, a plain-Python GPT-2 forward pass
 * (float64 arithmetic, the GPT-2 equations with ggml's tanh GELU) over the
 * f32 GGUF that tl-gen-model writes for the spec below, 2026-12-07; its
 * logits agreed with tinyloop's to 1e-5 everywhere. ik_llama.cpp cannot
 * serve as the reference here: its gpt2 graph applies the FFN's norm as
 * RMSNorm without the bias (and asserts on the missing RMS epsilon). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "test.h"
#include "testmodel.h"
#include "tinyloop.h"

static const char *tmp_path(const char *name) {
    static char buf[256];
    snprintf(buf, sizeof buf, "/tmp/tl_test_%d_gpt2_%s.gguf", (int)getpid(), name);
    return buf;
}

/* tl-gen-model ... --arch gpt2 --dim 64 --layers 2 --heads 4 --kv-heads 2
 * --ff 256 --vocab 320 --ctx 64 --seed 4 */
static tm_spec ref_spec(void) {
    tm_spec s = tm_default_spec();
    s.arch = "gpt2";
    s.n_ff = 256;
    s.n_ctx = 64;
    s.seed = 4;
    return s;
}

static const int32_t ref_ids[25] = {1,   5,  77, 300, 12, 9,  140, 33, 2,  45, 67, 89, 101,
                                    200, 17, 18, 19,  20, 21, 22,  23, 24, 25, 26, 27};

static tl_model *open_f32(const char *path, int max_seq_len, int threads) {
    tl_model_params p = tl_model_default_params();
    p.kv_type = TL_KV_F32;
    p.max_seq_len = max_seq_len;
    p.n_threads = threads;
    tl_model *m = NULL;
    tl_model_open(path, p, &m);
    return m;
}

static void test_reference(void) {
    tm_spec s = ref_spec();
    const char *path = tmp_path("ref");
    CHECK(tm_write(&s, path) == 0, "the gpt2 model is written");
    tl_model *m = open_f32(path, 64, 1);
    CHECK(m != NULL, "the gpt2 model opens (%s)", m ? "" : tl_last_error());
    if (!m) return;
    float l[320];
    tl_seq *q = NULL;
    const int32_t *p = ref_ids;
    int n = 25, rc = tl_seq_new(m, 0, &q) || tl_batch_forward(m, &q, &p, &n, 1, l);
    tl_seq_free(q);
    static const float want[8] = {0.41898f, 0.23747f, -0.15337f, -1.44867f, -0.80968f, 0.52530f, 1.75207f, -0.59531f};
    float err = 0;
    int best = 0;
    for (int i = 0; i < 8; i++) err = fmaxf(err, fabsf(l[100 + i] - want[i]));
    for (int i = 1; i < 320; i++) best = l[i] > l[best] ? i : best;
    CHECK(rc == 0 && err < 1e-4f && best == 189 && fabsf(l[189] - 3.58098f) < 1e-4f,
          "gpt2 logits equal the independent reference (max error %g over 8, argmax %d, want 189)", err, best);

    /* two sequences in one batch: each bitwise alone */
    float a[2][320], b[2][320];
    const int32_t *ps[2] = {ref_ids, ref_ids + 7};
    int ns[2] = {18, 11};
    tl_seq *qs[2] = {NULL, NULL};
    rc = tl_seq_new(m, 0, &qs[0]) || tl_seq_new(m, 0, &qs[1]) || tl_batch_forward(m, qs, ps, ns, 2, &a[0][0]);
    tl_seq_free(qs[0]);
    tl_seq_free(qs[1]);
    for (int k = 0; k < 2 && !rc; k++) {
        const int32_t *pk = ps[k];
        int nk = k ? 11 : 18;
        tl_seq *one = NULL;
        rc = tl_seq_new(m, 0, &one) || tl_batch_forward(m, &one, &pk, &nk, 1, b[k]);
        tl_seq_free(one);
    }
    CHECK(rc == 0 && !memcmp(a, b, sizeof a), "two gpt2 sequences in one batch give their logits alone, bitwise");
    tl_model_close(m);

    /* greedy tokens the same at 1 and 2 threads */
    int32_t out[2][12];
    for (int th = 1; th <= 2; th++) {
        m = open_f32(path, 64, th);
        tl_generate_params gp = tl_generate_default_params();
        gp.max_tokens = 12;
        gp.ignore_eos = 1;
        int ng = m ? tl_generate(m, ref_ids, 16, gp, out[th - 1], 12) : -1;
        CHECK(ng == 12, "gpt2 generates 12 tokens at %d thread(s) (%d)", th, ng);
        tl_model_close(m);
    }
    CHECK(!memcmp(out[0], out[1], sizeof out[0]), "... the same ones");

    /* no embedding for a position past the learned ones */
    m = open_f32(path, 65, 1);
    CHECK(!m && strstr(tl_last_error(), "max_seq_len 65 exceeds the 64 positions gpt2 has learned embeddings for"),
          "a max_seq_len past the learned positions is refused, naming both (%s)", tl_last_error());
    setenv("TINYLOOP_BACKEND", "cuda", 1);
    m = NULL;
    tl_model_params cp = tl_model_default_params();
    cp.max_seq_len = 64;
    rc = tl_model_open(path, cp, &m);
    unsetenv("TINYLOOP_BACKEND");
    CHECK(rc == TL_ERR_UNSUPPORTED && !m && strstr(tl_last_error(), "run on the CPU only"),
          "TINYLOOP_BACKEND=cuda refuses gpt2, saying why (%s)", tl_last_error());
    remove(path);
}

/* tl-gen-model ref.gguf --arch stablelm --dim 256 --layers 4 --heads 4
 * --kv-heads K --ff 512 --ctx 2048 --rope-dims R --seed S [--bias 1]:
 * ik_llama.cpp's llama-simple printed exactly these tokens' bytes after
 * the prompt (2026-12-07). */
static void test_stablelm(void) {
    static const struct {
        int kv_heads, rope_dims, seed, bias;
        int32_t want[24];
    } refs[] = {
        {2, 32, 3, 0,
         {42, 42, 42, 42, 42, 42, 42, 42, 42, 42, 42, 42, 38, 177, 5, 173, 253, 129, 301, 308, 308, 308, 308, 89}},
        {4, 16, 1, 1,
         {167, 178, 178, 178, 178, 178, 178, 178, 178, 178, 178, 178, 178, 178, 178, 178, 178, 178, 178, 178, 178, 178,
          178, 178}},
    };
    for (size_t r = 0; r < sizeof refs / sizeof refs[0]; r++) {
        tm_spec s = tm_default_spec();
        s.arch = "stablelm";
        s.n_embd = 256;
        s.n_head = 4;
        s.n_head_kv = refs[r].kv_heads;
        s.n_ff = 512;
        s.n_layer = 4;
        s.n_ctx = 2048;
        s.rope_dims = refs[r].rope_dims;
        s.seed = (uint64_t)refs[r].seed;
        s.bias = refs[r].bias;
        const char *path = tmp_path("stablelm");
        CHECK(tm_write(&s, path) == 0, "stablelm model %zu is written", r);
        for (int h = 0; h < 2; h++) {
            tl_model_params p = tl_model_default_params();
            p.kv_type = TL_KV_F16; /* as the reference ran */
            p.kv_mode = h ? "h" : NULL;
            tl_model *m = NULL;
            tl_model_open(path, p, &m);
            int32_t ids[24], out[24];
            int ng = m ? tm_greedy_ref(m, 24, ids, out) : -1;
            CHECK(ng == 24 && !memcmp(out, refs[r].want, sizeof out),
                  "stablelm %zu (rope over %d of 64, %s): greedy tokens equal ik_llama.cpp's (%s, %d)", r,
                  refs[r].rope_dims, refs[r].bias ? "Q/K/V biases" : "no biases", h ? "store-h KV" : "f16 KV", ng);
            tl_model_close(m);
        }
        remove(path);
    }
}

int main(void) {
    test_reference();
    test_stablelm();
    return test_summary();
}
