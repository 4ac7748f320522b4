/* model.c - opening a GGUF model: weight binding with shape checks (fused
 * tensors as row views, every file tensor accounted for), loop block, KV
 * pool and thread pool. The architecture table and hyperparameters are
 * model_hparams.c's. */
#include "model.h"

#include <limits.h>
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

tl_model_params tl_model_default_params(void) {
    tl_model_params p;
    memset(&p, 0, sizeof p);
    p.kv_type = TL_KV_DEFAULT;
    p.loop_start = -1;
    p.loop_end = -1;
    return p;
}

/* ---- weights ------------------------------------------------------------ */

/* The n matrices of one tensor [n_in, n_out, n] (n > 1: a 3-D tensor of
 * experts) as row views into ws[0..n); 1 when an optional one is absent. */
static int bind_matrices(tl_model *m, tl_weight *ws, const char *name, int64_t n_in, int64_t n_out, int n,
                         int optional) {
    const gguf_tensor *t = gguf_find_tensor(m->file, name);
    if (!t) {
        if (optional) return 1;
        return tl_set_error(TL_ERR_FORMAT, "missing tensor '%s'", name);
    }
    if (t->ne[0] != n_in || t->ne[1] != n_out || t->ne[2] != n || t->ne[3] != 1) {
        char third[24] = "";
        if (n > 1) snprintf(third, sizeof third, ", %d", n);
        return tl_set_error(TL_ERR_FORMAT, "tensor '%s' has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld%s]",
                            name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                            (long long)t->ne[3], (long long)n_in, (long long)n_out, third);
    }
    if (!tl_type_info(t->type)->supported)
        return tl_set_error(TL_ERR_UNSUPPORTED, "tensor '%s' has type %s (%d), which tinyloop cannot compute with", name,
                            tl_type_info(t->type)->name ? tl_type_info(t->type)->name : "unknown", t->type);
    const size_t bytes = tl_row_size(t->type, n_in) * (size_t)n_out;
    for (int e = 0; e < n; e++)
        ws[e] = (tl_weight){.data = (const uint8_t *)t->data + (size_t)e * bytes, .type = t->type, .n_in = n_in,
                            .n_out = n_out};
    m->weight_bytes += t->size;
    m->tensor_used[t - m->file->tensors] = 1;
    return TL_OK;
}

static int bind_weight(tl_model *m, tl_weight *w, const char *name, int64_t n_in, int64_t n_out, int optional) {
    return bind_matrices(m, w, name, n_in, n_out, 1, optional);
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
        return tl_set_error(TL_ERR_UNSUPPORTED, "tensor '%s' has type %s (%d), which tinyloop cannot compute with", name,
                            tl_type_info(t->type)->name ? tl_type_info(t->type)->name : "unknown", t->type);
    /* every vector bound is a tensor of its own; a file cannot bind more */
    if (m->n_owned_norms >= m->owned_cap)
        return tl_set_error(TL_ERR_FORMAT, "tensor '%s': more vectors bound than the file has tensors", name);
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

/* Layer l's mixture-of-experts FFN (llama.cpp's names): the router
 * ffn_gate_inp, the experts' ffn_{gate,up,down}_exps, and where the model
 * has one the shared expert ffn_*_shexp (Qwen 2 MoE's with its gate row). */
static int bind_moe(tl_model *m, tl_layer *L, int l) {
    const tl_hparams *hp = &m->hp;
    const int D = hp->n_embd, E = hp->n_expert, F = hp->n_ff_exp, S = hp->n_ff_shexp;
    char n[96];
    int rc;
#define NAME(s) (snprintf(n, sizeof n, "blk.%d.%s.weight", l, s), n)
    if (!(L->x_gate = calloc((size_t)E * 3, sizeof *L->x_gate)))
        return tl_set_error(TL_ERR_NOMEM, "out of memory for %d experts", E);
    L->x_up = L->x_gate + E;
    L->x_down = L->x_gate + 2 * E;
    if ((rc = bind_weight(m, &L->router, NAME("ffn_gate_inp"), D, E, 0)) ||
        (rc = bind_matrices(m, L->x_gate, NAME("ffn_gate_exps"), D, F, E, 0)) ||
        (rc = bind_matrices(m, L->x_up, NAME("ffn_up_exps"), D, F, E, 0)) ||
        (rc = bind_matrices(m, L->x_down, NAME("ffn_down_exps"), F, D, E, 0)))
        return rc;
    if ((m->arch->moe_shared == TL_SHEXP_GATED &&
         (rc = bind_weight(m, &L->sh_router, NAME("ffn_gate_inp_shexp"), D, 1, 0))) ||
        (S > 0 && ((rc = bind_weight(m, &L->sh_gate, NAME("ffn_gate_shexp"), D, S, 0)) ||
                   (rc = bind_weight(m, &L->sh_up, NAME("ffn_up_shexp"), D, S, 0)) ||
                   (rc = bind_weight(m, &L->sh_down, NAME("ffn_down_shexp"), S, D, 0)))))
        return rc;
#undef NAME
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
    /* Norms and biases: a layer reads up to 12 of them (gemma3 with every
     * bias), so size by the file's tensors, each bound at most once. */
    m->owned_cap = m->file->n_tensors < INT_MAX ? (int)m->file->n_tensors + 1 : INT_MAX;
    m->owned_norms = calloc((size_t)m->owned_cap, sizeof(float *));
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
    const int norms = !m->arch->norm_free; /* olmo's LayerNorms have no tensors */
    if (norms && (rc = bind_norm(m, &m->output_norm, "output_norm.weight", hp->n_embd, 0))) return rc;
    if ((rc = bind_norm(m, &m->rope_freqs, "rope_freqs.weight", hp->n_rot / 2, 1)) < 0) return rc;
    /* LayerNorm biases: required, absent (command-r) or where the file has them (mpt) */
    const int ln_bias = norms && m->arch->layer_norm && m->arch->ln_bias != TL_LNB_NONE;
    const int ln_opt = m->arch->ln_bias == TL_LNB_OPTIONAL;
    if ((m->arch->tok_norm && ((rc = bind_norm(m, &m->tok_norm, "token_embd_norm.weight", hp->n_embd, 0)) ||
                               (rc = bind_norm(m, &m->tok_norm_b, "token_embd_norm.bias", hp->n_embd, 0)))) ||
        (ln_bias && (rc = bind_norm(m, &m->output_norm_b, "output_norm.bias", hp->n_embd, ln_opt)) < 0) ||
        (m->arch->learned_pos &&
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
    if ((rc = bind_norm(m, &m->output_b, "output.bias", hp->n_vocab, 1)) < 0) return rc;

    for (int l = 0; l < hp->n_layer; l++) {
        tl_layer *L = &m->layers[l];
        char n[96];
#define NAME(s) (snprintf(n, sizeof n, "blk.%d.%s.weight", l, s), n)
#define NAME_B(s) (snprintf(n, sizeof n, "blk.%d.%s.bias", l, s), n)
        const int pre = norms && !m->arch->no_pre_norm; /* olmo2 norms after, not before */
        if (pre && (rc = bind_norm(m, &L->attn_norm, NAME("attn_norm"), hp->n_embd, 0))) return rc;
        const int fused = gguf_find_tensor(m->file, NAME("attn_qkv")) != NULL;
        if (fused) { /* Q, K, V rows in one tensor */
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
        /* phi2's FFN reads the attention's norm: it has no ffn_norm */
        const int ffn_norm = pre && !tl_par_shared_norm(hp->parallel);
        if (rc || (rc = bind_weight(m, &L->wo, NAME("attn_output"), q_dim, hp->n_embd, 0)) ||
            (ffn_norm && (rc = bind_norm(m, &L->ffn_norm, NAME("ffn_norm"), hp->n_embd, 0))))
            return rc;
        if (hp->n_expert) {
            if ((rc = bind_moe(m, L, l))) return rc;
        } else {
            const gguf_tensor *up = gguf_find_tensor(m->file, NAME("ffn_up"));
            if (m->arch->plain_ffn) { /* act(up) -> down, no gate */
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
        }
        /* Biases are optional in any architecture (qwen2 files have them);
         * a fused QKV's are attn_qkv.bias, and separate ones beside it stay
         * unread (refused below) rather than replace it */
        if (!fused && ((rc = bind_norm(m, &L->bq, NAME_B("attn_q"), q_dim, 1)) < 0 ||
            (rc = bind_norm(m, &L->bk, NAME_B("attn_k"), kv_dim, 1)) < 0 ||
            (rc = bind_norm(m, &L->bv, NAME_B("attn_v"), kv_dim, 1)) < 0))
            return rc;
        const int full = m->arch->qk_norm == TL_QKN_FULL;
        if (m->arch->qk_norm &&
            ((rc = bind_norm(m, &L->q_norm, NAME("attn_q_norm"), full ? q_dim : hp->head_dim, 0)) ||
             (rc = bind_norm(m, &L->k_norm, NAME("attn_k_norm"), full ? kv_dim : hp->head_dim, 0))))
            return rc;
        if (ln_bias &&
            ((rc = bind_norm(m, &L->attn_norm_b, NAME_B("attn_norm"), hp->n_embd, ln_opt)) < 0 ||
             (ffn_norm && (rc = bind_norm(m, &L->ffn_norm_b, NAME_B("ffn_norm"), hp->n_embd, ln_opt)) < 0)))
            return rc;
        /* the output projection's and the FFN's biases, where a file has them
         * (gpt2); a MoE layer has no dense FFN for them (refused as unread) */
        if ((rc = bind_norm(m, &L->bo, NAME_B("attn_output"), hp->n_embd, 1)) < 0 ||
            (!hp->n_expert && ((rc = bind_norm(m, &L->b_up, NAME_B("ffn_up"), hp->n_ff, 1)) < 0 ||
                               (rc = bind_norm(m, &L->b_down, NAME_B("ffn_down"), hp->n_embd, 1)) < 0)))
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
    m->arch = tl_arch_find(arch.ptr, arch.len);
    if (!m->arch) {
        char names[512];
        tl_arch_names(names, sizeof names);
        rc = tl_set_error(TL_ERR_UNSUPPORTED, "unsupported architecture '%.*s' (supported: %s)",
                          (int)(arch.len > 64 ? 64 : arch.len), arch.ptr, names);
        goto fail;
    }
    if ((rc = tl_model_load_hparams(m))) goto fail;
    /* before the weights: LongRoPE's factors depend on it */
    m->max_seq_len = params.max_seq_len > 0 ? params.max_seq_len : m->hp.n_ctx_train;
    if (m->max_seq_len < 1 || m->max_seq_len > (1 << 22)) {
        rc = tl_set_error(TL_ERR_INVALID_ARG, "max_seq_len %d must be in [1, %d]", m->max_seq_len, 1 << 22);
        goto fail;
    }
    if (m->arch->learned_pos && m->max_seq_len > m->hp.n_ctx_train) { /* no embedding past them */
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
    for (int i = 0; m->layers && i < m->hp.n_layer; i++) free(m->layers[i].x_gate);
    free(m->alibi);
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
    o->n_expert = m->hp.n_expert;
    o->n_expert_used = m->hp.n_expert_used;
    o->n_ff_expert = m->hp.n_expert ? m->hp.n_ff_exp : 0;
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
