/* context_window.c -- asking the server its context window (context_window.h). */
#include "http/context_window.h"

#include <curl/curl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "http/llm_http.h"
#include "lib/buf.h"
#include "provider/provider.h"

#define WINDOW_MAX_BODY ((size_t)4 << 20) /* /api/show carries the template and license */

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

/* provider_ask_fn for the codec's questions: ctx is the options. */
static int ask(void *ctx, const char *url, const char *post_body, pbuf *answer, char **err)
{
    const parley_options *o = ctx;
    window_body b = {PBUF_INIT, 0};
    long status = 0;
    if (!url) {
        *err = strdup("out of memory");
        return -1;
    }
    int rc = fetch(o, url, post_body, &status, &b, err);
    if (rc == 0 && (status < 200 || status > 299 || b.oversized))
        pbuf_reset(&b.body);
    pbuf_free(answer);
    *answer = b.body;
    return rc;
}

int context_window_discover(const parley_options *opts, context_window_info *out, char **err)
{
    memset(out, 0, sizeof *out);
    *err = NULL;
    const provider *p = opts->provider ? provider_find(opts->provider) : provider_registry[0];
    if (!p || !p->ask_window) /* the API does not say a model's window (Anthropic's) */
        return 0;
    parley_options o = *opts; /* borrowed members; base_url defaulted as the agent does */
    if (!o.base_url)
        o.base_url = (char *)p->default_base_url;
    o.provider = (char *)p->name;
    pthread_once(&curl_once, init_curl);
    return p->ask_window(&o, ask, &o, out, err);
}
