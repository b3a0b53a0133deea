/* alloc_fail.c -- the replaced allocator of alloc_fail.h. */
#include "alloc_fail.h"

#include <dlfcn.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

/* glibc's own allocator, exported for exactly this use. */
extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *p, size_t n);
extern void __libc_free(void *p);
extern void *__libc_memalign(size_t align, size_t n);

void *malloc(size_t n);
void *calloc(size_t n, size_t size);
void *realloc(void *p, size_t n);
void free(void *p);
void *memalign(size_t align, size_t n);
void *aligned_alloc(size_t align, size_t n);
int posix_memalign(void **out, size_t align, size_t n);

static long allocs, failures, fail_at, live, double_frees;
static int tracing;
static struct traced {
    void *p, *caller;
    long serial; /* af_allocs() when it was made */
} traced[AF_TRACE_MAX];
static int persistent, paused;
static void *first_caller;

void af_arm(long k, int persist)
{
    allocs = failures = double_frees = 0;
    fail_at = k;
    persistent = persist;
    first_caller = NULL;
}

void af_disarm(void) { fail_at = 0; }
void af_pause(void) { paused = 1; }
void af_resume(void) { paused = 0; }
long af_allocs(void) { return allocs; }
long af_failures(void) { return failures; }
long af_live(void) { return live; }
void *af_first_failure_caller(void) { return first_caller; }

/* Called at each failure made: a debugger's breakpoint ("break af_failing"). */
void af_failing(void);
__attribute__((noinline)) void af_failing(void) { __asm__ volatile(""); }

/* Count one allocation: 1 when it is to fail. */
static int should_fail(void *caller)
{
    if (paused)
        return 0;
    allocs++;
    if (fail_at <= 0 || allocs < fail_at || (allocs > fail_at && !persistent))
        return 0;
    if (!failures++)
        first_caller = caller;
    af_failing();
    errno = ENOMEM;
    return 1;
}

static int scoping;
static void *scoped[AF_TRACE_MAX], *scope_freed[AF_TRACE_MAX];

/* p in list: its slot, or -1 */
static int find(void *const *list, const void *p)
{
    for (int i = 0; i < AF_TRACE_MAX; i++)
        if (list[i] == p)
            return i;
    return -1;
}

static void put(void **list, void *p)
{
    int i = find(list, NULL);
    if (i >= 0)
        list[i] = p;
}

static void scope_add(void *p)
{
    if (!scoping || !p)
        return;
    int i = find(scope_freed, p);
    if (i >= 0) /* reused: a free of it from now on is a first one */
        scope_freed[i] = NULL;
    put(scoped, p);
}

static void scope_drop(void *p)
{
    if (!scoping || !p)
        return;
    int i = find(scoped, p);
    if (i >= 0)
        scoped[i] = NULL;
    if (find(scope_freed, p) >= 0)
        double_frees++;
    else
        put(scope_freed, p);
}

long af_double_frees(void) { return double_frees; }

void af_scope_begin(void)
{
    memset(scoped, 0, sizeof scoped);
    memset(scope_freed, 0, sizeof scope_freed);
    scoping = 1;
}

long af_scope_end(void)
{
    long n = 0;
    scoping = 0;
    for (int i = 0; i < AF_TRACE_MAX; i++)
        n += scoped[i] != NULL;
    return n;
}

static void trace_add(void *p, void *caller)
{
    scope_add(p);
    for (int i = 0; tracing && p && i < AF_TRACE_MAX; i++)
        if (!traced[i].p) {
            traced[i] = (struct traced){p, caller, allocs};
            return;
        }
}

static void trace_drop(void *p)
{
    scope_drop(p);
    for (int i = 0; tracing && p && i < AF_TRACE_MAX; i++)
        if (traced[i].p == p) {
            traced[i].p = NULL;
            return;
        }
}

void af_trace_start(void)
{
    memset(traced, 0, sizeof traced);
    tracing = 1;
}

void af_trace_report(void)
{
    tracing = 0;
    for (int i = 0; i < AF_TRACE_MAX; i++) {
        Dl_info info;
        void *c = traced[i].caller;
        if (traced[i].p && dladdr(c, &info) && info.dli_fname)
            fprintf(stderr, "    still allocated: allocation %ld from %s+0x%lx\n", traced[i].serial,
                    info.dli_fname, (unsigned long)((char *)c - (char *)info.dli_fbase));
    }
}

static void *counted(void *p, void *caller)
{
    if (p)
        live++;
    trace_add(p, caller);
    return p;
}

void *malloc(size_t n)
{
    if (should_fail(__builtin_return_address(0)))
        return NULL;
    return counted(__libc_malloc(n), __builtin_return_address(0));
}

void *calloc(size_t n, size_t size)
{
    if (should_fail(__builtin_return_address(0)))
        return NULL;
    return counted(__libc_calloc(n, size), __builtin_return_address(0));
}

void *realloc(void *p, size_t n)
{
    if (!p)
        return counted(should_fail(__builtin_return_address(0)) ? NULL : __libc_realloc(p, n),
                       __builtin_return_address(0));
    if (n == 0) { /* glibc frees the block and returns NULL */
        live--;
        trace_drop(p);
        return __libc_realloc(p, n);
    }
    if (should_fail(__builtin_return_address(0)))
        return NULL; /* p stays allocated, as a real failure leaves it */
    void *q = __libc_realloc(p, n);
    if (q && q != p) {
        trace_drop(p);
        trace_add(q, __builtin_return_address(0));
    }
    return q;
}

void free(void *p)
{
    if (p)
        live--;
    trace_drop(p);
    __libc_free(p);
}

void *memalign(size_t align, size_t n)
{
    if (should_fail(__builtin_return_address(0)))
        return NULL;
    return counted(__libc_memalign(align, n), __builtin_return_address(0));
}

void *aligned_alloc(size_t align, size_t n) { return memalign(align, n); }

int posix_memalign(void **out, size_t align, size_t n)
{
    if (align < sizeof(void *) || (align & (align - 1)))
        return EINVAL;
    void *p = memalign(align, n);
    if (!p)
        return ENOMEM;
    *out = p;
    return 0;
}
