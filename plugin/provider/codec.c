/*
 * codec.c -- the code every provider's codec shares (codec.h), and the neutral
 * reply's own functions (llm_reply.h): reading Parley's neutral messages, the
 * request parts every codec renders alike, the words of a decoder's errors,
 * the server's error text, and filling an llm_reply.
 *
 * Every decoder funnels into the same finishing steps (codec_fill_call and
 * llm_set_content), which is what makes a streamed reply identical to the same
 * reply sent whole, whichever the provider.  Apart from provider.c, which is
 * what the turn sees (the registry, the reasoning rules on top of every
 * decoder), and from each codec's own file: one per API.
 */
#include "provider/codec.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "lib/dict.h"
#include "lib/json_oom.h"

#define MAX_ERROR_TEXT 500 /* llm_error_text's bound, in bytes */

/* ---- neutral messages ---- */

const char *msg_str(const json_t *msg, const char *key)
{
    return json_string_value(json_object_get(msg, key));
}

const char *msg_role(const json_t *msg)
{
    const char *r = msg_str(msg, "role");
    return r ? r : "";
}

char *msg_text(const json_t *content)
{
    if (json_is_string(content))
        return strdup(json_string_value(content));
    pbuf b = PBUF_INIT;
    pbuf_puts(&b, "");
    size_t i;
    const json_t *part;
    if (json_is_array(content))
        json_array_foreach(content, i, part) {
            const char *t = json_string_value(json_object_get(part, "text"));
            if (t)
                pbuf_puts(&b, t);
        }
    return pbuf_take(&b);
}

const char *msg_image_url(const json_t *part)
{
    const char *type = msg_str(part, "type");
    return type && strcmp(type, "image_url") == 0
               ? msg_str(json_object_get(part, "image_url"), "url")
               : NULL;
}

json_t *msg_arguments_object(const json_t *call)
{
    const json_t *fn = json_object_get(call, "function");
    const json_t *args = json_object_get(fn, "arguments");
    if (json_is_object(args))
        return json_deep_copy(args);
    const char *text = json_string_value(args);
    if (!text || !*text)
        return json_object();
    json_t *v = json_loads(text, JSON_DECODE_ANY, NULL);
    if (json_is_object(v))
        return v;
    json_decref(v);
    return json_pack("{s:s}", "invalid_json", text);
}

char *msg_arguments_text(const json_t *call)
{
    const json_t *args = json_object_get(json_object_get(call, "function"), "arguments");
    if (json_is_string(args))
        return strdup(json_string_value(args));
    json_t *obj = msg_arguments_object(call);
    char *s = obj ? llm_arguments_text(obj) : NULL;
    json_decref(obj);
    return s;
}

/* A copy of message m with `with` for its content (taken, also on failure), or NULL out of
   memory (also when `with` is NULL: the content could not be made). */
static json_t *msg_with_content(const json_t *m, json_t *with)
{
    json_t *copy = with ? json_copy((json_t *)m) : NULL;
    if (!copy) {
        json_decref(with);
        return NULL;
    }
    if (json_object_set_new(copy, "content", with) != 0) { /* takes `with` */
        json_decref(copy);
        return NULL;
    }
    return copy;
}

json_t *msgs_with_turn_note(const json_t *messages, const char *note)
{
    json_t *out = json_array();
    int noted = 0, failed = !out;
    size_t i;
    json_t *m;
    json_array_foreach(messages, i, m) {
        if (failed)
            break;
        if (noted || strcmp(msg_role(m), "user") != 0) {
            failed = json_array_append(out, m) != 0;
            continue;
        }
        noted = 1;
        json_t *content = json_object_get(m, "content"), *with = NULL;
        if (json_is_array(content)) {
            with = json_copy(content);
            char *text = pstr_printf("\n\n%s", note);
            if (with && text)
                json_array_append_new(with, json_pack("{s:s,s:s}", "type", "text", "text", text));
            free(text);
        } else {
            const char *text = json_string_value(content);
            char *joined =
                pstr_printf("%s%s%s", text ? text : "", text && *text ? "\n\n" : "", note);
            with = joined ? json_string(joined) : NULL;
            free(joined);
        }
        json_t *copy = msg_with_content(m, with);
        failed = !copy || json_array_append_new(out, copy) != 0; /* takes `copy` */
    }
    if (failed) {
        json_decref(out);
        return NULL;
    }
    return out;
}

void notes_add(pbuf *notes, const json_t *m)
{
    char *text = msg_text(json_object_get(m, "content"));
    pbuf_puts(notes, notes->len ? "\n\n" SYSTEM_NOTE_PREFIX : SYSTEM_NOTE_PREFIX);
    if (text)
        pbuf_puts(notes, text);
    else
        notes->oom = 1;
    free(text);
}

json_t *msg_user_with_notes(const json_t *m, const char *notes)
{
    json_t *content = json_object_get(m, "content"), *with;
    if (json_is_array(content)) {
        with = json_copy(content);
        char *text = pstr_printf("%s\n\n", notes);
        if (!with || !text ||
            json_array_insert_new(with, 0, json_pack("{s:s,s:s}", "type", "text", "text", text)))
            json_decref(with), with = NULL;
        free(text);
    } else {
        const char *text = json_string_value(content);
        char *joined = pstr_printf("%s%s%s", notes, text && *text ? "\n\n" : "", text ? text : "");
        with = joined ? json_string(joined) : NULL;
        free(joined);
    }
    return msg_with_content(m, with);
}

json_t *msg_notes_alone(const char *notes)
{
    return json_pack("{s:s,s:s}", "role", "user", "content", notes);
}

/* The notes pending in `notes` before message m (NULL: the end) onto out. */
static int flush_notes(json_t *out, pbuf *notes, const json_t *m)
{
    if (!notes->len || notes->oom)
        return notes->oom ? -1 : json_array_append(out, (json_t *)m);
    int user = m && strcmp(msg_role(m), "user") == 0;
    json_t *first = user ? msg_user_with_notes(m, notes->data) : msg_notes_alone(notes->data);
    pbuf_reset(notes);
    if (json_array_append_new(out, first) != 0) /* takes `first`, NULL too */
        return -1;
    return user || !m ? 0 : json_array_append(out, (json_t *)m);
}

json_t *msgs_merge_notes(const json_t *all, size_t *first_current)
{
    json_t *out = json_array();
    pbuf notes = PBUF_INIT;
    size_t i, start = (size_t)-1;
    int failed = !out;
    const json_t *m;
    json_array_foreach(all, i, m) {
        if (failed)
            break;
        if (i == *first_current) /* the run, if any, opens this message or comes before it */
            start = json_array_size(out) + (notes.len && strcmp(msg_role(m), "user") != 0);
        if (strcmp(msg_role(m), "system") == 0)
            notes_add(&notes, m);
        else
            failed = flush_notes(out, &notes, m) != 0;
    }
    if (!failed && notes.len)
        failed = flush_notes(out, &notes, NULL) != 0;
    pbuf_free(&notes);
    if (failed) {
        json_decref(out);
        return NULL;
    }
    *first_current = start != (size_t)-1 ? start : json_array_size(out);
    return out;
}

int msg_join_kind(const json_t *m)
{
    const char *role = msg_role(m);
    if (strcmp(role, "user") == 0)
        return 'u';
    if (strcmp(role, "assistant") == 0)
        return json_array_size(json_object_get(m, "tool_calls")) ? 'c' : 'a';
    if (strcmp(role, "tool") == 0)
        return 't';
    return strcmp(role, "system") == 0 ? 's' : 0;
}

/* content as parts: a string becomes one text part (copied); NULL out of memory. */
static json_t *content_parts(const json_t *content)
{
    if (json_is_array(content))
        return json_copy((json_t *)content);
    const char *text = json_string_value(content);
    json_t *parts = json_array();
    if (parts && text && *text &&
        json_array_append_new(parts, json_pack("{s:s,s:s}", "type", "text", "text", text)) != 0)
        json_decref(parts), parts = NULL;
    return parts;
}

/* content empty: no text and no parts. */
static int content_empty(const json_t *content)
{
    const char *text = json_string_value(content);
    return json_is_array(content) ? json_array_size(content) == 0 : !text || !*text;
}

#ifdef PARLEY_TEST_HOOKS
json_t *msg_join(const json_t *a, const json_t *b)
{
    const json_t *ca = json_object_get(a, "content"), *cb = json_object_get(b, "content");
    const char *sep = content_empty(ca) || content_empty(cb) ? "" : "\n\n";
    json_t *with = NULL;
    if (json_is_array(ca) || json_is_array(cb)) {
        with = content_parts(ca);
        json_t *more = content_parts(cb);
        if (!with || !more ||
            (*sep &&
             json_array_append_new(with, json_pack("{s:s,s:s}", "type", "text", "text", sep))) ||
            json_array_extend(with, more) != 0)
            json_decref(with), with = NULL;
        json_decref(more);
    } else {
        const char *ta = json_string_value(ca), *tb = json_string_value(cb);
        char *joined = pstr_printf("%s%s%s", ta ? ta : "", sep, tb ? tb : "");
        with = joined ? json_string(joined) : NULL;
        free(joined);
    }
    return msg_with_content(a, with);
}
#endif

/* A text part holding text; NULL out of memory. */
static json_t *text_part(const char *text)
{
    return json_pack("{s:s,s:s}", "type", "text", "text", text);
}

/* The joined content so far: text while every content was a string (or no content), then
   parts from the first parts content on, the text so far their first part (content_parts). */
typedef struct joined_content {
    pbuf text;
    json_t *parts;
    int oom;
} joined_content;

static void join_content(joined_content *j, const json_t *c)
{
    if (!j->parts && !json_is_array(c)) {
        const char *t = json_string_value(c);
        if (j->text.len && t && *t)
            pbuf_puts(&j->text, "\n\n");
        pbuf_puts(&j->text, t ? t : "");
        return;
    }
    if (!j->parts) {
        j->parts = json_array();
        if (!j->parts ||
            (j->text.len && json_array_append_new(j->parts, text_part(j->text.data)) != 0)) {
            j->oom = 1;
            return;
        }
    }
    json_t *more = content_parts(c);
    if (!more ||
        (json_array_size(j->parts) && !content_empty(c) &&
         json_array_append_new(j->parts, text_part("\n\n")) != 0) ||
        json_array_extend(j->parts, more) != 0)
        j->oom = 1;
    json_decref(more);
}

json_t *msgs_join(const json_t *run)
{
    joined_content j = {PBUF_INIT, NULL, 0};
    size_t i;
    const json_t *m;
    json_array_foreach(run, i, m) {
        if (!j.oom)
            join_content(&j, json_object_get(m, "content"));
    }
    json_t *with = j.oom || j.text.oom ? NULL
                   : j.parts           ? json_incref(j.parts)
                                       : json_stringn(j.text.data ? j.text.data : "", j.text.len);
    pbuf_free(&j.text);
    json_decref(j.parts);
    return msg_with_content(json_array_get(run, 0), with);
}

json_t *msg_conversation_start(void)
{
    return json_pack("{s:s,s:s}", "role", "user", "content", CONVERSATION_START);
}

json_t *msgs_alternate(const json_t *all, size_t *first_current)
{
    size_t cur = *first_current;
    json_t *noted = msgs_merge_notes(all, &cur), *out = json_array();
    size_t i, start = (size_t)-1;
    int failed = !noted || !out;
    json_t *m;
    if (!failed && json_array_size(noted) &&
        (msg_join_kind(json_array_get(noted, 0)) == 'a' ||
         msg_join_kind(json_array_get(noted, 0)) == 'c'))
        failed = json_array_append_new(out, msg_conversation_start()) != 0;
    json_array_foreach(noted, i, m) {
        if (failed)
            break;
        size_t n = json_array_size(out);
        json_t *last = n ? json_array_get(out, n - 1) : NULL;
        int kind = msg_join_kind(m),
            join = last && (kind == 'u' || kind == 'a') && msg_join_kind(last) == kind;
        if (i == cur)
            start = join ? n - 1 : n;
        if (!join) {
            failed = json_array_append(out, m) != 0;
            continue;
        }
        /* the whole run at once (msgs_join): a join per message copies the growing text */
        json_t *run = json_array();
        failed = !run || json_array_append(run, last) != 0;
        for (; !failed && i < json_array_size(noted); i++) {
            m = json_array_get(noted, i);
            if (msg_join_kind(m) != kind)
                break;
            if (i == cur)
                start = n - 1;
            failed = json_array_append(run, m) != 0;
        }
        i--; /* json_array_foreach steps past the run's last */
        json_t *joined = failed ? NULL : msgs_join(run);
        json_decref(run);
        failed = !joined || json_array_set_new(out, n - 1, joined) != 0;
    }
    json_decref(noted);
    if (failed) {
        json_decref(out);
        return NULL;
    }
    *first_current = start != (size_t)-1 ? start : json_array_size(out);
    return out;
}

json_t *msgs_concat(const json_t *history, const json_t *messages, size_t *first_current)
{
    json_t *all = json_array();
    if (!all)
        return NULL;
    if (history && json_array_extend(all, (json_t *)history) != 0) {
        json_decref(all);
        return NULL;
    }
    *first_current = json_array_size(all);
    if (messages && json_array_extend(all, (json_t *)messages) != 0) {
        json_decref(all);
        return NULL;
    }
    return all;
}

const char *msg_tool_name(const json_t *all, size_t index)
{
    const json_t *m = json_array_get(all, index);
    const char *own = msg_str(m, "name");
    if (own && *own)
        return own;
    const char *id = msg_str(m, "tool_call_id");
    for (size_t i = index; id && i-- > 0;) {
        const json_t *prev = json_array_get(all, i);
        if (strcmp(msg_role(prev), "assistant") != 0)
            continue;
        size_t k;
        const json_t *call;
        json_array_foreach(json_object_get(prev, "tool_calls"), k, call) {
            const char *cid = msg_str(call, "id");
            if (cid && strcmp(cid, id) == 0) {
                const char *name = msg_str(json_object_get(call, "function"), "name");
                return name ? name : "";
            }
        }
        break; /* results follow their calls directly */
    }
    return "";
}

/* Is `id` one of the first n strings of `ids`? */
static int id_taken(const json_t *ids, size_t n, const char *id)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(json_string_value(json_array_get(ids, i)), id) == 0)
            return 1;
    return 0;
}

json_t *call_renames_assign(call_renames *r, const json_t *calls)
{
    call_renames_free(r);
    size_t n = json_array_size(calls), i;
    if (n < 2)
        return NULL; /* most messages: nothing to repeat */
    const json_t *call;
    json_t *given = json_array();
    int repeats = 0;
    json_array_foreach(calls, i, call) {
        const char *id = msg_str(call, "id");
        repeats |= id_taken(given, i, id ? id : "");
        json_array_append_new(given, json_string(id ? id : ""));
    }
    if (!repeats || json_array_size(given) != n) {
        json_decref(given);
        return NULL;
    }
    json_t *sent = json_array();
    r->queues = json_object();
    for (i = 0; i < n; i++) {
        const char *id = json_string_value(json_array_get(given, i));
        char *fresh = NULL;
        for (int k = 2; id_taken(sent, i, id) &&
                        (!fresh || id_taken(given, n, fresh) || id_taken(sent, i, fresh));
             k++) {
            free(fresh);
            fresh = pstr_printf("%s_%d", id, k);
            if (!fresh)
                break;
        }
        json_array_append_new(sent, json_string(fresh ? fresh : id));
        json_t *q = json_object_get(r->queues, id);
        if (!q)
            json_object_set_new(r->queues, id, q = json_array());
        json_array_append_new(q, json_string(fresh ? fresh : id));
        free(fresh);
    }
    json_decref(given);
    return sent;
}

const char *call_renames_result(call_renames *r, const char *id)
{
    json_t *q = id ? json_object_get(r->queues, id) : NULL;
    if (json_array_size(q) == 0)
        return id;
    json_decref(r->handed);
    r->handed = json_incref(json_array_get(q, 0));
    json_array_remove(q, 0);
    return json_string_value(r->handed);
}

void call_renames_free(call_renames *r)
{
    json_decref(r->queues);
    json_decref(r->handed);
    r->queues = r->handed = NULL;
}

const json_t *msg_provider_data(const json_t *msg, const char *name, const char *key)
{
    const json_t *v =
        json_object_get(json_object_get(json_object_get(msg, "provider_data"), name), key);
    return json_is_null(v) ? NULL : v;
}

/* 1 when jansson would write s exactly as pbuf_json_string does: no control
 * byte that jansson spells "\\u00XX" (upper case, pbuf_json_string lower case). */
static int escapes_alike(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 && c != '\n' && c != '\r' && c != '\t' && c != '\b' && c != '\f')
            return 0;
    }
    return 1;
}

void pbuf_json(pbuf *b, const json_t *v)
{
    /* A string (most message contents): escaped straight into b, no copy. */
    if (json_is_string(v) && escapes_alike(json_string_value(v), json_string_length(v))) {
        pbuf_json_string(b, json_string_value(v), json_string_length(v));
        return;
    }
    char *s = json_dumps_whole(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_PRESERVE_ORDER);
    if (!s) {
        b->oom = 1;
        return;
    }
    pbuf_puts(b, s);
    free(s);
}

/* ---- request parts every codec renders alike ---- */

void render_extra_body(pbuf *b, const parley_options *o)
{
    if (!o->extra_body)
        return;
    json_t *extra = json_loads(o->extra_body, 0, NULL); /* validated at create() */
    const char *key;
    json_t *v;
    json_object_foreach(extra, key, v) {
        pbuf_putc(b, ',');
        pbuf_json_string(b, key, strlen(key));
        pbuf_putc(b, ':');
        pbuf_json(b, v);
    }
    if (!extra)
        b->oom = 1;
    json_decref(extra);
}

static _Thread_local int build_failed; /* codec_set and the others since codec_build_begin */

void codec_build_begin(void) { build_failed = 0; }

void codec_set(json_t *obj, const char *key, json_t *value)
{
    if (json_object_set_new(obj, key, value) != 0)
        build_failed = 1;
}

void codec_append(json_t *array, json_t *value)
{
    if (json_array_append_new(array, value) != 0)
        build_failed = 1;
}

void codec_extend(json_t *array, json_t *other)
{
    if (json_array_extend(array, other) != 0)
        build_failed = 1;
}

void codec_insert(json_t *array, size_t index, json_t *value)
{
    if (json_array_insert_new(array, index, value) != 0)
        build_failed = 1;
}

void codec_build_oom(void) { build_failed = 1; }

char *codec_text(const json_t *content)
{
    char *text = msg_text(content);
    if (!text)
        build_failed = 1;
    return text;
}

int codec_body_text(pbuf *out, json_t *body, const parley_options *o, char **err)
{
    pbuf_reset(out);
    int failed = build_failed;
    build_failed = 0;
    char *text =
        body && !failed
            ? json_dumps_whole(body, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15))
            : NULL;
    json_decref(body);
    if (text) {
        pbuf_append(out, text, strlen(text) - 1); /* extra_body goes before the brace */
        render_extra_body(out, o);
        pbuf_putc(out, '}');
        free(text);
    }
    return !text || out->oom ? codec_oom(err) : 0;
}

int codec_bearer_header(const parley_options *o, struct curl_slist **list)
{
    if (!o->api_key)
        return 0;
    char *auth = pstr_printf("Authorization: Bearer %s", o->api_key);
    struct curl_slist *more = auth ? curl_slist_append(*list, auth) : NULL;
    free(auth);
    if (!more)
        return -1;
    *list = more;
    return 0;
}

long long codec_default_window(const parley_options *o)
{
    return !o->base_url || strstr(o->base_url, "://api.openai.com") ? 128000 : 4096;
}

/* ---- small shared pieces of the decoders ---- */

int codec_oom(char **err) { return codec_fail(err, LLM_OUT_OF_MEMORY); }

int llm_error_is_oom(const char *err) { return !err || strcmp(err, LLM_OUT_OF_MEMORY) == 0; }

long long codec_count(const json_t *obj, const char *key)
{
    const json_t *v = json_object_get(obj, key);
    return json_is_integer(v) && json_integer_value(v) > 0 ? (long long)json_integer_value(v) : 0;
}

int codec_stream_die(codec_stream_state *st, char *msg, char **err)
{
    st->failed = 1;
    free(st->error);
    st->error = msg ? msg : strdup("out of memory");
    if (err)
        *err = st->error ? strdup(st->error) : NULL;
    return -1;
}

int codec_stream_dead(codec_stream_state *st, int finishing, char **err)
{
    if (err)
        *err = NULL;
    if (st->failed)
        return codec_fail(err, "%s", st->error ? st->error : "out of memory");
    if (st->finished)
        return codec_fail(err, "%s",
                          finishing ? "stream already finished" : "stream fed after it finished");
    st->finished = finishing;
    return 0;
}

/* ---- errors, worded alike by every decoder ---- */

int codec_fail(char **err, const char *fmt, ...)
{
    if (!err)
        return -1;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    *err = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (*err) {
        va_start(ap, fmt);
        vsnprintf(*err, (size_t)n + 1, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static const char *type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
    case JSON_REAL:
        return "a number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    case JSON_NULL:
        return "null";
    }
    return "of an unknown type";
}

const char *llm_json_type_name(const json_t *v) { return v ? type_name(v) : "missing"; }

const json_t *codec_member(const json_t *obj, const char *key)
{
    const json_t *v = json_object_get(obj, key);
    return json_is_null(v) ? NULL : v;
}

int codec_optional_string(const json_t *obj, const char *key, const char *what, const char **out,
                          char **err)
{
    const json_t *v = codec_member(obj, key);
    *out = NULL;
    if (!v)
        return 0;
    if (!json_is_string(v))
        return codec_fail(err, "%s %s is %s, not a string", what, key, type_name(v));
    *out = json_string_value(v);
    return 0;
}

/* Length of the valid UTF-8 character at s (no overlongs, no surrogates,
   nothing above U+10FFFF), or 0 when s does not start one. */
static size_t utf8_char_len(const unsigned char *s, size_t n)
{
    unsigned char lo = 0x80, hi = 0xBF; /* the range allowed for the second byte */
    size_t len;
    if (s[0] < 0x80)
        return 1;
    if (s[0] >= 0xC2 && s[0] <= 0xDF) {
        len = 2;
    } else if (s[0] >= 0xE0 && s[0] <= 0xEF) {
        len = 3;
        lo = s[0] == 0xE0 ? 0xA0 : 0x80;
        hi = s[0] == 0xED ? 0x9F : 0xBF;
    } else if (s[0] >= 0xF0 && s[0] <= 0xF4) {
        len = 4;
        lo = s[0] == 0xF0 ? 0x90 : 0x80;
        hi = s[0] == 0xF4 ? 0x8F : 0xBF;
    } else {
        return 0;
    }
    if (n < len || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++)
        if ((s[i] & 0xC0) != 0x80)
            return 0;
    return len;
}

/* C0, DEL and C1 controls: they would garble a log line or a UI. */
static int is_control_char(const unsigned char *s, size_t len)
{
    if (len == 1)
        return s[0] < 0x20 || s[0] == 0x7F;
    return len == 2 && s[0] == 0xC2 && s[1] < 0xA0;
}

/*
 * Server text made safe to show and to embed in JSON: valid UTF-8 only
 * (invalid bytes dropped), control characters turned into spaces, runs of
 * spaces collapsed, trimmed, at most `max` bytes cut on a character boundary
 * ("..." then appended).  NULL when nothing is left (or out of memory).
 */
static char *clean_text(const char *text, size_t n, size_t max)
{
    const unsigned char *s = (const unsigned char *)text;
    pbuf out = PBUF_INIT;
    int space_pending = 0;
    for (size_t i = 0; i < n;) {
        size_t len = utf8_char_len(s + i, n - i);
        if (len == 0) {
            i++;
            continue;
        }
        if (s[i] == ' ' || is_control_char(s + i, len)) {
            space_pending = out.len > 0;
        } else if (out.len + (size_t)space_pending + len > max) {
            pbuf_puts(&out, "...");
            break;
        } else {
            if (space_pending)
                pbuf_putc(&out, ' ');
            space_pending = 0;
            pbuf_append(&out, s + i, len);
        }
        i += len;
    }
    if (out.len == 0) {
        pbuf_free(&out);
        return NULL;
    }
    return pbuf_take(&out);
}

char *llm_clean_text(const char *text, size_t n) { return clean_text(text, n, MAX_ERROR_TEXT); }

int codec_fail_not_json(char **err, const char *what, const json_error_t *jerr)
{
    if (json_load_oom(jerr))
        return codec_oom(err);
    char *why = clean_text(jerr->text, strlen(jerr->text), MAX_ERROR_TEXT);
    int rc = codec_fail(err, "%s is not JSON: %s (at byte %d)", what, why ? why : "parse error",
                        jerr->position);
    free(why);
    return rc;
}

/* ---- the server's error text ---- */

/* The message string of a JSON error body, or NULL. */
static const json_t *json_error_message(const json_t *root)
{
    if (json_is_array(root)) /* Gemini's OpenAI endpoint wraps its errors in a list */
        root = json_array_get(root, 0);
    if (!json_is_object(root))
        return NULL;
    const json_t *error = codec_member(root, "error");
    if (json_is_string(error)) /* Ollama */
        return error;
    if (json_is_object(error)) { /* OpenAI, llama.cpp, vLLM */
        const json_t *message = codec_member(error, "message");
        return json_is_string(message) ? message : NULL;
    }
    const json_t *message = codec_member(root, "message"); /* older vLLM: {"object":"error",...} */
    if (json_is_string(message))
        return message;
    const json_t *detail = codec_member(root, "detail"); /* FastAPI-based servers */
    return json_is_string(detail) ? detail : NULL;
}

static char *json_error_text(const json_t *root)
{
    if (json_is_string(root))
        return clean_text(json_string_value(root), json_string_length(root), MAX_ERROR_TEXT);
    const json_t *message = json_error_message(root);
    if (!message)
        return NULL;
    return clean_text(json_string_value(message), json_string_length(message), MAX_ERROR_TEXT);
}

/* Where `needle` (lower case ASCII) first occurs in hay[0..n), ignoring case. */
static const char *find_ci(const char *hay, size_t n, const char *needle)
{
    size_t m = strlen(needle);
    for (size_t i = 0; i + m <= n; i++)
        if (strncasecmp(hay + i, needle, m) == 0)
            return hay + i;
    return NULL;
}

static int looks_like_html(const char *body, size_t len)
{
    size_t i = 0;
    while (i < len && (body[i] == ' ' || body[i] == '\t' || body[i] == '\r' || body[i] == '\n'))
        i++;
    return i < len && body[i] == '<';
}

/* The text of the first <tag ...>...</tag> (proxies' error pages put the
   status in <title> and <h1>), or NULL. */
static char *html_element_text(const char *body, size_t len, const char *open, const char *close)
{
    const char *end = body + len;
    const char *start = find_ci(body, len, open);
    if (!start)
        return NULL;
    const char *gt = memchr(start, '>', (size_t)(end - start));
    if (!gt)
        return NULL;
    const char *text = gt + 1;
    const char *stop = find_ci(text, (size_t)(end - text), close);
    if (!stop)
        return NULL;
    return clean_text(text, (size_t)(stop - text), MAX_ERROR_TEXT);
}

char *llm_error_text(const char *body, size_t len)
{
    if (!body || len == 0)
        return NULL;
    json_t *root = json_loadb(body, len, JSON_DECODE_ANY, NULL);
    if (root && (json_is_object(root) || json_is_array(root) || json_is_string(root))) {
        char *text = json_error_text(root);
        json_decref(root);
        return text;
    }
    json_decref(root); /* a bare number or literal reads fine as plain text */
    if (looks_like_html(body, len)) {
        char *title = html_element_text(body, len, "<title", "</title");
        return title ? title : html_element_text(body, len, "<h1", "</h1");
    }
    return clean_text(body, len, MAX_ERROR_TEXT);
}

int codec_fail_server_error(const json_t *root, char **err)
{
    char *text = json_error_text(root);
    const json_t *e = json_is_array(root) ? codec_member(json_array_get(root, 0), "error")
                                          : codec_member(root, "error");
    const json_t *t = json_is_object(e) ? codec_member(e, "type") : NULL;
    const json_t *c = json_is_object(e) ? codec_member(e, "code") : NULL;
    /* the server's words, cleaned like the message (no control characters, bounded) */
    char *type =
        json_is_string(t) ? clean_text(json_string_value(t), json_string_length(t), 64) : NULL;
    char *code =
        json_is_string(c) ? clean_text(json_string_value(c), json_string_length(c), 64) : NULL;
    int rc = codec_fail(err, LLM_SERVER_ERROR "%s%s%s%s%s%s%s%s", text ? text : "(no message)",
                        type || code ? " (" : "", type ? "type " : "", type ? type : "",
                        type && code ? ", " : "", code ? "code " : "", code ? code : "",
                        type || code ? ")" : "");
    free(type);
    free(code);
    free(text);
    return rc;
}

parley_status llm_server_error_status(const char *decode_error, int *retryable)
{
    static const struct {
        const char *word; /* lower case; found anywhere in the text, ignoring case */
        parley_status status;
        int retry;
    } classes[] = {
        /* first match wins: a key problem before anything it may mention */
        {"invalid_api_key", PARLEY_ERR_HTTP_STATUS, 0},
        {"authentication", PARLEY_ERR_HTTP_STATUS, 0},
        {"unauthorized", PARLEY_ERR_HTTP_STATUS, 0},
        {"api key", PARLEY_ERR_HTTP_STATUS, 0},
        {"permission", PARLEY_ERR_HTTP_STATUS, 0},
        {"insufficient_quota", PARLEY_ERR_RATE_LIMITED, 0},
        {"rate_limit", PARLEY_ERR_RATE_LIMITED, 1},
        {"rate limit", PARLEY_ERR_RATE_LIMITED, 1},
        {"too many requests", PARLEY_ERR_RATE_LIMITED, 1},
        {"overloaded", PARLEY_ERR_HTTP_STATUS, 1},
        {"server_error", PARLEY_ERR_HTTP_STATUS, 1},
        {"api_error", PARLEY_ERR_HTTP_STATUS, 1},
        {"unavailable", PARLEY_ERR_HTTP_STATUS, 1},
        {"invalid_request", PARLEY_ERR_HTTP_STATUS, 0},
        {"not_found", PARLEY_ERR_HTTP_STATUS, 0},
        {"not found", PARLEY_ERR_HTTP_STATUS, 0}, /* Ollama: "model 'x' not found" */
        {"context_length", PARLEY_ERR_HTTP_STATUS, 0},
    };
    *retryable = 0;
    size_t prefix = strlen(LLM_SERVER_ERROR);
    if (!decode_error || strncmp(decode_error, LLM_SERVER_ERROR, prefix) != 0)
        return PARLEY_ERR_BAD_RESPONSE;
    const char *text = decode_error + prefix;
    for (size_t i = 0; i < sizeof classes / sizeof classes[0]; i++) {
        if (find_ci(text, strlen(text), classes[i].word)) {
            *retryable = classes[i].retry;
            return classes[i].status;
        }
    }
    return PARLEY_ERR_BAD_RESPONSE;
}

/* ---- filling a reply ---- */

/* Reals are printed with 15 digits when that reads back exactly, so 0.1 stays "0.1" rather
 * than jansson's default "0.10000000000000001"; else with 17. */
char *llm_arguments_text(const json_t *obj)
{
    char *text = json_dumps_whole(obj, JSON_COMPACT | JSON_REAL_PRECISION(15));
    if (!text)
        return NULL;
    json_t *back = json_loads(text, 0, NULL);
    int exact = back && json_equal(back, obj);
    json_decref(back);
    if (exact)
        return text;
    free(text);
    return json_dumps_whole(obj, JSON_COMPACT | JSON_REAL_PRECISION(17));
}

int codec_fill_call(llm_tool_call *c, size_t pos, const char *id, const char *name,
                    const pbuf *args, char **err)
{
    if (id && *id)
        c->id = strdup(id);
    else if (asprintf(&c->id, "call_%zu", pos) < 0)
        c->id = NULL;
    c->name = strdup(name);
    c->arguments = strdup(args->len ? args->data : "{}");
    if (!c->id || !c->name || !c->arguments)
        return codec_oom(err);
    return 0;
}

int llm_fill_call(llm_tool_call *c, size_t pos, const char *id, const char *name,
                  const char *arguments, char **err)
{
    pbuf args = PBUF_INIT;
    if (arguments)
        pbuf_puts(&args, arguments);
    int rc = args.oom ? codec_oom(err) : codec_fill_call(c, pos, id, name, &args, err);
    pbuf_free(&args);
    return rc;
}

int llm_too_many_calls(char **err)
{
    return codec_fail(err, "the answer has more than %d tool calls", LLM_MAX_TOOL_CALLS);
}

int llm_set_content(llm_reply *out, pbuf *text, char **err)
{
    if (text->oom)
        return codec_oom(err);
    if (text->len > 0)
        out->content = pbuf_take(text);
    else if (out->ncalls == 0)
        out->content = strdup("");
    else
        return 0;
    return out->content ? 0 : codec_oom(err);
}

void llm_reply_free(llm_reply *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->ncalls; i++) {
        free(r->calls[i].id);
        free(r->calls[i].name);
        free(r->calls[i].arguments);
    }
    free(r->calls);
    free(r->content);
    free(r->finish_reason);
    free(r->reasoning);
    free(r->provider_data);
    memset(r, 0, sizeof *r);
}

void llm_usage_settle(llm_usage *u)
{
    if (u->cache_read == 0)
        u->cache_read = u->timings_cached;
    if (u->prompt == 0 && u->evaluated > 0)
        u->prompt = u->evaluated + u->cache_read;
    if (u->evaluated == 0 && u->prompt > u->cache_read)
        u->evaluated = u->prompt - u->cache_read;
}

/* ---- call ids unique within a turn ---- */

static const char *id_key(const void *entry) { return entry; }

static void free_id(void *entry, void *ud)
{
    (void)ud;
    free(entry);
}

void llm_call_ids_free(dict *taken)
{
    if (!taken)
        return;
    dict_foreach(taken, free_id, NULL);
    dict_free(taken);
}

/* "call_<at>_<i>", then "call_<at>_<i>_<k>" for k = 1, 2, ... until no call of
   the turn has it: a model may well have used the first one itself. */
static char *fresh_id(const dict *taken, size_t at, size_t i)
{
    for (unsigned long k = 0;; k++) {
        char *id = NULL;
        int n =
            k ? asprintf(&id, "call_%zu_%zu_%lu", at, i, k) : asprintf(&id, "call_%zu_%zu", at, i);
        if (n < 0)
            return NULL;
        if (!dict_find(taken, id))
            return id;
        free(id);
    }
}

int llm_reply_claim_ids(llm_reply *r, dict **taken, size_t at)
{
    if (!*taken && !(*taken = dict_new(id_key)))
        return -1;
    for (size_t i = 0; i < r->ncalls; i++) {
        llm_tool_call *c = &r->calls[i];
        if (r->ids_minted || !*c->id || dict_find(*taken, c->id)) {
            char *id = fresh_id(*taken, at, i);
            if (!id)
                return -1;
            free(c->id);
            c->id = id;
        }
        char *copy = strdup(c->id);
        if (!copy || dict_add(*taken, copy) != 0) {
            free(copy);
            return -1;
        }
    }
    return 0;
}
