/* parley-fake-llm: command line, daemon lifecycle, signals. */
#include "fakellm.h"

#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct config g_cfg = {
    .host = "127.0.0.1",
    .threads = 2,
    .max_connections = 20000,
    .fault = {.kind = FAULT_NONE, .retry_after = -1},
    .cache = CACHE_LLAMACPP,
    .slots = 1,
    .overflow_style = OVERFLOW_LLAMACPP,
    .cache_min = 1024,
    .cache_ttl_ms = 300000,
};
atomic_bool g_shutting_down;
atomic_long g_suspended;
atomic_ulong g_seq;

static void usage(FILE *out)
{
    fputs("usage: parley-fake-llm [--host 127.0.0.1] [--port N] [--port-file FILE]\n"
          "                       [--log FILE] [--latency-ms N] [--fault MODE]\n"
          "                       [--threads N] [--max-connections N] [--quiet]\n"
          "                       [--n-ctx N] [--cache llamacpp|anthropic|openai|none]\n"
          "                       [--slots N] [--overflow-style llamacpp|openai|vllm|llamacpp-old]\n"
          "                       [--cache-min N] [--cache-ttl-ms N] [--honor-max-tokens]\n"
          "                       [--cache-ram N] [--strict-template none|qwen|gemma]\n"
          "fault modes: none 500 502 503 429 429:S NNNxK 429:SxK hang truncated not_json\n"
          "  bad_shape[:empty_choices|:null_message] invalid_utf8 reset oversized[:MB]\n"
          "  endless_tools slow_stream[:MS] stream_cut[:abort]\n",
          out);
}

static unsigned long num_arg(const char *opt, const char *s, unsigned long max)
{
    unsigned long v;
    if (!parse_ulong(s, strlen(s), &v) || v > max) {
        fprintf(stderr, "parley-fake-llm: bad value for --%s: '%s'\n", opt, s);
        exit(2);
    }
    return v;
}

/* In enum cache_mode's and enum overflow_style's order. */
static const char *const CACHE_MODES[] = {"llamacpp", "anthropic", "openai", "none", NULL};
static const char *const OVERFLOW_STYLES[] = {"llamacpp", "openai", "vllm", "llamacpp-old", NULL};
static const char *const STRICT_TEMPLATES[] = {"none", "qwen", "gemma", NULL};

static int word_arg(const char *opt, const char *s, const char *const *words)
{
    for (int i = 0; words[i]; i++)
        if (strcmp(s, words[i]) == 0)
            return i;
    fprintf(stderr, "parley-fake-llm: bad value for --%s: '%s'\n", opt, s);
    exit(2);
}

static void parse_args(int argc, char **argv)
{
    static const struct option opts[] = {
        {"host", required_argument, NULL, 'H'},
        {"port", required_argument, NULL, 'p'},
        {"port-file", required_argument, NULL, 'P'},
        {"log", required_argument, NULL, 'l'},
        {"latency-ms", required_argument, NULL, 'L'},
        {"fault", required_argument, NULL, 'f'},
        {"threads", required_argument, NULL, 't'},
        {"max-connections", required_argument, NULL, 'm'},
        {"quiet", no_argument, NULL, 'q'},
        {"n-ctx", required_argument, NULL, 'n'},
        {"cache", required_argument, NULL, 'c'},
        {"slots", required_argument, NULL, 's'},
        {"overflow-style", required_argument, NULL, 'o'},
        {"cache-min", required_argument, NULL, 'M'},
        {"cache-ttl-ms", required_argument, NULL, 'T'},
        {"honor-max-tokens", no_argument, NULL, 'X'},
        {"cache-ram", required_argument, NULL, 'R'},
        {"strict-template", required_argument, NULL, 'S'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'H': g_cfg.host = optarg; break;
        case 'p': g_cfg.port = (unsigned)num_arg("port", optarg, 65535); break;
        case 'P': g_cfg.port_file = optarg; break;
        case 'l': g_cfg.log_path = optarg; break;
        case 'L': g_cfg.latency_ms = num_arg("latency-ms", optarg, 3600000); break;
        case 't': g_cfg.threads = (unsigned)num_arg("threads", optarg, 1024); break;
        case 'm':
            g_cfg.max_connections = (unsigned)num_arg("max-connections", optarg, 1000000);
            break;
        case 'q': g_cfg.quiet = true; break;
        case 'n': g_cfg.n_ctx = num_arg("n-ctx", optarg, 100000000); break;
        case 's': g_cfg.slots = num_arg("slots", optarg, 256); break;
        case 'M': g_cfg.cache_min = num_arg("cache-min", optarg, 100000000); break;
        case 'X': g_cfg.honor_max_tokens = true; break;
        case 'R': g_cfg.cache_ram = num_arg("cache-ram", optarg, 4096); break;
        case 'T': g_cfg.cache_ttl_ms = num_arg("cache-ttl-ms", optarg, 86400000); break;
        case 'c': g_cfg.cache = (enum cache_mode)word_arg("cache", optarg, CACHE_MODES); break;
        case 'o':
            g_cfg.overflow_style = (enum overflow_style)word_arg("overflow-style", optarg,
                                                                 OVERFLOW_STYLES);
            break;
        case 'f':
            if (!fault_parse(optarg, strlen(optarg), &g_cfg.fault)) {
                fprintf(stderr, "parley-fake-llm: unknown fault mode '%s'\n", optarg);
                usage(stderr);
                exit(2);
            }
            break;
        case 'S':
            g_cfg.strict_template = (enum strict_template)word_arg("strict-template", optarg,
                                                                   STRICT_TEMPLATES);
            break;
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); exit(2);
        }
    }
    if (optind < argc) {
        usage(stderr);
        exit(2);
    }
    if (g_cfg.threads == 0)
        g_cfg.threads = 1;
    if (g_cfg.slots == 0)
        g_cfg.slots = 1;
    if (g_cfg.max_connections < g_cfg.threads)
        g_cfg.max_connections = g_cfg.threads;
}

/* Every connection is a file descriptor: allow as many as the hard limit. */
static void raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

static bool write_port_file(const char *path, unsigned port)
{
    /* tmp + rename: readers see either no file or the whole number. */
    size_t n = strlen(path) + 32;
    char *tmp = xmalloc(n);
    snprintf(tmp, n, "%s.tmp.%ld", path, (long)getpid());
    FILE *fp = fopen(tmp, "w");
    bool ok = fp && fprintf(fp, "%u\n", port) > 0;
    if (fp && fclose(fp) != 0)
        ok = false;
    if (ok && rename(tmp, path) != 0)
        ok = false;
    if (!ok)
        unlink(tmp);
    free(tmp);
    return ok;
}

static void wait_for_resumed(void)
{
    /* Resumed connections get closed by MHD's workers; MHD must not be
     * stopped while any is still suspended. */
    for (int i = 0; i < 300 && atomic_load(&g_suspended) > 0; i++) {
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

int main(int argc, char **argv)
{
    parse_args(argc, argv);
    raise_nofile();

    union {
        struct sockaddr sa;
        struct sockaddr_in v4;
        struct sockaddr_in6 v6;
    } addr;
    memset(&addr, 0, sizeof addr);
    const char *host = strcmp(g_cfg.host, "localhost") == 0 ? "127.0.0.1" : g_cfg.host;
    bool v6 = false;
    if (inet_pton(AF_INET, host, &addr.v4.sin_addr) == 1) {
        addr.v4.sin_family = AF_INET;
        addr.v4.sin_port = htons((uint16_t)g_cfg.port);
    } else if (inet_pton(AF_INET6, host, &addr.v6.sin6_addr) == 1) {
        addr.v6.sin6_family = AF_INET6;
        addr.v6.sin6_port = htons((uint16_t)g_cfg.port);
        v6 = true;
    } else {
        fprintf(stderr, "parley-fake-llm: --host must be an IPv4/IPv6 address: '%s'\n",
                g_cfg.host);
        return 2;
    }

    if (g_cfg.log_path && !reqlog_open(g_cfg.log_path)) {
        fprintf(stderr, "parley-fake-llm: cannot open log '%s': %s\n", g_cfg.log_path,
                strerror(errno));
        return 1;
    }

    /* Threads inherit this mask, so only sigwait() below sees the signals. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    timer_start();

    /* header_flood needs room for its headers; it is a command-line fault for that. */
    size_t memory_limit = 16 * 1024;
    if (g_cfg.fault.kind == FAULT_HEADER_FLOOD)
        memory_limit = g_cfg.fault.arg * 1024 * 2 + 64 * 1024;
    struct MHD_OptionItem opts[] = {
        {MHD_OPTION_SOCK_ADDR, 0, &addr.sa},
        {MHD_OPTION_NOTIFY_COMPLETED, (intptr_t)http_completed, NULL},
        {MHD_OPTION_CONNECTION_LIMIT, (intptr_t)g_cfg.max_connections, NULL},
        {MHD_OPTION_CONNECTION_TIMEOUT, 120, NULL},
        /* Per-connection pool (headers + I/O buffers); MHD's 32 KiB default
         * costs a lot of page faults with 10,000 connections. Bodies are
         * collected in our own buffer, so this only bounds the headers. */
        {MHD_OPTION_CONNECTION_MEMORY_LIMIT, (intptr_t)memory_limit, NULL},
        {MHD_OPTION_LISTEN_BACKLOG_SIZE, 4096, NULL},
        {MHD_OPTION_THREAD_POOL_SIZE, (intptr_t)g_cfg.threads, NULL},
        {MHD_OPTION_END, 0, NULL},
    };
    if (g_cfg.threads < 2) /* a pool of one is just the internal thread */
        opts[5].option = MHD_OPTION_END;
    unsigned flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME;
    if (!g_cfg.quiet)
        flags |= MHD_USE_ERROR_LOG;
    if (v6)
        flags |= MHD_USE_IPv6;

    struct MHD_Daemon *d = MHD_start_daemon(flags, (uint16_t)g_cfg.port, NULL, NULL,
                                            http_handler, NULL, MHD_OPTION_ARRAY, opts,
                                            MHD_OPTION_END);
    if (!d) {
        fprintf(stderr, "parley-fake-llm: cannot listen on %s:%u\n", g_cfg.host, g_cfg.port);
        timer_stop();
        reqlog_close();
        return 1;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    unsigned port = info ? info->port : g_cfg.port;
    if (g_cfg.port_file && !write_port_file(g_cfg.port_file, port))
        fprintf(stderr, "parley-fake-llm: cannot write port file '%s'\n", g_cfg.port_file);
    printf("listening on %u\n", port);
    fflush(stdout);

    int sig = 0;
    sigwait(&sigs, &sig);
    if (!g_cfg.quiet)
        fprintf(stderr, "parley-fake-llm: signal %d, shutting down\n", sig);

    atomic_store(&g_shutting_down, true);
    timer_stop(); /* resumes every delayed / hung connection */
    wait_for_resumed();
    MHD_stop_daemon(d);
    reqlog_close();
    faults_cleanup();
    prompt_cleanup();
    return 0;
}
