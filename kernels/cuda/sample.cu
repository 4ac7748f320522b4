/* sample.cu - token sampling on the device, so a decode step sends token
 * ids to the host instead of n_vocab logits per sequence.
 *
 * The chain is engine/sampler.c's, step for step (the CPU is the
 * reference): penalty, then argmax (temperature <= 0) or top-k selection
 * and a draw over at most TL_CUDA_SAMPLE_MAX_K sorted candidates.
 *
 * Top-k is a tournament of bitonic sorts: a CUDA block sorts SMP_CHUNK
 * (value, id) pairs in shared memory and keeps its best k; each round
 * shrinks a row SMP_CHUNK / k times (>= 8), so Gemma's 262,144 logits
 * need four rounds. Ties order by the lower id, as the host's partial
 * selection does, so both pick the same candidates. The draw is serial
 * per row (one thread, double sums like the host's) over <= 256 values. */
#include <math.h>
#include <string.h>

#include "cuda_impl.h"

#define SMP_CHUNK 2048
#define SMP_THREADS 1024

static __device__ __forceinline__ bool before(float av, int32_t ai, float bv, int32_t bi) {
    return av > bv || (av == bv && ai < bi);
}

/* Row r of the input: n_in pairs at in_v/in_i + r * in_stride (in_i NULL:
 * the id is the index). Block x of the row writes its chunk's best k to
 * out + r * out_stride + x * k, best first. */
static __global__ void __launch_bounds__(SMP_THREADS)
    kernel_topk_round(float *out_v, int32_t *out_i, int out_stride, const float *in_v, const int32_t *in_i,
                      int in_stride, int n_in, int k) {
    __shared__ float sv[SMP_CHUNK];
    __shared__ int32_t si[SMP_CHUNK];
    const int row = blockIdx.y, base = blockIdx.x * SMP_CHUNK;
    const float *iv = in_v + (size_t)row * in_stride;
    const int32_t *ii = in_i ? in_i + (size_t)row * in_stride : NULL;
    for (int i = threadIdx.x; i < SMP_CHUNK; i += blockDim.x) {
        const int j = base + i;
        float v = -INFINITY;
        int32_t id = INT32_MAX; /* padding sorts after every real entry */
        if (j < n_in) {
            v = iv[j];
            id = ii ? ii[j] : j;
            if (isnan(v)) v = -INFINITY;
        }
        sv[i] = v;
        si[i] = id;
    }
    __syncthreads();
    for (int size = 2; size <= SMP_CHUNK; size <<= 1)
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = threadIdx.x; i < SMP_CHUNK; i += blockDim.x) {
                const int j = i ^ stride;
                if (j <= i) continue;
                /* (i & size) == 0: this run ends best-first; else worst-first. */
                const bool swap = (i & size) == 0 ? before(sv[j], si[j], sv[i], si[i])
                                                  : before(sv[i], si[i], sv[j], si[j]);
                if (swap) {
                    const float tv = sv[i];
                    const int32_t ti = si[i];
                    sv[i] = sv[j];
                    si[i] = si[j];
                    sv[j] = tv;
                    si[j] = ti;
                }
            }
            __syncthreads();
        }
    float *ov = out_v + (size_t)row * out_stride + (size_t)blockIdx.x * k;
    int32_t *oi = out_i + (size_t)row * out_stride + (size_t)blockIdx.x * k;
    for (int i = threadIdx.x; i < k; i += blockDim.x) {
        ov[i] = sv[i];
        oi[i] = si[i];
    }
}

static __global__ void kernel_penalty(float *logits, int n_vocab, const tl_cuda_sample_row *rows,
                                      const int32_t *pen) {
    const tl_cuda_sample_row p = rows[blockIdx.x];
    float *l = logits + (size_t)blockIdx.x * n_vocab;
    /* distinct ids (the host deduplicates), so no two threads touch one logit */
    for (int j = threadIdx.x; j < p.pen_len; j += blockDim.x) {
        const int id = pen[p.pen_off + j];
        const float x = l[id];
        l[id] = x <= 0 ? x * p.repeat_penalty : x / p.repeat_penalty;
    }
}

/* One thread per row over its sorted candidates (cv, ci: stride apart). */
static __global__ void kernel_draw(int32_t *ids, const float *cv, const int32_t *ci, int stride,
                                   const tl_cuda_sample_row *rows, int n_rows, int n_vocab) {
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= n_rows) return;
    const float *v = cv + (size_t)r * stride;
    const int32_t *id = ci + (size_t)r * stride;
    const tl_cuda_sample_row p = rows[r];
    const float maxv = v[0];
    if (p.temperature <= 0 || maxv == -INFINITY) {
        ids[r] = id[0];
        return;
    }
    int n = p.top_k < n_vocab ? p.top_k : n_vocab;
    double sum = 0;
    for (int i = 0; i < n; i++) sum += expf(v[i] - maxv);
    if (p.top_p < 1.0f) {
        double cum = 0;
        int keep = n;
        for (int i = 0; i < n; i++) {
            cum += expf(v[i] - maxv) / sum;
            if (cum >= p.top_p) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
    }
    if (p.min_p > 0) {
        const float v0 = expf(v[0] - maxv);
        int keep = 1;
        while (keep < n && expf(v[keep] - maxv) >= p.min_p * v0) keep++;
        n = keep;
    }
    sum = 0;
    for (int i = 0; i < n; i++) sum += expf((v[i] - maxv) / p.temperature);
    const double target = p.u * sum;
    double acc = 0;
    for (int i = 0; i < n; i++) {
        acc += expf((v[i] - maxv) / p.temperature);
        if (target < acc) {
            ids[r] = id[i];
            return;
        }
    }
    ids[r] = id[n - 1];
}

/* ---- launchers ------------------------------------------------------------- */

static int chunks(int n) { return (n + SMP_CHUNK - 1) / SMP_CHUNK; }

/* Scratch: [rows | pen | ids | A values | A ids | B values | B ids], each
 * region 256-byte aligned. */
typedef struct smp_layout {
    size_t rows, pen, ids, av, ai, bv, bi, total;
} smp_layout;

static size_t align256(size_t x) { return (x + 255) & ~(size_t)255; }

static smp_layout layout(int n_rows, int n_pen, int n_vocab, int k) {
    smp_layout l;
    const size_t pairs = (size_t)n_rows * chunks(n_vocab) * k;
    l.rows = 0;
    l.pen = align256(l.rows + (size_t)n_rows * sizeof(tl_cuda_sample_row));
    l.ids = align256(l.pen + (size_t)(n_pen > 0 ? n_pen : 1) * sizeof(int32_t));
    l.av = align256(l.ids + (size_t)n_rows * sizeof(int32_t));
    l.ai = align256(l.av + pairs * sizeof(float));
    l.bv = align256(l.ai + pairs * sizeof(int32_t));
    l.bi = align256(l.bv + pairs * sizeof(float));
    l.total = align256(l.bi + pairs * sizeof(int32_t));
    return l;
}

/* Rounds of the tournament; the best k of each row end at (*vals, *ids),
 * k apart. */
static int topk_rounds(tl_cuda *c, const float *x, int n_rows, int n, int k, uint8_t *base, const smp_layout *l,
                       const float **vals, const int32_t **ids) {
    const float *in_v = x;
    const int32_t *in_i = NULL;
    int n_in = n, in_stride = n, flip = 0;
    for (;;) {
        const int nb = chunks(n_in);
        float *ov = (float *)(base + (flip ? l->bv : l->av));
        int32_t *oi = (int32_t *)(base + (flip ? l->bi : l->ai));
        const int out_stride = nb * k;
        kernel_topk_round<<<dim3((unsigned)nb, (unsigned)n_rows), SMP_THREADS, 0, c->stream>>>(
            ov, oi, out_stride, in_v, in_i, in_stride, n_in, k);
        TLC_LAUNCHED(kernel_topk_round);
        in_v = ov;
        in_i = oi;
        in_stride = out_stride;
        n_in = out_stride;
        flip ^= 1;
        if (nb == 1) break;
    }
    *vals = in_v;
    *ids = in_i;
    return TL_CUDA_OK;
}

static int reserve(tl_cuda *c, const smp_layout *l) { return tlc_scratch(c, &c->smp, &c->smp_bytes, l->total); }

extern "C" TL_CUDA_API int tl_cuda_topk(tl_cuda *c, float *vals, int32_t *ids, const float *x, int n_rows, int n,
                                        int k) {
    TLC_ARG(c && vals && ids && x, "NULL argument");
    TLC_ARG(n_rows > 0 && n_rows <= 65535 && n > 0 && k >= 1 && k <= TL_CUDA_SAMPLE_MAX_K && k <= n,
            "n_rows %d, n %d, k %d (1 <= k <= min(n, %d), n_rows <= 65535)", n_rows, n, k, TL_CUDA_SAMPLE_MAX_K);
    TLC_BIND(c);
    const smp_layout l = layout(n_rows, 0, n, k);
    int rc = reserve(c, &l);
    if (rc) return rc;
    const float *bv;
    const int32_t *bi;
    if ((rc = topk_rounds(c, x, n_rows, n, k, (uint8_t *)c->smp, &l, &bv, &bi))) return rc;
    TLC_CHECK(cudaMemcpyAsync(vals, bv, (size_t)n_rows * k * sizeof(float), cudaMemcpyDeviceToDevice, c->stream));
    TLC_CHECK(cudaMemcpyAsync(ids, bi, (size_t)n_rows * k * sizeof(int32_t), cudaMemcpyDeviceToDevice, c->stream));
    return TL_CUDA_OK;
}

extern "C" TL_CUDA_API int tl_cuda_sample(tl_cuda *c, int32_t *ids_host, float *logits, int n_rows, int n_vocab,
                                          const tl_cuda_sample_row *rows, const int32_t *pen_ids, int n_pen) {
    TLC_ARG(c && ids_host && logits && rows, "NULL argument");
    TLC_ARG(n_rows > 0 && n_rows <= 65535 && n_vocab > 0, "n_rows %d (1..65535), n_vocab %d", n_rows, n_vocab);
    TLC_ARG(n_pen >= 0 && (n_pen == 0 || pen_ids), "n_pen %d without ids", n_pen);
    int k = 1, any_pen = 0;
    for (int r = 0; r < n_rows; r++) {
        const tl_cuda_sample_row *p = &rows[r];
        TLC_ARG(p->pen_len >= 0 && p->pen_off >= 0 && p->pen_off <= n_pen && p->pen_len <= n_pen - p->pen_off,
                "row %d: penalty ids [%d, +%d) outside the %d given", r, p->pen_off, p->pen_len, n_pen);
        TLC_ARG(!(p->pen_len > 0) || (p->repeat_penalty > 0 && isfinite(p->repeat_penalty)),
                "row %d: repeat_penalty %g", r, p->repeat_penalty);
        any_pen |= p->pen_len > 0;
        if (p->temperature > 0) {
            TLC_ARG(p->top_k >= 1 && p->top_k <= TL_CUDA_SAMPLE_MAX_K, "row %d: top_k %d outside 1..%d", r,
                    p->top_k, TL_CUDA_SAMPLE_MAX_K);
            TLC_ARG(p->u >= 0 && p->u < 1, "row %d: u %g outside [0, 1)", r, p->u);
            const int kr = p->top_k < n_vocab ? p->top_k : n_vocab;
            if (kr > k) k = kr;
        }
    }
    for (int i = 0; i < n_pen; i++)
        TLC_ARG(pen_ids[i] >= 0 && pen_ids[i] < n_vocab, "penalty id %d outside the vocab [0, %d)", pen_ids[i],
                n_vocab);
    if (k == 1 && !any_pen) return tl_cuda_argmax(c, ids_host, logits, n_rows, n_vocab);
    TLC_BIND(c);

    const smp_layout l = layout(n_rows, n_pen, n_vocab, k);
    int rc = reserve(c, &l);
    if (rc) return rc;
    uint8_t *base = (uint8_t *)c->smp;
    tl_cuda_sample_row *rows_d = (tl_cuda_sample_row *)(base + l.rows);
    int32_t *pen_d = (int32_t *)(base + l.pen), *ids_d = (int32_t *)(base + l.ids);
    TLC_CHECK(cudaMemcpyAsync(rows_d, rows, (size_t)n_rows * sizeof *rows, cudaMemcpyHostToDevice, c->stream));
    if (n_pen)
        TLC_CHECK(cudaMemcpyAsync(pen_d, pen_ids, (size_t)n_pen * sizeof(int32_t), cudaMemcpyHostToDevice, c->stream));
    if (any_pen) {
        kernel_penalty<<<n_rows, 256, 0, c->stream>>>(logits, n_vocab, rows_d, pen_d);
        TLC_LAUNCHED(kernel_penalty);
    }
    const float *cv;
    const int32_t *ci;
    if ((rc = topk_rounds(c, logits, n_rows, n_vocab, k, base, &l, &cv, &ci))) return rc;
    kernel_draw<<<(n_rows + 63) / 64, 64, 0, c->stream>>>(ids_d, cv, ci, k, rows_d, n_rows, n_vocab);
    TLC_LAUNCHED(kernel_draw);
    return tl_cuda_download(c, ids_host, ids_d, (size_t)n_rows * sizeof(int32_t));
}
