/* model.c - opening a GGUF model: architecture lookup, hyperparameters,
 * weight binding with shape checks, loop block, KV pool and thread pool. */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "forward.h"
#include "cache_tier.h"
#include "kv_mode.h"
#include "quants.h"
#include "scheduler.h"
#include "tokenize_async.h"
#include "util.h"

static const tl_arch archs[] = {
    {.name = "llama", .rope_type = TL_ROPE_NORM, .ffn_act = TL_ACT_SILU},
    /* Qwen 2 / 2.5: llama's block with Q/K/V biases and NEOX RoPE. */
    {.name = "qwen2", .rope_type = TL_ROPE_NEOX, .ffn_act = TL_ACT_SILU},
    /* Qwen 3 (dense): qwen2 without the biases, with a per-head RMSNorm of
     * Q and K before RoPE (as gemma3's), and a head size of its own
     * (attention.key_length: 128 at every size, n_embd / n_head or not). */
    {.name = "qwen3", .rope_type = TL_ROPE_NEOX, .ffn_act = TL_ACT_SILU, .qk_norm = 1},
    /* SmolLM3: llama's block, but every 4th layer attends without RoPE. */
    {.name = "smollm3", .rope_type = TL_ROPE_NORM, .ffn_act = TL_ACT_SILU, .nope_every = 4},
    /* GPT-2: LayerNorm with biases, learned positions, Q/K/V in one
     * attn_qkv with its bias, biases on every matmul, a plain GELU FFN, no
     * RoPE, tied output. */
    {.name = "gpt2", .rope_type = TL_ROPE_NORM, .ffn_act = TL_ACT_GELU_TANH, .layer_norm = 1, .nope_every = 1},
    /* Phi-3 / Phi-3.5 / Phi-4(-mini): llama's block with Q/K/V in one
     * attn_qkv and gate/up in one ffn_up, NEOX RoPE (LongRoPE's per-pair
     * factors for long contexts), every layer over a sliding window. */
    {.name = "phi3", .rope_type = TL_ROPE_NEOX, .ffn_act = TL_ACT_SILU, .swa_all = 1},
    /* Gemma 2: Gemma 3's block without Q/K norms, every other layer local
     * (window 4096 unless the file says), scores and logits soft-capped. */
    {.name = "gemma2", .rope_type = TL_ROPE_NEOX, .ffn_act = TL_ACT_GELU_TANH, .post_norms = 1, .embd_scale = 1,
     .swa_pattern = 2, .softcap = 1, .swa_default = 4096, .big_layers = 46},
    /* Gemma 3: GGUF norm weights already include the +1 (the converter adds it). */
    {.name = "gemma3", .rope_type = TL_ROPE_NEOX, .ffn_act = TL_ACT_GELU_TANH, .qk_norm = 1, .post_norms = 1,
     .embd_scale = 1, .swa_pattern = 6, .rope_base_swa = 10000.0f, .big_layers = 62},
};

static const tl_arch *find_arch(const char *name, size_t len) {
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        if (strlen(archs[i].name) == len && memcmp(archs[i].name, name, len) == 0) return &archs[i];
    return NULL;
}

tl_model_params tl_model_default_params(void) {
    tl_model_params p;
    memset(&p, 0, sizeof p);
    p.kv_type = TL_KV_DEFAULT;
    p.loop_start = -1;
    p.loop_end = -1;
    return p;
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
 * LongRoPE, DeepSeek's yarn_log_multiplier and other types are refused
 * rather than run unscaled. Gemma 3's local layers keep their own base
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

static int load_hparams(tl_model *m) {
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
    if (hp->n_embd < 1 || hp->n_layer < 1 || hp->n_head < 1 || hp->n_ff < 1)
        return tl_set_error(TL_ERR_FORMAT, "hyperparameters must be >= 1 (n_embd %d, n_layer %d, n_head %d, n_ff %d)",
                            hp->n_embd, hp->n_layer, hp->n_head, hp->n_ff);
    /* Mixtral-style files keep the llama name but route each token through
     * experts (ffn_*_exps tensors): say so, not "missing ffn_gate" */
    int n_expert;
    if ((rc = arch_u32(m, "expert_count", 0, 0, &n_expert))) return rc;
    if (n_expert > 0)
        return tl_set_error(TL_ERR_UNSUPPORTED, "%s.expert_count %d: mixture-of-experts models are not supported",
                            m->arch->name, n_expert);
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
    if (hp->attn_softcap < 0 || hp->final_softcap < 0)
        return tl_set_error(TL_ERR_FORMAT, "soft-capping %g / %g must be >= 0", hp->attn_softcap, hp->final_softcap);
    if (hp->head_dim < 2 || hp->head_dim % 2 || hp->n_rot > hp->head_dim || hp->n_rot % 2)
        return tl_set_error(TL_ERR_FORMAT, "head_dim %d / rope dimension %d unusable", hp->head_dim, hp->n_rot);
    if (hp->norm_eps <= 0) return tl_set_error(TL_ERR_FORMAT, "rms epsilon %g must be > 0", hp->norm_eps);
    if (hp->rope.base <= 0) return tl_set_error(TL_ERR_FORMAT, "rope.freq_base %g must be > 0", hp->rope.base);
    return load_rope_scaling(m);
}

/* ---- weights ------------------------------------------------------------ */

static int bind_weight(tl_model *m, tl_weight *w, const char *name, int64_t n_in, int64_t n_out, int optional) {
    const gguf_tensor *t = gguf_find_tensor(m->file, name);
    if (!t) {
        if (optional) return 1;
        return tl_set_error(TL_ERR_FORMAT, "missing tensor '%s'", name);
    }
    if (t->ne[0] != n_in || t->ne[1] != n_out || t->ne[2] != 1 || t->ne[3] != 1)
        return tl_set_error(TL_ERR_FORMAT, "tensor '%s' has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld]",
                            name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                            (long long)t->ne[3], (long long)n_in, (long long)n_out);
    if (!tl_type_info(t->type)->supported)
        return tl_set_error(TL_ERR_UNSUPPORTED, "tensor '%s' has type %s, which tinyloop cannot compute with", name,
                            tl_type_info(t->type)->name ? tl_type_info(t->type)->name : "unknown");
    w->data = t->data;
    w->type = t->type;
    w->n_in = n_in;
    w->n_out = n_out;
    w->packed = 0;
    m->weight_bytes += t->size;
    m->tensor_used[t - m->file->tensors] = 1;
    return TL_OK;
}

/* Binds consecutive row ranges of one fused tensor (phi3's attn_qkv, and
 * ffn_up holding gate then up) as k weights: views of its rows, each a
 * matrix of its own to the matmuls and the weight arena. */
static int bind_split(tl_model *m, tl_weight *const *ws, const int64_t *rows, int k, const char *name, int64_t n_in) {
    int64_t total = 0;
    for (int i = 0; i < k; i++) total += rows[i];
    tl_weight whole;
    int rc = bind_weight(m, &whole, name, n_in, total, 0);
    if (rc) return rc;
    const size_t rs = tl_row_size(whole.type, n_in);
    for (int i = 0, r = 0; i < k; r += (int)rows[i++]) {
        *ws[i] = whole;
        ws[i]->data = (const uint8_t *)whole.data + (size_t)r * rs;
        ws[i]->n_out = rows[i];
    }
    return TL_OK;
}

/* Norm vectors are tiny: convert whatever type they have to owned f32. */
static int bind_norm(tl_model *m, float **out, const char *name, int64_t n, int optional) {
    const gguf_tensor *t = gguf_find_tensor(m->file, name);
    if (!t) {
        if (optional) return 1;
        return tl_set_error(TL_ERR_FORMAT, "missing tensor '%s'", name);
    }
    if (t->n_elements != n || t->ne[0] != n)
        return tl_set_error(TL_ERR_FORMAT, "tensor '%s' has %lld elements, expected %lld", name,
                            (long long)t->n_elements, (long long)n);
    if (!tl_type_info(t->type)->supported)
        return tl_set_error(TL_ERR_UNSUPPORTED, "tensor '%s' has unsupported type %d", name, t->type);
    float *v = tl_alloc_aligned((size_t)n * sizeof(float));
    if (!v) return tl_set_error(TL_ERR_NOMEM, "out of memory for tensor '%s'", name);
    tl_dequantize_row(t->type, t->data, v, n);
    if (m->arch->norm_plus_one)
        for (int64_t i = 0; i < n; i++) v[i] += 1.0f;
    m->owned_norms[m->n_owned_norms++] = v;
    m->weight_bytes += t->size;
    m->tensor_used[t - m->file->tensors] = 1;
    *out = v;
    return TL_OK;
}

static int load_weights(tl_model *m) {
    const tl_hparams *hp = &m->hp;
    int q_dim = hp->n_head * hp->head_dim, kv_dim = hp->n_head_kv * hp->head_dim;
    /* Every layer has at least 6 tensors (phi3's fused ones): a block_count
     * the file cannot back is refused before anything is sized by it. */
    if ((uint64_t)hp->n_layer * 6 > m->file->n_tensors)
        return tl_set_error(TL_ERR_FORMAT, "block_count %d needs at least %lld tensors; the file has %llu",
                            hp->n_layer, (long long)hp->n_layer * 6, (unsigned long long)m->file->n_tensors);
    m->layers = calloc((size_t)hp->n_layer, sizeof *m->layers);
    m->owned_norms = calloc((size_t)hp->n_layer * 9 + 4, sizeof(float *));
    m->tensor_used = calloc(m->file->n_tensors ? m->file->n_tensors : 1, 1);
    if (!m->layers || !m->owned_norms || !m->tensor_used)
        return tl_set_error(TL_ERR_NOMEM, "out of memory for %d layers", hp->n_layer);

    const gguf_tensor *te = gguf_find_tensor(m->file, "token_embd.weight");
    if (!te) return tl_set_error(TL_ERR_FORMAT, "missing tensor 'token_embd.weight'");
    if (te->ne[1] < 1 || te->ne[1] > (1 << 24))
        return tl_set_error(TL_ERR_FORMAT, "token_embd.weight has %lld rows", (long long)te->ne[1]);
    m->hp.n_vocab = (int)te->ne[1];
    int rc;
    if ((rc = bind_weight(m, &m->tok_embd, "token_embd.weight", hp->n_embd, hp->n_vocab, 0))) return rc;
    if ((rc = bind_norm(m, &m->output_norm, "output_norm.weight", hp->n_embd, 0))) return rc;
    if ((rc = bind_norm(m, &m->rope_freqs, "rope_freqs.weight", hp->n_rot / 2, 1)) < 0) return rc;
    if (m->arch->layer_norm && ((rc = bind_norm(m, &m->output_norm_b, "output_norm.bias", hp->n_embd, 0)) ||
                                (rc = bind_weight(m, &m->pos_embd, "position_embd.weight", hp->n_embd, hp->n_ctx_train, 0))))
        return rc;
    /* LongRoPE (Phi-3 128k): one set of per-pair factors for contexts past
     * the original one, one up to it, chosen by the context as llama.cpp's
     * build_rope_factors does (rope_freqs, when present, wins there too) */
    float *f_long = NULL, *f_short = NULL;
    if ((rc = bind_norm(m, &f_long, "rope_factors_long.weight", hp->n_rot / 2, 1)) < 0 ||
        (rc = bind_norm(m, &f_short, "rope_factors_short.weight", hp->n_rot / 2, 1)) < 0)
        return rc;
    if (!m->rope_freqs) m->rope_freqs = m->max_seq_len > hp->n_ctx_orig ? f_long : f_short;
    rc = bind_weight(m, &m->output, "output.weight", hp->n_embd, hp->n_vocab, 1);
    if (rc < 0) return rc;
    if (rc == 1) m->output = m->tok_embd; /* tied embeddings */

    for (int l = 0; l < hp->n_layer; l++) {
        tl_layer *L = &m->layers[l];
        char n[96];
#define NAME(s) (snprintf(n, sizeof n, "blk.%d.%s.weight", l, s), n)
#define NAME_B(s) (snprintf(n, sizeof n, "blk.%d.%s.bias", l, s), n)
        if ((rc = bind_norm(m, &L->attn_norm, NAME("attn_norm"), hp->n_embd, 0))) return rc;
        if (gguf_find_tensor(m->file, NAME("attn_qkv"))) { /* Q, K, V rows in one tensor */
            tl_weight *const qkv[3] = {&L->wq, &L->wk, &L->wv};
            const int64_t rows[3] = {q_dim, kv_dim, kv_dim};
            rc = bind_split(m, qkv, rows, 3, n, hp->n_embd);
            float *b = NULL; /* and their biases in one vector (gpt2) */
            if (!rc && (rc = bind_norm(m, &b, NAME_B("attn_qkv"), q_dim + 2 * kv_dim, 1)) == 1) rc = TL_OK;
            if (b) L->bq = b, L->bk = b + q_dim, L->bv = b + q_dim + kv_dim;
        } else if (!(rc = bind_weight(m, &L->wq, NAME("attn_q"), hp->n_embd, q_dim, 0)) &&
                   !(rc = bind_weight(m, &L->wk, NAME("attn_k"), hp->n_embd, kv_dim, 0))) {
            rc = bind_weight(m, &L->wv, NAME("attn_v"), hp->n_embd, kv_dim, 0);
        }
        if (rc || (rc = bind_weight(m, &L->wo, NAME("attn_output"), q_dim, hp->n_embd, 0)) ||
            (rc = bind_norm(m, &L->ffn_norm, NAME("ffn_norm"), hp->n_embd, 0)))
            return rc;
        const gguf_tensor *up = gguf_find_tensor(m->file, NAME("ffn_up"));
        if (m->arch->layer_norm) { /* act(up) -> down, no gate */
            rc = bind_weight(m, &L->w_up, NAME("ffn_up"), hp->n_embd, hp->n_ff, 0);
        } else if (!gguf_find_tensor(m->file, NAME("ffn_gate")) && up && up->ne[1] == 2 * (int64_t)hp->n_ff) {
            /* gate rows then up rows (llama.cpp's SWIGLU: silu of the first half) */
            tl_weight *const gu[2] = {&L->w_gate, &L->w_up};
            const int64_t rows[2] = {hp->n_ff, hp->n_ff};
            rc = bind_split(m, gu, rows, 2, NAME("ffn_up"), hp->n_embd);
        } else if (!(rc = bind_weight(m, &L->w_gate, NAME("ffn_gate"), hp->n_embd, hp->n_ff, 0))) {
            rc = bind_weight(m, &L->w_up, NAME("ffn_up"), hp->n_embd, hp->n_ff, 0);
        }
        if (rc || (rc = bind_weight(m, &L->w_down, NAME("ffn_down"), hp->n_ff, hp->n_embd, 0))) return rc;
        /* Biases are optional in any architecture (qwen2 files have them). */
        if ((rc = bind_norm(m, &L->bq, NAME_B("attn_q"), q_dim, 1)) < 0 ||
            (rc = bind_norm(m, &L->bk, NAME_B("attn_k"), kv_dim, 1)) < 0 ||
            (rc = bind_norm(m, &L->bv, NAME_B("attn_v"), kv_dim, 1)) < 0)
            return rc;
        if (m->arch->qk_norm &&
            ((rc = bind_norm(m, &L->q_norm, NAME("attn_q_norm"), hp->head_dim, 0)) ||
             (rc = bind_norm(m, &L->k_norm, NAME("attn_k_norm"), hp->head_dim, 0))))
            return rc;
        if (m->arch->layer_norm &&
            ((rc = bind_norm(m, &L->attn_norm_b, NAME_B("attn_norm"), hp->n_embd, 0)) ||
             (rc = bind_norm(m, &L->ffn_norm_b, NAME_B("ffn_norm"), hp->n_embd, 0)) ||
             (rc = bind_norm(m, &L->bo, NAME_B("attn_output"), hp->n_embd, 0)) ||
             (rc = bind_norm(m, &L->b_up, NAME_B("ffn_up"), hp->n_ff, 0)) ||
             (rc = bind_norm(m, &L->b_down, NAME_B("ffn_down"), hp->n_embd, 0))))
            return rc;
        if (m->arch->post_norms &&
            ((rc = bind_norm(m, &L->post_attn_norm, NAME("post_attention_norm"), hp->n_embd, 0)) ||
             (rc = bind_norm(m, &L->post_ffn_norm, NAME("post_ffw_norm"), hp->n_embd, 0))))
            return rc;
#undef NAME
#undef NAME_B
    }
    /* llama.cpp refuses a file with tensors its architecture does not read;
     * so does tinyloop, rather than run without them (an attn_output.bias,
     * say, would be silently dropped) */
    for (uint64_t i = 0; i < m->file->n_tensors; i++)
        if (!m->tensor_used[i])
            return tl_set_error(TL_ERR_UNSUPPORTED, "tensor '%s' is not part of a %s model as tinyloop runs it",
                                m->file->tensors[i].name, m->arch->name);
    return TL_OK;
}

/* ---- loop block ----------------------------------------------------------- */

static int load_loops(tl_model *m) {
    uint32_t s = 0, e = 0, d = 1;
    int hs = gguf_get_u32(m->file, "tinyloop.loop_start", &s);
    int he = gguf_get_u32(m->file, "tinyloop.loop_end", &e);
    int hd = gguf_get_u32(m->file, "tinyloop.loop_default", &d);
    if (hs < 0 || he < 0 || hd < 0) return TL_ERR_FORMAT;
    if (hs != he) return tl_set_error(TL_ERR_FORMAT, "tinyloop.loop_start and tinyloop.loop_end must both be present");
    if (m->params.loop_start >= 0 || m->params.loop_end >= 0) {
        if (m->params.loop_start < 0 || m->params.loop_end < 0)
            return tl_set_error(TL_ERR_INVALID_ARG, "loop_start %d and loop_end %d must be set together",
                                m->params.loop_start, m->params.loop_end);
        s = (uint32_t)m->params.loop_start;
        e = (uint32_t)m->params.loop_end;
    }
    if (s > e || e > (uint32_t)m->hp.n_layer)
        return tl_set_error(TL_ERR_INVALID_ARG, "loop block [%u, %u) is not within the model's %d layers", s, e,
                            m->hp.n_layer);
    if (m->params.loop_default > 0) d = (uint32_t)m->params.loop_default;
    if (d < 1 || d > 1024) return tl_set_error(TL_ERR_INVALID_ARG, "loop_default %u must be in [1, 1024]", d);
    m->loop_start = (int)s;
    m->loop_end = (int)e;
    m->loop_default = s == e ? 1 : (int)d;
    return TL_OK;
}

/* ---- open / close ----------------------------------------------------------- */

static int init_runtime(tl_model *m) {
    const tl_model_params *p = &m->params;
    int bs = p->kv_block_size > 0 ? p->kv_block_size : 16;
    if (bs > 4096) return tl_set_error(TL_ERR_INVALID_ARG, "kv_block_size %d is larger than 4096", bs);
    tl_kv_mode mode;
    int rc = tl_kv_mode_resolve(p, &mode);
    if (rc) return rc;
    tl_kv_layout layout;
    if (tl_kv_layout_init(&layout, mode.type_k, mode.type_v, mode.store_h, bs, m->hp.n_head_kv, m->hp.head_dim,
                          m->hp.n_embd)) {
        char name[16];
        tl_kv_mode_name(&mode, name, sizeof name);
        return tl_set_error(TL_ERR_UNSUPPORTED, "KV mode %s needs an even row length (head_dim %d, n_embd %d)", name,
                            m->hp.head_dim, m->hp.n_embd);
    }
    size_t block_bytes = layout.block_bytes;
    size_t seq_blocks = (size_t)((m->max_seq_len + bs - 1) / bs) * (size_t)tl_model_depth(m, 0);
    size_t n_blocks;
    if (p->kv_mem) {
        n_blocks = p->kv_mem / block_bytes;
        if (n_blocks < 1)
            return tl_set_error(TL_ERR_INVALID_ARG, "kv_mem %zu bytes is smaller than one KV block (%zu bytes)",
                                p->kv_mem, block_bytes);
    } else {
        n_blocks = 4 * seq_blocks;
        size_t cap = ((size_t)512 << 20) / block_bytes;
        if (n_blocks > cap) n_blocks = cap > seq_blocks ? cap : seq_blocks;
    }
    if (n_blocks > (size_t)INT32_MAX / 2)
        return tl_set_error(TL_ERR_INVALID_ARG, "%zu KV blocks is too many", n_blocks);
    /* Without a kv_mem a device backend may take most of its free memory
     * (vLLM's gpu_memory_utilization), up to 1,024 full sequences. */
    size_t auto_max = 1024 * seq_blocks;
    if (auto_max > (size_t)INT32_MAX / 2) auto_max = (size_t)INT32_MAX / 2;
    if (auto_max > ((size_t)1 << 24)) auto_max = (size_t)1 << 24;
    int nb = (int)n_blocks;
    rc = tl_backend_select(m, &nb, &layout, p->kv_mem == 0, (int)auto_max);
    if (rc) return rc;
    n_blocks = (size_t)nb;
    /* With a backend the arena lives in its memory; the pool keeps the books. */
    if ((rc = tl_kv_pool_init(&m->kv, (int)n_blocks, &layout, m->backend == NULL))) return rc;
    tl_backend_attach_pool(m);
    m->tp = tl_threadpool_new(p->n_threads > 0 ? p->n_threads : tl_cpu_count());
    if (!m->tp) return tl_set_error(TL_ERR_NOMEM, "cannot start %d worker threads", p->n_threads);
    tl_radix_init(&m->cache, &m->kv);
    if ((rc = tl_weights_resolve(m))) return rc;
    if ((rc = tl_cache_tiers_open(m))) return rc; /* hashes the weights as the file has them */
    tl_weights_move(m);
    if ((rc = tl_forward_init(m))) return rc;
    return tl_sched_init(m);
}

int tl_model_open(const char *path, tl_model_params params, tl_model **out) {
    if (!out) return tl_set_error(TL_ERR_INVALID_ARG, "out must not be NULL");
    *out = NULL;
    if (!path) return tl_set_error(TL_ERR_INVALID_ARG, "path must not be NULL");
    tl_kernels_init();
    tl_model *m = calloc(1, sizeof *m);
    if (!m) return tl_set_error(TL_ERR_NOMEM, "out of memory");
    m->params = params;
    pthread_mutex_init(&m->pools_mu, NULL);
    m->compute = &tl_cpu_compute; /* until a plugin attaches (tl_backend_select) */
    int rc = TL_OK;
    m->file = gguf_open(path);
    if (!m->file) { rc = TL_ERR_FORMAT; goto fail; }
    m->tok = tl_tokenizer_load(m->file);
    if (!m->tok) { rc = TL_ERR_FORMAT; goto fail; }
    if (params.vocab_only) {
        tl_chat_detect(m);
        *out = m;
        return TL_OK;
    }

    gguf_str arch;
    if (gguf_get_str(m->file, "general.architecture", &arch) != 1) {
        rc = tl_set_error(TL_ERR_FORMAT, "missing key 'general.architecture'");
        goto fail;
    }
    m->arch = find_arch(arch.ptr, arch.len);
    if (!m->arch) {
        char names[160] = "";
        for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "", archs[i].name);
        rc = tl_set_error(TL_ERR_UNSUPPORTED, "unsupported architecture '%.*s' (supported: %s)",
                          (int)(arch.len > 64 ? 64 : arch.len), arch.ptr, names);
        goto fail;
    }
    if ((rc = load_hparams(m))) goto fail;
    /* before the weights: LongRoPE's factors depend on it */
    m->max_seq_len = params.max_seq_len > 0 ? params.max_seq_len : m->hp.n_ctx_train;
    if (m->max_seq_len < 1 || m->max_seq_len > (1 << 22)) {
        rc = tl_set_error(TL_ERR_INVALID_ARG, "max_seq_len %d must be in [1, %d]", m->max_seq_len, 1 << 22);
        goto fail;
    }
    if (m->arch->layer_norm && m->max_seq_len > m->hp.n_ctx_train) { /* no embedding past them */
        rc = tl_set_error(TL_ERR_INVALID_ARG, "max_seq_len %d exceeds the %d positions %s has learned embeddings for",
                          m->max_seq_len, m->hp.n_ctx_train, m->arch->name);
        goto fail;
    }
    rc = load_weights(m);
    free(m->tensor_used);
    m->tensor_used = NULL;
    if (rc || (rc = load_loops(m))) goto fail;
    if (m->hp.n_vocab != tl_tokenizer_n_vocab(m->tok)) {
        rc = tl_set_error(TL_ERR_FORMAT, "tokenizer has %d tokens but token_embd.weight has %d rows",
                          tl_tokenizer_n_vocab(m->tok), m->hp.n_vocab);
        goto fail;
    }
    if ((rc = init_runtime(m))) goto fail;
    tl_chat_detect(m);
    *out = m;
    return TL_OK;
fail:;
    /* Keep the message: closing must not clobber it. */
    char msg[512];
    snprintf(msg, sizeof msg, "%s", tl_last_error());
    tl_model_close(m);
    tl_set_error(rc, "%s: %s", path, msg);
    return rc;
}

void tl_model_close(tl_model *m) {
    if (!m) return;
    tl_tokq_free(m); /* its thread reads the vocab and posts through the engine */
    tl_engine_stop(m);
    tl_sched_free(m); /* requests and pools let go of the cache first */
    tl_radix_destroy(&m->cache);
    tl_cache_tiers_close(m);
    tl_forward_free(m);
    tl_backend_close(m);
    tl_threadpool_free(m->tp);
    tl_kv_pool_destroy(&m->kv);
    for (int i = 0; i < m->n_owned_norms; i++) tl_free_aligned(m->owned_norms[i]);
    free(m->owned_norms);
    tl_free_aligned(m->weight_arena);
    free(m->layers);
    tl_tokenizer_free(m->tok);
    gguf_close(m->file);
    pthread_mutex_destroy(&m->pools_mu);
    free(m);
}

int tl_model_n_vocab(const tl_model *m) { return m ? tl_tokenizer_n_vocab(m->tok) : 0; }

/* KV bytes one token costs in layout l over the model's virtual layers at
 * the default loops (whole blocks spread over their tokens); 0 for a
 * vocab-only model, which has no KV layout (block_size 0). */
static size_t token_bytes(const tl_model *m, const tl_kv_layout *l) {
    return l->block_size ? l->block_bytes * (size_t)tl_model_depth(m, 0) / (size_t)l->block_size : 0;
}

int tl_model_get_info(const tl_model *m, tl_model_info *o) {
    if (!m || !o) return tl_set_error(TL_ERR_INVALID_ARG, "model and out must not be NULL");
    memset(o, 0, sizeof *o);
    snprintf(o->arch, sizeof o->arch, "%s", m->arch ? m->arch->name : "(vocab only)");
    o->n_vocab = tl_tokenizer_n_vocab(m->tok);
    o->n_embd = m->hp.n_embd;
    o->n_layer = m->hp.n_layer;
    o->n_head = m->hp.n_head;
    o->n_head_kv = m->hp.n_head_kv;
    o->head_dim = m->hp.head_dim;
    o->n_ff = m->hp.n_ff;
    o->n_ctx_train = m->hp.n_ctx_train;
    o->max_seq_len = m->max_seq_len;
    o->loop_start = m->loop_start;
    o->loop_end = m->loop_end;
    o->loop_default = m->loop_default;
    o->rope_freq_base = m->hp.rope.base;
    o->rope_freq_scale = m->hp.rope.freq_scale;
    o->rope_attn_factor = m->hp.rope.attn_factor;
    o->norm_eps = m->hp.norm_eps;
    o->bos = tl_tokenizer_bos(m->tok);
    o->eos = tl_tokenizer_eos(m->tok);
    o->n_threads = tl_threadpool_size(m->tp);
    o->kv_block_size = m->kv.block_size;
    o->kv_type = m->kv.kv_type;
    o->kv_blocks_total = m->kv.n_blocks;
    o->kv_blocks_free = m->kv.n_free;
    o->weight_bytes = m->weight_bytes;
    o->kv_bytes = (size_t)m->kv.n_blocks * m->kv.block_bytes;
    o->isa = tl_isa_name(tl_kernels_isa());
    o->backend = tl_backend_name(m);
    const tl_kv_layout *l = &m->kv.layout;
    tl_kv_mode mode = {l->type_k, l->type_v, l->store_h};
    o->kv_type_v = l->type_v;
    o->kv_store_h = l->store_h;
    tl_kv_mode_name(&mode, o->kv_mode, sizeof o->kv_mode);
    o->kv_token_bytes = token_bytes(m, l);
    return TL_OK;
}

size_t tl_model_kv_token_bytes(const tl_model *m, const char *mode_name) {
    tl_kv_mode mode;
    tl_kv_layout l;
    if (!m || !m->kv.n_blocks) {
        tl_set_error(TL_ERR_INVALID_ARG, "tl_model_kv_token_bytes: no model with a KV cache");
        return 0;
    }
    if (tl_kv_mode_parse(mode_name, "mode", &mode)) return 0;
    if (tl_kv_layout_init(&l, mode.type_k, mode.type_v, mode.store_h, m->kv.block_size, m->hp.n_head_kv,
                          m->hp.head_dim, m->hp.n_embd)) {
        tl_set_error(TL_ERR_UNSUPPORTED, "KV mode %s needs an even row length", mode_name);
        return 0;
    }
    return token_bytes(m, &l);
}

/* ---- tokenizer wrappers ------------------------------------------------------- */

int tl_tokenize(const tl_model *m, const char *text, int len, int add_special, int parse_special, int32_t *out,
                int cap) {
    if (!m || (!text && len > 0) || len < 0 || cap < 0)
        return tl_set_error(TL_ERR_INVALID_ARG, "tl_tokenize: bad argument (len %d, cap %d)", len, cap);
    return tl_tokenizer_encode(m->tok, text ? text : "", (size_t)len, add_special, parse_special, out, cap);
}

int tl_detokenize(const tl_model *m, const int32_t *ids, int n, char *out, int cap) {
    if (!m || (!ids && n > 0) || n < 0 || cap < 0)
        return tl_set_error(TL_ERR_INVALID_ARG, "tl_detokenize: bad argument (n %d, cap %d)", n, cap);
    int nv = tl_tokenizer_n_vocab(m->tok);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= nv)
            return tl_set_error(TL_ERR_INVALID_ARG, "token id %d at index %d is outside the vocab [0, %d)", ids[i],
                                i, nv);
    return tl_tokenizer_decode(m->tok, ids, n, out, cap);
}

int tl_token_to_piece(const tl_model *m, int32_t id, char *out, int cap) {
    if (!m || id < 0 || id >= tl_tokenizer_n_vocab(m->tok) || cap < 0)
        return tl_set_error(TL_ERR_INVALID_ARG, "token id %d is outside the vocab", id);
    return tl_tokenizer_piece(m->tok, id, 0, out, cap);
}
