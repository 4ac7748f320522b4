/* kv_layout.h - the bytes of one KV block in every KV mode. Plain C with no
 * dependencies: the engine (kv_blocks.c, forward.c) and the CUDA plugin
 * (kernels/cuda) both compute a block's layout from this one definition.
 *
 * A block holds one virtual layer's cache for block_size positions.
 *
 *   K/V modes:  [ K region ][ V region ]
 *       region: rows (head h, position r) at (h * block_size + r) * row_bytes,
 *               a row = head_dim values of the region's type
 *   store-h:    [ h region ]   rows (position r) at r * row_bytes,
 *               a row = n_embd values (the layer's normed attention input);
 *               K and V are recomputed from it when attention reads a block
 *
 * Row types: f16, f32, or quantized in groups of G = gcd(row_len, 32)
 * values along the row:
 *   q8: f16 scale d, G int8 q, value = d * q              (G = 32: ggml's q8_0)
 *   q4: f16 scale d, f16 minimum m, G/2 bytes, byte j = element j (low
 *       nibble) | element j + G/2 (high), value = d * nibble + m
 *                                                          (G = 32: ggml's q4_1)
 * q4 keeps a minimum because it measured better than a symmetric scale
 * (q4_0-style): keys are not centred within a group (Gemma 3 270M
 * perplexity +17% -> +7%, stories260K +92% -> +37%, for 2 bytes a group).
 * Regions start on 16-byte boundaries. */
#ifndef TL_KV_LAYOUT_H
#define TL_KV_LAYOUT_H

#include <stddef.h>

/* = enum tl_kv_type in tinyloop.h */
enum { TL_KVT_F16 = 0, TL_KVT_F32 = 1, TL_KVT_Q8 = 2, TL_KVT_Q4 = 3, TL_KVT_COUNT = 4 };

typedef struct tl_kv_layout {
    int type_k, type_v;    /* row types of K and V; store-h: type_k is h's, type_v unused */
    int store_h;           /* 1: blocks hold h rows, not K and V */
    int block_size;
    int rows;              /* rows per position in a region: n_head_kv, or 1 for store-h */
    int row_len;           /* values per row: head_dim, or n_embd for store-h */
    int group;             /* quantization group: gcd(row_len, 32) */
    size_t row_bytes_k, row_bytes_v;
    size_t k_bytes, v_bytes; /* region sizes; v_bytes is 0 for store-h */
    size_t block_bytes;
} tl_kv_layout;

static inline int tl_kv_group(int row_len) {
    int g = 32, n = row_len;
    while (n % g) g /= 2; /* gcd with a power of two */
    return g;
}

static inline size_t tl_kv_row_bytes(int type, int row_len, int group) {
    size_t n = (size_t)row_len, groups = n / (size_t)group;
    switch (type) {
    case TL_KVT_F32: return 4 * n;
    case TL_KVT_Q8: return groups * 2 + n;
    case TL_KVT_Q4: return groups * 4 + n / 2;
    default: return 2 * n;
    }
}

static inline size_t tl_kv_round16(size_t n) { return (n + 15) & ~(size_t)15; }

/* Fills *l. Returns 0, or -1 when the shape cannot hold the types (q4
 * needs an even group, which needs an even row length). */
static inline int tl_kv_layout_init(tl_kv_layout *l, int type_k, int type_v, int store_h, int block_size,
                                    int n_head_kv, int head_dim, int n_embd) {
    l->type_k = type_k;
    l->type_v = store_h ? type_k : type_v;
    l->store_h = store_h;
    l->block_size = block_size;
    l->rows = store_h ? 1 : n_head_kv;
    l->row_len = store_h ? n_embd : head_dim;
    l->group = tl_kv_group(l->row_len);
    if ((type_k == TL_KVT_Q4 || (!store_h && type_v == TL_KVT_Q4)) && l->group < 2) return -1;
    l->row_bytes_k = tl_kv_row_bytes(type_k, l->row_len, l->group);
    l->row_bytes_v = store_h ? 0 : tl_kv_row_bytes(type_v, l->row_len, l->group);
    l->k_bytes = tl_kv_round16((size_t)l->rows * (size_t)block_size * l->row_bytes_k);
    l->v_bytes = tl_kv_round16((size_t)l->rows * (size_t)block_size * l->row_bytes_v);
    l->block_bytes = l->k_bytes + l->v_bytes;
    return 0;
}

/* Byte offset of row (head h, position r) within its region. */
static inline size_t tl_kv_row_off(const tl_kv_layout *l, int h, int r, size_t row_bytes) {
    return ((size_t)h * (size_t)l->block_size + (size_t)r) * row_bytes;
}

#endif
