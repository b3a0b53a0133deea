/* fault_vfs.c -- see fault_vfs.h.  A shim in the shape SQLite's own test VFSes
 * use: each file is our header followed by the real VFS's file object. */
#include "fault_vfs.h"

#include <sqlite3.h>
#include <string.h>
#include <time.h>

fault_vfs_control fault_vfs;

typedef struct fault_file {
    sqlite3_file base;    /* our methods */
    sqlite3_file *real;   /* the wrapped file, right after this struct */
} fault_file;

static sqlite3_vfs *real_vfs;
static sqlite3_vfs wrapper;

#define REAL(f) (((fault_file *)(f))->real)

static int f_close(sqlite3_file *f) { return REAL(f)->pMethods->xClose(REAL(f)); }
static int f_read(sqlite3_file *f, void *p, int n, sqlite3_int64 off)
{
    return REAL(f)->pMethods->xRead(REAL(f), p, n, off);
}
static int f_write(sqlite3_file *f, const void *p, int n, sqlite3_int64 off)
{
    int fail = FAULT_VFS_GET(fail_writes);
    if (fail)
        return fail;
    return REAL(f)->pMethods->xWrite(REAL(f), p, n, off);
}
static int f_truncate(sqlite3_file *f, sqlite3_int64 size)
{
    int fail = FAULT_VFS_GET(fail_writes);
    if (fail)
        return fail;
    return REAL(f)->pMethods->xTruncate(REAL(f), size);
}
static int f_sync(sqlite3_file *f, int flags)
{
    __atomic_fetch_add(&fault_vfs.syncs, 1, __ATOMIC_SEQ_CST);
    unsigned delay = FAULT_VFS_GET(sync_delay_ms);
    if (delay) {
        struct timespec ts = {delay / 1000, (long)(delay % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    int fail = FAULT_VFS_GET(fail_syncs);
    if (fail)
        return fail;
    return REAL(f)->pMethods->xSync(REAL(f), flags);
}
static int f_size(sqlite3_file *f, sqlite3_int64 *size)
{
    return REAL(f)->pMethods->xFileSize(REAL(f), size);
}
static int f_lock(sqlite3_file *f, int level) { return REAL(f)->pMethods->xLock(REAL(f), level); }
static int f_unlock(sqlite3_file *f, int level)
{
    return REAL(f)->pMethods->xUnlock(REAL(f), level);
}
static int f_check(sqlite3_file *f, int *out)
{
    return REAL(f)->pMethods->xCheckReservedLock(REAL(f), out);
}
static int f_control(sqlite3_file *f, int op, void *arg)
{
    return REAL(f)->pMethods->xFileControl(REAL(f), op, arg);
}
static int f_sector(sqlite3_file *f) { return REAL(f)->pMethods->xSectorSize(REAL(f)); }
static int f_device(sqlite3_file *f)
{
    return REAL(f)->pMethods->xDeviceCharacteristics(REAL(f));
}
static int f_shm_map(sqlite3_file *f, int page, int size, int extend, void volatile **p)
{
    return REAL(f)->pMethods->xShmMap(REAL(f), page, size, extend, p);
}
static int f_shm_lock(sqlite3_file *f, int offset, int n, int flags)
{
    return REAL(f)->pMethods->xShmLock(REAL(f), offset, n, flags);
}
static void f_shm_barrier(sqlite3_file *f) { REAL(f)->pMethods->xShmBarrier(REAL(f)); }
static int f_shm_unmap(sqlite3_file *f, int del)
{
    return REAL(f)->pMethods->xShmUnmap(REAL(f), del);
}
static int f_fetch(sqlite3_file *f, sqlite3_int64 off, int n, void **p)
{
    return REAL(f)->pMethods->xFetch(REAL(f), off, n, p);
}
static int f_unfetch(sqlite3_file *f, sqlite3_int64 off, void *p)
{
    return REAL(f)->pMethods->xUnfetch(REAL(f), off, p);
}

static const sqlite3_io_methods methods = {
    3,         f_close,   f_read,      f_write,       f_truncate, f_sync,   f_size,
    f_lock,    f_unlock,  f_check,     f_control,     f_sector,   f_device, f_shm_map,
    f_shm_lock, f_shm_barrier, f_shm_unmap, f_fetch, f_unfetch,
};

static int v_open(sqlite3_vfs *vfs, const char *name, sqlite3_file *f, int flags, int *out_flags)
{
    (void)vfs;
    fault_file *ff = (fault_file *)f;
    ff->real = (sqlite3_file *)(ff + 1);
    int rc = real_vfs->xOpen(real_vfs, name, ff->real, flags, out_flags);
    ff->base.pMethods = rc == SQLITE_OK && ff->real->pMethods ? &methods : NULL;
    return rc;
}
static int v_delete(sqlite3_vfs *v, const char *n, int sync)
{
    (void)v;
    return real_vfs->xDelete(real_vfs, n, sync);
}
static int v_access(sqlite3_vfs *v, const char *n, int flags, int *out)
{
    (void)v;
    return real_vfs->xAccess(real_vfs, n, flags, out);
}
static int v_full(sqlite3_vfs *v, const char *n, int size, char *out)
{
    (void)v;
    return real_vfs->xFullPathname(real_vfs, n, size, out);
}
static int v_random(sqlite3_vfs *v, int n, char *out)
{
    (void)v;
    return real_vfs->xRandomness(real_vfs, n, out);
}
static int v_sleep(sqlite3_vfs *v, int us)
{
    (void)v;
    return real_vfs->xSleep(real_vfs, us);
}
static int v_time(sqlite3_vfs *v, double *out)
{
    (void)v;
    return real_vfs->xCurrentTime(real_vfs, out);
}
static int v_error(sqlite3_vfs *v, int n, char *out)
{
    (void)v;
    return real_vfs->xGetLastError(real_vfs, n, out);
}
static int v_time64(sqlite3_vfs *v, sqlite3_int64 *out)
{
    (void)v;
    return real_vfs->xCurrentTimeInt64(real_vfs, out);
}

int fault_vfs_install(void)
{
    if (real_vfs)
        return SQLITE_OK;
    real_vfs = sqlite3_vfs_find(NULL);
    if (!real_vfs)
        return SQLITE_ERROR;
    memset(&wrapper, 0, sizeof wrapper);
    wrapper.iVersion = 2;
    wrapper.szOsFile = (int)sizeof(fault_file) + real_vfs->szOsFile;
    wrapper.mxPathname = real_vfs->mxPathname;
    wrapper.zName = "parley-fault";
    wrapper.xOpen = v_open;
    wrapper.xDelete = v_delete;
    wrapper.xAccess = v_access;
    wrapper.xFullPathname = v_full;
    wrapper.xRandomness = v_random;
    wrapper.xSleep = v_sleep;
    wrapper.xCurrentTime = v_time;
    wrapper.xGetLastError = v_error;
    wrapper.xCurrentTimeInt64 = v_time64;
    return sqlite3_vfs_register(&wrapper, 1);
}
