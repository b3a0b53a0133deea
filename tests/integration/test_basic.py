"""The foundation: one turn end to end, options, connection failures, input
validation, continue_conversation, the system prompt, concurrency and sampling
parameters.  Every assertion is on what the host sees (the shim's result
lines) or on exactly what the plugin sent (the fake server's request log)."""
import json
import socket
import unittest

from harness import (SLOW, UUID_RE, FakeLLM, ParleyTestCase, fake_reply, messages, options,
                     run_shim)

PROMPT = "You are a test assistant."
SECRET = "sk-parley-TEST-9f8e7d6c5b4a"


def closed_port():
    """A loopback port nobody listens on (bound, then released)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class BasicTurn(ParleyTestCase):
    def setUp(self):
        self.llm = FakeLLM()

    def tearDown(self):
        self.llm.close()

    def test_hello_stateless(self):
        run = self.run_ok([{"text": "hello"}, {"op": "list"}], options(self.llm))
        line = self.assertTurnOk(run.by_seq(1))
        expected = fake_reply("hello", 2, 1)
        self.assertEqual(line["response"], expected)
        self.assertRegex(line["turn_id"], UUID_RE)
        self.assertIsNone(line["conversation_id"])
        self.assertEqual(line["steps"], [{"type": "answer", "content": expected}])
        self.assertIs(line["continue_conversation"], False)
        self.assertNotIn("deltas", line)
        # Stateless: nothing is stored.
        self.assertEqual(run.by_seq(2)["result"], {"conversations": []})
        self.assertIsNone(run.by_seq(2)["error"])

        reqs = self.llm.chat_requests()
        self.assertEqual(len(reqs), 1, reqs)
        r = reqs[0]
        self.assertEqual(r["method"], "POST")
        self.assertEqual(r["path"], "/v1/chat/completions")
        self.assertTrue(r["content_type"].startswith("application/json"), r["content_type"])
        self.assertEqual(r["status"], 200)
        self.assertEqual(r["body"]["model"], "fake-model")
        self.assertEqual(messages(r), [{"role": "system", "content": PROMPT},
                                       {"role": "user", "content": "hello"}])
        # No tools offered, nothing streamed, no sampling parameters.
        for key in ("tools", "tool_choice", "temperature", "top_p", "max_tokens"):
            self.assertNotIn(key, r["body"])
        self.assertIn(r["body"].get("stream"), (None, False))
        self.assertIsNone(r["authorization"], "no api_key: no Authorization header")

    def test_two_stateless_turns_share_nothing(self):
        run = self.run_ok([{"text": "one"}, {"text": "two"}], options(self.llm))
        a, b = self.assertTurnOk(run.by_seq(1)), self.assertTurnOk(run.by_seq(2))
        self.assertNotEqual(a["turn_id"], b["turn_id"])
        self.assertEqual(b["response"], fake_reply("two", 2, 1))
        reqs = self.llm.chat_requests()
        self.assertEqual([messages(r)[1:] for r in reqs],
                         [[{"role": "user", "content": "one"}],
                          [{"role": "user", "content": "two"}]])

    def test_base_url_trailing_slash(self):
        run = self.run_ok([{"text": "slash"}], options(self.llm, base_url=self.llm.base_url + "/"))
        self.assertTurnOk(run.by_seq(1))
        self.assertEqual([r["path"] for r in self.llm.requests()], ["/v1/chat/completions"])


class ApiKey(ParleyTestCase):
    def setUp(self):
        self.llm = FakeLLM()

    def tearDown(self):
        self.llm.close()

    def check_secret_hidden(self, run):
        self.assertNotIn(SECRET, run.stderr)
        self.assertNotIn(SECRET, "\n".join(run.raw))
        # Only the last characters of the key may ever be shown; not even a
        # long prefix.
        self.assertNotIn(SECRET[:12], run.stderr)

    def test_bearer_header_and_never_logged(self):
        lines = [{"text": "hello"}, {"text": "[[echo-request]]"}, {"text": "boom [[fault:500]]"}]
        run = self.run_ok(lines, options(self.llm, api_key=SECRET, debug_log_bodies=True,
                                         max_retries=0),
                          extra_args=("--log-level", "debug"))
        self.assertTurnOk(run.by_seq(1))
        self.assertTurnOk(run.by_seq(2))
        self.assertTurnError(run.by_seq(3), "http_status")
        reqs = self.llm.chat_requests()
        self.assertEqual(len(reqs), 3)
        for r in reqs:
            self.assertEqual(r["authorization"], "Bearer " + SECRET)
        # The debug log really ran (so "not in stderr" is not vacuous): the
        # request bodies were logged.
        self.assertIn("hello", run.stderr, "debug_log_bodies should log the request body")
        self.check_secret_hidden(run)

    def test_api_key_env(self):
        run = self.run_ok([{"text": "hello"}],
                          options(self.llm, api_key_env="PARLEY_TEST_KEY", debug_log_bodies=True),
                          extra_args=("--log-level", "debug"),
                          env={"PARLEY_TEST_KEY": SECRET})
        self.assertTurnOk(run.by_seq(1))
        self.assertEqual([r["authorization"] for r in self.llm.chat_requests()],
                         ["Bearer " + SECRET])
        self.check_secret_hidden(run)

    def test_no_key_no_header(self):
        run = self.run_ok([{"text": "hello"}], options(self.llm, api_key=None))
        self.assertTurnOk(run.by_seq(1))
        self.assertEqual([r["authorization"] for r in self.llm.chat_requests()], [None])


class BadOptions(ParleyTestCase):
    """create() rejects bad options: exit 1, stderr names the option."""

    CASES = [
        # (name, overrides, removed keys, option named in the message)
        ("unknown key", {"bogus_option": 1}, (), "bogus_option"),
        ("wrong type string->int", {"max_retries": "2"}, (), "max_retries"),
        ("wrong type number", {"temperature": "hot"}, (), "temperature"),
        ("wrong type bool", {"stream": "yes"}, (), "stream"),
        ("wrong type float for int", {"connect_timeout_ms": 1.5}, (), "connect_timeout_ms"),
        ("out of range high", {"max_retries": 11}, (), "max_retries"),
        ("out of range low", {"connect_timeout_ms": 0}, (), "connect_timeout_ms"),
        ("out of range negative", {"max_history_turns": -1}, (), "max_history_turns"),
        ("temperature above 2", {"temperature": 2.5}, (), "temperature"),
        ("top_p above 1", {"top_p": 1.01}, (), "top_p"),
        ("missing model", {}, ("model",), "model"),
        ("empty model", {"model": ""}, (), "model"),
        ("bad base_url scheme", {"base_url": "ftp://127.0.0.1/v1"}, (), "base_url"),
        ("base_url not a URL", {"base_url": "localhost:8080"}, (), "base_url"),
        ("base_url wrong type", {"base_url": 8080}, (), "base_url"),
        ("api_key_env unset", {"api_key_env": "PARLEY_TEST_SURELY_UNSET"}, (), "api_key_env"),
        ("tools not an array", {"tools": {"name": "x"}}, (), "tools"),
        ("unknown history store", {"history_store": "redis://h"}, (), "history_store"),
        ("history store not a string", {"history_store": 1}, (), "history_store"),
        ("unknown history_sync", {"history_sync": "sometimes"}, (), "history_sync"),
        ("history_keep_turns negative", {"history_keep_turns": -1}, (), "history_keep_turns"),
    ]

    def test_rejected(self):
        for name, over, removed, named in self.CASES:
            with self.subTest(name):
                o = options(None, **over)
                for k in removed:
                    o.pop(k)
                run = run_shim([{"text": "never sent"}], o,
                               env={"PARLEY_TEST_SURELY_UNSET": None}, timeout=20)
                self.assertEqual(run.rc, 1, "%s: rc %r, stderr %r" % (name, run.rc, run.stderr))
                self.assertIn("create failed", run.stderr)
                self.assertIn("'%s'" % named, run.stderr, run.stderr)
                self.assertEqual(run.lines, [], "no turn may run when create() failed")

    def test_accepted_boundaries(self):
        # The edges of the ranges are valid: a test that only checks
        # rejections would pass against a plugin that rejects everything.
        with FakeLLM() as llm:
            o = options(llm, max_retries=10, temperature=2, top_p=0, max_history_turns=0,
                        stream_idle_timeout_ms=1000, max_response_bytes=1024, api_key=None)
            run = self.run_ok([{"text": "edge"}], o)
            self.assertTurnOk(run.by_seq(1))


class ServerDown(ParleyTestCase):
    def test_connection_refused_retries_then_connect_error(self):
        port = closed_port()
        for retries in (0, 2):
            with self.subTest(max_retries=retries):
                o = options(None, base_url="http://127.0.0.1:%d/v1" % port,
                            connect_timeout_ms=1000, max_retries=retries, retry_backoff_ms=50,
                            retry_max_delay_ms=200)
                run = self.run_ok([{"text": "anyone there?"}, {"op": "metrics"},
                                   {"text": "still there?"}], o, timeout=30)
                line = self.assertTurnError(run.by_seq(1), "connect")
                self.assertIsNone(line["response"])
                self.assertRegex(line["turn_id"], UUID_RE)
                self.assertTrue(line["error"]["message"])
                m = run.by_seq(2)["result"]
                self.assertEqual(m["llm_retries"], retries, m)
                self.assertEqual(m["turns_failed"], 1, m)
                self.assertEqual(m["turns_ok"], 0, m)
                self.assertTurnError(run.by_seq(3), "connect")
                # Refused connections fail fast: two turns with retries and
                # 50-200 ms backoff, far below any hang.
                self.assertLess(run.elapsed, 8 * SLOW, run.elapsed)
                if retries:
                    # The backoff really happened (2 retries x >= ~50 ms with jitter, x2 turns).
                    self.assertGreater(run.elapsed, 0.1)

    def test_blackhole_connect_timeout_bounded(self):
        # A listener with a full accept queue: SYNs are dropped and connect()
        # hangs; only connect_timeout_ms ends each attempt.
        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen(0)
        port = srv.getsockname()[1]
        filler = socket.create_connection(("127.0.0.1", port))
        try:
            o = options(None, base_url="http://127.0.0.1:%d/v1" % port, connect_timeout_ms=300,
                        max_retries=1, retry_backoff_ms=10, retry_max_delay_ms=50)
            run = self.run_ok([{"text": "hello?"}, {"op": "metrics"}], o, timeout=30)
        finally:
            filler.close()
            srv.close()
        line = run.by_seq(1)
        self.assertIsNotNone(line["error"], line)
        self.assertIn(line["error"]["code"], ("connect", "timeout"), line)
        self.assertEqual(run.by_seq(2)["result"]["llm_retries"], 1)
        # Two attempts of 300 ms each: not a hang, and the timeout was honoured.
        self.assertGreaterEqual(run.elapsed, 0.55, run.elapsed)
        self.assertLess(run.elapsed, 5 * SLOW, run.elapsed)


class MalformedLines(ParleyTestCase):
    def test_each_rejected_and_next_works(self):
        llm = FakeLLM()
        self.addCleanup(llm.close)
        bad = [
            "this is not json",
            "[1, 2, 3]",
            '"just a string"',
            {"conversation_id": "c1"},               # missing text
            {"text": 42},                            # text of the wrong type
            {"text": None},
            {"text": ""},                            # empty text
            {"text": "hi", "conversation_id": ""},   # invalid ids
            {"text": "hi", "conversation_id": "bad\u0001id"},
            {"text": "hi", "conversation_id": "x" * 300},
            {"text": "hi", "conversation_id": 7},
            {"text": "hi", "context": "not an object"},
            '{"text": "truncated line"',
        ]
        lines = bad + [{"text": "valid after all", "conversation_id": "c1"},
                       {"op": "list"}, {"op": "metrics"}]
        run = self.run_ok(lines, options(llm))
        for i, b in enumerate(bad, start=1):
            with self.subTest(line=b):
                line = run.by_seq(i)
                self.assertEqual(line["error"]["code"], "invalid_input", line)
                self.assertTrue(line["error"]["message"], line)
                self.assertIsNone(line.get("response"))
        n = len(bad)
        ok = self.assertTurnOk(run.by_seq(n + 1))
        self.assertEqual(ok["response"], fake_reply("valid after all", 2, 1))
        self.assertEqual(ok["conversation_id"], "c1")
        # Nothing but the valid line reached the server or the history.
        reqs = llm.chat_requests()
        self.assertEqual([messages(r)[1:] for r in reqs],
                         [[{"role": "user", "content": "valid after all"}]])
        self.assertEqual([c["conversation_id"] for c in run.by_seq(n + 2)["result"]["conversations"]],
                         ["c1"])
        self.assertEqual(run.by_seq(n + 3)["result"]["turns_ok"], 1)
        self.assertEqual(len(run.lines), n + 3, run.lines)


class ContinueConversation(ParleyTestCase):
    def test_question_mark_and_friends(self):
        llm = FakeLLM()
        self.addCleanup(llm.close)
        lines = [
            {"text": "plain"},
            {"text": "[[ask]] please"},
            # [[echo-system]] answers with the system message: pick its ending.
            {"text": "[[echo-system]]", "extra_system_prompt": "End with a semicolon;"},
            {"text": "[[echo-system]]", "extra_system_prompt": "Fullwidth \uff1f"},
            {"text": "[[echo-system]]", "extra_system_prompt": "A question? Not at the end."},
        ]
        run = self.run_ok(lines, options(llm))
        got = [(run.by_seq(i)["response"][-12:], run.by_seq(i)["continue_conversation"])
               for i in range(1, 6)]
        self.assertEqual([c for _, c in got], [False, True, True, True, False], got)
        self.assertTrue(run.by_seq(2)["response"].endswith("Anything else?"))


class SystemPrompt(ParleyTestCase):
    def setUp(self):
        self.llm = FakeLLM()

    def tearDown(self):
        self.llm.close()

    def test_extra_system_prompt_after_the_user_text(self):
        # The turn's own instructions go after the stable prefix (system prompt, history):
        # in the turn's user message, after its text, under a heading (docs/history.md).
        # The fake's [[echo-system]] shows the system prompt, then those instructions.
        lines = [{"text": "[[echo-system]]", "extra_system_prompt": "The user is in the kitchen."},
                 {"text": "[[echo-system]]"}]
        run = self.run_ok(lines, options(self.llm))
        want = PROMPT + "\n\nThe user is in the kitchen."
        self.assertEqual(self.assertTurnOk(run.by_seq(1))["response"], want)
        self.assertEqual(self.assertTurnOk(run.by_seq(2))["response"], PROMPT)
        reqs = self.llm.chat_requests()
        self.assertEqual(messages(reqs[0]), [
            {"role": "system", "content": PROMPT},
            {"role": "user", "content": "[[echo-system]]\n\n[Instructions for this turn, from "
                                        "the system, not from the user]\nThe user is in the "
                                        "kitchen."}])
        self.assertEqual(messages(reqs[1])[0], {"role": "system", "content": PROMPT})

    def test_extra_prompt_is_per_turn_not_stored(self):
        lines = [{"text": "first", "conversation_id": "sp", "extra_system_prompt": "Only once."},
                 {"text": "second", "conversation_id": "sp"}]
        self.run_ok(lines, options(self.llm))
        second = messages(self.llm.chat_requests()[1])
        self.assertEqual(second[0], {"role": "system", "content": PROMPT})
        self.assertNotIn("Only once.", json.dumps(second))

    def test_empty_prompt_omits_system_message(self):
        run = self.run_ok([{"text": "no system"}], options(self.llm, prompt=""))
        self.assertEqual(self.assertTurnOk(run.by_seq(1))["response"],
                         fake_reply("no system", 1, 1))
        self.assertEqual(messages(self.llm.chat_requests()[0]),
                         [{"role": "user", "content": "no system"}])


class Concurrency(ParleyTestCase):
    def test_40_stateless_turns_concurrency_8(self):
        latency = 100
        with FakeLLM("--latency-ms", str(latency)) as llm:
            texts = ["message number %d" % i for i in range(1, 41)]
            run = self.run_ok([{"text": t} for t in texts], options(llm), concurrency=8)
            self.assertEqual(sorted(l["seq"] for l in run.lines), list(range(1, 41)))
            for i, t in enumerate(texts, start=1):
                line = self.assertTurnOk(run.by_seq(i))
                self.assertEqual(line["response"], fake_reply(t, 2, 1))
                self.assertIsNone(line["conversation_id"])
            self.assertEqual(len({l["turn_id"] for l in run.lines}), 40)
            reqs = llm.chat_requests()
            self.assertEqual(sorted(messages(r)[1]["content"] for r in reqs), sorted(texts))
            self.assertTrue(all(len(messages(r)) == 2 for r in reqs))
            if SLOW == 1:
                # 40 x 100 ms serially would be 4 s; 8 at a time ~0.5 s.
                self.assertLess(run.elapsed, 2.5, "turns did not run concurrently")


class SamplingParameters(ParleyTestCase):
    def test_sent_only_when_set(self):
        with FakeLLM() as llm:
            self.run_ok([{"text": "a"}], options(llm, temperature=0.25, top_p=0.5, max_tokens=64))
            self.run_ok([{"text": "b"}], options(llm, temperature=0))
            self.run_ok([{"text": "c"}], options(llm, temperature=None, top_p=None,
                                                 max_tokens=None))
            self.run_ok([{"text": "d"}], options(llm))
            bodies = [r["body"] for r in llm.chat_requests()]
            self.assertEqual(len(bodies), 4)
            keys = ("temperature", "top_p", "max_tokens")
            self.assertEqual({k: bodies[0].get(k) for k in keys},
                             {"temperature": 0.25, "top_p": 0.5, "max_tokens": 64})
            self.assertEqual(bodies[1]["temperature"], 0)
            self.assertNotIn("top_p", bodies[1])
            self.assertNotIn("max_tokens", bodies[1])
            for b in bodies[2:]:
                for k in keys:
                    self.assertNotIn(k, b)


if __name__ == "__main__":
    unittest.main()
