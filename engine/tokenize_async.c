/* tokenize_async.c - tokenization jobs on a thread of their own, so that an
 * event loop never tokenizes a large prompt itself (a megabyte takes about
 * a second).
 *
 * One thread per model, started by the first job, takes queued jobs in
 * submission order. A job owns a copy of its input; its ids stay until the
 * caller takes them or releases the job. News goes out like a request's:
 * the job's (negative) id on the engine's notification descriptors. The
 * tokenizer is immutable, so jobs run alongside the engine thread and any
 * synchronous tl_tokenize call. */
#include "tokenize_async.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "model.h"
#include "scheduler.h"
#include "util.h"

enum { JOB_QUEUED, JOB_RUNNING, JOB_DONE, JOB_FAILED };

/* Jobs waiting to run before submit answers TL_ERR_BUSY: each holds a copy
 * of its input (a megabyte, say), so a flood must not queue without end. */
#define TOKQ_MAX_QUEUED 64

typedef struct tok_job {
    int64_t id;
    int state, released;
    int is_chat, add_special, parse_special;
    char *text;              /* plain text input (is_chat == 0) */
    size_t len;
    tl_chat_rendered chat;   /* is_chat */
    int32_t *ids;
    int n_ids;
    int err;
    char msg[256];
    struct tok_job *next;
} tok_job;

struct tl_tokq {
    tl_model *model;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int started, stop;
    tok_job *head, *tail;    /* every live job, oldest first */
    int n_queued;
    int64_t next_id;         /* counts down from -1 */
};

static void job_free(tok_job *j) {
    free(j->text);
    tl_chat_rendered_free(&j->chat);
    free(j->ids);
    free(j);
}

static void unlink_job(struct tl_tokq *q, tok_job *j) {
    tok_job **p = &q->head, *prev = NULL;
    while (*p && *p != j) prev = *p, p = &(*p)->next;
    if (!*p) return;
    *p = j->next;
    if (q->tail == j) q->tail = prev;
}

static void run_job(tl_model *m, tok_job *j) {
    size_t len = j->is_chat ? j->chat.len : j->len;
    /* A generous bound (a byte never gives more than 3 ids), shrunk after. */
    size_t cap = 3 * len + 8;
    int32_t *ids = cap <= (size_t)INT32_MAX ? malloc(cap * sizeof *ids) : NULL;
    int n;
    if (!ids) {
        n = tl_set_error(TL_ERR_NOMEM, "tokenize job: out of memory for %zu ids", cap);
    } else if (j->is_chat) {
        n = tl_chat_encode_rendered(m, &j->chat, ids, (int)cap);
    } else {
        n = tl_tokenizer_encode(m->tok, j->text, j->len, j->add_special, j->parse_special, ids, (int)cap);
    }
    if (n >= 0) {
        int32_t *fit = realloc(ids, ((size_t)n + 1) * sizeof *ids);
        j->ids = fit ? fit : ids;
        j->n_ids = n;
    } else {
        free(ids);
        j->err = n;
        if (n >= TL_ERR_BUSY) { /* a status code: the bound leaves no -(needed) */
            snprintf(j->msg, sizeof j->msg, "%s", tl_last_error());
        } else {
            j->err = TL_ERR_BUFFER;
            snprintf(j->msg, sizeof j->msg, "tokenize job: %d ids exceed the bound of %zu", -n, cap);
        }
    }
}

static void *tokq_main(void *p) {
    struct tl_tokq *q = p;
    tl_model *m = q->model;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        tok_job *j = q->head;
        while (j && j->state != JOB_QUEUED) j = j->next;
        if (!j) {
            if (q->stop) break;
            pthread_cond_wait(&q->cv, &q->mu);
            continue;
        }
        j->state = JOB_RUNNING;
        q->n_queued--;
        pthread_mutex_unlock(&q->mu);
        run_job(m, j);
        pthread_mutex_lock(&q->mu);
        j->state = j->err ? JOB_FAILED : JOB_DONE;
        int64_t id = j->id;
        if (j->released) {
            unlink_job(q, j);
            job_free(j);
        } else {
            pthread_mutex_unlock(&q->mu);
            tl_engine_post_ids(m, &id, 1);
            pthread_mutex_lock(&q->mu);
        }
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

static struct tl_tokq *tokq_of(const tl_model *m) { return __atomic_load_n(&m->tokq, __ATOMIC_ACQUIRE); }

/* The queue, created (with its thread) on first use. With an engine the
 * model may be called from any thread, so creation is serialised (once per
 * model: a process-wide lock is cheap enough). tl_model_close must not
 * race a submit. */
static struct tl_tokq *tokq_get(tl_model *m) {
    static pthread_mutex_t create_mu = PTHREAD_MUTEX_INITIALIZER;
    struct tl_tokq *q = tokq_of(m);
    if (q) return q;
    pthread_mutex_lock(&create_mu);
    q = tokq_of(m);
    if (!q && (q = calloc(1, sizeof *q)) != NULL) {
        pthread_mutex_init(&q->mu, NULL);
        pthread_cond_init(&q->cv, NULL);
        q->next_id = -1;
        q->model = m;
        if (pthread_create(&q->thread, NULL, tokq_main, q) != 0) {
            pthread_cond_destroy(&q->cv);
            pthread_mutex_destroy(&q->mu);
            free(q);
            q = NULL;
        } else {
            q->started = 1;
            __atomic_store_n(&m->tokq, q, __ATOMIC_RELEASE);
        }
    }
    pthread_mutex_unlock(&create_mu);
    return q;
}

static int enqueue(tl_model *m, tok_job *j, int64_t *id_out) {
    struct tl_tokq *q = tokq_get(m);
    if (!q) {
        job_free(j);
        return tl_set_error(TL_ERR_NOMEM, "cannot start the tokenizer thread");
    }
    pthread_mutex_lock(&q->mu);
    if (q->n_queued >= TOKQ_MAX_QUEUED) {
        pthread_mutex_unlock(&q->mu);
        job_free(j);
        return tl_set_error(TL_ERR_BUSY, "the tokenizer queue is full (%d jobs waiting); retry later",
                            TOKQ_MAX_QUEUED);
    }
    q->n_queued++;
    j->id = q->next_id--;
    if (q->tail) q->tail->next = j;
    else q->head = j;
    q->tail = j;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
    *id_out = j->id;
    return TL_OK;
}

int tl_tokenize_submit(tl_model *m, const char *text, int len, int add_special, int parse_special,
                       int64_t *id_out) {
    if (!m || (!text && len > 0) || len < 0 || !id_out)
        return tl_set_error(TL_ERR_INVALID_ARG, "tl_tokenize_submit: bad arguments (len %d)", len);
    tok_job *j = calloc(1, sizeof *j);
    if (j) j->text = malloc((size_t)len + 1);
    if (!j || !j->text) {
        free(j);
        return tl_set_error(TL_ERR_NOMEM, "tl_tokenize_submit: out of memory for %d bytes", len);
    }
    if (len) memcpy(j->text, text, (size_t)len);
    j->len = (size_t)len;
    j->add_special = add_special;
    j->parse_special = parse_special;
    return enqueue(m, j, id_out);
}

int tl_chat_tokenize_submit(tl_model *m, const tl_chat_message *msgs, int n, int add_assistant, int64_t *id_out) {
    if (!m || !id_out) return tl_set_error(TL_ERR_INVALID_ARG, "tl_chat_tokenize_submit: bad arguments");
    tok_job *j = calloc(1, sizeof *j);
    if (!j) return tl_set_error(TL_ERR_NOMEM, "tl_chat_tokenize_submit: out of memory");
    int rc = tl_chat_render(m, msgs, n, add_assistant, &j->chat);
    if (rc) {
        free(j);
        return rc;
    }
    j->is_chat = 1;
    return enqueue(m, j, id_out);
}

static tok_job *find(struct tl_tokq *q, int64_t id) {
    tok_job *j = q->head;
    while (j && (j->id != id || j->released)) j = j->next;
    return j;
}

int tl_tokenize_take(tl_model *m, int64_t id, int32_t *out, int cap, int *n_out) {
    if (!m || !n_out || cap < 0 || (cap > 0 && !out))
        return tl_set_error(TL_ERR_INVALID_ARG, "tl_tokenize_take: bad arguments (cap %d)", cap);
    *n_out = -1;
    struct tl_tokq *q = tokq_of(m);
    if (!q) return tl_set_error(TL_ERR_INVALID_ARG, "no tokenize job %lld", (long long)id);
    pthread_mutex_lock(&q->mu);
    tok_job *j = find(q, id);
    int rc = TL_OK;
    if (!j) {
        rc = tl_set_error(TL_ERR_INVALID_ARG, "no tokenize job %lld", (long long)id);
    } else if (j->state == JOB_FAILED) {
        rc = tl_set_error(j->err, "%s", j->msg);
        unlink_job(q, j);
        job_free(j);
    } else if (j->state == JOB_DONE) {
        *n_out = j->n_ids;
        if (cap < j->n_ids) {
            rc = tl_set_error(TL_ERR_BUFFER, "tokenize job %lld has %d ids, the buffer holds %d", (long long)id,
                              j->n_ids, cap);
        } else {
            if (j->n_ids) memcpy(out, j->ids, (size_t)j->n_ids * sizeof *out);
            unlink_job(q, j);
            job_free(j);
        }
    }
    pthread_mutex_unlock(&q->mu);
    return rc;
}

int tl_tokenize_release(tl_model *m, int64_t id) {
    if (!m) return tl_set_error(TL_ERR_INVALID_ARG, "model must not be NULL");
    struct tl_tokq *q = tokq_of(m);
    if (!q) return tl_set_error(TL_ERR_INVALID_ARG, "no tokenize job %lld", (long long)id);
    pthread_mutex_lock(&q->mu);
    tok_job *j = find(q, id);
    if (j && j->state == JOB_RUNNING) {
        j->released = 1; /* the thread frees it when it ends */
    } else if (j) {
        if (j->state == JOB_QUEUED) q->n_queued--;
        unlink_job(q, j);
        job_free(j);
    }
    pthread_mutex_unlock(&q->mu);
    return j ? TL_OK : tl_set_error(TL_ERR_INVALID_ARG, "no tokenize job %lld", (long long)id);
}

void tl_tokq_free(tl_model *m) {
    struct tl_tokq *q = m ? m->tokq : NULL;
    if (!q) return;
    pthread_mutex_lock(&q->mu);
    q->stop = 1;
    /* queued jobs are dropped; the running one finishes first */
    for (tok_job *j = q->head; j; j = j->next)
        if (j->state == JOB_QUEUED) j->state = JOB_FAILED;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
    if (q->started) pthread_join(q->thread, NULL);
    while (q->head) {
        tok_job *j = q->head;
        q->head = j->next;
        job_free(j);
    }
    pthread_cond_destroy(&q->cv);
    pthread_mutex_destroy(&q->mu);
    free(q);
    m->tokq = NULL;
}
