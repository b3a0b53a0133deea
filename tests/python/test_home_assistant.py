"""The Home Assistant example integration, installed the way its README says
(the folder copied into custom_components/, the binding inside it), run end
to end against the real plugin and the fake LLM, with stand-ins for Home
Assistant (tests/python/ha/: each file names the HA source and commit it
follows).  Setup goes through the config, subentry and reconfigure flows;
turns go through ConversationEntity.async_process (chat session, chat log,
Assist tools); AI Task through ai_task.async_generate_data."""
import asyncio
import datetime
import http.server
import importlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import unittest

import ha
from ha import chat, core, llm, schemas
from support import PLUGIN, SLOW, SOURCE, AgentCase, harness, tool_messages

EXAMPLE = os.path.join(SOURCE, "examples", "home_assistant", "custom_components",
                       "parley_conversation")
DOMAIN = "parley_conversation"
SATELLITE = "assist_satellite.kitchen"


class FakeAssist(llm.API):
    """An Assist-like LLM API: HassTurnOn answers with an intent response
    (and fails for the garage), GetTime with time and date values."""

    def __init__(self, hass, api_prompt="Static Context: kitchen light, garage door."):
        super().__init__(hass=hass, id=llm.LLM_API_ASSIST, name="Assist")
        self.api_prompt = api_prompt
        self.calls = []

    async def async_get_api_instance(self, llm_context):
        api = self

        class TurnOn(llm.Tool):
            name = "HassTurnOn"
            description = "Turns on a device"
            parameters = schemas.Schema({schemas.Required("name"): str})

            async def async_call(self, hass, tool_input, ctx):
                api.calls.append(tool_input)
                if tool_input.tool_args["name"] == "garage":
                    raise core.HomeAssistantError("no device named garage")
                response = llm.IntentResponse(language=ctx.language)
                response.async_set_results([{"type": "entity", "name": tool_input.tool_args[
                    "name"], "id": "light." + tool_input.tool_args["name"]}])
                return llm.IntentResponseDict(response)

        class GetTime(llm.Tool):
            name = "GetTime"
            description = "The time"

            async def async_call(self, hass, tool_input, ctx):
                api.calls.append(tool_input)
                return {"time": datetime.time(14, 5), "date": datetime.date(2026, 11, 27)}

        prompt = self.api_prompt.replace("{device}", llm_context.device_id or "")
        return llm.APIInstance(api=self, api_prompt=prompt, llm_context=llm_context,
                               tools=[TurnOn(), GetTime()],
                               custom_serializer=llm.selector_serializer)


class KeyRefuser:
    """A loopback server answering every GET with a 401, as a server whose
    API key is wrong."""

    def __init__(self):
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = b'{"error":{"message":"Incorrect API key provided"}}'
                self.send_response(401)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = "http://127.0.0.1:%d/v1" % self.server.server_address[1]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def user_input(text, conversation_id=None, satellite=SATELLITE, user_id="user-1",
               agent_id="conversation.parley_conversation", extra=None, device="device-1"):
    return chat.ConversationInput(text=text, context=core.Context(user_id=user_id),
                                  conversation_id=conversation_id, device_id=device,
                                  satellite_id=satellite, language="en", agent_id=agent_id,
                                  extra_system_prompt=extra)


def system_text(request):
    return "\n".join(m["content"] for m in harness.messages(request) if m["role"] == "system")


NOTE_HEADING = "[Instructions for this turn, from the system, not from the user]\n"


def without_note(text):
    """A user message's own text: Parley sends the turn's extra_system_prompt after it
    (docs/history.md, "How the context is built")."""
    return text.split(NOTE_HEADING)[0].rstrip("\n") if isinstance(text, str) else text


def instructions(request):
    """What the model is told: the system prompt, then the turn note after the text of
    the last user message (HA's per-turn prompt part: time, extra system prompt)."""
    user = [m["content"] for m in harness.messages(request) if m["role"] == "user"][-1]
    note = user.split(NOTE_HEADING)[1] if NOTE_HEADING in user else ""
    return "\n\n".join(p for p in (system_text(request), note) if p)


class HomeAssistantTest(AgentCase):

    @classmethod
    def setUpClass(cls):
        ha.install()
        cls.tmp = tempfile.TemporaryDirectory(prefix="parley-ha-")
        # The README's install: package.sh makes the one folder (the binding
        # and parley.so inside it), copied into custom_components/.
        subprocess.run([os.path.join(SOURCE, "examples", "home_assistant", "package.sh"),
                        os.path.join(cls.tmp.name, "custom_components"), PLUGIN],
                       check=True, capture_output=True)
        sys.path.insert(0, cls.tmp.name)
        # The copy in the folder, whatever pkg-config knows on this machine.
        os.environ["PARLEY_PLUGIN"] = os.path.join(cls.tmp.name, "custom_components", DOMAIN,
                                                   "parley", "parley.so")
        cls.turns = importlib.import_module("custom_components.%s.turns" % DOMAIN)

    @classmethod
    def tearDownClass(cls):
        del os.environ["PARLEY_PLUGIN"]
        sys.path.remove(cls.tmp.name)
        cls.tmp.cleanup()

    async def asyncSetUp(self):
        await super().asyncSetUp()
        self.config_dir = tempfile.TemporaryDirectory(prefix="parley-ha-config-")
        self.addCleanup(self.config_dir.cleanup)
        self.hass = await self.start_hass()
        chat.trace.EVENTS.clear()

    async def start_hass(self):
        """A fresh Home Assistant on the same configuration directory (a restart)."""
        hass = core.HomeAssistant(self.config_dir.name)
        self.api = FakeAssist(hass)
        llm.async_register_api(hass, self.api)
        hass.auth.users["user-1"] = core.User("user-1", "Ada")

        async def stop():
            for entry in hass.config_entries.async_entries(DOMAIN):
                await hass.config_entries.async_unload(entry.entry_id)
        self.addAsyncCleanup(stop)
        return hass

    # -- setup helpers --

    async def add_entry(self, provider="openai", base_url=None, **sub):
        """The config flow, then the conversation subentry's settings."""
        flow = self.hass.config_entries.flow
        result = await flow.async_init(DOMAIN, context={"source": "user"})
        self.assertEqual(result["type"], "form")
        result = await flow.async_configure(result["flow_id"], {
            "provider": provider, "base_url": base_url or self.fake.base_url})
        self.assertEqual(result["type"], "create_entry", result.get("errors"))
        entry = result["result"]
        await self.hass.async_block_till_done()
        self.assertEqual(entry.state.value, "loaded", entry.reason)
        if sub:
            await self.set_agent(entry, **sub)
        return entry

    def subentry(self, entry, kind="conversation"):
        return next(s for s in entry.subentries.values() if s.subentry_type == kind)

    async def set_agent(self, entry, kind="conversation", **data):
        """Change a subentry's data the way its reconfigure flow does."""
        sub = self.subentry(entry, kind)
        self.hass.config_entries.async_update_subentry(entry, sub, data={**sub.data, **data})
        await self.hass.async_block_till_done()

    def entity(self, platform="conversation"):
        return next(e for eid, e in self.hass.config_entries.entities.items()
                    if eid.startswith(platform + "."))

    async def ask(self, text, **kw):
        return await self.entity().async_process(user_input(text, **kw))

    def chat_log(self, conversation_id):
        return self.hass.data["conversation_chat_logs"][conversation_id]

    # -- files --

    async def test_manifest_strings_and_translations(self):
        with open(os.path.join(EXAMPLE, "manifest.json")) as f:
            manifest = json.load(f)
        self.assertEqual(manifest["domain"], DOMAIN)
        self.assertTrue(manifest["config_flow"])
        self.assertEqual(set(manifest["dependencies"]), {"conversation", "ai_task"})
        self.assertEqual(manifest["requirements"], [])  # the binding is standard library only
        with open(os.path.join(EXAMPLE, "strings.json")) as f:
            strings = json.load(f)
        with open(os.path.join(EXAMPLE, "translations", "en.json")) as f:
            english = json.load(f)
        self.assertEqual(set(strings), set(english))
        errors = set(strings["config"]["error"])
        self.assertEqual(errors, {"cannot_connect", "invalid_auth", "invalid_url",
                                  "plugin_not_found", "unknown"})
        self.assertEqual(set(strings["config_subentries"]), {"conversation", "ai_task_data"})
        self.assertEqual(set(strings["selector"]["memory"]["options"]),
                         {"conversation", "device", "user", "home"})
        for name in sorted(os.listdir(EXAMPLE)):
            if name.endswith(".py"):
                with open(os.path.join(EXAMPLE, name)) as f:
                    compile(f.read(), name, "exec")

    # -- setup --

    async def test_config_flow_makes_an_entry_with_an_agent_and_an_ai_task(self):
        entry = await self.add_entry()
        self.assertEqual(dict(entry.data), {"provider": "openai", "base_url": self.fake.base_url})
        agent, task = self.subentry(entry), self.subentry(entry, "ai_task_data")
        self.assertEqual(agent.data["model"], "fake-model")  # the server's model list
        self.assertEqual(agent.data["memory"], "device")
        self.assertEqual(task.data["model"], "fake-model")
        conv, ai = self.entity(), self.entity("ai_task")
        self.assertEqual((conv.unique_id, ai.unique_id), (agent.subentry_id, task.subentry_id))
        self.assertEqual(conv.device_info["identifiers"], {(DOMAIN, agent.subentry_id)})
        self.assertEqual(conv.device_info["entry_type"], "service")
        self.assertTrue(conv.supported_features & chat.ConversationEntityFeature.CONTROL)
        # The same server again: refused.
        flow = self.hass.config_entries.flow
        result = await flow.async_init(DOMAIN, context={"source": "user"})
        result = await flow.async_configure(result["flow_id"], {
            "provider": "openai", "base_url": self.fake.base_url, "plugin_path": PLUGIN})
        self.assertEqual((result["type"], result["reason"]), ("abort", "already_configured"))

    async def test_bad_url_and_bad_key_are_form_errors(self):
        flow = self.hass.config_entries.flow
        result = await flow.async_init(DOMAIN, context={"source": "user"})
        result = await flow.async_configure(result["flow_id"], {
            "provider": "openai", "base_url": "http://127.0.0.1:9/v1", "plugin_path": PLUGIN})
        self.assertEqual((result["type"], result["errors"]), ("form", {"base": "cannot_connect"}))
        self.assertIn("is the server running", result["description_placeholders"]["error"])
        refuser = KeyRefuser()
        self.addCleanup(refuser.close)
        result = await flow.async_configure(result["flow_id"], {
            "provider": "openai", "base_url": refuser.url, "api_key": "wrong",
            "plugin_path": PLUGIN})
        self.assertEqual(result["errors"], {"base": "invalid_auth"})
        self.assertIn("API key", result["description_placeholders"]["error"])
        result = await flow.async_configure(result["flow_id"], {
            "provider": "openai", "base_url": "ftp://nowhere", "plugin_path": PLUGIN})
        self.assertEqual(result["errors"], {"base": "invalid_url"})
        # A required field left out is the form's own error, before the step.
        with self.assertRaises(schemas.Invalid):
            await flow.async_configure(result["flow_id"], {"provider": "openai"})
        self.assertEqual(self.hass.config_entries.async_entries(DOMAIN), [])

    async def test_subentry_flow_and_reconfigure_keep_the_memory(self):
        entry = await self.add_entry()
        subflow = self.hass.config_entries.subentries
        result = await subflow.async_init((entry.entry_id, "conversation"),
                                          context={"source": "user"})
        self.assertEqual(result["step_id"], "set_options")
        keys = {k.schema: v for k, v in result["data_schema"].schema.items()}
        self.assertEqual([o["value"] for o in keys["model"].config["options"]], ["fake-model"])
        self.assertNotIn("temperature", keys)  # recommended settings: the essentials only
        # Recommended off: the form comes again, with the rest.
        result = await subflow.async_configure(result["flow_id"], {
            "name": "Kitchen", "model": "fake-model", "memory": "home", "recommended": False})
        keys = {k.schema for k in result["data_schema"].schema}
        self.assertTrue({"temperature", "memory_turns", "memory_idle_hours", "stream"} <= keys)
        result = await subflow.async_configure(result["flow_id"], {
            "name": "Kitchen", "model": "fake-model", "memory": "home", "recommended": False,
            "temperature": 0.5, "memory_turns": 4, "stream": False})
        self.assertEqual(result["type"], "create_entry")
        await self.hass.async_block_till_done()  # a new subentry: the entry reloads
        self.assertEqual(len(entry.runtime_data.agents), 3)
        kitchen = result["result"]
        self.assertEqual(dict(kitchen.data)["memory_turns"], 4.0)
        kitchen_entity = next(e for e in self.hass.config_entries.entities.values()
                              if e.unique_id == kitchen.subentry_id)
        await kitchen_entity.async_process(user_input("my name is Ada"))
        handle = entry.runtime_data.agents[kitchen.subentry_id]
        agent_before = handle.agent
        # Reconfigure: a new prompt and temperature go to the live agent.
        result = await subflow.async_init((entry.entry_id, "conversation"), context={
            "source": "reconfigure", "subentry_id": kitchen.subentry_id})
        result = await subflow.async_configure(result["flow_id"], {
            "model": "fake-model", "memory": "home", "recommended": False, "temperature": 1.5,
            "prompt": "You are the kitchen."})
        self.assertEqual((result["type"], result["reason"]), ("abort", "reconfigure_successful"))
        await self.hass.async_block_till_done()
        self.assertIs(handle.agent, agent_before)  # updated in place, not remade
        r = await kitchen_entity.async_process(user_input("who am I? [[recall]]"))
        self.assertIn('Your first message was: "my name is Ada"', r.response.speech["plain"]["speech"])
        body = self.fake.chat_requests()[-1]["body"]
        self.assertEqual(body["temperature"], 1.5)
        self.assertTrue(system_text(self.fake.chat_requests()[-1]).startswith("You are the kitchen."))
        # An idle expiry change cannot be made live: a new agent on the same file remembers.
        await self.set_agent(entry, **{})  # no change: nothing happens
        sub = entry.subentries[kitchen.subentry_id]
        self.hass.config_entries.async_update_subentry(
            entry, sub, data={**sub.data, "memory_idle_hours": 2})
        await self.hass.async_block_till_done()
        self.assertIsNot(handle.agent, agent_before)
        r = await kitchen_entity.async_process(user_input("again [[recall]]"))
        self.assertIn('"my name is Ada"', r.response.speech["plain"]["speech"])

    async def test_reconfigure_the_connection_applies_it_live(self):
        entry = await self.add_entry()
        handle = next(iter(entry.runtime_data.agents.values()))
        agent = handle.agent
        flow = self.hass.config_entries.flow
        result = await flow.async_init(DOMAIN, context={"source": "reconfigure",
                                                        "entry_id": entry.entry_id})
        result = await flow.async_configure(result["flow_id"], {
            "provider": "openai", "base_url": "http://127.0.0.1:9/v1", "plugin_path": PLUGIN})
        self.assertEqual(result["errors"], {"base": "cannot_connect"})
        result = await flow.async_configure(result["flow_id"], {
            "provider": "openai", "base_url": self.fake.base_url, "api_key": "sk-new",
            "plugin_path": PLUGIN})
        self.assertEqual(result["reason"], "reconfigure_successful")
        await self.hass.async_block_till_done()
        self.assertIs(handle.agent, agent)
        await self.ask("hello")
        self.assertEqual(self.fake.requests()[-1]["authorization"], "Bearer sk-new")

    async def test_a_plugin_that_cannot_load_fails_setup(self):
        flow = self.hass.config_entries.flow
        result = await flow.async_init(DOMAIN, context={"source": "user"})
        result = await flow.async_configure(result["flow_id"], {
            "provider": "openai", "base_url": self.fake.base_url,
            "plugin_path": "/nonexistent/parley.so"})
        self.assertEqual(result["errors"], {"base": "plugin_not_found"})

    # -- turns --

    async def test_assist_tools_with_tool_result_and_time_values(self):
        await self.add_entry(stream=False)
        r = await self.ask('[[tool:HassTurnOn {"name":"kitchen"}]][[tool:GetTime {}]]')
        first, second = self.fake.chat_requests()[-2:]
        decl = {t["function"]["name"]: t["function"] for t in first["body"]["tools"]}
        self.assertEqual(decl["HassTurnOn"]["parameters"],
                         {"type": "object", "properties": {"name": {"type": "string"}},
                          "required": ["name"]})
        self.assertEqual(schemas.CONVERTED[-1][0], "probatio")  # HA 2026 converts with probatio
        sent = [json.loads(m["content"]) for m in tool_messages(second)]
        self.assertEqual(sent[0]["data"]["success"][0]["name"], "kitchen")
        self.assertEqual(sent[1], {"time": "14:05:00", "date": "2026-11-27"})  # HA's encoder
        self.assertEqual([c.id for c in self.api.calls], ["call_%d_0" % first["seq"],
                                                          "call_%d_1" % first["seq"]])
        # The result is HA's: the intent response of the Assist tool, the model's speech.
        self.assertEqual(r.response.response_type, "action_done")
        self.assertEqual(r.response.success_results[0]["id"], "light.kitchen")
        self.assertTrue(r.response.speech["plain"]["speech"].startswith("Done. HassTurnOn:"))

    async def test_tool_error_reaches_the_model_and_the_chat_log(self):
        await self.add_entry(stream=False)
        r = await self.ask('[[tool:HassTurnOn {"name":"garage"}]]')
        sent = json.loads(tool_messages(self.fake.chat_requests()[-1])[0]["content"])
        self.assertEqual(sent["error"], "tool_error")
        self.assertEqual(sent["error_text"], "HomeAssistantError: no device named garage")
        result = next(c for c in self.chat_log(r.conversation_id).content
                      if c.role == "tool_result")
        self.assertEqual((result.result.error, result.result.data),
                         (True, {"error": "HomeAssistantError",
                                 "error_text": "no device named garage"}))
        # Arguments the tool's schema refuses: HA's validation error, to the model too.
        await self.ask("[[tool:HassTurnOn {}]]")
        sent = json.loads(tool_messages(self.fake.chat_requests()[-1])[-1]["content"])
        self.assertEqual(sent["error_text"],
                         "MultipleInvalid: required key not provided @ data['name']")

    async def test_older_home_assistant_dict_results_and_voluptuous_schemas(self):
        ha.legacy(True)
        self.addCleanup(ha.legacy, False)
        probatio, self.turns.probatio = self.turns.probatio, None
        self.addCleanup(setattr, self.turns, "probatio", probatio)
        await self.add_entry(stream=False)
        r = await self.ask('[[tool:HassTurnOn {"name":"hall"}]][[tool:GetTime {}]]')
        self.assertEqual(schemas.CONVERTED[-1][0], "voluptuous_openapi")
        sent = [json.loads(m["content"]) for m in tool_messages(self.fake.chat_requests()[-1])]
        self.assertEqual(sent[0]["data"]["success"][0]["name"], "hall")
        self.assertEqual(sent[1]["time"], "14:05:00")
        results = [c for c in self.chat_log(r.conversation_id).content if c.role == "tool_result"]
        self.assertEqual(results[1].tool_result["date"], datetime.date(2026, 11, 27))
        self.assertEqual(r.response.success_results[0]["id"], "light.hall")

    async def test_every_step_goes_into_the_chat_log(self):
        await self.add_entry(stream=False)
        events = []
        chat.async_subscribe_chat_logs(self.hass, lambda cid, kind, data: events.append(
            (kind, data.get("content", {}).get("role"))))
        r = await self.ask('[[think:the light first]][[tool:HassTurnOn {"name":"kitchen"}]]')
        log = self.chat_log(r.conversation_id).content
        self.assertEqual([c.role for c in log],
                         ["system", "user", "assistant", "tool_result", "assistant"])
        calls = log[2]
        self.assertEqual(calls.thinking_content, "the light first")
        self.assertEqual([(t.tool_name, t.tool_args, t.external) for t in calls.tool_calls],
                         [("HassTurnOn", {"name": "kitchen"}, True)])
        self.assertEqual(calls.agent_id, self.entity().entity_id)
        self.assertEqual(log[3].tool_call_id, calls.tool_calls[0].id)
        self.assertIsInstance(log[3].result, llm.ToolResult)
        self.assertEqual(log[4].content, r.response.speech["plain"]["speech"])
        self.assertEqual(log[4].thinking_content, "the light first")  # the marker stays for round 2
        added = [role for kind, role in events if kind == "content_added"]
        self.assertEqual(added, ["user", "assistant", "tool_result", "assistant"])
        stats = [d["stats"] for kind, d in chat.trace.EVENTS
                 if kind == "agent_detail" and "stats" in d]
        self.assertGreater(stats[-1]["input_tokens"], 0)
        self.assertGreater(stats[-1]["output_tokens"], 0)

    async def test_steps_of_a_finished_turn_group_by_model_reply(self):
        log = chat.ChatLog(self.hass, "c1")
        turn = self.turns.Turn(log, "conversation.p", streaming=False)
        turn.results["a"] = llm.ToolResult(data={"ok": True})
        steps = [{"type": "reasoning", "content": "two lights"},
                 {"type": "tool_call", "call_id": "a", "name": "HassTurnOn",
                  "arguments": {"name": "x"}},
                 {"type": "tool_call", "call_id": "b", "name": "Nope", "arguments": "{bad"},
                 {"type": "tool_result", "call_id": "a", "name": "HassTurnOn",
                  "content": '{"ok":true}', "is_error": False},
                 {"type": "tool_result", "call_id": "b", "name": "Nope",
                  "content": '{"error":"unknown_tool","error_text":"no tool Nope"}',
                  "is_error": True},
                 {"type": "reasoning", "content": "done"},
                 {"type": "answer", "content": "Both on."}]
        turn.write_steps(steps, ["Let me look."])
        c = log.content
        self.assertEqual([x.role for x in c],
                         ["system", "assistant", "tool_result", "tool_result", "assistant"])
        self.assertEqual((c[1].content, c[1].thinking_content), ("Let me look.", "two lights"))
        self.assertEqual([(t.id, t.tool_args, t.external) for t in c[1].tool_calls],
                         [("a", {"name": "x"}, True), ("b", {"invalid_json": "{bad"}, True)])
        self.assertIs(c[2].result, turn.results["a"])  # the ToolResult HA's tool returned
        self.assertEqual((c[3].result.error, c[3].result.data["error"]), (True, "unknown_tool"))
        self.assertEqual((c[4].content, c[4].thinking_content), ("Both on.", "done"))

    async def test_streaming_feeds_the_chat_log_one_message_per_reply(self):
        await self.add_entry(stream=True)
        self.assertTrue(self.entity().supports_streaming)
        r = await self.ask('look [[tool:HassTurnOn {"name":"a"}]][[tool:HassTurnOn {"name":"b"}]]')
        log = self.chat_log(r.conversation_id).content
        self.assertEqual([c.role for c in log],
                         ["system", "user", "assistant", "tool_result", "tool_result", "assistant"])
        self.assertEqual([t.tool_args["name"] for t in log[2].tool_calls], ["a", "b"])
        self.assertEqual(log[-1].content, r.response.speech["plain"]["speech"])
        self.assertTrue(self.fake.chat_requests()[-1]["body"]["stream"])
        await self.set_agent(self.hass.config_entries.async_entries(DOMAIN)[0], stream=False)
        self.assertFalse(self.entity().supports_streaming)

    async def test_streamed_reasoning_goes_to_each_replys_message(self):
        await self.add_entry(stream=True)
        r = await self.ask('[[think:which light]][[tool:HassTurnOn {"name":"kitchen"}]]')
        log = self.chat_log(r.conversation_id).content
        self.assertEqual([c.role for c in log],
                         ["system", "user", "assistant", "tool_result", "assistant"])
        self.assertEqual((log[2].thinking_content, log[2].tool_calls[0].tool_name),
                         ("which light", "HassTurnOn"))
        self.assertEqual(log[4].thinking_content, "which light")  # the marker holds for round 2
        self.assertEqual(log[4].content, r.response.speech["plain"]["speech"])
        self.assertNotIn("which light", log[4].content)

    async def test_streamed_question_keeps_the_microphone_open(self):
        await self.add_entry(stream=True)
        r = await self.ask("a streamed answer please [[ask]]")
        self.assertTrue(r.continue_conversation)
        self.assertTrue(r.response.speech["plain"]["speech"].endswith("Anything else?"))

    async def test_failed_turn_is_an_error_response(self):
        await self.add_entry(stream=False, parley_options={"max_retries": 0})
        r = await self.ask("hi [[fault:500]]")
        self.assertEqual(r.response.error_code, "unknown")
        self.assertIn("(http_status)", r.response.speech["plain"]["speech"])

    # -- prompt --

    async def test_prompt_split_stable_part_cached_and_no_64k_limit(self):
        entry = await self.add_entry(stream=False, prompt="You are {{ ha_name }}'s assistant.")
        self.api.api_prompt = "Static Context:\n" + "".join("- light.lamp_%d: Lamp %d\n" % (i, i)
                                            for i in range(4000))  # > 64 KiB
        self.assertGreater(len(self.api.api_prompt), 65536)
        await self.ask("hello", extra="The user is in the kitchen.")
        handle = next(iter(entry.runtime_data.agents.values()))
        self.assertTrue(handle.prompt.startswith("You are Home's assistant.\n"))
        self.assertTrue(handle.prompt.endswith("Lamp 3999"))
        self.assertNotIn("Current time", handle.prompt)
        self.assertEqual(system_text(self.fake.chat_requests()[-1]), handle.prompt)  # cached
        system = instructions(self.fake.chat_requests()[-1])  # the rest after the history
        self.assertTrue(system.startswith(handle.prompt + "\n\nCurrent time is "))
        self.assertTrue(system.endswith("\nThe user is in the kitchen."))

    async def test_prompt_split_without_an_api_and_control_follows_the_apis(self):
        entry = await self.add_entry(stream=False, prompt="Be brief.")
        await self.set_agent(entry, llm_hass_api=[])
        self.assertFalse(self.entity().supported_features)  # no API: no CONTROL
        await self.ask("hello", extra="Speak French.")
        handle = next(iter(entry.runtime_data.agents.values()))
        self.assertEqual(handle.prompt, "Be brief.")
        system = instructions(self.fake.chat_requests()[-1])
        self.assertRegex(system, r"^Be brief\.\n\nCurrent time is \d\d:\d\d:\d\d\. "
                                 r"Today's date is \d{4}-\d\d-\d\d\.\n\nSpeak French\.$")
        split = self.turns.split_prompt
        self.assertEqual(split("A\nB", None, "B"), ("A", "B"))
        self.assertEqual(split("A", None, None), ("A", ""))
        await self.set_agent(entry, llm_hass_api=["assist"])
        self.assertTrue(self.entity().supported_features
                        & chat.ConversationEntityFeature.CONTROL)

    async def test_concurrent_turns_each_run_under_their_own_prompt(self):
        entry = await self.add_entry(stream=False)
        self.api.api_prompt = "You are in the area of {device}."
        asks = [self.ask("hi from dev-%d [[latency:%d]]" % (i, 150 if i % 2 else 10),
                         satellite="assist_satellite.s%d" % i, device="dev-%d" % i)
                for i in range(6)]
        results = await asyncio.gather(*asks)
        self.assertTrue(all(r.response.response_type == "action_done" for r in results))
        for request in self.fake.chat_requests()[-6:]:
            user = [m["content"] for m in harness.messages(request) if m["role"] == "user"][-1]
            device = user.split()[2]
            stable = instructions(request).split("\n\nCurrent time is ")[0]
            self.assertTrue(stable.endswith("You are in the area of %s." % device), stable)
        handle = next(iter(entry.runtime_data.agents.values()))
        self.assertIn("You are in the area of dev-", handle.prompt)

    # -- memory --

    async def test_memory_of_the_satellite_outlives_ha_sessions_and_a_restart(self):
        entry = await self.add_entry(stream=False, memory="device")
        first = await self.ask("my name is Ada")
        # HA drops the session after 5 idle minutes and mints a new id.
        core.advance_clock(minutes=6)
        core.async_fire_time_changed(self.hass)
        self.assertNotIn(first.conversation_id, self.hass.data["chat_session"])
        later = await self.ask("who am I? [[recall]]", conversation_id=first.conversation_id)
        self.assertNotEqual(later.conversation_id, first.conversation_id)
        self.assertIn('Your first message was: "my name is Ada"',
                      later.response.speech["plain"]["speech"])
        # Another satellite has its own memory.
        other = await self.ask("[[recall]]", satellite="assist_satellite.hall")
        self.assertIn('Your first message was: "[[recall]]"', other.response.speech["plain"]["speech"])
        # A restart: Home Assistant forgets every session, the SQLite memory comes back.
        await self.hass.config_entries.async_unload(entry.entry_id)
        self.hass = await self.start_hass()
        restored = entry  # the entry as HA stored it: the same data and subentries
        self.hass.config_entries._entries[restored.entry_id] = restored
        self.assertTrue(await self.hass.config_entries.async_setup(restored.entry_id))
        await self.hass.async_block_till_done()
        again = await self.ask("still me? [[recall]]", conversation_id=first.conversation_id)
        self.assertIn('Your first message was: "my name is Ada"',
                      again.response.speech["plain"]["speech"])
        turns = (await restored.runtime_data.agents[self.subentry(restored).subentry_id]
                 .agent.history("device:" + SATELLITE))["turns"]
        self.assertEqual(len(turns), 3)

    async def test_memory_of_ha_conversation_ends_with_it(self):
        await self.add_entry(stream=False, memory="conversation")
        first = await self.ask("my name is Ada")
        core.advance_clock(minutes=6)
        core.async_fire_time_changed(self.hass)
        later = await self.ask("[[recall]]", conversation_id=first.conversation_id)
        self.assertIn('Your first message was: "[[recall]]"', later.response.speech["plain"]["speech"])

    async def test_memory_of_the_user_and_of_the_home(self):
        entry = await self.add_entry(stream=False, memory="user")
        await self.ask("my name is Ada", satellite="assist_satellite.hall")
        r = await self.ask("[[recall]]", satellite="assist_satellite.kitchen")
        self.assertIn('"my name is Ada"', r.response.speech["plain"]["speech"])
        r = await self.ask("[[recall]]", user_id=None)  # no user: HA's conversation
        self.assertIn('"[[recall]]"', r.response.speech["plain"]["speech"])
        await self.set_agent(entry, memory="home")
        await self.ask("the home speaks", user_id="user-2")
        r = await self.ask("[[recall]]", satellite=None)
        self.assertIn('"the home speaks"', r.response.speech["plain"]["speech"])

    async def test_commands_handled_by_ha_and_announcements_reach_the_next_request(self):
        await self.add_entry(stream=False, memory="device")
        first = await self.ask("hello")
        cid = first.conversation_id
        # In the same session: HA's own agent handles a command locally, a
        # satellite announces something, as assist_satellite does.
        with chat.async_get_chat_session(self.hass, cid) as session, \
                chat.async_get_chat_log(self.hass, session,
                                        user_input("turn on the lights", cid)) as log:
            log.async_add_assistant_content_without_tools(chat.AssistantContent(
                agent_id="conversation.home_assistant", content="Turned on the lights"))
        with chat.async_get_chat_session(self.hass, cid) as session, \
                chat.async_get_chat_log(self.hass, session) as log:
            log.async_add_assistant_content_without_tools(chat.AssistantContent(
                agent_id=SATELLITE, content="The washing machine is done."))
        await self.ask("what happened? [[recall]]", conversation_id=cid)
        msgs = [(m["role"], without_note(m["content"]))
                for m in harness.messages(self.fake.chat_requests()[-1]) if m["role"] != "system"]
        self.assertEqual(msgs[2:], [("user", "turn on the lights"),
                                    # the announcement joins the answer before it: the
                                    # roles alternate, as strict chat templates require
                                    ("assistant",
                                     "Turned on the lights\n\nThe washing machine is done."),
                                    ("user", "what happened? [[recall]]")])
        # A failed turn in between adds nothing twice.
        r = await self.ask("oops [[fault:400]]", conversation_id=cid)
        self.assertEqual(r.response.error_code, "unknown")
        # Remembered: after HA forgot the session, the next request still has them.
        core.advance_clock(minutes=6)
        core.async_fire_time_changed(self.hass)
        await self.ask("and now?", conversation_id=cid)
        contents = [m["content"] for m in harness.messages(self.fake.chat_requests()[-1])]
        self.assertIn("Turned on the lights\n\nThe washing machine is done.", contents)
        self.assertEqual(contents.count("turn on the lights"), 1)

    async def test_forget_one_memory_or_all(self):
        await self.add_entry(stream=False, memory="device")
        await self.ask("I am in the kitchen")
        await self.ask("I am in the hall", satellite="assist_satellite.hall")
        await self.hass.services.async_call(DOMAIN, "forget",
                                            {"memory_id": "device:" + SATELLITE}, blocking=True)
        r = await self.ask("[[recall]]")
        self.assertIn('"[[recall]]"', r.response.speech["plain"]["speech"])
        r = await self.ask("[[recall]]", satellite="assist_satellite.hall")
        self.assertIn('"I am in the hall"', r.response.speech["plain"]["speech"])
        await self.hass.services.async_call(DOMAIN, "forget",
                                            {"entity_id": self.entity().entity_id}, blocking=True)
        r = await self.ask("x [[recall]]", satellite="assist_satellite.hall")
        self.assertIn('"x [[recall]]"', r.response.speech["plain"]["speech"])
        with self.assertRaises(core.ServiceValidationError):
            await self.hass.services.async_call(DOMAIN, "forget",
                                                {"entity_id": "conversation.nobody"})

    # -- AI Task --

    async def test_ai_task_returns_data_matching_the_schema_in_every_provider(self):
        base = self.fake.base_url[:-len("/v1")]
        for provider, url in (("openai", self.fake.base_url), ("ollama", base),
                              ("anthropic", base)):
            with self.subTest(provider=provider):
                hass = self.hass = await self.start_hass()
                entry = await self.add_entry(provider=provider, base_url=url)
                if provider == "anthropic":
                    await self.set_agent(entry, "ai_task_data", max_tokens=1024)
                structure = schemas.Schema({
                    schemas.Required("name", description="The device"): str,
                    schemas.Required("on"): bool,
                    schemas.Optional("brightness"): int})
                ai_entity = self.entity("ai_task")
                ai_task = sys.modules["homeassistant.components.ai_task"]
                result = await ai_task.async_generate_data(
                    hass, task_name="light state", entity_id=ai_entity.entity_id,
                    instructions="Describe the kitchen light as JSON.", structure=structure)
                self.assertIsInstance(result.data, dict)
                self.assertIsInstance(result.data["name"], str)
                self.assertIsInstance(result.data["on"], bool)
                self.assertLessEqual(set(result.data), {"name", "on", "brightness"})
                if "brightness" in result.data:  # optional: absent rather than null
                    self.assertIsInstance(result.data["brightness"], int)
                body = self.fake.requests()[-1]["body"]
                self.assertIn("kitchen light", json.dumps(body))
                # The schema in each provider's own form, strict as HA's OpenAI agent makes it.
                schema = {"openai": lambda: body["response_format"]["json_schema"]["schema"],
                          "ollama": lambda: body["format"],
                          "anthropic": lambda: body["tools"][0]["input_schema"]}[provider]()
                self.assertEqual(schema["required"], ["name", "on", "brightness"])
                self.assertFalse(schema["additionalProperties"])
                self.assertEqual(schema["properties"]["brightness"]["type"], ["integer", "null"])
                log = hass.data["conversation_chat_logs"][result.conversation_id].content
                self.assertEqual(json.loads(log[-1].content)["name"], result.data["name"])
                for e in list(hass.config_entries.async_entries(DOMAIN)):
                    await hass.config_entries.async_unload(e.entry_id)

    async def test_ai_task_without_structure_returns_text(self):
        await self.add_entry()
        ai_task = sys.modules["homeassistant.components.ai_task"]
        result = await ai_task.async_generate_data(
            self.hass, task_name="t", entity_id=self.entity("ai_task").entity_id,
            instructions="say something")
        # one message: the task's prompt is the turn's note, after the user's text
        self.assertEqual(result.data, 'You said: "say something". I have seen 1 messages (1 from you).')
        self.assertIn(ai_task.DEFAULT_SYSTEM_PROMPT, instructions(self.fake.chat_requests()[-1]))


if __name__ == "__main__":
    unittest.main()
