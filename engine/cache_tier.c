/* cache_tier.c - spill, restore, write-through, save and load of the
 * radix cache's blocks over the KV tiers (cache_tier.h, kv_tier.h). */
#include "cache_tier.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"
#include "hash.h"
#include "kv_mode.h"
#include "kv_tier.h"
#include "scheduler.h"
#include "util.h"

/* Per model: the tiers and the buffers a spill or restore reuses. */
struct tl_cache_tiers {
    tl_kv_tiers t;
    int32_t *path;         /* tokens of a node's path (max_seq_len) */
    uint8_t *stage;        /* one logical block, for a backend with its own arena */
    void **ptrs;           /* (depth) block pointers */
    int cap_depth;
};

/* "123", "64K", "512M", "2G" (powers of 1024) from option or variable. */
static int parse_bytes(const char *name, const char *v, size_t *out) {
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    int shift = 0;
    if (*end && !end[1]) shift = *end == 'K' || *end == 'k' ? 10 : *end == 'M' || *end == 'm' ? 20
                             : *end == 'G' || *end == 'g' ? 30 : *end == 'T' || *end == 't' ? 40 : -1;
    if (errno || end == v || !isdigit((unsigned char)*v) || shift < 0 || (*end && end[1]) ||
        x > (SIZE_MAX >> shift))
        return tl_set_error(TL_ERR_INVALID_ARG, "%s='%.40s' is not a byte count (digits, then K, M, G or T)", name, v);
    *out = (size_t)(x << shift);
    return TL_OK;
}

static int env_bytes(const char *name, size_t given, size_t *out) {
    *out = given;
    const char *v = getenv(name);
    return given || !v || !*v ? TL_OK : parse_bytes(name, v, out);
}

/* The model's identity for block files: its GGUF metadata and tensor
 * table (everything before the data), samples of every tensor's weights,
 * and the backend that computes the KV, whose rounding differs from the
 * CPU's. */
static void model_id(const tl_model *m, uint8_t out[32]) {
    tl_sha256_ctx h;
    tl_sha256_init(&h);
    tl_sha256_update(&h, m->file->base, m->file->data_offset);
    /* Fine-tunes share the metadata and the tensor table: a few KiB from
     * the start, middle and end of every tensor tell their weights apart
     * at a cost of milliseconds. */
    for (uint64_t i = 0; i < m->file->n_tensors; i++) {
        const gguf_tensor *t = &m->file->tensors[i];
        size_t take = t->size < 4096 ? t->size : 4096;
        const uint8_t *d = t->data;
        tl_sha256_update(&h, d, take);
        tl_sha256_update(&h, d + (t->size - take) / 2, take);
        tl_sha256_update(&h, d + t->size - take, take);
    }
    const char *be = tl_backend_name(m);
    tl_sha256_update(&h, be, strlen(be) + 1);
    if (m->bf16_act) tl_sha256_update(&h, "repack=bf16", 12); /* other arithmetic, other KV */
    tl_sha256_final(&h, out);
}

static int ensure_depth(struct tl_cache_tiers *c, const tl_model *m, int depth) {
    if (depth <= c->cap_depth) return 0;
    void **p = realloc(c->ptrs, (size_t)depth * sizeof *p);
    if (!p) return -1;
    c->ptrs = p;
    if (m->kv.arena == NULL) {
        uint8_t *s = realloc(c->stage, (size_t)depth * m->kv.block_bytes);
        if (!s) return -1;
        c->stage = s;
    }
    c->cap_depth = depth;
    return 0;
}

/* Where block `id`'s bytes are read or written on the host: the arena
 * itself on the CPU, else staging slot d (copied over by io_block). */
static void *host_block(struct tl_cache_tiers *c, const tl_model *m, int id, int d) {
    return m->kv.arena ? tl_kv_k(&m->kv, id) : c->stage + (size_t)d * m->kv.block_bytes;
}

static int io_block(const tl_model *m, int id, void *host, int to_device) {
    return m->kv.arena ? 0 : m->kv.io_hook(m->kv.hook_ud, id, host, to_device);
}

static void fill_meta(const tl_kv_tiers *t, const tl_radix_ns *ns, int lb, const uint8_t parent[32],
                      const uint8_t key[32], tl_kvf_meta *meta) {
    *meta = t->ident;
    meta->depth = ns->depth;
    meta->loops = ns->loops;
    meta->window = ns->cache_window;
    meta->salt = ns->salt;
    meta->lb = lb;
    memcpy(meta->parent, parent, 32);
    memcpy(meta->key, key, 32);
}

/* Spills (to_disk 0) or writes through to disk (1) every full logical
 * block node n holds that the tier lacks, keyed by the chain of its path.
 * Layers a sliding window released (id -1) are marked absent. */
static void each_full_block(tl_model *m, const tl_radix_node *n, int to_disk) {
    struct tl_cache_tiers *c = m->tiers;
    const tl_radix_ns *ns = &m->cache.ns[n->ns];
    int bs = m->kv.block_size, depth = ns->depth, end = n->start + n->n_tokens;
    if (end / bs <= n->lb_first || ensure_depth(c, m, depth)) return;
    for (const tl_radix_node *p = n; p && p->parent; p = p->parent)
        memcpy(c->path + p->start, p->tokens, (size_t)p->n_tokens * sizeof *c->path);
    uint8_t key[32], parent[32];
    tl_tiers_ns_key(&c->t, depth, ns->loops, ns->cache_window, ns->salt, key);
    for (int lb = 0; lb < end / bs; lb++) {
        memcpy(parent, key, 32);
        tl_tiers_next_key(&c->t, parent, c->path + lb * bs, key);
        if (lb < n->lb_first) continue;
        const int32_t *ids = n->blocks + (size_t)(lb - n->lb_first) * depth;
        int where = tl_tiers_find(&c->t, key), held = 0;
        if (to_disk ? where == TL_TIER_DISK : where >= 0) continue;
        tl_kvf_meta meta;
        fill_meta(&c->t, ns, lb, parent, key, &meta);
        for (int d = 0; d < depth; d++) {
            c->ptrs[d] = NULL;
            if (ids[d] < 0) {
                meta.absent[d >> 3] |= (uint8_t)(1u << (d & 7));
                continue;
            }
            held++;
            c->ptrs[d] = host_block(c, m, ids[d], d);
            if (io_block(m, ids[d], c->ptrs[d], 0)) return;
        }
        if (!held) continue;
        const void *const *blocks = (const void *const *)c->ptrs;
        if (to_disk) tl_tiers_persist(&c->t, &meta, c->path + lb * bs, blocks);
        else tl_tiers_put(&c->t, &meta, c->path + lb * bs, blocks);
    }
}

/* The radix tree's eviction hook: the policy's rule, then down a tier. */
static void spill_node(tl_radix *tree, const tl_radix_node *n, void *ud) {
    (void)tree;
    tl_model *m = ud;
    if (n->n_tokens < __atomic_load_n(&m->spill_min_tokens, __ATOMIC_RELAXED) ||
        (int)n->hits < __atomic_load_n(&m->spill_min_hits, __ATOMIC_RELAXED))
        return;
    each_full_block(m, n, 0);
}

int tl_cache_tiers_open(tl_model *m) {
    const tl_model_params *p = &m->params;
    const char *dir = p->kv_dir;
    if (!dir) dir = getenv("TINYLOOP_KV_DIR");
    if (dir && !*dir) dir = NULL;
    size_t host, disk;
    int rc;
    if ((rc = env_bytes("TINYLOOP_KV_HOST_MEM", p->kv_host_mem, &host)) ||
        (rc = env_bytes("TINYLOOP_KV_DISK_MEM", p->kv_disk_mem, &disk)))
        return rc;
    if (!dir && !host) return TL_OK;
    if (!m->kv.arena && !m->kv.io_hook)
        return tl_set_error(TL_ERR_UNSUPPORTED, "the %s backend cannot copy KV blocks to the host (KV tiers)",
                            tl_backend_name(m));
    struct tl_cache_tiers *c = calloc(1, sizeof *c);
    if (!c || !(c->path = malloc((size_t)m->max_seq_len * sizeof *c->path))) {
        free(c);
        return tl_set_error(TL_ERR_NOMEM, "out of memory for the KV tiers");
    }
    tl_kvf_meta ident;
    memset(&ident, 0, sizeof ident);
    model_id(m, ident.model_id);
    tl_kv_mode mode = {m->kv.layout.type_k, m->kv.layout.type_v, m->kv.layout.store_h};
    tl_kv_mode_name(&mode, ident.kv_mode, sizeof ident.kv_mode);
    ident.block_size = m->kv.block_size;
    ident.block_bytes = m->kv.block_bytes;
    m->tiers = c;
    if ((rc = tl_tiers_open(&c->t, &ident, host, dir, disk))) {
        tl_cache_tiers_close(m);
        return rc;
    }
    m->cache.on_evict = spill_node;
    m->cache.evict_ud = m;
    return TL_OK;
}

void tl_cache_tiers_close(tl_model *m) {
    struct tl_cache_tiers *c = m->tiers;
    if (!c) return;
    m->cache.on_evict = NULL;
    tl_tiers_close(&c->t);
    free(c->path);
    free(c->stage);
    free(c->ptrs);
    free(c);
    m->tiers = NULL;
}

/* How many logical blocks from lb0 on are in a tier; keys[i] holds block
 * lb0 + i's key and keys[-1] (the slot before) its parent. */
static int probe(struct tl_cache_tiers *c, const tl_radix_ns *ns, const int32_t *tokens, int lb0, int lb_end,
                 uint8_t (*keys)[32], int *first_tier) {
    int bs = c->t.ident.block_size;
    tl_tiers_ns_key(&c->t, ns->depth, ns->loops, ns->cache_window, ns->salt, keys[0]);
    for (int lb = 0; lb < lb0; lb++) tl_tiers_next_key(&c->t, keys[0], tokens + lb * bs, keys[0]);
    int k = 0;
    for (int lb = lb0; lb < lb_end; lb++, k++) {
        tl_tiers_next_key(&c->t, keys[k], tokens + lb * bs, keys[k + 1]);
        int tier = tl_tiers_find(&c->t, keys[k + 1]);
        if (tier < 0) break;
        if (k == 0) *first_tier = tier;
    }
    return k;
}

/* A block may lack only layers with a sliding window (as the tree's own
 * nodes may): a file that says otherwise is never restored. */
static int absent_ok(const tl_radix_ns *ns, const tl_kvf_meta *got) {
    for (int d = 0; d < got->depth; d++)
        if (!tl_kvf_has(got, d) && (!ns->windows || ns->windows[d] <= 0)) return 0;
    return 1;
}

/* Brings logical blocks lb0.. up into bt's fresh blocks (reserved there);
 * returns how many came. */
static int take_blocks(tl_model *m, const tl_radix_ns *ns, tl_block_table *bt, const int32_t *tokens, int lb0, int k,
                       uint8_t (*keys)[32]) {
    struct tl_cache_tiers *c = m->tiers;
    int bs = m->kv.block_size, depth = ns->depth, done = 0;
    for (; done < k; done++) {
        int lb = lb0 + done;
        tl_kvf_meta want, got;
        fill_meta(&c->t, ns, lb, keys[done], keys[done + 1], &want);
        int32_t *ids = bt->ids + (size_t)lb * depth;
        for (int d = 0; d < depth; d++) c->ptrs[d] = host_block(c, m, ids[d], d);
        if (tl_tiers_take(&c->t, &want, tokens + lb * bs, c->ptrs, &got) < 0 || !absent_ok(ns, &got)) break;
        int ok = 1;
        for (int d = 0; d < depth && ok; d++) {
            if (tl_kvf_has(&got, d)) {
                ok = io_block(m, ids[d], c->ptrs[d], 1) == 0;
            } else { /* released by its sliding window when spilled: released again */
                tl_kv_unref(&m->kv, ids[d]);
                ids[d] = -1;
            }
        }
        if (!ok) break;
    }
    return done;
}

int tl_cache_restore(tl_model *m, int ns_i, const int32_t *tokens, int n, int L, tl_radix_node *node, int tenant) {
    struct tl_cache_tiers *c = m->tiers;
    int bs = m->kv.block_size, lb_end = n / bs;
    if (!c || L / bs >= lb_end) return 0;
    const tl_radix_ns *ns = &m->cache.ns[ns_i];
    int depth = ns->depth, tier = -1, done = 0;
    if (ensure_depth(c, m, depth)) return 0;
    if (node) tl_radix_lock(node, 1); /* making room must not evict the match */
    /* The tree's blocks before the first one to restore: the match's whole
     * blocks, as far as share gives them (a sliding window may shorten it). */
    tl_block_table bt = {.depth = depth};
    tl_radix_node *at = node;
    int shared = node ? tl_radix_share(&m->cache, &at, L / bs * bs, &bt) : 0;
    int lb0 = shared > 0 ? shared / bs : 0;
    tl_block_table_truncate(&bt, &m->kv, lb0 * bs);
    uint8_t(*keys)[32] = shared >= 0 ? malloc((size_t)(lb_end - lb0 + 1) * sizeof *keys) : NULL;
    int k = keys ? probe(c, ns, tokens, lb0, lb_end, keys, &tier) : 0;
    if (k > 0 && !tl_tiers_restore_pays(&c->t, tier, k, (size_t)k * (size_t)depth * m->kv.block_bytes)) {
        c->t.recompute_chosen++;
        k = 0;
    }
    if (k > 0 && !tl_cache_make_room(m, k * depth)) k = m->kv.n_free / depth;
    if ((lb0 + k) * bs > L && tl_block_table_reserve(&bt, &m->kv, (lb0 + k) * bs) == 0) {
        done = take_blocks(m, ns, &bt, tokens, lb0, k, keys);
        tl_block_table_truncate(&bt, &m->kv, (lb0 + done) * bs);
        if ((lb0 + done) * bs <= L || !tl_radix_insert(&m->cache, ns_i, tokens, (lb0 + done) * bs, &bt, tenant))
            done = 0;
    }
    tl_block_table_release(&bt, &m->kv);
    if (node) tl_radix_lock(node, -1);
    free(keys);
    if (done > 0) c->t.restored_tokens += (lb0 + done) * bs - L;
    return done > 0;
}

void tl_cache_persist_path(tl_model *m, const tl_radix_node *node) {
    if (!m->tiers || !m->tiers->t.dir) return;
    for (const tl_radix_node *p = node; p && p->parent; p = p->parent) each_full_block(m, p, 1);
}

void tl_cache_note_prefill(tl_model *m, int tokens, double seconds) {
    if (m->tiers) tl_tiers_note_prefill(&m->tiers->t, tokens, seconds);
}

/* ---- the public calls ---------------------------------------------------------------------- */

static void persist_node(const tl_radix_node *n, const tl_radix_ns *ns, void *ud) {
    (void)ns;
    each_full_block(ud, n, 1);
}

/* The disk tier dir names, adopting it when the model has none. */
static int use_dir(tl_model *m, const char *dir) {
    if (!m->tiers && dir) {
        m->params.kv_dir = dir; /* read once, by tl_cache_tiers_open */
        int rc = tl_cache_tiers_open(m);
        m->params.kv_dir = NULL;
        if (rc) return rc;
    }
    tl_kv_tiers *t = m->tiers ? &m->tiers->t : NULL;
    if (!t || (!t->dir && !dir)) return tl_set_error(TL_ERR_INVALID_ARG, "no directory: pass one or set kv_dir");
    if (!t->dir) {
        /* a host tier only: the directory becomes its disk tier */
        tl_kv_tiers fresh;
        int rc = tl_tiers_open(&fresh, &t->ident, 0, dir, 0);
        if (rc) return rc;
        t->dir = fresh.dir;
        t->tier[TL_TIER_DISK] = fresh.tier[TL_TIER_DISK];
        fresh.dir = NULL;
        memset(&fresh.tier[TL_TIER_DISK], 0, sizeof fresh.tier[TL_TIER_DISK]);
        tl_tiers_close(&fresh);
        return TL_OK;
    }
    if (dir && strcmp(dir, t->dir))
        return tl_set_error(TL_ERR_INVALID_ARG, "the disk tier is %s, not %s (one directory per model)", t->dir, dir);
    return TL_OK;
}

int tl_model_save_cache(tl_model *m, const char *dir) {
    if (!m || !m->sched) return tl_set_error(TL_ERR_INVALID_ARG, "model must not be NULL");
    tl_sched_compute_lock(m);
    int rc = use_dir(m, dir);
    if (rc == TL_OK) {
        int64_t before = m->tiers->t.tier[TL_TIER_DISK].spills;
        tl_radix_walk(&m->cache, persist_node, m);
        rc = (int)(m->tiers->t.tier[TL_TIER_DISK].spills - before);
    }
    tl_sched_compute_unlock(m);
    return rc;
}

int tl_model_load_cache(tl_model *m, const char *dir, tl_cache_load_report *rep) {
    if (!m || !m->sched) return tl_set_error(TL_ERR_INVALID_ARG, "model must not be NULL");
    tl_sched_compute_lock(m);
    int rc = use_dir(m, dir);
    int loaded = 0;
    tl_kv_tiers *t = rc == TL_OK ? &m->tiers->t : NULL;
    if (t) loaded = tl_tiers_scan(t);
    if (rep) {
        memset(rep, 0, sizeof *rep);
        if (t) {
            rep->files = t->scanned;
            rep->loaded = loaded;
            rep->refused = t->scan_refused;
            snprintf(rep->why, sizeof rep->why, "%s", t->report);
        }
    }
    tl_sched_compute_unlock(m);
    return rc;
}

int tl_model_set_spill_policy(tl_model *m, int min_tokens, int min_hits) {
    if (!m || !m->sched) return tl_set_error(TL_ERR_INVALID_ARG, "model must not be NULL");
    if (min_tokens < 0 || min_hits < 0)
        return tl_set_error(TL_ERR_INVALID_ARG, "min_tokens %d and min_hits %d must be >= 0", min_tokens, min_hits);
    /* read by the eviction hook on the engine thread: no lock to wait for */
    __atomic_store_n(&m->spill_min_tokens, min_tokens, __ATOMIC_RELAXED);
    __atomic_store_n(&m->spill_min_hits, min_hits, __ATOMIC_RELAXED);
    return TL_OK;
}

void tl_cache_tier_stats(const tl_model *m, tl_cache_stats *o) {
    if (m->tiers) tl_tiers_stats(&m->tiers->t, o);
}
