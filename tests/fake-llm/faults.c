/* Fault modes: parsing "--fault MODE" / "[[fault:MODE]]", the per-body
 * counters behind "NNNxK", and the responses that need no chat reply. */
#include "fakellm.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static bool has_prefix(const char *s, size_t n, const char *p, size_t *rest)
{
    size_t pl = strlen(p);
    if (n < pl || memcmp(s, p, pl) != 0)
        return false;
    *rest = pl;
    return true;
}

/* Parses "NNN", "NNN:S", "NNNxK", "NNN:SxK". */
static bool parse_status_fault(const char *s, size_t n, struct fault *f)
{
    size_t i = 0;
    while (i < n && s[i] >= '0' && s[i] <= '9')
        i++;
    unsigned long status;
    if (i != 3 || !parse_ulong(s, 3, &status) || status < 400 || status > 999)
        return false;
    f->kind = FAULT_STATUS;
    f->status = (unsigned)status;
    f->retry_after = status == 429 ? 1 : -1;
    bool explicit_retry = false;
    if (i < n && s[i] == ':') {
        size_t j = ++i;
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++;
        unsigned long ra;
        if (!parse_ulong(s + j, i - j, &ra))
            return false;
        f->retry_after = (long)ra;
        explicit_retry = true;
    }
    if (i < n && s[i] == 'x') {
        unsigned long k;
        if (!parse_ulong(s + i + 1, n - i - 1, &k) || k == 0)
            return false;
        f->first_k = k;
        /* Retry tests should not sleep a whole second per attempt. */
        if (status == 429 && !explicit_retry)
            f->retry_after = 0;
        i = n;
    }
    return i == n;
}

bool fault_parse(const char *s, size_t n, struct fault *out)
{
    struct fault f = {.kind = FAULT_NONE, .retry_after = -1};
    size_t r;
    unsigned long v;

    if (n == 0 || n >= sizeof f.name)
        return false;
    memcpy(f.name, s, n);
    f.name[n] = '\0';

#define IS(lit) (n == sizeof(lit) - 1 && memcmp(s, lit, n) == 0)
    if (IS("none")) {
        f.name[0] = '\0';
    } else if (s[0] >= '0' && s[0] <= '9') {
        if (!parse_status_fault(s, n, &f))
            return false;
    } else if (IS("hang")) {
        f.kind = FAULT_HANG;
    } else if (IS("truncated")) {
        f.kind = FAULT_TRUNCATED;
    } else if (IS("not_json")) {
        f.kind = FAULT_NOT_JSON;
    } else if (IS("bad_shape")) {
        f.kind = FAULT_BAD_SHAPE;
        f.arg = SHAPE_NO_CHOICES;
    } else if (IS("bad_shape:empty_choices")) {
        f.kind = FAULT_BAD_SHAPE;
        f.arg = SHAPE_EMPTY_CHOICES;
    } else if (IS("bad_shape:null_message")) {
        f.kind = FAULT_BAD_SHAPE;
        f.arg = SHAPE_NULL_MESSAGE;
    } else if (IS("invalid_utf8")) {
        f.kind = FAULT_INVALID_UTF8;
    } else if (IS("reset")) {
        f.kind = FAULT_RESET;
    } else if (IS("oversized")) {
        f.kind = FAULT_OVERSIZED;
        f.arg = 50;
    } else if (has_prefix(s, n, "oversized:", &r)) {
        if (!parse_ulong(s + r, n - r, &v) || v == 0 || v > 4096)
            return false;
        f.kind = FAULT_OVERSIZED;
        f.arg = v;
    } else if (IS("endless_tools")) {
        f.kind = FAULT_ENDLESS_TOOLS;
    } else if (IS("schema_mismatch")) {
        f.kind = FAULT_SCHEMA_MISMATCH;
    } else if (IS("slow_stream")) {
        f.kind = FAULT_SLOW_STREAM;
        f.arg = 300;
    } else if (has_prefix(s, n, "slow_stream:", &r)) {
        if (!parse_ulong(s + r, n - r, &v) || v > 600000)
            return false;
        f.kind = FAULT_SLOW_STREAM;
        f.arg = v;
    } else if (IS("stream_cut")) {
        f.kind = FAULT_STREAM_CUT;
    } else if (IS("stream_cut:abort")) {
        f.kind = FAULT_STREAM_CUT;
        f.arg = 1;
    } else if (IS("done_hold")) {
        f.kind = FAULT_DONE_HOLD;
    } else if (IS("done_keepalive")) {
        f.kind = FAULT_DONE_HOLD;
        f.arg = 100;
    } else if (has_prefix(s, n, "done_keepalive:", &r)) {
        if (!parse_ulong(s + r, n - r, &v) || v == 0 || v > 600000)
            return false;
        f.kind = FAULT_DONE_HOLD;
        f.arg = v;
    } else if (has_prefix(s, n, "error200:", &r) || has_prefix(s, n, "error_event:", &r)) {
        if (!parse_ulong(s + r, n - r, &v) || v < 400 || v > 999)
            return false;
        f.kind = FAULT_ERROR_200;
        f.status = (unsigned)v;
        f.arg = s[5] == '_'; /* error_event: */
    } else if (IS("header_flood")) {
        f.kind = FAULT_HEADER_FLOOD;
        f.arg = 400;
    } else if (has_prefix(s, n, "header_flood:", &r)) {
        if (!parse_ulong(s + r, n - r, &v) || v == 0 || v > 4096)
            return false;
        f.kind = FAULT_HEADER_FLOOD;
        f.arg = v;
    } else {
        return false;
    }
#undef IS
    *out = f;
    return true;
}

/* ---- "NNNxK": how often has each exact body been seen? ---- */

struct seen {
    uint64_t hash;
    unsigned long count;
    struct seen *next;
};

#define SEEN_BUCKETS 1024
static struct seen *seen_tab[SEEN_BUCKETS];
static pthread_mutex_t seen_mu = PTHREAD_MUTEX_INITIALIZER;

static uint64_t fnv1a(const char *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

bool fault_fires(const struct fault *f, const char *body, size_t len)
{
    if (f->kind == FAULT_NONE)
        return false;
    if (f->kind != FAULT_STATUS || f->first_k == 0)
        return true;
    uint64_t h = fnv1a(body, len);
    pthread_mutex_lock(&seen_mu);
    struct seen **slot = &seen_tab[h % SEEN_BUCKETS], *e;
    for (e = *slot; e && e->hash != h; e = e->next)
        ;
    if (!e) {
        e = xmalloc(sizeof *e);
        *e = (struct seen){h, 0, *slot};
        *slot = e;
    }
    unsigned long count = ++e->count;
    pthread_mutex_unlock(&seen_mu);
    return count <= f->first_k;
}

void faults_cleanup(void)
{
    for (size_t i = 0; i < SEEN_BUCKETS; i++) {
        struct seen *e = seen_tab[i];
        while (e) {
            struct seen *next = e->next;
            free(e);
            e = next;
        }
        seen_tab[i] = NULL;
    }
}

/* ---- error-status faults ---- */

static void status_error(unsigned st, struct api_error *e);

struct MHD_Response *fault_status_response(const struct fault *f)
{
    struct api_error e = {0};
    status_error(f->status, &e);
    size_t len;
    char *json = api_error_json(&e, &len);
    api_error_free(&e);
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(len, json, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    if (f->retry_after >= 0) {
        char ra[32];
        snprintf(ra, sizeof ra, "%ld", f->retry_after);
        MHD_add_response_header(resp, "Retry-After", ra);
    }
    return resp;
}

/* Anthropic's error type for an HTTP status (its errors page). */
static const char *anthropic_type(unsigned st)
{
    return st == 401   ? "authentication_error"
           : st == 403 ? "permission_error"
           : st == 404 ? "not_found_error"
           : st == 429 ? "rate_limit_error"
           : st == 529 ? "overloaded_error"
           : st >= 500 ? "api_error"
                       : "invalid_request_error";
}

char *fault_error_body(const struct fault *f, int dialect, bool event, size_t *len)
{
    struct api_error e = {0};
    status_error(f->status, &e);
    json_t *o;
    if (dialect == DIALECT_ANTHROPIC)
        o = json_pack("{s:s,s:{s:s,s:s}}", "type", "error", "error", "type",
                      anthropic_type(f->status), "message", e.message);
    else if (dialect == DIALECT_OLLAMA)
        o = json_pack("{s:s}", "error", e.message);
    else
        o = json_pack("{s:{s:s,s:s,s:s?}}", "error", "message", e.message, "type", e.type,
                      "code", e.code);
    api_error_free(&e);
    char *json = json_dump_compact(o, len);
    json_decref(o);
    if (!event)
        return json;
    const char *pre = dialect == DIALECT_ANTHROPIC ? "event: error\ndata: "
                      : dialect == DIALECT_OPENAI  ? "data: "
                                                   : "";
    const char *post = dialect == DIALECT_OLLAMA ? "\n" : "\n\n";
    char *framed = xmalloc(strlen(pre) + *len + strlen(post) + 1);
    *len = (size_t)sprintf(framed, "%s%s%s", pre, json, post);
    free(json);
    return framed;
}

static void status_error(unsigned st, struct api_error *e_out)
{
    struct api_error e = {0};
    if (st == 429)
        api_error_set(&e, st, "rate_limit_error", NULL, "rate_limit_exceeded",
                      "Rate limit reached for requests");
    else if (st == 401)
        api_error_set(&e, st, "invalid_request_error", NULL, "invalid_api_key",
                      "Incorrect API key provided.");
    else if (st == 500)
        api_error_set(&e, st, "server_error", NULL, NULL,
                      "The server had an error while processing your request.");
    else if (st == 502)
        api_error_set(&e, st, "server_error", NULL, NULL, "Bad gateway.");
    else if (st == 503)
        api_error_set(&e, st, "server_error", NULL, NULL,
                      "The server is overloaded or not ready yet.");
    else if (st >= 500)
        api_error_set(&e, st, "server_error", NULL, NULL, "Fake server error %u.", st);
    else
        api_error_set(&e, st, "invalid_request_error", NULL, NULL, "Fake client error %u.", st);
    *e_out = e;
}

/* ---- header_flood: more response headers than a client should accept ---- */

void fault_header_flood(struct MHD_Response *resp, unsigned long kib)
{
    char value[1001];
    memset(value, 'a', sizeof value - 1);
    value[sizeof value - 1] = '\0';
    for (unsigned long i = 0; i < kib; i++) {
        char name[32];
        snprintf(name, sizeof name, "X-Flood-%lu", i);
        MHD_add_response_header(resp, name, value);
    }
}

/* ---- oversized: a huge, valid reply produced lazily ---- */

struct oversized {
    char *prefix, *suffix;
    size_t plen, slen;
    uint64_t fill; /* number of 'x' between prefix and suffix */
};

static ssize_t oversized_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct oversized *o = cls;
    uint64_t total = o->plen + o->fill + o->slen;
    size_t n = 0;
    while (n < max && pos < total) {
        size_t chunk;
        if (pos < o->plen) {
            chunk = o->plen - (size_t)pos;
            if (chunk > max - n)
                chunk = max - n;
            memcpy(buf + n, o->prefix + pos, chunk);
        } else if (pos < o->plen + o->fill) {
            uint64_t left = o->plen + o->fill - pos;
            chunk = left < max - n ? (size_t)left : max - n;
            memset(buf + n, 'x', chunk);
        } else {
            size_t off = (size_t)(pos - o->plen - o->fill);
            chunk = o->slen - off;
            if (chunk > max - n)
                chunk = max - n;
            memcpy(buf + n, o->suffix + off, chunk);
        }
        n += chunk;
        pos += chunk;
    }
    return n ? (ssize_t)n : MHD_CONTENT_READER_END_OF_STREAM;
}

static void oversized_free(void *cls)
{
    struct oversized *o = cls;
    free(o->prefix);
    free(o->suffix);
    free(o);
}

struct MHD_Response *fault_oversized_response(const char *model, unsigned long seq,
                                              unsigned long mib)
{
    struct oversized *o = xmalloc(sizeof *o);
    o->fill = (uint64_t)mib * 1024 * 1024;

    /* Encode model through jansson so any characters are escaped properly. */
    json_t *m = json_string(model);
    char *model_json = json_dump_compact(m, NULL);
    json_decref(m);

    buf_t b = {0};
    buf_printf(&b,
               "{\"id\":\"chatcmpl-%lu\",\"object\":\"chat.completion\",\"created\":%lld,"
               "\"model\":%s,\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\","
               "\"content\":\"",
               seq, (long long)time(NULL), model_json);
    o->prefix = buf_take(&b, &o->plen);
    buf_printf(&b,
               "\"},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":1,"
               "\"completion_tokens\":%llu,\"total_tokens\":%llu}}",
               (unsigned long long)(o->fill / 4), (unsigned long long)(o->fill / 4 + 1));
    o->suffix = buf_take(&b, &o->slen);
    free(model_json);

    struct MHD_Response *resp = MHD_create_response_from_callback(
        o->plen + o->fill + o->slen, 64 * 1024, oversized_read, o, oversized_free);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    return resp;
}

/* ---- reset: promise a big body, deliver half a reply, then abort ---- */

struct reset_body {
    char *json;
    size_t half;
};

static ssize_t reset_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct reset_body *r = cls;
    if (pos >= r->half)
        return MHD_CONTENT_READER_END_WITH_ERROR; /* MHD drops the connection */
    size_t n = r->half - (size_t)pos;
    if (n > max)
        n = max;
    memcpy(buf, r->json + pos, n);
    return (ssize_t)n;
}

static void reset_free(void *cls)
{
    struct reset_body *r = cls;
    free(r->json);
    free(r);
}

struct MHD_Response *fault_reset_response(char *json, size_t len)
{
    struct reset_body *r = xmalloc(sizeof *r);
    r->json = json;
    r->half = len / 2;
    uint64_t declared = (uint64_t)len * 2 + 1024 * 1024;
    struct MHD_Response *resp =
        MHD_create_response_from_callback(declared, 16 * 1024, reset_read, r, reset_free);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    return resp;
}
