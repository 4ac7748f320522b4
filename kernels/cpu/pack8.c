/* pack8.c - the row-interleaved weight layout the AVX2 GEMM reads in place
 * (TL_PACK8), the conversion into it at load and back, and the generic
 * tile that computes on packed rows at any level.
 *
 * A packed q8_0 / q4_0 matrix keeps its size and its row groups where
 * they were: rows 8g..8g+7 still fill bytes [8g, 8g+8) * row_size, but
 * block by block, 8 rows at a time:
 *
 *   q8_0, per block (272 bytes = 8 blocks):
 *     the 8 rows' scales (f16), then for k = 0..7 the bytes 4k..4k+3 of
 *     rows 0..7 (32 bytes: lane r of a ymm is row r)
 *   q4_0, per block (144 bytes):
 *     the 8 scales, then for j = 0..3 the packed bytes 4j..4j+3 of rows
 *     0..7 (low nibbles: elements 4j.., high: 16 + 4j..)
 *
 * so a matmul's kernel loads what a lane needs with one aligned-enough
 * 32-byte load instead of transposing 8 rows per block (prefill) or
 * reducing 8 rows' partial sums (decode). */
#include "quants_impl.h"

#include <string.h>

int tl_pack8_supported(int type) { return type == TL_TYPE_Q8_0 || type == TL_TYPE_Q4_0; }

/* Bytes of one row's quants in a block, and where they start. */
static size_t qbytes(int type) { return type == TL_TYPE_Q8_0 ? 32 : 16; }

void tl_pack8_group(int type, uint8_t *group, int64_t n, uint8_t *tmp) {
    const size_t bs = tl_type_info(type)->type_size, rs = tl_row_size(type, n), qb = qbytes(type);
    memcpy(tmp, group, 8 * rs);
    uint8_t *o = group;
    for (int64_t b = 0; b < n / 32; b++) {
        for (int r = 0; r < 8; r++, o += 2) memcpy(o, tmp + r * rs + b * bs, 2);
        for (size_t k = 0; k < qb; k += 4)
            for (int r = 0; r < 8; r++, o += 4) memcpy(o, tmp + r * rs + b * bs + 2 + k, 4);
    }
}

void tl_unpack8_group(int type, const uint8_t *group, int64_t n, uint8_t *rows) {
    const size_t bs = tl_type_info(type)->type_size, rs = tl_row_size(type, n), qb = qbytes(type);
    const uint8_t *p = group;
    for (int64_t b = 0; b < n / 32; b++) {
        for (int r = 0; r < 8; r++, p += 2) memcpy(rows + r * rs + b * bs, p, 2);
        for (size_t k = 0; k < qb; k += 4)
            for (int r = 0; r < 8; r++, p += 4) memcpy(rows + r * rs + b * bs + 2 + k, p, 4);
    }
}
