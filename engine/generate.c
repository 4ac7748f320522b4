/* generate.c - synchronous generation: a request submitted and waited
 * for (plain and beam search). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "beam.h"
#include "model.h"
#include "pool.h"
#include "scheduler.h"
#include "util.h"

int tl_generate(tl_model *m, const int32_t *prompt, int n_prompt, tl_generate_params gp, int32_t *out, int cap) {
    if (!m) return tl_set_error(TL_ERR_INVALID_ARG, "model must not be NULL");
    if (!m->arch) return tl_set_error(TL_ERR_STATE, "model was opened vocab_only; it cannot generate");
    if (cap < 0 || (!out && cap > 0)) return tl_set_error(TL_ERR_INVALID_ARG, "out/cap invalid (cap %d)", cap);
    return tl_sched_run(m, prompt, n_prompt, &gp, NULL, out, cap, NULL);
}

/* A TL_RK_BEAM request, waited for: its beams run in the scheduler's
 * batches, one sequence each, beside everything else. */
int tl_generate_beam(tl_model *m, tl_pool *pool, const int32_t *prompt, int n_prompt, tl_generate_params gp,
                     int beams, float alpha, int32_t *out, int cap, tl_beam_result *result) {
    if (!m) return tl_set_error(TL_ERR_INVALID_ARG, "model must not be NULL");
    if (!m->arch) return tl_set_error(TL_ERR_STATE, "model was opened vocab_only; it cannot generate");
    if (beams < 1 || beams > TL_BEAM_MAX)
        return tl_set_error(TL_ERR_INVALID_ARG, "beams %d must be in [1, %d]", beams, TL_BEAM_MAX);
    if (!isfinite(alpha)) return tl_set_error(TL_ERR_INVALID_ARG, "length_penalty %g must be finite", (double)alpha);
    int rc = tl_request_check_prompt(m, prompt, n_prompt, gp.max_tokens);
    if (rc) return rc;
    if (!out || cap < gp.max_tokens)
        return tl_set_error(TL_ERR_BUFFER, "output buffer of %d tokens is smaller than max_tokens %d", cap,
                            gp.max_tokens);
    if (gp.loops < 0 || gp.cache_window < 0 || gp.tenant < 0)
        return tl_set_error(TL_ERR_INVALID_ARG, "loops %d, cache_window %d and tenant %d must be >= 0", gp.loops,
                            gp.cache_window, gp.tenant);
    if (pool) {
        if ((rc = tl_pool_bind(pool, m))) return rc;
        uint64_t salt;
        int tenant;
        tl_pool_key(pool, &salt, &tenant);
        if (!gp.salt) gp.salt = salt;
        if (!gp.tenant) gp.tenant = tenant;
    }
    int64_t id;
    if ((rc = tl_request_submit_beam(m, prompt, n_prompt, &gp, pool, beams, alpha, &id))) return rc;
    tl_wait_result res = {0};
    rc = tl_sched_wait(m, id, out, cap, &res);
    if (rc >= 0 && result) *result = res.beam;
    return rc;
}
