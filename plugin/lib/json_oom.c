/* json_oom.c -- see json_oom.h. */
#include "lib/json_oom.h"

#include "lib/buf.h"
#include "lib/json_scan.h"

int json_load_oom_text(const json_error_t *e, const char *text, size_t len)
{
    if (json_load_oom(e))
        return 1;
    if (json_error_code(e) != json_error_invalid_syntax || !text)
        return 0;
    size_t i = 0;
    while (i < len && (text[i] == ' ' || text[i] == '\t' || text[i] == '\n' || text[i] == '\r'))
        i++;
    if (i == len || (text[i] != '{' && text[i] != '['))
        return 0; /* a scalar: valid JSON, but jansson rightly refuses it without JSON_DECODE_ANY */
    jscan s;
    jscan_init(&s, text, len);
    return jscan_skip(&s) == 0 && jscan_end(&s) == 0;
}

/* json_dump_callback's writer: once one write failed, the text is lost. */
static int put(const char *text, size_t n, void *data)
{
    pbuf *b = data;
    pbuf_append(b, text, n);
    return b->oom ? -1 : 0;
}

char *json_dumps_whole(const json_t *json, size_t flags)
{
    pbuf b = PBUF_INIT;
    if (json_dump_callback(json, put, &b, flags) != 0 || b.oom) {
        pbuf_free(&b);
        return NULL;
    }
    return pbuf_take(&b);
}
