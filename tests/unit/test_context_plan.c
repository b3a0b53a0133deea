/*
 * test_context_plan.c -- the context engine's pure parts (context/window.h):
 * whole turns found in stored text whatever the strings hold, the plan's low
 * mark, cuts, the summary made ahead taking the cut turns' place, and records
 * that do not parse (a conversation goes on from scratch, never a crash).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "context/window.h"
#include "lib/buf.h"

#define U(t) "{\"role\":\"user\",\"content\":\"" t "\"},"
#define A(t) "{\"role\":\"assistant\",\"content\":\"" t "\"},"
#define CALL "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\"}]},"
#define RESULT \
    "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"{\\\"role\\\":\\\"user\\\"}\"},"

static void window_of(ctx_window *w, pbuf *h, const char *text)
{
    memset(w, 0, sizeof *w);
    pbuf_reset(h);
    pbuf_puts(h, text);
    w->enabled = 1;
    CHECK(ctx_split(w, h) == 0);
}

static void test_split_whole_turns(void)
{
    ctx_window w;
    pbuf h = PBUF_INIT;
    /* a tool result whose text looks like a user message, braces and quotes in strings */
    window_of(&w, &h, U("one {\\\"x\\\"}") A("a]}") U("two") CALL RESULT A("done") U("three"));
    CHECK(w.nturns == 3);
    CHECK(w.nmsgs[0] == 2 && w.nmsgs[1] == 4 && w.nmsgs[2] == 1);
    CHECK(w.end[2] == h.len);
    size_t msgs = ctx_cut(&w, &h, 1, CTX_CUT_TURNS);
    CHECK(msgs == 2 && w.nturns == 2 && w.first == 2 && w.cut == CTX_CUT_TURNS);
    CHECK(strncmp(h.data, U("two"), strlen(U("two"))) == 0);
    ctx_window_free(&w);
    pbuf_free(&h);
}

static void test_plan_low_mark(void)
{
    ctx_window w;
    pbuf h = PBUF_INIT;
    window_of(&w, &h, U("1") A("1") U("2") A("2") U("3") A("3") U("4") A("4") U("5") A("5"));
    ctx_budget b = {.window = 100000, .reserve = 1000, .max_turns = 4, .factor = 1.0};
    ctx_cut_reason why;
    size_t n = ctx_plan(&w, &b, 1000, 0, 0, &why);
    CHECK(n == 4 && why == CTX_CUT_TURNS); /* 5 > 4: down to a third of 4 (one turn) */
    b.max_turns = 20; /* 21 > 20: down to a third of 20 */
    ctx_window_free(&w);
    window_of(&w, &h, "");
    for (int i = 0; i < 21; i++)
        pbuf_puts(&h, U("q") A("a"));
    CHECK(ctx_split(&w, &h) == 0 && w.nturns == 21);
    CHECK(ctx_plan(&w, &b, 1000, 0, 0, &why) == 15 && why == CTX_CUT_TURNS);
    ctx_window_free(&w);
    window_of(&w, &h, U("1") A("1") U("2") A("2") U("3") A("3") U("4") A("4") U("5") A("5"));
    b.max_turns = 0;
    CHECK(ctx_plan(&w, &b, 1000, 0, 0, &why) == 0 && why == CTX_CUT_NONE);
    b.window = 1000; /* over the tokens: down to a third of the history budget */
    b.reserve = 100;
    n = ctx_plan(&w, &b, 1000, 0, 0, &why);
    CHECK(why == CTX_CUT_TOKENS && n >= 1 && n <= 5);
    /* an idle gap: a free moment to cut, only above the low mark */
    b.window = 100000;
    w.life.last_message_ms = 1000;
    CHECK(ctx_plan(&w, &b, 100, 1000 + CTX_IDLE_CUT_MS + 1, 0, &why) == 0);
    ctx_window_free(&w);
    pbuf_free(&h);
}

static void test_next_summary_takes_the_cut(void)
{
    ctx_window w;
    pbuf h = PBUF_INIT;
    window_of(&w, &h, U("1") A("1") U("2") A("2") U("3") A("3") U("4") A("4") U("5") A("5"));
    w.summarize = 1;
    CHECK(ctx_record_write_next(&w, "what 1 and 2 said", 2) == 0);
    CHECK(w.rec.next_upto == 4);
    ctx_budget b = {.window = 100000, .reserve = 1000, .max_turns = 4, .factor = 1.0};
    int use = 0;
    size_t n = ctx_cut_for_next(&w, &b, 500, 3, &use);
    CHECK(use == 1 && n == 2); /* exactly what it covers: 3 turns left, within 4 */
    ctx_cut(&w, &h, n, CTX_CUT_TURNS);
    ctx_take_next(&w);
    CHECK(w.rec.summary && strcmp(w.rec.summary, "what 1 and 2 said") == 0);
    CHECK(w.rec.upto == 4 && w.first == 4 && !w.rec.next && w.dropped.len == 0);
    CHECK(strcmp(ctx_summary(&w), "what 1 and 2 said") == 0);
    CHECK(ctx_record_write(&w) == 0);
    CHECK(strstr(w.record.data, "\"start\":4,\"summary\":\"what 1 and 2 said\",\"upto\":4"));
    ctx_window_free(&w);
    pbuf_free(&h);
}

static void test_records_that_do_not_parse(void)
{
    const char *bad[] = {"",
                         "not json",
                         "[1,2]",
                         "{\"start\":-5}",
                         "{\"start\":\"x\"}",
                         "{\"summary\":\"s\"}",
                         "{\"start\":3,\"summary\":7,\"upto\":1}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        pbuf out = PBUF_INIT;
        ctx_describe(bad[i], strlen(bad[i]), &out);
        CHECK(out.data && strstr(out.data, "\"summary\":null"));
        pbuf_free(&out);
    }
    pbuf out = PBUF_INIT;
    const char *good = "{\"start\":9,\"summary\":\"caf\\u00e9\",\"upto\":7}";
    ctx_describe(good, strlen(good), &out);
    CHECK_STR(out.data, "{\"window_start\":9,\"summary\":\"caf\xc3\xa9\",\"summary_covers\":7}");
    pbuf_free(&out);
}

static void test_summary_input_clipped(void)
{
    ctx_window w;
    pbuf h = PBUF_INIT;
    window_of(&w, &h, "");
    pbuf_puts(&w.dropped, U("old and long") A("answer"));
    for (int i = 0; i < 40; i++)
        pbuf_puts(&w.dropped, U("a middle turn of the conversation") A("its answer"));
    pbuf_puts(&w.dropped, U("newest") A("last"));
    char *in = ctx_summary_input(&w, 600);
    CHECK(in && strstr(in, "[older turns omitted]") && strstr(in, "assistant: last"));
    CHECK(in && !strstr(in, "old and long"));
    free(in);
    in = ctx_summary_input(&w, 100000);
    CHECK(in && strstr(in, "user: old and long") && strstr(in, "(none)"));
    free(in);
    ctx_window_free(&w);
    pbuf_free(&h);
}

static void test_factor_per_model(void)
{
    ctx_agent a;
    memset(&a, 0, sizeof a);
    ctx_model *big = ctx_model_of(&a, "big"), *small = ctx_model_of(&a, "small");
    CHECK(big != small && ctx_model_of(&a, "big") == big);
    ctx_learn_factor(big, 4000, 1500);  /* the server counts 1.5 per estimated token */
    ctx_learn_factor(small, 4000, 800); /* and 0.8 here */
    CHECK(big->factor > 1.4 && big->factor < 1.6);
    CHECK(small->factor > 0.7 && small->factor < 0.9);
    for (int i = 0; i < CTX_MODELS; i++) { /* more models than slots: the oldest goes */
        char name[16];
        snprintf(name, sizeof name, "m%d", i);
        CHECK(ctx_model_of(&a, name)->factor == 0);
    }
    CHECK(ctx_model_of(&a, "big")->factor == 0);
}

int main(void)
{
    test_factor_per_model();
    test_split_whole_turns();
    test_plan_low_mark();
    test_next_summary_takes_the_cut();
    test_records_that_do_not_parse();
    test_summary_input_clipped();
    return check_report();
}
