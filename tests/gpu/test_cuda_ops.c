/* test_cuda_ops.c - every CUDA launcher against a CPU reference, by
 * normalized error (NMSE = sum (gpu - ref)^2 / sum ref^2, as llama.cpp's
 * test-backend-ops), at odd sizes and every weight type. Without a CUDA
 * device it prints "SKIP: no CUDA device" and an empty summary.
 *   test_cuda_ops           the parity tests
 *   test_cuda_ops --bench   also a few kernel timings (bandwidth vs H200 peak) */
#include <stdint.h>
#include <time.h>

#include "gpu_test.h"
#include "kv_layout.h"
#include "kv_mode.h"
#include "quants.h"

static tl_cuda *ctx;

/* Tolerances (NMSE). */
#define TOL_EXACT 1e-12  /* same arithmetic up to fma contraction / rounding order */
#define TOL_F32 1e-9     /* f32 accumulation in a different order */
#define TOL_GEMM16 2e-5  /* weights and activations rounded to f16 for cuBLAS */
#define TOL_ENGINE 5e-3  /* vs the CPU engine's dot (activations quantized to Q8) */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static float frand(void) { return gpu_frand(&rng_state); }
static void fill(float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = frand() * scale;
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    return p;
}

/* Device copy of a host buffer (NULL after a failure, which is a CHECK). */
static void *dev_put(const void *src, size_t bytes) {
    void *d = NULL;
    int rc = tl_cuda_alloc(ctx, bytes, &d);
    if (rc == TL_CUDA_OK && src) rc = tl_cuda_upload(ctx, d, src, bytes);
    CHECK(rc == TL_CUDA_OK, "device buffer of %zu bytes: %s", bytes, tl_cuda_last_error());
    return rc == TL_CUDA_OK ? d : NULL;
}
static int dev_get(void *dst, const void *src, size_t bytes) {
    int rc = tl_cuda_download(ctx, dst, src, bytes);
    CHECK(rc == TL_CUDA_OK, "download: %s", tl_cuda_last_error());
    return rc;
}

static const int weight_types[] = {TL_TYPE_F32, TL_TYPE_F16, TL_TYPE_BF16, TL_TYPE_Q8_0, TL_TYPE_Q4_0,
                                   TL_TYPE_Q4_1, TL_TYPE_Q5_0, TL_TYPE_Q4_K, TL_TYPE_Q5_K, TL_TYPE_Q6_K};
#define N_WTYPES (int)(sizeof weight_types / sizeof weight_types[0])

/* An odd row length valid for the type: 133, 7 blocks of 32, 3 of 256. */
static int odd_n_in(int type) {
    int bs = tl_type_info(type)->block_size;
    return bs == 1 ? 133 : bs == 32 ? 224 : 768;
}

/* W (rows, n) quantized from random values; also its dequantized f32. */
static void *make_weights(int type, int rows, int n, float *deq) {
    size_t rb = tl_row_size(type, n);
    uint8_t *w = xmalloc(rb * rows);
    float *tmp = xmalloc(sizeof(float) * n);
    for (int r = 0; r < rows; r++) {
        fill(tmp, n, 1.0f);
        tl_quantize_row(type, tmp, w + rb * r, n);
        tl_dequantize_row(type, w + rb * r, deq + (size_t)r * n, n);
    }
    free(tmp);
    return w;
}

/* ---- weights ----------------------------------------------------------------- */

static void test_dequantize_and_get_rows(void) {
    for (int k = 0; k < N_WTYPES; k++) {
        int type = weight_types[k], n = odd_n_in(type), rows = 13;
        const char *name = tl_type_info(type)->name;
        float *ref = xmalloc(sizeof(float) * rows * n), *got = xmalloc(sizeof(float) * rows * n);
        void *w = make_weights(type, rows, n, ref);
        void *dw = dev_put(w, tl_row_size(type, n) * rows);
        float *dout = dev_put(NULL, sizeof(float) * rows * n);
        int rc = dw && dout ? tl_cuda_dequantize(ctx, dout, dw, type, rows, n) : -1;
        CHECK(rc == TL_CUDA_OK, "%s: dequantize runs: %s", name, tl_cuda_last_error());
        if (rc == TL_CUDA_OK && dev_get(got, dout, sizeof(float) * rows * n) == TL_CUDA_OK) {
            double e = test_nmse(got, ref, (size_t)rows * n);
            CHECK(e < TOL_EXACT, "%s: dequantize matches tl_dequantize_row (nmse %.3g)", name, e);
        }
        /* Embedding gather, with ids out of range giving zero rows. */
        int32_t ids[6] = {12, 0, -1, 5, 13, 5};
        int32_t *dids = dev_put(ids, sizeof ids);
        rc = dw && dout && dids ? tl_cuda_get_rows(ctx, dout, dw, type, n, rows, dids, 6) : -1;
        CHECK(rc == TL_CUDA_OK, "%s: get_rows runs: %s", name, tl_cuda_last_error());
        if (rc == TL_CUDA_OK && dev_get(got, dout, sizeof(float) * 6 * n) == TL_CUDA_OK) {
            float *exp = xmalloc(sizeof(float) * 6 * n);
            for (int i = 0; i < 6; i++)
                for (int j = 0; j < n; j++)
                    exp[(size_t)i * n + j] = ids[i] >= 0 && ids[i] < rows ? ref[(size_t)ids[i] * n + j] : 0.0f;
            double e = test_nmse(got, exp, (size_t)6 * n);
            CHECK(e < TOL_EXACT, "%s: get_rows gathers the rows, zeros out of range (nmse %.3g)", name, e);
            free(exp);
        }
        tl_cuda_dealloc(ctx, dids);
        tl_cuda_dealloc(ctx, dw);
        tl_cuda_dealloc(ctx, dout);
        free(w);
        free(ref);
        free(got);
    }
}

static void test_matmul(void) {
    const int n_out = 67, Ts[] = {1, 3, 8, 11, 37};
    for (int k = 0; k < N_WTYPES; k++) {
        int type = weight_types[k], n_in = odd_n_in(type);
        const char *name = tl_type_info(type)->name;
        size_t rb = tl_row_size(type, n_in);
        float *deq = xmalloc(sizeof(float) * n_out * n_in);
        void *w = make_weights(type, n_out, n_in, deq);
        void *dw = dev_put(w, rb * n_out);
        int vdt = tl_type_info(type)->vec_dot_type;
        uint8_t *xq = xmalloc(tl_row_size(vdt, n_in) + 64);
        for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
            int T = Ts[ti];
            float *x = xmalloc(sizeof(float) * T * n_in), *ref = xmalloc(sizeof(float) * T * n_out);
            float *eng = xmalloc(sizeof(float) * T * n_out), *got = xmalloc(sizeof(float) * T * n_out);
            fill(x, (size_t)T * n_in, 1.0f);
            for (int t = 0; t < T; t++) {
                tl_quantize_row(vdt, x + (size_t)t * n_in, xq, n_in);
                for (int r = 0; r < n_out; r++) {
                    double s = 0;
                    for (int i = 0; i < n_in; i++) s += (double)deq[(size_t)r * n_in + i] * x[(size_t)t * n_in + i];
                    ref[(size_t)t * n_out + r] = (float)s;
                    tl_vec_dot_ref(type)(n_in, &eng[(size_t)t * n_out + r], (const uint8_t *)w + rb * r, xq);
                }
            }
            float *dx = dev_put(x, sizeof(float) * T * n_in), *dout = dev_put(NULL, sizeof(float) * T * n_out);
            for (int path = TL_CUDA_MM_DIRECT; path <= TL_CUDA_MM_GEMM; path++) {
                const char *pn = path == TL_CUDA_MM_GEMM ? "gemm" : "direct";
                int rc = dw && dx && dout ? tl_cuda_matmul_path(ctx, dout, dx, dw, type, n_in, n_out, T, path) : -1;
                CHECK(rc == TL_CUDA_OK, "%s %s T=%d: matmul runs: %s", name, pn, T, tl_cuda_last_error());
                if (rc != TL_CUDA_OK || dev_get(got, dout, sizeof(float) * T * n_out) != TL_CUDA_OK) continue;
                double tol = path == TL_CUDA_MM_DIRECT || type == TL_TYPE_F32 ? TOL_F32 : TOL_GEMM16;
                double e = test_nmse(got, ref, (size_t)T * n_out), e2 = test_nmse(got, eng, (size_t)T * n_out);
                CHECK(e < tol, "%s %s T=%d n_in=%d n_out=%d: matmul matches the f32 reference (nmse %.3g, tol %.0e)",
                      name, pn, T, n_in, n_out, e, tol);
                CHECK(e2 < TOL_ENGINE, "%s %s T=%d: matmul agrees with tl_vec_dot_ref (nmse %.3g, tol %.0e)", name,
                      pn, T, e2, TOL_ENGINE);
            }
            int rc = dw && dx && dout ? tl_cuda_matmul(ctx, dout, dx, dw, type, n_in, n_out, T) : -1;
            CHECK(rc == TL_CUDA_OK, "%s auto T=%d: matmul runs: %s", name, T, tl_cuda_last_error());
            tl_cuda_dealloc(ctx, dx);
            tl_cuda_dealloc(ctx, dout);
            free(x);
            free(ref);
            free(eng);
            free(got);
        }
        int rc = tl_cuda_matmul(ctx, (float *)dw, (const float *)dw, dw, type, n_in + (tl_type_info(type)->block_size == 1 ? -134 : 1),
                                n_out, 1);
        CHECK(rc == TL_CUDA_ERR_ARG, "%s: a row length the type cannot hold is rejected (rc %d)", name, rc);
        tl_cuda_dealloc(ctx, dw);
        free(xq);
        free(w);
        free(deq);
    }
}

/* The GEMM path converts activations to f16 (max 65504): rows far beyond
 * that (some models' FFN activations) must not overflow, rows in range
 * must be unaffected by their neighbours, and an inf must stay visible. */
static void test_gemm_range(void) {
    const int n_in = 256, n_out = 67, T = 11, type = TL_TYPE_Q8_0;
    const float row_scale[11] = {1e6f, 1, 1, 4e4f, 1, 1, 3e5f, 1, 1, 1, 2.5e9f};
    const size_t rb = tl_row_size(type, n_in);
    float *deq = xmalloc(sizeof(float) * n_out * n_in), *x = xmalloc(sizeof(float) * T * n_in);
    float *ref = xmalloc(sizeof(float) * T * n_out), *got = xmalloc(sizeof(float) * T * n_out);
    void *w = make_weights(type, n_out, n_in, deq);
    for (int t = 0; t < T; t++) fill(x + (size_t)t * n_in, n_in, row_scale[t]);
    for (int t = 0; t < T; t++)
        for (int r = 0; r < n_out; r++) {
            double acc = 0;
            for (int i = 0; i < n_in; i++) acc += (double)deq[(size_t)r * n_in + i] * x[(size_t)t * n_in + i];
            ref[(size_t)t * n_out + r] = (float)acc;
        }
    void *dw = dev_put(w, rb * n_out);
    float *dx = dev_put(x, sizeof(float) * T * n_in), *dout = dev_put(NULL, sizeof(float) * T * n_out);
    int rc = dw && dx && dout ? tl_cuda_matmul_path(ctx, dout, dx, dw, type, n_in, n_out, T, TL_CUDA_MM_GEMM) : -1;
    CHECK(rc == TL_CUDA_OK, "gemm with large rows runs: %s", tl_cuda_last_error());
    if (rc == TL_CUDA_OK && dev_get(got, dout, sizeof(float) * T * n_out) == TL_CUDA_OK)
        for (int t = 0; t < T; t++) {
            double e = test_nmse(got + (size_t)t * n_out, ref + (size_t)t * n_out, n_out);
            CHECK(e < TOL_GEMM16, "gemm row %d (values up to %.0e): matches the f32 reference (nmse %.3g)", t,
                  (double)row_scale[t], e);
        }
    /* an inf in row 2 makes that row non-finite; the others stay exact */
    x[(size_t)2 * n_in + 7] = INFINITY;
    rc = dx ? tl_cuda_upload(ctx, dx, x, sizeof(float) * T * n_in) : -1;
    if (rc == TL_CUDA_OK) rc = tl_cuda_matmul_path(ctx, dout, dx, dw, type, n_in, n_out, T, TL_CUDA_MM_GEMM);
    if (rc == TL_CUDA_OK && dev_get(got, dout, sizeof(float) * T * n_out) == TL_CUDA_OK) {
        int nonfinite = 0;
        for (int r = 0; r < n_out; r++) nonfinite += !isfinite(got[(size_t)2 * n_out + r]);
        CHECK(nonfinite == n_out, "an inf input leaves its output row non-finite (%d of %d)", nonfinite, n_out);
        double e = test_nmse(got + (size_t)3 * n_out, ref + (size_t)3 * n_out, n_out);
        CHECK(e < TOL_GEMM16, "the rows beside it are unaffected (row 3 nmse %.3g)", e);
    }
    tl_cuda_dealloc(ctx, dw);
    tl_cuda_dealloc(ctx, dx);
    tl_cuda_dealloc(ctx, dout);
    free(w);
    free(deq);
    free(x);
    free(ref);
    free(got);
}

/* ---- element-wise ------------------------------------------------------------ */

static void ref_rope(float *x, int pos, int n_rot, float base, int neox, const float *ff) {
    float theta_scale = powf(base, -2.0f / (float)n_rot), theta = (float)pos;
    for (int i = 0; i < n_rot / 2; i++) {
        float th = ff ? theta / ff[i] : theta, c = cosf(th), s = sinf(th);
        int a = neox ? i : 2 * i, b = neox ? i + n_rot / 2 : 2 * i + 1;
        float x0 = x[a], x1 = x[b];
        x[a] = x0 * c - x1 * s;
        x[b] = x0 * s + x1 * c;
        theta *= theta_scale;
    }
}

static float ref_gelu(float x) {
    const float k = 0.79788456080286535587989211986876f;
    return 0.5f * x * (1.0f + tanhf(k * x * (1.0f + 0.044715f * x * x)));
}

static void test_elementwise(void) {
    /* RMSNorm: odd widths, one wider than a block. */
    int widths[] = {333, 2053};
    for (int wi = 0; wi < 2; wi++) {
        int rows = 5, n = widths[wi];
        float *x = xmalloc(sizeof(float) * rows * n), *w = xmalloc(sizeof(float) * n);
        float *ref = xmalloc(sizeof(float) * rows * n), *got = xmalloc(sizeof(float) * rows * n);
        fill(x, (size_t)rows * n, 3.0f);
        fill(w, n, 1.0f);
        for (int r = 0; r < rows; r++) {
            double s = 0;
            for (int i = 0; i < n; i++) s += (double)x[r * n + i] * x[r * n + i];
            float sc = 1.0f / sqrtf((float)(s / n) + 1e-5f);
            for (int i = 0; i < n; i++) ref[r * n + i] = x[r * n + i] * sc * w[i];
        }
        float *dx = dev_put(x, sizeof(float) * rows * n), *dw = dev_put(w, sizeof(float) * n);
        int rc = dx && dw ? tl_cuda_rmsnorm(ctx, dx, dx, dw, rows, n, 1e-5f) : -1;
        CHECK(rc == TL_CUDA_OK, "rmsnorm runs in place: %s", tl_cuda_last_error());
        if (rc == TL_CUDA_OK && dev_get(got, dx, sizeof(float) * rows * n) == TL_CUDA_OK) {
            double e = test_nmse(got, ref, (size_t)rows * n);
            CHECK(e < TOL_F32, "rmsnorm n=%d matches (nmse %.3g)", n, e);
        }
        tl_cuda_dealloc(ctx, dx);
        tl_cuda_dealloc(ctx, dw);
        free(x), free(w), free(ref), free(got);
    }

    /* RoPE: partial rotation, padded token stride, both layouts, freq factors. */
    {
        int n_tok = 7, n_head = 3, hd = 64, n_rot = 48, stride = n_head * hd + 5;
        size_t nx = (size_t)n_tok * stride;
        float *x = xmalloc(sizeof(float) * nx), *ref = xmalloc(sizeof(float) * nx), *got = xmalloc(sizeof(float) * nx);
        float ff[24];
        int32_t pos[7] = {0, 1, 17, 255, 1000, 4095, 3};
        for (int i = 0; i < 24; i++) ff[i] = 1.0f + (float)i / 8;
        float *dff = dev_put(ff, sizeof ff);
        int32_t *dpos = dev_put(pos, sizeof pos);
        for (int neox = 0; neox <= 1; neox++)
            for (int use_ff = 0; use_ff <= 1; use_ff++) {
                fill(x, nx, 1.0f);
                memcpy(ref, x, sizeof(float) * nx);
                for (int t = 0; t < n_tok; t++)
                    for (int h = 0; h < n_head; h++)
                        ref_rope(ref + (size_t)t * stride + h * hd, pos[t], n_rot, 10000.0f, neox, use_ff ? ff : NULL);
                float *dx = dev_put(x, sizeof(float) * nx);
                int rc = dx && dpos && dff ? tl_cuda_rope(ctx, dx, n_tok, stride, n_head, hd, n_rot, dpos, 10000.0f,
                                                          neox ? TL_CUDA_ROPE_NEOX : TL_CUDA_ROPE_NORM,
                                                          use_ff ? dff : NULL)
                                           : -1;
                CHECK(rc == TL_CUDA_OK, "rope runs: %s", tl_cuda_last_error());
                if (rc == TL_CUDA_OK && dev_get(got, dx, sizeof(float) * nx) == TL_CUDA_OK) {
                    double e = test_nmse(got, ref, nx);
                    CHECK(e < TOL_F32, "rope %s%s matches, untouched dims and padding kept (nmse %.3g)",
                          neox ? "neox" : "norm", use_ff ? " with freq factors" : "", e);
                }
                tl_cuda_dealloc(ctx, dx);
            }
        tl_cuda_dealloc(ctx, dff);
        tl_cuda_dealloc(ctx, dpos);
        free(x), free(ref), free(got);
    }

    /* Gated activations and residual add. */
    {
        int n = 1001;
        float *a = xmalloc(sizeof(float) * n), *b = xmalloc(sizeof(float) * n);
        float *ref = xmalloc(sizeof(float) * n), *got = xmalloc(sizeof(float) * n);
        fill(a, n, 6.0f);
        fill(b, n, 2.0f);
        float *da = dev_put(a, sizeof(float) * n), *db = dev_put(b, sizeof(float) * n);
        float *dout = dev_put(NULL, sizeof(float) * n);
        for (int op = 0; op < 3; op++) {
            const char *name = op == 0 ? "swiglu" : op == 1 ? "geglu" : "add";
            for (int i = 0; i < n; i++)
                ref[i] = op == 0 ? a[i] / (1.0f + expf(-a[i])) * b[i] : op == 1 ? ref_gelu(a[i]) * b[i] : a[i] + b[i];
            int rc = -1;
            if (da && db && dout)
                rc = op == 0 ? tl_cuda_swiglu(ctx, dout, da, db, n)
                     : op == 1 ? tl_cuda_geglu(ctx, dout, da, db, n)
                               : tl_cuda_add(ctx, dout, da, db, n);
            CHECK(rc == TL_CUDA_OK, "%s runs: %s", name, tl_cuda_last_error());
            if (rc == TL_CUDA_OK && dev_get(got, dout, sizeof(float) * n) == TL_CUDA_OK) {
                double e = test_nmse(got, ref, n);
                CHECK(e < TOL_F32, "%s matches (nmse %.3g)", name, e);
            }
        }
        tl_cuda_dealloc(ctx, da), tl_cuda_dealloc(ctx, db), tl_cuda_dealloc(ctx, dout);
        free(a), free(b), free(ref), free(got);
    }

    /* Argmax: ties go to the lowest index, as tl_argmax. */
    {
        int rows = 4, n = 32003;
        float *x = xmalloc(sizeof(float) * rows * n);
        fill(x, (size_t)rows * n, 1.0f);
        int32_t want[4] = {7, 32002, 0, 15000}, got[4] = {-1, -1, -1, -1};
        for (int r = 0; r < rows; r++) x[(size_t)r * n + want[r]] = 5.0f;
        x[(size_t)3 * n + 20000] = 5.0f; /* a tie after the first maximum */
        float *dx = dev_put(x, sizeof(float) * rows * n);
        int rc = dx ? tl_cuda_argmax(ctx, got, dx, rows, n) : -1;
        CHECK(rc == TL_CUDA_OK, "argmax runs: %s", tl_cuda_last_error());
        for (int r = 0; r < rows && rc == TL_CUDA_OK; r++)
            CHECK(got[r] == want[r], "argmax row %d is %d (want %d)", r, got[r], want[r]);
        tl_cuda_dealloc(ctx, dx);
        free(x);
    }
}

/* ---- attention over the paged KV --------------------------------------------- */

enum { N_SEQ = 3, N_BLOCKS = 40, BS = 16, NKV = 2, NH = 6, HD = 80, DEPTH = 2, MAX_LB = 8 };

/* The arena's values as f32, dequantized once by the CPU codec
 * (tl_kv_load_row): deq[((id * 2 + v) * NKV + h) * BS + r) * HD + d]. */
static float *deq_arena(const uint8_t *arena, const tl_kv_layout *l) {
    float *deq = xmalloc(sizeof(float) * N_BLOCKS * 2 * NKV * BS * HD);
    for (int id = 0; id < N_BLOCKS; id++)
        for (int v = 0; v < 2; v++)
            for (int h = 0; h < NKV; h++)
                for (int r = 0; r < BS; r++) {
                    size_t rb = v ? l->row_bytes_v : l->row_bytes_k;
                    const uint8_t *row = arena + (size_t)id * l->block_bytes + (v ? l->k_bytes : 0) +
                                         tl_kv_row_off(l, h, r, rb);
                    tl_kv_load_row(v ? l->type_v : l->type_k, l->group, row,
                                   deq + ((((size_t)id * 2 + v) * NKV + h) * BS + r) * HD, HD);
                }
    return deq;
}

static float kv_at(const float *deq, int id, int v, int h, int r, int d) {
    return deq[((((size_t)id * 2 + v) * NKV + h) * BS + r) * HD + d];
}

/* out (NH*HD) for a query at `pos` of sequence s, window w (0 = none). */
static void ref_attention(float *out, const float *q, const float *deq, const int32_t *table, int pos, int w,
                          float scale) {
    int j0 = w > 0 && pos >= w ? pos - w + 1 : 0;
    double *sc = xmalloc(sizeof(double) * (pos + 1));
    for (int h = 0; h < NH; h++) {
        int kh = h / (NH / NKV);
        double mx = -1e300, sum = 0;
        for (int j = j0; j <= pos; j++) {
            int id = table[(j / BS) * DEPTH];
            double s = 0;
            for (int d = 0; d < HD; d++) s += (double)q[h * HD + d] * kv_at(deq, id, 0, kh, j % BS, d);
            sc[j] = s * scale;
            if (sc[j] > mx) mx = sc[j];
        }
        for (int j = j0; j <= pos; j++) sum += (sc[j] = exp(sc[j] - mx));
        for (int d = 0; d < HD; d++) {
            double o = 0;
            for (int j = j0; j <= pos; j++) o += sc[j] * kv_at(deq, table[(j / BS) * DEPTH], 1, kh, j % BS, d);
            out[h * HD + d] = (float)(o / sum);
        }
    }
    free(sc);
}

/* K rows of type tk, V rows of type tv (enum tl_cuda_kv_type). HD = 80:
 * quantized rows in groups of 16 (gcd(80, 32)), not ggml's 32. */
static void test_attention_kv(int tk, int tv) {
    static const char *const tn[] = {"f16", "f32", "q8", "q4"};
    char kvn[16];
    snprintf(kvn, sizeof kvn, "%s,%s", tn[tk], tn[tv]);
    void *darena = NULL;
    float *deq = NULL;
    tl_cuda_kv kv = {NULL, tk, tv, BS, NKV, HD};
    tl_kv_layout lay;
    tl_kv_layout_init(&lay, tk, tv, 0, BS, NKV, HD, 0);
    size_t bb = tl_cuda_kv_block_bytes(&kv);
    CHECK(bb == lay.block_bytes, "%s: block of %zu bytes, the engine's layout %zu", kvn, bb, lay.block_bytes);
    darena = dev_put(NULL, bb * N_BLOCKS);
    if (!darena) return;
    kv.arena = darena;
    /* Block tables in the engine's layout: ids[lb*DEPTH + vl], testing vl = 1;
     * blocks handed out in a scrambled order. */
    int32_t tables[N_SEQ][MAX_LB * DEPTH];
    int next = 0;
    for (int s = 0; s < N_SEQ; s++)
        for (int i = 0; i < MAX_LB * DEPTH; i++) tables[s][i] = -1;
    for (int s = 0; s < N_SEQ; s++)
        for (int lb = 0; lb < 4; lb++) tables[s][lb * DEPTH + 1] = (next++ * 7) % N_BLOCKS;
    /* Prefill batch: cached prefix pos0 + q_len new tokens per sequence. */
    int32_t pos0[N_SEQ] = {0, 20, 33}, q_len[N_SEQ] = {37, 5, 17}, q_start[N_SEQ];
    int rows = 0;
    for (int s = 0; s < N_SEQ; s++) q_start[s] = rows, rows += q_len[s];
    /* Store K/V for every position 0 .. pos0+q_len-1 (the prefix and the new tokens). */
    int kvd = NKV * HD, n_store = 0;
    int32_t slots[N_SEQ * 64];
    for (int s = 0; s < N_SEQ; s++)
        for (int p = 0; p < pos0[s] + q_len[s]; p++) slots[n_store++] = tables[s][(p / BS) * DEPTH + 1] * BS + p % BS;
    float *k = xmalloc(sizeof(float) * n_store * (kvd + 3)), *v = xmalloc(sizeof(float) * n_store * (kvd + 3));
    fill(k, (size_t)n_store * (kvd + 3), 1.0f);
    fill(v, (size_t)n_store * (kvd + 3), 1.0f);
    float *dk = dev_put(k, sizeof(float) * n_store * (kvd + 3)), *dv = dev_put(v, sizeof(float) * n_store * (kvd + 3));
    int32_t *dslots = dev_put(slots, sizeof(int32_t) * n_store);
    int rc = dk && dv && dslots ? tl_cuda_kv_store(ctx, &kv, dk, dv, kvd + 3, n_store, dslots) : -1;
    CHECK(rc == TL_CUDA_OK, "%s: kv_store runs: %s", kvn, tl_cuda_last_error());
    uint8_t *arena = xmalloc(bb * N_BLOCKS);
    if (rc != TL_CUDA_OK || dev_get(arena, darena, bb * N_BLOCKS) != TL_CUDA_OK) goto out;
    {
        /* every row holds the bytes the CPU codec (tl_kv_store_row) makes of
         * the same values: same rounding, same quantization */
        int bad = 0;
        uint8_t want[4 * HD];
        for (int t = 0; t < n_store; t++)
            for (int h = 0; h < NKV; h++)
                for (int vv = 0; vv < 2; vv++) {
                    int id = slots[t] / BS, r = slots[t] % BS, type = vv ? tv : tk;
                    size_t rb = vv ? lay.row_bytes_v : lay.row_bytes_k;
                    tl_kv_store_row(type, lay.group, (vv ? v : k) + (size_t)t * (kvd + 3) + h * HD, want, HD);
                    bad += memcmp(arena + (size_t)id * bb + (vv ? lay.k_bytes : 0) + tl_kv_row_off(&lay, h, r, rb),
                                  want, rb) != 0;
                }
        CHECK(bad == 0, "%s: kv_store writes each row as the CPU's tl_kv_store_row, at its slot (%d rows differ)",
              kvn, bad);
    }
    deq = deq_arena(arena, &lay);

    int32_t *dtab = dev_put(&tables[0][1], sizeof tables - sizeof(int32_t));
    int32_t *dpos0 = dev_put(pos0, sizeof pos0), *dqlen = dev_put(q_len, sizeof q_len);
    int32_t *dqstart = dev_put(q_start, sizeof q_start);
    int32_t seq_win[N_SEQ] = {0, 10, 0};
    int32_t *dwin = dev_put(seq_win, sizeof seq_win);
    float scale = 1.0f / sqrtf((float)HD);
    size_t qn = (size_t)rows * (NH * HD + 7);
    float *q = xmalloc(sizeof(float) * qn), *ref = xmalloc(sizeof(float) * rows * NH * HD);
    float *got = xmalloc(sizeof(float) * rows * NH * HD);
    fill(q, qn, 2.0f);
    float *dq = dev_put(q, sizeof(float) * qn), *dout = dev_put(NULL, sizeof(float) * rows * NH * HD);
    if (!dtab || !dpos0 || !dqlen || !dqstart || !dwin || !dq || !dout) goto out2;
    for (int wcase = 0; wcase < 3; wcase++) {
        /* 0: no window; 1: layer window 20; 2: per-sequence windows {0, 10, 0}. */
        int lw = wcase == 1 ? 20 : 0;
        tl_cuda_attn_seqs sq = {.n_seq = N_SEQ, .q_start = dqstart, .q_len = dqlen, .pos0 = dpos0, .block_ids = dtab,
                                .seq_stride = MAX_LB * DEPTH, .blk_stride = DEPTH,
                                .window = wcase == 2 ? dwin : NULL, .max_q_len = 37};
        for (int s = 0; s < N_SEQ; s++)
            for (int t = 0; t < q_len[s]; t++) {
                int w = lw;
                if (wcase == 2) w = seq_win[s];
                int row = q_start[s] + t;
                ref_attention(ref + (size_t)row * NH * HD, q + (size_t)row * (NH * HD + 7), deq, &tables[s][1],
                              pos0[s] + t, w, scale);
            }
        rc = tl_cuda_attn_prefill(ctx, dout, dq, NH * HD + 7, &kv, &sq, NH, lw, scale);
        CHECK(rc == TL_CUDA_OK, "%s: prefill attention runs: %s", kvn, tl_cuda_last_error());
        if (rc == TL_CUDA_OK && dev_get(got, dout, sizeof(float) * rows * NH * HD) == TL_CUDA_OK) {
            double e = test_nmse(got, ref, (size_t)rows * NH * HD);
            CHECK(e < TOL_F32, "%s window case %d: prefill (cached prefix + causal new tokens, GQA %d:%d) matches "
                  "(nmse %.3g)", kvn, wcase, NH, NKV, e);
        }
        /* Decode: one query per sequence at its last stored position. */
        int32_t dpos[N_SEQ];
        for (int s = 0; s < N_SEQ; s++) dpos[s] = pos0[s] + q_len[s] - 1;
        int32_t *ddpos = dev_put(dpos, sizeof dpos);
        sq.pos0 = ddpos;
        for (int s = 0; s < N_SEQ; s++)
            ref_attention(ref + (size_t)s * NH * HD, q + (size_t)s * (NH * HD + 7), deq, &tables[s][1], dpos[s],
                          wcase == 2 ? seq_win[s] : lw, scale);
        /* whole ranges, then split into 32-position ranges (flash-decoding), then the launcher's choice */
        static const int splits[] = {-1, 32, 0};
        sq.max_pos = 0;
        for (int s = 0; s < N_SEQ; s++) sq.max_pos = dpos[s] + 1 > sq.max_pos ? dpos[s] + 1 : sq.max_pos;
        for (int si = 0; si < 3; si++) {
            sq.split = splits[si];
            rc = ddpos ? tl_cuda_attn_decode(ctx, dout, dq, NH * HD + 7, &kv, &sq, NH, lw, scale) : -1;
            CHECK(rc == TL_CUDA_OK, "%s: decode attention runs: %s", kvn, tl_cuda_last_error());
            if (rc == TL_CUDA_OK && dev_get(got, dout, sizeof(float) * N_SEQ * NH * HD) == TL_CUDA_OK) {
                double e = test_nmse(got, ref, (size_t)N_SEQ * NH * HD);
                CHECK(e < TOL_F32, "%s window case %d: decode over %d sequences (split %d) matches (nmse %.3g)", kvn,
                      wcase, N_SEQ, splits[si], e);
            }
        }
        sq.split = 0;
        tl_cuda_dealloc(ctx, ddpos);
    }
    /* Copy-on-write block copy. */
    {
        int src = tables[2][1], dst = N_BLOCKS - 1;
        rc = tl_cuda_kv_copy(ctx, &kv, dst, src);
        CHECK(rc == TL_CUDA_OK, "%s: kv_copy runs: %s", kvn, tl_cuda_last_error());
        uint8_t *after = xmalloc(bb * N_BLOCKS);
        if (rc == TL_CUDA_OK && dev_get(after, darena, bb * N_BLOCKS) == TL_CUDA_OK) {
            CHECK(memcmp(after + (size_t)dst * bb, arena + (size_t)src * bb, bb) == 0,
                  "%s: kv_copy makes block %d a copy of block %d", kvn, dst, src);
            CHECK(memcmp(after, arena, (size_t)dst * bb) == 0, "%s: kv_copy leaves other blocks alone", kvn);
        }
        free(after);
    }
out2:
    tl_cuda_dealloc(ctx, dtab), tl_cuda_dealloc(ctx, dpos0), tl_cuda_dealloc(ctx, dqlen);
    tl_cuda_dealloc(ctx, dqstart), tl_cuda_dealloc(ctx, dwin), tl_cuda_dealloc(ctx, dq), tl_cuda_dealloc(ctx, dout);
    free(q), free(ref), free(got);
out:
    tl_cuda_dealloc(ctx, dk), tl_cuda_dealloc(ctx, dv), tl_cuda_dealloc(ctx, dslots), tl_cuda_dealloc(ctx, darena);
    free(k), free(v), free(arena), free(deq);
}

static void test_errors(void) {
    int rc = tl_cuda_matmul(ctx, NULL, NULL, NULL, TL_TYPE_Q4_0, 32, 1, 1);
    CHECK(rc == TL_CUDA_ERR_ARG && strstr(tl_cuda_last_error(), ".cu:") != NULL,
          "a bad call returns TL_CUDA_ERR_ARG with file and line (rc %d, \"%s\")", rc, tl_cuda_last_error());
    void *p = NULL;
    rc = tl_cuda_alloc(ctx, (size_t)1 << 62, &p);
    CHECK(rc == TL_CUDA_ERR_NOMEM && p == NULL && strstr(tl_cuda_last_error(), "cudaMalloc"),
          "an impossible allocation fails cleanly naming cudaMalloc (rc %d, \"%s\")", rc, tl_cuda_last_error());
    CHECK(tl_cuda_sync(ctx) == TL_CUDA_OK, "the context still works after those errors: %s", tl_cuda_last_error());
}

/* ---- benchmarks (--bench) ---------------------------------------------------- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void bench(void) {
    const int n_in = 4096, n_out = 14336, iters = 50;
    const int types[] = {TL_TYPE_Q4_K, TL_TYPE_Q8_0, TL_TYPE_F16, TL_TYPE_Q6_K};
    float *x = xmalloc(sizeof(float) * 512 * n_in);
    fill(x, (size_t)512 * n_in, 1.0f);
    float *dx = dev_put(x, sizeof(float) * 512 * n_in), *dout = dev_put(NULL, sizeof(float) * 512 * n_out);
    for (size_t k = 0; k < sizeof types / sizeof types[0] && dx && dout; k++) {
        size_t rb = tl_row_size(types[k], n_in);
        void *dw = dev_put(NULL, rb * n_out); /* contents do not matter for timing */
        if (!dw) break;
        for (int T = 1; T <= 512; T = T == 1 ? 8 : T == 8 ? 512 : 1024) {
            int n = T == 512 ? 5 : iters;
            tl_cuda_matmul(ctx, dout, dx, dw, types[k], n_in, n_out, T);
            tl_cuda_sync(ctx);
            double t0 = now_s();
            for (int i = 0; i < n; i++) tl_cuda_matmul(ctx, dout, dx, dw, types[k], n_in, n_out, T);
            int rc = tl_cuda_sync(ctx);
            double dt = (now_s() - t0) / n;
            double gbs = rb * n_out / dt / 1e9;
            printf("BENCH matmul %-5s %dx%d T=%-3d %8.1f us  %7.1f GB/s (%.0f%% of 4800)  %7.2f TFLOP/s%s\n",
                   tl_type_info(types[k])->name, n_out, n_in, T, dt * 1e6, gbs, gbs / 48, 2.0 * n_in * n_out * T / dt / 1e12,
                   rc ? " ERROR" : "");
        }
        tl_cuda_dealloc(ctx, dw);
    }
    tl_cuda_dealloc(ctx, dx);
    tl_cuda_dealloc(ctx, dout);
    free(x);
}

/* Decode attention over long sequences in each KV mode: the time of one
 * step and the K/V bytes it reads per second (q8/q4 rows are dequantized
 * on the way into shared memory, so they should read fewer bytes in about
 * the time of f16 or less). Arena contents do not matter for timing. */
static void bench_attention(void) {
    enum { S = 32, L = 2048, KVH = 8, H = 32, D = 128, B = 16, LB = L / B, iters = 20 };
    static const int pairs[][2] = {{TL_CUDA_KV_F16, TL_CUDA_KV_F16}, {TL_CUDA_KV_Q8, TL_CUDA_KV_Q8},
                                   {TL_CUDA_KV_Q4, TL_CUDA_KV_Q4}, {TL_CUDA_KV_Q8, TL_CUDA_KV_F16}};
    static const char *const tn[] = {"f16", "f32", "q8", "q4"};
    int32_t *table = xmalloc(sizeof(int32_t) * S * LB), pos[S];
    for (int i = 0; i < S * LB; i++) table[i] = i;
    for (int s = 0; s < S; s++) pos[s] = L - 1;
    float *q = xmalloc(sizeof(float) * S * H * D);
    fill(q, (size_t)S * H * D, 1.0f);
    int32_t *dtab = dev_put(table, sizeof(int32_t) * S * LB), *dpos = dev_put(pos, sizeof pos);
    float *dq = dev_put(q, sizeof(float) * S * H * D), *dout = dev_put(NULL, sizeof(float) * S * H * D);
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0] && dtab && dpos && dq && dout; i++) {
        tl_cuda_kv kv = {NULL, pairs[i][0], pairs[i][1], B, KVH, D};
        tl_kv_layout l;
        tl_kv_layout_init(&l, kv.type_k, kv.type_v, 0, B, KVH, D, 0);
        kv.arena = dev_put(NULL, l.block_bytes * S * LB);
        if (!kv.arena) break;
        tl_cuda_attn_seqs sq = {.n_seq = S, .pos0 = dpos, .block_ids = dtab, .seq_stride = LB, .blk_stride = 1,
                                .split = 0, .max_pos = L};
        tl_cuda_attn_decode(ctx, dout, dq, H * D, &kv, &sq, H, 0, 0.1f);
        tl_cuda_sync(ctx);
        double t0 = now_s();
        for (int it = 0; it < iters; it++) tl_cuda_attn_decode(ctx, dout, dq, H * D, &kv, &sq, H, 0, 0.1f);
        int rc = tl_cuda_sync(ctx);
        double dt = (now_s() - t0) / iters, bytes = (double)S * L * KVH * (double)(l.row_bytes_k + l.row_bytes_v);
        printf("BENCH attn decode kv %s,%s %d seqs x %d positions, %d/%d heads, head_dim %d: %8.1f us  %7.1f GB/s of "
               "K/V%s\n", tn[kv.type_k], tn[kv.type_v], S, L, H, KVH, D, dt * 1e6, bytes / dt / 1e9, rc ? " ERROR" : "");
        tl_cuda_dealloc(ctx, kv.arena);
    }
    tl_cuda_dealloc(ctx, dtab), tl_cuda_dealloc(ctx, dpos), tl_cuda_dealloc(ctx, dq), tl_cuda_dealloc(ctx, dout);
    free(table), free(q);
}

int main(int argc, char **argv) {
    if (!gpu_test_open(&ctx)) return test_summary();
    tl_kernels_init();
    char name[256];
    if (tl_cuda_device_name(ctx, name, sizeof name) == TL_CUDA_OK) printf("device: %s\n", name);
    test_dequantize_and_get_rows();
    test_matmul();
    test_gemm_range();
    test_elementwise();
    /* the KV modes: one type, and K and V of different types */
    static const int kv_pairs[][2] = {{TL_CUDA_KV_F16, TL_CUDA_KV_F16}, {TL_CUDA_KV_F32, TL_CUDA_KV_F32},
                                      {TL_CUDA_KV_Q8, TL_CUDA_KV_Q8},   {TL_CUDA_KV_Q4, TL_CUDA_KV_Q4},
                                      {TL_CUDA_KV_Q8, TL_CUDA_KV_F16},  {TL_CUDA_KV_Q4, TL_CUDA_KV_Q8}};
    for (size_t i = 0; i < sizeof kv_pairs / sizeof kv_pairs[0]; i++) test_attention_kv(kv_pairs[i][0], kv_pairs[i][1]);
    test_errors();
    if (argc > 1 && strcmp(argv[1], "--bench") == 0) {
        bench();
        bench_attention();
    }
    tl_cuda_free(ctx);
    return test_summary();
}
