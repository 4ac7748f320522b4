/* test_gemm.c - the prefill paths: tiles of weight rows x tokens and the
 * chunked attention.
 *
 *   tiles    every weight type (the iq2 family on random-byte blocks),
 *            every ISA level, rows 1..17 x tokens
 *            1..17 (every micro-tile and leftover path): each entry is
 *            bitwise tl_vec_dot of its (row, token) pair at that level,
 *            within 2e-5 * sum |w_i x_i| of the scalar reference (the
 *            integer block sums are exact; only the float summation order
 *            differs), and no output outside the tile is written.
 *   gemm     the GEMM path (tl_gemm_tile over tl_gemm_prepare rows) for
 *            q8_0/q4_0/q5_0/q4_1 (n = 32, 352, 2400) and q2_K..q6_K (n = 256,
 *            768, 2048) at every level that has one: rows 1..16 x
 *            tokens 1..19 (the fused few-token path, whole 8-token
 *            micro-tiles and every leftover), each entry bitwise
 *            tl_vec_dot at that level and bitwise the scalar reference,
 *            nothing written outside the tile or past the workspace.
 *   pack     TL_PACK8 / TL_PACK16 q8_0/q4_0 rows: pack/unpack round trip, and packed
 *            tiles at every level (prepared or plain activation rows)
 *            bitwise tl_vec_dot of the plain rows.
 *   extremes iq4_xs, q2_K..q6_K blocks of random bytes (every scale and min
 *            at any value) x activations of +-1 (q8_K rows all +-127): the
 *            GEMM entries are still the scalar reference bitwise.
 *   iq tiles iq1_s / iq1_m rows of random bytes (every bit pattern is a
 *            block; d finite) x Gaussian, +-127 and raw-byte q8_K rows:
 *            tiles of rows 1..17 x tokens 1..17 at every level are bitwise
 *            the scalar reference, nothing written outside the tile.
 *   forward  synthetic models of each architecture (f32, q4_0, q8_0,
 *            q4_K) and llama in q4_1, q2_K, q3_K, iq4_xs, iq1_s and iq1_m
 *            (whose prefill GEMM decodes through other kernels), in
 *            iq2_xxs, iq2_xs and iq2_s, and in q8_0,
 *            q5_0 and f16 at shapes off every tile size: a 45-token
 *            prompt prefilled in one call gives bitwise the logits of
 *            feeding it one token at a time (attention query chunks,
 *            token chunks of the matmuls, tile shapes), and
 *            two sequences prefilled together give what each gives alone.
 *   multi    tl_fwd_matmul_multi (a layer's Q, K, V in one run of the
 *            threads) gives bitwise what one matmul per weight gives, for
 *            1..37 tokens on 1 and 2 threads, also when the weights cannot
 *            share a run (another type, packed or not): those run in
 *            turn, each with its own prepared activations.
 *   pieces   a prefill of more tokens than one activation chunk (f32, q8_0
 *            models of width 1024), where the threads take the matmuls'
 *            rows in pieces as they finish: the logits are bitwise the
 *            same on 1, 2 and 3 threads.
 *   glu      tl_gelu_tanh_mul, tl_silu_mul at every ISA level within 1e-6 * (|x| + 1)
 *            * |g| of the scalar formula (tanhf / expf), over [-30, 30] and at the
 *            tails, writing nothing past n.
 *   rows     tl_axpy_rows_f32 (attention) is bitwise the per-row
 *            tl_axpy_f32 calls at every level, tl_axpy_rows_multi_f32 one
 *            tl_axpy_rows_f32 per query, and the f16-row kernels the f32
 *            ones on the widened rows (the score order: test_attn.c).
 *   softmax  tl_softmax_f32 at every level within 1e-6 relative of the
 *            scalar level (libm expf, double sum), writing nothing past n. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "forward_impl.h"
#include "quants.h"
#include "test.h"
#include "testmodel.h"
#include "tinyloop.h"

static uint64_t rng = 0x243F6A8885A308D3ull;

static float gauss(void) { return test_gauss(&rng); }

/* Tiles at most TILE_R x TILE_T; results go to a TILE_LDO-float stride. */
enum { TILE_R = 17, TILE_T = 17, TILE_LDO = TILE_R + 3 };

/* Every ISA level's tiles of nr x nt (all up to 5 and 16, 17, a sample
 * between) over w x x, n elements: entries not bitwise the 1 x 1 dot (one,
 * or the level's vec_dot where NULL) in bad[0], those farther than 2e-5 *
 * sum |w x| from the double dot of wf . xf (where given) in bad[1], writes
 * outside the tile in bad[2]. out holds TILE_LDO * TILE_T floats. */
static void sweep_tiles(int type, int64_t n, const uint8_t *w, size_t rw, const uint8_t *x, size_t rx,
                        tl_vec_dot_fn one, const float *wf, const float *xf, float *out, int bad[3]) {
    const int isa_max = tl_kernels_isa();
    bad[0] = bad[1] = bad[2] = 0;
    for (int lvl = 0; lvl <= isa_max; lvl++) {
        tl_kernels_set_isa(lvl);
        for (int nr = 1; nr <= TILE_R; nr++)
            for (int nt = 1; nt <= TILE_T; nt++) {
                if (nr > 5 && nr < 16 && nr != 9 && nt > 3 && nt != 8 && nt != 13) continue; /* keep it quick */
                for (size_t i = 0; i < TILE_LDO * TILE_T; i++) out[i] = -12345.0f;
                tl_vec_dot_tile(type, n, nr, nt, out, TILE_LDO, w, rw, x, rx);
                for (int t = 0; t < TILE_T; t++)
                    for (int r = 0; r < TILE_LDO; r++) {
                        const float got = out[t * TILE_LDO + r];
                        if (r >= nr || t >= nt) {
                            bad[2] += got != -12345.0f;
                            continue;
                        }
                        float want;
                        (one ? one : tl_vec_dot(type))(n, &want, w + rw * r, x + rx * t);
                        bad[0] += memcmp(&got, &want, sizeof got) != 0;
                        if (!wf) continue;
                        double ref = 0, mag = 0;
                        for (int64_t i = 0; i < n; i++) {
                            ref += (double)wf[n * r + i] * xf[n * t + i];
                            mag += fabs((double)wf[n * r + i] * xf[n * t + i]);
                        }
                        bad[1] += fabs(got - ref) > 2e-5 * mag + 1e-30;
                    }
            }
    }
    tl_kernels_set_isa(isa_max);
}

/* The iq2 and iq3 families' weights in the tile checks are random bytes
 * (every bit pattern is a valid block: any grid index, sign and scale), d
 * finite. */
static int random_blocks(int type) {
    return type == TL_TYPE_IQ2_XXS || type == TL_TYPE_IQ2_XS || type == TL_TYPE_IQ2_S || type == TL_TYPE_IQ3_XXS ||
           type == TL_TYPE_IQ3_S;
}

static void fill_random_blocks(int type, uint8_t *w, int64_t n) {
    const size_t bsz = tl_type_info(type)->type_size, nb = (size_t)(n / tl_type_info(type)->block_size);
    for (size_t i = 0; i < nb * bsz; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        w[i] = (uint8_t)(rng >> 56);
    }
    for (size_t b = 0; b < nb; b++) { /* d: the first field of these blocks */
        const uint16_t d = tl_f32_to_f16(gauss() * 0.01f);
        memcpy(w + b * bsz, &d, 2);
    }
}

static void test_tiles(void) {
    static const int types[] = {TL_TYPE_F32,  TL_TYPE_F16,  TL_TYPE_BF16, TL_TYPE_Q4_0, TL_TYPE_Q4_1,
                                TL_TYPE_Q5_0, TL_TYPE_Q5_1, TL_TYPE_Q8_0, TL_TYPE_IQ4_NL, TL_TYPE_IQ4_XS, TL_TYPE_Q2_K, TL_TYPE_Q3_K,
                                TL_TYPE_Q4_K, TL_TYPE_Q5_K, TL_TYPE_Q6_K, TL_TYPE_IQ2_XXS, TL_TYPE_IQ2_XS, TL_TYPE_IQ2_S,
                                TL_TYPE_IQ1_S, TL_TYPE_IQ1_M, TL_TYPE_IQ3_XXS, TL_TYPE_IQ3_S};
    enum { MAXR = TILE_R, MAXT = TILE_T };
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const int type = types[ti], vt = tl_type_info(type)->vec_dot_type, bs = tl_type_info(type)->block_size;
        /* an odd block count (tails of grouped loops), and one block; for
         * 32-element blocks also 75 blocks (the AVX2 staged scale products
         * go 8 blocks at a time: 9 groups and a tail of 3) */
        const int64_t sizes[3] = {bs == 1 ? 75 : bs == 32 ? 32 * 11 : 256 * 3, bs == 1 ? 8 : bs, 32 * 75};
        for (int si = 0; si < (bs == 32 ? 3 : 2); si++) {
            const int64_t n = sizes[si];
            const size_t rw = tl_row_size(type, n), rx = tl_row_size(vt, n);
            uint8_t *w = malloc(rw * MAXR), *x = malloc(rx * MAXT);
            float *wf = malloc(sizeof(float) * n * MAXR), *xf = malloc(sizeof(float) * n * MAXT);
            float *src = malloc(sizeof(float) * n), *out = malloc(sizeof(float) * TILE_LDO * MAXT);
            for (int r = 0; r < MAXR; r++) {
                for (int64_t i = 0; i < n; i++) src[i] = gauss() * (1 + (i / 32) % 3);
                tl_quantize_row(type, src, w + rw * r, n);
                if (random_blocks(type)) fill_random_blocks(type, w + rw * r, n);
                tl_dequantize_row(type, w + rw * r, wf + n * r, n);
            }
            for (int t = 0; t < MAXT; t++) {
                for (int64_t i = 0; i < n; i++) src[i] = gauss();
                tl_quantize_row(vt, src, x + rx * t, n);
                tl_dequantize_row(vt, x + rx * t, xf + n * t, n);
            }
            int bad[3];
            sweep_tiles(type, n, w, rw, x, rx, NULL, wf, xf, out, bad);
            CHECK(bad[0] == 0, "%s n=%lld: tile entries equal vec_dot bitwise at every ISA level (%d differ)",
                  tl_type_info(type)->name, (long long)n, bad[0]);
            CHECK(bad[1] == 0, "%s n=%lld: tile entries are within 2e-5 of the dequantized dot (%d far)",
                  tl_type_info(type)->name, (long long)n, bad[1]);
            CHECK(bad[2] == 0, "%s n=%lld: nothing outside the tile is written (%d)", tl_type_info(type)->name,
                  (long long)n, bad[2]);
            free(w); free(x); free(wf); free(xf); free(src); free(out);
        }
    }
}

/* Random-byte blocks of the grid i-quants with a finite f16 d (iq1_m's in
 * the top nibbles of its scale words): tile entries at every level are
 * bitwise the scalar reference. Raw-byte activations hold -128 and
 * garbage bsums (these kernels read qs only). */
static void test_iq_random_tiles(void) {
    static const int types[] = {TL_TYPE_IQ1_S, TL_TYPE_IQ1_M};
    enum { MAXR = TILE_R, MAXT = TILE_T, N = 256 * 3 };
    const uint64_t rng_saved = rng; /* the later tests' data stays as it was */
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const int type = types[ti];
        const size_t rw = tl_row_size(type, N), rx = tl_row_size(TL_TYPE_Q8_K, N);
        const size_t bsz = tl_type_info(type)->type_size, bq = tl_type_info(TL_TYPE_Q8_K)->type_size;
        uint8_t *w = malloc(rw * MAXR), *x = malloc(rx * MAXT);
        float *src = malloc(sizeof(float) * N), *out = malloc(sizeof(float) * TILE_LDO * MAXT);
        for (size_t i = 0; i < rw * MAXR; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            w[i] = (uint8_t)(rng >> 56);
        }
        for (int b = 0; b < MAXR * N / 256; b++) {
            uint8_t *blk = w + (size_t)b * bsz;
            const uint16_t d = b == 0 ? 0x7BFF : tl_f32_to_f16(gauss() * 0.01f);
            if (type == TL_TYPE_IQ1_S) {
                memcpy(blk, &d, 2);
            } else {
                uint8_t *sc = blk + bsz - 8; /* block_iq1_m's scales[8]: four uint16 words */
                for (int k = 0; k < 4; k++) sc[2 * k + 1] = (uint8_t)((sc[2 * k + 1] & 0x0F) | ((d >> (4 * k)) & 0xF) << 4);
            }
        }
        for (int t = 0; t < MAXT; t++) {
            for (int i = 0; i < N; i++) src[i] = t % 3 == 1 ? (gauss() < 0 ? -1.0f : 1.0f) : gauss();
            tl_quantize_row(TL_TYPE_Q8_K, src, x + rx * t, N);
            if (t % 3 == 2) /* raw bytes after each block's f32 d */
                for (size_t i = 0; i < rx; i++) {
                    if (i % bq < 4) continue;
                    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                    x[rx * t + i] = (uint8_t)(rng >> 56);
                }
        }
        int bad[3];
        sweep_tiles(type, N, w, rw, x, rx, tl_vec_dot_ref(type), NULL, NULL, out, bad);
        CHECK(bad[0] == 0, "%s random-byte blocks: tile entries at every level are the scalar reference bitwise (%d differ)",
              tl_type_info(type)->name, bad[0]);
        CHECK(bad[2] == 0, "%s random-byte blocks: nothing outside the tile is written (%d)", tl_type_info(type)->name,
              bad[2]);
        free(w); free(x); free(src); free(out);
    }
    rng = rng_saved;
}

/* Before a tile call: the output marked, 64 bytes past the workspace
 * (at guard) filled. */
static void arm_tile(float *out, size_t n_out, uint8_t *guard) {
    for (size_t i = 0; i < n_out; i++) out[i] = -12345.0f;
    memset(guard, 0x5a, 64);
}

/* After it: counts guard bytes changed (*past), marked entries outside the
 * nr x nt tile written (*spill), and entries that are not bitwise
 * tl_vec_dot of their plain (row, token) pair (*bad) or, with bad_ref,
 * not bitwise the scalar reference. */
static void score_tile(int type, int64_t n, int nr, int nt, const float *out, size_t ldo, int maxt, const uint8_t *w,
                       size_t rw, const uint8_t *x, size_t rx, const uint8_t *guard, int *past, int *spill, int *bad,
                       int *bad_ref) {
    for (int i = 0; i < 64; i++) *past += guard[i] != 0x5a;
    for (int t = 0; t < maxt; t++)
        for (int r = 0; r < (int)ldo; r++) {
            const float got = out[t * ldo + r];
            if (r >= nr || t >= nt) {
                *spill += got != -12345.0f;
                continue;
            }
            float one, ref;
            tl_vec_dot(type)(n, &one, w + rw * r, x + rx * t);
            *bad += memcmp(&got, &one, sizeof got) != 0;
            if (!bad_ref) continue;
            tl_vec_dot_ref(type)(n, &ref, w + rw * r, x + rx * t);
            *bad_ref += memcmp(&got, &ref, sizeof got) != 0;
        }
}

static void test_gemm_path(void) {
    static const int types[] = {TL_TYPE_Q8_0, TL_TYPE_Q4_0, TL_TYPE_Q5_0, TL_TYPE_Q4_1, TL_TYPE_Q5_1, TL_TYPE_IQ4_NL,
                                TL_TYPE_IQ4_XS, TL_TYPE_Q2_K, TL_TYPE_Q3_K, TL_TYPE_Q4_K, TL_TYPE_Q5_K, TL_TYPE_Q6_K,
                                TL_TYPE_IQ2_XXS, TL_TYPE_IQ2_XS, TL_TYPE_IQ2_S, TL_TYPE_IQ1_S, TL_TYPE_IQ1_M,
                                TL_TYPE_IQ3_XXS, TL_TYPE_IQ3_S};
    enum { MAXR = TL_GEMM_ROWS, MAXT = 19, PAD = 3 };
    const int isa_max = tl_kernels_isa();
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const int type = types[ti], vt = tl_type_info(type)->vec_dot_type;
        static const int64_t sizes32[] = {32, 32 * 11, 32 * 75}, sizesK[] = {256, 256 * 3, 256 * 8};
        const int64_t *sizes = tl_type_info(type)->block_size == 32 ? sizes32 : sizesK;
        for (size_t si = 0; si < 3; si++) {
            const int64_t n = sizes[si];
            /* rows back to back with a stride that is not a multiple of 64 */
            const size_t rw = tl_row_size(type, n), rx = tl_row_size(vt, n), xs = tl_gemm_x_size(n);
            const size_t ldo = MAXR + PAD, ws = tl_gemm_work_size(n);
            uint8_t *w = malloc(rw * MAXR), *x = malloc(rx * MAXT), *xp = aligned_alloc(64, xs * MAXT);
            uint8_t *work = aligned_alloc(64, ws + 64);
            float *src = malloc(sizeof(float) * n * MAXT), *out = malloc(sizeof(float) * ldo * MAXT);
            for (int r = 0; r < MAXR; r++) {
                for (int64_t i = 0; i < n; i++) src[i] = gauss() * (1 + (i / 32) % 3);
                tl_quantize_row(type, src, w + rw * r, n);
            }
            for (int t = 0; t < MAXT; t++) {
                for (int64_t i = 0; i < n; i++) src[(size_t)n * t + i] = gauss() * (t == 3 ? 40.0f : 1.0f);
                tl_quantize_row(vt, src + (size_t)n * t, x + rx * t, n);
            }
            int levels = 0, bad = 0, bad_ref = 0, spill = 0, past = 0;
            for (int lvl = 0; lvl <= isa_max; lvl++) {
                tl_kernels_set_isa(lvl);
                if (!tl_gemm_has(type)) continue;
                levels++;
                for (int t = 0; t < MAXT; t++) tl_gemm_prepare(type, src + (size_t)n * t, xp + xs * t, n);
                for (int nr = 1; nr <= MAXR; nr++)
                    for (int nt = 1; nt <= MAXT; nt++) {
                        if (nr > 3 && nr < 15 && nr != 9 && nt > 3 && nt != 8 && nt != 11) continue; /* keep it quick */
                        arm_tile(out, ldo * MAXT, work + ws);
                        tl_gemm_tile(type, n, nr, nt, out, ldo, w, rw, xp, xs, work);
                        score_tile(type, n, nr, nt, out, ldo, MAXT, w, rw, x, rx, work + ws, &past, &spill, &bad,
                                   &bad_ref);
                    }
            }
            tl_kernels_set_isa(isa_max);
            const char *name = tl_type_info(type)->name;
            if (!levels) {
                CHECK(1, "%s n=%lld: no level of this CPU has a GEMM path (nothing to check)", name, (long long)n);
            } else {
                CHECK(bad == 0, "%s n=%lld: GEMM tile entries equal vec_dot bitwise (%d levels, %d differ)", name,
                      (long long)n, levels, bad);
                CHECK(bad_ref == 0, "%s n=%lld: GEMM tile entries equal the scalar reference bitwise (%d differ)", name,
                      (long long)n, bad_ref);
                CHECK(spill == 0, "%s n=%lld: the GEMM path writes nothing outside the tile (%d)", name, (long long)n,
                      spill);
                CHECK(past == 0, "%s n=%lld: the GEMM path writes nothing past its workspace (%d)", name, (long long)n,
                      past);
            }
            free(w); free(x); free(xp); free(work); free(src); free(out);
        }
    }
}

/* TL_PACK8 / TL_PACK16 rows: packing then unpacking gives the rows back
 * byte for byte, and at every level tl_packed_tile on packed rows
 * (prepared rows where the level has a GEMM path, plain q8_0 rows always;
 * native where the level reads that G, else unpacked) gives bitwise
 * tl_vec_dot of the plain rows, writing nothing outside the tile. */
static void test_pack(void) {
    static const int types[] = {TL_TYPE_Q8_0, TL_TYPE_Q4_0, TL_TYPE_Q5_0, TL_TYPE_Q4_1, TL_TYPE_IQ4_NL};
    enum { NTYPES = sizeof types / sizeof types[0] };
    /* nt: VNNI micro-tiles and their tails; AMX's 16-token tiles, one of 13,
     * 16 + 13, 16 + 3 (VNNI tail), 2 x 16 + 3 */
    enum { MAXR = 32, MAXT = 35, PAD = 3 };
    const int isa_max = tl_kernels_isa();
    for (size_t ti = 0; ti < 2 * NTYPES; ti++) {
        const int type = types[ti % NTYPES], G = ti < NTYPES ? 8 : 16;
        /* (q8_0 at 16 rows also 32 * 200: the AMX tiles copy tile A for 192
         * KiB of tiles at a time, under two of that width, so 35 tokens take
         * two runs) */
        static const int64_t sizes[] = {32, 32 * 11, 32 * 75, 32 * 200};
        for (size_t si = 0; si < (type == TL_TYPE_Q8_0 && G == 16 ? 4u : 3u); si++) {
            const int64_t n = sizes[si];
            const size_t rw = tl_row_size(type, n), rx = tl_row_size(TL_TYPE_Q8_0, n), xs = tl_gemm_x_size(n);
            const size_t ldo = MAXR + PAD, ws = tl_gemm_work_size(n);
            uint8_t *w = malloc(rw * MAXR), *wp = malloc(rw * MAXR), *back = malloc(rw * G), *tmp = malloc(rw * G);
            uint8_t *x = malloc(rx * MAXT), *xp = aligned_alloc(64, xs * MAXT), *work = aligned_alloc(64, ws + 64);
            float *src = malloc(sizeof(float) * n * MAXT), *out = malloc(sizeof(float) * ldo * MAXT);
            for (int r = 0; r < MAXR; r++) {
                for (int64_t i = 0; i < n; i++) src[i] = gauss() * (1 + (i / 32) % 3);
                tl_quantize_row(type, src, w + rw * r, n);
            }
            memcpy(wp, w, rw * MAXR);
            int moved = 0, lost = 0, rows_off = 0;
            for (int g = 0; g < MAXR; g += G) {
                tl_pack_group(type, G, wp + rw * g, n, tmp);
                moved += memcmp(wp + rw * g, w + rw * g, rw * G) != 0;
                tl_unpack_group(type, G, wp + rw * g, n, back);
                lost += memcmp(back, w + rw * g, rw * G) != 0;
            }
            for (int r = 0; r < MAXR; r++) { /* src as scratch: two rows of n floats */
                tl_dequantize_row(type, w + rw * r, src, n);
                tl_packed_row_dequantize(type, G, wp, r, n, src + n);
                rows_off += memcmp(src, src + n, sizeof(float) * n) != 0;
            }
            for (int t = 0; t < MAXT; t++) {
                for (int64_t i = 0; i < n; i++) src[(size_t)n * t + i] = gauss() * (t == 3 ? 40.0f : 1.0f);
                tl_quantize_row(TL_TYPE_Q8_0, src + (size_t)n * t, x + rx * t, n);
            }
            int bad = 0, spill = 0, past = 0, runs = 0, native = 0;
            for (int lvl = 0; lvl <= isa_max; lvl++) {
                tl_kernels_set_isa(lvl);
                native += tl_pack_rows(type) == G;
                for (int prep = 0; prep <= tl_gemm_has(type); prep++) {
                    if (prep)
                        for (int t = 0; t < MAXT; t++) tl_gemm_prepare(type, src + (size_t)n * t, xp + xs * t, n);
                    for (int nr = G; nr <= (G == 8 ? 16 : MAXR); nr += G)
                        for (int nt = 1; nt <= MAXT; nt++) {
                            if (nt > 5 && nt != 8 && nt != 13 && nt != 16 && nt != 19 && nt != 29 && nt != MAXT)
                                continue;
                            arm_tile(out, ldo * MAXT, work + ws);
                            tl_packed_tile(type, G, prep, n, nr, nt, out, ldo, wp, rw, prep ? xp : x, prep ? xs : rx,
                                           work);
                            runs++;
                            score_tile(type, n, nr, nt, out, ldo, MAXT, w, rw, x, rx, work + ws, &past, &spill, &bad,
                                       NULL);
                        }
                }
            }
            tl_kernels_set_isa(isa_max);
            const char *name = tl_type_info(type)->name;
            CHECK(moved == MAXR / G && lost == 0,
                  "%s n=%lld G=%d: packing moves the bytes and unpacking restores them (%d lost)", name, (long long)n, G,
                  lost);
            CHECK(rows_off == 0, "%s n=%lld G=%d: a packed row dequantizes bitwise as the plain row (%d differ)", name,
                  (long long)n, G, rows_off);
            CHECK(bad == 0 && runs > 0,
                  "%s n=%lld G=%d: packed tiles equal vec_dot on the plain rows bitwise (%d runs, %d differ; %d levels "
                  "native)", name, (long long)n, G, runs, bad, native);
            CHECK(spill == 0 && past == 0,
                  "%s n=%lld G=%d: packed tiles write nothing outside the tile or past the workspace", name, (long long)n,
                  G);
            free(w); free(wp); free(back); free(tmp); free(x); free(xp); free(work); free(src); free(out);
        }
    }
}

static int forward(tl_model *m, tl_seq **seqs, const int32_t *const *toks, const int *n, int n_seq, float *logits) {
    return tl_batch_forward(m, seqs, toks, n, n_seq, logits);
}

/* A fresh sequence fed the prompt one token at a time; logits: the last step's. */
static int step_by_step(tl_model *m, const int32_t *prompt, int n, float *logits) {
    tl_seq *s = NULL;
    int ok = tl_seq_new(m, 0, &s) == TL_OK;
    for (int i = 0; ok && i < n; i++) {
        const int32_t *pi = prompt + i;
        int one = 1;
        ok = forward(m, &s, &pi, &one, 1, logits) == TL_OK;
    }
    tl_seq_free(s);
    return ok;
}

static void test_forward(void) {
    tm_spec specs[TM_ARCH_CASES + 14];
    const char *names[TM_ARCH_CASES + 14];
    int nc = tm_arch_cases(specs, names);
    /* and q4_1 weights (packed at AVX-512, with their mins), the output
     * tied to token_embd: lookups gather q4_1 rows from packed groups */
    specs[nc] = tm_default_spec();
    specs[nc].type = TL_TYPE_Q4_1;
    specs[nc].tied = 1;
    specs[nc].seed = 9;
    names[nc++] = "llama q4_1";
    /* and the K-quant kinds whose prefill GEMM decodes through other
     * kernels (row tiles at AVX2, rows_K at AVX-512): dims of 256 */
    static const int ktypes[] = {TL_TYPE_Q2_K,   TL_TYPE_Q3_K,  TL_TYPE_IQ4_XS, TL_TYPE_IQ2_XXS, TL_TYPE_IQ2_XS,
                                 TL_TYPE_IQ2_S,  TL_TYPE_IQ1_S, TL_TYPE_IQ1_M,  TL_TYPE_IQ3_XXS, TL_TYPE_IQ3_S};
    static const char *const knames[] = {"llama q2_k",  "llama q3_k",  "llama iq4_xs", "llama iq2_xxs", "llama iq2_xs",
                                         "llama iq2_s", "llama iq1_s", "llama iq1_m",  "llama iq3_xxs", "llama iq3_s"};
    for (int k = 0; k < 10; k++) {
        specs[nc] = tm_default_spec();
        specs[nc].n_embd = 256;
        specs[nc].n_ff = 512;
        specs[nc].type = ktypes[k];
        specs[nc].seed = 11 + k;
        names[nc++] = knames[k];
    }
    /* and shapes off every tile size: 333 vocab rows (no 8- or 16-row
     * packing of the output or the tied embeddings), a width of 96 (3
     * blocks), 3 heads, ff 224 (7 blocks) */
    static const int otypes[] = {TL_TYPE_Q8_0, TL_TYPE_Q5_0, TL_TYPE_F16};
    static const char *const onames[] = {"odd q8_0 tied", "odd q5_0", "odd f16"};
    for (int k = 0; k < 3; k++) {
        specs[nc] = tm_default_spec();
        specs[nc].n_vocab = 333;
        specs[nc].n_embd = 96;
        specs[nc].n_head = 3;
        specs[nc].n_head_kv = 1;
        specs[nc].n_ff = 224;
        specs[nc].type = otypes[k];
        specs[nc].seed = 21 + k;
        names[nc++] = onames[k];
    }
    enum { N = 45, N2 = 21 };
    int32_t prompt[N], prompt2[N2];
    for (int i = 0; i < N; i++) prompt[i] = 3 + (i * 37 + 11) % 250;
    for (int i = 0; i < N2; i++) prompt2[i] = 5 + (i * 53 + 7) % 250;
    for (int ci = 0; ci < nc; ci++) {
        char path[128];
        snprintf(path, sizeof path, "/tmp/tl_gemm_%d_%d.gguf", (int)getpid(), ci);
        /* the q8_0 case ties its output to token_embd (as Gemma 3's files
         * do): both are then packed, and lookups gather rows from groups */
        specs[ci].tied |= specs[ci].type == TL_TYPE_Q8_0;
        if (tm_write(&specs[ci], path)) {
            CHECK(0, "%s: the synthetic model is written", names[ci]);
            continue;
        }
        tl_model_params mp = tl_model_default_params();
        mp.kv_block_size = 4;
        mp.n_threads = 2;
        tl_model *m = NULL;
        tl_model_open(path, mp, &m);
        /* the same file with its weights as the file has them (no TL_PACK8) */
        tl_model *plain = NULL, *one = NULL;
        setenv("TINYLOOP_REPACK", "0", 1);
        tl_model_open(path, mp, &plain);
        unsetenv("TINYLOOP_REPACK");
        mp.n_threads = 1; /* decode steps through att_task, where two threads split a lone KV head's work */
        tl_model_open(path, mp, &one);
        unlink(path);
        CHECK(m != NULL, "%s: the synthetic model opens (%s)", names[ci], m ? "" : tl_last_error());
        if (!m) continue;
        tl_model_info info;
        tl_model_get_info(m, &info);
        const int nv = info.n_vocab;
        float *all = malloc(sizeof(float) * nv * 2), *step = malloc(sizeof(float) * nv * 2);
        float *alone = malloc(sizeof(float) * nv * 2);
        tl_seq *s[2] = {0};
        int ok = tl_seq_new(m, 0, &s[0]) == TL_OK;
        const int32_t *p = prompt;
        int n = N;
        ok = ok && forward(m, s, &p, &n, 1, all) == TL_OK;
        tl_seq_free(s[0]);
        ok = ok && step_by_step(m, prompt, N, step);
        CHECK(ok && !memcmp(all, step, sizeof(float) * nv),
              "%s: a %d-token prompt in one forward gives bitwise the logits of one token at a time", names[ci], N);
        if (one) {
            float *step1 = malloc(sizeof(float) * nv);
            int ok1 = step_by_step(one, prompt, N, step1);
            CHECK(ok1 && !memcmp(step, step1, sizeof(float) * nv),
                  "%s: one token at a time gives bitwise the same logits on 1 and 2 threads", names[ci]);
            free(step1);
            tl_model_close(one);
        }
        if (plain) {
            tl_seq *sp = NULL;
            int okp = tl_seq_new(plain, 0, &sp) == TL_OK && forward(plain, &sp, &p, &n, 1, step) == TL_OK;
            tl_seq_free(sp);
            CHECK(okp && !memcmp(all, step, sizeof(float) * nv),
                  "%s: repacked weights give bitwise the logits of the file's layout", names[ci]);
            tl_model_close(plain);
        }
        /* two sequences prefilled together vs the second alone */
        ok = tl_seq_new(m, 0, &s[0]) == TL_OK && tl_seq_new(m, 0, &s[1]) == TL_OK;
        const int32_t *pp[2] = {prompt, prompt2};
        int nn[2] = {N, N2};
        ok = ok && forward(m, s, pp, nn, 2, all) == TL_OK;
        tl_seq_free(s[0]);
        tl_seq_free(s[1]);
        ok = ok && tl_seq_new(m, 0, &s[1]) == TL_OK && forward(m, &s[1], &pp[1], &nn[1], 1, alone) == TL_OK;
        tl_seq_free(s[1]);
        CHECK(ok && !memcmp(all + nv, alone, sizeof(float) * nv),
              "%s: a sequence prefilled next to another gives bitwise its logits alone", names[ci]);
        free(all); free(step); free(alone);
        tl_model_close(m);
    }
}

/* One run for several weights against one matmul each (see the header). */
static void test_multi(void) {
    /* q8_0; its f32 twin; the same shapes in q4_0, whose prepared
     * activations differ from q8_0's (the offset correction) */
    tm_spec sp[3] = {tm_default_spec(), tm_default_spec(), tm_default_spec()};
    sp[0].type = sp[1].type = TL_TYPE_Q8_0;
    sp[1].twin_f32 = 1;
    sp[2].type = TL_TYPE_Q4_0;
    char path[3][128];
    int written = 1;
    for (int i = 0; i < 3; i++) {
        sp[i].seed = 21;
        snprintf(path[i], sizeof path[i], "/tmp/tl_multi_%d_%d.gguf", (int)getpid(), i);
        written = written && !tm_write(&sp[i], path[i]);
    }
    CHECK(written, "multi: the synthetic models are written");
    for (int nth = 1; written && nth <= 2; nth++) {
        tl_model_params mp = tl_model_default_params();
        mp.n_threads = nth;
        tl_model *m[3] = {0};
        int open = 1;
        for (int i = 0; i < 3; i++) open = open && tl_model_open(path[i], mp, &m[i]) == TL_OK;
        CHECK(open, "multi: the q8_0, f32 and q4_0 models open (%s)", open ? "" : tl_last_error());
        if (!open) {
            for (int i = 0; i < 3; i++) tl_model_close(m[i]);
            continue;
        }
        enum { TMAX = 37 };
        const int n = m[0]->hp.n_embd;
        float *x = malloc(sizeof(float) * TMAX * n), *one[3], *run[3];
        for (int i = 0; i < TMAX * n; i++) x[i] = gauss();
        for (int k = 0; k < 3; k++) {
            one[k] = malloc(sizeof(float) * TMAX * n);
            run[k] = malloc(sizeof(float) * TMAX * n);
        }
        const tl_layer *q8 = &m[0]->layers[1], *f32 = &m[1]->layers[1], *q4 = &m[2]->layers[1];
        /* one run; then weights that cannot share one (f32 rows; q4_0's
         * own prepared activations), each after the other */
        const tl_weight *sets[3][3] = {{&q8->wq, &q8->wk, &q8->wv}, {&q8->wq, &f32->wk, &q8->wv}, {&q8->wq, &q4->wk, &q8->wv}};
        static const int toks[] = {1, 2, 3, 9, 16, 17, 37};
        int ok = 1;
        for (int set = 0; set < 3; set++)
            for (size_t ti = 0; ti < sizeof toks / sizeof toks[0]; ti++) {
                const int T = toks[ti];
                for (int k = 0; k < 3; k++) {
                    tl_fwd_matmul(m[0], one[k], sets[set][k], x, T);
                    memset(run[k], 0xff, sizeof(float) * TMAX * n);
                }
                tl_fwd_matmul_multi(m[0], 3, run, sets[set], x, T);
                for (int k = 0; k < 3; k++)
                    ok = ok && !memcmp(one[k], run[k], sizeof(float) * (size_t)T * (size_t)sets[set][k]->n_out);
            }
        CHECK(ok, "multi: Q, K, V in one run (and weights that cannot share one) give bitwise one matmul each, "
                  "1..37 tokens, %d thread(s)", nth);
        for (int k = 0; k < 3; k++) {
            free(one[k]);
            free(run[k]);
        }
        free(x);
        for (int i = 0; i < 3; i++) tl_model_close(m[i]);
    }
    for (int i = 0; i < 3; i++) unlink(path[i]);
}

/* Prefill past one activation chunk (q8_0: 192 KiB of prepared rows,
 * ~140 tokens of 1024; f32 rows: half the L2, at most 2 MiB, 512 tokens of
 * 1024, so the f32 case prefills 600 on any machine), where mm_task deals row pieces to
 * whichever thread is free, and attention tasks (query chunk x KV head)
 * go the same way: the logits do not depend on the threads. With 2 KV
 * heads of 4 query heads each (the widened-rows path), and in store-h
 * (a thread pool run per sequence, the task counter reset for each: two
 * sequences are prefilled together). Then decode steps, where the threads
 * take their shares of the rows and then the rest of each other's
 * (mm_steal): bitwise the same logits too. */
static void test_pieces(void) {
    static const struct {
        int type, n_tok, n_head_kv;
        const char *kv_mode;
    } cases[] = {{TL_TYPE_F32, 600, 8, NULL}, {TL_TYPE_Q8_0, 160, 8, NULL}, {TL_TYPE_Q8_0, 160, 2, NULL},
                 {TL_TYPE_F32, 64, 2, "h:f16"}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        tm_spec sp = tm_default_spec();
        sp.type = cases[ci].type;
        sp.n_embd = 1024;
        sp.n_ff = 2048;
        sp.n_layer = 1;
        sp.n_head = 8;
        sp.n_head_kv = cases[ci].n_head_kv;
        sp.n_ctx = 1024;
        char path[128];
        snprintf(path, sizeof path, "/tmp/tl_pieces_%d_%zu.gguf", (int)getpid(), ci);
        if (tm_write(&sp, path)) {
            CHECK(0, "pieces: the synthetic model is written");
            continue;
        }
        const int n_tok = cases[ci].n_tok;
        int32_t prompt[600];
        for (int i = 0; i < n_tok; i++) prompt[i] = (int32_t)((i * 89 + 7) % sp.n_vocab);
        float *logits[3] = {0}, *dec[3] = {0};
        int ok = 1;
        for (int nth = 1; nth <= 3; nth++) {
            tl_model_params mp = tl_model_default_params();
            mp.n_threads = nth;
            mp.kv_mode = cases[ci].kv_mode;
            tl_model *m = NULL;
            tl_seq *s[8] = {NULL};
            const int32_t *p[2] = {prompt, prompt + 7};
            int n[2] = {n_tok, n_tok / 2};
            logits[nth - 1] = malloc(sizeof(float) * sp.n_vocab * 2);
            dec[nth - 1] = malloc(sizeof(float) * sp.n_vocab * 9);
            ok = ok && logits[nth - 1] && dec[nth - 1] && tl_model_open(path, mp, &m) == TL_OK;
            for (int i = 0; ok && i < 8; i++) ok = tl_seq_new(m, 0, &s[i]) == TL_OK;
            ok = ok && forward(m, s, p, n, 2, logits[nth - 1]) == TL_OK;
            if (ok && nth == 1) { /* and the chunks' sums are the single token's */
                float *one = malloc(sizeof(float) * sp.n_vocab);
                const int same = one && step_by_step(m, prompt, n_tok, one) &&
                                 !memcmp(one, logits[0], sizeof(float) * sp.n_vocab);
                CHECK(same, "pieces %s, %d KV heads: the %d-token prefill gives bitwise the logits of one token at a time",
                      tl_type_info(cases[ci].type)->name, sp.n_head_kv, n_tok);
                free(one);
            }
            /* then six short prompts, and decode steps of the eight
             * sequences together (a chunk of 8 tokens: mm_steal's shares),
             * then of the first alone */
            int32_t next[8];
            const int32_t *pn[8];
            int ones[8], fives[6] = {5, 5, 5, 5, 5, 5};
            for (int i = 0; i < 8; i++) {
                next[i] = (int32_t)(5 + 4 * i);
                pn[i] = i < 6 ? prompt + 11 * i : NULL;
                ones[i] = 1;
            }
            ok = ok && forward(m, s + 2, pn, fives, 6, dec[nth - 1]) == TL_OK;
            for (int i = 0; i < 8; i++) pn[i] = &next[i];
            for (int step = 0; ok && step < 5; step++) {
                for (int i = 0; i < 8; i++) next[i] = (next[i] * 31 + 7 + i) % sp.n_vocab;
                ok = step < 3 ? forward(m, s, pn, ones, 8, dec[nth - 1]) == TL_OK
                              : forward(m, s, pn, ones, 1, dec[nth - 1] + (size_t)sp.n_vocab * 8) == TL_OK;
            }
            for (int i = 0; i < 8; i++) tl_seq_free(s[i]);
            tl_model_close(m);
        }
        unlink(path);
        const char *name = tl_type_info(cases[ci].type)->name, *kvm = cases[ci].kv_mode ? cases[ci].kv_mode : "default";
        CHECK(ok, "pieces %s, %d KV heads, kv %s: the %d-token prefills run (%s)", name, sp.n_head_kv, kvm, n_tok,
              ok ? "" : tl_last_error());
        for (int nth = 2; ok && nth <= 3; nth++)
            CHECK(!memcmp(logits[0], logits[nth - 1], sizeof(float) * sp.n_vocab * 2),
                  "pieces %s, %d KV heads, kv %s: %d- and half as many token prefills together on %d threads give "
                  "bitwise the logits of one thread",
                  name, sp.n_head_kv, kvm, n_tok, nth);
        for (int nth = 2; ok && nth <= 3; nth++)
            CHECK(!memcmp(dec[0], dec[nth - 1], sizeof(float) * sp.n_vocab * 9),
                  "pieces %s, %d KV heads, kv %s: decode steps of eight sequences, then one, on %d threads give "
                  "bitwise the logits of one thread",
                  name, sp.n_head_kv, kvm, nth);
        for (int i = 0; i < 3; i++) {
            free(logits[i]);
            free(dec[i]);
        }
    }
}

/* tl_sum_sq (RMSNorm) at every level within 1e-12 relative of the scalar
 * level's index-order sum, at every tail length and at model widths, and
 * reading nothing past n (a huge value there would show). */
static void test_sum_sq(void) {
    enum { N = 2100 };
    static float x[N + 1];
    for (int i = 0; i < N; i++) x[i] = gauss() * (1 + i % 5) * (i % 97 == 0 ? 300.0f : 1.0f);
    static const int sizes[] = {640, 768, 2048, 2100};
    const int isa_max = tl_kernels_isa();
    for (int lvl = 0; lvl <= isa_max; lvl++) {
        int far = 0;
        for (int k = 0; k < 4 + 40; k++) {
            const int n = k < 4 ? sizes[k] : k - 4;
            const float keep = x[n];
            x[n] = 1e30f;
            tl_kernels_set_isa(TL_ISA_SCALAR);
            const double want = tl_sum_sq(x, n);
            tl_kernels_set_isa(lvl);
            const double got = tl_sum_sq(x, n);
            far += !(fabs(got - want) <= 1e-12 * want);
            x[n] = keep;
        }
        CHECK(far == 0, "%s sum of squares is within 1e-12 of the scalar sum at 44 lengths (%d far)", tl_isa_name(lvl),
              far);
    }
    tl_kernels_set_isa(isa_max);
}

/* A gated activation fn(h, g) at every ISA level against the scalar one. */
static void test_glu(const char *name, void (*fn)(float *h, const float *g, int64_t n)) {
    enum { N = 1203 };
    static float x[N + 8], g[N], ref[N + 8], got[N + 8];
    for (int i = 0; i < N; i++) {
        x[i] = -30.0f + 60.0f * (float)i / (N - 1);
        if (i % 7 == 0) x[i] = gauss() * 0.3f;
        g[i] = gauss();
    }
    x[5] = 0.0f;
    x[6] = -0.0f;
    x[7] = 1e-30f;
    x[8] = -100.0f;
    x[9] = 100.0f;
    const int isa_max = tl_kernels_isa();
    tl_kernels_set_isa(TL_ISA_SCALAR);
    memcpy(ref, x, sizeof x);
    fn(ref, g, N);
    for (int lvl = 0; lvl <= isa_max; lvl++) {
        tl_kernels_set_isa(lvl);
        int far = 0, past = 0;
        for (int n = 0; n <= 17; n++) { /* tails */
            memcpy(got, x, sizeof x);
            got[n] = 777.0f;
            fn(got, g, n);
            past += got[n] != 777.0f;
            for (int i = 0; i < n; i++) far += !(fabsf(got[i] - ref[i]) <= 1e-6f * (fabsf(x[i]) + 1) * fabsf(g[i]));
        }
        memcpy(got, x, sizeof x);
        fn(got, g, N);
        double worst = 0;
        for (int i = 0; i < N; i++) {
            double e = fabs(got[i] - ref[i]) / ((fabs(x[i]) + 1) * fabs(g[i]) + 1e-30);
            if (!(e <= 1e-6)) far++;
            if (e > worst) worst = e;
        }
        CHECK(far == 0, "%s %s*g is within 1e-6 (|x|+1)|g| of the scalar formula (%d far, worst %.2g)",
              tl_isa_name(lvl), name, far, worst);
        CHECK(past == 0, "%s %s*g writes nothing past n", tl_isa_name(lvl), name);
    }
    tl_kernels_set_isa(isa_max);
}

static void test_rows(void) {
    enum { MAXN = 264, MAXROWS = 17 };
    static float q[MAXN], k[MAXROWS * MAXN], a[MAXROWS], y0[MAXN], y1[MAXN], o0[MAXROWS], o1[MAXROWS];
    for (int i = 0; i < MAXN; i++) q[i] = gauss();
    for (int i = 0; i < MAXROWS * MAXN; i++) k[i] = gauss();
    for (int i = 0; i < MAXROWS; i++) a[i] = gauss();
    static const int ns[] = {32, 64, 72, 256, 264};
    const int isa_max = tl_kernels_isa();
    for (int lvl = 0; lvl <= isa_max; lvl++) {
        tl_kernels_set_isa(lvl);
        int bad_axpy = 0, bad_multi = 0, bad_f16 = 0, f16_cases = 0;
        for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
            for (int rows = 0; rows <= MAXROWS; rows++) {
                const int n = ns[ni];
                const size_t ld = (size_t)n + 8;
                if ((size_t)rows * ld > sizeof k / sizeof k[0]) continue;
                for (int i = 0; i < n; i++) y0[i] = y1[i] = q[i];
                tl_axpy_rows_f32(y0, a, k, ld, rows, n);
                for (int r = 0; r < rows; r++) tl_axpy_f32(y1, a[r], k + r * ld, n);
                bad_axpy += memcmp(y0, y1, sizeof(float) * n) != 0;
                /* 1..6 queries: whole groups of 4 and every leftover */
                for (int nq = 1; nq <= 6; nq++) {
                    static float ym[6][MAXN], am[6][MAXROWS];
                    float *yp[6];
                    const float *ap[6];
                    for (int qi = 0; qi < nq; qi++) {
                        for (int i = 0; i < n; i++) ym[qi][i] = q[(i + qi) % n];
                        for (int r = 0; r < rows; r++) am[qi][r] = a[(r + qi) % MAXROWS] * (float)(qi + 1);
                        yp[qi] = ym[qi];
                        ap[qi] = am[qi];
                    }
                    tl_axpy_rows_multi_f32(nq, yp, ap, k, ld, rows, n);
                    for (int qi = 0; qi < nq; qi++) {
                        for (int i = 0; i < n; i++) y1[i] = q[(i + qi) % n];
                        tl_axpy_rows_f32(y1, am[qi], k, ld, rows, n);
                        bad_multi += memcmp(ym[qi], y1, sizeof(float) * n) != 0;
                    }
                    if (!tl_attn_has_f16_rows()) continue;
                    /* f16 rows read directly == the f32 kernels on the widened rows */
                    static uint16_t kh[MAXROWS * MAXN];
                    static float kw[MAXROWS * MAXN], yw[6][MAXN];
                    tl_f32_to_f16_row(k, kh, (int64_t)rows * (int64_t)ld);
                    tl_f16_to_f32_row(kh, kw, (int64_t)rows * (int64_t)ld);
                    f16_cases++;
                    tl_dot_rows_f16(q, kh, ld, rows, n, 0.125f, o0);
                    tl_dot_rows_f32(q, kw, ld, rows, n, 0.125f, o1);
                    bad_f16 += rows && memcmp(o0, o1, sizeof(float) * rows) != 0;
                    float *yq[6];
                    for (int qi = 0; qi < nq; qi++) {
                        for (int i = 0; i < n; i++) ym[qi][i] = yw[qi][i] = q[(i + qi) % n];
                        yp[qi] = ym[qi];
                        yq[qi] = yw[qi];
                    }
                    tl_axpy_rows_multi_f16(nq, yp, ap, kh, ld, rows, n);
                    tl_axpy_rows_multi_f32(nq, yq, ap, kw, ld, rows, n);
                    for (int qi = 0; qi < nq; qi++) bad_f16 += memcmp(ym[qi], yw[qi], sizeof(float) * n) != 0;
                }
            }
        CHECK(bad_axpy == 0, "%s axpy_rows equals per-row tl_axpy_f32 bitwise (%d cases differ)", tl_isa_name(lvl),
              bad_axpy);
        CHECK(bad_multi == 0, "%s axpy_rows_multi equals one axpy_rows per query bitwise (%d queries differ)",
              tl_isa_name(lvl), bad_multi);
        if (f16_cases)
            CHECK(bad_f16 == 0, "%s dot_rows / axpy_rows_multi over f16 rows equal the f32 kernels on the widened rows "
                  "bitwise (%d of %d cases differ)", tl_isa_name(lvl), bad_f16, f16_cases);
    }
    tl_kernels_set_isa(isa_max);
}

/* Softmax rows as attention makes them (scores around 0, a spread of up
 * to 60, one dominant entry, -inf where nothing is seen, 1..2000
 * elements): every level within 1e-6 relative (+1e-30) of the scalar
 * level's libm result, nothing written past n. */
static void test_softmax(void) {
    enum { N = 2003 };
    static float x[N + 1], ref[N + 1], got[N + 1], pre[N + 1];
    const int isa_max = tl_kernels_isa();
    static const int ns[] = {1, 2, 15, 16, 17, 33, 100, 511, 2000};
    int unscaled = 0;
    static const float spread[] = {0.5f, 4.0f, 20.0f};
    for (int lvl = 0; lvl <= isa_max; lvl++) {
        int far = 0, past = 0, cases = 0;
        double worst = 0;
        for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
            for (size_t si = 0; si < sizeof spread / sizeof spread[0]; si++)
                for (int shape = 0; shape < 6; shape++) {
                    /* shapes 3..5: 0..2 as unscaled int8-tile scores, 1/sqrt(128) */
                    const int n = ns[ni];
                    const float scale = shape < 3 ? 1.0f : 0.0883883476f;
                    for (int i = 0; i < n; i++) x[i] = gauss() * spread[si] / scale;
                    if (shape % 3 == 1) x[n / 2] = 50.0f / scale;   /* one entry dominates: the rest underflow */
                    if (shape % 3 == 2 && n > 1) x[0] = -INFINITY; /* exp(-inf) = 0 */
                    x[n] = 777.0f;
                    tl_kernels_set_isa(TL_ISA_SCALAR);
                    memcpy(ref, x, sizeof x);
                    tl_softmax_f32(ref, n, scale);
                    tl_kernels_set_isa(lvl);
                    memcpy(got, x, sizeof x);
                    tl_softmax_f32(got, n, scale);
                    past += got[n] != 777.0f;
                    if (lvl == 0 && scale != 1.0f) { /* the scale is one rounding before the softmax */
                        for (int i = 0; i <= n; i++) pre[i] = x[i] * scale;
                        tl_softmax_f32(pre, n, 1.0f);
                        for (int i = 0; i < n; i++) unscaled += memcmp(&pre[i], &got[i], sizeof got[i]) != 0;
                    }
                    cases++;
                    for (int i = 0; i < n; i++) {
                        double e = fabs((double)got[i] - ref[i]) / (fabs(ref[i]) + 1e-30);
                        if (!(fabs((double)got[i] - ref[i]) <= 1e-6 * fabs(ref[i]) + 1e-30)) far++;
                        if (ref[i] > 1e-30 && e > worst) worst = e;
                    }
                }
        CHECK(far == 0, "%s softmax is within 1e-6 relative of the scalar level over %d rows (%d far, worst %.2g)",
              tl_isa_name(lvl), cases, far, worst);
        CHECK(past == 0, "%s softmax writes nothing past n", tl_isa_name(lvl));
    }
    CHECK(unscaled == 0, "scalar softmax with a scale is bitwise the softmax of the scaled scores (%d differ)", unscaled);
    tl_kernels_set_isa(isa_max);
}

/* K-quant and i-quant blocks of random bytes (every scale and min in its full range,
 * q6_K scales -128..127, q3_K's -32..31) against activations of +-1, whose q8_K rows are
 * all +-127 (bsums up to +-2032): the GEMM path's integer sums stay exact
 * at the extremes and every entry is still the scalar reference bitwise. */
static void test_gemm_k_extremes(void) {
    static const int types[] = {TL_TYPE_IQ4_XS, TL_TYPE_Q2_K, TL_TYPE_Q3_K,   TL_TYPE_Q4_K,  TL_TYPE_Q5_K,
                                TL_TYPE_Q6_K,   TL_TYPE_IQ2_XXS, TL_TYPE_IQ2_XS, TL_TYPE_IQ2_S,
                                TL_TYPE_IQ1_S,  TL_TYPE_IQ1_M,   TL_TYPE_IQ3_XXS, TL_TYPE_IQ3_S};
    enum { NR = TL_GEMM_ROWS, NT = 41, N = 512 }; /* the i-quants' GEMM takes 32 tokens or more */
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const int type = types[ti];
        if (!tl_gemm_has(type)) {
            CHECK(1, "%s: no GEMM path at this level (nothing to check)", tl_type_info(type)->name);
            continue;
        }
        const size_t rw = tl_row_size(type, N), rx = tl_row_size(TL_TYPE_Q8_K, N), xs = tl_gemm_x_size(N);
        const size_t bsz = tl_type_info(type)->type_size, ws = tl_gemm_work_size(N);
        uint8_t *w = malloc(rw * NR), *x = malloc(rx * NT), *xp = aligned_alloc(64, xs * NT);
        uint8_t *work = aligned_alloc(64, ws);
        float *src = malloc(sizeof(float) * N), *out = malloc(sizeof(float) * NR * NT);
        for (size_t i = 0; i < rw * NR; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            w[i] = (uint8_t)(rng >> 56);
        }
        for (int b = 0; b < NR * N / 256; b++) { /* finite block scales */
            uint8_t *blk = w + (size_t)b * bsz;
            const uint16_t d = tl_f32_to_f16(gauss() * 0.01f), dm = tl_f32_to_f16(gauss() * 0.01f);
            if (type == TL_TYPE_Q6_K || type == TL_TYPE_Q3_K) { /* d last */
                memcpy(blk + bsz - 2, &d, 2);
            } else if (type == TL_TYPE_IQ1_M) { /* d in the top nibbles of the four scale words */
                for (int k = 0; k < 4; k++) {
                    uint8_t *hi = blk + bsz - 8 + 2 * k + 1;
                    *hi = (uint8_t)((*hi & 0x0F) | ((d >> (4 * k)) & 0xF) << 4);
                }
            } else if (type == TL_TYPE_IQ4_XS || tl_type_info(type)->name[0] == 'i') { /* d first, then random bits */
                memcpy(blk, &d, 2);
            } else if (type == TL_TYPE_Q2_K) { /* d, dmin last */
                memcpy(blk + bsz - 4, &d, 2);
                memcpy(blk + bsz - 2, &dm, 2);
            } else {
                memcpy(blk, &d, 2);
                memcpy(blk + 2, &dm, 2);
            }
        }
        for (int t = 0; t < NT; t++) {
            for (int i = 0; i < N; i++) src[i] = t == 0 ? 1.0f : t == 1 ? -1.0f : (gauss() < 0 ? -1.0f : 1.0f);
            tl_quantize_row(TL_TYPE_Q8_K, src, x + rx * t, N);
            tl_gemm_prepare(type, src, xp + xs * t, N);
        }
        int bad = 0;
        static const int nts[] = {1, 2, 11, NT};
        for (int k = 0; k < 4; k++) {
            tl_gemm_tile(type, N, NR, nts[k], out, NR, w, rw, xp, xs, work);
            for (int t = 0; t < nts[k]; t++)
                for (int r = 0; r < NR; r++) {
                    float ref;
                    tl_vec_dot_ref(type)(N, &ref, w + rw * r, x + rx * t);
                    bad += memcmp(&out[t * NR + r], &ref, sizeof ref) != 0;
                }
        }
        CHECK(bad == 0, "%s: random-byte blocks x +-127 activations: GEMM entries equal the scalar reference bitwise "
              "(%d differ)", tl_type_info(type)->name, bad);
        free(w); free(x); free(xp); free(work); free(src); free(out);
    }
}

/* tl_gemm_work_keep: one matmul's row tiles reached in several calls on
 * the same activations (forward.c's claims) give the plain rows' vec_dot
 * bitwise, also when calls on other activations, token counts or a VNNI
 * tail come between; and at the AMX level the copies are reused, which
 * the test sees by rewriting the activations behind the kernel's back
 * (the contract forbids it: the outputs must then still be the old
 * activations'), and not reused once keep is off. */
static void test_keep(void) {
    static const int types[] = {TL_TYPE_Q8_0, TL_TYPE_Q4_0, TL_TYPE_Q4_1};
    enum { G = 16, NR = 64, NT = 35 };
    /* 32 * 200: q8_0's copies of one tile take 128 KiB, so two tiles go in
     * two runs, whose copies cannot be kept */
    for (size_t ti = 0; ti < 2 * sizeof types / sizeof types[0]; ti++) {
        const int type = types[ti % 3];
        const int64_t n = ti < 3 ? 32 * 24 : 32 * 200;
        if (!tl_gemm_has(type) || tl_pack_rows(type) != G) continue;
        const size_t rw = tl_row_size(type, n), rx = tl_row_size(TL_TYPE_Q8_0, n), xs = tl_gemm_x_size(n);
        const size_t ws = tl_gemm_work_size(n), ldo = NR;
        uint8_t *w = malloc(rw * NR), *wp = malloc(rw * NR), *tmp = malloc(rw * G);
        uint8_t *x[2], *xp[2], *work = aligned_alloc(64, ws + 64);
        /* (+ NR: score_tile reads a whole ldo-wide row from out + r0) */
        float *src = malloc(sizeof(float) * n * NT * 2), *out = malloc(sizeof(float) * (ldo * NT + NR));
        for (int r = 0; r < NR; r++) {
            for (int64_t i = 0; i < n; i++) src[i] = gauss();
            tl_quantize_row(type, src, w + rw * r, n);
        }
        memcpy(wp, w, rw * NR);
        for (int g = 0; g < NR; g += G) tl_pack_group(type, G, wp + rw * g, n, tmp);
        for (int k = 0; k < 2; k++) {
            x[k] = malloc(rx * NT);
            xp[k] = aligned_alloc(64, xs * NT);
            for (int t = 0; t < NT; t++) {
                float *row = src + ((size_t)k * NT + t) * n;
                for (int64_t i = 0; i < n; i++) row[i] = gauss();
                tl_quantize_row(TL_TYPE_Q8_0, row, x[k] + rx * t, n);
                tl_gemm_prepare(type, row, xp[k] + xs * t, n);
            }
        }
        /* (activations, tokens, first row) of each call, keep on throughout */
        static const int calls[][3] = {{0, 16, 0}, {0, 16, 16}, {1, 16, 32}, {0, 16, 48}, {0, 35, 0},
                                       {0, 35, 16}, {0, 29, 32}, {1, 29, 48}, {1, 29, 0}, {0, 3, 16}};
        int bad = 0, spill = 0, past = 0;
        tl_gemm_work_keep(work, 1);
        for (size_t c = 0; c < sizeof calls / sizeof calls[0]; c++) {
            const int k = calls[c][0], nt = calls[c][1], r0 = calls[c][2];
            arm_tile(out, ldo * NT + NR, work + ws);
            tl_packed_tile(type, G, 1, n, G, nt, out + r0, ldo, wp + rw * r0, rw, xp[k], xs, work);
            /* score_tile reads rows [0, G) of w from w + rw * r0 into columns r0.. */
            int b = 0, sp = 0;
            score_tile(type, n, G, nt, out + r0, ldo, NT, w + rw * r0, rw, x[k], rx, work + ws, &past, &sp, &b, NULL);
            bad += b;
            (void)sp; /* the other columns hold earlier calls' marks: checked by test_pack */
        }
        CHECK(bad == 0 && past == 0, "%s n=%lld: calls with keep on, on two activations and token counts, equal vec_dot "
              "bitwise (%d differ)", tl_type_info(type)->name, (long long)n, bad);
        /* the reuse itself, where the level copies (amx) */
        if (tl_kernels_isa() == TL_ISA_AMX) {
            float *before = malloc(sizeof(float) * ldo * NT);
            tl_packed_tile(type, G, 1, n, G, 16, out, ldo, wp, rw, xp[0], xs, work);
            memcpy(before, out, sizeof(float) * ldo * NT);
            uint8_t *saved = malloc(xs * NT);
            memcpy(saved, xp[0], xs * NT);
            memcpy(xp[0], xp[1], xs * NT); /* new activations at the same address */
            tl_packed_tile(type, G, 1, n, G, 16, out, ldo, wp, rw, xp[0], xs, work);
            /* q8_0's copies hold its quants and scales: the old outputs;
             * the other kinds' hold the scales (their quants are read in
             * place): neither the old nor the new */
            int stale = 0, is_new = 0, p0 = 0, s0 = 0;
            for (int t = 0; t < 16; t++)
                for (int r = 0; r < G; r++) stale += memcmp(&out[t * ldo + r], &before[t * ldo + r], 4) == 0;
            score_tile(type, n, G, 16, out, ldo, 16, w, rw, x[1], rx, work + ws, &p0, &s0, &is_new, NULL);
            if (type != TL_TYPE_Q8_0) stale = is_new;
            tl_gemm_work_keep(work, 0);
            tl_packed_tile(type, G, 1, n, G, 16, out, ldo, wp, rw, xp[0], xs, work);
            int fresh = 0;
            score_tile(type, n, G, 16, out, ldo, 16, w, rw, x[1], rx, work + ws, &past, &spill, &fresh, NULL);
            CHECK(stale == 16 * G, "%s: with keep on a second call reuses the copies (%d of %d outputs from them)",
                  tl_type_info(type)->name, stale, 16 * G);
            CHECK(fresh == 0, "%s: with keep off it copies again (%d differ from the new activations' vec_dot)",
                  tl_type_info(type)->name, fresh);
            memcpy(xp[0], saved, xs * NT);
            free(saved);
            free(before);
        }
        tl_gemm_work_keep(work, 0);
        for (int k = 0; k < 2; k++) {
            free(x[k]);
            free(xp[k]);
        }
        free(w); free(wp); free(tmp); free(work); free(src); free(out);
    }
}

int main(void) {
    tl_kernels_init();
    test_tiles();
    test_gemm_path();
    test_pack();
    test_keep();
    test_gemm_k_extremes();
    test_iq_random_tiles();
    test_forward();
    test_multi();
    test_pieces();
    test_glu("gelu", tl_gelu_tanh_mul);
    test_glu("silu", tl_silu_mul);
    test_sum_sq();
    test_rows();
    test_softmax();
    return test_summary();
}
