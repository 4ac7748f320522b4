/* bf16dot_avx512.c - the lossy BF16 mode's matmul tile (repack "bf16",
 * README "Models and weight types"): BF16 weight rows x activation rows
 * rounded to BF16, by AVX512_BF16's vdpbf16ps (32 products per
 * instruction, twice the f32 FMA's 16).
 *
 * Per (row, token) entry the order is fixed: 16 f32 lanes, lane j takes
 * the pairs (2j, 2j+1) of every 32-element step in turn (one vdpbf16ps a
 * step; a tail step's missing elements are zeros), then the lanes add in
 * _mm512_reduce_add_ps's tree. Tiles of any shape run that same sequence
 * per entry, so a token's outputs do not depend on the batch, the chunk or
 * its place in the tile (tile == single, bitwise: test_gemm). Each product
 * of two BF16 values is exact in f32; against the f64 sum of the same
 * products an entry is within 1e-5 of sum |w x| (test_gemm). */
#include "quants_impl.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define TB __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
#define AI __attribute__((always_inline))
#define UNROLL8 _Pragma("GCC unroll 8")
#define UNUSED __attribute__((unused)) /* the drivers' 1x1 wrappers */

/* Bytes ahead the first token group of a row group prefetches its rows
 * (decode streams them from DRAM; quants_avx512.c's PF_QUANT). */
#define PF_BF16 8192

/* One step of 32 elements from i (masked: the tail's missing ones are zeros). */
static inline AI TB void step_bf16(int R, int C, __mmask32 m, __m512 acc[4][6], int64_t i, const uint8_t *w, size_t ldw,
                                   const uint8_t *x, size_t ldx) {
    __m512bh xv[6];
    UNROLL8 for (int c = 0; c < C; c++) xv[c] = (__m512bh)_mm512_maskz_loadu_epi16(m, (const uint16_t *)(x + c * ldx) + i);
    UNROLL8 for (int r = 0; r < R; r++) {
        const __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(m, (const uint16_t *)(w + r * ldw) + i);
        UNROLL8 for (int c = 0; c < C; c++) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], wv, xv[c]);
    }
}

static inline AI TB void mk_bf16(int R, int C, int pf, int64_t n, float *out, size_t ldo, const uint8_t *w, size_t ldw,
                                 const uint8_t *x, size_t ldx) {
    __m512 acc[4][6];
    UNROLL8 for (int r = 0; r < R; r++) UNROLL8 for (int c = 0; c < C; c++) acc[r][c] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        /* the group's R rows are contiguous: prefetch them as one linear stream */
        if (pf) UNROLL8 for (int r = 0; r < R; r++) _mm_prefetch((const char *)(w + PF_BF16 + (R * i + 32 * r) * 2), _MM_HINT_T0);
        step_bf16(R, C, (__mmask32)0xFFFFFFFFu, acc, i, w, ldw, x, ldx);
    }
    if (i < n) step_bf16(R, C, (__mmask32)((1u << (n - i)) - 1), acc, i, w, ldw, x, ldx);
    UNROLL8 for (int r = 0; r < R; r++) UNROLL8 for (int c = 0; c < C; c++) out[c * ldo + r] = _mm512_reduce_add_ps(acc[r][c]);
}

/* Prefill (6 or more tokens): 4 rows x 6 tokens, whose 4 weight rows stay
 * in L1 while the activations stream from L2 (one 768 x 2048 matrix x 48
 * tokens: 91 GMAC/s, 2048 x 768: 75; 8 x 3 gave 91 and 68, 6 x 4 60 and
 * 53); decode: 4 rows a token. */
#define MK_BF16DOT(R, C, ...) mk_bf16(R, C, __VA_ARGS__)
TILE_DRIVER_RC(bf16dot_p, TB UNUSED, MK_BF16DOT, 4, 6)
TILE_DRIVER(bf16dot_d, TB UNUSED, MK_BF16DOT, 2)
#undef MK_BF16DOT

static TB void bf16dot_tile(int64_t n, int nr, int nt, float *out, size_t ldo, const void *w, size_t ldw,
                            const void *x, size_t ldx, void *work) {
    (void)work;
    if (nt >=  6) bf16dot_p(n, nr, nt, out, ldo, w, ldw, x, ldx);
    else bf16dot_d(n, nr, nt, out, ldo, w, ldw, x, ldx);
}

void tl_bf16dot_fill_avx512(tl_kernel_table *t) { t->bf16dot_tile = bf16dot_tile; }

#else
void tl_bf16dot_fill_avx512(tl_kernel_table *t) { (void)t; }
#endif
