/* iq1_grids.h - iq1_s and iq1_m (ggml types 19 and 29): their shared grid,
 * the block fields' decode both kernel files use, and the entry points
 * quants_ref.c and quants_avx2.c call.
 *
 * A value is dl * (g + delta), g a grid entry's element in {-1, 0, 1},
 * delta = +-1/8 and dl = d * (2 * ls + 1) with a 3-bit ls:
 *
 *   iq1_s | d:f16 | qs[32] | qh[8]: uint16 per 32 elements |
 *     entry l (0..3) of sub-block ib (elements 32ib + 8l ..): grid index
 *     qs[4ib + l] | bits 3l..3l+2 of qh[ib] << 8; qh[ib] bits 12..14 are
 *     ls, bit 15 set makes delta -1/8 for the whole sub-block.
 *   iq1_m | qs[32] | qh[16] | scales[8] = 4 uint16 words |
 *     entry k (0..31, elements 8k ..): index qs[k] | bits 0..2 of nibble
 *     k % 2 of qh[k / 2] << 8, bit 3 of that nibble set makes its delta
 *     -1/8; ls of elements 16j .. (j = k / 2) is bits 3(j%4)..3(j%4)+2 of
 *     word j / 4; d is the f16 made of the words' top nibbles (word 0's is
 *     its low nibble).
 *
 * Every index is 11 bits by construction (8 + 3), so any bytes address
 * inside the grid. */
#ifndef TL_IQ1_GRIDS_H
#define TL_IQ1_GRIDS_H

#include "quants_impl.h"

#define TL_IQ1S_GRID_SIZE 2048

/* Entry i, byte j: element j's level 0, 1, 2 for g = -1, 0, +1 (the
 * format's grid; the levels are what vpmaddubsw multiplies unsigned). */
extern const uint64_t tl_iq1s_grid[TL_IQ1S_GRID_SIZE];

static inline int tl_iq1s_g(unsigned idx, int j) { return (int)((tl_iq1s_grid[idx & 2047] >> (8 * j)) & 0xFF) - 1; }

static inline unsigned tl_iq1_s_index(const block_iq1_s *b, int ib, int l) {
    return b->qs[4 * ib + l] | ((unsigned)(b->qh[ib] >> (3 * l)) & 7) << 8;
}
static inline int tl_iq1_s_ls(const block_iq1_s *b, int ib) { return 2 * ((b->qh[ib] >> 12) & 7) + 1; }
static inline int tl_iq1_s_delta(const block_iq1_s *b, int ib) { return b->qh[ib] & 0x8000 ? -1 : 1; }

static inline unsigned tl_iq1_m_index(const block_iq1_m *b, int k) {
    return b->qs[k] | ((unsigned)(b->qh[k / 2] >> (4 * (k % 2))) & 7) << 8;
}
static inline int tl_iq1_m_delta(const block_iq1_m *b, int k) { return (b->qh[k / 2] >> (4 * (k % 2))) & 8 ? -1 : 1; }
static inline uint64_t tl_iq1_m_words(const block_iq1_m *b) {
    uint64_t w;
    memcpy(&w, b->scales, 8);
    return w;
}
static inline int tl_iq1_m_ls(const block_iq1_m *b, int j) {
    return 2 * (int)((tl_iq1_m_words(b) >> (16 * (j / 4) + 3 * (j % 4))) & 7) + 1;
}
static inline uint16_t tl_iq1_m_d(const block_iq1_m *b) {
    const uint64_t w = tl_iq1_m_words(b);
    return (uint16_t)(((w >> 12) & 0xF) | ((w >> 24) & 0xF0) | ((w >> 36) & 0xF00) | ((w >> 48) & 0xF000));
}

/* quants_iq1_ref.c: dequantize nb blocks, quantize nb blocks (the
 * reference quantizer, no importance matrix), and the scalar vec_dots. */
void tl_dequant_iq1_s(const void *src, float *dst, int64_t nb);
void tl_dequant_iq1_m(const void *src, float *dst, int64_t nb);
void tl_quant_iq1_s(const float *src, void *dst, int64_t nb);
void tl_quant_iq1_m(const float *src, void *dst, int64_t nb);
void tl_iq1_fill_ref(tl_kernel_table *t);
/* quants_iq1_avx2.c: the 4-row tiles, bitwise the scalar vec_dots. */
void tl_iq1_fill_avx2(tl_kernel_table *t);

#endif
