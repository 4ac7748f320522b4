/* gemm_amx.c - the packed q8_0 / q4_0 / q5_0 / q4_1 / iq4_nl GEMM on
 * AMX-INT8 tiles (Sapphire Rapids and later: the amx level, dispatch.c).
 *
 * One tile multiply takes 16 tokens' 32-element block (tile A: token m's
 * q8_0 quants, read in place from the prepared rows, row stride ldx, or
 * for q8_0 weights from a copy of them, copy_a) and
 * the same block of a 16-row group (tile B: 8 rows of 64 bytes, row k =
 * bytes 4k..4k+3 of weight rows 0..15 - the layout TL_PACK16 stores q8_0
 * in, and the one gemm_avx512.c's workspace holds for the other kinds):
 * 8192 multiply-adds, 128 vpdpbusd's worth, in one instruction. Tile C
 * then holds, for token m and weight row r, the exact integer block sum
 * the VNNI tiles build in lane r of their register for token m. It goes
 * through memory into their epilogue, block by block:
 *
 *   s = C[m] + corr_m,b;  acc_m = fma((float)s, d_w,b * d_y,m,b, acc_m)
 *
 * (q4_1: a second FMA), so every output is bitwise the VNNI tile's and
 * tl_vec_dot_ref's. q8_0 is multiplied signed by signed (TDPBSSD) straight
 * from the packed rows, with no bias to correct; the other kinds as the
 * unsigned bytes the VNNI tiles read (TDPBSUD), with its correction.
 *
 * A tile multiply covers one 32-element block, not the 64 elements AMX
 * can take, because every block has its own scales, so each 8192
 * multiply-adds cost a C store, two tile loads and the float epilogue (a
 * convert, a multiply and an FMA per token and block, 48 vector ops; it
 * was a multiply and an add instead of the FMA until the reference summed
 * with one: 16 tokens x 2048 x 256 in L2, one thread, 30 interleaved
 * pairs, median 0.92 of the time, fastest 2.18 against 2.68 us a group).
 * Measured on one Emerald Rapids core: the tile work alone ~47 cycles a
 * block (store 17, activation load 17, weight load 9, multiply 13), and it
 * does not overlap the epilogue: q8_0, 16 tokens x 2048 x 768 in L2, the
 * tile work alone (epilogue dropped) runs at 460-536 GMAC/s, the epilogue
 * alone (tile work dropped) at 605-668, both together at 275-292 - the
 * sum of the two times - also when the epilogue reads a buffer no tile
 * is stored to: they share the core's ports, not a dependency. So the
 * gain over VNNI is modest: q8_0 16 tokens x 65536 x 768 from memory
 * 234 GMAC/s against 167-180 (VNNI), 64 tokens x 768 x 3072 in L2 266.
 * The tiles of the next two blocks are issued before the sums of these
 * two.
 *
 * Whole 16-token tiles go first, then the rest as one tile of fewer rows
 * (a tile's multiply, loads and store cost about its rows), or, fewer than
 * TL_AMX_MIN_TOKENS, by the VNNI kernel (decode of a few sequences is
 * bound by reading the weights either way). */
#include "quants_impl.h"

enum { XA_BYTES = 192 * 1024 }; /* the copies of a run of A tiles (copy_a, copy_scales), at most */

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <string.h>

#include "amx_cfg.h"
#include "gemm_q.h"
#include "blocks_avx512.h"

#define TA __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c,amx-tile,amx-int8")))

#ifndef TL_AMX_MIN_TOKENS
#define TL_AMX_MIN_TOKENS 10
#endif

/* Tiles 0, 1: C (M tokens x 16 int32); 2, 3: A (M tokens x 32 bytes);
 * 4, 5: B (8 x 64 bytes). Two of each: two blocks in flight. */
static inline AI TA void configure(int M) {
    tl_tile_cfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 6; t++) {
        c.rows[t] = (uint8_t)(t >= 4 ? 8 : M);
        c.colsb[t] = t == 2 || t == 3 ? 32 : 64;
    }
    tl_tile_loadconfig(&c);
}

/* Block b's B tile and scales: in the packed group itself (q8_0) or in
 * the workspace the group was unpacked into (group_bytes a block). */
static inline AI TA const uint8_t *b_tile(int kind, const uint8_t *src, int64_t b) {
    return kind == Q_8_0 ? src + (size_t)b * 16 * sizeof(block_q8_0) + 32 : src + (size_t)b * group_bytes(kind);
}

static inline AI TA __m512 b_scales(int kind, const uint8_t *src, int64_t b) {
    if (kind == Q_8_0) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + (size_t)b * 16 * sizeof(block_q8_0))));
    return _mm512_load_ps((const float *)(b_tile(kind, src, b) + 8 * 64));
}

/* Tile A of block b: 16 tokens' quants, lda bytes apart, blocks abs
 * bytes apart (the prepared rows themselves, or q8_0's copy of them);
 * token m's scale of block b at dy[16 * b + m] and its corr slot (the
 * bias correction, or q4_1's sy) at cr[16 * b + m] (copy_scales). */
typedef struct {
    const uint8_t *p;
    size_t lda, abs;
    const float *dy;
    const int32_t *cr;
} a_rows;

/* Block b's C tile (cs, 16 x 16 int32) into the 16 tokens' accumulators,
 * as mk (gemm_avx512.c) sums its registers. */
static inline AI TA void epilogue(int kind, const uint8_t *src, int64_t b, const int32_t *cs, a_rows a, int M,
                                  __m512 acc[16]) {
    const __m512 dw = b_scales(kind, src, b);
    const __m512 dm = has_min(kind) ? _mm512_load_ps((const float *)(b_tile(kind, src, b) + 9 * 64)) : dw;
    const float *dy = a.dy + 16 * b;
    const int32_t *cr = a.cr + 16 * b;
    UNROLL16 for (int m = 0; m < 16; m++) {
        if (m >= M) break;
        __m512i s = _mm512_load_si512(cs + 16 * m);
        const __m512 d = _mm512_mul_ps(dw, _mm512_set1_ps(dy[m]));
        /* the corr slot: q4_1 / q5_1's sy_b, else the unsigned bias's correction (q8_0 has none here) */
        if (!has_min(kind) && kind != Q_8_0) s = _mm512_add_epi32(s, _mm512_set1_epi32(cr[m]));
        float sy = 0.0f;
        if (has_min(kind)) memcpy(&sy, &cr[m], 4);
        acc[m] = block_sum(kind, acc[m], s, d, dm, sy);
    }
}

/* The weight stream's lines go to L2 PF_PACKED ahead, as load_packed asks
 * for them, and to L1 PF_L1 ahead: the B tile loads had waited on L2
 * (110M Q8_0, every matmul of a decode step at 16 tokens, interleaved
 * runs: two threads 0.95-0.98 of the time over three sets of 8-12, one
 * thread 0.88 over 6; 2 KiB ahead 0.95-0.98, 1 KiB worse; the L1
 * prefetch alone 1.09, no prefetch at all 1.44). */
enum { PF_L1 = 4096 };

/* Blocks b and b + 1 (b + 1 < nb) multiplied into tiles 0 and 1. */
static inline AI TA void tiles2(int kind, const uint8_t *src, int pf, a_rows a, int64_t b) {
    if (pf)
        for (size_t k = 0; k < 2 * 16 * sizeof(block_q8_0); k += 64) {
            const char *p = (const char *)(src + (size_t)b * 16 * bw_of(kind) + k);
            _mm_prefetch(p + PF_PACKED, _MM_HINT_T1);
            _mm_prefetch(p + PF_L1, _MM_HINT_T0);
        }
    _tile_zero(0);
    _tile_zero(1);
    _tile_loadd(2, a.p + (size_t)b * a.abs, a.lda);
    _tile_loadd(3, a.p + (size_t)(b + 1) * a.abs, a.lda);
    _tile_loadd(4, b_tile(kind, src, b), 64);
    _tile_loadd(5, b_tile(kind, src, b + 1), 64);
    if (kind == Q_8_0) {
        _tile_dpbssd(0, 2, 4);
        _tile_dpbssd(1, 3, 5);
    } else {
        _tile_dpbsud(0, 2, 4);
        _tile_dpbsud(1, 3, 5);
    }
}

static inline AI TA void stores2(int32_t cs[2][256]) {
    _tile_stored(0, cs[0], 64);
    _tile_stored(1, cs[1], 64);
    TL_TILE_FENCE();
}

/* Where the C tiles of the next two blocks are stored: before the sums of
 * these two, or after them (late). Late, the sums' loads are not queued
 * behind a tile store that waits for its multiply; but only q8_0 gains:
 * 16 tokens x 2048 x 768 in L2, 213 -> 230-245 GMAC/s (and 128 tokens
 * 200 -> 224), where the kinds unpacked into the workspace lost 5-10%. */
#define LATE(kind) ((kind) == Q_8_0)

/* M tokens (their quants and scales as a; the tiles configured for M)
 * against one 16-row group whose blocks are at src. */
static inline AI TA void tile16(int kind, int64_t nb, const uint8_t *src, int pf, a_rows a, float *out, size_t ldo,
                                int M) {
    _Alignas(64) int32_t cs[2][2][256];
    __m512 acc[16];
    UNROLL16 for (int m = 0; m < 16; m++) acc[m] = _mm512_setzero_ps();
    const int64_t pairs = nb / 2;
    if (pairs) {
        tiles2(kind, src, pf, a, 0);
        stores2(cs[0]);
    }
    for (int64_t p = 0; p < pairs; p++) {
        const int next = p + 1 < pairs;
        if (next) tiles2(kind, src, pf, a, 2 * (p + 1));
        if (next && !LATE(kind)) stores2(cs[(p + 1) & 1]);
        epilogue(kind, src, 2 * p, cs[p & 1][0], a, M, acc);
        epilogue(kind, src, 2 * p + 1, cs[p & 1][1], a, M, acc);
        if (next && LATE(kind)) stores2(cs[(p + 1) & 1]);
    }
    if (nb & 1) {
        const int64_t b = nb - 1;
        _tile_zero(0);
        _tile_loadd(2, a.p + (size_t)b * a.abs, a.lda);
        _tile_loadd(4, b_tile(kind, src, b), 64);
        if (kind == Q_8_0) _tile_dpbssd(0, 2, 4);
        else _tile_dpbsud(0, 2, 4);
        _tile_stored(0, cs[0][0], 64);
        TL_TILE_FENCE();
        epilogue(kind, src, b, cs[0][0], a, M, acc);
    }
    UNROLL16 for (int m = 0; m < 16; m++)
        if (m < M) _mm512_storeu_ps(out + m * ldo, acc[m]);
}

/* q8_0's tile A rows from a copy: the quants of M tokens block by block,
 * 32 bytes a token, 512 a block. A tile load of rows 32 bytes apart costs
 * about half one of rows a prepared row apart (~900 bytes at n = 768),
 * and the copy is made once per call for every row group: 16 tokens x
 * 2048 x 768 in L2, 230-245 -> 252-266 GMAC/s, 128 tokens 224 -> 272
 * (with LATE). The unpacked kinds lost 10% with it (and without LATE),
 * so they read the prepared rows. */
static inline AI TA void copy_a(int64_t nb, const uint8_t *x, size_t ldx, int M, uint8_t *xa) {
    for (int64_t b = 0; b < nb; b++)
        for (int m = 0; m < M; m++) {
            const uint8_t *q = x + m * ldx + 2 + (size_t)b * sizeof(block_q8_0); /* past the block's scale */
            _mm256_store_si256((__m256i *)(void *)(xa + (size_t)b * 512 + m * 32),
                               _mm256_loadu_si256((const __m256i *)(const void *)q));
        }
}

/* Every kind's copy of the M tokens' block scales and corr slots, 16 of
 * each a block (a_rows' dy and cr; q8_0 has no corr): the epilogue reads
 * a block's from one pointer each, where 16 row pointers did not fit the
 * registers and were reloaded from the stack every block (stack operands
 * in amx_q8_0: 558 -> 314). q8_0, 16 tokens x 2048 x 256 in L2, one
 * thread, 30 interleaved pairs: median 0.84 of the time. */
enum { SC_BLOCK = 2 * 16 * 4 }; /* a block's scales and corr slots */

static inline AI TA void copy_scales(int kind, int64_t nb, const uint8_t *x, size_t ldx, int M, uint8_t *sc) {
    float *dy = (float *)(void *)sc;
    int32_t *cr = (int32_t *)(void *)(sc + (size_t)nb * 64);
    const size_t dyo = tl_gemm_dy_off(nb), co = tl_gemm_corr_off(nb);
    for (int64_t b = 0; b < nb; b++)
        for (int m = 0; m < M; m++) {
            dy[b * 16 + m] = ((const float *)(const void *)(x + m * ldx + dyo))[b];
            if (kind != Q_8_0) cr[b * 16 + m] = ((const int32_t *)(const void *)(x + m * ldx + co))[b];
        }
}

/* Where a tile's scales copy starts in its copies at xa: after q8_0's quants. */
static inline AI TA uint8_t *scales_at(int kind, int64_t nb, uint8_t *xa) {
    return xa + (kind == Q_8_0 ? (size_t)nb * 512 : 0);
}

static tl_gemm_tile_fn vnni_pk[TL_TYPE_COUNT];

/* The workspace: a keep_hdr (KEEP_ROOM bytes), the group unpacked for the
 * tiles (not q8_0, group_bytes a block: 640 at most), then per 16-token
 * tile of the run q8_0's quants (512 a block) and every kind's scales
 * (SC_BLOCK). The VNNI kernel's work starts past the header. */
enum { KEEP_ROOM = 64 };
#define KEEP_MAGIC 0x6b656570616d7831ull

/* Which call's copies the workspace holds, where the caller lets them be
 * reused (tl_gemm_work_keep): a decode step's matmul reaches the kernel
 * once per run of row tiles a thread claims (forward.c's mm_steal, ~5 a
 * thread), each with the same activations, and the copies were ~1.5 us
 * of each call at n = 2048 (3 us fixed of 30 for 256 rows). */
typedef struct {
    uint64_t magic; /* KEEP_MAGIC while reuse is allowed */
    const void *x;  /* the copies' source, NULL when none is held */
    size_t ldx;
    int64_t nb;
    int kind, M, tiles;
} keep_hdr;

static inline AI TA int copies_held(const keep_hdr *h, int kind, int64_t nb, int M, int tiles, const void *x,
                                    size_t ldx) {
    return h->magic == KEEP_MAGIC && h->x == x && h->ldx == ldx && h->nb == nb && h->kind == kind && h->M == M &&
           h->tiles == tiles;
}

/* Tokens [t0, t0 + M * tiles) in tiles of M against every group of nr
 * rows, in runs of as many tiles as XA_BYTES holds the copies of (the
 * weights are read again per run). */
static inline AI TA void pass(int kind, int64_t nb, int nr, int M, int tiles, float *out, size_t ldo, const uint8_t *w,
                              size_t ldw, const uint8_t *x, size_t ldx, uint8_t *work) {
    configure(M);
    keep_hdr *h = (keep_hdr *)(void *)work;
    uint8_t *wk = work + KEEP_ROOM, *xa0 = wk + (size_t)nb * 640;
    const size_t tile_a = (size_t)nb * (kind == Q_8_0 ? 512 + SC_BLOCK : SC_BLOCK);
    const int run = tile_a > XA_BYTES ? 1 : (int)(XA_BYTES / tile_a);
    /* one run holds every tile's copies: they can outlive the call */
    const int held = run >= tiles && copies_held(h, kind, nb, M, tiles, x, ldx);
    if (h->magic == KEEP_MAGIC && !held) *h = (keep_hdr){KEEP_MAGIC, run >= tiles ? x : NULL, ldx, nb, kind, M, tiles};
    for (int i0 = 0; i0 < tiles; i0 += run) {
        const int n_run = tiles - i0 < run ? tiles - i0 : run;
        const uint8_t *xr = x + (size_t)i0 * M * ldx;
        float *o = out + (size_t)i0 * M * ldo;
        for (int i = 0; i < n_run && !held; i++) {
            uint8_t *xa = xa0 + (size_t)i * tile_a;
            if (kind == Q_8_0) copy_a(nb, xr + (size_t)i * M * ldx, ldx, M, xa);
            copy_scales(kind, nb, xr + (size_t)i * M * ldx, ldx, M, scales_at(kind, nb, xa));
        }
        TL_TILE_FENCE(); /* the copies before the tile loads that read them */
        for (int r0 = 0; r0 < nr; r0 += 16) {
            const uint8_t *g = w + (size_t)r0 * ldw, *src = g;
            if (kind != Q_8_0) {
                for (int64_t b = 0; b < nb; b++) {
                    __m512i q[8];
                    __m512 dw, dm = _mm512_setzero_ps();
                    load_packed(kind, g, b, q, &dw, &dm, 1);
                    store_block(kind, wk, b, q, dw, dm);
                }
                TL_TILE_FENCE();
                src = wk;
            }
            for (int i = 0; i < n_run; i++) {
                uint8_t *xa = xa0 + (size_t)i * tile_a;
                const uint8_t *sc = scales_at(kind, nb, xa);
                const a_rows a = {kind == Q_8_0 ? xa : xr + (size_t)i * M * ldx + 2, kind == Q_8_0 ? 32 : ldx,
                                  kind == Q_8_0 ? 512 : sizeof(block_q8_0), (const float *)(const void *)sc,
                                  (const int32_t *)(const void *)(sc + (size_t)nb * 64)};
                tile16(kind, nb, src, kind == Q_8_0 && i == 0, a, o + r0 + (size_t)i * M * ldo, ldo, M);
            }
        }
    }
}

/* The GEMM on TL_PACK16 rows (nr a multiple of 16), as gemm_pk: whole
 * 16-token tiles, then the rest as one tile of fewer rows (a tile
 * multiply costs about its rows), or by the VNNI kernel when only a few. */
static inline AI TA void gemm_amx(int type, int kind, int64_t n, int nr, int nt, float *out, size_t ldo, const void *w,
                                  size_t ldw, const void *x, size_t ldx, void *work) {
    const int64_t nb = n / 32;
    const uint8_t *W = w, *X = x;
    const int full = nt / 16, rem = nt % 16;
    if (full) pass(kind, nb, nr, 16, full, out, ldo, W, ldw, X, ldx, work);
    if (rem >= TL_AMX_MIN_TOKENS)
        pass(kind, nb, nr, rem, 1, out + (size_t)full * 16 * ldo, ldo, W, ldw, X + (size_t)full * 16 * ldx, ldx, work);
    if (full || rem >= TL_AMX_MIN_TOKENS) _tile_release();
    if (rem && rem < TL_AMX_MIN_TOKENS)
        vnni_pk[type](n, nr, rem, out + (size_t)full * 16 * ldo, ldo, w, ldw, X + (size_t)full * 16 * ldx, ldx,
                      (uint8_t *)work + KEEP_ROOM);
}

#define GEMM_AMX(NAME, TYPE, KIND)                                                                                 \
    static TA void NAME(int64_t n, int nr, int nt, float *out, size_t ldo, const void *w, size_t ldw, const void *x, \
                        size_t ldx, void *work) {                                                                   \
        gemm_amx(TYPE, KIND, n, nr, nt, out, ldo, w, ldw, x, ldx, work);                                           \
    }
GEMM_AMX(amx_q8_0, TL_TYPE_Q8_0, Q_8_0)
GEMM_AMX(amx_q4_0, TL_TYPE_Q4_0, Q_4_0)
GEMM_AMX(amx_q5_0, TL_TYPE_Q5_0, Q_5_0)
GEMM_AMX(amx_q4_1, TL_TYPE_Q4_1, Q_4_1)
GEMM_AMX(amx_iq4_nl, TL_TYPE_IQ4_NL, Q_IQ4NL)
#undef GEMM_AMX

void tl_gemm_fill_amx(tl_kernel_table *t) {
    static const struct {
        int type;
        tl_gemm_tile_fn fn;
    } kinds[] = {{TL_TYPE_Q8_0, amx_q8_0},
                 {TL_TYPE_Q4_0, amx_q4_0},
                 {TL_TYPE_Q5_0, amx_q5_0},
                 {TL_TYPE_Q4_1, amx_q4_1},
                 {TL_TYPE_IQ4_NL, amx_iq4_nl}};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        const int ty = kinds[i].type;
        if (!t->gemm_tile_pk[ty] || t->pack_rows != 16) continue; /* the VNNI kernel it falls back to */
        vnni_pk[ty] = t->gemm_tile_pk[ty];
        t->gemm_tile_pk[ty] = kinds[i].fn;
    }
}

#else
void tl_gemm_fill_amx(tl_kernel_table *t) { (void)t; }
#endif

void tl_gemm_work_keep(void *work, int on) {
#if defined(__x86_64__) || defined(__i386__)
    keep_hdr *h = work;
    *h = (keep_hdr){on ? KEEP_MAGIC : 0, NULL, 0, 0, 0, 0, 0};
#else
    (void)work;
    (void)on;
#endif
}

/* the header, the unpacked group (q4_1's group_bytes: 640 a block) and the
 * copies of a run of tiles: XA_BYTES, or one tile's (q8_0: 640 a block);
 * the VNNI kernel's work (640 a block) fits past the header */
size_t tl_gemm_amx_work_size(int64_t n) {
    const size_t nb = (size_t)(n / 32), one = nb * (512 + 2 * 16 * 4);
    return 64 + nb * 640 + (one > XA_BYTES ? one : XA_BYTES);
}
