/* gguf_writer.h - a small in-memory GGUF v2/v3 writer for tests and the
 * test-model generator.
 *
 * The writer is deliberately dumb: it writes what it is given (any version,
 * dims, type ids, byte counts), so tests can also build malformed files.
 * Layout of the output:
 *
 *   "GGUF" | version | n_tensors | n_kv | kvs (call order) | tensor infos
 *   | pad to alignment | tensor data, each padded to alignment except the last
 *
 * Setting a key that already exists replaces its value in place. Allocation
 * failures abort (test code). Not thread-safe; one writer per thread.
 */
#ifndef TL_GGUF_WRITER_H
#define TL_GGUF_WRITER_H

#include <stddef.h>
#include <stdint.h>

typedef struct gguf_writer gguf_writer;

/* An array value under construction, for nested arrays. Element type is
 * fixed at creation (GGUF_T_* from engine/gguf.h). */
typedef struct gw_arr gw_arr;

gguf_writer *gw_new(void); /* version 3, alignment 32 */
void gw_free(gguf_writer *gw);

/* Version written in the header (2 and 3 are valid; anything is written). */
void gw_set_version(gguf_writer *gw, uint32_t version);
/* Lays out data with `n` (a nonzero power of two, else returns -1 and changes
 * nothing) and sets the general.alignment key (u32) to it. */
int gw_set_alignment(gguf_writer *gw, uint32_t n);

void gw_set_u8(gguf_writer *gw, const char *key, uint8_t v);
void gw_set_i8(gguf_writer *gw, const char *key, int8_t v);
void gw_set_u16(gguf_writer *gw, const char *key, uint16_t v);
void gw_set_i16(gguf_writer *gw, const char *key, int16_t v);
void gw_set_u32(gguf_writer *gw, const char *key, uint32_t v);
void gw_set_i32(gguf_writer *gw, const char *key, int32_t v);
void gw_set_u64(gguf_writer *gw, const char *key, uint64_t v);
void gw_set_i64(gguf_writer *gw, const char *key, int64_t v);
void gw_set_f32(gguf_writer *gw, const char *key, float v);
void gw_set_f64(gguf_writer *gw, const char *key, double v);
void gw_set_bool(gguf_writer *gw, const char *key, int v);
void gw_set_str(gguf_writer *gw, const char *key, const char *v);
/* A string with explicit length (may contain NUL or any bytes). */
void gw_set_strn(gguf_writer *gw, const char *key, const char *v, size_t len);

/* Flat arrays. */
void gw_set_arr_str(gguf_writer *gw, const char *key, const char *const *v, size_t n);
void gw_set_arr_f32(gguf_writer *gw, const char *key, const float *v, size_t n);
void gw_set_arr_i32(gguf_writer *gw, const char *key, const int32_t *v, size_t n);
void gw_set_arr_u32(gguf_writer *gw, const char *key, const uint32_t *v, size_t n);
/* Any primitive element type: `data` holds n elements of that type's size. */
void gw_set_arr_prim(gguf_writer *gw, const char *key, int elem_type, const void *data, size_t n);

/* Nested arrays: build with gw_arr_new and the pushes, then hand the array
 * to gw_set_arr (or to gw_arr_push_arr of a parent), which takes ownership. */
gw_arr *gw_arr_new(int elem_type);
void gw_arr_push_prim(gw_arr *a, const void *elem); /* one element of a's primitive type */
void gw_arr_push_str(gw_arr *a, const char *s);
void gw_arr_push_arr(gw_arr *a, gw_arr *child);     /* a's type is GGUF_T_ARRAY; takes child */
void gw_arr_free(gw_arr *a);
void gw_set_arr(gguf_writer *gw, const char *key, gw_arr *a); /* takes a */

/* A value written verbatim: `type` (any number) then `payload` bytes, for
 * tests that need values no typed setter produces. */
void gw_set_raw(gguf_writer *gw, const char *key, uint32_t type, const void *payload, size_t len);

/* Adds a tensor; `data` (nbytes) is copied. n_dims and ne are written as
 * given (n_dims up to 8), with no checks against type or size. Returns the
 * tensor's index, or -1 if the name is already used or n_dims > 8. */
int gw_add_tensor(gguf_writer *gw, const char *name, int type, int n_dims, const int64_t *ne,
                  const void *data, size_t nbytes);

/* Serializes. gw_write_mem: *buf is malloc'ed (caller frees), *len its size.
 * Both return 0 on success, -1 on failure (gw_write_file: errno is set). */
int gw_write_mem(gguf_writer *gw, uint8_t **buf, size_t *len);
int gw_write_file(gguf_writer *gw, const char *path);

#endif
