/* pack.c - the row-interleaved weight layouts the GEMM kernels read in
 * place (TL_PACK8 for AVX2, TL_PACK16 for AVX-512), the conversion into
 * them at load and back.
 *
 * A packed q8_0 / q4_0 / q5_0 / q4_1 / iq4_nl matrix keeps its size and its
 * row groups where they were: rows Gg..Gg+G-1 (G = 8 or 16) still fill
 * bytes [Gg, Gg+G) * row_size, but block by block, G rows at a time:
 *
 *   q8_0, per block (G * 34 bytes):
 *     the G rows' scales (f16), then for k = 0..7 the bytes 4k..4k+3 of
 *     rows 0..G-1 (4G bytes: lane r of a ymm (G 8) or zmm (G 16) is row r)
 *   q4_0, per block (G * 18 bytes):
 *     the G scales, then for j = 0..3 the packed bytes 4j..4j+3 of rows
 *     0..G-1 (low nibbles: elements 4j.., high: 16 + 4j..)
 *   q5_0, per block (G * 22 bytes):
 *     the G scales, then the 5th bits as 8 masks of 4G bits (G/2 bytes),
 *     mask k's bit 4r + e the bit of element 4k + e (k < 4) or 16 + 4(k -
 *     4) + e of row r: the byte lanes of the register the kernel builds
 *     from the nibbles, so one masked add sets them; then the nibbles as
 *     q4_0's
 *   q4_1, per block (G * 20 bytes):
 *     the G scales, the G mins (f16), then the nibbles as q4_0's
 *   iq4_nl: as q4_0 (the same bytes; the nibbles index its levels)
 *
 * so a matmul's kernel loads what a lane needs with one vector load
 * instead of transposing G rows per block (prefill and decode). */
#include "quants_impl.h"

#include <string.h>

int tl_pack_supported(int type) {
    return type == TL_TYPE_Q8_0 || type == TL_TYPE_Q4_0 || type == TL_TYPE_Q5_0 || type == TL_TYPE_Q4_1 ||
           type == TL_TYPE_IQ4_NL;
}

/* Bytes of one row's quants in a block, where they start, and the bytes of
 * a packed block before the quants (the scales, q4_1's mins, q5_0's bit
 * masks): per row, what precedes the quants in its own block. */
static size_t qbytes(int type) { return type == TL_TYPE_Q8_0 ? 32 : 16; }
static size_t qoff(int type) { return type == TL_TYPE_Q5_0 ? 6 : type == TL_TYPE_Q4_1 ? 4 : 2; }
static size_t head_bytes(int type, int G) { return (size_t)G * qoff(type); }

/* The element whose 5th bit lands in byte e of mask register k. */
static int hbit_elem(int k, int e) { return k < 4 ? 4 * k + e : 16 + 4 * (k - 4) + e; }

/* Row r's plain block from the packed block pb of its group. */
static void unpack_block(int type, int G, const uint8_t *pb, int r, uint8_t *blk) {
    const size_t qb = qbytes(type), qo = qoff(type), hb = head_bytes(type, G);
    memcpy(blk, pb + 2 * r, 2);
    if (type == TL_TYPE_Q4_1) memcpy(blk + 2, pb + 2 * G + 2 * r, 2);
    if (type == TL_TYPE_Q5_0) {
        uint32_t qh = 0;
        for (int k = 0; k < 8; k++)
            for (int e = 0; e < 4; e++) {
                const int bit = 4 * r + e;
                qh |= (uint32_t)(pb[2 * G + k * G / 2 + bit / 8] >> (bit % 8) & 1) << hbit_elem(k, e);
            }
        memcpy(blk + 2, &qh, 4);
    }
    for (size_t k = 0; k < qb; k += 4) memcpy(blk + qo + k, pb + hb + k * G + 4 * r, 4);
}

void tl_pack_group(int type, int G, uint8_t *group, int64_t n, uint8_t *tmp) {
    const size_t bs = tl_type_info(type)->type_size, rs = tl_row_size(type, n), qb = qbytes(type), qo = qoff(type);
    memcpy(tmp, group, (size_t)G * rs);
    uint8_t *o = group;
    for (int64_t b = 0; b < n / 32; b++) {
        for (int r = 0; r < G; r++, o += 2) memcpy(o, tmp + r * rs + b * bs, 2);
        if (type == TL_TYPE_Q4_1)
            for (int r = 0; r < G; r++, o += 2) memcpy(o, tmp + r * rs + b * bs + 2, 2);
        if (type == TL_TYPE_Q5_0) {
            memset(o, 0, (size_t)4 * G);
            for (int r = 0; r < G; r++) {
                uint32_t qh;
                memcpy(&qh, tmp + r * rs + b * bs + 2, 4);
                for (int k = 0; k < 8; k++)
                    for (int e = 0; e < 4; e++)
                        o[k * G / 2 + (4 * r + e) / 8] |= (uint8_t)((qh >> hbit_elem(k, e) & 1) << ((4 * r + e) % 8));
            }
            o += 4 * G;
        }
        for (size_t k = 0; k < qb; k += 4)
            for (int r = 0; r < G; r++, o += 4) memcpy(o, tmp + r * rs + b * bs + qo + k, 4);
    }
}

void tl_unpack_group(int type, int G, const uint8_t *group, int64_t n, uint8_t *rows) {
    const size_t bs = tl_type_info(type)->type_size, rs = tl_row_size(type, n);
    for (int64_t b = 0; b < n / 32; b++)
        for (int r = 0; r < G; r++) unpack_block(type, G, group + (size_t)b * G * bs, r, rows + r * rs + b * bs);
}

/* One block at a time: the row's plain block rebuilt, dequantized as such
 * (bitwise the plain row's values). */
void tl_packed_row_dequantize(int type, int G, const uint8_t *w, int64_t row, int64_t n, float *y) {
    const size_t bs = tl_type_info(type)->type_size;
    const int ri = (int)(row % G);
    const uint8_t *p = w + (size_t)(row - ri) * tl_row_size(type, n); /* the group's first block */
    uint8_t blk[34];
    for (int64_t b = 0; b < n / 32; b++, p += (size_t)G * bs) {
        unpack_block(type, G, p, ri, blk);
        tl_dequantize_row(type, blk, y + b * 32, 32);
    }
}
