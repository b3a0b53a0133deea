/*
 * failmalloc.c -- an LD_PRELOAD library for scripts/oom_soak.sh: makes a whole
 * process (parley-host, parley.so, its worker thread, libcurl, SQLite, hiredis)
 * run short of memory at random.
 *
 * It replaces malloc and its relatives the way glibc's manual ("Replacing
 * malloc") allows, forwarding to glibc's own __libc_* functions, and fails an
 * allocation (NULL, errno ENOMEM) pseudo-randomly.  Unlike tests/unit/
 * alloc_fail.c, which fails each allocation of single-threaded code in turn,
 * this one serves threads: the allocation counter is atomic and the choice is
 * a hash of (seed, allocation number), so no lock and no shared generator.
 *
 * PARLEY_FAILMALLOC="seed=N,one_in=K,after=M,report=1,stack=1" (every key optional):
 *   seed    the hash's seed (default 1);
 *   one_in  fail about one allocation in K (default 0: never fail);
 *   after   let the first M allocations through, so the process can start;
 *   report  at exit, print "failmalloc: A allocations, F failed, L live" to stderr;
 *   stack   on SIGSEGV, SIGBUS, SIGFPE, SIGILL or SIGABRT print a backtrace to
 *           stderr first (addresses as object+offset: addr2line reads them).
 * SIGUSR2 switches failing off for good (the soak then reads the history back
 * through the same process).  Without the variable nothing ever fails.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <execinfo.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
void *valloc(size_t n);
void *pvalloc(size_t n);

static uint64_t seed = 1, one_in, after;
static int report;
static atomic_int enabled;
static atomic_ulong allocs, failures;
static atomic_long live;

/* splitmix64's finaliser: a well-mixed 64-bit hash of x. */
static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15u;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9u;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebu;
    return x ^ (x >> 31);
}

/* Count one allocation: 1 when it is to fail (errno is then ENOMEM). */
static int should_fail(void)
{
    unsigned long n = atomic_fetch_add_explicit(&allocs, 1, memory_order_relaxed) + 1;
    if (!atomic_load_explicit(&enabled, memory_order_relaxed) || n <= after ||
        mix(seed ^ mix(n)) % one_in != 0)
        return 0;
    atomic_fetch_add_explicit(&failures, 1, memory_order_relaxed);
    errno = ENOMEM;
    return 1;
}

static void *counted(void *p)
{
    if (p)
        atomic_fetch_add_explicit(&live, 1, memory_order_relaxed);
    return p;
}

static void uncount(void *p)
{
    if (p)
        atomic_fetch_sub_explicit(&live, 1, memory_order_relaxed);
}

void *malloc(size_t n) { return should_fail() ? NULL : counted(__libc_malloc(n)); }

void *calloc(size_t n, size_t size)
{
    return should_fail() ? NULL : counted(__libc_calloc(n, size));
}

void *realloc(void *p, size_t n)
{
    if (!p)
        return malloc(n);
    if (n == 0) { /* glibc frees the block and returns NULL */
        uncount(p);
        return __libc_realloc(p, n);
    }
    if (should_fail())
        return NULL; /* p stays allocated, as a real failure leaves it */
    return __libc_realloc(p, n);
}

void free(void *p)
{
    uncount(p);
    __libc_free(p);
}

void *memalign(size_t align, size_t n)
{
    return should_fail() ? NULL : counted(__libc_memalign(align, n));
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

void *valloc(size_t n) { return memalign((size_t)sysconf(_SC_PAGESIZE), n); }

void *pvalloc(size_t n)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    return memalign(page, (n + page - 1) / page * page);
}

static void say(const char *text) { (void)!write(2, text, strlen(text)); }

static void switch_off(int sig)
{
    (void)sig;
    atomic_store(&enabled, 0);
}

static void print_stack(int sig)
{
    void *frames[64];
    say("failmalloc: fatal signal, stack:\n");
    backtrace_symbols_fd(frames, backtrace(frames, 64), 2);
    signal(sig, SIG_DFL);
    raise(sig);
}

/* The value of KEY in the spec ("k=v,k=v"), or def; parsed without allocating. */
static uint64_t option(const char *spec, const char *key, uint64_t def)
{
    size_t len = strlen(key);
    for (const char *p = spec; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
        if (!strncmp(p, key, len) && p[len] == '=')
            return strtoull(p + len + 1, NULL, 10);
    return def;
}

__attribute__((constructor)) static void start(void)
{
    const char *spec = getenv("PARLEY_FAILMALLOC");
    if (!spec)
        return;
    seed = option(spec, "seed", 1);
    one_in = option(spec, "one_in", 0);
    after = option(spec, "after", 0);
    report = option(spec, "report", 0) != 0;
    signal(SIGUSR2, switch_off);
    if (option(spec, "stack", 0)) {
        void *warm[1];
        backtrace(warm, 1); /* loads libgcc_s now: a handler must not allocate */
        int fatal[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
        for (size_t i = 0; i < sizeof fatal / sizeof *fatal; i++)
            signal(fatal[i], print_stack);
    }
    atomic_store(&enabled, one_in > 0);
}

__attribute__((destructor)) static void stop(void)
{
    if (!report)
        return;
    char line[160];
    snprintf(line, sizeof line, "failmalloc: %lu allocations, %lu failed, %ld live\n",
             atomic_load(&allocs), atomic_load(&failures), atomic_load(&live));
    say(line);
}
