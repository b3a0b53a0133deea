/*
 * main.c -- parley-host: command line, signals, loading the plugin, creating
 * the agent, and an orderly teardown (destroy, then tool handles, then
 * dlclose).
 *
 * Exit codes: 0 done (even if turns failed: those are reported in the
 * output), 1 create() failed, 2 usage / options / tools / loading error,
 * 128+signal after SIGINT or SIGTERM (a second one exits at once).
 */
#include <dlfcn.h>
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "metrics_http.h"
#include "shim.h"

struct shim g_shim = {
    .mu = PTHREAD_MUTEX_INITIALIZER,
    .cv = PTHREAD_COND_INITIALIZER,
    .log_level = PARLEY_LOG_WARN,
    .wake_fd = -1,
};

static int wake_pipe[2] = {-1, -1};
static pthread_t sig_thread;
static sigset_t sig_set;

static void usage(FILE *f)
{
    fputs("usage: parley-host --plugin PATH --options FILE [--set KEY=JSON]...\n"
          "                   [--tools FILE|demo] [--jsonl] [--concurrency N]\n"
          "                   [--log-level error|warn|info|debug] [--metrics-listen ADDR:PORT]\n"
          "       parley-host --plugin PATH --options FILE [--set KEY=JSON]... --check\n"
          "       parley-host --plugin PATH --print-schema\n"
          "\n"
          "  --plugin PATH       parley.so to load\n"
          "  --options FILE      agent options (a JSON object)\n"
          "  --set KEY=JSON      set one top-level option; a value that is not valid\n"
          "                      JSON is taken as a string (repeatable)\n"
          "  --tools FILE|demo   tools to offer: a tools file, or the built-in demo home\n"
          "  --jsonl             read JSON lines on stdin, write JSON lines on stdout\n"
          "  --concurrency N     JSONL: at most N turns in flight (1..100000, default 1)\n"
          "  --log-level LEVEL   plugin/host messages shown on stderr (default warn)\n"
          "  --check             check the connection (list the server's models), then exit\n"
          "  --metrics-listen ADDR:PORT  serve Prometheus metrics at http://ADDR:PORT/metrics\n"
          "                      (loopback only: 127.0.0.1, localhost, [::1])\n"
          "  --print-schema      print the options' JSON Schema, then exit\n"
          "\n"
          "Interactive mode (default): type a message, or /help for commands.\n"
          "See docs/shim.md.\n",
          f);
}

static int usage_error(const char *fmt, const char *arg)
{
    fputs("parley-host: ", stderr);
    fprintf(stderr, fmt, arg);
    fputs("\n(try parley-host --help)\n", stderr);
    return 2;
}

/* SIGINT/SIGTERM are blocked everywhere (threads inherit the mask) and
 * taken here, where it is safe to lock, broadcast and write. */
static void *signal_thread(void *arg)
{
    (void)arg;
    for (;;) {
        int sig = 0;
        if (sigwait(&sig_set, &sig) != 0)
            continue;
        if (sig == SIGUSR1)
            return NULL; /* our own shutdown request */
        if (sig == SIGINT && atomic_load(&g_shim.turn_in_flight) &&
            !atomic_exchange(&g_shim.cancel_requested, 1)) {
            /* Interactive: the first Ctrl-C cancels the turn in flight. */
            pthread_mutex_lock(&g_shim.mu);
            pthread_cond_broadcast(&g_shim.cv);
            pthread_mutex_unlock(&g_shim.mu);
            continue;
        }
        if (atomic_load(&g_shim.interrupted) != 0)
            _exit(128 + sig); /* second signal: the orderly shutdown is stuck */
        pthread_mutex_lock(&g_shim.mu);
        atomic_store(&g_shim.interrupted, sig);
        pthread_cond_broadcast(&g_shim.cv);
        pthread_mutex_unlock(&g_shim.mu);
        ssize_t w;
        do
            w = write(wake_pipe[1], "x", 1);
        while (w < 0 && errno == EINTR);
    }
}

/* --set KEY=JSON: JSON if it parses, else the text as a string. */
static int apply_set(json_t *options, const char *arg)
{
    const char *eq = strchr(arg, '=');
    /* The value is never echoed: it may be the API key. */
    if (!eq || eq == arg)
        return usage_error("%s", "--set expects KEY=JSON");
    char *key = strndup(arg, (size_t)(eq - arg));
    json_t *v = json_loads(eq + 1, JSON_DECODE_ANY, NULL);
    if (!v)
        v = json_string(eq + 1);
    if (!key || !v) {
        int rc = usage_error("--set %s: the value is not valid UTF-8", key ? key : "");
        free(key);
        json_decref(v);
        return rc;
    }
    json_object_set_new(options, key, v);
    free(key);
    return 0;
}

static int parse_level(const char *s, parley_log_level *out)
{
    static const char *names[] = {"error", "warn", "info", "debug"};
    for (int i = 0; i < 4; i++) {
        if (strcmp(s, names[i]) == 0) {
            *out = (parley_log_level)i;
            return 0;
        }
    }
    return -1;
}

/* dlopen the plugin and take its function table; NULL (after saying why) on
 * failure.  Returns the dlopen handle. */
static void *load_plugin(const char *path, const parley_plugin **out)
{
    void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!dl) {
        fprintf(stderr, "parley-host: cannot load plugin: %s\n", dlerror());
        return NULL;
    }
    dlerror();
    void *sym = dlsym(dl, PARLEY_ENTRY_SYMBOL);
    parley_entry_fn entry;
    /* ISO C has no object-to-function pointer cast; POSIX guarantees the
     * representation, so copy the bits. */
    memcpy(&entry, &sym, sizeof entry);
    if (!sym) {
        const char *e = dlerror();
        fprintf(stderr, "parley-host: %s: no symbol %s: %s\n", path, PARLEY_ENTRY_SYMBOL,
                e ? e : "NULL");
        dlclose(dl);
        return NULL;
    }
    const parley_plugin *pl = entry(PARLEY_ABI_VERSION);
    if (!pl) {
        fprintf(stderr, "parley-host: %s: the plugin does not support ABI version %u\n", path,
                PARLEY_ABI_VERSION);
        dlclose(dl);
        return NULL;
    }
    /* We call every entry up to metrics; later ones only when the table has them. */
    if (!PARLEY_HAS_FIELD(pl, parley_plugin, metrics) || !pl->create || !pl->destroy ||
        !pl->async_process || !pl->cancel || !pl->complete_tool_call || !pl->free_string ||
        !pl->status_name || !pl->history_get || !pl->turn_get || !pl->conversations_list ||
        !pl->history_clear || !pl->metrics || !pl->options_schema) {
        fprintf(stderr, "parley-host: %s: incomplete plugin function table (struct_size %u)\n",
                path, (unsigned)pl->struct_size);
        dlclose(dl);
        return NULL;
    }
    diag(PARLEY_LOG_INFO, "loaded %s %s (ABI %u) from %s", pl->name ? pl->name : "?",
         pl->version ? pl->version : "?", (unsigned)pl->abi_version, path);
    *out = pl;
    return dl;
}

/* --print-schema: the options' JSON Schema, pretty, on stdout. */
static int run_print_schema(const char *plugin_path)
{
    void *dl = load_plugin(plugin_path, &g_shim.pl);
    if (!dl)
        return 2;
    char *text = g_shim.pl->options_schema();
    json_t *schema = jparse_plugin(text, json_null(), "options_schema");
    plugin_free(text);
    char *pretty = json_dumps(schema, SHIM_JSON_PRETTY);
    json_decref(schema);
    int rc = pretty ? 0 : 2;
    if (pretty)
        out_printf("%s\n", pretty);
    free(pretty);
    g_shim.pl = NULL;
    dlclose(dl);
    return rc;
}

/* --check: the plugin's connection check; its JSON on stdout, exit 0 when the
 * server answered with its models, else {"ok":false,"error":{code,message}}
 * and exit 1. */
static int run_check(const char *options_json)
{
    const parley_plugin *pl = g_shim.pl;
    if (!PARLEY_HAS_FIELD(pl, parley_plugin, check_connection) || !pl->check_connection) {
        fprintf(stderr, "parley-host: this plugin has no check_connection\n");
        return 2;
    }
    char *out = NULL, *err = NULL;
    parley_status st = pl->check_connection(options_json, &out, &err);
    json_t *v;
    if (st == PARLEY_OK) {
        v = jparse_plugin(out, json_object(), "check_connection");
    } else {
        v = json_object();
        json_object_set_new(v, "ok", json_false());
        json_object_set_new(v, "error", jerror(st, err));
    }
    plugin_free(out);
    plugin_free(err);
    char *pretty = json_dumps(v, SHIM_JSON_PRETTY);
    json_decref(v);
    if (pretty)
        out_printf("%s\n", pretty);
    free(pretty);
    return st == PARLEY_OK ? 0 : 1;
}

int main(int argc, char **argv)
{
    /* Before any thread exists (ours or the plugin's), so all inherit it. */
    sigemptyset(&sig_set);
    sigaddset(&sig_set, SIGINT);
    sigaddset(&sig_set, SIGTERM);
    sigaddset(&sig_set, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &sig_set, NULL);
    /* A shell starts background jobs with SIGINT ignored; tests still need
     * Ctrl-C semantics, so take the signals whatever we inherited. */
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGPIPE, SIG_IGN); /* a closed stdout must not kill us mid-destroy */

    enum {
        OPT_PLUGIN = 1,
        OPT_OPTIONS,
        OPT_SET,
        OPT_TOOLS,
        OPT_JSONL,
        OPT_CONC,
        OPT_LOG,
        OPT_HELP,
        OPT_CHECK,
        OPT_SCHEMA,
        OPT_METRICS
    };
    static const struct option longopts[] = {
        {"plugin", required_argument, NULL, OPT_PLUGIN},
        {"options", required_argument, NULL, OPT_OPTIONS},
        {"set", required_argument, NULL, OPT_SET},
        {"tools", required_argument, NULL, OPT_TOOLS},
        {"jsonl", no_argument, NULL, OPT_JSONL},
        {"concurrency", required_argument, NULL, OPT_CONC},
        {"log-level", required_argument, NULL, OPT_LOG},
        {"help", no_argument, NULL, OPT_HELP},
        {"check", no_argument, NULL, OPT_CHECK},
        {"print-schema", no_argument, NULL, OPT_SCHEMA},
        {"metrics-listen", required_argument, NULL, OPT_METRICS},
        {NULL, 0, NULL, 0},
    };
    const char *plugin_path = NULL, *options_path = NULL, *tools_spec = NULL;
    const char *metrics_listen = NULL;
    int jsonl = 0, check = 0, print_schema = 0;
    unsigned long concurrency = 1;
    /* --set values are applied after the options file, in order. */
    const char **sets = calloc((size_t)argc, sizeof *sets);
    size_t nsets = 0;
    if (!sets)
        return 2;

    int rc = 2, c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "+h", longopts, NULL)) != -1) {
        switch (c) {
        case OPT_PLUGIN:
            plugin_path = optarg;
            break;
        case OPT_OPTIONS:
            options_path = optarg;
            break;
        case OPT_SET:
            sets[nsets++] = optarg;
            break;
        case OPT_TOOLS:
            if (tools_spec) {
                rc = usage_error("%s", "--tools given more than once");
                goto out_args;
            }
            tools_spec = optarg;
            break;
        case OPT_JSONL:
            jsonl = 1;
            break;
        case OPT_CHECK:
            check = 1;
            break;
        case OPT_SCHEMA:
            print_schema = 1;
            break;
        case OPT_METRICS: {
            char *merr = NULL;
            if (metrics_http_parse(optarg, &merr) != 0) {
                rc = usage_error("%s", merr ? merr : "--metrics-listen: bad address");
                free(merr);
                goto out_args;
            }
            metrics_listen = optarg;
            break;
        }
        case OPT_CONC: {
            char *end;
            errno = 0;
            unsigned long n = strtoul(optarg, &end, 10);
            if (errno || end == optarg || *end || optarg[0] == '-' || n < 1 || n > 100000) {
                rc = usage_error("--concurrency must be an integer from 1 to 100000, got '%s'",
                                 optarg);
                goto out_args;
            }
            concurrency = n;
            break;
        }
        case OPT_LOG:
            if (parse_level(optarg, &g_shim.log_level) < 0) {
                rc =
                    usage_error("--log-level must be error, warn, info or debug, got '%s'", optarg);
                goto out_args;
            }
            break;
        case 'h':
        case OPT_HELP:
            usage(stdout);
            rc = 0;
            goto out_args;
        default:
            rc = usage_error("unknown or incomplete option '%s'", argv[optind - 1]);
            goto out_args;
        }
    }
    if (optind < argc) {
        rc = usage_error("unexpected argument '%s'", argv[optind]);
        goto out_args;
    }
    if (!plugin_path) {
        rc = usage_error("%s", "--plugin PATH is required");
        goto out_args;
    }
    if (print_schema) {
        rc = run_print_schema(plugin_path);
        goto out_args;
    }
    if (!options_path) {
        rc = usage_error("%s", "--options FILE is required");
        goto out_args;
    }
    if (strcmp(options_path, "-") == 0) {
        rc = usage_error("%s", "--options - is not allowed: stdin carries the conversation");
        goto out_args;
    }

    /* ---- options ---- */
    json_error_t je;
    json_t *options = json_load_file(options_path, JSON_REJECT_DUPLICATES, &je);
    if (!options) {
        if (je.line > 0) /* the reason, never jansson's quote of the text (a key?) */
            fprintf(stderr, "parley-host: --options %s:%d:%d: not valid JSON: %s\n", options_path,
                    je.line, je.column, json_error_reason(&je));
        else /* could not open: the text names the file and the reason */
            fprintf(stderr, "parley-host: --options: %s\n", je.text);
        goto out_args;
    }
    if (!json_is_object(options)) {
        fprintf(stderr, "parley-host: --options %s: not a JSON object\n", options_path);
        goto out_options;
    }
    for (size_t i = 0; i < nsets; i++)
        if (apply_set(options, sets[i]) != 0)
            goto out_options;
    if (tools_spec) {
        char *err = NULL;
        if (tools_load(tools_spec, &err) < 0 || tools_declare(options, &err) < 0) {
            fprintf(stderr, "parley-host: --tools: %s\n", err ? err : "failed");
            free(err);
            goto out_tools;
        }
    }
    char *options_json = json_dumps(options, SHIM_JSON_COMPACT);
    if (!options_json) {
        fprintf(stderr, "parley-host: cannot serialize the options\n");
        goto out_tools;
    }

    /* ---- plugin ---- */
    void *dl = load_plugin(plugin_path, &g_shim.pl);
    if (!dl)
        goto out_json;
    const parley_plugin *pl = g_shim.pl;
    if (check) {
        rc = run_check(options_json);
        goto out_dl;
    }
    g_shim.options = options;

    /* ---- threads ---- */
    if (pipe(wake_pipe) != 0) {
        fprintf(stderr, "parley-host: pipe: %s\n", strerror(errno));
        goto out_dl;
    }
    g_shim.wake_fd = wake_pipe[0];
    int e = pthread_create(&sig_thread, NULL, signal_thread, NULL);
    if (e != 0) {
        fprintf(stderr, "parley-host: cannot start the signal thread: %s\n", strerror(e));
        goto out_pipe;
    }
    char *terr = NULL;
    if (tools_start(&terr) < 0) {
        fprintf(stderr, "parley-host: %s\n", terr ? terr : "cannot start the tool thread");
        free(terr);
        goto out_sig;
    }

    /* ---- agent ---- */
    parley_host host = {
        .struct_size = sizeof host,
        .host_data = &g_shim,
        .log = host_log,
        /* Always set: tools declared in the options or per turn that the
         * shim does not know still get a definite "unknown tool" answer. */
        .tool_call = tools_on_call,
    };
    char *cerr = NULL;
    g_shim.agent = pl->create(&host, options_json, &cerr);
    if (!g_shim.agent) {
        fprintf(stderr, "parley-host: create failed: %s\n", cerr ? cerr : "(no message)");
        plugin_free(cerr);
        rc = 1;
        goto out_sig;
    }
    plugin_free(cerr);
    char *merr = NULL;
    if (metrics_listen && metrics_http_start(metrics_listen, &merr) != 0) {
        fprintf(stderr, "parley-host: %s\n", merr ? merr : "--metrics-listen failed");
        free(merr);
        pl->destroy(g_shim.agent);
        g_shim.agent = NULL;
        rc = 2;
        goto out_sig;
    }

    rc = jsonl ? run_jsonl(concurrency) : run_interactive();
    metrics_http_stop(); /* before destroy: the server reads the agent */

    /* destroy() cancels what is still in flight; the done callbacks run on
     * this thread and still write their lines. */
    pl->destroy(g_shim.agent);
    g_shim.agent = NULL;
    g_shim.options = NULL;
    interactive_free();
    int sig = atomic_load(&g_shim.interrupted);
    if (sig)
        rc = 128 + sig;

out_sig:
    pthread_kill(sig_thread, SIGUSR1);
    pthread_join(sig_thread, NULL);
out_pipe:
    close(wake_pipe[0]);
    close(wake_pipe[1]);
out_dl:
    /* After destroy() and before dlclose(): completes what is still held. */
    tools_shutdown();
    dlclose(dl);
out_json:
    free(options_json);
out_tools:
    tools_shutdown(); /* idempotent; frees the tools when we never got this far */
out_options:
    live_options_free(); /* before `options`: g_shim.options may point at either */
    json_decref(options);
out_args:
    free(sets);
    return rc;
}
