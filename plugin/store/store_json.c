/* store_json.c -- see store_json.h. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memmem */
#endif
#include "store/store_json.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lib/json_scan.h"
#include "lib/utf8.h"

void store_json_timestamp(pbuf *b, uint64_t ms)
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

static void key(pbuf *b, const char *name)
{
    pbuf_putc(b, '"');
    pbuf_puts(b, name);
    pbuf_puts(b, "\":");
}

static void string_field(pbuf *b, const char *name, const char *value)
{
    key(b, name);
    pbuf_json_string(b, value, strlen(value));
}

static void time_field(pbuf *b, const char *name, uint64_t ms)
{
    key(b, name);
    store_json_timestamp(b, ms);
}

/* The same count by jansson, for what the scanner bails on (\u0000, deep nesting, long
   integers): the text as an array's elements. */
static long object_list_slow(const char *text, size_t len)
{
    pbuf b = PBUF_INIT;
    pbuf_putc(&b, '[');
    pbuf_append(&b, text, len && text[len - 1] == ',' ? len - 1 : len);
    pbuf_putc(&b, ']');
    /* valid JSON that jansson refuses by default is still what Parley may have stored */
    json_t *all = b.oom ? NULL
                        : json_loadb(b.data, b.len, JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, NULL);
    pbuf_free(&b);
    long n = json_is_array(all) && json_array_size(all) > 0 ? (long)json_array_size(all) : -1;
    for (size_t i = 0; n > 0 && i < json_array_size(all); i++)
        if (!json_is_object(json_array_get(all, i)))
            n = -1;
    json_decref(all);
    return n;
}

long store_json_object_list(const char *text, size_t len)
{
    jscan s;
    jscan_init(&s, text, len);
    for (long n = 1;; n++) {
        if (jscan_peek(&s) != JSCAN_OBJECT || jscan_skip(&s) != 0)
            return object_list_slow(text, len);
        if (s.p == s.end)
            return n;
        if (*s.p != ',')
            return jscan_end(&s) == 0 ? n : object_list_slow(text, len);
        if (++s.p == s.end)
            return n;
    }
}

parley_status store_json_damaged(const char *store_name, const char *conversation_id,
                                 size_t conversation_id_len, char **err)
{
    if (err) {
        char *id = utf8_quotable(conversation_id, conversation_id_len, conversation_id_len);
        *err = pstr_printf("%s: conversation '%s' holds a damaged message (not a JSON object); "
                           "clear the conversation", store_name, id ? id : "?");
        free(id);
    }
    return PARLEY_ERR_STORAGE;
}

void store_json_turn(pbuf *b, const char *turn_id, uint64_t started_ms, uint64_t finished_ms,
                     uint32_t tokens, const char *messages, size_t messages_len)
{
    pbuf_putc(b, '{');
    string_field(b, "turn_id", turn_id);
    pbuf_putc(b, ',');
    time_field(b, "started_at", started_ms);
    pbuf_putc(b, ',');
    time_field(b, "finished_at", finished_ms);
    if (tokens)
        pbuf_printf(b, ",\"tokens\":%u", (unsigned)tokens);
    pbuf_puts(b, ",\"messages\":[");
    pbuf_append(b, messages, messages_len); /* already valid JSON: verbatim */
    pbuf_puts(b, "]}");
}

void store_json_conversation_head(pbuf *b, const char *conversation_id, const char *persona,
                                  size_t persona_len, const char *interface_type,
                                  size_t interface_len, uint64_t created_ms,
                                  uint64_t last_used_ms)
{
    pbuf_putc(b, '{');
    string_field(b, "conversation_id", conversation_id);
    if (persona_len) {
        pbuf_puts(b, ",\"persona\":");
        pbuf_json_string(b, persona, persona_len);
    }
    if (interface_len) {
        pbuf_puts(b, ",\"interface_type\":");
        pbuf_json_string(b, interface_type, interface_len);
    }
    pbuf_putc(b, ',');
    time_field(b, "created_at", created_ms);
    pbuf_putc(b, ',');
    time_field(b, "last_used_at", last_used_ms);
}

void store_json_message(pbuf *b, const char *message_id, const char *conversation_id,
                        size_t conversation_id_len, const char *persona, size_t persona_len,
                        const char *interface_type, size_t interface_len, const char *turn_id,
                        const char *role, uint64_t created_ms, const char *json, size_t json_len,
                        const char *interface_message_id, size_t interface_message_id_len,
                        const char *metadata, size_t metadata_len)
{
    pbuf_putc(b, '{');
    string_field(b, "message_id", message_id);
    pbuf_puts(b, ",\"conversation_id\":");
    pbuf_json_string(b, conversation_id, conversation_id_len);
    pbuf_puts(b, ",\"interface_type\":");
    pbuf_json_string(b, interface_type, interface_len);
    pbuf_puts(b, ",\"persona\":");
    pbuf_json_string(b, persona, persona_len);
    pbuf_putc(b, ',');
    string_field(b, "turn_id", turn_id);
    pbuf_putc(b, ',');
    string_field(b, "role", role);
    pbuf_putc(b, ',');
    time_field(b, "created_at", created_ms);
    if (interface_message_id_len) {
        pbuf_puts(b, ",\"interface_message_id\":");
        pbuf_json_string(b, interface_message_id, interface_message_id_len);
    }
    if (metadata_len) {
        pbuf_puts(b, ",\"metadata\":");
        pbuf_append(b, metadata, metadata_len); /* a JSON object, validated when it came in */
    }
    pbuf_puts(b, ",\"message\":");
    pbuf_append(b, json, json_len);
    pbuf_putc(b, '}');
}

void store_json_lifetime(pbuf *b, const store_lifetime *life)
{
    static const struct {
        unsigned bit;
        const char *name;
    } roles[] = {{STORE_ROLE_USER, "user"},
                 {STORE_ROLE_ASSISTANT, "assistant"},
                 {STORE_ROLE_TOOL, "tool"},
                 {STORE_ROLE_SYSTEM, "system"}};
    pbuf_putc(b, ',');
    if (life->message_count)
        time_field(b, "last_message_at", life->last_message_ms);
    else
        pbuf_puts(b, "\"last_message_at\":null");
    pbuf_printf(b, ",\"message_count\":%" PRIu64 ",\"turn_count\":%" PRIu64
                   ",\"participants\":[",
                life->message_count, life->turn_count);
    int first = 1;
    for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++) {
        if (!(life->roles & roles[i].bit))
            continue;
        pbuf_printf(b, "%s\"%s\"", first ? "" : ",", roles[i].name);
        first = 0;
    }
    pbuf_putc(b, ']');
}

/* ---- content search ---- */

static int hex4(const char *p, const char *end, unsigned *out)
{
    if (end - p < 4)
        return -1;
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        int d = c >= '0' && c <= '9' ? c - '0'
              : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0)
            return -1;
        v = v << 4 | (unsigned)d;
    }
    *out = v;
    return 0;
}

/* Decode the character of a JSON string body at *p into UTF-8 bytes (out);
 * advances *p.  0 at the closing quote, at `end`, or on a malformed escape. */
static size_t next_char(const char **p, const char *end, unsigned char out[4])
{
    const char *s = *p;
    if (s >= end || *s == '"')
        return 0;
    if (*s != '\\') {
        out[0] = (unsigned char)*s;
        *p = s + 1;
        return 1;
    }
    if (s + 1 >= end)
        return 0;
    static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
    const char *e = strchr(from, s[1]);
    if (e && s[1]) {
        out[0] = (unsigned char)to[e - from];
        *p = s + 2;
        return 1;
    }
    unsigned cp;
    if (s[1] != 'u' || hex4(s + 2, end, &cp) != 0)
        return 0;
    s += 6;
    unsigned lo;
    if (cp >= 0xD800 && cp < 0xDC00 && end - s >= 6 && s[0] == '\\' && s[1] == 'u' &&
        hex4(s + 2, end, &lo) == 0 && lo >= 0xDC00 && lo < 0xE000) {
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        s += 6;
    }
    *p = s;
    if (cp < 0x80) {
        out[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (unsigned char)(0xC0 | cp >> 6);
        out[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (unsigned char)(0xE0 | cp >> 12);
        out[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
        out[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (unsigned char)(0xF0 | cp >> 18);
    out[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3F));
    out[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
    out[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

static unsigned char fold(unsigned char c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

/* Does the decoded string starting at `s` begin with needle? */
static int starts_with(const char *s, const char *end, const unsigned char *needle, size_t n)
{
    size_t matched = 0;
    unsigned char bytes[4];
    while (matched < n) {
        size_t k = next_char(&s, end, bytes);
        if (k == 0)
            return 0;
        for (size_t i = 0; i < k && matched < n; i++, matched++)
            if (fold(bytes[i]) != fold(needle[matched]))
                return 0;
    }
    return 1;
}

/* The common case, a content without escapes: ASCII-case-insensitive search
 * of the raw bytes, candidates found with memchr (fast on long texts). */
static int plain_contains(const char *s, size_t len, const char *needle, size_t n)
{
    unsigned char lo = fold((unsigned char)needle[0]);
    unsigned char up = lo >= 'a' && lo <= 'z' ? (unsigned char)(lo - 32) : lo;
    const char *end = s + len;
    while ((size_t)(end - s) >= n) {
        size_t starts = (size_t)(end - s) - n + 1; /* where a whole match still fits */
        const char *a = memchr(s, lo, starts);
        const char *b = up != lo ? memchr(s, up, a ? (size_t)(a - s) : starts) : NULL;
        const char *c = b ? b : a;
        if (!c)
            return 0;
        size_t i = 1;
        while (i < n && fold((unsigned char)c[i]) == fold((unsigned char)needle[i]))
            i++;
        if (i == n)
            return 1;
        s = c + 1;
    }
    return 0;
}

int store_json_content_matches(const char *json, size_t json_len, const char *needle)
{
    static const char key[] = "\"content\":\"";
    const char *end = json + json_len;
    const char *s = memmem(json, json_len, key, sizeof key - 1);
    size_t n = strlen(needle);
    if (!s)
        return 0;
    if (n == 0)
        return 1;
    s += sizeof key - 1;
    const char *close = memchr(s, '"', (size_t)(end - s));
    if (close && !memchr(s, '\\', (size_t)(close - s)))
        return plain_contains(s, (size_t)(close - s), needle, n);
    unsigned char first = fold((unsigned char)needle[0]), bytes[4];
    for (;;) {
        const char *start = s;
        size_t k = next_char(&s, end, bytes);
        if (k == 0)
            return 0;
        if (fold(bytes[0]) == first && starts_with(start, end, (const unsigned char *)needle, n))
            return 1;
    }
}
