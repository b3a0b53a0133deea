"""Several hosts, one Redis: history_store "redis://..." end to end.

Two parley-host processes (two hosts) share conversations through a real
redis-server (never a mock).  What each host sent is read from the fake
LLM's request log: every request of a conversation must carry every turn
committed before it, in order, and nothing of a turn still running.
"""
import json
import os
import signal
import socket
import subprocess
import threading
import time
import unittest

from harness import SLOW, FakeLLM, InteractiveShim, ParleyTestCase, options, run_shim, user_texts
from redis_server import RedisServer

PASSWORD = "pw-9f3k@redis"


def redis_options(fake, redis, **kw):
    return options(fake, history_store=redis.url, max_history_turns=100, **kw)


def requests_of(llm, conversation_marker):
    """Chat requests whose last user text holds the marker, in arrival order."""
    return [r for r in llm.chat_requests()
            if user_texts(r) and conversation_marker in user_texts(r)[-1]]


class RedisCase(ParleyTestCase):
    maxDiff = None
    redis_debug = False

    def setUp(self):
        self.redis = RedisServer(PASSWORD, debug=self.redis_debug)
        self.addCleanup(self.redis.stop)
        self.llm = FakeLLM()
        self.addCleanup(self.llm.close)

    def host(self, concurrency=1, **kw):
        sh = InteractiveShim(redis_options(self.llm, self.redis, **kw), concurrency=concurrency)
        self.addCleanup(sh.close)
        return sh

    def assert_no_password(self, *texts):
        for t in texts:
            self.assertNotIn(PASSWORD, t or "")
            self.assertNotIn(PASSWORD.split("@")[0], t or "")


class TestTwoHosts(RedisCase):
    def test_alternating_turns_see_each_other(self):
        a, b = self.host(), self.host()
        for i in range(6):
            host = a if i % 2 == 0 else b
            self.assertTurnOk(host.turn({"text": "alt %d" % i, "conversation_id": "alt"}))
        reqs = requests_of(self.llm, "alt ")
        self.assertEqual(len(reqs), 6)
        for i, r in enumerate(reqs):  # each sees every earlier turn, whichever host ran it
            self.assertEqual(user_texts(r), ["alt %d" % j for j in range(i + 1)])
        # Both hosts read back the same bytes.
        ha = a.op("history", conversation_id="alt")
        hb = b.op("history", conversation_id="alt")
        self.assertIsNone(ha["error"])
        self.assertEqual(a.raw[-1], b.raw[-1].replace('"seq": %d' % hb["seq"],
                                                     '"seq": %d' % ha["seq"]))
        self.assertEqual(len(ha["result"]["turns"]), 6)

    def test_concurrent_turns_on_one_conversation_run_in_strict_order(self):
        n = 6
        a, b = self.host(concurrency=n), self.host(concurrency=n)
        # Each turn takes a while at the LLM, so without the lease they would overlap.
        for i in range(n):
            a.send({"text": "[[latency:150]] A%d" % i, "conversation_id": "race"})
            b.send({"text": "[[latency:150]] B%d" % i, "conversation_id": "race"})
        results = [a.wait_seq(i + 1, timeout=60) for i in range(n)]
        results += [b.wait_seq(i + 1, timeout=60) for i in range(n)]
        for r in results:
            self.assertTurnOk(r)
        reqs = requests_of(self.llm, "[[latency:150]]")
        self.assertEqual(len(reqs), 2 * n)
        # Strict order: request k carries exactly the k turns before it, in the
        # order they ran; none of a turn still running (nothing interleaved).
        ran = []
        for r in reqs:
            self.assertEqual(user_texts(r), ran + [user_texts(r)[-1]])
            ran.append(user_texts(r)[-1])
        # Each host's own turns keep their submission order (its lane).
        self.assertEqual([t for t in ran if " A" in t], ["[[latency:150]] A%d" % i for i in range(n)])
        self.assertEqual([t for t in ran if " B" in t], ["[[latency:150]] B%d" % i for i in range(n)])
        hist = a.op("history", conversation_id="race")["result"]
        self.assertEqual([t["messages"][0]["content"] for t in hist["turns"]], ran)
        # No lease is left behind.
        self.assertEqual(self.redis.cli("EXISTS", "parley:lease:0:/0:/race").strip(), "0")

    def test_different_conversations_do_not_wait_for_each_other(self):
        a, b = self.host(), self.host()
        a.send({"text": "[[latency:%d]] slow one" % int(5000 * SLOW), "conversation_id": "one"})
        deadline = time.time() + 10 * SLOW
        while not requests_of(self.llm, "slow one"):  # a holds the lease on "one"
            self.assertLess(time.time(), deadline)
            time.sleep(0.02)
        self.assertTurnOk(b.turn({"text": "other", "conversation_id": "two"}))
        # b's turn on "two" was done while a's turn on "one" still held its lease.
        self.assertEqual(a.raw, [])
        self.assertTurnOk(a.wait_seq(1, timeout=30))

    def test_an_append_waits_for_another_hosts_turn_on_the_conversation(self):
        a, b = self.host(), self.host()
        a.send({"text": "[[latency:%d]] slow turn" % int(1500 * SLOW), "conversation_id": "ap"})
        deadline = time.time() + 10 * SLOW
        while not requests_of(self.llm, "slow turn"):  # a holds the lease on "ap"
            self.assertLess(time.time(), deadline)
            time.sleep(0.02)
        appended = b.op("append", conversation_id="ap", content="the washing machine finished")
        self.assertIsNone(appended["error"], appended)
        # b's append waited for the lease: a's turn was committed first.
        turn = a.wait_seq(1, timeout=30)
        self.assertTurnOk(turn)
        hist = b.op("history", conversation_id="ap")["result"]
        self.assertEqual([t["turn_id"] for t in hist["turns"]],
                         [turn["turn_id"], appended["turn_id"]])
        self.assertEqual(self.redis.cli("EXISTS", "parley:lease:0:/0:/ap").strip(), "0")
        self.assertTurnOk(a.turn({"text": "and now?", "conversation_id": "ap"}))
        last = self.llm.chat_requests()[-1]["body"]["messages"]
        # joined to a's answer before it (one assistant message: roles alternate)
        self.assertTrue(any(m["role"] == "assistant" and
                            m["content"].endswith("\n\nthe washing machine finished")
                            for m in last), last)

    def test_a_turn_that_times_out_waiting_leaves_no_lease(self):
        a = self.host()
        b = self.host(turn_timeout_ms=int(500 * SLOW))
        a.send({"text": "[[latency:%d]] long" % int(2500 * SLOW), "conversation_id": "w"})
        deadline = time.time() + 10 * SLOW
        while not requests_of(self.llm, "long"):  # a holds the lease
            self.assertLess(time.time(), deadline)
            time.sleep(0.02)
        self.assertTurnError(b.turn({"text": "impatient", "conversation_id": "w"}), "timeout")
        self.assertTurnOk(a.wait_seq(1, timeout=30))
        # Neither the committed turn nor the timed-out one left a lease behind.
        self.assertEqual(self.redis.cli("EXISTS", "parley:lease:0:/0:/w").strip(), "0")
        self.assertTurnOk(b.turn({"text": "later", "conversation_id": "w"}))
        self.assertEqual(user_texts(requests_of(self.llm, "later")[-1]),
                         ["[[latency:%d]] long" % int(2500 * SLOW), "later"])

    def test_host_killed_mid_turn_blocks_only_until_the_lease_expires(self):
        a = self.host(history_lease_ms=1000)
        b = self.host(history_lease_ms=1000)
        self.assertTurnOk(a.turn({"text": "first", "conversation_id": "k"}))
        a.send({"text": "[[latency:20000]] dying", "conversation_id": "k"})
        deadline = time.time() + 10 * SLOW
        while not requests_of(self.llm, "dying"):  # a holds the lease and waits on the LLM
            self.assertLess(time.time(), deadline, "host a never sent its request")
            time.sleep(0.02)
        a.proc.send_signal(signal.SIGKILL)
        a.proc.wait()
        line = b.turn({"text": "after", "conversation_id": "k"}, timeout=30)
        self.assertTurnOk(line)
        # b waited for the dead host's lease, then saw exactly the committed turn:
        # the killed turn is not in history, nothing is duplicated.
        req = requests_of(self.llm, "after")[-1]
        self.assertEqual(user_texts(req), ["first", "after"])
        hist = b.op("history", conversation_id="k")["result"]
        self.assertEqual([t["messages"][0]["content"] for t in hist["turns"]], ["first", "after"])


class TestRedisQueries(RedisCase):
    """history_query / message_get (the shim's "query" and "message" ops) on Redis:
    positions are the store's, so a cursor from one host pages on another."""

    def test_query_and_message_across_two_hosts(self):
        a, b = self.host(), self.host()
        texts = ["Is the washing machine done?", "turn on the light", "WASHING again",
                 "good night"]
        for i, t in enumerate(texts):
            host = a if i % 2 == 0 else b
            line = {"text": t, "conversation_id": "k%d" % (i % 2)}
            if i == 3:
                line["interface_type"] = "telegram"
            self.assertTurnOk(host.turn(line))
        found = b.op("query", search="washing", role="user", order="oldest")
        self.assertIsNone(found["error"])
        self.assertEqual([m["message"]["content"] for m in found["result"]["messages"]],
                         [texts[0], texts[2]])
        self.assertIsNone(found["result"]["next_cursor"])
        tg = a.op("query", interface_type="telegram")["result"]["messages"]
        self.assertEqual([(m["role"], m["conversation_id"]) for m in tg],
                         [("assistant", "k1"), ("user", "k1")])
        k1 = a.op("query", conversation_id="k1", persona="", interface_type="",
                  order="oldest")["result"]["messages"]
        self.assertEqual([m["message"]["content"] for m in k1 if m["role"] == "user"],
                         [texts[1]])
        # Pages of 3, newest first: the first from host a, the rest from host b.
        page = a.op("query", limit=3)["result"]
        self.assertEqual(len(page["messages"]), 3)
        self.assertEqual(page["messages"][1]["message"]["content"], texts[3])
        rest = b.op("query", limit=10, cursor=page["next_cursor"])["result"]
        self.assertIsNone(rest["next_cursor"])
        every = page["messages"] + rest["messages"]
        self.assertEqual(len({m["message_id"] for m in every}), 8)
        self.assertEqual(every[-1]["message"]["content"], texts[0])
        # One message by id, from the other host: the same object the query gave.
        want = every[-1]
        got = b.op("message", message_id=want["message_id"])
        self.assertIsNone(got["error"])
        self.assertEqual(got["result"], want)
        missing = b.op("message", message_id="00000000-0000-4000-8000-000000000000")
        self.assertEqual(missing["error"]["code"], "not_found")
        # The conversation's lifetime in history and in the list.
        hist = a.op("history", conversation_id="k0")["result"]
        self.assertEqual((hist["message_count"], hist["turn_count"], hist["participants"]),
                         (4, 2, ["user", "assistant"]))
        listed = {c["conversation_id"]: c for c in b.op("list")["result"]["conversations"]
                  if c.get("interface_type") is None}
        self.assertEqual(listed["k0"]["message_count"], 4)
        # Cleared: its messages are gone from queries and by id.
        self.assertIsNone(a.op("clear", conversation_id="k0")["error"])
        self.assertEqual(b.op("message", message_id=want["message_id"])["error"]["code"],
                         "not_found")
        left = b.op("query", search="washing")["result"]["messages"]
        self.assertEqual(left, [])
        a.close()
        b.close()
        self.assert_no_password(a.stderr, b.stderr, "\n".join(a.raw + b.raw))


class TestRedisFaults(RedisCase):
    def test_redis_down_at_create_fails_clearly(self):
        url = self.redis.url
        self.redis.kill()
        run = run_shim([{"text": "hi", "conversation_id": "c"}],
                       options(self.llm, history_store=url))
        self.assertNotEqual(run.rc, 0)
        self.assertIn("option 'history_store': redis store 127.0.0.1:%d/0: cannot connect"
                      % self.redis.port, run.stderr)
        self.assert_no_password(run.stderr, "\n".join(run.raw))

    def test_wrong_password_fails_clearly(self):
        url = self.redis.url.replace(PASSWORD, "not-" + PASSWORD)
        run = run_shim([{"text": "hi"}], options(self.llm, history_store=url))
        self.assertNotEqual(run.rc, 0)
        self.assertIn("authentication failed", run.stderr)
        self.assert_no_password(run.stderr)

    def test_a_server_quoting_the_password_back_is_redacted(self):
        # Not Redis: a server on the Redis port that echoes the password in its
        # error (a proxy might).  The text reaches create()'s error redacted.
        echo = socket.socket()
        echo.bind(("127.0.0.1", 0))
        echo.listen(1)
        self.addCleanup(echo.close)

        def answer():
            conn, _ = echo.accept()
            with conn:
                conn.recv(4096)
                conn.sendall(b"-ERR invalid password '%s' for this proxy\r\n" % PASSWORD.encode())
                conn.recv(4096)

        threading.Thread(target=answer, daemon=True).start()
        url = "redis://:%s@127.0.0.1:%d" % (PASSWORD, echo.getsockname()[1])
        run = run_shim([{"text": "hi"}], options(self.llm, history_store=url))
        self.assertNotEqual(run.rc, 0)
        self.assertIn("authentication failed: ERR invalid password '[redacted]' for this proxy",
                      run.stderr)
        self.assert_no_password(run.stderr, "\n".join(run.raw))

    def test_redis_restarted_mid_run(self):
        a = self.host()
        self.assertTurnOk(a.turn({"text": "before", "conversation_id": "c"}))
        before = a.op("history", conversation_id="c")
        self.redis.kill()
        down = a.turn({"text": "while down", "conversation_id": "c"})
        self.assertTurnError(down, "storage")
        self.assertIn("redis store 127.0.0.1:%d/0" % self.redis.port, down["error"]["message"])
        self.assert_no_password(down["error"]["message"])
        self.assertEqual(requests_of(self.llm, "while down"), [])  # failed before the LLM
        self.redis.restart()  # empty: the test server keeps nothing on disk
        line = None
        deadline = time.time() + 10 * SLOW
        while time.time() < deadline:  # the store reconnects by itself
            line = a.turn({"text": "back", "conversation_id": "c"})
            if not line.get("error"):
                break
            time.sleep(0.1)
        self.assertTurnOk(line)
        self.assertEqual(user_texts(requests_of(self.llm, "back")[-1]), ["back"])
        self.assertIsNone(before["error"])
        a.close()
        self.assert_no_password(a.stderr, "\n".join(a.raw))

    def test_redis_killed_while_a_turn_runs_commits_nothing(self):
        a = self.host()
        self.assertTurnOk(a.turn({"text": "kept", "conversation_id": "c"}))
        a.send({"text": "[[latency:%d]] lost" % int(3000 * SLOW), "conversation_id": "c"})
        deadline = time.time() + 10 * SLOW
        while not requests_of(self.llm, "lost"):
            self.assertLess(time.time(), deadline)
            time.sleep(0.02)
        self.redis.kill()
        self.redis.restart()
        # The turn's commit meets a Redis that lost its data and the lease:
        # the append's fencing refuses it rather than write a lone turn.
        line = a.wait_seq(2, timeout=30)
        self.assertTurnError(line, "storage")
        self.assertIn("lease", line["error"]["message"])
        hist = a.op("history", conversation_id="c")
        self.assertEqual(hist["error"]["code"], "not_found")


class TestRedisStall(RedisCase):
    redis_debug = True

    def redis_answers(self):
        """Whether Redis answers an AUTH within 200 ms (not while DEBUG SLEEP holds it)."""
        try:
            with socket.create_connection(("127.0.0.1", self.redis.port), timeout=0.2) as c:
                c.sendall(b"AUTH %s\r\n" % PASSWORD.encode())
                return c.recv(16).startswith(b"+OK")
        except OSError:
            return False

    def test_a_lease_taken_after_its_turn_timed_out_is_given_back(self):
        # Redis stalls past the command timeout (5 s) and its reconnection (5 s)
        # while a turn asks for the lease: the turn times out, and the acquire
        # still runs when Redis wakes.  That lease must not block the next turn
        # for history_lease_ms.
        a = self.host(turn_timeout_ms=int(2000 * SLOW), history_lease_ms=60000)
        self.assertTurnOk(a.turn({"text": "before", "conversation_id": "s"}))
        stall = subprocess.Popen(["redis-cli", "-p", str(self.redis.port), "DEBUG", "SLEEP", "14"],
                                 env=dict(os.environ, REDISCLI_AUTH=PASSWORD),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.addCleanup(stall.wait)
        deadline = time.time() + 10 * SLOW
        while self.redis_answers():  # until the stall has begun
            self.assertLess(time.time(), deadline, "DEBUG SLEEP did not stall Redis")
            time.sleep(0.05)
        self.assertTurnError(a.turn({"text": "stalled", "conversation_id": "s"}), "timeout")
        stall.wait(timeout=30)
        after = None
        deadline = time.time() + 10 * SLOW
        while time.time() < deadline:  # the store reconnects by itself
            after = a.turn({"text": "after", "conversation_id": "s"})
            if not after.get("error") or after["error"]["code"] != "storage":
                break
            time.sleep(0.1)
        self.assertTurnOk(after)
        self.assertEqual(user_texts(requests_of(self.llm, "after")[-1]), ["before", "after"])
        self.assertEqual(self.redis.cli("EXISTS", "parley:lease:0:/0:/s").strip(), "0")


if __name__ == "__main__":
    unittest.main()
