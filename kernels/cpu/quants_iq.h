/* quants_iq.h - private to kernels/cpu: the i-quants on grids (iq2_xxs,
 * iq2_xs, iq2_s, iq3_xxs, iq3_s, iq1_s, iq1_m) as integers, for the GEMM
 * (gemm_iq_avx2.c) and the reference dots that must agree with it. */
#ifndef TL_QUANTS_IQ_H
#define TL_QUANTS_IQ_H

#include "quants_impl.h"

/* A super-block as integers: v[g] holds the signed values of elements
 * 8g..8g+7 as int8 bytes (element 8g + j in byte j), ls[h] the scale of
 * elements 16h..16h+15 (a type with a scale per 32 repeats it), *d the
 * super-scale. The type's dot with q8_K activations is exactly
 *   post * sum_i (d_i * d_y,i) * (float)(sum_h ls_h * sum_{e in h} v_e * y_e)
 * with the integer sum exact in int32 and the float ops in that order. */
typedef void (*tl_iq_unpack_fn)(const uint8_t *block, uint64_t v[32], int16_t ls[16], float *d);

typedef struct {
    tl_iq_unpack_fn unpack;
    float post; /* a power of two, applied to the whole dot last */
    int vmax;   /* the largest |v| the type can produce */
} tl_iq_info;

/* The type's integer view; NULL for other types. */
const tl_iq_info *tl_iq_info_of(int type);

/* The same unpack through each family's AVX2 tile decode
 * (quants_iq{1,2,3}_avx2.c), a fifth of the scalar one's time; NULL for
 * types of another family or a build without x86. */
tl_iq_unpack_fn tl_iq1_unpack_avx2(int type);
tl_iq_unpack_fn tl_iq2_unpack_avx2(int type);
tl_iq_unpack_fn tl_iq3_unpack_avx2(int type);

#endif
