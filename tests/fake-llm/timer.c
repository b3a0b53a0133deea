/* One thread that resumes suspended MHD connections when their time comes.
 *
 * Why: --latency-ms must not block MHD worker threads (benchmarks keep
 * 10,000 connections waiting at once), so a delayed reply is a suspended
 * connection plus an entry in this min-heap of wakeup times. */
#include "fakellm.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

struct wake {
    uint64_t due;
    struct MHD_Connection *conn;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv;
static struct wake *heap;
static size_t heap_n, heap_cap;
static bool stopping, running;
static pthread_t thread;

static void heap_push(struct wake w)
{
    if (heap_n == heap_cap) {
        heap_cap = heap_cap ? heap_cap * 2 : 1024;
        heap = xrealloc(heap, heap_cap * sizeof *heap);
    }
    size_t i = heap_n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (heap[parent].due <= w.due)
            break;
        heap[i] = heap[parent];
        i = parent;
    }
    heap[i] = w;
}

static struct wake heap_pop(void)
{
    struct wake top = heap[0];
    struct wake last = heap[--heap_n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= heap_n)
            break;
        if (c + 1 < heap_n && heap[c + 1].due < heap[c].due)
            c++;
        if (last.due <= heap[c].due)
            break;
        heap[i] = heap[c];
        i = c;
    }
    if (heap_n)
        heap[i] = last;
    return top;
}

static void *timer_main(void *arg)
{
    (void)arg;
    enum { BATCH = 256 };
    struct MHD_Connection *due[BATCH];

    pthread_mutex_lock(&mu);
    while (!stopping) {
        uint64_t now = now_ms();
        size_t n = 0;
        while (heap_n && heap[0].due <= now && n < BATCH)
            due[n++] = heap_pop().conn;
        if (n) {
            /* Resume outside our lock: MHD takes its own locks. */
            pthread_mutex_unlock(&mu);
            for (size_t i = 0; i < n; i++)
                MHD_resume_connection(due[i]);
            pthread_mutex_lock(&mu);
            continue;
        }
        if (!heap_n || heap[0].due == TIMER_NEVER) {
            pthread_cond_wait(&cv, &mu);
        } else {
            uint64_t wait = heap[0].due - now;
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            ts.tv_sec += (time_t)(wait / 1000);
            ts.tv_nsec += (long)(wait % 1000) * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&cv, &mu, &ts);
        }
    }
    pthread_mutex_unlock(&mu);
    return NULL;
}

void timer_start(void)
{
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&cv, &attr);
    pthread_condattr_destroy(&attr);
    stopping = false;
    if (pthread_create(&thread, NULL, timer_main, NULL) != 0)
        abort();
    running = true;
}

void timer_resume_at(struct MHD_Connection *conn, uint64_t due_ms)
{
    pthread_mutex_lock(&mu);
    if (stopping) {
        /* Shutting down: nobody would resume it later. */
        pthread_mutex_unlock(&mu);
        MHD_resume_connection(conn);
        return;
    }
    bool new_min = heap_n == 0 || due_ms < heap[0].due;
    heap_push((struct wake){due_ms, conn});
    if (new_min)
        pthread_cond_signal(&cv);
    pthread_mutex_unlock(&mu);
}

void timer_stop(void)
{
    if (!running)
        return;
    pthread_mutex_lock(&mu);
    stopping = true;
    pthread_cond_signal(&cv);
    pthread_mutex_unlock(&mu);
    pthread_join(thread, NULL);
    running = false;

    /* MHD forbids stopping the daemon with suspended connections: wake all
     * of them (the handlers see g_shutting_down and close). */
    pthread_mutex_lock(&mu);
    struct wake *pending = heap;
    size_t n = heap_n;
    heap = NULL;
    heap_n = heap_cap = 0;
    pthread_mutex_unlock(&mu);
    for (size_t i = 0; i < n; i++)
        MHD_resume_connection(pending[i].conn);
    free(pending);
    pthread_cond_destroy(&cv);
}
