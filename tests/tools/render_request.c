/*
 * parley-render -- print the request body a provider codec renders for a list
 * of stored (neutral) messages: `parley-render OPTIONS.json MESSAGES.json`.
 *
 * The end-to-end tests use it to continue, under another provider, a
 * conversation recorded under one (history_get's messages go in, the fake
 * LLM's strict validation judges what comes out): a provider switch without
 * needing a store that outlives the agent.  Exit 0 and the body on stdout, or
 * 1 and the reason on stderr.
 */
#include <stdio.h>
#include <stdlib.h>

#include "config/options.h"
#include "provider/provider.h"
#include "config/toolset.h"
#include "../unit/read_file.h" /* the tests' whole-file reader */

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: parley-render OPTIONS.json MESSAGES.json\n");
        return 2;
    }
    char *opts_text = read_file(argv[1], NULL), *msgs_text = read_file(argv[2], NULL), *err = NULL;
    parley_options o;
    int rc = 1;
    json_t *all = msgs_text ? json_loads(msgs_text, 0, NULL) : NULL;
    if (!opts_text || !json_is_array(all) || json_array_size(all) == 0) {
        fprintf(stderr, "parley-render: cannot read the options or the messages\n");
        goto out;
    }
    if (provider_options_parse(opts_text, &o, &err) != PARLEY_OK) {
        fprintf(stderr, "parley-render: %s\n", err);
        goto out;
    }
    toolset *tools = NULL;
    toolset_parse(o.tools_json, NULL, &tools, &err); /* refused: tools stays NULL, err says why */
    /* Everything but the last message is history; the last is this turn's (a user message). */
    json_t *history = json_array(), *current = json_array();
    for (size_t i = 0; i < json_array_size(all); i++)
        json_array_append(i + 1 < json_array_size(all) ? history : current, json_array_get(all, i));
    provider_request r = {.system = o.prompt, .history = history, .messages = current,
                          .tools_json = tools ? toolset_json(tools) : "[]"};
    pbuf body = PBUF_INIT;
    const provider *p = provider_find(o.provider);
    if (tools && p->encode(&body, &o, &r, &err) == 0) {
        printf("%s\n", body.data);
        rc = 0;
    } else {
        fprintf(stderr, "parley-render: %s\n", err ? err : "cannot render");
    }
    pbuf_free(&body);
    json_decref(history);
    json_decref(current);
    toolset_free(tools);
    options_free(&o);
out:
    free(err);
    json_decref(all);
    free(opts_text);
    free(msgs_text);
    return rc;
}
