"""The binding's message functions: query() and message() against the real
parley.so, and the interface_type input field (docs/history.md)."""
import datetime
import unittest

from support import AgentCase, harness, parley


class MessagesTest(AgentCase):

    async def test_interface_query_and_message(self):
        async with self.agent() as agent:
            web = await agent.process("hello from the web", "c", interface_type="web")
            tg = await agent.process("hello from telegram", "c", interface_type="telegram")
            found = await agent.query(interface_type="web", order="oldest")
            self.assertIsNone(found["next_cursor"])
            self.assertEqual([(m["role"], m["message"]["content"]) for m in found["messages"]],
                             [("user", "hello from the web"), ("assistant", web.response)])
            first = found["messages"][0]
            self.assertEqual((first["conversation_id"], first["interface_type"],
                              first["turn_id"]), ("c", "web", web.turn_id))
            self.assertEqual(await agent.message(first["message_id"]), first)
            turn = await agent.turn(web.turn_id)  # says where the turn belongs, with ids
            self.assertEqual((turn["interface_type"], turn["persona"]), ("web", ""))
            self.assertEqual([m["message_id"] for m in turn["messages"]],
                             [web.user_message_id, web.answer_message_id])
            by_turn = await agent.query(turn_id=web.turn_id, order="oldest")
            self.assertEqual(by_turn["messages"], turn["messages"])
            page = await agent.query(limit=1, search="HELLO", role="user")
            self.assertEqual(page["messages"][0]["message"]["content"], "hello from telegram")
            rest = await agent.query(limit=1, search="HELLO", role="user",
                                     cursor=page["next_cursor"])
            self.assertEqual(rest["messages"][0]["message_id"], first["message_id"])
            with self.assertRaisesRegex(parley.InvalidInput, "limit"):
                await agent.query(limit=0)
            with self.assertRaisesRegex(parley.InvalidInput, "cursor"):
                await agent.query(cursor=page["next_cursor"])
            with self.assertRaises(parley.NotFound):
                await agent.message("00000000-0000-4000-8000-000000000000")
            # selectors: the conversation under one interface, then forgotten
            h = await agent.history_by("c", interface_type="telegram")
            self.assertEqual([t["turn_id"] for t in h["turns"]], [tg.turn_id])
            with self.assertRaisesRegex(parley.InvalidInput, "colour"):
                await agent.history_by("c", colour="red")
            with self.assertRaisesRegex(parley.InvalidInput, "persona"):
                await agent.history_by("c", persona="*")
            with self.assertRaises(parley.NotFound):
                await agent.history_by("c")  # no turn without an interface
            await agent.clear_history_by("c", interface_type="web", persona="*")
            with self.assertRaises(parley.NotFound):
                await agent.history_by("c", interface_type="web")
            with self.assertRaises(parley.NotFound):
                await agent.clear_history_by("c", interface_type="web", persona="*")
            await agent.history_by("c", interface_type="telegram")  # untouched
        # the two interfaces are two conversations: the second turn saw only itself
        last = self.fake.chat_requests()[-1]
        self.assertEqual(harness.user_texts(last), ["hello from telegram"])

    async def test_append_find_and_set_interface_message_id(self):
        async with self.agent() as agent:
            first = await agent.process("start the washer", "h", interface_type="web")
            note = await agent.append_message("h", "The washing machine has finished.",
                                              interface_type="web", interface_message_id="w-9",
                                              metadata={"source": "washer"})
            self.assertEqual(note.response, "The washing machine has finished.")
            self.assertIsNone(note.user_message_id)
            self.assertEqual(note.steps, [])
            after = await agent.process("thanks", "h", interface_type="web")
            h = await agent.history_by("h", interface_type="web")
            self.assertEqual([t["turn_id"] for t in h["turns"]],
                             [first.turn_id, note.turn_id, after.turn_id])
            sent = harness.messages(self.fake.chat_requests()[-1])  # joined to the reply
            self.assertTrue(sent[-2]["content"].endswith("\n\nThe washing machine has finished."),
                            sent)
            with self.assertRaisesRegex(parley.InvalidInput, "role"):
                await agent.append_message("h", "x", role="tool")
            said = await agent.append_message("h", "Dad: I'll be late", role="user",
                                              interface_type="web")
            await agent.process("what did dad say?", "h", interface_type="web")
            sent = harness.messages(self.fake.chat_requests()[-1])
            self.assertEqual(sent[-1], {"role": "user",  # one user message: roles alternate
                                        "content": "Dad: I'll be late\n\nwhat did dad say?"})
            self.assertEqual((await agent.message(said.answer_message_id))["role"], "user")
            found = await agent.find_message("h", "w-9", interface_type="web")
            self.assertEqual(found["message_id"], note.answer_message_id)
            self.assertEqual(found["metadata"], {"source": "washer"})
            await agent.set_interface_message_id(after.turn_id, "w-10")
            found = await agent.find_message("h", "w-10", interface_type="web")
            self.assertEqual(found["message_id"], after.answer_message_id)
            with self.assertRaises(parley.NotFound):
                await agent.find_message("h", "w-10")  # no interface: another conversation
            with self.assertRaises(parley.NotFound):
                await agent.set_interface_message_id("00000000-0000-4000-8000-000000000000",
                                                     "w-11")
            with self.assertRaises(parley.InvalidInput):
                await agent.set_interface_message_id(after.turn_id, "")

    async def test_host_timestamps(self):
        tz = datetime.timezone(datetime.timedelta(hours=2))
        async with self.agent() as agent:
            said = await agent.append_message(
                "s", "imported", role="user",
                timestamp=datetime.datetime(2025, 3, 1, 8, 0, tzinfo=tz))
            turn = await agent.process("simulated", "s", timestamp="2025-06-01T09:30:00Z")
            got = await agent.message(said.answer_message_id)
            self.assertTrue(got["created_at"].startswith("2025-03-01T06:00:00"), got)
            found = await agent.query(conversation_id="s", until="2025-04-01T00:00:00Z")
            self.assertEqual([m["message_id"] for m in found["messages"]],
                             [said.answer_message_id])
            found = await agent.query(conversation_id="s", since="2025-06-01T09:30:00Z",
                                      until="2025-06-01T10:00:00Z", order="oldest")
            self.assertEqual([m["message_id"] for m in found["messages"]],
                             [turn.user_message_id, turn.answer_message_id])
            with self.assertRaisesRegex(parley.InvalidInput, "timestamp"):
                await agent.process("x", "s", timestamp=datetime.datetime(2025, 1, 1))
            with self.assertRaisesRegex(parley.InvalidInput, "timestamp"):
                await agent.append_message("s", "x", timestamp="soon")

    async def test_errors_carry_the_plugins_message(self):
        async with self.agent(personas={"chef": {"prompt": "You are a chef."}}) as agent:
            await agent.process("hi", "c", persona="chef")
            with self.assertRaisesRegex(parley.NotFound, 'no conversation "42"$'):
                await agent.history("42")
            with self.assertRaisesRegex(parley.NotFound,
                                        'no conversation "42" under persona "chef"'):
                await agent.history_by("42", persona="chef")
            with self.assertRaisesRegex(parley.NotFound,
                                        'no conversation "42" under persona "chef"'):
                await agent.clear_history_by("42", persona="chef")
            with self.assertRaisesRegex(parley.InvalidInput, 'unknown persona "pirate"') as cm:
                await agent.clear_history_by("c", persona="pirate")
            self.assertEqual(cm.exception.status, "invalid_input")
            with self.assertRaisesRegex(parley.NotFound, "no turn"):
                await agent.turn("00000000-0000-4000-8000-000000000000")
            with self.assertRaisesRegex(parley.NotFound, 'no conversation "gone"'):
                await agent.clear_history("gone")
            self.assertEqual(len((await agent.history_by("c", persona="chef"))["turns"]), 1)

    async def test_personas_at_run_time(self):
        async with self.agent(personas={"chef": {"prompt": "You are a chef."}}) as agent:
            await agent.process("soup?", "v", persona="chef")
            await agent.put_persona("pirate", {"prompt": "You are a pirate."})
            await agent.process("ahoy", "v", persona="pirate")
            self.assertEqual(harness.messages(self.fake.chat_requests()[-1])[0]["content"],
                             "You are a pirate.")
            with self.assertRaisesRegex(parley.InvalidInput, "colour"):
                await agent.put_persona("chef", {"prompt": "x", "colour": "red"})
            await agent.remove_persona("pirate")
            with self.assertRaisesRegex(parley.InvalidInput, "pirate"):
                await agent.process("still there?", "v", persona="pirate")
            with self.assertRaisesRegex(parley.NotFound, "nobody"):
                await agent.remove_persona("nobody")
            await agent.put_persona("pirate", {"prompt": "You are a pirate."})
            self.assertEqual(len((await agent.history_by("v", persona="pirate"))["turns"]), 1)
            await agent.process("more?", "v", persona="chef")
            self.assertEqual(harness.messages(self.fake.chat_requests()[-1])[:2],
                             [{"role": "system", "content": "You are a chef."},
                              {"role": "user", "content": "soup?"}])

    async def test_metrics_prometheus(self):
        async with self.agent(personas={"chef": {"prompt": "You are a chef."}}) as agent:
            await agent.process("soup?", "m", persona="chef", interface_type="web")
            text = await agent.metrics_prometheus()
        self.assertIn("# TYPE parley_turns_total counter\n", text)
        self.assertIn('parley_turns_total{persona="chef",interface_type="web",outcome="ok"} 1\n',
                      text)
        self.assertIn("parley_stored_messages 2\n", text)


if __name__ == "__main__":
    unittest.main()
