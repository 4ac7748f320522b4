/* quants_avx512.c - AVX-512 (F, BW, VL, DQ) kernels, 64 bytes per op.
 * Float rows use 16-wide FMA; K-quants handle two 32-element sub-blocks
 * per zmm with maddubs/madd (BW only: with AVX512-VNNI gemm_k_avx512.c
 * replaces these for q4_K/q5_K/q6_K); q8_0/q4_0/q5_0/q4_1 are
 * gemm_avx512.c's (AVX512-VNNI), so without VNNI those keep the AVX2
 * kernels. */
#include "quants_impl.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define T5 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")))

static inline T5 float f16(uint16_t h) { return _cvtsh_ss(h); }

static inline T5 float hsum128(__m128 s) {
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline T5 float hsum256(__m256 v) {
    return hsum128(_mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)));
}

/* ---------------------------------------------------------- float rows */

#define LDB16(p) \
    _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16))

#define AI __attribute__((always_inline))
#include "avx512_dot.h"

/* The horizontal sum every f32 dot here ends with, written out (it is the
 * tree GCC's _mm512_reduce_add_ps uses) so that attn_avx512.c's dot_rows can
 * reproduce it for 16 rows at once: ((v_i + v_i+8) + (v_i+4 + v_i+12)) per i < 4,
 * then (i=0 + i=2) + (i=1 + i=3). */
static inline AI T5 float hsum512(__m512 v) {
    const __m256 t3 = _mm256_add_ps(_mm512_extractf32x8_ps(v, 1), _mm512_castps512_ps256(v));
    const __m128 t6 = _mm_add_ps(_mm256_extractf128_ps(t3, 1), _mm256_castps256_ps128(t3));
    const __m128 t8 = _mm_add_ps(t6, _mm_shuffle_ps(t6, t6, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm_cvtss_f32(t8) + _mm_cvtss_f32(_mm_shuffle_ps(t8, t8, 1));
}

static inline AI T5 __m512 dot_f32_vec(const float *a, const float *b, int64_t n) { return dot_vec(0, a, b, n); }

static T5 float dot_f32_512(const float *a, const float *b, int64_t n) { return hsum512(dot_f32_vec(a, b, n)); }

static T5 float dot_f16_f32_512(const uint16_t *a, const float *b, int64_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        s0 = _mm512_fmadd_ps(LDH16(a + i), _mm512_loadu_ps(b + i), s0);
        s1 = _mm512_fmadd_ps(LDH16(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
        s2 = _mm512_fmadd_ps(LDH16(a + i + 32), _mm512_loadu_ps(b + i + 32), s2);
        s3 = _mm512_fmadd_ps(LDH16(a + i + 48), _mm512_loadu_ps(b + i + 48), s3);
    }
    for (; i + 16 <= n; i += 16) s0 = _mm512_fmadd_ps(LDH16(a + i), _mm512_loadu_ps(b + i), s0);
    if (i < n) {
        const __mmask16 m = tail_mask(n - i);
        const __m512 va = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, a + i));
        s1 = _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(m, b + i), s1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

/* ------------------------------------------------ tiles of dot products
 *
 * A micro-kernel computes R rows x C tokens (R <= 4, C <= 4, constants after
 * inlining) with one accumulator per output: rows share each activation
 * load, tokens share each weight load and unpack. Every output goes through
 * the same operations in the same order whatever R and C are, so a tile
 * entry is bitwise the 1x1 result that vec_dot returns. */

/* Software prefetch distance in bytes. A 4-row group reads its rows as four
 * short interleaved streams (a q8_0 row of 768 is 13 lines), which the
 * hardware prefetcher does not follow well: measured on Zen 4, 4-row decode
 * streamed at half the speed of one row at a time until the group's bytes
 * were prefetched linearly this far ahead (R lines' worth per step). Only
 * the first token group of a row group prefetches; later ones hit L1/L2. */
#define PF_FLOAT 16384 /* f32 weights; f16/bf16 and quants measured best at 8 KiB */
#define PF_QUANT 8192
#define UNROLL _Pragma("GCC unroll 4")
#define UNROLL8 _Pragma("GCC unroll 8")
#define UNROLL16 _Pragma("GCC unroll 16")
#define UNUSED __attribute__((unused)) /* the prefill drivers' 1x1 vec_dot (vdt_*_d_1 is the one used) */

enum { W_F32, W_F16, W_BF16 };

/* Whether a decoding 16-bit row asks ahead itself (below): the CPU's
 * hardware prefetcher follows it on AMD, not on Intel. */
static int row16_prefetch;

static inline AI T5 __m512 ld_row16(int kind, const uint8_t *p, int64_t i) {
    if (kind == W_F32) return _mm512_loadu_ps((const float *)p + i);
    if (kind == W_F16) return LDH16((const uint16_t *)p + i);
    return LDB16((const uint16_t *)p + i);
}

static inline AI T5 __m512 ld_row16_tail(int kind, __mmask16 m, const uint8_t *p, int64_t i) {
    if (kind == W_F32) return _mm512_maskz_loadu_ps(m, (const float *)p + i);
    const __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i);
    if (kind == W_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* One 16-element step of mk_float's R x C accumulators. */
static inline AI T5 void float_step(int kind, int R, int C, int64_t i, __m512 acc[8][4], const uint8_t *w, size_t ldw,
                                    const uint8_t *x, size_t ldx) {
    __m512 xv[4];
    UNROLL8 for (int c = 0; c < C; c++) xv[c] = _mm512_loadu_ps((const float *)(x + c * ldx) + i);
    UNROLL8 for (int r = 0; r < R; r++) {
        const __m512 wv = ld_row16(kind, w + r * ldw, i);
        UNROLL8 for (int c = 0; c < C; c++) acc[r][c] = _mm512_fmadd_ps(wv, xv[c], acc[r][c]);
    }
}

static inline AI T5 void mk_float(int kind, int R, int C, int pf, int64_t n, float *out, size_t ldo, const uint8_t *w,
                                  size_t ldw, const uint8_t *x, size_t ldx) {
    const int64_t es = kind == W_F32 ? 4 : 2;
    __m512 acc[8][4];
    UNROLL8 for (int r = 0; r < R; r++) UNROLL8 for (int c = 0; c < C; c++) acc[r][c] = _mm512_setzero_ps();
    int64_t i = 0;
    /* a decoding f32 row (a line a step) also asks 4 KiB ahead into L2:
     * 110M F32, one thread, interleaved, 54-57 -> 61-70 tok/s; the
     * same for f16 rows (half a line a step) was 122-130 -> 92-100 on
     * Zen 4, but on Intel (row16_prefetch) it is what keeps the stream
     * going: 65536 x 768 f16 rows, one thread, 6.0-7.4 -> 11.4-14.3
     * GB/s on an Emerald Rapids VM (STREAM-like loop 10.6-13.2) */
    const int pf_rows = pf && R > 1, pf_row = R == 1 && (kind == W_F32 || row16_prefetch);
    if (pf_rows || pf_row) {
        for (; i + 16 <= n; i += 16) {
            if (pf_rows) UNROLL8 for (int r = 0; r < R; r++) _mm_prefetch((const char *)(w + (kind == W_F32 ? PF_FLOAT : PF_QUANT) + (R * i + 16 * r) * es), _MM_HINT_T0);
            if (pf_row) _mm_prefetch((const char *)(w + 4096 + i * es), _MM_HINT_T1);
            float_step(kind, R, C, i, acc, w, ldw, x, ldx);
        }
    } else {
        /* the token groups after a row group's first (no prefetches) two
         * steps a loop turn: the loop's own branches and adds had shared the
         * FMA ports at one turn per 16 FMAs */
        for (; i + 32 <= n; i += 32) {
            float_step(kind, R, C, i, acc, w, ldw, x, ldx);
            float_step(kind, R, C, i + 16, acc, w, ldw, x, ldx);
        }
        for (; i + 16 <= n; i += 16) float_step(kind, R, C, i, acc, w, ldw, x, ldx);
    }
    if (i < n) {
        const __mmask16 m = tail_mask(n - i);
        __m512 xv[4];
        UNROLL8 for (int c = 0; c < C; c++) xv[c] = _mm512_maskz_loadu_ps(m, (const float *)(x + c * ldx) + i);
        UNROLL8 for (int r = 0; r < R; r++) {
            const __m512 wv = ld_row16_tail(kind, m, w + r * ldw, i);
            UNROLL8 for (int c = 0; c < C; c++) acc[r][c] = _mm512_fmadd_ps(wv, xv[c], acc[r][c]);
        }
    }
    if (R * C == 16 || R * C == 24) {
        /* the prefill shapes' sums as one or two transposing trees (fold16:
         * reduce_add_ps's pairing in every lane, so bitwise the same), entry
         * (r, c) in lane R * c + r; rows past R * C pad the second tree
         * (each lane sums its own vector) */
        __m512 v[32];
        _Alignas(64) float sums[32];
        _Pragma("GCC unroll 32") for (int k = 0; k < 32; k++) v[k] = k < R * C ? acc[k % R][k / R] : _mm512_setzero_ps();
        _mm512_store_ps(sums, fold16(v, 0));
        if (R * C > 16) _mm512_store_ps(sums + 16, fold16(v + 16, 0));
        UNROLL8 for (int c = 0; c < C; c++) memcpy(out + c * ldo, sums + R * c, (size_t)R * sizeof(float));
        return;
    }
    UNROLL8 for (int r = 0; r < R; r++) UNROLL8 for (int c = 0; c < C; c++) out[c * ldo + r] = _mm512_reduce_add_ps(acc[r][c]);
}

/* TILE_DRIVER and the MK_* shorthands: quants_impl.h */

/* Float weights: prefill's token groups take 4 rows x 4 tokens (f32) or 8
 * rows x 3 tokens (16-bit: each activation load feeds 8 rows, measured
 * 1.15-1.25x the 4x4 tile at 64 tokens, as the activations stream from
 * L2); decode (1-2 tokens) one row at a time from start to end, both
 * tokens in the one pass: one sequential stream, which the hardware
 * prefetcher follows. Four rows in step (1.5-6 KiB apart) it did not
 * follow (7-11 GB/s alone), and the kernel's own prefetches topped out at
 * ~80% of the STREAM-like loop: 245 MB of f16 rows, one thread,
 * interleaved, 15-26 -> 22-30 GB/s against the loop's 27-31, f32 19-26 ->
 * 26-28; 110M decode, one thread, F16 92-103 -> 117-120 tok/s, F32 48-55
 * -> 57-61. The same per-entry order in every shape (mk_float's), so the
 * choice changes no bit. */
#define TILE_FLOAT(NAME, MK, PR, PC)                                                                             \
    TILE_DRIVER_RC(NAME##_d, T5, MK, 1, 2)                                                                      \
    TILE_DRIVER_RC(NAME##_p, T5 UNUSED, MK, PR, PC)                                                             \
    static T5 void NAME(int64_t n, int nr, int nt, float *out, size_t ldo, const void *w, size_t ldw, const void *x, \
                        size_t ldx) {                                                                           \
        if (nt >= 3) NAME##_p(n, nr, nt, out, ldo, w, ldw, x, ldx);                                             \
        else NAME##_d(n, nr, nt, out, ldo, w, ldw, x, ldx);                                                     \
    }
TILE_FLOAT(vdt_f32, MK_F32, 4, 4)
TILE_FLOAT(vdt_f16, MK_F16, 8, 3)
TILE_FLOAT(vdt_bf16, MK_BF16, 8, 3)
#undef TILE_FLOAT

static T5 void axpy_f32_512(float *y, float a, const float *x, int64_t n) {
    const __m512 va = _mm512_set1_ps(a);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    if (i < n) {
        const __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
    }
}

/* y += a[r] * x_r for r in order: per lane the same FMAs in the same order
 * as separate axpy_f32_512 calls, with y kept in registers across rows. */
static T5 void axpy_rows_512(float *y, const float *a, const float *x, size_t ldx, int rows, int64_t n) {
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m512 y0 = _mm512_loadu_ps(y + i), y1 = _mm512_loadu_ps(y + i + 16);
        __m512 y2 = _mm512_loadu_ps(y + i + 32), y3 = _mm512_loadu_ps(y + i + 48);
        for (int r = 0; r < rows; r++) {
            const float *xr = x + (size_t)r * ldx + i;
            const __m512 va = _mm512_set1_ps(a[r]);
            y0 = _mm512_fmadd_ps(va, _mm512_loadu_ps(xr), y0);
            y1 = _mm512_fmadd_ps(va, _mm512_loadu_ps(xr + 16), y1);
            y2 = _mm512_fmadd_ps(va, _mm512_loadu_ps(xr + 32), y2);
            y3 = _mm512_fmadd_ps(va, _mm512_loadu_ps(xr + 48), y3);
        }
        _mm512_storeu_ps(y + i, y0);
        _mm512_storeu_ps(y + i + 16, y1);
        _mm512_storeu_ps(y + i + 32, y2);
        _mm512_storeu_ps(y + i + 48, y3);
    }
    for (; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : tail_mask(n - i);
        __m512 y0 = _mm512_maskz_loadu_ps(m, y + i);
        for (int r = 0; r < rows; r++)
            y0 = _mm512_fmadd_ps(_mm512_set1_ps(a[r]), _mm512_maskz_loadu_ps(m, x + (size_t)r * ldx + i), y0);
        _mm512_mask_storeu_ps(y + i, m, y0);
    }
}

static T5 void axpy_f16_512(float *y, float a, const uint16_t *x, int64_t n) {
    const __m512 va = _mm512_set1_ps(a);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, LDH16(x + i), _mm512_loadu_ps(y + i)));
    if (i < n) {
        const __mmask16 m = tail_mask(n - i);
        const __m512 vx = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, x + i));
        _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(va, vx, _mm512_maskz_loadu_ps(m, y + i)));
    }
}

static T5 void f16_to_f32_512(const uint16_t *src, float *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, LDH16(src + i));
    if (i < n) {
        const __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(dst + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, src + i)));
    }
}

static T5 void f32_to_f16_512(const float *src, uint16_t *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(dst + i), _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    if (i < n) {
        const __mmask16 m = tail_mask(n - i);
        const __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, src + i), _MM_FROUND_TO_NEAREST_INT);
        _mm256_mask_storeu_epi16(dst + i, m, h);
    }
}

/* ------------------------------------------------------------ K-quants */

/* int16 lanes 0..15 = a, 16..31 = b. */
static inline T5 __m512i idx2(int a, int b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16((short)a)), _mm256_set1_epi16((short)b), 1);
}

/* q4_K/q5_K, R rows x C tokens: each (row, token) keeps its own float
 * accumulators (acc for the scaled sums, accm for the mins) fed in block
 * order, so any tile entry is bitwise the 1x1 result. Rows share the
 * activation loads; tokens share the unpacked weights and scales. */
static inline AI T5 void mk_q45_K(int five, int R, int C, int pf, int64_t n, float *out, size_t ldo, const uint8_t *w,
                                  size_t ldw, const uint8_t *x, size_t ldx) {
    const __m512i m4 = _mm512_set1_epi8(0xF), x10 = _mm512_set1_epi8(0x10);
    /* broadcast 32 q bytes to both halves, shift the high half by 4 */
    const __m512i nsh = _mm512_set_epi64(4, 4, 4, 4, 0, 0, 0, 0);
    const size_t bw = five ? sizeof(block_q5_K) : sizeof(block_q4_K);
    __m512 acc[4][2];
    __m128 accm[4][2];
    UNROLL for (int r = 0; r < R; r++) UNROLL for (int c = 0; c < C; c++) {
        acc[r][c] = _mm512_setzero_ps();
        accm[r][c] = _mm_setzero_ps();
    }
    for (int64_t i = 0; i < n / QK_K; i++) {
        if (pf) UNROLL for (int k = 0; k < R * (int)bw; k += 64) _mm_prefetch((const char *)(w + PF_QUANT + R * i * bw + k), _MM_HINT_T0);
        const block_q8_K *yb[2];
        __m128i ysum[2];
        UNROLL for (int c = 0; c < C; c++) {
            yb[c] = (const block_q8_K *)(x + c * ldx) + i;
            ysum[c] = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)yb[c]->bsums),
                                     _mm_loadu_si128((const __m128i *)yb[c]->bsums + 1));
        }
        __m512i sumi[4][2];
        UNROLL for (int r = 0; r < R; r++) {
            const uint8_t *scales, *q, *qh = NULL;
            uint16_t dh, dminh;
            if (five) {
                const block_q5_K *a = (const block_q5_K *)(w + r * ldw) + i;
                scales = a->scales; q = a->qs; qh = a->qh; dh = a->d; dminh = a->dmin;
            } else {
                const block_q4_K *a = (const block_q4_K *)(w + r * ldw) + i;
                scales = a->scales; q = a->qs; dh = a->d; dminh = a->dmin;
            }
            uint32_t u[4];
            tl_unpack_k4_scales(scales, u);
            const __m256i ms = _mm256_cvtepu8_epi16(_mm_set_epi32((int)u[3], (int)u[2], (int)u[1], (int)u[0]));
            const __m128i mins = _mm256_extracti128_si256(ms, 1);
            UNROLL for (int c = 0; c < C; c++) {
                const float dmin = -yb[c]->d * f16(dminh);
                const __m128i pm = _mm_madd_epi16(mins, ysum[c]);
                accm[r][c] = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(pm), accm[r][c]);
                sumi[r][c] = _mm512_setzero_si512();
            }
            /* int16 scales 0..7 in every 128-bit lane; vpshufb picks per half */
            const __m512i sc = _mm512_broadcast_i32x4(_mm256_castsi256_si128(ms));
            const __m512i hb = qh ? _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)qh)) : _mm512_setzero_si512();
            UNROLL for (int j = 0; j < 4; j++) {
                const __m512i bits = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(q + 32 * j)));
                __m512i v = _mm512_and_si512(_mm512_srlv_epi64(bits, nsh), m4);
                if (qh) {
                    const __m512i hmask = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << (2 * j))),
                                                             _mm256_set1_epi8((char)(2 << (2 * j))), 1);
                    v = _mm512_mask_add_epi8(v, _mm512_test_epi8_mask(hb, hmask), v, x10);
                }
                const __m512i s = _mm512_shuffle_epi8(sc, idx2((4 * j) | ((4 * j + 1) << 8), (4 * j + 2) | ((4 * j + 3) << 8)));
                UNROLL for (int c = 0; c < C; c++) {
                    const __m512i p = _mm512_maddubs_epi16(v, _mm512_loadu_si512(yb[c]->qs + 64 * j));
                    sumi[r][c] = _mm512_add_epi32(sumi[r][c], _mm512_madd_epi16(s, p));
                }
            }
            UNROLL for (int c = 0; c < C; c++) {
                const float d = yb[c]->d * f16(dh);
                acc[r][c] = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi[r][c]), acc[r][c]);
            }
        }
    }
    UNROLL for (int r = 0; r < R; r++) UNROLL for (int c = 0; c < C; c++)
        out[c * ldo + r] = _mm512_reduce_add_ps(acc[r][c]) + hsum128(accm[r][c]);
}

/* q6_K: 64 elements per zmm; -32 offset folded out through bsums. Tiled
 * like mk_q45_K. */
static inline AI T5 void mk_q6_K(int R, int C, int pf, int64_t n, float *out, size_t ldo, const uint8_t *w, size_t ldw,
                                 const uint8_t *x, size_t ldx) {
    const __m512i m4 = _mm512_set1_epi8(0xF), m30 = _mm512_set1_epi8(0x30);
    const __m512i shl = _mm512_set_epi64(2, 2, 2, 2, 4, 4, 4, 4), shr = _mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0);
    /* int16 scale lane pattern: 8 lanes per 16-element group */
    const __m512i sidx = _mm512_set_epi64(0x0003000300030003, 0x0003000300030003, 0x0002000200020002,
                                          0x0002000200020002, 0x0001000100010001, 0x0001000100010001, 0, 0);
    __m512 acc[4][2];
    __m256 accm[4][2];
    UNROLL for (int r = 0; r < R; r++) UNROLL for (int c = 0; c < C; c++) {
        acc[r][c] = _mm512_setzero_ps();
        accm[r][c] = _mm256_setzero_ps();
    }
    for (int64_t i = 0; i < n / QK_K; i++) {
        if (pf) UNROLL for (int k = 0; k < R * (int)sizeof(block_q6_K); k += 64)
            _mm_prefetch((const char *)(w + PF_QUANT + R * i * sizeof(block_q6_K) + k), _MM_HINT_T0);
        const block_q8_K *yb[2];
        UNROLL for (int c = 0; c < C; c++) yb[c] = (const block_q8_K *)(x + c * ldx) + i;
        UNROLL for (int r = 0; r < R; r++) {
            const block_q6_K *a = (const block_q6_K *)(w + r * ldw) + i;
            const float da = f16(a->d);
            const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)a->scales));
            __m512i sumi[2];
            UNROLL for (int c = 0; c < C; c++) {
                const float d = yb[c]->d * da;
                const __m256i pm = _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)yb[c]->bsums));
                accm[r][c] = _mm256_fmadd_ps(_mm256_set1_ps(-32.f * d), _mm256_cvtepi32_ps(pm), accm[r][c]);
                sumi[c] = _mm512_setzero_si512();
            }
            const __m512i sc = _mm512_castsi256_si512(sc16);
            UNROLL for (int j = 0; j < 2; j++) {
                const __m512i l = _mm512_loadu_si512(a->ql + 64 * j);
                const __m512i hb = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(a->qh + 32 * j)));
                /* elements 0..63: ql low nibbles, qh bits 0-1 (0..31) / 2-3 (32..63) */
                const __m512i q0 = _mm512_or_si512(_mm512_and_si512(l, m4), _mm512_and_si512(_mm512_sllv_epi64(hb, shl), m30));
                /* elements 64..127: ql high nibbles, qh bits 4-5 / 6-7 */
                const __m512i q1 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi64(l, 4), m4),
                                                   _mm512_and_si512(_mm512_srlv_epi64(hb, shr), m30));
                const __m512i base = _mm512_set1_epi16((short)(8 * j));
                const __m512i s0 = _mm512_permutexvar_epi16(_mm512_add_epi16(sidx, base), sc);
                const __m512i s1 = _mm512_permutexvar_epi16(_mm512_add_epi16(sidx, _mm512_add_epi16(base, _mm512_set1_epi16(4))), sc);
                UNROLL for (int c = 0; c < C; c++) {
                    const __m512i p0 = _mm512_maddubs_epi16(q0, _mm512_loadu_si512(yb[c]->qs + 128 * j));
                    const __m512i p1 = _mm512_maddubs_epi16(q1, _mm512_loadu_si512(yb[c]->qs + 128 * j + 64));
                    sumi[c] = _mm512_add_epi32(sumi[c], _mm512_add_epi32(_mm512_madd_epi16(s0, p0), _mm512_madd_epi16(s1, p1)));
                }
            }
            UNROLL for (int c = 0; c < C; c++) {
                const float d = yb[c]->d * da;
                acc[r][c] = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi[c]), acc[r][c]);
            }
        }
    }
    UNROLL for (int r = 0; r < R; r++) UNROLL for (int c = 0; c < C; c++)
        out[c * ldo + r] = _mm512_reduce_add_ps(acc[r][c]) + hsum256(accm[r][c]);
}

#define MK_Q4_K(R, C, ...) mk_q45_K(0, R, C, __VA_ARGS__)
#define MK_Q5_K(R, C, ...) mk_q45_K(1, R, C, __VA_ARGS__)
#define MK_Q6_K(R, C, ...) mk_q6_K(R, C, __VA_ARGS__)

TILE_DRIVER(vdt_q4_K, T5, MK_Q4_K, 2)
TILE_DRIVER(vdt_q5_K, T5, MK_Q5_K, 2)
TILE_DRIVER(vdt_q6_K, T5, MK_Q6_K, 2)

/* ---------------------------------------------- activation quantizers */

/* roundf (half away from zero), exact; see quants_avx2.c. */
static inline T5 __m512i round_away(__m512 v) {
    const __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __mmask16 ge = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(v, t)), _mm512_set1_ps(0.5f), _CMP_GE_OQ);
    const __m512 step = _mm512_or_ps(_mm512_and_ps(v, _mm512_set1_ps(-0.0f)), _mm512_set1_ps(1.0f));
    return _mm512_cvttps_epi32(_mm512_mask_add_ps(t, ge, t, step));
}

/* One block's quants with the inverse scale id (ggml's roundf: away from 0). */
static inline AI T5 void q8_0_quants(const float *x, float id, int8_t *qs) {
    const __m512 vid = _mm512_set1_ps(id);
    _mm_storeu_si128((__m128i *)qs, _mm512_cvtsepi32_epi8(round_away(_mm512_mul_ps(_mm512_loadu_ps(x), vid))));
    _mm_storeu_si128((__m128i *)(qs + 16), _mm512_cvtsepi32_epi8(round_away(_mm512_mul_ps(_mm512_loadu_ps(x + 16), vid))));
}

/* A block's |x| maxima by lane, NaN ignored as the reference's fmaxf does
 * (max_ps returns its second operand when either is NaN). */
static inline AI T5 __m512 q8_0_absmax(const float *x) {
    const __m512 m = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + 16)), _mm512_setzero_ps());
    return _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x)), m);
}

/* 16 blocks at a time (the last group padded with zero maxima): their
 * maxima fold into one vector (fold16; a maximum is exact in any order),
 * whose scales, inverses and f16 scales are a vector division and
 * conversion each, instead of a reduction, two scalar divisions and a
 * scalar f16 rounding per block (n = 768's last 8 blocks went that way:
 * 13 ns a block against 9). Bitwise the reference (the same IEEE
 * operations; vcvtps2ph rounds to nearest even as tl_f32_to_f16 does). */
static T5 void quantize_q8_0_512(const float *x, void *dst, int64_t n) {
    block_q8_0 *y = dst;
    const int64_t nb = n / 32;
    const __m512 zero = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i += 16) {
        const int cnt = nb - i < 16 ? (int)(nb - i) : 16;
        __m512 m[16];
        UNROLL16 for (int b = 0; b < 16; b++) m[b] = b < cnt ? q8_0_absmax(x + (i + b) * 32) : zero;
        const __m512 d = _mm512_div_ps(fold16(m, 1), _mm512_set1_ps(127.0f));
        float id[16];
        uint16_t dh[16];
        _mm512_storeu_ps(id, _mm512_maskz_div_ps(_mm512_cmp_ps_mask(d, zero, _CMP_NEQ_UQ), _mm512_set1_ps(1.0f), d));
        _mm256_storeu_si256((__m256i *)dh, _mm512_cvtps_ph(d, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        for (int b = 0; b < cnt; b++) {
            y[i + b].d = dh[b];
            q8_0_quants(x + (i + b) * 32, id[b], y[i + b].qs);
        }
    }
}

static T5 void quantize_q8_K_512(const float *x, void *dst, int64_t n) {
    block_q8_K *y = dst;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        __m512 m = _mm512_setzero_ps();
        for (int k = 0; k < QK_K; k += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(x + k)));
        const float amax = _mm512_reduce_max_ps(m);
        if (!amax) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        float max = 0;
        const __m512 vam = _mm512_set1_ps(amax);
        for (int k = 0; k < QK_K; k += 16) {
            const __mmask16 mk = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(x + k)), vam, _CMP_EQ_OQ);
            if (mk) { max = x[k + __builtin_ctz((unsigned)mk)]; break; }
        }
        const float iscale = -127.f / max;
        const __m512 vis = _mm512_set1_ps(iscale);
        for (int k = 0; k < QK_K; k += 16) {
            const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + k), vis));
            _mm_storeu_si128((__m128i *)(y[i].qs + k), _mm512_cvtsepi32_epi8(q));
        }
        for (int k = 0; k < QK_K; k += 64) {
            /* 4 groups of 16: maddubs(1, q) then madd(1) gives 4-sums; fold. */
            const __m512i q = _mm512_loadu_si512(y[i].qs + k);
            const __m512i s4 = _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_set1_epi8(1), q), _mm512_set1_epi16(1));
            /* s4: 16 int32, each the sum of 4 bytes; groups are lanes 4g..4g+3 */
            const __m512i s8 = _mm512_add_epi32(s4, _mm512_shuffle_epi32(s4, _MM_PERM_CDAB));
            const __m512i s16 = _mm512_add_epi32(s8, _mm512_shuffle_epi32(s8, _MM_PERM_BADC));
            /* lane 4g now holds group g's sum */
            const __m256i g = _mm512_cvtepi32_epi16(_mm512_maskz_compress_epi32(0x1111, s16));
            _mm_storel_epi64((__m128i *)(y[i].bsums + k / 16), _mm256_castsi256_si128(g));
        }
        y[i].d = 1 / iscale;
    }
}

void tl_kernels_fill_avx512(tl_kernel_table *t, int vnni) {
    row16_prefetch = __builtin_cpu_is("intel");
    t->vec_dot[TL_TYPE_F32] = vdt_f32_d_1;
    t->vec_dot[TL_TYPE_F16] = vdt_f16_d_1;
    t->vec_dot[TL_TYPE_BF16] = vdt_bf16_d_1;
    t->vec_dot_tile[TL_TYPE_F32] = vdt_f32;
    t->vec_dot_tile[TL_TYPE_F16] = vdt_f16;
    t->vec_dot_tile[TL_TYPE_BF16] = vdt_bf16;
    t->vec_dot[TL_TYPE_Q4_K] = vdt_q4_K_1;
    t->vec_dot[TL_TYPE_Q5_K] = vdt_q5_K_1;
    t->vec_dot[TL_TYPE_Q6_K] = vdt_q6_K_1;
    t->vec_dot_tile[TL_TYPE_Q4_K] = vdt_q4_K;
    t->vec_dot_tile[TL_TYPE_Q5_K] = vdt_q5_K;
    t->vec_dot_tile[TL_TYPE_Q6_K] = vdt_q6_K;
    t->quantize_q8_0 = quantize_q8_0_512;
    t->quantize_q8_K = quantize_q8_K_512;
    t->dot_f32 = dot_f32_512;
    t->dot_f16_f32 = dot_f16_f32_512;
    t->axpy_f32 = axpy_f32_512;
    t->axpy_f16 = axpy_f16_512;
    t->axpy_rows_f32 = axpy_rows_512;
    t->f16_to_f32_row = f16_to_f32_512;
    t->f32_to_f16_row = f32_to_f16_512;
    tl_attn_fill_avx512(t, vnni);
    if (vnni) tl_gemm_fill_avx512(t); /* q8_0/q4_0/q5_0: gemm_avx512.c */
}

#else
void tl_kernels_fill_avx512(tl_kernel_table *t, int vnni) { (void)t; (void)vnni; }
#endif
