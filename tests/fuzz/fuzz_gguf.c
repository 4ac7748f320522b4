/* fuzz_gguf.c - libFuzzer target for the GGUF reader.
 *
 * Each input is parsed with gguf_open_buffer; when it is accepted, every
 * string byte, every array element and the first and last byte of every
 * tensor are read, so ASan catches any pointer the reader let escape the
 * buffer. libFuzzer hands us an exact-size heap copy, so over-reads during
 * parsing are caught as well.
 *
 * Seeds: run with TL_FUZZ_WRITE_SEEDS=DIR (and optionally TL_FUZZ_MODEL=a
 * .gguf to derive a seed from) and the binary writes its seed files to DIR
 * and exits; tests/fuzz/run.sh does that before fuzzing.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "gguf_writer.h"
#include "quants.h"

static volatile uint8_t sink;

static size_t prim_size(int type) {
    switch (type) {
    case GGUF_T_UINT8: case GGUF_T_INT8: case GGUF_T_BOOL: return 1;
    case GGUF_T_UINT16: case GGUF_T_INT16: return 2;
    case GGUF_T_UINT32: case GGUF_T_INT32: case GGUF_T_FLOAT32: return 4;
    case GGUF_T_UINT64: case GGUF_T_INT64: case GGUF_T_FLOAT64: return 8;
    default: return 0;
    }
}

static uint8_t touch_value(const gguf_value *v) {
    uint8_t acc = 0;
    if (v->type == GGUF_T_STRING) {
        for (uint64_t i = 0; i < v->v.str.len; i++) acc ^= (uint8_t)v->v.str.ptr[i];
    } else if (v->type == GGUF_T_ARRAY) {
        if (v->v.arr.items) {
            for (uint64_t i = 0; i < v->v.arr.n; i++) acc ^= touch_value(&v->v.arr.items[i]);
        } else {
            const uint8_t *p = v->v.arr.data;
            size_t bytes = (size_t)v->v.arr.n * prim_size(v->v.arr.type);
            for (size_t i = 0; i < bytes; i++) acc ^= p[i];
        }
    } else {
        acc ^= (uint8_t)v->v.u64;
    }
    return acc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    gguf_file *f = gguf_open_buffer(data, size);
    if (!f) return 0;
    uint8_t acc = 0;
    for (uint64_t i = 0; i < f->n_kv; i++) {
        acc ^= (uint8_t)strlen(f->kv[i].key);
        acc ^= touch_value(&f->kv[i].value);
        if (gguf_find_kv(f, f->kv[i].key) != &f->kv[i]) abort(); /* lookups must agree with the table */
    }
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        acc ^= (uint8_t)strlen(t->name);
        if (gguf_find_tensor(f, t->name) != t) abort();
        if (t->size) {
            const uint8_t *p = t->data;
            acc ^= p[0] ^ p[t->size - 1];
        }
    }
    /* Exercise the getters on keys real loaders ask for. */
    uint32_t u;
    float x;
    gguf_str s;
    const gguf_value *a;
    gguf_get_u32(f, "general.alignment", &u);
    gguf_get_f32(f, "llama.attention.layer_norm_rms_epsilon", &x);
    gguf_get_str(f, "general.architecture", &s);
    if (gguf_get_arr(f, "tokenizer.ggml.scores", GGUF_T_FLOAT32, &a) == 1 && a->v.arr.n) x = gguf_arr_f32(a, 0);
    sink = acc;
    gguf_close(f);
    return 0;
}

/* ---- seed generation ---------------------------------------------------- */

static void write_seed(gguf_writer *gw, const char *dir, const char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (gw_write_file(gw, path)) fprintf(stderr, "fuzz_gguf: cannot write %s\n", path);
    gw_free(gw);
}

static void add_tensors(gguf_writer *gw) {
    static uint8_t data[4 * 144];
    for (size_t i = 0; i < sizeof data; i++) data[i] = (uint8_t)(i * 31 + 7);
    gw_add_tensor(gw, "token_embd.weight", TL_TYPE_F32, 2, (int64_t[]){4, 3}, data, 48);
    gw_add_tensor(gw, "blk.0.attn_q.weight", TL_TYPE_F16, 2, (int64_t[]){8, 2}, data, 32);
    gw_add_tensor(gw, "blk.0.ffn_up.weight", TL_TYPE_Q8_0, 2, (int64_t[]){32, 2}, data, 68);
    gw_add_tensor(gw, "blk.0.ffn_down.weight", TL_TYPE_Q4_K, 3, (int64_t[]){256, 2, 2}, data, 4 * 144);
}

/* Re-serializes one parsed array into a writer array (for the model seed). */
static gw_arr *copy_arr(const gguf_value *v) {
    gw_arr *a = gw_arr_new(v->v.arr.type);
    for (uint64_t i = 0; i < v->v.arr.n; i++) {
        if (v->v.arr.type == GGUF_T_ARRAY) {
            gw_arr_push_arr(a, copy_arr(&v->v.arr.items[i]));
        } else if (v->v.arr.type == GGUF_T_STRING) {
            char buf[256];
            gguf_str s = v->v.arr.items[i].v.str;
            snprintf(buf, sizeof buf, "%.*s", (int)(s.len < 255 ? s.len : 255), s.ptr);
            gw_arr_push_str(a, buf);
        } else {
            size_t es = prim_size(v->v.arr.type);
            gw_arr_push_prim(a, (const uint8_t *)v->v.arr.data + i * es);
        }
    }
    return a;
}

/* The real model's metadata with only its small tensors: the interesting
 * part of a real file without a megabyte of weights to mutate. */
static void seed_from_model(const char *model, const char *dir) {
    gguf_file *f = gguf_open(model);
    if (!f) return;
    gguf_writer *gw = gw_new();
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const gguf_kv *kv = &f->kv[i];
        const gguf_value *v = &kv->value;
        if (v->type == GGUF_T_ARRAY) gw_set_arr(gw, kv->key, copy_arr(v));
        else if (v->type == GGUF_T_STRING) gw_set_strn(gw, kv->key, v->v.str.ptr, (size_t)v->v.str.len);
        else if (v->type == GGUF_T_FLOAT32) gw_set_f32(gw, kv->key, (float)v->v.f64);
        else gw_set_raw(gw, kv->key, (uint32_t)v->type, &v->v.u64, prim_size(v->type)); /* ints, bool, f64 */
    }
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        if (t->size <= 1024) gw_add_tensor(gw, t->name, t->type, (int)t->n_dims, t->ne, t->data, t->size);
    }
    write_seed(gw, dir, "seed_model_meta.gguf");
    gguf_close(f);
}

static void write_seeds(const char *dir) {
    gguf_writer *gw = gw_new();
    gw_set_str(gw, "general.architecture", "llama");
    gw_set_u32(gw, "llama.embedding_length", 4);
    add_tensors(gw);
    write_seed(gw, dir, "seed_small_v3.gguf");

    gw = gw_new();
    gw_set_version(gw, 2);
    gw_set_alignment(gw, 64);
    gw_set_u8(gw, "a.u8", 1);
    gw_set_i8(gw, "a.i8", -1);
    gw_set_u16(gw, "a.u16", 2);
    gw_set_i16(gw, "a.i16", -2);
    gw_set_i32(gw, "a.i32", -3);
    gw_set_u64(gw, "a.u64", 4);
    gw_set_i64(gw, "a.i64", -4);
    gw_set_f32(gw, "a.f32", 0.5f);
    gw_set_f64(gw, "a.f64", 0.25);
    gw_set_bool(gw, "a.bool", 1);
    gw_set_strn(gw, "a.bytes", "x\0y\xff", 4);
    static const char *const toks[] = {"<unk>", "<s>", "</s>", "a"};
    static const float scores[] = {0, 0, 0, -1};
    static const int32_t types[] = {2, 3, 3, 1};
    gw_set_arr_str(gw, "tokenizer.ggml.tokens", toks, 4);
    gw_set_arr_f32(gw, "tokenizer.ggml.scores", scores, 4);
    gw_set_arr_i32(gw, "tokenizer.ggml.token_type", types, 4);
    gw_arr *outer = gw_arr_new(GGUF_T_ARRAY), *in = gw_arr_new(GGUF_T_STRING);
    gw_arr_push_str(in, "nested");
    gw_arr_push_arr(outer, in);
    in = gw_arr_new(GGUF_T_UINT16);
    uint16_t h = 7;
    gw_arr_push_prim(in, &h);
    gw_arr_push_arr(outer, in);
    gw_set_arr(gw, "a.nested", outer);
    add_tensors(gw);
    write_seed(gw, dir, "seed_all_types_v2.gguf");

    gw = gw_new();
    gw_set_str(gw, "general.name", "metadata only");
    write_seed(gw, dir, "seed_no_tensors.gguf");

    const char *model = getenv("TL_FUZZ_MODEL");
    if (model) seed_from_model(model, dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    const char *dir = getenv("TL_FUZZ_WRITE_SEEDS");
    if (dir) {
        write_seeds(dir);
        exit(0);
    }
    return 0;
}
