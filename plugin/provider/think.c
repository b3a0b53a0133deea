/* think.c -- see think.h. */
#include "provider/think.h"

#include <string.h>

enum { THINK_DECIDE, THINK_IN, THINK_AFTER, THINK_PASS };

static const char OPEN[] = "<think>", CLOSE[] = "</think>";
#define OPEN_LEN (sizeof OPEN - 1)
#define CLOSE_LEN (sizeof CLOSE - 1)

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

void think_init(think_filter *f, think_out_fn out, void *ud)
{
    memset(f, 0, sizeof *f);
    f->state = THINK_DECIDE;
    f->out = out;
    f->ud = ud;
}

static void emit(think_filter *f, int is_reasoning, const char *s, size_t n)
{
    if (n)
        f->out(f->ud, is_reasoning, s, n);
}

/* Longest suffix of s[0..n) that is a proper prefix of CLOSE. */
static size_t close_prefix_suffix(const char *s, size_t n)
{
    for (size_t k = n < CLOSE_LEN - 1 ? n : CLOSE_LEN - 1; k > 0; k--)
        if (memcmp(s + n - k, CLOSE, k) == 0)
            return k;
    return 0;
}

static void feed_in(think_filter *f, const char *s, size_t n);
static void feed_after(think_filter *f, const char *s, size_t n);

/* Inside the reasoning: emit it, holding back what may be the start of CLOSE. */
static void feed_in(think_filter *f, const char *s, size_t n)
{
    pbuf_append(&f->held, s, n);
    if (f->held.oom || f->held.len == 0)
        return;
    char *end = f->held.len >= CLOSE_LEN ? memmem(f->held.data, f->held.len, CLOSE, CLOSE_LEN)
                                         : NULL;
    if (end) {
        size_t before = (size_t)(end - f->held.data);
        emit(f, 1, f->held.data, before);
        pbuf rest = f->held;
        f->held = (pbuf)PBUF_INIT;
        f->state = THINK_AFTER;
        feed_after(f, rest.data + before + CLOSE_LEN, rest.len - before - CLOSE_LEN);
        pbuf_free(&rest);
        return;
    }
    size_t keep = close_prefix_suffix(f->held.data, f->held.len);
    emit(f, 1, f->held.data, f->held.len - keep);
    memmove(f->held.data, f->held.data + f->held.len - keep, keep);
    f->held.len = keep;
    f->held.data[keep] = '\0';
}

/* After CLOSE: the whitespace separating reasoning from the answer is dropped. */
static void feed_after(think_filter *f, const char *s, size_t n)
{
    while (n && is_ws(*s))
        s++, n--;
    if (!n)
        return;
    f->state = THINK_PASS;
    emit(f, 0, s, n);
}

/* At the start: hold whitespace and what may still become OPEN. */
static void feed_decide(think_filter *f, const char *s, size_t n)
{
    pbuf_append(&f->held, s, n);
    if (f->held.oom)
        return;
    size_t ws = 0;
    while (ws < f->held.len && is_ws(f->held.data[ws]))
        ws++;
    size_t rest = f->held.len - ws;
    size_t cmp = rest < OPEN_LEN ? rest : OPEN_LEN;
    if (memcmp(f->held.data + ws, OPEN, cmp) != 0) { /* not a think block: all text */
        f->state = THINK_PASS;
        emit(f, 0, f->held.data, f->held.len);
        pbuf_reset(&f->held);
        return;
    }
    if (rest < OPEN_LEN)
        return; /* could still be "<think>" */
    pbuf held = f->held;
    f->held = (pbuf)PBUF_INIT;
    f->state = THINK_IN;
    feed_in(f, held.data + ws + OPEN_LEN, held.len - ws - OPEN_LEN);
    pbuf_free(&held);
}

void think_feed(think_filter *f, const char *text, size_t len)
{
    switch (f->state) {
    case THINK_DECIDE: feed_decide(f, text, len); break;
    case THINK_IN: feed_in(f, text, len); break;
    case THINK_AFTER: feed_after(f, text, len); break;
    default: emit(f, 0, text, len); break;
    }
}

void think_finish(think_filter *f)
{
    if (f->held.len)
        emit(f, f->state == THINK_IN, f->held.data, f->held.len);
    pbuf_reset(&f->held);
}

int think_oom(const think_filter *f) { return f->held.oom; }

void think_free(think_filter *f) { pbuf_free(&f->held); }
