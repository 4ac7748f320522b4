/* test_phi3.c - the phi3 architecture: fused attn_qkv and gate/up
 * tensors, every layer over a sliding window, LongRoPE's long / short
 * factors chosen by the context, against ik_llama.cpp's greedy tokens
 * (also through store-h's recompute); llama.cpp's window defaults for old
 * files and the refusal of a file with none; and, for every architecture,
 * the refusal of a file holding tensors the model would not read. */
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "shape.h"
#include "test.h"
#include "testmodel.h"
#include "tinyloop.h"

static const char *tmp_path(const char *name) {
    static char buf[256];
    snprintf(buf, sizeof buf, "/tmp/tl_test_%d_phi3_%s.gguf", (int)getpid(), name);
    return buf;
}

/* The first n <= 24 greedy tokens after the 24-id prompt. */
static int greedy(const char *path, const char *kv_mode, int max_seq_len, int n, int32_t *out) {
    tl_model_params p = tl_model_default_params();
    p.kv_type = TL_KV_F16; /* the references ran with f16 KV */
    p.kv_mode = kv_mode;
    p.max_seq_len = max_seq_len;
    tl_model *m = NULL;
    if (tl_model_open(path, p, &m)) return -1;
    int32_t ids[24];
    int ng = tm_greedy_ref(m, n, ids, out);
    tl_model_close(m);
    return ng;
}

/* tl-gen-model ref.gguf --arch phi3 --dim 256 --layers 4 --heads 4
 * --kv-heads 2 --ff 512 --ctx 2048 --window 16 --seed S [--rope-factors
 * --rope-attn-factor 1.19 --rope-orig-ctx N]: ik_llama.cpp's llama-simple
 * (its context 2048) printed exactly these tokens' bytes (2026-12-06). With
 * the factors, a context past rope.scaling.original_context_length (32)
 * takes the long ones and one within it (4096) the short ones. */
static void test_references(void) {
    static const struct {
        const char *what;
        int seed, factors, orig;
        int32_t want[24];
    } refs[] = {
        {"phi3", 1, 0, 0,
         {4, 313, 35, 309, 140, 313, 116, 259, 48, 302, 116, 259, 302, 116, 4, 58, 242, 195, 195, 19, 195, 56, 235, 195}},
        {"phi3, long factors", 1, 1, 32,
         {123, 266, 117, 30, 47, 101, 106, 174, 195, 162, 45, 309, 47, 101, 45, 131, 243, 243, 243, 243, 243, 243,
          243, 243}},
        {"phi3, short factors", 1, 1, 4096,
         {123, 266, 117, 122, 117, 259, 4, 49, 257, 70, 243, 266, 87, 123, 223, 101, 3, 316, 243, 107, 3, 142, 316,
          316}},
    };
    for (size_t r = 0; r < sizeof refs / sizeof refs[0]; r++) {
        tm_spec s = tm_default_spec();
        s.arch = "phi3";
        s.n_embd = 256;
        s.n_head = 4;
        s.n_head_kv = 2;
        s.n_ff = 512;
        s.n_layer = 4;
        s.n_ctx = 2048;
        s.sliding_window = 16;
        s.seed = (uint64_t)refs[r].seed;
        s.rope_factors = refs[r].factors;
        s.rope_attn_factor = refs[r].factors ? 1.19f : 0;
        s.rope_orig_ctx = refs[r].orig;
        const char *path = tmp_path("ref");
        CHECK(tm_write(&s, path) == 0, "the %s model is written", refs[r].what);
        int32_t out[24];
        for (int h = 0; h < 2; h++) {
            int ng = greedy(path, h ? "h" : NULL, 0, 24, out);
            CHECK(ng == 24 && !memcmp(out, refs[r].want, sizeof out), "%s: greedy tokens equal ik_llama.cpp's (%s, %d)",
                  refs[r].what, h ? "store-h KV" : "f16 KV", ng);
        }
        if (refs[r].orig == 32) { /* a 32-position context takes the short factors: the next case's tokens */
            int ng = greedy(path, NULL, 32, 8, out);
            CHECK(ng == 8 && !memcmp(out, refs[r + 1].want, 8 * sizeof *out),
                  "%s: a 32-position context reads the short factors instead (%d tokens)", refs[r].what, ng);
        }
        remove(path);
    }
}

/* Old files without attention.sliding_window: llama.cpp's values for the
 * Phi-3 shapes it knows, a refusal for any other. */
static void test_window_defaults(void) {
    for (int k = 0; k < 2; k++) {
        tm_spec s = tm_default_spec();
        s.arch = "phi3";
        s.n_embd = 32;
        s.n_ff = 32;
        s.n_layer = k ? 32 : 3;
        s.n_ctx = 4096;
        const char *path = tmp_path("window");
        tm_write(&s, path);
        tl_model_params p = tl_model_default_params();
        p.max_seq_len = 64;
        tl_model *m = NULL;
        int rc = tl_model_open(path, p, &m);
        if (k)
            CHECK(rc == 0 && tl_model_layer_window(m, 0) == 2047 && tl_model_layer_window(m, 31) == 2047,
                  "a 32-layer, 4096-context phi3 file without the key gets Phi-3-mini's window of 2047 on every "
                  "layer (%s)",
                  rc ? tl_last_error() : "");
        else
            CHECK(rc == TL_ERR_FORMAT && !m && strstr(tl_last_error(), "phi3.attention.sliding_window is missing"),
                  "a phi3 file of no known shape without the key is refused, naming it (%s)", tl_last_error());
        tl_model_close(m);
        remove(path);
    }
}

/* A qwen3 file relabelled qwen2 keeps Q/K norm tensors qwen2 has no use
 * for: refused, naming the first, as llama.cpp refuses such a file. */
static void test_unused_tensor(void) {
    tm_spec s = tm_default_spec();
    s.arch = "qwen3";
    const char *path = tmp_path("unused");
    tm_write(&s, path);
    CHECK(tm_patch_bytes(path, "qwen3", "qwen2") > 3, "a qwen3 file is relabelled qwen2");
    tl_model *m = NULL;
    int rc = tl_model_open(path, tl_model_default_params(), &m);
    CHECK(rc == TL_ERR_UNSUPPORTED && !m &&
              strstr(tl_last_error(), "tensor 'blk.0.attn_q_norm.weight' is not part of a qwen2"),
          "a tensor the architecture does not read is refused, naming it (%s)", tl_last_error());
    remove(path);
}

int main(void) {
    test_references();
    test_window_defaults();
    test_unused_tensor();
    return test_summary();
}
