/* scheduler.h - the scheduler: continuous batching of every request kind over
 * the paged KV and the radix prefix cache (scheduler.c), the engine thread's
 * side of it (engine.c) and the locks. Internal. */
#ifndef TL_SCHED_H
#define TL_SCHED_H

#include <pthread.h>

#include "cache.h"
#include "model.h"
#include "request.h"
#include "sampler.h"

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

/* One forward pass's batch: parallel arrays, one entry per sequence (a
 * request's, or each live beam's), room for cap (grown only when a step
 * needs more than any before). */
typedef struct tl_batch {
    int cap;
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
    tl_batch batch;
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

/* Compute lock for calls that touch the KV pool or tree while an
 * engine thread may be stepping; waits for a step boundary. */
void tl_sched_compute_lock(tl_model *m);
void tl_sched_compute_unlock(tl_model *m);
/* engine.c: writes ids to the notification descriptors (no-op without an
 * engine); for news that does not come from a step (tokenize jobs). */
void tl_engine_post_ids(tl_model *m, const int64_t *ids, int n);

/* Runs one request to completion, stepping the whole scheduler. Returns
 * generated count or an error; out receives the generated tokens. */
int tl_sched_run(tl_model *m, const int32_t *prompt, int n_prompt, const tl_generate_params *p, tl_pool *pool,
                 int32_t *out, int cap, int *n_cached);
/* What a synchronous caller gets back besides the tokens. */
typedef struct tl_wait_result {
    int n_cached;          /* prompt tokens served by the cache */
    tl_radix_node *pinned; /* TL_RK_PIN: the node, pinned for the caller */
    tl_beam_result beam;   /* TL_RK_BEAM: the scores */
} tl_wait_result;
/* Waits for request id (the engine thread steps it, or this thread steps
 * the scheduler), taking up to cap tokens into out (a full buffer cancels
 * the rest), then releases it; res (may be NULL) is filled when the
 * request still exists. Returns the count or an error. */
int tl_sched_wait(tl_model *m, int64_t id, int32_t *out, int cap, tl_wait_result *res);

/* A pool being freed: requests in flight stop pointing at it (its pending
 * registrations still cache their prefix, unpinned). */
void tl_sched_forget_pool(tl_model *m, tl_pool *pool);

/* Checks the KV / cache invariants (tests): every block's refcount equals
 * its holders (tree nodes, running sequences, extra holders in `extra`
 * given as block ids) and free + used = total. Returns 0 or -1 with a
 * message in tl_last_error(). */
int tl_sched_check_invariants(tl_model *m, const int32_t *extra, int n_extra);

#endif
