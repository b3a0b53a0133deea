"""Durable history through parley-host: history_store "sqlite:PATH".

Restart: two runs on one file; the second continues every conversation (same
ids, turn ids, timestamps, messages, tool steps, order), and a conversation
that went idle while the host was down is gone.  Crash: parley-host killed
with SIGKILL again and again during many concurrent turns; a fresh run then
finds every turn that was reported ok, and no partial turn.  Refusals: a file
that is not a store stops the agent's creation with a message naming it, and
is left as it was.  Upgrade: a file of Parley 0.1 (schema version 1) is
upgraded in place and its conversations go on.
"""
import json
import os
import queue
import random
import signal
import sqlite3
import subprocess
import tempfile
import threading
import time
import unittest

from harness import (SLOW, FakeLLM, ParleyTestCase, _shim_args, as_sent, fake_reply, messages, options,
                     run_shim)

TOOLS = [
    {"name": "get_temp", "description": "Temperature of a room",
     "parameters": {"type": "object", "properties": {"room": {"type": "string"}}},
     "result": {"celsius": 21}},
    {"name": "set_mode", "description": "Set the heating mode",
     "parameters": {"type": "object", "properties": {"mode": {"type": "string"}}},
     "result": "ok"},
]


class StoreCase(ParleyTestCase):
    maxDiff = None

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory(prefix="parley-store-")
        self.addCleanup(self.dir.cleanup)
        self.path = os.path.join(self.dir.name, "history.db")
        self.llm = FakeLLM()
        self.addCleanup(self.llm.close)

    def opts(self, **kw):
        return options(self.llm, history_store="sqlite:" + self.path, **kw)


class Restart(StoreCase):
    def test_second_run_continues_every_conversation(self):
        idle_s = max(2, int(2 * SLOW))
        o = self.opts(history_idle_timeout_s=idle_s, max_tool_iterations=3)
        # A conversation that will be idle past the timeout by the second run.
        first = self.run_ok([{"text": "soon forgotten", "conversation_id": "old"}], o)
        old_turn = self.assertTurnOk(first.by_seq(1))["turn_id"]
        time.sleep(idle_s + 1.2)

        texts = ['warm? [[tool:get_temp {"room":"kitchen"}]]', "plain words",
                 'two calls [[tool:get_temp {"room":"hall"}]] [[tool:set_mode {"mode":"eco"}]]']
        lines = [{"text": t, "conversation_id": "home"} for t in texts]
        lines += [{"text": "hello", "conversation_id": "other"},
                  {"op": "history", "conversation_id": "home"}, {"op": "list"}]
        run1 = self.run_ok(lines, o, tools=TOOLS)
        turns1 = [self.assertTurnOk(run1.by_seq(i)) for i in range(1, 5)]
        hist1 = run1.by_seq(5)["result"]
        self.assertEqual([t["turn_id"] for t in hist1["turns"]],
                         [t["turn_id"] for t in turns1[:3]])
        self.assertEqual(len(hist1["turns"][0]["messages"]), 4)  # user, call, result, answer

        # Second process, same file: everything is there, byte for byte.
        n_requests = len(self.llm.chat_requests())
        run2 = self.run_ok([{"op": "history", "conversation_id": "home"},
                            {"text": "and now? [[recall]]", "conversation_id": "home"},
                            {"op": "history", "conversation_id": "home"},
                            {"op": "history", "conversation_id": "old"},
                            {"op": "turn", "turn_id": old_turn},
                            {"op": "turn", "turn_id": turns1[0]["turn_id"]},
                            {"op": "list"}], o, tools=TOOLS)
        self.assertEqual(run2.raw_result(1), run1.raw_result(5))
        # The new turn was sent the stored history, tool steps included, in order.
        request = self.llm.chat_requests()[n_requests]
        sent = messages(request)[1:]  # after the system prompt
        stored = [m for t in hist1["turns"] for m in t["messages"]]
        self.assertEqual(sent[:-1], as_sent(stored))
        self.assertEqual(sent[-1], {"role": "user", "content": "and now? [[recall]]"})
        new_turn = self.assertTurnOk(run2.by_seq(2))
        self.assertEqual(new_turn["response"],
                         'Your first message was: "%s". I have seen %d messages (%d from you).'
                         % (texts[0], len(stored) + 2, 4))
        hist2 = run2.by_seq(3)["result"]
        self.assertEqual(hist2["turns"][:3], hist1["turns"])
        self.assertEqual(hist2["turns"][3]["turn_id"], new_turn["turn_id"])
        self.assertEqual(hist2["created_at"], hist1["created_at"])
        # Idle while the host was down: gone.
        self.assertEqual(run2.by_seq(4)["error"]["code"], "not_found")
        self.assertEqual(run2.by_seq(5)["error"]["code"], "not_found")
        self.assertEqual(json.loads(run2.raw_result(6))["turn"], hist1["turns"][0])
        listed = [c["conversation_id"] for c in run2.by_seq(7)["result"]["conversations"]]
        self.assertEqual(listed, ["home", "other"])
        self.assertNotIn("old", [c["conversation_id"]
                                 for c in run1.by_seq(6)["result"]["conversations"]])

    def test_memory_store_forgets_on_restart(self):
        # The contrast that makes the durable store worth having.
        o = options(self.llm)
        self.run_ok([{"text": "hi", "conversation_id": "m"}], o)
        run = run_shim([{"op": "history", "conversation_id": "m"}], o)
        self.assertEqual(run.by_seq(1)["error"]["code"], "not_found")


class Refusals(StoreCase):
    def run_agent(self, path):
        o = options(self.llm, history_store="sqlite:" + path)
        return run_shim([{"text": "hi", "conversation_id": "x"}], o)

    def test_foreign_file_is_refused_unmodified(self):
        path = os.path.join(self.dir.name, "notes.txt")
        with open(path, "wb") as f:
            f.write(b"my shopping list\n" * 10)
        run = self.run_agent(path)
        self.assertNotEqual(run.rc, 0)
        self.assertIn(path, run.stderr)
        self.assertIn("not a SQLite database", run.stderr)
        with open(path, "rb") as f:
            self.assertEqual(f.read(), b"my shopping list\n" * 10)
        self.assertEqual(self.llm.chat_requests(), [])

    def test_fifo_is_refused_at_once(self):
        # Opening a FIFO for reading used to wait for a writer: create() never returned.
        path = os.path.join(self.dir.name, "pipe.db")
        os.mkfifo(path)
        run = self.run_agent(path)
        self.assertNotEqual(run.rc, 0)
        self.assertIn(path, run.stderr)
        self.assertIn("not a regular file (it is a FIFO (named pipe))", run.stderr)
        self.assertLess(run.elapsed, 20 * SLOW)
        self.assertFalse(os.path.exists(path + "-lock"))

    def test_symbolic_link_is_named_as_one(self):
        self.run_ok([{"text": "hi", "conversation_id": "x"}], self.opts())
        link = os.path.join(self.dir.name, "link.db")
        os.symlink(self.path, link)
        run = self.run_agent(link)
        self.assertNotEqual(run.rc, 0)
        self.assertIn("%s: a symbolic link (to %s): give the real path"
                      % (link, os.path.realpath(self.path)), run.stderr)
        self.assertNotIn("Too many levels", run.stderr)

    def test_second_agent_on_a_store_in_use_is_refused(self):
        o = self.opts()
        with tempfile.TemporaryDirectory() as d:
            first = subprocess.Popen(_shim_args(d, o, None, 1, ()), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
            try:
                first.stdin.write(json.dumps({"text": "hi", "conversation_id": "a"}) + "\n")
                first.stdin.flush()
                self.assertIn('"turn_id"', first.stdout.readline())  # open and serving
                run = run_shim([{"text": "hi", "conversation_id": "b"}], o)
                self.assertNotEqual(run.rc, 0)
                self.assertIn("in use by another agent", run.stderr)
                self.assertIn(self.path, run.stderr)
            finally:
                first.stdin.close()
                first.wait(timeout=30 * SLOW)
                first.stdout.close()
        self.assertEqual(first.returncode, 0)


class WalDeleted(StoreCase):
    def test_turns_survive_the_wal_deleted_then_kill_9(self):
        # The WAL deleted under the running agent, then a crash: before, every turn (none had
        # been checkpointed) was gone with the deleted file.
        o = self.opts()
        with tempfile.TemporaryDirectory() as d:
            proc = subprocess.Popen(_shim_args(d, o, None, 1, ()), stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            try:
                ok = []
                for i in range(5):
                    proc.stdin.write(json.dumps({"text": "turn %d" % i,
                                                 "conversation_id": "w"}) + "\n")
                    proc.stdin.flush()
                    ok.append(json.loads(proc.stdout.readline())["turn_id"])
                os.unlink(self.path + "-wal")
                time.sleep(2.5)  # the agent looks every second
                proc.stdin.write(json.dumps({"text": "after", "conversation_id": "w"}) + "\n")
                proc.stdin.flush()
                after = json.loads(proc.stdout.readline())
            finally:
                proc.kill()
                proc.wait(timeout=30 * SLOW)
                stderr = proc.stderr.read()
                for f in (proc.stdin, proc.stdout, proc.stderr):
                    f.close()
        self.assertEqual(after["error"]["code"], "storage", after)
        self.assertIn("deleted or replaced", after["error"]["message"])
        self.assertIn("were copied into the file", stderr)
        run = self.run_ok([{"op": "history", "conversation_id": "w"}], o)
        self.assertEqual([t["turn_id"] for t in run.by_seq(1)["result"]["turns"]], ok)


class Damaged(StoreCase):
    """A file damaged past its schema: every read op says SQLite's reason, in
    its answer and in the log, not just `storage`."""

    def test_every_read_says_why(self):
        self.run_ok([{"text": "hi %d" % i, "conversation_id": "c%d" % i} for i in range(3)],
                    self.opts())
        db = sqlite3.connect(self.path)
        try:
            root = db.execute("SELECT rootpage FROM sqlite_schema WHERE name = 'conversations'"
                              ).fetchone()[0]
            page = db.execute("PRAGMA page_size").fetchone()[0]
        finally:
            db.close()
        with open(self.path, "r+b") as f:  # the conversations table; its indexes stay
            f.seek((root - 1) * page)
            f.write(b"\x5a" * page)
        run = run_shim([{"op": "history", "conversation_id": "c1"}, {"op": "list"},
                        {"op": "query", "conversation_id": "c1"},
                        {"op": "history", "conversation_id": "c1", "persona": ""},
                        {"op": "list", "filter": {"interface_type": ""}}], self.opts())
        self.assertEqual(run.rc, 0, run.stderr)
        for seq, name in ((1, "history_get"), (2, "conversations_list"),
                          (3, "history_query"), (4, "history_get_by"),
                          (5, "conversations_list")):
            error = run.by_seq(seq)["error"]
            self.assertEqual(error["code"], "storage")
            self.assertIn(self.path, error["message"])
            self.assertIn("malformed", error["message"])
            self.assertIn(name + ": sqlite store " + self.path, run.stderr)
        self.assertIn("malformed", run.stderr)


# The schema version 1 DDL exactly as Parley 0.1 created it (plugin/store/sqlite.c, schema_v1).
V1_SCHEMA = """
CREATE TABLE store_meta( id INTEGER PRIMARY KEY CHECK (id = 1), conversations INTEGER NOT NULL,
 turns INTEGER NOT NULL, message_bytes INTEGER NOT NULL);
CREATE TABLE conversations( id INTEGER PRIMARY KEY, persona TEXT NOT NULL,
 interface_type TEXT NOT NULL, conversation_id TEXT NOT NULL, created_ms INTEGER NOT NULL,
 last_used_ms INTEGER NOT NULL, use_seq INTEGER NOT NULL, turns INTEGER NOT NULL,
 message_bytes INTEGER NOT NULL, UNIQUE (persona, interface_type, conversation_id));
CREATE UNIQUE INDEX conversations_by_use ON conversations(use_seq);
CREATE TABLE turns( id INTEGER PRIMARY KEY, conversation INTEGER NOT NULL
 REFERENCES conversations(id), turn_id TEXT NOT NULL UNIQUE, started_ms INTEGER NOT NULL,
 finished_ms INTEGER NOT NULL, message_bytes INTEGER NOT NULL);
CREATE INDEX turns_by_conversation ON turns(conversation, id);
CREATE TABLE messages( id INTEGER PRIMARY KEY, turn INTEGER NOT NULL REFERENCES turns(id),
 message_id TEXT NOT NULL, role TEXT NOT NULL, created_ms INTEGER NOT NULL, json TEXT NOT NULL);
CREATE INDEX messages_by_turn ON messages(turn);
"""


class Upgrade(StoreCase):
    OLD_TURN = "0b5a3c9e-1d2f-4a6b-8c7d-9e0f1a2b3c4d"
    OLD = [{"role": "user", "content": "is the garage door shut?"},
           {"role": "assistant", "content": "Yes, it is shut."}]

    def write_v1_store(self):
        now = int(time.time() * 1000)
        texts = [json.dumps(m, separators=(",", ":")) for m in self.OLD]
        size = len(",".join(texts))
        db = sqlite3.connect(self.path)
        db.executescript(V1_SCHEMA)
        db.execute("INSERT INTO store_meta VALUES (1, 1, 1, ?)", (size,))
        db.execute("INSERT INTO conversations VALUES (1, '', '', 'home', ?, ?, 1, 1, ?)",
                   (now - 2000, now - 1000, size))
        db.execute("INSERT INTO turns VALUES (1, 1, ?, ?, ?, ?)",
                   (self.OLD_TURN, now - 1500, now - 1000, size))
        for i, (m, text) in enumerate(zip(self.OLD, texts)):
            db.execute("INSERT INTO messages VALUES (?, 1, ?, ?, ?, ?)",
                       (i + 1, "0b5a3c9e-0000-4a6b-8c7d-00000000000%d" % i, m["role"],
                        now - 1010 + i, text))
        db.execute("PRAGMA application_id = %d" % 0x50726c79)
        db.execute("PRAGMA user_version = 1")
        db.commit()
        db.execute("PRAGMA journal_mode = WAL")
        db.close()

    def test_version_1_file_is_upgraded_and_its_conversation_goes_on(self):
        self.write_v1_store()
        run = self.run_ok([{"text": "and the kitchen window?", "conversation_id": "home"},
                           {"op": "history", "conversation_id": "home"}, {"op": "list"}],
                          self.opts())
        self.assertTurnOk(run.by_seq(1))
        # The model saw the turn stored by 0.1, then the new message.
        sent = messages(self.llm.chat_requests()[0])[1:]
        self.assertEqual(sent, as_sent(self.OLD) +
                         [{"role": "user", "content": "and the kitchen window?"}])
        history = run.by_seq(2)["result"]
        self.assertEqual([t["turn_id"] for t in history["turns"]][0], self.OLD_TURN)
        self.assertEqual(history["turns"][0]["messages"], self.OLD)
        # A turn stored before turns kept their size has none; the new one has.
        self.assertNotIn("tokens", history["turns"][0])
        self.assertGreater(history["turns"][1]["tokens"], 0)
        # Lifetime counts start from what the file held, then count on.
        listed = run.by_seq(3)["result"]["conversations"]
        self.assertEqual([(c["conversation_id"], c["message_count"], c["turn_count"],
                           c["participants"]) for c in listed],
                         [("home", 4, 2, ["user", "assistant"])])
        db = sqlite3.connect(self.path)
        try:
            self.assertEqual(db.execute("PRAGMA user_version").fetchone()[0], 4)
        finally:
            db.close()


def feed(proc, lines):
    try:
        for line in lines:
            proc.stdin.write(json.dumps(line) + "\n")
        proc.stdin.flush()
        proc.stdin.close()
    except (BrokenPipeError, ValueError, OSError):
        pass  # killed


def drain(proc, results):
    for line in proc.stdout:  # ends at the kill
        results.put(line)


class Crash(StoreCase):
    """kill -9 at random moments under load; every turn reported ok survives."""

    ROUNDS = 6
    TURNS_PER_ROUND = 1000
    CONVERSATIONS = 50

    def test_kill_9_during_concurrent_turns(self):
        rng = random.Random(9)
        o = self.opts(max_conversations=1000, max_history_turns=0,
                      history_keep_turns=0, history_sync="normal")
        ok = {}          # turn_id -> (conversation, user text)
        sent = 0
        for round_no in range(self.ROUNDS):
            with tempfile.TemporaryDirectory() as d:
                args = _shim_args(d, o, None, self.TURNS_PER_ROUND, ())
                proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.DEVNULL, text=True, bufsize=1)
                lines = []
                for i in range(self.TURNS_PER_ROUND):
                    sent += 1
                    conv = "c%d" % rng.randrange(self.CONVERSATIONS)
                    lines.append({"text": "r%d-%d [[latency:%d]]" % (round_no, i,
                                                                     rng.randrange(100, 500)),
                                  "conversation_id": conv})
                texts = {i + 1: (l["conversation_id"], l["text"]) for i, l in enumerate(lines)}
                # Feed and read from threads (the pipes are smaller than 1,000 lines);
                # collect results for a random while, then kill -9 mid-flight.
                results = queue.Queue()
                feeder = threading.Thread(target=feed, args=(proc, lines), daemon=True)
                reader = threading.Thread(target=drain, args=(proc, results), daemon=True)
                feeder.start()
                reader.start()
                # Kill at a random point of the run: after a random number of results.
                kill_after = rng.randrange(1, self.TURNS_PER_ROUND * 9 // 10)
                seen = []
                deadline = time.time() + 60 * SLOW
                while len(seen) < kill_after and time.time() < deadline:
                    try:
                        seen.append(results.get(timeout=0.5))
                    except queue.Empty:
                        pass
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=30)
                reader.join(timeout=30)
                feeder.join(timeout=30)
                while not results.empty():
                    seen.append(results.get())
                got = 0
                for raw in seen:
                    res = json.loads(raw)
                    if res.get("error") is None and res.get("turn_id"):
                        ok[res["turn_id"]] = texts[res["seq"]]
                    got += 1
                proc.stdout.close()
                self.assertGreater(got, 0, "round %d: no result before the kill" % round_no)
                self.assertLess(got, self.TURNS_PER_ROUND,
                                "round %d: everything finished before the kill" % round_no)
        # A fresh run opens the file and holds every turn reported ok, each whole.
        lines = [{"op": "history", "conversation_id": "c%d" % c}
                 for c in range(self.CONVERSATIONS)]
        run = self.run_ok(lines, self.opts(max_conversations=1000))
        stored = {}
        for c in range(self.CONVERSATIONS):
            line = run.by_seq(c + 1)
            if line.get("error"):
                self.assertEqual(line["error"]["code"], "not_found")
                continue
            for t in line["result"]["turns"]:
                stored[t["turn_id"]] = ("c%d" % c, t["messages"])
        missing = [t for t in ok if t not in stored]
        self.assertEqual(missing, [], "turns reported ok but not stored")
        for turn_id, (conv, msgs) in stored.items():
            self.assertEqual(len(msgs), 2, "partial turn %s: %r" % (turn_id, msgs))
            self.assertEqual(msgs[0]["role"], "user")
            self.assertEqual(msgs[1]["role"], "assistant")
            if turn_id in ok:
                self.assertEqual(ok[turn_id], (conv, msgs[0]["content"]))
        self.assertGreater(len(ok), 0)
        print("crash test: %d turns sent over %d kills, %d reported ok, %d stored"
              % (sent, self.ROUNDS, len(ok), len(stored)))


if __name__ == "__main__":
    unittest.main()
