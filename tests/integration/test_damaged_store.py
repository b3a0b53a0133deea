"""A stored message changed behind Parley's back (issue 27, item 3).

An SQLite row or a Redis turn holding '{"role":"user","content":"x"}],"injected":[{' must not be
spliced into what the history reads return (the result would not be JSON, and would carry the
injected structure), nor into the next request.  Every read of that conversation says `storage`,
naming it; a store-wide query leaves the damaged message out and answers with the rest; the
other conversations go on."""
import json
import os
import sqlite3
import tempfile
import unittest

from harness import FakeLLM, ParleyTestCase, options, run_shim
from redis_server import RedisServer

INJECTED = '{"role":"user","content":"x"}],"injected":[{'


class DamagedCase(ParleyTestCase):
    maxDiff = None

    def setUp(self):
        self.llm = FakeLLM()
        self.addCleanup(self.llm.close)

    def first_run(self, store):
        run = self.run_ok([{"text": "hello a", "conversation_id": "a"},
                           {"text": "hello b", "conversation_id": "b"}],
                          options(self.llm, history_store=store))
        return self.assertTurnOk(run.by_seq(1)), self.assertTurnOk(run.by_seq(2))

    def check_reads(self, store, a):
        lines = [{"op": "history", "conversation_id": "a"},
                 {"op": "query"},
                 {"op": "query", "conversation_id": "a", "persona": "", "interface_type": ""},
                 {"op": "turn", "turn_id": a["turn_id"]},
                 {"op": "message", "message_id": a["user_message_id"]},
                 {"text": "again", "conversation_id": "a"},
                 {"text": "hello again b", "conversation_id": "b"},
                 {"op": "history", "conversation_id": "b"}]
        run = run_shim(lines, options(self.llm, history_store=store))
        self.assertEqual(run.rc, 0, run.stderr)
        for line in run.raw:
            json.loads(line)  # every line is JSON (the shim re-parses what Parley returned)
            self.assertNotIn("injected", line)
        for seq in (1, 4, 5, 6):
            err = run.by_seq(seq)["error"]
            self.assertIsNotNone(err, run.by_seq(seq))
            self.assertEqual(err["code"], "storage", err)
        # A turn says why in its error; the reads (whose ABI returns a status only), in the log.
        self.assertIn("conversation 'a' holds a damaged message", run.by_seq(6)["error"]["message"])
        for what in ("history_get", "turn_get", "message_get"):
            self.assertIn("%s: %s store" % (what, "sqlite" if store.startswith("sqlite") else "redis"),
                          run.stderr)
        everything = run.by_seq(2)
        self.assertIsNone(everything["error"], everything)
        texts = [m["message"]["content"] for m in everything["result"]["messages"]]
        self.assertIn("hello b", texts, "the rest of a store-wide query still answers")
        self.assertNotIn("hello a", texts)
        self.assertIsNone(run.by_seq(3)["error"])
        self.assertTurnOk(run.by_seq(7))
        self.assertEqual(len(run.by_seq(8)["result"]["turns"]), 2)
        self.assertIn("conversation 'a' holds a damaged message", run.stderr,
                      "the query that left it out says so in the log")


class Sqlite(DamagedCase):
    def test_damaged_row_is_refused_by_name(self):
        d = tempfile.TemporaryDirectory(prefix="parley-damaged-")
        self.addCleanup(d.cleanup)
        path = os.path.join(d.name, "history.db")
        a, _ = self.first_run("sqlite:" + path)
        db = sqlite3.connect(path)
        with db:
            n = db.execute("UPDATE messages SET json = ? WHERE message_id = ?",
                           (INJECTED, a["user_message_id"])).rowcount
        db.close()
        self.assertEqual(n, 1)
        self.check_reads("sqlite:" + path, a)

    def test_message_closed_by_a_bracket_is_refused(self):
        # Its brackets balance, so a scanner counting '{' and ']' alike took it for a message
        # and sent it to the server as it was (the request was not JSON); it is damage.
        d = tempfile.TemporaryDirectory(prefix="parley-damaged-")
        self.addCleanup(d.cleanup)
        path = os.path.join(d.name, "history.db")
        a, _ = self.first_run("sqlite:" + path)
        db = sqlite3.connect(path)
        with db:
            db.execute("UPDATE messages SET json = ? WHERE message_id = ?",
                       ('{"role":"user","content":"x"]', a["user_message_id"]))
        db.close()
        run = run_shim([{"text": "again", "conversation_id": "a"},
                        {"text": "hello again b", "conversation_id": "b"}],
                       options(self.llm, history_store="sqlite:" + path))
        self.assertEqual(run.rc, 0, run.stderr)
        err = run.by_seq(1)["error"]
        self.assertIsNotNone(err, run.by_seq(1))
        self.assertEqual(err["code"], "storage", err)
        self.assertIn("conversation 'a' holds a damaged message", err["message"])
        self.assertTurnOk(run.by_seq(2))


class Redis(DamagedCase):
    def test_damaged_turn_is_refused_by_name(self):
        server = RedisServer()
        self.addCleanup(server.stop)
        a, _ = self.first_run(server.url)
        key = "parley:turn:" + a["turn_id"]
        answer = json.dumps({"role": "assistant", "content": a["response"]},
                            separators=(",", ":"), ensure_ascii=False)
        self.assertIn(answer, server.cli("HGET", key, "msgs"))
        # The user message's place (its length in lens too) holds the injection.
        server.cli("HSET", key, "msgs", INJECTED + "," + answer,
                   "lens", "%d,%d" % (len(INJECTED.encode()), len(answer.encode())))
        self.check_reads(server.url, a)


if __name__ == "__main__":
    unittest.main()
