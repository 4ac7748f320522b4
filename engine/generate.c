/* generate.c - synchronous generation: a request run to completion. */
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "scheduler.h"
#include "util.h"

int tl_generate(tl_model *m, const int32_t *prompt, int n_prompt, tl_generate_params gp, int32_t *out, int cap) {
    if (!m) return tl_set_error(TL_ERR_INVALID_ARG, "model must not be NULL");
    if (!m->arch) return tl_set_error(TL_ERR_STATE, "model was opened vocab_only; it cannot generate");
    if (cap < 0 || (!out && cap > 0)) return tl_set_error(TL_ERR_INVALID_ARG, "out/cap invalid (cap %d)", cap);
    return tl_sched_run(m, prompt, n_prompt, &gp, NULL, out, cap, NULL);
}
