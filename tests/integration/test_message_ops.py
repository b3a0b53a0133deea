"""Operations on messages outside a turn (docs/history.md, "Messages outside a turn",
"The interface's id of an answer", "Finding a message by its interface id",
"Conversation lifetime"): append_message, set_interface_message_id, message_find,
through the shim's "append", "set_interface_message_id" and "find" ops.

What the model saw is asserted from the fake server's request log (the fake
validates each dialect strictly, so a request in a wrong form fails the turn);
what a host reads back, from the shim's history/find/list ops.  Every case runs
on the memory store, on an SQLite file and on a Redis server."""
import os
import tempfile
import unittest

from redis_server import RedisServer
from harness import (SLOW, UUID_RE, FakeLLM, InteractiveShim, ParleyTestCase, fake_reply,
                     messages, options)

PROMPT = "You are a test assistant."
SYS = {"role": "system", "content": PROMPT}
PATHS = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages", "ollama": "/api/chat"}
WASHING = "The washing machine has finished."
AWAY = "The user is away until 18:00."


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


class MessageOpsCase(ParleyTestCase):
    """On the memory store; SqliteMessageOpsCase runs the same on a file."""
    maxDiff = None
    STORE = "memory"

    def setUp(self):
        self.llm = None

    def fake(self, *args):
        self.llm = FakeLLM(*args)
        self.addCleanup(self.llm.close)
        return self.llm

    def opts(self, fake=None, **kw):
        return options(fake or self.llm, history_store=self.store(), **kw)

    def store(self):
        if self.STORE == "memory":
            return "memory"
        if self.STORE == "redis":  # a fresh server per store: nothing shared between cases
            server = RedisServer()
            self.addCleanup(server.stop)
            return server.url
        d = tempfile.TemporaryDirectory(prefix="parley-msgops-")
        self.addCleanup(d.cleanup)
        return "sqlite:" + os.path.join(d.name, "history.db")

    def turn_ids(self, history):
        return [t["turn_id"] for t in history["turns"]]

    # ---- append ----------------------------------------------------------------

    def test_append_waits_behind_the_turn_in_flight_and_the_next_turn_sees_it(self):
        self.fake("--latency-ms", str(int(400 * SLOW)))
        lines = [{"text": "start the washing machine", "conversation_id": "c"},
                 {"op": "append", "conversation_id": "c", "content": WASHING},
                 {"text": "thanks", "conversation_id": "c"},
                 {"op": "history", "conversation_id": "c"}]
        run = self.run_ok(lines, self.opts(), concurrency=4)
        first, appended, second = run.by_seq(1), run.by_seq(2), run.by_seq(3)
        self.assertTurnOk(first)
        self.assertTurnOk(second)
        self.assertIsNone(appended["error"], appended)
        self.assertEqual(appended["op"], "append")
        self.assertEqual(appended["response"], WASHING)
        self.assertEqual(appended["steps"], [])
        self.assertRegex(appended["turn_id"], UUID_RE)
        self.assertRegex(appended["answer_message_id"], UUID_RE)
        self.assertNotIn("user_message_id", appended)
        self.assertEqual(appended["usage"]["requests"], 0, "the model was not called")

        # Stored after the turn that was in flight, before the one after it.
        history = run.by_seq(4)["result"]
        self.assertEqual(self.turn_ids(history),
                         [first["turn_id"], appended["turn_id"], second["turn_id"]])
        self.assertEqual(history["turns"][1]["messages"], [assistant(WASHING)])

        reqs = self.llm.chat_requests()
        self.assertEqual(len(reqs), 2, "an append calls no model")
        self.assertEqual(messages(reqs[0]), [SYS, user("start the washing machine")],
                         "never inside the turn in flight")
        self.assertEqual(messages(reqs[1]),
                         [SYS, user("start the washing machine"),  # joined: roles alternate
                          assistant(fake_reply("start the washing machine", 2, 1) + "\n\n"
                                    + WASHING), user("thanks")])

    def test_user_appends_are_ordered_like_turns_and_reach_every_provider(self):
        """role "user": what a person said, recorded without an answer (a group chat
        before the assistant is addressed, a command handled locally).  Appended while
        a turn is in flight it lands after that turn; later turns send it to the model
        in its place (Anthropic: merged with the next user message, as roles alternate)."""
        fake = self.fake("--latency-ms", str(int(300 * SLOW)))
        for provider in ("openai", "anthropic", "ollama"):
            with self.subTest(provider=provider):
                base = fake.base_url if provider == "openai" else "http://127.0.0.1:%d" % fake.port
                cid = "u-" + provider
                lines = [{"text": "hello", "conversation_id": cid},
                         {"op": "append", "conversation_id": cid, "role": "user",
                          "content": "Mum: dinner at 7"},
                         {"text": "what did mum say?", "conversation_id": cid},
                         {"op": "history", "conversation_id": cid},
                         {"op": "query", "conversation_id": cid, "role": "user",
                          "order": "oldest"}]
                before = len(fake.requests())
                run = self.run_ok(lines, self.opts(fake, provider=provider, base_url=base),
                                  concurrency=4)
                first, appended, second = run.by_seq(1), run.by_seq(2), run.by_seq(3)
                self.assertTurnOk(first)
                self.assertTurnOk(second)
                self.assertIsNone(appended["error"], appended)
                self.assertEqual(appended["usage"]["requests"], 0, "no model call")
                history = run.by_seq(4)["result"]
                self.assertEqual(self.turn_ids(history),
                                 [first["turn_id"], appended["turn_id"], second["turn_id"]])
                self.assertEqual(history["turns"][1]["messages"], [user("Mum: dinner at 7")])
                queried = run.by_seq(5)["result"]["messages"]
                self.assertEqual([m["message"]["content"] for m in queried],
                                 ["hello", "Mum: dinner at 7", "what did mum say?"])
                self.assertEqual(queried[1]["message_id"], appended["answer_message_id"])
                reqs = [r for r in fake.requests()[before:] if r.get("path") == PATHS[provider]]
                self.assertEqual(len(reqs), 2)
                sent = reqs[1]["body"]["messages"]
                if provider == "anthropic":
                    self.assertEqual([m["role"] for m in sent], ["user", "assistant", "user"])
                    self.assertEqual(sent[2]["content"],
                                     [{"type": "text", "text": "Mum: dinner at 7"},
                                      {"type": "text", "text": "what did mum say?",
                                       "cache_control": {"type": "ephemeral"}}])
                else:
                    tail = [{"role": m["role"], "content": m["content"]} for m in sent[-2:]]
                    self.assertEqual(tail, [assistant(fake_reply("hello", 2, 1)),  # joined:
                                            user("Mum: dinner at 7\n\nwhat did mum say?")])

    def test_host_timestamps_are_created_at_and_since_until_read_them(self):
        """A simulator on simulated time, a bridge importing earlier messages: the host's
        RFC 3339 time (any offset) is the stored created_at, and since/until select on it."""
        self.fake()
        lines = [{"op": "append", "conversation_id": "t", "role": "user",
                  "content": "sent last year", "timestamp": "2025-03-01T08:00:00+02:00"},
                 {"text": "simulated morning", "conversation_id": "t",
                  "timestamp": "2025-06-01T09:30:00.250Z"},
                 {"text": "now", "conversation_id": "t"},
                 {"op": "query", "conversation_id": "t", "order": "oldest",
                  "until": "2025-12-31T00:00:00Z"},
                 {"op": "query", "conversation_id": "t", "order": "oldest",
                  "since": "2025-05-01T00:00:00Z", "until": "2025-07-01T00:00:00Z"},
                 {"op": "history", "conversation_id": "t"}]
        run = self.run_ok(lines, self.opts())
        self.assertIsNone(run.by_seq(1)["error"], run.by_seq(1))
        self.assertTurnOk(run.by_seq(2))
        self.assertTurnOk(run.by_seq(3))
        old = run.by_seq(4)["result"]["messages"]
        self.assertEqual([m["message"]["content"] for m in old],
                         ["sent last year", "simulated morning",  # one user message sent
                          fake_reply("sent last year\n\nsimulated morning", 2, 1)])
        self.assertEqual(old[0]["created_at"][:19], "2025-03-01T06:00:00")
        self.assertEqual(old[1]["created_at"][:23], "2025-06-01T09:30:00.250")
        self.assertTrue(old[2]["created_at"].startswith("2025-06-01T09:30:"), old[2])
        june = run.by_seq(5)["result"]["messages"]
        self.assertEqual([m["message_id"] for m in june], [m["message_id"] for m in old[1:]])
        turns = run.by_seq(6)["result"]["turns"]
        self.assertEqual(turns[1]["started_at"][:23], "2025-06-01T09:30:00.250")
        self.assertTrue(turns[2]["started_at"] > "2026", turns[2])

    def test_bad_timestamps_are_refused_by_name_and_change_nothing(self):
        self.fake()
        bad = ["yesterday", "2025-13-01T00:00:00Z", "2025-06-01T09:30:00", "1969-12-31T23:59:59Z",
               "2025-06-01", ""]
        lines = [{"text": "hello", "conversation_id": "b"},
                 {"op": "history", "conversation_id": "b"}]
        for ts in bad:
            lines.append({"text": "x", "conversation_id": "b", "timestamp": ts})
            lines.append({"op": "append", "conversation_id": "b", "content": "x",
                          "timestamp": ts})
        lines.append({"op": "append", "conversation_id": "b", "content": "x", "timestamp": 5})
        lines.append({"op": "history", "conversation_id": "b"})
        run = self.run_ok(lines, self.opts())
        for seq in range(3, 3 + 2 * len(bad) + 1):
            line = run.by_seq(seq)
            self.assertEqual(line["error"]["code"], "invalid_input", line)
            self.assertIn("'timestamp'", line["error"]["message"], line)
        self.assertEqual(run.raw_result(2), run.raw_result(len(lines)), "history unchanged")
        self.assertEqual(len(self.llm.chat_requests()), 1)

    def test_refused_ops_carry_the_plugins_words(self):
        """A refused op's line says why (parley_plugin.last_error), not just the code; a
        conversation not found is named with its persona."""
        self.fake()
        nobody = "00000000-0000-4000-8000-000000000000"
        lines = [{"text": "hi", "conversation_id": "c", "persona": "chef"},
                 {"op": "clear", "conversation_id": "c", "persona": "pirate"},
                 {"op": "history", "conversation_id": "nobody", "persona": "chef"},
                 {"op": "clear", "conversation_id": "nobody", "persona": "chef"},
                 {"op": "clear", "conversation_id": "nobody", "persona": "*"},
                 {"op": "turn", "turn_id": nobody},
                 {"op": "message", "message_id": nobody},
                 {"op": "set_interface_message_id", "turn_id": nobody,
                  "interface_message_id": "x"},
                 {"op": "history", "conversation_id": "c", "persona": "chef"}]
        run = self.run_ok(lines, self.opts(personas={"chef": {"prompt": "You are a chef."}}))
        self.assertTurnOk(run.by_seq(1))
        expected = {2: ("invalid_input", 'unknown persona "pirate"'),
                    3: ("not_found", 'no conversation "nobody" under persona "chef"'),
                    4: ("not_found", 'no conversation "nobody" under persona "chef"'),
                    5: ("not_found", 'no conversation "nobody"'),
                    6: ("not_found", 'no turn "%s" is stored' % nobody),
                    7: ("not_found", 'no message "%s" is stored' % nobody),
                    8: ("not_found", 'no turn "%s" is stored' % nobody)}
        for seq, (code, words) in expected.items():
            line = run.by_seq(seq)
            self.assertEqual(line["error"]["code"], code, line)
            self.assertIn(words, line["error"]["message"], line)
        self.assertEqual(len(run.by_seq(9)["result"]["turns"]), 1, "nothing was cleared")

    def test_history_ops_take_the_whole_key(self):
        """history/clear take interface_type (and persona); turn says which interface and
        persona its turn belongs to and gives its messages with ids and times; query
        filters by turn_id and interface_message_id."""
        self.fake()
        lines = [{"text": "hi", "conversation_id": "42", "interface_type": "telegram",
                  "persona": "chef", "interface_message_id": "tg-1"},
                 {"text": "hello", "conversation_id": "42", "interface_type": "web"},
                 {"op": "history", "conversation_id": "42", "interface_type": "telegram",
                  "persona": "chef"},
                 {"op": "history", "conversation_id": "42", "interface_type": "web"},
                 {"op": "turn", "turn_id": None},  # filled in below
                 {"op": "query", "turn_id": None, "order": "oldest"},
                 {"op": "query", "interface_message_id": "tg-1"},
                 {"op": "query", "turn_id": 7},
                 {"op": "clear", "conversation_id": "42", "interface_type": "web"},
                 {"op": "history", "conversation_id": "42", "interface_type": "web"},
                 {"op": "history", "conversation_id": "42", "interface_type": 5},
                 {"op": "turn", "turn_id": "x", "interface_type": "web"}]
        with InteractiveShim(self.opts(personas={"chef": {"prompt": "You are a chef."}})) as sh:
            tg = self.assertTurnOk(sh.turn(lines[0]))
            web = self.assertTurnOk(sh.turn(lines[1]))
            lines[4]["turn_id"] = lines[5]["turn_id"] = tg["turn_id"]
            out = [sh.op(l["op"], **{k: v for k, v in l.items() if k != "op"})
                   for l in lines[2:]]
        h_tg, h_web, turn, by_turn, by_iid, bad_turn, cleared, gone, bad_key, turn_key = out
        self.assertEqual([t["turn_id"] for t in h_tg["result"]["turns"]], [tg["turn_id"]])
        self.assertEqual([t["turn_id"] for t in h_web["result"]["turns"]], [web["turn_id"]])
        t = turn["result"]
        self.assertEqual((t["conversation_id"], t["persona"], t["interface_type"]),
                         ("42", "chef", "telegram"))
        self.assertEqual([m["message_id"] for m in t["messages"]],
                         [tg["user_message_id"], tg["answer_message_id"]])
        self.assertEqual(t["messages"][0]["interface_message_id"], "tg-1")
        self.assertTrue(all(m["created_at"] for m in t["messages"]))
        self.assertEqual(by_turn["result"]["messages"], t["messages"])
        self.assertEqual([m["message_id"] for m in by_iid["result"]["messages"]],
                         [tg["user_message_id"]])
        self.assertEqual(bad_turn["error"]["code"], "invalid_input")
        self.assertIn("turn_id", bad_turn["error"]["message"])
        self.assertIsNone(cleared["error"], cleared)
        self.assertEqual(gone["error"]["code"], "not_found")
        self.assertIn('on interface "web"', gone["error"]["message"])
        self.assertEqual(bad_key["error"]["code"], "invalid_input")
        self.assertIn("interface_type", bad_key["error"]["message"])
        self.assertEqual(turn_key["error"]["code"], "invalid_input")

    def test_personas_added_replaced_and_removed_at_run_time_keep_every_history(self):
        self.fake()
        chef, chef2, pirate = "You are a chef.", "You are a French chef.", "You are a pirate."
        lines = [{"text": "soup?", "conversation_id": "k", "persona": "chef"},
                 {"op": "persona_put", "name": "pirate", "persona": {"prompt": pirate}},
                 {"text": "ahoy", "conversation_id": "k", "persona": "pirate"},
                 {"op": "persona_put", "name": "chef", "persona": {"prompt": chef2}},
                 {"text": "bread?", "conversation_id": "k", "persona": "chef"},
                 {"op": "persona_remove", "name": "pirate"},
                 {"text": "still there?", "conversation_id": "k", "persona": "pirate"},
                 {"op": "persona_put", "name": "chef", "persona": {"prompt": "x", "colour": "red"}},
                 {"op": "persona_put", "name": "", "persona": {"prompt": "x"}},
                 {"op": "persona_put", "name": "chef", "persona": "not an object"},
                 {"op": "persona_remove", "name": "nobody"},
                 {"op": "persona_put", "name": "pirate", "persona": {"prompt": pirate}},
                 {"op": "history", "conversation_id": "k", "persona": "pirate"},
                 {"op": "history", "conversation_id": "k", "persona": "chef"},
                 {"text": "more?", "conversation_id": "k", "persona": "chef"}]
        run = self.run_ok(lines, self.opts(personas={"chef": {"prompt": chef}}))
        for seq in (1, 3, 5):
            self.assertTurnOk(run.by_seq(seq))
        for seq in (2, 4, 6, 12):
            self.assertIsNone(run.by_seq(seq)["error"], run.by_seq(seq))
        self.assertTurnError(run.by_seq(7), "invalid_input")
        self.assertIn('unknown persona "pirate"', run.by_seq(7)["error"]["message"])
        refused = {8: ("invalid_input", "colour"), 9: ("invalid_input", "name"),
                   10: ("invalid_input", "persona"), 11: ("not_found", 'no persona "nobody"')}
        for seq, (code, words) in refused.items():
            self.assertEqual(run.by_seq(seq)["error"]["code"], code, run.by_seq(seq))
            self.assertIn(words, run.by_seq(seq)["error"]["message"], run.by_seq(seq))
        reqs = self.llm.chat_requests()
        self.assertEqual(len(reqs), 4)
        self.assertEqual(messages(reqs[1])[0], {"role": "system", "content": pirate})
        # the replaced chef speaks with its new prompt and keeps its conversation
        self.assertEqual(messages(reqs[2])[0], {"role": "system", "content": chef2})
        self.assertEqual(messages(reqs[2])[1], user("soup?"))
        # the refusals changed nothing: the French chef stayed
        self.assertEqual(messages(reqs[3])[0], {"role": "system", "content": chef2})
        self.assertEqual(len(run.by_seq(13)["result"]["turns"]), 1, "pirate's history came back")
        self.assertEqual(len(run.by_seq(14)["result"]["turns"]), 2)

    def test_append_queued_behind_a_turn_can_be_cancelled(self):
        self.fake("--latency-ms", str(int(600 * SLOW)))
        lines = [{"text": "slow one", "conversation_id": "c"},
                 {"op": "append", "conversation_id": "c", "content": WASHING},
                 {"op": "cancel", "seq": 2},
                 {"op": "history", "conversation_id": "c"}]
        run = self.run_ok(lines, self.opts(), concurrency=4)
        self.assertTurnOk(run.by_seq(1))
        self.assertIsNone(run.by_seq(3)["error"], run.by_seq(3))
        self.assertEqual(run.by_seq(2)["error"]["code"], "cancelled")
        self.assertNotIn("answer_message_id", run.by_seq(2))
        self.assertEqual(self.turn_ids(run.by_seq(4)["result"]), [run.by_seq(1)["turn_id"]])

    def test_bad_appends_are_refused_by_name_and_change_nothing(self):
        self.fake()
        long_id = "x" * 257
        bad = [({"content": "x"}, "conversation_id"),
                ({"conversation_id": 7, "content": "x"}, "conversation_id"),
                ({"conversation_id": "c"}, "content"),
                ({"conversation_id": "c", "content": ""}, "content"),
                ({"conversation_id": "c", "content": 5}, "content"),
                ({"conversation_id": "c", "content": "y" * 65}, "content"),
                ({"conversation_id": "c", "content": "x", "role": "bot"}, "role"),
                ({"conversation_id": "c", "content": "x", "role": "tool"}, "role"),
                ({"conversation_id": "c", "content": "x", "metadata": [1]}, "metadata"),
                ({"conversation_id": "c", "content": "x", "metadata": "{}"}, "metadata"),
                ({"conversation_id": "c", "content": "x", "metadata": {"k": "v" * 80}},
                 "metadata"),
                ({"conversation_id": "c", "content": "x", "interface_message_id": long_id},
                 "interface_message_id"),
                ({"conversation_id": "c", "content": "x", "interface_message_id": ""},
                 "interface_message_id"),
                ({"conversation_id": "c", "content": "x", "persona": "nobody"}, "persona"),
                ({"conversation_id": "c", "content": "x", "interface_type": "a\nb"},
                 "interface_type"),
                ({"conversation_id": "c", "content": "x", "colour": "red"}, "colour")]
        lines = [{"text": "hello", "conversation_id": "c"},
                 {"op": "history", "conversation_id": "c"}]
        lines += [dict(op="append", **m) for m, _ in bad]
        lines += [{"op": "history", "conversation_id": "c"}, {"op": "metrics"}]
        run = self.run_ok(lines, self.opts(max_input_bytes=64), concurrency=4)
        for i, (m, key) in enumerate(bad):
            line = run.by_seq(3 + i)
            self.assertEqual(line["op"], "append")
            self.assertIsNone(line["result"], line)
            self.assertEqual(line["error"]["code"], "invalid_input", (m, line))
            self.assertIn(key, line["error"]["message"], (m, line))
        end = 3 + len(bad)
        self.assertEqual(run.raw_result(2), run.raw_result(end), "history byte-identical")
        metrics = run.by_seq(end + 1)["result"]
        self.assertEqual(metrics["turns_accepted"], 1, "nothing was queued")
        self.assertEqual(metrics["in_flight"], 0)
        self.assertEqual(len(self.llm.chat_requests()), 1)

    def test_append_under_a_persona_joins_that_personas_conversation(self):
        self.fake()
        chef = "You are a chef."
        lines = [{"op": "append", "conversation_id": "k", "persona": "chef",
                  "content": "The oven is hot."},
                 {"text": "what now?", "conversation_id": "k", "persona": "chef"},
                 {"text": "and you?", "conversation_id": "k"},
                 {"op": "history", "conversation_id": "k", "persona": "chef"},
                 {"op": "metrics"}]
        run = self.run_ok(lines, self.opts(personas={"chef": {"prompt": chef}}))
        self.assertIsNone(run.by_seq(1)["error"], run.by_seq(1))
        self.assertTurnOk(run.by_seq(2))
        self.assertTurnOk(run.by_seq(3))
        reqs = self.llm.chat_requests()
        self.assertEqual(messages(reqs[0]), [{"role": "system", "content": chef},
                                             user("(start of the conversation)"),
                                             assistant("The oven is hot."), user("what now?")])
        self.assertEqual(messages(reqs[1]), [SYS, user("and you?")], "another conversation")
        turns = run.by_seq(4)["result"]["turns"]
        self.assertEqual([t["turn_id"] for t in turns],
                         [run.by_seq(1)["turn_id"], run.by_seq(2)["turn_id"]])
        m = run.by_seq(5)["result"]["personas"]["chef"]
        self.assertEqual((m["turns"], m["turns_stored"], m["messages_stored"]), (1, 2, 3),
                         "the append is stored under the persona, not a model turn")

    def test_system_and_assistant_appends_reach_every_provider_validly(self):
        """The fake validates each dialect strictly: Anthropic wants user first and
        no system role in messages; a note must still reach the model in place."""
        fake = self.fake()
        for provider in ("openai", "anthropic", "ollama"):
            with self.subTest(provider=provider):
                base = fake.base_url if provider == "openai" else "http://127.0.0.1:%d" % fake.port
                lines = [  # a conversation that opens with appends
                    {"op": "append", "conversation_id": "fresh", "content": WASHING},
                    {"op": "append", "conversation_id": "fresh", "role": "system",
                     "content": AWAY},
                    {"text": "anything new?", "conversation_id": "fresh"},
                    # ... and one where they come between turns
                    {"text": "hello", "conversation_id": "mid"},
                    {"op": "append", "conversation_id": "mid", "content": WASHING},
                    {"op": "append", "conversation_id": "mid", "role": "system",
                     "content": AWAY},
                    {"text": "thanks", "conversation_id": "mid"}]
                before = len(fake.requests())
                run = self.run_ok(lines, self.opts(fake, provider=provider, base_url=base))
                for seq in (1, 2, 5, 6):
                    self.assertIsNone(run.by_seq(seq)["error"], run.by_seq(seq))
                for seq in (3, 4, 7):
                    self.assertTurnOk(run.by_seq(seq))
                reqs = [r for r in fake.requests()[before:] if r.get("path") == PATHS[provider]]
                self.assertEqual(len(reqs), 3)
                fresh, mid = reqs[0]["body"], reqs[2]["body"]
                if provider == "anthropic":
                    self.assertEqual(fresh["messages"], [
                        {"role": "user", "content": [
                            {"type": "text", "text": "(start of the conversation)"}]},
                        {"role": "assistant", "content": [{"type": "text", "text": WASHING}]},
                        {"role": "user", "content": [
                            {"type": "text", "text": "[system note] " + AWAY},
                            {"type": "text", "text": "anything new?",  # the request's end:
                             "cache_control": {"type": "ephemeral"}}]}])  # prompt_cache
                    self.assertEqual([m["role"] for m in mid["messages"]],
                                     ["user", "assistant", "user"])
                    self.assertEqual(mid["messages"][1]["content"][-1],
                                     {"type": "text", "text": WASHING})
                    self.assertEqual(mid["messages"][2]["content"],
                                     [{"type": "text", "text": "[system note] " + AWAY},
                                      {"type": "text", "text": "thanks",
                                       "cache_control": {"type": "ephemeral"}}])
                else:  # the note opens the next user message: no late system message
                    tail = [{"role": m["role"], "content": m["content"]}
                            for m in fresh["messages"][1:]]
                    self.assertEqual(tail, [user("(start of the conversation)"), assistant(WASHING),
                                            user("[system note] " + AWAY + "\n\nanything new?")])
                    self.assertEqual([m["role"] for m in mid["messages"]],
                                     ["system", "user", "assistant", "user"])
                    self.assertTrue(mid["messages"][2]["content"].endswith("\n\n" + WASHING))
                    self.assertEqual(mid["messages"][3]["content"],
                                     "[system note] " + AWAY + "\n\nthanks")

    def test_system_notes_pass_strict_chat_templates(self):
        """A server whose chat template takes a system message only first (Qwen 3.x) or
        wants user and assistant in turn (Gemma) refuses a late system message with a 400
        (ggml-org/llama.cpp#20733): notes go as user text, so every turn passes."""
        for template in ("qwen", "gemma"):
            fake = self.fake("--strict-template", template)
            for provider in ("openai", "ollama"):
                with self.subTest(template=template, provider=provider):
                    base = (fake.base_url if provider == "openai"
                            else "http://127.0.0.1:%d" % fake.port)
                    lines = [
                        {"op": "append", "conversation_id": "fresh", "role": "system",
                         "content": AWAY},
                        {"text": "anything new?", "conversation_id": "fresh"},
                        {"text": "hello", "conversation_id": "mid"},
                        {"op": "append", "conversation_id": "mid", "role": "system",
                         "content": AWAY},
                        {"op": "append", "conversation_id": "mid", "role": "system",
                         "content": WASHING},
                        {"text": "thanks", "conversation_id": "mid"},
                        {"text": "and now?", "conversation_id": "mid"}]
                    before = len(fake.requests())
                    run = self.run_ok(lines, self.opts(fake, provider=provider, base_url=base))
                    for seq in (2, 3, 6, 7):
                        self.assertTurnOk(run.by_seq(seq))
                    reqs = [r for r in fake.requests()[before:] if r.get("path") == PATHS[provider]]
                    last = reqs[-1]["body"]["messages"]
                    self.assertEqual([m["role"] for m in last],
                                     ["system", "user", "assistant", "user", "assistant", "user"])
                    self.assertEqual(last[3]["content"], "[system note] %s\n\n[system note] %s"
                                     "\n\nthanks" % (AWAY, WASHING))

    def test_every_stored_order_alternates_for_gemma(self):
        """Gemma's template wants user and assistant in turn: two appended assistant messages
        in a row, a note between a user message and an assistant one, and a history that
        opens with an appended assistant message all pass, joined by a blank line."""
        fake = self.fake("--strict-template", "gemma")
        for provider in ("openai", "ollama"):
            with self.subTest(provider=provider):
                base = (fake.base_url if provider == "openai"
                        else "http://127.0.0.1:%d" % fake.port)
                lines = [
                    {"text": "hello", "conversation_id": "mid"},
                    {"op": "append", "conversation_id": "mid", "content": WASHING},
                    {"op": "append", "conversation_id": "mid", "content": AWAY},
                    {"text": "thanks", "conversation_id": "mid"},
                    {"op": "append", "conversation_id": "mid", "role": "user",
                     "content": "on my way"},
                    {"op": "append", "conversation_id": "mid", "role": "system",
                     "content": AWAY},
                    {"op": "append", "conversation_id": "mid", "content": WASHING},
                    {"text": "and now?", "conversation_id": "mid"},
                    {"op": "append", "conversation_id": "opens", "content": WASHING},
                    {"text": "what was that?", "conversation_id": "opens"}]
                before = len(fake.requests())
                run = self.run_ok(lines, self.opts(fake, provider=provider, base_url=base))
                for seq in (1, 4, 8, 10):
                    self.assertTurnOk(run.by_seq(seq))
                reqs = [r for r in fake.requests()[before:] if r.get("path") == PATHS[provider]]
                mid = reqs[2]["body"]["messages"]
                self.assertEqual([m["role"] for m in mid], ["system"] + ["user", "assistant"] * 3
                                 + ["user"])
                self.assertTrue(mid[2]["content"].endswith("\n\n%s\n\n%s" % (WASHING, AWAY)),
                                mid[2])
                self.assertEqual(mid[5]["content"], "on my way\n\n[system note] %s" % AWAY)
                self.assertEqual(mid[6]["content"], WASHING)
                opens = reqs[3]["body"]["messages"]
                self.assertEqual([m["role"] for m in opens],
                                 ["system", "user", "assistant", "user"])
                self.assertEqual(opens[1]["content"], "(start of the conversation)")

    # ---- interface message ids -------------------------------------------------

    def test_set_interface_message_id_then_find_returns_the_final_answer(self):
        self.fake()
        with InteractiveShim(self.opts()) as sh:
            turn = self.assertTurnOk(sh.turn({"text": "turn on the porch light",
                                              "conversation_id": "42",
                                              "interface_type": "telegram"}))
            tid = turn["turn_id"]
            ops = [("set_interface_message_id", dict(turn_id=tid,
                                                     interface_message_id="tg-1001")),
                   ("find", dict(conversation_id="42", interface_type="telegram",
                                 interface_message_id="tg-1001")),
                   ("find", dict(conversation_id="42", interface_type="web",
                                 interface_message_id="tg-1001")),
                   ("find", dict(conversation_id="42", interface_message_id="tg-1001")),
                   ("find", dict(conversation_id="42", interface_type="telegram",
                                 interface_message_id="tg-9")),
                   ("set_interface_message_id",
                    dict(turn_id="00000000-0000-4000-8000-000000000000",
                         interface_message_id="tg-1")),
                   ("set_interface_message_id", dict(turn_id="nope", interface_message_id="x")),
                   ("set_interface_message_id", dict(turn_id=tid, interface_message_id="")),
                   ("set_interface_message_id", dict(turn_id=tid,
                                                     interface_message_id="x" * 257)),
                   ("find", dict(conversation_id="42", interface_message_id=5)),
                   ("find", dict(conversation_id="42")),
                   ("find", dict(conversation_id="42", interface_message_id="a", colour="red")),
                   # set again: the new id replaces the old one
                   ("set_interface_message_id", dict(turn_id=tid,
                                                     interface_message_id="tg-1002")),
                   ("find", dict(conversation_id="42", interface_type="telegram",
                                 interface_message_id="tg-1002"))]
            answers = [sh.op(op, **args) for op, args in ops]
        self.assertIsNone(answers[0]["error"], answers[0])
        self.assertIsNone(answers[0]["result"])
        m = answers[1]["result"]
        self.assertIsNone(answers[1]["error"], answers[1])
        self.assertEqual(m["interface_message_id"], "tg-1001")
        self.assertEqual(m["turn_id"], tid)
        self.assertEqual(m["role"], "assistant")
        self.assertEqual(m["message"], assistant(turn["response"]))
        self.assertEqual(m["message_id"], turn["answer_message_id"])
        self.assertEqual((m["conversation_id"], m["interface_type"]), ("42", "telegram"))
        # another interface, no interface, an id never set; no such turn
        for a in answers[2:7]:
            self.assertEqual(a["error"]["code"], "not_found", a)
        for a in answers[7:11]:
            self.assertEqual(a["error"]["code"], "invalid_input", a)
            self.assertIn("interface_message_id", a["error"]["message"])
        self.assertEqual(answers[11]["error"]["code"], "invalid_input")
        self.assertIn("colour", answers[11]["error"]["message"])
        self.assertIsNone(answers[12]["error"], answers[12])
        self.assertEqual(answers[13]["result"]["message_id"], turn["answer_message_id"])

    def test_appended_message_keeps_its_identity(self):
        self.fake()
        lines = [{"op": "append", "conversation_id": "k", "interface_type": "web",
                  "content": WASHING, "interface_message_id": "web-7",
                  "metadata": {"source": "washer", "n": 1}},
                 {"op": "find", "conversation_id": "k", "interface_type": "web",
                  "interface_message_id": "web-7"},
                 # an interface's id is its own text: any UTF-8, as a turn's input takes it
                 {"op": "append", "conversation_id": "k", "content": "mail",
                  "interface_message_id": "<a@b>\n\u00e9"},
                 {"op": "find", "conversation_id": "k", "interface_message_id": "<a@b>\n\u00e9"}]
        run = self.run_ok(lines, self.opts())
        self.assertEqual(run.by_seq(4)["result"]["message_id"], run.by_seq(3)["answer_message_id"])
        appended = run.by_seq(1)
        self.assertIsNone(appended["error"], appended)
        m = run.by_seq(2)["result"]
        self.assertEqual(m["message_id"], appended["answer_message_id"])
        self.assertEqual(m["metadata"], {"source": "washer", "n": 1})
        self.assertEqual(m["message"], assistant(WASHING))
        self.assertEqual(m["turn_id"], appended["turn_id"])

    def test_lifetime_counts_survive_truncation(self):
        self.fake()
        lines = [{"text": "one", "conversation_id": "c"},
                 {"text": "two", "conversation_id": "c"},
                 {"op": "append", "conversation_id": "c", "role": "system", "content": AWAY},
                 {"text": "three", "conversation_id": "c"},
                 {"op": "history", "conversation_id": "c"},
                 {"op": "list"}]
        run = self.run_ok(lines, self.opts(history_keep_turns=2))
        history = run.by_seq(5)["result"]
        self.assertEqual(len(history["turns"]), 2, "kept: the last two")
        self.assertEqual(history["messages_kept"], 3, "the note's turn and the last one")
        self.assertEqual(history["message_count"], 7, "ever added")
        listed = [c for c in run.by_seq(6)["result"]["conversations"]
                  if c["conversation_id"] == "c"]
        self.assertEqual(len(listed), 1)
        for conv in (history, listed[0]):
            self.assertEqual(conv["message_count"], 7)
            self.assertEqual(conv["turn_count"], 4)
            self.assertEqual(conv["participants"], ["user", "assistant", "system"])
            # the newest message: the last turn's answer
            self.assertGreaterEqual(conv["last_message_at"], history["turns"][-1]["started_at"])
            self.assertLessEqual(conv["last_message_at"], history["turns"][-1]["finished_at"])


class SqliteMessageOpsCase(MessageOpsCase):
    STORE = "sqlite"


class RedisMessageOpsCase(MessageOpsCase):
    STORE = "redis"

    def test_store_down_is_storage_in_the_stores_words(self):
        self.fake()
        server = RedisServer()
        self.addCleanup(server.stop)
        with InteractiveShim(options(self.llm, history_store=server.url)) as sh:
            turn = self.assertTurnOk(sh.turn({"text": "hi", "conversation_id": "r"}))
            server.stop()
            found = sh.op("find", conversation_id="r", interface_message_id="x")
            appended = sh.op("append", conversation_id="r", content=WASHING)
            setid = sh.op("set_interface_message_id", turn_id=turn["turn_id"],
                          interface_message_id="x")
        self.assertEqual(found["error"]["code"], "storage", found)
        self.assertIn("redis store", found["error"]["message"])
        self.assertEqual(appended["error"]["code"], "storage", appended)
        self.assertEqual(setid["error"]["code"], "storage", setid)


if __name__ == "__main__":
    unittest.main()
