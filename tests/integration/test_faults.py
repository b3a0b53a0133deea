"""End-to-end resilience tests: every fault mode of the fake LLM server.

For each fault the tests assert the error code the host sees, a time bound,
what the plugin sent (retries, from the server's request log), and that the
history op output of an existing conversation is byte-identical before and
after the failed turn.

Anchors (see /work/shared/ANCHORS.md) proven here:
  #1  a failed turn never leaves anything behind in history;
  #8  429 is retried honouring Retry-After and surfaces as rate_limited,
      not as a generic failure.
"""
import json
import os
import resource
import socket
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import FakeLLM, ParleyTestCase, SLOW, options  # noqa: E402
from test_tools import shim  # noqa: E402  (local helpers: arrival times, raw lines)

CONV = "faulty"
SECRET = "sk-SECRET-123"


def closed_port():
    """A loopback port nobody listens on (bound, then released)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class FaultTestCase(ParleyTestCase):
    maxDiff = None

    def fault_turn(self, text, code, max_s, min_s=0.0, fake_args=(), **opt):
        """On an existing conversation: one good turn, history, the faulty
        turn, history.  Asserts the error `code` (None = success), the time
        bound and (on failure) byte-identical history.  Returns
        (result line, the faulty turn's requests, duration, run)."""
        lines = [{"text": "hello", "conversation_id": CONV},
                 {"op": "history", "conversation_id": CONV},
                 {"text": text, "conversation_id": CONV},
                 {"op": "history", "conversation_id": CONV},
                 {"op": "metrics"}]
        with FakeLLM(*fake_args) as fake:
            run = shim(lines, options(fake, **opt), timeout=30)
            reqs = fake.chat_requests()
        self.assertEqual(run.rc, 0, "parley-host failed (rc %r): %s" % (run.rc, run.stderr))
        self.assertTurnOk(run.by_seq(1))
        self.assertEqual(len(run.by_seq(2)["result"]["turns"]), 1)
        res = run.by_seq(3)
        self.assertEqual(res["conversation_id"], CONV)
        self.assertTrue(res["turn_id"])
        if code is None:
            self.assertTurnOk(res)
            self.assertEqual(len(run.by_seq(4)["result"]["turns"]), 2)
        else:
            self.assertTurnError(res, code)
            self.assertIsNone(res["response"])
            self.assertIsInstance(res["error"]["message"], str)
            self.assertEqual(run.op_raw(4), run.op_raw(2),
                             "history changed by a failed turn")
        duration = run.arrival(3) - run.arrival(2)
        self.assertLessEqual(duration, max_s * SLOW, "turn took %.2fs" % duration)
        self.assertGreaterEqual(duration, min_s, "turn took only %.2fs" % duration)
        # Requests of the faulty turn (the first request served turn 1).
        self.assertEqual(reqs[0]["status"], 200)
        return res, reqs[1:], duration, run

    def metrics(self, run):
        line = run.by_seq(5)
        self.assertEqual(line["op"], "metrics")
        self.assertIsNone(line["error"])
        return line["result"]


class HttpErrors(FaultTestCase):

    def test_500_without_retries(self):
        res, reqs, _, run = self.fault_turn("[[fault:500]] boom", "http_status", 2.0,
                                            max_retries=0)
        self.assertIn("The server had an error while processing your request.",
                      res["error"]["message"])
        self.assertIn("500", res["error"]["message"])
        self.assertEqual([r["status"] for r in reqs], [500])
        self.assertEqual(self.metrics(run)["llm_retries"], 0)
        self.assertEqual(res["usage"]["requests"], 1, "a failed request is a request")

    def test_500_twice_then_success(self):
        res, reqs, _, run = self.fault_turn("[[fault:500x2]] flaky", None, 3.0, max_retries=2)
        self.assertEqual([r["status"] for r in reqs], [500, 500, 200])
        self.assertEqual(reqs[0]["body"], reqs[1]["body"])
        self.assertEqual(reqs[0]["body"], reqs[2]["body"])
        self.assertEqual(res["response"],
                         'You said: "[[fault:500x2]] flaky". I have seen 4 messages (2 from you).')
        m = self.metrics(run)
        self.assertEqual(m["llm_retries"], 2)
        self.assertEqual(m["llm_requests"], 4)
        self.assertEqual(res["usage"]["requests"], 3, "retried requests count")

    def test_503_exhausts_retries(self):
        res, reqs, _, run = self.fault_turn("[[fault:503x5]] down", "http_status", 3.0,
                                            max_retries=2)
        self.assertEqual([r["status"] for r in reqs], [503, 503, 503])
        self.assertIn("The server is overloaded or not ready yet.", res["error"]["message"])
        self.assertEqual(self.metrics(run)["llm_retries"], 2)
        self.assertEqual(res["usage"]["requests"], 3)

    def test_429_retry_honours_retry_after(self):
        """Anchor #8: Retry-After: 1 is honoured (retry_backoff_ms is only 10)."""
        res, reqs, duration, _ = self.fault_turn("[[fault:429:1x1]] slow down", None, 3.0,
                                                 min_s=0.9, max_retries=1)
        self.assertEqual([r["status"] for r in reqs], [429, 200])
        self.assertEqual(reqs[0]["body"], reqs[1]["body"])

    def test_retry_after_is_capped_by_retry_max_delay_ms(self):
        _, reqs, duration, _ = self.fault_turn("[[fault:429:30x1]] much later", None, 2.5,
                                               max_retries=1, retry_max_delay_ms=300)
        self.assertEqual([r["status"] for r in reqs], [429, 200])

    def test_429_without_retries_is_rate_limited(self):
        res, reqs, _, _ = self.fault_turn("[[fault:429]] limited", "rate_limited", 0.85,
                                          max_retries=0)
        self.assertEqual([r["status"] for r in reqs], [429])
        self.assertIn("Rate limit reached for requests", res["error"]["message"])

    def test_429_after_all_retries_is_rate_limited(self):
        res, reqs, _, run = self.fault_turn("[[fault:429:0]] limited", "rate_limited", 2.0,
                                            max_retries=2)
        self.assertEqual([r["status"] for r in reqs], [429, 429, 429])
        self.assertEqual(self.metrics(run)["llm_retries"], 2)

    def test_4xx_is_never_retried(self):
        for status, text in (("400", "Fake client error 400."),
                             ("401", "Incorrect API key provided."),
                             ("404", "Fake client error 404.")):
            with self.subTest(status=status):
                res, reqs, _, run = self.fault_turn("[[fault:%s]] no" % status, "http_status",
                                                    2.0, max_retries=3)
                self.assertEqual([r["status"] for r in reqs], [int(status)])
                self.assertIn(text, res["error"]["message"])
                self.assertEqual(self.metrics(run)["llm_retries"], 0)

    def test_request_the_server_rejects_as_malformed(self):
        # The fake server validates requests like the real API; a bad marker
        # is the one way to make a valid request rejected with an OpenAI 400.
        res, reqs, _, _ = self.fault_turn("[[latency:abc]]", "http_status", 2.0, max_retries=3)
        self.assertEqual([r["status"] for r in reqs], [400])
        self.assertIn("bad [[latency:MS]] marker", res["error"]["message"])


class Timeouts(FaultTestCase):

    def test_hang_hits_request_timeout(self):
        _, reqs, _, _ = self.fault_turn("[[fault:hang]] hello?", "timeout", 3.0, min_s=0.45,
                                        request_timeout_ms=500, max_retries=0)
        self.assertEqual(len(reqs), 1)
        self.assertIsNone(reqs[0]["status"])

    def test_turn_timeout_bounds_a_slow_reply(self):
        self.fault_turn("[[latency:5000]] slow", "timeout", 2.5, min_s=0.75,
                        turn_timeout_ms=800)

    def test_turn_timeout_cuts_a_hung_request(self):
        # request_timeout_ms is far away; the turn deadline ends the wait.
        _, reqs, _, _ = self.fault_turn("[[fault:hang]] again", "timeout", 2.5, min_s=0.75,
                                        request_timeout_ms=5000, turn_timeout_ms=800,
                                        max_retries=5)
        self.assertEqual(len(reqs), 1)


class BadResponses(FaultTestCase):

    def test_malformed_replies_are_bad_response(self):
        expect = {"truncated": "not JSON", "not_json": "not JSON", "bad_shape": "choices",
                  "bad_shape:empty_choices": "choices", "bad_shape:null_message": "message",
                  "invalid_utf8": ""}
        for mode, words in expect.items():
            with self.subTest(mode=mode):
                res, reqs, _, run = self.fault_turn("[[fault:%s]] x" % mode, "bad_response", 2.0,
                                                    max_retries=2)
                # A complete 200 reply is never retried.
                self.assertEqual([(r["status"], r["fault"]) for r in reqs], [(200, mode)])
                self.assertIn(words, res["error"]["message"])
                self.assertEqual(self.metrics(run)["llm_retries"], 0)

    def test_error_object_in_a_200_is_classified_by_its_type(self):
        """Mock servers and proxies send {"error": {...}} with status 200, or as an event of
        the stream: read its type / code as the status it stands for, streamed or not, in
        each provider's shape -- not bad_response with the advice to retry."""
        from test_providers import llm_requests, provider_options
        expect = {401: ("http_status", 1, "API key"),   # an invalid key: never retried
                  429: ("rate_limited", 3, "Rate limit"),  # retried, then rate_limited
                  400: ("http_status", 1, "Fake client error")}
        with FakeLLM() as fake:
            for provider in ("openai", "anthropic", "ollama"):
                for stream in (False, True):
                    for status, (code, tries, words) in expect.items():
                        fault = "error_event" if stream else "error200"
                        with self.subTest(provider=provider, stream=stream, status=status):
                            before = len(llm_requests(fake, provider))
                            run = shim([{"text": "[[fault:%s:%d]] x" % (fault, status),
                                         "conversation_id": "e"},
                                        {"op": "history", "conversation_id": "e"}],
                                       provider_options(fake, provider, stream=stream,
                                                        max_retries=2, retry_backoff_ms=1),
                                       timeout=30)
                            if provider == "ollama" and status == 400:
                                code = "bad_response"  # a bare message, no type: unknown
                            res = self.assertTurnError(run.by_seq(1), code)
                            self.assertIn(words, res["error"]["message"])
                            if code != "bad_response":
                                self.assertIn("LLM server error", res["error"]["message"])
                            reqs = llm_requests(fake, provider)[before:]
                            self.assertEqual(len(reqs), tries, reqs)
                            self.assertEqual({r["status"] for r in reqs}, {200})
                            self.assertEqual(run.by_seq(2)["error"]["code"], "not_found")

    def test_reset_mid_response(self):
        """The server sends headers and half the body, then drops the connection.

        Observed (and right): bad_response, not connect, and no retry: the
        server was reached and answered 200, bytes of the reply had arrived,
        and the spec retries only failures before any response byte (the
        request may have been acted on)."""
        res, reqs, _, _ = self.fault_turn("[[fault:reset]] x", "bad_response", 2.0,
                                          max_retries=2)
        self.assertEqual([(r["status"], r["fault"]) for r in reqs], [(200, "reset")])

    def test_oversized_reply_is_cut_off(self):
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        res, reqs, _, _ = self.fault_turn("[[fault:oversized:1024]] big", "bad_response", 2.0,
                                          max_retries=2, max_response_bytes=1048576)
        self.assertIn("max_response_bytes", res["error"]["message"])
        self.assertEqual(len(reqs), 1)
        # A 1 GiB body was offered: the shim (a reaped child) never held it.
        peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        self.assertLess(peak_kib, max(before, 256 * 1024 * SLOW),
                        "parley-host peaked at %d KiB" % peak_kib)


class StreamFaults(FaultTestCase):

    def test_stream_cut(self):
        for mode in ("stream_cut", "stream_cut:abort"):
            with self.subTest(mode=mode):
                res, reqs, _, _ = self.fault_turn("[[fault:%s]] x" % mode, "bad_response", 2.0,
                                                  stream=True, max_retries=2)
                self.assertEqual([(r["status"], r["fault"]) for r in reqs], [(200, mode)])
                self.assertIs(reqs[0]["body"]["stream"], True)

    def test_stream_idle_timeout(self):
        _, reqs, _, _ = self.fault_turn("[[fault:slow_stream:3000]] x", "timeout", 2.9,
                                        min_s=0.9, stream=True, stream_idle_timeout_ms=1000,
                                        request_timeout_ms=5000, max_retries=2)
        self.assertEqual(len(reqs), 1, "a stream that started is not retried")

    def test_slow_stream_within_idle_timeout_succeeds(self):
        res, reqs, duration, run = self.fault_turn("[[fault:slow_stream:100]] drip", None, 6.0,
                                                   min_s=0.5, stream=True,
                                                   stream_idle_timeout_ms=1000)
        self.assertGreaterEqual(res.get("deltas", 0), 5, res)
        self.assertEqual(res["streamed"], res["response"])
        self.assertEqual(res["response"],
                         'You said: "[[fault:slow_stream:100]] drip". '
                         'I have seen 4 messages (2 from you).')
        self.assertEqual(len(reqs), 1)


class CancelAndShutdown(FaultTestCase):

    def test_cancel_mid_request(self):
        lines = [{"text": "hello", "conversation_id": CONV},
                 {"op": "history", "conversation_id": CONV},
                 {"text": "[[latency:3000]] slow", "conversation_id": CONV},
                 {"op": "sleep", "ms": 300},
                 {"op": "cancel", "seq": 3},
                 {"op": "history", "conversation_id": CONV},
                 {"op": "cancel", "seq": 3}]
        with FakeLLM() as fake:
            run = shim(lines, options(fake), concurrency=2, timeout=30)
            reqs = fake.chat_requests()
        self.assertEqual(run.rc, 0, run.stderr)
        res = self.assertTurnError(run.by_seq(3), "cancelled")
        self.assertIsNone(res["response"])
        self.assertEqual(len(reqs), 2, "the cancelled request was in flight")
        self.assertEqual(run.by_seq(5), {"seq": 5, "op": "cancel", "result": None,
                                         "error": None})
        self.assertLess(run.arrival(3) - run.arrival(2), 1.5 * SLOW)
        self.assertEqual(run.op_raw(6), run.op_raw(2))
        # Cancelling a finished turn: not_found.
        self.assertEqual(run.by_seq(7)["error"]["code"], "not_found")
        self.assertLess(run.elapsed, 2.5 * SLOW)

    def test_sigint_cancels_every_turn_in_flight(self):
        lines = [{"text": "[[latency:%d]] n%d" % (5000 * SLOW, i),
                  "conversation_id": "k%d" % i} for i in range(10)]
        with FakeLLM() as fake:
            run = shim(lines, options(fake), concurrency=10, sigint_after=0.5 * SLOW, timeout=30)
            reqs = fake.chat_requests()
        self.assertEqual(run.rc, 130, run.stderr)
        self.assertEqual(sorted(l["seq"] for l in run.lines), list(range(1, 11)), run.lines)
        for seq in range(1, 11):
            self.assertTurnError(run.by_seq(seq), "cancelled")
        self.assertEqual(len(reqs), 10)
        self.assertLess(run.elapsed, 3.0 * SLOW)

    def test_busy_when_max_in_flight_reached(self):
        lines = [{"text": "[[latency:1000]] n%d" % i, "conversation_id": "b%d" % i}
                 for i in range(5)] + [{"op": "list"}, {"op": "metrics"}]
        with FakeLLM() as fake:
            run = shim(lines, options(fake, max_in_flight=2), concurrency=5, timeout=30)
            reqs = fake.chat_requests()
        self.assertEqual(run.rc, 0, run.stderr)
        for seq in (1, 2):
            self.assertTurnOk(run.by_seq(seq))
            self.assertGreaterEqual(run.arrival(seq), 0.9)
        for seq in (3, 4, 5):
            line = run.by_seq(seq)
            self.assertEqual(line["error"]["code"], "busy", line)
            self.assertLess(run.arrival(seq), 0.8 * SLOW, "busy must be immediate")
        self.assertEqual(len(reqs), 2)
        convs = run.by_seq(6)["result"]["conversations"]
        self.assertEqual(sorted(c["conversation_id"] for c in convs), ["b0", "b1"])
        self.assertEqual(run.by_seq(7)["result"]["rejected_busy"], 3)


class Connect(FaultTestCase):

    def test_connection_refused(self):
        opts = options(None, base_url="http://127.0.0.1:%d/v1" % closed_port(), max_retries=2)
        run = shim([{"op": "history", "conversation_id": CONV},
                    {"text": "anyone?", "conversation_id": CONV},
                    {"op": "history", "conversation_id": CONV},
                    {"op": "metrics"}], opts, timeout=30)
        self.assertEqual(run.rc, 0, run.stderr)
        self.assertTurnError(run.by_seq(2), "connect")
        self.assertEqual(run.by_seq(1)["error"]["code"], "not_found")
        self.assertEqual(run.op_raw(3), run.op_raw(1), "a failed turn created the conversation")
        self.assertEqual(run.by_seq(4)["result"]["llm_retries"], 2)
        self.assertLess(run.arrival(2) - run.arrival(1), 2.0 * SLOW)


class SecretHygiene(FaultTestCase):

    FAULTS = ["500", "401", "429:0", "not_json", "bad_shape", "truncated", "invalid_utf8",
              "reset", "hang"]

    def assert_no_secret(self, run, secret):
        self.assertNotIn(secret, "\n".join(run.raw))
        self.assertNotIn(secret, run.stderr)
        self.assertNotIn(secret.split("-", 1)[1], run.stderr)
        self.assertNotIn(secret.split("-", 1)[1], "\n".join(run.raw))

    def test_api_key_never_in_errors_or_logs(self):
        lines = [{"text": "hello", "conversation_id": CONV}]
        lines += [{"text": "[[fault:%s]] x" % f, "conversation_id": CONV} for f in self.FAULTS]
        lines += [{"op": "history", "conversation_id": CONV}, {"op": "metrics"}]
        with FakeLLM() as fake:
            run = shim(lines, options(fake, api_key=SECRET, debug_log_bodies=True,
                                      request_timeout_ms=400, max_retries=1),
                       extra_args=("--log-level", "debug"), timeout=30)
            reqs = fake.chat_requests()
        self.assertEqual(run.rc, 0, run.stderr)
        # The key was used ...
        self.assertTrue(reqs)
        self.assertTrue(all(r["authorization"] == "Bearer " + SECRET for r in reqs), reqs[:1])
        # ... every fault failed the turn, and debug logging was on ...
        for seq in range(2, 2 + len(self.FAULTS)):
            self.assertIsNotNone(run.by_seq(seq)["error"], run.by_seq(seq))
        self.assertIn("parley[debug]", run.stderr)
        # ... yet the key appears nowhere.
        self.assert_no_secret(run, SECRET)

    def test_api_key_env_never_in_errors_or_logs(self):
        secret = "sk-ENVSECRET-456"
        env = dict(os.environ, PARLEY_E2E_KEY=secret)
        with FakeLLM() as fake:
            run = shim([{"text": "[[fault:401]] x"}, {"text": "[[fault:500]] y"}],
                       options(fake, api_key_env="PARLEY_E2E_KEY", debug_log_bodies=True,
                               max_retries=0),
                       extra_args=("--log-level", "debug"), env=env, timeout=30)
            reqs = fake.chat_requests()
        self.assertEqual(run.rc, 0, run.stderr)
        self.assertEqual([r["authorization"] for r in reqs], ["Bearer " + secret] * 2)
        self.assertTurnError(run.by_seq(1), "http_status")
        self.assert_no_secret(run, secret)

    def test_a_server_quoting_the_key_back_is_redacted(self):
        # Some gateways echo the key in their error text: it reaches no
        # error_message and no log line, whole or cut off by the text's bound.
        from test_http_edges import Stub
        key = "sk-proj-EchoedBack-7f3a9c41d2"
        said = lambda text: json.dumps({"error": {"message": text}})
        echo = said("Incorrect API key provided: Bearer %s. Find yours at example.com" % key)
        cut = said("x" * 480 + " " + key)  # the 500-byte bound cuts the key
        json_type = {"Content-Type": "application/json"}
        sse = {"Content-Type": "text/event-stream"}
        stub = Stub([(500, json_type, echo), (401, json_type, echo),  # 1: retried, then 401
                     (401, json_type, cut),                          # 2: cut off
                     (200, json_type, echo)])                        # 3: an error with 200
        streamed = Stub([(200, sse, "data: %s\n\n" % echo)])
        for s in (stub, streamed):
            self.addCleanup(s.close)
        runs, messages = [], []
        for server, lines, stream in ((stub, 3, False), (streamed, 1, True)):
            opts = options(None, base_url=server.base_url, api_key=key, debug_log_bodies=True,
                           max_retries=1, retry_backoff_ms=10, stream=stream)
            run = shim([{"text": "t%d" % n} for n in range(lines)], opts,
                       extra_args=("--log-level", "debug"), timeout=30)
            self.assertEqual(run.rc, 0, run.stderr)
            runs.append(run)
            messages += [run.by_seq(n + 1)["error"]["message"] for n in range(lines)]
        self.assertEqual((stub.requests, streamed.requests), (4, 1))
        for m in messages:
            self.assertIn("[redacted]", m)
        self.assertIn("Incorrect API key provided: Bearer [redacted]. Find yours", messages[0])
        self.assertTrue(messages[1].endswith("x [redacted]..."), messages[1])
        self.assertIn("[redacted]", runs[0].stderr)  # the retry's log line and the debug body
        for run in runs:
            for text in ("\n".join(run.raw), run.stderr):
                self.assertNotIn(key, text)
                self.assertNotIn("EchoedBack", text)
                self.assertNotIn("sk-proj-Echo", text)

    def test_api_key_not_in_connect_errors(self):
        opts = options(None, base_url="http://127.0.0.1:%d/v1" % closed_port(), api_key=SECRET,
                       debug_log_bodies=True, max_retries=1)
        run = shim([{"text": "x"}], opts, extra_args=("--log-level", "debug"), timeout=30)
        self.assertEqual(run.rc, 0, run.stderr)
        self.assertTurnError(run.by_seq(1), "connect")
        self.assert_no_secret(run, SECRET)


if __name__ == "__main__":
    unittest.main()
