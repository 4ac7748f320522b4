/* request.h - one request of any kind, and its state machine (request.c).
 * Internal. The stepping thread owns a request's KV fields; other threads
 * read what take/info need under the scheduler's `mu` (scheduler.h). */
#ifndef TL_REQUEST_H
#define TL_REQUEST_H

#include "model.h"

/* Request kinds: one state machine and one step (admit, batch, forward,
 * sample, deliver) for all of them. */
enum {
    TL_RK_GENERATE = 0, /* prompt -> sampled tokens; inserted into the cache on finish */
    TL_RK_REGISTER,     /* prefill a pool entry and pin it in its pool (tl_pool_register[_submit]) */
    TL_RK_PIN,          /* prefill a prefix and pin its node for the caller (tl_prefix_build) */
    TL_RK_RESUME,       /* a resume handle's prompt at another depth: the loop block from its hidden states */
    TL_RK_BEAM,         /* beam search: the prompt prefilled once, then every live beam a sequence in the batch */
};

/* What a TL_RK_RESUME request reads of its handle (prefix.c fills it; the
 * handle outlives the request, whose caller waits for it). */
typedef struct tl_resume_view {
    int prelude;            /* virtual layers whose KV the handle holds; the first pass starts here */
    int n_lb;               /* logical blocks of the prompt */
    const int32_t *blocks;  /* (n_lb, prelude) the handle's block ids */
    const float *x;         /* (n_prompt, n_embd) hidden states entering layer `prelude` */
} tl_resume_view;

typedef struct tl_request {
    int64_t id;
    int kind;                /* TL_RK_* */
    int state, finish, error;
    char errmsg[256];
    int32_t *tokens;         /* prompt then generated (cap = n_prompt + max_tokens) */
    int n_prompt, n_gen, n_taken;
    tl_generate_params p;
    uint64_t rng;            /* sampler state between steps */
    tl_seq *seq;
    int n_cached;            /* prompt tokens served by the cache */
    int ns;                  /* radix namespace, -1 without cache */
    tl_radix_node *locked;   /* matched node, locked while running */
    tl_pool *pool;
    int cancel_req, release_req; /* set by any thread; acted on by the stepping thread */
    tl_pool *reg_pool;       /* a registration (tl_pool_register_submit): prefill, then pin here */
    int reg_orphan;          /* a registration whose pool was freed: prefill and cache unpinned */
    float *reg_logits;       /* a registration's last position logits, kept with its entry */
    tl_radix_node *pinned;   /* TL_RK_PIN: the pinned node, until the waiting caller takes it */
    tl_resume_view resume;   /* TL_RK_RESUME */
    int beams;               /* TL_RK_BEAM: width and length penalty */
    float alpha;
    struct tl_beam *beam;    /* TL_RK_BEAM: the search, from admission (its beams own their sequences) */
    tl_beam_result beam_res; /* TL_RK_BEAM: the scores, once it has ended */
    int news;                /* tokens or a state change since the last notification */
    int64_t queued_step;     /* scheduler step it was first considered for admission (aging) */
    int first_tok;           /* >= 0: sampled at admission from a full match's kept logits */
    uint64_t first_rng;      /* the sampler state after that draw */
} tl_request;

/* Build requests prefill a prefix and keep its last logits with it. */
static inline int tl_request_is_build(const tl_request *r) { return r->kind == TL_RK_REGISTER || r->kind == TL_RK_PIN; }
static inline int tl_request_keeps_logits(const tl_request *r) { return r->kind == TL_RK_PIN || r->reg_pool; }

/* Ids in the vocab, at least one; and a prompt with max_tokens >= 1 that fits max_seq_len. */
int tl_request_check_tokens(const tl_model *m, const int32_t *tokens, int n);
int tl_request_check_prompt(const tl_model *m, const int32_t *prompt, int n_prompt, int max_tokens);

/* A queued request for prompt (room for max_tokens more), or NULL with the
 * error set; tl_request_enqueue queues it (taking it) and wakes the engine. */
tl_request *tl_request_new(tl_model *m, const int32_t *prompt, int n_prompt, const tl_generate_params *p);
int tl_request_enqueue(tl_model *m, tl_request *r, int64_t *id_out);
/* Queues a build of tokens (checked by the caller): TL_RK_REGISTER into
 * pool (its namespace salt and tenant), or TL_RK_PIN for the caller when
 * pool is NULL. */
int tl_request_submit_build(tl_model *m, tl_pool *pool, const int32_t *tokens, int n, int loops, int window,
                            int64_t *id_out);
/* Queues a TL_RK_BEAM request (arguments checked by the caller). */
int tl_request_submit_beam(tl_model *m, const int32_t *prompt, int n, const tl_generate_params *p, tl_pool *pool,
                           int beams, float alpha, int64_t *id_out);
/* Queues a TL_RK_RESUME request for a handle's prompt (checked) and view. */
int tl_request_submit_resume(tl_model *m, const int32_t *prompt, int n, const tl_resume_view *v,
                             const tl_generate_params *p, int64_t *id_out);

/* The request with this id, submitted or stepping (caller holds mu). */
tl_request *tl_request_find(const tl_model *m, int64_t id);
/* Transitions, made by the stepping thread (which holds compute_mu):
 * stop drops the KV and the cache lock (inserting the tokens first with
 * insert); finish ends with a reason, fail with an error, requeue goes back
 * to the queue without its KV; complete_build inserts and pins a build's
 * prefix; free also frees the request. */
void tl_request_stop(tl_model *m, tl_request *r, int insert);
void tl_request_finish(tl_model *m, tl_request *r, int reason);
void tl_request_fail(tl_model *m, tl_request *r, int code, const char *msg);
void tl_request_requeue(tl_model *m, tl_request *r);
void tl_request_complete_build(tl_model *m, tl_request *r);
void tl_request_free(tl_model *m, tl_request *r);
/* Blocks until request id has untaken tokens or has ended (engine mode). */
int tl_request_wait_news(tl_model *m, int64_t id);

#endif
