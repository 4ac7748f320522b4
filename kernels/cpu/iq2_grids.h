/* iq2_grids.h - the iq2 family (iq2_xxs, iq2_xs, iq2_s): the format's grids
 * (iq2_grids.c) and the entry points of its kernels, which quants_ref.c's
 * switches and the dispatch tables call.
 *
 * Layouts (super-blocks of 256; groups of 8 elements take one grid entry,
 * whose byte j is element j's magnitude, 0x08, 0x19 or 0x2b; a sub-block's
 * 4-bit scale s gives db = d * (0.5 + s) * 0.25, element = db * magnitude *
 * sign):
 *   iq2_xxs | d:f16 | 8 sub-blocks of 32 as 2 uint32: word 0 = the 4 groups'
 *            8-bit grid indices, word 1 = their 7-bit sign indices (bits
 *            7l..7l+6, tl_iq_signs8) and s in bits 28..31 |
 *   iq2_xs  | d | qs[32] uint16 per group: 9-bit grid index, 7-bit sign
 *            index above it | scales[8]: s per 16 elements, low nibble first |
 *   iq2_s   | d | qs[32]: the low 8 bits of group g's 10-bit index |
 *            qs[32 + g]: group g's 8 sign bits | qh[8]: bits 2l..2l+1 of
 *            byte b the high bits of group 4b + l | scales[8] as iq2_xs |
 *
 * Dot products (ggml's order): per super-block an exact int32 sum over its
 * sub-blocks of (2s + 1) * dot(signed magnitudes, q8), then
 * acc += (d_w * d_y) * (float)sum, and the row's dot is 0.125f * acc
 * (db = d * (2s + 1) / 8). */
#ifndef TL_IQ2_GRIDS_H
#define TL_IQ2_GRIDS_H

#include <stdint.h>

#include "quants_iq.h"

extern const uint64_t tl_iq2xxs_grid[256], tl_iq2xs_grid[512], tl_iq2s_grid[1024];

/* quants_iq2_ref.c: nb blocks to floats (bitwise ggml's dequantize_row_*),
 * the reference quantizers (no importance matrix) and dot products. */
void tl_dequant_iq2_xxs(const void *src, float *y, int64_t nb);
void tl_dequant_iq2_xs(const void *src, float *y, int64_t nb);
void tl_dequant_iq2_s(const void *src, float *y, int64_t nb);
void tl_quant_iq2_xxs(const float *x, void *dst, int64_t nb);
void tl_quant_iq2_xs(const float *x, void *dst, int64_t nb);
void tl_quant_iq2_s(const float *x, void *dst, int64_t nb);
void tl_dot_iq2_xxs(int64_t n, float *out, const void *w, const void *x);
void tl_dot_iq2_xs(int64_t n, float *out, const void *w, const void *x);
void tl_dot_iq2_s(int64_t n, float *out, const void *w, const void *x);

/* quants_iq2_avx2.c: the AVX2 tiles (called by tl_kernels_fill_avx2) */
void tl_iq2_fill_avx2(tl_kernel_table *t);

#endif
