/* attn_avx2.c - prefill attention scores through K panels at the AVX2
 * level (tl_attn_k_panels_* / tl_attn_scores_panels, quants.h), bitwise
 * the level's dot_rows_f32 (quants_avx2.c: dot_f32_inl per row, times the
 * scale).
 *
 * That row form keeps four 8-lane accumulators: s_j lane L chains the
 * products of elements 32t + 8j + L (t = 0, 1, ...; a multiply-add from
 * zero first), s_0 then also those of the 8-element tail 32T + 8u + L;
 * then v = (s0 + s1) + (s2 + s3) and hsum256's tree, ((v0 + v4) + (v2 +
 * v6)) + ((v1 + v5) + (v3 + v7)). Each score took a horizontal sum, and
 * the query and key rows were both loaded per multiply-add: at 4,096
 * tokens of a 110M f16-cache prefill the scores were a third of the time,
 * four times the FMA bound. Here 16 K rows are transposed once per block
 * and chunk into a panel (kp[p * 16 * n + d * 16 + i]: element d of row
 * 16p + i, rows past the last zero) and every chain above is computed for
 * 16 rows at once as whole vectors, q[d] broadcast, two queries sharing
 * each panel load; the folds are the same adds in the same pairing, as
 * vectors. Products, FMAs and adds commute, so every cell is bitwise the
 * row form's. */
#include "quants_impl.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define T2 __attribute__((target("avx2,fma,f16c")))
#define AI __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 8")

/* r[i] = elements c..c+7 of row i -> r[d] = element c + d of rows 0..7. */
static inline AI T2 void transpose8(__m256 r[8]) {
    __m256 t[8], u[8];
    UNROLL for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);     /* i.0 i+1.0 i.1 i+1.1 | .4 .5 */
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]); /* .2 .3 | .6 .7 */
    }
    UNROLL for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);         /* rows i..i+3 of element 0 | 4 */
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);     /* 1 | 5 */
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44); /* 2 | 6 */
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE); /* 3 | 7 */
    }
    UNROLL for (int d = 0; d < 4; d++) {
        r[d] = _mm256_permute2f128_ps(u[d], u[d + 4], 0x20);
        r[d + 4] = _mm256_permute2f128_ps(u[d], u[d + 4], 0x31);
    }
}

static inline AI T2 __m256 ld8(int f16, const uint8_t *row, int64_t c) {
    return f16 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(row + 2 * c)))
               : _mm256_loadu_ps((const float *)(const void *)row + c);
}

static inline AI T2 void k_panels(int f16, const void *k, size_t ldk, int rows, int64_t n, float *kp) {
    const size_t ldb = ldk * (f16 ? 2 : 4);
    for (int p = 0; 16 * p < rows; p++) {
        const int nr = rows - 16 * p < 16 ? rows - 16 * p : 16;
        const uint8_t *kr = (const uint8_t *)k + (size_t)(16 * p) * ldb;
        float *dst = kp + (size_t)p * 16 * n;
        for (int64_t c = 0; c < n; c += 8)
            for (int h = 0; h < 2; h++) {
                __m256 r[8];
                UNROLL for (int i = 0; i < 8; i++) {
                    const int row = 8 * h + i;
                    r[i] = row < nr ? ld8(f16, kr + (size_t)row * ldb, c) : _mm256_setzero_ps();
                }
                transpose8(r);
                UNROLL for (int d = 0; d < 8; d++) _mm256_storeu_ps(dst + (size_t)(c + d) * 16 + 8 * h, r[d]);
            }
    }
}

static T2 void k_panels_f32_avx2(const float *k, size_t ldk, int rows, int64_t n, float *kp) {
    k_panels(0, k, ldk, rows, n, kp);
}
static T2 void k_panels_f16_avx2(const uint16_t *k, size_t ldk, int rows, int64_t n, float *kp) {
    k_panels(1, k, ldk, rows, n, kp);
}

/* Q queries' (Q <= 2) chain j of lane L over H halves of a panel (H = 1:
 * rows 0..7 only), into acc[query][half]. */
static inline AI T2 void chain(int Q, int H, const float *const *q, const float *kp, int64_t n, int j, int L,
                               __m256 acc[2][2]) {
    UNROLL for (int i = 0; i < Q; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    const int64_t T = n / 32, U = j == 0 ? n % 32 / 8 : 0;
    for (int64_t s = 0; s < T + U; s++) {
        const int64_t d = s < T ? 32 * s + 8 * j + L : 32 * T + 8 * (s - T) + L;
        const float *kd = kp + (size_t)d * 16;
        __m256 k0 = _mm256_loadu_ps(kd), k1 = H == 2 ? _mm256_loadu_ps(kd + 8) : k0;
        /* in registers: GCC folded each load into both queries' FMAs,
         * six loads a step where four do (scores 2.6-2.7 -> 2.2-2.3 ns a
         * query-key in the micro-bench) */
        __asm__("" : "+x"(k0), "+x"(k1));
        UNROLL for (int i = 0; i < Q; i++) {
            const __m256 b = _mm256_broadcast_ss(q[i] + d);
            acc[i][0] = _mm256_fmadd_ps(b, k0, acc[i][0]);
            if (H == 2) acc[i][1] = _mm256_fmadd_ps(b, k1, acc[i][1]);
        }
    }
}

static inline AI T2 void add_into(int Q, int H, __m256 a[2][2], __m256 b[2][2]) {
    UNROLL for (int i = 0; i < Q; i++)
        for (int h = 0; h < H; h++) a[i][h] = _mm256_add_ps(a[i][h], b[i][h]);
}

/* Scores of Q queries against one panel's first 8 * H rows, of which the
 * first nr (<= 16) are stored at out[i] + o. */
static inline AI T2 void panel_q(int Q, int H, const float *const *q, const float *kp, int64_t n, float scale,
                                 float *const *out, int o, int nr) {
    /* v_L = (s0 + s1) + (s2 + s3), lane L, into memory: the tree over L
     * below reads them back rather than hold them in registers */
    __m256 v[8][2][2];
    UNROLL for (int L = 0; L < 8; L++) {
        __m256 a[2][2], b[2][2];
        chain(Q, H, q, kp, n, 0, L, a);
        chain(Q, H, q, kp, n, 1, L, b);
        add_into(Q, H, a, b);
        __m256 c[2][2];
        chain(Q, H, q, kp, n, 2, L, c);
        chain(Q, H, q, kp, n, 3, L, b);
        add_into(Q, H, c, b);
        add_into(Q, H, a, c);
        UNROLL for (int i = 0; i < Q; i++)
            for (int h = 0; h < H; h++) v[L][i][h] = a[i][h];
    }
    TL_IN_MEMORY(v);
    const __m256 sc = _mm256_set1_ps(scale);
    UNROLL for (int i = 0; i < Q; i++) {
        float cell[16];
        for (int h = 0; h < H; h++) {
            const __m256 e = _mm256_add_ps(_mm256_add_ps(v[0][i][h], v[4][i][h]), _mm256_add_ps(v[2][i][h], v[6][i][h]));
            const __m256 f = _mm256_add_ps(_mm256_add_ps(v[1][i][h], v[5][i][h]), _mm256_add_ps(v[3][i][h], v[7][i][h]));
            const __m256 s = _mm256_add_ps(e, f);
            _mm256_storeu_ps(cell + 8 * h, _mm256_mul_ps(s, sc));
        }
        if (nr == 16) {
            _mm256_storeu_ps(out[i] + o, _mm256_loadu_ps(cell));
            _mm256_storeu_ps(out[i] + o + 8, _mm256_loadu_ps(cell + 8));
        } else {
            memcpy(out[i] + o, cell, sizeof(float) * (size_t)nr);
        }
    }
}

static inline AI T2 void panels_n(int nq, const float *const *q, const float *kp, int rows, int64_t n, float scale,
                                  float *const *out) {
    for (int p = 0; 16 * p < rows; p++) {
        const int nr = rows - 16 * p < 16 ? rows - 16 * p : 16;
        const float *kpp = kp + (size_t)p * 16 * n;
        int i = 0;
        if (nr > 8) {
            for (; i + 2 <= nq; i += 2) panel_q(2, 2, q + i, kpp, n, scale, out + i, 16 * p, nr);
            if (i < nq) panel_q(1, 2, q + i, kpp, n, scale, out + i, 16 * p, nr);
        } else {
            for (; i + 2 <= nq; i += 2) panel_q(2, 1, q + i, kpp, n, scale, out + i, 16 * p, nr);
            if (i < nq) panel_q(1, 1, q + i, kpp, n, scale, out + i, 16 * p, nr);
        }
    }
}

static T2 void scores_panels_avx2(int nq, const float *const *q, const float *kp, int rows, int64_t n, float scale,
                                  float *const *out) {
    if (n == 64) panels_n(nq, q, kp, rows, 64, scale, out);
    else if (n == 128) panels_n(nq, q, kp, rows, 128, scale, out);
    else panels_n(nq, q, kp, rows, n, scale, out);
}

void tl_attn_fill_avx2(tl_kernel_table *t) {
    t->k_panels_f32 = k_panels_f32_avx2;
    t->k_panels_f16 = k_panels_f16_avx2;
    t->scores_panels = scores_panels_avx2;
}

#else
void tl_attn_fill_avx2(tl_kernel_table *t) { (void)t; }
#endif
