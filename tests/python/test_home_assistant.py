"""The Home Assistant example integration, installed the way its README says
(the binding copied into custom_components/parley_conversation/parley), run
with stand-ins for the HA names it uses (ha_stubs.py) against the real plugin
and the fake LLM: ConversationInput fields, HA's rendered system prompt,
HA LLM API tools, conversation ids, errors, streaming, unload."""
import asyncio
import dataclasses
import importlib
import json
import os
import shutil
import sys
import tempfile
import unittest

import ha_stubs
from support import BINDING, PLUGIN, SOURCE, AgentCase, harness, options, tool_messages

EXAMPLE = os.path.join(SOURCE, "examples", "home_assistant", "custom_components",
                       "parley_conversation")


@dataclasses.dataclass
class FakeTool:
    name: str
    description: str
    parameters: dict


class FakeAPI:
    """An llm.APIInstance with one tool; records calls."""

    def __init__(self):
        self.tools = [FakeTool("HassTurnOn", "Turns on a device",
                               {"type": "object", "properties": {"name": {"type": "string"}}})]
        self.custom_serializer = None
        self.calls = []

    async def async_call_tool(self, tool_input):
        self.calls.append(tool_input)
        if tool_input.tool_args.get("name") == "garage":
            raise RuntimeError("no device named garage")
        return {"success": True, "targets": [tool_input.tool_args["name"]]}


class FakeChatLog:
    """The parts of conversation.ChatLog the integration uses."""

    def __init__(self, conversation_id, api):
        self.conversation_id = conversation_id
        self.content = [ha_stubs.SystemContent("")]
        self.llm_api = None
        self._api = api
        self.provided = None
        self.deltas = []

    async def async_provide_llm_data(self, llm_context, user_llm_hass_api, user_llm_prompt,
                                     user_extra_system_prompt):
        self.provided = (llm_context, user_llm_hass_api, user_llm_prompt,
                         user_extra_system_prompt)
        self.content[0] = ha_stubs.SystemContent(
            "\n".join(p for p in (user_llm_prompt, "API prompt", user_extra_system_prompt) if p))
        self.llm_api = self._api if user_llm_hass_api else None

    def async_add_assistant_content_without_tools(self, content):
        self.content.append(content)

    async def async_add_delta_content_stream(self, agent_id, stream):
        async for delta in stream:
            self.deltas.append(delta)
        content = ha_stubs.AssistantContent(
            agent_id, "".join(d.get("content", "") for d in self.deltas))
        self.content.append(content)
        yield content


class FakeHass:
    def __init__(self):
        self.config_entries = self

    async def async_add_executor_job(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    async def async_forward_entry_setups(self, entry, platforms):
        return True

    async def async_unload_platforms(self, entry, platforms):
        return True


def user_input(text, **kw):
    fields = dict(text=text, context=ha_stubs.Context(user_id="user-1"), conversation_id=None,
                  device_id="device-1", satellite_id="assist_satellite.kitchen", language="en",
                  agent_id="conversation.parley", extra_system_prompt="The user is in the kitchen.")
    fields.update(kw)
    return ha_stubs.ConversationInput(**fields)


class HomeAssistantExampleTest(AgentCase):

    @classmethod
    def setUpClass(cls):
        ha_stubs.install()
        cls.tmp = tempfile.TemporaryDirectory(prefix="parley-ha-")
        # The README's install: the integration, with the binding inside it.
        target = os.path.join(cls.tmp.name, "custom_components", "parley_conversation")
        shutil.copytree(EXAMPLE, target)
        shutil.copytree(os.path.join(BINDING, "parley"), os.path.join(target, "parley"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        sys.path.insert(0, cls.tmp.name)
        cls.integration = importlib.import_module("custom_components.parley_conversation")
        cls.conversation = importlib.import_module(
            "custom_components.parley_conversation.conversation")

    @classmethod
    def tearDownClass(cls):
        sys.path.remove(cls.tmp.name)
        cls.tmp.cleanup()

    async def setup_entry(self, **data):
        entry = ha_stubs.ConfigEntry({**options(self.fake), "plugin_path": PLUGIN,
                                      "llm_hass_api": ["assist"], "prompt": "You are HA.",
                                      **data})
        hass = FakeHass()
        await self.integration.async_setup_entry(hass, entry)
        self.addAsyncCleanup(self.integration.async_unload_entry, hass, entry)
        return entry, self.conversation.ParleyConversationEntity(entry)

    async def test_manifest_is_valid(self):
        with open(os.path.join(EXAMPLE, "manifest.json")) as f:
            manifest = json.load(f)
        self.assertEqual(manifest["domain"], self.integration.DOMAIN)
        self.assertIn("conversation", manifest["dependencies"])
        self.assertEqual(manifest["requirements"], [])  # the binding is standard library only

    async def test_every_file_compiles(self):
        # config_flow.py needs voluptuous and HA selectors, not stood in here: at least it compiles.
        for name in sorted(os.listdir(EXAMPLE)):
            if name.endswith(".py"):
                with open(os.path.join(EXAMPLE, name)) as f:
                    compile(f.read(), name, "exec")

    async def test_turn_with_ha_tool_and_input_fields(self):
        entry, entity = await self.setup_entry()
        api = FakeAPI()
        chat_log = FakeChatLog("01JCONV", api)
        result = await entity._async_handle_message(
            user_input('[[tool:HassTurnOn {"name":"kitchen"}]]'), chat_log)

        self.assertEqual(result.conversation_id, "01JCONV")
        self.assertEqual(result.response.speech,
                         'Done. HassTurnOn: {"success":true,"targets":["kitchen"]} (messages: 4)')
        self.assertEqual(chat_log.content[-1].content, result.response.speech)
        # HA was asked for the LLM data of this input.
        llm_context, api_ids, prompt, extra = chat_log.provided
        self.assertEqual((llm_context.platform, llm_context.device_id, api_ids, prompt, extra),
                         ("parley_conversation", "device-1", ["assist"], "You are HA.",
                          "The user is in the kitchen."))
        # The tool ran through HA's API with the model's arguments and call id.
        self.assertEqual([(c.tool_name, c.tool_args, c.id) for c in api.calls],
                         [("HassTurnOn", {"name": "kitchen"}, "call_1_0")])
        first, second = self.fake.chat_requests()
        msgs = harness.messages(first)
        # HA's rendered prompt is the system message (Parley's own prompt is empty).
        self.assertEqual(msgs[0], {"role": "system",
                                   "content": "You are HA.\nAPI prompt\nThe user is in the kitchen."})
        decl = first["body"]["tools"][0]["function"]
        self.assertEqual((decl["name"], decl["description"]), ("HassTurnOn", "Turns on a device"))
        self.assertEqual(json.loads(tool_messages(second)[0]["content"]),
                         {"success": True, "targets": ["kitchen"]})
        # The turn is stored under HA's conversation id, with the input's fields.
        turn = (await entry.runtime_data.history("01JCONV"))["turns"][0]
        self.assertEqual(turn["messages"][0]["content"], '[[tool:HassTurnOn {"name":"kitchen"}]]')

    async def test_follow_up_continues_the_conversation(self):
        _, entity = await self.setup_entry(llm_hass_api=[])
        await entity._async_handle_message(user_input("my name is Ada"),
                                           FakeChatLog("01JC", None))
        r = await entity._async_handle_message(user_input("who am I? [[recall]]"),
                                               FakeChatLog("01JC", None))
        self.assertIn('Your first message was: "my name is Ada"', r.response.speech)
        self.assertNotIn("tools", self.fake.chat_requests()[-1]["body"])  # no API: no tools

    async def test_tool_error_reaches_the_model(self):
        _, entity = await self.setup_entry()
        await entity._async_handle_message(
            user_input('[[tool:HassTurnOn {"name":"garage"}]]'), FakeChatLog("c", FakeAPI()))
        sent = json.loads(tool_messages(self.fake.chat_requests()[1])[0]["content"])
        self.assertEqual(sent, {"error": "tool_error",
                                "error_text": "RuntimeError: no device named garage"})

    async def test_failed_turn_is_an_error_response(self):
        _, entity = await self.setup_entry(max_retries=0)
        r = await entity._async_handle_message(user_input("hi [[fault:500]]"),
                                               FakeChatLog("c", None))
        self.assertIsNone(r.response.speech)
        code, message = r.response.error
        self.assertEqual(code, "unknown")
        self.assertIn("(http_status)", message)

    async def test_streaming_feeds_the_chat_log(self):
        _, entity = await self.setup_entry(stream=True)
        chat_log = FakeChatLog("c", None)
        r = await entity._async_handle_message(user_input("a streamed answer please [[ask]]"),
                                               chat_log)
        self.assertEqual(chat_log.deltas[0], {"role": "assistant"})
        self.assertGreater(len(chat_log.deltas), 3)
        self.assertEqual("".join(d.get("content", "") for d in chat_log.deltas),
                         r.response.speech)
        self.assertTrue(r.continue_conversation)

    async def test_bad_options_fail_setup_with_the_option_named(self):
        with self.assertRaisesRegex(ha_stubs.ConfigEntryError, "temperature"):
            await self.setup_entry(temperature=9)


if __name__ == "__main__":
    unittest.main()
