/* kv_tier.c - host RAM and disk tiers of spilled KV blocks (kv_tier.h). */
#include "kv_tier.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hash.h"
#include "util.h"


/* Bytes of a block's stored layers (a sliding-window layer's released
 * block is absent). */
static size_t payload_bytes(const tl_kvf_meta *m) { return (size_t)tl_kvf_n_present(m) * (size_t)m->block_bytes; }

/* Copies the present layers between blocks[d] and a packed payload. */
static void pack(const tl_kvf_meta *m, uint8_t *dst, const void *const *blocks) {
    for (int d = 0, at = 0; d < m->depth; d++)
        if (tl_kvf_has(m, d)) memcpy(dst + (size_t)at++ * m->block_bytes, blocks[d], m->block_bytes);
}

static void unpack(const tl_kvf_meta *m, void *const *blocks, const uint8_t *src) {
    for (int d = 0, at = 0; d < m->depth; d++)
        if (tl_kvf_has(m, d)) memcpy(blocks[d], src + (size_t)at++ * m->block_bytes, m->block_bytes);
}

/* ---- one tier: a hash index and an LRU list ------------------------------------------------ */

static size_t bucket_of(const tl_tier *tr, const uint8_t key[32]) {
    uint64_t h;
    memcpy(&h, key, sizeof h); /* the key is a SHA-256: any 8 bytes are uniform */
    return (size_t)(h & (tr->n_buckets - 1));
}

static tl_tier_item *tier_get(const tl_tier *tr, const uint8_t key[32]) {
    if (!tr->n_buckets) return NULL;
    for (tl_tier_item *it = tr->buckets[bucket_of(tr, key)]; it; it = it->hnext)
        if (!memcmp(it->key, key, 32)) return it;
    return NULL;
}

static void lru_unlink(tl_tier *tr, tl_tier_item *it) {
    if (it->prev) it->prev->next = it->next;
    else tr->head = it->next;
    if (it->next) it->next->prev = it->prev;
    else tr->tail = it->prev;
    it->prev = it->next = NULL;
}

static void lru_front(tl_tier *tr, tl_tier_item *it) {
    it->next = tr->head;
    if (tr->head) tr->head->prev = it;
    tr->head = it;
    if (!tr->tail) tr->tail = it;
}

static int tier_grow(tl_tier *tr) {
    size_t n = tr->n_buckets ? tr->n_buckets * 2 : 64;
    tl_tier_item **b = calloc(n, sizeof *b);
    if (!b) return -1;
    for (size_t i = 0; i < tr->n_buckets; i++)
        for (tl_tier_item *it = tr->buckets[i], *nx; it; it = nx) {
            nx = it->hnext;
            size_t j = (size_t)(*(const uint64_t *)(const void *)it->key & (n - 1));
            it->hnext = b[j];
            b[j] = it;
        }
    free(tr->buckets);
    tr->buckets = b;
    tr->n_buckets = n;
    return 0;
}

static int tier_add(tl_tier *tr, tl_tier_item *it) {
    if (tr->n_items + 1 > tr->n_buckets && tier_grow(tr)) return -1;
    size_t j = bucket_of(tr, it->key);
    it->hnext = tr->buckets[j];
    tr->buckets[j] = it;
    lru_front(tr, it);
    tr->n_items++;
    tr->bytes += it->bytes;
    return 0;
}

static void item_free(tl_tier_item *it) {
    if (!it) return;
    free(it->tokens);
    free(it->data);
    free(it);
}

/* Unlinks it from the index and the list (the caller frees or reuses it). */
static void tier_remove(tl_tier *tr, tl_tier_item *it) {
    for (tl_tier_item **pp = &tr->buckets[bucket_of(tr, it->key)]; *pp; pp = &(*pp)->hnext)
        if (*pp == it) {
            *pp = it->hnext;
            break;
        }
    lru_unlink(tr, it);
    tr->n_items--;
    tr->bytes -= it->bytes;
}

static void tier_clear(tl_tier *tr) {
    for (tl_tier_item *it = tr->head, *nx; it; it = nx) {
        nx = it->next;
        item_free(it);
    }
    free(tr->buckets);
    memset(tr, 0, sizeof *tr);
}

/* ---- keys ------------------------------------------------------------------------------------ */

static void put_le32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

void tl_tiers_ns_key(const tl_kv_tiers *t, int depth, int loops, int window, uint64_t salt, uint8_t out[32]) {
    tl_sha256_ctx h;
    uint8_t num[28];
    tl_sha256_init(&h);
    tl_sha256_update(&h, "tinyloop kv chain 1", 19);
    tl_sha256_update(&h, t->ident.model_id, 32);
    tl_sha256_update(&h, t->ident.kv_mode, sizeof t->ident.kv_mode);
    put_le32(num, (uint32_t)t->ident.block_size);
    put_le32(num + 4, (uint32_t)depth);
    put_le32(num + 8, (uint32_t)loops);
    put_le32(num + 12, (uint32_t)window);
    put_le32(num + 16, (uint32_t)salt);
    put_le32(num + 20, (uint32_t)(salt >> 32));
    put_le32(num + 24, (uint32_t)t->ident.block_bytes);
    tl_sha256_update(&h, num, sizeof num);
    tl_sha256_final(&h, out);
}

void tl_tiers_next_key(const tl_kv_tiers *t, const uint8_t prev[32], const int32_t *tokens, uint8_t out[32]) {
    tl_sha256_ctx h;
    uint8_t b[4];
    tl_sha256_init(&h);
    tl_sha256_update(&h, prev, 32);
    for (int i = 0; i < t->ident.block_size; i++) {
        put_le32(b, (uint32_t)tokens[i]);
        tl_sha256_update(&h, b, 4);
    }
    tl_sha256_final(&h, out);
}

/* ---- the disk tier ---------------------------------------------------------------------------- */

static void path_of(const tl_kv_tiers *t, const uint8_t key[32], char *out, size_t cap) {
    char name[80];
    tl_kvf_name(key, name);
    snprintf(out, cap, "%s/%s", t->dir, name);
}

/* Appends a refusal line to the report, keeping a count once it is full. */
static void report(tl_kv_tiers *t, const char *msg) {
    t->scan_refused++;
    size_t n = strlen(t->report);
    if (n + strlen(msg) + 2 < sizeof t->report) snprintf(t->report + n, sizeof t->report - n, "%s\n", msg);
}

static int disk_index(tl_kv_tiers *t, const uint8_t key[32], size_t bytes) {
    tl_tier *tr = &t->tier[TL_TIER_DISK];
    tl_tier_item *it = tier_get(tr, key);
    if (it) {
        lru_unlink(tr, it);
        lru_front(tr, it);
        return 0;
    }
    if (!(it = calloc(1, sizeof *it))) return -1;
    memcpy(it->key, key, 32);
    it->bytes = bytes;
    if (tier_add(tr, it)) {
        free(it);
        return -1;
    }
    return 0;
}

/* Oldest files go while the disk tier is over its budget. */
static void disk_trim(tl_kv_tiers *t) {
    tl_tier *tr = &t->tier[TL_TIER_DISK];
    char path[4096];
    while (tr->budget && tr->bytes > tr->budget && tr->tail) {
        tl_tier_item *it = tr->tail;
        path_of(t, it->key, path, sizeof path);
        unlink(path);
        tier_remove(tr, it);
        item_free(it);
        tr->dropped++;
    }
}

static int disk_write(tl_kv_tiers *t, const tl_kvf_meta *meta, const int32_t *tokens, const void *const *blocks) {
    tl_tier *tr = &t->tier[TL_TIER_DISK];
    char err[512];
    double t0 = tl_now();
    if (tl_kvf_write(t->dir, meta, tokens, blocks, err, sizeof err)) {
        snprintf(t->report, sizeof t->report, "%s\n", err);
        return -1;
    }
    tr->spill_s += tl_now() - t0;
    tr->spills++;
    tr->spill_bytes += (int64_t)tl_kvf_file_size(meta);
    if (disk_index(t, meta->key, tl_kvf_file_size(meta))) return -1;
    disk_trim(t);
    return 1;
}

static int ensure_scratch(tl_kv_tiers *t, size_t n) {
    if (n <= t->scratch_cap) return 0;
    uint8_t *p = realloc(t->scratch, n);
    if (!p) return -1;
    t->scratch = p;
    t->scratch_cap = n;
    return 0;
}

/* Reads, parses and checks one file against the model's identity (and
 * against expect's namespace, key and depth when given); *tok and
 * *payload point into the scratch image. */
static int disk_read(tl_kv_tiers *t, const char *path, const tl_kvf_meta *expect, tl_kvf_meta *got,
                     const int32_t **tok, const uint8_t **payload, char *err, size_t cap) {
    struct stat st;
    if (stat(path, &st) || !S_ISREG(st.st_mode)) {
        snprintf(err, cap, "%s: %s", path, errno ? strerror(errno) : "not a regular file");
        return -1;
    }
    tl_kvf_meta want = expect ? *expect : t->ident;
    if (ensure_scratch(t, (size_t)st.st_size + 1)) {
        snprintf(err, cap, "%s: out of memory for %lld bytes", path, (long long)st.st_size);
        return -1;
    }
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(t->scratch, 1, (size_t)st.st_size + 1, f) : 0;
    if (f) fclose(f);
    if (!f) {
        snprintf(err, cap, "%s: %s", path, strerror(errno));
        return -1;
    }
    char why[400];
    if (tl_kvf_parse(t->scratch, n, got, tok, payload, why, sizeof why)) {
        snprintf(err, cap, "%s: %s", path, why);
        return -1;
    }
    if (!expect) want.depth = got->depth; /* a scan accepts every loop count's depth */
    if (tl_kvf_check(got, &want, expect != NULL, why, sizeof why)) {
        snprintf(err, cap, "%s: %s", path, why);
        return -1;
    }
    return 0;
}

int tl_tiers_scan(tl_kv_tiers *t) {
    t->report[0] = 0;
    t->scan_refused = 0;
    t->scanned = 0;
    if (!t->dir) return 0;
    DIR *d = opendir(t->dir);
    if (!d) {
        char msg[600];
        snprintf(msg, sizeof msg, "%s: %s", t->dir, strerror(errno));
        report(t, msg);
        return 0;
    }
    int indexed = 0;
    struct dirent *e;
    char path[4096], err[700];
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len < 5 || strcmp(e->d_name + len - 5, ".tlkv") || e->d_name[0] == '.') continue;
        t->scanned++;
        snprintf(path, sizeof path, "%s/%s", t->dir, e->d_name);
        tl_kvf_meta got;
        char name[80];
        const int32_t *tok;
        const uint8_t *payload;
        if (disk_read(t, path, NULL, &got, &tok, &payload, err, sizeof err) == 0) {
            tl_kvf_name(got.key, name);
            if (strcmp(name, e->d_name)) {
                snprintf(err, sizeof err, "%.500s: holds block %s, not the one its name says", path, name);
            } else if (disk_index(t, got.key, tl_kvf_file_size(&got)) == 0) {
                indexed++;
                continue;
            } else {
                snprintf(err, sizeof err, "%.600s: out of memory for the index", path);
            }
        }
        t->tier[TL_TIER_DISK].refused++;
        report(t, err);
    }
    closedir(d);
    disk_trim(t);
    return indexed;
}

/* ---- the tiers ------------------------------------------------------------------------------ */

static int mkdir_p(const char *dir) {
    char p[4096];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p) return -1;
    for (char *s = p + 1; *s; s++) {
        if (*s != '/') continue;
        *s = 0;
        if (mkdir(p, 0700) && errno != EEXIST) return -1;
        *s = '/';
    }
    return mkdir(p, 0700) && errno != EEXIST ? -1 : 0;
}

int tl_tiers_open(tl_kv_tiers *t, const tl_kvf_meta *ident, size_t host_budget, const char *dir,
                  size_t disk_budget) {
    memset(t, 0, sizeof *t);
    t->ident = *ident;
    t->tier[TL_TIER_HOST].budget = host_budget;
    t->tier[TL_TIER_DISK].budget = disk_budget;
    if (!dir || !*dir) return TL_OK;
    struct stat st;
    if (mkdir_p(dir) || stat(dir, &st) || !S_ISDIR(st.st_mode))
        return tl_set_error(TL_ERR_IO, "kv_dir %s: %s", dir, errno ? strerror(errno) : "not a directory");
    if (!(t->dir = strdup(dir))) return tl_set_error(TL_ERR_NOMEM, "out of memory");
    tl_tiers_scan(t);
    return TL_OK;
}

void tl_tiers_close(tl_kv_tiers *t) {
    tier_clear(&t->tier[TL_TIER_HOST]);
    tier_clear(&t->tier[TL_TIER_DISK]);
    free(t->dir);
    free(t->scratch);
    memset(t, 0, sizeof *t);
}

int tl_tiers_find(tl_kv_tiers *t, const uint8_t key[32]) {
    if (tier_get(&t->tier[TL_TIER_HOST], key)) return TL_TIER_HOST;
    if (!t->dir) return -1;
    if (tier_get(&t->tier[TL_TIER_DISK], key)) return TL_TIER_DISK;
    char path[4096];
    path_of(t, key, path, sizeof path);
    return access(path, R_OK) == 0 ? TL_TIER_DISK : -1; /* written by another process */
}

int tl_tiers_persist(tl_kv_tiers *t, const tl_kvf_meta *meta, const int32_t *tokens, const void *const *blocks) {
    if (!t->dir || tl_tiers_find(t, meta->key) == TL_TIER_DISK) return 0;
    return disk_write(t, meta, tokens, blocks);
}

/* Moves the host tier's least recently used blocks down until `need`
 * more bytes fit in its budget. */
static void host_make_room(tl_kv_tiers *t, size_t need) {
    tl_tier *tr = &t->tier[TL_TIER_HOST];
    while (tr->tail && tr->bytes + need > tr->budget) {
        tl_tier_item *it = tr->tail;
        tier_remove(tr, it);
        const void *blocks[TL_KVF_MAX_DEPTH];
        for (int d = 0, at = 0; d < it->meta.depth; d++)
            blocks[d] = tl_kvf_has(&it->meta, d) ? it->data + (size_t)at++ * it->meta.block_bytes : NULL;
        if (tl_tiers_persist(t, &it->meta, it->tokens, blocks) <= 0 && !t->dir) tr->dropped++;
        item_free(it);
    }
}

int tl_tiers_put(tl_kv_tiers *t, const tl_kvf_meta *meta, const int32_t *tokens, const void *const *blocks) {
    tl_tier *tr = &t->tier[TL_TIER_HOST];
    size_t bytes = payload_bytes(meta);
    if (!tr->budget || bytes > tr->budget) return tl_tiers_persist(t, meta, tokens, blocks);
    if (tier_get(tr, meta->key)) return 0;
    double t0 = tl_now();
    host_make_room(t, bytes);
    tl_tier_item *it = calloc(1, sizeof *it);
    size_t tok_bytes = (size_t)meta->block_size * sizeof *tokens;
    if (!it || !(it->tokens = malloc(tok_bytes)) || !(it->data = malloc(bytes))) {
        item_free(it);
        return tl_tiers_persist(t, meta, tokens, blocks);
    }
    memcpy(it->key, meta->key, 32);
    it->meta = *meta;
    it->bytes = bytes;
    memcpy(it->tokens, tokens, tok_bytes);
    pack(meta, it->data, blocks);
    if (tier_add(tr, it)) {
        item_free(it);
        return tl_tiers_persist(t, meta, tokens, blocks);
    }
    tr->spills++;
    tr->spill_bytes += (int64_t)bytes;
    tr->spill_s += tl_now() - t0;
    return 1;
}

static int host_take(tl_kv_tiers *t, tl_tier_item *it, const tl_kvf_meta *expect, const int32_t *tokens,
                     void *const *blocks, tl_kvf_meta *got) {
    tl_tier *tr = &t->tier[TL_TIER_HOST];
    char why[300];
    if (tl_kvf_check(&it->meta, expect, 1, why, sizeof why) ||
        memcmp(it->tokens, tokens, (size_t)expect->block_size * sizeof *tokens)) {
        tr->refused++; /* a key collision or a bug: never serve it */
        tier_remove(tr, it);
        item_free(it);
        return -1;
    }
    double t0 = tl_now();
    *got = it->meta;
    unpack(&it->meta, blocks, it->data);
    tr->restore_s += tl_now() - t0;
    tr->hits++;
    tr->restore_bytes += (int64_t)it->bytes;
    tier_remove(tr, it);
    item_free(it);
    return TL_TIER_HOST;
}

static int disk_take(tl_kv_tiers *t, const tl_kvf_meta *expect, const int32_t *tokens, void *const *blocks,
                     tl_kvf_meta *out) {
    tl_tier *tr = &t->tier[TL_TIER_DISK];
    char path[4096], err[700];
    path_of(t, expect->key, path, sizeof path);
    double t0 = tl_now();
    tl_kvf_meta got;
    tl_tier_item *it = tier_get(tr, expect->key);
    if (!it && access(path, F_OK)) return -1; /* not on disk: a plain miss */
    const int32_t *tok;
    const uint8_t *payload;
    if (disk_read(t, path, expect, &got, &tok, &payload, err, sizeof err)) {
        tr->refused++; /* present but bad: never loaded */
        report(t, err);
        if (it) {
            tier_remove(tr, it);
            item_free(it);
        }
        return -1;
    }
    if (memcmp(tok, tokens, (size_t)expect->block_size * sizeof *tokens)) {
        tr->refused++;
        snprintf(err, sizeof err, "%.600s: its tokens differ from the prompt's (a key collision)", path);
        report(t, err);
        return -1;
    }
    unpack(&got, blocks, payload);
    *out = got;
    tr->restore_s += tl_now() - t0;
    tr->hits++;
    tr->restore_bytes += (int64_t)tl_kvf_file_size(&got);
    disk_index(t, expect->key, tl_kvf_file_size(&got));
    return TL_TIER_DISK;
}

int tl_tiers_take(tl_kv_tiers *t, const tl_kvf_meta *expect, const int32_t *tokens, void *const *blocks,
                  tl_kvf_meta *got) {
    tl_tier_item *it = tier_get(&t->tier[TL_TIER_HOST], expect->key);
    if (it && host_take(t, it, expect, tokens, blocks, got) == TL_TIER_HOST) return TL_TIER_HOST;
    return t->dir ? disk_take(t, expect, tokens, blocks, got) : -1;
}

int tl_tiers_restore_pays(const tl_kv_tiers *t, int tier, int n_blocks, size_t bytes) {
    const tl_tier *tr = &t->tier[tier];
    if (tr->restore_bytes <= 0 || tr->restore_s <= 0 || t->prefill_s_per_tok <= 0) return 1;
    double move = (double)bytes / ((double)tr->restore_bytes / tr->restore_s);
    double prefill = (double)n_blocks * t->ident.block_size * t->prefill_s_per_tok;
    return move < prefill;
}

void tl_tiers_note_prefill(tl_kv_tiers *t, int tokens, double seconds) {
    if (tokens < 16 || seconds <= 0) return; /* decode-sized steps say little about prefill */
    double x = seconds / tokens;
    t->prefill_s_per_tok = t->prefill_s_per_tok > 0 ? 0.8 * t->prefill_s_per_tok + 0.2 * x : x;
}

void tl_tiers_stats(const tl_kv_tiers *t, tl_cache_stats *o) {
    for (int i = 0; i < 2; i++) {
        const tl_tier *tr = &t->tier[i];
        o->tier_blocks[i] = (int64_t)tr->n_items;
        o->tier_bytes[i] = (int64_t)tr->bytes;
        o->tier_budget[i] = (int64_t)tr->budget;
        o->tier_spills[i] = tr->spills;
        o->tier_spill_bytes[i] = tr->spill_bytes;
        o->tier_hits[i] = tr->hits;
        o->tier_restore_bytes[i] = tr->restore_bytes;
        o->tier_refused[i] = tr->refused;
        o->tier_dropped[i] = tr->dropped;
        o->tier_spill_ms[i] = tr->spill_s * 1e3;
        o->tier_restore_ms[i] = tr->restore_s * 1e3;
    }
    o->tier_restored_tokens = t->restored_tokens;
    o->tier_recomputed = t->recompute_chosen;
}
