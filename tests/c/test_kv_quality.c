/* test_kv_quality.c - what the lossy KV modes cost in quality, bounded:
 * perplexity relative to f16 and greedy agreement with f16 (identical
 * leading tokens) on stories260K (always), and on Gemma 3 270M when it is
 * fetched. The bounds sit above what `tinyloop bench kv` and this test
 * measured (2026-12-02, 2 cores, AVX2 kernels), with margin. Perplexity and
 * agreement come from engine/cli/kv_eval.c, the code `bench kv` reports
 * with. */
#include <math.h>
#include <stdint.h>

#include "kv_eval.h"
#include "ref_cases.h"
#include "test.h"
#include "tinyloop.h"

static const char *const modes[] = {"f16", "f32", "q8", "q4", "q8,f16", "h", "h:q8"};
enum { N_MODES = sizeof modes / sizeof modes[0], MAX_SEG = 4, MAX_PROMPTS = 5 };

/* Perplexity over all segments' scored tokens (kv_score_segments); -1 on failure. */
static double perplexity(tl_model *m, kv_segment *sg, int n_seg) {
    if (kv_score_segments(m, sg, n_seg) != TL_OK) return -1;
    double nll = 0;
    int count = 0;
    for (int i = 0; i < n_seg; i++) {
        nll += sg[i].nll;
        count += sg[i].n_score;
    }
    return count ? exp(nll / count) : -1;
}

static int32_t *read_ids(tl_model *m, const char *name, int *n) {
    char path[256];
    snprintf(path, sizeof path, "tests/data/%s", name);
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(path, sizeof path, "../tests/data/%s", name);
        f = fopen(path, "rb");
    }
    static char text[32768];
    size_t len = f ? fread(text, 1, sizeof text - 1, f) : 0;
    if (f) fclose(f);
    *n = 0;
    if (!len) return NULL;
    int need = tl_tokenize(m, text, (int)len, 1, 0, NULL, 0);
    int32_t *ids = malloc((size_t)(need < 0 ? -need : 1) * sizeof *ids);
    *n = ids ? tl_tokenize(m, text, (int)len, 1, 0, ids, need < 0 ? -need : 1) : 0;
    return ids;
}

/* Per mode: the largest perplexity ratio to f16 allowed, and the least
 * mean greedy agreement with f16 (tokens, over the prompts). */
typedef struct {
    const char *mode;
    double max_ratio;
    double min_agree;
} bound;

typedef struct {
    const char *name, *path;
    const bound *bounds;
    int n_bounds;
    int max_seq_len;
    int n_gen;
    /* perplexity segments, as (text file, leading tokens used, scored tail
     * of those; a tail as long as the text scores all after BOS) */
    struct { const char *file; int n_use, n_score; } text[2];
    int n_text;
    int n_prompts;
    const int32_t *prompts[MAX_PROMPTS];
    int n_prompt[MAX_PROMPTS];
} quality_case;

static void run_case(const quality_case *qc) {
    double ppl_f16 = 0;
    int32_t ref[MAX_PROMPTS][64], gen[MAX_PROMPTS][64];
    for (int b = 0; b < qc->n_bounds; b++) {
        const bound *bd = &qc->bounds[b];
        tl_model_params mp = tl_model_default_params();
        mp.kv_mode = bd->mode;
        mp.max_seq_len = qc->max_seq_len;
        mp.kv_mem = (size_t)32 << 20;
        tl_model *m = NULL;
        tl_model_open(qc->path, mp, &m);
        CHECK(m != NULL, "%s opens in KV mode %s (%s)", qc->name, bd->mode, tl_last_error());
        if (!m) continue;
        kv_segment sg[MAX_SEG];
        int32_t *ids[2] = {0};
        int n_seg = 0;
        for (int t = 0; t < qc->n_text; t++) {
            int n;
            ids[t] = read_ids(m, qc->text[t].file, &n);
            int use = n < qc->text[t].n_use ? n : qc->text[t].n_use;
            int score = qc->text[t].n_score < use ? qc->text[t].n_score : use - 1; /* at least BOS is context */
            if (score > 0) sg[n_seg++] = (kv_segment){ids[t], use - score, score, 0};
        }
        CHECK(n_seg == qc->n_text, "%s: the test texts are found and tokenized", qc->name);
        double ppl = perplexity(m, sg, n_seg);
        int rc = kv_greedy_batch(m, qc->prompts, qc->n_prompt, qc->n_prompts, qc->n_gen, (b == 0 ? ref : gen)[0], 64);
        tl_model_close(m);
        for (int t = 0; t < 2; t++) free(ids[t]);
        CHECK(ppl > 0 && rc == 0, "%s %s: perplexity and greedy generation run (%s)", qc->name, bd->mode,
              tl_last_error());
        if (ppl <= 0 || rc) continue;
        if (b == 0) {
            ppl_f16 = ppl;
            printf("  %s f16: perplexity %.3f\n", qc->name, ppl);
            continue;
        }
        int worst;
        double agree = kv_agreement(ref[0], gen[0], 64, qc->n_prompts, qc->n_gen, &worst), ratio = ppl / ppl_f16;
        printf("  %s %s: perplexity %.3f (%.4fx f16), greedy agreement with f16 min %d mean %.1f of %d\n", qc->name,
               bd->mode, ppl, ratio, worst, agree, qc->n_gen);
        CHECK(ratio <= bd->max_ratio, "%s %s: perplexity within %.3fx of f16 (%.4fx)", qc->name, bd->mode,
              bd->max_ratio, ratio);
        CHECK(agree >= bd->min_agree, "%s %s: greedy output agrees with f16 for >= %.0f tokens on average (%.1f)",
              qc->name, bd->mode, bd->min_agree, agree);
    }
}

/* stories260K, measured 2026-12-02 (paragraph.txt's 223 tokens after BOS
 * and lighthouse.txt's first 512 scoring the last 256; 48 greedy tokens on
 * the 5 reference prompts; f16 perplexity 12.046):
 *   mode     ppl/f16   agreement with f16, mean (min) of 48
 *   f32      0.9999    48 (48)
 *   q8       0.9986    48 (48)
 *   q4       1.4211     7.0 (0)   head_dim 8: groups of 8, 16 levels - a real loss
 *   q8,f16   0.9987    48 (48)
 *   h        0.9999    48 (48)
 *   h:q8     1.0015    48 (48)
 * Bounds: near-exact modes within 0.5%, q8 modes within 2% (the brief's
 * "q8 within ~1%" plus margin), q4 below 1.6x (a guard against it getting
 * worse, not a quality claim; it was 1.92x with a symmetric q4_0-style
 * scale, before q4 kept a minimum per group). */
static const bound stories_bounds[] = {
    {"f16", 0, 0},        {"f32", 1.005, 40}, {"q8", 1.02, 24}, {"q4", 1.6, 2},
    {"q8,f16", 1.02, 24}, {"h", 1.005, 40},   {"h:q8", 1.02, 24},
};

/* Gemma 3 270M: the lossy modes only (f32 and h are near-exact on
 * stories260K, and each Gemma mode costs seconds); measured 2026-12-02 on
 * the last 48 tokens of paragraph.txt (f16 perplexity 13.960) and 16
 * greedy tokens on "Once upon a time" / "Lily had a":
 *   q8     0.9884   agreement mean 13.0 (min 10) of 16
 *   q4     1.0541   6.0 (4)    (1.0797 with a symmetric q4_0-style scale)
 *   h:q8   0.9970   16 (16)   (Gemma's K/V matmuls quantize h to q8_0 anyway)
 * On this model even f32 KV moves perplexity by ~1% and breaks greedy ties
 * within a few tokens (bench kv: f32 agreement 0 / 10 of 32), so the
 * agreement bounds are loose and the perplexity bounds allow a few %.
 * On an Intel AVX-512 machine (2026-12-03, before and after the attention
 * panel kernels) h:q8 measured 0.977-0.984 with agreement 6.0 (min 4): its
 * greedy ties break there as q8's do, so it has q8's agreement bound. */
static const bound gemma_bounds[] = {
    {"f16", 0, 0}, {"q8", 1.03, 3}, {"q4", 1.12, 2}, {"h:q8", 1.02, 3},
};

int main(void) {
    const char *shared = test_shared_dir();
    if (!shared) {
        printf("skip: ../shared (stories260K) not found\n");
        return test_summary();
    }
    char path[1024];
    static ref_case cases[MAX_PROMPTS];
    int n_cases = ref_load_shared(shared, path, sizeof path, cases, MAX_PROMPTS);
    CHECK(n_cases == MAX_PROMPTS, "the %d reference prompts load (%d)", MAX_PROMPTS, n_cases);
    quality_case st = {"stories260K", path, stories_bounds, sizeof stories_bounds / sizeof *stories_bounds, 512, 48,
                       {{"paragraph.txt", 100000, 1 << 20}, {"lighthouse.txt", 512, 256}}, 2, n_cases > 0 ? n_cases : 0,
                       {0}, {0}};
    for (int p = 0; p < st.n_prompts; p++) {
        st.prompts[p] = cases[p].prompt_ids;
        st.n_prompt[p] = cases[p].n_prompt;
    }
    run_case(&st);

    const char *gemma = ref_default_model();
    if (!gemma) {
        printf("skip: Gemma 3 270M is not fetched (make model)\n");
        return test_summary();
    }
    if (getenv("TL_TEST_QUICK")) { /* ASan: minutes for Gemma; stories260K ran the same paths */
        printf("skip: Gemma 3 270M under TL_TEST_QUICK\n");
        return test_summary();
    }
    /* The reference prompts tokenized for Gemma (its BOS, its vocab). */
    tl_model_params vp = tl_model_default_params();
    vp.vocab_only = 1;
    tl_model *voc = NULL;
    static int32_t gp_ids[2][64];
    quality_case gq = {"Gemma 3 270M", gemma, gemma_bounds, sizeof gemma_bounds / sizeof *gemma_bounds, 256, 16,
                       {{"paragraph.txt", 94, 48}}, 1, 2, {0}, {0}};
    if (tl_model_open(gemma, vp, &voc) == TL_OK) {
        for (int p = 0; p < gq.n_prompts; p++) {
            gq.n_prompt[p] = tl_tokenize(voc, cases[p].prompt, (int)strlen(cases[p].prompt), 1, 0, gp_ids[p], 64);
            gq.prompts[p] = gp_ids[p];
        }
        tl_model_close(voc);
    }
    CHECK(gq.n_prompt[0] > 1 && gq.n_prompt[1] > 1, "the prompts tokenize for Gemma");
    run_case(&gq);
    return test_summary();
}
