"""End-to-end tests of Parley's agentic loop: tool calls through the host.

Every test drives the real parley-host --jsonl (loading build/plugin/parley.so)
against parley-fake-llm, and asserts on three things: the result lines the
host sees, exactly what the plugin sent (the fake server's request log), and
the history op output.

Anchors (see /work/shared/ANCHORS.md) proven here:
  #1  a failed turn that already ran a tool leaves no half-written tool
      sequence behind (the next request is accepted by a strict server);
  #5  the iteration limit ends with a forced final answer (tool_choice
      "none"), not "Unable to get response";
  #10 tool steps are kept in history and sent back to the model.
"""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (FakeLLM, ParleyTestCase, PLUGIN, SHIM, SLOW, as_sent,  # noqa: E402
                     options)


# ---------------------------------------------------------------------------
# Local helpers (harness.py belongs to another engineer).
# ---------------------------------------------------------------------------

class Run:
    """One parley-host --jsonl run: parsed lines, raw lines, arrival times."""

    def __init__(self):
        self.rc = None
        self.stderr = ""
        self.lines = []   # parsed output lines, in output order
        self.raw = []     # the same lines as printed
        self.times = []   # seconds since start when each line arrived
        self.elapsed = 0.0

    def by_seq(self, seq):
        found = [l for l in self.lines if l.get("seq") == seq]
        if len(found) != 1:
            raise AssertionError("expected one line for seq %d, got %r" % (seq, self.lines))
        return found[0]

    def index(self, seq):
        idx = [i for i, l in enumerate(self.lines) if l.get("seq") == seq]
        if len(idx) != 1:
            raise AssertionError("expected one line for seq %d, got %r" % (seq, self.lines))
        return idx[0]

    def arrival(self, seq):
        return self.times[self.index(seq)]

    def op_raw(self, seq):
        """The raw op line without its seq, for byte comparisons."""
        raw = self.raw[self.index(seq)]
        m = re.match(r'^\{"seq":\d+,', raw)
        if not m:
            raise AssertionError("unexpected op line: %r" % raw)
        return raw[m.end():]


def shim(lines, opts, tools=None, concurrency=1, extra_args=(), timeout=60, sigint_after=None,
         env=None):
    """Run parley-host --jsonl, recording when each output line arrives."""
    run = Run()
    with tempfile.TemporaryDirectory(prefix="parley-tools-") as d:
        opt_path = os.path.join(d, "options.json")
        with open(opt_path, "w") as f:
            json.dump(opts, f)
        args = [SHIM, "--plugin", PLUGIN, "--options", opt_path, "--jsonl",
                "--concurrency", str(concurrency), *extra_args]
        if tools == "demo":
            args += ["--tools", "demo"]
        elif tools is not None:
            tools_path = os.path.join(d, "tools.json")
            with open(tools_path, "w") as f:
                json.dump({"tools": tools}, f)
            args += ["--tools", tools_path]
        text = "".join((l if isinstance(l, str) else json.dumps(l)) + "\n" for l in lines)
        start = time.monotonic()
        proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env)
        err_chunks = []

        def feed():
            try:
                proc.stdin.write(text.encode())
                proc.stdin.close()
            except (BrokenPipeError, OSError):
                pass

        def drain_err():
            err_chunks.append(proc.stderr.read())

        threads = [threading.Thread(target=feed, daemon=True),
                   threading.Thread(target=drain_err, daemon=True)]
        for t in threads:
            t.start()
        killer = threading.Timer(timeout * SLOW, proc.kill)
        killer.start()
        sig_timer = None
        if sigint_after is not None:
            sig_timer = threading.Timer(sigint_after, lambda: proc.poll() is None and
                                        proc.send_signal(signal.SIGINT))
            sig_timer.start()
        try:
            for raw in proc.stdout:
                now = time.monotonic() - start
                s = raw.decode("utf-8").rstrip("\n")
                if not s.strip():
                    continue
                run.raw.append(s)
                run.lines.append(json.loads(s))
                run.times.append(now)
            run.rc = proc.wait()
        finally:
            killer.cancel()
            if sig_timer:
                sig_timer.cancel()
            for t in threads:
                t.join(5)
            proc.stdout.close()
            proc.stderr.close()
        run.elapsed = time.monotonic() - start
        run.stderr = b"".join(c for c in err_chunks if c).decode("utf-8", "replace")
        if run.rc == -signal.SIGKILL:
            raise AssertionError("parley-host did not finish within %ss; stderr: %s; lines: %r"
                                 % (timeout, run.stderr, run.lines))
    return run


def host_calls(stderr):
    """Tool calls the shim actually received (needs --log-level debug)."""
    calls = []
    for line in stderr.splitlines():
        m = re.match(r"^parley-host\[debug\]: tool call (\S+) (.*)$", line)
        if m:
            calls.append((m.group(1), m.group(2)))
    return calls


def tool(name, result, **kw):
    t = {"name": name, "description": "Test tool %s" % name,
         "parameters": {"type": "object", "properties": {"name": {"type": "string"}}},
         "result": result}
    t.update(kw)
    return t


def compact(v):
    return json.dumps(v, separators=(",", ":"))


def tool_names(request):
    return [t["function"]["name"] for t in request["body"].get("tools", [])]


def normalise_ids(value, mapping=None):
    """Replace call ids by call#N in order of first appearance (keeps pairing)."""
    if mapping is None:
        mapping = {}

    def one(i):
        if i not in mapping:
            mapping[i] = "call#%d" % len(mapping)
        return mapping[i]

    if isinstance(value, list):
        return [normalise_ids(v, mapping) for v in value]
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if k in ("id", "tool_call_id", "call_id") and isinstance(v, str):
                out[k] = one(v)
            else:
                out[k] = normalise_ids(v, mapping)
        return out
    return value


TURN_ON_RESULT = {"ok": True, "state": "on"}
DEBUG = ("--log-level", "debug")


class ToolTestCase(ParleyTestCase):
    maxDiff = None

    def run_ok(self, lines, opts, **kw):  # noqa: D401 - overrides the harness helper
        run = shim(lines, opts, **kw)
        self.assertEqual(run.rc, 0, "parley-host failed (rc %r): %s" % (run.rc, run.stderr))
        return run

    def history(self, run, seq):
        line = run.by_seq(seq)
        self.assertEqual(line.get("op"), "history", line)
        self.assertIsNone(line["error"], line)
        return line["result"]

    def tool_content(self, step):
        """A tool_result step's content parsed as JSON."""
        self.assertEqual(step["type"], "tool_result", step)
        return json.loads(step["content"])


# ---------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------

class ToolRoundTrip(ToolTestCase):

    def test_single_tool_round_trip(self):
        user = '[[tool:turn_on {"name":"kitchen"}]]'
        with FakeLLM() as fake:
            run = self.run_ok([{"text": user, "conversation_id": "rt"},
                               {"op": "history", "conversation_id": "rt"}],
                              options(fake), tools=[tool("turn_on", TURN_ON_RESULT)],
                              extra_args=DEBUG)
            reqs = fake.chat_requests()

        res = self.assertTurnOk(run.by_seq(1))
        canned = compact(TURN_ON_RESULT)
        answer = "Done. turn_on: %s (messages: 4)" % canned
        self.assertEqual(res["response"], answer)
        self.assertEqual(res["conversation_id"], "rt")
        self.assertFalse(res["continue_conversation"])

        steps = res["steps"]
        self.assertEqual([s["type"] for s in steps], ["tool_call", "tool_result", "answer"])
        call_id = steps[0]["call_id"]
        self.assertTrue(call_id)
        self.assertEqual(steps[0]["name"], "turn_on")
        self.assertEqual(steps[0]["arguments"], {"name": "kitchen"})
        self.assertEqual(steps[1], {"type": "tool_result", "call_id": call_id, "name": "turn_on",
                                    "content": canned, "is_error": False})
        self.assertEqual(steps[2], {"type": "answer", "content": answer})

        # The host ran the tool exactly once, with the model's arguments.
        self.assertEqual([(n, json.loads(a)) for n, a in host_calls(run.stderr)],
                         [("turn_on", {"name": "kitchen"})])

        # Exactly two requests; the first offers the tool.
        self.assertEqual(len(reqs), 2, reqs)
        first = reqs[0]["body"]
        self.assertEqual(tool_names(reqs[0]), ["turn_on"])
        self.assertEqual(first["tools"][0]["type"], "function")
        self.assertNotIn("tool_choice", first)
        self.assertEqual(first["messages"],
                         [{"role": "system", "content": "You are a test assistant."},
                          {"role": "user", "content": user}])
        # The second carries the assistant tool_calls and the tool result.
        assistant_tc = {"role": "assistant", "content": None,
                        "tool_calls": [{"id": call_id, "type": "function",
                                        "function": {"name": "turn_on",
                                                     "arguments": '{"name":"kitchen"}'}}]}
        tool_msg = {"role": "tool", "tool_call_id": call_id, "content": canned}
        second = reqs[1]["body"]
        self.assertEqual(second["messages"],
                         [{"role": "system", "content": "You are a test assistant."},
                          {"role": "user", "content": user}, assistant_tc, tool_msg])
        self.assertEqual(tool_names(reqs[1]), ["turn_on"])
        self.assertNotIn("tool_choice", second)

        # History: one turn, the four messages in order.
        hist = self.history(run, 2)
        self.assertEqual(len(hist["turns"]), 1)
        self.assertEqual(hist["turns"][0]["turn_id"], res["turn_id"])
        # Stored in the neutral form (docs/history.md): the tool message also names its tool.
        self.assertEqual(hist["turns"][0]["messages"],
                         [{"role": "user", "content": user}, assistant_tc,
                          dict(tool_msg, name="turn_on"),
                          {"role": "assistant", "content": answer}])

    def test_two_calls_in_one_answer(self):
        user = '[[tool:turn_on {"name":"kitchen"}]] and [[tool:turn_off {"name":"bedroom"}]]'
        tools = [tool("turn_on", {"r": "on-result"}), tool("turn_off", {"r": "off-result"})]
        with FakeLLM() as fake:
            run = self.run_ok([{"text": user, "conversation_id": "two"},
                               {"op": "history", "conversation_id": "two"}],
                              options(fake), tools=tools, extra_args=DEBUG)
            reqs = fake.chat_requests()

        res = self.assertTurnOk(run.by_seq(1))
        on, off = compact({"r": "on-result"}), compact({"r": "off-result"})
        answer = "Done. turn_on: %s; turn_off: %s (messages: 5)" % (on, off)
        self.assertEqual(res["response"], answer)

        # The host executed both, in call order.
        self.assertEqual([(n, json.loads(a)) for n, a in host_calls(run.stderr)],
                         [("turn_on", {"name": "kitchen"}), ("turn_off", {"name": "bedroom"})])

        steps = res["steps"]
        calls = [s for s in steps if s["type"] == "tool_call"]
        results = [s for s in steps if s["type"] == "tool_result"]
        self.assertEqual([c["name"] for c in calls], ["turn_on", "turn_off"])
        self.assertEqual([r["name"] for r in results], ["turn_on", "turn_off"])
        self.assertEqual([r["call_id"] for r in results], [c["call_id"] for c in calls])
        self.assertNotEqual(calls[0]["call_id"], calls[1]["call_id"])
        self.assertEqual([r["content"] for r in results], [on, off])
        self.assertEqual(steps[-1], {"type": "answer", "content": answer})
        self.assertEqual(len(steps), 5)
        for c in calls:  # every result comes after its call
            r = next(r for r in results if r["call_id"] == c["call_id"])
            self.assertLess(steps.index(c), steps.index(r))

        ids = [c["call_id"] for c in calls]
        self.assertEqual(len(reqs), 2)
        msgs = reqs[1]["body"]["messages"]
        self.assertEqual([m["role"] for m in msgs], ["system", "user", "assistant", "tool", "tool"])
        self.assertEqual([tc["id"] for tc in msgs[2]["tool_calls"]], ids)
        self.assertEqual([(m["tool_call_id"], m["content"]) for m in msgs[3:]],
                         [(ids[0], on), (ids[1], off)])

        hist = self.history(run, 2)["turns"][0]["messages"]
        self.assertEqual(as_sent(hist), msgs[1:] + [{"role": "assistant", "content": answer}])


class ToolProblems(ToolTestCase):
    """Tool problems never end the turn: the model sees an error result."""

    def one_turn(self, user, tools, **opt):
        with FakeLLM() as fake:
            run = self.run_ok([{"text": user, "conversation_id": "p"},
                               {"op": "history", "conversation_id": "p"}],
                              options(fake, **opt), tools=tools, extra_args=DEBUG)
            reqs = fake.chat_requests()
        return run, reqs

    def assert_error_result(self, run, reqs, name, kind):
        """The turn succeeded and the model saw {"error": kind, ...} for `name`."""
        res = self.assertTurnOk(run.by_seq(1))
        steps = res["steps"]
        self.assertEqual([s["type"] for s in steps], ["tool_call", "tool_result", "answer"], steps)
        self.assertEqual(steps[0]["name"], name)
        self.assertEqual(steps[1]["call_id"], steps[0]["call_id"])
        self.assertTrue(steps[1]["is_error"], steps[1])
        content = self.tool_content(steps[1])
        self.assertEqual(content["error"], kind, content)
        self.assertIsInstance(content.get("error_text"), str)
        # What the model saw: the same content in the tool message.
        self.assertEqual(len(reqs), 2, reqs)
        tool_msgs = [m for m in reqs[1]["body"]["messages"] if m["role"] == "tool"]
        self.assertEqual(tool_msgs, [{"role": "tool", "tool_call_id": steps[0]["call_id"],
                                      "content": steps[1]["content"]}])
        self.assertEqual(res["response"],
                         "Done. %s: %s (messages: 4)" % (name, steps[1]["content"]))
        # ... and history keeps it, so later requests stay valid.
        hist = self.history(run, 2)["turns"][0]["messages"]
        self.assertEqual(hist[2], dict(tool_msgs[0], name=name, is_error=True))
        self.assertEqual(len(hist), 4)
        return content

    def test_unknown_tool(self):
        run, reqs = self.one_turn("[[tool:launch_rockets {}]]",
                                  [tool("turn_on", TURN_ON_RESULT)])
        self.assert_error_result(run, reqs, "launch_rockets", "unknown_tool")
        self.assertEqual(host_calls(run.stderr), [], "the host must never run an unknown tool")

    def test_invalid_argument_json(self):
        run, reqs = self.one_turn("[[tool:turn_on {not json]]",
                                  [tool("turn_on", TURN_ON_RESULT)])
        self.assert_error_result(run, reqs, "turn_on", "invalid_arguments")
        self.assertEqual(host_calls(run.stderr), [], "the host must not run a call with bad args")
        steps = run.by_seq(1)["steps"]
        self.assertEqual(steps[0]["arguments"], "{not json", "raw string kept in steps")
        # What is sent back (and stored) must be a string of valid JSON, or every
        # later request of the conversation gets HTTP 400 (anchor #1).
        sent = reqs[1]["body"]["messages"][2]["tool_calls"][0]["function"]["arguments"]
        self.assertIsInstance(sent, str)
        json.loads(sent)
        stored = self.history(run, 2)["turns"][0]["messages"][1]
        self.assertEqual(stored["tool_calls"][0]["function"]["arguments"], sent)
        self.assertIn("not json", sent, "the model should still see what it sent")

    def test_host_reports_tool_error(self):
        canned = {"reason": "device offline"}
        run, reqs = self.one_turn('[[tool:turn_on {"name":"garage"}]]',
                                  [tool("turn_on", canned, error=True)])
        content = self.assert_error_result(run, reqs, "turn_on", "tool_error")
        # The host's JSON stays JSON (not JSON inside a string).
        self.assertEqual(content, {"error": "tool_error",
                                   "error_text": "The tool failed (see details)",
                                   "details": canned})
        self.assertEqual(len(host_calls(run.stderr)), 1)

    def test_host_tool_error_message_becomes_error_text(self):
        canned = {"error": "device offline", "code": 503}
        run, reqs = self.one_turn('[[tool:turn_on {"name":"garage"}]]',
                                  [tool("turn_on", canned, error=True)])
        content = self.assert_error_result(run, reqs, "turn_on", "tool_error")
        self.assertEqual(content, {"error": "tool_error", "error_text": "device offline",
                                   "details": canned})

    def test_host_tool_error_as_string_stays_text(self):
        run, reqs = self.one_turn('[[tool:turn_on {"name":"garage"}]]',
                                  [tool("turn_on", "device offline", error=True)])
        content = self.assert_error_result(run, reqs, "turn_on", "tool_error")
        self.assertEqual(content, {"error": "tool_error", "error_text": "device offline"})

    def test_slow_host_answers_from_another_thread(self):
        canned = {"ok": True, "late": True}
        run, reqs = self.one_turn('[[tool:turn_on {"name":"kitchen"}]]',
                                  [tool("turn_on", canned, delay_ms=300, from_thread=True)],
                                  tool_timeout_ms=5000)
        res = self.assertTurnOk(run.by_seq(1))
        self.assertEqual(res["steps"][1]["content"], compact(canned))
        self.assertFalse(res["steps"][1]["is_error"])
        self.assertEqual(res["response"], "Done. turn_on: %s (messages: 4)" % compact(canned))
        self.assertGreaterEqual(run.arrival(1), 0.3, "the result cannot precede the tool")
        self.assertEqual(len(reqs), 2)
        self.assertEqual(reqs[1]["body"]["messages"][-1]["content"], compact(canned))

    def test_host_never_answers(self):
        run, reqs = self.one_turn('[[tool:turn_on {"name":"kitchen"}]]',
                                  [tool("turn_on", TURN_ON_RESULT, never=True)],
                                  tool_timeout_ms=300)
        self.assert_error_result(run, reqs, "turn_on", "timeout")
        self.assertGreaterEqual(run.arrival(1), 0.28)
        self.assertLess(run.arrival(1), 3.0 * SLOW, "bounded by tool_timeout_ms")

    def test_per_request_tools_only_in_that_turn(self):
        garage = {"name": "open_garage", "description": "Open the garage door",
                  "parameters": {"type": "object", "properties": {}}}
        with FakeLLM() as fake:
            run = self.run_ok(
                [{"text": "[[tool:open_garage {}]]", "conversation_id": "pt", "tools": [garage]},
                 {"text": "[[tool:open_garage {}]] again", "conversation_id": "pt"},
                 {"op": "history", "conversation_id": "pt"}],
                options(fake), tools=[tool("turn_on", TURN_ON_RESULT)], extra_args=DEBUG)
            reqs = fake.chat_requests()
        self.assertEqual(len(reqs), 4, [r["body"] for r in reqs])
        self.assertEqual(sorted(tool_names(reqs[0])), ["open_garage", "turn_on"])
        self.assertEqual(sorted(tool_names(reqs[1])), ["open_garage", "turn_on"])
        self.assertEqual(tool_names(reqs[2]), ["turn_on"], "per-turn tool leaked into turn 2")
        self.assertEqual(tool_names(reqs[3]), ["turn_on"])
        offered = next(t for t in reqs[0]["body"]["tools"]
                       if t["function"]["name"] == "open_garage")
        self.assertEqual(offered["function"]["description"], "Open the garage door")

        # Turn 1: the host was asked (it does not implement it: a tool_error).
        first = self.assertTurnOk(run.by_seq(1))
        self.assertEqual(self.tool_content(first["steps"][1])["error"], "tool_error")
        # Turn 2: not offered any more, so unknown_tool and the host is not asked.
        second = self.assertTurnOk(run.by_seq(2))
        self.assertEqual(self.tool_content(second["steps"][1])["error"], "unknown_tool")
        self.assertEqual([n for n, _ in host_calls(run.stderr)], ["open_garage"])
        hist = self.history(run, 3)
        self.assertEqual(len(hist["turns"]), 2)


class IterationLimit(ToolTestCase):

    def test_endless_tools_end_with_forced_answer(self):
        """Anchor #5: after max_tool_iterations the plugin forces a text answer."""
        with FakeLLM("--fault", "endless_tools") as fake:
            run = self.run_ok([{"text": "keep going", "conversation_id": "loop"},
                               {"op": "history", "conversation_id": "loop"}],
                              options(fake, max_tool_iterations=3),
                              tools=[tool("turn_on", TURN_ON_RESULT)], extra_args=DEBUG)
            reqs = fake.chat_requests()

        self.assertEqual(len(reqs), 4, "3 tool rounds + 1 final request")
        for r in reqs[:3]:
            self.assertNotEqual(r["body"].get("tool_choice"), "none", r["body"])
            self.assertEqual(r["fault"], "endless_tools")
        self.assertEqual(reqs[3]["body"].get("tool_choice"), "none")
        self.assertEqual(tool_names(reqs[3]), ["turn_on"])
        self.assertEqual([m["role"] for m in reqs[3]["body"]["messages"]],
                         ["system", "user"] + ["assistant", "tool"] * 3)

        res = self.assertTurnOk(run.by_seq(1))  # an answer, not an error
        self.assertTrue(res["response"].startswith("Final: Done. turn_on: "), res["response"])
        steps = res["steps"]
        self.assertEqual([s["type"] for s in steps],
                         ["tool_call", "tool_result"] * 3 + ["answer"])
        ids = [s["call_id"] for s in steps if s["type"] == "tool_call"]
        self.assertEqual(len(set(ids)), 3)
        self.assertEqual([s["call_id"] for s in steps if s["type"] == "tool_result"], ids)
        self.assertEqual(len(host_calls(run.stderr)), 3)

        hist = self.history(run, 2)["turns"][0]["messages"]
        self.assertEqual([m["role"] for m in hist],
                         ["user"] + ["assistant", "tool"] * 3 + ["assistant"])
        self.assertEqual(hist[-1], {"role": "assistant", "content": res["response"]})

    def test_history_keeps_two_tool_rounds_in_order(self):
        canned = {"ok": 1}
        with FakeLLM("--fault", "endless_tools") as fake:
            run = self.run_ok([{"text": "twice", "conversation_id": "r2"},
                               {"op": "history", "conversation_id": "r2"},
                               {"text": "and now?", "conversation_id": "r2"}],
                              options(fake, max_tool_iterations=2),
                              tools=[tool("turn_on", canned)])
            reqs = fake.chat_requests()
        res = self.assertTurnOk(run.by_seq(1))
        ids = [s["call_id"] for s in res["steps"] if s["type"] == "tool_call"]
        self.assertEqual(len(ids), 2)
        self.assertNotEqual(ids[0], ids[1])
        c = compact(canned)

        def tc(i):
            return {"role": "assistant", "content": None,
                    "tool_calls": [{"id": i, "type": "function",
                                    "function": {"name": "turn_on", "arguments": "{}"}}]}

        expected = [{"role": "user", "content": "twice"},
                    tc(ids[0]),
                    {"role": "tool", "tool_call_id": ids[0], "content": c, "name": "turn_on"},
                    tc(ids[1]),
                    {"role": "tool", "tool_call_id": ids[1], "content": c, "name": "turn_on"},
                    {"role": "assistant", "content": res["response"]}]
        hist = self.history(run, 2)
        self.assertEqual(hist["turns"][0]["messages"], expected)
        self.assertEqual(res["steps"],
                         [{"type": "tool_call", "call_id": ids[0], "name": "turn_on",
                           "arguments": {}},
                          {"type": "tool_result", "call_id": ids[0], "name": "turn_on",
                           "content": c, "is_error": False},
                          {"type": "tool_call", "call_id": ids[1], "name": "turn_on",
                           "arguments": {}},
                          {"type": "tool_result", "call_id": ids[1], "name": "turn_on",
                           "content": c, "is_error": False},
                          {"type": "answer", "content": res["response"]}])
        self.assertEqual(len(reqs), 3 + 3, [r["body"]["messages"] for r in reqs])
        # Anchor #10: the next turn sends the whole tool sequence back.
        self.assertEqual(reqs[3]["body"]["messages"][1:7], as_sent(expected))
        self.assertEqual(reqs[3]["body"]["messages"][7], {"role": "user", "content": "and now?"})
        self.assertEqual(len(reqs[3]["body"]["messages"]), 8)


class DemoHome(ToolTestCase):

    def test_turn_on_then_ask(self):
        with FakeLLM() as fake:
            run = self.run_ok([{"text": "turn on the kitchen light", "conversation_id": "home"},
                               {"text": "is the kitchen light on", "conversation_id": "home"},
                               {"op": "history", "conversation_id": "home"}],
                              options(fake), tools="demo")
            reqs = fake.chat_requests()

        first = self.assertTurnOk(run.by_seq(1))
        self.assertEqual(first["steps"][0]["name"], "turn_on")
        self.assertEqual(first["steps"][0]["arguments"], {"name": "kitchen"})
        self.assertEqual(self.tool_content(first["steps"][1]),
                         {"ok": True, "name": "kitchen", "state": "on"})
        self.assertIn("turn_on", first["response"])
        self.assertIn("kitchen", first["response"])

        second = self.assertTurnOk(run.by_seq(2))
        self.assertEqual(second["steps"][0]["name"], "get_state")
        self.assertEqual(second["steps"][0]["arguments"], {"name": "kitchen"})
        state = self.tool_content(second["steps"][1])
        self.assertEqual(state["state"], "on", state)
        self.assertIn('"state":"on"', second["response"])

        self.assertEqual(sorted(tool_names(reqs[0])), ["get_state", "turn_off", "turn_on"])
        # The follow-up request carries the first turn, tool steps included.
        self.assertEqual(len(reqs), 4)
        follow = reqs[2]["body"]["messages"]
        self.assertEqual([m["role"] for m in follow],
                         ["system", "user", "assistant", "tool", "assistant", "user"])
        self.assertEqual(follow[1]["content"], "turn on the kitchen light")
        self.assertEqual(follow[3]["tool_call_id"], first["steps"][0]["call_id"])
        self.assertEqual(follow[4]["content"], first["response"])
        hist = self.history(run, 3)
        self.assertEqual([t["turn_id"] for t in hist["turns"]],
                         [first["turn_id"], second["turn_id"]])
        self.assertEqual(as_sent(hist["turns"][0]["messages"]), follow[1:5])

    def test_state_is_off_without_first_turn(self):
        """Control for the test above: without turning it on, the light is off."""
        with FakeLLM() as fake:
            run = self.run_ok([{"text": "is the kitchen light on", "conversation_id": "home"}],
                              options(fake), tools="demo")
        res = self.assertTurnOk(run.by_seq(1))
        self.assertEqual(self.tool_content(res["steps"][1])["state"], "off")


class Streaming(ToolTestCase):

    def test_plain_answer_streams_in_deltas(self):
        with FakeLLM() as fake:
            run = self.run_ok([{"text": "hello there, stream me", "conversation_id": "s"},
                               {"op": "history", "conversation_id": "s"}],
                              options(fake, stream=True))
            reqs = fake.chat_requests()
        res = self.assertTurnOk(run.by_seq(1))
        self.assertEqual(res["response"],
                         'You said: "hello there, stream me". I have seen 2 messages (1 from you).')
        self.assertGreater(res.get("deltas", 0), 1, res)
        self.assertEqual(res.get("streamed"), res["response"])
        self.assertIs(reqs[0]["body"].get("stream"), True)
        self.assertEqual(self.history(run, 2)["turns"][0]["messages"][-1],
                         {"role": "assistant", "content": res["response"]})

    def run_tool_turn(self, stream):
        user = '[[tool:turn_on {"name":"kitchen"}]] [[tool:turn_off {"name":"hall"}]]'
        with FakeLLM() as fake:
            run = self.run_ok([{"text": user, "conversation_id": "st"},
                               {"op": "history", "conversation_id": "st"}],
                              options(fake, stream=stream),
                              tools=[tool("turn_on", TURN_ON_RESULT),
                                     tool("turn_off", {"ok": True, "state": "off"})])
            reqs = fake.chat_requests()
        return run, reqs

    def test_streamed_tool_turn_commits_same_history(self):
        plain_run, plain_reqs = self.run_tool_turn(False)
        stream_run, stream_reqs = self.run_tool_turn(True)
        plain = self.assertTurnOk(plain_run.by_seq(1))
        streamed = self.assertTurnOk(stream_run.by_seq(1))
        self.assertNotIn("deltas", plain)
        self.assertGreater(streamed.get("deltas", 0), 1, streamed)
        self.assertEqual(streamed.get("streamed"), streamed["response"])
        self.assertEqual(streamed["response"], plain["response"])
        self.assertEqual(normalise_ids(streamed["steps"]), normalise_ids(plain["steps"]))
        self.assertEqual(len(stream_reqs), 2)
        self.assertTrue(all(r["body"].get("stream") is True for r in stream_reqs))
        self.assertTrue(all(not r["body"].get("stream") for r in plain_reqs))

        h_plain = self.history(plain_run, 2)["turns"][0]["messages"]
        h_stream = self.history(stream_run, 2)["turns"][0]["messages"]
        self.assertEqual(len(h_plain), 5)
        self.assertEqual(normalise_ids(h_stream), normalise_ids(h_plain))
        # The streamed tool_calls were reassembled: arguments intact.
        self.assertEqual([tc["function"]["arguments"] for tc in h_stream[1]["tool_calls"]],
                         ['{"name":"kitchen"}', '{"name":"hall"}'])


class FailedToolTurn(ToolTestCase):

    def test_failed_turn_after_a_tool_leaves_no_partial_sequence(self):
        """Anchor #1: a turn that dies while a tool is running stores nothing."""
        with FakeLLM() as fake:
            run = self.run_ok(
                [{"text": "hello", "conversation_id": "h"},
                 {"op": "history", "conversation_id": "h"},
                 {"text": '[[tool:turn_on {"name":"kitchen"}]]', "conversation_id": "h"},
                 {"op": "history", "conversation_id": "h"},
                 {"text": "after", "conversation_id": "h"},
                 {"op": "history", "conversation_id": "h"}],
                options(fake, turn_timeout_ms=int(700 * SLOW), tool_timeout_ms=int(5000 * SLOW)),
                tools=[tool("turn_on", TURN_ON_RESULT, delay_ms=int(2000 * SLOW))],
                extra_args=DEBUG)
            reqs = fake.chat_requests()
        self.assertTurnOk(run.by_seq(1))
        failed = self.assertTurnError(run.by_seq(3), "timeout")
        self.assertIsNone(failed["response"])
        # The step that happened is still reported, though history is untouched.
        self.assertEqual([s["type"] for s in failed["steps"]][:1], ["tool_call"])
        self.assertEqual(len(host_calls(run.stderr)), 1)
        self.assertEqual(run.op_raw(2), run.op_raw(4))
        self.assertLess(run.arrival(3) - run.arrival(2), 2.0 * SLOW)

        after = self.assertTurnOk(run.by_seq(5))
        self.assertEqual(after["response"],
                         'You said: "after". I have seen 4 messages (2 from you).')
        self.assertEqual([m["role"] for m in reqs[-1]["body"]["messages"]],
                         ["system", "user", "assistant", "user"])
        self.assertEqual(reqs[-1]["status"], 200)
        hist = self.history(run, 6)
        self.assertEqual([len(t["messages"]) for t in hist["turns"]], [2, 2])


if __name__ == "__main__":
    unittest.main()
