/* forward.h - the forward pass (forward.c): tl_forward checks a batch,
 * takes the blocks its new positions need (reserved by the caller through
 * cache.h) and calls the backend's compute ops; the CPU's ops are here.
 * Internal. */
#ifndef TL_FORWARD_H
#define TL_FORWARD_H

#include "backend.h"
#include "shape.h"

int tl_forward_init(tl_model *m);
void tl_forward_free(tl_model *m);
/* Phase timing of the CPU forward, for `tinyloop bench`: on != 0 (re)starts
 * accumulating wall seconds from zero, on == 0 stops; out (NULL allowed)
 * receives {matmuls incl. activation quantization, attention incl. the KV
 * store, whole forward} accumulated so far. Off by default (the clock reads
 * would cost a tiny model a few percent). */
void tl_forward_profile(tl_model *m, int on, double out[3]);

struct tl_forward_opts;
/* A backend's forward pass, as tl_forward calls it (the same shape for the
 * built-in CPU and a plugin, so forward.c has no backend switch): T new
 * tokens over blocks tl_forward reserved; positions advance in tl_forward. */
typedef struct tl_compute_ops {
    const char *name;
    int (*forward)(tl_model *m, tl_seq **seqs, const int32_t *const *tokens, const int *n_tokens, int n_seq, int T,
                   float *logits, const struct tl_forward_opts *opts);
} tl_compute_ops;
extern const tl_compute_ops tl_cpu_compute;    extern const tl_compute_ops tl_plugin_compute; /* backend.c: the dlopened plugin's */

/* Options of the internal forward entry point. */
typedef struct tl_forward_opts {
    const int *want_logits; /* (n_seq) 0/1 per sequence; NULL = all. Rows of
                               `logits` are compacted: one per wanting sequence. */
    int vl_begin;           /* first virtual layer to run (> 0: resume after a prelude) */
    const float *x_in;      /* with vl_begin > 0: (T, n_embd) hidden states entering vl_begin */
    int vl_capture;         /* >= 0: copy the hidden states entering this virtual layer ... */
    float *x_capture;       /* ... into this (T, n_embd) buffer */
    /* A backend with device sampling (tl_backend_sample_k > 0): one entry
     * per logits row; rows with on_device get their token in ids_out
     * instead of logits. Ignored on the CPU path (leave NULL there). */
    const tl_backend_sample *sample;
    int32_t *ids_out;
} tl_forward_opts;

/* Pure compute: the blocks the new positions need must be free (the
 * caller reserves them through the cache, cache.h); KV full otherwise. */
int tl_forward(tl_model *m, tl_seq **seqs, const int32_t *const *tokens, const int *n_tokens, int n_seq,
               float *logits, const tl_forward_opts *opts);
/* tl_forward's argument checks; *T_out = total tokens. */
int tl_forward_check(const tl_model *m, tl_seq *const *seqs, const int32_t *const *tokens, const int *n_tokens,
                     int n_seq, int *T_out);
/* Free blocks tl_forward would take for these sequences and token counts
 * (new logical blocks plus private copies of shared partial ones). */
int tl_forward_blocks_needed(const tl_model *m, tl_seq *const *seqs, const int *n_tokens, int n_seq);

#endif
