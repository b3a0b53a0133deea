"""Personas in one agent (option `personas`, input `persona`): each persona
has its own system prompt, options and history per conversation id.

Everything is asserted from the fake server's request log and the shim's
history ops."""
import base64
import json
import os
import tempfile
import unittest

from harness import FakeLLM, ParleyTestCase, fake_reply, messages, options, run_shim

CHEF = "You are a chef."
BUTLER = "You are a butler."
PERSONAS = {
    "chef": {"prompt": CHEF},
    "butler": {"prompt": BUTLER, "model": "butler-model", "temperature": 0.3,
               "max_tokens": 99, "tools": ["lights"], "max_history_turns": 1},
}
TOOLS = [{"name": "lights", "description": "Lights", "result": "on"},
         {"name": "oven", "description": "Oven", "result": "hot"}]


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


def system(text):
    return {"role": "system", "content": text}


class PersonaCase(ParleyTestCase):
    maxDiff = None

    def setUp(self):
        self.llm = FakeLLM()
        self.addCleanup(self.llm.close)

    def opts(self, **kw):
        # tools: the shim adds TOOLS; summaries (test_context.py) would add requests
        o = options(self.llm, personas=PERSONAS, summarize=False)
        o.update(kw)
        return o


class Separation(PersonaCase):
    def test_two_personas_on_one_conversation_never_see_each_other(self):
        run = self.run_ok([
            {"text": "c1", "conversation_id": "x", "persona": "chef"},
            {"text": "b1", "conversation_id": "x", "persona": "butler"},
            {"text": "c2", "conversation_id": "x", "persona": "chef"},
            {"text": "n1", "conversation_id": "x"},
        ], self.opts(), tools=TOOLS)
        for seq in (1, 2, 3, 4):
            self.assertTurnOk(run.by_seq(seq))
        reqs = self.llm.chat_requests()
        self.assertEqual(len(reqs), 4)
        self.assertEqual(messages(reqs[0]), [system(CHEF), user("c1")])
        self.assertEqual(messages(reqs[1]), [system(BUTLER), user("b1")])
        # switching back restores the chef's own conversation, without the butler's turn
        self.assertEqual(messages(reqs[2]), [system(CHEF), user("c1"),
                                             assistant(fake_reply("c1", 2, 1)), user("c2")])
        # no persona: the agent's own prompt and history (empty so far)
        self.assertEqual(messages(reqs[3]), [system("You are a test assistant."), user("n1")])

    def test_persona_options_and_tools_reach_the_request(self):
        run = self.run_ok([
            {"text": "b1", "conversation_id": "y", "persona": "butler"},
            {"text": "b2", "conversation_id": "y", "persona": "butler"},
            {"text": "c1", "conversation_id": "y", "persona": "chef",
             "extra_system_prompt": "It is Sunday."},
        ], self.opts(), tools=TOOLS)
        for seq in (1, 2, 3):
            self.assertTurnOk(run.by_seq(seq))
        b1, b2, c1 = (r["body"] for r in self.llm.chat_requests())
        self.assertEqual((b1["model"], b1["temperature"], b1["max_tokens"]),
                         ("butler-model", 0.3, 99))
        self.assertEqual([t["function"]["name"] for t in b1["tools"]], ["lights"])
        # max_history_turns 1: the second butler turn carries only the first
        self.assertEqual([m["content"] for m in b2["messages"]][1:],
                         ["b1", fake_reply("b1", 2, 1), "b2"])
        # the chef: the agent's model and all its tools; its prompt, and the turn's
        # extra_system_prompt after the user's text (docs/history.md)
        self.assertEqual(c1["model"], "fake-model")
        self.assertNotIn("temperature", c1)
        self.assertEqual(sorted(t["function"]["name"] for t in c1["tools"]), ["lights", "oven"])
        self.assertEqual(c1["messages"][0], system(CHEF))
        self.assertTrue(c1["messages"][-1]["content"].endswith("\nIt is Sunday."))


class HistoryByPersona(PersonaCase):
    def test_history_and_clear_per_persona(self):
        run = self.run_ok([
            {"text": "c1", "conversation_id": "h", "persona": "chef"},
            {"text": "b1", "conversation_id": "h", "persona": "butler"},
            {"text": "n1", "conversation_id": "h"},
            {"op": "history", "conversation_id": "h", "persona": "chef"},
            {"op": "history", "conversation_id": "h", "persona": "butler"},
            {"op": "history", "conversation_id": "h"},
            {"op": "clear", "conversation_id": "h", "persona": "chef"},
            {"op": "history", "conversation_id": "h", "persona": "chef"},
            {"text": "b2", "conversation_id": "h", "persona": "butler"},
            {"text": "c2", "conversation_id": "h", "persona": "chef"},
            {"op": "history", "conversation_id": "h", "persona": "pirate"},
            {"op": "clear", "conversation_id": "h", "persona": "*"},
            {"op": "history", "conversation_id": "h", "persona": "butler"},
            {"op": "history", "conversation_id": "h"},
            {"op": "metrics"},
        ], self.opts(), tools=TOOLS)

        def texts(seq):
            line = run.by_seq(seq)
            self.assertIsNone(line["error"], line)
            return [m["content"] for t in line["result"]["turns"] for m in t["messages"]]
        self.assertEqual(texts(4), ["c1", fake_reply("c1", 2, 1)])
        self.assertEqual(texts(5), ["b1", fake_reply("b1", 2, 1)])
        self.assertEqual(texts(6), ["n1", fake_reply("n1", 2, 1)])
        # clearing the chef's history leaves the butler's
        self.assertIsNone(run.by_seq(7)["error"])
        self.assertEqual(run.by_seq(8)["error"]["code"], "not_found")
        reqs = self.llm.chat_requests()
        self.assertEqual(messages(reqs[3]), [system(BUTLER), user("b1"),
                                             assistant(fake_reply("b1", 2, 1)), user("b2")])
        self.assertEqual(messages(reqs[4]), [system(CHEF), user("c2")])
        err = run.by_seq(11)["error"]
        self.assertEqual(err["code"], "invalid_input")
        self.assertIn('unknown persona "pirate"', err["message"])
        # "*": the conversation under every persona, the agent's own included
        self.assertIsNone(run.by_seq(12)["error"])
        self.assertEqual(run.by_seq(13)["error"]["code"], "not_found")
        self.assertEqual(run.by_seq(14)["error"]["code"], "not_found")
        m = run.by_seq(15)["result"]["personas"]
        self.assertEqual((m["chef"]["clears"], m["butler"]["clears"]), (2, 1))


class ListByPersona(PersonaCase):
    """The conversation list shows each conversation's persona and can be
    filtered by it; clear "*" works on every store (Redis has no queries)."""

    def check_store(self, store):
        run = self.run_ok([
            {"text": "c1", "conversation_id": "h", "persona": "chef"},
            {"text": "b1", "conversation_id": "h", "persona": "butler"},
            {"text": "n1", "conversation_id": "x"},
            {"op": "list"},
            {"op": "list", "filter": {"persona": "chef"}},
            {"op": "list", "filter": {"persona": ""}},
            {"op": "list", "filter": {"persona": "pirate"}},
            {"op": "list", "filter": {"colour": "red"}},
            {"op": "clear", "conversation_id": "h", "persona": "*"},
            {"op": "list"},
        ], self.opts(history_store=store), tools=TOOLS)

        def listed(seq):
            line = run.by_seq(seq)
            self.assertIsNone(line["error"], line)
            return [(c["conversation_id"], c.get("persona")) for c in
                    line["result"]["conversations"]]
        self.assertEqual(listed(4), [("x", None), ("h", "butler"), ("h", "chef")])
        self.assertEqual(listed(5), [("h", "chef")])
        self.assertEqual(listed(6), [("x", None)])
        err = run.by_seq(7)["error"]
        self.assertEqual(err["code"], "invalid_input")
        self.assertIn("pirate", err["message"])
        err = run.by_seq(8)["error"]
        self.assertEqual(err["code"], "invalid_input")
        self.assertIn('filter: unknown key "colour" (expected persona, interface_type)',
                      err["message"])
        self.assertIsNone(run.by_seq(9)["error"])
        self.assertEqual(listed(10), [("x", None)])

    def test_memory(self):
        self.check_store("memory")

    def test_sqlite(self):
        with tempfile.TemporaryDirectory() as d:
            self.check_store("sqlite:" + os.path.join(d, "h.db"))

    def test_redis(self):
        from redis_server import RedisServer
        redis = RedisServer()
        self.addCleanup(redis.stop)
        self.check_store(redis.url)


class Refusals(PersonaCase):
    def test_unknown_persona_is_invalid_input_naming_it(self):
        run = self.run_ok([{"text": "hi", "conversation_id": "z", "persona": "pirate"}],
                          self.opts(), tools=TOOLS)
        err = self.assertTurnError(run.by_seq(1), "invalid_input")["error"]
        self.assertIn('"pirate"', err["message"])
        self.assertIn('"chef"', err["message"])
        self.assertEqual(self.llm.chat_requests(), [])

    def test_bad_personas_option_is_refused_at_create(self):
        o = self.opts(personas={"chef": {"prompt": "p", "tools": ["grill"]}})
        run = run_shim([{"text": "hi"}], o, tools=TOOLS)
        self.assertNotEqual(run.rc, 0)
        self.assertIn('persona "chef": tool "grill" is not one of the agent\'s tools', run.stderr)


class Metrics(PersonaCase):
    def test_per_persona_counters(self):
        run = self.run_ok([
            {"text": "c1", "conversation_id": "m", "persona": "chef"},
            {"text": "c2", "conversation_id": "m", "persona": "chef"},
            {"text": "b1", "conversation_id": "m", "persona": "butler"},
            {"text": "b2", "conversation_id": "m", "persona": "butler"},
            {"text": "b3", "conversation_id": "m", "persona": "butler"},
            {"op": "metrics"},
        ], self.opts(summarize=False), tools=TOOLS)
        m = run.by_seq(6)["result"]["personas"]
        self.assertEqual(m["chef"], {"turns": 2, "turns_stored": 2, "messages_stored": 4,
                                     "truncations": 0, "clears": 0})
        # the butler sends 1 turn of history: its third turn left b1 out
        self.assertEqual(m["butler"], {"turns": 3, "turns_stored": 3, "messages_stored": 6,
                                       "truncations": 1, "clears": 0})
        self.assertEqual(messages(self.llm.chat_requests()[-1])[1:],
                         [user("b2"), assistant(fake_reply("b2", 4, 2)), user("b3")])


class Interactive(PersonaCase):
    def test_persona_and_image_commands(self):
        from test_shim_interactive import PtyShim
        o = self.opts(auto_create_conversation_id=True)
        with tempfile.TemporaryDirectory() as d, PtyShim(o, tools=TOOLS) as sh:
            path = os.path.join(d, "snap.gif")
            with open(path, "wb") as f:
                f.write(GIF)
            sh.read_until("you> ")
            sh.type("/persona chef")
            sh.read_until(r"\(persona chef\)")
            sh.type("hello chef")
            sh.read_until("parley> ")
            sh.read_until("you> ")
            sh.type("/image " + path)
            sh.read_until(r"\(image .*snap.gif attached to the next message\)")
            sh.type("/image " + os.path.join(d, "missing.png"))
            sh.read_until(r"parley! invalid_input: image .*missing.png: No such file")
            sh.type("what is it?")
            sh.read_until("parley> ")
            sh.read_until("you> ")
            sh.type("/history")
            sh.read_until(r"user: what is it\? \[image: image/gif, 14 bytes\]")
            sh.type("/clear")
            sh.read_until(r"\(cleared\)")
            sh.type("/history")
            sh.read_until(r"parley! not_found")
            sh.type("/persona pirate")
            sh.read_until(r"\(persona pirate\)")
            sh.type("arr")
            sh.read_until(r'parley! invalid_input: input \'persona\': unknown persona "pirate"')
            sh.type("/persona")
            sh.read_until(r"\(no persona: the agent's own prompt\)")
            sh.type("plain")
            sh.read_until("parley> ")
            sh.read_until("you> ")
            sh.type("/quit")
            self.assertEqual(sh.wait(), 0)
        r1, r2, r3 = self.llm.chat_requests()
        self.assertEqual(messages(r1), [system(CHEF), user("hello chef")])
        gif = "data:image/gif;base64," + base64.b64encode(GIF).decode()
        self.assertEqual(messages(r2)[1:], [
            user("hello chef"), assistant(fake_reply("hello chef", 2, 1)),
            user([{"type": "text", "text": "what is it?"},
                  {"type": "image_url", "image_url": {"url": gif}}])])
        # the same conversation id, no persona: none of the chef's turns
        self.assertEqual(messages(r3), [system("You are a test assistant."), user("plain")])


GIF = b"GIF89a\x01\x00\x01\x00\x00\x00\x00;"


if __name__ == "__main__":
    unittest.main()
