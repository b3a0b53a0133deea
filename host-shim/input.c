/*
 * input.c -- reading stdin line by line without ever missing a signal.
 *
 * SIGINT/SIGTERM are blocked in every thread and taken by a sigwait thread
 * (main.c), which makes g_shim.wake_fd readable.  Blocking reads therefore
 * poll() stdin together with that pipe instead of sitting in read(), which a
 * signal could not interrupt reliably.
 */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "shim.h"

#define RBUF_SIZE 65536

int shim_interrupted(void) { return atomic_load(&g_shim.interrupted) != 0; }

int lr_init(struct line_reader *lr, int fd)
{
    memset(lr, 0, sizeof *lr);
    lr->fd = fd;
    lr->rbuf = malloc(RBUF_SIZE);
    lr->cap = 4096;
    lr->line = malloc(lr->cap);
    if (!lr->rbuf || !lr->line) {
        lr_free(lr);
        return -1;
    }
    return 0;
}

void lr_free(struct line_reader *lr)
{
    free(lr->rbuf);
    free(lr->line);
    lr->rbuf = lr->line = NULL;
}

/* Append to the current line, or just count it once past the limit: an
 * over-long line is consumed but never stored whole. */
static int lr_append(struct line_reader *lr, const char *p, size_t n)
{
    if (lr->too_long)
        return 0;
    /* +1: room for the '\r' of a CRLF line, stripped in lr_next. */
    if (lr->len + n > SHIM_MAX_LINE + 1) {
        lr->too_long = 1;
        lr->len = 0;
        return 0;
    }
    if (lr->len + n + 1 > lr->cap) {
        size_t cap = lr->cap;
        while (cap < lr->len + n + 1)
            cap *= 2;
        char *nl = realloc(lr->line, cap);
        if (!nl)
            return -1;
        lr->line = nl;
        lr->cap = cap;
    }
    memcpy(lr->line + lr->len, p, n);
    lr->len += n;
    return 0;
}

/* Wait until fd is readable; -1 if a signal asked us to stop. */
static int wait_readable(int fd)
{
    struct pollfd p[2] = {{.fd = fd, .events = POLLIN}, {.fd = g_shim.wake_fd, .events = POLLIN}};
    for (;;) {
        if (shim_interrupted())
            return -1;
        int r = poll(p, 2, -1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return 0; /* let read() report the problem */
        if (p[1].revents)
            return -1;
        return 0;
    }
}

enum lr_status lr_next(struct line_reader *lr)
{
    lr->len = 0;
    lr->too_long = 0;
    int have = 0; /* bytes of this line seen (an unterminated last line counts) */
    for (;;) {
        if (lr->rpos < lr->rlen) {
            char *start = lr->rbuf + lr->rpos;
            size_t avail = lr->rlen - lr->rpos;
            char *nl = memchr(start, '\n', avail);
            size_t n = nl ? (size_t)(nl - start) : avail;
            if (lr_append(lr, start, n) < 0)
                return LR_EOF; /* OOM: stop reading; the caller ends cleanly */
            have = 1;
            lr->rpos += nl ? n + 1 : n;
            if (nl)
                break;
            continue;
        }
        if (lr->eof) {
            if (!have)
                return LR_EOF;
            break;
        }
        if (wait_readable(lr->fd) < 0)
            return LR_INTERRUPTED;
        ssize_t r = read(lr->fd, lr->rbuf, RBUF_SIZE);
        if (r < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (r <= 0) {
            lr->eof = 1;
            continue;
        }
        lr->rpos = 0;
        lr->rlen = (size_t)r;
    }
    if (!lr->too_long && lr->len > 0 && lr->line[lr->len - 1] == '\r')
        lr->len--; /* CRLF line ending */
    if (lr->len > SHIM_MAX_LINE) {
        lr->too_long = 1;
        lr->len = 0;
    }
    lr->line[lr->len] = '\0';
    return LR_LINE;
}

int shim_sleep_ms(long ms)
{
    struct pollfd p = {.fd = g_shim.wake_fd, .events = POLLIN};
    struct timespec end, now;
    clock_gettime(CLOCK_MONOTONIC, &end);
    end.tv_sec += ms / 1000;
    end.tv_nsec += (ms % 1000) * 1000000L;
    if (end.tv_nsec >= 1000000000L) {
        end.tv_sec++;
        end.tv_nsec -= 1000000000L;
    }
    for (;;) {
        if (shim_interrupted())
            return -1;
        clock_gettime(CLOCK_MONOTONIC, &now);
        long long left_ns =
            (long long)(end.tv_sec - now.tv_sec) * 1000000000LL + (end.tv_nsec - now.tv_nsec);
        if (left_ns <= 0)
            return 0;
        long long left = (left_ns + 999999) / 1000000; /* round up: never wake early */
        int r = poll(&p, 1, left > 60000 ? 60000 : (int)left);
        if (r > 0)
            return -1;
    }
}
