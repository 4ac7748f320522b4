#include "threadpool.h"

#include <pthread.h>
#include <sched.h> /* sched_yield */
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#define SPIN_ITERS 20000

struct tl_threadpool {
    int n;                     /* threads including the caller */
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_int generation;     /* bumped per job; workers wait for a change */
    atomic_int pending;        /* workers still running the current job */
    atomic_int stop;
    int sleepers;              /* guarded by mu */
    tl_task_fn fn;
    void *ctx;
    int nth;
};

typedef struct { tl_threadpool *tp; int ith; } worker_arg;

/* One round of waiting: pause while a wake-up is likely soon, then yield
 * the core (on a loaded machine the thread we wait for may need it). */
static void backoff(int spins) {
    if (spins < 2000) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    } else {
        sched_yield();
    }
}

static void *worker_main(void *p) {
    worker_arg *wa = p;
    tl_threadpool *tp = wa->tp;
    int ith = wa->ith;
    free(wa);
    int seen = 0;
    for (;;) {
        int gen;
        int spins = 0;
        while ((gen = atomic_load_explicit(&tp->generation, memory_order_acquire)) == seen &&
               !atomic_load(&tp->stop)) {
            if (++spins < SPIN_ITERS) {
                backoff(spins);
                continue;
            }
            pthread_mutex_lock(&tp->mu);
            tp->sleepers++;
            while (atomic_load(&tp->generation) == seen && !atomic_load(&tp->stop))
                pthread_cond_wait(&tp->cv, &tp->mu);
            tp->sleepers--;
            pthread_mutex_unlock(&tp->mu);
            spins = 0;
        }
        if (atomic_load(&tp->stop)) return NULL;
        seen = gen;
        if (ith < tp->nth) tp->fn(tp->ctx, ith, tp->nth);
        atomic_fetch_sub_explicit(&tp->pending, 1, memory_order_acq_rel);
    }
}

int tl_cpu_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (int)n;
}

tl_threadpool *tl_threadpool_new(int n_threads) {
    tl_threadpool *tp = calloc(1, sizeof *tp);
    if (!tp) return NULL;
    if (n_threads < 1) n_threads = 1;
    tp->n = n_threads;
    pthread_mutex_init(&tp->mu, NULL);
    pthread_cond_init(&tp->cv, NULL);
    tp->threads = calloc((size_t)n_threads, sizeof *tp->threads);
    if (!tp->threads) { free(tp); return NULL; }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (wa) {
            wa->tp = tp;
            wa->ith = i;
        }
        if (!wa || pthread_create(&tp->threads[i], NULL, worker_main, wa) != 0) {
            free(wa);
            tp->n = i; /* join only the ones started */
            tl_threadpool_free(tp);
            return NULL;
        }
    }
    return tp;
}

void tl_threadpool_free(tl_threadpool *tp) {
    if (!tp) return;
    atomic_store(&tp->stop, 1);
    pthread_mutex_lock(&tp->mu);
    pthread_cond_broadcast(&tp->cv);
    pthread_mutex_unlock(&tp->mu);
    for (int i = 1; i < tp->n; i++) pthread_join(tp->threads[i], NULL);
    pthread_mutex_destroy(&tp->mu);
    pthread_cond_destroy(&tp->cv);
    free(tp->threads);
    free(tp);
}

int tl_threadpool_size(const tl_threadpool *tp) { return tp ? tp->n : 1; }

void tl_threadpool_run(tl_threadpool *tp, tl_task_fn fn, void *ctx, int n_tasks) {
    if (n_tasks < 1) return;
    int nth = (!tp || n_tasks < tp->n) ? n_tasks : tp->n;
    if (!tp || tp->n == 1 || nth == 1) {
        for (int i = 0; i < nth; i++) fn(ctx, i, nth);
        return;
    }
    tp->fn = fn;
    tp->ctx = ctx;
    tp->nth = nth;
    atomic_store_explicit(&tp->pending, tp->n - 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&tp->generation, 1, memory_order_release);
    pthread_mutex_lock(&tp->mu);
    if (tp->sleepers) pthread_cond_broadcast(&tp->cv);
    pthread_mutex_unlock(&tp->mu);
    fn(ctx, 0, nth);
    for (int spins = 0; atomic_load_explicit(&tp->pending, memory_order_acquire) > 0; spins++) backoff(spins);
}
