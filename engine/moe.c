/* moe.c - a mixture-of-experts FFN on the CPU (Mixtral's llama, Qwen 2
 * MoE, Qwen 3 MoE), as llama.cpp's build_moe_ffn computes it:
 *
 *   p = softmax(router . x)              over the n_expert experts (tl_softmax_f32)
 *   top = the n_expert_used largest p     (ties: the lower index first)
 *   w_j = p[top_j]  (/ sum_j p[top_j] where the architecture renormalizes)
 *   out = sum_j w_j * down_e(silu(gate_e . x) * (up_e . x)),  e = top_j
 *         (+ sigmoid(g . x) * the shared expert's FFN of x, Qwen 2 MoE;
 *          + the shared expert's FFN of x, Granite MoE shared)
 *
 * The matmuls run expert by expert over the tokens routed to it, gathered
 * into rows of their own, so an expert's weights stream once a batch
 * however many of its tokens chose it. Each token's terms are added in
 * expert order: the order depends on the token alone, so a token's output
 * is the same in any batch (batch == alone holds bitwise); llama.cpp adds
 * them in rank order, a rounding apart. */
#include <math.h>
#include <string.h>

#include "forward_impl.h"
#include "forward_ops.h"
#include "quants.h"

/* Token t's k experts (largest probability first; equal ones by index) and
 * their weights; its router logits p become probabilities (the attention's
 * softmax: ggml's soft_max). */
static void route(const tl_model *m, float *p, int32_t *sel, float *w) {
    const int E = m->hp.n_expert, K = m->hp.n_expert_used;
    uint8_t taken[TL_MAX_EXPERTS] = {0};
    tl_softmax_f32(p, E, 1.0f);
    for (int j = 0; j < K; j++) {
        int best = -1;
        for (int e = 0; e < E; e++)
            if (!taken[e] && (best < 0 || p[e] > p[best])) best = e;
        taken[best] = 1;
        sel[j] = best;
        w[j] = p[best];
    }
    if (!m->arch->moe_norm) return;
    double sum = 0;
    for (int j = 0; j < K; j++) sum += (double)w[j];
    const float s = (float)sum;
    for (int j = 0; j < K; j++) w[j] /= s;
}

/* Row-wise steps between the matmuls, split over the pool by rows (each
 * row's arithmetic is the same whichever thread runs it, and the rows of
 * one expert are distinct tokens). */
enum { ROWS_ACT, ROWS_ADD };
typedef struct {
    tl_model *m;
    int step, rows, n;
    const float *w;       /* ROWS_ADD: row r's weight, or NULL: the shared expert's (gated: sigmoid(g[r]), else 1) */
    int gated;
    const int32_t *token; /* ROWS_ADD: row r's token, or NULL: r */
} rows_ctx;

static void rows_task(void *p, int ith, int nth) {
    const rows_ctx *c = p;
    tl_scratch *s = c->m->scratch;
    const int r0 = (int)((int64_t)c->rows * ith / nth), r1 = (int)((int64_t)c->rows * (ith + 1) / nth);
    for (int r = r0; r < r1; r++) {
        if (c->step == ROWS_ACT) { /* act(gate) * up, the gate in hb */
            tl_fwd_gated_act(c->m, s->hb + (size_t)r * c->n, s->hb2 + (size_t)r * c->n, c->n);
            continue;
        }
        float *o = s->o + (size_t)(c->token ? c->token[r] : r) * c->n;
        const float *y = s->moe_o + (size_t)r * c->n;
        if (!c->w && !c->gated) { /* Granite's shared expert: added as it is */
            tl_add_f32(o, y, c->n);
            continue;
        }
        const float w = c->w ? c->w[r] : 1.0f / (1.0f + expf(-s->moe_logits[r]));
        for (int i = 0; i < c->n; i++) o[i] += y[i] * w;
    }
}

static void rows_run(tl_model *m, int step, int rows, int n, const float *w, const int32_t *token, int gated) {
    rows_ctx c = {.m = m, .step = step, .rows = rows, .n = n, .w = w, .token = token, .gated = gated};
    tl_threadpool_run(m->tp, rows_task, &c, rows);
}

/* One gated FFN (gate, up, down) over rows of x into s->moe_o. */
static void expert_ffn(tl_model *m, const tl_weight *gate, const tl_weight *up, const tl_weight *down, const float *x,
                       int rows) {
    tl_scratch *s = m->scratch;
    float *const outs[2] = {s->hb, s->hb2};
    const tl_weight *const ws[2] = {gate, up};
    tl_fwd_matmul_multi(m, 2, outs, ws, x, rows);
    rows_run(m, ROWS_ACT, rows, (int)gate->n_out, NULL, NULL, 0);
    tl_fwd_matmul(m, s->moe_o, down, s->hb, rows);
}

void tl_moe_ffn(tl_model *m, const tl_layer *ly, int T) {
    tl_scratch *s = m->scratch;
    const tl_hparams *hp = &m->hp;
    const int D = hp->n_embd, E = hp->n_expert, K = hp->n_expert_used;
    tl_fwd_matmul(m, s->moe_logits, &ly->router, s->xb, T);
    for (int t = 0; t < T; t++)
        route(m, s->moe_logits + (size_t)t * E, s->moe_sel + (size_t)t * K, s->moe_w + (size_t)t * K);
    memset(s->o, 0, (size_t)T * D * sizeof(float));
    for (int e = 0; e < E; e++) {
        int rows = 0;
        for (int t = 0; t < T; t++)
            for (int j = 0; j < K; j++)
                if (s->moe_sel[(size_t)t * K + j] == e) {
                    s->moe_rows[rows] = t;
                    s->moe_rw[rows] = s->moe_w[(size_t)t * K + j];
                    memcpy(s->moe_x + (size_t)rows++ * D, s->xb + (size_t)t * D, (size_t)D * sizeof(float));
                }
        if (!rows) continue;
        expert_ffn(m, &ly->x_gate[e], &ly->x_up[e], &ly->x_down[e], s->moe_x, rows);
        rows_run(m, ROWS_ADD, rows, D, s->moe_rw, s->moe_rows, 0);
    }
    if (!ly->sh_up.data) return;
    /* the shared expert, gated per token by sigmoid(g . x) (Qwen 2 MoE) */
    expert_ffn(m, &ly->sh_gate, &ly->sh_up, &ly->sh_down, s->xb, T);
    if (ly->sh_router.data) tl_fwd_matmul(m, s->moe_logits, &ly->sh_router, s->xb, T);
    rows_run(m, ROWS_ADD, T, D, NULL, NULL, ly->sh_router.data != NULL);
}
