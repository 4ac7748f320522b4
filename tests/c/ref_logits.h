/* ref_logits.h - a small spec's logits against tools/ref_forward.py's
 * (test_arch_table, test_moe; header-only, its CHECKs count in the test
 * that includes it). */
#ifndef TL_TEST_REF_LOGITS_H
#define TL_TEST_REF_LOGITS_H

#include <math.h>
#include <stdint.h>

#include "test.h"
#include "tinyloop.h"

/* The first 25 ids of a small spec, its logits against values from
 * tools/ref_forward.py (float64 plain Python) on the same file: positions
 * 100-107 and the argmax within 1e-4. */
static const int32_t ref_ids[25] = {1, 5, 77, 300, 12, 9, 140, 33, 2, 45, 67, 89, 101, 200, 17, 18, 19, 20, 21, 22,
                                    23, 24, 25, 26, 27};

static void check_ref_logits(const char *what, const char *path, const float want[8], int best_want,
                             float best_value) {
    tl_model_params p = tl_model_default_params();
    p.kv_type = TL_KV_F32;
    p.max_seq_len = 64;
    tl_model *m = NULL;
    tl_model_open(path, p, &m);
    CHECK(m != NULL, "%s opens (%s)", what, m ? "" : tl_last_error());
    float l[320];
    tl_seq *q = NULL;
    const int32_t *ip = ref_ids;
    int n = 25, rc = m ? tl_seq_new(m, 0, &q) || tl_batch_forward(m, &q, &ip, &n, 1, l) : -1;
    tl_seq_free(q);
    tl_model_close(m);
    float err = 0;
    int best = 0;
    for (int i = 0; i < 8 && rc == 0; i++) err = fmaxf(err, fabsf(l[100 + i] - want[i]));
    for (int i = 1; i < 320 && rc == 0; i++) best = l[i] > l[best] ? i : best;
    CHECK(rc == 0 && err < 1e-4f && best == best_want && fabsf(l[best_want] - best_value) < 1e-4f,
          "%s logits equal the independent reference (max error %g over 8, argmax %d, want %d)", what, err, best,
          best_want);
}

#endif
