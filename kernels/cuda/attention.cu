/* attention.cu - attention over the paged KV arena, the K/V store, and
 * the copy-on-write block copy.
 *
 * One kernel serves decode and prefill. A CUDA block owns one sequence,
 * one KV head and ATT_ROWS query rows, a query row being a (token, head of
 * the KV head's group) pair, so GQA groups share every K/V load:
 *
 *   rows of sequence s, KV head kh (group g = n_head / n_head_kv):
 *     row r -> token r / g, query head kh*g + r % g
 *   block x covers rows [x*ATT_ROWS, (x+1)*ATT_ROWS)
 *
 * K/V stream through shared memory ATT_BK positions at a time, covering
 * the union of the rows' visible ranges; each warp keeps an online softmax
 * (running max, sum, accumulator) for ATT_ROWS/4 rows, lane j scoring
 * position j of the tile, so memory is O(tile) whatever the length. */
#include <math.h>

#include "cuda_impl.h"

#define ATT_WARPS 4
#define ATT_RPW 4                          /* rows per warp */
#define ATT_ROWS (ATT_WARPS * ATT_RPW)     /* rows per block */
#define ATT_BK 32                          /* positions per K/V tile (= lanes) */
#define ATT_MAX_HD 256
#define ATT_SPLIT_MIN 256      /* shortest position range a decode split gets (auto) */
#define ATT_TARGET_BLOCKS 264  /* blocks that keep an H100/H200 (132 SMs) busy, twice over */

static __device__ __forceinline__ float kv_load(const __half *p, size_t i) { return __half2float(p[i]); }
static __device__ __forceinline__ float kv_load(const float *p, size_t i) { return p[i]; }
static __device__ __forceinline__ void kv_put(__half *p, size_t i, float v) { p[i] = __float2half_rn(v); }
static __device__ __forceinline__ void kv_put(float *p, size_t i, float v) { p[i] = v; }

static __device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Decode when sq.q_start is NULL: sequence s has one query, row s. With
 * n_split > 1 (decode), block x covers row block x / n_split and positions
 * [split * split_len, (split + 1) * split_len), and writes its unnormalised
 * state (max, sum, accumulator: hd + 2 floats per query head) to part for
 * kernel_attn_combine. */
template <typename KT>
static __global__ void __launch_bounds__(32 * ATT_WARPS)
    kernel_attention(float *out, const float *q, int q_stride, const uint8_t *arena, size_t block_bytes, int bs,
                     int n_head_kv, int hd, int group, tl_cuda_attn_seqs sq, int window, float scale, int n_split,
                     int split_len, float *part) {
    extern __shared__ float smem[];
    const int s = blockIdx.y, kvh = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int qs = sq.q_start ? sq.q_start[s] : s;
    const int ql = sq.q_start ? sq.q_len[s] : 1;
    const int p0 = sq.pos0[s];
    const int split = blockIdx.x % n_split;
    const int rows = ql * group, row0 = blockIdx.x / n_split * ATT_ROWS;
    if (row0 >= rows) return;
    int w = window;
    const int sw = sq.window ? sq.window[s] : 0;
    if (sw > 0 && (w <= 0 || sw < w)) w = sw;
    const int n_head = n_head_kv * group;

    float *Qs = smem, *Ks = Qs + ATT_ROWS * hd, *Vs = Ks + ATT_BK * (hd + 1);
    for (int i = threadIdx.x; i < ATT_ROWS * hd; i += blockDim.x) {
        const int r = i / hd, d = i % hd, rr = row0 + r;
        float v = 0.0f;
        if (rr < rows)
            v = q[(size_t)(qs + rr / group) * q_stride + (size_t)(kvh * group + rr % group) * hd + d] * scale;
        Qs[i] = v;
    }
    const int last = min(rows, row0 + ATT_ROWS) - 1;
    const int pmin = p0 + row0 / group, pmax = p0 + last / group;
    /* Tiles start at multiples of ATT_BK whatever the block's rows, so a
     * query sums its positions in the same groups in any batch (the exact
     * mode's batch invariance); the extra masked positions add nothing. */
    const int jlo = (w > 0 && pmin >= w ? pmin - w + 1 : 0) / ATT_BK * ATT_BK;
    const int32_t *ids = sq.block_ids + (size_t)s * sq.seq_stride;
    const size_t v_off = block_bytes / 2 / sizeof(KT);

    float m[ATT_RPW], l[ATT_RPW], acc[ATT_RPW][ATT_MAX_HD / 32];
#pragma unroll
    for (int k = 0; k < ATT_RPW; k++) {
        m[k] = -INFINITY;
        l[k] = 0.0f;
#pragma unroll
        for (int i = 0; i < ATT_MAX_HD / 32; i++) acc[k][i] = 0.0f;
    }

    int jb0 = jlo, jend = pmax;
    if (n_split > 1) { /* split_len is a multiple of ATT_BK: tiles stay aligned */
        jb0 = max(jlo, split * split_len);
        jend = min(pmax, (split + 1) * split_len - 1);
    }
    for (int jb = jb0; jb <= jend; jb += ATT_BK) {
        __syncthreads(); /* the previous tile is consumed (and Qs written, first time) */
        for (int i = threadIdx.x; i < ATT_BK * hd; i += blockDim.x) {
            const int jj = i / hd, d = i % hd, j = jb + jj;
            float kv = 0.0f, vv = 0.0f;
            if (j <= pmax) {
                const int id = ids[(size_t)(j / bs) * sq.blk_stride];
                if (id >= 0) {
                    const KT *kb = (const KT *)(arena + (size_t)id * block_bytes);
                    const size_t off = ((size_t)kvh * bs + j % bs) * hd + d;
                    kv = kv_load(kb, off);
                    vv = kv_load(kb, v_off + off);
                }
            }
            Ks[jj * (hd + 1) + d] = kv;
            Vs[jj * hd + d] = vv;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < ATT_RPW; k++) {
            const int r = warp + ATT_WARPS * k, rr = row0 + r;
            if (rr >= rows) continue; /* warp-uniform */
            const int pos = p0 + rr / group;
            const int lo = w > 0 && pos >= w ? pos - w + 1 : 0;
            const int j = jb + lane;
            const bool valid = j >= lo && j <= pos;
            float sc = -INFINITY;
            if (valid) {
                const float *qr = Qs + r * hd, *kr = Ks + lane * (hd + 1);
                float a = 0.0f;
                for (int d = 0; d < hd; d++) a = fmaf(qr[d], kr[d], a);
                sc = a;
            }
            const float mn = fmaxf(m[k], warp_max(sc));
            if (mn == -INFINITY) continue; /* nothing visible yet */
            const float p = valid ? expf(sc - mn) : 0.0f;
            const float corr = expf(m[k] - mn);
            l[k] = l[k] * corr + warp_sum(p);
            m[k] = mn;
#pragma unroll
            for (int i = 0; i < ATT_MAX_HD / 32; i++) acc[k][i] *= corr;
            for (int jj = 0; jj < ATT_BK; jj++) {
                const float pj = __shfl_sync(0xffffffffu, p, jj);
                /* Masked positions (p = 0, warp-uniform) add nothing; skipping them
                 * also keeps an inf in a V row a query does not see (f16 overflow)
                 * from turning its output into 0 * inf = NaN, as on the CPU. */
                if (pj == 0.0f) continue;
                const float *vr = Vs + jj * hd;
#pragma unroll
                for (int i = 0; i < ATT_MAX_HD / 32; i++) {
                    const int d = lane + 32 * i;
                    if (d < hd) acc[k][i] = fmaf(pj, vr[d], acc[k][i]);
                }
            }
        }
    }
#pragma unroll
    for (int k = 0; k < ATT_RPW; k++) {
        const int rr = row0 + warp + ATT_WARPS * k;
        if (rr >= rows) continue;
        if (n_split > 1) { /* decode: row rr is query head kvh * group + rr */
            float *pp = part + ((size_t)(s * n_head + kvh * group + rr) * n_split + split) * (hd + 2);
            if (lane == 0) pp[0] = m[k], pp[1] = l[k];
#pragma unroll
            for (int i = 0; i < ATT_MAX_HD / 32; i++) {
                const int d = lane + 32 * i;
                if (d < hd) pp[2 + d] = acc[k][i];
            }
            continue;
        }
        const float inv = l[k] > 0.0f ? 1.0f / l[k] : 0.0f;
        float *o = out + (size_t)(qs + rr / group) * n_head * hd + (size_t)(kvh * group + rr % group) * hd;
#pragma unroll
        for (int i = 0; i < ATT_MAX_HD / 32; i++) {
            const int d = lane + 32 * i;
            if (d < hd) o[d] = acc[k][i] * inv;
        }
    }
}

/* Block (s * n_head + h): the split states of one decode query, rescaled
 * to their common max and summed, then normalised. */
static __global__ void kernel_attn_combine(float *out, const float *part, int n_split, int hd) {
    const float *p = part + (size_t)blockIdx.x * n_split * (hd + 2);
    float mx = -INFINITY, sum = 0.0f;
    for (int i = 0; i < n_split; i++) mx = fmaxf(mx, p[(size_t)i * (hd + 2)]);
    for (int i = 0; i < n_split; i++) {
        const float mi = p[(size_t)i * (hd + 2)];
        if (mi != -INFINITY) sum += p[(size_t)i * (hd + 2) + 1] * expf(mi - mx);
    }
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float a = 0.0f;
        for (int i = 0; i < n_split; i++) {
            const float mi = p[(size_t)i * (hd + 2)];
            if (mi != -INFINITY) a += p[(size_t)i * (hd + 2) + 2 + d] * expf(mi - mx);
        }
        out[(size_t)blockIdx.x * hd + d] = sum > 0.0f ? a / sum : 0.0f;
    }
}

template <typename KT>
static __global__ void kernel_kv_store(uint8_t *arena, size_t block_bytes, int bs, int n_head_kv, int hd,
                                       const float *k, const float *v, int src_stride, const int32_t *slots) {
    const int t = blockIdx.x, slot = slots[t];
    const int id = slot / bs, r = slot % bs;
    KT *kb = (KT *)(arena + (size_t)id * block_bytes);
    const size_t v_off = block_bytes / 2 / sizeof(KT);
    for (int e = threadIdx.x; e < n_head_kv * hd; e += blockDim.x) {
        const int h = e / hd, d = e % hd;
        const size_t off = ((size_t)h * bs + r) * hd + d;
        kv_put(kb, off, k[(size_t)t * src_stride + e]);
        kv_put(kb, v_off + off, v[(size_t)t * src_stride + e]);
    }
}

/* ---- launchers --------------------------------------------------------------- */

/* More than 48 KiB of dynamic shared memory must be allowed per kernel and
 * device. Done once, by the first (eager) launch: a graph capture then
 * never meets this call. */
template <typename K>
static int allow_smem(tl_cuda *c, K kernel, int which, size_t smem) {
    static int allowed[2][TLC_MAX_DEVICES];
    if (smem <= 48 * 1024) return TL_CUDA_OK;
    int *a = c->device < TLC_MAX_DEVICES ? &allowed[which][c->device] : NULL;
    if (a && __atomic_load_n(a, __ATOMIC_RELAXED) >= (int)smem) return TL_CUDA_OK;
    TLC_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    if (a) __atomic_store_n(a, (int)smem, __ATOMIC_RELAXED);
    return TL_CUDA_OK;
}

extern "C" TL_CUDA_API size_t tl_cuda_kv_block_bytes(const tl_cuda_kv *kv) {
    const size_t elem = kv->kv_type == TL_CUDA_KV_F32 ? 4 : 2;
    return 2 * (size_t)kv->n_head_kv * kv->block_size * kv->head_dim * elem;
}

static int check_kv(const tl_cuda_kv *kv) {
    TLC_ARG(kv && kv->arena, "no KV arena");
    TLC_ARG(kv->kv_type == TL_CUDA_KV_F16 || kv->kv_type == TL_CUDA_KV_F32, "unknown KV type %d", kv->kv_type);
    TLC_ARG(kv->block_size > 0 && kv->n_head_kv > 0 && kv->head_dim > 0 && kv->head_dim <= ATT_MAX_HD,
            "bad KV shape (block_size %d, n_head_kv %d, head_dim %d; head_dim <= %d)", kv->block_size,
            kv->n_head_kv, kv->head_dim, ATT_MAX_HD);
    return TL_CUDA_OK;
}

extern "C" TL_CUDA_API int tl_cuda_kv_store(tl_cuda *c, const tl_cuda_kv *kv, const float *k, const float *v,
                                            int src_stride, int n_tok, const int32_t *slots) {
    int rc = check_kv(kv);
    if (rc) return rc;
    TLC_ARG(c && k && v && slots && n_tok >= 0 && src_stride >= kv->n_head_kv * kv->head_dim, "bad arguments");
    if (n_tok == 0) return TL_CUDA_OK;
    TLC_BIND(c);
    const size_t bb = tl_cuda_kv_block_bytes(kv);
    if (kv->kv_type == TL_CUDA_KV_F16)
        kernel_kv_store<__half><<<n_tok, 128, 0, c->stream>>>((uint8_t *)kv->arena, bb, kv->block_size,
                                                               kv->n_head_kv, kv->head_dim, k, v, src_stride, slots);
    else
        kernel_kv_store<float><<<n_tok, 128, 0, c->stream>>>((uint8_t *)kv->arena, bb, kv->block_size,
                                                              kv->n_head_kv, kv->head_dim, k, v, src_stride, slots);
    TLC_LAUNCHED(kernel_kv_store);
    return TL_CUDA_OK;
}

extern "C" TL_CUDA_API int tl_cuda_kv_copy(tl_cuda *c, const tl_cuda_kv *kv, int dst, int src) {
    int rc = check_kv(kv);
    if (rc) return rc;
    TLC_ARG(c && dst >= 0 && src >= 0, "bad block ids (dst %d, src %d)", dst, src);
    if (dst == src) return TL_CUDA_OK;
    TLC_BIND(c);
    const size_t bb = tl_cuda_kv_block_bytes(kv);
    uint8_t *a = (uint8_t *)kv->arena;
    TLC_CHECK(cudaMemcpyAsync(a + (size_t)dst * bb, a + (size_t)src * bb, bb, cudaMemcpyDeviceToDevice, c->stream));
    return TL_CUDA_OK;
}

static int attention(tl_cuda *c, float *out, const float *q, int q_stride, const tl_cuda_kv *kv,
                     const tl_cuda_attn_seqs *sq, int n_head, int window, float scale, int decode) {
    int rc = check_kv(kv);
    if (rc) return rc;
    TLC_ARG(c && out && q && sq && sq->pos0 && sq->block_ids, "bad arguments");
    TLC_ARG(n_head > 0 && n_head % kv->n_head_kv == 0, "n_head %d not a multiple of n_head_kv %d", n_head,
            kv->n_head_kv);
    TLC_ARG(q_stride >= n_head * kv->head_dim, "q_stride %d < n_head*head_dim %d", q_stride, n_head * kv->head_dim);
    TLC_ARG(sq->n_seq >= 0 && sq->n_seq <= 65535, "n_seq %d out of range", sq->n_seq);
    TLC_ARG(kv->n_head_kv <= 65535, "n_head_kv %d out of range", kv->n_head_kv);
    if (sq->n_seq == 0) return TL_CUDA_OK;
    TLC_BIND(c);
    tl_cuda_attn_seqs s = *sq;
    const int group = n_head / kv->n_head_kv;
    int max_q = 1;
    if (decode) {
        s.q_start = NULL;
        s.q_len = NULL;
    } else {
        TLC_ARG(s.q_start && s.q_len && s.max_q_len >= 0, "prefill needs q_start, q_len and max_q_len");
        if (s.max_q_len == 0) return TL_CUDA_OK;
        max_q = s.max_q_len;
    }
    const int hd = kv->head_dim;
    const size_t smem = (size_t)(ATT_ROWS * hd + ATT_BK * (hd + 1) + ATT_BK * hd) * sizeof(float);
    const int n_rb = (int)(((int64_t)max_q * group + ATT_ROWS - 1) / ATT_ROWS);
    int n_split = 1, split_len = 0;
    if (decode && s.split >= 0 && s.max_pos > 0) {
        int len = s.split;
        TLC_ARG(len % ATT_BK == 0, "split %d is not a multiple of %d", len, ATT_BK);
        const int64_t blocks = (int64_t)n_rb * s.n_seq * kv->n_head_kv;
        if (len == 0 && s.max_pos > ATT_SPLIT_MIN && blocks < ATT_TARGET_BLOCKS) {
            /* enough splits to fill the device, each at least ATT_SPLIT_MIN long */
            const int64_t want = (ATT_TARGET_BLOCKS + blocks - 1) / blocks;
            len = (int)((s.max_pos + want - 1) / want);
            len = len < ATT_SPLIT_MIN ? ATT_SPLIT_MIN : (len + ATT_BK - 1) / ATT_BK * ATT_BK;
        }
        if (len > 0 && s.max_pos > len) {
            n_split = (s.max_pos + len - 1) / len;
            split_len = len;
        }
    }
    float *part = NULL;
    if (n_split > 1) {
        TLC_ARG((int64_t)n_rb * n_split <= INT32_MAX, "%d splits of %d row blocks", n_split, n_rb);
        rc = tlc_scratch(c, &c->att_part, &c->att_part_bytes,
                         (size_t)s.n_seq * n_head * n_split * (hd + 2) * sizeof(float));
        if (rc) return rc;
        part = (float *)c->att_part;
    }
    const dim3 grid((unsigned)(n_rb * n_split), (unsigned)s.n_seq, (unsigned)kv->n_head_kv);
    const size_t bb = tl_cuda_kv_block_bytes(kv);
    const uint8_t *a = (const uint8_t *)kv->arena;
    if (kv->kv_type == TL_CUDA_KV_F16) {
        if ((rc = allow_smem(c, kernel_attention<__half>, 0, smem))) return rc;
        kernel_attention<__half><<<grid, 32 * ATT_WARPS, smem, c->stream>>>(
            out, q, q_stride, a, bb, kv->block_size, kv->n_head_kv, hd, group, s, window, scale, n_split, split_len,
            part);
    } else {
        if ((rc = allow_smem(c, kernel_attention<float>, 1, smem))) return rc;
        kernel_attention<float><<<grid, 32 * ATT_WARPS, smem, c->stream>>>(
            out, q, q_stride, a, bb, kv->block_size, kv->n_head_kv, hd, group, s, window, scale, n_split, split_len,
            part);
    }
    TLC_LAUNCHED(kernel_attention);
    if (n_split > 1) {
        kernel_attn_combine<<<s.n_seq * n_head, hd < 128 ? 64 : 128, 0, c->stream>>>(out, part, n_split, hd);
        TLC_LAUNCHED(kernel_attn_combine);
    }
    return TL_CUDA_OK;
}

extern "C" TL_CUDA_API int tl_cuda_attn_decode(tl_cuda *c, float *out, const float *q, int q_stride,
                                               const tl_cuda_kv *kv, const tl_cuda_attn_seqs *seqs, int n_head,
                                               int window, float scale) {
    return attention(c, out, q, q_stride, kv, seqs, n_head, window, scale, 1);
}

extern "C" TL_CUDA_API int tl_cuda_attn_prefill(tl_cuda *c, float *out, const float *q, int q_stride,
                                                const tl_cuda_kv *kv, const tl_cuda_attn_seqs *seqs, int n_head,
                                                int window, float scale) {
    return attention(c, out, q, q_stride, kv, seqs, n_head, window, scale, 0);
}
