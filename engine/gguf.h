/* gguf.h - a hostile-input-safe reader for GGUF v2/v3 files.
 *
 * The file is mmap'ed read-only; tensor data pointers point into the
 * mapping and are never copied. Every count, length, offset and size is
 * checked against the bytes left and against overflow; a bad file yields
 * NULL with a specific message in tl_last_error().
 *
 *   header: magic "GGUF" | version u32 | n_tensors u64 | n_kv u64
 *   kv[n_kv]:      key (u64 len + bytes) | type u32 | value
 *   tensor[n]:     name | n_dims u32 | ne[n_dims] u64 | type u32 | offset u64
 *   padding to general.alignment (default 32), then the data section;
 *   each tensor's offset is relative to the data section start.
 */
#ifndef TL_GGUF_H
#define TL_GGUF_H

#include <stddef.h>
#include <stdint.h>

enum gguf_vtype {
    GGUF_T_UINT8 = 0, GGUF_T_INT8 = 1, GGUF_T_UINT16 = 2, GGUF_T_INT16 = 3,
    GGUF_T_UINT32 = 4, GGUF_T_INT32 = 5, GGUF_T_FLOAT32 = 6, GGUF_T_BOOL = 7,
    GGUF_T_STRING = 8, GGUF_T_ARRAY = 9, GGUF_T_UINT64 = 10, GGUF_T_INT64 = 11,
    GGUF_T_FLOAT64 = 12,
    GGUF_T_COUNT
};

typedef struct gguf_str {
    const char *ptr; /* points into the mapping; NOT NUL-terminated */
    uint64_t len;
} gguf_str;

typedef struct gguf_value gguf_value;
struct gguf_value {
    int type; /* enum gguf_vtype */
    union {
        uint64_t u64; /* all unsigned ints and bool, widened */
        int64_t i64;  /* all signed ints, widened */
        double f64;   /* float32 and float64, widened */
        gguf_str str;
        struct {
            int type;         /* element type */
            uint64_t n;       /* element count */
            const void *data; /* primitive elements: raw little-endian bytes in the mapping */
            gguf_value *items; /* string or nested-array elements (n of them), else NULL */
        } arr;
    } v;
};

typedef struct gguf_kv {
    char *key; /* NUL-terminated copy */
    gguf_value value;
} gguf_kv;

#define GGUF_MAX_DIMS 4

typedef struct gguf_tensor {
    char *name;             /* NUL-terminated copy */
    uint32_t n_dims;
    int64_t ne[GGUF_MAX_DIMS]; /* ne[0] is the contiguous (row) dimension; unused dims are 1 */
    int type;               /* ggml type id (kernels/cpu/quants.h TL_TYPE_*) */
    uint64_t offset;        /* relative to the data section */
    size_t size;            /* bytes */
    int64_t n_elements;
    const void *data;       /* into the mapping */
} gguf_tensor;

typedef struct gguf_file {
    uint32_t version;
    uint64_t n_kv, n_tensors;
    gguf_kv *kv;
    gguf_tensor *tensors;
    size_t alignment;
    size_t data_offset;     /* file offset of the data section */
    const uint8_t *base;    /* start of the mapping / buffer */
    size_t size;            /* file size */
    int mapped;             /* 1: base is an mmap we own */
} gguf_file;

/* Opens and validates a file. Returns NULL on error (message in tl_last_error()). */
gguf_file *gguf_open(const char *path);
/* Parses a buffer in place (not copied; must outlive the result). Same checks. */
gguf_file *gguf_open_buffer(const void *data, size_t size);
void gguf_close(gguf_file *f);

/* Lookups return NULL / -1 when absent. */
const gguf_kv *gguf_find_kv(const gguf_file *f, const char *key);
const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name);

/* Typed getters: return 1 when found and convertible, 0 when absent,
 * -1 (with tl_last_error set, naming key, type and value) when present
 * but of an unusable type or out of range. Any integer type converts to
 * any integer type when the value fits. */
int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out);
int gguf_get_i64(const gguf_file *f, const char *key, int64_t *out);
int gguf_get_f32(const gguf_file *f, const char *key, float *out);
int gguf_get_bool(const gguf_file *f, const char *key, int *out);
int gguf_get_str(const gguf_file *f, const char *key, gguf_str *out);
/* Array: element type and count, plus the gguf_value for element access. */
int gguf_get_arr(const gguf_file *f, const char *key, int elem_type, const gguf_value **out);

/* Element accessors for primitive arrays (no bounds check beyond assert). */
float gguf_arr_f32(const gguf_value *arr, uint64_t i);
int32_t gguf_arr_i32(const gguf_value *arr, uint64_t i);

const char *gguf_vtype_name(int type);

#endif
