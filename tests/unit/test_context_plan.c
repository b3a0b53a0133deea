/*
 * test_context_plan.c -- the context engine's pure parts (context/window.h):
 * whole turns found in stored text whatever the strings hold, the plan's low
 * mark, cuts, the summary made ahead taking the cut turns' place, records
 * that do not parse (a conversation goes on from scratch, never a crash), and
 * turn sizes: kept with each turn in the store, loaded with the window and
 * counted instead of the byte estimate (which a turn without one falls back to).
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "context/window.h"
#include "lib/buf.h"
#include "store/store.h"

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
    b.idle_ms = CTX_IDLE_CUT_MS;
    w.life.last_message_ms = 1000;
    CHECK(ctx_plan(&w, &b, 100, 1000 + CTX_IDLE_CUT_MS, 0, &why) == 0 && why == CTX_CUT_NONE);
    b.max_turns = 8; /* 5 turns, within the bound: only the pause cuts, to the low mark of 8 */
    CHECK(ctx_plan(&w, &b, 100, 1000 + CTX_IDLE_CUT_MS, 0, &why) == 0 && why == CTX_CUT_NONE);
    n = ctx_plan(&w, &b, 100, 1000 + CTX_IDLE_CUT_MS + 1, 0, &why);
    CHECK(n == 5 - 8 / CTX_LOW_MARK_DIVISOR && why == CTX_CUT_IDLE); /* keeps 2 */
    b.idle_ms = 0; /* never for a pause */
    CHECK(ctx_plan(&w, &b, 100, 1000 + 10 * CTX_IDLE_CUT_MS, 0, &why) == 0);
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

/* The summary made ahead near the limit covers what the cut will drop when the
 * window has grown to the limit, so that cut keeps a third, not what a cut at
 * the moment of the summary would have kept plus the turns since (about half). */
static void test_ahead_summary_covers_the_cut_to_a_third(void)
{
    ctx_window w;
    pbuf h = PBUF_INIT;
    window_of(&w, &h, "");
    w.summarize = 1;
    ctx_budget b = {.window = 4000, .reserve = 500, .factor = 1.0};
    const char *turn = U("a question of some length, about forty tokens or so in all, "
                         "give or take") A("an answer of some length too, about as long as the "
                                           "question was, more or less");
    size_t ahead = 0, made_at = 0;
    ctx_cut_reason why = CTX_CUT_NONE;
    size_t n = 0;
    for (int i = 0; i < 200 && why == CTX_CUT_NONE; i++) {
        pbuf_puts(&h, turn);
        ctx_window_free(&w);
        memset(&w, 0, sizeof w);
        w.enabled = w.summarize = 1;
        CHECK(ctx_split(&w, &h) == 0);
        if (ahead)
            CHECK(ctx_record_write_next(&w, "so far", ahead) == 0);
        n = ctx_plan(&w, &b, 100, 0, 0, &why);
        if (!ahead && why == CTX_CUT_NONE && (ahead = ctx_ahead_turns(&w, &b, 100)))
            made_at = w.nturns;
    }
    CHECK(why == CTX_CUT_TOKENS && ahead > 0 && made_at < w.nturns);
    int use = 0;
    size_t cut = ctx_cut_for_next(&w, &b, 100, n, &use);
    size_t kept = w.nturns - cut;
    CHECK(use == 1);
    CHECK(kept * 10 <= w.nturns * 4); /* a third (and a turn): it kept about half before */
    if (!(kept * 10 <= w.nturns * 4))
        fprintf(stderr, "  made ahead at %zu turns for %zu; cut at %zu kept %zu\n", made_at, ahead,
                w.nturns, kept);
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

/* A field of a record read either whole, as Parley writes it, or not at all
 * (fuzz_context_record): no hash from the digits before a stray byte, no
 * negative position read as a huge one. */
static void test_record_fields_whole_or_none(void)
{
    const char *recs[] = {
        "{\"start\":3,\"lp\":1,\"lb\":2,\"plen\":3,\"phash\":\"00c0ffee123$5678\"}",
        "{\"start\":3,\"lp\":1,\"lb\":2,\"plen\":3,\"phash\":\"zz\"}",
        "{\"start\":3,\"lp\":1,\"lb\":2,\"plen\":3,\"phash\":\" 123456789abcdef\"}",
        "{\"start\":3,\"lp\":1,\"lb\":2,\"plen\":-3,\"phash\":\"0123456789abcdef\"}",
        "{\"start\":3,\"next\":\"ahead\",\"next_upto\":-1}",
    };
    for (size_t i = 0; i < sizeof recs / sizeof recs[0]; i++) {
        ctx_record r;
        ctx_record_parse(recs[i], strlen(recs[i]), &r);
        CHECK(r.start == 3 && !r.prefix_len && !r.prefix_hash);
        CHECK(!r.summary && !r.upto && !r.next && !r.next_upto);
        if (r.prefix_hash || r.summary || r.next)
            fprintf(stderr, "record %zu half read\n", i);
        free(r.summary);
        free(r.next);
    }
    ctx_record r; /* upper-case digits are still the hash */
    const char *upper = "{\"start\":3,\"lp\":1,\"lb\":2,\"plen\":3,\"phash\":\"0123456789ABCDEF\"}";
    ctx_record_parse(upper, strlen(upper), &r);
    CHECK(r.prefix_len == 3 && r.prefix_hash == 0x0123456789abcdefULL);
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

#define FORTY "the quick brown fox jumps over the lazy "

/* Append turn n of "c": messages `spec` ("u:text|a:text|..."), stored with `tokens`. */
static void put_turn(store *s, unsigned n, const char *spec, uint32_t tokens)
{
    char tid[37], mids[4][37], json[4][256];
    store_message m[4];
    size_t count = 0;
    snprintf(tid, sizeof tid, "%08x-0000-4000-8000-000000000000", n);
    for (const char *p = spec; *p && count < 4; count++) {
        const char *bar = strchr(p, '|');
        int len = bar ? (int)(bar - p - 2) : (int)strlen(p + 2);
        const char *role = *p == 'u' ? "user" : "assistant";
        snprintf(json[count], sizeof json[count], "{\"role\":\"%s\",\"content\":\"%.*s\"}", role,
                 len, p + 2);
        snprintf(mids[count], sizeof mids[count], "%08x-1111-4000-8000-%012zx", n, count);
        m[count] = (store_message){.message_id = mids[count],
                                   .role = role,
                                   .created_ms = 1000 + n,
                                   .json = json[count],
                                   .json_len = strlen(json[count])};
        p = bar ? bar + 1 : p + strlen(p);
    }
    store_turn t = {tid, 1000 + n, 1000 + n, m, count, NULL, 0, tokens};
    store_key key = {"c", "", ""};
    CHECK(store_append(s, &key, &t, 1000 + n, NULL) == PARLEY_OK);
}

static void test_turn_sizes_from_the_store(void)
{
    store_config cfg = {.location = "", .limits = {0, 10, 0}};
    store *s = NULL;
    CHECK(store_open(&store_memory_backend, &cfg, &s, NULL) == PARLEY_OK);
    if (!s)
        return;
    /* What a commit stores: the bytes ("m,") times the factor; nothing while none is learned. */
    const char *hi = "{\"role\":\"user\",\"content\":\"hi\"}";
    store_message one = {"x", "user", 1, hi, strlen(hi), NULL, NULL, 0};
    CHECK(ctx_turn_tokens(&one, 1, 0) == 0);
    CHECK(ctx_turn_tokens(&one, 1, 1.0) == ctx_tokens(strlen(hi) + 1, 1.0));
    CHECK(ctx_turn_tokens(&one, 1, 2.0) == ctx_tokens(strlen(hi) + 1, 2.0));
    put_turn(s, 1, "u:one|a:1", 0);     /* stored without a size */
    put_turn(s, 2, "u:two|a:2", 200);   /* a turn the server counted large */
    put_turn(s, 3, "a:announced", 40);  /* an announcement: a stored turn inside turn 2 */
    put_turn(s, 4, "u:four|a:4", 50);
    store_key key = {"c", "", ""};
    ctx_window w;
    memset(&w, 0, sizeof w);
    pbuf h = PBUF_INIT;
    size_t n = 0;
    CHECK(ctx_load(s, &key, 0, 0, 2000, &h, &n, &w, NULL) == PARLEY_OK);
    CHECK(n == 7 && w.nturns == 3);
    CHECK(w.tokens && w.tokens[0] == 0 && w.tokens[1] == 240 && w.tokens[2] == 50);
    /* Counted as stored: 240 + 50 + turn 1's bytes estimated, far over what
     * the bytes alone say (under 100 tokens): a 300-token budget cuts. */
    ctx_budget b = {.window = 300, .reserve = 0, .max_turns = 0, .factor = 1.0};
    int64_t body = ctx_tokens(h.len, 1.0) + 20; /* the history and a little more */
    ctx_cut_reason why;
    size_t cut = ctx_plan(&w, &b, body, 2000, 0, &why);
    CHECK(why == CTX_CUT_TOKENS && cut == 2);         /* down to the low mark: only turn 4 fits */
    memset(w.tokens, 0, w.nturns * sizeof *w.tokens); /* the estimate alone: no cut */
    CHECK(ctx_plan(&w, &b, body, 2000, 0, &why) == 0 && why == CTX_CUT_NONE);
    ctx_window_free(&w);
    /* Cut from the front: the sizes move with their turns. */
    memset(&w, 0, sizeof w);
    pbuf_reset(&h);
    CHECK(ctx_load(s, &key, 0, 0, 2000, &h, &n, &w, NULL) == PARLEY_OK);
    CHECK(ctx_cut(&w, &h, 1, CTX_CUT_TOKENS) == 2);
    CHECK(w.nturns == 2 && w.tokens[0] == 240 && w.tokens[1] == 50);
    ctx_window_free(&w);
    /* A window that starts inside the loaded text (its record's start) lines up too. */
    memset(&w, 0, sizeof w);
    pbuf_reset(&h);
    CHECK(store_context_set(s, &key, "{\"start\":2}", 11, NULL, 0, 2000, NULL) == PARLEY_OK);
    CHECK(ctx_load(s, &key, 0, 0, 2000, &h, &n, &w, NULL) == PARLEY_OK);
    CHECK(n == 5 && w.nturns == 2 && w.tokens[0] == 240 && w.tokens[1] == 50);
    ctx_window_free(&w);
    /* A start that splits a stored turn (not one Parley writes): that turn is estimated. */
    memset(&w, 0, sizeof w);
    pbuf_reset(&h);
    CHECK(store_context_set(s, &key, "{\"start\":3}", 11, NULL, 0, 2000, NULL) == PARLEY_OK);
    CHECK(ctx_load(s, &key, 0, 0, 2000, &h, &n, &w, NULL) == PARLEY_OK);
    CHECK(n == 4 && w.nturns == 2 && w.tokens[0] == 0 && w.tokens[1] == 50);
    ctx_window_free(&w);
    /* A size no factor Parley learns gives the turn's bytes (an edited file), too
     * large or too small: estimated, not trusted into a cut or an overflow. */
    put_turn(s, 5, "u:five|a:5", 8388607);
    put_turn(s, 6, "u:six " FORTY FORTY FORTY FORTY "|a:6", 1);
    put_turn(s, 7, "u:seven|a:7", 150);
    memset(&w, 0, sizeof w);
    pbuf_reset(&h);
    CHECK(ctx_load(s, &key, 0, 0, 2000, &h, &n, &w, NULL) == PARLEY_OK);
    CHECK(w.nturns == 5 && w.tokens[2] == 0 && w.tokens[3] == 0 && w.tokens[4] == 150);
    ctx_window_free(&w);
    pbuf_free(&h);
    store_close(s);
}

/* FNV-1a one byte at a time, as the stored records' "phash" were made. */
static uint64_t fnv_ref(const char *const *parts, const size_t *lens, size_t nparts, uint64_t limit,
                        uint64_t *len)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    *len = 0;
    for (size_t k = 0; k < nparts; k++)
        for (size_t i = 0; i < lens[k] && *len < limit; i++, ++*len)
            h = (h ^ (unsigned char)parts[k][i]) * 0x100000001b3ULL;
    return h ? h : 1;
}

/* The prefix hash is the records' FNV-1a whatever the lengths (the tails of
 * an unrolled loop) and wherever a stored length stops the check. */
static void test_prefix_hash_is_fnv1a(void)
{
    char text[200];
    unsigned seed = 7;
    for (size_t i = 0; i < sizeof text; i++)
        text[i] = (char)(1 + (seed = seed * 1103515245u + 12345u) % 255);
    for (size_t pl = 0; pl < 20; pl += 3)
        for (size_t tl = 0; tl < 12; tl += 5)
            for (size_t hl = 0; hl < 40; hl++) {
                char prompt[32], tools[16];
                memcpy(prompt, text, pl);
                prompt[pl] = '\0';
                memcpy(tools, text + 40, tl);
                tools[tl] = '\0';
                const char *parts[] = {prompt, "\x1e", tools, "\x1e", text + 60, text + 120};
                size_t lens[] = {pl, 1, tl, 1, hl, hl / 3};
                ctx_window w = {0};
                uint64_t len, h = fnv_ref(parts, lens, 6, UINT64_MAX, &len);
                ctx_set_prefix(&w, prompt, tools, text + 60, hl, text + 120, hl / 3);
                CHECK(w.rec.prefix_len == len && w.rec.prefix_hash == h);
                /* the next turn: its history is this one's plus the turn */
                char next[80] = {0};
                memcpy(next, text + 60, hl);
                memcpy(next + hl, text + 120, hl / 3);
                CHECK(ctx_prefix_kept(&w, prompt, tools, next, hl + hl / 3 + 5));
                if (hl) { /* shorter than the prefix, or a byte of it changed: a break */
                    CHECK(!ctx_prefix_kept(&w, prompt, tools, next, hl + hl / 3 - 1));
                    next[hl - 1] ^= 1;
                    CHECK(!ctx_prefix_kept(&w, prompt, tools, next, hl + hl / 3 + 5));
                }
            }
}

/* The records a window without summaries writes are read without the JSON
 * parser: whatever the numbers and the hash, each reads as the parser reads
 * the same record with a space after its '{' (which only the parser takes). */
static void test_plain_records_read_as_parsed(void)
{
    const char *recs[] = {
        "{\"start\":0}",
        "{\"start\":12345}",
        "{\"start\":7,\"lp\":4000,\"lb\":15000,\"plen\":14321,\"phash\":\"0123456789abcdef\"}",
        "{\"start\":0,\"lp\":0,\"lb\":0,\"plen\":0,\"phash\":\"ffffffffffffffff\"}",
        "{\"start\":999999999999999999,\"lp\":1,\"lb\":2,\"plen\":3,\"phash\":\"00000000000000a1\"}",
        "{\"start\":9223372036854775807}",
        "{\"start\":9223372036854775808}",
        "{\"start\":1234567890123456789}",
        "{\"start\":012}",
        "{\"start\":00}",
        "{\"start\":-1}",
        "{\"start\":1.5}",
        "{\"start\":3} ",
        "{\"start\":3}x",
        "{\"start\":3,\"start\":4}",
        "{\"start\":3,\"lp\":1,\"lb\":2,\"plen\":3,\"phash\":\"0123456789ABCDEF\"}",
        "{\"start\":3,\"lp\":1,\"lb\":2,\"plen\":3,\"phash\":\"0123456789abcde\"}",
        "{\"start\":3,\"lp\":1,\"lb\":2,\"plen\":3,\"phash\":\"0123456789abcdef0\"}",
        "{\"start\":3,\"lp\":1,\"lb\":2,\"plen\":3}",
        "{\"start\":3,\"lp\":1,\"lb\":-2,\"plen\":3,\"phash\":\"0123456789abcdef\"}",
        "{\"start\":3,\"lp\":1,\"lb\":2,\"plen\":3,\"phash\":\"0123456789abcdef\",\"x\":1}",
        "{\"start\":3,\"summary\":\"s\",\"upto\":2}",
        "{\"start\":3",
        "{\"start\":",
    };
    for (size_t i = 0; i < sizeof recs / sizeof recs[0]; i++) {
        char spaced[256];
        snprintf(spaced, sizeof spaced, "{ %s", recs[i] + 1);
        ctx_record a, b;
        ctx_record_parse(recs[i], strlen(recs[i]), &a);
        ctx_record_parse(spaced, strlen(spaced), &b);
        CHECK(a.start == b.start && a.upto == b.upto && a.next_upto == b.next_upto);
        CHECK(a.last_prompt == b.last_prompt && a.last_bytes == b.last_bytes);
        CHECK(a.prefix_len == b.prefix_len && a.prefix_hash == b.prefix_hash);
        CHECK(!a.summary == !b.summary && !a.next == !b.next);
        if (a.start != b.start || a.prefix_hash != b.prefix_hash)
            fprintf(stderr, "record %zu reads apart\n", i);
        free(a.summary);
        free(a.next);
        free(b.summary);
        free(b.next);
    }
    ctx_record r;
    const char *written = recs[2];
    ctx_record_parse(written, strlen(written), &r);
    CHECK(r.start == 7 && r.last_prompt == 4000 && r.last_bytes == 15000 && r.prefix_len == 14321 &&
          r.prefix_hash == 0x0123456789abcdefULL);
}

/* The commit goes on from the check's hash after the history only when it is
 * the same history: the stored hash is FNV-1a of what the commit names, also
 * after the history held was changed in place and found again (a load). */
static void test_commit_hash_after_the_check(void)
{
    ctx_window w;
    pbuf h = PBUF_INIT;
    window_of(&w, &h, U("one") A("a") U("two") A("b"));
    const char *turn = U("three") A("c");
    size_t tl = strlen(turn);
    ctx_set_prefix(&w, "prompt", "[]", h.data, h.len, turn, tl); /* a longer earlier prefix */
    for (int round = 0; round < 3; round++) {
        ctx_prefix_kept(&w, "prompt", "[]", h.data, h.len);
        CHECK(w.memo.valid);
        pbuf other = PBUF_INIT;
        if (round == 1) { /* the same length elsewhere, other bytes */
            pbuf_append(&other, h.data, h.len);
            other.data[3] ^= 1;
        }
        if (round == 2) { /* changed in place, then split again as a load does */
            h.data[h.len - 3] = 'X';
            CHECK(ctx_split(&w, &h) == 0);
        }
        const char *hist = round == 1 ? other.data : h.data;
        const char *parts[] = {"prompt", "\x1e", "[]", "\x1e", hist, turn};
        size_t lens[] = {6, 1, 2, 1, h.len, tl};
        uint64_t len, want = fnv_ref(parts, lens, 6, UINT64_MAX, &len);
        ctx_set_prefix(&w, "prompt", "[]", hist, h.len, turn, tl);
        CHECK(w.rec.prefix_len == len && w.rec.prefix_hash == want);
        pbuf_free(&other);
    }
    /* a check that stopped short of the history's end: nothing kept for the commit */
    w.rec.prefix_len = 5;
    ctx_prefix_kept(&w, "prompt", "[]", h.data, h.len);
    CHECK(!w.memo.valid);
    ctx_window_free(&w);
    pbuf_free(&h);
}

/* A record (JSON, as older Parleys wrote it) whose parse ran out of memory is -1, never a
 * record read without its summary: the turn would write that back and lose the summary
 * for good.  jansson's first allocation failing sets no error code at all (lib/json_oom.h). */
static void *no_malloc(size_t n)
{
    (void)n;
    return NULL;
}

static void test_record_out_of_memory_keeps_the_summary(void)
{
    const char *rec = "{\"start\":3,\"summary\":\"Lamps.\",\"upto\":2}";
    ctx_record r;
    json_set_alloc_funcs(no_malloc, free);
    int rc = ctx_record_parse(rec, strlen(rec), &r);
    json_set_alloc_funcs(malloc, free);
    CHECK(rc == -1);
    free(r.summary);
    free(r.next);
}

int main(void)
{
    test_record_out_of_memory_keeps_the_summary();
    test_commit_hash_after_the_check();
    test_plain_records_read_as_parsed();
    test_prefix_hash_is_fnv1a();
    test_turn_sizes_from_the_store();
    test_factor_per_model();
    test_split_whole_turns();
    test_plan_low_mark();
    test_next_summary_takes_the_cut();
    test_ahead_summary_covers_the_cut_to_a_third();
    test_records_that_do_not_parse();
    test_record_fields_whole_or_none();
    test_summary_input_clipped();
    return check_report();
}
