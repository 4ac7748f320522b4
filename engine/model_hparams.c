/* model_hparams.c - the architecture table and a model's hyperparameters
 * from its GGUF keys: sizes, norms, attention windows and scales,
 * soft-capping, and RoPE (base, linear / YaRN scaling), as llama.cpp reads
 * them for each architecture. model.c binds the weights that follow. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "forward_ops.h"
#include "model.h"
#include "util.h"

static const tl_arch archs[] = {
    /* (with expert_count: Mixtral, the top-k weights renormalized) */
    {.name = "llama", .rope_type = TL_ROPE_NORM, .ffn_act = TL_ACT_SILU, .moe = TL_MOE_MAY, .moe_norm = 1},
    /* llama's block under other names (llama.cpp's converters write the
     * same tensors): InternLM 2 / 2.5 (its wqkv split at conversion),
     * XVERSE, ERNIE 4.5 dense (0.3B; optional Q/K/V biases), Mistral 3
     * (Ministral; its attention temperature scaling is refused below). */
    {.name = "internlm2", .rope_type = TL_ROPE_NORM, .ffn_act = TL_ACT_SILU},
    {.name = "xverse", .rope_type = TL_ROPE_NORM, .ffn_act = TL_ACT_SILU},
    {.name = "ernie4_5", .rope_type = TL_ROPE_NORM, .ffn_act = TL_ACT_SILU},
    {.name = "mistral3", .rope_type = TL_ROPE_NORM, .ffn_act = TL_ACT_SILU},
    /* Granite (3.x dense): llama's block with four multipliers from the
     * file: embeddings, each branch before its residual add, q.k (instead
     * of 1/sqrt(head_dim)) and logits (divided). */
    {.name = "granite", .rope_type = TL_ROPE_NORM, .ffn_act = TL_ACT_SILU, .multipliers = 1},
    /* Granite MoE (3.x 1B-A400M, 3B-A800M): granite's block and multipliers
     * with routed experts, their weights renormalized; Granite MoE shared
     * adds an ungated shared expert. */
    {.name = "granitemoe", .rope_type = TL_ROPE_NORM, .ffn_act = TL_ACT_SILU, .multipliers = 1,
     .moe = TL_MOE_ALWAYS, .moe_norm = 1, .moe_shared = TL_SHEXP_KEY},
    /* Qwen (1): llama's block with Q/K/V and their bias fused, NEOX RoPE. */
    {.name = "qwen", .rope_type = TL_ROPE_NEOX, .ffn_act = TL_ACT_SILU, .ff_half = 1},
    /* Qwen 2 / 2.5: llama's block with Q/K/V biases and NEOX RoPE. */
    {.name = "qwen2", .rope_type = TL_ROPE_NEOX, .ffn_act = TL_ACT_SILU},
    /* Qwen 2 MoE (Qwen1.5-MoE, Qwen2-57B-A14B): qwen2's attention, an FFN of
     * routed experts (softmax weights as they are) plus a shared expert
     * gated by sigmoid(x . ffn_gate_inp_shexp). */
    {.name = "qwen2moe", .rope_type = TL_ROPE_NEOX, .ffn_act = TL_ACT_SILU, .moe = TL_MOE_ALWAYS,
     .moe_shared = TL_SHEXP_GATED},
    /* Qwen 3 (dense): qwen2 without the biases, with a per-head RMSNorm of
     * Q and K before RoPE (as gemma3's), and a head size of its own
     * (attention.key_length: 128 at every size, n_embd / n_head or not). */
    {.name = "qwen3", .rope_type = TL_ROPE_NEOX, .ffn_act = TL_ACT_SILU, .qk_norm = 1},
    /* Qwen 3 MoE (30B-A3B, 235B-A22B): qwen3's attention, routed experts
     * with their top-k weights renormalized. */
    {.name = "qwen3moe", .rope_type = TL_ROPE_NEOX, .ffn_act = TL_ACT_SILU, .qk_norm = 1, .moe = TL_MOE_ALWAYS,
     .moe_norm = 1},
    /* SmolLM3: llama's block, but every 4th layer attends without RoPE. */
    {.name = "smollm3", .rope_type = TL_ROPE_NORM, .ffn_act = TL_ACT_SILU, .nope_every = 4},
    /* GPT-2: LayerNorm with biases, learned positions, Q/K/V in one
     * attn_qkv with its bias, biases on every matmul, a plain GELU FFN, no
     * RoPE, tied output. */
    {.name = "gpt2", .rope_type = TL_ROPE_NORM, .ffn_act = TL_ACT_GELU_TANH, .layer_norm = 1, .learned_pos = 1,
     .plain_ffn = 1, .nope_every = 1},
    /* StarCoder (GPT-BigCode): gpt2's block, usually with one K/V head. */
    {.name = "starcoder", .rope_type = TL_ROPE_NORM, .ffn_act = TL_ACT_GELU_TANH, .layer_norm = 1, .learned_pos = 1,
     .plain_ffn = 1, .nope_every = 1},
    /* StableLM 2 (1.6B, Zephyr) / StableCode: llama's gated FFN under
     * LayerNorms with biases, Q/K/V biases, partial NEOX RoPE
     * (rope.dimension_count: a quarter of the head). */
    {.name = "stablelm", .rope_type = TL_ROPE_NEOX, .ffn_act = TL_ACT_SILU, .layer_norm = 1},
    /* StarCoder 2: LayerNorms with biases, biases on every matmul, a plain
     * GELU FFN, NEOX RoPE. */
    {.name = "starcoder2", .rope_type = TL_ROPE_NEOX, .ffn_act = TL_ACT_GELU_TANH, .layer_norm = 1, .plain_ffn = 1},
    /* GPT-NeoX / Pythia: gpt2's tensors (fused QKV, biases everywhere, plain
     * GELU FFN) with partial NEOX RoPE instead of learned positions, and
     * attention and FFN side by side when use_parallel_residual says. */
    {.name = "gptneox", .rope_type = TL_ROPE_NEOX, .ffn_act = TL_ACT_GELU_TANH, .layer_norm = 1, .plain_ffn = 1,
     .parallel = TL_PAR_KEY},
    /* Phi-2 / Phi-1.5: gptneox's block with one LayerNorm a layer that
     * attention and FFN share, and a bias on the output matrix. */
    {.name = "phi2", .rope_type = TL_ROPE_NEOX, .ffn_act = TL_ACT_GELU_TANH, .layer_norm = 1, .plain_ffn = 1,
     .parallel = TL_PAR_SHARED},
    /* Command R (35B; Aya 23): LayerNorms with a weight and no bias,
     * attention and FFN side by side on one norm, summed (x + ffn) + attn,
     * logits times logit_scale. Command R+'s per-head Q/K norms are refused
     * as unread tensors. */
    {.name = "command-r", .rope_type = TL_ROPE_NORM, .ffn_act = TL_ACT_SILU, .layer_norm = 1, .ln_bias = TL_LNB_NONE,
     .parallel = TL_PAR_SHARED_X, .logit_scale = 1},
    /* Command R7B: command-r's block with three sliding-window layers with
     * RoPE to every global one without. */
    {.name = "cohere2", .rope_type = TL_ROPE_NORM, .ffn_act = TL_ACT_SILU, .layer_norm = 1, .ln_bias = TL_LNB_NONE,
     .parallel = TL_PAR_SHARED_X, .logit_scale = 1, .swa_pattern = 4, .nope_every = 4},
    /* BLOOM: gpt2's tensors (fused, biased QKV, biases everywhere, a
     * plain GELU FFN) under ALiBi instead of positions, a LayerNorm of the
     * embeddings, tied output. */
    {.name = "bloom", .rope_type = TL_ROPE_NORM, .ffn_act = TL_ACT_GELU_TANH, .layer_norm = 1, .plain_ffn = 1,
     .nope_every = 1, .alibi = 1, .tok_norm = 1},
    /* MPT: bloom's block without the embeddings' norm, biases only where
     * the file has them, Q/K/V optionally clipped. */
    {.name = "mpt", .rope_type = TL_ROPE_NORM, .ffn_act = TL_ACT_GELU_TANH, .layer_norm = 1, .plain_ffn = 1,
     .nope_every = 1, .alibi = 1, .ln_bias = TL_LNB_OPTIONAL, .clamp_kqv = 1},
    /* OLMo 2: no norm before attention or FFN, RMSNorm after each (before
     * its residual add), Q and K RMS-normed over their whole rows, NEOX
     * RoPE. */
    {.name = "olmo2", .rope_type = TL_ROPE_NEOX, .ffn_act = TL_ACT_SILU, .qk_norm = TL_QKN_FULL, .post_norms = 1,
     .no_pre_norm = 1},
    /* OLMoE: llama's pre-norm block with OLMo 2's whole-row Q/K norms and
     * routed experts (softmax weights as they are). */
    {.name = "olmoe", .rope_type = TL_ROPE_NEOX, .ffn_act = TL_ACT_SILU, .qk_norm = TL_QKN_FULL,
     .moe = TL_MOE_ALWAYS},
    /* OLMo (1): llama's block under LayerNorms with no weight or bias, Q/K/V
     * optionally clipped (attention.clamp_kqv). */
    {.name = "olmo", .rope_type = TL_ROPE_NORM, .ffn_act = TL_ACT_SILU, .layer_norm = 1, .norm_free = 1,
     .clamp_kqv = 1},
    /* Falcon (7B): phi2's parallel block without biases, Q/K/V fused, usually
     * one K/V head. Falcon-40B's second norm (attn_norm_2) is refused as an
     * unread tensor. */
    {.name = "falcon", .rope_type = TL_ROPE_NEOX, .ffn_act = TL_ACT_GELU_TANH, .layer_norm = 1, .plain_ffn = 1,
     .parallel = TL_PAR_SHARED},
    /* Phi-3 / Phi-3.5 / Phi-4(-mini): llama's block with Q/K/V in one
     * attn_qkv and gate/up in one ffn_up, NEOX RoPE (LongRoPE's per-pair
     * factors for long contexts), every layer over a sliding window. */
    {.name = "phi3", .rope_type = TL_ROPE_NEOX, .ffn_act = TL_ACT_SILU, .swa_all = 1},
    /* Gemma (1, 1.1, CodeGemma): llama's block with GeGLU, NEOX RoPE,
     * embeddings times sqrt(n_embd), tied output. */
    {.name = "gemma", .rope_type = TL_ROPE_NEOX, .ffn_act = TL_ACT_GELU_TANH, .embd_scale = 1},
    /* Gemma 2: Gemma 3's block without Q/K norms, every other layer local
     * (window 4096 unless the file says), scores and logits soft-capped. */
    {.name = "gemma2", .rope_type = TL_ROPE_NEOX, .ffn_act = TL_ACT_GELU_TANH, .post_norms = 1, .embd_scale = 1,
     .swa_pattern = 2, .softcap = 1, .swa_default = 4096, .big_layers = 46},
    /* Gemma 3: GGUF norm weights already include the +1 (the converter adds it). */
    {.name = "gemma3", .rope_type = TL_ROPE_NEOX, .ffn_act = TL_ACT_GELU_TANH, .qk_norm = 1, .post_norms = 1,
     .embd_scale = 1, .swa_pattern = 6, .rope_base_swa = 10000.0f, .big_layers = 62},
};

const tl_arch *tl_arch_find(const char *name, size_t len) {
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        if (strlen(archs[i].name) == len && memcmp(archs[i].name, name, len) == 0) return &archs[i];
    return NULL;
}

void tl_arch_names(char *out, size_t cap) {
    out[0] = 0;
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        snprintf(out + strlen(out), cap - strlen(out), "%s%s", i ? ", " : "", archs[i].name);
}

/* ---- hyperparameters ---------------------------------------------------- */

/* Reads "<arch>.<suffix>" as u32; required keys fail when absent. */
static int arch_u32(const tl_model *m, const char *suffix, int required, uint32_t def, int *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", m->arch->name, suffix);
    uint32_t v = def;
    int r = gguf_get_u32(m->file, key, &v);
    if (r < 0) return TL_ERR_FORMAT;
    if (r == 0 && required) return tl_set_error(TL_ERR_FORMAT, "missing required key '%s'", key);
    if (v > (1u << 30)) return tl_set_error(TL_ERR_FORMAT, "key '%s' = %u is out of range", key, v);
    *out = (int)v;
    return TL_OK;
}

static int arch_f32(const tl_model *m, const char *suffix, float def, float *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", m->arch->name, suffix);
    float v = def;
    if (gguf_get_f32(m->file, key, &v) < 0) return TL_ERR_FORMAT;
    if (!isfinite(v)) return tl_set_error(TL_ERR_FORMAT, "key '%s' is not finite", key);
    *out = v;
    return TL_OK;
}

/* rope.scaling.* as llama.cpp reads them: the type defaults to linear, so a
 * factor alone (or the older rope.scale_linear) scales the angles by
 * 1 / factor; type none ignores the factor; yarn blends scaled and
 * unscaled angles over a ramp set by original_context_length and
 * yarn_beta_fast/slow (32, 1) and raises attn_factor by 1 + 0.1 ln(factor).
 * A longrope type (LongRoPE's factor tensors are model.c's), DeepSeek's
 * yarn_log_multiplier and other types are refused rather than run unscaled. Gemma 3's local layers keep their own base
 * unscaled (llama.cpp's rope_freq_scale_train_swa = 1). */
static int load_rope_scaling(tl_model *m) {
    tl_hparams *hp = &m->hp;
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", m->arch->name);
    gguf_str type = {.ptr = "linear", .len = 6};
    if (gguf_get_str(m->file, key, &type) < 0) return TL_ERR_FORMAT;
    float factor = 0, attn_factor = 1, yarn_attn = 1, ext = -1, beta_fast = 32, beta_slow = 1, log_mul = 0;
    int rc;
    if ((rc = arch_f32(m, "rope.scaling.factor", 0, &factor)) ||
        (rc = arch_f32(m, "rope.scaling.attn_factor", 1, &attn_factor)) ||
        (rc = arch_f32(m, "rope.scaling.yarn_attn_factor", 1, &yarn_attn)) ||
        (rc = arch_f32(m, "rope.scaling.yarn_ext_factor", -1, &ext)) ||
        (rc = arch_f32(m, "rope.scaling.yarn_beta_fast", 32, &beta_fast)) ||
        (rc = arch_f32(m, "rope.scaling.yarn_beta_slow", 1, &beta_slow)) ||
        (rc = arch_f32(m, "rope.scaling.yarn_log_multiplier", 0, &log_mul)) ||
        (rc = arch_u32(m, "rope.scaling.original_context_length", 0, (uint32_t)hp->n_ctx_train, &hp->n_ctx_orig)))
        return rc;
    if (factor == 0 && (rc = arch_f32(m, "rope.scale_linear", 0, &factor))) return rc;
    int shown = type.len > 32 ? 32 : (int)type.len, yarn = type.len == 4 && !memcmp(type.ptr, "yarn", 4);
    if (type.len == 4 && !memcmp(type.ptr, "none", 4))
        factor = 0;
    else if (!yarn && !(type.len == 6 && !memcmp(type.ptr, "linear", 6)))
        return tl_set_error(TL_ERR_UNSUPPORTED,
                            "%s '%.*s' (factor %g) is not supported: tinyloop runs linear and yarn RoPE scaling", key,
                            shown, type.ptr, factor);
    if (factor < 0 || attn_factor <= 0 || yarn_attn <= 0)
        return tl_set_error(TL_ERR_FORMAT, "RoPE scaling factor %g / attn_factor %g must be >= 0 / > 0", factor,
                            attn_factor * yarn_attn);
    if (log_mul != 0)
        return tl_set_error(TL_ERR_UNSUPPORTED,
                            "rope.scaling.yarn_log_multiplier %g (DeepSeek's attention temperature) is not supported",
                            log_mul);
    if (yarn && (hp->n_ctx_orig < 1 || !(beta_fast > 0) || !(beta_slow > 0)))
        return tl_set_error(TL_ERR_FORMAT, "YaRN: original_context_length %d / beta_fast %g / beta_slow %g must be > 0",
                            hp->n_ctx_orig, beta_fast, beta_slow);
    hp->rope.freq_scale = factor == 0 ? 1.0f : 1.0f / factor;
    hp->rope.attn_factor = attn_factor * yarn_attn;
    hp->rope.ext_factor = ext >= 0 ? ext : yarn ? 1.0f : 0.0f;
    hp->rope_swa = hp->rope;
    if (m->arch->rope_base_swa > 0) {
        hp->rope_swa.base = m->arch->rope_base_swa;
        hp->rope_swa.freq_scale = 1.0f;
    }
    tl_rope_params *both[2] = {&hp->rope, &hp->rope_swa};
    for (int i = 0; i < 2; i++)
        if (both[i]->ext_factor != 0.0f) tl_rope_yarn_prepare(both[i], hp->n_rot, hp->n_ctx_orig, beta_fast, beta_slow);
    return TL_OK;
}

/* Phi-3 files from before the converter wrote attention.sliding_window
 * get llama.cpp's per-model values; a file with neither is refused, as
 * llama.cpp refuses it. */
static int phi3_window(tl_model *m) {
    tl_hparams *hp = &m->hp;
    char key[128];
    snprintf(key, sizeof key, "%s.attention.sliding_window", m->arch->name);
    if (gguf_find_kv(m->file, key)) return TL_OK;
    if ((hp->n_layer == 32 || hp->n_layer == 40) && hp->n_ctx_train == 4096)
        hp->sliding_window = 2047; /* Phi-3-mini / -medium 4k */
    else if (hp->n_layer == 32 && hp->n_head_kv == 32 && hp->n_ctx_train == 131072)
        hp->sliding_window = 262144; /* Phi-3-mini 128k */
    else if (hp->n_layer == 40 && hp->n_ctx_train == 131072)
        hp->sliding_window = 131072; /* Phi-3-medium 128k */
    else
        return tl_set_error(TL_ERR_FORMAT, "%s is missing (and %d layers, context %d match no known Phi-3)", key,
                            hp->n_layer, hp->n_ctx_train);
    return TL_OK;
}

/* Embedding, residual, attention and logit multipliers: gemma's sqrt(n_embd)
 * on the embeddings, granite's four keys (0 or absent: none, as in
 * llama.cpp's graph). */
static int load_multipliers(tl_model *m) {
    tl_hparams *hp = &m->hp;
    hp->embd_mul = m->arch->embd_scale ? sqrtf((float)hp->n_embd) : 1.0f;
    hp->residual_mul = hp->logit_mul = 1.0f;
    if (m->arch->logit_scale) {
        char key[96];
        snprintf(key, sizeof key, "%s.logit_scale", m->arch->name);
        int rc = gguf_get_f32(m->file, key, &hp->logit_mul);
        if (rc < 0) return TL_ERR_FORMAT;
        if (rc == 0) return tl_set_error(TL_ERR_FORMAT, "missing required key '%s'", key);
        if (!(hp->logit_mul > 0) || !isfinite(hp->logit_mul))
            return tl_set_error(TL_ERR_FORMAT, "%s %g must be > 0", key, hp->logit_mul);
    }
    if (!m->arch->multipliers) return TL_OK;
    float embd, res, attn, logit;
    int rc;
    if ((rc = arch_f32(m, "embedding_scale", 0, &embd)) || (rc = arch_f32(m, "residual_scale", 0, &res)) ||
        (rc = arch_f32(m, "attention.scale", 0, &attn)) || (rc = arch_f32(m, "logit_scale", 0, &logit)))
        return rc;
    if (embd < 0 || res < 0 || attn < 0 || logit < 0)
        return tl_set_error(TL_ERR_FORMAT, "%s multipliers must be >= 0 (embedding %g, residual %g, attention %g, "
                            "logit %g)", m->arch->name, embd, res, attn, logit);
    if (embd > 0) hp->embd_mul = embd;
    if (res > 0) hp->residual_mul = res;
    if (attn > 0) hp->attn_scale = attn;
    if (logit > 0) hp->logit_mul = 1.0f / logit; /* llama.cpp's ggml_scale by 1 / logit_scale */
    return TL_OK;
}

/* Experts: expert_count (and expert_used_count, the top k) where the
 * architecture routes its FFN; their width is expert_feed_forward_length,
 * else feed_forward_length (Mixtral's), the shared expert's
 * expert_shared_feed_forward_length, else (Qwen 2 MoE) the experts' or
 * (Granite) none. Any other architecture with experts is refused by name,
 * not as a missing ffn_gate. */
static int load_experts(tl_model *m) {
    tl_hparams *hp = &m->hp;
    int rc;
    if ((rc = arch_u32(m, "expert_count", m->arch->moe == TL_MOE_ALWAYS, 0, &hp->n_expert))) return rc;
    if (hp->n_expert == 0 && m->arch->moe == TL_MOE_ALWAYS)
        return tl_set_error(TL_ERR_FORMAT, "%s.expert_count is 0", m->arch->name);
    if (hp->n_expert == 0) return TL_OK;
    if (!m->arch->moe)
        return tl_set_error(TL_ERR_UNSUPPORTED,
                            "%s.expert_count %d: tinyloop runs mixture-of-experts models as llama (Mixtral), qwen2moe, "
                            "qwen3moe, olmoe and granitemoe, not as %s",
                            m->arch->name, hp->n_expert, m->arch->name);
    if ((rc = arch_u32(m, "expert_used_count", 1, 0, &hp->n_expert_used)) ||
        (rc = arch_u32(m, "expert_feed_forward_length", 0, (uint32_t)hp->n_ff, &hp->n_ff_exp)) ||
        (rc = arch_u32(m, "expert_shared_feed_forward_length", 0,
                       m->arch->moe_shared == TL_SHEXP_GATED ? (uint32_t)hp->n_ff_exp : 0, &hp->n_ff_shexp)))
        return rc;
    if (!m->arch->moe_shared) hp->n_ff_shexp = 0;
    if (hp->n_expert > TL_MAX_EXPERTS || hp->n_expert_used < 1 || hp->n_expert_used > hp->n_expert)
        return tl_set_error(TL_ERR_FORMAT, "%s.expert_count %d / expert_used_count %d: need 1 <= used <= count <= %d",
                            m->arch->name, hp->n_expert, hp->n_expert_used, TL_MAX_EXPERTS);
    if (hp->n_ff_exp < 1 || (m->arch->moe_shared == TL_SHEXP_GATED && hp->n_ff_shexp < 1))
        return tl_set_error(TL_ERR_FORMAT, "%s: expert feed_forward_length %d / shared %d must be >= 1",
                            m->arch->name, hp->n_ff_exp, hp->n_ff_shexp);
    return TL_OK;
}

/* ALiBi's per-head slopes as ggml's soft_max computes them: with n2 the
 * largest power of two <= n_head, m0 = 2^(-max_bias / n2), m1 =
 * 2^(-max_bias / 2 / n2); head h < n2 takes m0^(h + 1), the others
 * m1^(2 (h - n2) + 1). */
static int load_alibi(tl_model *m) {
    float max_bias;
    int rc = arch_f32(m, "attention.max_alibi_bias", 8.0f, &max_bias);
    if (rc) return rc;
    if (!(max_bias > 0))
        return tl_set_error(TL_ERR_FORMAT, "%s.attention.max_alibi_bias %g must be > 0", m->arch->name, max_bias);
    const int n_head = m->hp.n_head;
    if (!(m->alibi = malloc((size_t)n_head * sizeof *m->alibi))) return tl_set_error(TL_ERR_NOMEM, "out of memory");
    const uint32_t n2 = 1u << (uint32_t)floor(log2((double)n_head));
    const float m0 = powf(2.0f, -max_bias / (float)n2), m1 = powf(2.0f, -(max_bias / 2.0f) / (float)n2);
    for (int h = 0; h < n_head; h++)
        m->alibi[h] = (uint32_t)h < n2 ? powf(m0, (float)(h + 1)) : powf(m1, (float)(2 * (h - (int)n2) + 1));
    return TL_OK;
}

int tl_model_load_hparams(tl_model *m) {
    tl_hparams *hp = &m->hp;
    int rc;
    if ((rc = arch_u32(m, "embedding_length", 1, 0, &hp->n_embd)) ||
        (rc = arch_u32(m, "block_count", 1, 0, &hp->n_layer)) ||
        (rc = arch_u32(m, "feed_forward_length", 1, 0, &hp->n_ff)) ||
        (rc = arch_u32(m, "attention.head_count", 1, 0, &hp->n_head)) ||
        (rc = arch_u32(m, "context_length", 0, 2048, &hp->n_ctx_train)) ||
        (rc = arch_f32(m, m->arch->layer_norm ? "attention.layer_norm_epsilon" : "attention.layer_norm_rms_epsilon",
                       1e-5f, &hp->norm_eps)) ||
        (rc = arch_f32(m, "rope.freq_base", 10000.0f, &hp->rope.base)))
        return rc;
    if (m->arch->ff_half) {
        if (hp->n_ff % 2)
            return tl_set_error(TL_ERR_FORMAT, "%s.feed_forward_length %d is odd (the FFN is half of it)",
                                m->arch->name, hp->n_ff);
        hp->n_ff /= 2;
    }
    if (hp->n_embd < 1 || hp->n_layer < 1 || hp->n_head < 1 || hp->n_ff < 1)
        return tl_set_error(TL_ERR_FORMAT, "hyperparameters must be >= 1 (n_embd %d, n_layer %d, n_head %d, n_ff %d)",
                            hp->n_embd, hp->n_layer, hp->n_head, hp->n_ff);
    if ((rc = load_experts(m))) return rc;
    if ((rc = arch_u32(m, "attention.head_count_kv", 0, (uint32_t)hp->n_head, &hp->n_head_kv))) return rc;
    if (hp->n_head_kv < 1 || hp->n_head % hp->n_head_kv)
        return tl_set_error(TL_ERR_FORMAT, "head_count %d is not a multiple of head_count_kv %d", hp->n_head,
                            hp->n_head_kv);
    int def_hd = hp->n_embd / hp->n_head;
    if ((rc = arch_u32(m, "attention.key_length", 0, (uint32_t)def_hd, &hp->head_dim))) return rc;
    int v_dim;
    if ((rc = arch_u32(m, "attention.value_length", 0, (uint32_t)hp->head_dim, &v_dim))) return rc;
    if (v_dim != hp->head_dim)
        return tl_set_error(TL_ERR_UNSUPPORTED, "attention.value_length %d differs from key_length %d", v_dim,
                            hp->head_dim);
    if ((rc = arch_u32(m, "rope.dimension_count", 0, (uint32_t)hp->head_dim, &hp->n_rot))) return rc;
    if ((rc = arch_u32(m, "attention.sliding_window", 0, (uint32_t)m->arch->swa_default, &hp->sliding_window)))
        return rc;
    if (m->arch->swa_all && rc == TL_OK && (rc = phi3_window(m))) return rc;
    hp->attn_scale = 1.0f / sqrtf((float)(hp->n_layer == m->arch->big_layers ? hp->n_embd / hp->n_head : hp->head_dim));
    if (m->arch->softcap &&
        ((rc = arch_f32(m, "attn_logit_softcapping", 50.0f, &hp->attn_softcap)) ||
         (rc = arch_f32(m, "final_logit_softcapping", 30.0f, &hp->final_softcap))))
        return rc;
    float temp_scale; /* Llama 4 / Mistral 3's attention temperature: scales Q by position */
    if ((rc = arch_f32(m, "attention.temperature_scale", 0, &temp_scale))) return rc;
    if (temp_scale != 0)
        return tl_set_error(TL_ERR_UNSUPPORTED, "%s.attention.temperature_scale %g is not supported", m->arch->name,
                            temp_scale);
    if ((rc = load_multipliers(m))) return rc;
    if (m->arch->alibi && (rc = load_alibi(m))) return rc;
    if (m->arch->clamp_kqv && (rc = arch_f32(m, "attention.clamp_kqv", 0, &hp->clamp_kqv))) return rc;
    if (hp->clamp_kqv < 0) return tl_set_error(TL_ERR_FORMAT, "attention.clamp_kqv %g must be >= 0", hp->clamp_kqv);
    hp->parallel = m->arch->parallel;
    if (m->arch->parallel == TL_PAR_KEY) { /* llama.cpp requires the key; Hugging Face's default is true */
        char key[96];
        int par = 1;
        snprintf(key, sizeof key, "%s.use_parallel_residual", m->arch->name);
        if (gguf_get_bool(m->file, key, &par) < 0) return TL_ERR_FORMAT; /* named by the reader */
        hp->parallel = par ? TL_PAR_KEY : TL_PAR_NONE;
    }
    if (hp->attn_softcap < 0 || hp->final_softcap < 0)
        return tl_set_error(TL_ERR_FORMAT, "soft-capping %g / %g must be >= 0", hp->attn_softcap, hp->final_softcap);
    if (hp->head_dim < 2 || hp->head_dim % 2 || hp->n_rot > hp->head_dim || hp->n_rot % 2)
        return tl_set_error(TL_ERR_FORMAT, "head_dim %d / rope dimension %d unusable", hp->head_dim, hp->n_rot);
    if (hp->norm_eps <= 0) return tl_set_error(TL_ERR_FORMAT, "rms epsilon %g must be > 0", hp->norm_eps);
    if (hp->rope.base <= 0) return tl_set_error(TL_ERR_FORMAT, "rope.freq_base %g must be > 0", hp->rope.base);
    return load_rope_scaling(m);
}
