/* recording.c -- what a turn keeps of each step; see recording.h. */
#include "turn/recording.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "lib/json_oom.h"
#include "lib/uuid.h"

/*
 * Messages are written in place at the end of t->rec.messages (no copy per
 * message): message_open() gives where this one starts, the caller appends
 * one JSON object, message_close() indexes it for the store.  A failure is
 * sticky oom, and a message cut by it is never stored (messages.oom fails
 * the turn).
 */
static size_t message_open(turn *t)
{
    if (t->rec.messages.len)
        pbuf_putc(&t->rec.messages, ',');
    return t->rec.messages.len;
}

static void message_close(turn *t, const char *role, size_t start)
{
    if (t->rec.messages.oom)
        return;
    if (t->rec.nmessages == t->rec.index_cap) {
        /* 2 first: a turn without tools has two messages (it is kept during the wait) */
        size_t cap = t->rec.index_cap ? t->rec.index_cap * 2 : 2;
        turn_message *more = realloc(t->rec.index, cap * sizeof *more);
        if (!more) {
            t->rec.messages.oom = 1;
            return;
        }
        t->rec.index = more;
        t->rec.index_cap = cap;
    }
    turn_message *m = &t->rec.index[t->rec.nmessages];
    if (uuid4(m->id) != 0) {
        t->rec.messages.oom = 1; /* no randomness: treated as a failure to record */
        return;
    }
    m->offset = start;
    m->len = t->rec.messages.len - start;
    m->role = role;
    m->created_ms = turn_clock_ms(t);
    t->rec.nmessages++;
}

/* Where the next step starts: '[' before the first, ',' before the others. */
static void step_open(turn *t) { pbuf_putc(&t->rec.steps, t->rec.steps.len ? ',' : '['); }

static void record_step(turn *t, const pbuf *step)
{
    step_open(t);
    pbuf_append(&t->rec.steps, step->data, step->len);
}

static void put_str(pbuf *b, const char *s) { pbuf_json_string(b, s, strlen(s)); }

/*
 * The user message as stored, when it differs from the one sent: with
 * history_images "placeholder", its text plus one line per image; with
 * "keep", the parts sent, except that an image whose URL carries credentials
 * or a token (image_url_has_secrets) becomes such a line too: history never
 * holds them, and the bare URL would not fetch when sent again.
 */
static void record_stored_user(turn *t)
{
    int placeholder = strcmp(t->cfg->opts.history_images, "placeholder") == 0;
    int differs = placeholder;
    for (size_t i = 0; i < t->in.images.n; i++)
        differs |= image_url_has_secrets(&t->in.images.items[i]);
    if (!differs)
        return;
    pbuf text = PBUF_INIT, *s = &t->rec.stored_user;
    pbuf_puts(&text, t->in.text);
    for (size_t i = 0; i < t->in.images.n; i++) {
        if (placeholder || image_url_has_secrets(&t->in.images.items[i])) {
            if (text.len) /* a photo without a caption: no empty first line */
                pbuf_putc(&text, '\n');
            image_placeholder(&text, &t->in.images.items[i]);
        }
    }
    pbuf_puts(s, placeholder ? "{\"role\":\"user\",\"content\":"
                             : "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":");
    pbuf_json_string(s, text.data ? text.data : "", text.len);
    for (size_t i = 0; !placeholder && i < t->in.images.n; i++) {
        if (image_url_has_secrets(&t->in.images.items[i]))
            continue;
        pbuf_puts(s, "},{\"type\":\"image_url\",\"image_url\":{\"url\":");
        put_str(s, t->in.images.items[i].url);
        pbuf_putc(s, '}');
    }
    pbuf_puts(s, placeholder ? "}" : "}]}");
    if (text.oom || s->oom)
        t->rec.messages.oom = 1;
    pbuf_free(&text);
}

/*
 * The user message.  With images its content is Chat Completions content
 * parts (the neutral record's form, docs/history.md): the text, then one
 * image_url part per image.  History keeps that too with history_images
 * "keep"; with "placeholder" it keeps the text plus one line per image.
 */
void record_user_message(turn *t)
{
    size_t start = message_open(t);
    pbuf *m = &t->rec.messages;
    pbuf_puts(m, "{\"role\":\"user\",\"content\":");
    if (!t->in.images.n) {
        put_str(m, t->in.text);
    } else {
        pbuf_putc(m, '[');
        if (*t->in.text) { /* a photo without a caption has no text part */
            pbuf_puts(m, "{\"type\":\"text\",\"text\":");
            put_str(m, t->in.text);
            pbuf_puts(m, "},");
        }
        for (size_t i = 0; i < t->in.images.n; i++) {
            pbuf_puts(m, i ? ",{" : "{");
            pbuf_puts(m, "\"type\":\"image_url\",\"image_url\":{\"url\":");
            put_str(m, t->in.images.items[i].url);
            pbuf_puts(m, "}}");
        }
        pbuf_putc(m, ']');
        record_stored_user(t);
    }
    pbuf_putc(m, '}');
    message_close(t, "user", start);
}

/* JSON text as-is if it is valid JSON, else as a JSON string. */
static void put_json_or_string(pbuf *b, const char *text)
{
    json_t *v = json_loads(text, JSON_DECODE_ANY, NULL);
    char *compact = v ? json_dumps_whole(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_PRESERVE_ORDER) : NULL;
    if (compact)
        pbuf_puts(b, compact);
    else
        put_str(b, text);
    free(compact);
    json_decref(v);
}

/*
 * Arguments as they may be stored and sent back: servers reject a history
 * whose tool-call arguments are not JSON (every later request of the
 * conversation would fail), so invalid text is wrapped in a JSON object.
 */
static void put_stored_arguments(pbuf *b, const char *arguments)
{
    json_t *v = json_loads(arguments, JSON_DECODE_ANY, NULL);
    json_decref(v);
    if (v) {
        put_str(b, arguments);
        return;
    }
    pbuf wrapped = PBUF_INIT;
    pbuf_puts(&wrapped, "{\"invalid_json\":");
    put_str(&wrapped, arguments);
    pbuf_putc(&wrapped, '}');
    if (wrapped.oom)
        b->oom = 1;
    else
        put_str(b, wrapped.data);
    pbuf_free(&wrapped);
}

/* The reasoning that came with a reply: a step, and keys of its stored message. */
static void record_reasoning(turn *t, pbuf *m, const llm_reply *reply)
{
    if (reply->reasoning && *reply->reasoning) {
        pbuf_puts(m, ",\"reasoning\":");
        put_str(m, reply->reasoning);
        pbuf s = PBUF_INIT;
        pbuf_puts(&s, "{\"type\":\"reasoning\",\"content\":");
        put_str(&s, reply->reasoning);
        pbuf_putc(&s, '}');
        record_step(t, &s);
        pbuf_free(&s);
    }
    if (reply->provider_data) {
        pbuf_puts(m, ",\"provider_data\":");
        pbuf_puts(m, reply->provider_data);
    }
}

void record_tool_calls(turn *t, const llm_reply *reply)
{
    const char *content = reply->content;
    size_t start = message_open(t);
    pbuf *m = &t->rec.messages;
    pbuf_puts(m, "{\"role\":\"assistant\",\"content\":");
    if (content && *content)
        put_str(m, content);
    else
        pbuf_puts(m, "null");
    record_reasoning(t, m, reply);
    pbuf_puts(m, ",\"tool_calls\":[");
    for (size_t i = 0; i < t->tool.ncalls; i++) {
        const turn_call *c = &t->tool.calls[i];
        pbuf_puts(m, i ? ",{\"id\":" : "{\"id\":");
        put_str(m, c->id);
        pbuf_puts(m, ",\"type\":\"function\",\"function\":{\"name\":");
        put_str(m, c->name);
        pbuf_puts(m, ",\"arguments\":");
        put_stored_arguments(m, c->arguments);
        pbuf_puts(m, "}}");

        pbuf s = PBUF_INIT;
        pbuf_puts(&s, "{\"type\":\"tool_call\",\"call_id\":");
        put_str(&s, c->id);
        pbuf_puts(&s, ",\"name\":");
        put_str(&s, c->name);
        pbuf_puts(&s, ",\"arguments\":");
        put_json_or_string(&s, c->arguments);
        pbuf_putc(&s, '}');
        record_step(t, &s);
        pbuf_free(&s);
    }
    pbuf_puts(m, "]}");
    message_close(t, "assistant", start);
}

/* Tool messages keep the Chat Completions keys and add the tool's name and
   is_error: Ollama sends results back by name, Anthropic marks failures. */
void record_tool_results(turn *t)
{
    for (size_t i = 0; i < t->tool.ncalls; i++) {
        const turn_call *c = &t->tool.calls[i];
        size_t start = message_open(t);
        pbuf *m = &t->rec.messages;
        pbuf_puts(m, "{\"role\":\"tool\",\"tool_call_id\":");
        put_str(m, c->id);
        pbuf_puts(m, ",\"content\":");
        put_str(m, c->content);
        pbuf_puts(m, ",\"name\":");
        put_str(m, c->name);
        if (c->is_error)
            pbuf_puts(m, ",\"is_error\":true");
        pbuf_putc(m, '}');
        message_close(t, "tool", start);

        pbuf s = PBUF_INIT;
        pbuf_puts(&s, "{\"type\":\"tool_result\",\"call_id\":");
        put_str(&s, c->id);
        pbuf_puts(&s, ",\"name\":");
        put_str(&s, c->name);
        pbuf_puts(&s, ",\"content\":");
        put_str(&s, c->content);
        pbuf_printf(&s, ",\"is_error\":%s}", c->is_error ? "true" : "false");
        record_step(t, &s);
        pbuf_free(&s);
    }
}

void record_answer(turn *t, const llm_reply *reply, const char *content)
{
    size_t start = message_open(t);
    pbuf *m = &t->rec.messages;
    pbuf_puts(m, "{\"role\":\"assistant\",\"content\":");
    size_t content_at = m->len;
    put_str(m, content);
    size_t content_end = m->len; /* the content as a JSON string: [content_at, content_end) */
    record_reasoning(t, m, reply);
    pbuf_putc(m, '}');
    message_close(t, "assistant", start);

    free(t->rec.answer);
    t->rec.answer = strdup(content);

    /* The step holds the same JSON string: escape the content once. */
    step_open(t);
    pbuf_puts(&t->rec.steps, "{\"type\":\"answer\",\"content\":");
    if (m->oom) /* the message is cut (the turn fails): the step still says what came */
        put_str(&t->rec.steps, content);
    else
        pbuf_append(&t->rec.steps, m->data + content_at, content_end - content_at);
    pbuf_putc(&t->rec.steps, '}');
}

/* The store's view of this turn's messages (malloc'd array; JSON borrowed from t->rec.messages). */
store_message *record_store_messages(const turn *t)
{
    store_message *msgs = calloc(t->rec.nmessages, sizeof *msgs);
    for (size_t i = 0; msgs && i < t->rec.nmessages; i++) {
        const turn_message *m = &t->rec.index[i];
        msgs[i] = (store_message){.message_id = m->id,
                                  .role = m->role,
                                  .created_ms = m->created_ms,
                                  .json = t->rec.messages.data + m->offset,
                                  .json_len = m->len};
    }
    if (msgs) { /* what the host said of the user's message (append_message: of its one) */
        msgs[0].interface_message_id = t->in.interface_message_id;
        msgs[0].metadata = t->in.metadata;
        msgs[0].metadata_len = t->in.metadata ? strlen(t->in.metadata) : 0;
    }
    if (msgs && t->rec.stored_user.len) { /* the user message with its images as placeholders */
        msgs[0].json = t->rec.stored_user.data;
        msgs[0].json_len = t->rec.stored_user.len;
    }
    return msgs;
}
