/*
 * fault_vfs.h -- a SQLite VFS for tests and benchmarks that wraps the default
 * one and can fail or delay file operations on demand: disk full, I/O
 * errors, a slow fsync.  Registered as the default VFS by the test program
 * itself, before any store opens, so production code has no test hooks.
 */
#ifndef PARLEY_FAULT_VFS_H
#define PARLEY_FAULT_VFS_H

/* What the wrapped files do now: read on every call, from SQLite's threads;
 * set with FAULT_VFS_SET and read with FAULT_VFS_GET from any thread. */
typedef struct fault_vfs_control {
    int fail_writes;               /* 0, or the SQLite error xWrite returns (SQLITE_FULL, ...) */
    int fail_syncs;                /* 0, or the SQLite error xSync returns */
    unsigned sync_delay_ms;        /* every xSync sleeps this long first */
    unsigned long syncs;           /* xSync calls so far */
} fault_vfs_control;

extern fault_vfs_control fault_vfs;

#define FAULT_VFS_SET(field, value) __atomic_store_n(&fault_vfs.field, (value), __ATOMIC_SEQ_CST)
#define FAULT_VFS_GET(field) __atomic_load_n(&fault_vfs.field, __ATOMIC_SEQ_CST)

/* Register the wrapper as SQLite's default VFS; 0 or a SQLite error. */
int fault_vfs_install(void);

#endif
