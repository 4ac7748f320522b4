/* gguf_writer.c - see gguf_writer.h. Values are serialized as soon as they
 * are set, so a kv is just a key plus the bytes that follow it in the file. */
#include "gguf_writer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"

#define GW_MAX_DIMS 8

/* A growable byte buffer. */
typedef struct gw_bytes {
    uint8_t *p;
    size_t len, cap;
} gw_bytes;

static void *gw_xrealloc(void *p, size_t n) {
    p = realloc(p, n ? n : 1);
    if (!p) {
        fprintf(stderr, "gguf_writer: out of memory (%zu bytes)\n", n);
        abort();
    }
    return p;
}

static void put(gw_bytes *b, const void *src, size_t n) {
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n) cap *= 2;
        b->p = gw_xrealloc(b->p, cap);
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, src, n);
    b->len += n;
}

static void put_u32(gw_bytes *b, uint32_t v) { put(b, &v, 4); } /* little-endian host */
static void put_u64(gw_bytes *b, uint64_t v) { put(b, &v, 8); }
static void put_str(gw_bytes *b, const char *s, size_t n) {
    put_u64(b, n);
    put(b, s, n);
}
static void put_zeros(gw_bytes *b, size_t n) {
    static const uint8_t z[64];
    while (n) {
        size_t k = n < sizeof z ? n : sizeof z;
        put(b, z, k);
        n -= k;
    }
}

typedef struct gw_kv {
    char *key;
    gw_bytes val; /* type u32 + payload */
} gw_kv;

typedef struct gw_tensor {
    char *name;
    int type, n_dims;
    int64_t ne[GW_MAX_DIMS];
    uint8_t *data;
    size_t nbytes;
} gw_tensor;

struct gguf_writer {
    uint32_t version, alignment;
    gw_kv *kv;
    size_t n_kv;
    gw_tensor *t;
    size_t n_t;
};

struct gw_arr {
    int elem_type;
    uint64_t n;
    gw_bytes body; /* serialized elements */
};

static char *gw_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = gw_xrealloc(NULL, n);
    memcpy(d, s, n);
    return d;
}

gguf_writer *gw_new(void) {
    gguf_writer *gw = gw_xrealloc(NULL, sizeof *gw);
    memset(gw, 0, sizeof *gw);
    gw->version = 3;
    gw->alignment = 32;
    return gw;
}

void gw_free(gguf_writer *gw) {
    if (!gw) return;
    for (size_t i = 0; i < gw->n_kv; i++) {
        free(gw->kv[i].key);
        free(gw->kv[i].val.p);
    }
    for (size_t i = 0; i < gw->n_t; i++) {
        free(gw->t[i].name);
        free(gw->t[i].data);
    }
    free(gw->kv);
    free(gw->t);
    free(gw);
}

void gw_set_version(gguf_writer *gw, uint32_t version) { gw->version = version; }

/* Returns the value buffer for `key`, emptied; a new kv at the end if absent. */
static gw_bytes *slot(gguf_writer *gw, const char *key) {
    for (size_t i = 0; i < gw->n_kv; i++)
        if (!strcmp(gw->kv[i].key, key)) {
            gw->kv[i].val.len = 0;
            return &gw->kv[i].val;
        }
    gw->kv = gw_xrealloc(gw->kv, (gw->n_kv + 1) * sizeof *gw->kv);
    gw_kv *kv = &gw->kv[gw->n_kv++];
    kv->key = gw_strdup(key);
    memset(&kv->val, 0, sizeof kv->val);
    return &kv->val;
}

static void set_prim(gguf_writer *gw, const char *key, int type, const void *v, size_t size) {
    gw_bytes *b = slot(gw, key);
    put_u32(b, (uint32_t)type);
    put(b, v, size);
}

int gw_set_alignment(gguf_writer *gw, uint32_t n) {
    if (n == 0 || (n & (n - 1))) return -1;
    gw->alignment = n;
    gw_set_u32(gw, "general.alignment", n);
    return 0;
}

void gw_set_u8(gguf_writer *gw, const char *key, uint8_t v) { set_prim(gw, key, GGUF_T_UINT8, &v, 1); }
void gw_set_i8(gguf_writer *gw, const char *key, int8_t v) { set_prim(gw, key, GGUF_T_INT8, &v, 1); }
void gw_set_u16(gguf_writer *gw, const char *key, uint16_t v) { set_prim(gw, key, GGUF_T_UINT16, &v, 2); }
void gw_set_i16(gguf_writer *gw, const char *key, int16_t v) { set_prim(gw, key, GGUF_T_INT16, &v, 2); }
void gw_set_u32(gguf_writer *gw, const char *key, uint32_t v) { set_prim(gw, key, GGUF_T_UINT32, &v, 4); }
void gw_set_i32(gguf_writer *gw, const char *key, int32_t v) { set_prim(gw, key, GGUF_T_INT32, &v, 4); }
void gw_set_u64(gguf_writer *gw, const char *key, uint64_t v) { set_prim(gw, key, GGUF_T_UINT64, &v, 8); }
void gw_set_i64(gguf_writer *gw, const char *key, int64_t v) { set_prim(gw, key, GGUF_T_INT64, &v, 8); }
void gw_set_f32(gguf_writer *gw, const char *key, float v) { set_prim(gw, key, GGUF_T_FLOAT32, &v, 4); }
void gw_set_f64(gguf_writer *gw, const char *key, double v) { set_prim(gw, key, GGUF_T_FLOAT64, &v, 8); }

void gw_set_bool(gguf_writer *gw, const char *key, int v) {
    uint8_t b = v != 0;
    set_prim(gw, key, GGUF_T_BOOL, &b, 1);
}

void gw_set_strn(gguf_writer *gw, const char *key, const char *v, size_t len) {
    gw_bytes *b = slot(gw, key);
    put_u32(b, GGUF_T_STRING);
    put_str(b, v, len);
}

void gw_set_str(gguf_writer *gw, const char *key, const char *v) { gw_set_strn(gw, key, v, strlen(v)); }

void gw_set_raw(gguf_writer *gw, const char *key, uint32_t type, const void *payload, size_t len) {
    gw_bytes *b = slot(gw, key);
    put_u32(b, type);
    put(b, payload, len);
}

/* ---- arrays ------------------------------------------------------------- */

static size_t elem_size(int type) {
    switch (type) {
    case GGUF_T_UINT8: case GGUF_T_INT8: case GGUF_T_BOOL: return 1;
    case GGUF_T_UINT16: case GGUF_T_INT16: return 2;
    case GGUF_T_UINT32: case GGUF_T_INT32: case GGUF_T_FLOAT32: return 4;
    case GGUF_T_UINT64: case GGUF_T_INT64: case GGUF_T_FLOAT64: return 8;
    default: return 0;
    }
}

gw_arr *gw_arr_new(int elem_type) {
    gw_arr *a = gw_xrealloc(NULL, sizeof *a);
    memset(a, 0, sizeof *a);
    a->elem_type = elem_type;
    return a;
}

void gw_arr_free(gw_arr *a) {
    if (!a) return;
    free(a->body.p);
    free(a);
}

void gw_arr_push_prim(gw_arr *a, const void *elem) {
    put(&a->body, elem, elem_size(a->elem_type));
    a->n++;
}

void gw_arr_push_str(gw_arr *a, const char *s) {
    put_str(&a->body, s, strlen(s));
    a->n++;
}

/* Element type, count, elements: how an array appears after its type tag
 * (and how a nested array appears as an element). */
static void put_arr(gw_bytes *b, const gw_arr *a) {
    put_u32(b, (uint32_t)a->elem_type);
    put_u64(b, a->n);
    put(b, a->body.p, a->body.len);
}

void gw_arr_push_arr(gw_arr *a, gw_arr *child) {
    put_arr(&a->body, child);
    a->n++;
    gw_arr_free(child);
}

void gw_set_arr(gguf_writer *gw, const char *key, gw_arr *a) {
    gw_bytes *b = slot(gw, key);
    put_u32(b, GGUF_T_ARRAY);
    put_arr(b, a);
    gw_arr_free(a);
}

void gw_set_arr_prim(gguf_writer *gw, const char *key, int elem_type, const void *data, size_t n) {
    gw_bytes *b = slot(gw, key);
    put_u32(b, GGUF_T_ARRAY);
    put_u32(b, (uint32_t)elem_type);
    put_u64(b, n);
    put(b, data, n * elem_size(elem_type));
}

void gw_set_arr_str(gguf_writer *gw, const char *key, const char *const *v, size_t n) {
    gw_arr *a = gw_arr_new(GGUF_T_STRING);
    for (size_t i = 0; i < n; i++) gw_arr_push_str(a, v[i]);
    gw_set_arr(gw, key, a);
}

void gw_set_arr_f32(gguf_writer *gw, const char *key, const float *v, size_t n) {
    gw_set_arr_prim(gw, key, GGUF_T_FLOAT32, v, n);
}
void gw_set_arr_i32(gguf_writer *gw, const char *key, const int32_t *v, size_t n) {
    gw_set_arr_prim(gw, key, GGUF_T_INT32, v, n);
}
void gw_set_arr_u32(gguf_writer *gw, const char *key, const uint32_t *v, size_t n) {
    gw_set_arr_prim(gw, key, GGUF_T_UINT32, v, n);
}

/* ---- tensors and output ------------------------------------------------- */

int gw_add_tensor(gguf_writer *gw, const char *name, int type, int n_dims, const int64_t *ne,
                  const void *data, size_t nbytes) {
    if (n_dims < 0 || n_dims > GW_MAX_DIMS) return -1;
    for (size_t i = 0; i < gw->n_t; i++)
        if (!strcmp(gw->t[i].name, name)) return -1;
    gw->t = gw_xrealloc(gw->t, (gw->n_t + 1) * sizeof *gw->t);
    gw_tensor *t = &gw->t[gw->n_t];
    memset(t, 0, sizeof *t);
    t->name = gw_strdup(name);
    t->type = type;
    t->n_dims = n_dims;
    for (int d = 0; d < n_dims; d++) t->ne[d] = ne[d];
    t->data = gw_xrealloc(NULL, nbytes);
    if (nbytes) memcpy(t->data, data, nbytes);
    t->nbytes = nbytes;
    return (int)gw->n_t++;
}

static size_t pad_to(size_t n, size_t a) { return (a - n % a) % a; }

int gw_write_mem(gguf_writer *gw, uint8_t **buf, size_t *len) {
    gw_bytes b = {0};
    put(&b, "GGUF", 4);
    put_u32(&b, gw->version);
    put_u64(&b, gw->n_t);
    put_u64(&b, gw->n_kv);
    for (size_t i = 0; i < gw->n_kv; i++) {
        put_str(&b, gw->kv[i].key, strlen(gw->kv[i].key));
        put(&b, gw->kv[i].val.p, gw->kv[i].val.len);
    }
    uint64_t off = 0;
    for (size_t i = 0; i < gw->n_t; i++) {
        const gw_tensor *t = &gw->t[i];
        put_str(&b, t->name, strlen(t->name));
        put_u32(&b, (uint32_t)t->n_dims);
        for (int d = 0; d < t->n_dims; d++) put_u64(&b, (uint64_t)t->ne[d]);
        put_u32(&b, (uint32_t)t->type);
        put_u64(&b, off);
        off += t->nbytes + pad_to(t->nbytes, gw->alignment);
    }
    /* A file without tensors ends right after the metadata. */
    if (gw->n_t) put_zeros(&b, pad_to(b.len, gw->alignment));
    for (size_t i = 0; i < gw->n_t; i++) {
        put(&b, gw->t[i].data, gw->t[i].nbytes);
        if (i + 1 < gw->n_t) put_zeros(&b, pad_to(gw->t[i].nbytes, gw->alignment));
    }
    *buf = b.p ? b.p : gw_xrealloc(NULL, 1);
    *len = b.len;
    return 0;
}

int gw_write_file(gguf_writer *gw, const char *path) {
    uint8_t *buf;
    size_t len;
    if (gw_write_mem(gw, &buf, &len)) return -1;
    FILE *fp = fopen(path, "wb");
    if (!fp) {
        free(buf);
        return -1;
    }
    int ok = fwrite(buf, 1, len, fp) == len;
    ok &= fclose(fp) == 0;
    free(buf);
    return ok ? 0 : -1;
}
