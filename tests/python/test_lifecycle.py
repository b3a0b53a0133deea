"""Loading the plugin, bad options, agents never closed, interpreter exit,
and reading structs within their struct_size."""
import asyncio
import ctypes
import ctypes.util
import gc
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest
import warnings
import weakref
from unittest import mock

from support import BINDING, PLUGIN, SLOW, AgentCase, FakeLLM, options, parley

from parley import _abi, agent as agent_mod


class LoadTest(unittest.TestCase):

    def test_loads_and_reports_version(self):
        p = parley.load_plugin(PLUGIN)
        self.assertEqual((p.name, p.abi_version), ("parley", parley.ABI_VERSION))
        self.assertIs(parley.load_plugin(PLUGIN), p)  # loaded once, shared
        schema = parley.options_schema(PLUGIN)
        self.assertEqual(schema["properties"]["max_history_turns"]["default"], 20)

    def test_abi_mismatch_is_a_clear_error(self):
        with mock.patch.object(_abi, "ABI_VERSION", 999):
            with self.assertRaises(parley.PluginLoadError) as cm:
                parley.Plugin(PLUGIN)
        self.assertIn("does not serve Parley ABI version 999", str(cm.exception))
        self.assertEqual(cm.exception.status, "plugin_load")

    def test_missing_file(self):
        with self.assertRaisesRegex(parley.PluginLoadError, "cannot load /nonexistent/parley.so"):
            parley.load_plugin("/nonexistent/parley.so")

    def test_not_a_parley_plugin(self):
        libm = ctypes.util.find_library("m")
        with self.assertRaisesRegex(parley.PluginLoadError, "no symbol parley_plugin_entry"):
            parley.Plugin(libm)

    def test_search_order_and_error_lists_every_place(self):
        with tempfile.TemporaryDirectory() as d, \
                mock.patch.dict(os.environ, {"PARLEY_PLUGIN": os.path.join(d, "env.so"),
                                             "PKG_CONFIG_PATH": d}):
            with open(os.path.join(d, "parley.pc"), "w") as f:
                f.write("plugindir=%s/lib/parley\nName: parley\nDescription: x\nVersion: 1\n" % d)
            where = [w for w, _ in parley.candidate_paths()]
            if shutil.which("pkg-config"):
                self.assertEqual(where, ["PARLEY_PLUGIN", "pkg-config plugindir",
                                         "next to the package"])
                self.assertEqual(parley.candidate_paths()[1][1],
                                 os.path.join(d, "lib", "parley", "parley.so"))
            with self.assertRaises(parley.PluginLoadError) as cm:
                parley.load_plugin()
            self.assertIn("env.so (PARLEY_PLUGIN): no such file", str(cm.exception))
            self.assertIn("(next to the package)", str(cm.exception))
            # The environment variable finds the real one.
            os.environ["PARLEY_PLUGIN"] = PLUGIN
            self.assertEqual(os.path.realpath(parley.load_plugin().path),
                             os.path.realpath(PLUGIN))

    def test_struct_fields_beyond_struct_size_are_not_read(self):
        # A result struct with one more (appended) field than ABI 1.0.
        wide = _abi._result_struct([("usage_json", ctypes.c_char_p)])
        r = wide(request_id=7, status=0, response=b"hi", steps_json=b"[]",
                 usage_json=b'{"prompt": 3}')
        r.struct_size = ctypes.sizeof(_abi._result_struct([]))  # ABI 1.0's: field absent
        got = _abi.fields_within(wide, ctypes.addressof(r))
        self.assertNotIn("usage_json", got)
        self.assertEqual((got["request_id"], got["response"]), (7, b"hi"))
        r.struct_size = ctypes.sizeof(wide)
        self.assertEqual(_abi.fields_within(wide, ctypes.addressof(r))["usage_json"],
                         b'{"prompt": 3}')
        # The binding turns such a field into Result.usage.
        with mock.patch.object(_abi, "RESULT_APPENDED", [("usage_json", ctypes.c_char_p)]):
            core = agent_mod._Core(parley.load_plugin(PLUGIN), None, {}, None)
            res = core._result(_abi.fields_within(wide, ctypes.addressof(r)))
        self.assertEqual((res.usage, res.response), ({"prompt": 3}, "hi"))

    def test_function_table_read_within_struct_size(self):
        p = parley.load_plugin(PLUGIN)
        self.assertIsNotNone(p.function("metrics"))
        short = ctypes.pointer(_abi.PluginTable.from_buffer_copy(p._table.contents))
        short.contents.struct_size = _abi.PluginTable.metrics.offset  # predates metrics()
        self.assertIsNone(_abi.table_function(short, "metrics"))
        self.assertIsNotNone(_abi.table_function(short, "history_clear"))


class OptionsTest(AgentCase):

    async def test_bad_options_raise_invalid_options(self):
        with self.assertRaises(parley.InvalidOptions) as cm:
            parley.Agent(options(self.fake, temperature=3), plugin=PLUGIN)
        self.assertEqual(cm.exception.status, "invalid_options")
        self.assertIn("temperature", str(cm.exception))
        with self.assertRaisesRegex(parley.InvalidOptions, "colour"):
            parley.Agent(options(self.fake, colour="red"), plugin=PLUGIN)

    def test_agent_needs_a_running_loop(self):
        with self.assertRaisesRegex(RuntimeError, "in a coroutine"):
            parley.Agent(options(self.fake), plugin=PLUGIN)


class NeverClosedTest(AgentCase):

    async def test_collected_without_close_warns_and_destroys(self):
        agent = self.agent()
        await agent.process("hello")
        # A turn in flight that nobody awaits (as from a dropped stream()).
        agent._start("slow [[latency:30000]]", None, {}, streaming=False)
        await self.wait_requests(2)
        core, agent_ref = agent._core, weakref.ref(agent)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            del agent
            gc.collect()
        self.assertIsNone(agent_ref())
        resource = [str(w.message) for w in caught if w.category is ResourceWarning]
        self.assertEqual(len(resource), 1, resource)
        self.assertIn("never closed", resource[0])
        self.assertIsNone(core.handle)  # destroyed
        self.assertNotIn(core, agent_mod._live)

    async def test_collected_on_a_worker_thread_destroys_elsewhere(self):
        agent = self.agent()
        core = agent._core
        agent._finalizer.detach()
        agent_mod._in_callback.active = True  # as if collected inside a plugin callback
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                agent_mod._finalize(core)
        finally:
            agent_mod._in_callback.active = False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10 * SLOW
        while core.handle is not None or core in agent_mod._live:
            self.assertLess(loop.time(), deadline, "not destroyed by the helper thread")
            await asyncio.sleep(0.01)


EXIT_SCRIPT = textwrap.dedent("""
    import asyncio, json, sys
    sys.path.insert(0, sys.argv[1])
    import parley
    options = json.loads(sys.argv[3])

    async def forever(call):
        await asyncio.sleep(3600)

    async def main():
        agent = parley.Agent(options, tools={"forever": forever}, plugin=sys.argv[2])
        closed_ok = parley.Agent(options, plugin=sys.argv[2])
        async with closed_ok:
            print((await closed_ok.process("hi")).response, flush=True)
        for i in range(5):
            asyncio.ensure_future(agent.process("slow [[latency:30000]]", "c%d" % i))
        asyncio.ensure_future(agent.process("[[tool:forever {}]]", "ct"))
        await asyncio.sleep(float(sys.argv[4]))
        globals()["keep"] = agent  # still referenced at exit: atexit destroys it
        if sys.argv[5] == "exit-in-loop":
            sys.exit(0)

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(main())
    finally:
        if sys.argv[5] == "close-loop":
            loop.close()
    print("main done", flush=True)
""")


class ExitTest(unittest.TestCase):

    def run_exit(self, mode):
        with FakeLLM() as fake:
            with tempfile.TemporaryDirectory() as d:
                script = os.path.join(d, "exit.py")
                with open(script, "w") as f:
                    f.write(EXIT_SCRIPT)
                import json
                proc = subprocess.run(
                    [sys.executable, script, BINDING, PLUGIN, json.dumps(options(fake)),
                     str(0.5 * SLOW), mode],
                    capture_output=True, text=True, timeout=120 * SLOW)
            requests = fake.chat_requests()
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("You said", proc.stdout)
        self.assertNotIn("Traceback", proc.stderr)
        self.assertNotIn("Exception ignored", proc.stderr)
        self.assertGreaterEqual(len(requests), 7)  # the turns were really in flight
        return proc

    def test_exit_with_turns_and_tools_in_flight_loop_closed(self):
        self.assertIn("main done", self.run_exit("close-loop").stdout)

    def test_exit_with_loop_left_open(self):
        self.assertIn("main done", self.run_exit("leave-loop").stdout)

    def test_sys_exit_inside_the_loop(self):
        self.assertNotIn("main done", self.run_exit("exit-in-loop").stdout)


if __name__ == "__main__":
    unittest.main()
