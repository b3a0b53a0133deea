/* window.c -- see window.h. */
#include "context/window.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http/context_window.h"
#include "lib/json_oom.h"
#include "store/message_text.h"

void ctx_window_free(ctx_window *w)
{
    free(w->end);
    free(w->nmsgs);
    free(w->tokens);
    free(w->rec.summary);
    free(w->rec.next);
    pbuf_free(&w->record);
    pbuf_free(&w->dropped);
    memset(w, 0, sizeof *w);
}

/* Takes the literal `s` at *p. */
static int plain_lit(const char **p, const char *end, const char *s)
{
    size_t n = strlen(s);
    if ((size_t)(end - *p) < n || memcmp(*p, s, n) != 0)
        return 0;
    *p += n;
    return 1;
}

/* An integer as JSON writes it (no leading zero), short enough for any reader. */
static int plain_uint(const char **p, const char *end, uint64_t *v)
{
    const char *s = *p;
    uint64_t x = 0;
    while (s < end && *s >= '0' && *s <= '9' && s - *p < 18)
        x = x * 10 + (uint64_t)(*s++ - '0');
    if (s == *p || (s < end && *s >= '0' && *s <= '9') || (**p == '0' && s - *p > 1))
        return 0;
    *v = x;
    *p = s;
    return 1;
}

static int plain_hash(const char **p, const char *end, uint64_t *v)
{
    uint64_t x = 0;
    if (end - *p < 16)
        return 0;
    for (int i = 0; i < 16; i++) {
        char c = (*p)[i];
        if (c >= '0' && c <= '9')
            x = x << 4 | (uint64_t)(c - '0');
        else if (c >= 'a' && c <= 'f')
            x = x << 4 | (uint64_t)(c - 'a' + 10);
        else
            return 0;
    }
    *v = x;
    *p += 16;
    return 1;
}

/* The record of a window without summaries, exactly as record_put writes it:
 * read without a JSON parser (every turn reads one).  0 for anything else,
 * which the parser reads as before. */
static int record_parse_plain(const char *json, size_t len, ctx_record *out)
{
    const char *p = json, *end = json + len;
    ctx_record r = {0};
    if (!plain_lit(&p, end, "{\"start\":") || !plain_uint(&p, end, &r.start))
        return 0;
    if (plain_lit(&p, end, ",\"lp\":") &&
        !(plain_uint(&p, end, &r.last_prompt) && plain_lit(&p, end, ",\"lb\":") &&
          plain_uint(&p, end, &r.last_bytes) && plain_lit(&p, end, ",\"plen\":") &&
          plain_uint(&p, end, &r.prefix_len) && plain_lit(&p, end, ",\"phash\":\"") &&
          plain_hash(&p, end, &r.prefix_hash) && plain_lit(&p, end, "\"")))
        return 0;
    if (!plain_lit(&p, end, "}") || p != end)
        return 0;
    *out = r;
    return 1;
}

/* The prefix hash as record_put writes it (16 hex digits; either case): 1 and
 * *v, or 0 for anything else, which strtoull would half read (the digits
 * before a stray byte: a hash no request has, a cache break reported). */
static int record_hash(const char *s, uint64_t *v)
{
    if (strlen(s) != 16 || strspn(s, "0123456789abcdefABCDEF") != 16)
        return 0;
    *v = strtoull(s, NULL, 16);
    return 1;
}

/* Any record (summaries, or written by an older Parley), field by field;
 * a field that is not as Parley writes it is left out whole.  0, or -1 out of
 * memory (a summary dropped then would be lost for good when the turn writes
 * the record back). */
static int record_parse_json(const char *json, size_t len, ctx_record *out)
{
    json_error_t jerr;
    json_t *root = json_loadb(json, len, 0, &jerr);
    if (!root && json_load_oom(&jerr))
        return -1;
    int oom = 0;
    json_t *start = json_object_get(root, "start");
    json_t *summary = json_object_get(root, "summary");
    json_t *upto = json_object_get(root, "upto");
    if (json_is_integer(start) && json_integer_value(start) >= 0)
        out->start = (uint64_t)json_integer_value(start);
    json_t *next = json_object_get(root, "next"), *next_upto = json_object_get(root, "next_upto");
    if (json_is_string(next) && json_string_length(next) && json_is_integer(next_upto) &&
        json_integer_value(next_upto) >= 0) {
        oom |= !(out->next = strdup(json_string_value(next)));
        out->next_upto = (uint64_t)json_integer_value(next_upto);
    }
    json_t *lp = json_object_get(root, "lp"), *lb = json_object_get(root, "lb");
    if (json_is_integer(lp) && json_is_integer(lb) && json_integer_value(lp) >= 0 &&
        json_integer_value(lb) >= 0) {
        out->last_prompt = (uint64_t)json_integer_value(lp);
        out->last_bytes = (uint64_t)json_integer_value(lb);
    }
    json_t *plen = json_object_get(root, "plen"), *phash = json_object_get(root, "phash");
    if (json_is_integer(plen) && json_integer_value(plen) >= 0 && json_is_string(phash) &&
        record_hash(json_string_value(phash), &out->prefix_hash))
        out->prefix_len = (uint64_t)json_integer_value(plen);
    if (json_is_string(summary) && json_string_length(summary) && json_is_integer(upto) &&
        json_integer_value(upto) >= 0) {
        oom |= !(out->summary = strdup(json_string_value(summary)));
        out->upto = (uint64_t)json_integer_value(upto);
    }
    json_decref(root);
    if (oom) {
        free(out->next);
        free(out->summary);
        memset(out, 0, sizeof *out);
        return -1;
    }
    return 0;
}

/* A record that does not parse is no record: the window starts over (one
 * cache miss), the conversation goes on. */
int ctx_record_parse(const char *json, size_t len, ctx_record *out)
{
    memset(out, 0, sizeof *out);
    if (!json || !len || record_parse_plain(json, len, out))
        return 0;
    return record_parse_json(json, len, out);
}

#ifdef PARLEY_TEST_HOOKS
int ctx_record_parse_plain(const char *json, size_t len, ctx_record *out)
{
    return record_parse_plain(json, len, out);
}

void ctx_record_parse_json(const char *json, size_t len, ctx_record *out)
{
    memset(out, 0, sizeof *out);
    if (json && len)
        record_parse_json(json, len, out);
}
#endif

/* Calls fn(ud, offset, length) for each message of stored text (message_text.h), in order,
 * until fn returns non-zero. */
static void each_message(const pbuf *text, int (*fn)(void *, size_t, size_t), void *ud)
{
    msgtext_iter it;
    msgtext_msg m;
    msgtext_begin(&it, text->data, text->len);
    while (msgtext_next(&it, &m) > 0)
        if (fn(ud, (size_t)(m.json - text->data), m.len))
            return;
}

typedef struct skip_state {
    size_t left, at;
} skip_state;

static int skip_one(void *ud, size_t offset, size_t len)
{
    skip_state *s = ud;
    s->at = offset + len + 1; /* past its ',' */
    return --s->left == 0;
}

/* Drop the first k messages of stored text, appending them to `into` when not NULL. */
static void skip_messages(pbuf *text, size_t k, pbuf *into)
{
    skip_state s = {k, 0};
    if (!k)
        return;
    each_message(text, skip_one, &s);
    if (s.at > text->len)
        s.at = text->len;
    if (into)
        pbuf_append(into, text->data, s.at);
    memmove(text->data, text->data + s.at, text->len - s.at + 1);
    text->len -= s.at;
}

/*
 * Each turn of the window takes the sizes the store kept for its turns
 * (w->tokens).  The store's turns nest in the window's (a turn is split at
 * user messages; an announcement is a stored turn of its own inside one):
 * a window turn's size is the sum of those it holds, and unknown (0: its
 * bytes are estimated) when any of them is, or when they do not line up
 * with it.  `skipped`: the loaded messages before the window.
 */
/* Whether `sum`, the sizes of `n` stored turns of `bytes` bytes in all, is
 * what ctx_turn_tokens could have given them with a factor in bounds. */
static int size_possible(uint64_t sum, size_t bytes, size_t n)
{
    double low = (double)bytes / CTX_BYTES_PER_TOKEN * CTX_FACTOR_MIN,
           high = (double)bytes / CTX_BYTES_PER_TOKEN * CTX_FACTOR_MAX + (double)n;
    return sum <= UINT32_MAX && (double)sum + 1 >= low && (double)sum <= high + 1;
}

static void take_sizes(ctx_window *w, const store_sizes *z, size_t loaded, size_t skipped)
{
    uint64_t all = 0;
    for (size_t j = 0; j < z->n; j++)
        all += z->turn[j].nmessages;
    if (z->oom || all != loaded || !w->tokens) /* not what was loaded: every turn estimated */
        return;
    uint64_t at = skipped, s_at = 0; /* a window turn's first message, a stored turn's */
    size_t j = 0;
    for (size_t i = 0; i < w->nturns; i++) {
        uint64_t end = at + w->nmsgs[i], sum = 0;
        size_t nstored = 0;
        while (j < z->n && s_at + z->turn[j].nmessages <= at) /* stored turns before it */
            s_at += z->turn[j++].nmessages;
        int known = 1;
        for (uint64_t p = at; known && p < end;) {
            const store_turn_size *t = j < z->n ? &z->turn[j] : NULL;
            known = t && s_at == p && t->nmessages && s_at + t->nmessages <= end && t->tokens;
            if (known) {
                sum += t->tokens;
                nstored++;
                p = s_at += t->nmessages;
                j++;
            }
        }
        size_t bytes = w->end[i] - (i ? w->end[i - 1] : 0);
        w->tokens[i] = known && size_possible(sum, bytes, nstored) ? (uint32_t)sum : 0;
        at = end;
    }
}

parley_status ctx_load(store *s, const store_key *key, size_t max_turns, int summarize,
                       uint64_t now_ms, pbuf *history, size_t *nmessages, ctx_window *w, char **err)
{
    *nmessages = 0;
    w->memo.valid = 0; /* a history loaded again */
    pbuf rec = {0};
    parley_status st = store_context_get(s, key, now_ms, &rec, &w->life, err);
    if (st == PARLEY_OK && rec.oom)
        st = PARLEY_ERR_NO_MEMORY;
    if (st != PARLEY_OK) {
        pbuf_free(&rec);
        return st;
    }
    w->enabled = 1;
    free(w->rec.summary); /* a window read again (a busy lease) */
    free(w->rec.next);
    int parsed = ctx_record_parse(rec.data, rec.len, &w->rec);
    pbuf_free(&rec);
    if (parsed != 0)
        return PARLEY_ERR_NO_MEMORY;
    uint64_t total = w->life.message_count;
    if (w->rec.start > total || w->rec.upto > w->rec.start) { /* not this conversation's */
        free(w->rec.summary);
        free(w->rec.next);
        memset(&w->rec, 0, sizeof w->rec);
    }
    w->summarize = summarize;
    /* With summaries, also what left the window before the summary caught up. */
    uint64_t from = w->rec.start;
    if (summarize && w->rec.upto < from)
        from = from - w->rec.upto > CTX_PENDING_MAX_MESSAGES ? from - CTX_PENDING_MAX_MESSAGES
                                                             : w->rec.upto;
    uint64_t since = total - from, window = total - w->rec.start;
    w->first = w->dropped_from = total;
    if (!since)
        return PARLEY_OK;
    /* A turn holds at least one message, so `since` turns reach `from`. */
    size_t last = since > (uint64_t)SIZE_MAX ? 0 : (size_t)since;
    /* Without summaries, turns beyond max_turns are only to be cut: not read.
     * With them, they are what the summary folds in: read (the start moves at
     * every cut, so `since` stays near the window plus a turn). */
    if (!summarize && max_turns && (!last || last > max_turns))
        last = max_turns;
    size_t n = 0;
    store_sizes sizes = {0};
    if ((st = store_load_sized(s, key, last, now_ms, history, &n, &sizes, err)) != PARLEY_OK) {
        free(sizes.turn);
        return st;
    }
    size_t loaded = n;
    if (n > since) {
        skip_messages(history, (size_t)(n - since), NULL);
        n = (size_t)since;
    }
    if (n > window) { /* the messages before the start: to fold into the summary */
        w->dropped_from = total - n;
        skip_messages(history, (size_t)(n - window), &w->dropped);
        n = (size_t)window;
    }
    w->start_lost = n < window;
    w->first = total - n;
    if (w->dropped_from > w->first)
        w->dropped_from = w->first;
    *nmessages = n;
    int split = history->oom || w->dropped.oom ? -1 : ctx_split(w, history);
    if (split == 0)
        take_sizes(w, &sizes, loaded, loaded - n);
    free(sizes.turn);
    return split == 0 ? PARLEY_OK : PARLEY_ERR_NO_MEMORY;
}

/* ---- turns ---- */

int64_t ctx_limit(const ctx_budget *b)
{
    return b->window - b->reserve - b->window * CTX_MARGIN_PERCENT / 100;
}

/* The tokens a cut keeps: what every request holds (fixed) and a third of the
 * rest of the limit (window.h: CTX_LOW_MARK_DIVISOR). */
static int64_t low_tokens(int64_t fixed, int64_t limit)
{
    return fixed + (limit > fixed ? (limit - fixed) / CTX_LOW_MARK_DIVISOR : 0);
}

/* The turns a cut by the turn bound keeps (window.h: CTX_LOW_MARK_DIVISOR). */
static size_t low_turns(size_t max_turns)
{
    size_t low = max_turns / CTX_LOW_MARK_DIVISOR;
    return low ? low : 1;
}

size_t ctx_reply_window(const ctx_window *w, size_t max_turns)
{
    if (!w->enabled || !w->nturns)
        return max_turns;
    if (max_turns && w->nturns > max_turns) /* the turn bound will cut to its low mark */
        return low_turns(max_turns);
    return w->nturns;
}

typedef struct split_state {
    ctx_window *w;
    const char *text;
    size_t cap;
    int oom;
} split_state;

static int split_one(void *ud, size_t offset, size_t len)
{
    static const char USER[] = "{\"role\":\"user\"";
    split_state *s = ud;
    ctx_window *w = s->w;
    int opens = !w->nturns ||
                (len >= sizeof USER - 1 && memcmp(s->text + offset, USER, sizeof USER - 1) == 0);
    if (opens) {
        if (w->nturns == s->cap) {
            size_t cap = s->cap ? 2 * s->cap : 16;
            size_t *end = realloc(w->end, cap * sizeof *end);
            if (end)
                w->end = end;
            size_t *nmsgs = end ? realloc(w->nmsgs, cap * sizeof *nmsgs) : NULL;
            if (nmsgs)
                w->nmsgs = nmsgs;
            uint32_t *tokens = nmsgs ? realloc(w->tokens, cap * sizeof *tokens) : NULL;
            if (!tokens) {
                s->oom = 1;
                return 1;
            }
            w->tokens = tokens;
            s->cap = cap;
        }
        w->tokens[w->nturns] = 0;
        w->nmsgs[w->nturns++] = 0;
    }
    w->end[w->nturns - 1] = offset + len + 1;
    w->nmsgs[w->nturns - 1]++;
    return 0;
}

int ctx_split(ctx_window *w, const pbuf *history)
{
    split_state s = {w, history->data, 0, 0};
    w->nturns = 0;
    w->memo.valid = 0; /* the history held changed */
    free(w->end);
    free(w->nmsgs);
    free(w->tokens);
    w->end = w->nmsgs = NULL;
    w->tokens = NULL;
    if (history->len)
        each_message(history, split_one, &s);
    return s.oom ? -1 : 0;
}

/* ---- the plan ---- */

int64_t ctx_tokens(size_t bytes, double factor)
{
    double t = (double)bytes / CTX_BYTES_PER_TOKEN * (factor > 0 ? factor : 1.0);
    return (int64_t)t + 1;
}

uint32_t ctx_turn_tokens(const store_message *msgs, size_t n, double factor)
{
    if (factor <= 0) /* the server has said nothing yet: estimate at each load instead */
        return 0;
    size_t bytes = 0;
    for (size_t i = 0; i < n; i++)
        bytes += msgs[i].json_len + 1; /* as the window holds it: "m," */
    int64_t t = ctx_tokens(bytes, factor);
    return t < UINT32_MAX ? (uint32_t)t : UINT32_MAX;
}

static size_t bytes_from(const ctx_window *w, size_t turn)
{
    size_t all = w->nturns ? w->end[w->nturns - 1] : 0;
    return all - (turn ? w->end[turn - 1] : 0);
}

/* Tokens of turns [from, to): the size stored with each where known, the
 * rest estimated from their bytes. */
static int64_t turns_tokens(const ctx_window *w, size_t from, size_t to, double factor)
{
    int64_t known = 0;
    size_t unknown = 0;
    for (size_t i = from; i < to; i++) {
        if (w->tokens && w->tokens[i])
            known += w->tokens[i];
        else
            unknown += w->end[i] - (i ? w->end[i - 1] : 0);
    }
    return known + (unknown || !known ? ctx_tokens(unknown, factor) : 0);
}

/* The request's size with its history counted as stored: body_tokens
 * estimates all of the request from its bytes; the history's part of that
 * gives way to turns_tokens.  *fixed receives the rest (prompt, tools,
 * summary, the new input). */
static int64_t body_counted(const ctx_window *w, const ctx_budget *b, int64_t body_tokens,
                            int64_t *fixed)
{
    int64_t f = body_tokens - ctx_tokens(bytes_from(w, 0), b->factor);
    *fixed = f > 0 ? f : 0;
    return *fixed + turns_tokens(w, 0, w->nturns, b->factor);
}

static ctx_cut_reason trigger(const ctx_window *w, const ctx_budget *b, int64_t body_tokens,
                              int64_t limit, uint64_t now_ms, int force)
{
    if (force)
        return CTX_CUT_OVERFLOW;
    if (body_tokens > limit)
        return CTX_CUT_TOKENS;
    if (b->max_turns && w->nturns > b->max_turns)
        return CTX_CUT_TURNS;
    if (w->start_lost)
        return b->max_turns && w->nturns >= b->max_turns ? CTX_CUT_TURNS : CTX_CUT_STORE;
    uint64_t last = w->life.last_message_ms;
    if (b->idle_ms && last && now_ms > last && now_ms - last > b->idle_ms)
        return CTX_CUT_IDLE;
    return CTX_CUT_NONE;
}

size_t ctx_plan(const ctx_window *w, const ctx_budget *b, int64_t body_tokens, uint64_t now_ms,
                int force, ctx_cut_reason *why)
{
    *why = CTX_CUT_NONE;
    if (!w->enabled || !w->nturns)
        return 0;
    int64_t limit = ctx_limit(b);
    int64_t fixed;
    int64_t body = body_counted(w, b, body_tokens, &fixed);
    ctx_cut_reason r = trigger(w, b, body, limit, now_ms, force);
    if (r == CTX_CUT_NONE)
        return 0;
    int64_t low = low_tokens(fixed, limit);
    size_t keep_turns = b->max_turns ? low_turns(b->max_turns) : SIZE_MAX;
    size_t n = 0;
    while (n < w->nturns) {
        size_t kept = w->nturns - n;
        int fits = kept <= keep_turns && fixed + turns_tokens(w, n, w->nturns, b->factor) <= low;
        if (fits && !(force && n == 0))
            break;
        n++;
    }
    if (n || w->start_lost)
        *why = r;
    return n;
}

void ctx_forget_sizes(ctx_window *w)
{
    if (w->tokens)
        memset(w->tokens, 0, w->nturns * sizeof *w->tokens);
}

size_t ctx_cut(ctx_window *w, pbuf *history, size_t n, ctx_cut_reason why)
{
    w->memo.valid = 0;
    if (n > w->nturns)
        n = w->nturns;
    size_t bytes = n ? w->end[n - 1] : 0, msgs = 0;
    for (size_t i = 0; i < n; i++)
        msgs += w->nmsgs[i];
    if (bytes > history->len)
        bytes = history->len;
    if (w->summarize) { /* what leaves the window goes to the summary */
        if (!w->dropped.len)
            w->dropped_from = w->first;
        pbuf_append(&w->dropped, history->data, bytes);
    }
    memmove(history->data, history->data + bytes, history->len - bytes + 1);
    history->len -= bytes;
    for (size_t i = n; i < w->nturns; i++) {
        w->end[i - n] = w->end[i] - bytes;
        w->nmsgs[i - n] = w->nmsgs[i];
        w->tokens[i - n] = w->tokens[i];
    }
    w->nturns -= n;
    w->first += msgs;
    w->start_lost = 0;
    w->cut_turns += n;
    if (why != CTX_CUT_NONE)
        w->cut = why;
    return msgs;
}

/* ,"key":"text" (clipped between characters to CTX_SUMMARY_MAX_BYTES) */
static void put_summary(pbuf *b, const char *key, const char *text)
{
    size_t n = strlen(text);
    if (n > CTX_SUMMARY_MAX_BYTES) {
        n = CTX_SUMMARY_MAX_BYTES;
        while (n && ((unsigned char)text[n] & 0xC0) == 0x80)
            n--;
    }
    pbuf_printf(b, ",\"%s\":", key);
    pbuf_json_string(b, text, n);
}

static int record_put(ctx_window *w, const char *summary, uint64_t upto)
{
    pbuf_reset(&w->record);
    pbuf_printf(&w->record, "{\"start\":%llu", (unsigned long long)w->first);
    if (summary && *summary) {
        put_summary(&w->record, "summary", summary);
        pbuf_printf(&w->record, ",\"upto\":%llu", (unsigned long long)upto);
    }
    if (w->rec.next && w->rec.next_upto > w->first) { /* still ahead of the window's start */
        put_summary(&w->record, "next", w->rec.next);
        pbuf_printf(&w->record, ",\"next_upto\":%llu", (unsigned long long)w->rec.next_upto);
    }
    if (w->rec.prefix_hash)
        pbuf_printf(&w->record, ",\"lp\":%llu,\"lb\":%llu,\"plen\":%llu,\"phash\":\"%016llx\"",
                    (unsigned long long)w->rec.last_prompt, (unsigned long long)w->rec.last_bytes,
                    (unsigned long long)w->rec.prefix_len, (unsigned long long)w->rec.prefix_hash);
    pbuf_putc(&w->record, '}');
    return w->record.oom ? -1 : 0;
}

int ctx_record_write(ctx_window *w) { return record_put(w, w->rec.summary, w->rec.upto); }

int ctx_record_write_summary(ctx_window *w, const char *summary)
{
    return record_put(w, summary, w->first);
}

int ctx_record_write_next(ctx_window *w, const char *next, size_t n_turns)
{
    uint64_t upto = w->first;
    for (size_t i = 0; i < n_turns && i < w->nturns; i++)
        upto += w->nmsgs[i];
    char *copy = strdup(next);
    if (!copy)
        return -1;
    free(w->rec.next);
    w->rec.next = copy;
    w->rec.next_upto = upto;
    return ctx_record_write(w);
}

size_t ctx_ahead_turns(const ctx_window *w, const ctx_budget *b, int64_t body_tokens)
{
    if (!w->enabled || !w->summarize || !w->nturns || w->dropped.len)
        return 0;
    if (w->rec.next && w->rec.next_upto > w->first) /* one is waiting */
        return 0;
    int64_t fixed;
    int near = body_counted(w, b, body_tokens, &fixed) > ctx_limit(b) * 8 / 10 ||
               (b->max_turns && w->nturns + 1 >= b->max_turns);
    if (!near)
        return 0;
    /* What the cut will drop when it comes: by the turn bound, the window of
     * max_turns + 1 down to its low mark; by tokens, the window grown to the
     * limit down to the low mark.  The turns still to come before that cut are
     * kept by it, so the oldest turns it drops add up to limit - low, not to
     * what a cut now would drop (that left the cut keeping twice the low mark). */
    ctx_cut_reason why;
    size_t k = ctx_plan(w, b, body_tokens, 0, 1, &why);
    int64_t limit = ctx_limit(b);
    while (k < w->nturns && turns_tokens(w, 0, k, b->factor) < limit - low_tokens(fixed, limit))
        k++;
    if (b->max_turns && w->nturns + 1 >= b->max_turns) {
        size_t by_turns = b->max_turns + 1 - low_turns(b->max_turns);
        if (by_turns > k)
            k = by_turns;
    }
    return k < w->nturns ? k : w->nturns;
}

size_t ctx_cut_for_next(const ctx_window *w, const ctx_budget *b, int64_t body_tokens, size_t n,
                        int *use_next)
{
    *use_next = 0;
    if (!w->summarize || !w->rec.next || w->rec.next_upto <= w->first ||
        w->dropped.len) /* turns waiting to be folded: the summary made ahead missed them */
        return n;
    uint64_t at = w->first;
    size_t k = 0;
    while (k < w->nturns && at < w->rec.next_upto)
        at += w->nmsgs[k++];
    if (at != w->rec.next_upto) /* not at a turn's start of this window */
        return n;
    int64_t fixed;
    int64_t kept = body_counted(w, b, body_tokens, &fixed) - turns_tokens(w, 0, k, b->factor);
    int fits = kept <= ctx_limit(b) && (!b->max_turns || w->nturns - k <= b->max_turns);
    if (!fits)
        return n;
    *use_next = 1; /* exactly what it covers: nothing is left to fold afterwards */
    return k;
}

void ctx_take_next(ctx_window *w)
{
    uint64_t covered = w->rec.next_upto;
    if (w->dropped.len && covered > w->dropped_from) { /* what it covers is folded */
        skip_messages(&w->dropped, (size_t)(covered - w->dropped_from), NULL);
        w->dropped_from = covered;
    }
    free(w->rec.summary);
    w->rec.summary = w->rec.next;
    w->rec.upto = covered;
    w->rec.next = NULL;
    w->rec.next_upto = 0;
}

const char *ctx_summary(const ctx_window *w)
{
    return w->enabled && w->summarize && w->rec.summary && *w->rec.summary ? w->rec.summary : NULL;
}

/* ---- the summary's input ---- */

/* The longest piece of one message that goes into the transcript. */
#define TRANSCRIPT_MAX_MESSAGE 4000

static void put_clipped(pbuf *b, const char *text)
{
    size_t n = strlen(text);
    if (n > TRANSCRIPT_MAX_MESSAGE) {
        n = TRANSCRIPT_MAX_MESSAGE;
        while (n && ((unsigned char)text[n] & 0xC0) == 0x80) /* not inside a character */
            n--;
    }
    pbuf_append(b, text, n);
    if (n < strlen(text))
        pbuf_puts(b, " [...]");
}

/* One stored message as a transcript line: "user: ...", "assistant: ...",
 * "assistant called NAME(ARGS)", "tool result: ...". */
static void put_line(pbuf *b, const json_t *m)
{
    const char *role = json_string_value(json_object_get(m, "role"));
    const json_t *content = json_object_get(m, "content");
    const json_t *calls = json_object_get(m, "tool_calls");
    size_t i;
    const json_t *call;
    json_array_foreach(calls, i, call)
    {
        const json_t *f = json_object_get(call, "function");
        const char *name = json_string_value(json_object_get(f, "name"));
        const char *args = json_string_value(json_object_get(f, "arguments"));
        pbuf_printf(b, "assistant called %s(", name ? name : "?");
        put_clipped(b, args ? args : "");
        pbuf_puts(b, ")\n");
    }
    if (!json_is_string(content) || !json_string_length(content))
        return;
    pbuf_printf(b, "%s: ", role && strcmp(role, "tool") == 0 ? "tool result" : role ? role : "?");
    put_clipped(b, json_string_value(content));
    pbuf_putc(b, '\n');
}

/* The dropped turns' messages (message_text.h), parsed: all of them, or NULL. */
static json_t *dropped_messages(const pbuf *dropped)
{
    json_t *msgs = json_array();
    msgtext_iter it;
    msgtext_msg m;
    int rc = 0;
    msgtext_begin(&it, dropped->data, dropped->len);
    while (msgs && rc >= 0 && (rc = msgtext_next(&it, &m)) > 0)
        if (json_array_append_new(msgs, json_loadb(m.json, m.len, 0, NULL)) != 0)
            rc = -1; /* not JSON (or out of memory): none, as for a text that is not a list */
    if (rc < 0) {
        json_decref(msgs);
        msgs = NULL;
    }
    return msgs;
}

/* Keep the last max_bytes of a transcript, from a line's start. */
static void keep_tail(pbuf *t, size_t max_bytes)
{
    if (t->len <= max_bytes)
        return;
    size_t at = t->len - max_bytes;
    while (at < t->len && t->data[at - 1] != '\n')
        at++;
    memmove(t->data, t->data + at, t->len - at + 1);
    t->len -= at;
}

char *ctx_summary_input(const ctx_window *w, size_t max_bytes)
{
    pbuf b = PBUF_INIT, lines = PBUF_INIT;
    const char *old = w->rec.summary && *w->rec.summary ? w->rec.summary : "(none)";
    pbuf_puts(&b, "Summary so far:\n");
    pbuf_puts(&b, old);
    pbuf_puts(&b, "\n\nConversation turns to add to it, oldest first:\n");
    json_t *msgs = dropped_messages(&w->dropped);
    size_t i;
    const json_t *m;
    json_array_foreach(msgs, i, m) put_line(&lines, m);
    json_decref(msgs);
    size_t room = max_bytes > b.len + 256 ? max_bytes - b.len : 256;
    if (lines.len > room) {
        keep_tail(&lines, room);
        pbuf_puts(&b, "[older turns omitted]\n");
    }
    if (lines.len)
        pbuf_append(&b, lines.data, lines.len);
    pbuf_free(&lines);
    if (b.oom || lines.oom) {
        pbuf_free(&b);
        return NULL;
    }
    return pbuf_take(&b);
}

ctx_model *ctx_model_of(ctx_agent *a, const char *model)
{
    const char *name = model ? model : "";
    for (size_t i = 0; i < CTX_MODELS; i++)
        if (a->models[i].name[0] && strncmp(a->models[i].name, name, CTX_MODEL_NAME - 1) == 0)
            return &a->models[i];
    ctx_model *m = &a->models[a->next_slot++ % CTX_MODELS];
    memset(m, 0, sizeof *m);
    snprintf(m->name, sizeof m->name, "%s", *name ? name : "?");
    return m;
}

void ctx_learn_factor(ctx_model *a, size_t body_bytes, long long prompt_tokens)
{
    if (prompt_tokens <= 0 || body_bytes < 64)
        return;
    double sample = (double)prompt_tokens / ((double)body_bytes / CTX_BYTES_PER_TOKEN);
    if (sample < CTX_FACTOR_MIN)
        sample = CTX_FACTOR_MIN;
    if (sample > CTX_FACTOR_MAX)
        sample = CTX_FACTOR_MAX;
    /* Weighted towards the newest, never below it by much: an estimate that
     * runs low is what overflows. */
    a->factor = a->factor > 0 ? 0.5 * a->factor + 0.5 * sample : sample;
    if (a->factor < sample * 0.9)
        a->factor = sample * 0.9;
}

/* ---- cache breaks ---- */

typedef struct fnv {
    uint64_t h;
    uint64_t len, limit; /* bytes taken so far; stop at limit */
} fnv;

#define FNV_PRIME      0x100000001b3ULL
#define FNV_STEP(h, c) ((h) = ((h) ^ (c)) * FNV_PRIME)

/* Every request's prefix goes through here twice a turn (the check, then the
 * commit): eight bytes a round, the state in registers, the limit taken once,
 * so a byte costs a load, a xor and a multiply.  The same hash as one byte a
 * round (the stored records hold it). */
static void fnv_add(fnv *f, const char *p, size_t n)
{
    if (n > f->limit - f->len)
        n = (size_t)(f->limit - f->len);
    const unsigned char *s = (const unsigned char *)p, *end = s + n;
    uint64_t h = f->h;
    for (; end - s >= 8; s += 8) {
        FNV_STEP(h, s[0]);
        FNV_STEP(h, s[1]);
        FNV_STEP(h, s[2]);
        FNV_STEP(h, s[3]);
        FNV_STEP(h, s[4]);
        FNV_STEP(h, s[5]);
        FNV_STEP(h, s[6]);
        FNV_STEP(h, s[7]);
    }
    for (; s < end; s++)
        FNV_STEP(h, *s);
    f->h = h;
    f->len += n;
}

/* The prompt and the tools, each followed by 0x1e: what comes before the history. */
static fnv fnv_head(const char *prompt, const char *tools, uint64_t limit)
{
    fnv f = {0xcbf29ce484222325ULL, 0, limit};
    fnv_add(&f, prompt ? prompt : "", prompt ? strlen(prompt) : 0);
    fnv_add(&f, "\x1e", 1);
    fnv_add(&f, tools ? tools : "", tools ? strlen(tools) : 0);
    fnv_add(&f, "\x1e", 1);
    return f;
}

void ctx_set_prefix(ctx_window *w, const char *prompt, const char *tools, const char *history,
                    size_t history_len, const char *turn, size_t turn_len)
{
    fnv f = fnv_head(prompt, tools, UINT64_MAX);
    const ctx_prefix_memo *m = &w->memo;
    /* The same state before the same history bytes: the check's hash after them. */
    if (m->valid && m->history == history && m->history_len == history_len && m->head_h == f.h &&
        m->head_len == f.len) {
        f.h = m->h;
        f.len += history_len;
    } else {
        fnv_add(&f, history ? history : "", history ? history_len : 0);
    }
    fnv_add(&f, turn ? turn : "", turn ? turn_len : 0);
    w->rec.prefix_len = f.len;
    w->rec.prefix_hash = f.h ? f.h : 1;
}

int ctx_prefix_kept(ctx_window *w, const char *prompt, const char *tools, const char *history,
                    size_t history_len)
{
    if (!w->rec.prefix_hash)
        return 1;
    fnv f = fnv_head(prompt, tools, w->rec.prefix_len), head = f;
    fnv_add(&f, history ? history : "", history ? history_len : 0);
    w->memo.valid = f.len - head.len == history_len; /* all of the history taken */
    w->memo.head_h = head.h;
    w->memo.head_len = head.len;
    w->memo.h = f.h;
    w->memo.history = history;
    w->memo.history_len = history_len;
    return f.len == w->rec.prefix_len && (f.h ? f.h : 1) == w->rec.prefix_hash;
}

int ctx_shrunk(const ctx_window *w, size_t body_bytes, long long prompt, double factor)
{
    if (!w->enabled || w->cut != CTX_CUT_NONE || !w->rec.last_prompt || prompt <= 0 ||
        body_bytes < w->rec.last_bytes + 64)
        return 0;
    int64_t growth = ctx_tokens(body_bytes - (size_t)w->rec.last_bytes, factor);
    return prompt < (long long)w->rec.last_prompt + growth / 2;
}

void ctx_describe(const char *record, size_t len, pbuf *out)
{
    ctx_record r;
    if (ctx_record_parse(record, len, &r) != 0) {
        out->oom = 1; /* not "no summary" */
        return;
    }
    pbuf_printf(out, "{\"window_start\":%llu,\"summary\":", (unsigned long long)r.start);
    if (r.summary)
        pbuf_json_string(out, r.summary, strlen(r.summary));
    else
        pbuf_puts(out, "null");
    pbuf_printf(out, ",\"summary_covers\":%llu}", (unsigned long long)(r.summary ? r.upto : 0));
    free(r.summary);
    free(r.next);
}

/* ---- discovery ---- */

static void *discover_main(void *arg)
{
    ctx_agent *a = arg;
    context_window_info info = {0, NULL};
    char *err = NULL;
    if (context_window_discover(a->opts, &info, &err) == 0 && info.n_ctx > 0)
        atomic_store(&a->discovered, info.n_ctx);
    free(err); /* no answer: the fallback stays (and an overflow answer still teaches) */
    a->release(a->ref);
    return NULL;
}

int ctx_discover_start(ctx_agent *a, const parley_options *o, void *ref, void (*release)(void *ref))
{
    if (a->started) {
        release(ref);
        return 0;
    }
    a->opts = o;
    a->ref = ref;
    a->release = release;
    a->started = pthread_create(&a->thread, NULL, discover_main, a) == 0 ? 1 : -1;
    if (a->started < 0) {
        release(ref);
        return -1;
    }
    return 0;
}

void ctx_agent_stop(ctx_agent *a)
{
    if (a->started == 1)
        pthread_join(a->thread, NULL);
    a->started = 0;
}

const char *ctx_cut_reason_name(ctx_cut_reason why)
{
    static const char *const NAMES[] = {"none", "tokens", "turns", "idle", "store", "overflow"};
    return (unsigned)why < sizeof NAMES / sizeof NAMES[0] ? NAMES[why] : "?";
}
