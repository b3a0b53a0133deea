/* llm_http.c -- see llm_http.h. */
#include "llm_http.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>


static size_t on_body(char *data, size_t size, size_t nmemb, void *ud)
{
    http_call *c = ud;
    size_t n = size * nmemb;
    if (c->status == 0)
        curl_easy_getinfo(c->easy, CURLINFO_RESPONSE_CODE, &c->status);
    if (c->received + n > c->max_bytes) {
        c->oversized = 1;
        return 0; /* abort: CURLE_WRITE_ERROR */
    }
    c->received += n;
    if (c->sink && c->status >= 200 && c->status < 300) {
        if (c->sink(c->owner, data, n) != 0) {
            c->sink_failed = 1;
            return 0;
        }
        return n;
    }
    pbuf_append(&c->body, data, n);
    return c->body.oom ? 0 : n;
}

/* Retry-After: delta-seconds or an HTTP date. */
static int64_t parse_retry_after(const char *v)
{
    while (*v == ' ' || *v == '\t')
        v++;
    char *end;
    long long secs = strtoll(v, &end, 10);
    if (end != v && secs >= 0)
        return secs > 86400 ? 86400000 : (int64_t)secs * 1000;
    /* An HTTP date, "Sun, 06 Nov 1994 08:49:37 GMT": parsed by hand, since
     * strptime's month names follow the host's locale. */
    static const char months[] = "JanFebMarAprMayJunJulAugSepOctNovDec";
    char mon[4] = "";
    int day, year, hh, mm, ss;
    const char *comma = strchr(v, ',');
    if (!comma || sscanf(comma + 1, " %d %3s %d %d:%d:%d GMT", &day, mon, &year, &hh, &mm, &ss) != 6)
        return -1;
    const char *m = strlen(mon) == 3 ? strstr(months, mon) : NULL;
    if (!m || (m - months) % 3 != 0)
        return -1;
    struct tm tm;
    memset(&tm, 0, sizeof tm);
    tm.tm_mday = day;
    tm.tm_mon = (int)((m - months) / 3);
    tm.tm_year = year - 1900;
    tm.tm_hour = hh;
    tm.tm_min = mm;
    tm.tm_sec = ss;
    time_t when = timegm(&tm), now = time(NULL);
    return when > now ? (int64_t)(when - now) * 1000 : 0;
}

static size_t on_header(char *data, size_t size, size_t nmemb, void *ud)
{
    http_call *c = ud;
    size_t n = size * nmemb;
    static const char name[] = "retry-after:";
    if (n > sizeof name - 1 && strncasecmp(data, name, sizeof name - 1) == 0) {
        char value[128];
        size_t vlen = n - (sizeof name - 1);
        if (vlen >= sizeof value)
            vlen = sizeof value - 1;
        memcpy(value, data + sizeof name - 1, vlen);
        value[vlen] = '\0';
        c->retry_after_ms = parse_retry_after(value);
    }
    return n;
}

http_call *http_call_start(CURLM *multi, const http_config *cfg, const char *body, size_t len,
                           void *owner, http_sink_fn sink)
{
    http_call *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->easy = curl_easy_init();
    if (!c->easy) {
        free(c);
        return NULL;
    }
    c->multi = multi;
    c->owner = owner;
    c->sink = sink;
    c->max_bytes = cfg->max_response_bytes;
    c->retry_after_ms = -1;
    CURL *e = c->easy;
    curl_easy_setopt(e, CURLOPT_URL, cfg->url);
    curl_easy_setopt(e, CURLOPT_POST, 1L);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, cfg->headers);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, c);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, c);
    curl_easy_setopt(e, CURLOPT_PRIVATE, c);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, c->error);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, cfg->connect_timeout_ms);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, cfg->request_timeout_ms);
    curl_easy_setopt(e, CURLOPT_SSL_VERIFYPEER, cfg->verify_tls ? 1L : 0L);
    curl_easy_setopt(e, CURLOPT_SSL_VERIFYHOST, cfg->verify_tls ? 2L : 0L);
    curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    /* Expect: 100-continue would cost a round trip on every large body. */
    curl_easy_setopt(e, CURLOPT_EXPECT_100_TIMEOUT_MS, 0L);
    if (curl_multi_add_handle(multi, e) != CURLM_OK) {
        curl_easy_cleanup(e);
        free(c);
        return NULL;
    }
    return c;
}

http_call *http_call_of(CURL *easy)
{
    http_call *c = NULL;
    curl_easy_getinfo(easy, CURLINFO_PRIVATE, (char **)&c);
    return c;
}

void http_call_free(http_call *c)
{
    if (!c)
        return;
    curl_multi_remove_handle(c->multi, c->easy);
    curl_easy_cleanup(c->easy);
    pbuf_free(&c->body);
    free(c);
}

static int is_connection_failure(CURLcode code)
{
    switch (code) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_SSL_CONNECT_ERROR:
        return 1;
    default:
        return 0;
    }
}

long http_call_status(const http_call *c)
{
    /* A body-less answer (an empty 429 from a gateway) never reached on_body. */
    long status = c->status;
    if (status == 0)
        curl_easy_getinfo(c->easy, CURLINFO_RESPONSE_CODE, &status);
    return status;
}

parley_status http_call_outcome(const http_call *c, CURLcode code, char **msg, int *retryable)
{
    *msg = NULL;
    *retryable = 0;
    const char *detail = c->error[0] ? c->error : curl_easy_strerror(code);
    if (c->oversized) {
        *msg = pstr_printf("LLM response larger than max_response_bytes (%zu bytes)", c->max_bytes);
        return PARLEY_ERR_BAD_RESPONSE;
    }
    if (c->sink_failed)
        return PARLEY_ERR_BAD_RESPONSE; /* the sink keeps its own message */
    /* A reused connection has no connect time, but its request did get under way. */
    curl_off_t connect_us = 0, pretransfer_us = 0;
    curl_easy_getinfo(c->easy, CURLINFO_CONNECT_TIME_T, &connect_us);
    curl_easy_getinfo(c->easy, CURLINFO_PRETRANSFER_TIME_T, &pretransfer_us);
    if (code == CURLE_OPERATION_TIMEDOUT && connect_us == 0 && pretransfer_us == 0) {
        /* Never connected: as much a connection failure as a refusal. */
        *retryable = 1;
        *msg = pstr_printf("cannot reach the LLM server: %s", detail);
        return PARLEY_ERR_CONNECT;
    }
    if (code == CURLE_OPERATION_TIMEDOUT) {
        *msg = pstr_printf("LLM request timed out: %s", detail);
        return PARLEY_ERR_TIMEOUT;
    }
    if (code != CURLE_OK) {
        if (is_connection_failure(code) && c->received == 0) {
            *retryable = 1;
            *msg = pstr_printf("cannot reach the LLM server: %s", detail);
            return PARLEY_ERR_CONNECT;
        }
        *msg = pstr_printf("LLM connection failed mid-response: %s", detail);
        return PARLEY_ERR_BAD_RESPONSE;
    }
    long status = http_call_status(c);
    if (status >= 200 && status < 300)
        return PARLEY_OK;
    /* What the body says, and whether to retry, is the provider codec's to tell. */
    *msg = pstr_printf("LLM server answered HTTP %ld", status);
    return status == 429 ? PARLEY_ERR_RATE_LIMITED : PARLEY_ERR_HTTP_STATUS;
}
