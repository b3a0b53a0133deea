/* timer_heap.c -- see timer_heap.h. */
#include "engine/timer_heap.h"

#include <stdlib.h>

static void place(timer_heap *h, size_t i, ptimer *t)
{
    h->items[i] = t;
    t->slot = i;
}

static void sift_up(timer_heap *h, size_t i)
{
    ptimer *t = h->items[i];
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (h->items[parent]->when_ms <= t->when_ms)
            break;
        place(h, i, h->items[parent]);
        i = parent;
    }
    place(h, i, t);
}

static void sift_down(timer_heap *h, size_t i)
{
    ptimer *t = h->items[i];
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= h->count)
            break;
        if (child + 1 < h->count && h->items[child + 1]->when_ms < h->items[child]->when_ms)
            child++;
        if (t->when_ms <= h->items[child]->when_ms)
            break;
        place(h, i, h->items[child]);
        i = child;
    }
    place(h, i, t);
}

void timer_disarm(timer_heap *h, ptimer *t)
{
    if (t->slot == TIMER_IDLE)
        return;
    size_t i = t->slot;
    t->slot = TIMER_IDLE;
    h->count--;
    if (i == h->count)
        return;
    ptimer *moved = h->items[h->count];
    place(h, i, moved);
    sift_up(h, i);
    sift_down(h, moved->slot);
}

int timer_arm(timer_heap *h, ptimer *t, uint64_t when_ms)
{
    timer_disarm(h, t);
    if (h->count == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 64;
        ptimer **items = realloc(h->items, cap * sizeof *items);
        if (!items)
            return -1;
        h->items = items;
        h->cap = cap;
    }
    t->when_ms = when_ms;
    place(h, h->count++, t);
    sift_up(h, t->slot);
    return 0;
}

ptimer *timer_pop_due(timer_heap *h, uint64_t now_ms)
{
    if (h->count == 0 || h->items[0]->when_ms > now_ms)
        return NULL;
    ptimer *t = h->items[0];
    timer_disarm(h, t);
    return t;
}

int64_t timer_next_in(const timer_heap *h, uint64_t now_ms)
{
    if (h->count == 0)
        return -1;
    uint64_t when = h->items[0]->when_ms;
    return when <= now_ms ? 0 : (int64_t)(when - now_ms);
}

void timer_heap_free(timer_heap *h)
{
    free(h->items);
    h->items = NULL;
    h->count = h->cap = 0;
}
