"""HTTP edge cases the fake LLM cannot produce, served by a tiny stub server,
and the timing rules of streamed answers.

Each stub answers a scripted sequence of raw responses, one per request.
"""
import http.server
import json
import threading
import unittest

from harness import SLOW, FakeLLM, ParleyTestCase, options

OK_BODY = json.dumps({"id": "x", "object": "chat.completion", "choices": [
    {"index": 0, "message": {"role": "assistant", "content": "stub says hi"},
     "finish_reason": "stop"}]})


class Stub:
    """A loopback HTTP server answering each POST with the next scripted response."""

    def __init__(self, script):
        self.script = list(script)
        self.requests = 0
        stub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                status, headers, body = stub.script[min(stub.requests, len(stub.script) - 1)]
                stub.requests += 1
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.base_url = "http://127.0.0.1:%d/v1" % self.server.server_address[1]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class EmptyBodies(ParleyTestCase):
    def stub(self, script):
        s = Stub(script)
        self.addCleanup(s.close)
        return s

    def test_empty_429_is_rate_limited_and_retried(self):
        # Gateways send 429/503 with no body; the status must still count.
        s = self.stub([(429, {"Retry-After": "0"}, ""), (429, {"Retry-After": "0"}, ""),
                       (200, {"Content-Type": "application/json"}, OK_BODY)])
        run = self.run_ok([{"text": "hi"}], options(None, base_url=s.base_url, max_retries=2))
        self.assertTurnOk(run.by_seq(1))
        self.assertEqual(run.by_seq(1)["response"], "stub says hi")
        self.assertEqual(s.requests, 3)

    def test_empty_429_after_retries_is_rate_limited(self):
        s = self.stub([(429, {"Retry-After": "0"}, "")])
        run = self.run_ok([{"text": "hi"}], options(None, base_url=s.base_url, max_retries=1))
        line = self.assertTurnError(run.by_seq(1), "rate_limited")
        self.assertIn("HTTP 429", line["error"]["message"])
        self.assertEqual(s.requests, 2)

    def test_empty_503_is_retried_then_http_status(self):
        s = self.stub([(503, {}, "")])
        run = self.run_ok([{"text": "hi"}], options(None, base_url=s.base_url, max_retries=2))
        line = self.assertTurnError(run.by_seq(1), "http_status")
        self.assertIn("HTTP 503", line["error"]["message"])
        self.assertEqual(s.requests, 3)

    def test_empty_200_is_bad_response(self):
        s = self.stub([(200, {"Content-Type": "application/json"}, "")])
        run = self.run_ok([{"text": "hi"}], options(None, base_url=s.base_url, max_retries=2))
        self.assertTurnError(run.by_seq(1), "bad_response")
        self.assertEqual(s.requests, 1)  # a 200 is never retried

    def test_retry_after_http_date(self):
        # An HTTP date in the past means "now": retried at once, not after the backoff cap.
        s = self.stub([(429, {"Retry-After": "Sun, 06 Nov 1994 08:49:37 GMT"}, ""),
                       (200, {"Content-Type": "application/json"}, OK_BODY)])
        run = self.run_ok([{"text": "hi"}], options(None, base_url=s.base_url, max_retries=1,
                                                    retry_backoff_ms=5000, retry_max_delay_ms=5000))
        self.assertTurnOk(run.by_seq(1))
        self.assertLess(run.elapsed, 4 * SLOW)


class StreamTiming(ParleyTestCase):
    def setUp(self):
        self.llm = FakeLLM()
        self.addCleanup(self.llm.close)

    def test_long_stream_outlives_request_timeout(self):
        # A streamed answer that keeps coming is not cut off by request_timeout_ms
        # (it bounds the wait for the first byte); only idle gaps and the turn's
        # own deadline end it.
        o = options(self.llm, stream=True, request_timeout_ms=int(1000 * SLOW),
                    stream_idle_timeout_ms=int(2000 * SLOW))
        run = self.run_ok([{"text": "[[fault:slow_stream:250]] a reply long enough to stream"}], o)
        line = self.assertTurnOk(run.by_seq(1))
        self.assertGreater(line["deltas"], 4)
        self.assertGreater(run.elapsed, 1.0)

    def test_slow_first_byte_within_request_timeout(self):
        # A model that takes a while to start (loading, thinking) is not "stalled".
        o = options(self.llm, stream=True, request_timeout_ms=int(5000 * SLOW),
                    stream_idle_timeout_ms=500)
        run = self.run_ok([{"text": "[[latency:1200]] hello"}], o)
        self.assertTurnOk(run.by_seq(1))

    def test_no_first_byte_is_a_timeout_naming_request_timeout(self):
        o = options(self.llm, stream=True, request_timeout_ms=600, stream_idle_timeout_ms=5000,
                    max_retries=0)
        run = self.run_ok([{"text": "[[fault:hang]] hello"}], o)
        line = self.assertTurnError(run.by_seq(1), "timeout")
        self.assertIn("request_timeout_ms", line["error"]["message"])
        self.assertLess(run.elapsed, 4 * SLOW)


if __name__ == "__main__":
    unittest.main()
