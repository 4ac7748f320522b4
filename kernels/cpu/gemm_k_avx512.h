/* gemm_k_avx512.h - what gemm_k_avx512.c (the K-quant tiles) and
 * rows_k_avx512.h (their decode rows) share: the target, the kinds, the
 * decode threshold. Include only under x86, after <immintrin.h>. */
#ifndef TL_GEMM_K_AVX512_H
#define TL_GEMM_K_AVX512_H

#include <stddef.h>
#include <stdint.h>

#include "quants_impl.h"

/* bmi2 (pdep, row_iq4xs): every VNNI CPU has it; dispatch.c checks it beside VNNI */
#define TN __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c,bmi2")))
#define AI __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 8")
#define UNROLL16 _Pragma("GCC unroll 16")

enum { K_4, K_5, K_6, K_3, K_2, K_X }; /* q4_K, q5_K (the q4_K layout in the workspace), q6_K, q3_K (q6_K's), q2_K, iq4_xs */
/* up to this many tokens a matmul goes row by row (decode) */
#define TL_FUSED_TOKENS 2

static inline size_t kbw_of(int kind) {
    return kind == K_4 ? sizeof(block_q4_K) : kind == K_5 ? sizeof(block_q5_K) : kind == K_6 ? sizeof(block_q6_K)
         : kind == K_3 ? sizeof(block_q3_K) : kind == K_2 ? sizeof(block_q2_K) : sizeof(block_iq4_xs);
}

#endif
