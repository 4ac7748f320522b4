/* tl-gen-model - writes a synthetic GGUF model of one of the architectures
 * ARCHS names (see tests/c/lib/testmodel.h).
 *   tl-gen-model OUT.gguf [--type q4_0] [--vocab N] [--dim N] [--layers N] [--heads N]
 *                [--kv-heads N] [--ff N] [--ctx N] [--loop S E D] [--unroll K]
 *                [--twin-f32] [--tied] [--seed N] [--arch A] [--head-dim N]
 *                [--bias 0|1|2] [--window N] [--rope-dims N]
 *                [--rope-base F] [--rope-scaling TYPE] [--rope-factor F] [--rope-attn-factor F] [--rope-orig-ctx N] [--rope-factors]
 *                [--softcap ATTN FINAL] [--sequential] [--embd-gain F]
 *                [--matmul-bias] [--extra-f32 KEY F] [--experts N] [--experts-used K] [--ff-shexp N] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quants.h"
#include "testmodel.h"

#define ARCHS                                                                                                   \
    "llama, internlm2, xverse, ernie4_5, mistral3, olmo, olmo2, olmoe, granite, granitemoe, qwen, qwen2, qwen3, qwen2moe, qwen3moe, smollm3, gemma, " \
    "gemma2, gemma3, phi3, " \
    "gpt2, starcoder, stablelm, starcoder2, gptneox, phi2, falcon, command-r, cohere2, bloom, mpt"

static int type_by_name(const char *name) {
    for (int t = 0; t < TL_TYPE_COUNT; t++) {
        const tl_type_traits *tr = tl_type_info(t);
        if (tr->name && tr->supported && !strcmp(tr->name, name)) return t;
    }
    return -1;
}

int main(int argc, char **argv) {
    /* an option where OUT.gguf goes (--help) would be written as a file of that name */
    if (argc < 2 || argv[1][0] == '-') {
        fprintf(stderr, "usage: tl-gen-model OUT.gguf [--type q4_0] [--vocab N] [--dim N] [--layers N] [--heads N]\n"
                        "                    [--kv-heads N] [--ff N] [--ctx N] [--loop S E D] [--unroll K]\n"
                        "                    [--twin-f32] [--tied] [--seed N] [--arch A] [--head-dim N]\n"
                        "                    [--bias 0|1|2] [--window N] [--rope-dims N]\n"
                        "                    [--rope-base F] [--rope-scaling TYPE] [--rope-factor F] [--rope-attn-factor F] [--rope-orig-ctx N] [--rope-factors]\n"
                        "                    [--softcap ATTN FINAL] [--sequential] [--embd-gain F] [--matmul-bias]\n"
                        "                    [--extra-f32 KEY F] [--experts N] [--experts-used K] [--ff-shexp N]\n"
                        "  architectures: " ARCHS "\n");
        return 2;
    }
    tm_spec s = tm_default_spec();
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        int more = i + 1 < argc;
#define INT_OPT(flag, field) else if (!strcmp(a, flag) && more) s.field = atoi(argv[++i]);
        if (!strcmp(a, "--type") && more) {
            s.type = type_by_name(argv[++i]);
            if (s.type < 0) { fprintf(stderr, "tl-gen-model: unknown type '%s'\n", argv[i]); return 2; }
        }
        INT_OPT("--vocab", n_vocab) INT_OPT("--dim", n_embd) INT_OPT("--layers", n_layer)
        INT_OPT("--heads", n_head) INT_OPT("--kv-heads", n_head_kv) INT_OPT("--ff", n_ff)
        INT_OPT("--ctx", n_ctx) INT_OPT("--unroll", unroll) INT_OPT("--head-dim", head_dim)
        INT_OPT("--bias", bias) INT_OPT("--window", sliding_window) INT_OPT("--rope-dims", rope_dims)
        INT_OPT("--experts", expert_count) INT_OPT("--experts-used", expert_used) INT_OPT("--ff-shexp", n_ff_shexp)
        else if (!strcmp(a, "--arch") && more) {
            const char *v = argv[++i];
            if (!tm_arch_known(v)) {
                fprintf(stderr, "tl-gen-model: unknown architecture '%s' (" ARCHS ")\n", v);
                return 2;
            }
            s.arch = v;
        } else if (!strcmp(a, "--loop") && i + 3 < argc) {
            s.loop_start = atoi(argv[++i]);
            s.loop_end = atoi(argv[++i]);
            s.loop_default = atoi(argv[++i]);
        } else if (!strcmp(a, "--twin-f32")) s.twin_f32 = 1;
        else if (!strcmp(a, "--tied")) s.tied = 1;
        else if (!strcmp(a, "--seed") && more) s.seed = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(a, "--rope-base") && more) s.rope_base = strtof(argv[++i], NULL);
        else if (!strcmp(a, "--rope-scaling") && more) s.rope_scaling = argv[++i];
        else if (!strcmp(a, "--rope-factor") && more) s.rope_factor = strtof(argv[++i], NULL);
        else if (!strcmp(a, "--rope-attn-factor") && more) s.rope_attn_factor = strtof(argv[++i], NULL);
        else if (!strcmp(a, "--rope-orig-ctx") && more) s.rope_orig_ctx = atoi(argv[++i]);
        else if (!strcmp(a, "--rope-factors")) s.rope_factors = 1;
        else if (!strcmp(a, "--sequential")) s.sequential = 1;
        else if (!strcmp(a, "--matmul-bias")) s.matmul_bias = 1;
        else if (!strcmp(a, "--extra-f32") && i + 2 < argc) {
            s.extra_key = argv[++i];
            s.extra_value = strtof(argv[++i], NULL);
        }
        else if (!strcmp(a, "--embd-gain") && more) s.embd_gain = strtof(argv[++i], NULL);
        else if (!strcmp(a, "--softcap") && i + 2 < argc) {
            s.attn_softcap = strtof(argv[++i], NULL);
            s.final_softcap = strtof(argv[++i], NULL);
        }
        else { fprintf(stderr, "tl-gen-model: unknown option '%s'\n", a); return 2; }
#undef INT_OPT
    }
    if (s.n_head_kv == 0 || s.n_head_kv > s.n_head) s.n_head_kv = s.n_head;
    return tm_write(&s, argv[1]) ? 1 : 0;
}
