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
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* strcasestr, memalign */
#endif
#include <errno.h>
#include <malloc.h>
#include <stdatomic.h>
#include <stddef.h>
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

static atomic_int counting;
static atomic_long n_allocs, n_frees, n_bytes;

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
    }
    atomic_store(&counting, on);
}

EXPORT void parley_bench_alloc_read(long *allocs, long *frees, long *bytes)
{
    *allocs = atomic_load(&n_allocs);
    *frees = atomic_load(&n_frees);
    *bytes = atomic_load(&n_bytes);
}

/* ---- the allocator, forwarded ----------------------------------------------- */

EXPORT void *malloc(size_t size)
{
    count(size);
    return __libc_malloc(size);
}

EXPORT void *calloc(size_t n, size_t size)
{
    count(n * size);
    return __libc_calloc(n, size);
}

EXPORT void *realloc(void *p, size_t size)
{
    count(size);
    return __libc_realloc(p, size);
}

EXPORT void free(void *p)
{
    if (p && atomic_load_explicit(&counting, memory_order_relaxed))
        atomic_fetch_add_explicit(&n_frees, 1, memory_order_relaxed);
    __libc_free(p);
}

EXPORT void *memalign(size_t alignment, size_t size)
{
    count(size);
    return __libc_memalign(alignment, size);
}

EXPORT void *aligned_alloc(size_t alignment, size_t size)
{
    count(size);
    return __libc_memalign(alignment, size);
}

EXPORT int posix_memalign(void **out, size_t alignment, size_t size)
{
    if (alignment < sizeof(void *) || (alignment & (alignment - 1)) != 0)
        return EINVAL;
    count(size);
    void *p = __libc_memalign(alignment, size);
    if (!p && size)
        return ENOMEM;
    *out = p;
    return 0;
}

EXPORT void *valloc(size_t size)
{
    count(size);
    return __libc_valloc(size);
}

EXPORT void *pvalloc(size_t size)
{
    count(size);
    return __libc_pvalloc(size);
}
