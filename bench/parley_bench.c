/*
 * parley_bench.c -- what Parley costs beyond the LLM call, measured as
 * ratios to a bare libcurl client ("the floor") against the same fake LLM
 * server, in the same run.
 *
 *   parley-bench [--scenario seq|concurrent|all] [options]   (--help lists them)
 *
 * Scenarios
 *   seq         one conversation with a 20-turn history and 5 tools declared,
 *               server latency 0: turns one after another.  Floor: the same
 *               number of POSTs of the same body size with curl_easy on one
 *               reused connection.
 *   concurrent  10,000 conversations in flight at once, server latency 200 ms,
 *               each conversation doing 3 turns back to back (closed loop).
 *               Floor: curl multi (epoll + curl_multi_socket_action) keeping
 *               10,000 POSTs of the same body sizes in flight: the ceiling of
 *               the server (and of this machine) at that concurrency.
 *   The limit (scenarios 1 and 2; --no-limit leaves it out): bench/raw_client.c,
 *               a minimal epoll HTTP/1.1 client sending the same bodies at the same
 *               concurrency: the least user-space work for the same exchanges.
 *   store-seq, store-concurrent (in "all" too)
 *               the two scenarios above with history_store "sqlite:FILE" (a
 *               fresh file in --store-dir per phase) against the memory store,
 *               same server, same run: what durable history costs.
 *
 * How it runs
 *   The parent process never loads the plugin nor initialises libcurl.  It starts
 *   parley-fake-llm as a child (127.0.0.1, port 0), then forks one child
 *   process per measured phase, so every phase has its own clean address
 *   space, its own getrusage() and its own VmHWM.  A phase child loads
 *   parley.so with dlopen() through the ABI (or drives libcurl directly for
 *   the floor), measures, and writes one struct result to a pipe.  The
 *   parent kills a phase that overruns --phase-timeout-s.
 *
 *   Request bodies: before measuring, a capture phase runs the same turns
 *   against a separate fake server started with --log, and the floor then
 *   sends those very request bodies (re-serialised from the log, which gives
 *   the same byte count as Parley sent: compact JSON either way).
 *
 *   Each repetition starts a fresh server and runs the Parley phase, the
 *   floor phase (and the limit's) against it, rotating which goes first.  The
 *   summary gives medians over the repetitions; a ratio is the median of the
 *   per-repetition ratios (Parley/floor, Parley/limit: on the same server).
 *
 * Measured per phase: turns/s, p50/p99 latency (submission to completion, as
 * the host sees it), CPU seconds of this process per turn (getrusage, all
 * threads), CPU seconds of the fake server per turn (/proc/PID/stat),
 * VmHWM, RSS growth; with --count-allocs (a separate pass, re-executed under
 * LD_PRELOAD of bench/alloc_count.c) heap allocations and bytes per turn.
 * Nothing is asserted: the bench reports what it saw.
 */
#include <curl/curl.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <parley/plugin.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fault_vfs.h" /* tests/store: a VFS that delays fsync, for --fsync-delay-ms */
#include "raw_client.h" /* the limit: a minimal epoll HTTP/1.1 client */

#ifndef PARLEY_BENCH_PLUGIN
#define PARLEY_BENCH_PLUGIN "parley.so"
#endif
#ifndef PARLEY_BENCH_FAKE_LLM
#define PARLEY_BENCH_FAKE_LLM "parley-fake-llm"
#endif
#ifndef PARLEY_BENCH_ALLOC_LIB
#define PARLEY_BENCH_ALLOC_LIB "parley-bench-alloc.so"
#endif

#define SEQ_CONVERSATION "bench-sequential-conversation"
#define MAX_CONC_TURNS 16

/* ======================================================================
 * Configuration
 * ====================================================================== */

static struct config {
    const char *plugin;
    const char *fake_llm;
    const char *scenario;       /* seq | concurrent | all */
    const char *summary_file;   /* key=value medians, for run.sh */
    int seq_turns;              /* measured turns */
    int seq_history;            /* turns of history kept (max_history_turns) */
    int seq_repeats;
    int conc_conversations;
    int conc_turns;             /* turns per conversation */
    int conc_latency_ms;
    int conc_repeats;
    int conc_max_connections;   /* Parley's max_connections there; 0 = one per conversation */
    int server_threads;         /* fake server threads for the concurrent scenario */
    int phase_timeout_s;
    const char *store_dir;      /* where the SQLite phases put their store files */
    int store_seq_latency_ms;   /* server latency of the store-seq scenario */
    const char *history_sync;   /* the SQLite phases' history_sync: normal | full */
    int fsync_delay_ms;         /* SQLite phases: every fsync takes this long (a slow disk) */
    int limit;                  /* also run the raw epoll client (scenarios 1 and 2) */
    int count_allocs;           /* the counting pass: allocations per turn (LD_PRELOAD) */
    int pin_cpus;               /* fake server on the last CPU, every client on CPU 0 */
    int seq_chain;              /* scenario 1's Parley host submits from the done callback */
    int verbose;
} cfg = {
    .plugin = PARLEY_BENCH_PLUGIN,
    .fake_llm = PARLEY_BENCH_FAKE_LLM,
    .scenario = "all",
    .seq_turns = 2000,
    .seq_history = 20,
    .seq_repeats = 5,
    .conc_conversations = 10000,
    .conc_turns = 3,
    .conc_latency_ms = 200,
    .conc_repeats = 3,
    .server_threads = 2,
    .phase_timeout_s = 120,
    .history_sync = "normal",
    .limit = 1,
};

/* --pin-cpus: one process on one CPU, so that where the scheduler puts the
 * fake server (its cost per request doubles on some placements) no longer
 * moves the sequential ratios.  Only with 2 CPUs or more. */
static void pin_to_cpu(int cpu)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0)
        fprintf(stderr, "parley-bench: cannot pin to CPU %d: %s\n", cpu, strerror(errno));
}

static int pinning(void) { return cfg.pin_cpus && sysconf(_SC_NPROCESSORS_ONLN) >= 2; }


/* Five Home-Assistant-like tools, declared in the agent's options. */
static const char TOOLS_JSON[] =
    "["
    "{\"name\":\"HassTurnOn\",\"description\":\"Turns on/opens a device or entity\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
    "\"area\":{\"type\":\"string\"},\"domain\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}}}}},"
    "{\"name\":\"HassTurnOff\",\"description\":\"Turns off/closes a device or entity\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
    "\"area\":{\"type\":\"string\"},\"domain\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}}}}},"
    "{\"name\":\"HassLightSet\",\"description\":\"Sets the brightness or color of a light\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
    "\"area\":{\"type\":\"string\"},\"brightness\":{\"type\":\"integer\",\"minimum\":0,"
    "\"maximum\":100},\"color\":{\"type\":\"string\"}}}},"
    "{\"name\":\"HassClimateSetTemperature\",\"description\":\"Sets the target temperature\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"area\":{\"type\":\"string\"},"
    "\"temperature\":{\"type\":\"number\"}},\"required\":[\"temperature\"]}},"
    "{\"name\":\"GetLiveContext\",\"description\":\"Current state of the home's devices\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{}}}"
    "]";

/* ======================================================================
 * Small helpers
 * ====================================================================== */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("parley-bench: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

/* A "Name:   123 kB" field of /proc/self/status, in KiB; -1 when unreadable.
 * With read(), not stdio: it runs inside measured windows, where the counting
 * pass counts every malloc. */
static long status_kib(const char *field)
{
    char buf[4096];
    int fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t got = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (got <= 0)
        return -1;
    buf[got] = '\0';
    size_t n = strlen(field);
    const char *line = buf;
    while (line) {
        if (strncmp(line, field, n) == 0 && line[n] == ':')
            return strtol(line + n + 1, NULL, 10);
        line = strchr(line, '\n');
        if (line)
            line++;
    }
    return -1;
}

/* The first three fields of /proc/loadavg ("?" when unreadable): how busy the
 * machine was, printed with every run's figures. */
static void load_average(char *out, size_t n)
{
    char buf[128] = "";
    int fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
    ssize_t got = fd >= 0 ? read(fd, buf, sizeof buf - 1) : -1;
    if (fd >= 0)
        close(fd);
    double a = 0, b = 0, c = 0;
    if (got <= 0 || sscanf(buf, "%lf %lf %lf", &a, &b, &c) != 3)
        snprintf(out, n, "?");
    else
        snprintf(out, n, "%.2f/%.2f/%.2f", a, b, c);
}

/* user + system CPU seconds of this process, every thread included. */
static double self_cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

/* The kernel's share of self_cpu_s(), and the context switches of every thread:
 * what a hand-off between threads costs shows here, not in instruction counts. */
static void self_sys_and_switches(double *sys_s, long *switches)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    *sys_s = (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
    *switches = ru.ru_nvcsw + ru.ru_nivcsw;
}

/* user + system CPU seconds of another process, from /proc/PID/stat (10 ms ticks). */
static double proc_cpu_s(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%ld/stat", (long)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')'); /* the command name may contain spaces */
    if (!p)
        return -1;
    /* After ") ": state(3) ppid(4) ... utime(14) stime(15). */
    unsigned long long utime = 0, stime = 0;
    if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &utime, &stime) != 2)
        return -1;
    return (double)(utime + stime) / (double)sysconf(_SC_CLK_TCK);
}

/* Make n bytes at p resident now, so the bench's own arrays are in the baseline RSS. */
static void touch(void *p, size_t n)
{
    volatile char *c = p;
    for (size_t i = 0; i < n; i += 4096)
        c[i] = c[i];
    if (n)
        c[n - 1] = c[n - 1];
}

static void raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of v[0..n) (sorts v). */
static double percentile(double *v, size_t n, double pct)
{
    if (n == 0)
        return 0;
    qsort(v, n, sizeof *v, cmp_double);
    size_t rank = (size_t)(pct / 100.0 * (double)n + 0.999999);
    if (rank < 1)
        rank = 1;
    if (rank > n)
        rank = n;
    return v[rank - 1];
}

static double median(const double *v, size_t n)
{
    double tmp[64];
    if (n == 0 || n > 64)
        return 0;
    memcpy(tmp, v, n * sizeof *v);
    qsort(tmp, n, sizeof *tmp, cmp_double);
    return n % 2 ? tmp[n / 2] : (tmp[n / 2 - 1] + tmp[n / 2]) / 2;
}

/* ======================================================================
 * The fake LLM server
 * ====================================================================== */

struct server {
    pid_t pid;
    int port;
    char port_file[PATH_MAX];
};

static char workdir[64]; /* mkdtemp: port files and the capture log */

static void server_start(struct server *s, const char *tag, int latency_ms, int threads,
                         int max_connections, const char *log_path)
{
    snprintf(s->port_file, sizeof s->port_file, "%s/%s.port", workdir, tag);
    unlink(s->port_file);
    char lat[16], thr[16], maxc[16];
    snprintf(lat, sizeof lat, "%d", latency_ms);
    snprintf(thr, sizeof thr, "%d", threads);
    snprintf(maxc, sizeof maxc, "%d", max_connections);
    const char *argv[17] = {cfg.fake_llm, "--host", "127.0.0.1", "--port", "0", "--port-file",
                            s->port_file, "--latency-ms", lat, "--threads", thr,
                            "--max-connections", maxc, "--quiet"};
    int argc = 14;
    if (log_path) {
        argv[argc++] = "--log";
        argv[argc++] = log_path;
    }
    argv[argc] = NULL;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        die("fork: %s", strerror(errno));
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the bench */
        unsetenv("LD_PRELOAD"); /* the counting pass counts the bench, not the server */
        if (pinning())
            pin_to_cpu((int)sysconf(_SC_NPROCESSORS_ONLN) - 1);
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0)
            dup2(devnull, STDOUT_FILENO); /* it prints "listening on N" */
        execv(cfg.fake_llm, (char *const *)argv);
        fprintf(stderr, "parley-bench: cannot run %s: %s\n", cfg.fake_llm, strerror(errno));
        _exit(127);
    }
    s->pid = pid;
    for (int i = 0; i < 1000; i++) { /* up to 10 s */
        FILE *f = fopen(s->port_file, "r");
        if (f) {
            int port = 0;
            int ok = fscanf(f, "%d", &port) == 1;
            fclose(f);
            if (ok && port > 0) {
                s->port = port;
                return;
            }
        }
        if (waitpid(pid, NULL, WNOHANG) == pid)
            die("%s exited before listening", cfg.fake_llm);
        sleep_ms(10);
    }
    kill(pid, SIGKILL);
    die("%s did not report its port within 10 s", cfg.fake_llm);
}

static void server_stop(struct server *s)
{
    if (s->pid <= 0)
        return;
    kill(s->pid, SIGTERM);
    for (int i = 0; i < 500; i++) { /* up to 5 s, then SIGKILL */
        if (waitpid(s->pid, NULL, WNOHANG) == s->pid) {
            s->pid = 0;
            unlink(s->port_file);
            return;
        }
        sleep_ms(10);
    }
    kill(s->pid, SIGKILL);
    waitpid(s->pid, NULL, 0);
    s->pid = 0;
    unlink(s->port_file);
}

/* ======================================================================
 * Phases: each runs in a forked child and reports one struct result
 * ====================================================================== */

struct result {
    int ok;               /* the phase ran to its end (failures may still be > 0) */
    char error[256];      /* first error seen, if any */
    long turns;           /* turns (or requests) measured */
    long failures;        /* turns that did not end in success, rejections included */
    long retries;         /* Parley's llm_retries during the phase */
    long peak_in_flight;
    double wall_s;
    double p50_ms, p99_ms;
    double cpu_s;         /* this process, during the measured window */
    double sys_s;         /* the kernel's part of cpu_s */
    long switches;        /* context switches of this process's threads in the window */
    double server_cpu_s;  /* the fake server, during the measured window */
    long rss_base_kib;    /* VmRSS when the measured window opened */
    long rss_end_kib;     /* VmRSS when it closed */
    long hwm_kib;         /* VmHWM at the end */
    double body_bytes;    /* mean request body size */
    int counted;          /* the counting pass: allocs, frees and alloc_bytes are set */
    long allocs, frees;   /* heap allocations and frees during the measured window */
    long alloc_bytes;     /* bytes those allocations asked for */
};

/* What the phase children need; set by the parent before fork(). */
static struct phase_ctx {
    int port;
    pid_t server_pid;
    char *seq_body;                      /* captured: a turn with the full history */
    size_t seq_body_len;
    char *conc_body[MAX_CONC_TURNS];     /* captured: turn k of a conversation */
    size_t conc_body_len[MAX_CONC_TURNS];
} ctx;

/* The measured window of a phase: CPU, wall time and memory from open to close. */
struct window {
    double server_cpu0, cpu0, t0, sys0;
    long switches0;
};

/* The counting pass's interposer (bench/alloc_count.c), when LD_PRELOAD holds it. */
static void (*alloc_counting)(int on);
static void (*alloc_read)(long *allocs, long *frees, long *bytes);

static struct window window_open(struct result *r)
{
    r->rss_base_kib = status_kib("VmRSS");
    struct window w = {proc_cpu_s(ctx.server_pid), self_cpu_s(), now_s(), 0, 0};
    self_sys_and_switches(&w.sys0, &w.switches0);
    if (alloc_counting)
        alloc_counting(1); /* last: what window_open itself allocates is not counted */
    return w;
}

static void window_close(const struct window *w, struct result *r)
{
    if (alloc_counting) {
        alloc_counting(0);
        alloc_read(&r->allocs, &r->frees, &r->alloc_bytes);
        r->counted = 1;
    }
    r->wall_s = now_s() - w->t0;
    r->cpu_s = self_cpu_s() - w->cpu0;
    self_sys_and_switches(&r->sys_s, &r->switches);
    r->sys_s -= w->sys0;
    r->switches -= w->switches0;
    r->server_cpu_s = proc_cpu_s(ctx.server_pid) - w->server_cpu0;
    r->rss_end_kib = status_kib("VmRSS");
    r->hwm_kib = status_kib("VmHWM");
}

static void set_error(struct result *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_error(struct result *r, const char *fmt, ...)
{
    if (r->error[0])
        return; /* keep the first */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->error, sizeof r->error, fmt, ap);
    va_end(ap);
}

typedef void (*phase_fn)(struct result *r);

/* Run fn in a child process; the parent waits at most phase_timeout_s. */
static struct result run_phase(phase_fn fn)
{
    struct result r;
    memset(&r, 0, sizeof r);
    int fds[2];
    if (pipe(fds) != 0)
        die("pipe: %s", strerror(errno));
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        die("fork: %s", strerror(errno));
    if (pid == 0) {
        close(fds[0]);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        raise_nofile();
        if (pinning())
            pin_to_cpu(0);
        fn(&r);
        ssize_t w = write(fds[1], &r, sizeof r);
        _exit(w == (ssize_t)sizeof r ? 0 : 1);
    }
    close(fds[1]);
    struct pollfd pfd = {fds[0], POLLIN, 0};
    int ready = poll(&pfd, 1, cfg.phase_timeout_s * 1000);
    ssize_t got = ready > 0 ? read(fds[0], &r, sizeof r) : 0;
    close(fds[0]);
    if (got != (ssize_t)sizeof r) {
        kill(pid, SIGKILL);
        memset(&r, 0, sizeof r);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (got != (ssize_t)sizeof r) {
        if (ready == 0)
            snprintf(r.error, sizeof r.error, "phase killed after %d s (--phase-timeout-s)",
                     cfg.phase_timeout_s);
        else if (WIFSIGNALED(status))
            snprintf(r.error, sizeof r.error, "phase died of signal %d", WTERMSIG(status));
        else
            snprintf(r.error, sizeof r.error, "phase exited with status %d without a result",
                     WEXITSTATUS(status));
    }
    return r;
}

/* ---- Parley through the ABI --------------------------------------------- */

static const parley_plugin *load_plugin(struct result *r)
{
    void *so = dlopen(cfg.plugin, RTLD_NOW | RTLD_LOCAL);
    if (!so) {
        set_error(r, "dlopen %s: %s", cfg.plugin, dlerror());
        return NULL;
    }
    parley_entry_fn entry = (parley_entry_fn)dlsym(so, PARLEY_ENTRY_SYMBOL);
    const parley_plugin *p = entry ? entry(PARLEY_ABI_VERSION) : NULL;
    if (!p)
        set_error(r, "%s: no compatible %s", cfg.plugin, PARLEY_ENTRY_SYMBOL);
    return p;
}

static void on_log(void *host_data, parley_log_level level, const char *message)
{
    (void)host_data;
    if (level <= PARLEY_LOG_WARN && cfg.verbose)
        fprintf(stderr, "parley: %s\n", message);
}

/* The history_store of the Parley phase running in this child ("memory" unless a
 * store phase set it). */
static char phase_store[PATH_MAX + 16] = "memory";

static parley_agent *make_agent(const parley_plugin *p, struct result *r, long max_in_flight,
                                long max_conversations, long max_connections)
{
    static const parley_host host = {.struct_size = sizeof host, .log = on_log};
    char *options = NULL;
    if (asprintf(&options,
                 "{\"base_url\":\"http://127.0.0.1:%d/v1\",\"model\":\"fake-model\","
                 /* Parley's own cost: summary requests are context_bench.py's subject */
                 "\"tools\":%s,\"max_history_turns\":%d,\"summarize\":false,\"max_in_flight\":%ld,"
                 "\"max_connections\":%ld,"
                 "\"max_conversations\":%ld,\"turn_timeout_ms\":%d,\"request_timeout_ms\":%d,"
                 "\"history_store\":\"%s\",\"history_sync\":\"%s\"}",
                 ctx.port, TOOLS_JSON, cfg.seq_history, max_in_flight,
                 max_connections, max_conversations,
                 cfg.phase_timeout_s * 1000, cfg.phase_timeout_s * 1000, phase_store,
                 cfg.history_sync) < 0)
        return NULL;
    char *err = NULL;
    parley_agent *a = p->create(&host, options, &err);
    free(options);
    if (!a) {
        set_error(r, "create: %s", err ? err : "failed");
        p->free_string(err);
    }
    return a;
}

static long parley_retries(const parley_plugin *p, parley_agent *a)
{
    char *m = NULL;
    long retries = -1;
    if (p->metrics(a, &m) == PARLEY_OK && m) {
        const char *k = strstr(m, "\"llm_retries\":");
        if (k)
            retries = strtol(k + strlen("\"llm_retries\":"), NULL, 10);
    }
    p->free_string(m);
    return retries;
}

/* Fixed-width texts: every turn of a scenario sends a body of the same size. */
static void seq_text(char *out, size_t n, int i)
{
    snprintf(out, n, "Turn %06d: turn on the kitchen lights and set the living room to 21 degrees",
             i);
}

static void conc_id(char *out, size_t n, int i) { snprintf(out, n, "conv-%07d", i); }

static void conc_text(char *out, size_t n, int i, int k)
{
    snprintf(out, n, "Conversation %07d turn %02d: what is the temperature in the bedroom", i, k);
}

/* One turn at a time: the host thread waits for each done callback, on a
 * semaphore (one futex call on each side when the host sleeps; a mutex and
 * condition variable cost a third: glibc leaves the mutex marked contended
 * after a condition wait, so the host's unlock makes a futex call too). */
struct waiter {
    sem_t done;
    parley_status status;
    char error[200];
};

static void waiter_init(struct waiter *w)
{
    memset(w, 0, sizeof *w);
    sem_init(&w->done, 0, 0);
}

static void waiter_wait(struct waiter *w)
{
    while (sem_wait(&w->done) != 0 && errno == EINTR)
        ;
}

static void seq_done(void *user_data, const parley_result *res)
{
    struct waiter *w = user_data;
    w->status = res->status;
    if (res->status != PARLEY_OK)
        snprintf(w->error, sizeof w->error, "%s: %s", "turn failed",
                 res->error_message ? res->error_message : "?");
    sem_post(&w->done); /* publishes status and error to the waiter */
}

/* Runs turn i of the sequential conversation; 0 on success. */
static int seq_turn(const parley_plugin *p, parley_agent *a, struct waiter *w, int i,
                    struct result *r)
{
    char text[128];
    seq_text(text, sizeof text, i);
    parley_input in = {.struct_size = sizeof in, .text = text, .conversation_id = SEQ_CONVERSATION};
    char *err = NULL;
    if (p->async_process(a, &in, seq_done, w, NULL, &err) != PARLEY_OK) {
        set_error(r, "async_process: %s", err ? err : "?");
        p->free_string(err);
        return -1;
    }
    waiter_wait(w);
    if (w->status != PARLEY_OK) {
        set_error(r, "%s", w->error);
        return -1;
    }
    return 0;
}

/* Warm-up turns: enough to fill the history, plus a few more. */
static int seq_warmup_turns(void) { return cfg.seq_history + 10; }

/* --seq-chain: the host submits turn k+1 from turn k's done callback (on
 * Parley's worker), as an asynchronous host may; no host thread sleeps and
 * wakes per turn.  Callbacks of one agent never run at once, so no lock. */
struct seq_chain {
    const parley_plugin *p;
    parley_agent *a;
    int next, end;     /* the turn to submit next; one past the last */
    double submitted;  /* when the turn in flight was submitted */
    double *lat;       /* per measured turn */
    int measured;
    struct result *r;
    sem_t done;        /* posted after the last turn */
};

static void seq_chain_done(void *user_data, const parley_result *res);

/* Submit the next turn of the chain, or post `done` after the last. */
static void seq_chain_submit(struct seq_chain *c)
{
    if (c->next == c->end) {
        sem_post(&c->done);
        return;
    }
    char text[128];
    seq_text(text, sizeof text, c->next++);
    parley_input in = {.struct_size = sizeof in, .text = text, .conversation_id = SEQ_CONVERSATION};
    c->submitted = now_s();
    if (c->p->async_process(c->a, &in, seq_chain_done, c, NULL, NULL) != PARLEY_OK) {
        c->r->failures += c->end - c->next + 1; /* refused: the rest never runs */
        sem_post(&c->done);
    }
}

static void seq_chain_done(void *user_data, const parley_result *res)
{
    struct seq_chain *c = user_data;
    c->lat[c->measured++] = now_s() - c->submitted;
    if (res->status != PARLEY_OK)
        c->r->failures++;
    seq_chain_submit(c);
}

/* Turns first..first+n-1 chained from the done callbacks; their latencies in lat. */
static void seq_run_chained(const parley_plugin *p, parley_agent *a, int first, int n,
                            double *lat, struct result *r)
{
    struct seq_chain c = {p, a, first, first + n, 0, lat, 0, r, {{0}}};
    sem_init(&c.done, 0, 0);
    seq_chain_submit(&c);
    while (sem_wait(&c.done) != 0 && errno == EINTR)
        ;
    sem_destroy(&c.done);
}

static void phase_seq_parley(struct result *r)
{
    const parley_plugin *p = load_plugin(r);
    parley_agent *a = p ? make_agent(p, r, 16, 16, 16) : NULL;
    if (!a)
        return;
    struct waiter w;
    waiter_init(&w);
    int n = cfg.seq_turns, warm = seq_warmup_turns();
    double *lat = calloc((size_t)n, sizeof *lat);
    if (!lat) {
        set_error(r, "out of memory");
        return;
    }
    touch(lat, (size_t)n * sizeof *lat);
    for (int i = 0; i < warm; i++)
        if (seq_turn(p, a, &w, i, r) != 0)
            r->failures++;

    struct window win = window_open(r);
    if (cfg.seq_chain) {
        seq_run_chained(p, a, warm, n, lat, r);
    } else {
        for (int i = 0; i < n; i++) {
            double s = now_s();
            if (seq_turn(p, a, &w, warm + i, r) != 0)
                r->failures++;
            lat[i] = now_s() - s;
        }
    }
    window_close(&win, r);
    r->turns = n;
    r->peak_in_flight = 1;
    r->body_bytes = (double)ctx.seq_body_len;
    r->retries = parley_retries(p, a);
    r->p50_ms = percentile(lat, (size_t)n, 50) * 1e3;
    r->p99_ms = percentile(lat, (size_t)n, 99) * 1e3;
    p->destroy(a);
    free(lat);
    r->ok = 1;
}

/* ---- Parley, many conversations at once ----------------------------------- */

static struct conc {
    const parley_plugin *p;
    parley_agent *a;
    int n, k;
    char (*ids)[16];
    double *start;           /* per conversation: when its current turn was submitted */
    int *turn_no;            /* per conversation: turns completed */
    double *lat;             /* n * k latencies */
    atomic_long completed, failures, in_flight, peak_in_flight;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int finished;
    char error[200];
} conc;

static void conc_note_error(const char *what, const char *msg)
{
    pthread_mutex_lock(&conc.mu);
    if (!conc.error[0])
        snprintf(conc.error, sizeof conc.error, "%s: %s", what, msg ? msg : "?");
    pthread_mutex_unlock(&conc.mu);
}

static void conc_count_done(long turns)
{
    if (atomic_fetch_add(&conc.completed, turns) + turns >= (long)conc.n * conc.k) {
        pthread_mutex_lock(&conc.mu);
        conc.finished = 1;
        pthread_cond_signal(&conc.cv);
        pthread_mutex_unlock(&conc.mu);
    }
}

static void conc_done(void *user_data, const parley_result *res);

/* Submit conversation i's next turn; on refusal its remaining turns count as failed. */
static void conc_submit(int i)
{
    char text[128];
    conc_text(text, sizeof text, i, conc.turn_no[i]);
    parley_input in = {.struct_size = sizeof in, .text = text, .conversation_id = conc.ids[i]};
    char *err = NULL;
    long now_in = atomic_fetch_add(&conc.in_flight, 1) + 1;
    long peak = atomic_load(&conc.peak_in_flight);
    while (now_in > peak && !atomic_compare_exchange_weak(&conc.peak_in_flight, &peak, now_in)) {
    }
    conc.start[i] = now_s();
    parley_status st = conc.p->async_process(conc.a, &in, conc_done, (void *)(intptr_t)i, NULL, &err);
    if (st != PARLEY_OK) {
        atomic_fetch_sub(&conc.in_flight, 1);
        conc_note_error("async_process", err);
        conc.p->free_string(err);
        long left = conc.k - conc.turn_no[i];
        atomic_fetch_add(&conc.failures, left);
        conc_count_done(left);
    }
}

static void conc_done(void *user_data, const parley_result *res)
{
    int i = (int)(intptr_t)user_data;
    conc.lat[(size_t)i * (size_t)conc.k + (size_t)conc.turn_no[i]] = now_s() - conc.start[i];
    conc.turn_no[i]++;
    atomic_fetch_sub(&conc.in_flight, 1);
    if (res->status != PARLEY_OK) {
        atomic_fetch_add(&conc.failures, 1);
        conc_note_error("turn failed", res->error_message);
    }
    if (conc.turn_no[i] < conc.k)
        conc_submit(i); /* allowed from inside a callback (plugin.h) */
    conc_count_done(1);
}

/* PARLEY_BENCH_TIMELINE=1: every 0.2 s of scenario 2's Parley phase, VmRSS
 * beside the live heap (with the counting pass and PARLEY_BENCH_ALLOC_LIVE=1)
 * and the turns done, on stderr: where the RSS peak forms, and how much of
 * it is not live data (docs/performance.md, "Memory per in-flight turn,
 * session 5"). */
static void conc_timeline(double t0, long rss)
{
    static double next;
    static long (*live_bytes)(void);
    double now = now_s();
    if (now < next)
        return;
    if (next == 0)
        live_bytes = (long (*)(void))dlsym(RTLD_DEFAULT, "parley_bench_alloc_live");
    next = now + 0.2;
    fprintf(stderr, "timeline: %6.2f s  VmRSS %7ld KiB  live heap %7ld KiB  done %6ld  in flight %6ld\n",
            now - t0, rss, live_bytes ? live_bytes() / 1024 : -1L, atomic_load(&conc.completed),
            (long)atomic_load(&conc.in_flight));
}

/* Wait until every turn completed, sampling VmRSS; 0, or -1 on timeout. */
static int conc_wait(double deadline, long *rss_peak)
{
    int rc = 0;
    const char *tl = getenv("PARLEY_BENCH_TIMELINE");
    int timeline = tl && *tl == '1';
    double t0 = now_s();
    pthread_mutex_lock(&conc.mu);
    while (!conc.finished) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 20 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&conc.cv, &conc.mu, &ts);
        pthread_mutex_unlock(&conc.mu);
        long rss = status_kib("VmRSS");
        if (rss > *rss_peak)
            *rss_peak = rss;
        if (timeline)
            conc_timeline(t0, rss);
        pthread_mutex_lock(&conc.mu);
        if (!conc.finished && now_s() > deadline) {
            rc = -1;
            break;
        }
    }
    pthread_mutex_unlock(&conc.mu);
    return rc;
}

static void phase_conc_parley(struct result *r)
{
    int n = cfg.conc_conversations, k = cfg.conc_turns;
    conc.p = load_plugin(r);
    /* One connection per turn in flight, as the floor has, unless measuring the cap. */
    long maxc = cfg.conc_max_connections ? cfg.conc_max_connections : (n < 100000 ? n : 100000);
    conc.a = conc.p ? make_agent(conc.p, r, n, 2L * n + 16, maxc) : NULL;
    if (!conc.a)
        return;
    conc.n = n;
    conc.k = k;
    pthread_mutex_init(&conc.mu, NULL);
    pthread_cond_init(&conc.cv, NULL);
    conc.ids = calloc((size_t)n, sizeof *conc.ids);
    conc.start = calloc((size_t)n, sizeof *conc.start);
    conc.turn_no = calloc((size_t)n, sizeof *conc.turn_no);
    conc.lat = calloc((size_t)n * (size_t)k, sizeof *conc.lat);
    if (!conc.ids || !conc.start || !conc.turn_no || !conc.lat) {
        set_error(r, "out of memory");
        return;
    }
    for (int i = 0; i < n; i++)
        conc_id(conc.ids[i], sizeof conc.ids[i], i);
    touch(conc.ids, (size_t)n * sizeof *conc.ids);
    touch(conc.start, (size_t)n * sizeof *conc.start);
    touch(conc.turn_no, (size_t)n * sizeof *conc.turn_no);
    touch(conc.lat, (size_t)n * (size_t)k * sizeof *conc.lat);

    /* Warm-up: one turn on a conversation of its own (libcurl, jansson, the worker). */
    struct waiter w;
    waiter_init(&w);
    if (seq_turn(conc.p, conc.a, &w, 0, r) != 0)
        return;

    struct window win = window_open(r);
    long rss_peak = r->rss_base_kib;
    double t0 = win.t0;
    for (int i = 0; i < n; i++)
        conc_submit(i);
    int rc = conc_wait(t0 + cfg.phase_timeout_s - 5, &rss_peak);
    window_close(&win, r);
    if (rss_peak > r->hwm_kib)
        r->hwm_kib = rss_peak;
    r->turns = (long)n * k;
    r->failures = atomic_load(&conc.failures);
    r->peak_in_flight = atomic_load(&conc.peak_in_flight);
    r->retries = parley_retries(conc.p, conc.a);
    double mean_body = 0;
    for (int j = 0; j < k; j++)
        mean_body += (double)ctx.conc_body_len[j] / k;
    r->body_bytes = mean_body;
    if (rc != 0) {
        set_error(r, "%ld of %ld turns still unfinished at the deadline",
                  r->turns - atomic_load(&conc.completed), r->turns);
        r->failures += r->turns - atomic_load(&conc.completed);
        return; /* destroy() would wait for them: just exit */
    }
    if (conc.error[0])
        set_error(r, "%s", conc.error);
    size_t nl = (size_t)n * (size_t)k;
    r->p50_ms = percentile(conc.lat, nl, 50) * 1e3;
    r->p99_ms = percentile(conc.lat, nl, 99) * 1e3;
    conc.p->destroy(conc.a);
    r->ok = 1;
}

/* ---- the floor: bare libcurl ------------------------------------------------ */

static size_t count_body(char *data, size_t size, size_t nmemb, void *ud)
{
    (void)data;
    *(size_t *)ud += size * nmemb;
    return size * nmemb;
}

static struct curl_slist *floor_headers(void)
{
    return curl_slist_append(NULL, "Content-Type: application/json");
}

static void floor_setup(CURL *e, const char *url, struct curl_slist *headers, size_t *received)
{
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_POST, 1L);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, count_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, received);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)cfg.phase_timeout_s * 1000);
}

/* 0 when the request got a 200 with a body (read *received after the transfer). */
static int floor_check(CURL *e, CURLcode code, const size_t *received, struct result *r)
{
    long status = 0;
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
    if (code != CURLE_OK) {
        set_error(r, "curl: %s", curl_easy_strerror(code));
        return -1;
    }
    if (status != 200 || *received == 0) {
        set_error(r, "HTTP %ld (%zu body bytes)", status, *received);
        return -1;
    }
    return 0;
}

static void phase_seq_floor(struct result *r)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    char url[96];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/chat/completions", ctx.port);
    struct curl_slist *headers = floor_headers();
    CURL *e = curl_easy_init();
    size_t received = 0;
    int n = cfg.seq_turns, warm = seq_warmup_turns();
    double *lat = calloc((size_t)n, sizeof *lat);
    if (!e || !headers || !lat) {
        set_error(r, "out of memory");
        return;
    }
    floor_setup(e, url, headers, &received);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, ctx.seq_body);
    curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)ctx.seq_body_len);
    touch(lat, (size_t)n * sizeof *lat);
    for (int i = 0; i < warm; i++) {
        received = 0;
        if (floor_check(e, curl_easy_perform(e), &received, r) != 0)
            r->failures++;
    }
    struct window win = window_open(r);
    for (int i = 0; i < n; i++) {
        double s = now_s();
        received = 0;
        if (floor_check(e, curl_easy_perform(e), &received, r) != 0)
            r->failures++;
        lat[i] = now_s() - s;
    }
    window_close(&win, r);
    r->turns = n;
    r->peak_in_flight = 1;
    r->body_bytes = (double)ctx.seq_body_len;
    r->p50_ms = percentile(lat, (size_t)n, 50) * 1e3;
    r->p99_ms = percentile(lat, (size_t)n, 99) * 1e3;
    curl_easy_cleanup(e);
    curl_slist_free_all(headers);
    free(lat);
    r->ok = 1;
}

/* curl multi driven by epoll and curl_multi_socket_action: the cheapest way
 * to keep N transfers in flight with libcurl. */
struct fmulti {
    CURLM *m;
    int epfd;
    double timer_at; /* when curl wants CURL_SOCKET_TIMEOUT; < 0: not armed */
};

struct ftransfer {
    CURL *e;
    int turn;         /* requests completed on this transfer */
    double start;
    size_t received;
};

static int fm_socket(CURL *e, curl_socket_t s, int what, void *userp, void *socketp)
{
    (void)e;
    (void)socketp;
    struct fmulti *fm = userp;
    if (what == CURL_POLL_REMOVE) {
        epoll_ctl(fm->epfd, EPOLL_CTL_DEL, s, NULL);
        return 0;
    }
    struct epoll_event ev;
    memset(&ev, 0, sizeof ev);
    ev.events = (what & CURL_POLL_IN ? EPOLLIN : 0u) | (what & CURL_POLL_OUT ? EPOLLOUT : 0u);
    ev.data.fd = s;
    if (epoll_ctl(fm->epfd, EPOLL_CTL_MOD, s, &ev) != 0 && errno == ENOENT)
        epoll_ctl(fm->epfd, EPOLL_CTL_ADD, s, &ev);
    return 0;
}

static int fm_timer(CURLM *m, long timeout_ms, void *userp)
{
    (void)m;
    struct fmulti *fm = userp;
    fm->timer_at = timeout_ms < 0 ? -1 : now_s() + (double)timeout_ms / 1e3;
    return 0;
}

static void ftransfer_start(struct fmulti *fm, struct ftransfer *t)
{
    int k = t->turn;
    curl_easy_setopt(t->e, CURLOPT_POSTFIELDS, ctx.conc_body[k]);
    curl_easy_setopt(t->e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)ctx.conc_body_len[k]);
    t->received = 0;
    t->start = now_s();
    curl_multi_add_handle(fm->m, t->e);
}

static void phase_conc_floor(struct result *r)
{
    int n = cfg.conc_conversations, k = cfg.conc_turns;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    char url[96];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/chat/completions", ctx.port);
    struct curl_slist *headers = floor_headers();
    struct fmulti fm = {curl_multi_init(), epoll_create1(EPOLL_CLOEXEC), -1};
    struct ftransfer *ts = calloc((size_t)n, sizeof *ts);
    double *lat = calloc((size_t)n * (size_t)k, sizeof *lat);
    struct epoll_event *evs = calloc(1024, sizeof *evs);
    if (!headers || !fm.m || fm.epfd < 0 || !ts || !lat || !evs) {
        set_error(r, "out of memory");
        return;
    }
    touch(ts, (size_t)n * sizeof *ts);
    touch(lat, (size_t)n * (size_t)k * sizeof *lat);
    curl_multi_setopt(fm.m, CURLMOPT_SOCKETFUNCTION, fm_socket);
    curl_multi_setopt(fm.m, CURLMOPT_SOCKETDATA, &fm);
    curl_multi_setopt(fm.m, CURLMOPT_TIMERFUNCTION, fm_timer);
    curl_multi_setopt(fm.m, CURLMOPT_TIMERDATA, &fm);
    for (int i = 0; i < n; i++) {
        ts[i].e = curl_easy_init();
        if (!ts[i].e) {
            set_error(r, "out of memory");
            return;
        }
        floor_setup(ts[i].e, url, headers, &ts[i].received);
        curl_easy_setopt(ts[i].e, CURLOPT_PRIVATE, &ts[i]);
    }
    /* Warm-up: one request, as the Parley phase makes one turn. */
    {
        size_t received = 0;
        CURL *e = curl_easy_init();
        floor_setup(e, url, headers, &received);
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, ctx.conc_body[0]);
        curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)ctx.conc_body_len[0]);
        if (floor_check(e, curl_easy_perform(e), &received, r) != 0)
            r->failures++;
        curl_easy_cleanup(e);
    }

    struct window win = window_open(r);
    long rss_peak = r->rss_base_kib, completed = 0, in_flight = 0, total = (long)n * k;
    double t0 = win.t0;
    double deadline = t0 + cfg.phase_timeout_s - 5, next_sample = t0;
    int running = 0;
    for (int i = 0; i < n; i++) {
        ftransfer_start(&fm, &ts[i]);
        in_flight++;
    }
    r->peak_in_flight = in_flight;
    while (completed < total) {
        double now = now_s();
        if (now > deadline) {
            set_error(r, "%ld of %ld requests still unfinished at the deadline",
                      total - completed, total);
            r->failures += total - completed;
            break;
        }
        int wait_ms = 20;
        if (fm.timer_at >= 0) {
            double d = (fm.timer_at - now) * 1e3;
            wait_ms = d <= 0 ? 0 : d < 20 ? (int)d + 1 : 20;
        }
        int nev = epoll_wait(fm.epfd, evs, 1024, wait_ms);
        for (int j = 0; j < nev; j++) {
            int flags = (evs[j].events & EPOLLIN ? CURL_CSELECT_IN : 0) |
                        (evs[j].events & EPOLLOUT ? CURL_CSELECT_OUT : 0) |
                        (evs[j].events & (EPOLLERR | EPOLLHUP) ? CURL_CSELECT_ERR : 0);
            curl_multi_socket_action(fm.m, evs[j].data.fd, flags, &running);
        }
        if (fm.timer_at >= 0 && now_s() >= fm.timer_at) {
            fm.timer_at = -1;
            curl_multi_socket_action(fm.m, CURL_SOCKET_TIMEOUT, 0, &running);
        }
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(fm.m, &left))) {
            if (msg->msg != CURLMSG_DONE)
                continue;
            struct ftransfer *t = NULL;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&t);
            CURLcode code = msg->data.result;
            size_t idx = (size_t)(t - ts) * (size_t)k + (size_t)t->turn;
            lat[idx] = now_s() - t->start;
            if (floor_check(t->e, code, &t->received, r) != 0)
                r->failures++;
            curl_multi_remove_handle(fm.m, t->e); /* msg is invalid from here */
            completed++;
            in_flight--;
            if (++t->turn < k) {
                ftransfer_start(&fm, t);
                in_flight++;
            }
        }
        if (now_s() >= next_sample) {
            long rss = status_kib("VmRSS");
            if (rss > rss_peak)
                rss_peak = rss;
            next_sample = now_s() + 0.02;
        }
    }
    window_close(&win, r);
    if (rss_peak > r->hwm_kib)
        r->hwm_kib = rss_peak;
    r->turns = total;
    double mean_body = 0;
    for (int j = 0; j < k; j++)
        mean_body += (double)ctx.conc_body_len[j] / k;
    r->body_bytes = mean_body;
    size_t nl = (size_t)completed;
    r->p50_ms = percentile(lat, nl, 50) * 1e3;
    r->p99_ms = percentile(lat, nl, 99) * 1e3;
    if (completed < total)
        return;
    for (int i = 0; i < n; i++)
        curl_easy_cleanup(ts[i].e);
    curl_multi_cleanup(fm.m);
    curl_slist_free_all(headers);
    r->ok = 1;
}

/* ---- the limit: a raw epoll HTTP/1.1 client (bench/raw_client.c) ------------- */

static struct raw_client *limit_client(struct result *r, int connections, const char *const *bodies,
                                       const size_t *lens, int n_bodies)
{
    struct raw_config rc = {.port = ctx.port,
                            .path = "/v1/chat/completions",
                            .content_type = "application/json",
                            .bodies = bodies,
                            .body_lens = lens,
                            .n_bodies = n_bodies,
                            .connections = connections,
                            .timeout_s = cfg.phase_timeout_s - 5};
    char err[256];
    struct raw_client *c = raw_client_new(&rc, err, sizeof err);
    if (!c)
        set_error(r, "%s", err);
    return c;
}

/* The sequential scenario's POSTs, one after the other on one keep-alive connection. */
static void phase_seq_limit(struct result *r)
{
    const char *body = ctx.seq_body;
    int n = cfg.seq_turns, warm = seq_warmup_turns();
    struct raw_client *c = limit_client(r, 1, &body, &ctx.seq_body_len, 1);
    double *lat = calloc((size_t)n, sizeof *lat);
    if (!c || !lat) {
        set_error(r, "out of memory");
        raw_client_free(c);
        free(lat);
        return;
    }
    touch(lat, (size_t)n * sizeof *lat);
    struct raw_stats st;
    raw_client_run(c, warm, NULL, &st); /* opens the connection, as the floor's warm-up does */
    r->failures += st.failures;
    struct window win = window_open(r);
    int rc = raw_client_run(c, n, lat, &st);
    window_close(&win, r);
    r->failures += st.failures;
    if (st.error[0])
        set_error(r, "%s", st.error);
    r->turns = n;
    r->peak_in_flight = st.peak_in_flight;
    r->body_bytes = (double)ctx.seq_body_len;
    r->p50_ms = percentile(lat, (size_t)n, 50) * 1e3;
    r->p99_ms = percentile(lat, (size_t)n, 99) * 1e3;
    raw_client_free(c);
    free(lat);
    r->ok = rc == 0;
}

/* The concurrent scenario: every conversation's bodies in order on a connection of
 * its own, all conversations at once.  Its per-connection state (a fixed struct)
 * is allocated before the window, as the floor's easy handles are. */
static void phase_conc_limit(struct result *r)
{
    int n = cfg.conc_conversations, k = cfg.conc_turns;
    const char *bodies[MAX_CONC_TURNS];
    for (int j = 0; j < k; j++)
        bodies[j] = ctx.conc_body[j];
    struct raw_client *c = limit_client(r, n, bodies, ctx.conc_body_len, k);
    double *lat = calloc((size_t)n * (size_t)k, sizeof *lat);
    if (!c || !lat) {
        set_error(r, "out of memory");
        raw_client_free(c);
        free(lat);
        return;
    }
    touch(lat, (size_t)n * (size_t)k * sizeof *lat);
    struct raw_stats st;
    /* Warm-up: one request on a connection of its own, as the floor makes one. */
    struct raw_client *w = limit_client(r, 1, bodies, ctx.conc_body_len, 1);
    if (w) {
        raw_client_run(w, 1, NULL, &st);
        r->failures += st.failures;
        raw_client_free(w);
    }
    struct window win = window_open(r);
    int rc = raw_client_run(c, k, lat, &st);
    window_close(&win, r); /* no RSS sampling needed: nothing is freed during the run */
    r->failures += st.failures;
    if (st.error[0])
        set_error(r, "%s", st.error);
    r->turns = (long)n * k;
    r->peak_in_flight = st.peak_in_flight;
    double mean_body = 0;
    for (int j = 0; j < k; j++)
        mean_body += (double)ctx.conc_body_len[j] / k;
    r->body_bytes = mean_body;
    size_t nl = (size_t)n * (size_t)k;
    r->p50_ms = percentile(lat, nl, 50) * 1e3;
    r->p99_ms = percentile(lat, nl, 99) * 1e3;
    raw_client_free(c);
    free(lat);
    r->ok = rc == 0;
}

/* ---- capture: the request bodies Parley sends -------------------------------- */

static void phase_capture(struct result *r)
{
    const parley_plugin *p = load_plugin(r);
    parley_agent *a = p ? make_agent(p, r, 16, 16, 16) : NULL;
    if (!a)
        return;
    struct waiter w;
    waiter_init(&w);
    /* The sequential turns, up to the first measured one. */
    for (int i = 0; i <= seq_warmup_turns(); i++)
        if (seq_turn(p, a, &w, i, r) != 0)
            return;
    /* One concurrent-scenario conversation, all its turns. */
    char id[16];
    conc_id(id, sizeof id, 0);
    for (int j = 0; j < cfg.conc_turns; j++) {
        char text[128];
        conc_text(text, sizeof text, 0, j);
        parley_input in = {.struct_size = sizeof in, .text = text, .conversation_id = id};
        if (p->async_process(a, &in, seq_done, &w, NULL, NULL) != PARLEY_OK) {
            set_error(r, "capture: async_process refused a turn");
            return;
        }
        waiter_wait(&w);
        if (w.status != PARLEY_OK) {
            set_error(r, "capture: %s", w.error);
            return;
        }
    }
    p->destroy(a);
    r->ok = 1;
}

/* Request bodies from the fake server's JSON-lines log, in order. */
static size_t read_logged_bodies(const char *path, char ***bodies)
{
    FILE *f = fopen(path, "r");
    if (!f)
        die("cannot read %s", path);
    size_t n = 0, cap = 0, linecap = 0;
    char *line = NULL;
    *bodies = NULL;
    while (getline(&line, &linecap, f) > 0) {
        json_t *o = json_loads(line, 0, NULL);
        json_t *b = json_object_get(o, "body");
        if (json_is_null(b)) { /* no body: a GET, the context window's discovery */
            json_decref(o);
            continue;
        }
        char *s = b ? json_dumps(b, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        json_decref(o);
        if (!s)
            die("bad line in %s", path);
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            *bodies = realloc(*bodies, cap * sizeof **bodies);
            if (!*bodies)
                die("out of memory");
        }
        (*bodies)[n++] = s;
    }
    free(line);
    fclose(f);
    return n;
}

static void capture_bodies(void)
{
    char log_path[PATH_MAX];
    snprintf(log_path, sizeof log_path, "%s/capture.log", workdir);
    unlink(log_path);
    struct server s;
    server_start(&s, "capture", 0, 2, 64, log_path);
    ctx.port = s.port;
    ctx.server_pid = s.pid;
    struct result r = run_phase(phase_capture);
    server_stop(&s);
    if (!r.ok)
        die("capture phase failed: %s", r.error[0] ? r.error : "?");
    char **bodies;
    size_t n = read_logged_bodies(log_path, &bodies);
    size_t seq_index = (size_t)seq_warmup_turns(); /* the first "measured" turn */
    if (n != seq_index + 1 + (size_t)cfg.conc_turns)
        die("capture: expected %zu requests in %s, found %zu", seq_index + 1 + cfg.conc_turns,
            log_path, n);
    ctx.seq_body = bodies[seq_index];
    ctx.seq_body_len = strlen(bodies[seq_index]);
    for (int k = 0; k < cfg.conc_turns; k++) {
        ctx.conc_body[k] = bodies[seq_index + 1 + (size_t)k];
        ctx.conc_body_len[k] = strlen(ctx.conc_body[k]);
    }
    for (size_t i = 0; i < seq_index; i++)
        free(bodies[i]);
    free(bodies);
    unlink(log_path);
    printf("request bodies (captured from Parley via the fake server's --log):\n"
           "  sequential turn with %d turns of history and 5 tools: %zu bytes\n",
           cfg.seq_history, ctx.seq_body_len);
    printf("  concurrent turns 1..%d of a conversation:", cfg.conc_turns);
    for (int k = 0; k < cfg.conc_turns; k++)
        printf(" %zu", ctx.conc_body_len[k]);
    printf(" bytes\n\n");
}

/* ---- the same Parley phases with the SQLite store ------------------------- */

/* Run `fn` (in this phase child) with a fresh SQLite store file, removed after. */
static void with_sqlite_store(phase_fn fn, struct result *r)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/parley-bench-%ld.db", cfg.store_dir ? cfg.store_dir : workdir,
             (long)getpid());
    snprintf(phase_store, sizeof phase_store, "sqlite:%s", path);
    if (cfg.fsync_delay_ms) { /* a slow disk: the default VFS, before the plugin is loaded */
        if (fault_vfs_install() != 0) {
            set_error(r, "cannot install the delaying VFS");
            return;
        }
        FAULT_VFS_SET(sync_delay_ms, (unsigned)cfg.fsync_delay_ms);
    }
    fn(r);
    static const char *const suffixes[] = {"", "-wal", "-shm", "-lock"};
    for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
        char file[PATH_MAX + 8];
        snprintf(file, sizeof file, "%s%s", path, suffixes[i]);
        unlink(file);
    }
}

static void phase_seq_sqlite(struct result *r) { with_sqlite_store(phase_seq_parley, r); }
static void phase_conc_sqlite(struct result *r) { with_sqlite_store(phase_conc_parley, r); }

/* ======================================================================
 * Reporting
 * ====================================================================== */

static FILE *summary;

static void print_result(const char *scenario, int rep, int reps, const char *who,
                         const struct result *r)
{
    printf("[%s %d/%d] %-6s %6ld turns %9.0f/s  p50 %8.3f ms  p99 %8.3f ms  cpu %7.1f us/turn  "
           "server cpu %7.1f us/turn  VmHWM %7.1f MiB  RSS +%ld KiB  in flight %ld  failures %ld",
           scenario, rep, reps, who, r->turns, r->wall_s > 0 ? (double)r->turns / r->wall_s : 0,
           r->p50_ms, r->p99_ms, r->turns ? r->cpu_s / (double)r->turns * 1e6 : 0,
           r->turns ? r->server_cpu_s / (double)r->turns * 1e6 : 0, (double)r->hwm_kib / 1024,
           r->rss_end_kib - r->rss_base_kib, r->peak_in_flight, r->failures);
    if (r->turns)
        printf("  (sys %.1f us, %.2f switches)/turn", r->sys_s / (double)r->turns * 1e6,
               (double)r->switches / (double)r->turns);
    if (r->retries > 0)
        printf("  retries %ld", r->retries);
    if (r->counted && r->turns)
        printf("  allocs %.1f/turn (%.0f B/turn)", (double)r->allocs / (double)r->turns,
               (double)r->alloc_bytes / (double)r->turns);
    if (!r->ok || r->error[0])
        printf("  [%s%s]", r->ok ? "" : "INCOMPLETE: ", r->error[0] ? r->error : "?");
    printf("\n");
    fflush(stdout);
}

/* Medians over repetitions of one metric for Parley, the floor and (scenarios 1
 * and 2) the limit. */
struct series {
    double parley[64], floor[64], limit[64];
    double ratio[64], ratio_limit[64]; /* per run: Parley / floor, Parley / limit; < 0: none */
    size_t n;
};

static int with_limit; /* the scenario being reported ran the limit too */

static void table_header(const char *a, const char *b)
{
    if (with_limit)
        printf("  %-34s %14s %14s %14s %9s %9s\n", "", a, b, "limit", "/floor", "/limit");
    else
        printf("  %-34s %14s %14s %10s\n", "", a, b, "ratio");
}

static void format_ratio(char *out, size_t n, double ratio)
{
    if (ratio < 0)
        snprintf(out, n, "-");
    else
        snprintf(out, n, "%.3f", ratio);
}

static void row(const char *key, const char *label, const char *fmt, const struct series *s,
                int with_ratio)
{
    char pv[32], fv[32], lv[32], rf[16] = "", rl[16] = "";
    snprintf(pv, sizeof pv, fmt, median(s->parley, s->n));
    snprintf(fv, sizeof fv, fmt, median(s->floor, s->n));
    snprintf(lv, sizeof lv, fmt, median(s->limit, s->n));
    if (with_ratio) {
        format_ratio(rf, sizeof rf, median(s->ratio, s->n));
        format_ratio(rl, sizeof rl, median(s->ratio_limit, s->n));
    }
    if (with_limit)
        printf("  %-34s %14s %14s %14s %9s %9s\n", label, pv, fv, lv, rf, rl);
    else
        printf("  %-34s %14s %14s %10s\n", label, pv, fv, rf);
    if (summary) { /* as printed, for run.sh's and limit.sh's tables */
        fprintf(summary, "%s.parley=%s\n%s.floor=%s\n", key, pv, key, fv);
        if (with_limit)
            fprintf(summary, "%s.limit=%s\n", key, lv);
        if (with_ratio)
            fprintf(summary, "%s.ratio=%s\n", key, rf);
        if (with_ratio && with_limit)
            fprintf(summary, "%s.ratio_limit=%s\n", key, rl);
    }
}

static void add(struct series *s, double parley, double floor_v, double ratio)
{
    s->parley[s->n] = parley;
    s->floor[s->n] = floor_v;
    s->limit[s->n] = 0;
    s->ratio[s->n] = ratio;
    s->ratio_limit[s->n] = -1;
    s->n++;
}

/* The limit's figure for the run add() just recorded. */
static void add_limit(struct series *s, double limit, double ratio)
{
    s->limit[s->n - 1] = limit;
    s->ratio_limit[s->n - 1] = ratio;
}

static double ratio_of(double a, double b) { return b > 0 ? a / b : -1; }

struct scenario_figures {
    struct series thr, mean_ms, wall, p50, p99, cpu, srv, hwm, growth, per_inflight, fail,
        inflight, allocs, alloc_bytes;
    int complete;  /* every phase of every repetition ran to its end */
    int has_limit; /* the limit ran */
    int counted;   /* the counting pass: allocs and alloc_bytes are filled */
};

static double per_turn(double x, const struct result *r) { return x / (double)r->turns; }

/* RSS per in-flight turn: VmHWM minus VmRSS when the window opened, over the peak in flight. */
static double kib_per_in_flight(const struct result *r)
{
    return (double)(r->hwm_kib - r->rss_base_kib) / (double)r->peak_in_flight;
}

/* One repetition's figures; l is NULL when the limit did not run. */
static void collect(struct scenario_figures *fg, const struct result *p, const struct result *f,
                    const struct result *l)
{
    double tp = p->turns / p->wall_s, tf = f->turns / f->wall_s;
    add(&fg->thr, tp, tf, tp / tf);
    add(&fg->mean_ms, 1e3 / tp, 1e3 / tf, tf / tp);
    add(&fg->wall, p->wall_s, f->wall_s, p->wall_s / f->wall_s);
    add(&fg->p50, p->p50_ms, f->p50_ms, p->p50_ms / f->p50_ms);
    add(&fg->p99, p->p99_ms, f->p99_ms, p->p99_ms / f->p99_ms);
    double cp = per_turn(p->cpu_s, p) * 1e6, cf = per_turn(f->cpu_s, f) * 1e6;
    add(&fg->cpu, cp, cf, cp / cf);
    add(&fg->srv, per_turn(p->server_cpu_s, p) * 1e6, per_turn(f->server_cpu_s, f) * 1e6, 0);
    add(&fg->hwm, p->hwm_kib / 1024.0, f->hwm_kib / 1024.0, 0);
    add(&fg->growth, (double)(p->rss_end_kib - p->rss_base_kib),
        (double)(f->rss_end_kib - f->rss_base_kib), 0);
    add(&fg->per_inflight, kib_per_in_flight(p), kib_per_in_flight(f),
        ratio_of(kib_per_in_flight(p), kib_per_in_flight(f)));
    add(&fg->fail, (double)p->failures, (double)f->failures, 0);
    add(&fg->inflight, (double)p->peak_in_flight, (double)f->peak_in_flight, 0);
    double ap = per_turn((double)p->allocs, p), af = per_turn((double)f->allocs, f);
    double bp = per_turn((double)p->alloc_bytes, p), bf = per_turn((double)f->alloc_bytes, f);
    add(&fg->allocs, ap, af, ratio_of(ap, af));
    add(&fg->alloc_bytes, bp, bf, ratio_of(bp, bf));
    if (l) {
        double tl = l->turns / l->wall_s, cl = per_turn(l->cpu_s, l) * 1e6;
        add_limit(&fg->thr, tl, tp / tl);
        add_limit(&fg->mean_ms, 1e3 / tl, tl / tp);
        add_limit(&fg->wall, l->wall_s, p->wall_s / l->wall_s);
        add_limit(&fg->p50, l->p50_ms, ratio_of(p->p50_ms, l->p50_ms));
        add_limit(&fg->p99, l->p99_ms, ratio_of(p->p99_ms, l->p99_ms));
        add_limit(&fg->cpu, cl, ratio_of(cp, cl));
        add_limit(&fg->srv, per_turn(l->server_cpu_s, l) * 1e6, 0);
        add_limit(&fg->hwm, l->hwm_kib / 1024.0, 0);
        add_limit(&fg->growth, (double)(l->rss_end_kib - l->rss_base_kib), 0);
        /* no ratio: the limit keeps nothing per turn in user space (its ~0 would make one meaningless) */
        add_limit(&fg->per_inflight, kib_per_in_flight(l), -1);
        add_limit(&fg->fail, (double)l->failures, 0);
        add_limit(&fg->inflight, (double)l->peak_in_flight, 0);
        double al = per_turn((double)l->allocs, l), bl = per_turn((double)l->alloc_bytes, l);
        add_limit(&fg->allocs, al, ratio_of(ap, al));
        add_limit(&fg->alloc_bytes, bl, ratio_of(bp, bl));
    }
    if (!p->ok || !f->ok || (l && !l->ok))
        fg->complete = 0;
    if (!p->counted || !f->counted || (l && !l->counted))
        fg->counted = 0;
}

static const char *verdict(int met) { return met ? "met" : "MISSED"; }

/* ======================================================================
 * Scenarios
 * ====================================================================== */

/* What the two sides of a scenario are called ("parley" against "floor", or
 * "sqlite" against "memory" for the store scenarios). */
static const char *side_a = "parley", *side_b = "floor";

/* reps repetitions, each against a fresh server: Parley, the floor and (when
 * limit_fn is not NULL) the limit, each in a phase process of its own. */
static void scenario(const char *name, int reps, int latency_ms, int threads, int max_conn,
                     phase_fn parley_fn, phase_fn floor_fn, phase_fn limit_fn,
                     struct scenario_figures *fg)
{
    memset(fg, 0, sizeof *fg);
    fg->complete = 1;
    fg->counted = 1;
    fg->has_limit = limit_fn != NULL;
    phase_fn fns[3] = {parley_fn, floor_fn, limit_fn};
    const char *who[3] = {side_a, side_b, "limit"};
    int sides = limit_fn ? 3 : 2;
    for (int rep = 1; rep <= reps; rep++) {
        struct server s;
        char tag[32];
        snprintf(tag, sizeof tag, "%s-%d", name, rep);
        server_start(&s, tag, latency_ms, threads, max_conn, NULL);
        ctx.port = s.port;
        ctx.server_pid = s.pid;
        struct result res[3];
        memset(res, 0, sizeof res);
        for (int k = 0; k < sides; k++) { /* rotate the order: drift hits every side alike */
            int i = (k + rep - 1) % sides;
            res[i] = run_phase(fns[i]);
            print_result(name, rep, reps, who[i], &res[i]);
        }
        server_stop(&s);
        const struct result *p = &res[0], *f = &res[1], *l = limit_fn ? &res[2] : NULL;
        if (p->turns && f->turns && p->wall_s > 0 && f->wall_s > 0 &&
            (!l || (l->turns && l->wall_s > 0)))
            collect(fg, p, f, l);
        else
            fg->complete = 0;
    }
}

/* The counting pass's rows: heap allocations during the measured window, per turn. */
static void alloc_rows(const char *prefix, const struct scenario_figures *fg)
{
    if (!fg->counted)
        return;
    char key[64];
    snprintf(key, sizeof key, "%s.allocs_per_turn", prefix);
    row(key, "heap allocations per turn", "%.1f", &fg->allocs, 1);
    snprintf(key, sizeof key, "%s.alloc_bytes_per_turn", prefix);
    row(key, "bytes allocated per turn", "%.0f", &fg->alloc_bytes, 1);
}

static void report_seq(const struct scenario_figures *fg)
{
    printf("\nScenario 1 -- sequential: 1 conversation, %d-turn history, 5 tools, server "
           "latency 0 ms; %d turns, median of %zu runs%s\n",
           cfg.seq_history, cfg.seq_turns, fg->thr.n,
           cfg.count_allocs ? " (COUNTING PASS: allocations counted, timings not comparable)" : "");
    with_limit = fg->has_limit;
    table_header("Parley", "floor");
    row("seq.turns_per_s", "turns/s", "%.0f", &fg->thr, 1);
    row("seq.mean_ms", "mean turn time (ms)", "%.3f", &fg->mean_ms, 1);
    row("seq.wall_s", "wall time (s)", "%.3f", &fg->wall, 1);
    row("seq.p50_ms", "p50 latency (ms)", "%.3f", &fg->p50, 1);
    row("seq.p99_ms", "p99 latency (ms)", "%.3f", &fg->p99, 1);
    row("seq.cpu_us", "client CPU per turn (us)", "%.1f", &fg->cpu, 1);
    row("seq.server_cpu_us", "server CPU per turn (us)", "%.1f", &fg->srv, 0);
    row("seq.hwm_mib", "peak RSS, VmHWM (MiB)", "%.1f", &fg->hwm, 0);
    row("seq.rss_growth_kib", "RSS growth over the run (KiB)", "%.0f", &fg->growth, 0);
    row("seq.failures", "failures", "%.0f", &fg->fail, 0);
    alloc_rows("seq", fg);
    double ratio = median(fg->mean_ms.ratio, fg->mean_ms.n);
    double cpu = median(fg->cpu.ratio, fg->cpu.n);
    printf("  => Parley turn time / floor request time = %.3f (target <= 1.10: %s)%s\n", ratio,
           verdict(ratio <= 1.10), fg->complete ? "" : "  [some phases incomplete]");
    printf("  => Parley CPU per turn / floor's = %.3f (issue 17 target <= 1.30: %s)\n", cpu,
           verdict(cpu <= 1.30));
    if (summary)
        fprintf(summary, "seq.body_bytes=%zu\nseq.complete=%d\n", ctx.seq_body_len, fg->complete);
}

static void report_conc(const struct scenario_figures *fg)
{
    printf("\nScenario 2 -- concurrent: %d conversations in flight, %d turns each, server "
           "latency %d ms, %d server threads; median of %zu runs%s\n",
           cfg.conc_conversations, cfg.conc_turns, cfg.conc_latency_ms, cfg.server_threads,
           fg->thr.n,
           cfg.count_allocs ? " (COUNTING PASS: allocations counted, timings not comparable)" : "");
    with_limit = fg->has_limit;
    table_header("Parley", "floor");
    row("conc.turns_per_s", "turns/s", "%.0f", &fg->thr, 1);
    row("conc.wall_s", "wall time (s)", "%.2f", &fg->wall, 1);
    row("conc.p50_ms", "p50 latency (ms)", "%.1f", &fg->p50, 1);
    row("conc.p99_ms", "p99 latency (ms)", "%.1f", &fg->p99, 1);
    row("conc.cpu_us", "client CPU per turn (us)", "%.1f", &fg->cpu, 1);
    row("conc.server_cpu_us", "server CPU per turn (us)", "%.1f", &fg->srv, 0);
    row("conc.peak_in_flight", "peak turns in flight", "%.0f", &fg->inflight, 0);
    row("conc.hwm_mib", "peak RSS, VmHWM (MiB)", "%.1f", &fg->hwm, 0);
    row("conc.kib_per_in_flight", "RSS per in-flight turn (KiB)", "%.1f", &fg->per_inflight, 1);
    row("conc.failures", "failures", "%.0f", &fg->fail, 0);
    alloc_rows("conc", fg);
    double ratio = median(fg->thr.ratio, fg->thr.n);
    double kib = median(fg->per_inflight.parley, fg->per_inflight.n);
    double worst_fail = 0;
    for (size_t i = 0; i < fg->fail.n; i++)
        if (fg->fail.parley[i] > worst_fail)
            worst_fail = fg->fail.parley[i];
    printf("  => Parley throughput / floor throughput = %.3f (target >= 0.80: %s)\n", ratio,
           verdict(ratio >= 0.80));
    if (fg->has_limit) {
        double lr = median(fg->thr.ratio_limit, fg->thr.n);
        printf("  => Parley throughput / limit throughput = %.3f (issue 17 target >= 0.50: %s)\n",
               lr, verdict(lr >= 0.50));
    }
    printf("  => Parley failures, worst run = %.0f (target 0: %s)\n", worst_fail,
           verdict(worst_fail == 0 && fg->complete));
    printf("  => RSS per in-flight turn = %.1f KiB (target <= 64 KiB: %s; issue 17 target "
           "<= 16 KiB: %s)\n",
           kib, verdict(kib <= 64), verdict(kib <= 16));
    printf("     (VmHWM minus VmRSS before the first submission, over the peak number of turns "
           "in flight;\n      includes the history committed during the run)\n");
    if (summary)
        fprintf(summary, "conc.failures_worst=%.0f\nconc.complete=%d\n", worst_fail, fg->complete);
}

static void report_store_seq(const struct scenario_figures *fg)
{
    printf("\nScenario 1s -- sequential turns as in scenario 1 (server latency %d ms), history in "
           "SQLite (history_sync %s, fsync delay %d ms) against the memory store; median of %zu "
           "runs\n",
           cfg.store_seq_latency_ms, cfg.history_sync, cfg.fsync_delay_ms, fg->thr.n);
    with_limit = 0;
    table_header("sqlite", "memory");
    row("store_seq.mean_ms", "mean turn time (ms)", "%.3f", &fg->mean_ms, 1);
    row("store_seq.p50_ms", "p50 latency (ms)", "%.3f", &fg->p50, 1);
    row("store_seq.p99_ms", "p99 latency (ms)", "%.3f", &fg->p99, 1);
    row("store_seq.cpu_us", "client CPU per turn (us)", "%.1f", &fg->cpu, 1);
    row("store_seq.hwm_mib", "peak RSS, VmHWM (MiB)", "%.1f", &fg->hwm, 0);
    row("store_seq.failures", "failures", "%.0f", &fg->fail, 0);
    alloc_rows("store_seq", fg);
    double ratio = median(fg->mean_ms.ratio, fg->mean_ms.n);
    printf("  => SQLite turn time / memory turn time = %.3f (target <= 1.10: %s)%s\n", ratio,
           verdict(ratio <= 1.10), fg->complete ? "" : "  [some phases incomplete]");
}

static void report_store_conc(const struct scenario_figures *fg)
{
    printf("\nScenario 2s -- %d conversations in flight as in scenario 2, history in SQLite "
           "(history_sync %s, fsync delay %d ms) against the memory store; median of %zu runs\n",
           cfg.conc_conversations, cfg.history_sync, cfg.fsync_delay_ms, fg->thr.n);
    with_limit = 0;
    table_header("sqlite", "memory");
    row("store_conc.turns_per_s", "turns/s", "%.0f", &fg->thr, 1);
    row("store_conc.p50_ms", "p50 latency (ms)", "%.1f", &fg->p50, 1);
    row("store_conc.p99_ms", "p99 latency (ms)", "%.1f", &fg->p99, 1);
    row("store_conc.cpu_us", "client CPU per turn (us)", "%.1f", &fg->cpu, 1);
    row("store_conc.hwm_mib", "peak RSS, VmHWM (MiB)", "%.1f", &fg->hwm, 0);
    row("store_conc.failures", "failures", "%.0f", &fg->fail, 0);
    alloc_rows("store_conc", fg);
    double ratio = median(fg->thr.ratio, fg->thr.n), worst_fail = 0;
    for (size_t i = 0; i < fg->fail.n; i++)
        if (fg->fail.parley[i] > worst_fail)
            worst_fail = fg->fail.parley[i];
    printf("  => SQLite throughput / memory throughput = %.3f (target >= 0.90: %s)\n", ratio,
           verdict(ratio >= 0.90));
    printf("  => SQLite failures, worst run = %.0f (target 0: %s)\n", worst_fail,
           verdict(worst_fail == 0 && fg->complete));
    if (summary)
        fprintf(summary, "store_conc.failures_worst=%.0f\n", worst_fail);
}

/* ======================================================================
 * main
 * ====================================================================== */

/* --scenario is "all" or a comma-separated list of scenario names. */
static const char *const scenario_names[] = {"seq", "concurrent", "store-seq", "store-concurrent"};

/* The item after p in a comma-separated list, or NULL. */
static const char *next_item(const char *p)
{
    const char *comma = strchr(p, ',');
    return comma ? comma + 1 : NULL;
}

static int scenario_chosen(const char *name)
{
    if (strcmp(cfg.scenario, "all") == 0)
        return 1;
    size_t n = strlen(name);
    for (const char *p = cfg.scenario; p; p = next_item(p))
        if (strncmp(p, name, n) == 0 && (p[n] == ',' || p[n] == '\0'))
            return 1;
    return 0;
}

static int scenarios_known(void)
{
    if (strcmp(cfg.scenario, "all") == 0)
        return 1;
    for (const char *p = cfg.scenario; p; p = next_item(p)) {
        size_t len = strcspn(p, ",");
        int known = 0;
        for (size_t i = 0; i < sizeof scenario_names / sizeof scenario_names[0]; i++)
            known |= strlen(scenario_names[i]) == len && strncmp(p, scenario_names[i], len) == 0;
        if (!known)
            return 0;
    }
    return 1;
}

/* --count-allocs: find the interposer's counters, or re-execute this program with
 * the interposer preloaded (once: the new process finds them). */
static void start_counting_pass(char **argv)
{
    alloc_counting = (void (*)(int))dlsym(RTLD_DEFAULT, "parley_bench_alloc_counting");
    alloc_read = (void (*)(long *, long *, long *))dlsym(RTLD_DEFAULT, "parley_bench_alloc_read");
    if (alloc_counting && alloc_read)
        return;
    if (getenv("PARLEY_BENCH_COUNTING"))
        die("--count-allocs: %s is preloaded but has no counters", PARLEY_BENCH_ALLOC_LIB);
    if (access(PARLEY_BENCH_ALLOC_LIB, R_OK) != 0)
        die("--count-allocs: %s not found (build the parley-bench-alloc target)",
            PARLEY_BENCH_ALLOC_LIB);
    const char *old = getenv("LD_PRELOAD");
    char preload[PATH_MAX * 2];
    snprintf(preload, sizeof preload, "%s%s%s", PARLEY_BENCH_ALLOC_LIB, old && *old ? ":" : "",
             old ? old : "");
    setenv("LD_PRELOAD", preload, 1);
    setenv("PARLEY_BENCH_COUNTING", "1", 1); /* no second re-execution */
    fflush(NULL);
    execv("/proc/self/exe", argv);
    die("--count-allocs: cannot re-execute with LD_PRELOAD: %s", strerror(errno));
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: parley-bench [options]\n"
            "  --scenario seq|concurrent|store-seq|store-concurrent|all   (all; or a list: seq,concurrent)\n"
            "  --store-dir DIR                 store files of the store scenarios (a temp dir)\n"
            "  --store-seq-latency-ms N        server latency of store-seq (0)\n"
            "  --history-sync normal|full      history_sync of the SQLite phases (normal)\n"
            "  --fsync-delay-ms N              SQLite phases: each fsync sleeps N ms first (0)\n"
            "  --plugin PATH                   parley.so (%s)\n"
            "  --fake-llm PATH                 parley-fake-llm (%s)\n"
            "  --seq-turns N                   measured sequential turns (2000)\n"
            "  --seq-repeats N                 (5)\n"
            "  --conc-conversations N          conversations in flight at once (10000)\n"
            "  --conc-turns N                  turns per conversation, 1..%d (3)\n"
            "  --conc-latency-ms N             server latency (200)\n"
            "  --conc-repeats N                (3)\n"
            "  --conc-max-connections N        Parley's max_connections (0 = conversations, like the floor)\n"
            "  --server-threads N              fake server threads, concurrent scenario (2)\n"
            "  --phase-timeout-s N             kill a phase after N s (120)\n"
            "  --summary-file PATH             also write the medians as key=value lines\n"
            "  --no-limit                      scenarios 1 and 2 without the raw epoll client\n"
            "  --pin-cpus                      the fake server on the last CPU, each client on CPU 0\n"
            "                                  (steadier sequential ratios; see docs/performance.md)\n"
            "  --seq-chain                     scenario 1: Parley's host submits each next turn from\n"
            "                                  the done callback instead of a thread waiting for it\n"
            "                                  (what the hand-off between threads costs)\n"
            "  --count-allocs                  the counting pass: re-run under LD_PRELOAD=%s\n"
            "                                  and count heap allocations per turn in every\n"
            "                                  measured window (its timings are not the benchmark's)\n"
            "  --verbose                       show the plugin's warnings\n",
            PARLEY_BENCH_PLUGIN, PARLEY_BENCH_FAKE_LLM, MAX_CONC_TURNS, PARLEY_BENCH_ALLOC_LIB);
}

static int int_arg(const char *name, const char *v, int lo, int hi)
{
    char *end;
    long x = strtol(v, &end, 10);
    if (*v == '\0' || *end != '\0' || x < lo || x > hi) {
        fprintf(stderr, "parley-bench: %s must be an integer from %d to %d\n", name, lo, hi);
        exit(2);
    }
    return (int)x;
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        }
        static const struct {
            const char *name;
            int *field;
            int value;
        } switches[] = {
            {"--verbose", &cfg.verbose, 1},     {"--no-limit", &cfg.limit, 0},
            {"--count-allocs", &cfg.count_allocs, 1}, {"--pin-cpus", &cfg.pin_cpus, 1},
            {"--seq-chain", &cfg.seq_chain, 1},
        };
        size_t sw = 0;
        while (sw < sizeof switches / sizeof switches[0] && strcmp(a, switches[sw].name) != 0)
            sw++;
        if (sw < sizeof switches / sizeof switches[0]) { /* an option without a value */
            *switches[sw].field = switches[sw].value;
            continue;
        }
        if (!v) {
            usage(stderr);
            return 2;
        }
        i++;
        if (strcmp(a, "--scenario") == 0)
            cfg.scenario = v;
        else if (strcmp(a, "--plugin") == 0)
            cfg.plugin = v;
        else if (strcmp(a, "--fake-llm") == 0)
            cfg.fake_llm = v;
        else if (strcmp(a, "--summary-file") == 0)
            cfg.summary_file = v;
        else if (strcmp(a, "--store-dir") == 0)
            cfg.store_dir = v;
        else if (strcmp(a, "--history-sync") == 0)
            cfg.history_sync = v;
        else if (strcmp(a, "--fsync-delay-ms") == 0)
            cfg.fsync_delay_ms = int_arg(a, v, 0, 10000);
        else if (strcmp(a, "--store-seq-latency-ms") == 0)
            cfg.store_seq_latency_ms = int_arg(a, v, 0, 60000);
        else if (strcmp(a, "--seq-turns") == 0)
            cfg.seq_turns = int_arg(a, v, 1, 10000000);
        else if (strcmp(a, "--seq-repeats") == 0)
            cfg.seq_repeats = int_arg(a, v, 1, 64);
        else if (strcmp(a, "--conc-conversations") == 0)
            cfg.conc_conversations = int_arg(a, v, 1, 1000000);
        else if (strcmp(a, "--conc-turns") == 0)
            cfg.conc_turns = int_arg(a, v, 1, MAX_CONC_TURNS);
        else if (strcmp(a, "--conc-latency-ms") == 0)
            cfg.conc_latency_ms = int_arg(a, v, 0, 60000);
        else if (strcmp(a, "--conc-repeats") == 0)
            cfg.conc_repeats = int_arg(a, v, 1, 64);
        else if (strcmp(a, "--conc-max-connections") == 0)
            cfg.conc_max_connections = int_arg(a, v, 0, 100000);
        else if (strcmp(a, "--server-threads") == 0)
            cfg.server_threads = int_arg(a, v, 1, 1024);
        else if (strcmp(a, "--phase-timeout-s") == 0)
            cfg.phase_timeout_s = int_arg(a, v, 10, 3600);
        else {
            usage(stderr);
            return 2;
        }
    }
    int do_seq = scenario_chosen("seq"), do_conc = scenario_chosen("concurrent");
    int do_store_seq = scenario_chosen("store-seq");
    int do_store_conc = scenario_chosen("store-concurrent");
    if (!scenarios_known() || (!do_seq && !do_conc && !do_store_seq && !do_store_conc)) {
        usage(stderr);
        return 2;
    }
    if (cfg.count_allocs)
        start_counting_pass(argv);
    if (access(cfg.plugin, R_OK) != 0)
        die("plugin not found: %s (--plugin)", cfg.plugin);
    if (access(cfg.fake_llm, X_OK) != 0)
        die("fake server not found: %s (--fake-llm)", cfg.fake_llm);
    raise_nofile();
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    if (do_conc && rl.rlim_cur < (rlim_t)cfg.conc_conversations + 64)
        fprintf(stderr,
                "parley-bench: warning: RLIMIT_NOFILE is %llu, fewer than %d connections need\n",
                (unsigned long long)rl.rlim_cur, cfg.conc_conversations + 64);
    snprintf(workdir, sizeof workdir, "/tmp/parley-bench.XXXXXX");
    if (!mkdtemp(workdir))
        die("mkdtemp: %s", strerror(errno));
    if (cfg.summary_file && !(summary = fopen(cfg.summary_file, "w")))
        die("cannot write %s", cfg.summary_file);
    signal(SIGPIPE, SIG_IGN);

    printf("parley-bench: plugin %s\n              server %s (127.0.0.1 only)\n", cfg.plugin,
           cfg.fake_llm);
    char load_before[64];
    load_average(load_before, sizeof load_before);
    printf("              %ld CPUs online, load average (1/5/15 min) %s\n\n",
           sysconf(_SC_NPROCESSORS_ONLN), load_before);
    capture_bodies();

    struct scenario_figures seq, conc_fg, store_seq, store_conc;
    if (do_seq)
        scenario("seq", cfg.seq_repeats, 0, 2, 64, phase_seq_parley, phase_seq_floor,
                 cfg.limit ? phase_seq_limit : NULL, &seq);
    if (do_conc)
        scenario("concurrent", cfg.conc_repeats, cfg.conc_latency_ms, cfg.server_threads,
                 2 * cfg.conc_conversations + 64, phase_conc_parley, phase_conc_floor,
                 cfg.limit ? phase_conc_limit : NULL, &conc_fg);
    side_a = "sqlite";
    side_b = "memory";
    if (do_store_seq)
        scenario("store-seq", cfg.seq_repeats, cfg.store_seq_latency_ms, 2, 64, phase_seq_sqlite,
                 phase_seq_parley, NULL, &store_seq);
    if (do_store_conc)
        scenario("store-concurrent", cfg.conc_repeats, cfg.conc_latency_ms, cfg.server_threads,
                 2 * cfg.conc_conversations + 64, phase_conc_sqlite, phase_conc_parley, NULL,
                 &store_conc);
    char load_after[64];
    load_average(load_after, sizeof load_after);
    printf("\nLoad average (1/5/15 min): %s at the start, %s at the end; %ld CPUs online.\n",
           load_before, load_after, sysconf(_SC_NPROCESSORS_ONLN));
    if (summary)
        fprintf(summary, "load.before=%s\nload.after=%s\nnproc=%ld\n", load_before, load_after,
                sysconf(_SC_NPROCESSORS_ONLN));
    if (do_seq)
        report_seq(&seq);
    if (do_conc)
        report_conc(&conc_fg);
    if (do_store_seq)
        report_store_seq(&store_seq);
    if (do_store_conc)
        report_store_conc(&store_conc);
    if (summary)
        fclose(summary);
    rmdir(workdir);
    return 0;
}
