/* test_rope_scaling.c - rope.scaling.* as llama.cpp reads them: linear
 * scaling with an attn_factor, and YaRN, against ik_llama.cpp's greedy
 * tokens (on the table path and store-h's recompute), the keys that must
 * change nothing (factor 1, type none), Gemma 3's local layers left
 * unscaled, and clear refusals of what tinyloop does not run (LongRoPE,
 * other types, a negative factor, scaled RoPE on the CUDA plugin). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "test.h"
#include "testmodel.h"
#include "tinyloop.h"

static const char *tmp_path(const char *name) {
    static char buf[4][256];
    static int k;
    char *p = buf[k++ % 4];
    snprintf(p, 256, "/tmp/tl_test_%d_rope_%s.gguf", (int)getpid(), name);
    return p;
}

/* The references ran with f16 KV: pinned, whatever TINYLOOP_KV_* says. */
static tl_model *open_f16(const char *path, const char *kv_mode) {
    tl_model_params p = tl_model_default_params();
    p.kv_type = TL_KV_F16;
    p.kv_mode = kv_mode;
    tl_model *m = NULL;
    tl_model_open(path, p, &m);
    return m;
}

/* Last-token logits of 40 fixed ids through a fresh sequence of the model
 * that `s` describes; 0 on success. */
static int logits_for(const tm_spec *s, float *out) {
    const char *path = tmp_path("logits");
    if (tm_write(s, path)) return -1;
    tl_model *m = open_f16(path, NULL);
    int rc = -1;
    if (m) {
        int32_t toks[40];
        for (int i = 0; i < 40; i++) toks[i] = (int32_t)((i * 37 + 3) % s->n_vocab);
        const int32_t *p = toks;
        int n = 40;
        tl_seq *q = NULL;
        rc = tl_seq_new(m, 0, &q) || tl_batch_forward(m, &q, &p, &n, 1, out);
        tl_seq_free(q);
        tl_model_close(m);
    }
    remove(path);
    return rc;
}

/* A llama model whose angles linear scaling changes a lot (a small base,
 * 40 positions). */
static tm_spec small_llama(void) {
    tm_spec s = tm_default_spec();
    s.rope_base = 100.0f;
    return s;
}

/* tl-gen-model ref.gguf --dim 256 --layers 4 --heads 4 --kv-heads 2
 * --ff 512 --ctx 2048 --seed 7, plus each case's scaling options:
 * ik_llama.cpp's llama-simple (greedy) printed exactly the bytes of these
 * tokens after the prompt (2026-12-06; unscaled, the two cases and linear
 * scaling without the attn_factor each gave other tokens). */
static const struct ref_case {
    const char *what, *type;
    float factor, attn;
    int orig_ctx;
    int32_t want[24];
    float freq_scale, attn_factor; /* what info must report */
} refs[] = {
    {"linear x4, attn_factor 1.3", "linear", 4.0f, 1.3f, 0,
     {31, 31, 31, 31, 31, 298, 31, 31, 31, 31, 51, 31, 298, 31, 298, 31, 285, 119, 284, 285, 82, 112, 138, 72},
     0.25f, 1.3f},
    {"yarn x4 from 256 positions", "yarn", 4.0f, 0, 256,
     {116, 170, 213, 219, 308, 310, 71, 284, 219, 123, 51, 285, 131, 266, 175, 317, 82, 112, 31, 285, 213, 285, 216, 219},
     0.25f, 0},
};

static void test_reference(void) {
    for (size_t r = 0; r < sizeof refs / sizeof refs[0]; r++) {
        tm_spec s = tm_default_spec();
        s.n_embd = 256;
        s.n_head = 4;
        s.n_head_kv = 2;
        s.n_ff = 512;
        s.n_layer = 4;
        s.n_ctx = 2048;
        s.seed = 7;
        s.rope_scaling = refs[r].type;
        s.rope_factor = refs[r].factor;
        s.rope_attn_factor = refs[r].attn;
        s.rope_orig_ctx = refs[r].orig_ctx;
        const char *path = tmp_path("ref");
        CHECK(tm_write(&s, path) == 0, "the %s model is written", refs[r].what);
        for (int mode = 0; mode < 2; mode++) {
            tl_model *m = open_f16(path, mode ? "h" : NULL);
            CHECK(m != NULL, "the %s model opens (%s)", refs[r].what, m ? "" : tl_last_error());
            if (!m) continue;
            tl_model_info info;
            tl_model_get_info(m, &info);
            /* YaRN's attn_factor is 1 + 0.1 ln 4 */
            float want_attn = refs[r].attn_factor > 0 ? refs[r].attn_factor : 1.0f + 0.1f * logf(4.0f);
            CHECK(info.rope_freq_scale == refs[r].freq_scale && info.rope_attn_factor == want_attn,
                  "%s: info reports freq_scale %g, attn_factor %g", refs[r].what, info.rope_freq_scale,
                  info.rope_attn_factor);
            int32_t ids[24], out[24];
            int ng = tm_greedy_ref(m, 24, ids, out);
            CHECK(ng == 24 && !memcmp(out, refs[r].want, sizeof out), "%s: greedy tokens equal ik_llama.cpp's (%s, %d)",
                  refs[r].what, mode ? "store-h KV" : "f16 KV", ng);
            tl_model_close(m);
        }

        /* the CUDA plugin ropes unscaled: forced, it refuses; auto stays on the CPU */
        setenv("TINYLOOP_BACKEND", "cuda", 1);
        tl_model *m = NULL;
        int rc = tl_model_open(path, tl_model_default_params(), &m);
        unsetenv("TINYLOOP_BACKEND");
        CHECK(rc == TL_ERR_UNSUPPORTED && !m && strstr(tl_last_error(), "scaled RoPE (freq_scale 0.25"),
              "TINYLOOP_BACKEND=cuda refuses %s, saying why (%s)", refs[r].what, tl_last_error());
        tl_model_close(m);
        remove(path);
    }
}

/* Keys that must not change a bit, and the scaling that must. */
static void test_neutral_and_effective(void) {
    float plain[320], l[320];
    tm_spec s = small_llama();
    CHECK(logits_for(&s, plain) == 0, "the unscaled model runs");
    s.rope_scaling = "linear";
    s.rope_factor = 1.0f;
    CHECK(logits_for(&s, l) == 0 && !memcmp(l, plain, sizeof l), "linear scaling by 1 is bitwise no scaling");
    s.rope_scaling = "none";
    s.rope_factor = 4.0f;
    CHECK(logits_for(&s, l) == 0 && !memcmp(l, plain, sizeof l), "type none ignores a factor of 4 (llama.cpp's rule)");
    s.rope_scaling = NULL;
    float scaled[320];
    CHECK(logits_for(&s, scaled) == 0 && test_nmse(scaled, plain, 320) > 1e-4,
          "a factor alone (type linear by default) changes the logits (nmse %g)", test_nmse(scaled, plain, 320));
    s.rope_scaling = "linear";
    CHECK(logits_for(&s, l) == 0 && !memcmp(l, scaled, sizeof l), "... exactly as the explicit type linear does");
    s.rope_attn_factor = 1.5f;
    CHECK(logits_for(&s, l) == 0 && test_nmse(l, scaled, 320) > 1e-4, "an attn_factor changes them too (nmse %g)",
          test_nmse(l, scaled, 320));

    /* Gemma 3: local layers keep base 10000 unscaled; layer 6 of 6 is the
     * first global one, so 5 layers ignore the factor and 6 do not */
    for (int layers = 5; layers <= 6; layers++) {
        tm_spec g = tm_default_spec();
        g.arch = "gemma3";
        g.n_embd = 256;
        g.n_head = 4;
        g.n_head_kv = 2;
        g.n_ff = 512;
        g.n_layer = layers;
        g.sliding_window = 16;
        g.rope_base = 100.0f;
        float a[320], b[320];
        int rc = logits_for(&g, a);
        g.rope_factor = 8.0f;
        rc |= logits_for(&g, b);
        double e = test_nmse(b, a, 320);
        if (layers == 5)
            CHECK(rc == 0 && !memcmp(a, b, sizeof a), "gemma3's sliding-window layers ignore the factor (nmse %g)", e);
        else
            CHECK(rc == 0 && e > 1e-6, "gemma3's global layer applies it (nmse %g)", e);
    }
}

static void test_refusals(void) {
    static const struct {
        const char *type;
        float factor, attn;
        int rc;
        const char *msg;
    } cases[] = {
        {"longrope", 0, 0, TL_ERR_UNSUPPORTED, "llama.rope.scaling.type 'longrope' (factor 0) is not supported"},
        {"dynamic", 2.0f, 0, TL_ERR_UNSUPPORTED, "'dynamic' (factor 2)"},
        {"Linear", 2.0f, 0, TL_ERR_UNSUPPORTED, "'Linear' (factor 2)"},
        {NULL, -2.0f, 0, TL_ERR_FORMAT, "RoPE scaling factor -2 / attn_factor 1 must be >= 0 / > 0"},
        {"linear", 2.0f, -1.0f, TL_ERR_FORMAT, "attn_factor -1 must be"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tm_spec s = tm_default_spec();
        s.rope_scaling = cases[i].type;
        s.rope_factor = cases[i].factor;
        s.rope_attn_factor = cases[i].attn;
        const char *path = tmp_path("bad");
        tm_write(&s, path);
        tl_model *m = NULL;
        int rc = tl_model_open(path, tl_model_default_params(), &m);
        CHECK(rc == cases[i].rc && !m && strstr(tl_last_error(), cases[i].msg), "scaling %s / %g / %g is refused: %s",
              cases[i].type ? cases[i].type : "(no type)", cases[i].factor, cases[i].attn, tl_last_error());
        tl_model_close(m);
        remove(path);
    }
}

int main(void) {
    test_reference();
    test_neutral_and_effective();
    test_refusals();
    return test_summary();
}
