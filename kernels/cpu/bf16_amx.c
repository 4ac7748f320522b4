/* bf16_amx.c - the lossy BF16 mode's matmul tile (repack "bf16") on
 * AMX-BF16 tiles: the amx level's tl_bf16dot_tile where the CPU has
 * AMX-BF16, for rows whose length is a multiple of 32.
 *
 * Tile A is 16 weight rows x 32 elements read in place (row stride ldw);
 * tile B is up to 16 tokens' same 32 elements as pairs, B[k][2m + j] =
 * x_m[2k + j], which the activation rows are rearranged into once per call
 * (per 16 tokens and 32 elements one 16 x 16 transpose of dwords). One
 * TDPBF16PS adds 16 x 16 x 32 exact products into C (f32), which stays in
 * its tile for the whole row: no per-block epilogue, unlike the int8 kinds
 * (gemm_amx.c). C is then stored and transposed into out (C's rows are
 * weight rows, out's are tokens).
 *
 * Per (row, token) entry the order is fixed: the entry of C takes the
 * 32-element steps in turn, each as the tile multiply sums its 16 pairs,
 * whatever the tile's shape (rows, tokens) or the entry's place in it, so
 * a token's outputs do not depend on the batch, the chunk or its place in
 * the tile (tile == single, bitwise: test_bf16; prefill == one token at a
 * time, batch == alone: test_bf16's model checks). It is not the AVX-512
 * kernel's order (bf16dot_avx512.c: 16 lanes, then a tree): the two levels
 * give different bits within the lossy mode, each within 1e-5 of
 * sum |w x| of the exact sum. Rows of other lengths keep the AVX-512
 * kernel at this level, so one matrix never mixes the two. */
#include "quants_impl.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <string.h>

#include "amx_cfg.h"

#define TX __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16")))
#define AI __attribute__((always_inline))
#define UNROLL16 _Pragma("GCC unroll 16")

/* Tokens rearranged per call at most (a chunk of the matmul is ~192 KiB
 * of activations; larger calls go in parts of this many tokens). */
enum { PART = 64 };

/* Tiles 0, 1: C (R rows x N tokens, f32); 2, 5: A (R rows x 32 BF16);
 * 3, 4: B (16 pairs x N tokens). */
static inline AI TX void configure(int R, int N) {
    tl_tile_cfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    c.rows[0] = c.rows[1] = c.rows[2] = c.rows[5] = (uint8_t)R;
    c.colsb[0] = c.colsb[1] = c.colsb[3] = c.colsb[4] = (uint16_t)(4 * N);
    c.colsb[2] = c.colsb[5] = 64;
    c.rows[3] = c.rows[4] = 16;
    tl_tile_loadconfig(&c);
}

/* 16 x 16 dwords: row i of v to column i (v[i] lane j -> v[j] lane i). */
static inline AI TX void transpose16(__m512i v[16]) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(v[i], v[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(v[i], v[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        v[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        v[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        v[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        v[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    /* v[4q + s] lane group L (128 bits) now holds rows 4q..4q+3, dword
     * 4L + s'; gather the 128-bit lanes across the four quads */
    for (int s = 0; s < 4; s++) {
        const __m512i a = _mm512_shuffle_i32x4(v[s], v[4 + s], 0x88), b = _mm512_shuffle_i32x4(v[s], v[4 + s], 0xDD);
        const __m512i c = _mm512_shuffle_i32x4(v[8 + s], v[12 + s], 0x88),
                      d = _mm512_shuffle_i32x4(v[8 + s], v[12 + s], 0xDD);
        t[s] = _mm512_shuffle_i32x4(a, c, 0x88);
        t[8 + s] = _mm512_shuffle_i32x4(a, c, 0xDD);
        t[4 + s] = _mm512_shuffle_i32x4(b, d, 0x88);
        t[12 + s] = _mm512_shuffle_i32x4(b, d, 0xDD);
    }
    UNROLL16 for (int i = 0; i < 16; i++) v[i] = t[i];
}

/* Tokens [0, N) of x (N <= 16) as B tiles, one per 32 elements (1 KiB
 * each, row k = dword k of the N tokens). */
static inline AI TX void arrange(int64_t n, int N, const uint8_t *x, size_t ldx, uint8_t *b) {
    for (int64_t c = 0; c < n / 32; c++, b += 1024) {
        __m512i v[16];
        UNROLL16 for (int m = 0; m < 16; m++)
            v[m] = m < N ? _mm512_loadu_si512(x + m * ldx + 64 * c) : _mm512_setzero_si512();
        transpose16(v);
        UNROLL16 for (int k = 0; k < 16; k++) _mm512_store_si512(b + 64 * k, v[k]);
    }
}

/* C (R rows x N tokens, at cs with 64-byte rows) into out[m * ldo + r]. */
static inline AI TX void put(const float *cs, int R, int N, float *out, size_t ldo) {
    __m512i v[16];
    UNROLL16 for (int r = 0; r < 16; r++) v[r] = r < R ? _mm512_load_si512(cs + 16 * r) : _mm512_setzero_si512();
    transpose16(v);
    const __mmask16 m = (__mmask16)((1u << R) - 1);
    for (int t = 0; t < N; t++) _mm512_mask_storeu_ps(out + t * ldo, m, _mm512_castsi512_ps(v[t]));
}

/* R rows (at w) against one or two token tiles: B tiles at b0 (b1) + step
 * c * bs, row stride bst (arranged: 1024 and 64; one token read in place:
 * 64 and 4, its 16 dwords being the tile's 16 rows). N0 and N1 tokens (N1
 * 0: one tile); the tiles are configured for (R, N0) and N1 is N0 or 0.
 * pf: prefetch the next rows (the first tiles of a row group). */
static inline AI TX void rows_tiles(int64_t n, int R, int pf, const uint8_t *w, size_t ldw, const uint8_t *b0,
                                    const uint8_t *b1, size_t bs, size_t bst, int N0, int N1, float *out, size_t ldo) {
    _Alignas(64) float cs[2][256];
    _tile_zero(0);
    if (N1) _tile_zero(1);
    for (int64_t c = 0; c < n / 32; c++) {
        if (pf) /* the next 16 rows' same 64 bytes: 16 streams, more than the hardware follows */
            UNROLL16 for (int r = 0; r < 16; r++) _mm_prefetch((const char *)(w + (16 + r) * ldw + 64 * c), _MM_HINT_T1);
        _tile_loadd(2, w + 64 * c, ldw);
        _tile_loadd(3, b0 + bs * c, bst);
        _tile_dpbf16ps(0, 2, 3);
        if (N1) {
            _tile_loadd(4, b1 + bs * c, bst);
            _tile_dpbf16ps(1, 2, 4);
        }
    }
    _tile_stored(0, cs[0], 64);
    TL_TILE_FENCE();
    put(cs[0], R, N0, out, ldo);
    if (N1) {
        _tile_stored(1, cs[1], 64);
        TL_TILE_FENCE();
        put(cs[1], R, N1, out + (size_t)N0 * ldo, ldo);
    }
}

/* One token (x, its row read in place as the B tile) against 32 rows:
 * two groups of 16 (tiles configured for (16, 1)), two independent chains
 * of tile multiplies where one group alone waits on each. */
static inline AI TX void rows32_tok1(int64_t n, const uint8_t *w, size_t ldw, const uint8_t *x, float *out) {
    _Alignas(64) float cs[2][256];
    _tile_zero(0);
    _tile_zero(1);
    for (int64_t c = 0; c < n / 32; c++) {
        UNROLL16 for (int r = 0; r < 16; r++) {
            _mm_prefetch((const char *)(w + (32 + r) * ldw + 64 * c), _MM_HINT_T1);
            _mm_prefetch((const char *)(w + (48 + r) * ldw + 64 * c), _MM_HINT_T1);
        }
        _tile_loadd(3, x + 64 * c, 4);
        _tile_loadd(2, w + 64 * c, ldw);
        _tile_loadd(5, w + 16 * ldw + 64 * c, ldw);
        _tile_dpbf16ps(0, 2, 3);
        _tile_dpbf16ps(1, 5, 3);
    }
    _tile_stored(0, cs[0], 64);
    _tile_stored(1, cs[1], 64);
    TL_TILE_FENCE();
    put(cs[0], 16, 1, out, 0);
    put(cs[1], 16, 1, out + 16, 0);
}

static tl_gemm_tile_fn bf16_avx512;

static TX void bf16_amx(int64_t n, int nr, int nt, float *out, size_t ldo, const void *w, size_t ldw, const void *x,
                        size_t ldx, void *work) {
    if (n % 32) {
        bf16_avx512(n, nr, nt, out, ldo, w, ldw, x, ldx, work);
        return;
    }
    const uint8_t *W = w, *X = x;
    uint8_t *b = work;
    const size_t tile_bytes = (size_t)(n / 32) * 1024;
    int cfg_r = 0, cfg_n = 0;
    if (nt == 1) { /* decode: the token's row is its own B tile */
        int r0 = 0;
        if (nr >= 32) configure(cfg_r = 16, 1);
        for (; r0 + 32 <= nr; r0 += 32) rows32_tok1(n, W + (size_t)r0 * ldw, ldw, X, out + r0);
        for (; r0 < nr; r0 += 16) {
            const int R = nr - r0 < 16 ? nr - r0 : 16;
            if (R != cfg_r) configure(cfg_r = R, 1);
            rows_tiles(n, R, 1, W + (size_t)r0 * ldw, ldw, X, NULL, 64, 4, 1, 0, out + r0, ldo);
        }
        _tile_release();
        return;
    }
    for (int p0 = 0; p0 < nt; p0 += PART) {
        const int np = nt - p0 < PART ? nt - p0 : PART, ntiles = (np + 15) / 16;
        for (int j = 0; j < ntiles; j++) {
            const int N = np - 16 * j < 16 ? np - 16 * j : 16;
            arrange(n, N, X + (size_t)(p0 + 16 * j) * ldx, ldx, b + (size_t)j * tile_bytes);
        }
        TL_TILE_FENCE(); /* the arranged tokens before the tile loads that read them */
        for (int r0 = 0; r0 < nr; r0 += 16) {
            const int R = nr - r0 < 16 ? nr - r0 : 16;
            for (int j = 0; j < ntiles;) {
                const int N0 = np - 16 * j < 16 ? np - 16 * j : 16;
                /* two tiles at once when both are whole (they share one configuration) */
                const int N1 = N0 == 16 && np - 16 * (j + 1) >= 16 ? 16 : 0;
                if (R != cfg_r || N0 != cfg_n) {
                    configure(R, N0);
                    cfg_r = R;
                    cfg_n = N0;
                }
                rows_tiles(n, R, j == 0, W + (size_t)r0 * ldw, ldw, b + (size_t)j * tile_bytes,
                           b + (size_t)(j + 1) * tile_bytes, 1024, 64, N0, N1, out + (size_t)(p0 + 16 * j) * ldo + r0,
                           ldo);
                j += N1 ? 2 : 1;
            }
        }
    }
    _tile_release();
}

void tl_bf16_fill_amx(tl_kernel_table *t) {
    if (!t->bf16dot_tile) return;
    bf16_avx512 = t->bf16dot_tile;
    t->bf16dot_tile = bf16_amx;
}

#else
void tl_bf16_fill_amx(tl_kernel_table *t) { (void)t; }
#endif

/* PART tokens' B tiles for rows of n elements */
size_t tl_bf16_amx_work_size(int64_t n) { return (size_t)((n + 31) / 32) * 1024 * (PART / 16); }
