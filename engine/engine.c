/* engine.c - the background scheduler thread and its notification pipe.
 *
 * Locks: `mu` (short: request lists and the fields callers read) and
 * `compute_mu` (held for a whole step, or by synchronous calls that touch
 * the KV pool or the radix tree). Lock order: compute_mu before mu. What a
 * request handler calls never waits on compute_mu: changes to state the
 * step owns (tenant budgets, freeing a pool) are messages the engine
 * applies between steps, and the attached notification descriptor has a
 * lock of its own (`ext_mu`, held around one non-blocking write). No
 * callback ever leaves the engine: news goes out as request ids written
 * to a pipe that an event loop (nginx cosocket, poll) can wait on. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "scheduler.h"
#include "util.h"

/* Writes the ids of requests with news; clears their flags. */
static void notify(tl_model *m, const tl_cache_stats *st) {
    tl_sched *s = m->sched;
    int64_t ids[256];
    pthread_mutex_lock(&s->mu);
    int n = 0;
    for (int i = 0; i < s->n; i++) {
        tl_request *r = s->reqs[i];
        if (!r->news) continue;
        r->news = 0;
        if (n == 256) {
            if (write(s->notify_wr, ids, sizeof ids) < 0 && errno != EAGAIN) break;
            n = 0;
        }
        ids[n++] = r->id;
    }
    s->snap = *st;
    pthread_cond_broadcast(&s->done_cv);
    pthread_mutex_unlock(&s->mu);
    /* A full pipe drops ids (EAGAIN): readers poll what they wait for. */
    if (n && write(s->notify_wr, ids, (size_t)n * sizeof *ids) < 0 && errno != EAGAIN) {
    }
    if (n) {
        pthread_mutex_lock(&s->ext_mu);
        if (s->notify_ext >= 0 && write(s->notify_ext, ids, (size_t)n * sizeof *ids) < 0 && errno != EAGAIN) {
        }
        pthread_mutex_unlock(&s->ext_mu);
    }
}

int tl_engine_notify_attach(tl_model *m, int fd) {
    if (!m || !m->sched) return tl_set_error(TL_ERR_INVALID_ARG, "model must not be NULL");
    tl_sched *s = m->sched;
    if (!s->engine_running) return tl_set_error(TL_ERR_STATE, "no engine thread is running");
    int dup_fd = -1;
    if (fd >= 0 && (dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0)) < 0)
        return tl_set_error(TL_ERR_IO, "cannot duplicate descriptor %d: %s", fd, strerror(errno));
    /* ext_mu, not compute_mu: it is held only around the engine's
     * non-blocking write, so a handler never waits for a step, and once
     * this returns the old descriptor gets no more writes. */
    pthread_mutex_lock(&s->ext_mu);
    int old = s->notify_ext;
    s->notify_ext = dup_fd;
    pthread_mutex_unlock(&s->ext_mu);
    if (old >= 0) close(old);
    return TL_OK;
}

static void *engine_main(void *p) {
    tl_model *m = p;
    tl_sched *s = m->sched;
    for (;;) {
        tl_cache_stats st;
        pthread_mutex_lock(&s->compute_mu);
        int active = tl_sched_step(m);
        tl_sched_stats_now(m, &st);
        pthread_mutex_unlock(&s->compute_mu);
        notify(m, &st);
        pthread_mutex_lock(&s->mu);
        while (!s->stop && active <= 0 && s->n_in == 0 && !s->flags_pending && !s->weights_pending &&
               s->n_msgs == 0)
            pthread_cond_wait(&s->cv, &s->mu);
        int stop = s->stop;
        pthread_mutex_unlock(&s->mu);
        if (stop) return NULL;
    }
}

int tl_engine_start(tl_model *m, int max_queue) {
    if (!m || !m->sched) return tl_set_error(TL_ERR_INVALID_ARG, "model must not be NULL");
    if (!m->arch) return tl_set_error(TL_ERR_STATE, "model was opened vocab_only; it cannot run an engine");
    tl_sched *s = m->sched;
    if (s->engine_running) return tl_set_error(TL_ERR_STATE, "the engine thread is already running");
    int fds[2];
    if (pipe(fds) != 0) return tl_set_error(TL_ERR_IO, "cannot create the notification pipe: %s", strerror(errno));
    for (int i = 0; i < 2; i++) {
        fcntl(fds[i], F_SETFL, fcntl(fds[i], F_GETFL) | O_NONBLOCK);
        fcntl(fds[i], F_SETFD, FD_CLOEXEC);
    }
    pthread_mutex_lock(&s->mu);
    s->notify_rd = fds[0];
    s->notify_wr = fds[1];
    s->max_queue = max_queue > 0 ? max_queue : 1024;
    s->stop = 0;
    s->engine_running = 1;
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_lock(&s->compute_mu);
    tl_sched_stats_now(m, &s->snap);
    pthread_mutex_unlock(&s->compute_mu);
    if (pthread_create(&s->thread, NULL, engine_main, m) != 0) {
        s->engine_running = 0;
        close(fds[0]);
        close(fds[1]);
        s->notify_rd = s->notify_wr = -1;
        return tl_set_error(TL_ERR_NOMEM, "cannot start the engine thread");
    }
    return TL_OK;
}

void tl_engine_stop(tl_model *m) {
    if (!m || !m->sched || !m->sched->engine_running) return;
    tl_sched *s = m->sched;
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    pthread_mutex_lock(&s->mu);
    s->engine_running = 0; /* messages posted from now on are applied by their callers */
    pthread_mutex_unlock(&s->mu);
    tl_sched_apply_msgs(m); /* those that came after the last step */
    pthread_mutex_lock(&s->mu);
    close(s->notify_rd);
    close(s->notify_wr);
    if (s->notify_ext >= 0) close(s->notify_ext);
    s->notify_rd = s->notify_wr = s->notify_ext = -1;
    pthread_cond_broadcast(&s->done_cv); /* synchronous waiters see the engine gone */
    pthread_mutex_unlock(&s->mu);
}

int tl_engine_notify_fd(const tl_model *m) { return m && m->sched ? m->sched->notify_rd : -1; }

void tl_engine_post_ids(tl_model *m, const int64_t *ids, int n) {
    tl_sched *s = m->sched;
    if (!s || n <= 0) return;
    /* Under mu: tl_engine_stop closes the pipe under it. */
    pthread_mutex_lock(&s->mu);
    if (s->engine_running) {
        if (write(s->notify_wr, ids, (size_t)n * sizeof *ids) < 0 && errno != EAGAIN) {
        }
        int ext = __atomic_load_n(&s->notify_ext, __ATOMIC_ACQUIRE);
        if (ext >= 0 && write(ext, ids, (size_t)n * sizeof *ids) < 0 && errno != EAGAIN) {
        }
    }
    pthread_mutex_unlock(&s->mu);
}
