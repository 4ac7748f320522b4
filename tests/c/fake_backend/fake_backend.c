/* fake_backend.c - a backend plugin (engine/backend.h) that tests the
 * engine's side of the interface on machines without a GPU: block tables,
 * copy-on-write through copy_block, the KV tiers through kv_io, the arena
 * size it reports, device sampling parameters and errors. build/tests/libtl-fake-backend.so,
 * loaded by test_backend through TINYLOOP_CUDA_LIB.
 *
 * Its "model" is a hash. Storing a token writes hash(token, position,
 * layer) into the token's KV slot of every virtual layer; a sequence's
 * logits are a hash of every slot it can see (positions inside its
 * window, read through its block table), spread over [-4, 4). So a cached
 * request gets the logits of an uncached one only if the engine handed it
 * blocks holding exactly that prefix's KV. Rows marked on_device are
 * sampled with the engine's own chain (engine/sampler.c, compiled in), the
 * penalty applied from the ids the engine sent. kv_io moves a block's
 * slots as the first bytes of its block_bytes (the rest zero), so a block
 * spilled to a tier and restored into another id reads as it was written.
 *
 * Environment: FAKE_BACKEND_NO_SAMPLING=1 (max_sample_k 0: the host
 * samples), FAKE_BACKEND_FAIL_AT=N (the N-th forward call fails),
 * FAKE_BACKEND_BAD_IDS=1 (sampled ids outside the vocab),
 * FAKE_BACKEND_NO_KV_IO=1 (no kv_io: the engine refuses KV tiers),
 * FAKE_BACKEND_IO_FAIL=1 (kv_io into the arena fails). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "sampler.h"

typedef struct fake {
    int n_vocab, bs, kv_blocks;
    size_t block_bytes; /* the engine's block (kv_layout.block_bytes): what kv_io moves */
    uint64_t *slots; /* kv_blocks * bs: what each KV slot holds (0 = never written) */
    float *row;      /* n_vocab */
    tl_sampler smp;
    int forwards, fail_at, bad_ids, io_fail;
} fake;

static uint64_t mix(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int fail(char *msg, size_t cap, const char *what, long a, long b) {
    snprintf(msg, cap, "fake backend: %s (%ld, %ld)", what, a, b);
    return -1;
}

static void fk_free(void *ctx) {
    fake *f = ctx;
    if (!f) return;
    tl_sampler_free(&f->smp);
    free(f->slots);
    free(f->row);
    free(f);
}

static int fk_init(const tl_backend_model *m, void **ctx, char *msg, size_t cap) {
    *ctx = NULL;
    if (m->abi != TL_BACKEND_ABI) return fail(msg, cap, "ABI mismatch", m->abi, TL_BACKEND_ABI);
    fake *f = calloc(1, sizeof *f);
    if (!f) return fail(msg, cap, "out of memory", 0, 0);
    f->n_vocab = m->n_vocab;
    f->bs = m->kv_block_size;
    f->block_bytes = m->kv_layout.block_bytes;
    if (f->block_bytes < (size_t)f->bs * sizeof *f->slots) {
        free(f);
        return fail(msg, cap, "a KV block too small for its slots (bytes, slots)", (long)m->kv_layout.block_bytes,
                    m->kv_block_size);
    }
    /* as a device with plenty of memory: kv_auto takes the cap */
    f->kv_blocks = m->kv_auto ? m->kv_blocks_max : m->kv_blocks;
    const char *env = getenv("FAKE_BACKEND_FAIL_AT");
    f->fail_at = env ? atoi(env) : 0;
    env = getenv("FAKE_BACKEND_BAD_IDS");
    f->bad_ids = env && *env == '1';
    env = getenv("FAKE_BACKEND_IO_FAIL");
    f->io_fail = env && *env == '1';
    f->slots = calloc((size_t)f->kv_blocks * f->bs, sizeof *f->slots);
    f->row = malloc((size_t)f->n_vocab * sizeof *f->row);
    tl_sampling_params sp = {.repeat_penalty = 1.0f};
    if (!f->slots || !f->row || tl_sampler_init(&f->smp, &sp, f->n_vocab)) {
        fk_free(f);
        return fail(msg, cap, "out of memory", 0, 0);
    }
    *ctx = f;
    return 0;
}

/* The slot of (sequence s, position pos, virtual layer vl), or -1. */
static long slot_of(const fake *f, const tl_backend_batch *b, int s, int pos, int vl) {
    int lb = pos / f->bs;
    if (lb >= b->n_logical[s]) return -1;
    int id = b->block_ids[s][(size_t)lb * b->depth + vl];
    if (id < 0 || id >= f->kv_blocks) return -1;
    return (long)id * f->bs + pos % f->bs;
}

static void sample_row(fake *f, const tl_backend_sample *p, const float *logits, int32_t *out) {
    memcpy(f->row, logits, (size_t)f->n_vocab * sizeof *f->row);
    for (int i = 0; i < p->n_penalty; i++) {
        float *x = &f->row[p->penalty_ids[i]];
        *x = *x <= 0 ? *x * p->repeat_penalty : *x / p->repeat_penalty;
    }
    f->smp.p = (tl_sampling_params){.temperature = p->temperature, .top_k = p->top_k, .top_p = p->top_p,
                                    .min_p = p->min_p, .repeat_penalty = 1.0f};
    *out = tl_sampler_sample_u(&f->smp, f->row, NULL, 0, p->u);
}

static int fk_forward(void *ctx, const tl_backend_batch *b, float *logits, char *msg, size_t cap) {
    fake *f = ctx;
    if (++f->forwards == f->fail_at) return fail(msg, cap, "injected failure at forward", f->forwards, 0);
    for (int t = 0; t < b->T; t++) {
        int s = b->tok_seq[t];
        if (s < 0 || s >= b->n_seq || b->tokens[t] < 0 || b->tokens[t] >= f->n_vocab)
            return fail(msg, cap, "bad token or sequence", t, s);
        for (int vl = 0; vl < b->depth; vl++) {
            long sl = slot_of(f, b, s, b->pos[t], vl);
            if (sl < 0) return fail(msg, cap, "no block for a new token (token, position)", t, b->pos[t]);
            f->slots[sl] = mix(((uint64_t)b->tokens[t] << 32) ^ (uint64_t)b->pos[t] * 131 ^ (uint64_t)vl);
        }
    }
    int row = 0;
    for (int s = 0, t = 0; s < b->n_seq; s++) {
        while (t + 1 < b->T && b->tok_seq[t + 1] == s) t++;
        int last = b->pos[t];
        t++;
        if (!b->want_logits[s]) continue;
        int w = b->window[s], lo = w > 0 && last >= w ? last - w + 1 : 0;
        uint64_t acc = 0;
        for (int j = lo; j <= last; j++)
            for (int vl = 0; vl < b->depth; vl++) {
                long sl = slot_of(f, b, s, j, vl);
                if (sl < 0 || f->slots[sl] == 0) return fail(msg, cap, "a visible position has no KV (seq, pos)", s, j);
                acc = mix(acc ^ f->slots[sl]);
            }
        float *out = logits + (size_t)row * f->n_vocab;
        for (int v = 0; v < f->n_vocab; v++)
            out[v] = (float)(mix(acc ^ ((uint64_t)v << 20)) >> 40) / (float)(1 << 24) * 8.0f - 4.0f;
        if (b->sample && b->sample[row].on_device) {
            if (!b->ids_out) return fail(msg, cap, "device sampling without ids_out", row, 0);
            sample_row(f, &b->sample[row], out, &b->ids_out[row]);
            if (f->bad_ids) b->ids_out[row] = f->n_vocab; /* a broken device sampler */
        }
        row++;
    }
    return 0;
}

static int fk_copy(void *ctx, int dst, int src, char *msg, size_t cap) {
    fake *f = ctx;
    if (dst < 0 || src < 0 || dst >= f->kv_blocks || src >= f->kv_blocks) return fail(msg, cap, "copy ids", dst, src);
    memcpy(f->slots + (size_t)dst * f->bs, f->slots + (size_t)src * f->bs, (size_t)f->bs * sizeof *f->slots);
    return 0;
}

static int fk_kv_io(void *ctx, int id, void *host, int to_device, char *msg, size_t cap) {
    fake *f = ctx;
    if (id < 0 || id >= f->kv_blocks || !host) return fail(msg, cap, "kv_io block id", id, f->kv_blocks);
    if (to_device && f->io_fail) return fail(msg, cap, "injected kv_io failure (block, to_device)", id, to_device);
    uint64_t *slots = f->slots + (size_t)id * f->bs;
    const size_t used = (size_t)f->bs * sizeof *slots;
    if (to_device) {
        memcpy(slots, host, used);
    } else {
        memcpy(host, slots, used);
        memset((uint8_t *)host + used, 0, f->block_bytes - used);
    }
    return 0;
}

static int fk_kv_blocks(void *ctx) { return ((fake *)ctx)->kv_blocks; }

/* Two tables: models opened with and without device sampling coexist. */
#define FAKE_OPS(sample_k)                                                                                       \
    {.name = "fake", .abi = TL_BACKEND_ABI, .init = fk_init, .free = fk_free, .forward = fk_forward,             \
     .copy_block = fk_copy, .kv_blocks = fk_kv_blocks, .kv_io = fk_kv_io, .max_sample_k = (sample_k)}
static const tl_backend_ops ops_dev = FAKE_OPS(TL_BACKEND_SAMPLE_MAX_K);
static const tl_backend_ops ops_host = FAKE_OPS(0);
static const tl_backend_ops ops_no_io = {.name = "fake", .abi = TL_BACKEND_ABI, .init = fk_init, .free = fk_free,
                                        .forward = fk_forward, .copy_block = fk_copy, .kv_blocks = fk_kv_blocks};

__attribute__((visibility("default"))) const tl_backend_ops *tl_backend_plugin_v1(void) {
    const char *env = getenv("FAKE_BACKEND_NO_KV_IO");
    if (env && *env == '1') return &ops_no_io;
    env = getenv("FAKE_BACKEND_NO_SAMPLING");
    return env && *env == '1' ? &ops_host : &ops_dev;
}
