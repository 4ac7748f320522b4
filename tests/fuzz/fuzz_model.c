/* fuzz_model.c - libFuzzer target for opening a model: each input is a GGUF
 * file handed to tl_model_open (through a memfd), so hyperparameters, tensor
 * shapes and types, the vocab and the loop keys of hostile files meet the
 * binding code, not only the parser; a model that opens also generates two
 * tokens and is closed. Seeds (TL_FUZZ_WRITE_SEEDS=DIR): tiny synthetic
 * llama, looped, quantized, qwen2, gemma3 and qwen3 (heads wider than
 * n_embd / n_head) models, gemma2 (soft-capping), phi3 (fused tensors,
 * LongRoPE factors), gpt2 (LayerNorm, biases, learned positions) and a
 * YaRN-scaled llama, and 256-wide K-quant (and iq4_xs) ones. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "testmodel.h"
#include "tinyloop.h"

/* k >= 5: 256-wide models of the 256-element super-block types, so the
 * mutations reach their decoders (hostile scales, f16 d words, levels) */
static const int k_types[] = {10, 11, 12, 14, 23, /* q2_K, q3_K, q4_K, q6_K, iq4_xs */
                              16, 17, 22, 18, 21, 19, 29}; /* iq2_xxs/xs/s, iq3_xxs/s, iq1_s/m: grid indices, signs */

static void write_seeds(const char *dir) {
    for (int k = 0; k < 5 + (int)(sizeof k_types / sizeof k_types[0]); k++) {
        tm_spec s = tm_default_spec();
        s.n_embd = 32;
        s.n_head = 2;
        s.n_head_kv = 1;
        s.n_ff = 32;
        s.n_layer = k == 1 ? 3 : 1;
        s.n_vocab = 260;
        s.n_ctx = 64;
        if (k == 1) s.loop_start = 1, s.loop_end = 2, s.loop_default = 2;
        if (k == 2) s.type = 8; /* q8_0 */
        if (k == 3) s.arch = "qwen2", s.bias = 1;
        if (k == 4) s.arch = "gemma3", s.sliding_window = 4;
        if (k >= 5) s.n_embd = 256, s.n_ff = 256, s.n_head = 4, s.type = k_types[k - 5];
        char path[512];
        snprintf(path, sizeof path, "%s/model-%d.gguf", dir, k);
        tm_write(&s, path);
    }
    static const char *const names[] = {"qwen3",    "gemma2",    "phi3",    "gpt2",  "yarn",      "gptneox",
                                        "phi2",     "starcoder2", "olmo",   "qwen",  "starcoder", "falcon",
                                        "granite",  "bloom",     "mpt",     "command-r", "cohere2", "olmo2",
                                        "llama",    "qwen2moe",  "qwen3moe", "olmoe", "granitemoe"};
    const int n_names = (int)(sizeof names / sizeof names[0]), first_moe = 18;
    for (int k = 0; k < n_names; k++) {
        tm_spec s = tm_default_spec();
        s.n_layer = 1, s.n_vocab = 260, s.n_ctx = 64;
        if (k == 0) s.arch = "qwen3", s.head_dim = 32;
        if (k == 1) s.arch = "gemma2", s.sliding_window = 4;
        if (k == 2) s.arch = "phi3", s.sliding_window = 8, s.rope_factors = 1, s.rope_orig_ctx = 32;
        if (k == 3) s.arch = "gpt2";
        if (k == 4) s.rope_scaling = "yarn", s.rope_factor = 4, s.rope_orig_ctx = 16;
        if (k >= 5) s.arch = names[k], s.n_head_kv = s.n_head, s.rope_dims = 8; /* one K/V head a query head */
        if (k >= first_moe) s.expert_count = 4, s.expert_used = 2, s.n_ff = 32; /* experts (llama: Mixtral's) */
        if (!strcmp(names[k], "cohere2")) s.sliding_window = 4;
        char path[512];
        snprintf(path, sizeof path, "%s/model-%s.gguf", dir, names[k]);
        tm_write(&s, path);
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    setenv("TINYLOOP_BACKEND", "cpu", 1);
    const char *dir = getenv("TL_FUZZ_WRITE_SEEDS");
    if (dir) {
        write_seeds(dir);
        exit(0);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int fd = memfd_create("tl_fuzz_model", 0);
    if (fd < 0) return 0;
    if (write(fd, data, size) != (ssize_t)size) {
        close(fd);
        return 0;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    tl_model_params mp = tl_model_default_params();
    mp.n_threads = 1;
    mp.max_seq_len = 64;
    mp.kv_mem = 1 << 20;
    tl_model *m = NULL;
    if (tl_model_open(path, mp, &m) == TL_OK) {
        int nv = tl_model_n_vocab(m);
        int32_t prompt[3] = {1 % nv, 2 % nv, 3 % nv}, out[2];
        tl_generate_params gp = tl_generate_default_params();
        gp.max_tokens = 2;
        tl_generate(m, prompt, 3, gp, out, 2);
        tl_model_close(m);
    } else if (!tl_last_error()[0]) {
        abort(); /* a refusal must say why */
    }
    close(fd);
    return 0;
}
