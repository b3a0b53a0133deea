/* config.c -- see config.h. */
#include "engine/config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/buf.h"
#include "provider/provider.h"

/* Everything requests share: the URL, the headers, the limits.  0, or -1 on OOM. */
static int setup_http(agent_config *c)
{
    const parley_options *o = &c->opts;
    c->prov = provider_find(o->provider); /* options_parse accepted only known names */
    if (!c->prov)
        return -1;
    const char *base = o->base_url ? o->base_url : c->prov->default_base_url;
    if (!(c->url = pstr_printf("%s%s", base, c->prov->path)))
        return -1;
    if (!(c->display_url = http_display_url(c->url)))
        return -1;
    const char *lines[] = {"Content-Type: application/json",
                           o->stream ? c->prov->stream_accept : NULL};
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
        if (!lines[i])
            continue;
        struct curl_slist *more = curl_slist_append(c->headers, lines[i]);
        if (!more) /* the list so far stays in c->headers, freed with the snapshot */
            return -1;
        c->headers = more;
    }
    if (c->prov->headers(o, &c->headers) != 0)
        return -1;
    c->http = (http_config){
        .url = c->url,
        .parsed_url = http_parse_url(c->url),
        .display_url = c->display_url,
        .headers = c->headers,
        .connect_timeout_ms = (long)o->connect_timeout_ms,
        /* Streamed answers are timed by the turn: first byte, then idle gaps. */
        .request_timeout_ms = o->stream ? 0 : (long)o->request_timeout_ms,
        .verify_tls = o->verify_tls,
        .max_response_bytes = (size_t)o->max_response_bytes,
        .generation = http_config_generation(),
    };
    return 0;
}

static void config_free(agent_config *c)
{
    curl_slist_free_all(c->headers);
    curl_url_cleanup(c->http.parsed_url);
    free(c->url);
    free(c->display_url);
    toolset_free(c->tools);
    persona_set_free(&c->personas);
    options_free(&c->opts);
    free(c->options_json);
    free(c);
}

agent_config *config_new(const char *options_json, parley_status *status, char **err)
{
    *err = NULL;
    *status = PARLEY_ERR_NO_MEMORY;
    agent_config *c = calloc(1, sizeof *c);
    if (!c) {
        *err = pstr_printf("out of memory");
        return NULL;
    }
    atomic_init(&c->refs, 1);
    if ((*status = provider_options_parse(options_json, &c->opts, err)) != PARLEY_OK) {
        free(c);
        return NULL;
    }
    char *terr = NULL;
    parley_status st = toolset_parse(c->opts.tools_json, NULL, &c->tools, &terr);
    if (st != PARLEY_OK) { /* INVALID_INPUT from toolset_parse: the options' tools */
        *status = st == PARLEY_ERR_NO_MEMORY ? st : PARLEY_ERR_INVALID_OPTIONS;
        *err = st == PARLEY_ERR_NO_MEMORY ? pstr_printf("out of memory")
                                          : pstr_printf("option 'tools': %s", terr);
        free(terr);
        goto fail;
    }
    if ((*status = persona_set_parse(c->opts.personas_json, c->tools, &c->personas, err)) !=
        PARLEY_OK)
        goto fail;
    if (setup_http(c) != 0 || !(c->options_json = strdup(options_json ? options_json : "{}"))) {
        *status = PARLEY_ERR_NO_MEMORY;
        goto fail;
    }
    return c;
fail:
    config_free(c);
    if (!*err) { /* out of memory, or a message that could not be made */
        *status = PARLEY_ERR_NO_MEMORY;
        *err = pstr_printf("out of memory");
    }
    return NULL;
}

agent_config *config_ref(agent_config *c)
{
    atomic_fetch_add(&c->refs, 1);
    return c;
}

void config_unref(agent_config *c)
{
    if (c && atomic_fetch_sub(&c->refs, 1) == 1)
        config_free(c);
}
