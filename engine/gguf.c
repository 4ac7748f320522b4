/* gguf.c - GGUF v2/v3 reader that treats every file as hostile.
 *
 * Parsing is one forward pass over the bytes with a cursor that refuses to
 * move past the end. Every count read from the file is checked against the
 * bytes left (times the smallest possible encoding of one element) before
 * anything is allocated, so a 40-byte file cannot make us allocate 2^60
 * items. Strings and primitive arrays point into the mapping; only keys and
 * tensor names are copied (they need a NUL). Duplicates are found by sorting
 * pointer indexes, which we keep for O(log n) lookups.
 */
#include "gguf.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "quants.h"
#include "tinyloop.h"
#include "util.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gguf.c reads little-endian files in place and needs a little-endian host"
#endif

#define GGUF_MAGIC "GGUF"
#define GGUF_DEFAULT_ALIGNMENT 32
/* Real files nest at most one level (arrays of strings); 8 leaves room for
 * odd but honest files while bounding recursion on hostile ones. */
#define GGUF_MAX_NESTING 8
/* Smallest encodings, used to bound counts before allocating:
 * kv = key len u64 + 1 key byte + type u32 + 1 value byte;
 * tensor info = name len u64 + 1 byte + n_dims u32 + one ne u64 + type u32 + offset u64. */
#define MIN_KV_BYTES (8 + 1 + 4 + 1)
#define MIN_TENSOR_BYTES (8 + 1 + 4 + 8 + 4 + 8)

/* The public struct plus sorted indexes for lookups; callers only see `pub`. */
typedef struct gguf_impl {
    gguf_file pub;
    gguf_kv **kv_sorted;         /* n_kv entries, by key */
    gguf_tensor **tensor_sorted; /* n_tensors entries, by name */
} gguf_impl;

/* ---- cursor ------------------------------------------------------------- */

typedef struct reader {
    const uint8_t *p;
    size_t size, pos;
} reader;

static size_t left(const reader *r) { return r->size - r->pos; }

/* The `what` argument names the field for the truncation message. */
static int need(const reader *r, size_t n, const char *what) {
    if (n > left(r))
        return tl_set_error(TL_ERR_FORMAT, "file truncated reading %s at offset %zu: need %zu bytes, %zu left",
                            what, r->pos, n, left(r));
    return 0;
}

static int rd_u32(reader *r, uint32_t *out, const char *what) {
    if (need(r, 4, what)) return -1;
    memcpy(out, r->p + r->pos, 4);
    r->pos += 4;
    return 0;
}

static int rd_u64(reader *r, uint64_t *out, const char *what) {
    if (need(r, 8, what)) return -1;
    memcpy(out, r->p + r->pos, 8);
    r->pos += 8;
    return 0;
}

/* Reads a length-prefixed string, in place; `key` (may be NULL) names the
 * owning key in messages. */
static int rd_str(reader *r, gguf_str *out, const char *what, const char *key) {
    uint64_t len;
    if (rd_u64(r, &len, what)) return -1;
    if (len > left(r))
        return tl_set_error(TL_ERR_FORMAT, "%s%s%s%s length %llu at offset %zu exceeds the %zu bytes left in the file",
                            key ? "key '" : "", key ? key : "", key ? "': " : "", what, (unsigned long long)len,
                            r->pos - 8, left(r));
    out->ptr = (const char *)r->p + r->pos;
    out->len = len;
    r->pos += (size_t)len;
    return 0;
}

/* Keys and tensor names become C strings, so they must be non-empty and
 * free of NUL bytes (an embedded NUL would make two distinct names compare
 * equal after the copy). */
static char *rd_name(reader *r, const char *what, uint64_t index) {
    gguf_str s;
    if (rd_str(r, &s, what, NULL)) return NULL;
    if (s.len == 0) {
        tl_set_error(TL_ERR_FORMAT, "empty %s (entry %llu)", what, (unsigned long long)index);
        return NULL;
    }
    const char *nul = memchr(s.ptr, 0, (size_t)s.len);
    if (nul) {
        /* %s is safe here: it stops at the NUL we just found. */
        tl_set_error(TL_ERR_FORMAT, "%s '%s...' (entry %llu) contains a NUL byte at position %zu", what, s.ptr,
                     (unsigned long long)index, (size_t)(nul - s.ptr));
        return NULL;
    }
    char *name = malloc((size_t)s.len + 1);
    if (!name) {
        tl_set_error(TL_ERR_NOMEM, "out of memory copying a %llu-byte %s", (unsigned long long)s.len, what);
        return NULL;
    }
    memcpy(name, s.ptr, (size_t)s.len);
    name[s.len] = 0;
    return name;
}

/* ---- values ------------------------------------------------------------- */

static const char *const vtype_names[GGUF_T_COUNT] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
};

const char *gguf_vtype_name(int type) {
    return type >= 0 && type < GGUF_T_COUNT ? vtype_names[type] : "unknown";
}

/* Bytes of one primitive element; 0 for string/array/unknown. */
static size_t prim_size(int type) {
    switch (type) {
    case GGUF_T_UINT8: case GGUF_T_INT8: case GGUF_T_BOOL: return 1;
    case GGUF_T_UINT16: case GGUF_T_INT16: return 2;
    case GGUF_T_UINT32: case GGUF_T_INT32: case GGUF_T_FLOAT32: return 4;
    case GGUF_T_UINT64: case GGUF_T_INT64: case GGUF_T_FLOAT64: return 8;
    default: return 0;
    }
}

static int is_signed(int type) {
    return type == GGUF_T_INT8 || type == GGUF_T_INT16 || type == GGUF_T_INT32 || type == GGUF_T_INT64;
}

static int is_int(int type) {
    return is_signed(type) || type == GGUF_T_UINT8 || type == GGUF_T_UINT16 || type == GGUF_T_UINT32 ||
           type == GGUF_T_UINT64;
}

static void free_value(gguf_value *v) {
    if (v->type != GGUF_T_ARRAY || !v->v.arr.items) return;
    for (uint64_t i = 0; i < v->v.arr.n; i++) free_value(&v->v.arr.items[i]);
    free(v->v.arr.items);
    v->v.arr.items = NULL;
}

/* Decodes one primitive from raw little-endian bytes into the widened union. */
static void decode_prim(gguf_value *v, const uint8_t *b) {
    switch (v->type) {
    case GGUF_T_UINT8: case GGUF_T_BOOL: v->v.u64 = b[0]; break;
    case GGUF_T_INT8: v->v.i64 = (int8_t)b[0]; break;
    case GGUF_T_UINT16: { uint16_t x; memcpy(&x, b, 2); v->v.u64 = x; break; }
    case GGUF_T_INT16: { int16_t x; memcpy(&x, b, 2); v->v.i64 = x; break; }
    case GGUF_T_UINT32: { uint32_t x; memcpy(&x, b, 4); v->v.u64 = x; break; }
    case GGUF_T_INT32: { int32_t x; memcpy(&x, b, 4); v->v.i64 = x; break; }
    case GGUF_T_FLOAT32: { float x; memcpy(&x, b, 4); v->v.f64 = x; break; }
    case GGUF_T_UINT64: memcpy(&v->v.u64, b, 8); break;
    case GGUF_T_INT64: memcpy(&v->v.i64, b, 8); break;
    case GGUF_T_FLOAT64: memcpy(&v->v.f64, b, 8); break;
    default: assert(0);
    }
}

/* Reads a value of known `type` (already consumed). `key` names it in
 * messages; `depth` counts enclosing arrays. On failure *v may hold partial
 * allocations, which the caller frees with free_value. */
static int rd_value(reader *r, gguf_value *v, int type, const char *key, int depth) {
    v->type = type;
    size_t es = prim_size(type);
    if (es) {
        if (need(r, es, "a value")) return -1;
        const uint8_t *b = r->p + r->pos;
        if (type == GGUF_T_BOOL && b[0] > 1)
            return tl_set_error(TL_ERR_FORMAT, "key '%s': bool value %u is not 0 or 1", key, b[0]);
        decode_prim(v, b);
        r->pos += es;
        return 0;
    }
    if (type == GGUF_T_STRING) return rd_str(r, &v->v.str, "string value", key);
    assert(type == GGUF_T_ARRAY); /* callers reject unknown types */

    if (depth >= GGUF_MAX_NESTING)
        return tl_set_error(TL_ERR_FORMAT, "key '%s': array nesting deeper than %d levels", key,
                            GGUF_MAX_NESTING);
    uint32_t et;
    uint64_t n;
    if (rd_u32(r, &et, "array element type") || rd_u64(r, &n, "array length")) return -1;
    if (et >= GGUF_T_COUNT)
        return tl_set_error(TL_ERR_FORMAT, "key '%s': unknown array element type %u", key, et);
    v->v.arr.type = (int)et;
    /* Smallest encoding of one element: a primitive, a string's length, or
     * a nested array's type + count. Checked before allocating anything. */
    size_t min_elem = prim_size((int)et) ? prim_size((int)et) : et == GGUF_T_STRING ? 8 : 12;
    if (n > left(r) / min_elem)
        return tl_set_error(TL_ERR_FORMAT,
                            "key '%s': array of %llu %s elements (at least %zu bytes each) exceeds the %zu bytes left",
                            key, (unsigned long long)n, gguf_vtype_name((int)et), min_elem, left(r));
    v->v.arr.n = n;
    if (prim_size((int)et)) {
        const uint8_t *b = r->p + r->pos;
        if (et == GGUF_T_BOOL)
            for (uint64_t i = 0; i < n; i++)
                if (b[i] > 1)
                    return tl_set_error(TL_ERR_FORMAT, "key '%s': bool element %llu has value %u, not 0 or 1",
                                        key, (unsigned long long)i, b[i]);
        v->v.arr.data = b;
        r->pos += (size_t)n * min_elem;
        return 0;
    }
    if (n == 0) return 0;
    v->v.arr.items = calloc((size_t)n, sizeof(gguf_value));
    if (!v->v.arr.items)
        return tl_set_error(TL_ERR_NOMEM, "key '%s': out of memory for %llu array elements", key,
                            (unsigned long long)n);
    for (uint64_t i = 0; i < n; i++) {
        gguf_value *it = &v->v.arr.items[i];
        if (et == GGUF_T_ARRAY) {
            /* A nested array carries its own element type and count, so
             * sibling arrays may differ in element type. */
            if (rd_value(r, it, GGUF_T_ARRAY, key, depth + 1)) return -1;
        } else {
            it->type = GGUF_T_STRING;
            if (rd_str(r, &it->v.str, "string element", key)) return -1;
        }
    }
    return 0;
}

/* ---- duplicates and lookup ---------------------------------------------- */

static int cmp_kv(const void *a, const void *b) {
    return strcmp((*(gguf_kv *const *)a)->key, (*(gguf_kv *const *)b)->key);
}

static int cmp_tensor(const void *a, const void *b) {
    return strcmp((*(gguf_tensor *const *)a)->name, (*(gguf_tensor *const *)b)->name);
}

static int index_kvs(gguf_impl *g) {
    gguf_file *f = &g->pub;
    g->kv_sorted = malloc((f->n_kv ? f->n_kv : 1) * sizeof *g->kv_sorted);
    if (!g->kv_sorted) return tl_set_error(TL_ERR_NOMEM, "out of memory indexing %llu keys", (unsigned long long)f->n_kv);
    for (uint64_t i = 0; i < f->n_kv; i++) g->kv_sorted[i] = &f->kv[i];
    qsort(g->kv_sorted, (size_t)f->n_kv, sizeof *g->kv_sorted, cmp_kv);
    for (uint64_t i = 1; i < f->n_kv; i++)
        if (!strcmp(g->kv_sorted[i - 1]->key, g->kv_sorted[i]->key))
            return tl_set_error(TL_ERR_FORMAT, "duplicate key '%s'", g->kv_sorted[i]->key);
    return 0;
}

static int index_tensors(gguf_impl *g) {
    gguf_file *f = &g->pub;
    g->tensor_sorted = malloc((f->n_tensors ? f->n_tensors : 1) * sizeof *g->tensor_sorted);
    if (!g->tensor_sorted)
        return tl_set_error(TL_ERR_NOMEM, "out of memory indexing %llu tensors", (unsigned long long)f->n_tensors);
    for (uint64_t i = 0; i < f->n_tensors; i++) g->tensor_sorted[i] = &f->tensors[i];
    qsort(g->tensor_sorted, (size_t)f->n_tensors, sizeof *g->tensor_sorted, cmp_tensor);
    for (uint64_t i = 1; i < f->n_tensors; i++)
        if (!strcmp(g->tensor_sorted[i - 1]->name, g->tensor_sorted[i]->name))
            return tl_set_error(TL_ERR_FORMAT, "duplicate tensor name '%s'", g->tensor_sorted[i]->name);
    return 0;
}

const gguf_kv *gguf_find_kv(const gguf_file *f, const char *key) {
    const gguf_impl *g = (const gguf_impl *)f;
    gguf_kv probe = {.key = (char *)key}, *pp = &probe;
    gguf_kv **hit = bsearch(&pp, g->kv_sorted, (size_t)f->n_kv, sizeof *g->kv_sorted, cmp_kv);
    return hit ? *hit : NULL;
}

const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name) {
    const gguf_impl *g = (const gguf_impl *)f;
    gguf_tensor probe = {.name = (char *)name}, *pp = &probe;
    gguf_tensor **hit = bsearch(&pp, g->tensor_sorted, (size_t)f->n_tensors, sizeof *g->tensor_sorted, cmp_tensor);
    return hit ? *hit : NULL;
}

/* ---- tensors ------------------------------------------------------------ */

/* Reads one tensor info and checks everything that does not depend on the
 * data section: dims, type, sizes, offset alignment. */
static int rd_tensor(reader *r, gguf_tensor *t, uint64_t index, size_t alignment) {
    t->name = rd_name(r, "tensor name", index);
    if (!t->name) return -1;
    if (rd_u32(r, &t->n_dims, "tensor n_dims")) return -1;
    if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS)
        return tl_set_error(TL_ERR_FORMAT, "tensor '%s': n_dims %u out of range 1..%d", t->name, t->n_dims,
                            GGUF_MAX_DIMS);
    for (int d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    /* Zero-sized dims are allowed (as in ggml); negative ones are not. */
    for (uint32_t d = 0; d < t->n_dims; d++) {
        uint64_t ne;
        if (rd_u64(r, &ne, "tensor dims")) return -1;
        if (ne > (uint64_t)INT64_MAX)
            return tl_set_error(TL_ERR_FORMAT, "tensor '%s': ne[%u] = %lld is negative", t->name, d,
                                (long long)ne);
        t->ne[d] = (int64_t)ne;
    }
    int64_t nel = 1, rows = 1;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) {
        if (__builtin_mul_overflow(nel, t->ne[d], &nel) || (d > 0 && __builtin_mul_overflow(rows, t->ne[d], &rows)))
            return tl_set_error(TL_ERR_FORMAT,
                                "tensor '%s': element count %lld x %lld x %lld x %lld overflows", t->name,
                                (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3]);
    }
    t->n_elements = nel;

    uint32_t type;
    if (rd_u32(r, &type, "tensor type")) return -1;
    const tl_type_traits *tr = tl_type_info(type < TL_TYPE_COUNT ? (int)type : -1);
    if (!tr->name) return tl_set_error(TL_ERR_FORMAT, "tensor '%s': unknown type id %u", t->name, type);
    t->type = (int)type;
    if (t->ne[0] % tr->block_size)
        return tl_set_error(TL_ERR_FORMAT, "tensor '%s': ne[0] = %lld is not a multiple of the %s block size %d",
                            t->name, (long long)t->ne[0], tr->name, tr->block_size);
    /* tl_row_size does not check for overflow, so bound the block count first. */
    uint64_t blocks = (uint64_t)t->ne[0] / (uint64_t)tr->block_size;
    if (blocks > SIZE_MAX / tr->type_size ||
        tl_mul_size(tl_row_size(t->type, t->ne[0]), (size_t)rows, &t->size))
        return tl_set_error(TL_ERR_FORMAT, "tensor '%s': byte size of %lld x %lld %s elements overflows",
                            t->name, (long long)t->ne[0], (long long)rows, tr->name);

    if (rd_u64(r, &t->offset, "tensor offset")) return -1;
    if (t->offset % alignment)
        return tl_set_error(TL_ERR_FORMAT, "tensor '%s': data offset %llu is not a multiple of the alignment %zu",
                            t->name, (unsigned long long)t->offset, alignment);
    return 0;
}

/* general.alignment, when present, must be a u32 power of two. */
static int get_alignment(gguf_impl *g, size_t *out) {
    const gguf_kv *kv = gguf_find_kv(&g->pub, "general.alignment");
    *out = GGUF_DEFAULT_ALIGNMENT;
    if (!kv) return 0;
    if (kv->value.type != GGUF_T_UINT32)
        return tl_set_error(TL_ERR_FORMAT, "key 'general.alignment' has type %s, expected u32",
                            gguf_vtype_name(kv->value.type));
    uint64_t a = kv->value.v.u64;
    if (a == 0 || (a & (a - 1)))
        return tl_set_error(TL_ERR_FORMAT, "key 'general.alignment' = %llu is not a nonzero power of two",
                            (unsigned long long)a);
    *out = (size_t)a;
    return 0;
}

/* ---- open / close ------------------------------------------------------- */

static void free_file(gguf_impl *g) {
    gguf_file *f = &g->pub;
    if (f->kv) {
        for (uint64_t i = 0; i < f->n_kv; i++) {
            free(f->kv[i].key);
            free_value(&f->kv[i].value);
        }
        free(f->kv);
    }
    if (f->tensors) {
        for (uint64_t i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
        free(f->tensors);
    }
    free(g->kv_sorted);
    free(g->tensor_sorted);
    free(g);
}

/* Reads the header and every kv; leaves the cursor at the tensor infos. */
static int parse_header_kv(reader *r, gguf_file *f) {
    if (r->size < 4) return tl_set_error(TL_ERR_FORMAT, "bad magic: not a GGUF file (only %zu bytes)", r->size);
    if (memcmp(r->p, GGUF_MAGIC, 4))
        return tl_set_error(TL_ERR_FORMAT, "bad magic: not a GGUF file (first bytes %02x %02x %02x %02x)", r->p[0],
                            r->p[1], r->p[2], r->p[3]);
    r->pos = 4;
    if (rd_u32(r, &f->version, "version")) return -1;
    if (f->version == 1)
        return tl_set_error(TL_ERR_FORMAT, "GGUF version 1 is not supported (only v2 and v3; re-convert the model)");
    if (f->version != 2 && f->version != 3)
        return tl_set_error(TL_ERR_FORMAT, "unsupported GGUF version %u (expected 2 or 3%s)", f->version,
                            f->version > 0xffff ? "; a big-endian file?" : "");
    uint64_t n_tensors, n_kv;
    if (rd_u64(r, &n_tensors, "n_tensors") || rd_u64(r, &n_kv, "n_kv")) return -1;
    if (n_tensors > left(r) / MIN_TENSOR_BYTES)
        return tl_set_error(TL_ERR_FORMAT, "n_tensors %llu cannot fit in the %zu bytes left (at least %d bytes each)",
                            (unsigned long long)n_tensors, left(r), MIN_TENSOR_BYTES);
    if (n_kv > left(r) / MIN_KV_BYTES || n_kv * MIN_KV_BYTES + n_tensors * MIN_TENSOR_BYTES > left(r))
        return tl_set_error(TL_ERR_FORMAT,
                            "n_kv %llu with n_tensors %llu cannot fit in the %zu bytes left (at least %d bytes per kv)",
                            (unsigned long long)n_kv, (unsigned long long)n_tensors, left(r), MIN_KV_BYTES);

    f->kv = calloc(n_kv ? (size_t)n_kv : 1, sizeof *f->kv);
    f->tensors = calloc(n_tensors ? (size_t)n_tensors : 1, sizeof *f->tensors);
    if (!f->kv || !f->tensors) return tl_set_error(TL_ERR_NOMEM, "out of memory for GGUF metadata");
    /* Both tables start zeroed, so free_file can release a half-read file. */
    f->n_kv = n_kv;
    f->n_tensors = n_tensors;
    for (uint64_t i = 0; i < n_kv; i++) {
        gguf_kv *kv = &f->kv[i];
        kv->key = rd_name(r, "key", i);
        if (!kv->key) return -1;
        uint32_t type;
        if (rd_u32(r, &type, "value type")) return -1;
        if (type >= GGUF_T_COUNT)
            return tl_set_error(TL_ERR_FORMAT, "key '%s': unknown value type %u at offset %zu", kv->key, type,
                                r->pos - 4);
        if (rd_value(r, &kv->value, (int)type, kv->key, 0)) return -1;
    }
    return 0;
}

static int parse_tensors(reader *r, gguf_impl *g) {
    gguf_file *f = &g->pub;
    uint64_t n_tensors = f->n_tensors;
    for (uint64_t i = 0; i < n_tensors; i++) {
        if (rd_tensor(r, &f->tensors[i], i, f->alignment)) return -1;
    }
    /* The data section starts at the next multiple of the alignment. A file
     * without tensors may end before that padding; clamp so data_offset
     * stays inside the file. */
    size_t pad = (f->alignment - r->pos % f->alignment) % f->alignment;
    if (pad > left(r)) {
        if (n_tensors > 0)
            return tl_set_error(TL_ERR_FORMAT, "data section at offset %zu (aligned to %zu) lies past end of file (size %zu)",
                                r->pos + pad, f->alignment, r->size);
        pad = left(r);
    }
    f->data_offset = r->pos + pad;
    size_t data_size = r->size - f->data_offset;
    for (uint64_t i = 0; i < n_tensors; i++) {
        gguf_tensor *t = &f->tensors[i];
        if (t->offset > data_size || t->size > data_size - t->offset) {
            if (t->offset <= SIZE_MAX - f->data_offset)
                return tl_set_error(TL_ERR_FORMAT, "tensor '%s' data [offset %llu, size %zu] lies past end of file (size %zu)",
                                    t->name, (unsigned long long)(f->data_offset + t->offset), t->size, r->size);
            return tl_set_error(TL_ERR_FORMAT, "tensor '%s' data [offset %zu + %llu, size %zu] lies past end of file (size %zu)",
                                t->name, f->data_offset, (unsigned long long)t->offset, t->size, r->size);
        }
        t->data = f->base + f->data_offset + t->offset;
    }
    return 0;
}

gguf_file *gguf_open_buffer(const void *data, size_t size) {
    if (!data && size) {
        tl_set_error(TL_ERR_INVALID_ARG, "gguf_open_buffer: NULL data with size %zu", size);
        return NULL;
    }
    gguf_impl *g = calloc(1, sizeof *g);
    if (!g) {
        tl_set_error(TL_ERR_NOMEM, "out of memory opening a GGUF buffer");
        return NULL;
    }
    gguf_file *f = &g->pub;
    static const uint8_t empty[1];
    f->base = data ? data : empty;
    f->size = size;
    reader r = {f->base, size, 0};
    if (parse_header_kv(&r, f) || index_kvs(g) || get_alignment(g, &f->alignment) || parse_tensors(&r, g) ||
        index_tensors(g))
        goto fail;
    return f;
fail:
    free_file(g);
    return NULL;
}

gguf_file *gguf_open(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        tl_set_error(TL_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        tl_set_error(TL_ERR_IO, "cannot stat '%s': %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) {
        tl_set_error(TL_ERR_IO, "'%s' is not a regular file", path);
        close(fd);
        return NULL;
    }
    if ((uint64_t)st.st_size > SIZE_MAX) {
        tl_set_error(TL_ERR_IO, "'%s' is too large to map (%lld bytes)", path, (long long)st.st_size);
        close(fd);
        return NULL;
    }
    size_t size = (size_t)st.st_size;
    void *map = NULL;
    /* mmap rejects length 0; an empty file goes to the parser, which reports it. */
    if (size > 0) {
        map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            tl_set_error(TL_ERR_IO, "cannot mmap '%s' (%zu bytes): %s", path, size, strerror(errno));
            close(fd);
            return NULL;
        }
    }
    close(fd); /* the mapping keeps the file alive */
    gguf_file *f = gguf_open_buffer(map, size);
    if (!f) {
        /* Prefix the path; copy first because the message buffer is reused. */
        char msg[512];
        snprintf(msg, sizeof msg, "%s", tl_last_error());
        tl_set_error(TL_ERR_FORMAT, "%s: %s", path, msg);
        if (map) munmap(map, size);
        return NULL;
    }
    f->mapped = map != NULL;
    return f;
}

void gguf_close(gguf_file *f) {
    if (!f) return;
    if (f->mapped) munmap((void *)f->base, f->size);
    free_file((gguf_impl *)f);
}

/* ---- getters ------------------------------------------------------------ */

/* Formats a scalar value for messages. */
static const char *fmt_value(const gguf_value *v, char *buf, size_t n) {
    if (is_signed(v->type)) snprintf(buf, n, "%lld", (long long)v->v.i64);
    else if (is_int(v->type) || v->type == GGUF_T_BOOL) snprintf(buf, n, "%llu", (unsigned long long)v->v.u64);
    else if (v->type == GGUF_T_FLOAT32 || v->type == GGUF_T_FLOAT64) snprintf(buf, n, "%g", v->v.f64);
    else if (v->type == GGUF_T_STRING)
        snprintf(buf, n, "\"%.*s\"", (int)(v->v.str.len > 32 ? 32 : v->v.str.len), v->v.str.ptr);
    else snprintf(buf, n, "array of %llu %s", (unsigned long long)v->v.arr.n, gguf_vtype_name(v->v.arr.type));
    return buf;
}

static int bad_type(const gguf_kv *kv, const char *want) {
    char b[64];
    return tl_set_error(TL_ERR_FORMAT, "key '%s' has type %s (value %s), expected %s", kv->key,
                        gguf_vtype_name(kv->value.type), fmt_value(&kv->value, b, sizeof b), want);
}

static int out_of_range(const gguf_kv *kv, const char *want) {
    char b[64];
    tl_set_error(TL_ERR_FORMAT, "key '%s' (%s) value %s does not fit in %s", kv->key,
                 gguf_vtype_name(kv->value.type), fmt_value(&kv->value, b, sizeof b), want);
    return -1;
}

int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out) {
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) return 0;
    const gguf_value *v = &kv->value;
    if (!is_int(v->type)) return bad_type(kv, "an integer"), -1;
    if (is_signed(v->type) ? (v->v.i64 < 0 || v->v.i64 > UINT32_MAX) : v->v.u64 > UINT32_MAX)
        return out_of_range(kv, "u32");
    *out = is_signed(v->type) ? (uint32_t)v->v.i64 : (uint32_t)v->v.u64;
    return 1;
}

int gguf_get_i64(const gguf_file *f, const char *key, int64_t *out) {
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) return 0;
    const gguf_value *v = &kv->value;
    if (!is_int(v->type)) return bad_type(kv, "an integer"), -1;
    if (!is_signed(v->type) && v->v.u64 > INT64_MAX) return out_of_range(kv, "i64");
    *out = is_signed(v->type) ? v->v.i64 : (int64_t)v->v.u64;
    return 1;
}

int gguf_get_f32(const gguf_file *f, const char *key, float *out) {
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) return 0;
    const gguf_value *v = &kv->value;
    double d;
    if (v->type == GGUF_T_FLOAT32 || v->type == GGUF_T_FLOAT64) d = v->v.f64;
    else if (is_signed(v->type)) d = (double)v->v.i64;
    else if (is_int(v->type)) d = (double)v->v.u64;
    else return bad_type(kv, "a number"), -1;
    /* NaN and infinities pass through; only finite values too big for a float are refused. */
    if (d == d && (d > FLT_MAX || d < -FLT_MAX) && d - d == 0) return out_of_range(kv, "f32");
    *out = (float)d;
    return 1;
}

int gguf_get_bool(const gguf_file *f, const char *key, int *out) {
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) return 0;
    if (kv->value.type != GGUF_T_BOOL) return bad_type(kv, "bool"), -1;
    *out = kv->value.v.u64 != 0;
    return 1;
}

int gguf_get_str(const gguf_file *f, const char *key, gguf_str *out) {
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) return 0;
    if (kv->value.type != GGUF_T_STRING) return bad_type(kv, "string"), -1;
    *out = kv->value.v.str;
    return 1;
}

int gguf_get_arr(const gguf_file *f, const char *key, int elem_type, const gguf_value **out) {
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) return 0;
    if (kv->value.type != GGUF_T_ARRAY) return bad_type(kv, "array"), -1;
    if (elem_type >= 0 && kv->value.v.arr.type != elem_type) {
        tl_set_error(TL_ERR_FORMAT, "key '%s' is an array of %llu %s, expected elements of type %s", kv->key,
                     (unsigned long long)kv->value.v.arr.n, gguf_vtype_name(kv->value.v.arr.type),
                     gguf_vtype_name(elem_type));
        return -1;
    }
    *out = &kv->value;
    return 1;
}

float gguf_arr_f32(const gguf_value *arr, uint64_t i) {
    assert(arr->type == GGUF_T_ARRAY && arr->v.arr.type == GGUF_T_FLOAT32 && i < arr->v.arr.n);
    float x;
    memcpy(&x, (const uint8_t *)arr->v.arr.data + i * 4, 4); /* elements may be unaligned */
    return x;
}

int32_t gguf_arr_i32(const gguf_value *arr, uint64_t i) {
    assert(arr->type == GGUF_T_ARRAY && (arr->v.arr.type == GGUF_T_INT32 || arr->v.arr.type == GGUF_T_UINT32) &&
           i < arr->v.arr.n);
    int32_t x;
    memcpy(&x, (const uint8_t *)arr->v.arr.data + i * 4, 4);
    return x;
}
