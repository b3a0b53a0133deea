/*
 * codec.c -- the code every provider's codec shares (codec.h): reading Parley's
 * neutral messages, the request parts every codec renders alike, and the small
 * pieces of the decoders.
 *
 * Apart from provider.c, which is what the turn sees (the registry and the
 * reasoning rules on top of every decoder): a codec includes codec.h, the
 * turn never does, and neither half needs the other's code to be read.
 */
#include "provider/codec.h"

#include <stdlib.h>
#include <string.h>

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
    return type && strcmp(type, "image_url") == 0 ? msg_str(json_object_get(part, "image_url"), "url")
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
        for (int k = 2; id_taken(sent, i, id) && (!fresh || id_taken(given, n, fresh) ||
                                                  id_taken(sent, i, fresh)); k++) {
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
    const json_t *v = json_object_get(json_object_get(json_object_get(msg, "provider_data"),
                                                      name), key);
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
    char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_PRESERVE_ORDER);
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

int codec_body_text(pbuf *out, json_t *body, const parley_options *o, char **err)
{
    pbuf_reset(out);
    char *text = body ? json_dumps(body, JSON_COMPACT | JSON_PRESERVE_ORDER |
                                             JSON_REAL_PRECISION(15)) : NULL;
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

/* ---- small shared pieces of the decoders ---- */

int codec_oom(char **err)
{
    *err = pstr_printf("out of memory");
    return -1;
}

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
    *err = st->error ? strdup(st->error) : NULL;
    return -1;
}

int codec_stream_dead(codec_stream_state *st, int finishing, char **err)
{
    *err = NULL;
    if (st->failed) {
        *err = pstr_printf("%s", st->error ? st->error : "out of memory");
        return -1;
    }
    if (st->finished) {
        *err = pstr_printf(finishing ? "stream already finished" : "stream fed after it finished");
        return -1;
    }
    st->finished = finishing;
    return 0;
}
