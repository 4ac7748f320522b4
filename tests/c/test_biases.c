/* test_biases.c - optional biases, where any architecture's file may hold
 * them: a llama with attn_output / ffn_up / ffn_down biases (llama.cpp's
 * optional MLP biases: up's bias goes on the up projection, not the gate)
 * against ik_llama.cpp's greedy tokens; separate Q/K/V biases beside a
 * fused attn_qkv refused rather than read in place of its own bias; and a
 * file with every bias a layer can bind (more than the old fixed table of
 * nine a layer held) opening and running. */
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "test.h"
#include "testmodel.h"
#include "tinyloop.h"

static const char *tmp_path(const char *name) {
    static char buf[256];
    snprintf(buf, sizeof buf, "/tmp/tl_test_%d_biases_%s.gguf", (int)getpid(), name);
    return buf;
}

static tl_model *open_model(const char *path, const char *kv_mode) {
    tl_model_params p = tl_model_default_params();
    p.kv_type = TL_KV_F16; /* as the reference ran */
    p.kv_mode = kv_mode;
    p.max_seq_len = 256;
    tl_model *m = NULL;
    tl_model_open(path, p, &m);
    return m;
}

/* tl-gen-model ref.gguf --arch llama --dim 256 --layers 4 --heads 4
 * --kv-heads 2 --ff 512 --ctx 2048 --seed 1 --matmul-bias: ik_llama.cpp's
 * llama-simple printed exactly these tokens' bytes after the prompt
 * (2026-12-07); with up's bias added to the gate, as before, the second
 * token differed. */
static void test_llama_mlp_biases(void) {
    static const int32_t want[24] = {38, 23, 83, 38, 35, 235, 78, 204, 83, 38, 35, 285,
                                     78, 38, 38, 38, 235, 90, 79, 193, 39, 83, 38, 235};
    tm_spec s = tm_default_spec();
    s.n_embd = 256;
    s.n_layer = 4;
    s.n_head = 4;
    s.n_head_kv = 2;
    s.n_ff = 512;
    s.n_ctx = 2048;
    s.matmul_bias = 1;
    const char *path = tmp_path("llama");
    CHECK(tm_write(&s, path) == 0, "a llama with MLP biases is written");
    for (int h = 0; h < 2; h++) {
        tl_model *m = open_model(path, h ? "h" : NULL);
        int32_t ids[24], out[24];
        int ng = m ? tm_greedy_ref(m, 24, ids, out) : -1;
        CHECK(ng == 24 && !memcmp(out, want, sizeof out),
              "llama with attn_output / ffn_up / ffn_down biases: greedy tokens equal ik_llama.cpp's (%s, %d; %s)",
              h ? "store-h KV" : "f16 KV", ng, m ? "" : tl_last_error());
        tl_model_close(m);
    }
    remove(path);
}

/* gpt2 keeps Q, K and V's bias in attn_qkv.bias: separate attn_q/k/v
 * biases beside it are not read, so the file is refused naming one. */
static void test_fused_and_separate(void) {
    tm_spec s = tm_default_spec();
    s.arch = "gpt2";
    s.bias = 1;
    const char *path = tmp_path("gpt2");
    tm_write(&s, path);
    tl_model *m = open_model(path, NULL);
    CHECK(!m && strstr(tl_last_error(), "tensor 'blk.0.attn_q.bias' is not part of a gpt2 model"),
          "separate Q/K/V biases beside a fused attn_qkv are refused, naming one (%s)", tl_last_error());
    tl_model_close(m);
    remove(path);
}

/* gemma3 with Q/K/V, output-projection and FFN biases besides its four
 * norms and two Q/K norms: 12 vectors a layer, over 3 layers and the
 * LongRoPE factors. Opens, and generates the same tokens with and without
 * the prefix cache's help (batch of one vs a fresh model). */
static void test_every_bias(void) {
    tm_spec s = tm_default_spec();
    s.arch = "gemma3";
    s.n_layer = 3;
    s.bias = 1;
    s.matmul_bias = 1;
    s.rope_factors = 1;
    const char *path = tmp_path("gemma3");
    tm_write(&s, path);
    tl_model *m = open_model(path, NULL);
    CHECK(m != NULL, "gemma3 with every bias opens (%s)", m ? "" : tl_last_error());
    int32_t ids[24], a[12], b[12];
    int na = m ? tm_greedy_ref(m, 12, ids, a) : -1, nb = m ? tm_greedy_ref(m, 12, ids, b) : -1;
    CHECK(na == 12 && nb == 12 && !memcmp(a, b, sizeof a), "... generates, twice the same (%d, %d)", na, nb);
    tl_model_close(m);
    remove(path);
}

int main(void) {
    test_llama_mlp_biases();
    test_fused_and_separate();
    test_every_bias();
    return test_summary();
}
