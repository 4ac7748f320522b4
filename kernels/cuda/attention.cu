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
 * position j of the tile, so memory is O(tile) whatever the length.
 *
 * KV rows are in the engine's block layout (engine/kv_layout.h) in any of
 * its row types, K and V each their own: f16, f32, or q8 / q4 groups
 * (scale + quants). Quantized rows are dequantized as a tile is loaded
 * into shared memory, and quantized by the store kernel with the CPU's
 * rounding (engine/kv_mode.c), so an arena means the same on both. */
#include <math.h>

#include "cuda_impl.h"

#define ATT_WARPS 4
#define ATT_RPW 4                          /* rows per warp */
#define ATT_ROWS (ATT_WARPS * ATT_RPW)     /* rows per block */
#define ATT_BK 32                          /* positions per K/V tile (= lanes) */
#define ATT_MAX_HD 256
#define ATT_SPLIT_MIN 256      /* shortest position range a decode split gets (auto) */
#define ATT_TARGET_BLOCKS 264  /* blocks that keep an H100/H200 (132 SMs) busy, twice over */

/* ---- KV rows: one accessor per row type (engine/kv_layout.h) -------------------
 *
 * kv_row<T>::load(row, d, gs) is element d of a row as f32 (quantized
 * rows: group size G = 1 << gs); kv_row<T>::store(row, c, x, gs) writes
 * chunk c of a row from f32 x (the chunk's own values): one element for
 * f16/f32, one quantization group for q8/q4, whose scale needs the whole
 * group; kv_row<T>::chunk(gs) is the number of values in a chunk. The
 * kernels are templated on the K and V row types, so f16/f32 rows keep
 * their plain loads. Quantized groups are 2 + G (q8) or 4 + G/2 (q4) bytes,
 * an odd count when G = 1 (q8) or 2 (q4): their f16 scales (and q4's
 * minimum) are read and written a byte at a time. */
template <int T> struct kv_row;

template <> struct kv_row<TL_KVT_F16> {
    static __device__ __forceinline__ int chunk(int) { return 1; }
    static __device__ __forceinline__ float load(const uint8_t *row, int d, int) {
        return __half2float(((const __half *)row)[d]);
    }
    static __device__ __forceinline__ void store(uint8_t *row, int c, const float *x, int) {
        ((__half *)row)[c] = __float2half_rn(x[0]);
    }
};

template <> struct kv_row<TL_KVT_F32> {
    static __device__ __forceinline__ int chunk(int) { return 1; }
    static __device__ __forceinline__ float load(const uint8_t *row, int d, int) { return ((const float *)row)[d]; }
    static __device__ __forceinline__ void store(uint8_t *row, int c, const float *x, int) {
        ((float *)row)[c] = x[0];
    }
};

static __device__ __forceinline__ float scale_at(const uint8_t *b) {
    return __half2float(__ushort_as_half((unsigned short)(b[0] | b[1] << 8)));
}
static __device__ __forceinline__ void scale_put(uint8_t *b, float d) {
    const unsigned short h = __half_as_ushort(__float2half_rn(d));
    b[0] = (uint8_t)(h & 0xff);
    b[1] = (uint8_t)(h >> 8);
}

/* The rounding of kv_mode.c's store_q8 / store_q4 (ggml's reference
 * quantizers), operation for operation: the _rn intrinsics keep nvcc from
 * fusing (x - min) * id + 0.5 into one fma, which would round differently from the
 * CPU's multiply-then-add, so both backends store the same bytes. */
template <> struct kv_row<TL_KVT_Q8> {
    static __device__ __forceinline__ int chunk(int gs) { return 1 << gs; }
    static __device__ __forceinline__ float load(const uint8_t *row, int d, int gs) {
        const int G = 1 << gs;
        const uint8_t *b = row + (size_t)(d >> gs) * (2 + G);
        return scale_at(b) * (float)(int8_t)b[2 + (d & (G - 1))];
    }
    static __device__ void store(uint8_t *row, int c, const float *x, int gs) {
        const int G = 1 << gs;
        uint8_t *b = row + (size_t)c * (2 + G);
        float amax = 0.0f;
        for (int i = 0; i < G; i++) amax = fmaxf(amax, fabsf(x[i]));
        const float d = __fdiv_rn(amax, 127.0f), id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
        scale_put(b, d);
        for (int i = 0; i < G; i++) b[2 + i] = (uint8_t)(int8_t)roundf(__fmul_rn(x[i], id));
    }
};

template <> struct kv_row<TL_KVT_Q4> {
    static __device__ __forceinline__ int chunk(int gs) { return 1 << gs; }
    /* a group: f16 scale d, f16 minimum m, then byte j = element j (low
     * nibble) and j + G/2 (high); value q * d + m (ggml's q4_1) */
    static __device__ __forceinline__ float load(const uint8_t *row, int d, int gs) {
        const int G = 1 << gs, h = G >> 1, e = d & (G - 1);
        const uint8_t *b = row + (size_t)(d >> gs) * (4 + h);
        const int q = e < h ? b[4 + e] & 15 : b[4 + e - h] >> 4;
        return __fadd_rn(__fmul_rn((float)q, scale_at(b)), scale_at(b + 2));
    }
    static __device__ void store(uint8_t *row, int c, const float *x, int gs) {
        const int G = 1 << gs, h = G >> 1;
        uint8_t *b = row + (size_t)c * (4 + h);
        float mn = x[0], mx = x[0];
        for (int i = 1; i < G; i++) {
            if (x[i] < mn) mn = x[i];
            if (x[i] > mx) mx = x[i];
        }
        const float d = __fdiv_rn(__fsub_rn(mx, mn), 15.0f), id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
        scale_put(b, d);
        scale_put(b + 2, mn);
        for (int i = 0; i < h; i++) {
            const int lo = min(15, max(0, (int)__fadd_rn(__fmul_rn(__fsub_rn(x[i], mn), id), 0.5f)));
            const int hi = min(15, max(0, (int)__fadd_rn(__fmul_rn(__fsub_rn(x[i + h], mn), id), 0.5f)));
            b[4 + i] = (uint8_t)(lo | hi << 4);
        }
    }
};

/* Where a block's rows are (from tl_kv_layout): row (h, r) of K at
 * block + (h * bs + r) * rb_k, of V at block + k_bytes + (h * bs + r) * rb_v. */
typedef struct kv_geom {
    size_t block_bytes, k_bytes, rb_k, rb_v;
    int bs;
    int gs; /* log2 of the quantization group */
} kv_geom;

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
template <int TK, int TV>
static __global__ void __launch_bounds__(32 * ATT_WARPS)
    kernel_attention(float *out, const float *q, int q_stride, const uint8_t *arena, kv_geom kg, int n_head_kv,
                     int hd, int group, tl_cuda_attn_seqs sq, int window, float scale, int n_split, int split_len,
                     float *part) {
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
    const int bs = kg.bs;

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
                if (id >= 0) { /* rows dequantize here, on their way into shared memory */
                    const uint8_t *blk = arena + (size_t)id * kg.block_bytes;
                    const size_t row = (size_t)kvh * bs + j % bs;
                    kv = kv_row<TK>::load(blk + row * kg.rb_k, d, kg.gs);
                    vv = kv_row<TV>::load(blk + kg.k_bytes + row * kg.rb_v, d, kg.gs);
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

/* Block t stores token t: each thread takes chunks (elements, or whole
 * quantization groups) of its K and V rows. */
template <int TK, int TV>
static __global__ void kernel_kv_store(uint8_t *arena, kv_geom kg, int n_head_kv, int hd, const float *k,
                                       const float *v, int src_stride, const int32_t *slots) {
    const int t = blockIdx.x, slot = slots[t];
    const int id = slot / kg.bs, r = slot % kg.bs;
    uint8_t *blk = arena + (size_t)id * kg.block_bytes;
    const int ck = kv_row<TK>::chunk(kg.gs), cv = kv_row<TV>::chunk(kg.gs);
    const int nk = n_head_kv * (hd / ck), nv = n_head_kv * (hd / cv);
    for (int e = threadIdx.x; e < nk + nv; e += blockDim.x) {
        const bool is_v = e >= nk;
        const int c = is_v ? e - nk : e, per_row = hd / (is_v ? cv : ck), h = c / per_row, ci = c % per_row;
        const size_t row = (size_t)h * kg.bs + r;
        const float *x = (is_v ? v : k) + (size_t)t * src_stride + (size_t)h * hd;
        if (is_v)
            kv_row<TV>::store(blk + kg.k_bytes + row * kg.rb_v, ci, x + ci * cv, kg.gs);
        else
            kv_row<TK>::store(blk + row * kg.rb_k, ci, x + ci * ck, kg.gs);
    }
}

/* ---- launchers --------------------------------------------------------------- */

/* More than 48 KiB of dynamic shared memory must be allowed per kernel and
 * device. Done once, by the first (eager) launch: a graph capture then
 * never meets this call. */
template <typename K>
static int allow_smem(tl_cuda *c, K kernel, int which, size_t smem) {
    static int allowed[TL_KVT_COUNT * TL_KVT_COUNT][TLC_MAX_DEVICES]; /* which: one per kernel instance */
    if (smem <= 48 * 1024) return TL_CUDA_OK;
    int *a = c->device < TLC_MAX_DEVICES ? &allowed[which][c->device] : NULL;
    if (a && __atomic_load_n(a, __ATOMIC_RELAXED) >= (int)smem) return TL_CUDA_OK;
    TLC_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    if (a) __atomic_store_n(a, (int)smem, __ATOMIC_RELAXED);
    return TL_CUDA_OK;
}

/* The engine's layout of a block (kv_layout.h); -1 when the description is bad. */
static int layout_of(const tl_cuda_kv *kv, tl_kv_layout *l) {
    if (!kv || kv->type_k < 0 || kv->type_k >= TL_KVT_COUNT || kv->type_v < 0 || kv->type_v >= TL_KVT_COUNT ||
        kv->block_size <= 0 || kv->n_head_kv <= 0 || kv->head_dim <= 0)
        return -1;
    return tl_kv_layout_init(l, kv->type_k, kv->type_v, 0, kv->block_size, kv->n_head_kv, kv->head_dim, 0);
}

extern "C" TL_CUDA_API size_t tl_cuda_kv_block_bytes(const tl_cuda_kv *kv) {
    tl_kv_layout l;
    return layout_of(kv, &l) == 0 ? l.block_bytes : 0;
}

/* Checks kv and fills *g with its block geometry. */
static int check_kv(const tl_cuda_kv *kv, kv_geom *g) {
    TLC_ARG(kv && kv->arena, "no KV arena");
    TLC_ARG(kv->type_k >= 0 && kv->type_k < TL_KVT_COUNT && kv->type_v >= 0 && kv->type_v < TL_KVT_COUNT,
            "unknown KV row types (K %d, V %d; f16 0, f32 1, q8 2, q4 3)", kv->type_k, kv->type_v);
    TLC_ARG(kv->block_size > 0 && kv->n_head_kv > 0 && kv->head_dim > 0 && kv->head_dim <= ATT_MAX_HD,
            "bad KV shape (block_size %d, n_head_kv %d, head_dim %d; head_dim <= %d)", kv->block_size,
            kv->n_head_kv, kv->head_dim, ATT_MAX_HD);
    tl_kv_layout l;
    TLC_ARG(layout_of(kv, &l) == 0, "q4 KV rows need an even head_dim (got %d)", kv->head_dim);
    int gs = 0;
    while ((1 << gs) < l.group) gs++;
    g->block_bytes = l.block_bytes;
    g->k_bytes = l.k_bytes;
    g->rb_k = l.row_bytes_k;
    g->rb_v = l.row_bytes_v;
    g->bs = kv->block_size;
    g->gs = gs;
    return TL_CUDA_OK;
}

/* Each launcher is instantiated for every (K, V) pair of row types; pick()
 * turns the runtime pair into the instance. */
template <template <int, int> class L, int TK> static typename L<0, 0>::fn pick_v(int tv) {
    switch (tv) {
    case TL_KVT_F32: return L<TK, TL_KVT_F32>::run;
    case TL_KVT_Q8: return L<TK, TL_KVT_Q8>::run;
    case TL_KVT_Q4: return L<TK, TL_KVT_Q4>::run;
    default: return L<TK, TL_KVT_F16>::run;
    }
}
template <template <int, int> class L> static typename L<0, 0>::fn pick(int tk, int tv) {
    switch (tk) {
    case TL_KVT_F32: return pick_v<L, TL_KVT_F32>(tv);
    case TL_KVT_Q8: return pick_v<L, TL_KVT_Q8>(tv);
    case TL_KVT_Q4: return pick_v<L, TL_KVT_Q4>(tv);
    default: return pick_v<L, TL_KVT_F16>(tv);
    }
}

template <int TK, int TV> struct store_launch {
    typedef void (*fn)(tl_cuda *, uint8_t *, const kv_geom &, int, int, const float *, const float *, int, int,
                       const int32_t *);
    static void run(tl_cuda *c, uint8_t *arena, const kv_geom &g, int n_head_kv, int hd, const float *k,
                    const float *v, int src_stride, int n_tok, const int32_t *slots) {
        kernel_kv_store<TK, TV><<<n_tok, 128, 0, c->stream>>>(arena, g, n_head_kv, hd, k, v, src_stride, slots);
    }
};

extern "C" TL_CUDA_API int tl_cuda_kv_store(tl_cuda *c, const tl_cuda_kv *kv, const float *k, const float *v,
                                            int src_stride, int n_tok, const int32_t *slots) {
    kv_geom g;
    int rc = check_kv(kv, &g);
    if (rc) return rc;
    TLC_ARG(c && k && v && slots && n_tok >= 0 && src_stride >= kv->n_head_kv * kv->head_dim, "bad arguments");
    if (n_tok == 0) return TL_CUDA_OK;
    TLC_BIND(c);
    pick<store_launch>(kv->type_k, kv->type_v)(c, (uint8_t *)kv->arena, g, kv->n_head_kv, kv->head_dim, k, v,
                                                src_stride, n_tok, slots);
    TLC_LAUNCHED(kernel_kv_store);
    return TL_CUDA_OK;
}

extern "C" TL_CUDA_API int tl_cuda_kv_copy(tl_cuda *c, const tl_cuda_kv *kv, int dst, int src) {
    kv_geom g;
    int rc = check_kv(kv, &g);
    if (rc) return rc;
    TLC_ARG(c && dst >= 0 && src >= 0, "bad block ids (dst %d, src %d)", dst, src);
    if (dst == src) return TL_CUDA_OK;
    TLC_BIND(c);
    const size_t bb = g.block_bytes;
    uint8_t *a = (uint8_t *)kv->arena;
    TLC_CHECK(cudaMemcpyAsync(a + (size_t)dst * bb, a + (size_t)src * bb, bb, cudaMemcpyDeviceToDevice, c->stream));
    return TL_CUDA_OK;
}

/* One attention launch, after the checks: everything kernel_attention takes. */
typedef struct att_call {
    float *out;
    const float *q;
    int q_stride;
    const uint8_t *arena;
    kv_geom g;
    int n_head_kv, hd, group;
    tl_cuda_attn_seqs s;
    int window;
    float scale;
    int n_split, split_len;
    float *part;
    dim3 grid;
    size_t smem;
} att_call;

template <int TK, int TV> struct att_launch {
    typedef int (*fn)(tl_cuda *, const att_call &);
    static int run(tl_cuda *c, const att_call &a) {
        int rc = allow_smem(c, kernel_attention<TK, TV>, TK * TL_KVT_COUNT + TV, a.smem);
        if (rc) return rc;
        kernel_attention<TK, TV><<<a.grid, 32 * ATT_WARPS, a.smem, c->stream>>>(
            a.out, a.q, a.q_stride, a.arena, a.g, a.n_head_kv, a.hd, a.group, a.s, a.window, a.scale, a.n_split,
            a.split_len, a.part);
        TLC_LAUNCHED(kernel_attention);
        return TL_CUDA_OK;
    }
};

static int attention(tl_cuda *c, float *out, const float *q, int q_stride, const tl_cuda_kv *kv,
                     const tl_cuda_attn_seqs *sq, int n_head, int window, float scale, int decode) {
    kv_geom g;
    int rc = check_kv(kv, &g);
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
    att_call a = {out, q, q_stride, (const uint8_t *)kv->arena, g, kv->n_head_kv, hd, group, s, window, scale,
                  n_split, split_len, part,
                  dim3((unsigned)(n_rb * n_split), (unsigned)s.n_seq, (unsigned)kv->n_head_kv), smem};
    if ((rc = pick<att_launch>(kv->type_k, kv->type_v)(c, a))) return rc;
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
