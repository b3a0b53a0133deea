/* Streaming: SSE event generation and "paced" bodies.
 *
 * A paced body is a list of segments handed to MHD one per content-reader
 * call, so each becomes its own HTTP chunk. slow_stream waits between
 * segments by suspending the connection (the timer resumes it) instead of
 * sleeping, so a slow stream never pins an MHD worker thread. */
#include "fakellm.h"

#include <stdlib.h>
#include <string.h>

void segments_add(struct segments *s, const char *p, size_t n)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 16;
        s->ends = xrealloc(s->ends, s->cap * sizeof *s->ends);
    }
    buf_append(&s->data, p, n);
    s->ends[s->n++] = s->data.len;
}

void segments_free(struct segments *s)
{
    buf_free(&s->data);
    free(s->ends);
    memset(s, 0, sizeof *s);
}

void segments_split(const char *body, size_t len, size_t pieces, struct segments *out)
{
    size_t step = len / pieces + 1;
    for (size_t pos = 0; pos < len;) {
        size_t end = utf8_boundary(body, len, pos + step);
        segments_add(out, body + pos, end - pos);
        pos = end;
    }
}

/* ---- SSE events ---- */

struct sse_ctx {
    const struct chat_request *req;
    unsigned long seq;
    bool poison;
    struct segments *out;
    json_t *timings; /* llama.cpp: goes on the chunk with finish_reason (stolen) */
};

/* Appends one "data: {chunk}\n\n" event. delta and usage are stolen. */
static void emit(struct sse_ctx *c, json_t *delta, const char *finish, json_t *usage)
{
    json_t *o = chat_object_base(c->req, c->seq, "chat.completion.chunk");
    json_t *choices = json_array();
    if (delta) {
        json_t *ch = json_object();
        json_object_set_new(ch, "index", json_integer(0));
        json_object_set_new(ch, "delta", delta);
        json_object_set_new(ch, "logprobs", json_null());
        json_object_set_new(ch, "finish_reason", finish ? json_string(finish) : json_null());
        json_array_append_new(choices, ch);
    }
    json_object_set_new(o, "choices", choices);
    if (usage)
        json_object_set_new(o, "usage", usage);
    if (finish && c->timings) {
        json_object_set_new(o, "timings", c->timings);
        c->timings = NULL;
    }
    size_t len;
    char *s = json_dump_compact(o, &len);
    json_decref(o);
    if (c->poison)
        len = utf8_poison(s, len);

    buf_t ev = {0};
    buf_append(&ev, "data: ", 6);
    buf_append(&ev, s, len);
    buf_append(&ev, "\n\n", 2);
    segments_add(c->out, ev.data, ev.len);
    buf_free(&ev);
    free(s);
}

/* Piece size: ~8 bytes, but at most ~256 pieces for long texts. */
static size_t piece_size(size_t len)
{
    size_t p = len / 256 + 1;
    return p < 8 ? 8 : p;
}

static json_t *tool_delta(size_t index, const struct tool_call *tc, const char *args, size_t alen)
{
    json_t *fn = json_object();
    if (tc)
        json_object_set_new(fn, "name", json_string_lossy(tc->name, strlen(tc->name)));
    json_object_set_new(fn, "arguments", json_string_lossy(args, alen));
    json_t *call = json_object();
    json_object_set_new(call, "index", json_integer((json_int_t)index));
    if (tc) {
        json_object_set_new(call, "id", json_string(tc->id));
        json_object_set_new(call, "type", json_string("function"));
    }
    json_object_set_new(call, "function", fn);
    json_t *calls = json_array();
    json_array_append_new(calls, call);
    json_t *delta = json_object();
    json_object_set_new(delta, "tool_calls", calls);
    return delta;
}

/* One delta event per ~8-byte piece of s, in delta member `field`. */
static void text_deltas(struct sse_ctx *c, const char *field, const char *s)
{
    size_t len = strlen(s), step = piece_size(len);
    for (size_t pos = 0; pos < len;) {
        size_t end = utf8_boundary(s, len, pos + step);
        json_t *d = json_object();
        json_object_set_new(d, field, json_string_lossy(s + pos, end - pos));
        emit(c, d, NULL, NULL);
        pos = end;
    }
}

void sse_build(const struct chat_request *req, const struct chat_reply *r, unsigned long seq,
               const struct prompt_stats *ps, bool poison_utf8, struct segments *out)
{
    struct sse_ctx c = {req, seq, poison_utf8, out, chat_timings(ps, r)};

    json_t *d = json_object();
    json_object_set_new(d, "role", json_string("assistant"));
    emit(&c, d, NULL, NULL);

    if (r->reasoning)
        text_deltas(&c, "reasoning_content", r->reasoning);
    if (r->content)
        text_deltas(&c, "content", r->content);
    for (size_t i = 0; i < r->ncalls; i++) {
        const struct tool_call *tc = &r->calls[i];
        emit(&c, tool_delta(i, tc, "", 0), NULL, NULL);
        size_t len = strlen(tc->args), step = piece_size(len);
        for (size_t pos = 0; pos < len;) {
            size_t end = utf8_boundary(tc->args, len, pos + step);
            emit(&c, tool_delta(i, NULL, tc->args + pos, end - pos), NULL, NULL);
            pos = end;
        }
    }
    emit(&c, json_object(), r->finish_reason, NULL);
    if (req->include_usage)
        emit(&c, NULL, NULL, chat_usage(ps, r));
    static const char done[] = "data: [DONE]\n\n";
    segments_add(out, done, sizeof done - 1);
}

/* ---- paced MHD responses ---- */

struct paced {
    struct segments segs;
    struct MHD_Connection *conn;
    struct paced_opts o;
    size_t limit;     /* bytes to send before ending (the cut point) */
    size_t seg;       /* segment currently being sent */
    size_t waited;    /* segment whose gap we already waited for */
    bool suspended;
    bool held;        /* hold_open: the wait before the next keep-alive is over */
};

static ssize_t paced_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct paced *p = cls;
    if (p->suspended) {
        p->suspended = false;
        http_resumed();
    }
    if (atomic_load(&g_shutting_down))
        return MHD_CONTENT_READER_END_WITH_ERROR;
    if (pos >= p->limit) {
        if (p->o.cut && p->o.abort_at_cut)
            return MHD_CONTENT_READER_END_WITH_ERROR;
        if (!p->o.hold_open)
            return MHD_CONTENT_READER_END_OF_STREAM;
        /* The answer is complete, but the body never ends: wait, then (maybe)
         * send a keep-alive comment, forever.  Shutdown resumes and ends it. */
        if (!p->held) {
            p->held = true;
            p->suspended = true;
            http_suspend_until(p->conn,
                               p->o.keepalive_ms ? now_ms() + p->o.keepalive_ms : TIMER_NEVER);
            return 0;
        }
        p->held = false;
        static const char ka[] = ": keep-alive\n\n";
        size_t n = sizeof ka - 1 < max ? sizeof ka - 1 : max;
        memcpy(buf, ka, n);
        return (ssize_t)n;
    }
    while (p->seg < p->segs.n && p->segs.ends[p->seg] <= pos)
        p->seg++;
    size_t start = p->seg ? p->segs.ends[p->seg - 1] : 0;
    if (p->o.gap_ms && pos == start && p->seg > 0 && p->waited != p->seg) {
        p->waited = p->seg;
        p->suspended = true;
        http_suspend_until(p->conn, now_ms() + p->o.gap_ms);
        return 0; /* MHD calls us again once resumed */
    }
    size_t end = p->segs.ends[p->seg];
    if (end > p->limit)
        end = p->limit;
    size_t n = end - (size_t)pos;
    if (n > max)
        n = max;
    memcpy(buf, p->segs.data.data + pos, n);
    return (ssize_t)n;
}

static void paced_free(void *cls)
{
    struct paced *p = cls;
    if (p->suspended) /* closed while suspended (daemon shutdown) */
        http_resumed();
    segments_free(&p->segs);
    free(p);
}

struct MHD_Response *paced_response(struct MHD_Connection *conn, struct segments *segs,
                                    const struct paced_opts *o, const char *content_type)
{
    struct paced *p = xmalloc(sizeof *p);
    memset(p, 0, sizeof *p);
    p->segs = *segs;
    memset(segs, 0, sizeof *segs);
    p->conn = conn;
    p->o = *o;
    p->waited = (size_t)-1;
    p->limit = p->segs.data.len;
    if (o->cut && p->segs.n) {
        size_t mid = p->segs.n / 2;
        size_t start = mid ? p->segs.ends[mid - 1] : 0;
        p->limit = start + (p->segs.ends[mid] - start) / 2;
    }
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, paced_read, p, paced_free);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    return resp;
}
