/* cache.c - namespaces, room in the KV arena, tenant budgets, eviction
 * weights, statistics and the invariant checker (see cache.h). */
#include "cache.h"

#include <stdlib.h>
#include <string.h>

#include "util.h"

int tl_cache_namespace(tl_model *m, int loops, int window, uint64_t salt) {
    int eff = tl_model_effective_loops(m, loops);
    int ns = tl_radix_namespace(&m->cache, eff, window, salt, tl_model_depth(m, eff));
    return ns < 0 ? tl_set_error(TL_ERR_NOMEM, "out of memory for a cache namespace") : ns;
}

int tl_cache_make_room(tl_model *m, int need) {
    if (need > m->kv.n_free) tl_radix_evict(&m->cache, need);
    return need <= m->kv.n_free;
}

int tl_cache_reserve(tl_model *m, tl_seq *const *seqs, const int *n_tokens, int n_seq) {
    return tl_cache_make_room(m, tl_forward_blocks_needed(m, seqs, n_tokens, n_seq));
}

/* The public one-pass entry point (tinyloop.h): room first, as the
 * scheduler makes it, then the pure forward pass. */
int tl_batch_forward(tl_model *m, tl_seq **seqs, const int32_t *const *tokens, const int *n_tokens, int n_seq,
                     float *logits) {
    int T;
    if (tl_forward_check(m, seqs, tokens, n_tokens, n_seq, &T)) return tl_last_error_code();
    tl_cache_reserve(m, seqs, n_tokens, n_seq);
    return tl_forward(m, seqs, tokens, n_tokens, n_seq, logits, NULL);
}
