/*
 * connection_check.c -- see connection_check.h.
 *
 * One blocking libcurl easy transfer on the caller's thread, bounded by the
 * options' connect_timeout_ms and request_timeout_ms, with the same TLS
 * settings and auth header as the agent's requests.  The outcome is turned
 * into a sentence that says what to fix, not just what curl saw.
 */
#include "api/connection_check.h"

#include <curl/curl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "lib/buf.h"
#include "lib/json_oom.h"
#include "lib/redact.h"
#include "http/llm_http.h"
#include "config/options.h"
#include "provider/provider.h"

/* The request that lists the server's models: its URL and headers, the
 * provider codec's (Anthropic and Ollama list models elsewhere, with other
 * headers).  Returns 0, or -1 on OOM with whatever was made freed. */
static int models_request(const parley_options *o, char **url, struct curl_slist **headers)
{
    const provider *p = provider_find(o->provider);
    *headers = NULL;
    *url = pstr_printf("%s%s", o->base_url, p->models_path);
    struct curl_slist *h = curl_slist_append(NULL, "Accept: application/json");
    if (!*url || !h || p->headers(o, &h) != 0) {
        curl_slist_free_all(h);
        free(*url);
        *url = NULL;
        return -1;
    }
    *headers = h;
    return 0;
}

typedef struct {
    pbuf body;
    size_t max;
    int oversized;
} check_body;

static size_t on_body(char *data, size_t size, size_t nmemb, void *ud)
{
    check_body *b = ud;
    size_t n = size * nmemb;
    if (b->body.len + n > b->max) {
        b->oversized = 1;
        return 0; /* abort the transfer */
    }
    pbuf_append(&b->body, data, n);
    return b->body.oom ? 0 : n;
}

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void init_curl(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

/* What went wrong before an HTTP answer, in words that say what to do. */
static parley_status transport_error(CURLcode code, const char *detail, const parley_options *o,
                                     const char *url, long connected, char **error)
{
    switch (code) {
    case CURLE_OUT_OF_MEMORY: /* libcurl's own allocation: nothing to do with the server */
        *error = pstr_printf("out of memory");
        return PARLEY_ERR_NO_MEMORY;
    case CURLE_COULDNT_CONNECT:
        *error = pstr_printf("nothing listens at %s (%s); is the server running?", url, detail);
        return PARLEY_ERR_CONNECT;
    case CURLE_COULDNT_RESOLVE_HOST:
        *error = pstr_printf("cannot resolve the host of %s (%s); check base_url", url, detail);
        return PARLEY_ERR_CONNECT;
    case CURLE_OPERATION_TIMEDOUT:
        if (!connected) {
            *error = pstr_printf("could not connect to %s within connect_timeout_ms (%lld ms): "
                                 "is the host right, and is a firewall dropping the connection?",
                                 url, (long long)o->connect_timeout_ms);
            return PARLEY_ERR_CONNECT;
        }
        *error = pstr_printf("%s did not answer within request_timeout_ms (%lld ms): the server "
                             "may be busy loading a model; try again or raise request_timeout_ms",
                             url, (long long)o->request_timeout_ms);
        return PARLEY_ERR_TIMEOUT;
    case CURLE_PEER_FAILED_VERIFICATION:
        *error = pstr_printf("the TLS certificate of %s was not accepted (%s): install the CA "
                             "that signed it, or set verify_tls to false for a self-signed "
                             "certificate you trust", url, detail);
        return PARLEY_ERR_CONNECT;
    case CURLE_SSL_CONNECT_ERROR:
        *error = pstr_printf("the TLS handshake with %s failed (%s): does the server speak "
                             "https on this port? A plain HTTP server needs an http:// base_url",
                             url, detail);
        return PARLEY_ERR_CONNECT;
    case CURLE_GOT_NOTHING:
    case CURLE_RECV_ERROR:
    case CURLE_WEIRD_SERVER_REPLY:
        *error = pstr_printf("%s closed the connection without an HTTP answer (%s): is this an "
                             "https server behind an http:// base_url, or not an LLM server?",
                             url, detail);
        return PARLEY_ERR_CONNECT;
    default:
        *error = pstr_printf("cannot reach %s: %s", url, detail);
        return PARLEY_ERR_CONNECT;
    }
}

/* An HTTP error status, with what it most likely means here. */
static parley_status status_error(long status, const char *body, size_t len,
                                  const parley_options *o, const char *url, char **error)
{
    const provider *p = provider_find(o->provider);
    char *text = p->error_text(body, len); /* the server's words */
    const char *sep = text ? ": " : "";
    const char *said = text ? text : "";
    if (status == 401 || status == 403) {
        if (o->api_key)
            *error = pstr_printf("the server refused the API key (HTTP %ld from %s%s%s); check "
                                 "api_key or api_key_env", status, url, sep, said);
        else
            *error = pstr_printf("the server wants an API key (HTTP %ld from %s%s%s); set "
                                 "api_key or api_key_env", status, url, sep, said);
    } else if (status == 404) {
        *error = pstr_printf("%s was not found (HTTP 404%s%s); is base_url the server's API "
                             "root, and provider right? (%s)", url, sep, said, p->not_found_hint);
    } else {
        *error = pstr_printf("%s answered HTTP %ld%s%s", url, status, sep, said);
    }
    free(text);
    return status == 429 ? PARLEY_ERR_RATE_LIMITED : PARLEY_ERR_HTTP_STATUS;
}

/* {"ok":true,"url":...,"models":[ids]} from a model list, or NULL: OpenAI's and
   Anthropic's {"data":[{"id"}]}, or Ollama's {"models":[{"name"}]}. */
static char *models_json(const char *url, const char *body, size_t len)
{
    json_t *root = json_loadb(body, len, 0, NULL);
    json_t *data = json_object_get(root, "data");
    const char *key = "id";
    if (!json_is_array(data)) {
        data = json_object_get(root, "models");
        key = "name";
    }
    json_t *out = json_is_array(data) ? json_object() : NULL;
    json_t *ids = json_array();
    size_t i;
    json_t *m;
    json_array_foreach(data, i, m) {
        const char *id = json_string_value(json_object_get(m, key));
        if (id)
            json_array_append_new(ids, json_string(id));
    }
    char *s = NULL;
    if (out && ids) {
        json_object_set_new(out, "ok", json_true());
        json_object_set_new(out, "url", json_string(url));
        json_object_set(out, "models", ids);
        s = json_dumps_whole(out, JSON_COMPACT | JSON_PRESERVE_ORDER);
    }
    json_decref(ids);
    json_decref(out);
    json_decref(root);
    return s;
}

parley_status connection_check(const char *options_json, char **out_json, char **error)
{
    char *ignored = NULL;
    if (!error)
        error = &ignored;
    *error = NULL;
    if (out_json)
        *out_json = NULL;
    parley_options o;
    parley_status parsed = provider_options_parse(options_json, &o, error);
    if (parsed != PARLEY_OK) {
        free(ignored);
        return parsed;
    }
    if (!o.base_url && !(o.base_url = strdup(provider_find(o.provider)->default_base_url))) {
        options_free(&o);
        *error = pstr_printf("out of memory");
        free(ignored);
        return PARLEY_ERR_NO_MEMORY;
    }

    parley_status st = PARLEY_ERR_NO_MEMORY;
    char *url = NULL, *shown = NULL; /* shown: url without credentials, for messages */
    struct curl_slist *headers = NULL;
    check_body b = {.body = PBUF_INIT, .max = (size_t)o.max_response_bytes};
    CURL *e = NULL;
    pthread_once(&curl_once, init_curl);
    if (models_request(&o, &url, &headers) != 0 || !(shown = http_display_url(url)) ||
        !(e = curl_easy_init()))
        goto out;

    char detail[CURL_ERROR_SIZE] = "";
    curl_easy_setopt(e, CURLOPT_URL, url); /* the only use of url: messages say `shown` */
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, detail);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, (long)o.connect_timeout_ms);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)o.request_timeout_ms);
    curl_easy_setopt(e, CURLOPT_SSL_VERIFYPEER, o.verify_tls ? 1L : 0L);
    curl_easy_setopt(e, CURLOPT_SSL_VERIFYHOST, o.verify_tls ? 2L : 0L);
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    CURLcode code = curl_easy_perform(e);

    long status = 0;
    curl_off_t connect_us = 0;
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_getinfo(e, CURLINFO_CONNECT_TIME_T, &connect_us);
    if (b.oversized) {
        *error = pstr_printf("the model list from %s is larger than max_response_bytes (%lld)",
                             shown, (long long)o.max_response_bytes);
        st = PARLEY_ERR_BAD_RESPONSE;
    } else if (b.body.oom) {
        st = PARLEY_ERR_NO_MEMORY;
    } else if (code != CURLE_OK) {
        st = transport_error(code, detail[0] ? detail : curl_easy_strerror(code), &o, shown,
                             connect_us > 0 || status > 0, error);
    } else if (status < 200 || status >= 300) {
        st = status_error(status, b.body.data ? b.body.data : "", b.body.len, &o, shown, error);
    } else {
        char *json = models_json(shown, b.body.data ? b.body.data : "", b.body.len);
        if (json) {
            st = PARLEY_OK;
            if (out_json)
                *out_json = json;
            else
                free(json);
        } else {
            *error = pstr_printf("%s answered, but not with a model list ({\"data\":[...]} or "
                                 "{\"models\":[...]}): is base_url the API root?", shown);
            st = PARLEY_ERR_BAD_RESPONSE;
        }
    }
out:
    if (*error) { /* the server's words may quote the key back */
        secret_span secrets[REDACT_MAX_SECRETS];
        redact_owned(error, secrets, redact_secrets(o.api_key, o.history_store, secrets));
    }
    if (st != PARLEY_OK && !*error)
        *error = pstr_printf("out of memory");
    if (e)
        curl_easy_cleanup(e);
    curl_slist_free_all(headers);
    free(url);
    free(shown);
    pbuf_free(&b.body);
    options_free(&o);
    free(ignored);
    return st;
}
