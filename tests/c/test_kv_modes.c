/* test_kv_modes.c - KV cache modes: the row codecs, choosing a mode
 * (option, kv_type, environment, errors), the memory each mode takes, and
 * the cache equivalences (cached == uncached, batch == alone, looped ==
 * unrolled, cache_window, copy-on-write) in every mode, mixed K/V types
 * and store-h included, on every architecture the backends are checked on.
 * tests/kv_modes.sh also runs the other equivalence suites per mode. */
#include <stdint.h>
#include <unistd.h>

#include "kv_blocks.h"
#include "kv_mode.h"
#include "quants.h"
#include "ref_cases.h"
#include "test.h"
#include "testmodel.h"
#include "tinyloop.h"

static const char *tmp_path(const char *tag) {
    static char buf[8][128];
    static int next;
    char *p = buf[next++ % 8];
    snprintf(p, 128, "/tmp/tl_kvmodes_%d_%s.gguf", (int)getpid(), tag);
    return p;
}

static float frand(uint32_t *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) & 0xFFFF) / 32768.0f - 1.0f;
}

/* ---- codecs ---------------------------------------------------------------------- */

static void test_codecs(void) {
    uint32_t seed = 7;
    float x[256], y[256];
    uint8_t buf[1024];
    for (int type = TL_KVT_Q8; type <= TL_KVT_Q4; type++) {
        for (int n = 8; n <= 256; n *= 2) {
            int g = tl_kv_group(n);
            double worst = 0;
            for (int rep = 0; rep < 20; rep++) {
                float scale = rep == 0 ? 0.0f : (float)(rep * rep) * 0.1f;
                for (int i = 0; i < n; i++) x[i] = frand(&seed) * scale;
                tl_kv_store_row(type, g, x, buf, n);
                tl_kv_load_row(type, g, buf, y, n);
                /* per group: q8 errs by at most half a step (amax/127), q4
                 * by half a step ((max - min)/15), plus the f16 rounding of
                 * the scale (and of q4's minimum) */
                for (int b = 0; b < n / g; b++) {
                    float amax = 0, lo = x[b * g], hi = x[b * g];
                    for (int i = 0; i < g; i++) {
                        amax = fmaxf(amax, fabsf(x[b * g + i]));
                        lo = fminf(lo, x[b * g + i]);
                        hi = fmaxf(hi, x[b * g + i]);
                    }
                    double step = type == TL_KVT_Q8 ? amax / 127.0 : (hi - lo) / 15.0;
                    for (int i = 0; i < g; i++) {
                        double e = fabs((double)y[b * g + i] - x[b * g + i]);
                        double bound = 0.5 * step * 1.01 + amax * 2.5e-3;
                        if (e > bound && e - bound > worst) worst = e - bound;
                    }
                }
                /* decoding = d * q (q4: q * d + m) of the stored bytes, bitwise,
                 * whichever path (group 32 goes through the q8_0 / q4_1 dequantizers) */
                int same = 1;
                const uint8_t *p = buf;
                for (int b = 0; b < n / g; b++) {
                    uint16_t dh;
                    memcpy(&dh, p, 2);
                    float d = tl_f16_to_f32(dh), mn = 0;
                    if (type == TL_KVT_Q4) {
                        memcpy(&dh, p + 2, 2);
                        mn = tl_f16_to_f32(dh);
                    }
                    for (int i = 0; i < g; i++) {
                        float want = type == TL_KVT_Q8
                                         ? d * (float)((const int8_t *)(p + 2))[i]
                                         : (float)(i < g / 2 ? p[4 + i] & 15 : p[4 + i - g / 2] >> 4) * d + mn;
                        if (memcmp(&want, &y[b * g + i], 4) != 0) same = 0;
                    }
                    p += tl_kv_row_bytes(type, g, g);
                }
                if (!same) {
                    CHECK(0, "%s n %d: decoding is d * q of the stored bytes", tl_kv_type_name(type), n);
                    break;
                }
            }
            CHECK(worst == 0, "%s rows of %d (group %d) round-trip within their step (worst excess %g)",
                  tl_kv_type_name(type), n, g, worst);
        }
    }
    CHECK(tl_kv_group(64) == 32 && tl_kv_group(80) == 16 && tl_kv_group(8) == 8 && tl_kv_group(256) == 32,
          "groups are gcd(row, 32)");
    CHECK(tl_kv_row_bytes(TL_KVT_Q8, 64, 32) == 68 && tl_kv_row_bytes(TL_KVT_Q4, 64, 32) == 40 &&
              tl_kv_row_bytes(TL_KVT_F16, 64, 32) == 128,
          "a 64-value row is 68 bytes in q8, 40 in q4, 128 in f16");
}

/* ---- choosing a mode ------------------------------------------------------------------- */

static void test_parse(void) {
    static const struct { const char *in, *name; } ok[] = {
        {"f16", "f16"}, {"f32", "f32"}, {"q8", "q8"}, {"q4", "q4"}, {"q8,f16", "q8,f16"},
        {"f16,q4", "f16,q4"}, {"q8,q8", "q8"}, {"h", "h:f16"}, {"h:q8", "h:q8"}, {"h:f32", "h:f32"},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        tl_kv_mode mo;
        char name[16] = "";
        int rc = tl_kv_mode_parse(ok[i].in, "kv_mode", &mo);
        if (!rc) tl_kv_mode_name(&mo, name, sizeof name);
        CHECK(rc == TL_OK && !strcmp(name, ok[i].name), "'%s' parses to %s (got %d, %s)", ok[i].in, ok[i].name, rc,
              name);
    }
    static const char *const bad[] = {"", "q9", "h:", "h:q9", "q8,", ",q8", "q8,f16,f32", "H", "hq8", "f16 "};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tl_kv_mode mo;
        int rc = tl_kv_mode_parse(bad[i], "--kv", &mo);
        CHECK(rc == TL_ERR_INVALID_ARG && strstr(tl_last_error(), "--kv") && strstr(tl_last_error(), bad[i]),
              "'%s' is refused, naming the option and value (%s)", bad[i], tl_last_error());
    }
}

/* Opens path with params; returns the model's mode name in name, or the error code. */
static int open_mode(const char *path, tl_model_params mp, char *name, size_t cap) {
    tl_model *m = NULL;
    int rc = tl_model_open(path, mp, &m);
    name[0] = 0;
    if (rc) return rc;
    tl_model_info info;
    tl_model_get_info(m, &info);
    snprintf(name, cap, "%s", info.kv_mode);
    tl_model_close(m);
    return TL_OK;
}

static void test_environment(const char *path) {
    static const char *const vars[] = {"TINYLOOP_KV_INT8", "TINYLOOP_KV_INT4", "TINYLOOP_KV_H_MODE"};
    char *saved[3];
    for (int i = 0; i < 3; i++) {
        const char *v = getenv(vars[i]);
        saved[i] = v ? strdup(v) : NULL;
        unsetenv(vars[i]);
    }
    static const struct { const char *i8, *i4, *h, *want; } cases[] = {
        {NULL, NULL, NULL, "f16"}, {"1", NULL, NULL, "q8"},   {NULL, "true", NULL, "q4"},
        {NULL, NULL, "yes", "h:f16"}, {"on", NULL, "1", "h:q8"}, {"0", "1", "off", "q4"},
        {"", NULL, NULL, "f16"},
    };
    tl_model_params mp = tl_model_default_params();
    char name[16];
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const char *vals[3] = {cases[c].i8, cases[c].i4, cases[c].h};
        for (int i = 0; i < 3; i++)
            if (vals[i]) setenv(vars[i], vals[i], 1);
            else unsetenv(vars[i]);
        int rc = open_mode(path, mp, name, sizeof name);
        CHECK(rc == TL_OK && !strcmp(name, cases[c].want), "INT8=%s INT4=%s H_MODE=%s gives %s (got %s: %s)",
              vals[0] ? vals[0] : "-", vals[1] ? vals[1] : "-", vals[2] ? vals[2] : "-", cases[c].want, name,
              rc ? tl_last_error() : "ok");
    }
    /* the option wins over the environment */
    setenv("TINYLOOP_KV_INT8", "1", 1);
    tl_model_params f16 = mp;
    f16.kv_type = TL_KV_F16;
    CHECK(open_mode(path, f16, name, sizeof name) == TL_OK && !strcmp(name, "f16"), "kv_type f16 wins over INT8=1");
    tl_model_params q4 = mp;
    q4.kv_mode = "q4,f16";
    CHECK(open_mode(path, q4, name, sizeof name) == TL_OK && !strcmp(name, "q4,f16"), "kv_mode wins over INT8=1");
    /* errors name the variable and value */
    setenv("TINYLOOP_KV_INT4", "1", 1);
    int rc = open_mode(path, mp, name, sizeof name);
    CHECK(rc == TL_ERR_INVALID_ARG && strstr(tl_last_error(), "TINYLOOP_KV_INT8") &&
              strstr(tl_last_error(), "TINYLOOP_KV_INT4"),
          "INT8 and INT4 both set is an error naming both (%s)", tl_last_error());
    unsetenv("TINYLOOP_KV_INT4");
    setenv("TINYLOOP_KV_INT8", "maybe", 1);
    rc = open_mode(path, mp, name, sizeof name);
    CHECK(rc == TL_ERR_INVALID_ARG && strstr(tl_last_error(), "TINYLOOP_KV_INT8='maybe'"),
          "an unparsable value names the variable and value (%s)", tl_last_error());
    unsetenv("TINYLOOP_KV_INT8");
    tl_model_params badt = mp;
    badt.kv_type = 7;
    rc = open_mode(path, badt, name, sizeof name);
    CHECK(rc == TL_ERR_INVALID_ARG && strstr(tl_last_error(), "kv_type 7"), "kv_type 7 is refused by value (%s)",
          tl_last_error());
    tl_model_params badm = mp;
    badm.kv_mode = "q5";
    rc = open_mode(path, badm, name, sizeof name);
    CHECK(rc == TL_ERR_INVALID_ARG && strstr(tl_last_error(), "'q5'"), "kv_mode 'q5' is refused by value (%s)",
          tl_last_error());
    for (int i = 0; i < 3; i++) {
        if (saved[i]) setenv(vars[i], saved[i], 1);
        free(saved[i]);
    }
}

/* ---- memory ---------------------------------------------------------------------------- */

/* 1,024-token sequences of one layer's KV that fit 256 MB in a mode. */
static long seqs_in_256mb(int tk, int tv, int h, int n_head_kv, int head_dim, int n_embd, int n_layer) {
    tl_kv_layout l;
    if (tl_kv_layout_init(&l, tk, tv, h, 16, n_head_kv, head_dim, n_embd)) return -1;
    long blocks = (long)((256u << 20) / l.block_bytes);
    return blocks / (1024 / 16 * n_layer);
}

static void test_memory(const char *path) {
    static const struct { const char *name; int n_head_kv, head_dim, n_embd, n_layer, h_saves; } shapes[] = {
        {"110M-shaped (12 kv heads x 64, embd 768)", 12, 64, 768, 12, 1},
        {"Gemma 3 270M (1 kv head x 256, embd 640)", 1, 256, 640, 18, 0},
    };
    for (size_t i = 0; i < 2; i++) {
        const int nk = shapes[i].n_head_kv, hd = shapes[i].head_dim, ne = shapes[i].n_embd, nl = shapes[i].n_layer;
        long f16 = seqs_in_256mb(TL_KVT_F16, TL_KVT_F16, 0, nk, hd, ne, nl);
        long q8 = seqs_in_256mb(TL_KVT_Q8, TL_KVT_Q8, 0, nk, hd, ne, nl);
        long q4 = seqs_in_256mb(TL_KVT_Q4, TL_KVT_Q4, 0, nk, hd, ne, nl);
        long h = seqs_in_256mb(TL_KVT_F16, TL_KVT_F16, 1, nk, hd, ne, nl);
        long hq8 = seqs_in_256mb(TL_KVT_Q8, TL_KVT_Q8, 1, nk, hd, ne, nl);
        printf("  %s: 1,024-token sequences in 256 MB: f16 %ld, q8 %ld, q4 %ld, h:f16 %ld, h:q8 %ld\n",
               shapes[i].name, f16, q8, q4, h, hq8);
        CHECK(q8 * 10 >= f16 * 18, "%s: q8 holds >= 1.8x the sequences of f16 (%ld vs %ld)", shapes[i].name, q8, f16);
        CHECK(q4 >= f16 * 3, "%s: q4 holds >= 3x the sequences of f16 (%ld vs %ld)", shapes[i].name, q4, f16);
        CHECK((h > f16) == shapes[i].h_saves, "%s: store-h %s memory (%ld vs %ld)", shapes[i].name,
              shapes[i].h_saves ? "saves" : "does not save", h, f16);
        CHECK(hq8 > h, "%s: h:q8 holds more than h:f16", shapes[i].name);
    }
    /* the model reports the same figures, and kv_bytes / blocks follow the mode */
    tl_model_params mp = tl_model_default_params();
    mp.kv_mem = 1 << 20;
    size_t bytes[3] = {0};
    int blocks[3] = {0};
    const char *modes[3] = {"f16", "q8", "q4"};
    for (int i = 0; i < 3; i++) {
        mp.kv_mode = modes[i];
        tl_model *m = NULL;
        if (tl_model_open(path, mp, &m)) continue;
        tl_model_info info;
        tl_model_get_info(m, &info);
        bytes[i] = info.kv_token_bytes;
        blocks[i] = info.kv_blocks_total;
        CHECK(tl_model_kv_token_bytes(m, modes[i]) == info.kv_token_bytes,
              "tl_model_kv_token_bytes(%s) = the open mode's bytes/token (%zu)", modes[i], info.kv_token_bytes);
        CHECK(info.kv_bytes <= mp.kv_mem && info.kv_bytes + info.kv_bytes / info.kv_blocks_total > mp.kv_mem,
              "%s: the arena fills kv_mem with whole blocks (%zu of %zu bytes)", modes[i], info.kv_bytes, mp.kv_mem);
        CHECK(tl_model_kv_token_bytes(m, "q9") == 0 && strstr(tl_last_error(), "q9"),
              "tl_model_kv_token_bytes refuses an unknown mode");
        tl_model_close(m);
    }
    CHECK(bytes[1] < bytes[0] && bytes[2] < bytes[1] && blocks[1] > blocks[0] && blocks[2] > blocks[1],
          "q8 and q4 take fewer bytes per token and fit more blocks in kv_mem (%zu/%zu/%zu bytes, %d/%d/%d blocks)",
          bytes[0], bytes[1], bytes[2], blocks[0], blocks[1], blocks[2]);
}

/* ---- copy-on-write ------------------------------------------------------------------------ */

/* Copying a shared, partly written quantized block for a writer copies its
 * bytes: the rows the writer does not touch are not re-quantized. */
static void test_cow(void) {
    static const int types[][2] = {{TL_KVT_Q8, TL_KVT_Q8}, {TL_KVT_Q4, TL_KVT_Q4}, {TL_KVT_Q8, TL_KVT_F16}};
    for (int c = 0; c < 3; c++) {
        tl_kv_layout l;
        tl_kv_layout_init(&l, types[c][0], types[c][1], 0, 16, 2, 64, 128);
        tl_kv_pool pool;
        if (tl_kv_pool_init(&pool, 8, &l, 1)) continue;
        tl_block_table a = {.depth = 1}, b = {.depth = 1};
        tl_block_table_reserve(&a, &pool, 20); /* 2 blocks, the second holds rows 0-3 */
        uint32_t seed = 3;
        float row[64];
        for (int pos = 0; pos < 20; pos++)
            for (int h = 0; h < 2; h++) {
                for (int i = 0; i < 64; i++) row[i] = frand(&seed);
                int id = a.ids[pos / 16];
                tl_kv_store_row(l.type_k, l.group, row, tl_kv_k(&pool, id) + tl_kv_row_off(&l, h, pos % 16, l.row_bytes_k), 64);
                tl_kv_store_row(l.type_v, l.group, row, tl_kv_v(&pool, id) + tl_kv_row_off(&l, h, pos % 16, l.row_bytes_v), 64);
            }
        /* b shares a's blocks, then takes a private copy of the tail to write position 20 */
        tl_block_table_reserve(&b, &pool, 0);
        b.ids = malloc(2 * sizeof *b.ids);
        b.cap_logical = b.n_logical = 2;
        for (int i = 0; i < 2; i++) {
            b.ids[i] = a.ids[i];
            tl_kv_ref(&pool, a.ids[i]);
        }
        int rc = tl_block_table_make_writable(&b, &pool, 1);
        int src = a.ids[1], dst = b.ids[1], same = rc == 0 && src != dst;
        for (int h = 0; same && h < 2; h++)
            for (int r = 0; r < 4; r++) {
                same &= !memcmp(tl_kv_k(&pool, dst) + tl_kv_row_off(&l, h, r, l.row_bytes_k),
                                tl_kv_k(&pool, src) + tl_kv_row_off(&l, h, r, l.row_bytes_k), l.row_bytes_k);
                same &= !memcmp(tl_kv_v(&pool, dst) + tl_kv_row_off(&l, h, r, l.row_bytes_v),
                                tl_kv_v(&pool, src) + tl_kv_row_off(&l, h, r, l.row_bytes_v), l.row_bytes_v);
            }
        /* the arena is not zeroed: compare the shared block's row 4 with what it held before */
        uint8_t before[256];
        memcpy(before, tl_kv_k(&pool, src) + tl_kv_row_off(&l, 0, 4, l.row_bytes_k), l.row_bytes_k);
        for (int i = 0; i < 64; i++) row[i] = 9.0f;
        tl_kv_store_row(l.type_k, l.group, row, tl_kv_k(&pool, dst) + tl_kv_row_off(&l, 0, 4, l.row_bytes_k), 64);
        same &= !memcmp(tl_kv_k(&pool, src) + tl_kv_row_off(&l, 0, 4, l.row_bytes_k), before, l.row_bytes_k);
        char name[16];
        tl_kv_mode mo = {types[c][0], types[c][1], 0};
        tl_kv_mode_name(&mo, name, sizeof name);
        CHECK(same, "%s: the copy-on-write copy of a shared tail block keeps its rows' bytes, and the writer's new "
              "row stays out of the shared block", name);
        tl_block_table_release(&a, &pool);
        tl_block_table_release(&b, &pool);
        CHECK(pool.n_free == pool.n_blocks, "%s: every block returns to the free list", name);
        tl_kv_pool_destroy(&pool);
    }
}

/* ---- equivalences ---------------------------------------------------------------------- */

static int gen(tl_model *m, const int32_t *p, int n, int max, int no_cache, int window, int32_t *out) {
    tl_generate_params gp = tl_generate_default_params();
    gp.max_tokens = max;
    gp.ignore_eos = 1;
    gp.no_cache = no_cache;
    gp.cache_window = window;
    return tl_generate(m, p, n, gp, out, max);
}

/* Last-token logits of `n` tokens prefilled, then one decode step, alone
 * and in a batch of two; returns the largest |difference| (0 when equal). */
static double batch_vs_alone(tl_model *m, const int32_t *toks, int nv) {
    float *alone = malloc(sizeof(float) * (size_t)nv * 4), *batch = malloc(sizeof(float) * (size_t)nv * 4);
    const int lens[2] = {21, 7};
    double worst = 0;
    for (int i = 0; i < 2; i++) {
        tl_seq *s = NULL;
        tl_seq_new(m, 0, &s);
        const int32_t *p = toks + i * 30;
        int n = lens[i];
        tl_batch_forward(m, &s, &p, &n, 1, alone + (size_t)(2 * i) * nv);
        p = toks + i * 30 + lens[i];
        n = 1;
        tl_batch_forward(m, &s, &p, &n, 1, alone + (size_t)(2 * i + 1) * nv);
        tl_seq_free(s);
    }
    tl_seq *s[2] = {NULL, NULL};
    tl_seq_new(m, 0, &s[0]);
    tl_seq_new(m, 0, &s[1]);
    const int32_t *p[2] = {toks, toks + 30};
    int n[2] = {lens[0], lens[1]};
    tl_batch_forward(m, s, p, n, 2, batch);
    const int32_t *p2[2] = {toks + lens[0], toks + 30 + lens[1]};
    int n2[2] = {1, 1};
    tl_batch_forward(m, s, p2, n2, 2, batch + (size_t)2 * nv);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < nv; j++) {
            double d1 = fabs((double)batch[(size_t)i * nv + j] - alone[(size_t)(2 * i) * nv + j]);
            double d2 = fabs((double)batch[(size_t)(2 + i) * nv + j] - alone[(size_t)(2 * i + 1) * nv + j]);
            if (d1 > worst) worst = d1;
            if (d2 > worst) worst = d2;
        }
    tl_seq_free(s[0]);
    tl_seq_free(s[1]);
    free(alone);
    free(batch);
    return worst;
}

/* Cached == uncached (a prefix hit, a prompt extending it, a cache window)
 * and batch == alone for model m in one mode. */
static void equivalences_in(tl_model *m, const char *name, const char *mode, int a) {
    tl_model_info info;
    tl_model_get_info(m, &info);
    int32_t prompt[96], ext[112], u[24], c1[24], c2[24], e1[24], e2[24], w1[24], w2[24];
    ref_fill_tokens(prompt, 96, info.n_vocab, 11 + (uint32_t)a);
    int nu = gen(m, prompt, 37, 20, 1, 0, u);       /* uncached */
    int na = gen(m, prompt, 37, 20, 0, 0, c1);      /* fills the cache */
    int nb = gen(m, prompt, 37, 20, 0, 0, c2);      /* hits it */
    CHECK(nu == 20 && ref_same_ids(u, nu, c1, na) && ref_same_ids(u, nu, c2, nb),
          "%s / %s: cached == uncached (first diff %d, %d)", name, mode, ref_first_diff(u, nu, c1, na),
          ref_first_diff(u, nu, c2, nb));
    /* a longer prompt through the cached prefix: partial tail block copied on write */
    memcpy(ext, prompt, sizeof prompt);
    int ne1 = gen(m, prompt, 53, 16, 0, 0, e1), ne2 = gen(m, prompt, 53, 16, 1, 0, e2);
    CHECK(ref_same_ids(e1, ne1, e2, ne2), "%s / %s: a prompt extending a cached one == uncached (diff at %d)", name,
          mode, ref_first_diff(e1, ne1, e2, ne2));
    int nw1 = gen(m, prompt, 60, 20, 1, 24, w1);
    gen(m, prompt, 60, 20, 0, 24, w2);
    int nw2 = gen(m, prompt, 60, 20, 0, 24, w2);
    CHECK(ref_same_ids(w1, nw1, w2, nw2), "%s / %s: cache_window 24 cached == uncached (diff at %d)", name, mode,
          ref_first_diff(w1, nw1, w2, nw2));
    double d = batch_vs_alone(m, prompt, info.n_vocab);
    CHECK(d == 0.0, "%s / %s: a batch of two gives each sequence's logits alone, exactly (max diff %g)", name, mode, d);
}

static void test_equivalences(void) {
    static const char *const modes[] = {"q8", "q4", "q8,f16", "f16,q4", "q4,q8", "f32,q8", "h:f16", "h:q8", "h:q4"};
    tm_spec specs[TM_ARCH_CASES + 1];
    const char *names[TM_ARCH_CASES + 1];
    int n_arch = tm_arch_cases(specs, names);
    /* head_dim 64: q8 / q4 K rows are q8_0 / q4_0 rows and attention reads
     * them with the int8 dot kernels (the cases above have head_dim 16,
     * except Gemma's 64 with one KV head for four query heads) */
    specs[n_arch] = tm_default_spec();
    specs[n_arch].n_embd = 128;
    specs[n_arch].n_head = specs[n_arch].n_head_kv = 2;
    specs[n_arch].seed = 9;
    names[n_arch++] = "llama head_dim 64";
    const int quick = getenv("TL_TEST_QUICK") != NULL;
    for (int a = 0; a < n_arch; a++) {
        const char *path = tmp_path("arch");
        if (tm_write(&specs[a], path)) {
            CHECK(0, "write the %s model", names[a]);
            continue;
        }
        for (size_t mi = 0; mi < sizeof modes / sizeof modes[0]; mi++) {
            if (quick && mi % 3 != (size_t)a % 3) continue; /* ASan: a third of the grid, every mode somewhere */
            tl_model_params mp = tl_model_default_params();
            mp.kv_mode = modes[mi];
            mp.max_seq_len = 256;
            tl_model *m = NULL;
            if (tl_model_open(path, mp, &m)) {
                CHECK(0, "%s opens in %s (%s)", names[a], modes[mi], tl_last_error());
                continue;
            }
            equivalences_in(m, names[a], modes[mi], a);
            tl_model_close(m);
        }
        /* q8 V at head_dim 64 is summed in int8 over pieces of 16 rows of a
         * block: blocks of 4 (a piece in part) and 24 (a piece and a half) */
        for (int bi = 0; a == n_arch - 1 && bi < 2; bi++) {
            tl_model_params mp = tl_model_default_params();
            mp.kv_mode = "q8";
            mp.max_seq_len = 256;
            mp.kv_block_size = bi ? 24 : 4;
            tl_model *m = NULL;
            if (tl_model_open(path, mp, &m)) {
                CHECK(0, "%s opens in q8 with blocks of %d (%s)", names[a], mp.kv_block_size, tl_last_error());
                continue;
            }
            equivalences_in(m, bi ? "llama head_dim 64, blocks of 24" : "llama head_dim 64, blocks of 4", "q8", a);
            tl_model_close(m);
        }
        remove(path);
    }
}

/* loops = 2 over layers [1, 3) equals the model with them written twice, in every mode. */
static void test_looped(void) {
    static const char *const modes[] = {"q8", "q4,f16", "h:q8"};
    tm_spec s = tm_default_spec();
    s.n_layer = 4;
    s.loop_start = 1;
    s.loop_end = 3;
    s.loop_default = 1;
    const char *lp = tmp_path("loop"), *up = tmp_path("unroll");
    tm_write(&s, lp);
    s.unroll = 2;
    tm_write(&s, up);
    for (size_t mi = 0; mi < sizeof modes / sizeof modes[0]; mi++) {
        tl_model_params mp = tl_model_default_params();
        mp.kv_mode = modes[mi];
        tl_model *ml = NULL, *mu = NULL;
        tl_model_open(lp, mp, &ml);
        tl_model_open(up, mp, &mu);
        if (!ml || !mu) {
            CHECK(0, "looped and unrolled models open in %s", modes[mi]);
            tl_model_close(ml);
            tl_model_close(mu);
            continue;
        }
        int32_t p[40], a[16], b[16];
        ref_fill_tokens(p, 40, 320, 5);
        tl_generate_params gp = tl_generate_default_params();
        gp.max_tokens = 16;
        gp.ignore_eos = 1;
        gp.loops = 2;
        int na = tl_generate(ml, p, 40, gp, a, 16);
        gp.loops = 0;
        int nb = tl_generate(mu, p, 40, gp, b, 16);
        CHECK(na == 16 && ref_same_ids(a, na, b, nb), "%s: looped x2 == unrolled (diff at %d)", modes[mi],
              ref_first_diff(a, na, b, nb));
        tl_model_close(ml);
        tl_model_close(mu);
    }
    remove(lp);
    remove(up);
}

int main(void) {
    tl_kernels_init();
    test_codecs();
    test_parse();
    tm_spec s = tm_default_spec();
    const char *path = tmp_path("small");
    if (tm_write(&s, path) == 0) {
        test_environment(path);
        test_memory(path);
    } else {
        CHECK(0, "write the small model");
    }
    remove(path);
    test_cow();
    test_equivalences();
    test_looped();
    return test_summary();
}
