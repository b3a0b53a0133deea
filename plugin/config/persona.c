/* persona.c -- see persona.h. */
#include "config/persona.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "lib/buf.h"
#include "lib/json_keys.h"
#include "lib/json_oom.h"
#include "lib/unicode_name.h"
#include "lib/utf8.h"

static int valid_name(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > PERSONA_MAX_NAME || !utf8_valid(s, n))
        return 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
            return 0;
    return 1;
}

/* The agent's tools whose names `names` (a JSON array of strings) lists, in *out. */
static parley_status tool_subset(const char *who, json_t *names, const toolset *agent_tools,
                                 toolset **out, char **err)
{
    *out = NULL;
    if (!json_is_array(names)) {
        *err = pstr_printf("option 'personas': persona \"%s\": 'tools' must be an array of tool "
                           "names", who);
        return PARLEY_ERR_INVALID_OPTIONS;
    }
    json_t *all = json_loads(toolset_json(agent_tools), 0, NULL), *picked = json_array();
    parley_status st = PARLEY_ERR_NO_MEMORY;
    if (!all || !picked)
        goto done;
    size_t i;
    json_t *name;
    json_array_foreach(names, i, name) {
        const char *n = json_string_value(name);
        if (!n) {
            *err = pstr_printf("option 'personas': persona \"%s\": 'tools' must be an array of "
                               "tool names", who);
            st = PARLEY_ERR_INVALID_OPTIONS;
            goto done;
        }
        if (!toolset_has(agent_tools, n)) {
            char *q = utf8_quotable(n, json_string_length(name), 64);
            *err = q ? pstr_printf("option 'personas': persona \"%s\": tool \"%s\" is not one "
                                   "of the agent's tools", who, q)
                     : NULL;
            free(q);
            if (*err) /* else out of memory (st) */
                st = PARLEY_ERR_INVALID_OPTIONS;
            goto done;
        }
        size_t k;
        json_t *tool;
        json_array_foreach(all, k, tool) {
            json_t *fn = json_object_get(tool, "function");
            const char *tn = json_string_value(json_object_get(fn, "name"));
            if (tn && strcmp(tn, n) == 0 && json_array_append(picked, tool) != 0)
                goto done;
        }
    }
    char *text = json_dumps_whole(picked, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (text)
        st = toolset_parse(text, NULL, out, err); /* a repeated name is refused here, by name */
    free(text);
    if (st == PARLEY_ERR_INVALID_INPUT) {
        char *inner = *err;
        *err = pstr_printf("option 'personas': persona \"%s\": 'tools': %s", who, inner);
        free(inner);
        st = PARLEY_ERR_INVALID_OPTIONS;
    }
done:
    json_decref(all);
    json_decref(picked);
    if (st != PARLEY_OK && !*err) {
        *err = pstr_printf("out of memory");
        st = PARLEY_ERR_NO_MEMORY;
    }
    return st;
}

/* A number option of a persona: absent = the agent's (*dst untouched). */
static parley_status number_key(const char *who, json_t *obj, const char *key, double lo,
                                double hi, double *dst, char **err)
{
    json_t *v = json_object_get(obj, key);
    if (!v)
        return PARLEY_OK;
    if (!json_is_number(v) || json_number_value(v) < lo || json_number_value(v) > hi) {
        *err = pstr_printf("option 'personas': persona \"%s\": '%s' must be a number from %g to "
                           "%g", who, key, lo, hi);
        return PARLEY_ERR_INVALID_OPTIONS;
    }
    *dst = json_number_value(v);
    return PARLEY_OK;
}

static parley_status int_key(const char *who, json_t *obj, const char *key, int64_t lo,
                             int64_t hi, int64_t *dst, char **err)
{
    json_t *v = json_object_get(obj, key);
    if (!v)
        return PARLEY_OK;
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) {
        *err = pstr_printf("option 'personas': persona \"%s\": '%s' must be an integer from %lld "
                           "to %lld", who, key, (long long)lo, (long long)hi);
        return PARLEY_ERR_INVALID_OPTIONS;
    }
    *dst = json_integer_value(v);
    return PARLEY_OK;
}

static const char *const KEYS[] = {"prompt", "model", "temperature", "top_p", "max_tokens",
                                   "tools", "max_history_turns", NULL};

static parley_status parse_one(const char *name, json_t *obj, const toolset *agent_tools,
                               persona_spec *p, char **err)
{
    p->temperature = p->top_p = -1;
    p->max_history_turns = -1;
    if (!(p->name = strdup(name)))
        goto oom;
    if (!valid_name(name)) {
        *err = pstr_printf("option 'personas': a persona name must be 1 to %d bytes of UTF-8 "
                           "without control characters", PERSONA_MAX_NAME);
        return PARLEY_ERR_INVALID_OPTIONS;
    }
    unsigned cp = 0;
    const char *why = unicode_name_problem(name, strlen(name), &cp);
    if (why) { /* names that print alike must be one persona: see unicode_name.h */
        *err = pstr_printf("option 'personas': persona \"%s\": holds U+%04X, %s; write names in "
                           "NFC without invisible characters", name, cp, why);
        return PARLEY_ERR_INVALID_OPTIONS;
    }
    if (!json_is_object(obj)) {
        *err = pstr_printf("option 'personas': persona \"%s\": must be an object with a 'prompt'",
                           name);
        return PARLEY_ERR_INVALID_OPTIONS;
    }
    char *what = pstr_printf("option 'personas': persona \"%s\"", name);
    parley_status st = what ? json_keys_check(obj, KEYS, what, err) : PARLEY_ERR_NO_MEMORY;
    free(what);
    if (st == PARLEY_ERR_NO_MEMORY)
        goto oom;
    if (st != PARLEY_OK)
        return PARLEY_ERR_INVALID_OPTIONS; /* an unknown key, in the options */
    const char *prompt = json_string_value(json_object_get(obj, "prompt"));
    if (!prompt) {
        *err = pstr_printf("option 'personas': persona \"%s\": 'prompt' (a string) is required",
                           name);
        return PARLEY_ERR_INVALID_OPTIONS;
    }
    if (!(p->prompt = strdup(prompt)))
        goto oom;
    json_t *model = json_object_get(obj, "model");
    if (model && (!json_is_string(model) || !*json_string_value(model))) {
        *err = pstr_printf("option 'personas': persona \"%s\": 'model' must be a non-empty string",
                           name);
        return PARLEY_ERR_INVALID_OPTIONS;
    }
    if (model && !(p->model = strdup(json_string_value(model))))
        goto oom;
    if (number_key(name, obj, "temperature", 0, 2, &p->temperature, err) != PARLEY_OK ||
        number_key(name, obj, "top_p", 0, 1, &p->top_p, err) != PARLEY_OK ||
        int_key(name, obj, "max_tokens", 1, 1048576, &p->max_tokens, err) != PARLEY_OK ||
        int_key(name, obj, "max_history_turns", 0, 100000, &p->max_history_turns, err) !=
            PARLEY_OK)
        return PARLEY_ERR_INVALID_OPTIONS;
    json_t *tools = json_object_get(obj, "tools");
    return tools ? tool_subset(name, tools, agent_tools, &p->tools, err) : PARLEY_OK;
oom:
    *err = pstr_printf("out of memory");
    return PARLEY_ERR_NO_MEMORY;
}

parley_status persona_set_parse(const char *json_object, const toolset *agent_tools,
                                persona_set *out, char **err)
{
    memset(out, 0, sizeof *out);
    *err = NULL;
    json_t *root = json_loads(json_object ? json_object : "{}", 0, NULL);
    if (!json_is_object(root)) {
        json_decref(root);
        *err = pstr_printf("option 'personas': must be an object: name -> {\"prompt\": ...}");
        return PARLEY_ERR_INVALID_OPTIONS;
    }
    size_t n = json_object_size(root);
    if (n && !(out->items = calloc(n, sizeof *out->items))) {
        json_decref(root);
        *err = pstr_printf("out of memory");
        return PARLEY_ERR_NO_MEMORY;
    }
    const char *name;
    json_t *v;
    parley_status rc = PARLEY_OK;
    json_object_foreach(root, name, v) {
        rc = parse_one(name, v, agent_tools, &out->items[out->n++], err);
        if (rc != PARLEY_OK)
            break;
    }
    json_decref(root);
    if (rc != PARLEY_OK)
        persona_set_free(out);
    return rc;
}

void persona_set_free(persona_set *s)
{
    for (size_t i = 0; i < s->n; i++) {
        free(s->items[i].name);
        free(s->items[i].prompt);
        free(s->items[i].model);
        toolset_free(s->items[i].tools);
    }
    free(s->items);
    memset(s, 0, sizeof *s);
}

const persona_spec *persona_find(const persona_set *s, const char *name)
{
    for (size_t i = 0; i < s->n; i++)
        if (strcmp(s->items[i].name, name) == 0)
            return &s->items[i];
    return NULL;
}

parley_status persona_check_name(const persona_set *s, const char *name, int all_ok,
                                 const char *where, char **err)
{
    if (!*name || persona_find(s, name) || (all_ok && strcmp(name, "*") == 0))
        return PARLEY_OK;
    char *names = persona_names(s);
    char *q = utf8_quotable(name, strlen(name), 64); /* the host's bytes: maybe not UTF-8 */
    unsigned cp = 0;
    const char *why = utf8_valid(name, strlen(name)) ? unicode_name_problem(name, strlen(name), &cp)
                                                     : NULL;
    char *hint = why ? pstr_printf("; it holds U+%04X, %s", cp, why) : NULL;
    *err = NULL;
    if (q && names && (hint || !why)) /* else out of memory: no message with parts missing */
        *err = pstr_printf("%s: unknown persona \"%s\" (%s%s%s)", where, q,
                           s->n ? "personas: " : "the option 'personas' names none", names,
                           hint ? hint : "");
    free(hint);
    free(q);
    free(names);
    return *err ? PARLEY_ERR_INVALID_INPUT : PARLEY_ERR_NO_MEMORY;
}

char *persona_names(const persona_set *s)
{
    pbuf b = PBUF_INIT;
    for (size_t i = 0; i < s->n; i++) {
        if (i)
            pbuf_puts(&b, ", ");
        pbuf_json_string(&b, s->items[i].name, strlen(s->items[i].name));
    }
    return pbuf_take(&b);
}

void persona_apply(const persona_spec *p, const parley_options *base, parley_options *o)
{
    *o = *base;
    if (!p)
        return;
    o->prompt = p->prompt;
    if (p->model)
        o->model = p->model;
    if (p->temperature >= 0)
        o->temperature = p->temperature;
    if (p->top_p >= 0)
        o->top_p = p->top_p;
    if (p->max_tokens > 0)
        o->max_tokens = p->max_tokens;
    if (p->max_history_turns >= 0)
        o->max_history_turns = p->max_history_turns;
}

void persona_metrics_init(persona_metrics *m)
{
    pthread_mutex_init(&m->lock, NULL);
    m->head = NULL;
    series_init(&m->series);
}

void persona_metrics_destroy(persona_metrics *m)
{
    for (persona_counters *c = m->head, *next; c; c = next) {
        next = c->next;
        free(c->name);
        free(c);
    }
    m->head = NULL;
    pthread_mutex_destroy(&m->lock);
    series_destroy(&m->series);
}

void persona_metrics_json(persona_metrics *m, pbuf *out)
{
    pbuf_puts(out, "\"personas\":{");
    pthread_mutex_lock(&m->lock);
    for (persona_counters *c = m->head; c; c = c->next) {
        pbuf_json_string(out, c->name, strlen(c->name));
        pbuf_printf(out, ":{\"turns\":%llu,\"turns_stored\":%llu,\"messages_stored\":%llu,"
                         "\"truncations\":%llu,\"clears\":%llu}%s",
                    (unsigned long long)atomic_load(&c->turns),
                    (unsigned long long)atomic_load(&c->turns_stored),
                    (unsigned long long)atomic_load(&c->messages_stored),
                    (unsigned long long)atomic_load(&c->truncations),
                    (unsigned long long)atomic_load(&c->clears), c->next ? "," : "");
    }
    pthread_mutex_unlock(&m->lock);
    pbuf_putc(out, '}');
}

persona_counters *persona_metrics_for(persona_metrics *m, const char *name)
{
    pthread_mutex_lock(&m->lock);
    persona_counters *c = m->head;
    while (c && strcmp(c->name, name) != 0)
        c = c->next;
    if (!c && (c = calloc(1, sizeof *c)) != NULL) {
        if ((c->name = strdup(name)) != NULL) {
            c->next = m->head;
            m->head = c;
        } else {
            free(c);
            c = NULL;
        }
    }
    pthread_mutex_unlock(&m->lock);
    return c;
}
