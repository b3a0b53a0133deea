/*
 * provider_options.c -- the options as the registry sees them: the `provider`
 * option must name a codec of provider_registry[] (the error lists them), and
 * that codec's check_options runs; the schema's provider enum is the same list.
 * Apart from provider.c so that code reading replies alone (the fuzz targets)
 * does not pull in the options parser.
 */
#include "provider/provider.h"

#include <jansson.h>
#include <stdlib.h>

#include "lib/buf.h"

/* "\"openai\", \"anthropic\" or \"ollama\"": the registry's names for an error. */
static void registry_names(pbuf *b)
{
    for (size_t i = 0; provider_registry[i]; i++) {
        if (i > 0)
            pbuf_puts(b, provider_registry[i + 1] ? ", " : " or ");
        pbuf_printf(b, "\"%s\"", provider_registry[i]->name);
    }
}

int provider_options_parse(const char *json, parley_options *o, char **err)
{
    if (options_parse(json, o, err) != 0)
        return -1;
    const provider *p = provider_find(o->provider);
    if (!p) {
        pbuf b = PBUF_INIT;
        pbuf_puts(&b, "option 'provider': must be ");
        registry_names(&b);
        pbuf_puts(&b, " (got \"");
        pbuf_puts(&b, o->provider);
        pbuf_puts(&b, "\")");
        *err = b.oom ? NULL : pbuf_take(&b);
        pbuf_free(&b);
        if (!*err)
            *err = pstr_printf("out of memory");
        options_free(o);
        return -1;
    }
    if (p->check_options && p->check_options(o, err) != 0) {
        options_free(o);
        return -1;
    }
    return 0;
}

char *provider_options_schema(void)
{
    char *text = options_schema();
    json_t *schema = text ? json_loads(text, 0, NULL) : NULL;
    free(text);
    json_t *provider_opt = json_object_get(json_object_get(schema, "properties"), "provider");
    json_t *names = json_array();
    for (size_t i = 0; names && provider_registry[i]; i++)
        json_array_append_new(names, json_string(provider_registry[i]->name));
    char *out = NULL;
    if (provider_opt && names && json_object_set(provider_opt, "enum", names) == 0)
        out = json_dumps(schema, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(names);
    json_decref(schema);
    return out;
}
