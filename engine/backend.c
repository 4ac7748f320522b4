/* backend.c - choosing a compute backend at run time and running a batch
 * through a plugin. CPU (forward.c) is built in; the CUDA backend is the
 * plugin libtinyloop-cuda.so, loaded with dlopen when present, so this
 * library never links a CUDA runtime. TINYLOOP_BACKEND=cpu|cuda forces a
 * choice; unset, a plugin is used when it loads and finds a device. */
#include <dlfcn.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "forward.h"
#include "model.h"
#include "util.h"

struct tl_backend_state {
    void *dl;
    const tl_backend_ops *ops;
    void *ctx;
    tl_backend_model desc;
    int *layer_window;            /* (n_layer) */
    /* per-batch staging, grown as needed */
    int32_t *tokens, *pos, *tok_seq;
    const int32_t **ids;
    int *n_logical, *window, *phys;
    int cap_tokens, cap_seq, cap_depth;
};

const char *tl_backend_name(const tl_model *m) { return m->backend ? m->backend->ops->name : "cpu"; }

static int copy_hook(void *ud, int dst, int src) {
    struct tl_backend_state *b = ud;
    char msg[256] = "";
    if (b->ops->copy_block(b->ctx, dst, src, msg, sizeof msg) != 0)
        return tl_set_error(TL_ERR_STATE, "%s backend: block copy %d -> %d failed: %s", b->ops->name, src, dst, msg);
    return 0;
}

static int io_hook(void *ud, int id, void *host, int to_device) {
    struct tl_backend_state *b = ud;
    char msg[256] = "";
    if (b->ops->kv_io(b->ctx, id, host, to_device, msg, sizeof msg) != 0)
        return tl_set_error(TL_ERR_STATE, "%s backend: KV block %d copy %s failed: %s", b->ops->name, id,
                            to_device ? "host -> device" : "device -> host", msg);
    return 0;
}

/* The CUDA driver reaches a GPU only through these nodes (WSL: /dev/dxg).
 * Without any, the plugin's init would fail after dlopen had mapped a
 * ~600 MB library and its runtime: ~150 MiB of transient RSS and startup
 * time on every GPU-less machine, so auto mode does not try. */
static int gpu_device_node_exists(void) {
    static const char *const nodes[] = {"/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg"};
    for (size_t i = 0; i < sizeof nodes / sizeof nodes[0]; i++)
        if (access(nodes[i], F_OK) == 0) return 1;
    return 0;
}

/* Tries the places a plugin may live; fills `tried` with what was tried. */
static void *open_plugin(const char *file, char *tried, size_t cap) {
    char paths[4][1024];
    int n = 0;
    const char *env = getenv("TINYLOOP_CUDA_LIB");
    if (env && *env) snprintf(paths[n++], sizeof paths[0], "%s", env);
    Dl_info info;
    if (dladdr((void *)&tl_backend_name, &info) && info.dli_fname) {
        char dir[900];
        snprintf(dir, sizeof dir, "%s", info.dli_fname);
        char *slash = strrchr(dir, '/');
        if (slash) {
            *slash = 0;
            snprintf(paths[n++], sizeof paths[0], "%s/%s", dir, file);
            snprintf(paths[n++], sizeof paths[0], "%s/../build/%s", dir, file);
        }
    }
    snprintf(paths[n++], sizeof paths[0], "%s", file);
    size_t used = 0;
    tried[0] = 0;
    for (int i = 0; i < n; i++) {
        void *dl = dlopen(paths[i], RTLD_NOW | RTLD_LOCAL);
        if (dl) return dl;
        const char *why = dlerror();
        used += (size_t)snprintf(tried + used, used < cap ? cap - used : 0, "%s%s (%s)", i ? "; " : "", paths[i],
                                 why ? why : "not found");
        if (used >= cap) used = cap - 1;
    }
    return NULL;
}

void tl_backend_describe(const tl_model *m, int n_blocks, const tl_kv_layout *kv, int *layer_window,
                         tl_backend_model *d) {
    const tl_hparams *hp = &m->hp;
    for (int l = 0; l < hp->n_layer; l++) layer_window[l] = tl_model_layer_window(m, l);
    *d = (tl_backend_model){.abi = TL_BACKEND_ABI, .n_vocab = hp->n_vocab, .n_embd = hp->n_embd,
                            .n_layer = hp->n_layer, .n_head = hp->n_head, .n_head_kv = hp->n_head_kv,
                            .head_dim = hp->head_dim, .n_ff = hp->n_ff, .n_rot = hp->n_rot, .norm_eps = hp->norm_eps,
                            .rope_base = hp->rope.base, .rope_base_swa = m->arch->rope_base_swa,
                            .rope_type = m->arch->rope_type, .ffn_act = m->arch->ffn_act,
                            .embd_scale = m->arch->embd_scale, .layer_window = layer_window,
                            .rope_freqs = m->rope_freqs, .tok_embd = m->tok_embd, .output = m->output,
                            .output_norm = m->output_norm, .layers = m->layers, .kv_blocks = n_blocks,
                            .kv_block_size = kv->block_size, .kv_type = kv->type_k,
                            .kv_layout = *kv, .max_batch_tokens = 4096,
                            .max_seq_len = m->max_seq_len};
    d->kv_mem = (size_t)n_blocks * kv->block_bytes;
}

void tl_backend_close(tl_model *m) {
    struct tl_backend_state *b = m->backend;
    if (!b) return;
    if (b->ctx) b->ops->free(b->ctx);
    if (b->dl) dlclose(b->dl);
    free(b->layer_window);
    free(b->tokens);
    free(b->pos);
    free(b->tok_seq);
    free(b->ids);
    free(b->n_logical);
    free(b->window);
    free(b->phys);
    free(b);
    m->backend = NULL;
    m->compute = &tl_cpu_compute;
}

int tl_backend_max_tokens(const tl_model *m) { return m->backend ? m->backend->desc.max_batch_tokens : INT_MAX; }

int tl_backend_sample_k(const tl_model *m) { return m->backend ? m->backend->ops->max_sample_k : 0; }

/* 1, with what into why, when the model needs something the plugin does
 * not compute: it applies unscaled RoPE on every layer, RMSNorm, q.k by
 * 1/sqrt(head_dim), no soft-capping, attention then a dense FFN, and no
 * output-projection, FFN or logits bias. */
static int cpu_only(const tl_model *m, char *why, size_t cap) {
    const tl_rope_params *r = &m->hp.rope;
    if (m->arch->nope_every > 0)
        snprintf(why, cap, "%s's layers without RoPE", m->arch->name);
    else if (m->arch->softcap || m->arch->layer_norm || m->hp.attn_scale != 1.0f / sqrtf((float)m->hp.head_dim))
        snprintf(why, cap, "%s's soft-capping / LayerNorm / attention scale", m->arch->name);
    else if (m->hp.parallel || m->output_b)
        snprintf(why, cap, "%s's parallel attention and FFN / output bias", m->arch->name);
    else if (m->arch->qk_norm == TL_QKN_FULL || m->arch->no_pre_norm)
        snprintf(why, cap, "%s's whole-row Q/K norms / post-only norms", m->arch->name);
    else if (m->alibi || m->tok_norm)
        snprintf(why, cap, "%s's ALiBi / embedding norm", m->arch->name);
    else if (m->hp.n_expert)
        snprintf(why, cap, "%s's mixture-of-experts FFN", m->arch->name);
    else if (m->arch->multipliers)
        snprintf(why, cap, "%s's embedding / residual / logit multipliers", m->arch->name);
    else if (r->freq_scale != 1.0f || r->attn_factor != 1.0f || r->ext_factor != 0.0f)
        snprintf(why, cap, "scaled RoPE (freq_scale %g, attn_factor %g, ext_factor %g)", r->freq_scale, r->attn_factor,
                 r->ext_factor);
    else {
        for (int l = 0; l < m->hp.n_layer; l++)
            if (m->layers[l].bo || m->layers[l].b_up || m->layers[l].b_down) {
                snprintf(why, cap, "the output / FFN biases of layer %d", l);
                return 1;
            }
        return 0;
    }
    return 1;
}

int tl_backend_select(tl_model *m, int *n_blocks, const tl_kv_layout *kv, int kv_auto, int kv_blocks_max) {
    const char *want = getenv("TINYLOOP_BACKEND");
    if (want && (!strcmp(want, "cpu") || !*want)) return TL_OK;
    int forced = want && !strcmp(want, "cuda");
    if (want && !forced && strcmp(want, "auto"))
        return tl_set_error(TL_ERR_INVALID_ARG, "TINYLOOP_BACKEND='%s' is not cpu, cuda or auto", want);
    char why[160];
    if (cpu_only(m, why, sizeof why)) {
        if (forced) return tl_set_error(TL_ERR_UNSUPPORTED, "TINYLOOP_BACKEND=cuda: %s run on the CPU only", why);
        return TL_OK;
    }
    const char *lib = getenv("TINYLOOP_CUDA_LIB");
    if (!forced && !(lib && *lib) && !gpu_device_node_exists()) return TL_OK; /* a plugin named by path is still tried */
    char tried[2048];
    void *dl = open_plugin("libtinyloop-cuda.so", tried, sizeof tried);
    if (!dl) {
        if (forced) return tl_set_error(TL_ERR_UNSUPPORTED, "TINYLOOP_BACKEND=cuda: no CUDA backend plugin; tried %s", tried);
        return TL_OK;
    }
    tl_backend_plugin_fn entry = (tl_backend_plugin_fn)dlsym(dl, "tl_backend_plugin_v1");
    const tl_backend_ops *ops = entry ? entry() : NULL;
    if (!ops || ops->abi != TL_BACKEND_ABI) {
        dlclose(dl);
        if (forced)
            return tl_set_error(TL_ERR_UNSUPPORTED, "TINYLOOP_BACKEND=cuda: the plugin has no tl_backend_plugin_v1 of ABI %d",
                                TL_BACKEND_ABI);
        return TL_OK;
    }
    struct tl_backend_state *b = calloc(1, sizeof *b);
    if (b) b->layer_window = malloc((size_t)m->hp.n_layer * sizeof *b->layer_window);
    if (!b || !b->layer_window) {
        free(b);
        dlclose(dl);
        return tl_set_error(TL_ERR_NOMEM, "out of memory");
    }
    b->dl = dl;
    b->ops = ops;
    tl_backend_describe(m, *n_blocks, kv, b->layer_window, &b->desc);
    b->desc.kv_auto = kv_auto;
    b->desc.kv_blocks_max = kv_blocks_max > *n_blocks ? kv_blocks_max : *n_blocks;
    char msg[512] = "";
    if (ops->init(&b->desc, &b->ctx, msg, sizeof msg) != 0) {
        b->ctx = NULL;
        m->backend = b;
        tl_backend_close(m);
        /* No device: the CPU serves unless CUDA was asked for. */
        if (forced) return tl_set_error(TL_ERR_UNSUPPORTED, "TINYLOOP_BACKEND=cuda: %s", msg);
        return TL_OK;
    }
    m->backend = b;
    m->compute = &tl_plugin_compute;
    int got = ops->kv_blocks ? ops->kv_blocks(b->ctx) : *n_blocks;
    if (got < *n_blocks || got > b->desc.kv_blocks_max) {
        tl_backend_close(m);
        return tl_set_error(TL_ERR_STATE, "%s backend: arena of %d blocks; asked for %d..%d", ops->name, got,
                            *n_blocks, b->desc.kv_blocks_max);
    }
    *n_blocks = got;
    return TL_OK;
}

void tl_backend_attach_pool(tl_model *m) {
    if (!m->backend) return;
    m->kv.copy_hook = copy_hook;
    m->kv.io_hook = m->backend->ops->kv_io ? io_hook : NULL; /* NULL: no KV tiers (cache_tier.c) */
    m->kv.hook_ud = m->backend;
}

static int grow(void **p, int *cap, int need, size_t elem) {
    if (need <= *cap) return 0;
    int n = *cap ? *cap : 64;
    while (n < need) n *= 2;
    void *q = realloc(*p, (size_t)n * elem);
    if (!q) return -1;
    *p = q;
    *cap = n;
    return 0;
}

static int plugin_forward(tl_model *m, tl_seq **seqs, const int32_t *const *tokens, const int *n_tokens, int n_seq,
                          int T, float *logits, const tl_forward_opts *opts) {
    struct tl_backend_state *b = m->backend;
    if (T > b->desc.max_batch_tokens)
        return tl_set_error(TL_ERR_INVALID_ARG, "%s backend: a batch of %d tokens exceeds its limit of %d",
                            b->ops->name, T, b->desc.max_batch_tokens);
    int depth = seqs[0]->bt.depth, ct = b->cap_tokens, cs = b->cap_seq, cd = b->cap_depth;
    if (grow((void **)&b->tokens, &ct, T, sizeof *b->tokens) || (ct = b->cap_tokens, 0) ||
        grow((void **)&b->pos, &ct, T, sizeof *b->pos) || (ct = b->cap_tokens, 0) ||
        grow((void **)&b->tok_seq, &ct, T, sizeof *b->tok_seq) ||
        grow((void **)&b->ids, &cs, n_seq, sizeof *b->ids) || (cs = b->cap_seq, 0) ||
        grow((void **)&b->n_logical, &cs, n_seq, sizeof *b->n_logical) || (cs = b->cap_seq, 0) ||
        grow((void **)&b->window, &cs, n_seq, sizeof *b->window) ||
        grow((void **)&b->phys, &cd, depth, sizeof *b->phys))
        return tl_set_error(TL_ERR_NOMEM, "out of memory for a batch of %d tokens", T);
    b->cap_tokens = ct;
    b->cap_seq = cs;
    b->cap_depth = cd;
    int t = 0;
    for (int i = 0; i < n_seq; i++) {
        for (int j = 0; j < n_tokens[i]; j++, t++) {
            b->tokens[t] = tokens[i][j];
            b->pos[t] = seqs[i]->n_pos + j;
            b->tok_seq[t] = i;
        }
        b->ids[i] = seqs[i]->bt.ids;
        b->n_logical[i] = seqs[i]->bt.n_logical;
        b->window[i] = seqs[i]->window;
    }
    for (int vl = 0; vl < depth; vl++) b->phys[vl] = tl_model_phys_layer(m, seqs[0]->loops, vl);
    const int *want_logits = opts->want_logits;
    int *want = NULL;
    if (!want_logits) { /* every sequence wants its logits, or none without a buffer (a resume build) */
        want = malloc((size_t)n_seq * sizeof *want);
        if (!want) return tl_set_error(TL_ERR_NOMEM, "out of memory");
        for (int i = 0; i < n_seq; i++) want[i] = logits != NULL;
    }
    tl_backend_batch batch = {.n_seq = n_seq, .T = T, .tokens = b->tokens, .pos = b->pos, .tok_seq = b->tok_seq,
                              .block_ids = b->ids, .n_logical = b->n_logical, .window = b->window, .depth = depth,
                              .phys_layer = b->phys, .want_logits = want_logits ? want_logits : want,
                              .sample = opts->sample, .ids_out = opts->ids_out,
                              .x_in = opts->vl_begin > 0 ? opts->x_in : NULL, .vl_begin = opts->vl_begin,
                              .x_capture = opts->vl_capture >= 0 ? opts->x_capture : NULL,
                              .vl_capture = opts->vl_capture};
    char msg[512] = "";
    int rc = b->ops->forward(b->ctx, &batch, logits, msg, sizeof msg);
    free(want);
    if (rc) return tl_set_error(TL_ERR_STATE, "%s backend: %s", b->ops->name, msg);
    return TL_OK;
}

const tl_compute_ops tl_plugin_compute = {"plugin", plugin_forward};
