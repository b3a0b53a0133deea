/* json_oom.c -- see json_oom.h. */
#include "lib/json_oom.h"

#include "lib/buf.h"

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
