"""Message identity inside a turn (docs/history.md, "Metadata and interface message ids",
"Reply context"): the input's metadata and interface message id are kept with the stored
user message, the result returns the stored ids, and a reply to a turn that has left the
history sent brings that turn back into the request, once, with a note after the new
user message's text.

What the model saw is asserted from the fake server's request log; what a host reads back,
from the shim's result lines and its "message" / "query" / "turn" ops."""
import contextlib
import json
import os
import tempfile
import unittest

from harness import (UUID_RE, FakeLLM, InteractiveShim, ParleyTestCase, as_sent, messages,
                     options, tool_sequence_problems)
from redis_server import RedisServer
from test_providers import PROVIDERS, llm_requests, provider_options

PROMPT = "You are a test assistant."
NOTE = ("The user's latest message replies to an earlier exchange of this conversation; that "
        "exchange is repeated just before the latest message.")
TOOL_TEXT = '[[tool:turn_on {"name":"kitchen"}]]'
UNKNOWN_TURN = "00000000-0000-4000-8000-000000000000"
NO_LOAD_TURN_WARNING = "cannot look up the turn reply_to names"


def user(text):
    return {"role": "user", "content": text}


def noted(text, note=NOTE):
    """The turn's user message as sent with the turn's instructions after its text."""
    return user(text + "\n\n[Instructions for this turn, from the system, not from the user]\n"
                + note)


@contextlib.contextmanager
def shim(case, opts, **kw):
    """An InteractiveShim that must exit cleanly (a sanitizer report fails the test)."""
    with InteractiveShim(opts, **kw) as sh:
        yield sh
    case.assertEqual(sh.rc, 0, sh.stderr)


class ReplyContextCase(ParleyTestCase):
    maxDiff = None

    def setUp(self):
        self.llm = FakeLLM()
        self.addCleanup(self.llm.close)

    def turn_messages(self, sh, turn_id):
        line = sh.op("turn", turn_id=turn_id)
        self.assertIsNone(line["error"], line)
        return line["result"]["turn"]["messages"]

    def conversation(self, sh, n_plain=3, first=None, **keys):
        """A tool turn (with `first`'s extra keys) then n_plain plain turns on "home",
        each with `keys`; returns their result lines."""
        lines = [sh.turn(dict({"text": TOOL_TEXT, "conversation_id": "home"}, **keys,
                              **(first or {})))]
        for i in range(n_plain):
            lines.append(sh.turn(dict({"text": "plain %d" % (i + 1), "conversation_id": "home"},
                                      **keys)))
        for line in lines:
            self.assertIsNone(line["error"], line)
        return lines

    def test_reply_outside_the_window_is_sent_whole_and_marked(self):
        o = options(self.llm, max_history_turns=2, history_keep_turns=0, summarize=False)
        with shim(self, o, tools="demo") as sh:
            first, _, third, fourth = self.conversation(sh)
            old = self.turn_messages(sh, first["turn_id"])
            window = self.turn_messages(sh, third["turn_id"]) + \
                self.turn_messages(sh, fourth["turn_id"])
            n_before = len(self.llm.chat_requests())
            reply = sh.turn({"text": "and the hall?", "conversation_id": "home",
                             "reply_to": {"turn_id": first["turn_id"]}})
            self.assertIsNone(reply["error"], reply)
            self.assertEqual(reply["reply_context"], "included")
            stored = self.turn_messages(sh, reply["turn_id"])
        reqs = self.llm.chat_requests()
        self.assertEqual(len(reqs), n_before + 1)
        sent = messages(reqs[-1])
        # the window, then the replied-to turn whole (its tool call and result), then the message
        self.assertEqual(sent, [{"role": "system", "content": PROMPT}] +
                         as_sent(window) + as_sent(old) + [noted("and the hall?")])
        self.assertEqual([m["role"] for m in old], ["user", "assistant", "tool", "assistant"])
        self.assertIn("tool_calls", old[1])
        self.assertEqual(tool_sequence_problems(sent), [])
        # sent, not stored again: the new turn keeps only its own two messages
        self.assertEqual(stored, [user("and the hall?"),
                                  {"role": "assistant", "content": reply["response"]}])
        # and the next turn is an ordinary one again: no note, no repeated turn
        self.assertNotIn(NOTE, json.dumps(messages(reqs[-2])))

    def test_reply_inside_the_window_is_not_repeated(self):
        o = options(self.llm, max_history_turns=2, history_keep_turns=0, summarize=False)
        with shim(self, o, tools="demo") as sh:
            _, _, third, fourth = self.conversation(sh)
            window = self.turn_messages(sh, third["turn_id"]) + \
                self.turn_messages(sh, fourth["turn_id"])
            reply = sh.turn({"text": "about that", "conversation_id": "home",
                             "reply_to": {"turn_id": third["turn_id"].upper()}})
        self.assertIsNone(reply["error"], reply)
        self.assertEqual(reply["reply_context"], "in_window")
        self.assertEqual(messages(self.llm.chat_requests()[-1]),
                         [{"role": "system", "content": PROMPT}] + as_sent(window) +
                         [user("about that")])

    def test_reply_by_interface_message_id(self):
        o = options(self.llm, max_history_turns=1, history_keep_turns=0, summarize=False)
        with shim(self, o, tools="demo") as sh:
            first = self.conversation(sh, n_plain=2, first={"interface_message_id": "tg-100"},
                                      interface_type="telegram")[0]
            # the same conversation id without an interface is another conversation
            other = sh.turn({"text": "no interface", "conversation_id": "home",
                             "reply_to": {"interface_message_id": "tg-100"}})
            reply = sh.turn({"text": "that one", "conversation_id": "home",
                             "interface_type": "telegram", "interface_message_id": "tg-104",
                             "reply_to": {"interface_message_id": "tg-100"}})
            old = self.turn_messages(sh, first["turn_id"])
        self.assertEqual(other["reply_context"], "not_found")
        self.assertIsNone(reply["error"], reply)
        self.assertEqual(reply["reply_context"], "included")
        sent = messages(self.llm.chat_requests()[-1])
        self.assertEqual(sent[-1], noted("that one"))
        self.assertEqual(sent[-1 - len(old):-1], as_sent(old))

    def test_unknown_target_runs_without_it(self):
        lines = [{"text": "hello", "conversation_id": "a"},
                 {"text": "one", "conversation_id": "a", "reply_to": {"turn_id": UNKNOWN_TURN}},
                 {"text": "two", "conversation_id": "a",
                  "reply_to": {"interface_message_id": "nobody"}},
                 {"text": "three", "conversation_id": "b"}]
        run = self.run_ok(lines, options(self.llm, max_history_turns=1, history_keep_turns=0, summarize=False))
        for seq, ctx in ((2, "not_found"), (3, "not_found")):
            line = self.assertTurnOk(run.by_seq(seq))
            self.assertEqual(line["reply_context"], ctx)
        self.assertNotIn("reply_context", run.by_seq(1))
        for r in self.llm.chat_requests():
            self.assertEqual(messages(r)[0], {"role": "system", "content": PROMPT})
        # a turn of another conversation is not a match
        with shim(self, options(self.llm, max_history_turns=1, history_keep_turns=0, summarize=False)) as sh:
            theirs = sh.turn({"text": "in b", "conversation_id": "b"})
            sh.turn({"text": "in a", "conversation_id": "a"})
            sh.turn({"text": "again a", "conversation_id": "a"})
            mine = sh.turn({"text": "cross", "conversation_id": "a",
                            "reply_to": {"turn_id": theirs["turn_id"]}})
        self.assertEqual(mine["reply_context"], "not_found")
        self.assertNotIn("in b", json.dumps(messages(self.llm.chat_requests()[-1])))

    def test_a_turn_no_longer_kept_is_not_found(self):
        # history_keep_turns 1: what left the store is gone
        with shim(self, options(self.llm, max_history_turns=1, history_keep_turns=1, summarize=False)) as sh:
            first = sh.turn({"text": "old", "conversation_id": "k", "interface_message_id": "k1"})
            sh.turn({"text": "newer", "conversation_id": "k"})
            reply = sh.turn({"text": "that", "conversation_id": "k",
                             "reply_to": {"interface_message_id": "k1"}})
            gone = sh.op("turn", turn_id=first["turn_id"])
        self.assertEqual(gone["error"]["code"], "not_found")
        self.assertIsNone(reply["error"], reply)
        self.assertEqual(reply["reply_context"], "not_found")

    def test_ids_metadata_and_interface_id_come_back(self):
        meta = {"from": "anna", "chat": -1001, "tags": ["kitchen", "evening"]}
        with shim(self, options(self.llm), tools="demo") as sh:
            res = sh.turn({"text": TOOL_TEXT, "conversation_id": "m", "interface_type": "web",
                           "interface_message_id": "w-1", "metadata": meta})
            self.assertIsNone(res["error"], res)
            um = sh.op("message", message_id=res["user_message_id"])["result"]
            am = sh.op("message", message_id=res["answer_message_id"])["result"]
            found = sh.op("query", conversation_id="m", order="oldest")["result"]["messages"]
            stateless = sh.turn({"text": "no history", "metadata": {"x": 1},
                                 "interface_message_id": "s-1"})
        self.assertRegex(res["user_message_id"], UUID_RE)
        self.assertRegex(res["answer_message_id"], UUID_RE)
        self.assertEqual((um["role"], um["turn_id"], um["interface_type"]),
                         ("user", res["turn_id"], "web"))
        self.assertEqual(um["metadata"], meta)
        self.assertEqual(um["interface_message_id"], "w-1")
        self.assertEqual(um["message"], user(TOOL_TEXT))
        self.assertEqual((am["role"], am["message"]["content"]), ("assistant", res["response"]))
        self.assertNotIn("metadata", am)
        self.assertNotIn("interface_message_id", am)
        self.assertEqual(found[0], um)  # the query shows the same record
        self.assertEqual(found[-1]["message_id"], res["answer_message_id"])
        self.assertEqual(len(found), 4)
        # metadata and interface ids are the host's: the model never sees them
        for r in self.llm.chat_requests():
            self.assertNotIn("anna", json.dumps(r["body"]))
            self.assertNotIn("w-1", json.dumps(r["body"]))
        self.assertIsNone(stateless["error"], stateless)
        self.assertNotIn("user_message_id", stateless)
        self.assertNotIn("answer_message_id", stateless)

    def test_failed_turn_stores_nothing_and_returns_no_ids(self):
        lines = [{"text": "kept", "conversation_id": "f"},
                 {"op": "history", "conversation_id": "f"},
                 {"text": "boom [[fault:400]]", "conversation_id": "f", "metadata": {"a": 1},
                  "interface_message_id": "x-9"},
                 {"op": "history", "conversation_id": "f"},
                 {"op": "query", "search": "boom"}]
        run = self.run_ok(lines, options(self.llm, max_retries=0))
        failed = self.assertTurnError(run.by_seq(3), "http_status")
        for key in ("user_message_id", "answer_message_id", "reply_context"):
            self.assertNotIn(key, failed)
        self.assertEqual(run.raw_result(2), run.raw_result(4))
        self.assertEqual(run.by_seq(5)["result"]["messages"], [])

    def test_bad_identity_input_names_the_field_and_changes_nothing(self):
        bad = [({"metadata": [1]}, "metadata"),
               ({"reply_to": "x"}, "reply_to"),
               ({"interface_message_id": ""}, "interface_message_id"),
               ({"interface_message_id": "i" * 257}, "interface_message_id"),
               ({"reply_to": {"turn_id": "nope"}}, "reply_to_json"),
               ({"reply_to": {"turn_id": UNKNOWN_TURN, "interface_message_id": "a"}},
                "reply_to_json"),
               ({"reply_to": {"message_id": UNKNOWN_TURN}}, "reply_to_json")]
        lines = [{"text": "kept", "conversation_id": "c"},
                 {"op": "history", "conversation_id": "c"}]
        lines += [dict({"text": "bad", "conversation_id": "c"}, **b) for b, _ in bad]
        lines += [{"text": "stateless", "reply_to": {"turn_id": UNKNOWN_TURN}},
                  {"op": "history", "conversation_id": "c"}, {"op": "list"}]
        run = self.run_ok(lines, options(self.llm))
        for seq, (_, field) in enumerate(bad, start=3):
            err = run.by_seq(seq)["error"]
            self.assertEqual(err["code"], "invalid_input", err)
            self.assertIn(field, err["message"])
        err = run.by_seq(len(bad) + 3)["error"]
        self.assertEqual(err["code"], "invalid_input")
        self.assertIn("reply_to_json", err["message"])
        n = len(lines)
        self.assertEqual(run.raw_result(2), run.raw_result(n - 1))
        self.assertEqual(len(run.by_seq(n)["result"]["conversations"]), 1)
        self.assertEqual(len(self.llm.chat_requests()), 1)


class ReplyContextProviders(ParleyTestCase):
    """Every codec renders a replied-to tool turn into a request its API accepts (the fake
    server validates each dialect strictly: alternation, tool results after their calls)."""

    def test_every_provider(self):
        for provider in PROVIDERS:
            for stream in (False, True):
                with self.subTest(provider=provider, stream=stream), FakeLLM() as fake:
                    o = provider_options(fake, provider, stream=stream, max_history_turns=1,
                                         history_keep_turns=0, summarize=False)
                    with shim(self, o, tools="demo") as sh:
                        first = sh.turn({"text": TOOL_TEXT, "conversation_id": "p",
                                         "interface_message_id": "p-1"})
                        sh.turn({"text": "next", "conversation_id": "p"})
                        reply = sh.turn({"text": "back to that", "conversation_id": "p",
                                         "reply_to": {"interface_message_id": "p-1"}})
                        again = sh.turn({"text": TOOL_TEXT + " again", "conversation_id": "p",
                                         "reply_to": {"turn_id": first["turn_id"]}})
                    reqs = llm_requests(fake, provider)
                    self.assertTrue(all(r["status"] == 200 for r in reqs),
                                    [(r["status"], r.get("response")) for r in reqs])
                    for line in (first, reply, again):
                        self.assertIsNone(line["error"], line)
                    self.assertEqual((reply["reply_context"], again["reply_context"]),
                                     ("included", "included"))
                    body = json.dumps(reqs[3]["body"])
                    self.assertIn("replies to an earlier exchange", body)
                    self.assertIn("kitchen", body)  # the replied-to turn's tool call
                    # the last reply's own tool round went through too: 2 + 1 + 1 + 2 requests
                    self.assertEqual(len(reqs), 6)


class ReplyContextSqlite(ParleyTestCase):
    """A file store keeps ids, metadata and interface ids across a restart, and a reply
    after the restart finds its turn (needs the SQLite store's v4: branch msgsqlite)."""

    def test_restart_keeps_identity(self):
        with FakeLLM() as llm, tempfile.TemporaryDirectory(prefix="parley-reply-") as d:
            o = options(llm, history_store="sqlite:" + os.path.join(d, "h.db"),
                        max_history_turns=1, history_keep_turns=0)
            with shim(self, o) as sh:
                first = sh.turn({"text": "remember the blue box", "conversation_id": "s",
                                 "interface_type": "email", "interface_message_id": "<a@x>",
                                 "metadata": {"from": "ben"}})
                sh.turn({"text": "something else", "conversation_id": "s",
                         "interface_type": "email"})
            self.assertIsNone(first["error"], first)
            with shim(self, o) as sh:
                um = sh.op("message", message_id=first["user_message_id"])
                reply = sh.turn({"text": "which box?", "conversation_id": "s",
                                 "interface_type": "email",
                                 "reply_to": {"interface_message_id": "<a@x>"}})
            self.assertIsNone(um["error"], um)
            self.assertEqual(um["result"]["metadata"], {"from": "ben"})
            self.assertEqual(um["result"]["interface_message_id"], "<a@x>")
            self.assertEqual(um["result"]["turn_id"], first["turn_id"])
            self.assertEqual(reply["reply_context"], "included")
            self.assertIn("remember the blue box", json.dumps(messages(llm.chat_requests()[-1])))


class ReplyContextRedis(ParleyTestCase):
    """On a shared store the lookup runs on the store threads after the conversation's
    lease.  The Redis store has load_turn (store v4): replies are included as on the other
    stores, by interface message id and by turn id, with no warning."""

    def test_reply_on_redis(self):
        redis = RedisServer()
        self.addCleanup(redis.stop)
        with FakeLLM() as llm:
            o = options(llm, history_store=redis.url, max_history_turns=1, history_keep_turns=0,
                        summarize=False)
            with shim(self, o, tools="demo") as sh:
                first = sh.turn({"text": TOOL_TEXT, "conversation_id": "r",
                                 "interface_message_id": "r-1"})
                sh.turn({"text": "next", "conversation_id": "r"})
                reply = sh.turn({"text": "back", "conversation_id": "r",
                                 "reply_to": {"interface_message_id": "r-1"}})
                again = sh.turn({"text": "again", "conversation_id": "r",
                                 "reply_to": {"turn_id": first["turn_id"]}})
            sent = json.dumps(messages(llm.chat_requests()[-1]))
        for line in (first, reply, again):
            self.assertIsNone(line["error"], line)
        self.assertEqual((reply["reply_context"], again["reply_context"]),
                         ("included", "included"))
        self.assertEqual(sh.stderr.count(NO_LOAD_TURN_WARNING), 0, sh.stderr)
        self.assertIn(NOTE, sent)
        self.assertIn("kitchen", sent)


if __name__ == "__main__":
    unittest.main()
