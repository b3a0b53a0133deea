"""Conversation history, the heart of Parley.

Everything is asserted from the fake server's request log (exactly which
messages the plugin sent) and from the shim's history ops.  Every request
logged by every test of this module is also checked for well-formed tool
sequences (tearDown): never a tool message without its assistant tool_calls
message, never tool_calls without all their results (ANCHORS.md pain #1).
"""
import json
import time
import unittest

from harness import (SLOW, UUID4_RE, UUID_RE, FakeLLM, InteractiveShim, ParleyTestCase,
                     as_sent, fake_reply, messages, options, run_shim, tool_sequence_problems, user_texts)

PROMPT = "You are a test assistant."
SYS = {"role": "system", "content": PROMPT}

TOOLS = [
    {"name": "get_temp", "description": "Temperature of a room",
     "parameters": {"type": "object", "properties": {"room": {"type": "string"}}},
     "result": {"celsius": 21}},
    {"name": "set_mode", "description": "Set the heating mode",
     "parameters": {"type": "object", "properties": {"mode": {"type": "string"}}},
     "result": "ok"},
    {"name": "slow_tool", "description": "Answers after 2 s", "result": "late", "delay_ms": 2000},
    {"name": "never_tool", "description": "Never answers", "never": True},
    {"name": "big_tool", "description": "A large result", "result": "x" * 3000},
    {"name": "threaded", "description": "Answered from another thread",
     "result": {"ok": True}, "from_thread": True},
]


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


def flatten(turns):
    """Stored turns' messages, as the Chat Completions codec sends them."""
    return as_sent([m for t in turns for m in t["messages"]])


def last_user_text(request):
    texts = user_texts(request)
    return texts[-1] if texts else None


def assert_well_formed(testcase, msgs, where=""):
    problems = tool_sequence_problems(msgs)
    testcase.assertEqual(problems, [], "%s: malformed tool sequence in %s"
                         % (where, json.dumps(msgs)))


class HistoryCase(ParleyTestCase):
    """Creates fake servers on demand; on teardown checks EVERY request they
    logged for well-formed tool sequences."""

    maxDiff = None

    def setUp(self):
        self._servers = []

    def server(self, *args):
        llm = FakeLLM(*args)
        self._servers.append(llm)
        self.addCleanup(llm.close)
        return llm

    def tearDown(self):
        for llm in self._servers:
            for r in llm.chat_requests():
                if r.get("body") and isinstance(r["body"], dict):
                    assert_well_formed(self, messages(r), "request #%s" % r["seq"])

    def requests_for(self, llm, text):
        """The chat requests of the turn whose user text is `text`."""
        return [r for r in llm.chat_requests() if last_user_text(r) == text]

    def history_turns(self, op_line):
        self.assertIsNone(op_line["error"], op_line)
        return op_line["result"]["turns"]


class FollowUps(HistoryCase):
    def test_second_turn_carries_first(self):
        llm = self.server()
        u1, u2 = "What is the capital of France?", "And of Italy?"
        run = self.run_ok([{"text": u1, "conversation_id": "c1"},
                           {"text": u2, "conversation_id": "c1"},
                           {"op": "history", "conversation_id": "c1"}], options(llm))
        l1, l2 = self.assertTurnOk(run.by_seq(1)), self.assertTurnOk(run.by_seq(2))
        a1, a2 = fake_reply(u1, 2, 1), fake_reply(u2, 4, 2)
        self.assertEqual((l1["response"], l2["response"]), (a1, a2))
        self.assertEqual((l1["conversation_id"], l2["conversation_id"]), ("c1", "c1"))
        reqs = llm.chat_requests()
        self.assertEqual(len(reqs), 2)
        self.assertEqual(messages(reqs[0]), [SYS, user(u1)])
        self.assertEqual(messages(reqs[1]), [SYS, user(u1), assistant(a1), user(u2)])

        h = run.by_seq(3)["result"]
        self.assertEqual(h["conversation_id"], "c1")
        self.assertEqual([t["turn_id"] for t in h["turns"]], [l1["turn_id"], l2["turn_id"]])
        self.assertEqual([t["messages"] for t in h["turns"]],
                         [[user(u1), assistant(a1)], [user(u2), assistant(a2)]])
        for t in h["turns"]:
            self.assertLessEqual(t["started_at"], t["finished_at"])
        self.assertLessEqual(h["created_at"], h["last_used_at"])
        self.assertLessEqual(h["turns"][0]["finished_at"], h["turns"][1]["started_at"])


class Recall(HistoryCase):
    def test_model_can_recall_the_first_turn_only_through_history(self):
        # What the README demo shows: a follow-up answered from memory.
        llm = self.server()
        run = self.run_ok([{"text": "My name is Ada.", "conversation_id": "r"},
                           {"text": "What did I say first? [[recall]]", "conversation_id": "r"},
                           {"text": "What did I say first? [[recall]]", "conversation_id": "other"}],
                          options(llm))
        self.assertEqual(self.assertTurnOk(run.by_seq(2))["response"],
                         'Your first message was: "My name is Ada.". I have seen 4 messages (2 from you).')
        # Another conversation has no such memory: its first message is the question itself.
        self.assertTrue(self.assertTurnOk(run.by_seq(3))["response"].startswith(
            'Your first message was: "What did I say first?'))


def window_start(n_stored, start, sent, limit):
    """Where the history sent starts (a turn index) before the turn that
    follows n_stored turns, the window having started at `start`: the
    context engine's rule for small turns (docs/history.md, "How the context
    is built").  It stays put until the window exceeds max_history_turns
    (`sent`, 0 = no bound) or the store no longer holds its start (`limit`
    turns kept, 0 = all); then it moves once, down to a third of `sent`."""
    first_kept = max(0, n_stored - limit) if limit else 0
    lost = start < first_kept
    held = n_stored - max(start, first_kept)
    if sent and (n_stored - start > sent or lost):
        return n_stored - min(max(1, sent // 3), held)
    return first_kept if lost else start


def default_keep(sent):
    """history_keep_turns when null: well more than is sent."""
    return max(200, 4 * sent) if sent else 0


class Truncation(HistoryCase):
    def run_plain(self, n_turns, max_hist, snapshots=True, keep=None):
        """n_turns plain turns on one id, a history op after each (when
        snapshots); checks every request (the window of window_start) and
        snapshot (the last `keep` turns kept; None: default_keep) exactly."""
        llm = self.server()
        o = options(llm, summarize=False)  # the window alone (summaries: test_context.py)
        if max_hist is not None:
            o["max_history_turns"] = max_hist
        if keep is not None:
            o["history_keep_turns"] = keep
        sent = max_hist if max_hist is not None else 20
        limit = keep if keep is not None else default_keep(sent)
        texts = ["turn %d of %d" % (k, n_turns) for k in range(1, n_turns + 1)]
        lines = []
        for t in texts:
            lines.append({"text": t, "conversation_id": "trunc"})
            if snapshots:
                lines.append({"op": "history", "conversation_id": "trunc"})
        if not snapshots:
            lines.append({"op": "history", "conversation_id": "trunc"})
        run = self.run_ok(lines, o)
        results = [self.assertTurnOk(l) for l in run.turn_lines()]
        self.assertEqual(len(results), n_turns)
        reqs = llm.chat_requests()
        self.assertEqual(len(reqs), n_turns)
        stored = []  # every turn ever completed: [user, assistant]
        start = 0
        for k, (text, res, req) in enumerate(zip(texts, results, reqs), start=1):
            start = window_start(len(stored), start, sent, limit)
            kept = stored[start:]
            want = [SYS] + [m for pair in kept for m in pair] + [user(text)]
            self.assertEqual(messages(req), want, "request of turn %d" % k)
            self.assertEqual(res["response"], fake_reply(text, len(want), len(kept) + 1))
            stored.append([user(text), assistant(res["response"])])
        ops = [l for l in run.lines if l.get("op") == "history"]
        if snapshots:
            for k, op in enumerate(ops, start=1):
                turns = self.history_turns(op)
                n = k if limit == 0 else min(k, limit)
                self.assertEqual(len(turns), n, "history after turn %d" % k)
                self.assertEqual([t["messages"] for t in turns], stored[k - n:k])
        final = self.history_turns(ops[-1])
        n = n_turns if limit == 0 else min(n_turns, limit)
        self.assertEqual([t["messages"] for t in final], stored[-n:])
        self.assertEqual([t["turn_id"] for t in final], [r["turn_id"] for r in results][-n:])
        return run

    def test_max_history_3(self):
        self.run_plain(6, 3)

    def test_max_history_1(self):
        self.run_plain(4, 1)

    def test_default_is_20(self):
        self.run_plain(23, None, snapshots=False)

    def test_zero_is_unlimited(self):
        self.run_plain(24, 0, snapshots=False)

    def test_keep_more_than_sent(self):
        # Requests carry the last 2 turns; history_get shows the last 5.
        self.run_plain(7, 2, keep=5)

    def test_keep_all_send_last_1(self):
        self.run_plain(5, 1, keep=0)

    def test_keep_fewer_than_sent(self):
        self.run_plain(5, 4, keep=2)

    def check_tool_conversation(self, max_hist):
        llm = self.server()
        texts = [
            'one call [[tool:get_temp {"room":"kitchen"}]]',
            "plain words in between",
            'two calls [[tool:get_temp {"room":"hall"}]] [[tool:set_mode {"mode":"eco"}]]',
            "endless [[fault:endless_tools]]",                 # 2 tool rounds, then a final answer
            "unknown tool [[tool:no_such_tool {}]]",
            "bad arguments [[tool:get_temp this is not json]]",
            "from a thread [[tool:threaded {}]]",
            "plain words again",
            'last one [[tool:set_mode {"mode":"away"}]]',
        ]
        lines = []
        for t in texts:
            lines.append({"text": t, "conversation_id": "tools"})
            lines.append({"op": "history", "conversation_id": "tools"})
        o = options(llm, max_history_turns=max_hist, max_tool_iterations=2, summarize=False)
        start = 0
        run = self.run_ok(lines, o, tools=TOOLS)
        results = run.turn_lines()
        snaps = [self.history_turns(l) for l in run.lines if l.get("op") == "history"]
        self.assertEqual(len(results), len(texts))
        for k, (text, res) in enumerate(zip(texts, results)):
            self.assertTurnOk(res)
            before = snaps[k - 1] if k else []
            after = snaps[k]
            n = len(before)
            # The store keeps well more than is sent: every turn so far.
            self.assertEqual(len(after), k + 1)
            start = window_start(n, start, max_hist, default_keep(max_hist))
            this = after[-1]
            self.assertEqual(this["turn_id"], res["turn_id"])
            self.assertEqual(this["messages"][0], user(text))
            self.assertEqual(this["messages"][-1], assistant(res["response"]))
            # Older turns are unchanged, whole, in order.
            keep = after[:-1]
            self.assertEqual(keep, before[len(before) - len(keep):] if keep else [])
            # Every request of this turn starts with exactly the stored turns, whole.
            reqs = self.requests_for(llm, text)
            self.assertGreaterEqual(len(reqs), 1, text)
            prefix = [SYS] + flatten(before[start:])
            for r in reqs:
                msgs = messages(r)
                self.assertEqual(msgs[:len(prefix)], prefix, "turn %d request #%s" % (k + 1, r["seq"]))
                self.assertEqual(msgs[len(prefix)], user(text))
                # The rest is this turn's own messages so far, as stored.
                rest = msgs[len(prefix):]
                self.assertEqual(rest, as_sent(this["messages"][:len(rest)]))
            self.assertLessEqual(n - start, max_hist if max_hist else n)

        # The turns really contained tool steps (else the test proves nothing).
        t3 = snaps[2][-1]["messages"]
        self.assertEqual([m["role"] for m in t3], ["user", "assistant", "tool", "tool", "assistant"])
        self.assertEqual([c["function"]["name"] for c in t3[1]["tool_calls"]],
                         ["get_temp", "set_mode"])
        self.assertEqual([m["tool_call_id"] for m in t3[2:4]],
                         [c["id"] for c in t3[1]["tool_calls"]])
        t4 = snaps[3][-1]["messages"]
        self.assertEqual([m["role"] for m in t4],
                         ["user", "assistant", "tool", "assistant", "tool", "assistant"])
        steps = [s["type"] for s in results[2]["steps"]]
        self.assertEqual(steps, ["tool_call", "tool_call", "tool_result", "tool_result", "answer"])
        # Each tool turn's final answer reports the results the model saw.
        self.assertTrue(results[0]["response"].startswith("Done. get_temp: "), results[0])
        return llm

    def test_tools_truncated_by_whole_turns_1(self):
        self.check_tool_conversation(1)

    def test_tools_truncated_by_whole_turns_2(self):
        self.check_tool_conversation(2)

    def test_tools_unlimited(self):
        self.check_tool_conversation(0)


class FailedTurns(HistoryCase):
    """A failed turn leaves the history dump byte-identical and never leaks
    into later requests."""

    def check_failure(self, failing, codes, opts=None, concurrency=1, extra_lines=(),
                      server_args=()):
        llm = self.server(*server_args)
        cid = "fail"
        setup = ['setup [[tool:get_temp {"room":"attic"}]]', "setup plain"]
        after = "after the failure"
        lines = [{"text": t, "conversation_id": cid} for t in setup]
        lines.append({"op": "history", "conversation_id": cid})          # 3
        fail_seq = len(lines) + 1
        lines.append(dict(failing, conversation_id=cid))                  # 4
        lines.extend(extra_lines)
        before_seq = 3
        lines.append({"op": "list"})
        list_seq = len(lines)
        lines.append({"op": "history", "conversation_id": cid})
        after_hist_seq = len(lines)
        lines.append({"text": after, "conversation_id": cid})
        lines.append({"op": "history", "conversation_id": cid})
        lines.append({"op": "list"})
        o = options(llm, **(opts or {}))
        run = self.run_ok(lines, o, tools=TOOLS, concurrency=concurrency)

        for s in (1, 2):
            self.assertTurnOk(run.by_seq(s))
        failed = run.by_seq(fail_seq)
        self.assertIsNotNone(failed["error"], failed)
        self.assertIn(failed["error"]["code"], codes, failed)
        self.assertIsNone(failed["response"])
        self.assertEqual(failed["conversation_id"], cid)
        self.assertRegex(failed["turn_id"], UUID_RE)

        # Byte-identical history dump before and after the failed turn.
        self.assertEqual(run.raw_result(before_seq), run.raw_result(after_hist_seq))
        # ... and the conversation was not even "used" by it.
        listed = run.by_seq(list_seq)["result"]["conversations"]
        head = ("conversation_id", "created_at", "last_used_at", "last_message_at",
                "message_count", "turn_count", "participants")
        self.assertEqual(listed, [{k: run.by_seq(before_seq)["result"][k] for k in head}
                                  | {"turns": 2}])
        before = self.history_turns(run.by_seq(before_seq))
        self.assertEqual(len(before), 2)

        # The next turn sends exactly the old history, nothing of the failure.
        ok = self.assertTurnOk(run.by_seq(after_hist_seq + 1))
        reqs = self.requests_for(llm, after)
        self.assertEqual(len(reqs), 1)
        self.assertEqual(messages(reqs[0]), [SYS] + flatten(before) + [user(after)])
        self.assertNotIn(failing["text"], json.dumps(messages(reqs[0])))
        self.assertEqual(ok["response"], fake_reply(after, len(flatten(before)) + 2, 3))
        final = self.history_turns(run.by_seq(after_hist_seq + 2))
        self.assertEqual(final[:2], before)
        self.assertEqual([t["messages"][0] for t in final[2:]], [user(after)])
        self.assertNotIn(failed["turn_id"], run.raw[-2])
        self.assertEqual(run.by_seq(after_hist_seq + 3)["result"]["conversations"][0]["turns"], 3)
        return run, failed, llm

    def test_failed_first_turn_creates_nothing(self):
        llm = self.server()
        lines = [{"text": "doomed [[fault:500]]", "conversation_id": "ghost"},
                 {"op": "history", "conversation_id": "ghost"},
                 {"op": "list"},
                 {"text": "cancelled [[latency:3000]]", "conversation_id": "ghost2"},
                 {"op": "cancel", "seq": 4},
                 {"op": "history", "conversation_id": "ghost2"},
                 {"op": "list"},
                 {"text": "now it works", "conversation_id": "ghost"}]
        run = self.run_ok(lines, options(llm, max_retries=0), concurrency=2)
        self.assertTurnError(run.by_seq(1), "http_status")
        self.assertEqual(run.by_seq(2)["error"]["code"], "not_found", run.by_seq(2))
        self.assertEqual(run.by_seq(3)["result"], {"conversations": []})
        self.assertTurnError(run.by_seq(4), "cancelled")
        self.assertEqual(run.by_seq(6)["error"]["code"], "not_found", run.by_seq(6))
        self.assertEqual(run.by_seq(7)["result"], {"conversations": []})
        self.assertTurnOk(run.by_seq(8))
        self.assertEqual(messages(self.requests_for(llm, "now it works")[0]),
                         [SYS, user("now it works")])

    def test_http_500_no_retries(self):
        text = "this fails [[fault:500]]"
        _, failed, llm = self.check_failure({"text": text}, ("http_status",),
                                            {"max_retries": 0})
        self.assertEqual(len(self.requests_for(llm, text)), 1)

    def test_http_503_after_retries(self):
        text = "this fails thrice [[fault:503]]"
        _, failed, llm = self.check_failure({"text": text}, ("http_status",),
                                            {"max_retries": 2})
        self.assertEqual(len(self.requests_for(llm, text)), 3)

    def test_truncated_response(self):
        self.check_failure({"text": "cut short [[fault:truncated]]"}, ("bad_response",),
                           {"max_retries": 0})

    def test_not_json_response(self):
        self.check_failure({"text": "garbage [[fault:not_json]]"}, ("bad_response",))

    def test_hang_request_timeout(self):
        start = time.time()
        self.check_failure({"text": "never answered [[fault:hang]]"}, ("timeout",),
                           {"request_timeout_ms": 500, "max_retries": 0})
        self.assertLess(time.time() - start, 10 * SLOW)

    def test_cancel_op(self):
        run, failed, _ = self.check_failure(
            {"text": "slow one [[latency:3000]]"}, ("cancelled",), concurrency=2,
            extra_lines=[{"op": "sleep", "ms": 100}, {"op": "cancel", "seq": 4}])
        cancel = run.by_seq(6)
        self.assertEqual(cancel["op"], "cancel")
        self.assertIsNone(cancel["error"], cancel)

    def test_turn_timeout_during_tool_call(self):
        # The model asked for a tool; the turn times out while it runs: the
        # half-built tool sequence must not reach the history.
        run, failed, _ = self.check_failure(
            {"text": "slow tool [[tool:slow_tool {}]]"}, ("timeout",),
            {"turn_timeout_ms": 700, "tool_timeout_ms": 10000})
        self.assertIn("tool_call", [s["type"] for s in failed["steps"]])

    def test_cancel_during_tool_call(self):
        run, failed, _ = self.check_failure(
            {"text": "never answered tool [[tool:never_tool {}]]"}, ("cancelled",),
            concurrency=2,
            extra_lines=[{"op": "sleep", "ms": 300}, {"op": "cancel", "seq": 4}])
        self.assertEqual([s["type"] for s in failed["steps"]][:1], ["tool_call"])

    def test_failure_after_tool_round(self):
        # First request fine (tool call), the tool runs, then the final
        # reply is too large: the turn fails after a complete tool round.
        run, failed, llm = self.check_failure(
            {"text": "big result [[tool:big_tool {}]]"}, ("bad_response",),
            {"max_response_bytes": 2048, "max_retries": 0})
        types = [s["type"] for s in failed["steps"]]
        self.assertEqual(types, ["tool_call", "tool_result"], failed["steps"])
        self.assertEqual(len(self.requests_for(llm, "big result [[tool:big_tool {}]]")), 2)


class SameConversationConcurrency(HistoryCase):
    def test_serialized_in_submission_order(self):
        llm = self.server("--latency-ms", "20")
        n = 16
        texts = ["ordered turn %02d" % i for i in range(1, n + 1)]
        lines = [{"text": t, "conversation_id": "same"} for t in texts]
        lines.append({"op": "history", "conversation_id": "same"})
        run = self.run_ok(lines, options(llm), concurrency=16)
        reqs = sorted(llm.chat_requests(), key=lambda r: r["seq"])
        self.assertEqual(len(reqs), n)
        expected = [SYS]
        for i, (t, r) in enumerate(zip(texts, reqs), start=1):
            line = self.assertTurnOk(run.by_seq(i))
            # History grows by exactly one whole turn each time, in seq order.
            self.assertEqual(messages(r), expected + [user(t)], "request %d" % i)
            self.assertEqual(line["response"], fake_reply(t, 2 * i, i))
            expected = expected + [user(t), assistant(line["response"])]
        turns = self.history_turns(run.by_seq(n + 1))
        self.assertEqual([t["messages"][0]["content"] for t in turns], texts)
        self.assertEqual([t["turn_id"] for t in turns], [run.by_seq(i)["turn_id"]
                                                           for i in range(1, n + 1)])


    def test_cancel_queued_turn_keeps_order(self):
        # t2 waits behind t1 on the same id and is cancelled before it starts:
        # t3 must still run after t1, and see t1 but not t2.
        llm = self.server()
        cid = "queue"
        lines = [{"text": "first slow [[latency:600]]", "conversation_id": cid},
                 {"text": "second, cancelled while queued", "conversation_id": cid},
                 {"text": "third", "conversation_id": cid},
                 {"op": "cancel", "seq": 2},
                 {"op": "history", "conversation_id": cid}]
        run = self.run_ok(lines, options(llm), concurrency=4)
        self.assertIsNone(run.by_seq(4)["error"], run.by_seq(4))
        t1 = self.assertTurnOk(run.by_seq(1))
        self.assertTurnError(run.by_seq(2), "cancelled")
        self.assertEqual(run.by_seq(2)["steps"], [])
        t3 = self.assertTurnOk(run.by_seq(3))
        self.assertEqual(self.requests_for(llm, "second, cancelled while queued"), [])
        self.assertEqual(messages(self.requests_for(llm, "third")[0]),
                         [SYS, user("first slow [[latency:600]]"), assistant(t1["response"]),
                          user("third")])
        turns = self.history_turns(run.by_seq(5))
        self.assertEqual([t["turn_id"] for t in turns], [t1["turn_id"], t3["turn_id"]])


class Isolation(HistoryCase):
    def test_ids_never_see_each_other(self):
        llm = self.server("--latency-ms", "20")
        ids = ["alpha", "bravo", "charlie"]
        lines = []
        for k in range(1, 6):
            for cid in ids:
                lines.append({"text": "%s says %d" % (cid, k), "conversation_id": cid})
        lines += [{"op": "history", "conversation_id": cid} for cid in ids]
        run = self.run_ok(lines, options(llm), concurrency=6)
        for l in run.turn_lines():
            self.assertTurnOk(l)
        reqs = llm.chat_requests()
        self.assertEqual(len(reqs), 15)
        for r in reqs:
            msgs = messages(r)
            cid, k = last_user_text(r).split(" says ")
            self.assertEqual(user_texts(r), ["%s says %d" % (cid, j) for j in range(1, int(k) + 1)])
            for m in msgs[1:]:
                for other in ids:
                    if other != cid:
                        self.assertNotIn(other, m["content"], "request for %s leaked %s" % (cid, m))
        for i, cid in enumerate(ids):
            turns = self.history_turns(run.by_seq(16 + i))
            self.assertEqual([t["messages"][0]["content"] for t in turns],
                             ["%s says %d" % (cid, k) for k in range(1, 6)])
        # Different ids really ran in parallel (not one global queue).
        if SLOW == 1:
            self.assertLess(run.elapsed, 15 * 0.02 + 2.0)


class AutoCreate(HistoryCase):
    def test_minted_id_continues(self):
        llm = self.server()
        with InteractiveShim(options(llm, auto_create_conversation_id=True)) as sh:
            l1 = self.assertTurnOk(sh.turn({"text": "remember the number 42"}))
            cid = l1["conversation_id"]
            self.assertRegex(cid, UUID4_RE)
            l2 = self.assertTurnOk(sh.turn({"text": "what was it?", "conversation_id": cid}))
            self.assertEqual(l2["conversation_id"], cid)
            l3 = self.assertTurnOk(sh.turn({"text": "a fresh start"}))
            self.assertRegex(l3["conversation_id"], UUID4_RE)
            self.assertNotEqual(l3["conversation_id"], cid)
            # A host-chosen id it does not know is kept as given, not re-minted.
            l4 = self.assertTurnOk(sh.turn({"text": "host id", "conversation_id": "host-chosen-01"}))
            self.assertEqual(l4["conversation_id"], "host-chosen-01")
            lst = sh.op("list")
        self.assertEqual(sh.rc, 0, sh.stderr)
        reqs = llm.chat_requests()
        self.assertEqual(messages(reqs[1]), [SYS, user("remember the number 42"),
                                             assistant(l1["response"]), user("what was it?")])
        self.assertEqual(messages(reqs[2]), [SYS, user("a fresh start")])
        self.assertEqual(messages(reqs[3]), [SYS, user("host id")])
        convs = {c["conversation_id"]: c["turns"] for c in lst["result"]["conversations"]}
        self.assertEqual(convs, {cid: 2, l3["conversation_id"]: 1, "host-chosen-01": 1})

    def test_without_option_stateless(self):
        llm = self.server()
        run = self.run_ok([{"text": "one"}, {"text": "two"}, {"op": "list"}, {"op": "metrics"}],
                          options(llm))
        for s in (1, 2):
            self.assertIsNone(self.assertTurnOk(run.by_seq(s))["conversation_id"])
        self.assertEqual(run.by_seq(3)["result"], {"conversations": []})
        self.assertEqual(run.by_seq(4)["result"]["conversations"], 0)
        self.assertEqual(messages(llm.chat_requests()[1]), [SYS, user("two")])


class Ops(HistoryCase):
    def test_list_turn_clear(self):
        llm = self.server()
        with InteractiveShim(options(llm)) as sh:
            la1 = self.assertTurnOk(sh.turn({"text": "apple one", "conversation_id": "c-a"}))
            lb1 = self.assertTurnOk(sh.turn({"text": "banana one", "conversation_id": "c-b"}))
            la2 = self.assertTurnOk(sh.turn({"text": "apple two", "conversation_id": "c-a"}))

            lst = sh.op("list")["result"]["conversations"]
            self.assertEqual([(c["conversation_id"], c["turns"]) for c in lst],
                             [("c-a", 2), ("c-b", 1)])

            t = sh.op("turn", turn_id=la1["turn_id"])
            self.assertIsNone(t["error"], t)
            self.assertEqual(t["result"]["conversation_id"], "c-a")
            self.assertEqual(t["result"]["turn"]["turn_id"], la1["turn_id"])
            self.assertEqual(t["result"]["turn"]["messages"],
                             [user("apple one"), assistant(la1["response"])])
            t = sh.op("turn", turn_id=lb1["turn_id"])
            self.assertEqual(t["result"]["conversation_id"], "c-b")
            self.assertEqual(t["result"]["turn"]["messages"][0], user("banana one"))

            for op, args in (("turn", {"turn_id": "00000000-0000-4000-8000-000000000000"}),
                             ("turn", {"turn_id": "not-a-uuid"}),
                             ("history", {"conversation_id": "c-zzz"}),
                             ("clear", {"conversation_id": "c-zzz"})):
                r = sh.op(op, **args)
                self.assertIsNone(r["result"], r)
                self.assertEqual(r["error"]["code"], "not_found", r)

            r = sh.op("clear", conversation_id="c-a")
            self.assertIsNone(r["error"], r)
            self.assertEqual([c["conversation_id"] for c in sh.op("list")["result"]["conversations"]],
                             ["c-b"])
            self.assertEqual(sh.op("history", conversation_id="c-a")["error"]["code"], "not_found")
            self.assertEqual(sh.op("turn", turn_id=la2["turn_id"])["error"]["code"], "not_found")

            la3 = self.assertTurnOk(sh.turn({"text": "apple again", "conversation_id": "c-a"}))
            self.assertEqual(la3["response"], fake_reply("apple again", 2, 1))
            h = sh.op("history", conversation_id="c-a")["result"]
            self.assertEqual([t["messages"][0] for t in h["turns"]], [user("apple again")])

            r = sh.op("clear")  # all
            self.assertIsNone(r["error"], r)
            self.assertEqual(sh.op("list")["result"], {"conversations": []})
            self.assertEqual(sh.op("history", conversation_id="c-b")["error"]["code"], "not_found")
            self.assertTurnOk(sh.turn({"text": "banana again", "conversation_id": "c-b"}))
        self.assertEqual(sh.rc, 0, sh.stderr)
        self.assertEqual(messages(self.requests_for(llm, "apple again")[0]),
                         [SYS, user("apple again")])
        self.assertEqual(messages(self.requests_for(llm, "banana again")[0]),
                         [SYS, user("banana again")])


class Expiry(HistoryCase):
    def test_max_conversations_evicts_lru(self):
        llm = self.server()
        lines = [{"text": "%s first" % c, "conversation_id": c} for c in "abc"]
        lines.append({"text": "a second", "conversation_id": "a"})   # a is now most recent
        lines.append({"text": "d first", "conversation_id": "d"})    # evicts b (LRU)
        lines += [{"op": "list"}, {"op": "history", "conversation_id": "b"}, {"op": "metrics"},
                  {"text": "b again", "conversation_id": "b"},
                  {"text": "a third", "conversation_id": "a"}]
        run = self.run_ok(lines, options(llm, max_conversations=3))
        self.assertEqual([c["conversation_id"] for c in run.by_seq(6)["result"]["conversations"]],
                         ["d", "a", "c"])
        self.assertEqual(run.by_seq(7)["error"]["code"], "not_found")
        self.assertEqual(run.by_seq(8)["result"]["conversations_evicted"], 1)
        self.assertEqual(messages(self.requests_for(llm, "b again")[0]), [SYS, user("b again")])
        self.assertEqual(user_texts(self.requests_for(llm, "a third")[0]),
                         ["a first", "a second", "a third"])

    def test_idle_timeout(self):
        llm = self.server()
        lines = [
            {"text": "old one", "conversation_id": "old"},
            {"text": "kept one", "conversation_id": "kept"},
            {"op": "sleep", "ms": 1000},
            {"text": "kept two", "conversation_id": "kept"},   # touched: idle clock restarts
            {"op": "sleep", "ms": 1300},                       # old idle 2.3 s > 2, kept 1.3 s
            {"op": "list"},
            {"text": "old two", "conversation_id": "old"},
            {"text": "kept three", "conversation_id": "kept"},
            {"op": "metrics"},
        ]
        run = self.run_ok(lines, options(llm, history_idle_timeout_s=2))
        self.assertEqual([c["conversation_id"] for c in run.by_seq(6)["result"]["conversations"]],
                         ["kept"])
        self.assertEqual(messages(self.requests_for(llm, "old two")[0]), [SYS, user("old two")])
        self.assertEqual(user_texts(self.requests_for(llm, "kept three")[0]),
                         ["kept one", "kept two", "kept three"])
        self.assertGreaterEqual(run.by_seq(9)["result"]["conversations_expired"], 1)

    def test_idle_timeout_1s_sleep_op(self):
        llm = self.server()
        lines = [{"text": "before sleep", "conversation_id": "nap"},
                 {"op": "sleep", "ms": 2100},
                 {"op": "list"},
                 {"op": "history", "conversation_id": "nap"},
                 {"text": "after sleep", "conversation_id": "nap"}]
        run = self.run_ok(lines, options(llm, history_idle_timeout_s=1))
        self.assertEqual(run.by_seq(3)["result"], {"conversations": []})
        self.assertEqual(run.by_seq(4)["error"]["code"], "not_found")
        self.assertEqual(messages(self.requests_for(llm, "after sleep")[0]),
                         [SYS, user("after sleep")])


class InvalidIds(HistoryCase):
    def test_bad_ids_rejected(self):
        llm = self.server()
        bad = ["x" * 300, "y" * 257, "\u00e9" * 129, "ctl\u0001char", "bell\u0007", "esc\u001b[0m",
               "new\nline", "tab\there", ""]
        good = ["z" * 256, "\u00e9" * 128, "k\u00fcche-satellite:1"]
        lines = [{"text": "bad id %d" % i, "conversation_id": c} for i, c in enumerate(bad)]
        lines += [{"text": "good id %d" % i, "conversation_id": c} for i, c in enumerate(good)]
        lines.append({"op": "list"})
        run = self.run_ok(lines, options(llm))
        for i, c in enumerate(bad, start=1):
            with self.subTest(id=c[:20], length=len(c.encode())):
                line = run.by_seq(i)
                self.assertIsNotNone(line.get("error"), line)
                self.assertEqual(line["error"]["code"], "invalid_input", line)
        for i, c in enumerate(good, start=len(bad) + 1):
            line = self.assertTurnOk(run.by_seq(i))
            self.assertEqual(line["conversation_id"], c)
        self.assertEqual(sorted(user_texts(r)[-1] for r in llm.chat_requests()),
                         ["good id %d" % i for i in range(len(good))])
        self.assertEqual(sorted(c["conversation_id"]
                                for c in run.by_seq(len(lines))["result"]["conversations"]),
                         sorted(good))


if __name__ == "__main__":
    unittest.main()
