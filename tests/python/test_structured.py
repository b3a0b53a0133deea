"""The binding's structured output (process(response_format=...) -> Result.structured),
on_reasoning, and check_connection (off the event loop), against the real parley.so and
the fake LLM."""
import asyncio
import threading
import unittest

from support import PLUGIN, AgentCase, options, parley

SCHEMA = {"type": "object",
          "properties": {"room": {"type": "string"}, "level": {"type": "integer"}},
          "required": ["room", "level"]}


class StructuredTest(AgentCase):

    async def test_response_format_returns_the_data(self):
        async with self.agent() as agent:
            r = await agent.process("dim the hall", "c",
                                    response_format={"name": "light", "schema": SCHEMA})
            self.assertEqual(r.structured, {"room": "fake room", "level": 1})
            self.assertEqual(r.response, '{"room":"fake room","level":1}')
            body = self.fake.chat_requests()[0]["body"]
            self.assertEqual(body["response_format"]["json_schema"]["name"], "light")
            # A plain turn has no data.
            plain = await agent.process("hello", "c")
            self.assertIsNone(plain.structured)

    async def test_mismatch_and_bad_format_raise(self):
        async with self.agent() as agent:
            with self.assertRaisesRegex(parley.BadResponse, "lacks the required property 'room'"):
                await agent.process("x [[fault:schema_mismatch]]", "c",
                                    response_format={"schema": SCHEMA})
            with self.assertRaisesRegex(parley.InvalidInput, "must describe a JSON object"):
                await agent.process("x", response_format={"schema": {"type": "string"}})
            with self.assertRaises(parley.NotFound):  # the failed turn stored nothing
                await agent.history("c")


class ReasoningTest(AgentCase):

    async def test_on_reasoning_with_stream_and_process(self):
        seen, order = [], []
        loop_thread = threading.get_ident()

        def on_reasoning(text):
            self.assertEqual(threading.get_ident(), loop_thread)  # on the loop, not the worker
            seen.append(text)
            order.append("r")

        async with self.agent(stream=True) as agent:
            async for item in agent.stream("hi [[think:step one, step two]]",
                                           on_reasoning=on_reasoning):
                if isinstance(item, str):
                    order.append("t")
            self.assertEqual("".join(seen), "step one, step two")
            self.assertEqual(order[0], "r")  # reasoning came before the answer text
            self.assertIn("t", order)
            got = []

            async def async_reasoning(text):
                got.append(text)

            r = await agent.process("again [[think:more]]", on_reasoning=async_reasoning)
            await asyncio.sleep(0)
            self.assertEqual("".join(got), "more")
            self.assertEqual(r.steps[0], {"type": "reasoning", "content": "more"})
            with self.assertRaises(TypeError):
                await agent.process("x", on_reasoning="not callable")


class CheckConnectionTest(AgentCase):

    async def test_ok_and_errors_off_the_loop(self):
        out = await parley.check_connection(options(self.fake), plugin=PLUGIN)
        self.assertTrue(out["ok"])
        self.assertIn("fake-model", out["models"])
        with self.assertRaisesRegex(parley.ConnectError, "is the server running"):
            await parley.check_connection({"model": "m", "base_url": "http://127.0.0.1:9/v1",
                                           "connect_timeout_ms": 2000}, plugin=PLUGIN)
        with self.assertRaisesRegex(parley.InvalidOptions, "option 'model'"):
            await parley.check_connection({"base_url": self.fake.base_url}, plugin=PLUGIN)

    async def test_it_runs_off_the_event_loop(self):
        plugin = parley.load_plugin(PLUGIN)
        threads = []
        real = plugin.check_connection

        def spy(opts):
            threads.append(threading.get_ident())
            return real(opts)

        plugin.check_connection = spy
        self.addCleanup(delattr, plugin, "check_connection")
        out = await parley.check_connection(options(self.fake), plugin=plugin)
        self.assertTrue(out["ok"])
        self.assertEqual(len(threads), 1)
        self.assertNotEqual(threads[0], threading.get_ident())


if __name__ == "__main__":
    unittest.main()
