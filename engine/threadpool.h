/* threadpool.h - a persistent pool of compute workers.
 *
 * tl_threadpool_run(tp, fn, ctx, n) calls fn(ctx, i, n) for i in [0, n)
 * across the workers plus the calling thread, and returns when all are
 * done. Workers spin briefly between jobs (a forward pass issues many small
 * jobs back to back, and a condition-variable wake costs more than a small
 * matmul), then sleep. One caller at a time. */
#ifndef TL_THREADPOOL_H
#define TL_THREADPOOL_H

typedef struct tl_threadpool tl_threadpool;
typedef void (*tl_task_fn)(void *ctx, int ith, int nth);

/* n_threads counts the caller: 1 means no worker threads. NULL on failure. */
tl_threadpool *tl_threadpool_new(int n_threads);
void tl_threadpool_free(tl_threadpool *tp);
int tl_threadpool_size(const tl_threadpool *tp);
/* Runs fn(ctx, ith, nth) for ith in [0, nth), nth = min(n_tasks, size). */
void tl_threadpool_run(tl_threadpool *tp, tl_task_fn fn, void *ctx, int n_tasks);

/* Online CPU count (at least 1). */
int tl_cpu_count(void);

#endif
