/* test_gguf.c - the GGUF reader against files from tests/c/lib/gguf_writer:
 * every value type (nested arrays too), v2 and v3, custom alignments, the
 * shared stories260K model, truncation at every byte, and one specific
 * rejection message per kind of malformed file. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf.h"
#include "gguf_writer.h"
#include "quants.h"
#include "test.h"
#include "util.h"

/* ---- helpers ------------------------------------------------------------ */

static uint8_t *finish(gguf_writer *gw, size_t *len) {
    uint8_t *buf;
    gw_write_mem(gw, &buf, len);
    gw_free(gw);
    return buf;
}

/* Offset just past the first occurrence of `s` in buf (the field after a
 * key or tensor name), or 0 when absent. */
static size_t after(const uint8_t *buf, size_t len, const char *s) {
    size_t n = strlen(s);
    for (size_t i = 0; i + n <= len; i++)
        if (!memcmp(buf + i, s, n)) return i + n;
    return 0;
}

static void poke32(uint8_t *b, size_t off, uint32_t v) { memcpy(b + off, &v, 4); }
static void poke64(uint8_t *b, size_t off, uint64_t v) { memcpy(b + off, &v, 8); }

static void fill(uint8_t *p, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = (uint8_t)(seed >> 24);
    }
}

/* Parses an exact-size heap copy (so ASan sees any over-read); expects a
 * rejection whose message contains `phrase`. */
static void expect_reject(const uint8_t *buf, size_t len, const char *phrase, const char *what) {
    uint8_t *copy = malloc(len ? len : 1);
    memcpy(copy, buf, len);
    tl_set_error(0, "%s", "");
    gguf_file *f = gguf_open_buffer(copy, len);
    if (getenv("TL_TEST_VERBOSE")) printf("  %s: %s\n", what, tl_last_error());
    CHECK(f == NULL, "%s is rejected", what);
    CHECK(strstr(tl_last_error(), phrase) != NULL, "%s is rejected with a message containing \"%s\" (got \"%s\")",
          what, phrase, tl_last_error());
    gguf_close(f);
    free(copy);
}

static gguf_file *expect_accept(const uint8_t *buf, size_t len, const char *what) {
    gguf_file *f = gguf_open_buffer(buf, len);
    CHECK(f != NULL, "%s is accepted (error: %s)", what, tl_last_error());
    return f;
}

/* ---- 1. every value type, tensors, alignment ---------------------------- */

#define N_TENSORS 5
static const struct {
    const char *name;
    int type, n_dims;
    int64_t ne[4];
    size_t nbytes;
} tdefs[N_TENSORS] = {
    {"tok.f32", TL_TYPE_F32, 2, {8, 3}, 8 * 3 * 4},
    {"w.f16", TL_TYPE_F16, 3, {16, 2, 2}, 16 * 4 * 2},
    {"w.q8_0", TL_TYPE_Q8_0, 2, {64, 2}, 2 * 2 * 34},
    {"empty.f32", TL_TYPE_F32, 2, {0, 4}, 0},
    {"w.q4_k", TL_TYPE_Q4_K, 4, {256, 2, 1, 1}, 2 * 144},
};

static const uint8_t prim_bytes[24] = {1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0};
static const float arr_f32[3] = {0.5f, -2.0f, 1e10f};
static const int32_t arr_i32[4] = {-1, 0, 7, INT32_MIN};
static const char *const arr_str[3] = {"x", "yy", ""};

static gguf_writer *make_full(uint32_t version, uint32_t alignment) {
    gguf_writer *gw = gw_new();
    gw_set_version(gw, version);
    if (alignment) gw_set_alignment(gw, alignment);
    gw_set_str(gw, "general.architecture", "llama");
    gw_set_u8(gw, "t.u8", 200);
    gw_set_i8(gw, "t.i8", -100);
    gw_set_u16(gw, "t.u16", 60000);
    gw_set_i16(gw, "t.i16", -30000);
    gw_set_u32(gw, "t.u32", 4000000000u);
    gw_set_i32(gw, "t.i32", -2000000000);
    gw_set_f32(gw, "t.f32", 1.5f);
    gw_set_bool(gw, "t.bool", 1);
    gw_set_bool(gw, "t.false", 0);
    gw_set_str(gw, "t.str", "hello");
    gw_set_strn(gw, "t.strn", "a\0b\xff", 4);
    gw_set_str(gw, "t.empty", "");
    gw_set_u64(gw, "t.u64", (1ull << 40) + 7);
    gw_set_u64(gw, "t.u64max", UINT64_MAX);
    gw_set_i64(gw, "t.i64", -(1ll << 40));
    gw_set_f64(gw, "t.f64", 3.25e100);
    gw_set_f64(gw, "t.f64s", 0.125);
    /* One flat array per primitive type, three elements each. */
    for (int t = 0; t < GGUF_T_COUNT; t++) {
        if (t == GGUF_T_STRING || t == GGUF_T_ARRAY) continue;
        char key[32];
        snprintf(key, sizeof key, "a.%s", gguf_vtype_name(t));
        if (t == GGUF_T_FLOAT32) gw_set_arr_f32(gw, key, arr_f32, 3);
        else gw_set_arr_prim(gw, key, t, prim_bytes, 3);
    }
    gw_set_arr_i32(gw, "a.i32s", arr_i32, 4);
    gw_set_arr_str(gw, "a.str", arr_str, 3);
    gw_set_arr_i32(gw, "a.empty", NULL, 0);
    /* [["a", "b"], [], ["c"]] */
    gw_arr *outer = gw_arr_new(GGUF_T_ARRAY), *in = gw_arr_new(GGUF_T_STRING);
    gw_arr_push_str(in, "a");
    gw_arr_push_str(in, "b");
    gw_arr_push_arr(outer, in);
    gw_arr_push_arr(outer, gw_arr_new(GGUF_T_STRING));
    in = gw_arr_new(GGUF_T_STRING);
    gw_arr_push_str(in, "c");
    gw_arr_push_arr(outer, in);
    gw_set_arr(gw, "a.nested_str", outer);
    /* Siblings of different element types: [[i32 5, i32 6], ["z"]] */
    outer = gw_arr_new(GGUF_T_ARRAY);
    in = gw_arr_new(GGUF_T_INT32);
    int32_t five = 5, six = 6;
    gw_arr_push_prim(in, &five);
    gw_arr_push_prim(in, &six);
    gw_arr_push_arr(outer, in);
    in = gw_arr_new(GGUF_T_STRING);
    gw_arr_push_str(in, "z");
    gw_arr_push_arr(outer, in);
    gw_set_arr(gw, "a.mixed", outer);
    /* Eight levels deep, the most the reader allows: [[[[[[[[u8 9]]]]]]]] */
    gw_arr *deep = gw_arr_new(GGUF_T_UINT8);
    uint8_t nine = 9;
    gw_arr_push_prim(deep, &nine);
    for (int d = 1; d < 8; d++) {
        gw_arr *up = gw_arr_new(GGUF_T_ARRAY);
        gw_arr_push_arr(up, deep);
        deep = up;
    }
    gw_set_arr(gw, "a.deep8", deep);

    for (int i = 0; i < N_TENSORS; i++) {
        uint8_t data[512];
        fill(data, tdefs[i].nbytes, (uint32_t)i + 1);
        gw_add_tensor(gw, tdefs[i].name, tdefs[i].type, tdefs[i].n_dims, tdefs[i].ne, data, tdefs[i].nbytes);
    }
    return gw;
}

static int str_eq(gguf_str s, const char *want, size_t n) { return s.len == n && !memcmp(s.ptr, want, n); }

static void check_values(const gguf_file *f, const char *ctx) {
    const gguf_kv *kv;
    uint32_t u;
    int64_t i;
    float x;
    int b;
    gguf_str s;
    const gguf_value *a;

    kv = gguf_find_kv(f, "t.u8");
    CHECK(kv && kv->value.type == GGUF_T_UINT8 && kv->value.v.u64 == 200, "%s: u8 reads back as 200", ctx);
    kv = gguf_find_kv(f, "t.i8");
    CHECK(kv && kv->value.type == GGUF_T_INT8 && kv->value.v.i64 == -100, "%s: i8 reads back as -100", ctx);
    kv = gguf_find_kv(f, "t.u16");
    CHECK(kv && kv->value.type == GGUF_T_UINT16 && kv->value.v.u64 == 60000, "%s: u16 reads back", ctx);
    kv = gguf_find_kv(f, "t.i16");
    CHECK(kv && kv->value.type == GGUF_T_INT16 && kv->value.v.i64 == -30000, "%s: i16 reads back", ctx);
    kv = gguf_find_kv(f, "t.u32");
    CHECK(kv && kv->value.type == GGUF_T_UINT32 && kv->value.v.u64 == 4000000000u, "%s: u32 reads back", ctx);
    kv = gguf_find_kv(f, "t.i32");
    CHECK(kv && kv->value.type == GGUF_T_INT32 && kv->value.v.i64 == -2000000000, "%s: i32 reads back", ctx);
    kv = gguf_find_kv(f, "t.f32");
    CHECK(kv && kv->value.type == GGUF_T_FLOAT32 && kv->value.v.f64 == 1.5, "%s: f32 reads back", ctx);
    kv = gguf_find_kv(f, "t.bool");
    CHECK(kv && kv->value.type == GGUF_T_BOOL && kv->value.v.u64 == 1, "%s: bool reads back as true", ctx);
    kv = gguf_find_kv(f, "t.str");
    CHECK(kv && kv->value.type == GGUF_T_STRING && str_eq(kv->value.v.str, "hello", 5), "%s: string reads back", ctx);
    kv = gguf_find_kv(f, "t.strn");
    CHECK(kv && str_eq(kv->value.v.str, "a\0b\xff", 4), "%s: a string with NUL and 0xff bytes reads back", ctx);
    kv = gguf_find_kv(f, "t.empty");
    CHECK(kv && kv->value.type == GGUF_T_STRING && kv->value.v.str.len == 0, "%s: empty string reads back", ctx);
    kv = gguf_find_kv(f, "t.u64");
    CHECK(kv && kv->value.type == GGUF_T_UINT64 && kv->value.v.u64 == (1ull << 40) + 7, "%s: u64 reads back", ctx);
    kv = gguf_find_kv(f, "t.i64");
    CHECK(kv && kv->value.type == GGUF_T_INT64 && kv->value.v.i64 == -(1ll << 40), "%s: i64 reads back", ctx);
    kv = gguf_find_kv(f, "t.f64");
    CHECK(kv && kv->value.type == GGUF_T_FLOAT64 && kv->value.v.f64 == 3.25e100, "%s: f64 reads back", ctx);

    for (int t = 0; t < GGUF_T_COUNT; t++) {
        if (t == GGUF_T_STRING || t == GGUF_T_ARRAY || t == GGUF_T_FLOAT32) continue;
        char key[32];
        snprintf(key, sizeof key, "a.%s", gguf_vtype_name(t));
        size_t es = t == GGUF_T_UINT8 || t == GGUF_T_INT8 || t == GGUF_T_BOOL ? 1
                    : t == GGUF_T_UINT16 || t == GGUF_T_INT16                 ? 2
                    : t == GGUF_T_UINT64 || t == GGUF_T_INT64 || t == GGUF_T_FLOAT64 ? 8 : 4;
        int r = gguf_get_arr(f, key, t, &a);
        CHECK(r == 1 && a->v.arr.n == 3 && a->v.arr.items == NULL && !memcmp(a->v.arr.data, prim_bytes, 3 * es),
              "%s: array of %s holds its 3 raw elements", ctx, gguf_vtype_name(t));
    }
    CHECK(gguf_get_arr(f, "a.f32", GGUF_T_FLOAT32, &a) == 1 && gguf_arr_f32(a, 0) == 0.5f &&
              gguf_arr_f32(a, 1) == -2.0f && gguf_arr_f32(a, 2) == 1e10f,
          "%s: f32 array elements read back through gguf_arr_f32", ctx);
    CHECK(gguf_get_arr(f, "a.i32s", -1, &a) == 1 && a->v.arr.n == 4 && gguf_arr_i32(a, 0) == -1 &&
              gguf_arr_i32(a, 2) == 7 && gguf_arr_i32(a, 3) == INT32_MIN,
          "%s: i32 array elements read back through gguf_arr_i32", ctx);
    CHECK(gguf_get_arr(f, "a.str", GGUF_T_STRING, &a) == 1 && a->v.arr.n == 3 &&
              str_eq(a->v.arr.items[0].v.str, "x", 1) && str_eq(a->v.arr.items[1].v.str, "yy", 2) &&
              a->v.arr.items[2].v.str.len == 0,
          "%s: string array reads back", ctx);
    CHECK(gguf_get_arr(f, "a.empty", GGUF_T_INT32, &a) == 1 && a->v.arr.n == 0, "%s: empty array reads back", ctx);
    int r = gguf_get_arr(f, "a.nested_str", GGUF_T_ARRAY, &a);
    CHECK(r == 1 && a->v.arr.n == 3 && a->v.arr.items[0].v.arr.type == GGUF_T_STRING &&
              a->v.arr.items[0].v.arr.n == 2 && str_eq(a->v.arr.items[0].v.arr.items[1].v.str, "b", 1) &&
              a->v.arr.items[1].v.arr.n == 0 && a->v.arr.items[2].v.arr.n == 1 &&
              str_eq(a->v.arr.items[2].v.arr.items[0].v.str, "c", 1),
          "%s: array of arrays of strings reads back", ctx);
    r = gguf_get_arr(f, "a.mixed", GGUF_T_ARRAY, &a);
    CHECK(r == 1 && a->v.arr.n == 2 && a->v.arr.items[0].v.arr.type == GGUF_T_INT32 &&
              gguf_arr_i32(&a->v.arr.items[0], 1) == 6 && a->v.arr.items[1].v.arr.type == GGUF_T_STRING &&
              str_eq(a->v.arr.items[1].v.arr.items[0].v.str, "z", 1),
          "%s: nested arrays of different element types read back", ctx);
    r = gguf_get_arr(f, "a.deep8", GGUF_T_ARRAY, &a);
    int depth = 1;
    while (r == 1 && a->v.arr.type == GGUF_T_ARRAY && a->v.arr.n == 1) a = &a->v.arr.items[0], depth++;
    CHECK(r == 1 && depth == 8 && a->v.arr.type == GGUF_T_UINT8 && ((const uint8_t *)a->v.arr.data)[0] == 9,
          "%s: an array nested 8 deep reads back (depth %d)", ctx, depth);

    /* Getters: conversions, absence, wrong types, range. */
    CHECK(gguf_get_u32(f, "t.u8", &u) == 1 && u == 200, "%s: gguf_get_u32 widens a u8", ctx);
    CHECK(gguf_get_u32(f, "t.u32", &u) == 1 && u == 4000000000u, "%s: gguf_get_u32 reads a u32", ctx);
    CHECK(gguf_get_u32(f, "t.missing", &u) == 0, "%s: gguf_get_u32 returns 0 for an absent key", ctx);
    CHECK(gguf_get_u32(f, "t.i32", &u) == -1 && strstr(tl_last_error(), "t.i32") &&
              strstr(tl_last_error(), "-2000000000"),
          "%s: gguf_get_u32 refuses a negative i32, naming key and value (%s)", ctx, tl_last_error());
    CHECK(gguf_get_u32(f, "t.u64", &u) == -1 && strstr(tl_last_error(), "1099511627783"),
          "%s: gguf_get_u32 refuses a u64 above 2^32 (%s)", ctx, tl_last_error());
    CHECK(gguf_get_u32(f, "t.str", &u) == -1 && strstr(tl_last_error(), "string"),
          "%s: gguf_get_u32 refuses a string (%s)", ctx, tl_last_error());
    CHECK(gguf_get_i64(f, "t.i64", &i) == 1 && i == -(1ll << 40), "%s: gguf_get_i64 reads an i64", ctx);
    CHECK(gguf_get_i64(f, "t.u16", &i) == 1 && i == 60000, "%s: gguf_get_i64 widens a u16", ctx);
    CHECK(gguf_get_i64(f, "t.u64max", &i) == -1 && strstr(tl_last_error(), "18446744073709551615"),
          "%s: gguf_get_i64 refuses a u64 above INT64_MAX (%s)", ctx, tl_last_error());
    CHECK(gguf_get_f32(f, "t.f32", &x) == 1 && x == 1.5f, "%s: gguf_get_f32 reads an f32", ctx);
    CHECK(gguf_get_f32(f, "t.f64s", &x) == 1 && x == 0.125f, "%s: gguf_get_f32 narrows an f64", ctx);
    CHECK(gguf_get_f32(f, "t.i16", &x) == 1 && x == -30000.0f, "%s: gguf_get_f32 converts an integer", ctx);
    CHECK(gguf_get_f32(f, "t.f64", &x) == -1 && strstr(tl_last_error(), "t.f64"),
          "%s: gguf_get_f32 refuses an f64 beyond float range (%s)", ctx, tl_last_error());
    CHECK(gguf_get_bool(f, "t.bool", &b) == 1 && b == 1, "%s: gguf_get_bool reads true", ctx);
    CHECK(gguf_get_bool(f, "t.false", &b) == 1 && b == 0, "%s: gguf_get_bool reads false", ctx);
    CHECK(gguf_get_bool(f, "t.u8", &b) == -1 && strstr(tl_last_error(), "t.u8"), "%s: gguf_get_bool refuses a u8",
          ctx);
    CHECK(gguf_get_str(f, "general.architecture", &s) == 1 && str_eq(s, "llama", 5), "%s: gguf_get_str reads", ctx);
    CHECK(gguf_get_str(f, "t.u8", &s) == -1, "%s: gguf_get_str refuses a u8", ctx);
    CHECK(gguf_get_str(f, "nope", &s) == 0, "%s: gguf_get_str returns 0 for an absent key", ctx);
    CHECK(gguf_get_arr(f, "a.f32", GGUF_T_INT32, &a) == -1 && strstr(tl_last_error(), "a.f32") &&
              strstr(tl_last_error(), "f32"),
          "%s: gguf_get_arr refuses the wrong element type (%s)", ctx, tl_last_error());
    CHECK(gguf_get_arr(f, "t.u8", -1, &a) == -1, "%s: gguf_get_arr refuses a scalar", ctx);
    CHECK(gguf_find_kv(f, "t.missing") == NULL && gguf_find_tensor(f, "missing") == NULL,
          "%s: lookups of absent names return NULL", ctx);
}

static void check_tensors(const gguf_file *f, uint32_t alignment, const char *ctx) {
    CHECK(f->n_tensors == N_TENSORS, "%s: %d tensors (got %llu)", ctx, N_TENSORS, (unsigned long long)f->n_tensors);
    CHECK(f->alignment == alignment, "%s: alignment is %u (got %zu)", ctx, alignment, f->alignment);
    CHECK(f->data_offset % alignment == 0, "%s: data section offset %zu is aligned", ctx, f->data_offset);
    for (int i = 0; i < N_TENSORS; i++) {
        const gguf_tensor *t = gguf_find_tensor(f, tdefs[i].name);
        CHECK(t != NULL, "%s: tensor %s is found", ctx, tdefs[i].name);
        if (!t) continue;
        int ne_ok = 1;
        int64_t nel = 1;
        for (int d = 0; d < 4; d++) {
            int64_t want = d < tdefs[i].n_dims ? tdefs[i].ne[d] : 1;
            ne_ok &= t->ne[d] == want;
            nel *= want;
        }
        CHECK(t == &f->tensors[i], "%s: %s keeps its file order", ctx, t->name);
        CHECK(t->type == tdefs[i].type && t->n_dims == (uint32_t)tdefs[i].n_dims && ne_ok && t->n_elements == nel,
              "%s: %s has its type, dims and element count", ctx, t->name);
        CHECK(t->size == tdefs[i].nbytes, "%s: %s is %zu bytes (got %zu)", ctx, t->name, tdefs[i].nbytes, t->size);
        CHECK(t->offset % alignment == 0 && t->data == f->base + f->data_offset + t->offset &&
                  (size_t)((const uint8_t *)t->data - f->base) % alignment == 0,
              "%s: %s data sits at an aligned offset in the buffer", ctx, t->name);
        uint8_t want[512];
        fill(want, tdefs[i].nbytes, (uint32_t)i + 1);
        CHECK(tdefs[i].nbytes == 0 || !memcmp(t->data, want, tdefs[i].nbytes), "%s: %s data bytes match", ctx,
              t->name);
    }
}

static void test_roundtrip(void) {
    static const struct { uint32_t version, alignment; } cases[] = {{3, 0}, {2, 0}, {3, 64}, {2, 1}, {3, 4096}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char ctx[64];
        uint32_t align = cases[c].alignment ? cases[c].alignment : 32;
        size_t len;
        uint8_t *buf = finish(make_full(cases[c].version, cases[c].alignment), &len);

        snprintf(ctx, sizeof ctx, "v%u align %u buffer", cases[c].version, align);
        gguf_file *f = expect_accept(buf, len, ctx);
        if (f) {
            CHECK(f->version == cases[c].version && !f->mapped && f->base == buf && f->size == len,
                  "%s: header fields are right", ctx);
            check_values(f, ctx);
            check_tensors(f, align, ctx);
            gguf_close(f);
        }

        char path[] = "/tmp/test_gguf_XXXXXX";
        int fd = mkstemp(path);
        CHECK(fd >= 0 && write(fd, buf, len) == (ssize_t)len, "a temporary file is written");
        close(fd);
        snprintf(ctx, sizeof ctx, "v%u align %u file", cases[c].version, align);
        f = gguf_open(path);
        CHECK(f != NULL, "%s: gguf_open accepts it (%s)", ctx, tl_last_error());
        if (f) {
            CHECK(f->mapped && f->size == len, "%s: the file is mapped", ctx);
            check_values(f, ctx);
            check_tensors(f, align, ctx);
            /* The mapping is page-aligned, so pointers are aligned too. */
            int aligned = 1;
            for (uint64_t i = 0; i < f->n_tensors; i++) aligned &= (uintptr_t)f->tensors[i].data % align == 0;
            CHECK(aligned, "%s: mapped tensor pointers are %u-aligned", ctx, align);
            gguf_close(f);
        }
        unlink(path);
        free(buf);
    }

    /* A file with metadata only ends without padding. */
    gguf_writer *gw = gw_new();
    gw_set_str(gw, "general.architecture", "none");
    size_t len;
    uint8_t *buf = finish(gw, &len);
    gguf_file *f = expect_accept(buf, len, "a file without tensors");
    CHECK(f && f->n_tensors == 0 && f->n_kv == 1 && f->data_offset <= len, "a file without tensors has 1 kv");
    gguf_close(f);
    free(buf);
}

/* ---- 2. the shared model ------------------------------------------------ */

static void test_stories(void) {
    const char *dir = test_shared_dir();
    if (!dir) {
        printf("skip: stories260K.gguf not found (set TINYLOOP_SHARED)\n");
        return;
    }
    char path[600];
    snprintf(path, sizeof path, "%s/models/stories260K.gguf", dir);
    gguf_file *f = gguf_open(path);
    CHECK(f != NULL, "stories260K.gguf opens (%s)", tl_last_error());
    if (!f) return;
    gguf_str s;
    uint32_t u;
    const gguf_value *a;
    CHECK(f->version == 2 || f->version == 3, "stories260K is GGUF v2 or v3 (got %u)", f->version);
    CHECK(gguf_get_str(f, "general.architecture", &s) == 1 && str_eq(s, "llama", 5),
          "stories260K general.architecture is llama");
    CHECK(gguf_get_u32(f, "llama.embedding_length", &u) == 1 && u == 64, "stories260K embedding_length is 64");
    CHECK(gguf_get_u32(f, "llama.block_count", &u) == 1 && u == 5, "stories260K has 5 blocks");
    CHECK(gguf_get_u32(f, "llama.attention.head_count_kv", &u) == 1 && u == 4, "stories260K has 4 kv heads");
    const gguf_tensor *t = gguf_find_tensor(f, "token_embd.weight");
    CHECK(t && t->type == TL_TYPE_F32 && t->n_dims == 2 && t->ne[0] == 64 && t->ne[1] == 512 &&
              t->size == 64 * 512 * 4,
          "stories260K token_embd.weight is f32 64 x 512");
    t = gguf_find_tensor(f, "blk.0.ffn_gate.weight");
    CHECK(t && t->ne[0] == 64 && t->ne[1] == 172, "stories260K blk.0.ffn_gate.weight is 64 x 172");
    CHECK(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_T_STRING, &a) == 1 && a->v.arr.n == 512,
          "stories260K has 512 token strings");
    CHECK(gguf_get_arr(f, "tokenizer.ggml.scores", GGUF_T_FLOAT32, &a) == 1 && a->v.arr.n == 512,
          "stories260K has 512 token scores");
    size_t total = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) total += f->tensors[i].size;
    CHECK(total > 900000 && total <= f->size, "stories260K tensors hold %zu bytes of a %zu-byte file", total, f->size);
    gguf_close(f);
}

/* ---- 3. truncation ------------------------------------------------------ */

static uint8_t *make_small(size_t *len) {
    gguf_writer *gw = gw_new();
    gw_set_str(gw, "general.architecture", "llama");
    gw_set_u32(gw, "s.u32", 7);
    gw_set_str(gw, "s.str", "hello");
    gw_set_arr_str(gw, "s.arr", arr_str, 3);
    gw_set_u32(gw, "dup.k1", 1);
    gw_set_u32(gw, "dup.k2", 2);
    gw_arr *outer = gw_arr_new(GGUF_T_ARRAY), *in = gw_arr_new(GGUF_T_STRING);
    gw_arr_push_str(in, "q");
    gw_arr_push_arr(outer, in);
    gw_set_arr(gw, "s.nested", outer);
    uint8_t data[68];
    fill(data, sizeof data, 7);
    gw_add_tensor(gw, "tensor.a1", TL_TYPE_F32, 2, (int64_t[]){8, 2}, data, 64);
    gw_add_tensor(gw, "tensor.a2", TL_TYPE_Q8_0, 2, (int64_t[]){32, 2}, data, 68);
    gw_add_tensor(gw, "tensor.last", TL_TYPE_F32, 1, (int64_t[]){4}, data, 16);
    return finish(gw, len);
}

static void test_truncation(void) {
    size_t len;
    uint8_t *buf = make_small(&len);
    gguf_file *f = expect_accept(buf, len, "the small file");
    gguf_close(f);
    size_t bad = 0, first_bad = 0;
    for (size_t k = 0; k < len; k++) {
        uint8_t *copy = malloc(k ? k : 1); /* exact size: ASan flags any over-read */
        memcpy(copy, buf, k);
        tl_set_error(0, "%s", "");
        f = gguf_open_buffer(copy, k);
        if (f || !tl_last_error()[0]) {
            if (!bad++) first_bad = k;
        }
        gguf_close(f);
        free(copy);
    }
    CHECK(bad == 0, "the small file truncated at each of its %zu offsets is rejected with a message "
          "(%zu accepted, first at %zu)", len, bad, first_bad);
    free(buf);
}

/* ---- 4. corruption ------------------------------------------------------ */

static void reject_patched32(size_t at, uint32_t v, const char *phrase, const char *what) {
    size_t len;
    uint8_t *buf = make_small(&len);
    poke32(buf, at, v);
    expect_reject(buf, len, phrase, what);
    free(buf);
}

static void reject_patched64(size_t at, uint64_t v, const char *phrase, const char *what) {
    size_t len;
    uint8_t *buf = make_small(&len);
    poke64(buf, at, v);
    expect_reject(buf, len, phrase, what);
    free(buf);
}

static void reject_tensor(int type, int n_dims, const int64_t *ne, size_t nbytes, const char *phrase,
                          const char *what) {
    gguf_writer *gw = gw_new();
    gw_set_str(gw, "general.architecture", "llama");
    uint8_t data[64] = {0};
    gw_add_tensor(gw, "blk.0.bad", type, n_dims, ne, data, nbytes);
    size_t len;
    uint8_t *buf = finish(gw, &len);
    expect_reject(buf, len, phrase, what);
    free(buf);
}

static void reject_writer(gguf_writer *gw, const char *phrase, const char *what) {
    size_t len;
    uint8_t *buf = finish(gw, &len);
    expect_reject(buf, len, phrase, what);
    free(buf);
}

static void test_corruption(void) {
    size_t len;
    uint8_t *buf = make_small(&len);
    size_t a1 = after(buf, len, "tensor.a1"), a2 = after(buf, len, "tensor.a2");
    size_t u32v = after(buf, len, "s.u32"), strv = after(buf, len, "s.str"), arrv = after(buf, len, "s.arr");
    size_t k2 = after(buf, len, "dup.k2");
    CHECK(a1 && a2 && u32v && strv && arrv && k2, "the small file's fields are located");

    reject_patched32(0, 0x46554758, "bad magic", "a file with bad magic");
    reject_patched32(4, 1, "version 1", "a GGUF v1 file");
    reject_patched32(4, 4, "unsupported GGUF version 4", "a GGUF v4 file");
    reject_patched32(4, 0x03000000, "big-endian", "a big-endian file");
    reject_patched64(8, 1ull << 60, "n_tensors 1152921504606846976", "a huge n_tensors");
    reject_patched64(16, 1ull << 60, "n_kv 1152921504606846976", "a huge n_kv");
    reject_patched64(16, UINT64_MAX, "n_kv", "n_kv of 2^64-1");
    reject_patched64(24, 1ull << 62, "key length 4611686018427387904", "a huge key length");
    reject_patched64(strv + 4, 1ull << 62, "key 's.str': string value length", "a huge string length");
    reject_patched64(strv + 4, UINT64_MAX, "string value length", "a string length of 2^64-1");
    reject_patched32(u32v, 77, "key 's.u32': unknown value type 77", "an unknown value type");
    reject_patched32(u32v, 0x80000000u, "unknown value type 2147483648", "a value type above INT_MAX");
    reject_patched32(arrv + 4, 50, "key 's.arr': unknown array element type 50", "an unknown array element type");
    reject_patched64(arrv + 8, 1ull << 61, "key 's.arr': array of 2305843009213693952 string", "a huge array count");
    reject_patched64(after(buf, len, "s.nested") + 20, 1ull << 60, "array of 1152921504606846976 string",
                     "a huge nested array count");
    reject_patched32(a1 + 4 + 16, 99, "tensor 'tensor.a1': unknown type id 99", "an unknown tensor type");
    reject_patched32(a1 + 4 + 16, 4, "unknown type id 4", "a removed tensor type (Q4_2)");
    reject_patched32(a1 + 4 + 16, UINT32_MAX, "unknown type id 4294967295", "tensor type 2^32-1");
    reject_patched64(a2 + 4 + 16 + 4, 33, "tensor 'tensor.a2': data offset 33 is not a multiple of the alignment 32",
                     "a misaligned tensor offset");
    reject_patched64(a2 + 4 + 16 + 4, 1ull << 40, "tensor 'tensor.a2' data [offset ", "a tensor offset past the file");
    reject_patched64(a2 + 4 + 16 + 4, UINT64_MAX - 31, "past end of file", "a tensor offset near 2^64");
    reject_patched64(a1 + 4 + 8, 1ull << 40, "past end of file", "a tensor dim that makes it too big");

    /* Keys: duplicate, NUL inside, empty. */
    memcpy(buf + k2 - 1, "1", 1);
    expect_reject(buf, len, "duplicate key 'dup.k1'", "a duplicate key");
    memcpy(buf + k2 - 1, "2", 1);
    memcpy(buf + k2 - 3, "\0", 1);
    expect_reject(buf, len, "contains a NUL byte", "a key with a NUL byte");
    memcpy(buf + k2 - 3, "k", 1);
    memcpy(buf + a2 - 1, "1", 1);
    expect_reject(buf, len, "duplicate tensor name 'tensor.a1'", "a duplicate tensor name");
    memcpy(buf + a2 - 1, "2", 1);
    gguf_close(expect_accept(buf, len, "the restored small file"));
    free(buf);

    gguf_writer *gw = gw_new();
    gw_set_u32(gw, "", 1);
    reject_writer(gw, "empty key", "an empty key");
    gw = gw_new();
    gw_add_tensor(gw, "", TL_TYPE_F32, 1, (int64_t[]){1}, "abcd", 4);
    reject_writer(gw, "empty tensor name", "an empty tensor name");
    gw = gw_new();
    gw_set_raw(gw, "s.flag", GGUF_T_BOOL, "\x02", 1);
    reject_writer(gw, "key 's.flag': bool value 2", "a bool of 2");
    gw = gw_new();
    gw_set_arr_prim(gw, "s.flags", GGUF_T_BOOL, "\x01\x00\x07", 3);
    reject_writer(gw, "bool element 2 has value 7", "a bool array element of 7");

    /* Nine levels of arrays, one more than allowed. */
    gw_arr *deep = gw_arr_new(GGUF_T_UINT8);
    for (int d = 1; d < 9; d++) {
        gw_arr *up = gw_arr_new(GGUF_T_ARRAY);
        gw_arr_push_arr(up, deep);
        deep = up;
    }
    gw = gw_new();
    gw_set_arr(gw, "s.deep", deep);
    reject_writer(gw, "key 's.deep': array nesting deeper than 8", "arrays nested 9 deep");
    /* A bomb: 100000 levels must not recurse 100000 times. */
    {
        size_t n = 100000, blen = 24 + 8 + 6 + 4 + n * 12;
        uint8_t *b = calloc(1, blen), *p = b;
        memcpy(p, "GGUF", 4), poke32(p, 4, 3), poke64(p, 8, 0), poke64(p, 16, 1), p += 24;
        poke64(p, 0, 6), memcpy(p + 8, "s.bomb", 6), poke32(p, 14, GGUF_T_ARRAY), p += 18;
        for (size_t i = 0; i < n; i++, p += 12) poke32(p, 0, GGUF_T_ARRAY), poke64(p, 4, 1);
        expect_reject(b, blen, "nesting deeper than 8", "arrays nested 100000 deep");
        free(b);
    }

    /* general.alignment must be a u32 power of two. */
    gw = gw_new();
    gw_set_u32(gw, "general.alignment", 0);
    reject_writer(gw, "'general.alignment' = 0 is not a nonzero power of two", "alignment 0");
    gw = gw_new();
    gw_set_u32(gw, "general.alignment", 48);
    reject_writer(gw, "'general.alignment' = 48 is not a nonzero power of two", "alignment 48");
    gw = gw_new();
    gw_set_u64(gw, "general.alignment", 32);
    reject_writer(gw, "'general.alignment' has type u64, expected u32", "a u64 alignment");

    /* Tensor shapes. */
    int64_t ne[8] = {4, 1, 1, 1, 1, 1, 1, 1};
    reject_tensor(TL_TYPE_F32, 0, ne, 16, "tensor 'blk.0.bad': n_dims 0 out of range 1..4", "n_dims 0");
    reject_tensor(TL_TYPE_F32, 5, ne, 16, "tensor 'blk.0.bad': n_dims 5 out of range 1..4", "n_dims 5");
    reject_tensor(TL_TYPE_F32, 2, (int64_t[]){4, -1}, 16, "tensor 'blk.0.bad': ne[1] = -1 is negative",
                  "a negative dim");
    reject_tensor(TL_TYPE_F32, 2, (int64_t[]){INT64_MIN, 1}, 16, "is negative", "a dim of -2^63");
    reject_tensor(TL_TYPE_F32, 3, (int64_t[]){1ll << 32, 1ll << 32, 1ll << 32}, 16,
                  "tensor 'blk.0.bad': element count 4294967296 x 4294967296 x 4294967296 x 1 overflows",
                  "a dim product that overflows");
    reject_tensor(TL_TYPE_F32, 2, (int64_t[]){1ll << 62, 1}, 16, "byte size of 4611686018427387904 x 1 f32",
                  "a byte size that overflows");
    reject_tensor(TL_TYPE_F32, 2, (int64_t[]){1ll << 61, 3}, 16, "byte size of 2305843009213693952 x 3 f32",
                  "a row count that overflows the byte size");
    reject_tensor(TL_TYPE_Q8_0, 1, (int64_t[]){33}, 34,
                  "tensor 'blk.0.bad': ne[0] = 33 is not a multiple of the q8_0 block size 32",
                  "a row not a multiple of the block size");
    reject_tensor(TL_TYPE_F32, 2, (int64_t[]){8, 8}, 64, "past end of file", "a tensor with too few bytes");

    /* The message the issue asks for, with exact values. */
    gw = gw_new();
    gw_add_tensor(gw, "blk.3.attn_q.weight", TL_TYPE_F32, 2, (int64_t[]){64, 384}, ne, 32);
    buf = finish(gw, &len);
    char want[200];
    snprintf(want, sizeof want,
             "tensor 'blk.3.attn_q.weight' data [offset %zu, size 98304] lies past end of file (size %zu)", len - 32,
             len);
    expect_reject(buf, len, want, "a tensor whose data runs past the end");
    free(buf);

    /* Zero-sized dims are allowed; the tensor is empty. */
    gw = gw_new();
    gw_add_tensor(gw, "zero", TL_TYPE_F32, 2, (int64_t[]){0, 3}, NULL, 0);
    buf = finish(gw, &len);
    gguf_file *f = expect_accept(buf, len, "a tensor with a zero dim");
    CHECK(f && f->tensors[0].size == 0 && f->tensors[0].n_elements == 0, "a tensor with a zero dim has no bytes");
    gguf_close(f);
    free(buf);

    /* Garbage and empty inputs. */
    expect_reject((const uint8_t *)"", 0, "bad magic", "an empty buffer");
    tl_set_error(0, "%s", "");
    CHECK(gguf_open_buffer(NULL, 0) == NULL && tl_last_error()[0], "a NULL empty buffer is rejected");
}

static void test_open_errors(void) {
    gguf_file *f = gguf_open("/nonexistent/dir/model.gguf");
    CHECK(f == NULL && strstr(tl_last_error(), "/nonexistent/dir/model.gguf") &&
              strstr(tl_last_error(), "No such file"),
          "a missing file is reported with its path and strerror (%s)", tl_last_error());
    f = gguf_open("/tmp");
    CHECK(f == NULL && strstr(tl_last_error(), "not a regular file"), "a directory is refused (%s)", tl_last_error());
    char path[] = "/tmp/test_gguf_XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    f = gguf_open(path);
    CHECK(f == NULL && strstr(tl_last_error(), path) && strstr(tl_last_error(), "bad magic"),
          "an empty file is refused, naming the path (%s)", tl_last_error());
    unlink(path);
    gguf_close(NULL);
}

int main(void) {
    test_roundtrip();
    test_stories();
    test_truncation();
    test_corruption();
    test_open_errors();
    return test_summary();
}
