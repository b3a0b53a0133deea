/* context_window.c -- asking the server its context window (context_window.h). */
#include "http/context_window.h"

#include <curl/curl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "http/llm_http.h"
#include "lib/buf.h"
#include "provider/provider.h"

#define WINDOW_MAX_BODY ((size_t)4 << 20) /* /api/show carries the template and license */

static long long positive(const json_t *v)
{
    return json_is_integer(v) && json_integer_value(v) > 0 ? (long long)json_integer_value(v) : 0;
}

long long context_window_from_props(const char *body, size_t len)
{
    json_t *root = json_loadb(body ? body : "", body ? len : 0, 0, NULL);
    long long n = positive(json_object_get(json_object_get(root, "default_generation_settings"),
                                           "n_ctx"));
    if (!n)
        n = positive(json_object_get(root, "n_ctx"));
    json_decref(root);
    return n;
}

long long context_window_from_models(const char *body, size_t len, const char *model)
{
    json_t *root = json_loadb(body ? body : "", body ? len : 0, 0, NULL);
    json_t *data = json_object_get(root, "data");
    long long n = 0;
    size_t i;
    json_t *m;
    json_array_foreach(data, i, m) {
        const char *id = json_string_value(json_object_get(m, "id"));
        if (model && id && strcmp(id, model) == 0)
            n = positive(json_object_get(m, "max_model_len"));
    }
    if (!n && json_array_size(data) == 1)
        n = positive(json_object_get(json_array_get(data, 0), "max_model_len"));
    json_decref(root);
    return n;
}

/* The number on the "num_ctx N" line of Ollama's parameters text, or 0. */
static long long num_ctx_param(const char *params)
{
    for (const char *p = params; p && (p = strstr(p, "num_ctx")); p += 7) {
        if (p != params && p[-1] != '\n')
            continue;
        const char *q = p + 7;
        while (*q == ' ' || *q == '\t')
            q++;
        long long v = strtoll(q, NULL, 10);
        if (v > 0)
            return v;
    }
    return 0;
}

long long context_window_from_show(const char *body, size_t len, long long *num_ctx)
{
    json_t *root = json_loadb(body ? body : "", body ? len : 0, 0, NULL);
    json_t *info = json_object_get(root, "model_info");
    const char *arch = json_string_value(json_object_get(info, "general.architecture"));
    long long n = 0;
    *num_ctx = num_ctx_param(json_string_value(json_object_get(root, "parameters")));
    if (arch) {
        char *key = pstr_printf("%s.context_length", arch);
        if (key)
            n = positive(json_object_get(info, key));
        free(key);
    }
    json_decref(root);
    return n;
}

typedef struct {
    pbuf body;
    int oversized;
} window_body;

static size_t on_body(char *data, size_t size, size_t nmemb, void *ud)
{
    window_body *b = ud;
    size_t n = size * nmemb;
    if (b->body.len + n > WINDOW_MAX_BODY) {
        b->oversized = 1;
        return 0;
    }
    pbuf_append(&b->body, data, n);
    return b->body.oom ? 0 : n;
}

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void init_curl(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

/* One request (POST when post_body is not NULL); 0 with the status and body, or -1 with
   *err when no HTTP answer came. */
static int fetch(const parley_options *o, const char *url, const char *post_body, long *status,
                 window_body *b, char **err)
{
    const provider *p = provider_find(o->provider);
    struct curl_slist *h = curl_slist_append(NULL, "Accept: application/json");
    if (h && post_body)
        h = curl_slist_append(h, "Content-Type: application/json");
    CURL *e = NULL;
    if (!h || !p || p->headers(o, &h) != 0 || !(e = curl_easy_init())) {
        curl_slist_free_all(h);
        *err = strdup("out of memory");
        return -1;
    }
    char detail[CURL_ERROR_SIZE] = "";
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
    if (post_body)
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, post_body);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, b);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, detail);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, (long)o->connect_timeout_ms);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)o->request_timeout_ms);
    curl_easy_setopt(e, CURLOPT_SSL_VERIFYPEER, o->verify_tls ? 1L : 0L);
    curl_easy_setopt(e, CURLOPT_SSL_VERIFYHOST, o->verify_tls ? 2L : 0L);
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    CURLcode code = curl_easy_perform(e);
    *status = 0;
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, status);
    curl_easy_cleanup(e);
    curl_slist_free_all(h);
    if (code != CURLE_OK && !(b->oversized && *status)) {
        char *shown = http_display_url(url);
        *err = pstr_printf("asking %s for the context window: %s", shown ? shown : "the server",
                           detail[0] ? detail : curl_easy_strerror(code));
        free(shown);
        return -1;
    }
    return 0;
}

/* GET or POST url; the body of a 2xx answer in *b (else empty).  -1 as fetch. */
static int ask(const parley_options *o, const char *url, const char *post_body, window_body *b,
               char **err)
{
    long status = 0;
    if (!url) {
        *err = strdup("out of memory");
        return -1;
    }
    int rc = fetch(o, url, post_body, &status, b, err);
    if (rc == 0 && (status < 200 || status > 299 || b->oversized))
        pbuf_reset(&b->body);
    return rc;
}

/* base_url without a trailing "/v1": where llama.cpp serves /props. */
static char *server_root(const char *base_url)
{
    size_t n = strlen(base_url);
    if (n >= 3 && strcmp(base_url + n - 3, "/v1") == 0)
        n -= 3;
    return pstr_printf("%.*s/props", (int)n, base_url);
}

static int discover_openai(const parley_options *o, context_window_info *out, char **err)
{
    window_body b = {PBUF_INIT, 0};
    char *url = server_root(o->base_url);
    int rc = ask(o, url, NULL, &b, err);
    free(url);
    if (rc == 0 && (out->n_ctx = context_window_from_props(b.body.data, b.body.len)))
        out->source = "props";
    pbuf_free(&b.body);
    if (out->n_ctx)
        return 0;
    char *err2 = NULL;
    window_body m = {PBUF_INIT, 0};
    url = pstr_printf("%s/models", o->base_url);
    int rc2 = ask(o, url, NULL, &m, &err2);
    free(url);
    if (rc2 == 0 && (out->n_ctx = context_window_from_models(m.body.data, m.body.len, o->model)))
        out->source = "models";
    pbuf_free(&m.body);
    if (rc != 0 && rc2 != 0) { /* neither answered: say the first one's reason */
        free(err2);
        return -1;
    }
    free(rc != 0 ? *err : err2);
    *err = NULL;
    return 0;
}

static int discover_ollama(const parley_options *o, context_window_info *out, char **err)
{
    window_body b = {PBUF_INIT, 0};
    char *url = pstr_printf("%s/api/show", o->base_url);
    json_t *req = json_pack("{s:s}", "model", o->model ? o->model : "");
    char *body = req ? json_dumps(req, JSON_COMPACT) : NULL;
    json_decref(req);
    int rc = body ? ask(o, url, body, &b, err) : (*err = strdup("out of memory"), -1);
    free(url);
    free(body);
    long long num_ctx = 0, model_len = rc == 0 ? context_window_from_show(b.body.data, b.body.len,
                                                                           &num_ctx) : 0;
    pbuf_free(&b.body);
    if (o->num_ctx > 0) { /* Parley sends num_ctx: the window is that, within the model's */
        out->n_ctx = model_len && model_len < o->num_ctx ? model_len : o->num_ctx;
        out->source = "num_ctx";
        free(*err);
        *err = NULL;
        return 0;
    }
    if (rc != 0)
        return -1;
    out->n_ctx = num_ctx ? num_ctx : model_len;
    out->source = out->n_ctx ? "show" : NULL;
    return 0;
}

int context_window_discover(const parley_options *opts, context_window_info *out, char **err)
{
    memset(out, 0, sizeof *out);
    *err = NULL;
    const provider *p = provider_find(opts->provider ? opts->provider : "openai");
    if (!p)
        return 0;
    parley_options o = *opts; /* borrowed members; base_url defaulted as the agent does */
    if (!o.base_url)
        o.base_url = (char *)p->default_base_url;
    o.provider = (char *)p->name;
    pthread_once(&curl_once, init_curl);
    if (strcmp(p->name, "ollama") == 0)
        return discover_ollama(&o, out, err);
    if (strcmp(p->name, "openai") == 0)
        return discover_openai(&o, out, err);
    return 0; /* anthropic: the Messages API does not say a model's window */
}
