/*
 * history.c -- see history.h.
 *
 * Layout, chosen so the store costs little more than the message text:
 *  - a conversation is one allocation (header + id bytes inline), linked
 *    into an LRU list (head = most recently committed) and into `by_id`;
 *  - a turn is one allocation (small header + the comma-joined message
 *    JSON), linked oldest-first from its conversation and into `by_turn_id`;
 *  - both dicts are intrusive: they hold only pointers, keys are read from
 *    the entries, so no key is ever copied.
 * Rendering is a memcpy per turn; trimming and eviction free whole turns,
 * so a tool call is never separated from its result.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "history.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dict.h"

#define TURN_ID_MAX 36 /* a UUID */

typedef struct conversation conversation;

typedef struct stored_turn {
    struct stored_turn *newer;  /* next turn in the conversation, NULL for the newest */
    conversation *conv;
    uint64_t started_ms;
    uint64_t finished_ms;
    uint32_t nmessages;
    uint32_t length;            /* bytes in messages[] */
    char turn_id[TURN_ID_MAX + 1];
    char messages[];            /* "m1,m2,...", not NUL-terminated */
} stored_turn;

struct conversation {
    conversation *more_recent;  /* LRU neighbours; NULL at the ends */
    conversation *less_recent;
    stored_turn *oldest;
    stored_turn *newest;
    uint64_t created_ms;
    uint64_t last_used_ms;      /* time of the last commit */
    size_t nturns;
    char id[];
};

struct history {
    pthread_mutex_t lock;
    history_limits limits;
    dict *by_id;                /* conversation id -> conversation */
    dict *by_turn_id;           /* turn id -> stored_turn */
    conversation *lru_head;     /* most recently used */
    conversation *lru_tail;     /* next to evict or expire */
    size_t nturns;
    size_t message_bytes;
    size_t evicted;
    size_t expired;
};

static const char *conversation_key(const void *entry)
{
    return ((const conversation *)entry)->id;
}

static const char *turn_key(const void *entry)
{
    return ((const stored_turn *)entry)->turn_id;
}

/* ---- LRU list ---- */

static void lru_unlink(history *h, conversation *c)
{
    if (c->more_recent)
        c->more_recent->less_recent = c->less_recent;
    else
        h->lru_head = c->less_recent;
    if (c->less_recent)
        c->less_recent->more_recent = c->more_recent;
    else
        h->lru_tail = c->more_recent;
    c->more_recent = c->less_recent = NULL;
}

static void lru_push_head(history *h, conversation *c)
{
    c->more_recent = NULL;
    c->less_recent = h->lru_head;
    if (h->lru_head)
        h->lru_head->more_recent = c;
    else
        h->lru_tail = c;
    h->lru_head = c;
}

/* ---- forgetting ---- */

/* Guarded against a clock that steps backwards: that is "not idle". */
static int is_idle(const history *h, const conversation *c, uint64_t now_ms)
{
    uint64_t timeout = h->limits.idle_timeout_ms;
    return timeout && now_ms > c->last_used_ms && now_ms - c->last_used_ms > timeout;
}

/* Remove from the index only if it points at this turn: a duplicate turn id
 * (a caller bug) is stored but never indexed, and must not unindex the first. */
static void unindex_turn(history *h, stored_turn *t)
{
    if (dict_find(h->by_turn_id, t->turn_id) == t)
        dict_remove(h->by_turn_id, t->turn_id);
}

static void drop_oldest_turn(history *h, conversation *c)
{
    stored_turn *t = c->oldest;
    c->oldest = t->newer;
    if (!c->oldest)
        c->newest = NULL;
    c->nturns--;
    h->nturns--;
    h->message_bytes -= t->length;
    unindex_turn(h, t);
    free(t);
}

static void drop_all_turns(history *h, conversation *c)
{
    while (c->oldest)
        drop_oldest_turn(h, c);
}

static void forget_conversation(history *h, conversation *c)
{
    drop_all_turns(h, c);
    lru_unlink(h, c);
    dict_remove(h->by_id, c->id);
    free(c);
}

/* The conversation `id`, or NULL if unknown or idle (then forgotten here). */
static conversation *find_live(history *h, const char *id, uint64_t now_ms)
{
    conversation *c = dict_find(h->by_id, id);
    if (c && is_idle(h, c, now_ms)) {
        forget_conversation(h, c);
        h->expired++;
        return NULL;
    }
    return c;
}

/* Evict from the LRU tail down to max_conversations, sparing `keep`.  A tail
 * already idle past the timeout counts as expired: it was gone anyway. */
static void evict_beyond_limit(history *h, const conversation *keep, uint64_t now_ms)
{
    while (dict_size(h->by_id) > h->limits.max_conversations && h->lru_tail != keep) {
        conversation *victim = h->lru_tail;
        if (is_idle(h, victim, now_ms))
            h->expired++;
        else
            h->evicted++;
        forget_conversation(h, victim);
    }
}

/* Free every conversation and turn, leaving the dicts stale (caller resets them). */
static void free_all_entries(history *h)
{
    conversation *c = h->lru_head;
    while (c) {
        conversation *next = c->less_recent;
        for (stored_turn *t = c->oldest, *newer; t; t = newer) {
            newer = t->newer;
            free(t);
        }
        free(c);
        c = next;
    }
    h->lru_head = h->lru_tail = NULL;
    h->nturns = 0;
    h->message_bytes = 0;
}

/* Forget everything: swap in empty dicts (fast, and returns the tables'
 * memory), or without memory for them, remove entry by entry. */
static void forget_all(history *h)
{
    dict *by_id = dict_new(conversation_key);
    dict *by_turn_id = dict_new(turn_key);
    if (by_id && by_turn_id) {
        free_all_entries(h);
        dict_free(h->by_id);
        dict_free(h->by_turn_id);
        h->by_id = by_id;
        h->by_turn_id = by_turn_id;
        return;
    }
    dict_free(by_id);
    dict_free(by_turn_id);
    while (h->lru_head)
        forget_conversation(h, h->lru_head);
}

/* ---- lifecycle ---- */

history *history_new(const history_limits *limits)
{
    if (!limits)
        return NULL;
    history *h = calloc(1, sizeof *h);
    if (!h)
        return NULL;
    h->limits = *limits;
    if (h->limits.max_conversations == 0) /* contract says >= 1; stay bounded */
        h->limits.max_conversations = 1;
    h->by_id = dict_new(conversation_key);
    h->by_turn_id = dict_new(turn_key);
    if (!h->by_id || !h->by_turn_id || pthread_mutex_init(&h->lock, NULL) != 0) {
        dict_free(h->by_id);
        dict_free(h->by_turn_id);
        free(h);
        return NULL;
    }
    return h;
}

void history_free(history *h)
{
    if (!h)
        return;
    free_all_entries(h);
    dict_free(h->by_id);
    dict_free(h->by_turn_id);
    pthread_mutex_destroy(&h->lock);
    free(h);
}

/* ---- render ---- */

static size_t append_messages(const conversation *c, pbuf *out)
{
    size_t bytes = 0, count = 0;
    for (const stored_turn *t = c->oldest; t; t = t->newer)
        bytes += (size_t)t->length + 1;
    if (pbuf_reserve(out, bytes) != 0)
        return 0;
    for (const stored_turn *t = c->oldest; t; t = t->newer) {
        pbuf_append(out, t->messages, t->length);
        pbuf_putc(out, ',');
        count += t->nmessages;
    }
    return count;
}

size_t history_render(history *h, const char *id, uint64_t now_ms, pbuf *out)
{
    if (!h || !id || !out)
        return 0;
    pthread_mutex_lock(&h->lock);
    conversation *c = find_live(h, id, now_ms);
    size_t count = c ? append_messages(c, out) : 0;
    pthread_mutex_unlock(&h->lock);
    return count;
}

/* ---- commit ---- */

static int turn_in_is_valid(const history_turn_in *in)
{
    return in && in->turn_id && in->messages && in->messages_len > 0 &&
           in->messages_len <= UINT32_MAX && in->nmessages > 0 && in->nmessages <= UINT32_MAX;
}

static stored_turn *turn_new(const history_turn_in *in)
{
    size_t size = offsetof(stored_turn, messages) + in->messages_len;
    stored_turn *t = malloc(size < sizeof *t ? sizeof *t : size);
    if (!t)
        return NULL;
    t->newer = NULL;
    t->conv = NULL;
    t->started_ms = in->started_ms;
    t->finished_ms = in->finished_ms;
    t->nmessages = (uint32_t)in->nmessages;
    t->length = (uint32_t)in->messages_len;
    size_t idlen = strnlen(in->turn_id, TURN_ID_MAX);
    memcpy(t->turn_id, in->turn_id, idlen);
    t->turn_id[idlen] = '\0';
    memcpy(t->messages, in->messages, in->messages_len);
    return t;
}

static conversation *conversation_new(const char *id, uint64_t now_ms)
{
    size_t idlen = strlen(id);
    conversation *c = malloc(sizeof *c + idlen + 1);
    if (!c)
        return NULL;
    memset(c, 0, sizeof *c);
    c->created_ms = now_ms;
    memcpy(c->id, id, idlen + 1);
    return c;
}

static void append_turn(history *h, conversation *c, stored_turn *t)
{
    t->conv = c;
    if (c->newest)
        c->newest->newer = t;
    else
        c->oldest = t;
    c->newest = t;
    c->nturns++;
    h->nturns++;
    h->message_bytes += t->length;
}

static void trim_turns(history *h, conversation *c)
{
    while (h->limits.max_turns && c->nturns > h->limits.max_turns)
        drop_oldest_turn(h, c);
}

/*
 * Everything that can fail (the conversation allocation, both dict
 * insertions) happens first and is undone on failure; after the last
 * fallible step the store only frees, links and counts.
 */
static int commit_locked(history *h, const char *id, stored_turn *t, uint64_t now_ms)
{
    conversation *c = dict_find(h->by_id, id);
    int created = (c == NULL);
    int restarted = c && is_idle(h, c, now_ms);
    if (created) {
        c = conversation_new(id, now_ms);
        if (!c)
            return -1;
        if (dict_add(h->by_id, c) != 0) {
            free(c);
            return -1;
        }
    }
    if (!dict_find(h->by_turn_id, t->turn_id) && dict_add(h->by_turn_id, t) != 0) {
        if (created) {
            dict_remove(h->by_id, id);
            free(c);
        }
        return -1;
    }
    /* Nothing below can fail. */
    if (restarted) { /* idle past the timeout: the old context is forgotten */
        drop_all_turns(h, c);
        c->created_ms = now_ms;
        h->expired++;
    }
    if (!created)
        lru_unlink(h, c);
    lru_push_head(h, c);
    c->last_used_ms = now_ms;
    append_turn(h, c, t);
    trim_turns(h, c);
    evict_beyond_limit(h, c, now_ms);
    return 0;
}

int history_commit(history *h, const char *id, const history_turn_in *turn, uint64_t now_ms)
{
    if (!h || !id || !turn_in_is_valid(turn))
        return -1;
    stored_turn *t = turn_new(turn); /* outside the lock: the copy may be large */
    if (!t)
        return -1;
    pthread_mutex_lock(&h->lock);
    int rc = commit_locked(h, id, t, now_ms);
    pthread_mutex_unlock(&h->lock);
    if (rc != 0)
        free(t);
    return rc;
}

size_t history_expire(history *h, uint64_t now_ms)
{
    if (!h)
        return 0;
    size_t n = 0;
    pthread_mutex_lock(&h->lock);
    while (h->lru_tail && is_idle(h, h->lru_tail, now_ms)) {
        forget_conversation(h, h->lru_tail);
        n++;
    }
    h->expired += n;
    pthread_mutex_unlock(&h->lock);
    return n;
}

/* ---- JSON dumps ---- */

static void append_timestamp(pbuf *b, uint64_t ms)
{
    time_t secs = (time_t)(ms / 1000);
    struct tm tm;
    if ((uint64_t)secs != ms / 1000 || !gmtime_r(&secs, &tm)) {
        pbuf_puts(b, "\"1970-01-01T00:00:00.000Z\""); /* beyond what time_t can show */
        return;
    }
    pbuf_printf(b, "\"%04d-%02d-%02dT%02d:%02d:%02d.%03uZ\"", tm.tm_year + 1900, tm.tm_mon + 1,
                tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (unsigned)(ms % 1000));
}

static void append_key(pbuf *b, const char *key)
{
    pbuf_putc(b, '"');
    pbuf_puts(b, key);
    pbuf_puts(b, "\":");
}

static void append_string_field(pbuf *b, const char *key, const char *value)
{
    append_key(b, key);
    pbuf_json_string(b, value, strlen(value));
}

static void append_time_field(pbuf *b, const char *key, uint64_t ms)
{
    append_key(b, key);
    append_timestamp(b, ms);
}

static void append_turn_json(pbuf *b, const stored_turn *t)
{
    pbuf_putc(b, '{');
    append_string_field(b, "turn_id", t->turn_id);
    pbuf_putc(b, ',');
    append_time_field(b, "started_at", t->started_ms);
    pbuf_putc(b, ',');
    append_time_field(b, "finished_at", t->finished_ms);
    pbuf_puts(b, ",\"messages\":[");
    pbuf_append(b, t->messages, t->length); /* already valid JSON: verbatim */
    pbuf_puts(b, "]}");
}

/* The fields every conversation dump starts with, without the closing brace. */
static void append_conversation_head(pbuf *b, const conversation *c)
{
    pbuf_putc(b, '{');
    append_string_field(b, "conversation_id", c->id);
    pbuf_putc(b, ',');
    append_time_field(b, "created_at", c->created_ms);
    pbuf_putc(b, ',');
    append_time_field(b, "last_used_at", c->last_used_ms);
}

static void append_conversation_json(pbuf *b, const conversation *c)
{
    append_conversation_head(b, c);
    pbuf_puts(b, ",\"turns\":[");
    for (const stored_turn *t = c->oldest; t; t = t->newer) {
        if (t != c->oldest)
            pbuf_putc(b, ',');
        append_turn_json(b, t);
    }
    pbuf_puts(b, "]}");
}

/* Hand the buffer to *out: 0, or -2 when it ran out of memory. */
static int finish_dump(pbuf *b, char **out)
{
    *out = pbuf_take(b);
    return *out ? 0 : -2;
}

int history_dump_conversation(history *h, const char *id, uint64_t now_ms, char **out)
{
    if (!out)
        return -1;
    *out = NULL;
    if (!h || !id)
        return -1;
    pbuf b = PBUF_INIT;
    pthread_mutex_lock(&h->lock);
    conversation *c = find_live(h, id, now_ms);
    if (c)
        append_conversation_json(&b, c);
    pthread_mutex_unlock(&h->lock);
    return c ? finish_dump(&b, out) : -1;
}

int history_dump_turn(history *h, const char *turn_id, uint64_t now_ms, char **out)
{
    if (!out)
        return -1;
    *out = NULL;
    if (!h || !turn_id)
        return -1;
    pbuf b = PBUF_INIT;
    pthread_mutex_lock(&h->lock);
    stored_turn *t = dict_find(h->by_turn_id, turn_id);
    if (t && !find_live(h, t->conv->id, now_ms))
        t = NULL; /* its conversation expired and is now freed */
    if (t) {
        pbuf_putc(&b, '{');
        append_string_field(&b, "conversation_id", t->conv->id);
        pbuf_puts(&b, ",\"turn\":");
        append_turn_json(&b, t);
        pbuf_putc(&b, '}');
    }
    pthread_mutex_unlock(&h->lock);
    return t ? finish_dump(&b, out) : -1;
}

int history_dump_list(history *h, uint64_t now_ms, char **out)
{
    if (!out)
        return -1;
    *out = NULL;
    if (!h)
        return -1;
    pbuf b = PBUF_INIT;
    pbuf_puts(&b, "{\"conversations\":[");
    pthread_mutex_lock(&h->lock);
    int first = 1;
    for (conversation *c = h->lru_head, *next; c; c = next) {
        next = c->less_recent;
        if (is_idle(h, c, now_ms)) { /* checked one by one: clocks may step back */
            forget_conversation(h, c);
            h->expired++;
            continue;
        }
        if (!first)
            pbuf_putc(&b, ',');
        first = 0;
        append_conversation_head(&b, c);
        pbuf_printf(&b, ",\"turns\":%zu}", c->nturns);
    }
    pthread_mutex_unlock(&h->lock);
    pbuf_puts(&b, "]}");
    return finish_dump(&b, out);
}

/* ---- clear, stats ---- */

int history_clear(history *h, const char *id)
{
    if (!h)
        return -1;
    int rc = 0;
    pthread_mutex_lock(&h->lock);
    if (!id) {
        forget_all(h);
    } else {
        conversation *c = dict_find(h->by_id, id);
        if (c)
            forget_conversation(h, c);
        else
            rc = -1;
    }
    pthread_mutex_unlock(&h->lock);
    return rc;
}

void history_get_stats(history *h, history_stats *out)
{
    if (!out)
        return;
    memset(out, 0, sizeof *out);
    if (!h)
        return;
    pthread_mutex_lock(&h->lock);
    out->conversations = dict_size(h->by_id);
    out->turns = h->nturns;
    out->message_bytes = h->message_bytes;
    out->evicted = h->evicted;
    out->expired = h->expired;
    pthread_mutex_unlock(&h->lock);
}
