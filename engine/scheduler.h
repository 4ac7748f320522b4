/* scheduler.h - requests and the scheduler (continuous batching over the
 * paged KV and the radix prefix cache). Internal. */
#ifndef TL_SCHED_H
#define TL_SCHED_H

#include <pthread.h>

#include "cache.h"
#include "model.h"
#include "sampler.h"

/* Request kinds: one state machine and one step (admit, batch, forward,
 * sample, deliver) for all of them. */
enum {
    TL_RK_GENERATE = 0, /* prompt -> sampled tokens; inserted into the cache on finish */
    TL_RK_REGISTER,     /* prefill a pool entry and pin it in its pool (tl_pool_register[_submit]) */
    TL_RK_PIN,          /* prefill a prefix and pin its node for the caller (tl_prefix_build) */
    TL_RK_RESUME,       /* a resume handle's prompt at another depth: the loop block from its hidden states */
};

struct tl_prefix;

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
    const struct tl_prefix *resume; /* TL_RK_RESUME: the handle (outlives the request: its caller waits) */
    int news;                /* tokens or a state change since the last notification */
    int64_t queued_step;     /* scheduler step it was first considered for admission (aging) */
    int first_tok;           /* >= 0: sampled at admission from a full match's kept logits */
    uint64_t first_rng;      /* the sampler state after that draw */
} tl_request;

/* A change asked for from a thread that must not wait for a step (a
 * request handler): queued under `mu` and applied by the stepping thread
 * between steps (tl_sched_apply_msgs), never under the caller's thread
 * waiting on compute_mu. */
enum { TL_MSG_BUDGET = 1, TL_MSG_POOL_FREE = 2 };
typedef struct tl_sched_msg {
    int kind;
    int tenant, max_blocks;  /* TL_MSG_BUDGET */
    tl_pool *pool;           /* TL_MSG_POOL_FREE */
} tl_sched_msg;

/* One forward pass's batch, parallel arrays with room for every request
 * (grown with the request list, so a step allocates nothing). */
typedef struct tl_batch {
    tl_request **rq;
    tl_seq **seqs;
    const int32_t **toks;
    int *ntok, *want, *prompt_part;
} tl_batch;

/* Locking (see engine.c): `mu` guards the request lists, the fields
 * take/get_info read, and the flags; `compute_mu` is held by whoever steps
 * or otherwise touches the KV pool and the radix tree. Without the engine
 * thread both are uncontended. */
typedef struct tl_sched {
    tl_request **reqs;       /* in submission order; owned by the stepping thread */
    int n, cap;
    tl_batch batch;          /* room for cap requests */
    tl_request **incoming;   /* submitted, not yet seen by a step (guarded by mu) */
    int n_in, cap_in;
    int n_queued, max_queue;
    int flags_pending;       /* cancel/release requests waiting for a step */
    pthread_mutex_t mu, compute_mu;
    pthread_cond_t cv;       /* wakes the engine thread */
    pthread_cond_t done_cv;  /* wakes synchronous callers waiting on the engine */
    pthread_t thread;
    int engine_running, stop;
    int notify_rd, notify_wr;
    int notify_ext;          /* attached descriptor (dup owned by the engine), -1 = none */
    pthread_mutex_t ext_mu;  /* guards notify_ext: held around one non-blocking write */
    tl_cache_stats snap;     /* statistics published after each engine step */
    int weights_pending;
    tl_sched_msg *msgs;      /* pending messages (guarded by mu) */
    int n_msgs, cap_msgs;
    tl_evict_weights weights;
    int64_t next_id;
    tl_sampler smp;          /* shared scratch; per-request rng swapped in */
    float *logits;
    int logits_rows;
    /* device sampling staging (backend.h), one entry per logits row */
    tl_backend_sample *dev_smp;
    int32_t *dev_ids, *dev_pen;
    uint64_t *dev_rng;       /* each row's generator after its draw, kept if the token is */
    int dev_rows_cap, dev_pen_cap;
    int prefill_budget;      /* prompt tokens per step across requests */
    int64_t steps;           /* steps taken (the aging clock) */
    int aging_steps;         /* steps waited per priority level gained (> 0) */
    tl_pool **pools;         /* pools bound to this model, detached on close */
    int n_pools, cap_pools;
    tl_cache_stats st;       /* counters (the block fields are filled on read) */
} tl_sched;

int tl_sched_init(tl_model *m);
void tl_sched_free(tl_model *m);
/* One scheduler step (the caller holds compute_mu). Returns requests
 * still queued or running, or < 0. */
int tl_sched_step(tl_model *m);
/* Statistics computed now (the caller holds compute_mu). */
void tl_sched_stats_now(const tl_model *m, tl_cache_stats *o);

/* Applies the queued messages in order (the caller holds compute_mu, or no
 * engine thread runs). */
void tl_sched_apply_msgs(tl_model *m);
/* Queues msg for the engine thread and returns 1, or returns 0 with
 * nothing queued when no engine thread runs (the caller applies it
 * itself); TL_ERR_NOMEM when the queue cannot grow. */
int tl_sched_post_msg(tl_model *m, const tl_sched_msg *msg);
/* pool.c: frees the pool now (the caller holds compute_mu, or no engine
 * thread runs). */
void tl_pool_free_now(tl_pool *pool);

/* engine.c: compute lock for calls that touch the KV pool or tree while an
 * engine thread may be stepping; waits for a step boundary. */
void tl_sched_compute_lock(tl_model *m);
void tl_sched_compute_unlock(tl_model *m);
/* Blocks until request id has untaken tokens or has ended (engine mode). */
int tl_sched_wait_news(tl_model *m, int64_t id);
/* engine.c: runs one request to completion while the engine thread steps. */
int tl_engine_wait_run(tl_model *m, int64_t id, int32_t *out, int cap);
/* engine.c: writes ids to the notification descriptors (no-op without an
 * engine); for news that does not come from a step (tokenize jobs). */
void tl_engine_post_ids(tl_model *m, const int64_t *ids, int n);

/* Runs one request to completion, stepping the whole scheduler. Returns
 * generated count or an error; out receives the generated tokens. */
int tl_sched_run(tl_model *m, const int32_t *prompt, int n_prompt, const tl_generate_params *p, tl_pool *pool,
                 int32_t *out, int cap, int *n_cached);
/* Waits for request id (the engine thread steps it, or this thread steps
 * the scheduler), taking up to cap tokens into out (a full buffer cancels
 * the rest), then releases it. n_cached and pinned (a TL_RK_PIN's node,
 * pinned for the caller) may be NULL. Returns the count or an error. */
int tl_sched_wait(tl_model *m, int64_t id, int32_t *out, int cap, int *n_cached, tl_radix_node **pinned);
/* Queues a TL_RK_PIN request for tokens (checked by the caller). */
int tl_sched_submit_pin(tl_model *m, const int32_t *tokens, int n, int loops, int window, int64_t *id_out);
/* Queues a TL_RK_RESUME request for handle h (its prompt checked). */
int tl_sched_submit_resume(tl_model *m, const struct tl_prefix *h, const tl_generate_params *p, int64_t *id_out);
/* Ids in the vocab, at least one. */
int tl_sched_check_tokens(const tl_model *m, const int32_t *tokens, int n);
int tl_sched_check_prompt(const tl_model *m, const int32_t *prompt, int n_prompt, int max_tokens);

void tl_sched_attach_pool(tl_model *m, tl_pool *pool);
void tl_sched_detach_pool(tl_model *m, tl_pool *pool);
/* pool.c: the argument checks of register and register_submit (binds the
 * pool to m); TL_OK or the error with its message. */
int tl_pool_check_register(tl_model *m, tl_pool *pool, const int32_t *tokens, int n, int loops, int window);
/* pool.c: binds an unbound pool to m (error if bound to another model). */
int tl_pool_bind(tl_pool *pool, tl_model *m);
/* pool.c: the namespace salt and tenant of the pool's entries. */
void tl_pool_key(const tl_pool *pool, uint64_t *salt, int *tenant);
/* pool.c: adds a built entry whose node ends at n (pinning it), making room
 * by the pool's policy; a key already present only drops the new build.
 * Runs with the compute lock held. */
int tl_pool_add_built(tl_pool *pool, const int32_t *tokens, int n, int loops, int window, tl_radix_node *node);
/* pool.c: called by the model on close. */
void tl_pool_detach_model(tl_pool *pool);
/* pool.c: counts a lookup made through the pool. */
void tl_pool_count_lookup(tl_pool *pool);
/* pool.c: a request reused `matched` tokens along the path ending at node:
 * the entries (of any pool bound to m) pinning a node on that path are
 * used now (LRU, hits) and their pools count the hit. Runs in the
 * stepping thread. */
void tl_pool_attribute_hit(tl_model *m, const tl_radix_node *node, int matched);
/* pool.c: with scope TL_POOL_SCOPE_POOL, the length of the longest entry of
 * the pool that the prompt starts with in the request's namespace (0: none)
 * and its node in *node; -1 when the pool's scope is shared (match the
 * whole cache). */
int tl_pool_scoped_match(tl_pool *pool, const int32_t *prompt, int n, int loops, int window, uint64_t salt,
                         tl_radix_node **node);

/* Checks the KV / cache invariants (tests): every block's refcount equals
 * its holders (tree nodes, running sequences, extra holders in `extra`
 * given as block ids) and free + used = total. Returns 0 or -1 with a
 * message in tl_last_error(). */
int tl_sched_check_invariants(tl_model *m, const int32_t *extra, int n_extra);

#endif
