"""The binding's side of a context overflow: the turn raises parley.ContextOverflow (status
context_overflow, the sizes in its message) and the history stays as it was; the usage of a
turn carries the cached and evaluated prompt tokens the server reported."""
import unittest

from support import PLUGIN, FakeLLM, options, parley


class ContextOverflowTest(unittest.IsolatedAsyncioTestCase):

    def setUp(self):
        self.fake = FakeLLM("--n-ctx", "300")
        self.addCleanup(self.fake.close)

    async def test_overflow_raises_its_own_error(self):
        opts = options(self.fake, auto_create_conversation_id=True, max_retries=0)
        async with parley.Agent(opts, plugin=PLUGIN) as agent:
            ok = await agent.process("hello")
            again = await agent.process("again", ok.conversation_id)
            self.assertGreater(again.usage["cache_read_tokens"], 0)
            self.assertEqual(again.usage["prompt_tokens_evaluated"],
                             again.usage["prompt_tokens"] - again.usage["cache_read_tokens"])
            before = await agent.history(ok.conversation_id)
            with self.assertRaises(parley.ContextOverflow) as cm:
                await agent.process("word " * 400, ok.conversation_id)
            err = cm.exception
            self.assertEqual(err.status, "context_overflow")
            self.assertIsInstance(err, parley.ParleyError)
            self.assertRegex(err.message, r"context window \(\d+ tokens > 300\)")
            self.assertEqual(await agent.history(ok.conversation_id), before)


if __name__ == "__main__":
    unittest.main()
