/*
 * redis_bench.c -- what a shared Redis history costs (docs/performance.md,
 * "Redis store").
 *
 *   redis-bench [--turns N] [--repeats N] [--inflight N] [--latency-ms N]
 *               [--seq-latency-ms N] [--verbose]
 *
 * Starts parley-fake-llm and a redis-server (loopback, free port, temporary
 * directory, no persistence) as children, then measures, each phase in a
 * forked process of its own that loads parley.so through the ABI:
 *
 *  1. sequential turns on one conversation (history sent and stored each
 *     turn), history_store "memory" vs "redis://..." alternating, `repeats`
 *     runs each: median time per turn and the ratio redis / memory;
 *  2. `inflight` turns at once across two host processes on one Redis, each
 *     host submitting one turn to each of inflight/2 conversations that both
 *     hosts share (so every conversation has two turns racing for its lease):
 *     throughput, failures, and whether each conversation ended with exactly
 *     its two turns.  The same load on two memory hosts (nothing shared, no
 *     leases) is the floor.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <parley/plugin.h>

static struct {
    const char *plugin, *fake_llm;
    int turns, repeats, inflight, latency_ms, seq_latency_ms, verbose;
} cfg = {PARLEY_BENCH_PLUGIN, PARLEY_BENCH_FAKE_LLM, 2000, 5, 1000, 100, 0, 0};

static int llm_port, redis_port;

static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "redis-bench: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- children: the fake LLM and redis-server ---- */

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0)
        die("no free port: %s", strerror(errno));
    close(fd);
    return ntohs(a.sin_port);
}

static int accepts(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int ok = fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
    if (fd >= 0)
        close(fd);
    return ok;
}

static pid_t spawn(const char *const argv[])
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        die("fork: %s", strerror(errno));
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the bench */
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0)
            dup2(devnull, STDOUT_FILENO);
        execvp(argv[0], (char *const *)argv);
        fprintf(stderr, "redis-bench: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    return pid;
}

static void wait_listening(pid_t pid, int port, const char *what)
{
    for (int i = 0; i < 1000; i++) {
        if (accepts(port))
            return;
        if (waitpid(pid, NULL, WNOHANG) == pid)
            die("%s exited before listening", what);
        sleep_ms(10);
    }
    die("%s is not listening on %d after 10 s", what, port);
}

static void stop(pid_t pid)
{
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
}

/* ---- Parley through the ABI ---- */

static const parley_plugin *load_plugin(void)
{
    void *so = dlopen(cfg.plugin, RTLD_NOW | RTLD_LOCAL);
    if (!so)
        die("dlopen %s: %s", cfg.plugin, dlerror());
    parley_entry_fn entry = (parley_entry_fn)dlsym(so, PARLEY_ENTRY_SYMBOL);
    const parley_plugin *p = entry ? entry(PARLEY_ABI_VERSION) : NULL;
    if (!p)
        die("%s: no compatible %s", cfg.plugin, PARLEY_ENTRY_SYMBOL);
    return p;
}

static void on_log(void *host_data, parley_log_level level, const char *message)
{
    (void)host_data;
    if (level <= PARLEY_LOG_WARN && cfg.verbose)
        fprintf(stderr, "parley: %s\n", message);
}

/* store: "memory" or "redis"; prefix keeps runs apart on the one Redis. */
static parley_agent *make_agent(const parley_plugin *p, const char *store, const char *prefix)
{
    static const parley_host host = {.struct_size = sizeof host, .log = on_log};
    char history[128], *options = NULL;
    if (strcmp(store, "redis") == 0)
        snprintf(history, sizeof history, "redis://127.0.0.1:%d", redis_port);
    else
        snprintf(history, sizeof history, "memory");
    if (asprintf(&options,
                 "{\"base_url\":\"http://127.0.0.1:%d/v1\",\"model\":\"fake-model\","
                 "\"max_history_turns\":20,\"summarize\":false,\"max_in_flight\":100000,"
                 "\"turn_timeout_ms\":120000,"
                 "\"request_timeout_ms\":120000,\"history_store\":\"%s\","
                 "\"history_key_prefix\":\"%s\"}",
                 llm_port, history, prefix) < 0)
        die("out of memory");
    char *err = NULL;
    parley_agent *a = p->create(&host, options, &err);
    free(options);
    if (!a)
        die("create (%s): %s", store, err ? err : "failed");
    return a;
}

/* Counts done callbacks; the host thread waits for `target`. */
struct waiter {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done, failed, target;
    char first_error[200];
};

static void on_done(void *user_data, const parley_result *res)
{
    struct waiter *w = user_data;
    pthread_mutex_lock(&w->mu);
    if (res->status != PARLEY_OK && !w->failed++)
        snprintf(w->first_error, sizeof w->first_error, "%s",
                 res->error_message ? res->error_message : "?");
    if (++w->done >= w->target)
        pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static void wait_all(struct waiter *w)
{
    pthread_mutex_lock(&w->mu);
    while (w->done < w->target)
        pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
}

static void submit(const parley_plugin *p, parley_agent *a, struct waiter *w, const char *text,
                   const char *conversation)
{
    parley_input in = {.struct_size = sizeof in, .text = text, .conversation_id = conversation};
    char *err = NULL;
    if (p->async_process(a, &in, on_done, w, NULL, &err) != PARLEY_OK)
        die("async_process: %s", err ? err : "?");
}

/* ---- phase 1: sequential turns ---- */

/* Seconds per turn over cfg.turns turns (after 100 warm-up turns). */
static double seq_phase(const char *store, int run)
{
    const parley_plugin *p = load_plugin();
    char prefix[64];
    snprintf(prefix, sizeof prefix, "bench-seq-%d-%d:", (int)getpid(), run);
    parley_agent *a = make_agent(p, store, prefix);
    struct waiter w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0, ""};
    double start = 0;
    for (int i = -100; i < cfg.turns; i++) {
        if (i == 0)
            start = now_s();
        char text[128];
        snprintf(text, sizeof text, "[[latency:%d]] Turn %06d: turn on the kitchen lights, 21 degrees",
                 cfg.seq_latency_ms, i + 100);
        w.target = w.done + 1;
        submit(p, a, &w, text, "kitchen");
        wait_all(&w);
        if (w.failed)
            die("%s turn failed: %s", store, w.first_error);
    }
    double per_turn = (now_s() - start) / cfg.turns;
    p->destroy(a);
    return per_turn;
}

/* ---- phase 2: turns in flight across two hosts ---- */

struct conc_result {
    double seconds;
    int failed;
    int wrong; /* shared conversations without exactly their two turns */
    char first_error[200];
};

/* One host: one turn on each of n conversations, all submitted at once. */
static struct conc_result conc_host(const char *store, const char *prefix, int host, int n,
                                    int ready_fd, int go_fd)
{
    const parley_plugin *p = load_plugin();
    parley_agent *a = make_agent(p, store, prefix);
    struct waiter w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, n, ""};
    char go;
    if (write(ready_fd, "r", 1) != 1 || read(go_fd, &go, 1) != 1) /* both hosts start together */
        die("sync pipe");
    double start = now_s();
    for (int i = 0; i < n; i++) {
        char text[128], id[32];
        snprintf(text, sizeof text, "[[latency:%d]] host %d asks in conversation %d",
                 cfg.latency_ms, host, i);
        snprintf(id, sizeof id, "shared-%05d", i);
        submit(p, a, &w, text, id);
    }
    wait_all(&w);
    struct conc_result r = {now_s() - start, w.failed, 0, ""};
    snprintf(r.first_error, sizeof r.first_error, "%s", w.first_error);
    p->destroy(a);
    return r;
}

/* After both hosts are done: how many shared conversations do not hold
 * exactly their two turns (one per host)?  Runs in a forked process. */
static int count_wrong(const char *prefix, int n)
{
    const parley_plugin *p = load_plugin();
    parley_agent *a = make_agent(p, "redis", prefix);
    int wrong = 0;
    for (int i = 0; i < n; i++) {
        char id[32], *json = NULL;
        snprintf(id, sizeof id, "shared-%05d", i);
        if (p->history_get(a, id, &json) != PARLEY_OK) {
            wrong++;
            continue;
        }
        int turns = 0;
        for (const char *q = json; (q = strstr(q, "\"turn_id\"")); q++)
            turns++;
        wrong += turns != 2;
        p->free_string(json);
    }
    p->destroy(a);
    return wrong;
}

/* Two host processes on `store`; the slower host's time is the run's. */
static void conc_phase(const char *store, int run, struct conc_result *out)
{
    char prefix[64];
    snprintf(prefix, sizeof prefix, "bench-conc-%d-%d:", (int)getpid(), run);
    int per_host = cfg.inflight / 2, results[2][2], ready[2], go[2];
    pid_t pids[2];
    if (pipe(ready) || pipe(go))
        die("pipe");
    for (int h = 0; h < 2; h++) {
        if (pipe(results[h]))
            die("pipe");
        fflush(NULL);
        pids[h] = fork();
        if (pids[h] == 0) {
            struct conc_result r = conc_host(store, prefix, h, per_host, ready[1], go[0]);
            if (write(results[h][1], &r, sizeof r) != (ssize_t)sizeof r)
                _exit(1);
            _exit(0);
        }
    }
    char c;
    for (int h = 0; h < 2; h++)
        if (read(ready[0], &c, 1) != 1)
            die("a host died before starting");
    if (write(go[1], "gg", 2) != 2)
        die("sync pipe");
    memset(out, 0, sizeof *out);
    for (int h = 0; h < 2; h++) {
        struct conc_result r;
        if (read(results[h][0], &r, sizeof r) != (ssize_t)sizeof r)
            die("host %d died", h);
        waitpid(pids[h], NULL, 0);
        if (r.seconds > out->seconds)
            out->seconds = r.seconds;
        out->failed += r.failed;
        if (r.first_error[0] && !out->first_error[0])
            memcpy(out->first_error, r.first_error, sizeof r.first_error);
        close(results[h][0]);
        close(results[h][1]);
    }
    close(ready[0]), close(ready[1]), close(go[0]), close(go[1]);
    if (strcmp(store, "redis") == 0) {
        int fds[2];
        if (pipe(fds))
            die("pipe");
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            int wrong = count_wrong(prefix, per_host);
            _exit(write(fds[1], &wrong, sizeof wrong) == (ssize_t)sizeof wrong ? 0 : 1);
        }
        int wrong = -1;
        if (read(fds[0], &wrong, sizeof wrong) != (ssize_t)sizeof wrong)
            die("the check died");
        waitpid(pid, NULL, 0);
        close(fds[0]);
        close(fds[1]);
        out->wrong = wrong;
    }
}

/* ---- the run ---- */

/* One phase in a forked process, its double result through a pipe. */
static double forked_seq(const char *store, int run)
{
    int fds[2];
    if (pipe(fds))
        die("pipe");
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        double v = seq_phase(store, run);
        _exit(write(fds[1], &v, sizeof v) == (ssize_t)sizeof v ? 0 : 1);
    }
    double v = 0;
    if (read(fds[0], &v, sizeof v) != (ssize_t)sizeof v)
        die("sequential phase (%s) died", store);
    waitpid(pid, NULL, 0);
    close(fds[0]);
    close(fds[1]);
    return v;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static int int_arg(const char *name, const char *v)
{
    if (!v || atoi(v) <= 0)
        die("%s needs a positive number", name);
    return atoi(v);
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--verbose") == 0) {
            cfg.verbose = 1;
            continue;
        }
        if (strcmp(a, "--turns") == 0)
            cfg.turns = int_arg(a, v);
        else if (strcmp(a, "--repeats") == 0)
            cfg.repeats = int_arg(a, v);
        else if (strcmp(a, "--inflight") == 0)
            cfg.inflight = int_arg(a, v);
        else if (strcmp(a, "--latency-ms") == 0)
            cfg.latency_ms = int_arg(a, v);
        else if (strcmp(a, "--seq-latency-ms") == 0)
            cfg.seq_latency_ms = v ? atoi(v) : 0;
        else if (strcmp(a, "--plugin") == 0 && v)
            cfg.plugin = v;
        else if (strcmp(a, "--fake-llm") == 0 && v)
            cfg.fake_llm = v;
        else
            die("usage: redis-bench [--turns N] [--repeats N] [--inflight N] [--latency-ms N] "
                "[--seq-latency-ms N] "
                "[--plugin PATH] [--fake-llm PATH] [--verbose]");
        i++;
    }
    char dir[] = "/tmp/parley-redis-bench-XXXXXX", port[16], lport[16];
    if (!mkdtemp(dir))
        die("mkdtemp: %s", strerror(errno));
    redis_port = free_port();
    snprintf(port, sizeof port, "%d", redis_port);
    const char *redis_argv[] = {"redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "",
                                "--appendonly", "no", "--dir", dir, "--maxclients", "1000", NULL};
    pid_t redis = spawn(redis_argv);
    wait_listening(redis, redis_port, "redis-server");
    llm_port = free_port();
    snprintf(lport, sizeof lport, "%d", llm_port);
    const char *llm_argv[] = {cfg.fake_llm, "--host", "127.0.0.1", "--port", lport, "--threads", "2",
                              "--max-connections", "20000", "--quiet", NULL};
    pid_t llm = spawn(llm_argv);
    wait_listening(llm, llm_port, "parley-fake-llm");

    printf("== 1. sequential turns on one conversation (20-turn history), %d turns x %d runs, "
           "%d ms LLM latency\n", cfg.turns, cfg.repeats, cfg.seq_latency_ms);
    double *mem = calloc((size_t)cfg.repeats, sizeof *mem);
    double *red = calloc((size_t)cfg.repeats, sizeof *red);
    for (int r = 0; r < cfg.repeats; r++) { /* alternate which goes first */
        if (r % 2) {
            red[r] = forked_seq("redis", r);
            mem[r] = forked_seq("memory", r);
        } else {
            mem[r] = forked_seq("memory", r);
            red[r] = forked_seq("redis", r);
        }
        printf("   run %d: memory %.1f us/turn, redis %.1f us/turn\n", r + 1, mem[r] * 1e6,
               red[r] * 1e6);
    }
    double m = median(mem, cfg.repeats), rd = median(red, cfg.repeats);
    printf("   median: memory %.1f us/turn (%.0f turns/s), redis %.1f us/turn (%.0f turns/s), "
           "ratio %.2f x (target <= 1.15 x)\n",
           m * 1e6, 1 / m, rd * 1e6, 1 / rd, rd / m);

    printf("== 2. %d turns in flight across two hosts (%d shared conversations, 2 turns each), "
           "%d ms LLM latency\n", cfg.inflight, cfg.inflight / 2, cfg.latency_ms);
    for (int r = 0; r < 3; r++) {
        struct conc_result mr, rr;
        conc_phase("memory", r, &mr);
        conc_phase("redis", r, &rr);
        printf("   run %d: memory (not shared) %.2f s, %.0f turns/s, %d failed | redis %.2f s, "
               "%.0f turns/s, %d failed, %d conversations without exactly their 2 turns%s%s\n",
               r + 1, mr.seconds, cfg.inflight / mr.seconds, mr.failed, rr.seconds,
               cfg.inflight / rr.seconds, rr.failed, rr.wrong, rr.first_error[0] ? ": " : "",
               rr.first_error);
    }
    stop(llm);
    stop(redis);
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "redis-bench: could not remove %s\n", dir);
    free(mem);
    free(red);
    return 0;
}
