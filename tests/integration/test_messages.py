"""Messages with identity: interfaces keep separate histories, and history_query /
message_get find stored messages (docs/history.md, "Querying messages").

What the model saw is asserted from the fake server's request log; what a host
reads back, from the shim's "query" and "message" ops."""
import unittest

from harness import UUID_RE, FakeLLM, ParleyTestCase, fake_reply, messages, options

PROMPT = "You are a test assistant."
SYS = {"role": "system", "content": PROMPT}


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


class MessagesCase(ParleyTestCase):
    maxDiff = None

    def setUp(self):
        self.llm = FakeLLM()
        self.addCleanup(self.llm.close)

    def test_interfaces_are_separate_conversations(self):
        lines = [{"text": "web one", "conversation_id": "c", "interface_type": "web"},
                 {"text": "telegram one", "conversation_id": "c", "interface_type": "telegram"},
                 {"text": "plain one", "conversation_id": "c"},
                 {"text": "web two", "conversation_id": "c", "interface_type": "web"},
                 {"op": "query", "interface_type": "telegram"},
                 {"op": "query", "conversation_id": "c", "interface_type": "", "persona": ""},
                 {"op": "history", "conversation_id": "c"}]
        run = self.run_ok(lines, options(self.llm))
        for seq in range(1, 5):
            self.assertTurnOk(run.by_seq(seq))
        reqs = {messages(r)[-1]["content"]: messages(r) for r in self.llm.chat_requests()}
        self.assertEqual(reqs["web two"],
                         [SYS, user("web one"), assistant(fake_reply("web one", 2, 1)),
                          user("web two")])
        self.assertEqual(reqs["telegram one"], [SYS, user("telegram one")])
        self.assertEqual(reqs["plain one"], [SYS, user("plain one")])

        tg = run.by_seq(5)["result"]["messages"]
        self.assertEqual([(m["role"], m["interface_type"], m["conversation_id"]) for m in tg],
                         [("assistant", "telegram", "c"), ("user", "telegram", "c")])
        self.assertEqual(tg[1]["message"], user("telegram one"))
        self.assertEqual(tg[1]["turn_id"], run.by_seq(2)["turn_id"])
        self.assertRegex(tg[1]["message_id"], UUID_RE)
        plain = run.by_seq(6)["result"]["messages"]
        self.assertEqual([m["message"]["content"] for m in plain],
                         [fake_reply("plain one", 2, 1), "plain one"])
        # the existing history functions read the key without an interface
        h = run.by_seq(7)["result"]
        self.assertEqual([t["turn_id"] for t in h["turns"]], [run.by_seq(3)["turn_id"]])

    def test_query_filters_paging_and_message(self):
        texts = ["Is the washing machine done?", "turn on the light", "WASHING again",
                 "good night"]
        lines = [{"text": t, "conversation_id": "k%d" % (i % 2)} for i, t in enumerate(texts)]
        lines += [{"op": "query", "search": "washing", "role": "user", "order": "oldest"},
                  {"op": "query", "limit": 3},
                  {"op": "query", "conversation_id": "k1", "order": "oldest"}]
        run = self.run_ok(lines, options(self.llm))
        found = run.by_seq(5)["result"]
        self.assertEqual([m["message"]["content"] for m in found["messages"]],
                         [texts[0], texts[2]])
        self.assertIsNone(found["next_cursor"])
        page = run.by_seq(6)["result"]
        self.assertEqual(len(page["messages"]), 3)
        self.assertEqual(page["messages"][0]["message"]["content"], fake_reply(texts[3], 4, 2))
        self.assertIsInstance(page["next_cursor"], str)
        k1 = run.by_seq(7)["result"]["messages"]
        self.assertEqual([m["message"]["content"] for m in k1 if m["role"] == "user"],
                         [texts[1], texts[3]])

        # The next page.  A cursor holds a position, and the memory store numbers
        # messages in the order they were stored: the same lines in a new run
        # give the same positions, so this run's cursor pages the next run.
        cursor = page["next_cursor"]
        lines2 = lines[:4] + [{"op": "query", "limit": 3},
                              {"op": "query", "limit": 10, "cursor": cursor},
                              {"op": "query", "role": "user", "cursor": cursor},
                              {"op": "message",
                               "message_id": "00000000-0000-4000-8000-000000000000"}]
        run2 = self.run_ok(lines2, options(self.llm))
        rest = run2.by_seq(6)["result"]
        self.assertEqual(len(rest["messages"]), 5)
        self.assertIsNone(rest["next_cursor"])
        ids = [m["message_id"] for m in run2.by_seq(5)["result"]["messages"] + rest["messages"]]
        self.assertEqual(len(set(ids)), 8)
        self.assertEqual([m["message"]["content"] for m in rest["messages"]][-1], texts[0])
        err = run2.by_seq(7)["error"]
        self.assertEqual(err["code"], "invalid_input")
        self.assertIn("cursor", err["message"])
        self.assertEqual(run2.by_seq(8)["error"]["code"], "not_found")

    def test_bad_queries_name_the_key(self):
        bad = [({"limit": 0}, "limit"), ({"limit": 10001}, "limit"), ({"role": "robot"}, "role"),
               ({"since": "yesterday"}, "since"),
               ({"since": "2026-11-23T00:00:00Z", "until": "2026-11-22T00:00:00Z"}, "since"),
               ({"colour": "red"}, "colour"), ({"cursor": "c1.0.1"}, "cursor")]
        lines = [{"text": "hello", "conversation_id": "b"}]
        lines += [dict(op="query", **q) for q, _ in bad]
        run = self.run_ok(lines, options(self.llm))
        for seq, (_, key) in enumerate(bad, start=2):
            err = run.by_seq(seq)["error"]
            self.assertEqual(err["code"], "invalid_input", err)
            self.assertIn(key, err["message"])

    def test_bad_interface_type_is_refused(self):
        run = self.run_ok([{"text": "hi", "conversation_id": "c", "interface_type": "a\u0001b"},
                           {"op": "list"}], options(self.llm))
        err = run.by_seq(1)["error"]
        self.assertEqual(err["code"], "invalid_input")
        self.assertIn("interface_type", err["message"])
        self.assertEqual(run.by_seq(2)["result"]["conversations"], [])
        self.assertEqual(self.llm.chat_requests(), [])


if __name__ == "__main__":
    unittest.main()
