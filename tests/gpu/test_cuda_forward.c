/* test_cuda_forward.c - the CUDA backend plugin (tl_backend_plugin_v1 in
 * libtinyloop-cuda.so) against the CPU engine's forward pass, on synthetic
 * models from tests/c/lib/testmodel.h: llama (f32 weights and KV; Q4_0
 * with a loop block, so virtual layers reuse physical ones), qwen2 (Q/K/V
 * biases, NEOX RoPE, Q8_0, f16 KV) and gemma3 (Q/K norms, post norms,
 * GeGLU, sliding-window layers, Q4_K, f16 KV).
 *
 * The CPU forward runs first (it reserves the KV blocks); the same batch is
 * then described to the plugin with the CPU's block ids, so both arenas hold
 * the same blocks. Each case runs a mixed prefill batch (T >= 9: the GEMM
 * path and the prefill attention kernel), decode steps (T = n_seq: the
 * direct matmul path and the decode kernel), a mixed prefill+decode batch
 * and a batch with want_logits masking one sequence.
 *
 * CUDA graphs: every batch also runs on a second plugin context with
 * graphs off (TINYLOOP_CUDA_GRAPHS=0). Decode steps on the first are
 * captured and replayed (16 steps cross a block-table bucket, and odd
 * cases split decode attention), and the two must agree bit for bit: a
 * replay runs the same kernels, so any difference is a value the capture
 * froze that should have been read afresh.
 *
 * KV modes: the CPU engine and the plugin both opened in q8, q4, q8,f16,
 * q4,q8 (and f16,q4 at head_dim 256); after the steps, every stored K/V row
 * of the sequences is read back from the plugin's arena
 * (tl_cuda_plugin_read_kv_block) and compared with the CPU's block.
 *
 * Tolerances, by NMSE = sum (gpu - cpu)^2 / sum cpu^2 over a batch's logits:
 *   1e-5  f32 weights with f32, q8 or q4 KV (same arithmetic up to
 *         summation order; q8/q4 rows quantized with the same rounding, so
 *         >= 95% of them must be the CPU's bytes: 100% on the emulation)
 *   1e-3  f16 KV or quantized weights (the CPU quantizes activations to
 *         Q8 for quantized dots; the GEMM path rounds weights and
 *         activations to f16)
 *   1e-2, 3e-2  quantized weights with q4 K (the Q8-activation difference
 *         moves K elements across q4 steps of 1/16 of a group's range)
 * Stored K/V (dequantized, NMSE): 1e-9 f32, 1e-5 f16 with float weights,
 * 1e-4 q8/q4 with f32 weights, 1e-3 .. 5e-2 with quantized weights.
 * Greedy tokens: the CPU's argmax is fed to both (teacher forcing); the
 * GPU's argmax must match wherever the CPU's top-2 margin exceeds 1e-2 of
 * the logits' spread (5e-2 for quantized weights with q4 K) (a near-tie may
 * flip legitimately).
 *
 * Without a CUDA device: "SKIP: no CUDA device" and "0 passed, 0 failed". */
#include <stdint.h>
#include <unistd.h>

#include "backend.h"
#include "forward.h"
#include "kv_blocks.h"
#include "kv_mode.h"
#include "model.h"
#include "quants.h"
#include "test.h"
#include "testmodel.h"
#include "tinyloop.h"
#include "tl_cuda.h"

const tl_backend_ops *tl_backend_plugin_v1(void);

#define MAX_SEQ 4
#define MAX_TOK 64

typedef struct tcase {
    const char *name;
    tm_spec spec;
    int kv_type;
    const char *kv_mode; /* a KV mode string (q8, "q4,q8", ...) instead of kv_type, or NULL */
    int loops;
    double tol;
    double kv_tol;   /* stored K/V (dequantized) vs the CPU's, NMSE */
    double min_same; /* fraction of stored q8/q4 rows bytewise equal to the CPU's, at least */
    float tie;       /* near-tie margin for greedy tokens (0: NEAR_TIE) */
} tcase;

#define NEAR_TIE 1e-2f

static int argmax(const float *x, int n, float *margin) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    float second = -INFINITY, lo = x[0], hi = x[0];
    for (int i = 0; i < n; i++) {
        if (i != best && x[i] > second) second = x[i];
        if (x[i] < lo) lo = x[i];
        if (x[i] > hi) hi = x[i];
    }
    *margin = hi > lo ? (x[best] - second) / (hi - lo) : 1.0f;
    return best;
}

typedef struct runner {
    tl_model *m;
    const tl_backend_ops *ops;
    void *ctx;
    void *ctx_eager; /* the same plugin with CUDA graphs off */
    float *eager;    /* its logits */
    tl_backend_model bm;
    int *layer_window;
    int *phys;
    int depth;
} runner;

static void fill_backend_model(runner *r, int max_batch) {
    tl_model *m = r->m;
    r->layer_window = calloc((size_t)m->hp.n_layer, sizeof(int));
    tl_backend_describe(m, m->kv.n_blocks, &m->kv.layout, r->layer_window, &r->bm);
    r->bm.max_batch_tokens = max_batch;
}

/* One step on both: CPU first (reserves blocks), then the plugin with the
 * same block ids. Returns the number of logits rows (-1 on failure). */
static int step(runner *r, tl_seq **seqs, int n_seq, int32_t *const *toks, const int *n_tok, const int *want,
                float *cpu, float *gpu, const char *what) {
    int pos0[MAX_SEQ];
    for (int s = 0; s < n_seq; s++) pos0[s] = seqs[s]->n_pos;
    tl_forward_opts opts = {.want_logits = want, .vl_capture = -1};
    int rc = tl_forward(r->m, seqs, (const int32_t *const *)toks, n_tok, n_seq, cpu, &opts);
    CHECK(rc == 0, "%s: CPU forward failed (%d)", what, rc);
    if (rc) return -1;
    int32_t tokens[MAX_TOK], pos[MAX_TOK], tok_seq[MAX_TOK];
    const int32_t *ids[MAX_SEQ];
    int n_logical[MAX_SEQ], window[MAX_SEQ], T = 0, rows = 0;
    for (int s = 0; s < n_seq; s++) {
        for (int j = 0; j < n_tok[s]; j++, T++) {
            tokens[T] = toks[s][j];
            pos[T] = pos0[s] + j;
            tok_seq[T] = s;
        }
        ids[s] = seqs[s]->bt.ids;
        n_logical[s] = seqs[s]->bt.n_logical;
        window[s] = seqs[s]->window;
        rows += !want || want[s];
        CHECK(seqs[s]->bt.depth == r->depth, "%s: depth %d vs %d", what, seqs[s]->bt.depth, r->depth);
    }
    tl_backend_batch b = {.n_seq = n_seq, .T = T, .tokens = tokens, .pos = pos, .tok_seq = tok_seq,
                          .block_ids = ids, .n_logical = n_logical, .window = window, .depth = r->depth,
                          .phys_layer = r->phys, .want_logits = want};
    char msg[512] = "";
    rc = r->ops->forward(r->ctx, &b, gpu, msg, sizeof msg);
    CHECK(rc == 0, "%s: plugin forward failed (%d): %s", what, rc, msg);
    if (rc) return -1;
    rc = r->ops->forward(r->ctx_eager, &b, r->eager, msg, sizeof msg);
    CHECK(rc == 0, "%s: plugin forward without graphs failed (%d): %s", what, rc, msg);
    if (rc) return -1;
    CHECK(!memcmp(gpu, r->eager, (size_t)rows * r->m->hp.n_vocab * sizeof(float)),
          "%s: logits with CUDA graphs differ from those without (T %d, %d sequences)", what, T, n_seq);
    return rows;
}

static void compare(const tcase *tc, const float *cpu, const float *gpu, int rows, int n_vocab, const char *what,
                    int32_t *greedy_out) {
    double e = test_nmse(gpu, cpu, (size_t)rows * n_vocab);
    CHECK(e <= tc->tol, "%s %s: logits NMSE %.3g > %.1g", tc->name, what, e, tc->tol);
    printf("  %-28s %-22s rows %d  NMSE %.3g\n", tc->name, what, rows, e);
    for (int i = 0; i < rows; i++) {
        float mc, mg;
        int c = argmax(cpu + (size_t)i * n_vocab, n_vocab, &mc);
        int g = argmax(gpu + (size_t)i * n_vocab, n_vocab, &mg);
        CHECK(c == g || mc < (tc->tie > 0 ? tc->tie : NEAR_TIE), "%s %s row %d: greedy token GPU %d vs CPU %d (CPU margin %.3g)", tc->name, what,
              i, g, c, mc);
        if (greedy_out) greedy_out[i] = c;
    }
}

/* The K/V both backends stored for every position of the sequences, read
 * back from the plugin's arena and dequantized by the CPU codec, against
 * the CPU arena's: NMSE over K and over V. The K/V inputs differ by the
 * backends' rounding, so a quantized element may land one step apart;
 * the bytes of most rows still agree, and the graph and eager contexts
 * must agree bit for bit. */
static void compare_kv(const tcase *tc, runner *r, tl_seq **seqs, int n_seq) {
    const tl_kv_layout *l = &r->m->kv.layout;
    const int hd = l->row_len, bs = l->block_size;
    uint8_t *g = malloc(l->block_bytes), *ge = malloc(l->block_bytes);
    float *a = malloc(sizeof(float) * hd), *b = malloc(sizeof(float) * hd);
    double err[2] = {0, 0}, ref[2] = {0, 0};
    long rows = 0, qrows = 0, qsame = 0, blocks = 0, eager_diff = 0;
    for (int s = 0; s < n_seq; s++) {
        const tl_seq *sq = seqs[s];
        for (int lb = 0; lb < sq->bt.n_logical; lb++)
            for (int vl = 0; vl < r->depth; vl++) {
                int id = sq->bt.ids[lb * sq->bt.depth + vl];
                if (id < 0) continue; /* dropped behind a window */
                int rc = tl_cuda_plugin_read_kv_block(r->ctx, id, g, l->block_bytes);
                rc = rc ? rc : tl_cuda_plugin_read_kv_block(r->ctx_eager, id, ge, l->block_bytes);
                CHECK(rc == 0, "%s: reading KV block %d: %s", tc->name, id, tl_cuda_last_error());
                if (rc) goto out;
                blocks++;
                for (int rr = 0; rr < bs && lb * bs + rr < sq->n_pos; rr++)
                    for (int h = 0; h < l->rows; h++)
                        for (int v = 0; v < 2; v++) {
                            size_t rb = v ? l->row_bytes_v : l->row_bytes_k;
                            size_t off = (size_t)(v ? l->k_bytes : 0) + tl_kv_row_off(l, h, rr, rb);
                            const uint8_t *cpu = (v ? tl_kv_v(&r->m->kv, id) : tl_kv_k(&r->m->kv, id)) +
                                                 tl_kv_row_off(l, h, rr, rb);
                            int type = v ? l->type_v : l->type_k;
                            tl_kv_load_row(type, l->group, cpu, a, hd);
                            tl_kv_load_row(type, l->group, g + off, b, hd);
                            for (int d = 0; d < hd; d++) {
                                err[v] += ((double)b[d] - a[d]) * ((double)b[d] - a[d]);
                                ref[v] += (double)a[d] * a[d];
                            }
                            rows++;
                            if (type == TL_KVT_Q8 || type == TL_KVT_Q4) {
                                qrows++;
                                qsame += !memcmp(cpu, g + off, rb);
                            }
                            eager_diff += memcmp(g + off, ge + off, rb) != 0;
                        }
            }
    }
    {
        double ek = ref[0] > 0 ? err[0] / ref[0] : err[0], ev = ref[1] > 0 ? err[1] / ref[1] : err[1];
        printf("  %-28s stored K/V: %ld blocks, %ld rows, NMSE K %.3g, V %.3g", tc->name, blocks, rows, ek, ev);
        if (qrows) printf(", %.1f%% of %ld q8/q4 rows bytewise equal", 100.0 * qsame / qrows, qrows);
        printf("\n");
        CHECK(rows > 0, "%s: rows of stored K/V compared", tc->name);
        CHECK(qsame >= tc->min_same * qrows, "%s: %ld of %ld stored q8/q4 rows bytewise equal to the CPU's (want "
              "%.0f%%)", tc->name, qsame, qrows, 100 * tc->min_same);
        CHECK(ek <= tc->kv_tol && ev <= tc->kv_tol, "%s: stored K/V NMSE (K %.3g, V %.3g) > %.1g", tc->name, ek, ev,
              tc->kv_tol);
        CHECK(eager_diff == 0, "%s: %ld stored K/V rows differ between the graph and eager contexts", tc->name,
              eager_diff);
    }
out:
    free(g), free(ge), free(a), free(b);
}

static void run_case(const tcase *tc, int idx) {
    char path[128];
    snprintf(path, sizeof path, "/tmp/tl_cuda_fwd_%d_%d.gguf", (int)getpid(), idx);
    if (tm_write(&tc->spec, path) != 0) {
        CHECK(0, "%s: tm_write failed", tc->name);
        return;
    }
    tl_model_params mp = tl_model_default_params();
    mp.n_threads = 4;
    mp.max_seq_len = 128;
    mp.kv_block_size = 4; /* windows and prompts span several blocks */
    mp.kv_type = tc->kv_type;
    mp.kv_mode = tc->kv_mode;
    runner r = {0};
    /* the plugin is described from this CPU model: plain rows, as a model
     * opened on a device backend keeps them (no TL_PACK8 / TL_PACK16) */
    setenv("TINYLOOP_REPACK", "0", 1);
    int rc = tl_model_open(path, mp, &r.m);
    unsetenv("TINYLOOP_REPACK");
    unlink(path);
    CHECK(rc == 0 && r.m, "%s: tl_model_open failed (%d)", tc->name, rc);
    if (rc || !r.m) return;
    tl_model *m = r.m;
    const int nv = m->hp.n_vocab;
    r.ops = tl_backend_plugin_v1();
    CHECK(r.ops && r.ops->abi == TL_BACKEND_ABI && strcmp(r.ops->name, "cuda") == 0, "plugin ops table");
    int loops = tl_model_effective_loops(m, tc->loops);
    r.depth = tl_model_depth(m, loops);
    r.phys = calloc((size_t)r.depth, sizeof(int));
    for (int vl = 0; vl < r.depth; vl++) r.phys[vl] = tl_model_phys_layer(m, loops, vl);
    fill_backend_model(&r, MAX_TOK);
    char msg[512] = "";
    if (idx % 2) setenv("TINYLOOP_CUDA_ATTN_SPLIT", "32", 1); /* flash-decoding past 32 positions */
    rc = r.ops->init(&r.bm, &r.ctx, msg, sizeof msg);
    CHECK(rc == 0 && r.ctx, "%s: plugin init failed (%d): %s", tc->name, rc, msg);
    setenv("TINYLOOP_CUDA_GRAPHS", "0", 1);
    int rc2 = r.ops->init(&r.bm, &r.ctx_eager, msg, sizeof msg);
    CHECK(rc2 == 0 && r.ctx_eager, "%s: plugin init without graphs failed (%d): %s", tc->name, rc2, msg);
    unsetenv("TINYLOOP_CUDA_GRAPHS");
    unsetenv("TINYLOOP_CUDA_ATTN_SPLIT");
    r.eager = malloc(sizeof(float) * 4 * nv);
    if (rc || !r.ctx || rc2 || !r.ctx_eager) goto out;

    {
        enum { NS = 3 };
        tl_seq *seqs[NS] = {0};
        for (int s = 0; s < NS; s++) {
            rc = tl_seq_new(m, tc->loops, &seqs[s]);
            CHECK(rc == 0, "%s: tl_seq_new", tc->name);
            if (rc) goto seqs_out;
        }
        /* a request-level cache_window on one sequence (narrower than gemma3's 8 where both apply) */
        if (idx % 2 == 0) seqs[2]->window = 6;
        float *cpu = malloc(sizeof(float) * NS * nv), *gpu = malloc(sizeof(float) * NS * nv);
        int32_t buf[NS][MAX_TOK], greedy[NS];
        int32_t *toks[NS] = {buf[0], buf[1], buf[2]};
        uint32_t x = 12345u + (uint32_t)idx;
        /* 1. mixed prefill: 5, 19, 1 tokens (T = 25) */
        int n1[NS] = {5, 19, 1};
        for (int s = 0; s < NS; s++)
            for (int j = 0; j < n1[s]; j++) {
                x = x * 1664525u + 1013904223u;
                buf[s][j] = 3 + (int32_t)((x >> 8) % (uint32_t)(nv - 3));
            }
        int rows = step(&r, seqs, NS, toks, n1, NULL, cpu, gpu, "prefill");
        if (rows > 0) compare(tc, cpu, gpu, rows, nv, "prefill", greedy);
        /* 2. decode steps, teacher-forced with the CPU's greedy tokens;
         * sequence 1 passes 32 positions (8 blocks: the table bucket grows) */
        int one[NS] = {1, 1, 1};
        for (int st = 0; st < 16 && rows > 0; st++) {
            for (int s = 0; s < NS; s++) buf[s][0] = greedy[s];
            char what[32];
            snprintf(what, sizeof what, "decode %d", st);
            rows = step(&r, seqs, NS, toks, one, NULL, cpu, gpu, what);
            if (rows > 0) compare(tc, cpu, gpu, rows, nv, what, greedy);
        }
        /* 3. mixed: sequence 1 gets a 6-token chunk, the others decode */
        if (rows > 0) {
            int n3[NS] = {1, 6, 1};
            for (int s = 0; s < NS; s++) buf[s][0] = greedy[s];
            for (int j = 1; j < 6; j++) buf[1][j] = 3 + (j * 37) % (nv - 3);
            rows = step(&r, seqs, NS, toks, n3, NULL, cpu, gpu, "mixed");
            if (rows > 0) compare(tc, cpu, gpu, rows, nv, "mixed", greedy);
        }
        /* 4. want_logits masks sequence 1: rows compacted */
        if (rows > 0) {
            int want[NS] = {1, 0, 1};
            for (int s = 0; s < NS; s++) buf[s][0] = greedy[s];
            rows = step(&r, seqs, NS, toks, one, want, cpu, gpu, "want_logits");
            CHECK(rows == 2, "%s: want_logits rows %d", tc->name, rows);
            if (rows > 0) compare(tc, cpu, gpu, rows, nv, "want_logits {1,0,1}", NULL);
        }
        /* the K/V every step stored, against the CPU's */
        if (rows > 0) compare_kv(tc, &r, seqs, NS);
        /* 5. errors come back as messages, nothing aborts */
        {
            int32_t tk[2] = {5, 6}, ps[2] = {0, 1}, ts[2] = {1, 0};
            const int32_t *ids[2] = {seqs[0]->bt.ids, seqs[1]->bt.ids};
            int nl[2] = {seqs[0]->bt.n_logical, seqs[1]->bt.n_logical};
            tl_backend_batch bad = {.n_seq = 2, .T = 2, .tokens = tk, .pos = ps, .tok_seq = ts, .block_ids = ids,
                                    .n_logical = nl, .depth = r.depth, .phys_layer = r.phys};
            msg[0] = 0;
            rc = r.ops->forward(r.ctx, &bad, gpu, msg, sizeof msg);
            CHECK(rc < 0 && msg[0], "%s: out-of-order batch rejected (rc %d, msg '%s')", tc->name, rc, msg);
            msg[0] = 0;
            rc = r.ops->copy_block(r.ctx, m->kv.n_blocks, 0, msg, sizeof msg);
            CHECK(rc < 0 && msg[0], "%s: copy_block out of range rejected (rc %d)", tc->name, rc);
            rc = r.ops->copy_block(r.ctx, m->kv.n_blocks - 1, 0, msg, sizeof msg);
            CHECK(rc == 0, "%s: copy_block: %s", tc->name, msg);
        }
        free(cpu);
        free(gpu);
    seqs_out:
        for (int s = 0; s < NS; s++)
            if (seqs[s]) tl_seq_free(seqs[s]);
    }
out:
    if (r.ctx) r.ops->free(r.ctx);
    if (r.ctx_eager) r.ops->free(r.ctx_eager);
    free(r.eager);
    free(r.phys);
    free(r.layer_window);
    tl_model_close(m);
}

int main(void) {
    /* The reference is the CPU engine: this binary links the plugin, so an
     * unset TINYLOOP_BACKEND would put the reference itself on the GPU. */
    setenv("TINYLOOP_BACKEND", "cpu", 1);
    int n_dev = 0;
    tl_cuda_device_count(&n_dev);
    if (n_dev < 1) {
        printf("SKIP: no CUDA device\n");
        printf("0 passed, 0 failed\n");
        return 0;
    }
    tm_spec arch[TM_ARCH_CASES];
    const char *names[TM_ARCH_CASES];
    tm_arch_cases(arch, names);
    /* the four architectures (llama in f32 with f32 KV: the tight check;
     * the loop model at depth 5 over 3 layers), llama with f16 weights and
     * gemma3 in f32, and head_dim 256; even cases also get a request cache_window */
    /* kv_tol: the stored K/V (dequantized) against the CPU's; with f16 KV
     * it measures the K/V projections' rounding, as the logits' tol does. */
    tcase cases[] = {
        {.name = names[0], .spec = arch[0], .kv_type = TL_KV_F32, .tol = 1e-5, .kv_tol = 1e-9},
        {.name = "llama f16/kv f16", .spec = arch[0], .kv_type = TL_KV_F16, .tol = 1e-3, .kv_tol = 1e-5},
        {.name = names[1], .spec = arch[1], .kv_type = TL_KV_F16, .loops = 2, .tol = 1e-3, .kv_tol = 1e-3},
        {.name = names[2], .spec = arch[2], .kv_type = TL_KV_F16, .tol = 1e-3, .kv_tol = 1e-3},
        {.name = names[3], .spec = arch[3], .kv_type = TL_KV_F16, .tol = 1e-3, .kv_tol = 1e-3},
        {.name = "gemma3 swa f32/kv f32", .spec = tm_default_spec(), .kv_type = TL_KV_F32, .tol = 1e-5,
         .kv_tol = 1e-9},
        {.name = "llama head_dim 256", .spec = arch[0], .kv_type = TL_KV_F16, .tol = 1e-3, .kv_tol = 1e-5},
        /* KV modes. f32 weights: K and V reach the store nearly equal on
         * both backends, so the quantized rows should be the same bytes (a
         * rare one-step flip at a rounding boundary allowed) and the logits
         * as close as with f32 KV. */
        {.name = "llama f32/kv q8", .spec = arch[0], .kv_mode = "q8", .tol = 1e-5, .kv_tol = 1e-4, .min_same = 0.95},
        {.name = "llama f32/kv q4", .spec = arch[0], .kv_mode = "q4", .tol = 1e-5, .kv_tol = 1e-4, .min_same = 0.95},
        {.name = "llama f32/kv q8,f16", .spec = arch[0], .kv_mode = "q8,f16", .tol = 1e-5, .kv_tol = 1e-4,
         .min_same = 0.95},
        {.name = "llama f32/kv q4,q8", .spec = arch[0], .kv_mode = "q4,q8", .tol = 1e-5, .kv_tol = 1e-4,
         .min_same = 0.95},
        {.name = "gemma3 swa f32/kv q4", .spec = tm_default_spec(), .kv_mode = "q4", .tol = 1e-5, .kv_tol = 1e-4,
         .min_same = 0.95},
        {.name = "llama hd 256/kv f16,q4", .spec = arch[0], .kv_mode = "f16,q4", .tol = 1e-3, .kv_tol = 1e-4},
        /* Quantized weights: the CPU's Q8 activations already move K and V
         * by ~1e-4 (the f16 KV cases above), and a q4 element that lands one
         * step apart moves a score by a sixteenth of its group's range: wider
         * tolerances, and near-ties up to 5e-2 where K is q4. */
        {.name = "llama loop/kv q4,q8", .spec = arch[1], .kv_mode = "q4,q8", .loops = 2, .tol = 1e-2, .kv_tol = 2e-2,
         .tie = 5e-2f},
        {.name = "qwen2 q8_0/kv q8,f16", .spec = arch[2], .kv_mode = "q8,f16", .tol = 1e-3, .kv_tol = 1e-3},
        {.name = "gemma3 q4_k/kv q4", .spec = arch[3], .kv_mode = "q4", .tol = 3e-2, .kv_tol = 5e-2, .tie = 5e-2f},
    };
    cases[1].spec.type = TL_TYPE_F16;
    cases[5].spec.arch = "gemma3";
    cases[5].spec.sliding_window = 8;
    cases[5].spec.n_layer = 6;
    cases[5].spec.seed = 9;
    /* one head of 256: attention needs more than 48 KiB of shared memory (Gemma 3's size) */
    cases[6].spec.n_embd = 256;
    cases[6].spec.n_head = 1;
    cases[6].spec.n_head_kv = 1;
    cases[11].spec = cases[5].spec; /* gemma3 swa f32 */
    cases[12].spec = cases[6].spec; /* head_dim 256: groups of 32 (ggml's blocks), > 48 KiB of shared memory */
    int n = (int)(sizeof cases / sizeof cases[0]);
    for (int i = 0; i < n; i++) run_case(&cases[i], i);
    tl_cuda_graph_stats gs;
    tl_cuda_graph_totals(&gs);
    printf("  CUDA graphs: %lld captured, %lld replays, %lld eager runs, %lld failed captures%s%s\n", gs.captures,
           gs.replays, gs.eager, gs.failures, gs.failures ? ": " : "", gs.last_failure);
    CHECK(gs.failures == 0, "a graph capture failed: %s", gs.last_failure);
    CHECK(gs.captures >= n && gs.replays >= 12 * n, "decode steps replayed graphs (%lld captures, %lld replays)",
          gs.captures, gs.replays);
    return test_summary();
}
