/* quants_avx2.c - AVX2+FMA+F16C kernels. Each function carries its own
 * target attribute so the file builds without -march flags; dispatch.c
 * only installs them after CPUID says the CPU has AVX2/FMA.
 *
 * Quant dot products follow ggml's x86 scheme: unpack nibbles to bytes,
 * _mm256_maddubs_epi16 (unsigned x signed bytes -> int16 pairs), then
 * _mm256_madd_epi16 against ones or the sub-block scales -> int32, and one
 * float FMA per block. */
#include "iq2_grids.h"
#include "iq3_grids.h"
#include "iq1_grids.h"
#include "quants_impl.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <math.h>

#define T2 __attribute__((target("avx2,fma,f16c")))

static inline T2 float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline T2 float hsum128(__m128 s) {
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#include "avx2_bytes.h"

/* ---------------------------------------------------------- float rows */

static inline __attribute__((always_inline)) T2 float dot_f32_inl(const float *a, const float *b, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float s = hsum256(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

static T2 float dot_f32_avx2(const float *a, const float *b, int64_t n) { return dot_f32_inl(a, b, n); }

/* Attention scores: dot_f32 of q with each row, scaled, bitwise as
 * separate tl_dot_f32 calls (same inlined code) without a call per row. */
static T2 void dot_rows_f32_avx2(const float *q, const float *k, size_t ldk, int rows, int64_t n, float scale, float *out) {
    for (int r = 0; r < rows; r++) out[r] = dot_f32_inl(q, k + (size_t)r * ldk, n) * scale;
}

static T2 float dot_f16_f32_avx2(const uint16_t *a, const float *b, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
#define LDH(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(LDH(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(LDH(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(LDH(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(LDH(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(LDH(a + i), _mm256_loadu_ps(b + i), s0);
    float s = hsum256(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; i++) s += _cvtsh_ss(a[i]) * b[i];
    return s;
}

static inline T2 __m256 ld_bf16(const uint16_t *p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

static T2 void axpy_f32_avx2(float *y, float a, const float *x, int64_t n) {
    const __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

static T2 void axpy_f16_avx2(float *y, float a, const uint16_t *x, int64_t n) {
    const __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, LDH(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * _cvtsh_ss(x[i]);
}

/* 8 elements from i of an f32 row, or of an f16 row widened (exactly). */
static inline __attribute__((always_inline)) T2 __m256 ld8(int f16, const void *x, size_t i) {
    return f16 ? LDH((const uint16_t *)x + i) : _mm256_loadu_ps((const float *)x + i);
}

/* Elements [i, n) of axpy_rows_q: row by row, 8 lanes then scalar. */
static inline __attribute__((always_inline)) T2 void axpy_rows_tail(int f16, float *y, const float *a, const void *x,
                                                                    size_t ldx, int rows, int64_t i, int64_t n) {
    for (int r = 0; i < n && r < rows; r++) {
        const size_t xr = (size_t)r * ldx + (size_t)i;
        if (f16) axpy_f16_avx2(y + i, a[r], (const uint16_t *)x + xr, n - i);
        else axpy_f32_avx2(y + i, a[r], (const float *)x + xr, n - i);
    }
}

/* y[k] += a[k][r] * x_r for r in order, for Q queries at once (Q <= 3,
 * their y distinct), sharing each row load: per query and lane the same
 * FMAs in the same order as separate tl_axpy_f32 calls, with y kept in
 * registers across rows, so bitwise one call per query and row. The f16
 * rows (attention reading f16 V in place) go through the same FMAs on the
 * widened values, so they are bitwise the f32 rows widened first. */
static inline __attribute__((always_inline)) T2 void axpy_rows_q(int Q, int f16, float *const *y, const float *const *a,
                                                                 const void *x, size_t ldx, int rows, int64_t n) {
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256 u[3][4];
        _Pragma("GCC unroll 3") for (int k = 0; k < Q; k++)
            _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) u[k][c] = _mm256_loadu_ps(y[k] + i + 8 * c);
        for (int r = 0; r < rows; r++) {
            const size_t xr = (size_t)r * ldx + (size_t)i;
            __m256 va[3];
            _Pragma("GCC unroll 3") for (int k = 0; k < Q; k++) va[k] = _mm256_set1_ps(a[k][r]);
            _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) {
                const __m256 xv = ld8(f16, x, xr + 8 * (size_t)c);
                _Pragma("GCC unroll 3") for (int k = 0; k < Q; k++) u[k][c] = _mm256_fmadd_ps(va[k], xv, u[k][c]);
            }
        }
        _Pragma("GCC unroll 3") for (int k = 0; k < Q; k++)
            _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) _mm256_storeu_ps(y[k] + i + 8 * c, u[k][c]);
    }
    _Pragma("GCC unroll 3") for (int k = 0; k < Q; k++) axpy_rows_tail(f16, y[k], a[k], x, ldx, rows, i, n);
}

static T2 void axpy_rows_f32_avx2(float *y, const float *a, const float *x, size_t ldx, int rows, int64_t n) {
    axpy_rows_q(1, 0, &y, &a, x, ldx, rows, n);
}

/* nq queries three at a time (12 accumulators: with 8, two queries a
 * pass, the FMA chains left the pipes idle; one query a pass loaded
 * every row once per query, 1.25 loads per FMA). */
static inline __attribute__((always_inline)) T2 void axpy_rows_multi_inl(int f16, int nq, float *const *y,
                                                                         const float *const *a, const void *x,
                                                                         size_t ldx, int rows, int64_t n) {
    int q = 0;
    for (; q + 3 <= nq; q += 3) axpy_rows_q(3, f16, y + q, a + q, x, ldx, rows, n);
    if (nq - q == 2) axpy_rows_q(2, f16, y + q, a + q, x, ldx, rows, n);
    if (nq - q == 1) axpy_rows_q(1, f16, y + q, a + q, x, ldx, rows, n);
}

static T2 void axpy_rows_multi_f32_avx2(int nq, float *const *y, const float *const *a, const float *x, size_t ldx,
                                        int rows, int64_t n) {
    axpy_rows_multi_inl(0, nq, y, a, x, ldx, rows, n);
}

/* Attention on f16 K/V rows read in place (decode), bitwise the f32 row
 * kernels on the widened rows: the same FMAs in the same order, each f16
 * widened exactly in the register (a product is the same either way round). */
static T2 void dot_rows_f16_avx2(const float *q, const uint16_t *k, size_t ldk, int rows, int64_t n, float scale,
                                 float *out) {
    for (int r = 0; r < rows; r++) out[r] = dot_f16_f32_avx2(k + (size_t)r * ldk, q, n) * scale;
}

static T2 void axpy_rows_multi_f16_avx2(int nq, float *const *y, const float *const *a, const uint16_t *x, size_t ldx,
                                        int rows, int64_t n) {
    axpy_rows_multi_inl(1, nq, y, a, x, ldx, rows, n);
}

static T2 void f16_to_f32_avx2(const uint16_t *src, float *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, LDH(src + i));
    for (; i < n; i++) dst[i] = _cvtsh_ss(src[i]);
}
#undef LDH

/* exp(x) for x in [-86, 88] (clamped; 2^n stays a normal number), within 2 ulp: x = n ln2 + r with
 * |r| <= ln2/2 (ln2 split in two for an exact r), a degree-6 polynomial
 * for e^r, and 2^n added to the exponent. */
static inline T2 __m256 exp256(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-86.0f)), _mm256_set1_ps(88.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23);
    return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), e));
}

/* Softmax: exp256 with lanes below -87 set to 0 (libm's expf is
 * subnormal or 0 there, below any weight that matters; exp256's clamp
 * would give 4e-38), the sum in double lanes as the scalar loop sums. Within
 * 1e-6 relative of the scalar level (test_gemm). The n % 8 tail goes
 * through a padded copy: -inf pads add 0 to the sum. */
static inline T2 __m256 exp256_or_0(__m256 x) {
    return _mm256_and_ps(exp256(x), _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_GE_OQ));
}

static T2 void softmax_avx2(float *x, int64_t n, float scale) {
    float tail[8];
    const int64_t n8 = n & ~(int64_t)7;
    for (int i = 0; i < 8; i++) tail[i] = n8 + i < n ? x[n8 + i] * scale : -INFINITY;
    __m256 mv = _mm256_loadu_ps(tail);
    const __m256 sc = _mm256_set1_ps(scale);
    /* (x * scale made in both passes, the same product, not stored) */
    for (int64_t i = 0; i < n8; i += 8) mv = _mm256_max_ps(mv, _mm256_mul_ps(_mm256_loadu_ps(x + i), sc));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mv), _mm256_extractf128_ps(mv, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const __m256 maxv = _mm256_set1_ps(_mm_cvtss_f32(m4));
    __m256d s0 = _mm256_setzero_pd(), s1 = s0;
    for (int64_t i = 0; i <= n8; i += 8) {
        float *p = i < n8 ? x + i : tail; /* (the tail is scaled already) */
        const __m256 y = i < n8 ? _mm256_mul_ps(_mm256_loadu_ps(p), sc) : _mm256_loadu_ps(p);
        const __m256 e = exp256_or_0(_mm256_sub_ps(y, maxv));
        _mm256_storeu_ps(p, e);
        s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    const __m256d s = _mm256_add_pd(s0, s1);
    const __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
    const __m256 inv = _mm256_set1_ps((float)(1.0 / _mm_cvtsd_f64(_mm_add_sd(s2, _mm_unpackhi_pd(s2, s2)))));
    for (int64_t i = 0; i < n8; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), inv));
    for (int64_t i = n8; i < n; i++) x[i] = tail[i - n8] * _mm_cvtss_f32(_mm256_castps256_ps128(inv));
}

/* The gated activations h = x / (1 + e^a) * g, a = -x for silu, -2u for
 * gelu_tanh: gelu_tanh(x) = 0.5x(1 + tanh(u)) = x / (1 + exp(-2u)), no
 * cancellation where tanh(u) is near -1. exp256 clamps: below x = -88 silu
 * gives x / e^88, some 1e-36, where libm's is -0. Each element's value
 * depends on it alone, so the n % 8 tail through a padded copy gives what
 * the full lanes would. (libm's expf per element for silu was most of a
 * layer's element-wise work: 24,576 calls a token on a 110M-shaped model.) */
enum { GATE_SILU, GATE_GELU_TANH };

static inline __attribute__((always_inline)) T2 __m256 gate8(int kind, __m256 x, __m256 g) {
    const __m256 one = _mm256_set1_ps(1.0f);
    __m256 a;
    if (kind == GATE_SILU) {
        a = _mm256_xor_ps(x, _mm256_set1_ps(-0.0f));
    } else {
        const __m256 k2 = _mm256_set1_ps(-2.0f * 0.79788456080286535587989211986876f), c = _mm256_set1_ps(0.044715f);
        a = _mm256_mul_ps(_mm256_mul_ps(k2, x), _mm256_fmadd_ps(_mm256_mul_ps(c, x), x, one));
    }
    return _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(one, exp256(a))), g);
}

static inline __attribute__((always_inline)) T2 void gate_mul(int kind, float *h, const float *g, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(h + i, gate8(kind, _mm256_loadu_ps(h + i), _mm256_loadu_ps(g + i)));
    if (i < n) {
        float xs[8] = {0}, gs[8] = {0};
        memcpy(xs, h + i, (size_t)(n - i) * sizeof(float));
        memcpy(gs, g + i, (size_t)(n - i) * sizeof(float));
        _mm256_storeu_ps(xs, gate8(kind, _mm256_loadu_ps(xs), _mm256_loadu_ps(gs)));
        memcpy(h + i, xs, (size_t)(n - i) * sizeof(float));
    }
}

static T2 void gelu_tanh_mul_avx2(float *h, const float *g, int64_t n) { gate_mul(GATE_GELU_TANH, h, g, n); }
static T2 void silu_mul_avx2(float *h, const float *g, int64_t n) { gate_mul(GATE_SILU, h, g, n); }

/* RMSNorm's sum of squares in 8 double lanes: the scalar loop's one add
 * per element, each waiting for the last (4 cycles), was ~3% of a prefill. */
static T2 double sum_sq_avx2(const float *x, int64_t n) {
    __m256d s0 = _mm256_setzero_pd(), s1 = s0;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i), p = _mm256_mul_ps(v, v);
        s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(p)));
        s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(p, 1)));
    }
    const __m256d s = _mm256_add_pd(s0, s1);
    const __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
    double r = _mm_cvtsd_f64(_mm_add_sd(s2, _mm_unpackhi_pd(s2, s2)));
    for (; i < n; i++) r += (double)(x[i] * x[i]);
    return r;
}

static T2 void f32_to_f16_avx2(const float *src, uint16_t *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) dst[i] = tl_f32_to_f16_inl(src[i]);
}

/* ------------------------------------------------- 32-element blocks */

/* ------------------------------------------------ tiles of dot products
 *
 * As in quants_avx512.c: a micro-kernel computes R rows x C tokens (R <= 4,
 * C <= 4, constants after inlining) with one accumulator per output; rows
 * share each activation load, tokens share each weight load and unpack.
 * Every output goes through the same operations in the same order whatever
 * R and C are, and the single-row vec_dot of these types is the 1x1 case,
 * so a tile entry is bitwise what vec_dot returns. 4 x 2 keeps the 8
 * accumulators and the loads inside the 16 ymm registers; the shapes that
 * measured better (f32) say so where they are instantiated. */

#define AI __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 4")

enum { W_F32, W_F16, W_BF16 };

/* Software prefetch distance in bytes of the 16-bit rows' decode; see
 * quants_avx512.c. Zen 3, 110M, one thread, interleaved runs: f16 rows
 * 78.0-92.8 tok/s at 4 KiB against 79.0-85.1 at 8 KiB, ahead in 11 of 13
 * pairs (2 KiB 71.6-80.0, 16 KiB 75.9-83.1); bf16 rows 79.9-84.0 at 4 KiB
 * against 84.5-87.4 at 8. */
static inline int pf_dist(int kind) { return kind == W_F16 ? 4096 : 8192; }

static inline AI T2 __m256 ld_row8(int kind, const uint8_t *p) {
    if (kind == W_F32) return _mm256_loadu_ps((const float *)p);
    if (kind == W_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    return ld_bf16((const uint16_t *)p);
}

/* The last n % 8 elements, zero-padded to 8 (a zero product adds +0, so
 * the sum is that of the real elements). */
static inline AI T2 __m256 ld_row8_tail(int kind, const uint8_t *p, int64_t rem) {
    if (kind == W_F32) {
        const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        return _mm256_maskload_ps((const float *)p, _mm256_cmpgt_epi32(_mm256_set1_epi32((int)rem), idx));
    }
    uint16_t h[8] = {0};
    memcpy(h, p, (size_t)rem * 2);
    return ld_row8(kind, (const uint8_t *)h);
}

static inline AI T2 void mk_float(int kind, int R, int C, int pf, int64_t n, float *out, size_t ldo, const uint8_t *w,
                                  size_t ldw, const uint8_t *x, size_t ldx) {
    const int64_t es = kind == W_F32 ? 4 : 2;
    __m256 acc[4][4];
    UNROLL for (int r = 0; r < R; r++) UNROLL for (int c = 0; c < C; c++) acc[r][c] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        /* 16-bit rows only: f32 rows decode 0.87-0.91 of the time without
         * it, f16 rows 1.31 (Zen 3, one thread, the 110M's matrices in one
         * process, alternating step by step) */
        if (pf && kind != W_F32 && (i * es) % 64 == 0)
            UNROLL for (int r = 0; r < R; r++) _mm_prefetch((const char *)(w + pf_dist(kind) + R * i * es + 64 * r), _MM_HINT_T0);
        __m256 xv[4];
        UNROLL for (int c = 0; c < C; c++) xv[c] = _mm256_loadu_ps((const float *)(x + c * ldx) + i);
        UNROLL for (int r = 0; r < R; r++) {
            const __m256 wv = ld_row8(kind, w + r * ldw + i * es);
            UNROLL for (int c = 0; c < C; c++) acc[r][c] = _mm256_fmadd_ps(wv, xv[c], acc[r][c]);
        }
    }
    if (i < n) {
        __m256 xv[4];
        UNROLL for (int c = 0; c < C; c++) xv[c] = ld_row8_tail(W_F32, x + c * ldx + i * 4, n - i);
        UNROLL for (int r = 0; r < R; r++) {
            const __m256 wv = ld_row8_tail(kind, w + r * ldw + i * es, n - i);
            UNROLL for (int c = 0; c < C; c++) acc[r][c] = _mm256_fmadd_ps(wv, xv[c], acc[r][c]);
        }
    }
    UNROLL for (int r = 0; r < R; r++) UNROLL for (int c = 0; c < C; c++) out[c * ldo + r] = hsum256(acc[r][c]);
}

/* q8_0/q4_0/q5_0: gemm_avx2.c (8 rows transposed per block, exact integer
 * block sums). */

/* TILE_DRIVER and the MK_* shorthands: quants_impl.h */

/* f32 rows load twice the bytes of f16 per FMA: a third token per weight
 * load (12 accumulators) pays for f32 and not for f16's conversions.
 * Decode keeps the 4-row groups here, unlike quants_avx512.c's one row at
 * a time: an output is one 8-lane FMA chain (the per-entry order), so one
 * row is bound by the FMA latency at 32 bytes (f32) or 16 (f16) of
 * weights per 4 cycles. Measured on Zen 4 at this level (TINYLOOP_ISA=avx2,
 * 110M, one thread, interleaved): one row at a time F16 90-97 tok/s
 * against 105-122, F32 49-50 against 56-62. BF16's conversion (a zero
 * extension and a shift) pays for the third token as f32's loads do:
 * prefill(512) 318-321 -> 366-368 tok/s (Zen 3, one thread; F16 at 3:
 * 1.01x, noise). Converting 16 bf16 at once into even and odd lanes (a
 * shift and an and, the activations deinterleaved to match) measured
 * slower: 287-320. */
TILE_DRIVER(vdt_f32, T2, MK_F32, 3)
TILE_DRIVER(vdt_f16, T2, MK_F16, 2)
TILE_DRIVER(vdt_bf16, T2, MK_BF16, 3)

/* ------------------------------------------------------------ K-quants */

/* ---------------------------------------------- activation quantizers */

/* roundf (half away from zero) exactly: trunc, then step by the sign when
 * the exact remainder is >= 0.5. */
static inline T2 __m256i round_away(__m256 v) {
    const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 sgn = _mm256_and_ps(v, _mm256_set1_ps(-0.0f));
    const __m256 frac = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), _mm256_sub_ps(v, t));
    const __m256 step = _mm256_and_ps(_mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ),
                                      _mm256_or_ps(sgn, _mm256_set1_ps(1.0f)));
    return _mm256_cvttps_epi32(_mm256_add_ps(t, step));
}

/* 4 x 8 int32 -> 32 int8 in order (saturating). */
static inline T2 __m256i pack32(__m256i a, __m256i b, __m256i c, __m256i d) {
    const __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);
    return _mm256_permutevar8x32_epi32(_mm256_packs_epi16(ab, cd), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

static T2 void quantize_q8_0_avx2(const float *x, void *dst, int64_t n) {
    block_q8_0 *y = dst;
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int64_t i = 0; i < n / 32; i++, x += 32) {
        __m256 v[4];
        for (int k = 0; k < 4; k++) v[k] = _mm256_loadu_ps(x + 8 * k);
        __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v[0], absmask), _mm256_and_ps(v[1], absmask)),
                                 _mm256_max_ps(_mm256_and_ps(v[2], absmask), _mm256_and_ps(v[3], absmask)));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        const float d = amax / 127, id = d ? 1.0f / d : 0.0f;
        y[i].d = tl_f32_to_f16_inl(d);
        const __m256 vid = _mm256_set1_ps(id);
        __m256i q[4];
        for (int k = 0; k < 4; k++) q[k] = round_away(_mm256_mul_ps(v[k], vid));
        _mm256_storeu_si256((__m256i *)y[i].qs, pack32(q[0], q[1], q[2], q[3]));
    }
}

static T2 void quantize_q8_K_avx2(const float *x, void *dst, int64_t n) {
    block_q8_K *y = dst;
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        __m256 m = _mm256_setzero_ps();
        for (int k = 0; k < QK_K; k += 8) m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(x + k), absmask));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        if (!amax) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        /* The signed value of the first element of largest magnitude. */
        float max = 0;
        const __m256 vam = _mm256_set1_ps(amax);
        for (int k = 0; k < QK_K; k += 8) {
            const int mk = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_and_ps(_mm256_loadu_ps(x + k), absmask), vam, _CMP_EQ_OQ));
            if (mk) { max = x[k + __builtin_ctz((unsigned)mk)]; break; }
        }
        const float iscale = -127.f / max;
        const __m256 vis = _mm256_set1_ps(iscale);
        for (int k = 0; k < QK_K; k += 64) {
            __m256i q[8];
            for (int t = 0; t < 8; t++) q[t] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + k + 8 * t), vis));
            /* q <= 127 already except when |iscale*x| rounds to 128, which
             * packs saturate exactly like ggml's MIN(127, v). */
            _mm256_storeu_si256((__m256i *)(y[i].qs + k), pack32(q[0], q[1], q[2], q[3]));
            _mm256_storeu_si256((__m256i *)(y[i].qs + k + 32), pack32(q[4], q[5], q[6], q[7]));
        }
        for (int k = 0; k < QK_K; k += 64) {
            __m256i s[4];
            for (int t = 0; t < 4; t++) {
                const __m128i b = _mm_loadu_si128((const __m128i *)(y[i].qs + k + 16 * t));
                s[t] = _mm256_add_epi32(_mm256_cvtepi8_epi32(b), _mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)));
            }
            const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
            const __m128i r = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
            _mm_storel_epi64((__m128i *)(y[i].bsums + k / 16), _mm_packs_epi32(r, r));
        }
        y[i].d = 1 / iscale;
    }
}

/* d * q per element, as the scalar code: one exact int -> float and one
 * rounded product, so the results are bitwise equal. */
static T2 void dequant_q8_0_avx2(const void *src, float *y, int64_t nb) {
    const block_q8_0 *x = src;
    for (int64_t i = 0; i < nb; i++, y += 32) {
        const __m256 d = _mm256_set1_ps(f16(x[i].d));
        for (int j = 0; j < 32; j += 8) {
            const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(x[i].qs + j)));
            _mm256_storeu_ps(y + j, _mm256_mul_ps(_mm256_cvtepi32_ps(q), d));
        }
    }
}

/* The 32 nibbles of a q4 block, as 8 int32 each: elements 0-7, 8-15,
 * 16-23, 24-31. */
static inline T2 void nibble_octets(const uint8_t *qs, __m256i q[4]) {
    const __m256i b = nibbles32(qs); /* elems 0-15 | 16-31 */
    const __m128i lo = _mm256_castsi256_si128(b), hi = _mm256_extracti128_si256(b, 1);
    q[0] = _mm256_cvtepu8_epi32(lo);
    q[1] = _mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8));
    q[2] = _mm256_cvtepu8_epi32(hi);
    q[3] = _mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8));
}

static T2 void dequant_q4_0_avx2(const void *src, float *y, int64_t nb) {
    const block_q4_0 *x = src;
    __m256i q[4];
    for (int64_t i = 0; i < nb; i++, y += 32) {
        const __m256 d = _mm256_set1_ps(f16(x[i].d));
        nibble_octets(x[i].qs, q);
        for (int j = 0; j < 4; j++) {
            const __m256 v = _mm256_cvtepi32_ps(_mm256_sub_epi32(q[j], _mm256_set1_epi32(8)));
            _mm256_storeu_ps(y + 8 * j, _mm256_mul_ps(v, d));
        }
    }
}

/* q * d + m as two rounded operations (no fma), as the scalar code. */
static T2 void dequant_q4_1_avx2(const void *src, float *y, int64_t nb) {
    const block_q4_1 *x = src;
    __m256i q[4];
    for (int64_t i = 0; i < nb; i++, y += 32) {
        const __m256 d = _mm256_set1_ps(f16(x[i].d)), m = _mm256_set1_ps(f16(x[i].m));
        nibble_octets(x[i].qs, q);
        for (int j = 0; j < 4; j++)
            _mm256_storeu_ps(y + 8 * j, _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(q[j]), d), m));
    }
}

void tl_kernels_fill_avx2(tl_kernel_table *t) {
    t->vec_dot[TL_TYPE_F32] = vdt_f32_1;
    t->vec_dot[TL_TYPE_F16] = vdt_f16_1;
    t->vec_dot[TL_TYPE_BF16] = vdt_bf16_1;
    t->vec_dot_tile[TL_TYPE_F32] = vdt_f32;
    t->vec_dot_tile[TL_TYPE_F16] = vdt_f16;
    t->vec_dot_tile[TL_TYPE_BF16] = vdt_bf16;
    t->quantize_q8_0 = quantize_q8_0_avx2;
    t->quantize_q8_K = quantize_q8_K_avx2;
    t->dot_f32 = dot_f32_avx2;
    t->dot_f16_f32 = dot_f16_f32_avx2;
    t->axpy_f32 = axpy_f32_avx2;
    t->dot_rows_f32 = dot_rows_f32_avx2;
    t->axpy_rows_f32 = axpy_rows_f32_avx2;
    t->axpy_rows_multi_f32 = axpy_rows_multi_f32_avx2;
    t->axpy_f16 = axpy_f16_avx2;
    t->dot_rows_f16 = dot_rows_f16_avx2;
    t->axpy_rows_multi_f16 = axpy_rows_multi_f16_avx2;
    t->gelu_tanh_mul = gelu_tanh_mul_avx2;
    t->silu_mul = silu_mul_avx2;
    t->sum_sq = sum_sq_avx2;
    t->softmax_f32 = softmax_avx2;
    t->f16_to_f32_row = f16_to_f32_avx2;
    t->dequant_q8_0 = dequant_q8_0_avx2;
    t->dequant_q4_0 = dequant_q4_0_avx2;
    t->dequant_q4_1 = dequant_q4_1_avx2;
    t->f32_to_f16_row = f32_to_f16_avx2;
    tl_gemm_fill_avx2(t); /* q8_0/q4_0/q5_0/q4_1/q5_1/iq4_nl: gemm_avx2.c */
    tl_extra_fill_avx2(t); /* q2_K/q3_K/iq4_xs: quants_extra_avx2.c */
    tl_iq2_fill_avx2(t);   /* iq2_xxs/iq2_xs/iq2_s: quants_iq2_avx2.c */
    tl_iq3_fill_avx2(t);   /* iq3_xxs/iq3_s: quants_iq3_avx2.c */
    tl_iq1_fill_avx2(t); /* iq1_s/iq1_m: quants_iq1_avx2.c */
    tl_gemm_k_fill_avx2(t); /* q4_K/q5_K/q6_K: gemm_k_avx2.c */
    tl_gemm_iq_fill_avx2(t); /* the i-quants' GEMM over their tiles: gemm_iq_avx2.c */
    tl_attn_fill_avx2(t); /* prefill scores through K panels: attn_avx2.c */
}

#else
void tl_kernels_fill_avx2(tl_kernel_table *t) { (void)t; }
#endif
