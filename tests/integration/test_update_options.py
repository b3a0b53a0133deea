"""update_options: a live agent changes its options without forgetting.

Asserted from the fake server's request log (what each request carried) and
from the shim's op answers: history survives an update, turns in flight finish
under the options they were accepted with, bad options change nothing, and the
options that belong to the store or the connection pool are refused by name.
"""
import os
import tempfile
import unittest

from harness import FakeLLM, ParleyTestCase, messages, options

TOOLS = [{"name": "slow_tool", "description": "answers after 1.5 s", "result": "done",
          "delay_ms": 1500}]


def system_prompt(request):
    first = messages(request)[0]
    return first["content"] if first["role"] == "system" else None


class UpdateOptions(ParleyTestCase):

    def test_history_kept_and_next_turns_use_the_new_options(self):
        with FakeLLM() as llm:
            opts = options(llm, prompt="You are A.")
            new = options(llm, prompt="You are B.", temperature=0.5)
            run = self.run_ok([
                {"text": "first", "conversation_id": "c1"},
                {"op": "wait"},
                {"op": "update_options", "options": new},
                {"text": "second", "conversation_id": "c1"},
                {"op": "history", "conversation_id": "c1"},
            ], opts)
            self.assertIsNone(run.by_seq(3)["error"])
            self.assertTurnOk(run.by_seq(4))
            reqs = llm.chat_requests()
            self.assertEqual([system_prompt(r) for r in reqs], ["You are A.", "You are B."])
            self.assertNotIn("temperature", reqs[0]["body"])
            self.assertEqual(reqs[1]["body"]["temperature"], 0.5)
            # The second request still carries the first turn: nothing was forgotten.
            self.assertEqual([m["content"] for m in messages(reqs[1]) if m["role"] == "user"],
                             ["first", "second"])
            self.assertEqual(len(run.by_seq(5)["result"]["turns"]), 2)

    def test_a_turn_in_flight_finishes_under_its_own_options(self):
        with FakeLLM() as llm:
            opts = options(llm, prompt="You are A.")
            new = options(llm, prompt="You are B.")
            # Turn 1 calls a slow tool; the update lands between its two requests.
            run = self.run_ok([
                {"text": "go [[tool:slow_tool {}]]", "conversation_id": "c1"},
                {"op": "sleep", "ms": 500},
                {"op": "update_options", "options": new},
                {"text": "after", "conversation_id": "c2"},
            ], opts, tools=TOOLS, concurrency=2)
            self.assertTurnOk(run.by_seq(1))
            self.assertTurnOk(run.by_seq(4))
            by_user = {}
            for r in llm.chat_requests():
                first_user = [m["content"] for m in messages(r) if m["role"] == "user"][0]
                by_user.setdefault(first_user, []).append(system_prompt(r))
            self.assertEqual(by_user["go [[tool:slow_tool {}]]"], ["You are A.", "You are A."])
            self.assertEqual(by_user["after"], ["You are B."])

    def test_bad_options_change_nothing(self):
        with FakeLLM() as llm:
            opts = options(llm, prompt="You are A.")
            bad = options(llm, prompt="You are B.", temperature=7)
            run = self.run_ok([
                {"op": "update_options", "options": bad},
                {"op": "update_options", "options": {"prompt": "no model"}},
                {"text": "still A", "conversation_id": "c1"},
            ], opts)
            err = run.by_seq(1)["error"]
            self.assertEqual(err["code"], "invalid_options")
            self.assertIn("'temperature'", err["message"])
            self.assertIn("'model'", run.by_seq(2)["error"]["message"])
            self.assertTurnOk(run.by_seq(3))
            self.assertEqual([system_prompt(r) for r in llm.chat_requests()], ["You are A."])

    def test_store_and_pool_options_are_refused_by_name(self):
        with FakeLLM() as llm, tempfile.TemporaryDirectory() as d:
            opts = options(llm)
            lines = [{"text": "hi", "conversation_id": "c1"}, {"op": "wait"}]
            changes = [("history_store", "sqlite:" + os.path.join(d, "h.db")),
                       ("max_conversations", 5), ("history_idle_timeout_s", 60),
                       ("max_connections", 3), ("history_keep_turns", 2),
                       ("history_sync", "full"), ("history_key_prefix", "other:"),
                       ("history_lease_ms", 2000)]
            for key, value in changes:
                lines.append({"op": "update_options", "options": dict(opts, **{key: value})})
            lines.append({"op": "history", "conversation_id": "c1"})
            run = self.run_ok(lines, opts)
            for i, (key, _) in enumerate(changes):
                err = run.by_seq(3 + i)["error"]
                self.assertEqual(err["code"], "invalid_options", key)
                self.assertIn("'%s'" % key, err["message"])
                self.assertIn("cannot change on a live agent", err["message"])
            self.assertEqual(len(run.by_seq(3 + len(changes))["result"]["turns"]), 1)
            self.assertFalse(os.path.exists(os.path.join(d, "h.db")))

    def test_the_op_needs_an_object(self):
        with FakeLLM() as llm:
            run = self.run_ok([{"op": "update_options", "options": "x"}], options(llm))
            self.assertEqual(run.by_seq(1)["error"]["code"], "invalid_input")


if __name__ == "__main__":
    unittest.main()
