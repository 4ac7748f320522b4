/* attn_avx512.c - attention's score rows, softmax and multi-query
 * weighted V sums for the AVX-512 level (the scalar level's are in
 * dispatch.c). Score rows and V sums also read f16 K/V rows directly,
 * widening in registers: a decoding token (one query per block) would
 * otherwise convert each block to f32 to read it once.
 *
 * Softmax: a polynomial exp, the sum in double lanes. The scalar loop it
 * replaces (libm expf, then a sum with one double add per element, each
 * waiting for the last) was as much of a 512-token prefill as the score
 * dots. The result is within 1e-6 relative of the scalar level's (test_gemm);
 * each token's softmax depends on its own scores only, so batch, chunk
 * and cache still change nothing.
 *
 * Weighted V sums: tl_axpy_rows_f32 for up to 4 queries (the tokens of a
 * chunk and the query heads of a group that see the same rows of a block)
 * with each V row loaded once for all of them. Per lane the same FMAs in
 * the same order as one call per query, so the result is bitwise theirs. */
#include "quants_impl.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <math.h>

#define T5 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")))
#define AI __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 4")
#define UNROLL16 _Pragma("GCC unroll 16")
#include "avx512_dot.h"

/* exp(x) within 2 ulp for x <= 88.7: x = n ln2 + r with |r| <= ln2/2 (ln2
 * in two parts for an exact r), a degree-6 polynomial for e^r, then
 * scalef by 2^n, which underflows to 0 as libm's expf does (x < -103.9). */
static inline AI T5 __m512 exp512(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-110.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

static T5 void softmax_512(float *x, int64_t n, float scale) {
    __m512 mv = _mm512_set1_ps(-INFINITY);
    const __m512 sc = _mm512_set1_ps(scale);
    /* x * scale is made in both passes (the same product each time) rather
     * than stored by the first */
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) mv = _mm512_max_ps(mv, _mm512_mul_ps(_mm512_loadu_ps(x + i), sc));
    if (i < n)
        mv = _mm512_mask_max_ps(mv, tail_mask(n - i), mv, _mm512_mul_ps(_mm512_maskz_loadu_ps(tail_mask(n - i), x + i), sc));
    const __m512 maxv = _mm512_set1_ps(_mm512_reduce_max_ps(mv));
    __m512d s0 = _mm512_setzero_pd(), s1 = s0;
    for (i = 0; i + 16 <= n; i += 16) {
        const __m512 e = exp512(_mm512_sub_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), sc), maxv));
        _mm512_storeu_ps(x + i, e);
        s0 = _mm512_add_pd(s0, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        s1 = _mm512_add_pd(s1, _mm512_cvtps_pd(_mm512_extractf32x8_ps(e, 1)));
    }
    if (i < n) {
        const __mmask16 m = tail_mask(n - i);
        const __m512 e = _mm512_maskz_mov_ps(m, exp512(_mm512_sub_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), sc), maxv)));
        _mm512_mask_storeu_ps(x + i, m, e);
        s0 = _mm512_add_pd(s0, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        s1 = _mm512_add_pd(s1, _mm512_cvtps_pd(_mm512_extractf32x8_ps(e, 1)));
    }
    const __m512 inv = _mm512_set1_ps((float)(1.0 / _mm512_reduce_add_pd(_mm512_add_pd(s0, s1))));
    for (i = 0; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), inv));
    if (i < n) {
        const __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), inv));
    }
}

/* Q queries (constant after inlining): y[q] += a[q][r] * x_r, r in order,
 * laid out as quants_avx512.c's axpy_rows_512 (64 lanes, then 16 masked). */
static inline AI T5 void axpy_rows_q(int f16, int Q, float *const *y, const float *const *a, const void *x,
                                     size_t ldx, int rows, int64_t n) {
    const size_t es = f16 ? 2 : 4;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m512 acc[4][4];
        UNROLL for (int q = 0; q < Q; q++) UNROLL for (int j = 0; j < 4; j++) acc[q][j] = _mm512_loadu_ps(y[q] + i + 16 * j);
        for (int r = 0; r < rows; r++) {
            const uint8_t *xr = (const uint8_t *)x + (size_t)r * ldx * es;
            const __m512 x0 = ld_f(f16, xr, i), x1 = ld_f(f16, xr, i + 16);
            const __m512 x2 = ld_f(f16, xr, i + 32), x3 = ld_f(f16, xr, i + 48);
            UNROLL for (int q = 0; q < Q; q++) {
                const __m512 va = _mm512_set1_ps(a[q][r]);
                acc[q][0] = _mm512_fmadd_ps(va, x0, acc[q][0]);
                acc[q][1] = _mm512_fmadd_ps(va, x1, acc[q][1]);
                acc[q][2] = _mm512_fmadd_ps(va, x2, acc[q][2]);
                acc[q][3] = _mm512_fmadd_ps(va, x3, acc[q][3]);
            }
        }
        UNROLL for (int q = 0; q < Q; q++) UNROLL for (int j = 0; j < 4; j++) _mm512_storeu_ps(y[q] + i + 16 * j, acc[q][j]);
    }
    for (; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : tail_mask(n - i);
        __m512 acc[4];
        UNROLL for (int q = 0; q < Q; q++) acc[q] = _mm512_maskz_loadu_ps(m, y[q] + i);
        for (int r = 0; r < rows; r++) {
            const __m512 xv = ld_f_tail(f16, m, (const uint8_t *)x + (size_t)r * ldx * es, i);
            UNROLL for (int q = 0; q < Q; q++) acc[q] = _mm512_fmadd_ps(_mm512_set1_ps(a[q][r]), xv, acc[q]);
        }
        UNROLL for (int q = 0; q < Q; q++) _mm512_mask_storeu_ps(y[q] + i, m, acc[q]);
    }
}

static inline AI T5 void axpy_rows_multi(int f16, int nq, float *const *y, const float *const *a, const void *x,
                                         size_t ldx, int rows, int64_t n) {
    for (; nq >= 4; nq -= 4, y += 4, a += 4) axpy_rows_q(f16, 4, y, a, x, ldx, rows, n);
    if (nq == 3) axpy_rows_q(f16, 3, y, a, x, ldx, rows, n);
    if (nq == 2) axpy_rows_q(f16, 2, y, a, x, ldx, rows, n);
    if (nq == 1) axpy_rows_q(f16, 1, y, a, x, ldx, rows, n);
}

static T5 void axpy_rows_multi_512(int nq, float *const *y, const float *const *a, const float *x, size_t ldx,
                                   int rows, int64_t n) {
    axpy_rows_multi(0, nq, y, a, x, ldx, rows, n);
}

static T5 void axpy_rows_multi_f16_512(int nq, float *const *y, const float *const *a, const uint16_t *x, size_t ldx,
                                       int rows, int64_t n) {
    axpy_rows_multi(1, nq, y, a, x, ldx, rows, n);
}

/* Scores, in this level's own order (not tl_dot_f32's: one chain per lane
 * is fewer operations per score in both forms below): lane j of a
 * 16-lane accumulator sums the products of elements j, j+16, j+32, ... as
 * one FMA chain (the first a multiply; a tail of n % 16 is one more
 * masked step that leaves the other lanes as they are), then the 16 lanes
 * add in hsum512's tree (quants_avx512.c): ((v_i + v_i+8) + (v_i+4 +
 * v_i+12)) per i < 4, then (i=0 + i=2) + (i=1 + i=3); the sum is then
 * multiplied by the scale. tl_attn_score_ref (dispatch.c) writes it out
 * element by element. */
static inline AI T5 __m512 score_vec(int f16, const float *a, const void *b, int64_t n) {
    if (n < 16) {
        const __mmask16 m = tail_mask(n);
        return _mm512_mul_ps(_mm512_maskz_loadu_ps(m, a), ld_f_tail(f16, m, b, 0));
    }
    __m512 s = _mm512_mul_ps(_mm512_loadu_ps(a), ld_f(f16, b, 0));
    int64_t i = 16;
    for (; i + 16 <= n; i += 16) s = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), ld_f(f16, b, i), s);
    if (i < n) {
        const __mmask16 m = tail_mask(n - i);
        s = _mm512_mask3_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), ld_f_tail(f16, m, b, i), s, m);
    }
    return s;
}

/* Row form (a decoding query, or rows no panel kernel takes): 16 rows at a
 * time, each row's lanes by score_vec, then the 16 horizontal sums as one
 * transposing tree with hsum512's pairing in every lane: lane r ends as
 * row r's sum. A full group of 64, 128 or 256 elements is compiled for its
 * width (the rows and their steps unrolled, the 16 lane sums kept in
 * registers). */
static inline AI T5 void rows_group(int f16, const float *q, const uint8_t *k, size_t ldk_bytes, int nr, int64_t n,
                                    float scale, float *out) {
    __m512 v[16];
    UNROLL16 for (int i = 0; i < 16; i++) v[i] = i < nr ? score_vec(f16, q, k + (size_t)i * ldk_bytes, n) : _mm512_setzero_ps();
    _mm512_mask_storeu_ps(out, tail_mask(nr), _mm512_mul_ps(fold16(v, 0), _mm512_set1_ps(scale)));
}

static inline AI T5 void dot_rows(int f16, const float *q, const void *k, size_t ldk, int rows, int64_t n, float scale,
                                  float *out) {
    const size_t ldb = ldk * (f16 ? 2 : 4);
    for (int r0 = 0; r0 < rows; r0 += 16) {
        const int nr = rows - r0 < 16 ? rows - r0 : 16;
        const uint8_t *kr = (const uint8_t *)k + (size_t)r0 * ldb;
        if (nr == 16 && n == 64)
            rows_group(f16, q, kr, ldb, 16, 64, scale, out + r0);
        else if (nr == 16 && n == 128)
            rows_group(f16, q, kr, ldb, 16, 128, scale, out + r0);
        else if (nr == 16 && n == 256)
            rows_group(f16, q, kr, ldb, 16, 256, scale, out + r0);
        else
            rows_group(f16, q, kr, ldb, nr, n, scale, out + r0);
    }
}

static T5 void dot_rows_512(const float *q, const float *k, size_t ldk, int rows, int64_t n, float scale, float *out) {
    dot_rows(0, q, k, ldk, rows, n, scale, out);
}

static T5 void dot_rows_f16_512(const float *q, const uint16_t *k, size_t ldk, int rows, int64_t n, float scale,
                                float *out) {
    dot_rows(1, q, k, ldk, rows, n, scale, out);
}

/* Panel form (prefill: a chunk of queries against one K block). The rows
 * go 16 to a panel, transposed once per block so that element d of the
 * panel's rows is one vector (lane i = row 16p + i; rows past the last are
 * zero): kp[p * 16 * n + d * 16 + i]. A query's 16 lane chains are then
 * computed for all 16 rows at once, chain j over the vectors d = j, j+16,
 * ... times q[d] broadcast, and folded with hsum512's pairing as whole
 * vectors: pair(i) = chain i + chain i+8, quad(i) = pair(i) + pair(i+4),
 * half(i) = quad(i) + quad(i+2), sum = half(0) + half(1). Each score is
 * therefore bitwise the row form's (products, FMAs and adds commute), with
 * one FMA per 16 products, no horizontal step, and 4 queries sharing each
 * panel load. n is a multiple of 16 (tl_attn_has_panels). */
static inline AI T5 void transpose16(__m512 r[16]) {
    __m512 t[16];
    UNROLL16 for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    /* r[4i + e], 128-bit lane L: element 4L + e of rows 4i..4i+3 */
    UNROLL for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
        r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
    }
    __m512 o[16];
    UNROLL for (int e = 0; e < 4; e++) {
        const __m512 a = _mm512_shuffle_f32x4(r[e], r[4 + e], 0x88), b = _mm512_shuffle_f32x4(r[e], r[4 + e], 0xDD);
        const __m512 c = _mm512_shuffle_f32x4(r[8 + e], r[12 + e], 0x88), d = _mm512_shuffle_f32x4(r[8 + e], r[12 + e], 0xDD);
        o[e] = _mm512_shuffle_f32x4(a, c, 0x88);
        o[8 + e] = _mm512_shuffle_f32x4(a, c, 0xDD);
        o[4 + e] = _mm512_shuffle_f32x4(b, d, 0x88);
        o[12 + e] = _mm512_shuffle_f32x4(b, d, 0xDD);
    }
    UNROLL16 for (int i = 0; i < 16; i++) r[i] = o[i];
}

static inline AI T5 void k_panels(int f16, const void *k, size_t ldk, int rows, int64_t n, float *kp) {
    const size_t ldb = ldk * (f16 ? 2 : 4);
    for (int p = 0; 16 * p < rows; p++) {
        const int nr = rows - 16 * p < 16 ? rows - 16 * p : 16;
        const uint8_t *kr = (const uint8_t *)k + (size_t)(16 * p) * ldb;
        float *dst = kp + (size_t)p * 16 * n;
        for (int64_t c = 0; c < n; c += 16) {
            __m512 r[16];
            UNROLL16 for (int i = 0; i < 16; i++) r[i] = i < nr ? ld_f(f16, kr + (size_t)i * ldb, c) : _mm512_setzero_ps();
            transpose16(r);
            UNROLL16 for (int d = 0; d < 16; d++) _mm512_storeu_ps(dst + (size_t)(c + d) * 16, r[d]);
        }
    }
}

static T5 void k_panels_f32_512(const float *k, size_t ldk, int rows, int64_t n, float *kp) { k_panels(0, k, ldk, rows, n, kp); }
static T5 void k_panels_f16_512(const uint16_t *k, size_t ldk, int rows, int64_t n, float *kp) {
    k_panels(1, k, ldk, rows, n, kp);
}

/* Chain j of Q queries over one panel (ns = n / 16 steps). */
static inline AI T5 void chain(int Q, const float *const *q, const float *kp, int64_t ns, int j, __m512 *acc) {
    const float *kj = kp + (size_t)j * 16;
    __m512 kv = _mm512_loadu_ps(kj);
    UNROLL for (int i = 0; i < Q; i++) acc[i] = _mm512_mul_ps(_mm512_set1_ps(q[i][j]), kv);
    for (int64_t s = 1; s < ns; s++) {
        kv = _mm512_loadu_ps(kj + (size_t)s * 256);
        UNROLL for (int i = 0; i < Q; i++) acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(q[i][j + 16 * s]), kv, acc[i]);
    }
}

#define FOLD(NAME, SUB, STRIDE)                                                                                     \
    static inline AI T5 void NAME(int Q, const float *const *q, const float *kp, int64_t ns, int i, __m512 *out) { \
        __m512 b[4];                                                                                                \
        SUB(Q, q, kp, ns, i, out);                                                                                  \
        SUB(Q, q, kp, ns, i + STRIDE, b);                                                                           \
        UNROLL for (int x = 0; x < Q; x++) out[x] = _mm512_add_ps(out[x], b[x]);                                    \
    }
FOLD(pair, chain, 8)
FOLD(quad, pair, 4)
FOLD(half, quad, 2)
#undef FOLD

static inline AI T5 void panel_q(int Q, const float *const *q, const float *kp, int64_t ns, float scale,
                                 float *const *out, int o, __mmask16 m) {
    __m512 s[4], h[4];
    half(Q, q, kp, ns, 0, s);
    half(Q, q, kp, ns, 1, h);
    const __m512 sc = _mm512_set1_ps(scale);
    UNROLL for (int i = 0; i < Q; i++) _mm512_mask_storeu_ps(out[i] + o, m, _mm512_mul_ps(_mm512_add_ps(s[i], h[i]), sc));
}

static inline AI T5 void panels_n(int nq, const float *const *q, const float *kp, int rows, int64_t n, float scale,
                                  float *const *out) {
    const int64_t ns = n / 16;
    for (int p = 0; 16 * p < rows; p++) {
        const __mmask16 m = rows - 16 * p >= 16 ? (__mmask16)0xFFFF : tail_mask(rows - 16 * p);
        const float *kpp = kp + (size_t)p * 16 * n;
        int i = 0;
        for (; i + 4 <= nq; i += 4) panel_q(4, q + i, kpp, ns, scale, out + i, 16 * p, m);
        if (nq - i == 3) panel_q(3, q + i, kpp, ns, scale, out + i, 16 * p, m);
        if (nq - i == 2) panel_q(2, q + i, kpp, ns, scale, out + i, 16 * p, m);
        if (nq - i == 1) panel_q(1, q + i, kpp, ns, scale, out + i, 16 * p, m);
    }
}

static T5 void scores_panels_512(int nq, const float *const *q, const float *kp, int rows, int64_t n, float scale,
                                 float *const *out) {
    if (n == 64) panels_n(nq, q, kp, rows, 64, scale, out);
    else if (n == 128) panels_n(nq, q, kp, rows, 128, scale, out);
    else if (n == 256) panels_n(nq, q, kp, rows, 256, scale, out);
    else panels_n(nq, q, kp, rows, n, scale, out);
}

/* Int8 V sums (tl_attn_v8_prep / tl_attn_v8_sum, quants.h). The prep
 * transposes each quad of rows with byte then word interleaves (per
 * 128-bit lane: dims 0-3 | 16-19, 4-7 | 20-23, ...), and two lane
 * shuffles put dims 0-15 and 16-31 in order; a query's weights, quantized
 * in one vector, then go 4 rows at a time into 16 lanes of vpdpbusd. */
#define TV __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c")))

static TV void attn_v8_prep_vnni(const uint8_t *v, size_t rb, int rows, int hd, void *vp) {
    uint8_t *p = vp;
    for (int g = 0; g < hd / 32; g++, p += TL_V8_GROUP_BYTES) {
        const uint8_t *vg = v + (size_t)g * sizeof(block_q8_0);
        uint16_t dh[16] = {0};
        for (int r = 0; r < rows; r++) memcpy(&dh[r], vg + (size_t)r * rb, 2);
        _mm512_storeu_ps(p, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)dh)));
        for (int k = 0; k < 4; k++) {
            __m256i x[4];
            UNROLL for (int j = 0; j < 4; j++)
                x[j] = 4 * k + j < rows ? _mm256_loadu_si256((const __m256i *)(const void *)(vg + (size_t)(4 * k + j) * rb + 2))
                                        : _mm256_setzero_si256();
            const __m256i lo01 = _mm256_unpacklo_epi8(x[0], x[1]), hi01 = _mm256_unpackhi_epi8(x[0], x[1]);
            const __m256i lo23 = _mm256_unpacklo_epi8(x[2], x[3]), hi23 = _mm256_unpackhi_epi8(x[2], x[3]);
            const __m512i A = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_unpacklo_epi16(lo01, lo23)),
                                                 _mm256_unpackhi_epi16(lo01, lo23), 1);
            const __m512i B = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_unpacklo_epi16(hi01, hi23)),
                                                 _mm256_unpackhi_epi16(hi01, hi23), 1);
            _mm512_storeu_si512(p + 64 + k * 128, _mm512_shuffle_i64x2(A, B, _MM_SHUFFLE(2, 0, 2, 0)));
            _mm512_storeu_si512(p + 64 + k * 128 + 64, _mm512_shuffle_i64x2(A, B, _MM_SHUFFLE(3, 1, 3, 1)));
        }
    }
}

static TV void attn_v8_sum_vnni(int nq, float *const *y, const float *const *a, const void *vp, int r0, int r1, int hd) {
    const __mmask16 rm = (__mmask16)(((1u << r1) - 1) & ~((1u << r0) - 1));
    const __m512 zero = _mm512_setzero_ps(), top = _mm512_set1_ps(255.0f);
    for (int g = 0; g < hd / 32; g++) {
        const uint8_t *p = (const uint8_t *)vp + (size_t)g * TL_V8_GROUP_BYTES;
        const __m512 sc = _mm512_loadu_ps(p);
        __m512i t[8];
        UNROLL for (int i = 0; i < 8; i++) t[i] = _mm512_loadu_si512(p + 64 + 64 * i);
        for (int q0 = 0; q0 < nq; q0 += 16) {
            const int n = nq - q0 < 16 ? nq - q0 : 16;
            __m512 w[16];
            float m[16], inv[16], ds[16];
            UNROLL16 for (int i = 0; i < 16; i++)
                w[i] = i < n ? _mm512_max_ps(_mm512_maskz_mul_ps(rm, _mm512_maskz_loadu_ps(rm, a[q0 + i]), sc), zero) : zero;
            if (n < 4) { /* a decoding token: the tree would be mostly padding */
                for (int i = 0; i < n; i++) {
                    m[i] = _mm512_reduce_max_ps(w[i]);
                    inv[i] = 255.0f / m[i], ds[i] = m[i] / 255.0f;
                }
            } else {
                const __m512 mv = fold16(w, 1); /* (max is exact in any order) */
                _mm512_storeu_ps(m, mv);
                _mm512_storeu_ps(inv, _mm512_div_ps(top, mv));
                _mm512_storeu_ps(ds, _mm512_div_ps(mv, top));
            }
            /* the u8 weights, 4 rows to a dword, broadcast from memory
             * below (load ports, not shuffles) */
            int32_t u[16][4];
            for (int i = 0; i < n; i++) {
                const __m512 f = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(w[i], _mm512_set1_ps(inv[i])), zero), top);
                _mm_storeu_si128((__m128i *)(void *)u[i], _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(f)));
            }
            for (int i = 0; i < n; i++) {
                if (!(m[i] > 0.0f)) continue;
                const __m512i b0 = _mm512_set1_epi32(u[i][0]), b1 = _mm512_set1_epi32(u[i][1]);
                const __m512i b2 = _mm512_set1_epi32(u[i][2]), b3 = _mm512_set1_epi32(u[i][3]);
                const __m512i z = _mm512_setzero_si512();
                /* two chains per half, added at the end (integers: exact) */
                const __m512i acc0 = _mm512_add_epi32(_mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, b0, t[0]), b1, t[2]),
                                                      _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, b2, t[4]), b3, t[6]));
                const __m512i acc1 = _mm512_add_epi32(_mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, b0, t[1]), b1, t[3]),
                                                      _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, b2, t[5]), b3, t[7]));
                const __m512 d = _mm512_set1_ps(ds[i]);
                float *o = y[q0 + i] + g * 32;
                _mm512_storeu_ps(o, _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc0), d, _mm512_loadu_ps(o)));
                _mm512_storeu_ps(o + 16, _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc1), d, _mm512_loadu_ps(o + 16)));
            }
        }
    }
}

void tl_attn_fill_avx512(tl_kernel_table *t, int vnni) {
    t->softmax_f32 = softmax_512;
    t->dot_rows_f32 = dot_rows_512;
    t->dot_rows_f16 = dot_rows_f16_512;
    t->k_panels_f32 = k_panels_f32_512;
    t->k_panels_f16 = k_panels_f16_512;
    t->scores_panels = scores_panels_512;
    t->axpy_rows_multi_f32 = axpy_rows_multi_512;
    t->axpy_rows_multi_f16 = axpy_rows_multi_f16_512;
    if (vnni) {
        t->attn_v8_prep = attn_v8_prep_vnni;
        t->attn_v8_sum = attn_v8_sum_vnni;
    }
}

#else
void tl_attn_fill_avx512(tl_kernel_table *t, int vnni) { (void)t; (void)vnni; }
#endif
