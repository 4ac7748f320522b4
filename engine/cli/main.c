/* bin/tinyloop - command-line front end: generate, tokenize, info, bench. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tinyloop.h"
#include "util.h"

static void usage(void) {
    fprintf(stderr,
            "usage:\n"
            "  tinyloop generate -m MODEL -p TEXT [-n N] [--temp T] [--top-k K] [--top-p P] [--min-p P]\n"
            "                    [--repeat-penalty R] [--seed S] [--loops L] [--ids] [common options]\n"
            "  tinyloop tokenize -m MODEL (-p TEXT | -f FILE) [--ids] [--no-special] [--parse-special]\n"
            "  tinyloop info MODEL\n"
            "  tinyloop repl [MODEL]               (LuaJIT with the tinyloop library loaded)\n"
            "  tinyloop bench [-m MODEL]... [-n N] [--prompt-len P] [--batch B]\n"
            "  tinyloop bench cache [-m MODEL]...   (prefix-cache TTFT, chat, memory, radix timings)\n"
            "  tinyloop bench tiers [-m MODEL]...   (KV tiers: TTFT from arena / host / disk, restart, trace hit rate)\n"
            "  tinyloop bench tokenize [-m VOCAB]... [-f TEXTFILE] [-r RUNS]\n"
            "  tinyloop bench kv [-m MODEL]... [-t N] [--only mem,quality,speed] [--ctx N] [-n N]\n"
            "                    [--ppl-ctx N] [--ppl-score N] [--ppl-chunks N] [-f TEXT]   (KV modes: memory, quality, speed)\n"
            "common options: -t THREADS  --max-seq-len N  --kv f16|f32|q8|q4|K,V|h|h:TYPE  --kv-mem MB\n"
            "                --loop-start S --loop-end E --loop-default D  --repack on|off|bf16 (bf16: lossy, faster)\n");
}

typedef struct {
    const char *models[16];
    int n_models;
    const char *prompt, *file;
    int n, ids, no_special, parse_special, prompt_len, batch;
    tl_model_params mp;
    tl_generate_params gp;
} opts;

static int parse_int(const char *flag, const char *v, int *out) {
    char *end;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || *end || x < -(1L << 30) || x > (1L << 30)) {
        fprintf(stderr, "tinyloop: %s expects an integer, got '%s'\n", flag, v ? v : "(nothing)");
        return -1;
    }
    *out = (int)x;
    return 0;
}

static int parse_float(const char *flag, const char *v, float *out) {
    char *end;
    double x = v ? strtod(v, &end) : 0;
    if (!v || *end) {
        fprintf(stderr, "tinyloop: %s expects a number, got '%s'\n", flag, v ? v : "(nothing)");
        return -1;
    }
    *out = (float)x;
    return 0;
}

static int parse_opts(int argc, char **argv, opts *o) {
    memset(o, 0, sizeof *o);
    o->mp = tl_model_default_params();
    o->gp = tl_generate_default_params();
    o->n = -1;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int iv = 0, r = 0;
        float fv = 0;
#define TAKE(expr) do { r = (expr); i++; } while (0)
        if (!strcmp(a, "-m")) {
            if (!v || o->n_models == 16) { fprintf(stderr, "tinyloop: -m needs a path\n"); return -1; }
            o->models[o->n_models++] = v; i++;
        } else if (!strcmp(a, "-p")) { if (!v) { fprintf(stderr, "tinyloop: -p needs text\n"); return -1; } o->prompt = v; i++; }
        else if (!strcmp(a, "-f")) { if (!v) { fprintf(stderr, "tinyloop: -f needs a file\n"); return -1; } o->file = v; i++; }
        else if (!strcmp(a, "-n")) TAKE(parse_int(a, v, &o->n));
        else if (!strcmp(a, "-t")) TAKE(parse_int(a, v, &o->mp.n_threads));
        else if (!strcmp(a, "--temp")) TAKE(parse_float(a, v, &o->gp.sampling.temperature));
        else if (!strcmp(a, "--top-k")) TAKE(parse_int(a, v, &o->gp.sampling.top_k));
        else if (!strcmp(a, "--top-p")) TAKE(parse_float(a, v, &o->gp.sampling.top_p));
        else if (!strcmp(a, "--min-p")) TAKE(parse_float(a, v, &o->gp.sampling.min_p));
        else if (!strcmp(a, "--repeat-penalty")) TAKE(parse_float(a, v, &o->gp.sampling.repeat_penalty));
        else if (!strcmp(a, "--seed")) { TAKE(parse_int(a, v, &iv)); o->gp.sampling.seed = (uint64_t)(int64_t)iv; }
        else if (!strcmp(a, "--loops")) TAKE(parse_int(a, v, &o->gp.loops));
        else if (!strcmp(a, "--max-seq-len")) TAKE(parse_int(a, v, &o->mp.max_seq_len));
        else if (!strcmp(a, "--kv-mem")) { TAKE(parse_int(a, v, &iv)); o->mp.kv_mem = (size_t)iv << 20; }
        else if (!strcmp(a, "--loop-start")) TAKE(parse_int(a, v, &o->mp.loop_start));
        else if (!strcmp(a, "--loop-end")) TAKE(parse_int(a, v, &o->mp.loop_end));
        else if (!strcmp(a, "--loop-default")) TAKE(parse_int(a, v, &o->mp.loop_default));
        else if (!strcmp(a, "--prompt-len")) TAKE(parse_int(a, v, &o->prompt_len));
        else if (!strcmp(a, "--batch")) TAKE(parse_int(a, v, &o->batch));
        else if (!strcmp(a, "--kv")) {
            if (!v) { fprintf(stderr, "tinyloop: --kv expects a KV mode (f16, f32, q8, q4, q8,f16, h, h:q8)\n"); return -1; }
            o->mp.kv_mode = v; /* checked when the model opens */
            i++;
        } else if (!strcmp(a, "--repack")) {
            if (!v) { fprintf(stderr, "tinyloop: --repack expects on, off or bf16\n"); return -1; }
            o->mp.repack = v; /* checked when the model opens */
            i++;
        } else if (!strcmp(a, "--ids")) o->ids = 1;
        else if (!strcmp(a, "--no-special")) o->no_special = 1;
        else if (!strcmp(a, "--parse-special")) o->parse_special = 1;
        else if (a[0] != '-' && o->n_models == 0) o->models[o->n_models++] = a;
        else { fprintf(stderr, "tinyloop: unknown option '%s'\n", a); return -1; }
        if (r) return -1;
        (void)fv;
#undef TAKE
    }
    return 0;
}

static char *read_file(const char *path, int *len) {
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "tinyloop: cannot open '%s'\n", path); return NULL; }
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    size_t r;
    while (buf && (r = fread(buf + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap && n < ((size_t)1 << 30)) { char *nb = realloc(buf, cap *= 2); if (!nb) { free(buf); buf = NULL; } else buf = nb; }
        else if (n == cap) break;
    }
    fclose(f);
    *len = (int)n;
    return buf;
}

/* Tokenizes text into a malloc'ed array; returns count or < 0. */
static int tokenize_alloc(tl_model *m, const char *text, int len, int add_special, int parse_special, int32_t **out) {
    int need = tl_tokenize(m, text, len, add_special, parse_special, NULL, 0);
    if (need >= 0 && need != 0) return need; /* cannot happen with cap 0 unless empty */
    int cap = need < 0 ? -need : 1;
    *out = malloc((size_t)(cap > 0 ? cap : 1) * sizeof **out);
    if (!*out) return TL_ERR_NOMEM;
    return tl_tokenize(m, text, len, add_special, parse_special, *out, cap);
}

static void print_ids(const int32_t *ids, int n) {
    for (int i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
    printf("\n");
}

static int open_model(const opts *o, int vocab_only, tl_model **m) {
    if (o->n_models < 1) { fprintf(stderr, "tinyloop: no model given (-m MODEL)\n"); return -1; }
    tl_model_params mp = o->mp;
    mp.vocab_only = vocab_only;
    if (tl_model_open(o->models[0], mp, m) != TL_OK) {
        fprintf(stderr, "tinyloop: %s\n", tl_last_error());
        return -1;
    }
    return 0;
}

/* Prints the prompt, then each token's text as it is produced (whole UTF-8
 * characters only), then the speed on stderr. */
static int stream_generate(tl_model *m, const char *text, int len, const int32_t *prompt, int np,
                           const tl_generate_params *gp, int32_t *gen) {
    int64_t id;
    if (!gen || tl_request_submit(m, prompt, np, gp, NULL, &id)) {
        fprintf(stderr, "tinyloop: %s\n", gen ? tl_last_error() : "out of memory");
        return -1;
    }
    fwrite(text, 1, (size_t)len, stdout);
    fflush(stdout);
    char pending[64];
    int n_pending = 0, n = 0, finished = 0, rc = 0;
    double t0 = tl_now(), t_first = 0;
    while (!finished) {
        if (tl_model_step(m) < 0) { rc = -1; break; }
        int got = tl_request_take(m, id, gen + n, gp->max_tokens - n, &finished);
        if (got < 0) { rc = -1; break; }
        for (int i = 0; i < got; i++) {
            if (!t_first) t_first = tl_now();
            char piece[256];
            int pl = tl_token_to_piece(m, gen[n + i], piece, sizeof piece);
            for (int k = 0; k < pl; k++) {
                if (n_pending == (int)sizeof pending) { fwrite(pending, 1, (size_t)n_pending, stdout); n_pending = 0; }
                pending[n_pending++] = piece[k];
            }
            int ok = tl_utf8_complete_prefix(pending, n_pending);
            fwrite(pending, 1, (size_t)ok, stdout);
            memmove(pending, pending + ok, (size_t)(n_pending - ok));
            n_pending -= ok;
        }
        n += got;
        fflush(stdout);
    }
    fwrite(pending, 1, (size_t)n_pending, stdout);
    printf("\n");
    if (rc) fprintf(stderr, "tinyloop: %s\n", tl_last_error());
    double t1 = tl_now();
    if (!rc && n > 0)
        fprintf(stderr, "[%d prompt tokens, %d generated; first token %.1f ms, %.1f tokens/s]\n", np, n,
                (t_first - t0) * 1e3, n > 1 ? (n - 1) / (t1 - t_first) : 0.0);
    tl_request_release(m, id);
    return rc;
}

static int cmd_generate(opts *o) {
    if (!o->prompt && !o->file) { fprintf(stderr, "tinyloop: generate needs -p TEXT or -f FILE\n"); return 2; }
    tl_model *m;
    if (open_model(o, 0, &m)) return 1;
    int len = 0, rc = 1;
    char *text = o->file ? read_file(o->file, &len) : NULL;
    if (o->file && !text) { tl_model_close(m); return 1; }
    if (!o->file) { text = strdup(o->prompt); len = (int)strlen(text); }
    int32_t *prompt = NULL, *gen = NULL;
    int np = tokenize_alloc(m, text, len, !o->no_special, o->parse_special, &prompt);
    if (np < 0) { fprintf(stderr, "tinyloop: %s\n", tl_last_error()); goto out; }
    if (o->n >= 0) o->gp.max_tokens = o->n;
    gen = malloc((size_t)(o->gp.max_tokens > 0 ? o->gp.max_tokens : 1) * sizeof *gen);
    if (o->ids) {
        int ng = gen ? tl_generate(m, prompt, np, o->gp, gen, o->gp.max_tokens) : TL_ERR_NOMEM;
        if (ng < 0) { fprintf(stderr, "tinyloop: %s\n", tl_last_error()); goto out; }
        print_ids(prompt, np);
        print_ids(gen, ng);
    } else if (stream_generate(m, text, len, prompt, np, &o->gp, gen)) {
        goto out;
    }
    rc = 0;
out:
    free(gen);
    free(prompt);
    free(text);
    tl_model_close(m);
    return rc;
}

static int cmd_tokenize(opts *o) {
    if (!o->prompt && !o->file) { fprintf(stderr, "tinyloop: tokenize needs -p TEXT or -f FILE\n"); return 2; }
    tl_model *m;
    if (open_model(o, 1, &m)) return 1;
    int len = 0;
    char *text = o->file ? read_file(o->file, &len) : strdup(o->prompt);
    if (!text) { tl_model_close(m); return 1; }
    if (!o->file) len = (int)strlen(text);
    int32_t *ids = NULL;
    int n = tokenize_alloc(m, text, len, !o->no_special, o->parse_special, &ids);
    int rc = 0;
    if (n < 0) { fprintf(stderr, "tinyloop: %s\n", tl_last_error()); rc = 1; }
    else if (o->ids) print_ids(ids, n);
    else
        for (int i = 0; i < n; i++) {
            char piece[256];
            int pl = tl_token_to_piece(m, ids[i], piece, sizeof piece);
            printf("%6d -> '%.*s'\n", ids[i], pl > 0 ? pl : 0, piece);
        }
    free(ids);
    free(text);
    tl_model_close(m);
    return rc;
}

static int cmd_info(opts *o) {
    tl_model *m;
    if (open_model(o, 0, &m)) return 1;
    tl_model_info i;
    tl_model_get_info(m, &i);
    printf("file          %s\narch          %s\nvocab         %d (bos %d, eos %d)\n", o->models[0], i.arch, i.n_vocab,
           i.bos, i.eos);
    printf("n_embd        %d\nn_layer       %d\nn_head        %d (kv %d, head_dim %d)\nn_ff          %d\n", i.n_embd,
           i.n_layer, i.n_head, i.n_head_kv, i.head_dim, i.n_ff);
    if (i.n_expert) printf("experts       %d, %d a token, width %d\n", i.n_expert, i.n_expert_used, i.n_ff_expert);
    printf("context       %d trained, max_seq_len %d\nrope base     %g", i.n_ctx_train, i.max_seq_len, i.rope_freq_base);
    if (i.rope_freq_scale != 1.0f || i.rope_attn_factor != 1.0f)
        printf(" (scaled x%g, attn_factor %g)", 1.0f / i.rope_freq_scale, i.rope_attn_factor);
    printf("\nrms eps       %g\n", i.norm_eps);
    if (i.loop_start != i.loop_end)
        printf("loop block    [%d, %d) x %d by default\n", i.loop_start, i.loop_end, i.loop_default);
    else
        printf("loop block    none\n");
    printf("weights       %.2f MiB\n", (double)i.weight_bytes / (1 << 20));
    extern int tl_cli_print_tensor_types(const char *path);
    tl_cli_print_tensor_types(o->models[0]);
    printf("kv cache      %d blocks x %d tokens, %s, %.2f MiB, %zu bytes/token\n", i.kv_blocks_total,
           i.kv_block_size, i.kv_mode, (double)i.kv_bytes / (1 << 20), i.kv_token_bytes);
    static const char *const modes[] = {"f16", "f32", "q8", "q4", "h:f16", "h:q8"};
    printf("kv modes      bytes/token:");
    for (size_t k = 0; k < sizeof modes / sizeof modes[0]; k++)
        printf(" %s %zu", modes[k], tl_model_kv_token_bytes(m, modes[k]));
    /* store-h pays when the model's K+V rows are wider than its hidden state */
    printf("; store-h %s memory here\n",
           tl_model_kv_token_bytes(m, "h:f16") < tl_model_kv_token_bytes(m, "f16") ? "saves" : "does not save");
    printf("threads       %d\ncpu kernels   %s\nbackend       %s\n", i.n_threads, i.isa, i.backend);
    tl_model_close(m);
    return 0;
}

int tl_cli_bench(int n_models, const char *const *models, tl_model_params mp, int n_gen, int prompt_len, int batch);
int tl_cli_bench_cache(int n_models, const char *const *models, tl_model_params mp);
int tl_cli_bench_tiers(int n_models, const char *const *models, tl_model_params mp);
int tl_cli_bench_tokenize(int argc, char **argv);
int tl_cli_bench_kv(int argc, char **argv);
int tl_cli_repl(int argc, char **argv);

int main(int argc, char **argv) {
    if (argc < 2) { usage(); return 2; }
    opts o;
    if (!strcmp(argv[1], "repl")) return tl_cli_repl(argc - 2, argv + 2);
    if (!strcmp(argv[1], "bench") && argc > 2 && !strcmp(argv[2], "tokenize")) return tl_cli_bench_tokenize(argc - 3, argv + 3);
    if (!strcmp(argv[1], "bench") && argc > 2 && !strcmp(argv[2], "kv")) return tl_cli_bench_kv(argc - 3, argv + 3);
    if (!strcmp(argv[1], "bench") && argc > 2 && !strcmp(argv[2], "cache")) {
        if (parse_opts(argc - 3, argv + 3, &o)) { usage(); return 2; }
        return tl_cli_bench_cache(o.n_models, o.models, o.mp);
    }
    if (!strcmp(argv[1], "bench") && argc > 2 && !strcmp(argv[2], "tiers")) {
        if (parse_opts(argc - 3, argv + 3, &o)) { usage(); return 2; }
        return tl_cli_bench_tiers(o.n_models, o.models, o.mp);
    }
    if (parse_opts(argc - 2, argv + 2, &o)) { usage(); return 2; }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "generate")) return cmd_generate(&o);
    if (!strcmp(cmd, "tokenize")) return cmd_tokenize(&o);
    if (!strcmp(cmd, "info")) return cmd_info(&o);
    if (!strcmp(cmd, "bench"))
        return tl_cli_bench(o.n_models, o.models, o.mp, o.n > 0 ? o.n : 64, o.prompt_len > 0 ? o.prompt_len : 128,
                            o.batch > 0 ? o.batch : 8);
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) { usage(); return 0; }
    fprintf(stderr, "tinyloop: unknown command '%s'\n", cmd);
    usage();
    return 2;
}
