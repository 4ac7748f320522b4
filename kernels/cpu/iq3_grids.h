/* iq3_grids.h - the grids of the 3-bit i-quants (iq3_grids.c), and the
 * entry points of their kernels (quants_iq3_ref.c, quants_iq3_avx2.c),
 * private to kernels/cpu. Each grid entry is 4 unsigned levels, element
 * 0 in the low byte (the bytes as ggml's tables lay them out, so a 32-bit
 * load gives 4 consecutive elements):
 *   iq3_xxs: 256 entries over the levels 4, 12, 20, ..., 52, 62
 *   iq3_s:   512 entries over the odd levels 1, 3, ..., 15 */
#ifndef TL_IQ3_GRIDS_H
#define TL_IQ3_GRIDS_H

#include <stdint.h>

extern const uint32_t tl_iq3xxs_grid[256];
extern const uint32_t tl_iq3s_grid[512];

/* The scalar reference (layouts, quantizer and dot order: quants_iq3_ref.c):
 * nb blocks to floats, nb blocks from floats, and the dots with q8_K rows. */
void tl_dequant_iq3_xxs(const void *src, float *dst, int64_t nb);
void tl_dequant_iq3_s(const void *src, float *dst, int64_t nb);
void tl_quant_iq3_xxs(const float *src, void *dst, int64_t nb);
void tl_quant_iq3_s(const float *src, void *dst, int64_t nb);
void tl_dot_iq3_xxs(int64_t n, float *out, const void *w, const void *x);
void tl_dot_iq3_s(int64_t n, float *out, const void *w, const void *x);

/* The AVX2 tiles and vec_dots of both (quants_iq3_avx2.c), set into an
 * AVX2 kernel table (the tl_kernel_table of quants_impl.h). */
struct tl_kernel_table;
void tl_iq3_fill_avx2(struct tl_kernel_table *t);

#endif
