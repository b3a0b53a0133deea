/*
 * provider.c -- provider.h, what the turn sees of the codecs: the registry,
 * stored messages parsed, retry policy, and the reasoning rules applied on top
 * of every decoder (think.h), so streamed and whole replies agree for all
 * providers.  What the codecs share among themselves is codec.c.
 */
#include "provider/provider.h"

#include <stdlib.h>
#include <string.h>

#include "lib/json_oom.h"
#include "lib/utf8.h"
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

/* ---- stored messages ---- */

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
        if (!o) /* out of memory leaves why NULL */
            why = json_load_oom(&jerr) ? NULL
                                       : pstr_printf("stored messages are not JSON: %s",
                                                     utf8_mend(jerr.text));
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
