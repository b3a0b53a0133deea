"""The binding's message identity keywords on process()/stream(): metadata=,
interface_message_id=, reply_to=, and the Result's user_message_id,
answer_message_id and reply_context (docs/python.md, docs/history.md)."""
import unittest

from support import AgentCase, harness, parley


class IdentityTest(AgentCase):

    async def test_metadata_interface_id_and_reply(self):
        async with self.agent(max_history_turns=1, history_keep_turns=0, summarize=False) as agent:
            first = await agent.process("the blue box", "c", interface_type="telegram",
                                        interface_message_id="tg-1",
                                        metadata={"from": "anna", "n": 1})
            await agent.process("something else", "c", interface_type="telegram")
            reply = await agent.process("which box?", "c", interface_type="telegram",
                                        reply_to={"interface_message_id": "tg-1"})
            near = await agent.process("that", "c", interface_type="telegram",
                                       reply_to='{"turn_id": "%s"}' % reply.turn_id)
            plain = await agent.process("plain", "c", interface_type="telegram")
            stateless = await agent.process("no history", metadata='{"x": 1}')
            um = await agent.message(first.user_message_id)
            am = await agent.message(first.answer_message_id)
            with self.assertRaisesRegex(parley.InvalidInput, "metadata_json"):
                await agent.process("bad", "c", metadata=[1, 2])
            with self.assertRaisesRegex(parley.InvalidInput, "reply_to_json"):
                await agent.process("bad", "c", reply_to={"turn_id": "x"})
            with self.assertRaisesRegex(TypeError, "interface_message_id must be a str"):
                await agent.process("bad", "c", interface_message_id=7)
            chunks = [c async for c in agent.stream("streamed", "c", interface_type="telegram",
                                                   reply_to={"turn_id": first.turn_id})]
        self.assertEqual(um["metadata"], {"from": "anna", "n": 1})
        self.assertEqual(um["interface_message_id"], "tg-1")
        self.assertEqual(um["message"], {"role": "user", "content": "the blue box"})
        self.assertEqual(am["message"]["content"], first.response)
        self.assertEqual(first.extra["user_message_id"], first.user_message_id)
        self.assertEqual((reply.reply_context, near.reply_context, plain.reply_context),
                         ("included", "in_window", None))
        self.assertIsNone(stateless.user_message_id)
        self.assertIsNone(stateless.answer_message_id)
        self.assertEqual(chunks[-1].reply_context, "included")
        sent = harness.user_texts(self.fake.chat_requests()[2])
        # the note on the replied-to turn follows the user's text (docs/history.md)
        self.assertEqual(sent[:2], ["something else", "the blue box"])
        self.assertTrue(sent[2].startswith("which box?\n\n[Instructions for this turn"), sent)


if __name__ == "__main__":
    unittest.main()
