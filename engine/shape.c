/* shape.c - the model's shape as the layers above read it: loop depth,
 * the physical layer behind each virtual layer, sliding windows, the
 * layers without RoPE, and the sequences (block tables) that run through
 * it. Everything here reads the loaded model and calls nothing above the
 * KV arena. */
#include "shape.h"

#include <stdlib.h>

#include "model.h"
#include "util.h"

int tl_model_layer_window(const tl_model *m, int L) {
    int p = m->arch->swa_pattern;
    if (m->hp.sliding_window && m->arch->swa_all) return m->hp.sliding_window;
    if (!m->hp.sliding_window || p <= 0 || L % p == p - 1) return 0;
    return m->hp.sliding_window;
}

int tl_model_layer_rope(const tl_model *m, int L) {
    int e = m->arch->nope_every;
    return e <= 0 || (L + 1) % e != 0;
}

int tl_model_effective_loops(const tl_model *m, int loops) {
    if (m->loop_start == m->loop_end) return 1;
    return loops > 0 ? loops : m->loop_default;
}

int tl_model_depth(const tl_model *m, int loops) {
    int core = m->loop_end - m->loop_start;
    return m->hp.n_layer - core + core * tl_model_effective_loops(m, loops);
}

int tl_model_phys_layer(const tl_model *m, int loops, int vl) {
    int core = m->loop_end - m->loop_start;
    if (vl < m->loop_start || core == 0) return vl;
    int looped = core * tl_model_effective_loops(m, loops);
    if (vl < m->loop_start + looped) return m->loop_start + (vl - m->loop_start) % core;
    return vl - looped + core;
}

int tl_model_vl_window(const tl_model *m, int loops, int cache_window, int vl) {
    return tl_window_narrower(tl_model_layer_window(m, tl_model_phys_layer(m, loops, vl)), cache_window);
}

/* ---- sequences ------------------------------------------------------------------ */

int tl_seq_new(tl_model *m, int loops, tl_seq **out) {
    if (!m || !out) return tl_set_error(TL_ERR_INVALID_ARG, "model and out must not be NULL");
    *out = NULL;
    if (!m->arch) return tl_set_error(TL_ERR_STATE, "model was opened vocab_only; it cannot run");
    if (loops < 0) return tl_set_error(TL_ERR_INVALID_ARG, "loops %d must be >= 0", loops);
    tl_seq *s = calloc(1, sizeof *s);
    if (!s) return tl_set_error(TL_ERR_NOMEM, "out of memory");
    s->model = m;
    s->loops = tl_model_effective_loops(m, loops);
    s->bt.depth = tl_model_depth(m, s->loops);
    *out = s;
    return TL_OK;
}

void tl_seq_free(tl_seq *s) {
    if (!s) return;
    tl_block_table_release(&s->bt, &s->model->kv);
    free(s);
}

int tl_seq_len(const tl_seq *s) { return s ? s->n_pos : 0; }

void tl_seq_drop_behind_windows(tl_model *m, tl_seq *seq) {
    for (int vl = 0; vl < seq->bt.depth; vl++) {
        int layer_window = tl_model_layer_window(m, tl_model_phys_layer(m, seq->loops, vl));
        if (layer_window == 0) continue; /* a request's cache_window drops whole logical blocks (scheduler.c) */
        int first = tl_window_first(seq->n_pos, tl_window_narrower(layer_window, seq->window));
        tl_block_table_drop_layer_before(&seq->bt, &m->kv, vl, first / m->kv.block_size);
    }
}
