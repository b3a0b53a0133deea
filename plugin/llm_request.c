/* llm_request.c -- see llm_request.h. */
#include "llm_request.h"

#include <string.h>

static void render_system(pbuf *out, const parley_options *o, const char *extra)
{
    int has_prompt = o->prompt && *o->prompt;
    int has_extra = extra && *extra;
    if (!has_prompt && !has_extra)
        return;
    /* One system message: the agent's prompt, then this turn's extra prompt. */
    pbuf text = PBUF_INIT;
    if (has_prompt)
        pbuf_puts(&text, o->prompt);
    if (has_prompt && has_extra)
        pbuf_puts(&text, "\n\n");
    if (has_extra)
        pbuf_puts(&text, extra);
    pbuf_puts(out, "{\"role\":\"system\",\"content\":");
    pbuf_json_string(out, text.data ? text.data : "", text.len);
    pbuf_puts(out, "},");
    if (text.oom)
        out->oom = 1;
    pbuf_free(&text);
}

void llm_request_render(pbuf *out, const parley_options *o, const llm_request *r)
{
    pbuf_reset(out);
    pbuf_puts(out, "{\"model\":");
    pbuf_json_string(out, o->model, strlen(o->model));
    pbuf_puts(out, ",\"messages\":[");
    render_system(out, o, r->extra_system_prompt);
    pbuf_append(out, r->history, r->history_len);
    pbuf_append(out, r->messages, r->messages_len);
    pbuf_putc(out, ']');
    if (strcmp(r->tools_json, "[]") != 0) {
        pbuf_puts(out, ",\"tools\":");
        pbuf_puts(out, r->tools_json);
        if (r->tool_choice_none)
            pbuf_puts(out, ",\"tool_choice\":\"none\"");
    }
    if (o->stream)
        pbuf_puts(out, ",\"stream\":true");
    if (o->temperature >= 0)
        pbuf_printf(out, ",\"temperature\":%.15g", o->temperature);
    if (o->top_p >= 0)
        pbuf_printf(out, ",\"top_p\":%.15g", o->top_p);
    if (o->max_tokens > 0)
        pbuf_printf(out, ",\"max_tokens\":%lld", (long long)o->max_tokens);
    pbuf_putc(out, '}');
}
