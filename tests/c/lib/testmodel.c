#include "testmodel.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "gguf_writer.h"
#include "quants.h"
#include "tinyloop.h"

int tm_arch_cases(tm_spec *c, const char **names) {
    static const char *const n[TM_ARCH_CASES] = {"llama f32", "llama loop q4_0", "qwen2 bias q8_0", "gemma3 swa q4_k",
                                                 "qwen3 q8_0 head 32"};
    for (int i = 0; i < TM_ARCH_CASES; i++) {
        c[i] = tm_default_spec();
        names[i] = n[i];
    }
    c[1].type = TL_TYPE_Q4_0;
    c[1].n_layer = 3;
    c[1].loop_start = 1;
    c[1].loop_end = 3;
    c[1].loop_default = 2;
    c[1].seed = 7;
    c[2].arch = "qwen2";
    c[2].bias = 1;
    c[2].type = TL_TYPE_Q8_0;
    c[2].seed = 3;
    c[3].arch = "gemma3";
    c[3].sliding_window = 8;
    c[3].n_layer = 6;
    c[3].n_embd = 256;
    c[3].n_head = 4;
    c[3].n_head_kv = 1;
    c[3].n_ff = 512;
    c[3].type = TL_TYPE_Q4_K;
    c[3].seed = 5;
    c[4].arch = "qwen3"; /* Q/K norms; heads of 32 on a width of 64 (q_dim 128) */
    c[4].head_dim = 32;
    c[4].type = TL_TYPE_Q8_0;
    c[4].seed = 6;
    return TM_ARCH_CASES;
}

/* What each architecture's files hold, as llama.cpp's converter writes them. */
typedef struct {
    const char *name;
    unsigned layer_norm : 1;  /* LayerNorm: its epsilon key, norm biases */
    unsigned qkv_fused : 1;   /* attn_qkv (and its bias with matmul_bias or qkv_bias) */
    unsigned qkv_bias : 1;    /* a fused QKV's bias without the other matmuls' (qwen) */
    unsigned ff_twice : 1;    /* feed_forward_length written as twice n_ff (qwen) */
    unsigned qkv_split : 1;   /* attn_q/k/v (and biases) drawn as one fused attn_qkv, then split by
                                 rows: the same network as the fused recipe with the same seed */
    unsigned gate_up : 1;     /* gate and up rows in one ffn_up (phi3) */
    unsigned plain_ffn : 1;   /* ffn_up, ffn_down; no gate */
    unsigned qk_norm : 1;     /* attn_q_norm / attn_k_norm */
    unsigned post_norms : 1;  /* post_attention_norm / post_ffw_norm */
    unsigned gemma : 1;       /* tied, key_length written */
    unsigned window : 1;      /* attention.sliding_window written when set */
    unsigned softcap : 1;     /* gemma2's soft-capping keys */
    unsigned learned_pos : 1; /* position_embd */
    unsigned matmul_bias : 1; /* attn_output, ffn_up and ffn_down biases (and a fused QKV's) */
    unsigned one_norm : 1;    /* no ffn_norm: the FFN reads the attention's norm (phi2) */
    unsigned output_bias : 1; /* output.bias */
    unsigned par_key : 1;     /* use_parallel_residual (gptneox) */
    unsigned norm_free : 1;   /* no norm tensors at all: LayerNorms without weight or bias (olmo) */
    unsigned multipliers : 1; /* granite's four keys, with values like Granite 3's */
    unsigned ln_no_bias : 1;  /* LayerNorms with a weight only (command-r, mpt) */
    unsigned tok_norm : 1;    /* token_embd_norm weight and bias (bloom) */
    unsigned alibi_key : 1;   /* attention.max_alibi_bias written, 8 (mpt) */
    unsigned tied_out : 1;    /* no output.weight (command-r) */
    unsigned logit_scale : 1; /* logit_scale written (command-r: 0.0625) */
    unsigned qk_full : 1;     /* attn_q_norm / attn_k_norm over the whole Q / K row (olmo2) */
    unsigned no_pre_norm : 1; /* no attn_norm / ffn_norm (olmo2: post norms only) */
    unsigned moe : 1;         /* with expert_count: experts instead of the dense FFN */
    unsigned moe_keys : 1;    /* expert_feed_forward_length written (qwen2moe, qwen3moe) */
    unsigned shexp : 1;       /* a shared expert and its gate (qwen2moe) */
    unsigned shexp_plain : 1; /* with n_ff_shexp: an ungated shared expert (granitemoe) */
} tm_recipe;

static const tm_recipe recipes[] = {
    {.name = "llama", .moe = 1},
    {.name = "internlm2"},
    {.name = "xverse"},
    {.name = "ernie4_5"},
    {.name = "mistral3"},
    {.name = "olmo", .layer_norm = 1, .norm_free = 1},
    {.name = "bloom", .layer_norm = 1, .qkv_fused = 1, .plain_ffn = 1, .matmul_bias = 1, .tok_norm = 1, .tied_out = 1},
    {.name = "mpt", .layer_norm = 1, .ln_no_bias = 1, .qkv_fused = 1, .plain_ffn = 1, .tied_out = 1, .alibi_key = 1},
    {.name = "command-r", .layer_norm = 1, .ln_no_bias = 1, .tied_out = 1, .one_norm = 1, .logit_scale = 1},
    {.name = "cohere2", .layer_norm = 1, .ln_no_bias = 1, .tied_out = 1, .one_norm = 1, .logit_scale = 1,
     .window = 1},
    {.name = "olmo2", .qk_norm = 1, .qk_full = 1, .post_norms = 1, .no_pre_norm = 1},
    {.name = "olmoe", .qk_norm = 1, .qk_full = 1, .moe = 1},
    {.name = "granite", .multipliers = 1},
    {.name = "granitemoe", .multipliers = 1, .moe = 1, .shexp_plain = 1},
    {.name = "qwen", .qkv_fused = 1, .qkv_bias = 1, .ff_twice = 1},
    {.name = "qwen2"},
    {.name = "qwen3", .qk_norm = 1},
    {.name = "qwen2moe", .moe = 1, .moe_keys = 1, .shexp = 1},
    {.name = "qwen3moe", .qk_norm = 1, .moe = 1, .moe_keys = 1},
    {.name = "smollm3"},
    {.name = "gemma", .gemma = 1},
    {.name = "gemma2", .gemma = 1, .post_norms = 1, .window = 1, .softcap = 1},
    {.name = "gemma3", .gemma = 1, .post_norms = 1, .window = 1, .qk_norm = 1},
    {.name = "phi3", .qkv_fused = 1, .gate_up = 1, .window = 1},
    {.name = "gpt2", .layer_norm = 1, .qkv_fused = 1, .plain_ffn = 1, .learned_pos = 1, .matmul_bias = 1},
    {.name = "starcoder", .layer_norm = 1, .qkv_fused = 1, .plain_ffn = 1, .learned_pos = 1, .matmul_bias = 1},
    {.name = "stablelm", .layer_norm = 1},
    {.name = "starcoder2", .layer_norm = 1, .qkv_split = 1, .plain_ffn = 1, .matmul_bias = 1},
    {.name = "gptneox", .layer_norm = 1, .qkv_fused = 1, .plain_ffn = 1, .matmul_bias = 1, .par_key = 1},
    {.name = "falcon", .layer_norm = 1, .qkv_fused = 1, .plain_ffn = 1, .one_norm = 1},
    {.name = "phi2", .layer_norm = 1, .qkv_fused = 1, .plain_ffn = 1, .matmul_bias = 1, .one_norm = 1,
     .output_bias = 1},
};

static const tm_recipe *recipe(const char *name) {
    for (size_t i = 0; i < sizeof recipes / sizeof recipes[0]; i++)
        if (!strcmp(recipes[i].name, name ? name : "llama")) return &recipes[i];
    return NULL;
}

int tm_arch_known(const char *name) { return recipe(name) != NULL; }

int tm_spec_tied(const tm_spec *s) {
    const tm_recipe *r = recipe(s->arch);
    return s->tied || (r && (r->gemma || r->tied_out));
}

tm_spec tm_default_spec(void) {
    tm_spec s;
    memset(&s, 0, sizeof s);
    s.n_vocab = 320;
    s.n_embd = 64;
    s.n_layer = 2;
    s.n_head = 4;
    s.n_head_kv = 2;
    s.n_ff = 128;
    s.n_ctx = 256;
    s.type = TL_TYPE_F32;
    s.seed = 1;
    return s;
}

static uint64_t mix(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* Deterministic uniform values in [-scale, scale) for one tensor. */
static void fill(float *v, int64_t n, uint64_t seed, float scale, float offset) {
    uint64_t s = mix(seed);
    for (int64_t i = 0; i < n; i++) {
        s = mix(s);
        v[i] = offset + scale * ((float)(s >> 40) / (float)(1 << 24) * 2.0f - 1.0f);
    }
}

/* One matrix of n_in columns drawn from the seed, in the spec's weight
 * type, written as k tensors of rows[i] consecutive rows each (k = 1: the
 * whole matrix; starcoder2's Q, K and V: the rows of one fused QKV). */
static int add_matrix_parts(gguf_writer *gw, const tm_spec *s, const char *const *names, const int64_t *rows,
                            int k, int64_t n_in, uint64_t seed, int type, float gain) {
    int64_t n_out = 0;
    for (int i = 0; i < k; i++) n_out += rows[i];
    int64_t n = n_in * n_out;
    float *v = malloc((size_t)n * sizeof *v);
    if (!v) return -1;
    fill(v, n, seed, 1.0f / sqrtf((float)n_in) * 1.7f * gain, 0.0f);
    size_t row = tl_row_size(type, n_in);
    if (!row) {
        fprintf(stderr, "testmodel: %s: row of %lld is not a multiple of the %s block\n", names[0], (long long)n_in,
                tl_type_info(type)->name);
        free(v);
        return -1;
    }
    uint8_t *q = malloc(row * (size_t)n_out);
    if (!q) { free(v); return -1; }
    for (int64_t r = 0; r < n_out; r++) tl_quantize_row(type, v + r * n_in, q + r * row, n_in);
    const int twin = s->twin_f32 && type != TL_TYPE_F32;
    if (twin)
        for (int64_t r = 0; r < n_out; r++) tl_dequantize_row(type, q + r * row, v + r * n_in, n_in);
    int rc = 0;
    for (int i = 0, r0 = 0; i < k; r0 += (int)rows[i++]) {
        int64_t ne[2] = {n_in, rows[i]};
        if (twin)
            rc |= gw_add_tensor(gw, names[i], TL_TYPE_F32, 2, ne, v + (size_t)r0 * n_in,
                                (size_t)(rows[i] * n_in) * sizeof(float)) < 0;
        else
            rc |= gw_add_tensor(gw, names[i], type, 2, ne, q + (size_t)r0 * row, row * (size_t)rows[i]) < 0;
    }
    free(q);
    free(v);
    return rc ? -1 : 0;
}

/* Adds one tensor of `n_out` rows of `n_in`, in the spec's weight type. */
static int add_matrix(gguf_writer *gw, const tm_spec *s, const char *name, int64_t n_in, int64_t n_out,
                      uint64_t seed, int type) {
    return add_matrix_parts(gw, s, &name, &n_out, 1, n_in, seed, type, 1.0f);
}

/* n_expert matrices of n_out rows of n_in, each drawn from its own seed,
 * as one 3-D tensor [n_in, n_out, n_expert] in the spec's weight type. */
static int add_experts(gguf_writer *gw, const tm_spec *s, const char *name, int64_t n_in, int64_t n_out,
                       uint64_t seed) {
    const int E = s->expert_count, type = s->twin_f32 ? TL_TYPE_F32 : s->type;
    const size_t row = tl_row_size(s->type, n_in), out_row = tl_row_size(type, n_in);
    float *v = malloc((size_t)(n_in * n_out) * sizeof *v);
    uint8_t *q = malloc(row * (size_t)n_out), *all = malloc(out_row * (size_t)n_out * (size_t)E);
    int rc = !v || !q || !all || !row;
    for (int e = 0; e < E && !rc; e++) {
        fill(v, n_in * n_out, seed * 131 + (uint64_t)e, 1.0f / sqrtf((float)n_in) * 1.7f, 0.0f);
        uint8_t *dst = all + out_row * (size_t)n_out * (size_t)e;
        for (int64_t r = 0; r < n_out; r++) {
            tl_quantize_row(s->type, v + r * n_in, q + r * row, n_in);
            if (type == TL_TYPE_F32) tl_dequantize_row(s->type, q + r * row, (float *)dst + r * n_in, n_in);
            else memcpy(dst + r * row, q + r * row, row);
        }
    }
    int64_t ne[3] = {n_in, n_out, E};
    if (!rc) rc = gw_add_tensor(gw, name, type, 3, ne, all, out_row * (size_t)n_out * (size_t)E) < 0;
    free(v);
    free(q);
    free(all);
    return rc ? -1 : 0;
}

/* An f32 vector of values offset +- scale, written as k tensors of lens[i]
 * consecutive values each. */
static int add_vector_parts(gguf_writer *gw, const char *const *names, const int64_t *lens, int k, uint64_t seed,
                            float scale, float offset) {
    int64_t n = 0;
    for (int i = 0; i < k; i++) n += lens[i];
    float *v = malloc((size_t)n * sizeof *v);
    if (!v) return -1;
    fill(v, n, seed, scale, offset);
    int rc = 0;
    for (int i = 0, at = 0; i < k; at += (int)lens[i++])
        rc |= gw_add_tensor(gw, names[i], TL_TYPE_F32, 1, &lens[i], v + at, (size_t)lens[i] * sizeof(float)) < 0;
    free(v);
    return rc ? -1 : 0;
}

static int add_vector(gguf_writer *gw, const char *name, int64_t n, uint64_t seed, float scale, float offset) {
    return add_vector_parts(gw, &name, &n, 1, seed, scale, offset);
}

/* A norm weight around 1, and a bias around 0. */
static int add_norm(gguf_writer *gw, const char *name, int64_t n, uint64_t seed) {
    return add_vector(gw, name, n, seed, 0.2f, 1.0f);
}
static int add_bias(gguf_writer *gw, const char *name, int64_t n, uint64_t seed) {
    return add_vector(gw, name, n, seed, 0.1f, 0.0f);
}

/* A SentencePiece vocab: <unk> <s> </s>, 256 byte tokens, then pieces. */
static void add_vocab(gguf_writer *gw, int n_vocab) {
    char **toks = calloc((size_t)n_vocab, sizeof *toks);
    float *scores = calloc((size_t)n_vocab, sizeof *scores);
    int32_t *types = calloc((size_t)n_vocab, sizeof *types);
    static const char *letters = "etaoinshrdlucmfwypvbgkjqxz";
    for (int i = 0; i < n_vocab; i++) {
        char buf[32];
        if (i == 0) snprintf(buf, sizeof buf, "<unk>"), types[i] = 2;
        else if (i == 1) snprintf(buf, sizeof buf, "<s>"), types[i] = 3;
        else if (i == 2) snprintf(buf, sizeof buf, "</s>"), types[i] = 3;
        else if (n_vocab >= 260 && i < 3 + 256) snprintf(buf, sizeof buf, "<0x%02X>", i - 3), types[i] = 6;
        else {
            int k = n_vocab >= 260 ? i - 259 : i - 3; /* a tiny vocab (beam tests) has no byte tokens */
            /* "\xe2\x96\x81" is U+2581, SentencePiece's space marker. */
            if (k < 26) snprintf(buf, sizeof buf, "\xe2\x96\x81%c", letters[k]);
            else if (k < 26 + 26 * 26) snprintf(buf, sizeof buf, "%c%c", letters[(k - 26) % 26], letters[(k - 26) / 26]);
            else snprintf(buf, sizeof buf, "\xe2\x96\x81%c%d", letters[k % 26], k); /* unique: k is */
            types[i] = 1;
            scores[i] = -(float)k;
        }
        toks[i] = strdup(buf);
    }
    gw_set_str(gw, "tokenizer.ggml.model", "llama");
    gw_set_arr_str(gw, "tokenizer.ggml.tokens", (const char *const *)toks, (size_t)n_vocab);
    gw_set_arr_f32(gw, "tokenizer.ggml.scores", scores, (size_t)n_vocab);
    gw_set_arr_i32(gw, "tokenizer.ggml.token_type", types, (size_t)n_vocab);
    gw_set_u32(gw, "tokenizer.ggml.bos_token_id", 1);
    gw_set_u32(gw, "tokenizer.ggml.eos_token_id", 2);
    gw_set_u32(gw, "tokenizer.ggml.unknown_token_id", 0);
    for (int i = 0; i < n_vocab; i++) free(toks[i]);
    free(toks);
    free(scores);
    free(types);
}

int tm_write(const tm_spec *s, const char *path) {
    if (s->n_vocab < 4) {
        fprintf(stderr, "testmodel: n_vocab %d < 4 (unk, bos, eos and one word)\n", s->n_vocab);
        return -1;
    }
    const tm_recipe *found = recipe(s->arch);
    if (!found) {
        fprintf(stderr, "testmodel: unknown architecture '%s'\n", s->arch);
        return -1;
    }
    tm_recipe r = *found;
    if (s->matmul_bias) r.matmul_bias = 1;
    gguf_writer *gw = gw_new();
    int hd = s->head_dim ? s->head_dim : s->n_embd / s->n_head;
    int looped = s->loop_end > s->loop_start;
    int core = s->loop_end - s->loop_start;
    int n_written = s->n_layer + (looped && s->unroll > 0 ? core * (s->unroll - 1) : 0);
    const char *arch = r.name;
    char key[96];
#define KEY(suffix) (snprintf(key, sizeof key, "%s.%s", arch, suffix), key)
    gw_set_str(gw, "general.architecture", arch);
    gw_set_str(gw, "general.name", "tinyloop synthetic");
    gw_set_u32(gw, KEY("context_length"), (uint32_t)s->n_ctx);
    gw_set_u32(gw, KEY("embedding_length"), (uint32_t)s->n_embd);
    gw_set_u32(gw, KEY("block_count"), (uint32_t)n_written);
    gw_set_u32(gw, KEY("feed_forward_length"), (uint32_t)(r.ff_twice ? 2 * s->n_ff : s->n_ff));
    gw_set_u32(gw, KEY("rope.dimension_count"), (uint32_t)(s->rope_dims > 0 ? s->rope_dims : hd));
    gw_set_u32(gw, KEY("attention.head_count"), (uint32_t)s->n_head);
    gw_set_u32(gw, KEY("attention.head_count_kv"), (uint32_t)s->n_head_kv);
    gw_set_f32(gw, KEY(r.layer_norm ? "attention.layer_norm_epsilon" : "attention.layer_norm_rms_epsilon"), 1e-5f);
    if (s->rope_base > 0) gw_set_f32(gw, KEY("rope.freq_base"), s->rope_base);
    const int moe = r.moe && s->expert_count > 0, shexp_ff = s->n_ff_shexp > 0 ? s->n_ff_shexp : s->n_ff;
    if (s->expert_count > 0) gw_set_u32(gw, KEY("expert_count"), (uint32_t)s->expert_count);
    if (moe) gw_set_u32(gw, KEY("expert_used_count"), (uint32_t)(s->expert_used > 0 ? s->expert_used : 2));
    if (moe && r.moe_keys) gw_set_u32(gw, KEY("expert_feed_forward_length"), (uint32_t)s->n_ff);
    const int shexp = moe && (r.shexp || (r.shexp_plain && s->n_ff_shexp > 0));
    if (shexp) gw_set_u32(gw, KEY("expert_shared_feed_forward_length"), (uint32_t)shexp_ff);
    if (s->rope_scaling) gw_set_str(gw, KEY("rope.scaling.type"), s->rope_scaling);
    if (s->rope_factor != 0) gw_set_f32(gw, KEY("rope.scaling.factor"), s->rope_factor);
    if (s->rope_attn_factor != 0) gw_set_f32(gw, KEY("rope.scaling.attn_factor"), s->rope_attn_factor);
    if (s->rope_orig_ctx > 0) gw_set_u32(gw, KEY("rope.scaling.original_context_length"), (uint32_t)s->rope_orig_ctx);
    if (r.gemma || s->head_dim) gw_set_u32(gw, KEY("attention.key_length"), (uint32_t)hd);
    if (s->head_dim) gw_set_u32(gw, KEY("attention.value_length"), (uint32_t)hd);
    if (r.window && s->sliding_window > 0) gw_set_u32(gw, KEY("attention.sliding_window"), (uint32_t)s->sliding_window);
    if (s->extra_key) gw_set_f32(gw, KEY(s->extra_key), s->extra_value);
    if (r.multipliers) {
        gw_set_f32(gw, KEY("embedding_scale"), 12.0f);
        gw_set_f32(gw, KEY("residual_scale"), 0.22f);
        gw_set_f32(gw, KEY("attention.scale"), 0.2f);
        gw_set_f32(gw, KEY("logit_scale"), 4.0f);
    }
    if (r.logit_scale) gw_set_f32(gw, KEY("logit_scale"), 0.0625f);
    if (r.alibi_key) gw_set_f32(gw, KEY("attention.max_alibi_bias"), 8.0f);
    if (r.par_key) gw_set_bool(gw, KEY("use_parallel_residual"), !s->sequential);
    if (r.softcap) {
        gw_set_f32(gw, KEY("attn_logit_softcapping"), s->attn_softcap > 0 ? s->attn_softcap : 50.0f);
        gw_set_f32(gw, KEY("final_logit_softcapping"), s->final_softcap > 0 ? s->final_softcap : 30.0f);
    }
#undef KEY
    if (looped && s->unroll <= 0) {
        gw_set_u32(gw, "tinyloop.loop_start", (uint32_t)s->loop_start);
        gw_set_u32(gw, "tinyloop.loop_end", (uint32_t)s->loop_end);
        gw_set_u32(gw, "tinyloop.loop_default", (uint32_t)(s->loop_default > 0 ? s->loop_default : 1));
    }
    add_vocab(gw, s->n_vocab);

    int rc = 0, q_dim = hd * s->n_head, kv_dim = hd * s->n_head_kv;
    uint64_t seed = s->seed * 1000003ull;
    const char *embd = "token_embd.weight";
    const int64_t n_vocab = s->n_vocab;
    rc |= add_matrix_parts(gw, s, &embd, &n_vocab, 1, s->n_embd, seed + 1, s->type,
                           s->embd_gain > 0 ? s->embd_gain : 1.0f);
    if (!r.norm_free) rc |= add_norm(gw, "output_norm.weight", s->n_embd, seed + 2);
    if (s->rope_factors) { /* per-pair divisors, distinct for long and short, 1-4 as LongRoPE's are */
        float *f = malloc((size_t)hd / 2 * sizeof *f);
        int64_t ne[1] = {hd / 2};
        for (int k = 0; k < 2 && f; k++) {
            for (int i = 0; i < hd / 2; i++) f[i] = 1.0f + (float)i * (k ? 3.0f : 1.0f) / (float)(hd / 2);
            rc |= gw_add_tensor(gw, k ? "rope_factors_long.weight" : "rope_factors_short.weight", TL_TYPE_F32, 1, ne, f,
                                (size_t)hd / 2 * sizeof *f) < 0;
        }
        rc |= !f;
        free(f);
    }
    const int ln_bias = r.layer_norm && !r.norm_free && !r.ln_no_bias;
    if (ln_bias) rc |= add_bias(gw, "output_norm.bias", s->n_embd, seed + 4);
    if (r.tok_norm) {
        rc |= add_norm(gw, "token_embd_norm.weight", s->n_embd, seed + 7);
        rc |= add_bias(gw, "token_embd_norm.bias", s->n_embd, seed + 8);
    }
    if (r.learned_pos) rc |= add_matrix(gw, s, "position_embd.weight", s->n_embd, s->n_ctx, seed + 5, s->type);
    if (!tm_spec_tied(s)) rc |= add_matrix(gw, s, "output.weight", s->n_embd, s->n_vocab, seed + 3, s->type);
    if (r.output_bias) rc |= add_bias(gw, "output.bias", s->n_vocab, seed + 6);
    for (int l = 0; l < n_written && rc == 0; l++) {
        /* physical layer whose weights written layer l carries */
        int p = l;
        if (looped && s->unroll > 0 && l >= s->loop_start) {
            int span = core * s->unroll;
            p = l < s->loop_start + span ? s->loop_start + (l - s->loop_start) % core : l - span + core;
        }
        uint64_t ls = seed + 100 + (uint64_t)p * 16;
        char n[64], qkv_names[6][64];
        const char *qkv_w[3] = {qkv_names[0], qkv_names[1], qkv_names[2]};
        const char *qkv_b[3] = {qkv_names[3], qkv_names[4], qkv_names[5]};
        const int64_t qkv_rows[3] = {q_dim, kv_dim, kv_dim};
        for (int i = 0; i < 6; i++) /* starcoder2's split Q, K, V weights and biases */
            snprintf(qkv_names[i], sizeof qkv_names[i], "blk.%d.attn_%c.%s", l, "qkv"[i % 3],
                     i < 3 ? "weight" : "bias");
#define NAME(x) (snprintf(n, sizeof n, "blk.%d.%s.weight", l, x), n)
        if (!r.norm_free && !r.no_pre_norm) rc |= add_norm(gw, NAME("attn_norm"), s->n_embd, ls + 0);
        if (r.qkv_split) {
            rc |= add_matrix_parts(gw, s, qkv_w, qkv_rows, 3, s->n_embd, ls + 1, s->type, 1.0f);
        } else if (r.qkv_fused) {
            rc |= add_matrix(gw, s, NAME("attn_qkv"), s->n_embd, q_dim + 2 * kv_dim, ls + 1, s->type);
        } else {
            rc |= add_matrix(gw, s, NAME("attn_q"), s->n_embd, q_dim, ls + 1, s->type);
            rc |= add_matrix(gw, s, NAME("attn_k"), s->n_embd, kv_dim, ls + 2, s->type);
            rc |= add_matrix(gw, s, NAME("attn_v"), s->n_embd, kv_dim, ls + 3, s->type);
        }
        rc |= add_matrix(gw, s, NAME("attn_output"), q_dim, s->n_embd, ls + 4, s->type);
        if (!r.one_norm && !r.norm_free && !r.no_pre_norm) rc |= add_norm(gw, NAME("ffn_norm"), s->n_embd, ls + 5);
        if (moe) { /* the router stays F32, as llama.cpp's quantizer leaves it */
            rc |= add_matrix(gw, s, NAME("ffn_gate_inp"), s->n_embd, s->expert_count, ls + 6, TL_TYPE_F32);
            rc |= add_experts(gw, s, NAME("ffn_gate_exps"), s->n_embd, s->n_ff, ls + 7);
            rc |= add_experts(gw, s, NAME("ffn_up_exps"), s->n_embd, s->n_ff, ls + 8);
            rc |= add_experts(gw, s, NAME("ffn_down_exps"), s->n_ff, s->n_embd, ls + 9);
            if (shexp) {
                if (r.shexp) rc |= add_vector(gw, NAME("ffn_gate_inp_shexp"), s->n_embd, ls + 10, 0.3f, 0.0f);
                rc |= add_matrix(gw, s, NAME("ffn_gate_shexp"), s->n_embd, shexp_ff, ls + 11, s->type);
                rc |= add_matrix(gw, s, NAME("ffn_up_shexp"), s->n_embd, shexp_ff, ls + 12, s->type);
                rc |= add_matrix(gw, s, NAME("ffn_down_shexp"), shexp_ff, s->n_embd, ls + 13, s->type);
            }
        } else if (r.gate_up) {
            rc |= add_matrix(gw, s, NAME("ffn_up"), s->n_embd, 2 * s->n_ff, ls + 7, s->type);
        } else if (r.plain_ffn) {
            rc |= add_matrix(gw, s, NAME("ffn_up"), s->n_embd, s->n_ff, ls + 7, s->type);
        } else {
            rc |= add_matrix(gw, s, NAME("ffn_gate"), s->n_embd, s->n_ff, ls + 6, s->type);
            rc |= add_matrix(gw, s, NAME("ffn_up"), s->n_embd, s->n_ff, ls + 7, s->type);
        }
        if (!moe) rc |= add_matrix(gw, s, NAME("ffn_down"), s->n_ff, s->n_embd, ls + 8, s->type);
#define BIAS(x) (snprintf(n, sizeof n, "blk.%d.%s.bias", l, x), n)
        if (ln_bias) rc |= add_bias(gw, BIAS("attn_norm"), s->n_embd, ls + 9);
        if ((r.matmul_bias || r.qkv_bias) && r.qkv_fused) rc |= add_bias(gw, BIAS("attn_qkv"), q_dim + 2 * kv_dim, ls + 10);
        if (r.matmul_bias && r.qkv_split) rc |= add_vector_parts(gw, qkv_b, qkv_rows, 3, ls + 10, 0.1f, 0.0f);
        if (r.matmul_bias) rc |= add_bias(gw, BIAS("attn_output"), s->n_embd, ls + 11);
        if (ln_bias && !r.one_norm) rc |= add_bias(gw, BIAS("ffn_norm"), s->n_embd, ls + 12);
        if (r.matmul_bias) {
            rc |= add_bias(gw, BIAS("ffn_up"), s->n_ff, ls + 13);
            rc |= add_bias(gw, BIAS("ffn_down"), s->n_embd, ls + 14);
        }
#undef BIAS
        if (s->bias) {
            float scale = s->bias == 1 ? 1.0f : 0.0f;
            char bn[64];
            const char *which[3] = {"attn_q", "attn_k", "attn_v"};
            int dims[3] = {q_dim, kv_dim, kv_dim};
            for (int b = 0; b < 3; b++) {
                float *v = malloc((size_t)dims[b] * sizeof *v);
                fill(v, dims[b], ls + 13 + (uint64_t)b, 0.3f * scale, 0.0f);
                snprintf(bn, sizeof bn, "blk.%d.%s.bias", l, which[b]);
                int64_t ne[1] = {dims[b]};
                rc |= gw_add_tensor(gw, bn, TL_TYPE_F32, 1, ne, v, (size_t)dims[b] * sizeof(float)) < 0;
                free(v);
            }
        }
        if (r.qk_norm) {
            rc |= add_norm(gw, NAME("attn_q_norm"), r.qk_full ? q_dim : hd, ls + 9);
            rc |= add_norm(gw, NAME("attn_k_norm"), r.qk_full ? kv_dim : hd, ls + 10);
        }
        if (r.post_norms) {
            rc |= add_norm(gw, NAME("post_attention_norm"), s->n_embd, ls + 11);
            rc |= add_norm(gw, NAME("post_ffw_norm"), s->n_embd, ls + 12);
        }
#undef NAME
    }
    if (rc == 0 && gw_write_file(gw, path) != 0) {
        perror(path);
        rc = -1;
    }
    gw_free(gw);
    return rc ? -1 : 0;
}

int tm_greedy_ref(tl_model *m, int n, int32_t ids[24], int32_t *out) {
    static const char text[] = "the cat sat on the mat and then it ran";
    if (tl_tokenize(m, text, (int)strlen(text), 1, 0, ids, 24) != 24) return -1;
    tl_generate_params gp = tl_generate_default_params();
    gp.max_tokens = n;
    gp.ignore_eos = 1;
    return tl_generate(m, ids, 24, gp, out, n);
}

/* Writes the n bytes `with` at `skip` past the first (all: every)
 * occurrence of `find` in the first 1 MiB of a file; returns how many. */
static int patch_file(const char *path, const char *find, size_t skip, const void *with, size_t n, int all) {
    static uint8_t buf[1 << 20];
    FILE *f = fopen(path, "r+b");
    if (!f) return 0;
    size_t len = fread(buf, 1, sizeof buf, f), k = strlen(find);
    int hits = 0;
    for (uint8_t *at = buf; (hits == 0 || all) && (at = memmem(at, len - (size_t)(at - buf), find, k)); at += k, hits++) {
        fseek(f, (long)(at - buf + skip), SEEK_SET);
        fwrite(with, 1, n, f);
    }
    fclose(f);
    return hits;
}

int tm_patch_bytes(const char *path, const char *from, const char *to) {
    return patch_file(path, from, 0, to, strlen(from), 1);
}

int tm_patch_u32_key(const char *path, const char *key, uint32_t value) {
    return patch_file(path, key, strlen(key) + 4, &value, 4, 0); /* past the key and its u32 type */
}
