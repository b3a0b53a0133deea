/*
 * memory.c -- the in-memory store (scheme "memory"), the default.  Never
 * blocks, so the agent calls it inline on the worker.
 *
 * Layout, chosen so the store costs little more than the message text:
 *  - a conversation is one allocation (header + key bytes inline), linked
 *    into an LRU list (head = most recently appended) and into `by_key`;
 *  - a turn is one allocation: an 80-byte header (its size in tokens, store.h
 *    version 6, packed into bits its first position does not need), a packed
 *    index entry per message (its id, role, time and length: 24 bytes) and
 *    the messages' JSON joined by ',', so loading is a memcpy per turn.  Its turn id is
 *    kept as the UUID's 16 bytes, so a turn id must be a lowercase UUID (the
 *    plugin makes only those: uuid4()); that keeps 1M conversations under
 *    2 x their stored bytes (docs/performance.md);
 *  - both dicts are intrusive: they hold only pointers, keys are read from
 *    the entries, so no key is ever copied.
 * Trimming and eviction free whole turns, so a tool call is never separated
 * from its result.
 *
 * Version 4 (message identity) costs nothing to what does not use it:
 *  - the interface message ids and metadata the host gave a turn's messages
 *    live in one block per turn (turn_identity), in a third dict keyed by
 *    turn id, and only for turns that have some; a flag in the turn's
 *    padding says whether to look;
 *  - a conversation's lifetime counters fit in the padding its header had
 *    (the header stays 64 bytes); its last_message_at is read from its
 *    newest turn, which is never dropped;
 *  - find_message and load_turn by interface id scan the conversation's
 *    kept turns (reading the blocks of those with identity): no index
 *    per message.
 *
 * The dict key of a conversation is its conversation id when persona and
 * interface are both "" (the common case: no copy to look it up), else
 * "<id>\x1f<persona length>:<persona><interface>": ids hold no control
 * characters, so the first \x1f ends the id and the length ends the persona.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "lib/dict.h"
#include "store/store.h"
#include "store/store_json.h"

typedef struct conversation conversation;

/* What the store indexes of one message, packed: 24 bytes next to its JSON. */
typedef struct stored_message {
    uint32_t length;            /* of its JSON in the turn's text */
    uint32_t role : 2;          /* index into ROLES */
    uint32_t created_after_ms : 30; /* created_ms - the turn's started_ms (clamped: 12 days) */
    uint8_t message_id[16];     /* the UUID, binary */
} stored_message;
#define CREATED_AFTER_MAX ((1u << 30) - 1)

typedef struct stored_turn {
    struct stored_turn *newer;  /* NULL for the newest */
    struct stored_turn *store_newer; /* every turn of the store in append order: */
    struct stored_turn *store_older; /* what a query across conversations walks */
    conversation *conv;
    uint64_t first_seq : 40;    /* position of messages[0]; the others follow (SEQ_END) */
    uint64_t has_identity : 1;  /* m->identities holds a turn_identity */
    uint64_t tokens : 23;       /* store_turn.tokens (version 6), saturating at TOKENS_MAX */
    uint64_t started_ms;
    uint64_t finished_ms;
    uint32_t nmessages;
    uint32_t length;            /* bytes of the joined text "m1,m2,..." */
    uint8_t turn_id[16];        /* the UUID, binary: the key of by_turn_id and identities */
    stored_message messages[];  /* then the joined text, not NUL-terminated */
} stored_turn;
/* 80: with the 24 per message and the text, a 2-message turn of ~190 bytes
 * lands in a 336-352 byte malloc chunk (the 37-byte text id made it 104). */
_Static_assert(sizeof(stored_turn) == 80, "stored_turn header is 80 bytes");
/* Positions stop here: 10^12 messages appended by one process (a thousand a
 * second for 35 years); an append past it is refused, never wrapped. */
#define SEQ_END (UINT64_C(1) << 40)
/* A turn's size beyond this (8.4M tokens, more than any model's window) is kept as this. */
#define TOKENS_MAX ((UINT32_C(1) << 23) - 1)

static const char *const ROLES[] = {"user", "assistant", "tool", "system"};

static int role_code(const char *role)
{
    for (size_t i = 0; role && i < sizeof ROLES / sizeof ROLES[0]; i++)
        if (strcmp(role, ROLES[i]) == 0)
            return (int)i;
    return -1;
}

/* A hex digit's value + 1 (0: not a digit); capitals also carry 0x20. */
static const uint8_t HEX_PLUS_1[256] = {
    ['0'] = 1, ['1'] = 2, ['2'] = 3, ['3'] = 4, ['4'] = 5,
    ['5'] = 6, ['6'] = 7, ['7'] = 8, ['8'] = 9, ['9'] = 10,
    ['a'] = 11, ['b'] = 12, ['c'] = 13, ['d'] = 14, ['e'] = 15, ['f'] = 16,
    ['A'] = 0x20 | 11, ['B'] = 0x20 | 12, ['C'] = 0x20 | 13,
    ['D'] = 0x20 | 14, ['E'] = 0x20 | 15, ['F'] = 0x20 | 16,
};

/* "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" to 16 bytes; -1 if it is not that
 * shape, or (lowercase_only) if it has a capital hex digit.  Table-driven:
 * every append parses its ids. */
static int uuid_parse_as(const char *text, uint8_t out[16], int lowercase_only)
{
    static const uint8_t at[16] = {0, 2, 4, 6, 9, 11, 14, 16, 19, 21, 24, 26, 28, 30, 32, 34};
    if (!text || strnlen(text, STORE_ID_LEN + 1) != STORE_ID_LEN || text[8] != '-' ||
        text[13] != '-' || text[18] != '-' || text[23] != '-')
        return -1;
    unsigned missing = 0, capitals = 0;
    for (size_t n = 0; n < 16; n++) {
        unsigned hi = HEX_PLUS_1[(unsigned char)text[at[n]]];
        unsigned lo = HEX_PLUS_1[(unsigned char)text[at[n] + 1]];
        missing |= !(hi & 0x1f) | !(lo & 0x1f);
        capitals |= (hi | lo) & 0x20;
        out[n] = (uint8_t)(((hi & 0x1f) - 1) << 4 | ((lo & 0x1f) - 1));
    }
    return missing || (lowercase_only && capitals) ? -1 : 0;
}

static int uuid_parse(const char *text, uint8_t out[16])
{
    return uuid_parse_as(text, out, 0);
}

static void uuid_format(const uint8_t id[16], char out[STORE_ID_LEN + 1])
{
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;
    for (size_t i = 0; i < 16; i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10)
            out[o++] = '-';
        out[o++] = hex[id[i] >> 4];
        out[o++] = hex[id[i] & 15];
    }
    out[o] = '\0';
}

/* A turn id as stored: 16 bytes, only from its canonical text (lowercase,
 * as uuid_format writes it back), so that it round-trips byte for byte; -1
 * for any other text (such a turn id can be neither stored nor found). */
static int turn_id_parse(const char *text, uint8_t out[16])
{
    return uuid_parse_as(text, out, 1);
}

/* The identity the host gave one message (version 4): where its
 * interface_message_id and metadata are in its turn_identity's text. */
typedef struct message_identity {
    uint32_t interface_id_at, interface_id_len; /* len 0: none */
    uint32_t metadata_at, metadata_len;
} message_identity;

/* One per turn that has any identity: an entry of m->identities, keyed by
 * its turn's id (read through the turn: no copy). */
typedef struct turn_identity {
    const struct stored_turn *turn;
    message_identity of[];      /* one per message of the turn, then the text */
} turn_identity;

struct conversation {
    conversation *more_recent;  /* LRU neighbours; NULL at the ends */
    conversation *less_recent;
    stored_turn *oldest;
    stored_turn *newest;        /* never NULL: a conversation has >= 1 turn */
    uint64_t created_ms;
    uint64_t last_used_ms;      /* time of the last append */
    uint32_t nturns;            /* kept now */
    /* The lifetime (version 4), kept when turns are dropped; saturating
     * (4 billion: 136 years at a message a second). */
    uint32_t message_count;
    uint32_t turn_count;
    uint16_t id_len;            /* the conversation id is key[0..id_len) */
    uint8_t roles;              /* STORE_ROLE_* ever seen */
    uint8_t has_context;        /* m->contexts holds its context record (version 5) */
    char key[];
};

/* A conversation's context record (store.h version 5), kept beside it in
 * m->contexts (keyed by the conversation's key, read through it) so that
 * conversations without one pay nothing. */
typedef struct context_record {
    const conversation *conv;
    size_t len;
    char json[];
} context_record;

static uint32_t saturating_add(uint32_t a, uint32_t b)
{
    return a > UINT32_MAX - b ? UINT32_MAX : a + b;
}

typedef struct memory_store {
    struct store base;
    pthread_mutex_t lock;
    store_limits limits;
    dict *by_key;               /* conversation key -> conversation */
    dict *by_turn_id;           /* turn id -> stored_turn */
    dict *identities;           /* turn id -> turn_identity, for turns with has_identity */
    dict *contexts;             /* conversation key -> context_record, for has_context */
    conversation *lru_head;     /* most recently used */
    conversation *lru_tail;     /* next to evict or expire */
    stored_turn *store_oldest;  /* every turn, in append order */
    stored_turn *store_newest;
    uint64_t next_seq;          /* a message's position: 1, 2, ... in append order */
    size_t nturns;
    size_t nmessages;           /* of those turns */
    size_t trimmed;             /* turns dropped by keep_turns, since open */
    size_t message_bytes;
    size_t evicted;
    size_t expired;
} memory_store;

static const char *text_of(const stored_turn *t)
{
    return (const char *)(t->messages + t->nmessages);
}

static uint64_t created_ms_of(const stored_turn *t, size_t i)
{
    return t->started_ms + t->messages[i].created_after_ms;
}

static const char *conversation_key(const void *entry)
{
    return ((const conversation *)entry)->key;
}

static const char *turn_key(const void *entry)
{
    return (const char *)((const stored_turn *)entry)->turn_id;
}

/* The stored turn named by the text `turn_id` (NULL-safe), or NULL. */
static stored_turn *turn_named(const memory_store *m, const char *turn_id)
{
    uint8_t id[16];
    return turn_id && turn_id_parse(turn_id, id) == 0 ? dict_find(m->by_turn_id, (const char *)id)
                                                      : NULL;
}

static const char *context_key(const void *entry)
{
    return ((const context_record *)entry)->conv->key;
}

static const char *identity_key(const void *entry)
{
    return (const char *)((const turn_identity *)entry)->turn->turn_id;
}

static char *oom_message(void) { return strdup("memory store: out of memory"); }

static parley_status fail(char **err, parley_status st)
{
    if (err)
        *err = st == PARLEY_ERR_NOT_FOUND ? NULL : oom_message();
    return st;
}

/* The dict key of `k`: k->conversation_id itself, or *owned (malloc'd). */
static const char *key_text(const store_key *k, char **owned)
{
    *owned = NULL;
    const char *p = k->persona ? k->persona : "", *i = k->interface_type ? k->interface_type : "";
    if (!*p && !*i)
        return k->conversation_id;
    *owned = pstr_printf("%s\x1f%zu:%s%s", k->conversation_id, strlen(p), p, i);
    return *owned;
}

/* ---- LRU list ---- */

static void lru_unlink(memory_store *m, conversation *c)
{
    if (c->more_recent)
        c->more_recent->less_recent = c->less_recent;
    else
        m->lru_head = c->less_recent;
    if (c->less_recent)
        c->less_recent->more_recent = c->more_recent;
    else
        m->lru_tail = c->more_recent;
    c->more_recent = c->less_recent = NULL;
}

static void lru_push_head(memory_store *m, conversation *c)
{
    c->more_recent = NULL;
    c->less_recent = m->lru_head;
    if (m->lru_head)
        m->lru_head->more_recent = c;
    else
        m->lru_tail = c;
    m->lru_head = c;
}

/* ---- forgetting ---- */

/* Guarded against a clock that steps backwards: that is "not idle". */
static int is_idle(const memory_store *m, const conversation *c, uint64_t now_ms)
{
    uint64_t timeout = m->limits.idle_timeout_ms;
    return timeout && now_ms > c->last_used_ms && now_ms - c->last_used_ms > timeout;
}

static void store_list_unlink(memory_store *m, stored_turn *t)
{
    if (t->store_newer)
        t->store_newer->store_older = t->store_older;
    else
        m->store_newest = t->store_older;
    if (t->store_older)
        t->store_older->store_newer = t->store_newer;
    else
        m->store_oldest = t->store_newer;
}

static void drop_oldest_turn(memory_store *m, conversation *c)
{
    stored_turn *t = c->oldest;
    store_list_unlink(m, t);
    c->oldest = t->newer;
    if (!c->oldest)
        c->newest = NULL;
    c->nturns--;
    m->nturns--;
    m->nmessages -= t->nmessages;
    m->message_bytes -= t->length;
    dict_remove(m->by_turn_id, (const char *)t->turn_id);
    if (t->has_identity)
        free(dict_remove(m->identities, (const char *)t->turn_id));
    free(t);
}

static void drop_all_turns(memory_store *m, conversation *c)
{
    while (c->oldest)
        drop_oldest_turn(m, c);
}

static void forget_conversation(memory_store *m, conversation *c)
{
    if (c->has_context)
        free(dict_remove(m->contexts, c->key));
    drop_all_turns(m, c);
    lru_unlink(m, c);
    dict_remove(m->by_key, c->key);
    free(c);
}

/* The conversation named `key`, or NULL if unknown or idle (then forgotten here). */
static conversation *find_live(memory_store *m, const char *key, uint64_t now_ms)
{
    conversation *c = dict_find(m->by_key, key);
    if (c && is_idle(m, c, now_ms)) {
        forget_conversation(m, c);
        m->expired++;
        return NULL;
    }
    return c;
}

/* Evict from the LRU tail down to max_conversations, sparing `keep`.  A tail
 * already idle past the timeout counts as expired: it was gone anyway. */
static void evict_beyond_limit(memory_store *m, const conversation *keep, uint64_t now_ms)
{
    while (dict_size(m->by_key) > m->limits.max_conversations && m->lru_tail != keep) {
        conversation *victim = m->lru_tail;
        if (is_idle(m, victim, now_ms))
            m->expired++;
        else
            m->evicted++;
        forget_conversation(m, victim);
    }
}

static void free_entry(void *entry, void *ud)
{
    (void)ud;
    free(entry);
}

/* Free every conversation and turn, leaving the dicts stale (caller resets them). */
static void free_all_entries(memory_store *m)
{
    dict_foreach(m->identities, free_entry, NULL); /* first: their keys live in the turns */
    dict_foreach(m->contexts, free_entry, NULL);   /* and in the conversations */
    conversation *c = m->lru_head;
    while (c) {
        conversation *next = c->less_recent;
        for (stored_turn *t = c->oldest, *newer; t; t = newer) {
            newer = t->newer;
            free(t);
        }
        free(c);
        c = next;
    }
    m->lru_head = m->lru_tail = NULL;
    m->store_oldest = m->store_newest = NULL;
    m->nturns = 0;
    m->nmessages = 0;
    m->message_bytes = 0;
}

/* Forget everything: swap in empty dicts (fast, and returns the tables'
 * memory), or without memory for them, remove entry by entry. */
static void forget_all(memory_store *m)
{
    dict *by_key = dict_new(conversation_key);
    dict *by_turn_id = dict_new_fixed(turn_key, sizeof(((stored_turn *)0)->turn_id));
    dict *identities = dict_new_fixed(identity_key, sizeof(((stored_turn *)0)->turn_id));
    dict *contexts = dict_new(context_key);
    if (by_key && by_turn_id && identities && contexts) {
        free_all_entries(m);
        dict_free(m->by_key);
        dict_free(m->by_turn_id);
        dict_free(m->identities);
        dict_free(m->contexts);
        m->by_key = by_key;
        m->by_turn_id = by_turn_id;
        m->identities = identities;
        m->contexts = contexts;
        return;
    }
    dict_free(by_key);
    dict_free(by_turn_id);
    dict_free(identities);
    dict_free(contexts);
    while (m->lru_head)
        forget_conversation(m, m->lru_head);
}

/* ---- open, close ---- */

static parley_status memory_open(const store_config *cfg, store **out, char **err)
{
    *out = NULL;
    memory_store *m = calloc(1, sizeof *m);
    if (!m)
        return fail(err, PARLEY_ERR_NO_MEMORY);
    m->base.backend = &store_memory_backend;
    m->next_seq = 1;
    m->limits = cfg->limits;
    if (m->limits.max_conversations == 0) /* contract says >= 1; stay bounded */
        m->limits.max_conversations = 1;
    m->by_key = dict_new(conversation_key);
    m->by_turn_id = dict_new_fixed(turn_key, sizeof(((stored_turn *)0)->turn_id));
    m->identities = dict_new_fixed(identity_key, sizeof(((stored_turn *)0)->turn_id));
    m->contexts = dict_new(context_key);
    if (!m->by_key || !m->by_turn_id || !m->identities || !m->contexts ||
        pthread_mutex_init(&m->lock, NULL) != 0) {
        dict_free(m->by_key);
        dict_free(m->by_turn_id);
        dict_free(m->identities);
        dict_free(m->contexts);
        free(m);
        return fail(err, PARLEY_ERR_NO_MEMORY);
    }
    *out = &m->base;
    return PARLEY_OK;
}

static void memory_close(store *s)
{
    memory_store *m = (memory_store *)s;
    if (!m)
        return;
    free_all_entries(m);
    dict_free(m->by_key);
    dict_free(m->by_turn_id);
    dict_free(m->identities);
    dict_free(m->contexts);
    pthread_mutex_destroy(&m->lock);
    free(m);
}

/* ---- load ---- */

/* The oldest of the last `last_turns` turns (0 = all). */
static const stored_turn *first_to_send(const conversation *c, size_t last_turns)
{
    const stored_turn *t = c->oldest;
    for (size_t skip = last_turns && last_turns < c->nturns ? c->nturns - last_turns : 0; skip;
         skip--)
        t = t->newer;
    return t;
}

static parley_status memory_load_sized(store *s, const store_key *key, size_t last_turns,
                                       uint64_t now_ms, pbuf *out, size_t *nmessages,
                                       store_sizes *sizes, char **err)
{
    memory_store *m = (memory_store *)s;
    char *owned;
    const char *k = key_text(key, &owned);
    *nmessages = 0;
    if (!k)
        return fail(err, PARLEY_ERR_NO_MEMORY);
    parley_status st = PARLEY_OK;
    pthread_mutex_lock(&m->lock);
    conversation *c = find_live(m, k, now_ms);
    if (c) {
        const stored_turn *first = first_to_send(c, last_turns);
        size_t bytes = 0, count = 0;
        for (const stored_turn *t = first; t; t = t->newer)
            bytes += (size_t)t->length + 1;
        if (pbuf_reserve(out, bytes) != 0) {
            st = PARLEY_ERR_NO_MEMORY;
        } else { /* reserved: copy straight in (this runs for every turn) */
            char *o = out->data + out->len;
            for (const stored_turn *t = first; t; t = t->newer) {
                memcpy(o, text_of(t), t->length);
                o += t->length;
                *o++ = ',';
                count += t->nmessages;
                if (sizes)
                    store_sizes_add(sizes, t->nmessages, (uint32_t)t->tokens);
            }
            *o = '\0';
            out->len = (size_t)(o - out->data);
            *nmessages = count;
        }
    }
    pthread_mutex_unlock(&m->lock);
    free(owned);
    return st == PARLEY_OK ? st : fail(err, st);
}

static parley_status memory_load(store *s, const store_key *key, size_t last_turns,
                                 uint64_t now_ms, pbuf *out, size_t *nmessages, char **err)
{
    return memory_load_sized(s, key, last_turns, now_ms, out, nmessages, NULL, err);
}

/* ---- append ---- */

/* Ids parsed by turn_problem for stored_turn_new, so each is parsed once:
 * the turn's and its first messages' (a turn of more messages parses the
 * rest again). */
#define PARSED_MESSAGE_IDS 8
typedef struct parsed_ids {
    uint8_t turn[16];
    uint8_t message[PARSED_MESSAGE_IDS][16];
} parsed_ids;

/* NULL when the turn can be stored, else why not; ids: what it parsed. */
static const char *turn_problem(const store_turn *in, parsed_ids *ids)
{
    uint8_t id[16];
    if (!in || !in->turn_id || !in->messages || in->nmessages == 0 || in->nmessages > UINT32_MAX)
        return "a turn needs a turn id and messages";
    if (turn_id_parse(in->turn_id, ids->turn) != 0)
        return "a turn id must be a UUID in lowercase";
    size_t total = 0;
    for (size_t i = 0; i < in->nmessages; i++) {
        const store_message *msg = &in->messages[i];
        if (!msg->json || msg->json_len == 0)
            return "a message needs its JSON";
        if (role_code(msg->role) < 0)
            return "a message's role must be user, assistant, tool or system";
        if (uuid_parse(msg->message_id, i < PARSED_MESSAGE_IDS ? ids->message[i] : id) != 0)
            return "a message id must be a UUID";
        if (msg->interface_message_id &&
            strlen(msg->interface_message_id) > STORE_MAX_INTERFACE_MESSAGE_ID)
            return "an interface message id is at most 256 bytes";
        if (msg->metadata_len && !msg->metadata)
            return "a message's metadata needs its JSON";
        total += msg->json_len + 1 + msg->metadata_len;
    }
    return total <= UINT32_MAX ? NULL : "the turn is larger than 4 GiB";
}

/* ---- identity (version 4) ---- */

/* One message's identity, borrowed: from a turn being appended or a turn_identity. */
typedef struct identity_parts {
    const char *interface_id, *metadata;
    size_t interface_id_len, metadata_len;
} identity_parts;

/* One block holding parts[0..n) for turn t (n messages); NULL without memory. */
static turn_identity *identity_pack(const stored_turn *t, const identity_parts *parts, size_t n)
{
    size_t text = 0;
    for (size_t i = 0; i < n; i++)
        text += parts[i].interface_id_len + parts[i].metadata_len;
    turn_identity *ti = malloc(sizeof *ti + n * sizeof(message_identity) + text);
    if (!ti)
        return NULL;
    ti->turn = t;
    char *base = (char *)(ti->of + n), *p = base;
    for (size_t i = 0; i < n; i++) {
        message_identity *e = &ti->of[i];
        e->interface_id_at = (uint32_t)(p - base);
        e->interface_id_len = (uint32_t)parts[i].interface_id_len;
        if (e->interface_id_len)
            memcpy(p, parts[i].interface_id, e->interface_id_len);
        p += e->interface_id_len;
        e->metadata_at = (uint32_t)(p - base);
        e->metadata_len = (uint32_t)parts[i].metadata_len;
        if (e->metadata_len)
            memcpy(p, parts[i].metadata, e->metadata_len);
        p += e->metadata_len;
    }
    return ti;
}

/* Message i of t's identity in ti (NULL: none). */
static identity_parts identity_at(const stored_turn *t, const turn_identity *ti, size_t i)
{
    identity_parts p = {"", "", 0, 0};
    if (!ti)
        return p;
    const char *base = (const char *)(ti->of + t->nmessages);
    const message_identity *e = &ti->of[i];
    p.interface_id = base + e->interface_id_at;
    p.interface_id_len = e->interface_id_len;
    p.metadata = base + e->metadata_at;
    p.metadata_len = e->metadata_len;
    return p;
}

static const turn_identity *identity_of(const memory_store *m, const stored_turn *t)
{
    return t->has_identity ? dict_find(m->identities, (const char *)t->turn_id) : NULL;
}

/* The identity of the messages of `in` (passed turn_problem), stored as t;
 * NULL when none has any, or without memory (then *oom). */
static turn_identity *identity_from_input(const store_turn *in, const stored_turn *t, int *oom)
{
    *oom = 0;
    int any = 0;
    for (size_t i = 0; i < in->nmessages && !any; i++) {
        const store_message *msg = &in->messages[i];
        any = (msg->interface_message_id && *msg->interface_message_id) || msg->metadata_len;
    }
    if (!any)
        return NULL;
    identity_parts *parts = malloc(in->nmessages * sizeof *parts);
    turn_identity *ti = NULL;
    if (parts) {
        for (size_t i = 0; i < in->nmessages; i++) {
            const store_message *msg = &in->messages[i];
            const char *iface = msg->interface_message_id ? msg->interface_message_id : "";
            parts[i] = (identity_parts){iface, msg->metadata, strlen(iface), msg->metadata_len};
        }
        ti = identity_pack(t, parts, in->nmessages);
        free(parts);
    }
    *oom = ti == NULL;
    return ti;
}

/* One allocation: header, message index, joined text.  `in` passed turn_problem,
 * which parsed `ids`. */
static stored_turn *stored_turn_new(const store_turn *in, const parsed_ids *ids)
{
    size_t text = 0;
    for (size_t i = 0; i < in->nmessages; i++)
        text += in->messages[i].json_len + (i ? 1 : 0);
    stored_turn *t = malloc(sizeof *t + in->nmessages * sizeof(stored_message) + text);
    if (!t)
        return NULL;
    t->newer = NULL;
    t->conv = NULL;
    t->has_identity = 0;
    t->tokens = in->tokens < TOKENS_MAX ? in->tokens : TOKENS_MAX;
    t->started_ms = in->started_ms;
    t->finished_ms = in->finished_ms;
    t->nmessages = (uint32_t)in->nmessages;
    t->length = (uint32_t)text;
    memcpy(t->turn_id, ids->turn, sizeof t->turn_id);
    char *p = (char *)(t->messages + t->nmessages);
    for (size_t i = 0; i < in->nmessages; i++) {
        const store_message *src = &in->messages[i];
        stored_message *dst = &t->messages[i];
        if (i)
            *p++ = ',';
        uint64_t after = src->created_ms > in->started_ms ? src->created_ms - in->started_ms : 0;
        dst->length = (uint32_t)src->json_len;
        dst->created_after_ms = after < CREATED_AFTER_MAX ? (uint32_t)after : CREATED_AFTER_MAX;
        dst->role = (uint32_t)role_code(src->role) & 3u;
        if (i < PARSED_MESSAGE_IDS)
            memcpy(dst->message_id, ids->message[i], sizeof dst->message_id);
        else
            uuid_parse(src->message_id, dst->message_id);
        memcpy(p, src->json, src->json_len);
        p += src->json_len;
    }
    return t;
}

static conversation *conversation_new(const char *key, const char *conversation_id,
                                      uint64_t now_ms)
{
    size_t keylen = strlen(key);
    conversation *c = malloc(sizeof *c + keylen + 1);
    if (!c)
        return NULL;
    memset(c, 0, sizeof *c);
    c->created_ms = now_ms;
    c->id_len = (uint16_t)strlen(conversation_id); /* <= STORE_MAX_CONVERSATION_ID */
    memcpy(c->key, key, keylen + 1);
    return c;
}

static void link_turn(memory_store *m, conversation *c, stored_turn *t)
{
    t->conv = c;
    t->first_seq = m->next_seq;
    m->next_seq += t->nmessages;
    t->store_newer = NULL;
    t->store_older = m->store_newest;
    if (m->store_newest)
        m->store_newest->store_newer = t;
    else
        m->store_oldest = t;
    m->store_newest = t;
    if (c->newest)
        c->newest->newer = t;
    else
        c->oldest = t;
    c->newest = t;
    c->nturns++;
    m->nturns++;
    m->nmessages += t->nmessages;
    m->message_bytes += t->length;
}

_Static_assert(STORE_ROLE_USER == 1u << 0 && STORE_ROLE_ASSISTANT == 1u << 1 &&
                   STORE_ROLE_TOOL == 1u << 2 && STORE_ROLE_SYSTEM == 1u << 3,
               "ROLES[i] is the role of bit STORE_ROLE_* 1 << i");

/* The lifetime counts of c after appending t. */
static void count_lifetime(conversation *c, const stored_turn *t)
{
    c->message_count = saturating_add(c->message_count, t->nmessages);
    c->turn_count = saturating_add(c->turn_count, 1);
    for (size_t i = 0; i < t->nmessages; i++)
        c->roles |= (uint8_t)(1u << t->messages[i].role);
}

static void trim_turns(memory_store *m, conversation *c)
{
    while (m->limits.keep_turns && c->nturns > m->limits.keep_turns) {
        drop_oldest_turn(m, c);
        m->trimmed++;
    }
}

/*
 * Everything that can fail (the conversation allocation, the dict
 * insertions) happens first and is undone on failure; after the last
 * fallible step the store only frees, links and counts.  `ti` (may be NULL)
 * is t's identity.
 */
/* Give conversation c the context record r (a new allocation), replacing its
 * old one; r == NULL drops the old one.  -1 (nothing changed) on OOM. */
static int set_context_locked(memory_store *m, conversation *c, context_record *r)
{
    if (!r) {
        if (c->has_context)
            free(dict_remove(m->contexts, c->key));
        c->has_context = 0;
        return 0;
    }
    r->conv = c;
    if (c->has_context) {
        free(dict_replace(m->contexts, r));
        return 0;
    }
    if (dict_add(m->contexts, r) != 0)
        return -1;
    c->has_context = 1;
    return 0;
}

static context_record *context_record_new(const char *json, size_t len)
{
    context_record *r = malloc(sizeof *r + len + 1);
    if (r) {
        r->conv = NULL;
        r->len = len;
        memcpy(r->json, json, len);
        r->json[len] = '\0';
    }
    return r;
}

static parley_status append_locked(memory_store *m, const char *k, const char *conversation_id,
                                   stored_turn *t, turn_identity *ti, context_record *ctx,
                                   uint64_t now_ms)
{
    conversation *c = dict_find(m->by_key, k);
    int created = (c == NULL);
    int restarted = c && is_idle(m, c, now_ms);
    if (created) {
        c = conversation_new(k, conversation_id, now_ms);
        if (!c)
            return PARLEY_ERR_NO_MEMORY;
        if (dict_add(m->by_key, c) != 0) {
            free(c);
            return PARLEY_ERR_NO_MEMORY;
        }
    }
    int added = dict_add(m->by_turn_id, t) == 0;
    int with_ti = added && (!ti || dict_add(m->identities, ti) == 0);
    if (!with_ti || (ctx && set_context_locked(m, c, ctx) != 0)) {
        if (with_ti && ti)
            dict_remove(m->identities, (const char *)t->turn_id);
        if (added)
            dict_remove(m->by_turn_id, (const char *)t->turn_id);
        if (created) {
            dict_remove(m->by_key, k);
            free(c);
        }
        return PARLEY_ERR_NO_MEMORY;
    }
    /* Nothing below can fail. */
    t->has_identity = ti != NULL;
    if (restarted) { /* idle past the timeout: the old context (and its lifetime) is forgotten */
        drop_all_turns(m, c);
        c->created_ms = now_ms;
        c->message_count = c->turn_count = 0;
        c->roles = 0;
        if (!ctx)
            set_context_locked(m, c, NULL);
        m->expired++;
    }
    count_lifetime(c, t);
    if (!created)
        lru_unlink(m, c);
    lru_push_head(m, c);
    c->last_used_ms = now_ms;
    link_turn(m, c, t);
    trim_turns(m, c);
    evict_beyond_limit(m, c, now_ms);
    return PARLEY_OK;
}

static parley_status memory_append(store *s, const store_key *key, const store_turn *turn,
                                   uint64_t now_ms, char **err)
{
    memory_store *m = (memory_store *)s;
    parsed_ids ids;
    const char *problem = !key || !key->conversation_id ? "a turn needs a conversation id"
                          : strlen(key->conversation_id) > STORE_MAX_CONVERSATION_ID
                              ? "a conversation id is at most 256 bytes"
                              : turn_problem(turn, &ids);
    if (problem) {
        if (err)
            *err = pstr_printf("memory store: %s", problem);
        return PARLEY_ERR_STORAGE;
    }
    char *owned;
    const char *k = key_text(key, &owned);
    /* Outside the lock: the copies may be large. */
    stored_turn *t = k ? stored_turn_new(turn, &ids) : NULL;
    int oom = 0;
    turn_identity *ti = t ? identity_from_input(turn, t, &oom) : NULL;
    context_record *ctx = NULL;
    if (t && turn->context && !(ctx = context_record_new(turn->context, turn->context_len)))
        oom = 1;
    if (!t || oom) {
        free(t);
        free(ti);
        free(owned);
        return fail(err, PARLEY_ERR_NO_MEMORY);
    }
    pthread_mutex_lock(&m->lock);
    int exhausted = m->next_seq + t->nmessages > SEQ_END;
    parley_status st = dict_find(m->by_turn_id, (const char *)t->turn_id) ? PARLEY_OK
                       /* already stored: a retried append */
                       : exhausted ? PARLEY_ERR_STORAGE
                                   : append_locked(m, k, key->conversation_id, t, ti, ctx, now_ms);
    int stored = st == PARLEY_OK && t->conv;
    pthread_mutex_unlock(&m->lock);
    if (st == PARLEY_ERR_STORAGE && exhausted) {
        free(t);
        free(ti);
        free(ctx);
        free(owned);
        if (err)
            *err = strdup("memory store: 10^12 messages appended since the agent started: "
                          "restart it to go on");
        return st;
    }
    if (!stored) {
        free(t);
        free(ti);
        free(ctx);
    }
    free(owned);
    return st == PARLEY_OK ? st : fail(err, st);
}

/* ---- the JSON the ABI returns ---- */

static void put_turn(pbuf *b, const stored_turn *t)
{
    char id[STORE_ID_LEN + 1];
    uuid_format(t->turn_id, id);
    store_json_turn(b, id, t->started_ms, t->finished_ms, (uint32_t)t->tokens, text_of(t),
                    t->length);
}

typedef struct conversation_parts conversation_parts;
static conversation_parts parts_of(const conversation *c);

/* The head and the lifetime of a conversation (no closing brace). */
static void put_conversation_head(pbuf *b, const conversation *c);

static parley_status finish_json(pbuf *b, size_t mark, char **err)
{
    if (!b->oom)
        return PARLEY_OK;
    b->len = mark < b->len ? mark : b->len; /* what the caller had before */
    return fail(err, PARLEY_ERR_NO_MEMORY);
}

static parley_status memory_get_conversation(store *s, const store_key *key, uint64_t now_ms,
                                             pbuf *out, char **err)
{
    memory_store *m = (memory_store *)s;
    char *owned;
    const char *k = key_text(key, &owned);
    if (!k)
        return fail(err, PARLEY_ERR_NO_MEMORY);
    size_t mark = out->len;
    pthread_mutex_lock(&m->lock);
    conversation *c = find_live(m, k, now_ms);
    if (c) {
        put_conversation_head(out, c);
        pbuf_puts(out, ",\"turns\":[");
        for (const stored_turn *t = c->oldest; t; t = t->newer) {
            if (t != c->oldest)
                pbuf_putc(out, ',');
            put_turn(out, t);
        }
        pbuf_puts(out, "]}");
    }
    pthread_mutex_unlock(&m->lock);
    free(owned);
    return c ? finish_json(out, mark, err) : fail(err, PARLEY_ERR_NOT_FOUND);
}

static parley_status memory_get_turn(store *s, const char *turn_id, uint64_t now_ms, pbuf *out,
                                     char **err)
{
    memory_store *m = (memory_store *)s;
    size_t mark = out->len;
    pthread_mutex_lock(&m->lock);
    stored_turn *t = turn_named(m, turn_id);
    if (t && !find_live(m, t->conv->key, now_ms))
        t = NULL; /* its conversation expired and is now freed */
    if (t) {
        pbuf_puts(out, "{\"conversation_id\":");
        pbuf_json_string(out, t->conv->key, t->conv->id_len);
        pbuf_puts(out, ",\"turn\":");
        put_turn(out, t);
        pbuf_putc(out, '}');
    }
    pthread_mutex_unlock(&m->lock);
    return t ? finish_json(out, mark, err) : fail(err, PARLEY_ERR_NOT_FOUND);
}

static parley_status memory_list(store *s, uint64_t now_ms, pbuf *out, char **err)
{
    memory_store *m = (memory_store *)s;
    size_t mark = out->len;
    pbuf_puts(out, "{\"conversations\":[");
    pthread_mutex_lock(&m->lock);
    int first = 1;
    for (conversation *c = m->lru_head, *next; c; c = next) {
        next = c->less_recent;
        if (is_idle(m, c, now_ms)) { /* checked one by one: clocks may step back */
            forget_conversation(m, c);
            m->expired++;
            continue;
        }
        if (!first)
            pbuf_putc(out, ',');
        first = 0;
        put_conversation_head(out, c);
        pbuf_printf(out, ",\"turns\":%zu}", (size_t)c->nturns);
    }
    pthread_mutex_unlock(&m->lock);
    pbuf_puts(out, "]}");
    return finish_json(out, mark, err);
}

/* ---- forget, expire, stats ---- */

static parley_status memory_forget(store *s, const store_key *key, char **err)
{
    memory_store *m = (memory_store *)s;
    char *owned = NULL;
    const char *k = key ? key_text(key, &owned) : NULL;
    if (key && !k)
        return fail(err, PARLEY_ERR_NO_MEMORY);
    parley_status st = PARLEY_OK;
    pthread_mutex_lock(&m->lock);
    if (!key) {
        forget_all(m);
    } else {
        conversation *c = dict_find(m->by_key, k);
        if (c)
            forget_conversation(m, c);
        else
            st = PARLEY_ERR_NOT_FOUND;
    }
    pthread_mutex_unlock(&m->lock);
    free(owned);
    return st == PARLEY_OK ? st : fail(err, st);
}

static parley_status memory_expire(store *s, uint64_t now_ms, size_t *expired, char **err)
{
    (void)err;
    memory_store *m = (memory_store *)s;
    size_t n = 0;
    pthread_mutex_lock(&m->lock);
    while (m->lru_tail && is_idle(m, m->lru_tail, now_ms)) {
        forget_conversation(m, m->lru_tail);
        n++;
    }
    m->expired += n;
    pthread_mutex_unlock(&m->lock);
    if (expired)
        *expired = n;
    return PARLEY_OK;
}

static parley_status memory_stats(store *s, store_stats *out, char **err)
{
    (void)err;
    memory_store *m = (memory_store *)s;
    pthread_mutex_lock(&m->lock);
    out->conversations = dict_size(m->by_key);
    out->turns = m->nturns;
    out->messages = m->nmessages;
    out->trimmed = m->trimmed;
    out->message_bytes = m->message_bytes;
    out->evicted = m->evicted;
    out->expired = m->expired;
    pthread_mutex_unlock(&m->lock);
    return PARLEY_OK;
}

/* ---- queries ---- */

/* The parts of a conversation's dict key (see the top of this file). */
struct conversation_parts {
    const char *id, *persona, *interface_type;
    size_t id_len, persona_len, interface_len;
};

static conversation_parts parts_of(const conversation *c)
{
    conversation_parts p = {.id = c->key, .id_len = c->id_len, .persona = "", .interface_type = ""};
    if (c->key[c->id_len] != '\x1f')
        return p;
    char *colon;
    p.persona_len = strtoul(c->key + c->id_len + 1, &colon, 10);
    p.persona = colon + 1;
    p.interface_type = p.persona + p.persona_len;
    p.interface_len = strlen(p.interface_type);
    return p;
}

static void put_conversation_head(pbuf *b, const conversation *c)
{
    conversation_parts p = parts_of(c);
    char id[STORE_MAX_CONVERSATION_ID + 1];
    size_t n = p.id_len < STORE_MAX_CONVERSATION_ID ? p.id_len : STORE_MAX_CONVERSATION_ID;
    memcpy(id, p.id, n);
    id[n] = '\0';
    store_json_conversation_head(b, id, p.persona, p.persona_len, p.interface_type,
                                 p.interface_len, c->created_ms, c->last_used_ms);
    const stored_turn *newest = c->newest;
    store_lifetime life = {created_ms_of(newest, newest->nmessages - 1), c->message_count,
                           c->turn_count, c->roles};
    store_json_lifetime(b, &life);
}

static int field_is(const char *want, const char *have, size_t have_len)
{
    return !want || (strlen(want) == have_len && memcmp(want, have, have_len) == 0);
}

static int conversation_matches(const conversation *c, const store_query *q)
{
    conversation_parts p = parts_of(c);
    return field_is(q->conversation_id, p.id, p.id_len) &&
           field_is(q->persona, p.persona, p.persona_len) &&
           field_is(q->interface_type, p.interface_type, p.interface_len);
}

/* Where message i of t starts in the turn's joined text. */
static const char *message_text(const stored_turn *t, size_t i)
{
    const char *p = text_of(t);
    for (size_t k = 0; k < i; k++)
        p += t->messages[k].length + 1;
    return p;
}

/* Message i of t, whose JSON is `json` and whose turn's identity is ti (may be NULL). */
static void put_message(pbuf *b, const stored_turn *t, size_t i, const char *json,
                        const turn_identity *ti)
{
    char id[STORE_ID_LEN + 1], turn_id[STORE_ID_LEN + 1];
    uuid_format(t->messages[i].message_id, id);
    uuid_format(t->turn_id, turn_id);
    conversation_parts p = parts_of(t->conv);
    identity_parts who = identity_at(t, ti, i);
    store_json_message(b, id, p.id, p.id_len, p.persona, p.persona_len, p.interface_type,
                       p.interface_len, turn_id, ROLES[t->messages[i].role],
                       created_ms_of(t, i), json, t->messages[i].length, who.interface_id,
                       who.interface_id_len, who.metadata, who.metadata_len);
}

typedef struct query_run {
    memory_store *m;
    const store_query *q;
    int role;                   /* -1: any */
    uint64_t now_ms;
    pbuf *out;
    size_t count;
    uint64_t last;
    int more;
} query_run;

/* Offer one turn's messages to the query; 1 once it has all it wants. */
static int query_turn(query_run *r, const stored_turn *t)
{
    const store_query *q = r->q;
    if (!conversation_matches(t->conv, q) || is_idle(r->m, t->conv, r->now_ms))
        return 0;
    const turn_identity *ti = identity_of(r->m, t);
    /* Walk the joined text "m1,m2,..." forwards, or backwards from its end. */
    const char *forward = text_of(t), *backward = text_of(t) + t->length + 1;
    for (size_t k = 0; k < t->nmessages; k++) {
        size_t i = q->newest_first ? t->nmessages - 1 - k : k;
        const char *json;
        if (q->newest_first) {
            json = backward = backward - 1 - t->messages[i].length;
        } else {
            json = forward;
            forward += t->messages[i].length + 1;
        }
        uint64_t pos = t->first_seq + i, created = created_ms_of(t, i);
        if (q->after && (q->newest_first ? pos >= q->after : pos <= q->after))
            continue;
        if ((r->role >= 0 && t->messages[i].role != (uint32_t)r->role) || created < q->since_ms ||
            created > q->until_ms)
            continue;
        if (q->search && *q->search &&
            !store_json_content_matches(json, t->messages[i].length, q->search))
            continue;
        if (q->interface_message_id) {
            identity_parts who = identity_at(t, ti, i);
            if (who.interface_id_len != strlen(q->interface_message_id) ||
                memcmp(who.interface_id, q->interface_message_id, who.interface_id_len) != 0)
                continue;
        }
        if (r->count == q->limit) {
            r->more = 1;
            return 1;
        }
        if (r->count)
            pbuf_putc(r->out, ',');
        put_message(r->out, t, i, json, ti);
        r->count++;
        r->last = pos;
    }
    return 0;
}

/* One conversation's turns (when the key is exact), else every turn of the store. */
static void query_walk(query_run *r)
{
    const store_query *q = r->q;
    memory_store *m = r->m;
    if (q->turn_id) { /* one turn: found by its id, not by walking them all */
        const stored_turn *t = turn_named(m, q->turn_id);
        if (t)
            query_turn(r, t);
        return;
    }
    if (q->conversation_id && q->persona && q->interface_type) {
        store_key key = {q->conversation_id, q->persona, q->interface_type};
        char *owned;
        const char *k = key_text(&key, &owned);
        conversation *c = k ? dict_find(m->by_key, k) : NULL;
        free(owned);
        if (!c)
            return;
        if (!q->newest_first) {
            for (const stored_turn *t = c->oldest; t; t = t->newer)
                if (query_turn(r, t))
                    return;
            return;
        }
        const stored_turn **turns = malloc(c->nturns * sizeof *turns);
        if (!turns) {
            r->out->oom = 1;
            return;
        }
        size_t n = 0;
        for (const stored_turn *t = c->oldest; t; t = t->newer)
            turns[n++] = t;
        while (n-- > 0 && !query_turn(r, turns[n]))
            ;
        free(turns);
        return;
    }
    for (const stored_turn *t = q->newest_first ? m->store_newest : m->store_oldest; t;
         t = q->newest_first ? t->store_older : t->store_newer)
        if (query_turn(r, t))
            return;
}

static parley_status memory_query(store *s, const store_query *q, uint64_t now_ms, pbuf *out,
                                  size_t *count, uint64_t *last, int *more, char **err)
{
    query_run r = {.m = (memory_store *)s, .q = q, .role = role_code(q->role), .now_ms = now_ms,
                   .out = out};
    size_t mark = out->len;
    pthread_mutex_lock(&r.m->lock);
    query_walk(&r);
    pthread_mutex_unlock(&r.m->lock);
    *count = r.count;
    *last = r.last;
    *more = r.more;
    return finish_json(out, mark, err);
}

static parley_status memory_get_message(store *s, const char *message_id, uint64_t now_ms,
                                        pbuf *out, char **err)
{
    memory_store *m = (memory_store *)s;
    uint8_t id[16];
    if (uuid_parse(message_id, id) != 0)
        return fail(err, PARLEY_ERR_NOT_FOUND);
    size_t mark = out->len;
    int found = 0;
    pthread_mutex_lock(&m->lock);
    /* A scan: a host looks one message up now and then; an index per message
     * would cost every stored message a dict slot. */
    for (const stored_turn *t = m->store_newest; t && !found; t = t->store_older) {
        for (size_t i = 0; i < t->nmessages; i++) {
            if (memcmp(t->messages[i].message_id, id, 16) != 0)
                continue;
            if (!is_idle(m, t->conv, now_ms)) {
                put_message(out, t, i, message_text(t, i), identity_of(m, t));
                found = 1;
            }
            break;
        }
    }
    pthread_mutex_unlock(&m->lock);
    return found ? finish_json(out, mark, err) : fail(err, PARLEY_ERR_NOT_FOUND);
}

/* ---- message identity (version 4) ---- */

/* The turn's final answer: its last assistant message, else its last message. */
static size_t final_answer_index(const stored_turn *t)
{
    const uint32_t assistant = 1; /* ROLES[1] */
    for (size_t i = t->nmessages; i-- > 0;)
        if (t->messages[i].role == assistant)
            return i;
    return t->nmessages - 1;
}

/* Give t's final answer the interface id iface[0..len): a new identity block
 * replaces the old one.  Without memory, nothing changes. */
static parley_status set_identity_locked(memory_store *m, stored_turn *t, const char *iface,
                                         size_t len, char *message_id)
{
    size_t target = final_answer_index(t);
    identity_parts *parts = malloc(t->nmessages * sizeof *parts);
    if (!parts)
        return PARLEY_ERR_NO_MEMORY;
    const turn_identity *old = identity_of(m, t);
    for (size_t i = 0; i < t->nmessages; i++)
        parts[i] = identity_at(t, old, i);
    parts[target].interface_id = iface;
    parts[target].interface_id_len = len;
    turn_identity *fresh = identity_pack(t, parts, t->nmessages);
    free(parts);
    if (!fresh)
        return PARLEY_ERR_NO_MEMORY;
    if (old) {
        free(dict_replace(m->identities, fresh));
    } else if (dict_add(m->identities, fresh) != 0) {
        free(fresh);
        return PARLEY_ERR_NO_MEMORY;
    }
    t->has_identity = 1;
    if (message_id)
        uuid_format(t->messages[target].message_id, message_id);
    return PARLEY_OK;
}

static parley_status memory_set_interface_message_id(store *s, const char *turn_id,
                                                     const char *interface_message_id,
                                                     uint64_t now_ms, char *message_id,
                                                     char **err)
{
    memory_store *m = (memory_store *)s;
    if (message_id)
        message_id[0] = '\0';
    size_t len = interface_message_id ? strlen(interface_message_id) : 0;
    if (len == 0 || len > STORE_MAX_INTERFACE_MESSAGE_ID) {
        if (err)
            *err = pstr_printf("memory store: an interface message id is 1 to %d bytes",
                               STORE_MAX_INTERFACE_MESSAGE_ID);
        return PARLEY_ERR_STORAGE;
    }
    pthread_mutex_lock(&m->lock);
    stored_turn *t = turn_named(m, turn_id);
    if (t && !find_live(m, t->conv->key, now_ms))
        t = NULL; /* its conversation expired and is now freed */
    parley_status st = t ? set_identity_locked(m, t, interface_message_id, len, message_id)
                         : PARLEY_ERR_NOT_FOUND;
    pthread_mutex_unlock(&m->lock);
    return st == PARLEY_OK ? st : fail(err, st);
}

/* The most recently stored message of c whose interface id is `iface`: its
 * turn (NULL if none) and *index.  A scan of c's turns that have identity
 * (a conversation keeps keep_turns turns; an index per message would cost
 * every message a dict slot). */
static const stored_turn *find_by_interface_id(const memory_store *m, const conversation *c,
                                               const char *iface, size_t *index)
{
    size_t len = strlen(iface);
    const stored_turn *found = NULL;
    for (const stored_turn *t = c->oldest; t; t = t->newer) {
        const turn_identity *ti = identity_of(m, t);
        for (size_t i = 0; ti && i < t->nmessages; i++) {
            identity_parts who = identity_at(t, ti, i);
            if (who.interface_id_len == len && memcmp(who.interface_id, iface, len) == 0) {
                found = t; /* later ones win: they were stored after */
                *index = i;
            }
        }
    }
    return found;
}

static parley_status memory_find_message(store *s, const store_key *key,
                                         const char *interface_message_id, uint64_t now_ms,
                                         pbuf *out, char **err)
{
    memory_store *m = (memory_store *)s;
    if (!interface_message_id || !*interface_message_id)
        return fail(err, PARLEY_ERR_NOT_FOUND);
    char *owned;
    const char *k = key_text(key, &owned);
    if (!k)
        return fail(err, PARLEY_ERR_NO_MEMORY);
    size_t mark = out->len, i = 0;
    pthread_mutex_lock(&m->lock);
    conversation *c = find_live(m, k, now_ms);
    const stored_turn *t = c ? find_by_interface_id(m, c, interface_message_id, &i) : NULL;
    if (t)
        put_message(out, t, i, message_text(t, i), identity_of(m, t));
    pthread_mutex_unlock(&m->lock);
    free(owned);
    return t ? finish_json(out, mark, err) : fail(err, PARLEY_ERR_NOT_FOUND);
}

static parley_status memory_load_turn(store *s, const store_key *key, const char *turn_id,
                                      const char *interface_message_id, size_t window_turns,
                                      uint64_t now_ms, pbuf *out, size_t *nmessages,
                                      char *turn_id_out, int *in_window, char **err)
{
    memory_store *m = (memory_store *)s;
    *nmessages = 0;
    *in_window = 0;
    if (turn_id_out)
        turn_id_out[0] = '\0';
    char *owned;
    const char *k = key_text(key, &owned);
    if (!k)
        return fail(err, PARLEY_ERR_NO_MEMORY);
    size_t mark = out->len, i;
    pthread_mutex_lock(&m->lock);
    conversation *c = find_live(m, k, now_ms);
    const stored_turn *t = NULL;
    if (c && turn_id) {
        t = turn_named(m, turn_id);
        if (t && t->conv != c)
            t = NULL; /* another conversation's turn */
    } else if (c && interface_message_id && *interface_message_id) {
        t = find_by_interface_id(m, c, interface_message_id, &i);
    }
    if (t) {
        if (turn_id_out)
            uuid_format(t->turn_id, turn_id_out);
        /* In the window iff fewer than window_turns turns came after it. */
        size_t after = 0;
        for (const stored_turn *u = t->newer; u && after < window_turns; u = u->newer)
            after++;
        *in_window = window_turns == 0 || after < window_turns;
        if (!*in_window) {
            pbuf_append(out, text_of(t), t->length);
            pbuf_putc(out, ',');
            *nmessages = t->nmessages;
        }
    }
    pthread_mutex_unlock(&m->lock);
    free(owned);
    if (!t)
        return fail(err, PARLEY_ERR_NOT_FOUND);
    if (out->oom)
        *nmessages = 0;
    return finish_json(out, mark, err);
}

/* ---- the context record (version 5) ---- */

static parley_status memory_context_get(store *s, const store_key *key, uint64_t now_ms,
                                        pbuf *out, store_lifetime *life, char **err)
{
    memory_store *m = (memory_store *)s;
    char *owned;
    const char *k = key_text(key, &owned);
    *life = (store_lifetime){0, 0, 0, 0};
    if (!k)
        return fail(err, PARLEY_ERR_NO_MEMORY);
    size_t mark = out->len;
    pthread_mutex_lock(&m->lock);
    conversation *c = find_live(m, k, now_ms);
    if (c) {
        const stored_turn *newest = c->newest;
        *life = (store_lifetime){created_ms_of(newest, newest->nmessages - 1), c->message_count,
                                 c->turn_count, c->roles};
        const context_record *r = c->has_context ? dict_find(m->contexts, c->key) : NULL;
        if (r)
            pbuf_append(out, r->json, r->len);
    }
    pthread_mutex_unlock(&m->lock);
    free(owned);
    return finish_json(out, mark, err);
}

static parley_status memory_context_set(store *s, const store_key *key, const char *json,
                                        size_t len, const char *expected, size_t expected_len,
                                        uint64_t now_ms, char **err)
{
    memory_store *m = (memory_store *)s;
    char *owned;
    const char *k = key_text(key, &owned);
    if (!k)
        return fail(err, PARLEY_ERR_NO_MEMORY);
    parley_status st = PARLEY_OK;
    pthread_mutex_lock(&m->lock);
    conversation *c = find_live(m, k, now_ms);
    const context_record *cur = c && c->has_context ? dict_find(m->contexts, c->key) : NULL;
    int moved = c && expected && (cur ? cur->len != expected_len ||
                                            memcmp(cur->json, expected, expected_len) != 0
                                      : expected_len != 0);
    context_record *r = c && !moved ? context_record_new(json, len) : NULL;
    if (!c) {
        st = PARLEY_ERR_NOT_FOUND;
    } else if (moved) {
        st = PARLEY_ERR_BUSY;
    } else if (!r || set_context_locked(m, c, r) != 0) {
        free(r);
        st = PARLEY_ERR_NO_MEMORY;
    }
    pthread_mutex_unlock(&m->lock);
    free(owned);
    return st == PARLEY_OK || st == PARLEY_ERR_BUSY ? st : fail(err, st);
}

const store_backend store_memory_backend = {
    .version = STORE_BACKEND_VERSION,
    .scheme = "memory",
    .blocking = 0,
    .open = memory_open,
    .close = memory_close,
    .load = memory_load,
    .load_sized = memory_load_sized,
    .append = memory_append,
    .get_conversation = memory_get_conversation,
    .get_turn = memory_get_turn,
    .list = memory_list,
    .forget = memory_forget,
    .expire = memory_expire,
    .stats = memory_stats,
    .query = memory_query,
    .get_message = memory_get_message,
    .set_interface_message_id = memory_set_interface_message_id,
    .find_message = memory_find_message,
    .load_turn = memory_load_turn,
    .context_get = memory_context_get,
    .context_set = memory_context_set,
};
