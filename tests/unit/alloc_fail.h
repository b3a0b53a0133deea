/*
 * alloc_fail.h -- allocation-failure injection for the unit tests, in the
 * manner of SQLite's malloc tests: the test program that links alloc_fail.c
 * defines malloc, calloc, realloc and free itself (glibc's documented
 * "Replacing malloc"), forwarding to glibc's own allocator, so every
 * allocation of the process -- Parley's, jansson's, and glibc's internal ones
 * (strdup, vasprintf) -- goes through it.  It counts them, can make the k-th
 * one fail (and, persistently, every one after it), and counts the blocks
 * alive, so a test can run a piece of code once per allocation it makes,
 * failing each in turn, and check that it gives a clean out-of-memory status
 * and leaks nothing.
 *
 * A program built this way cannot run under ASan, TSan or valgrind (each puts
 * its own allocator in place of malloc): tests/CMakeLists.txt builds it only
 * without sanitizers.  Single-threaded use only.
 */
#ifndef PARLEY_ALLOC_FAIL_H
#define PARLEY_ALLOC_FAIL_H

/* Count allocations from 0 again and fail the k-th one from now (1-based), and
 * every one after it when persistent; k 0: fail none (count only). */
void af_arm(long k, int persistent);
/* Fail nothing more (the counts stay readable). */
void af_disarm(void);
/* While paused, allocations are neither counted nor failed (a test's own
 * bookkeeping between the calls it tests); pauses do not nest. */
void af_pause(void);
void af_resume(void);
/* Allocations made (attempted) since af_arm. */
long af_allocs(void);
/* Allocations failed since af_arm. */
long af_failures(void);
/* Blocks allocated and not yet freed (process-wide, since the program started). */
long af_live(void);
/* The return address of the first call that was failed since af_arm (for a
 * report: addr2line -f -e <test> <address>), or NULL. */
void *af_first_failure_caller(void);

/* Diagnosis: from af_trace_start, remember where each block still alive was allocated
 * (up to AF_TRACE_MAX of them); af_trace_report prints those of a leak ("file+0xoffset",
 * for addr2line).  Slow: for a run a test has found leaking, not for every run. */
#define AF_TRACE_MAX 4096
void af_trace_start(void);
void af_trace_report(void);

/* Blocks allocated between af_scope_begin and af_scope_end (not nested; at most
 * AF_TRACE_MAX) that are still alive at the end: what a call kept, whatever it freed
 * that was allocated before it. */
void af_scope_begin(void);
long af_scope_end(void);
/* Blocks freed twice within scopes since af_arm (a block freed in the scope and freed
 * again before anything reused it). */
long af_double_frees(void);

#endif
