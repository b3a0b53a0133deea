/*
 * provider_options.c -- the options as the registry sees them: the `provider`
 * option must name a codec of provider_registry[] (the error lists them; not
 * given, it is the first), and that codec's check_options runs; the schema's
 * provider enum, default and help, and base_url's, come from the same list.
 * Apart from provider.c so that code reading replies alone (the fuzz targets)
 * does not pull in the options parser.
 */
#include "provider/provider.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "lib/buf.h"
#include "lib/json_oom.h"

/* "\"openai\", \"anthropic\" or \"ollama\"": the registry's names for an error. */
static void registry_names(pbuf *b)
{
    for (size_t i = 0; provider_registry[i]; i++) {
        if (i > 0)
            pbuf_puts(b, provider_registry[i + 1] ? ", " : " or ");
        pbuf_printf(b, "\"%s\"", provider_registry[i]->name);
    }
}

parley_status provider_options_parse(const char *json, parley_options *o, char **err)
{
    parley_status st = options_parse(json, o, err);
    if (st != PARLEY_OK)
        return st;
    if (!o->provider && !(o->provider = strdup(provider_registry[0]->name)))
        goto fail; /* no message: out of memory */
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
        st = PARLEY_ERR_INVALID_OPTIONS;
        goto fail;
    }
    if (p->check_options && (st = p->check_options(o, err)) != PARLEY_OK)
        goto fail;
    return PARLEY_OK;
fail:
    options_free(o);
    if (!*err) { /* a message that could not be made */
        *err = pstr_printf("out of memory");
        return PARLEY_ERR_NO_MEMORY;
    }
    return st;
}

/* The help of `provider`: each codec's name and summary. */
static char *provider_help(void)
{
    pbuf b = PBUF_INIT;
    pbuf_puts(&b, "Wire format of the LLM server: ");
    for (size_t i = 0; provider_registry[i]; i++) {
        if (i > 0)
            pbuf_puts(&b, provider_registry[i + 1] ? ", " : " or ");
        pbuf_printf(&b, "\"%s\" (%s)", provider_registry[i]->name, provider_registry[i]->summary);
    }
    return b.oom ? (pbuf_free(&b), NULL) : pbuf_take(&b);
}

/* The help of `base_url`: each codec's default and where its requests go. */
static char *base_url_help(void)
{
    pbuf b = PBUF_INIT;
    pbuf_puts(&b, "API root; null = the provider's default (");
    for (size_t i = 0; provider_registry[i]; i++) {
        const provider *p = provider_registry[i];
        pbuf_printf(&b, "%s%s: %s, %s <base_url>%s", i ? "; " : "", p->name, p->default_base_url,
                    i ? "to" : "requests to", p->path);
    }
    pbuf_putc(&b, ')');
    return b.oom ? (pbuf_free(&b), NULL) : pbuf_take(&b);
}

/* Set member key of the option's schema to v (stolen); 0, or -1 (v freed). */
static int set_in(json_t *props, const char *option, const char *key, json_t *v)
{
    return json_object_set_new(json_object_get(props, option), key, v);
}

char *provider_options_schema(void)
{
    char *text = options_schema();
    json_t *schema = text ? json_loads(text, 0, NULL) : NULL;
    free(text);
    json_t *props = json_object_get(schema, "properties");
    json_t *names = json_array();
    for (size_t i = 0; names && provider_registry[i]; i++)
        json_array_append_new(names, json_string(provider_registry[i]->name));
    char *help = provider_help(), *url_help = base_url_help();
    char *out = NULL;
    if (!props || !help || !url_help)
        json_decref(names);
    else if (set_in(props, "provider", "enum", names) == 0 &&
             set_in(props, "provider", "default", json_string(provider_registry[0]->name)) == 0 &&
             set_in(props, "provider", "description", json_string(help)) == 0 &&
             set_in(props, "base_url", "description", json_string(url_help)) == 0)
        out = json_dumps_whole(schema, JSON_COMPACT | JSON_PRESERVE_ORDER);
    free(help);
    free(url_help);
    json_decref(schema);
    return out;
}
