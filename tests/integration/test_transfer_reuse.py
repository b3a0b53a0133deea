"""A transfer's easy handle is kept for the next request (plugin/http/llm_http.c):
configured once per options snapshot, with only the body set per request.

Asserted from what the servers received: a request that libcurl must send
again (its kept-alive connection was closed under it) goes out byte for byte
the same, so the turn's body is still whole while it waits; and options
changed by update_options (base_url, api_key) reach the next request although
its easy handle was set up for the old ones.
"""
import json
import unittest

from harness import SLOW, FakeLLM, ParleyTestCase, options
from test_hardening import LoopbackServer, read_request  # its tests stay in their module

REPLY = json.dumps({"id": "chatcmpl-reuse", "object": "chat.completion", "created": 0,
                    "model": "fake-model",
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "again"},
                                 "finish_reason": "stop"}]}).encode()


class DroppingServer(LoopbackServer):
    """Keeps connections alive, but closes the connection that carries the
    request number `drop` (0-based; "second": every request that is the second
    on its connection) without answering it: libcurl must send that request
    again on a new connection.  Records every body received."""

    def __init__(self, drop):
        self.drop = drop
        self.bodies = []
        self.connections = 0
        super().__init__()

    def handle(self, conn):
        self.connections += 1
        on_this = 0
        with conn:
            conn.settimeout(10 * SLOW)
            while True:
                try:
                    body = read_request(conn)
                except OSError:
                    return
                if body is None:
                    return
                self.bodies.append(body)
                on_this += 1
                if len(self.bodies) - 1 == self.drop or (self.drop == "second" and on_this == 2):
                    return  # closed under a kept-alive request: no answer at all
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n" % len(REPLY) + REPLY)


class ResendOnReusedConnection(ParleyTestCase):

    def test_request_sent_again_after_the_server_closed_the_connection(self):
        server = DroppingServer(drop=1)
        try:
            opts = options(None, base_url="http://127.0.0.1:%d/v1" % server.port, max_retries=0)
            run = self.run_ok([
                {"text": "first", "conversation_id": "c1"},
                {"op": "wait"},
                {"text": "second, on the kept-alive connection", "conversation_id": "c1"},
            ], opts)
            self.assertTurnOk(run.by_seq(1))
            # max_retries 0: only libcurl's own resend can have saved this turn.
            self.assertTurnOk(run.by_seq(3))
            self.assertEqual(len(server.bodies), 3, "the second request was sent twice")
            self.assertEqual(server.bodies[1], server.bodies[2], "sent again byte for byte")
            sent = json.loads(server.bodies[2])
            self.assertEqual(sent["messages"][-1]["content"], "second, on the kept-alive connection")
            self.assertEqual(server.connections, 2)
        finally:
            server.close()

    def test_every_turn_resent_on_one_kept_handle(self):
        # libcurl gives up after 5 resends of one transfer; a kept easy handle
        # must start each request with a fresh count, as a reset one does.
        server = DroppingServer(drop="second")
        try:
            opts = options(None, base_url="http://127.0.0.1:%d/v1" % server.port, max_retries=0)
            lines = []
            for i in range(8):
                lines += [{"text": "turn %d" % i}, {"op": "wait"}]
            run = self.run_ok(lines, opts)
            for i in range(8):
                self.assertTurnOk(run.by_seq(2 * i + 1))
            # Turn 0 on a new connection; each later one dropped once, then sent again.
            self.assertEqual(len(server.bodies), 1 + 7 * 2)
            for i in range(1, 8):
                self.assertEqual(server.bodies[2 * i - 1], server.bodies[2 * i])
        finally:
            server.close()


class NewOptionsOnAKeptHandle(ParleyTestCase):

    def test_update_options_moves_the_next_request_to_the_new_url_and_key(self):
        with FakeLLM() as one, FakeLLM() as two:
            run = self.run_ok([
                {"text": "to one", "conversation_id": "c1"},
                {"op": "wait"},
                {"op": "update_options", "options": options(two, api_key="key-two")},
                {"text": "to two", "conversation_id": "c1"},
                {"op": "wait"},
                {"op": "update_options", "options": options(one, api_key="key-three")},
                {"text": "to one again", "conversation_id": "c1"},
            ], options(one, api_key="key-one"))
            for seq in (1, 4, 7):
                self.assertTurnOk(run.by_seq(seq))
            for seq in (3, 6):
                self.assertIsNone(run.by_seq(seq)["error"])
            seen = [(r["body"]["messages"][-1]["content"], r["authorization"])
                    for r in one.chat_requests()]
            self.assertEqual(seen, [("to one", "Bearer key-one"),
                                    ("to one again", "Bearer key-three")])
            seen = [(r["body"]["messages"][-1]["content"], r["authorization"])
                    for r in two.chat_requests()]
            self.assertEqual(seen, [("to two", "Bearer key-two")])


if __name__ == "__main__":
    unittest.main()
