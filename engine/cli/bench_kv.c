/* bench_kv.c - `tinyloop bench kv`: what each KV cache mode costs and what
 * it gives up, per model, in one table.
 *
 *   memory   bytes per token (all layers, block rounding included, as
 *            tl_model_kv_token_bytes reports) and how many 1,024-token
 *            sequences a 256 MiB arena holds: floor(256 MiB / (1024 x
 *            bytes/token)). 1,024 tokens are whole 16-token blocks, so this
 *            equals counting the whole blocks the arena holds.
 *   quality  perplexity on tests/data/paragraph.txt and on a longer text
 *            (tests/data/lighthouse.txt), and its ratio to f16; greedy
 *            agreement with f16 (identical leading tokens) on the plain
 *            text prompts of ../shared/ref.
 *   speed    a prompt of ctx - 32 tokens through the request API on an
 *            empty cache (TTFT miss, whose prefill rate is reported), then
 *            the same prefix with a different 16-token suffix (TTFT hit)
 *            decoding 16 tokens, so attention spans ~ctx positions.
 *
 * Every mode opens the model afresh (the mode is fixed at open) with a
 * 256 MiB arena. Perplexity needs each position's logits, which the public
 * API gives only for a sequence's last token, so scored tokens are decoded
 * one at a time; their context is prefilled in one batched forward, and
 * the segments of a text decode together as one batch. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kv_eval.h"
#include "tinyloop.h"
#include "util.h"

#define ARENA_BYTES ((size_t)256 << 20)
#define MAX_PROMPTS 8

static const char *const kv_modes[] = {"f16", "f32", "q8", "q4", "q8,f16", "q8,q4", "h", "h:q8"};
enum { N_MODES = sizeof kv_modes / sizeof kv_modes[0] };

typedef struct {
    int n_threads;
    int sections;   /* bit mask of SEC_* */
    int ctx;        /* speed: attention span; <= 0: min(2048, max_seq_len) */
    int n_agree;    /* greedy tokens compared with f16; <= 0: per model */
    int ppl_ctx;    /* long text: tokens per scored window */
    int ppl_score;  /* long text: scored tokens per window (the window's tail); <= 0: per model */
    int ppl_chunks; /* long text: windows; <= 0: per model */
    const char *text, *paragraph, *refs;
} kv_opts;

enum { SEC_MEM = 1, SEC_QUALITY = 2, SEC_SPEED = 4 };

typedef struct {
    double ppl_par, ppl_long;   /* 0: not measured */
    int n_par, n_long;          /* scored tokens */
    int agree_min;              /* leading tokens equal to f16's, worst prompt */
    double agree_mean;
    double ttft_miss, ttft_hit; /* seconds */
    double prefill_tps, decode_tps;
    int ctx;
} mode_result;

/* ---- inputs ----------------------------------------------------------------------- */

static char *slurp(const char *path, int *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) { free(buf); buf = NULL; }
    fclose(f);
    if (buf) { buf[n] = 0; *len = (int)n; }
    return buf;
}

static int tokenize_alloc(tl_model *m, const char *text, int len, int32_t **out) {
    int need = tl_tokenize(m, text, len, 1, 0, NULL, 0);
    int cap = need < 0 ? -need : need + 1;
    *out = malloc((size_t)cap * sizeof **out);
    return *out ? tl_tokenize(m, text, len, 1, 0, *out, cap) : TL_ERR_NOMEM;
}

/* The "prompt" strings of the reference file (a fixed, simple JSON shape:
 * prompts without escapes are the plain text ones; others are skipped). */
static int load_prompts(const char *path, char prompts[][256], int cap) {
    int len, n = 0;
    char *s = slurp(path, &len);
    if (!s) return 0;
    for (char *p = s; n < cap && (p = strstr(p, "\"prompt\": \"")); ) {
        p += strlen("\"prompt\": \"");
        char *e = strchr(p, '"');
        if (!e) break;
        if (e - p < 256 && !memchr(p, '\\', (size_t)(e - p))) {
            memcpy(prompts[n], p, (size_t)(e - p));
            prompts[n++][e - p] = 0;
        }
        p = e;
    }
    free(s);
    return n;
}

/* ---- perplexity ------------------------------------------------------------------------ */

/* Perplexity of the paragraph (all tokens after BOS, one segment) and of
 * the long text (`chunks` windows of ppl_ctx tokens, each scoring its last
 * n_score tokens; a window after the first starts with BOS in place of its
 * first token, as llama.cpp's perplexity does). Both run as one batch. */
static int perplexity(tl_model *m, const int32_t *par, int n_par, const int32_t *lng, int ppl_ctx, int n_score,
                      int chunks, int bos, mode_result *r) {
    kv_segment sg[1 + 64];
    int32_t *win = NULL;
    int n_seg = 0;
    if (par && n_par > 1) sg[n_seg++] = (kv_segment){par, 1, n_par - 1, 0};
    if (chunks > 64) chunks = 64;
    if (lng && chunks > 0) {
        win = malloc((size_t)chunks * ppl_ctx * sizeof *win);
        if (!win) return TL_ERR_NOMEM;
        for (int c = 0; c < chunks; c++) {
            int32_t *w = win + (size_t)c * ppl_ctx;
            memcpy(w, lng + (size_t)c * ppl_ctx, (size_t)ppl_ctx * sizeof *w);
            if (c > 0 && bos >= 0) w[0] = bos;
            sg[n_seg++] = (kv_segment){w, ppl_ctx - n_score, n_score, 0};
        }
    }
    int rc = n_seg ? kv_score_segments(m, sg, n_seg) : TL_OK; /* no text found: nothing to score */
    if (!rc) {
        int k = 0;
        if (par && n_par > 1) {
            r->n_par = n_par - 1;
            r->ppl_par = exp(sg[k++].nll / r->n_par);
        }
        double nll = 0;
        for (; k < n_seg; k++) nll += sg[k].nll;
        r->n_long = chunks * n_score;
        if (r->n_long) r->ppl_long = exp(nll / r->n_long);
    }
    free(win);
    return rc;
}

/* ---- greedy agreement --------------------------------------------------------------------- */

/* Greedy continuations of n tokens of every prompt, as one batch
 * (kv_greedy_batch); out[p] receives prompt p's. Returns TL_OK or an error. */
static int greedy_all(tl_model *m, char prompts[][256], int n_prompts, int n, int32_t (*out)[256]) {
    static int32_t ptok[MAX_PROMPTS][256];
    const int32_t *pp[MAX_PROMPTS];
    int np[MAX_PROMPTS];
    for (int p = 0; p < n_prompts; p++) {
        np[p] = tl_tokenize(m, prompts[p], (int)strlen(prompts[p]), 1, 0, ptok[p], 256);
        if (np[p] <= 0) return np[p] < 0 ? np[p] : TL_ERR_INVALID_ARG;
        pp[p] = ptok[p];
    }
    return kv_greedy_batch(m, pp, np, n_prompts, n, out[0], 256);
}

/* ---- speed ----------------------------------------------------------------------------- */

/* Submits one request and steps it to the end: seconds to its first token
 * in *ttft, and decode tokens/s after it (n_gen > 1). */
static int timed_request(tl_model *m, const int32_t *p, int n, int n_gen, double *ttft, double *decode_tps) {
    tl_generate_params gp = tl_generate_default_params();
    gp.max_tokens = n_gen;
    gp.ignore_eos = 1;
    int64_t id;
    int32_t out[64];
    int got = 0, live, rc = TL_OK;
    double t0 = tl_now(), t1 = 0;
    if ((rc = tl_request_submit(m, p, n, &gp, NULL, &id))) return rc;
    do {
        if ((live = tl_model_step(m)) < 0) { rc = live; break; }
        int k = tl_request_take(m, id, out, 64, NULL);
        if (k < 0) { rc = k; break; }
        if (k > 0 && got == 0) t1 = tl_now();
        got += k;
    } while (live > 0);
    double t2 = tl_now();
    tl_request_release(m, id);
    if (rc) return rc;
    *ttft = t1 - t0;
    if (decode_tps) *decode_tps = got > 1 ? (got - 1) / (t2 - t1) : 0;
    return TL_OK;
}

/* TTFT miss on an empty cache (prefix + suffix A), then TTFT hit (same
 * prefix, suffix B) generating 16 tokens, the last at position ctx - 1
 * (decode tok/s over the 15 after the first). ids must hold ctx tokens. */
static int speed(tl_model *m, const int32_t *ids, int ctx, mode_result *r) {
    enum { SUFFIX = 16, DECODE = 16 };
    int prefix = ctx - SUFFIX - DECODE;
    int32_t *p = malloc((size_t)(prefix + SUFFIX) * sizeof *p);
    if (!p) return TL_ERR_NOMEM;
    memcpy(p, ids, (size_t)(prefix + SUFFIX) * sizeof *p);
    int rc = timed_request(m, p, prefix + SUFFIX, 1, &r->ttft_miss, NULL);
    if (!rc) {
        memcpy(p + prefix, ids + prefix + SUFFIX, SUFFIX * sizeof *p); /* a different suffix */
        rc = timed_request(m, p, prefix + SUFFIX, DECODE, &r->ttft_hit, &r->decode_tps);
    }
    r->prefill_tps = r->ttft_miss > 0 ? (prefix + SUFFIX) / r->ttft_miss : 0;
    r->ctx = ctx;
    free(p);
    return rc;
}

/* ---- one model ------------------------------------------------------------------------------ */

/* A table cell: the value, or "-" when `measured` is 0. */
static void fmt(char *out, const char *f, double v, double measured) {
    if (measured > 0) snprintf(out, 24, f, v);
    else strcpy(out, "-");
}

static int file_exists(const char *path) {
    struct stat st;
    return path && stat(path, &st) == 0;
}

static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* Token ids of a text file, repeated cyclically up to at least min_len. */
static int text_ids(tl_model *m, const char *path, int min_len, int32_t **out) {
    int len;
    char *text = slurp(path, &len);
    if (!text) return 0;
    int32_t *ids = NULL;
    int n = tokenize_alloc(m, text, len, &ids);
    free(text);
    if (n <= 0) { free(ids); return 0; }
    if (n < min_len) {
        int32_t *big = realloc(ids, (size_t)min_len * sizeof *big);
        if (!big) { free(ids); return 0; }
        for (int i = n; i < min_len; i++) big[i] = big[i % n];
        ids = big;
    }
    *out = ids;
    return n;
}

static void print_memory(const char *name, tl_model *m) {
    printf("%s: KV memory per mode (bytes/token over all layers incl. block rounding; 1,024-token sequences in a "
           "256 MiB arena = floor(256 MiB / (1024 x bytes/token)))\n",
           name);
    printf("  %-8s %12s %10s %9s\n", "mode", "bytes/token", "seqs/256M", "vs f16");
    size_t f16 = tl_model_kv_token_bytes(m, "f16");
    for (int k = 0; k < N_MODES; k++) {
        size_t b = tl_model_kv_token_bytes(m, kv_modes[k]);
        if (!b) { printf("  %-8s %12s (%s)\n", kv_modes[k], "-", tl_last_error()); continue; }
        long seqs = (long)(ARENA_BYTES / (1024 * b));
        printf("  %-8s %12zu %10ld %8.2fx\n", kv_modes[k], b, seqs, (double)f16 / b);
    }
}

static int bench_model(const char *path, const kv_opts *o) {
    tl_model_params mp = tl_model_default_params();
    mp.n_threads = o->n_threads;
    mp.kv_mem = (size_t)16 << 20;
    mp.kv_mode = "f16";
    tl_model *m;
    if (tl_model_open(path, mp, &m)) { fprintf(stderr, "bench kv: %s\n", tl_last_error()); return 1; }
    tl_model_info info;
    tl_model_get_info(m, &info);
    const char *name = base_name(path);
    if (o->sections & SEC_MEM) print_memory(name, m);
    if (!(o->sections & (SEC_QUALITY | SEC_SPEED))) { tl_model_close(m); return 0; }

    /* Sizes: the trained context bounds everything (stories260K's file says
     * 128 but it was trained on 512, as ../shared/models/README.md says). */
    int max_len = info.n_ctx_train > 512 ? info.n_ctx_train : 512;
    int ctx = o->ctx > 0 ? o->ctx : 2048;
    if (ctx > max_len) ctx = max_len;
    int ppl_ctx = o->ppl_ctx > 0 ? o->ppl_ctx : 512;
    if (ppl_ctx > max_len) ppl_ctx = max_len;
    /* A big model's scored and generated tokens cost a decode step each
     * (Gemma's 262k-vocab head dominates) and its 2,048-token prefill per
     * mode already takes most of the run: one window scoring its last 128
     * tokens (decoded in the same batch as the paragraph's) and 32 greedy
     * tokens keep it short. A small model scores half of up to 4 windows
     * and compares 64 greedy tokens. */
    int big = info.weight_bytes > ((size_t)50 << 20);
    int n_score = o->ppl_score > 0 ? o->ppl_score : big ? 128 : ppl_ctx / 2;
    if (n_score >= ppl_ctx) n_score = ppl_ctx - 1;

    int32_t *par = NULL, *lng = NULL;
    int n_par = text_ids(m, o->paragraph, 0, &par);
    int n_lng = text_ids(m, o->text, ctx, &lng);
    int chunks = n_lng / ppl_ctx, max_chunks = o->ppl_chunks > 0 ? o->ppl_chunks : big ? 1 : 4;
    if (chunks > max_chunks) chunks = max_chunks;
    char prompts[MAX_PROMPTS][256];
    int n_prompts = load_prompts(o->refs, prompts, MAX_PROMPTS);
    int n_agree = o->n_agree > 0 ? o->n_agree : big ? 32 : 64;
    if (n_agree > 255) n_agree = 255;
    tl_model_close(m);

    printf("%s: quality and speed per mode (%d threads, %s kernels)\n", name, info.n_threads, info.isa);
    if (o->sections & SEC_QUALITY) {
        printf("  perplexity: %s %d tokens (all after BOS); %s %d tokens, %d window(s) of %d scoring the last %d\n",
               o->paragraph, n_par, o->text, n_lng, chunks, ppl_ctx, n_score);
        printf("  agreement: leading greedy tokens equal to f16's, %d generated, %d prompts of %s (min / mean)\n",
               n_agree, n_prompts, o->refs);
    }
    if (o->sections & SEC_SPEED)
        printf("  speed: %d-token prompt on an empty cache (TTFT miss; prefill tok/s), then the same %d-token prefix "
               "+ another 16-token suffix (TTFT hit) generating 16 tokens up to %d positions%s\n",
               ctx - 16, ctx - 32, ctx, n_lng > 0 && ctx > n_lng ? " (the long text repeated)" : "");
    printf("  %-8s %9s %7s %9s %7s %11s %9s %9s %10s %10s\n", "mode", "ppl par", "/f16", "ppl long", "/f16",
           "agree", "prefill/s", "decode/s", "TTFT miss", "TTFT hit");

    static int32_t ref_gen[MAX_PROMPTS][256], gen[MAX_PROMPTS][256];
    mode_result f16 = {0};
    int rc = 0;
    for (int k = 0; k < N_MODES && !rc; k++) {
        mode_result r = {0};
        r.agree_min = -1;
        mp.kv_mode = kv_modes[k];
        mp.kv_mem = ARENA_BYTES;
        mp.max_seq_len = ctx > ppl_ctx ? ctx : ppl_ctx;
        if (mp.max_seq_len < n_par) mp.max_seq_len = n_par;
        double t0 = tl_now();
        if ((rc = tl_model_open(path, mp, &m))) {
            fprintf(stderr, "bench kv: %s: %s\n", kv_modes[k], tl_last_error());
            break;
        }
        /* speed first, on an empty cache and a fresh arena */
        if (o->sections & SEC_SPEED && lng && (rc = speed(m, lng, ctx, &r)))
            fprintf(stderr, "bench kv: %s speed: %s\n", kv_modes[k], tl_last_error());
        if (!rc && o->sections & SEC_QUALITY) {
            if ((rc = perplexity(m, n_par ? par : NULL, n_par, chunks ? lng : NULL, ppl_ctx, n_score, chunks, info.bos,
                                 &r)))
                fprintf(stderr, "bench kv: %s perplexity: %s\n", kv_modes[k], tl_last_error());
            if (!rc && n_prompts > 0) {
                if ((rc = greedy_all(m, prompts, n_prompts, n_agree, k == 0 ? ref_gen : gen)))
                    fprintf(stderr, "bench kv: %s greedy: %s\n", kv_modes[k], tl_last_error());
                r.agree_mean = kv_agreement(ref_gen[0], (k == 0 ? ref_gen : gen)[0], 256, n_prompts, n_agree,
                                            &r.agree_min);
            }
        }
        tl_model_close(m);
        if (k == 0) f16 = r;
        /* a figure not measured (section off, text missing) prints as "-" */
        char c[9][24];
        fmt(c[0], "%.3f", r.ppl_par, r.ppl_par);
        fmt(c[1], "%.4f", f16.ppl_par > 0 ? r.ppl_par / f16.ppl_par : 0, r.ppl_par);
        fmt(c[2], "%.3f", r.ppl_long, r.ppl_long);
        fmt(c[3], "%.4f", f16.ppl_long > 0 ? r.ppl_long / f16.ppl_long : 0, r.ppl_long);
        fmt(c[5], "%.1f", r.prefill_tps, r.ttft_miss);
        fmt(c[6], "%.1f", r.decode_tps, r.ttft_miss);
        fmt(c[7], "%.0fms", r.ttft_miss * 1e3, r.ttft_miss);
        fmt(c[8], "%.0fms", r.ttft_hit * 1e3, r.ttft_miss);
        if (r.agree_min >= 0) snprintf(c[4], sizeof c[4], "%d / %.1f", r.agree_min, r.agree_mean);
        else strcpy(c[4], "-");
        printf("  %-8s %9s %7s %9s %7s %11s %9s %9s %10s %10s   (%.0f s)\n", kv_modes[k], c[0], c[1], c[2], c[3], c[4],
               c[5], c[6], c[7], c[8], tl_now() - t0);
        fflush(stdout);
    }
    free(par);
    free(lng);
    return rc ? 1 : 0;
}

/* ---- command line -------------------------------------------------------------------------------- */

static int parse_sections(const char *s) {
    int mask = 0;
    if (strstr(s, "mem")) mask |= SEC_MEM;
    if (strstr(s, "quality")) mask |= SEC_QUALITY;
    if (strstr(s, "speed")) mask |= SEC_SPEED;
    return mask;
}

int tl_cli_bench_kv(int argc, char **argv) {
    kv_opts o = {.sections = SEC_MEM | SEC_QUALITY | SEC_SPEED,
                 .text = "tests/data/lighthouse.txt", .paragraph = "tests/data/paragraph.txt",
                 .refs = "../shared/ref/stories260K_greedy.json"};
    const char *models[16];
    int n_models = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) { fprintf(stderr, "bench kv: %s needs a value\n", a); return 2; }
        i++;
        if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && n_models < 16) models[n_models++] = v;
        else if (!strcmp(a, "-t")) o.n_threads = atoi(v);
        else if (!strcmp(a, "--only")) o.sections = parse_sections(v);
        else if (!strcmp(a, "--ctx")) o.ctx = atoi(v);
        else if (!strcmp(a, "-n")) o.n_agree = atoi(v);
        else if (!strcmp(a, "--ppl-ctx")) o.ppl_ctx = atoi(v);
        else if (!strcmp(a, "--ppl-score")) o.ppl_score = atoi(v);
        else if (!strcmp(a, "--ppl-chunks")) o.ppl_chunks = atoi(v);
        else if (!strcmp(a, "-f")) o.text = v;
        else if (!strcmp(a, "--paragraph")) o.paragraph = v;
        else if (!strcmp(a, "--refs")) o.refs = v;
        else { fprintf(stderr, "bench kv: unknown option '%s'\n", a); return 2; }
    }
    if (!o.sections) { fprintf(stderr, "bench kv: --only takes mem, quality, speed (comma separated)\n"); return 2; }
    /* default: Gemma 3 270M when fetched (make model), and stories260K */
    static char gemma[512];
    if (n_models == 0) {
        const char *dir = getenv("TINYLOOP_MODELS"), *home = getenv("HOME");
        if (dir) snprintf(gemma, sizeof gemma, "%s/gemma-3-270m-q4_k_m.gguf", dir);
        else snprintf(gemma, sizeof gemma, "%s/.cache/tinyloop/models/gemma-3-270m-q4_k_m.gguf", home ? home : "");
        if (file_exists(gemma)) models[n_models++] = gemma;
        else printf("(Gemma 3 270M not fetched: %s; `make model` fetches it)\n", gemma);
        models[n_models++] = "../shared/models/stories260K.gguf";
    }
    double t0 = tl_now();
    for (int i = 0; i < n_models; i++)
        if (bench_model(models[i], &o)) return 1;
    printf("bench kv: %.0f s\n", tl_now() - t0);
    return 0;
}
