/*
 * timer_heap.h -- an indexed binary min-heap of deadlines, owned by the
 * worker thread.  Timers are embedded in the objects they belong to (no
 * allocation per timer) and know their heap slot, so cancelling one is
 * O(log n) and a freed object can always take its timers out first.
 */
#ifndef PARLEY_TIMER_HEAP_H
#define PARLEY_TIMER_HEAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct ptimer {
    uint64_t when_ms; /* monotonic */
    size_t slot;      /* index in the heap; TIMER_IDLE when not armed */
    void *owner;      /* what the timer belongs to, for whoever pops it */
} ptimer;

#define TIMER_IDLE ((size_t)-1)
#define PTIMER_INIT(owner) {0, TIMER_IDLE, (owner)}

typedef struct timer_heap {
    ptimer **items;
    size_t count, cap;
} timer_heap;

/* Arm (or re-arm) t for when_ms.  Returns 0, or -1 on OOM (t stays idle). */
int timer_arm(timer_heap *h, ptimer *t, uint64_t when_ms);
void timer_disarm(timer_heap *h, ptimer *t);
static inline int timer_armed(const ptimer *t) { return t->slot != TIMER_IDLE; }
/* The earliest timer due at now_ms, removed from the heap; NULL when none is due. */
ptimer *timer_pop_due(timer_heap *h, uint64_t now_ms);
/* ms until the earliest deadline (0 if past), or -1 when the heap is empty. */
int64_t timer_next_in(const timer_heap *h, uint64_t now_ms);
void timer_heap_free(timer_heap *h);

#endif
