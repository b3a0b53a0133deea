"""The asyncio binding against the real parley.so and the fake LLM: turns,
memory, tools, streaming, cancellation, concurrency, closing, history."""
import asyncio
import base64
import gc
import json
import unittest

from support import PLUGIN, SLOW, AgentCase, harness, parley, tool_messages


class TurnTest(AgentCase):

    async def test_multi_turn_memory(self):
        async with self.agent(auto_create_conversation_id=True) as agent:
            first = await agent.process("my name is Ada", language="en")
            self.assertRegex(first.conversation_id, harness.UUID_RE)
            self.assertRegex(first.turn_id, harness.UUID_RE)
            self.assertEqual(first.response, harness.fake_reply("my name is Ada", 2, 1))
            self.assertEqual(first.steps, [{"type": "answer", "content": first.response}])
            self.assertFalse(first.continue_conversation)
            second = await agent.process("what was it? [[recall]]", first.conversation_id)
            self.assertEqual(second.conversation_id, first.conversation_id)
            self.assertIn('Your first message was: "my name is Ada"', second.response)
            third = await agent.process("thanks [[ask]]", first.conversation_id)
            self.assertTrue(third.continue_conversation)
        # What the plugin sent: the last request carries the earlier turns.
        last = self.fake.chat_requests()[-1]
        self.assertEqual(harness.user_texts(last),
                         ["my name is Ada", "what was it? [[recall]]", "thanks [[ask]]"])

    async def test_input_fields_reach_the_request_and_tools(self):
        seen = []

        async def where(call):
            seen.append(call)
            return "ok"

        async with self.agent(tools={"where": where}) as agent:
            await agent.process("[[tool:where {}]] go", language="de", device_id="dev1",
                                satellite_id="sat1", agent_id="conversation.parley",
                                extra_system_prompt="Speak German.",
                                context={"user_id": "u42"})
        self.assertEqual(len(seen), 1)
        call = seen[0]
        self.assertEqual((call.name, call.arguments, call.language, call.device_id,
                          call.satellite_id, call.agent_id, call.context),
                         ("where", {}, "de", "dev1", "sat1", "conversation.parley",
                          {"user_id": "u42"}))
        user = harness.messages(self.fake.chat_requests()[0])[-1]["content"]  # after the text
        self.assertTrue(user.endswith("\nSpeak German."), user)
        self.assertEqual((call.interface_type, call.persona), (None, None))

    async def test_tools_are_told_the_interface_and_persona(self):
        seen = []

        async def reply_here(call):
            seen.append((call.interface_type, call.persona, call.conversation_id))
            return "sent"

        async with self.agent(tools={"reply_here": reply_here},
                              personas={"chef": {"prompt": "You are a chef."}}) as agent:
            await agent.process("[[tool:reply_here {}]] go", "42", interface_type="telegram",
                                persona="chef")
            await agent.process("[[tool:reply_here {}]] go", "42", interface_type="web")
        self.assertEqual(seen, [("telegram", "chef", "42"), ("web", None, "42")])

    async def test_persona_and_images_reach_the_request(self):
        png = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(8)).decode()
        async with self.agent(personas={"chef": {"prompt": "You are a chef."}}) as agent:
            await agent.process("look", "c", persona="chef", images=[{"url": png}])
            with self.assertRaisesRegex(parley.InvalidInput, 'unknown persona "pirate"'):
                await agent.process("hi", "c", persona="pirate")
            with self.assertRaisesRegex(parley.InvalidInput, "image 1: the URL must be"):
                await agent.process("hi", "c", images='[{"url": "ftp://x/y.png"}]')
        msgs = harness.messages(self.fake.chat_requests()[0])
        self.assertEqual(msgs, [{"role": "system", "content": "You are a chef."},
                                {"role": "user", "content": [
                                    {"type": "text", "text": "look"},
                                    {"type": "image_url", "image_url": {"url": png}}]}])
        self.assertEqual(len(self.fake.chat_requests()), 1)

    async def test_conversations_by_persona(self):
        async with self.agent(personas={"chef": {"prompt": "You are a chef."}}) as agent:
            await agent.process("as chef", "c", persona="chef")
            await agent.process("as myself", "c")
            everyone = await agent.conversations()
            chef = await agent.conversations(persona="chef")
            mine = await agent.conversations(persona="")
            with self.assertRaises(parley.InvalidInput):
                await agent.conversations(persona="pirate")
        self.assertEqual([(c["conversation_id"], c.get("persona")) for c in everyone],
                         [("c", None), ("c", "chef")])
        self.assertEqual([c.get("persona") for c in chef], ["chef"])
        self.assertEqual([c.get("persona") for c in mine], [None])

    async def test_unknown_input_field_is_a_type_error(self):
        async with self.agent() as agent:
            with self.assertRaisesRegex(TypeError, "unknown input field.*colour"):
                await agent.process("hi", colour="red")
        self.assertEqual(self.fake.chat_requests(), [])

    async def test_rejected_input_raises_invalid_input(self):
        async with self.agent() as agent:
            with self.assertRaises(parley.InvalidInput) as cm:
                await agent.process("")
            self.assertEqual(cm.exception.status, "invalid_input")
            self.assertIn("text", str(cm.exception))
            with self.assertRaises(parley.InvalidInput):
                await agent.process("hi", context="[1, 2]")  # context must be an object
            # What C cannot carry is refused here, naming the field, never cut short.
            with self.assertRaisesRegex(parley.InvalidInput, "device_id contains a NUL"):
                await agent.process("hi", device_id="a\0b")
            with self.assertRaisesRegex(parley.InvalidInput, "text is not valid Unicode"):
                await agent.process("lone \ud800 surrogate")
            with self.assertRaisesRegex(TypeError, "language must be a str, not int"):
                await agent.process("hi", language=7)
        self.assertEqual(self.fake.chat_requests(), [])

    async def test_failed_turn_raises_with_status_and_leaves_history(self):
        async with self.agent(auto_create_conversation_id=True, max_retries=0) as agent:
            ok = await agent.process("hello")
            before = await agent.history(ok.conversation_id)
            with self.assertRaises(parley.HttpStatus) as cm:
                await agent.process("boom [[fault:500]]", ok.conversation_id)
            err = cm.exception
            self.assertEqual(err.status, "http_status")
            self.assertIsInstance(err, parley.ParleyError)
            self.assertIn("server had an error", err.message)
            self.assertRegex(err.turn_id, harness.UUID_RE)
            self.assertEqual(err.conversation_id, ok.conversation_id)
            self.assertEqual(await agent.history(ok.conversation_id), before)


class ToolTest(AgentCase):

    async def test_async_tool_result_goes_to_the_model(self):
        async def turn_on(call):
            await asyncio.sleep(0)
            return {"ok": True, "name": call.arguments["name"]}

        async with self.agent(tools={"turn_on": turn_on}) as agent:
            r = await agent.process("turn on the kitchen light")
        self.assertEqual([s["type"] for s in r.steps], ["tool_call", "tool_result", "answer"])
        self.assertEqual(r.steps[0]["arguments"], {"name": "kitchen"})
        self.assertFalse(r.steps[1]["is_error"])
        first, second = self.fake.chat_requests()
        # The tool was declared from the callable (docstring-less: its name).
        self.assertEqual([t["function"]["name"] for t in first["body"]["tools"]], ["turn_on"])
        self.assertEqual([json.loads(m["content"]) for m in tool_messages(second)],
                         [{"ok": True, "name": "kitchen"}])

    async def test_declared_tool_and_plain_function(self):
        @parley.tool("Read a sensor", {"type": "object",
                                       "properties": {"id": {"type": "string"}}})
        def read(call):  # a plain (non-async) callable works too
            return 21.5

        async with self.agent(tools={"read": read}) as agent:
            r = await agent.process('[[tool:read {"id":"t1"}]]')
        decl = self.fake.chat_requests()[0]["body"]["tools"][0]["function"]
        self.assertEqual(decl["description"], "Read a sensor")
        self.assertEqual(decl["parameters"]["properties"], {"id": {"type": "string"}})
        self.assertEqual(r.steps[1]["content"], "21.5")

    async def test_raising_tool_is_an_error_the_model_sees(self):
        async def turn_on(call):
            raise LookupError("no device named %s" % call.arguments["name"])

        async with self.agent(tools={"turn_on": turn_on}) as agent:
            r = await agent.process("turn on the garage light")
        self.assertTrue(r.steps[1]["is_error"])
        sent = json.loads(tool_messages(self.fake.chat_requests()[1])[0]["content"])
        self.assertEqual(sent, {"error": "tool_error",
                                "error_text": "LookupError: no device named garage"})

    async def test_unserializable_result_is_an_error(self):
        async with self.agent(tools={"t": lambda call: object()}) as agent:
            r = await agent.process("[[tool:t {}]]")
        self.assertTrue(r.steps[1]["is_error"])
        self.assertIn("not JSON", r.steps[1]["content"])

    async def test_nan_and_infinity_are_not_json(self):
        tools = {"nan": lambda call: {"x": float("nan")}, "inf": lambda call: [float("-inf")],
                 "text": lambda call: "lone \ud800 surrogate"}
        async with self.agent(tools=tools) as agent:
            for name in tools:
                r = await agent.process("[[tool:%s {}]]" % name)
                self.assertTrue(r.steps[1]["is_error"], r.steps)
                self.assertIn("tool %r returned" % name, r.steps[1]["content"])
        sent = [tool_messages(req)[0]["content"] for req in self.fake.chat_requests()
                if tool_messages(req)]
        self.assertEqual(len(sent), 3)
        for content in sent:  # JSON the server accepts, saying what was wrong
            self.assertEqual(json.loads(content)["error"], "tool_error")
        self.assertIn("not JSON", sent[0])
        self.assertIn("not UTF-8", sent[2])

    async def test_an_exception_whose_text_cannot_be_encoded_is_still_explained(self):
        class Unprintable(Exception):
            def __str__(self):
                raise RuntimeError("no")

        async def surrogate(call):
            raise LookupError("no device \udc80 here")

        async def unprintable(call):
            raise Unprintable()

        with self.assertNoLogs("asyncio", level="ERROR"):
            async with self.agent(tools={"s": surrogate, "u": unprintable}) as agent:
                a = await agent.process("[[tool:s {}]]")
                b = await agent.process("[[tool:u {}]]")
            gc.collect()  # a task whose exception nobody retrieved says so when collected
            await asyncio.sleep(0)
        sent = [json.loads(tool_messages(req)[0]["content"])["error_text"]
                for req in self.fake.chat_requests() if tool_messages(req)]
        self.assertEqual(sent, ["LookupError: no device \\udc80 here",
                                "Unprintable: (its message could not be read: RuntimeError)"])
        self.assertTrue(a.steps[1]["is_error"] and b.steps[1]["is_error"])

    async def test_slow_tool_does_not_block_other_turns(self):
        release = asyncio.Event()
        slow_started = asyncio.Event()

        async def slow(call):
            slow_started.set()
            await release.wait()  # only the other turn finishing lets this one go on
            return "finally"

        async with self.agent(tools={"slow": slow}) as agent:
            slow_turn = asyncio.create_task(agent.process("[[tool:slow {}]]", "c-slow"))
            await asyncio.wait_for(slow_started.wait(), 10 * SLOW)
            quick = await asyncio.wait_for(agent.process("quick", "c-quick"), 10 * SLOW)
            self.assertFalse(slow_turn.done())
            release.set()
            r = await asyncio.wait_for(slow_turn, 10 * SLOW)
        self.assertEqual(r.steps[1]["content"], "finally")
        self.assertIn("You said", quick.response)

    async def test_tool_past_its_timeout(self):
        cancelled = asyncio.Event()

        async def stuck(call):
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancelled.set()  # the turn ended: the late call is completed and dropped
                raise

        async with self.agent(tools={"stuck": stuck}, tool_timeout_ms=int(200 * SLOW)) as agent:
            r = await agent.process("[[tool:stuck {}]]")
            self.assertTrue(r.steps[1]["is_error"])
            self.assertIn("timeout", r.steps[1]["content"])
            await asyncio.wait_for(cancelled.wait(), 10 * SLOW)
            self.assertEqual((await agent.metrics())["tool_timeouts"], 1)

    async def test_per_turn_tools(self):
        async def light(call):
            return "on"

        async with self.agent() as agent:
            r = await agent.process("[[tool:light {}]]", tools={"light": light})
        self.assertEqual(r.steps[1]["content"], "on")
        self.assertEqual([t["function"]["name"]
                          for t in self.fake.chat_requests()[0]["body"]["tools"]], ["light"])

    async def test_declared_tool_without_callable_is_refused(self):
        with self.assertRaisesRegex(ValueError, "'ghost'.*no callable"):
            parley.Agent(harness.options(self.fake, tools=[{"name": "ghost", "parameters": {}}]),
                         plugin=PLUGIN)

    async def test_tool_cancelled_with_its_turn(self):
        started, cancelled = asyncio.Event(), asyncio.Event()

        async def forever(call):
            started.set()
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancelled.set()
                raise

        async with self.agent(tools={"forever": forever}) as agent:
            task = asyncio.create_task(agent.process("[[tool:forever {}]]"))
            await asyncio.wait_for(started.wait(), 10 * SLOW)
            task.cancel()
            with self.assertRaises(asyncio.CancelledError):
                await task
            await asyncio.wait_for(cancelled.wait(), 10 * SLOW)
            m = await agent.metrics()
            self.assertEqual(m["turns_cancelled"], 1)


class StreamTest(AgentCase):

    async def test_deltas_then_result(self):
        async with self.agent(stream=True) as agent:
            items = [x async for x in agent.stream("tell me a fairly long story please")]
        *deltas, result = items
        self.assertIsInstance(result, parley.Result)
        self.assertGreater(len(deltas), 3)
        self.assertTrue(all(isinstance(d, str) and d for d in deltas))
        self.assertEqual("".join(deltas), result.response)
        self.assertTrue(self.fake.chat_requests()[0]["body"]["stream"])

    async def test_stream_without_the_option_gives_only_the_result(self):
        async with self.agent() as agent:
            items = [x async for x in agent.stream("hello")]
        self.assertEqual(len(items), 1)
        self.assertIsInstance(items[0], parley.Result)

    async def test_stream_error_raises(self):
        async with self.agent(stream=True, max_retries=0) as agent:
            with self.assertRaises(parley.HttpStatus):
                async for _ in agent.stream("x [[fault:503]]"):
                    pass

    async def test_leaving_the_stream_early_cancels_the_turn(self):
        async with self.agent(stream=True) as agent:
            gen = agent.stream("a long answer [[fault:slow_stream:200]]")
            first = await gen.__anext__()
            self.assertIsInstance(first, str)
            await gen.aclose()
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 10 * SLOW
            while (await agent.metrics())["turns_cancelled"] != 1:
                self.assertLess(loop.time(), deadline, "the turn was not cancelled")
                await asyncio.sleep(0.02)


class CancelTest(AgentCase):

    async def test_cancelling_the_task_cancels_the_turn(self):
        async with self.agent() as agent:
            task = asyncio.create_task(agent.process("slow [[latency:30000]]", "c1"))
            await self.wait_requests(1)
            task.cancel()
            with self.assertRaises(asyncio.CancelledError):
                await task
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 10 * SLOW
            while (await agent.metrics())["in_flight"]:
                self.assertLess(loop.time(), deadline)
                await asyncio.sleep(0.02)
            m = await agent.metrics()
            self.assertEqual((m["turns_cancelled"], m["turns_ok"]), (1, 0))
            with self.assertRaises(parley.NotFound):  # a cancelled turn stores nothing
                await agent.history("c1")

    async def test_timeout_from_wait_for(self):
        async with self.agent() as agent:
            with self.assertRaises(asyncio.TimeoutError):
                await asyncio.wait_for(agent.process("slow [[latency:30000]]"), 0.2)
            # The agent is still usable.
            self.assertIn("You said", (await agent.process("next")).response)


class ConcurrencyTest(AgentCase):

    async def test_busy_when_max_in_flight_is_reached(self):
        async with self.agent(max_in_flight=2) as agent:
            tasks = [asyncio.create_task(agent.process("slow [[latency:30000]]", "c%d" % i))
                     for i in range(2)]
            await asyncio.sleep(0)  # both started
            with self.assertRaises(parley.Busy) as cm:
                await agent.process("one too many")
            self.assertEqual(cm.exception.status, "busy")
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def test_cancel_storm_then_close(self):
        """Turns with tools cancelled at arbitrary points, then the rest closed
        mid-flight: every outcome is a result, a cancellation or Cancelled (the
        ASan run checks every tool handle is completed exactly once)."""
        async def tool_a(call):
            await asyncio.sleep(0.001 * (hash(call.call_id) % 20))
            return "a"

        agent = self.agent(tools={"tool_a": tool_a})
        tasks = [asyncio.create_task(agent.process("[[tool:tool_a {}]] [[latency:%d]]" % (i % 7),
                                                   "c%d" % i)) for i in range(120)]
        for i, t in enumerate(tasks):
            if i % 3 == 0:
                await asyncio.sleep(0.001)
                t.cancel()
        await asyncio.sleep(0.05)
        await asyncio.wait_for(agent.aclose(), 60 * SLOW)
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        kinds = {type(o).__name__ for o in outcomes}
        self.assertLessEqual(kinds, {"Result", "CancelledError", "Cancelled"}, outcomes)
        self.assertEqual(agent._core.calls, set())  # every tool call was completed

    async def test_200_concurrent_turns(self):
        async def turn_on(call):
            await asyncio.sleep(0.01)
            return {"on": call.arguments["name"]}

        async with self.agent(tools={"turn_on": turn_on}) as agent:
            texts = ["turn on lamp%d light" % i if i % 2 else "hello %d" % i for i in range(200)]
            results = await asyncio.gather(*(agent.process(t, "conv-%d" % i)
                                             for i, t in enumerate(texts)))
            for i, r in enumerate(results):
                self.assertEqual(r.conversation_id, "conv-%d" % i)
                if i % 2:
                    self.assertEqual(r.response, 'Done. turn_on: {"on":"lamp%d"} (messages: 4)'
                                     % i)
                else:
                    self.assertEqual(r.response, harness.fake_reply("hello %d" % i, 2, 1))
            self.assertEqual(len({r.request_id for r in results}), 200)
            m = await agent.metrics()
            self.assertEqual((m["turns_ok"], m["tool_calls"], m["in_flight"]), (200, 100, 0))
            self.assertEqual(len(await agent.conversations()), 200)


class CloseTest(AgentCase):

    async def test_close_with_turns_in_flight(self):
        started = asyncio.Event()
        tool_cancelled = []

        async def forever(call):
            started.set()
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                tool_cancelled.append(call.call_id)
                raise

        agent = self.agent(tools={"forever": forever})
        tasks = [asyncio.create_task(agent.process("slow [[latency:30000]]", "c%d" % i))
                 for i in range(10)]
        tasks.append(asyncio.create_task(agent.process("[[tool:forever {}]]", "ct")))
        await self.wait_requests(11)
        await asyncio.wait_for(started.wait(), 10 * SLOW)
        await asyncio.wait_for(agent.aclose(), 30 * SLOW)
        for t in tasks:
            with self.assertRaises(parley.Cancelled) as cm:
                await asyncio.wait_for(t, 1 * SLOW)
            self.assertEqual(cm.exception.status, "cancelled")
        self.assertEqual(len(tool_cancelled), 1)
        self.assertEqual(agent._core.calls, set())  # every tool call was completed
        self.assertTrue(agent.closed)
        with self.assertRaises(parley.Cancelled):
            await agent.process("after close")
        with self.assertRaises(parley.Cancelled):
            await agent.metrics()
        await agent.aclose()  # idempotent

    async def test_concurrent_closes_all_wait(self):
        agent = self.agent()
        turn = asyncio.ensure_future(agent.process("slow [[latency:30000]]"))
        await self.wait_requests(1)
        await asyncio.gather(agent.aclose(), agent.aclose(), agent.aclose())
        self.assertTrue(turn.done())  # every closer returned after the turn was settled
        self.assertIsInstance(turn.exception(), parley.Cancelled)

    async def test_close_settles_futures_before_returning(self):
        agent = self.agent()
        fut = asyncio.ensure_future(agent.process("slow [[latency:30000]]"))
        await self.wait_requests(1)
        await agent.aclose()
        # No further loop iteration needed for the turn's outcome to exist.
        await asyncio.sleep(0)
        self.assertTrue(fut.done())
        self.assertIsInstance(fut.exception(), parley.Cancelled)


class HistoryTest(AgentCase):

    async def test_history_functions(self):
        async with self.agent() as agent:
            a = await agent.process("one", "alpha")
            await agent.process("two", "alpha")
            await agent.process("three", "beta")
            h = await agent.history("alpha")
            self.assertEqual(h["conversation_id"], "alpha")
            self.assertEqual([t["turn_id"] for t in h["turns"]][0], a.turn_id)
            self.assertEqual(len(h["turns"]), 2)
            t = await agent.turn(a.turn_id)
            self.assertEqual((t["conversation_id"], t["turn"]["messages"][0]["content"]),
                             ("alpha", "one"))
            self.assertEqual(sorted(c["conversation_id"] for c in await agent.conversations()),
                             ["alpha", "beta"])
            await agent.clear_history("alpha")
            with self.assertRaises(parley.NotFound) as cm:
                await agent.history("alpha")
            self.assertEqual(cm.exception.status, "not_found")
            self.assertIn("alpha", str(cm.exception))
            with self.assertRaises(parley.NotFound):
                await agent.clear_history("alpha")
            await agent.clear_history()
            self.assertEqual(await agent.conversations(), [])
            with self.assertRaises(parley.NotFound):
                await agent.turn(a.turn_id)
            self.assertEqual((await agent.metrics())["turns_ok"], 3)

    async def test_log_function_runs_on_the_loop(self):
        import threading
        lines = []
        loop_thread = threading.get_ident()

        def log(level, message):
            lines.append((level, message, threading.get_ident() == loop_thread))

        async with self.agent(log=log, debug_log_bodies=True) as agent:
            await agent.process("hello log")
        self.assertTrue(lines, "no log line came")
        self.assertTrue(all(on_loop for _, _, on_loop in lines))
        self.assertTrue(any("hello log" in m for _, m, _ in lines))



class UpdateOptionsTest(AgentCase):

    async def test_update_keeps_history_and_tools(self):
        async def ping(call):
            return {"pong": True}

        async with self.agent(tools={"ping": ping}, prompt="You are A.") as agent:
            first = await agent.process("hello", "c1")
            await agent.update_options(harness.options(self.fake, prompt="You are B."))
            second = await agent.process("again [[tool:ping {}]]", "c1")
            self.assertEqual(first.conversation_id, second.conversation_id)
            with self.assertRaises(parley.InvalidOptions) as cm:
                await agent.update_options(harness.options(self.fake, temperature=9))
            self.assertIn("'temperature'", cm.exception.message)
            with self.assertRaises(parley.InvalidOptions) as cm:
                await agent.update_options(harness.options(self.fake, max_connections=3))
            self.assertIn("'max_connections'", cm.exception.message)
        reqs = self.fake.chat_requests()
        self.assertEqual([harness.messages(r)[0]["content"] for r in reqs],
                         ["You are A.", "You are B.", "You are B."])
        self.assertEqual(harness.user_texts(reqs[1]), ["hello", "again [[tool:ping {}]]"])
        self.assertEqual(tool_messages(reqs[2])[0]["content"], '{"pong":true}')


class UsageTest(AgentCase):

    async def test_usage_and_stop_reason_reach_the_result(self):
        async with self.agent() as agent:
            done = await agent.process("hello", "u1")
            cut = await agent.process("go on [[length]]", "u1")
        self.assertEqual(done.stop_reason, "stop")
        self.assertEqual(done.usage["requests"], 1)
        self.assertGreater(done.usage["prompt_tokens"], 0)
        self.assertGreater(done.usage["completion_tokens"], 0)
        self.assertEqual(cut.stop_reason, "length")
        self.assertEqual(done.extra["stop_reason"], "stop")

if __name__ == "__main__":
    unittest.main()
