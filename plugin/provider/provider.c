/*
 * provider.c -- what every codec shares: the registry, reading neutral
 * messages, retry policy, and the reasoning rules applied on top of every
 * decoder (think.h), so streamed and whole replies agree for all providers.
 */
#include "provider/provider.h"

#include <stdlib.h>
#include <string.h>

#include "provider/codec.h"
#include "provider/think.h"
#include "store/message_text.h"

const provider *const provider_registry[] = {&provider_openai, &provider_anthropic,
                                             &provider_ollama, NULL};

const provider *provider_find(const char *name)
{
    for (size_t i = 0; name && provider_registry[i]; i++)
        if (strcmp(provider_registry[i]->name, name) == 0)
            return provider_registry[i];
    return NULL;
}

/* ---- neutral messages ---- */

json_t *provider_parse_messages(const char *text, size_t len, char **err)
{
    json_t *arr = json_array();
    msgtext_iter it;
    msgtext_msg m;
    int rc = 0;
    msgtext_begin(&it, text, len);
    while (arr && (rc = msgtext_next(&it, &m)) > 0) {
        json_error_t jerr;
        size_t i = json_array_size(arr);
        json_t *o = json_loadb(m.json, m.len, 0, &jerr);
        char *why = NULL;
        if (!o)
            why = pstr_printf("stored messages are not JSON: %s", jerr.text);
        else if (!json_is_object(o) || !json_is_string(json_object_get(o, "role")))
            why = pstr_printf("stored message %zu is not a message object", i);
        else if (json_array_append_new(arr, o) == 0)
            continue;
        else /* json_array_append_new freed it */
            o = NULL;
        json_decref(o);
        json_decref(arr);
        *err = why ? why : pstr_printf("out of memory");
        return NULL;
    }
    if (arr && rc == 0)
        return arr;
    *err = arr ? pstr_printf("stored messages are not JSON: not a list of objects")
               : pstr_printf("out of memory");
    json_decref(arr);
    return NULL;
}

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

/* ---- retry policy ---- */

int provider_retryable_default(long status, const char *body, size_t len)
{
    if (status == 429) /* OpenAI's "You exceeded your current quota": waiting will not help */
        return !(body && memmem(body, len, "insufficient_quota", 18));
    return status >= 500 && status <= 599;
}

/* ---- reasoning on top of every decoder ---- */

typedef struct split_out {
    pbuf text, reasoning;
    const llm_sink *sink; /* deltas go on to it while streaming; NULL for a whole reply */
} split_out;

static void on_split(void *ud, int is_reasoning, const char *s, size_t n)
{
    split_out *o = ud;
    if (!o->sink) { /* a whole reply: collect */
        pbuf_append(is_reasoning ? &o->reasoning : &o->text, s, n);
        return;
    }
    llm_text_fn fn = is_reasoning ? o->sink->reasoning : o->sink->text;
    if (fn)
        fn(o->sink->ud, s, n);
}

/* Move "<think>" reasoning out of out->content into out->reasoning (after any the server
   sent in its own field, as the streamed deltas came). */
static int take_think_tags(llm_reply *out, char **err)
{
    if (!out->content)
        return 0;
    split_out o = {PBUF_INIT, PBUF_INIT, NULL};
    think_filter f;
    think_init(&f, on_split, &o);
    size_t len = strlen(out->content);
    think_feed(&f, out->content, len);
    think_finish(&f);
    int oom = think_oom(&f) || o.text.oom || o.reasoning.oom;
    think_free(&f);
    if (!oom && o.text.len != len) { /* a think block was there (even an empty one) */
        pbuf r = PBUF_INIT;
        if (out->reasoning) /* joined as the deltas were: no separator */
            pbuf_puts(&r, out->reasoning);
        if (o.reasoning.len)
            pbuf_append(&r, o.reasoning.data, o.reasoning.len);
        int has_reasoning = r.len > 0;
        oom = r.oom;
        free(out->content);
        out->content = NULL;
        free(out->reasoning);
        out->reasoning = !oom && has_reasoning ? pbuf_take(&r) : NULL;
        pbuf_free(&r);
        oom = oom || (has_reasoning && !out->reasoning);
        if (!oom && llm_set_content(out, &o.text, err) != 0) { /* it said why */
            llm_reply_free(out);
            pbuf_free(&o.text);
            pbuf_free(&o.reasoning);
            return -1;
        }
    }
    pbuf_free(&o.text);
    pbuf_free(&o.reasoning);
    if (oom) {
        llm_reply_free(out);
        *err = pstr_printf("out of memory");
        return -1;
    }
    return 0;
}

int provider_decode(const provider *p, int strip_think, const char *body, size_t len,
                    llm_reply *out, char **err)
{
    if (p->decode(body, len, out, err) != 0)
        return -1;
    return strip_think ? take_think_tags(out, err) : 0;
}

struct provider_stream {
    const provider *p;
    void *codec;
    int strip_think;
    think_filter think;
    split_out split;
    llm_sink outer; /* the caller's (split.sink points here) */
    llm_sink inner; /* what the codec calls */
};

static void stream_text(void *ud, const char *s, size_t n)
{
    provider_stream *ps = ud;
    think_feed(&ps->think, s, n);
}

static void stream_reasoning(void *ud, const char *s, size_t n)
{
    provider_stream *ps = ud;
    if (ps->split.sink->reasoning)
        ps->split.sink->reasoning(ps->split.sink->ud, s, n);
}

provider_stream *provider_stream_new(const provider *p, int strip_think, const llm_sink *sink)
{
    provider_stream *ps = calloc(1, sizeof *ps);
    if (!ps)
        return NULL;
    ps->p = p;
    ps->strip_think = strip_think;
    ps->outer = *sink;
    ps->split.sink = &ps->outer;
    think_init(&ps->think, on_split, &ps->split);
    ps->inner = strip_think ? (llm_sink){stream_text, stream_reasoning, ps} : *sink;
    /* Codecs copy their sink too: callers may pass one on the stack. */
    if (!(ps->codec = p->stream_new(&ps->inner))) {
        free(ps);
        return NULL;
    }
    return ps;
}

int provider_stream_feed(provider_stream *ps, const char *data, size_t len, char **err)
{
    int rc = ps->p->stream_feed(ps->codec, data, len, err);
    if (rc == 0 && think_oom(&ps->think)) {
        *err = pstr_printf("out of memory");
        return -1;
    }
    return rc;
}

int provider_stream_finish(provider_stream *ps, llm_reply *out, char **err)
{
    if (ps->p->stream_finish(ps->codec, out, err) != 0)
        return -1;
    if (!ps->strip_think)
        return 0;
    think_finish(&ps->think); /* deltas held back (a lone "<thi") go out now */
    /* The whole content through the same rules gives what the deltas said. */
    return take_think_tags(out, err);
}

int provider_stream_done(const provider_stream *ps) { return ps->p->stream_done(ps->codec); }

void provider_stream_free(provider_stream *ps)
{
    if (!ps)
        return;
    ps->p->stream_free(ps->codec);
    think_free(&ps->think);
    pbuf_free(&ps->split.text);
    pbuf_free(&ps->split.reasoning);
    free(ps);
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
