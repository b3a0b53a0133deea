/*
 * alloc_count.c -- counts heap allocations for parley-bench's counting pass.
 *
 * Built as a shared library that `parley-bench --count-allocs` puts in
 * LD_PRELOAD (it re-executes itself with it), so the timing runs never carry
 * it.  Its malloc, calloc, realloc, free and the aligned allocators replace
 * glibc's for the whole process (glibc's own internal callers included) and
 * forward to glibc's allocator (__libc_malloc and friends), counting calls
 * and requested bytes while counting is switched on.  The bench finds
 * parley_bench_alloc_* with dlsym(RTLD_DEFAULT): absent, nothing is counted.
 *
 * Counted: every malloc, calloc, realloc, posix_memalign, aligned_alloc,
 * memalign, valloc and pvalloc call (one allocation each; realloc counts
 * whether it moves or not), and the bytes each asked for.  free is counted
 * apart.  Every thread counts, with relaxed atomics.
 *
 * Live bytes: with PARLEY_BENCH_ALLOC_LIVE=1 in the environment it also
 * keeps the bytes live in glibc's chunks (malloc_usable_size, whoever
 * allocated them, counted from process start) and their peak while counting
 * is on, and prints them to stderr when the window closes: what a measured
 * window held at most, beside the RSS the bench reports (which adds
 * fragmentation and the allocator's own overhead).  parley_bench_alloc_live
 * reads them at any moment (the bench's timeline of scenario 2).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* strcasestr, memalign */
#endif
#include <errno.h>
#include <malloc.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

void *__libc_malloc(size_t size);
void *__libc_calloc(size_t n, size_t size);
void *__libc_realloc(void *p, size_t size);
void __libc_free(void *p);
void *__libc_memalign(size_t alignment, size_t size);
void *__libc_valloc(size_t size);
void *__libc_pvalloc(size_t size);

#define EXPORT __attribute__((visibility("default")))

EXPORT void parley_bench_alloc_counting(int on);
EXPORT void parley_bench_alloc_read(long *allocs, long *frees, long *bytes);
EXPORT long parley_bench_alloc_live(void);

static atomic_int counting;
static atomic_long n_allocs, n_frees, n_bytes;
static atomic_int track_live = -1; /* -1: not read yet */
static atomic_long live_bytes, live_at_open, live_peak;

static int live_on(void)
{
    int on = atomic_load_explicit(&track_live, memory_order_relaxed);
    if (on < 0) { /* getenv allocates nothing: safe inside malloc */
        const char *v = getenv("PARLEY_BENCH_ALLOC_LIVE");
        on = v && *v == '1';
        atomic_store_explicit(&track_live, on, memory_order_relaxed);
    }
    return on;
}

/* p was just allocated (or reallocated from a block of old_usable bytes). */
static inline void live_add(void *p, size_t old_usable)
{
    if (!live_on())
        return;
    long delta = (long)(p ? malloc_usable_size(p) : 0) - (long)old_usable;
    long now = atomic_fetch_add_explicit(&live_bytes, delta, memory_order_relaxed) + delta;
    if (!atomic_load_explicit(&counting, memory_order_relaxed))
        return;
    long peak = atomic_load_explicit(&live_peak, memory_order_relaxed);
    while (now > peak && !atomic_compare_exchange_weak(&live_peak, &peak, now)) {
    }
}

static inline size_t usable(void *p) { return p && live_on() ? malloc_usable_size(p) : 0; }

static inline void count(size_t bytes)
{
    if (atomic_load_explicit(&counting, memory_order_relaxed)) {
        atomic_fetch_add_explicit(&n_allocs, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&n_bytes, (long)bytes, memory_order_relaxed);
    }
}

/* ---- the bench's interface ----------------------------------------------- */

/* Zero the counters and start (on != 0) or stop counting. */
EXPORT void parley_bench_alloc_counting(int on)
{
    if (on) {
        atomic_store(&n_allocs, 0);
        atomic_store(&n_frees, 0);
        atomic_store(&n_bytes, 0);
        atomic_store(&live_at_open, atomic_load(&live_bytes));
        atomic_store(&live_peak, atomic_load(&live_bytes));
    }
    atomic_store(&counting, on);
    if (!on && live_on() && atomic_load(&live_peak)) /* the window closed */
        fprintf(stderr, "alloc_count: live heap at window open %ld B, peak in window %ld B "
                        "(+%ld B), at close %ld B\n",
                atomic_load(&live_at_open), atomic_load(&live_peak),
                atomic_load(&live_peak) - atomic_load(&live_at_open), atomic_load(&live_bytes));
}

EXPORT void parley_bench_alloc_read(long *allocs, long *frees, long *bytes)
{
    *allocs = atomic_load(&n_allocs);
    *frees = atomic_load(&n_frees);
    *bytes = atomic_load(&n_bytes);
}

/* The bytes live in glibc's chunks now (0 without PARLEY_BENCH_ALLOC_LIVE=1). */
EXPORT long parley_bench_alloc_live(void) { return atomic_load(&live_bytes); }

/* ---- the allocator, forwarded ----------------------------------------------- */

EXPORT void *malloc(size_t size)
{
    count(size);
    void *p = __libc_malloc(size);
    live_add(p, 0);
    return p;
}

EXPORT void *calloc(size_t n, size_t size)
{
    count(n * size);
    void *p = __libc_calloc(n, size);
    live_add(p, 0);
    return p;
}

EXPORT void *realloc(void *p, size_t size)
{
    count(size);
    size_t old = usable(p);
    void *q = __libc_realloc(p, size);
    if (q || size == 0)
        live_add(q, old);
    return q;
}

EXPORT void free(void *p)
{
    if (p && atomic_load_explicit(&counting, memory_order_relaxed))
        atomic_fetch_add_explicit(&n_frees, 1, memory_order_relaxed);
    if (p && live_on())
        atomic_fetch_sub_explicit(&live_bytes, (long)malloc_usable_size(p), memory_order_relaxed);
    __libc_free(p);
}

EXPORT void *memalign(size_t alignment, size_t size)
{
    count(size);
    void *p = __libc_memalign(alignment, size);
    live_add(p, 0);
    return p;
}

EXPORT void *aligned_alloc(size_t alignment, size_t size)
{
    count(size);
    void *p = __libc_memalign(alignment, size);
    live_add(p, 0);
    return p;
}

EXPORT int posix_memalign(void **out, size_t alignment, size_t size)
{
    if (alignment < sizeof(void *) || (alignment & (alignment - 1)) != 0)
        return EINVAL;
    count(size);
    void *p = __libc_memalign(alignment, size);
    live_add(p, 0);
    if (!p && size)
        return ENOMEM;
    *out = p;
    return 0;
}

EXPORT void *valloc(size_t size)
{
    count(size);
    void *p = __libc_valloc(size);
    live_add(p, 0);
    return p;
}

EXPORT void *pvalloc(size_t size)
{
    count(size);
    void *p = __libc_pvalloc(size);
    live_add(p, 0);
    return p;
}
