"""Shared setup of the Python binding tests: the binding from the source tree,
the fake LLM and options helpers from tests/integration/harness.py."""
import asyncio
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.normpath(os.path.join(HERE, "..", ".."))
BINDING = os.path.join(SOURCE, "bindings", "python")
sys.path.insert(0, BINDING)
sys.path.insert(0, os.path.join(SOURCE, "tests", "integration"))

import harness  # noqa: E402
import parley  # noqa: E402

PLUGIN = os.path.abspath(harness.PLUGIN)
SLOW = harness.SLOW
FakeLLM = harness.FakeLLM


def options(fake, **overrides):
    return harness.options(fake, **overrides)


def tool_messages(request):
    return [m for m in harness.messages(request) if m["role"] == "tool"]


class AgentCase(unittest.IsolatedAsyncioTestCase):
    """One fake LLM per test; helpers to make agents on it."""

    def setUp(self):
        self.fake = FakeLLM()
        self.addCleanup(self.fake.close)

    async def asyncSetUp(self):
        # The test runner's debug mode reports callbacks over 0.1 s; on a loaded
        # machine (or under ASan) starting 200 turns takes longer than that.
        asyncio.get_running_loop().slow_callback_duration = 10

    def agent(self, tools=None, log=None, **opts):
        return parley.Agent(options(self.fake, **opts), tools=tools, log=log, plugin=PLUGIN)

    async def wait_requests(self, n, timeout=10):
        """Until the fake LLM has logged n chat requests."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout * SLOW
        while len(self.fake.chat_requests()) < n:
            if loop.time() > deadline:
                self.fail("the fake LLM saw %d requests, expected %d"
                          % (len(self.fake.chat_requests()), n))
            await asyncio.sleep(0.01)
