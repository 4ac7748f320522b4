/* pack.c - the row-interleaved weight layouts the GEMM kernels read in
 * place (TL_PACK8 for AVX2, TL_PACK16 for AVX-512), the conversion into
 * them at load and back.
 *
 * A packed q8_0 / q4_0 matrix keeps its size and its row groups where
 * they were: rows Gg..Gg+G-1 (G = 8 or 16) still fill bytes [Gg, Gg+G) *
 * row_size, but block by block, G rows at a time:
 *
 *   q8_0, per block (G * 34 bytes):
 *     the G rows' scales (f16), then for k = 0..7 the bytes 4k..4k+3 of
 *     rows 0..G-1 (4G bytes: lane r of a ymm (G 8) or zmm (G 16) is row r)
 *   q4_0, per block (G * 18 bytes):
 *     the G scales, then for j = 0..3 the packed bytes 4j..4j+3 of rows
 *     0..G-1 (low nibbles: elements 4j.., high: 16 + 4j..)
 *
 * so a matmul's kernel loads what a lane needs with one vector load
 * instead of transposing G rows per block (prefill and decode). */
#include "quants_impl.h"

#include <string.h>

int tl_pack_supported(int type) { return type == TL_TYPE_Q8_0 || type == TL_TYPE_Q4_0; }

/* Bytes of one row's quants in a block, and where they start. */
static size_t qbytes(int type) { return type == TL_TYPE_Q8_0 ? 32 : 16; }

void tl_pack_group(int type, int G, uint8_t *group, int64_t n, uint8_t *tmp) {
    const size_t bs = tl_type_info(type)->type_size, rs = tl_row_size(type, n), qb = qbytes(type);
    memcpy(tmp, group, (size_t)G * rs);
    uint8_t *o = group;
    for (int64_t b = 0; b < n / 32; b++) {
        for (int r = 0; r < G; r++, o += 2) memcpy(o, tmp + r * rs + b * bs, 2);
        for (size_t k = 0; k < qb; k += 4)
            for (int r = 0; r < G; r++, o += 4) memcpy(o, tmp + r * rs + b * bs + 2 + k, 4);
    }
}

/* One block at a time: the row's scale and its 4-byte pieces gathered into
 * a plain block, dequantized as such (bitwise the plain row's values). */
void tl_packed_row_dequantize(int type, int G, const uint8_t *w, int64_t row, int64_t n, float *y) {
    const size_t bs = tl_type_info(type)->type_size, qb = qbytes(type);
    const int ri = (int)(row % G);
    const uint8_t *p = w + (size_t)(row - ri) * tl_row_size(type, n); /* the group's first block */
    uint8_t blk[34];
    for (int64_t b = 0; b < n / 32; b++, p += (size_t)G * bs) {
        memcpy(blk, p + 2 * ri, 2);
        for (size_t k = 0; k < qb; k += 4) memcpy(blk + 2 + k, p + 2 * G + k * G + 4 * ri, 4);
        tl_dequantize_row(type, blk, y + b * 32, 32);
    }
}

void tl_unpack_group(int type, int G, const uint8_t *group, int64_t n, uint8_t *rows) {
    const size_t bs = tl_type_info(type)->type_size, rs = tl_row_size(type, n), qb = qbytes(type);
    const uint8_t *p = group;
    for (int64_t b = 0; b < n / 32; b++) {
        for (int r = 0; r < G; r++, p += 2) memcpy(rows + r * rs + b * bs, p, 2);
        for (size_t k = 0; k < qb; k += 4)
            for (int r = 0; r < G; r++, p += 4) memcpy(rows + r * rs + b * bs + 2 + k, p, 4);
    }
}
