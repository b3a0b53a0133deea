"""The context engine: a token budget and a cache-stable window (docs/history.md,
"How the context is built").

What the plugin sent is read from the fake server's request log.  A request
"extends" the one before it when the earlier request's messages (and tools)
are a prefix of its own: the server's prefix cache then reads only the new
part.  The only requests allowed not to extend the one before are the first
requests of turns where the window moved (a planned cut, counted in the
metric context_cuts); the window then starts at a later whole turn.
"""
import json
import os
import sqlite3
import tempfile
import time
import unittest

from harness import SLOW, FakeLLM, InteractiveShim, ParleyTestCase, messages, options, run_shim
from redis_server import RedisServer

TOOLS = [
    {"name": "get_temp", "description": "Temperature of a room",
     "parameters": {"type": "object", "properties": {"room": {"type": "string"}}},
     "result": {"celsius": 21}},
]

FILLER = "the quick brown fox jumps over the lazy dog "


def text_of(k):
    """Turn k's message: mixed lengths, a tool call every fifth turn."""
    words = FILLER * ((k * 37) % 23)
    tool = ' [[tool:get_temp {"room":"r%d"}]]' % k if k % 5 == 0 else ""
    return "turn %d %s%s" % (k, words, tool)


def prompt_tokens(request):
    """The prompt's tokens as the fake server's prompt model counted them."""
    return request["prompt_tokens"]


def extends(prev, cur):
    p, c = prev["body"], cur["body"]
    if {k: v for k, v in p.items() if k != "messages"} != \
            {k: v for k, v in c.items() if k != "messages"}:
        return False
    pm, cm = messages(prev), messages(cur)
    return len(cm) > len(pm) and cm[:len(pm)] == pm


def breaks(requests):
    """Indexes of the requests that do not extend the one before."""
    return [i for i in range(1, len(requests)) if not extends(requests[i - 1], requests[i])]


SUMMARY_SYSTEM = "You keep a running summary"


AHEAD = "Before the conversation goes on: write the summary"


def is_summary(request):
    """A summary's request: made ahead of a cut (the conversation's own
    request plus the instruction), or from the transcript of cut turns."""
    msgs = request["body"].get("messages") or []
    last = msgs[-1].get("content") if msgs else None
    if isinstance(last, list):  # Anthropic blocks
        last = last[-1].get("text") if last else None
    if isinstance(last, str) and last.startswith(AHEAD):
        return True
    system = request["body"].get("system")  # Anthropic: text or blocks
    if isinstance(system, list):
        system = system[0].get("text", "") if system else ""
    if system is None:
        system = messages(request)[0]["content"]
    return isinstance(system, str) and system.startswith(SUMMARY_SYSTEM)


def chat(llm):
    """The conversation's requests (not the summaries' requests), in order."""
    return [r for r in llm.chat_requests() if not is_summary(r)]


def summaries(llm):
    return [r for r in llm.chat_requests() if is_summary(r)]


def metrics_of(run):
    return [l for l in run.lines if l.get("op") == "metrics"][-1]["result"]


class ContextCase(ParleyTestCase):
    maxDiff = None

    def setUp(self):
        self.llm = FakeLLM()
        self.addCleanup(self.llm.close)

    def check_window_moves(self, reqs, cuts, summaries_made=0):
        """Every request extends the one before, but at planned moves: the
        `cuts`, and the turn after each summary made (its summary changed),
        each at a turn's first request, keeping whole later turns."""
        firsts = {i for i, r in enumerate(reqs) if messages(r)[-1]["role"] == "user"}
        moved = breaks(reqs)
        if summaries_made:
            self.assertLessEqual(len(moved), cuts + summaries_made, "unplanned cache breaks")
            self.assertGreaterEqual(len(moved), cuts)
        else:
            self.assertEqual(len(moved), cuts, "unplanned cache breaks at requests %r" % moved)
        for i in moved:
            self.assertIn(i, firsts, "request %d broke the prefix inside a turn" % i)
            history = messages(reqs[i])[1:-1]
            before = messages(reqs[i - 1])
            if messages(reqs[i])[0] != before[0] and history and history[0] in before:
                continue  # a new summary, and perhaps a cut with it
            if not history:
                continue
            # The window now starts at a user message the previous request held:
            # whole turns were dropped from its front, nothing else changed.
            self.assertEqual(history[0]["role"], "user")
            at = before.index(history[0])
            self.assertEqual(before[at:], history[:len(before) - at])


class Budget(ContextCase):
    def test_200_turns_with_tools_stay_within_budget_and_cache(self):
        window, max_tokens = 3000, 200
        o = options(self.llm, context_window=window, max_tokens=max_tokens)
        lines = [{"text": text_of(k), "conversation_id": "long"} for k in range(1, 201)]
        lines.append({"op": "metrics"})
        run = self.run_ok(lines, o, tools=TOOLS, timeout=240)
        results = run.turn_lines()
        self.assertEqual(len(results), 200)
        for r in results:
            self.assertTurnOk(r)
        reqs = chat(self.llm)
        self.assertEqual(len(reqs), 200 + 40)  # a tool round on every fifth turn
        over = [(i, prompt_tokens(r)) for i, r in enumerate(reqs)
                if prompt_tokens(r) > window - max_tokens]
        self.assertEqual(over, [], "requests over the budget")

        m = metrics_of(run)
        cuts = m["context_cuts"]
        self.assertGreater(cuts, 5)       # the budget did move the window
        self.assertLess(cuts, 60)         # ... but not every turn
        # one per cut, made ahead of it (one more may wait for the next cut, or still run)
        self.assertGreaterEqual(m["summaries_made"], cuts - 1)
        self.assertLessEqual(m["summaries_made"], cuts + 1)
        self.assertEqual(m["summaries_failed"], 0)
        self.assertEqual(m["cache_breaks"], 0)
        over = [(i, prompt_tokens(r)) for i, r in enumerate(summaries(self.llm))
                if prompt_tokens(r) > window]
        self.assertEqual(over, [], "summary requests over the window")
        self.check_window_moves(reqs, cuts, m["summaries_made"])

    def test_turn_bound_cuts_to_a_third(self):
        o = options(self.llm, max_history_turns=6, summarize=False)
        lines = [{"text": "short %d" % k, "conversation_id": "c"} for k in range(1, 16)]
        lines.append({"op": "metrics"})
        run = self.run_ok(lines, o)
        reqs = self.llm.chat_requests()
        sent = [(len(messages(r)) - 2) // 2 for r in reqs]  # history turns per request
        # grows to 6, cut to 2 (a third of 6) when a 7th would be sent, grows again
        self.assertEqual(sent, [0, 1, 2, 3, 4, 5, 6, 2, 3, 4, 5, 6, 2, 3, 4])
        self.assertEqual(metrics_of(run)["context_cuts"], 2)
        self.check_window_moves(reqs, 2)


class Persistence(ContextCase):
    def test_restart_keeps_the_window_start_on_sqlite(self):
        with tempfile.TemporaryDirectory(prefix="parley-ctx-") as d:
            o = options(self.llm, max_history_turns=4, summarize=False,
                        history_store="sqlite:" + os.path.join(d, "h.db"))
            first = [{"text": "before %d" % k, "conversation_id": "r"} for k in range(1, 8)]
            run = self.run_ok(first + [{"op": "metrics"}], o)
            self.assertEqual(metrics_of(run)["context_cuts"], 1)  # at turn 6: 5 > 4, kept 1
            run = self.run_ok([{"text": "after", "conversation_id": "r"}, {"op": "metrics"}], o)
            self.assertEqual(metrics_of(run)["context_cuts"], 0)
            self.assertEqual(metrics_of(run)["cache_breaks"], 0)
        reqs = self.llm.chat_requests()
        self.assertEqual(len(reqs), 8)
        # The request after the restart extends the last one before it: the
        # window kept its start (turn 5), it did not start over at turn 1.
        self.assertTrue(extends(reqs[6], reqs[7]), messages(reqs[7]))
        self.assertEqual(messages(reqs[7])[1]["content"], "before 5")

    def test_restart_counts_the_history_by_its_stored_sizes(self):
        """Each turn keeps its size in tokens: after a restart, before the new
        agent has learned anything from the server, the window counts the
        history as the server did, not at 4 bytes a token.  Non-ASCII text
        counts one token a byte in the fake's tokenizer (about 4 x the estimate)."""
        text = "\u043f\u0440\u0438\u0432\u0435\u0442 " * 25  # 300 bytes: ~300 tokens
        with tempfile.TemporaryDirectory(prefix="parley-ctx-") as d:
            store = "sqlite:" + os.path.join(d, "h.db")
            o = options(self.llm, summarize=False, max_history_turns=0, history_store=store)
            lines = [{"text": "%d %s" % (k, text), "conversation_id": "z"} for k in range(1, 9)]
            run = self.run_ok(lines + [{"op": "history", "conversation_id": "z"}], o)
            turns = run.lines[-1]["result"]["turns"]
            self.assertEqual(len(turns), 8)
            for t in turns:  # each with its size, well above its bytes / 4
                size = len(json.dumps(t["messages"], ensure_ascii=False).encode())
                self.assertGreater(t["tokens"], size / 4 * 1.5, t)
            # The agent restarts against a server with a 4000-token window, which
            # the history alone (8 turns of ~600 tokens) does not fit.
            with FakeLLM("--n-ctx", "4000") as small:
                o = options(small, summarize=False, max_history_turns=0, history_store=store,
                            context_window=4000, max_tokens=100)
                run = self.run_ok([{"text": "after", "conversation_id": "z"},
                                   {"op": "metrics"}], o)
                self.assertTurnOk(run.turn_lines()[0])
                m = metrics_of(run)
                # the cut was planned before the first request: nothing refused
                self.assertEqual((m["context_cuts"], m["context_overflows_recovered"]), (1, 0))
                [req] = small.chat_requests()
                self.assertFalse(req.get("overflow"))
                self.assertLessEqual(prompt_tokens(req), 4000 - 100)

    def test_stored_sizes_parley_could_not_have_written_are_estimated(self):
        """A stored size no factor Parley learns could give the turn's bytes (an
        edited file: 2^23-1 tokens for a turn of a few hundred bytes, or 1) is
        unknown: the turn is estimated from its bytes, not cut (all the history
        dropped for nothing) nor trusted into a refusal."""
        for size in (2 ** 23 - 1, 1):
            with self.subTest(size=size), \
                    tempfile.TemporaryDirectory(prefix="parley-ctx-") as d:
                path = os.path.join(d, "h.db")
                o = options(self.llm, summarize=False, max_history_turns=0,
                            history_store="sqlite:" + path, context_window=4000, max_tokens=100)
                self.run_ok([{"text": "%d %s" % (k, FILLER * (2 + 2 * k)),
                              "conversation_id": "z"} for k in range(1, 9)], o)
                db = sqlite3.connect(path)
                db.execute("UPDATE turns SET tokens = ?", (size,))
                db.commit()
                db.close()
                with FakeLLM("--n-ctx", "4000") as fresh:
                    o = dict(o, base_url=fresh.base_url)
                    run = self.run_ok([{"text": "after", "conversation_id": "z"},
                                       {"op": "metrics"}], o)
                    self.assertTurnOk(run.turn_lines()[0])
                    m = metrics_of(run)
                    self.assertEqual((m["context_cuts"], m["context_overflows_recovered"]), (0, 0))
                    [req] = fresh.chat_requests()
                    self.assertEqual(len(messages(req)), 1 + 2 * 8 + 1)  # all the history

    def test_a_changed_prompt_is_a_cache_break(self):
        with tempfile.TemporaryDirectory(prefix="parley-ctx-") as d:
            o = options(self.llm, history_store="sqlite:" + os.path.join(d, "h.db"))
            self.run_ok([{"text": "one", "conversation_id": "p"}], o)
            o["prompt"] = "You are another assistant."  # the engine did not plan this
            run = self.run_ok([{"text": "two", "conversation_id": "p"},
                               {"text": "three", "conversation_id": "p"}, {"op": "metrics"}], o)
            self.assertEqual(metrics_of(run)["cache_breaks"], 1)
            # not an extra_system_prompt that changes from one turn to the next: it comes
            # after the history (VolatileAfterStable)
            run = self.run_ok([{"text": "a", "conversation_id": "p", "extra_system_prompt": "x"},
                               {"text": "b", "conversation_id": "p", "extra_system_prompt": "y"},
                               {"op": "metrics"}], o)
            self.assertEqual(metrics_of(run)["cache_breaks"], 0)

    def test_shared_on_redis(self):
        redis = RedisServer("ctx-pw")
        self.addCleanup(redis.stop)
        o = options(self.llm, max_history_turns=4, history_store=redis.url, summarize=False)
        a, b = InteractiveShim(o), InteractiveShim(o)
        self.addCleanup(a.close)
        self.addCleanup(b.close)
        for k in range(12):
            host = a if k % 2 == 0 else b
            self.assertTurnOk(host.turn({"text": "shared %d" % k, "conversation_id": "s"}))
        ma, mb = a.op("metrics")["result"], b.op("metrics")["result"]
        cuts = ma["context_cuts"] + mb["context_cuts"]
        self.assertEqual(ma["cache_breaks"] + mb["cache_breaks"], 0)  # across hosts too
        reqs = self.llm.chat_requests()
        self.assertEqual(len(reqs), 12)
        self.assertEqual(cuts, 2)  # at turns 6 and 10 (index 5, 9): 5 > 4, kept 1
        self.check_window_moves(reqs, cuts)
        # each turn's size is stored with it, whichever host wrote it
        turns = a.op("history", conversation_id="s")["result"]["turns"]
        self.assertEqual(len(turns), 12)
        self.assertEqual([t for t in turns if not t.get("tokens")], [])


class IdleGap(ContextCase):
    """A turn after a pause longer than the server keeps a prompt cached
    (prompt_cache_ttl_ms) finds the cache gone: a free moment to cut the
    window down to its low mark, though it is within the bound."""

    def conversation(self, fake, ttl_ms, pause_s):
        o = options(fake, max_history_turns=10, summarize=False, prompt_cache_ttl_ms=ttl_ms)
        sh = InteractiveShim(o)
        self.addCleanup(sh.close)
        for k in range(1, 9):
            self.assertTurnOk(sh.turn({"text": "turn %d" % k, "conversation_id": "i"}))
        time.sleep(pause_s)
        self.assertTurnOk(sh.turn({"text": "after the pause", "conversation_id": "i"}))
        reqs = fake.chat_requests()
        self.assertEqual(len(reqs), 9)
        history = messages(reqs[8])[1:-1]  # what turn 9 sent between the prompt and its message
        return sh.op("metrics")["result"], reqs, history

    def test_a_pause_past_the_cache_lifetime_cuts_deeper(self):
        ttl = int(1000 * SLOW)  # turns 1-8 come well within it; the pause is longer
        m, reqs, history = self.conversation(self.llm, ttl, 1.5 * ttl / 1000)
        self.assertEqual((m["context_cuts"], m["cache_breaks"]), (1, 0))
        # 8 turns of history are within the bound of 10: only the pause cut them,
        # whole oldest turns, down to the low mark
        self.assertLess(len(history) // 2, 8)
        self.assertGreater(len(history), 0)
        self.assertEqual(history[0]["role"], "user")
        self.assertNotEqual(history[0]["content"], "turn 1")
        self.check_window_moves(reqs, 1)

    def test_no_cut_within_the_lifetime_or_when_off(self):
        for ttl, pause in ((int(60000 * SLOW), 1.0), (0, 1.0)):
            with self.subTest(prompt_cache_ttl_ms=ttl), FakeLLM() as fake:
                m, reqs, history = self.conversation(fake, ttl, pause)
                self.assertEqual(m["context_cuts"], 0)
                self.assertEqual(len(history) // 2, 8)  # all eight, from turn 1
                self.assertEqual(history[0]["content"], "turn 1")
                self.check_window_moves(reqs, 0)


class VolatileAfterStable(ContextCase):
    """What changes from turn to turn (extra_system_prompt: Home Assistant's time and
    states) goes after the stable prefix -- system prompt, tools, summary, history -- in the
    turn's own user message (docs/history.md, "How the context is built"), so a changed
    one costs the server only the last turn's tail, never the conversation."""

    CASES = (("llamacpp", "openai"), ("anthropic", "anthropic"))

    def cached_run(self, cache, provider, lines, tools=None):
        # a low Anthropic minimum: the test's prompts are short
        fake = FakeLLM("--cache", cache, "--cache-min", "64")
        self.addCleanup(fake.close)
        base = fake.base_url if provider == "openai" else "http://127.0.0.1:%d" % fake.port
        o = options(fake, provider=provider, base_url=base, summarize=False)
        run = self.run_ok(lines + [{"op": "metrics"}], o, tools=tools)
        for line in run.turn_lines():
            self.assertTurnOk(line)
        return run, [r for r in fake.requests() if "prompt_tokens" in r]

    def test_a_changed_extra_prompt_is_read_from_the_cache(self):
        lines = [{"text": "turn %d %s" % (k, FILLER * 8), "conversation_id": "x",
                  "extra_system_prompt": "Current time is 10:%02d." % k} for k in range(6)]
        for cache, provider in self.CASES:
            with self.subTest(cache=cache):
                run, reqs = self.cached_run(cache, provider, lines)
                self.assertEqual(len(reqs), 6)
                self.assertEqual(metrics_of(run)["cache_breaks"], 0)
                for k in range(1, 6):
                    prev, cur = reqs[k - 1], reqs[k]
                    # the server reads from its cache all of the previous request up to its
                    # user's text: all but that turn's note (about 30 tokens) and the end
                    # markers (the prompt model's, about 12); llama.cpp reads the answer it
                    # generated after the note again (on main: only the system prompt)
                    self.assertGreaterEqual(cur["cached_tokens"], prev["prompt_tokens"] - 50,
                                            (k, cur["cached_tokens"], prev["prompt_tokens"]))

    def test_anthropic_marks_keep_a_tool_loop_in_the_lookback(self):
        # 12 tool calls in one round: 24 blocks, past the 20-block lookback of a mark on
        # the request's last block; never more than 4 marks (the fake refuses a fifth)
        calls = " ".join('[[tool:get_temp {"room":"r%d"}]]' % i for i in range(12))
        lines = [{"text": "first %s" % FILLER * 4, "conversation_id": "t"},
                 {"text": "all rooms %s" % calls, "conversation_id": "t",
                  "extra_system_prompt": "Current time is 10:01."},
                 {"text": "thanks %s" % FILLER, "conversation_id": "t",
                  "extra_system_prompt": "Current time is 10:02."}]
        run, reqs = self.cached_run("anthropic", "anthropic", lines, tools=TOOLS)
        self.assertEqual(len(reqs), 4)  # the tool turn takes two requests
        marks = [json.dumps(r["body"]).count('"cache_control"') for r in reqs]
        self.assertTrue(all(n <= 4 for n in marks), marks)
        first, round1, round2, last = reqs
        # the tool round reads the whole first request of its turn from the cache (but the
        # end markers, about 12 tokens; on main: only the system prompt and tools)
        self.assertGreaterEqual(round2["cached_tokens"], round1["prompt_tokens"] - 15)
        # the next turn reads up to the tool turn's user text (its note, about 25 tokens,
        # is not sent again), 26 blocks back: a mark of its own
        self.assertGreaterEqual(last["cached_tokens"], round1["prompt_tokens"] - 40)


class Summaries(ContextCase):
    def turns(self, o, texts, tools=None, cid="s"):
        lines = [{"text": t, "conversation_id": cid} for t in texts]
        lines += [{"op": "metrics"}, {"op": "query", "conversation_id": cid, "limit": 1},
                  {"op": "history", "conversation_id": cid}]
        return self.run_ok(lines, o, tools=tools)

    def test_made_ahead_with_the_cached_prompt_and_taken_at_the_cut(self):
        o = options(self.llm, max_history_turns=4)
        run = self.turns(o, ["fact %d" % k for k in range(1, 9)])
        m = metrics_of(run)
        self.assertEqual((m["context_cuts"], m["summaries_failed"]), (1, 0))
        reqs, made = chat(self.llm), summaries(self.llm)
        self.assertGreaterEqual(len(made), 1)
        # After turn 4, near the bound: turn 4's own request and answer, then the
        # instruction (the server has all but the instruction cached).
        ahead = messages(made[0])
        turn4 = messages(reqs[3])
        self.assertEqual(ahead[:len(turn4)], turn4)
        self.assertEqual(ahead[len(turn4)]["role"], "assistant")
        self.assertTrue(ahead[-1]["content"].startswith(AHEAD + " of the earlier conversation"))
        self.assertIn("the first 3 exchanges", ahead[-1]["content"])
        # Turn 6 cuts exactly what it covers (turns 1-3) and carries it after the prompt.
        self.assertNotIn("Summary of the earlier", messages(reqs[4])[0]["content"])
        system = messages(reqs[5])[0]["content"]
        self.assertTrue(system.startswith("You are a test assistant.\n\nSummary of the earlier "
                                          "conversation"), system)
        self.assertEqual(messages(reqs[5])[1], {"role": "user", "content": "fact 4"})
        self.assertEqual(messages(reqs[6])[0], messages(reqs[5])[0])  # stable afterwards
        history = run.lines[-1]["result"]
        self.assertEqual(len(history["turns"]), 8)   # every turn kept
        ctx = history["context"]  # history_get: the summary and what it covers (turns 1-3)
        self.assertEqual((ctx["window_start"], ctx["summary_covers"]), (6, 6))
        self.assertIn("first 3 exchanges", ctx["summary"])
        query = [l for l in run.lines if l.get("op") == "query"][-1]["result"]
        self.assertEqual(query["context"], ctx)  # history_query of the conversation too

    def test_transcript_with_another_summary_model(self):
        o = options(self.llm, max_history_turns=4, summary_model="small-model")
        run = self.turns(o, ["fact %d" % k for k in range(1, 9)])
        m = metrics_of(run)
        self.assertEqual((m["context_cuts"], m["summaries_made"], m["summaries_failed"]),
                         (1, 1, 0))
        [req] = summaries(self.llm)
        self.assertEqual(req["body"]["model"], "small-model")
        text = messages(req)[-1]["content"]
        # what left the window (turns 1-4 at turn 6's cut), never the system prompt
        for k in (1, 2, 3, 4):
            self.assertIn("user: fact %d\n" % k, text)
        self.assertNotIn("fact 5", text)
        self.assertNotIn("You are a test assistant", text)
        reqs = chat(self.llm)
        self.assertNotIn("Summary of the earlier conversation", messages(reqs[5])[0]["content"])
        self.assertIn("user: fact 1", messages(reqs[6])[0]["content"])  # from turn 7 on

    def test_cleared_with_the_conversation(self):
        o = options(self.llm, max_history_turns=2)
        lines = [{"text": "fact %d" % k, "conversation_id": "c"} for k in range(1, 6)]
        lines += [{"op": "clear", "conversation_id": "c"}, {"text": "again", "conversation_id": "c"},
                  {"op": "history", "conversation_id": "c"}]
        run = self.run_ok(lines, o)
        self.assertEqual(run.lines[-1]["result"]["context"],
                         {"window_start": 0, "summary": None, "summary_covers": 0})
        self.assertNotIn("Summary of the earlier", messages(chat(self.llm)[-1])[0]["content"])

    def test_a_failing_summary_loses_nothing_and_is_retried(self):
        # A tool result the fake server takes for a fault marker: only the
        # summary's request (whose transcript holds it) fails.
        tools = [{"name": "poison", "description": "x", "result": "[[fault:400]]"}]
        o = options(self.llm, max_history_turns=2, summary_model="small-model")
        texts = ["t1 [[tool:poison {}]]"] + ["t%d" % k for k in range(2, 7)]
        run = self.turns(o, texts, tools=tools)
        for line in run.turn_lines():
            self.assertTurnOk(line)
        m = metrics_of(run)
        self.assertEqual(m["summaries_made"], 0)
        self.assertGreaterEqual(m["summaries_failed"], 2)  # tried again by a later turn
        tried = summaries(self.llm)
        self.assertGreaterEqual(len(tried), 2)
        for req in tried:
            self.assertIn("user: t1 [[tool:poison {}]]", messages(req)[-1]["content"])
        for req in chat(self.llm):
            self.assertNotIn("Summary of the earlier", messages(req)[0]["content"])
        self.assertEqual(len(run.lines[-1]["result"]["turns"]), 6)

    def test_survives_a_restart_on_sqlite(self):
        with tempfile.TemporaryDirectory(prefix="parley-ctx-") as d:
            o = options(self.llm, max_history_turns=4,
                        history_store="sqlite:" + os.path.join(d, "h.db"))
            self.turns(o, ["fact %d" % k for k in range(1, 8)])  # turn 7 waits for 6's summary
            # What the restarted agent reads before its first turn. (Whether turn 7's own
            # summary, still in flight when the first agent was destroyed, was stored or
            # cancelled is a race; destroy() cancels it and a later turn makes it again.
            # So is whether "after" has made one by the metrics line: neither is asserted.)
            run = self.run_ok([{"op": "history", "conversation_id": "s"},
                               {"text": "after", "conversation_id": "s"}], o)
            stored = run.lines[0]["result"]["context"]
            self.assertTrue(stored["summary"])
            self.assertGreaterEqual(stored["summary_covers"], stored["window_start"])
            self.assertGreaterEqual(stored["window_start"], 3)
            self.assertTurnOk(run.turn_lines()[-1])
        reqs = chat(self.llm)
        self.assertIn("Summary of the earlier conversation", messages(reqs[-1])[0]["content"])
        self.assertEqual(messages(reqs[-1])[0], messages(reqs[-2])[0])  # as before the restart

    def test_shared_on_redis(self):
        redis = RedisServer("ctx-pw")
        self.addCleanup(redis.stop)
        o = options(self.llm, max_history_turns=4, history_store=redis.url)
        a, b = InteractiveShim(o), InteractiveShim(o)
        self.addCleanup(a.close)
        self.addCleanup(b.close)
        for k in range(1, 7):
            self.assertTurnOk(a.turn({"text": "fact %d" % k, "conversation_id": "r"}))
        deadline = time.time() + 10 * SLOW
        while a.op("metrics")["result"]["summaries_made"] < 1 and time.time() < deadline:
            time.sleep(0.02)  # made after turn 6 was reported
        self.assertEqual(a.op("metrics")["result"]["summaries_made"], 1)
        self.assertTurnOk(b.turn({"text": "from b", "conversation_id": "r"}))
        reqs = chat(self.llm)
        self.assertIn("Summary of the earlier conversation", messages(reqs[-1])[0]["content"])
        self.assertEqual(messages(reqs[-1])[0], messages(reqs[-2])[0])  # host b sends a's

    def test_off(self):
        o = options(self.llm, max_history_turns=4, summarize=False)
        run = self.turns(o, ["fact %d" % k for k in range(1, 9)])
        self.assertEqual(metrics_of(run)["summaries_made"], 0)
        self.assertEqual(summaries(self.llm), [])


class Hints(ParleyTestCase):
    def test_prompt_cache_key_only_when_asked_or_openai(self):
        for value, sent in ((None, False), (True, True), (False, False)):
            with self.subTest(prompt_cache_key=value), FakeLLM() as fake:
                o = options(fake)
                if value is not None:
                    o["prompt_cache_key"] = value
                self.run_ok([{"text": "hi", "conversation_id": "kitchen-1"}], o)
                body = fake.chat_requests()[0]["body"]
                self.assertEqual(body.get("prompt_cache_key"), "kitchen-1" if sent else None)

    def test_anthropic_breakpoint_moves_with_the_conversation(self):
        with FakeLLM() as fake:
            o = options(fake, provider="anthropic", base_url="http://127.0.0.1:%d" % fake.port)
            lines = [{"text": "turn %d" % k, "conversation_id": "a"} for k in range(1, 4)]
            self.run_ok(lines, o)
            reqs = [r for r in fake.requests() if r.get("path") == "/v1/messages"]
            for k, r in enumerate(reqs):
                marked = [i for i, m in enumerate(r["body"]["messages"])
                          if any("cache_control" in b for b in m["content"])]
                # on the last message of the request: it moves with the conversation
                self.assertEqual(marked, [2 * k])
                marks = json.dumps(r["body"]).count("cache_control")
                self.assertLessEqual(marks, 4)


class Discovery(ParleyTestCase):
    def test_the_window_the_server_names_is_the_budget(self):
        with FakeLLM("--n-ctx", "2000") as fake:
            o = options(fake, context_window=0, max_tokens=100)  # 0: ask the server
            sh = InteractiveShim(o)
            self.addCleanup(sh.close)
            self.assertTurnOk(sh.turn({"text": "hello", "conversation_id": "d"}))
            deadline = time.time() + 10 * SLOW  # the question runs beside the turns
            while not [r for r in fake.requests() if r.get("path") == "/props"]:
                self.assertLess(time.time(), deadline, "no GET /props")
                time.sleep(0.02)
            time.sleep(0.3 * SLOW)  # and its answer is read
            for k in range(1, 16):
                self.assertTurnOk(sh.turn({"text": "turn %d %s" % (k, FILLER * 6),
                                           "conversation_id": "d"}))
            m = sh.op("metrics")["result"]
            reqs = chat(fake)
            # the fallback (4096) would have sent more than 2000 tokens from turn 8 on
            self.assertEqual([r for r in reqs if r.get("overflow")], [])
            self.assertGreater(m["context_cuts"], 0)
            self.assertLessEqual(max(r["prompt_tokens"] for r in reqs), 2000 - 100)


class Overflow(ParleyTestCase):
    """A server that refuses a prompt as too long: Parley learns the window,
    cuts and sends again within the same turn."""

    def conversation(self, fake, provider, turns=14):
        base = fake.base_url if provider == "openai" else "http://127.0.0.1:%d" % fake.port
        # The user claims a window far larger than the server's.
        o = options(fake, provider=provider, base_url=base, context_window=100000,
                    max_tokens=100)
        lines = [{"text": "turn %d %s" % (k, FILLER * 4), "conversation_id": "o"}
                 for k in range(1, turns + 1)]
        return self.run_ok(lines + [{"op": "metrics"}, {"op": "history", "conversation_id": "o"}],
                           o)

    def test_recovered_in_each_dialect(self):
        cases = ((("--overflow-style", "llamacpp"), "openai"),
                 (("--overflow-style", "openai"), "openai"),
                 (("--overflow-style", "vllm"), "openai"),
                 ((), "anthropic"))
        for args, provider in cases:
            with self.subTest(args=args, provider=provider), \
                    FakeLLM("--n-ctx", "1500", *args) as fake:
                run = self.conversation(fake, provider)
                for line in run.turn_lines():
                    self.assertTurnOk(line)
                refused = [r for r in fake.requests() if r.get("overflow")
                           and not is_summary(r)]
                recovered = metrics_of(run)["context_overflows_recovered"]
                self.assertGreaterEqual(recovered, 1)
                self.assertEqual(len(refused), recovered)  # each refusal, sent again once
                # The window was learned: one refusal, then the budget holds.
                self.assertEqual(recovered, 1)
                history = [l for l in run.lines if l.get("op") == "history"][-1]
                self.assertEqual(len(history["result"]["turns"]), 14)  # nothing lost

    def test_ollama_silent_truncation_recovered(self):
        with FakeLLM("--n-ctx", "1500") as fake:
            run = self.conversation(fake, "ollama")
            for line in run.turn_lines():
                self.assertTurnOk(line)
            chats = [r for r in fake.requests() if r.get("path") == "/api/chat"]
            cut = [r for r in chats if r.get("truncated_messages")]
            self.assertGreaterEqual(len(cut), 1)  # the server did drop messages, once ...
            self.assertEqual(metrics_of(run)["context_overflows_recovered"], len(cut))
            # ... and each time the turn was sent again, shorter, and answered in full
            for r in cut:
                after = chats[chats.index(r) + 1]
                self.assertFalse(after.get("truncated_messages"))
                self.assertEqual(messages(after)[-1], messages(r)[-1])

    def test_stored_sizes_that_undercount_still_recovered(self):
        """Turns whose stored sizes say far less than the server counts (a file
        edited or copied, sizes kept from another model): the server's refusal
        is believed over them, and the turn sent again cut to fit, not cut by
        the sizes that were refused."""
        for provider in ("openai", "anthropic"):
            with self.subTest(provider=provider), \
                    tempfile.TemporaryDirectory(prefix="parley-ctx-") as d:
                path = os.path.join(d, "h.db")
                with FakeLLM() as big:
                    o = options(big, summarize=False, max_history_turns=0,
                                history_store="sqlite:" + path)
                    self.run_ok([{"text": "%d %s" % (k, FILLER * 20), "conversation_id": "z"}
                                 for k in range(1, 9)], o)
                db = sqlite3.connect(path)
                db.execute("UPDATE turns SET tokens = 80")  # possible, ~1/6 of the truth
                db.commit()
                db.close()
                with FakeLLM("--n-ctx", "1000") as small:
                    base = (small.base_url if provider == "openai"
                            else "http://127.0.0.1:%d" % small.port)
                    o = options(small, provider=provider, base_url=base, summarize=False,
                                max_history_turns=0, history_store="sqlite:" + path,
                                context_window=1000, max_tokens=100)
                    run = self.run_ok([{"text": "after", "conversation_id": "z"},
                                       {"op": "metrics"}], o)
                    self.assertTurnOk(run.turn_lines()[0])
                    self.assertEqual(metrics_of(run)["context_overflows_recovered"], 1)

    def test_newest_turn_alone_too_long_fails_history_unchanged(self):
        with FakeLLM("--n-ctx", "300") as fake:
            o = options(fake)
            lines = [{"text": "short one", "conversation_id": "n"},
                     {"text": "long " * 400, "conversation_id": "n"},
                     {"op": "history", "conversation_id": "n"}, {"op": "metrics"}]
            run = self.run_ok(lines, o)
            self.assertTurnOk(run.by_seq(1))
            line = self.assertTurnError(run.by_seq(2), "context_overflow")
            self.assertRegex(line["error"]["message"], r"\(\d+ tokens > 300\)")
            self.assertEqual(len(run.by_seq(3)["result"]["turns"]), 1)
            self.assertEqual(metrics_of(run)["context_overflows_recovered"], 0)
            refused = [r for r in fake.requests() if r.get("overflow")]
            self.assertEqual(len(refused), 2)  # cut to nothing, tried once more, then failed


if __name__ == "__main__":
    unittest.main()
