/* types.c - the table of ggml weight types: block sizes and byte sizes as
 * GGUF files store them. Kernels for each type live in quants*.c. */
#include "quants.h"

#define QK_K 256

/* block_size, type_size, vec_dot_type, supported */
static const tl_type_traits traits[TL_TYPE_COUNT] = {
    [TL_TYPE_F32]  = {"f32", 1, 4, TL_TYPE_F32, 1},
    [TL_TYPE_F16]  = {"f16", 1, 2, TL_TYPE_F32, 1},
    [TL_TYPE_BF16] = {"bf16", 1, 2, TL_TYPE_F32, 1},
    [TL_TYPE_Q4_0] = {"q4_0", 32, 2 + 16, TL_TYPE_Q8_0, 1},
    [TL_TYPE_Q4_1] = {"q4_1", 32, 2 + 2 + 16, TL_TYPE_Q8_0, 1},
    [TL_TYPE_Q5_0] = {"q5_0", 32, 2 + 4 + 16, TL_TYPE_Q8_0, 1},
    [TL_TYPE_Q5_1] = {"q5_1", 32, 2 + 2 + 4 + 16, TL_TYPE_Q8_0, 1},
    [TL_TYPE_Q8_0] = {"q8_0", 32, 2 + 32, TL_TYPE_Q8_0, 1},
    /* IQ4_NL: q4_0's bytes, the nibbles indexing tl_iq4nl_values */
    [TL_TYPE_IQ4_NL] = {"iq4_nl", 32, 2 + 16, TL_TYPE_Q8_0, 1},
    [TL_TYPE_Q8_1] = {"q8_1", 32, 4 + 32, TL_TYPE_Q8_1, 0},
    [TL_TYPE_Q2_K] = {"q2_K", QK_K, QK_K / 16 + QK_K / 4 + 2 + 2, TL_TYPE_Q8_K, 1},
    [TL_TYPE_Q3_K] = {"q3_K", QK_K, QK_K / 8 + QK_K / 4 + 12 + 2, TL_TYPE_Q8_K, 1},
    [TL_TYPE_Q4_K] = {"q4_K", QK_K, 2 + 2 + 12 + QK_K / 2, TL_TYPE_Q8_K, 1},
    [TL_TYPE_Q5_K] = {"q5_K", QK_K, 2 + 2 + 12 + QK_K / 8 + QK_K / 2, TL_TYPE_Q8_K, 1},
    /* IQ4_XS: 8 sub-blocks of 32 with 6-bit scales, iq4_nl's levels */
    [TL_TYPE_IQ4_XS] = {"iq4_xs", QK_K, 2 + 2 + QK_K / 64 + QK_K / 2, TL_TYPE_Q8_K, 1},
    /* The i-quants on E8-lattice-style grids; supported once their kernels exist. */
    [TL_TYPE_IQ2_XXS] = {"iq2_xxs", QK_K, 2 + QK_K / 4, TL_TYPE_Q8_K, 1},
    [TL_TYPE_IQ2_XS] = {"iq2_xs", QK_K, 2 + QK_K / 4 + QK_K / 32, TL_TYPE_Q8_K, 1},
    [TL_TYPE_IQ2_S] = {"iq2_s", QK_K, 2 + QK_K / 4 + QK_K / 16, TL_TYPE_Q8_K, 1},
    [TL_TYPE_IQ3_XXS] = {"iq3_xxs", QK_K, 2 + QK_K / 4 + QK_K / 8, TL_TYPE_Q8_K, 1},
    [TL_TYPE_IQ3_S] = {"iq3_s", QK_K, 2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4, TL_TYPE_Q8_K, 1},
    [TL_TYPE_IQ1_S] = {"iq1_s", QK_K, 2 + QK_K / 8 + QK_K / 16, TL_TYPE_Q8_K, 1},
    [TL_TYPE_IQ1_M] = {"iq1_m", QK_K, QK_K / 8 + QK_K / 16 + QK_K / 32, TL_TYPE_Q8_K, 1},
    [TL_TYPE_Q6_K] = {"q6_K", QK_K, QK_K / 2 + QK_K / 4 + QK_K / 16 + 2, TL_TYPE_Q8_K, 1},
    /* Q8_K: f32 d, int8 qs[256], int16 bsums[16]; activations only. */
    [TL_TYPE_Q8_K] = {"q8_K", QK_K, 4 + QK_K + 2 * (QK_K / 16), TL_TYPE_Q8_K, 0},
    /* Named so a file using them is refused by name: ternary (TriLM /
     * BitNet-style) and gpt-oss's MXFP4 (e8m0 scale, 16 bytes of FP4 pairs). */
    [TL_TYPE_TQ1_0] = {"tq1_0", QK_K, 2 + 4 * 13, TL_TYPE_Q8_K, 0},
    [TL_TYPE_TQ2_0] = {"tq2_0", QK_K, 2 + QK_K / 4, TL_TYPE_Q8_K, 0},
    [TL_TYPE_MXFP4] = {"mxfp4", 32, 1 + 16, TL_TYPE_Q8_0, 0},
};

const tl_type_traits *tl_type_info(int type) {
    static const tl_type_traits unknown = {0};
    if (type < 0 || type >= TL_TYPE_COUNT || traits[type].name == NULL) return &unknown;
    return &traits[type];
}

size_t tl_row_size(int type, int64_t n) {
    const tl_type_traits *t = tl_type_info(type);
    if (!t->name || n < 0 || n % t->block_size) return 0;
    return (size_t)(n / t->block_size) * t->type_size;
}
