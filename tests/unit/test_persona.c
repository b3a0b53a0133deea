/* test_persona.c -- persona.c: the `personas` option, tool subsets, overrides, counters. */
#include <jansson.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "api/agent_api.h"
#include "api/personas_live.h"
#include "config/persona.h"
#include "lib/utf8.h"

/* How many tools t offers: the length of its `tools` array (toolset.h keeps no count). */
static size_t tools_in(const toolset *t)
{
    json_t *a = json_loads(toolset_json(t), 0, NULL);
    size_t n = json_array_size(a);
    json_decref(a);
    return n;
}

static int contains(const char *s, const char *part) { return s && strstr(s, part) != NULL; }

static const char *TOOLS = "[{\"name\":\"lights\"},{\"name\":\"oven\"},{\"name\":\"music\"}]";

static void test_parse(void)
{
    char *err = NULL;
    toolset *agent = NULL;
    CHECK(toolset_parse(TOOLS, NULL, &agent, &err) == PARLEY_OK && agent != NULL);
    persona_set s;
    CHECK(persona_set_parse("{\"chef\": {\"prompt\": \"You cook.\", \"model\": \"m2\", "
                            "\"temperature\": 0.2, \"top_p\": 0.5, \"max_tokens\": 77, "
                            "\"tools\": [\"music\", \"oven\"], \"max_history_turns\": 3},"
                            " \"butler\": {\"prompt\": \"\"}}", agent, &s, &err) == PARLEY_OK);
    CHECK(err == NULL && s.n == 2);
    const persona_spec *chef = persona_find(&s, "chef"), *butler = persona_find(&s, "butler");
    CHECK(chef && butler && !persona_find(&s, "Chef") && !persona_find(&s, ""));
    if (chef && butler) {
        CHECK(tools_in(chef->tools) == 2 && toolset_has(chef->tools, "oven") &&
              !toolset_has(chef->tools, "lights"));
        CHECK(butler->tools == NULL);
        parley_options base = {0}, o;
        base.model = "m1";
        base.prompt = "agent prompt";
        base.temperature = 1;
        base.top_p = -1;
        base.max_tokens = 0;
        base.max_history_turns = 20;
        persona_apply(chef, &base, &o);
        CHECK_STR(o.model, "m2");
        CHECK_STR(o.prompt, "You cook.");
        CHECK(o.temperature == 0.2 && o.top_p == 0.5 && o.max_tokens == 77 &&
              o.max_history_turns == 3);
        persona_apply(butler, &base, &o);
        CHECK_STR(o.model, "m1");
        CHECK_STR(o.prompt, "");
        CHECK(o.temperature == 1 && o.top_p == -1 && o.max_tokens == 0 && o.max_history_turns == 20);
        persona_apply(NULL, &base, &o);
        CHECK_STR(o.prompt, "agent prompt");
    }
    err = NULL;
    CHECK(persona_check_name(&s, "chef", 0, "x", &err) == PARLEY_OK && persona_check_name(&s, "", 0, "x", &err) == PARLEY_OK);
    CHECK(persona_check_name(&s, "*", 1, "x", &err) == PARLEY_OK && err == NULL);
    CHECK(persona_check_name(&s, "*", 0, "selector", &err) == PARLEY_ERR_INVALID_INPUT);
    CHECK(contains(err, "selector: unknown persona \"*\" (personas: \"chef\", \"butler\")"));
    free(err);
    char *names = persona_names(&s);
    CHECK_STR(names, "\"chef\", \"butler\"");
    free(names);
    persona_set_free(&s);

    const char *bad[][2] = {
        {"[]", "must be an object"},
        {"{\"a\": \"hi\"}", "persona \"a\": must be an object"},
        {"{\"a\": {}}", "persona \"a\": 'prompt' (a string) is required"},
        {"{\"a\": {\"prompt\": \"p\", \"tools\": [\"oven\", \"grill\"]}}",
         "persona \"a\": tool \"grill\" is not one of the agent's tools"},
        {"{\"a\": {\"prompt\": \"p\", \"tools\": \"oven\"}}", "'tools' must be an array"},
        {"{\"a\": {\"prompt\": \"p\", \"tools\": [\"oven\", \"oven\"]}}", "persona \"a\": 'tools':"},
        {"{\"a\": {\"prompt\": \"p\", \"temperature\": 3}}", "'temperature' must be a number from 0 to 2"},
        {"{\"a\": {\"prompt\": \"p\", \"max_history_turns\": -1}}", "'max_history_turns' must be"},
        {"{\"a\": {\"prompt\": \"p\", \"max_tokens\": 1.5}}", "'max_tokens' must be an integer"},
        {"{\"a\": {\"prompt\": \"p\", \"model\": \"\"}}", "'model' must be a non-empty string"},
        {"{\"a\": {\"prompt\": \"p\", \"promt\": \"q\"}}", "option 'personas': persona \"a\": unknown key \"promt\" (expected prompt, "
         "model, temperature, top_p, max_tokens, tools, max_history_turns)"},
        {"{\"\": {\"prompt\": \"p\"}}", "a persona name must be 1 to 64 bytes"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err = NULL;
        CHECK(persona_set_parse(bad[i][0], agent, &s, &err) == PARLEY_ERR_INVALID_OPTIONS);
        CHECK(contains(err, bad[i][1]));
        if (!contains(err, bad[i][1]))
            fprintf(stderr, "  %s -> %s\n", bad[i][0], err ? err : "(null)");
        CHECK(s.n == 0 && s.items == NULL);
        free(err);
    }
    CHECK(persona_set_parse(NULL, agent, &s, &err) == PARLEY_OK && s.n == 0);
    toolset_free(agent);
}

/* Error text quoting a name is UTF-8 whatever the name: bytes that are not, and control
   characters, as \xNN; a long name cut at a character's start, never inside one. */
static void test_quoting(void)
{
    char *err = NULL;
    toolset *agent = NULL;
    CHECK(toolset_parse(TOOLS, NULL, &agent, &err) == PARLEY_OK);
    persona_set s;
    CHECK(persona_set_parse("{\"chef\": {\"prompt\": \"p\"}}", agent, &s, &err) == PARLEY_OK);
    CHECK(persona_check_name(&s, "\xff\xfe" "chef\x01", 0, "input 'persona'", &err) == PARLEY_ERR_INVALID_INPUT);
    CHECK(err && utf8_valid(err, strlen(err)));
    CHECK(contains(err, "input 'persona': unknown persona \"\\xFF\\xFEchef\\x01\""));
    free(err);
    char long_name[128] = "a";
    for (int i = 0; i < 40; i++)
        strcat(long_name, "\xc3\xa9"); /* é: 81 bytes, the 64th byte inside a character */
    CHECK(persona_check_name(&s, long_name, 0, "x", &err) == PARLEY_ERR_INVALID_INPUT);
    CHECK(err && utf8_valid(err, strlen(err)));
    char want[128];
    snprintf(want, sizeof want, "unknown persona \"%.63s...\"", long_name);
    CHECK(contains(err, want));
    free(err);
    persona_set_free(&s);
    char json[256];
    snprintf(json, sizeof json, "{\"a\": {\"prompt\": \"p\", \"tools\": [\"%s\"]}}", long_name);
    CHECK(persona_set_parse(json, agent, &s, &err) == PARLEY_ERR_INVALID_OPTIONS);
    CHECK(err && utf8_valid(err, strlen(err)));
    free(err);
    snprintf(json, sizeof json, "{\"a\": {\"prompt\": \"p\", \"%s\": 1}}", long_name);
    CHECK(persona_set_parse(json, agent, &s, &err) == PARLEY_ERR_INVALID_OPTIONS);
    CHECK(err && utf8_valid(err, strlen(err)));
    free(err);
    toolset_free(agent);
}

/* Names that print alike must be one persona: invisible characters and names not in NFC are
   refused (lib/unicode_name.h), by the option and by an input naming a persona. */
static void test_lookalike_names(void)
{
    static const char *const refused[][2] = {
        {"cafe\xcc\x81", "U+0301"},                 /* NFD café */
        {"\xe2\x84\xab" "ngstr\xc3\xb6m", "U+212B"}, /* ANGSTROM SIGN */
        {"\xe2\x84\xa6hm", "U+2126"},                /* OHM SIGN */
        {"a\xe2\x80\x8b" "b", "U+200B"},             /* zero-width space */
        {"chef\xe2\x80\x8f", "U+200F"},              /* right-to-left mark */
        {"\xe2\x80\xae" "fehc", "U+202E"},           /* right-to-left override */
        {"\xef\xbb\xbf" "chef", "U+FEFF"},           /* byte order mark */
        {"so\xc2\xad" "le", "U+00AD"},               /* soft hyphen */
        {"x\xc2\x85y", "U+0085"},                    /* C1 control */
        {"\xe1\x84\x80\xe1\x85\xa1", "U+1161"},      /* NFD Hangul 가 */
        {"\xe3\x81\x8b\xe3\x82\x99", "U+3099"},      /* か + voicing mark */
        {"\xe0\xa4\xa8\xe0\xa4\xbc", "U+093C"},      /* न + nukta (NFC: ऩ) */
        {"\xe0\xa5\x9b", "U+095B"},                  /* ज़ as one character: a composition exclusion */
        {"\xe1\xbd\xb1", "U+1F71"},                  /* Greek alpha with oxia */
        {"\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x8d\xb3", "U+200D"}, /* an emoji ZWJ sequence */
    };
    char *err = NULL;
    persona_set s;
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        char json[128];
        snprintf(json, sizeof json, "{\"%s\": {\"prompt\": \"p\"}}", refused[i][0]);
        err = NULL;
        CHECK(persona_set_parse(json, NULL, &s, &err) == PARLEY_ERR_INVALID_OPTIONS);
        CHECK(contains(err, refused[i][1]) && contains(err, "NFC"));
        if (!contains(err, refused[i][1]))
            fprintf(stderr, "  %s -> %s\n", refused[i][0], err ? err : "(null)");
        free(err);
    }
    static const char *const fine[] = {
        "caf\xc3\xa9", "\xc3\x85ngstr\xc3\xb6m", "\xce\xa9", "ab", "\xea\xb0\x80",
        "\xe3\x81\x8c", "\xe0\xa4\x9c\xe0\xa4\xbc\xe0\xa5\x8b\xe0\xa4\xaf\xe0\xa4\xbe", /* ज़ोया */
        "\xce\xac", "\xd0\x99", "\xe0\xa4\xa8\xe0\xa4\xae", "chef-2", "\xf0\x9f\x8d\xb3",
    };
    for (size_t i = 0; i < sizeof fine / sizeof fine[0]; i++) {
        char json[128];
        snprintf(json, sizeof json, "{\"%s\": {\"prompt\": \"p\"}}", fine[i]);
        err = NULL;
        CHECK(persona_set_parse(json, NULL, &s, &err) == PARLEY_OK);
        if (err)
            fprintf(stderr, "  %s -> %s\n", fine[i], err);
        free(err);
        persona_set_free(&s);
    }
    /* an input naming a look-alike of a defined persona is told why it is unknown */
    CHECK(persona_set_parse("{\"caf\xc3\xa9\": {\"prompt\": \"p\"}}", NULL, &s, &err) == PARLEY_OK);
    err = NULL;
    CHECK(persona_check_name(&s, "cafe\xcc\x81", 0, "input 'persona'", &err) == PARLEY_ERR_INVALID_INPUT);
    CHECK(contains(err, "unknown persona") && contains(err, "it holds U+0301"));
    free(err);
    persona_set_free(&s);
}

/* Worker threads bump counters of new and known personas while a host thread prints them. */
static persona_metrics shared;
static atomic_int stop_printing;

static void *bumper(void *arg)
{
    char name[16];
    for (int i = 0; i < 2000; i++) {
        snprintf(name, sizeof name, "p%d", (i + (int)(intptr_t)arg) % 7);
        persona_counters *c = persona_metrics_for(&shared, name);
        if (c)
            atomic_fetch_add(&c->turns, 1);
    }
    return NULL;
}

static void *printer(void *arg)
{
    (void)arg;
    while (!atomic_load(&stop_printing)) {
        pbuf b = PBUF_INIT;
        persona_metrics_json(&shared, &b);
        pbuf_free(&b);
    }
    return NULL;
}

static void test_counters_threads(void)
{
    persona_metrics_init(&shared);
    pthread_t t[4], p;
    pthread_create(&p, NULL, printer, NULL);
    for (intptr_t i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, bumper, (void *)i);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    atomic_store(&stop_printing, 1);
    pthread_join(p, NULL);
    unsigned long long total = 0;
    for (persona_counters *c = shared.head; c; c = c->next)
        total += atomic_load(&c->turns);
    CHECK(total == 8000);
    persona_metrics_destroy(&shared);
}

static void test_counters(void)
{
    persona_metrics m;
    persona_metrics_init(&m);
    persona_counters *a = persona_metrics_for(&m, "chef"), *b = persona_metrics_for(&m, "butler");
    CHECK(a && b && a != b && persona_metrics_for(&m, "chef") == a);
    atomic_fetch_add(&a->turns, 2);
    CHECK(atomic_load(&persona_metrics_for(&m, "chef")->turns) == 2);
    persona_metrics_destroy(&m);
}

/* jansson's allocations fail from the nth on (json_set_alloc_funcs). */
static long allocs_left;
static void *failing_malloc(size_t n) { return allocs_left-- > 0 ? malloc(n) : NULL; }

/* A persona's tools picked out of memory: PARLEY_ERR_NO_MEMORY, never INVALID_OPTIONS
   saying "out of memory" (the host would fix options that are right). */
static void test_out_of_memory(void)
{
    char *err = NULL;
    toolset *agent = NULL;
    CHECK(toolset_parse(TOOLS, NULL, &agent, &err) == PARLEY_OK);
    long failed = 0;
    for (long n = 0; n < 100000; n++) {
        persona_set s;
        err = NULL;
        allocs_left = n;
        json_set_alloc_funcs(failing_malloc, free);
        const char *text = "{\"chef\": {\"prompt\": \"p\", \"tools\": [\"oven\"]}}";
        parley_status st = persona_set_parse(text, agent, &s, &err);
        json_set_alloc_funcs(malloc, free);
        if (st == PARLEY_OK) {
            persona_set_free(&s);
            break;
        }
        failed++;
        int oom_said = contains(err, "out of memory");
        CHECK(err != NULL && oom_said == (st == PARLEY_ERR_NO_MEMORY));
        if (!err || oom_said != (st == PARLEY_ERR_NO_MEMORY))
            fprintf(stderr, "  after %ld allocations: status %d, %s\n", n, (int)st,
                    err ? err : "(no message)");
        free(err);
    }
    CHECK(failed > 0);
    toolset_free(agent);
}

/* A live agent's persona_put and update_options out of memory: PARLEY_ERR_NO_MEMORY, never
   a refusal of the host's valid settings saying "out of memory" (config_new dropped the
   options' NO_MEMORY, so persona_put said INVALID_INPUT and update_options INVALID_OPTIONS). */
static void test_live_out_of_memory(void)
{
    char *err = NULL;
    parley_agent *a = agent_create(NULL, "{\"model\":\"m\",\"tools\":[{\"name\":\"oven\"}]}", &err);
    CHECK(a != NULL);
    free(err);
    if (!a)
        return;
    const char *opts = "{\"model\":\"m\",\"tools\":[{\"name\":\"oven\"}],"
                       "\"personas\":{\"chef\":{\"prompt\":\"p\",\"tools\":[\"oven\"]}}}";
    for (int op = 0; op < 2; op++) {
        long failed = 0;
        for (long n = 0; n < 100000; n++) {
            err = NULL;
            allocs_left = n;
            json_set_alloc_funcs(failing_malloc, free);
            parley_status st = op == 0 ? agent_persona_put(a, "chef", "{\"prompt\": \"p\", "
                                                           "\"tools\": [\"oven\"]}", &err)
                                       : agent_update_options(a, opts, &err);
            long left = allocs_left;
            json_set_alloc_funcs(malloc, free);
            int oom_said = contains(err, "out of memory");
            int ok = st == PARLEY_OK || (st == PARLEY_ERR_NO_MEMORY && oom_said) ||
                     (st != PARLEY_ERR_NO_MEMORY && err && !oom_said); /* jansson's "syntax" */
            CHECK(ok);
            if (!ok)
                fprintf(stderr, "  %s after %ld allocations: status %d, %s\n",
                        op == 0 ? "persona_put" : "update_options", n, (int)st,
                        err ? err : "(no message)");
            free(err);
            if (st == PARLEY_OK && left > 0)
                break;
            failed++;
        }
        CHECK(failed > 0);
    }
    agent_destroy(a);
}

int main(void)
{
    test_quoting();
    test_lookalike_names();
    test_parse();
    test_counters();
    test_counters_threads();
    test_out_of_memory();
    test_live_out_of_memory();
    return check_report();
}
