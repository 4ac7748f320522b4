/* testmodel.h - writes synthetic llama-architecture GGUF models with
 * seeded random weights, for tests and benchmarks.
 *
 * Weights are drawn per (physical layer, tensor) from the seed, so two specs
 * that differ only in `unroll`, or in `type` with `twin_f32`, describe the
 * same network: `unroll = k` writes layers [loop_start, loop_end) k times
 * into a plain model (no loop keys); `twin_f32` quantizes to `type` and
 * writes the dequantized values as F32 (the exact twin of the quantized
 * model). */
#ifndef TL_TESTMODEL_H
#define TL_TESTMODEL_H

#include <stdint.h>

typedef struct tm_spec {
    int n_vocab, n_embd, n_layer, n_head, n_head_kv, n_ff, n_ctx;
    int type;          /* TL_TYPE_* of the 2-D weights (embeddings included) */
    int loop_start, loop_end, loop_default; /* loop_end > loop_start: write loop keys */
    int unroll;        /* > 0: write the loop block unrolled this many times */
    int twin_f32;      /* 1: dequantized F32 twin of `type` */
    int tied;          /* 1: no output.weight */
    uint64_t seed;
    float rope_base;   /* 0: key absent */
    const char *rope_scaling;          /* rope.scaling.type; NULL: key absent */
    float rope_factor, rope_attn_factor; /* rope.scaling.factor / attn_factor; 0: key absent */
    int rope_orig_ctx;                   /* rope.scaling.original_context_length; 0: key absent */
    int rope_factors;                    /* 1: LongRoPE's rope_factors_long / _short tensors */
    const char *arch;  /* general.architecture, NULL: llama. Its tensors and keys as
                          llama.cpp's converter writes them (tm_write's recipe table):
                          qwen2 (NEOX RoPE), qwen3 (per-head Q/K norms), smollm3 (layers
                          3, 7, ... without RoPE), gemma / gemma2 / gemma3 (tied; gemma2/3
                          post norms and a window, gemma2 soft-capping, gemma3 Q/K
                          norms), phi3 (fused attn_qkv and gate/up ffn_up, a window),
                          gpt2 (LayerNorms with biases, learned positions, fused QKV and
                          every matmul with a bias, plain GELU FFN), stablelm (LayerNorms
                          with biases), starcoder2 (LayerNorms, biased matmuls, plain FFN),
                          gptneox (gpt2's tensors with RoPE, parallel residual unless
                          `sequential`), phi2 (gptneox's with one norm a layer and an
                          output bias), falcon (phi2's without biases), starcoder
                          (gpt2's), qwen (fused QKV with its bias, feed_forward_length
                          twice n_ff), olmo (no norm tensors), granite (llama's with its
                          four multiplier keys), qwen2moe / qwen3moe (qwen2's / qwen3's
                          attention, experts; qwen2moe's shared expert), olmo2 (post norms
                          only, whole-row Q/K norms), olmoe (olmo2's Q/K norms, pre norms,
                          experts), granitemoe (granite's with experts), command-r (weight-only
                          LayerNorms, one norm a parallel layer, logit_scale), cohere2
                          (command-r's with a window), bloom (gpt2's tensors, ALiBi, the
                          embeddings' norm), mpt (bloom's without biases or that norm);
                          internlm2, xverse,
                          ernie4_5 and mistral3 are llama's under their names */
    int sequential;    /* gptneox: use_parallel_residual false */
    float embd_gain;   /* > 0: token embeddings this much smaller or larger (a gemma's tied
                          output otherwise echoes the sqrt(n_embd)-scaled input token) */
    float attn_softcap, final_softcap; /* gemma2's soft-capping keys; 0: written as 50 and 30 */
    int sliding_window; /* gemma3 / gemma2 / phi3: window of the local layers; 0: key absent */
    int rope_dims;     /* > 0: rope.dimension_count (partial rotary); 0: the head size */
    int head_dim;      /* 0: n_embd / n_head (no key_length key); else written as attention.key_length */
    int bias;          /* separate Q/K/V biases: 1 random, 2 all zero, 0 none */
    int matmul_bias;   /* 1: attn_output / ffn_up / ffn_down biases whatever the architecture */
    const char *extra_key; /* "<arch>.<extra_key>" written as extra_value (f32); NULL: none */
    float extra_value;
    int expert_count;  /* > 0: expert_count; llama, qwen2moe and qwen3moe then route their FFN
                          through that many experts (3-D ffn_*_exps tensors, an F32 router),
                          other architectures keep a dense FFN under the key */
    int expert_used;   /* expert_used_count: the top k (0: 2) */
    int n_ff_shexp;    /* qwen2moe's shared expert width (0: n_ff); granitemoe: > 0 adds an
                          ungated shared expert of that width */
} tm_spec;

tm_spec tm_default_spec(void);
/* 1 when the spec's model has no output.weight (tied, or a gemma). */
int tm_spec_tied(const tm_spec *s);
/* 1 when tm_write knows the architecture name. */
int tm_arch_known(const char *name); /* small: vocab 320, dim 64, 2 layers, 4 heads (2 kv), ff 128, f32 */
/* The architectures a backend is checked on, small, into specs/names
 * (room for TM_ARCH_CASES): llama f32; llama with a loop block (layers 1-2
 * run twice, Q4_0); qwen2 with Q/K/V biases and NEOX RoPE (Q8_0); gemma3
 * with Q/K norms, post norms, GeGLU and a window of 8 on 5 of 6 layers
 * (Q4_K, dims of 256); qwen3 with Q/K norms and heads of 32 on a width of
 * 64 (Q8_0). Returns TM_ARCH_CASES. */
#define TM_ARCH_CASES 5
int tm_arch_cases(tm_spec *specs, const char **names);
/* Returns 0 on success, -1 on failure (message on stderr). */
int tm_write(const tm_spec *spec, const char *path);

/* The cross-engine references' run (ik_llama.cpp's llama-simple on the same
 * file): the prompt "the cat sat on the mat and then it ran" (24 ids with
 * BOS on the synthetic vocab) into ids, then n <= 24 greedy tokens after it
 * (EOS ignored) into out. Returns how many were generated, or -1 when the
 * prompt is not 24 ids. */
/* Hostile-file patches of a written model, in its first 1 MiB: every
 * `from` becomes `to` (the same length; returns how many), or the u32
 * value of metadata key `key` is set (0 when the key is absent). */
int tm_patch_bytes(const char *path, const char *from, const char *to);
int tm_patch_u32_key(const char *path, const char *key, uint32_t value);

struct tl_model;
int tm_greedy_ref(struct tl_model *m, int n, int32_t ids[24], int32_t *out);

#endif
