"""Structured output (parley_input.response_format_json) in the three providers, the empty
answer that fails instead of committing "", the tool_choice option, and what the log says
when the answer is cut short.

Shapes follow the references: Chat Completions response_format json_schema
(https://platform.openai.com/docs/guides/structured-outputs), Ollama `format`
(https://github.com/ollama/ollama/blob/main/docs/api.md#request-structured-outputs),
Anthropic tool_choice {"type": "tool"} (https://docs.anthropic.com/en/docs/build-with-claude/tool-use)
and output_config.format (structured outputs).  The fake LLM answers a schema with JSON
generated from it (tests/fake-llm/schema.c), and the fault schema_mismatch breaks it.
"""
import json
import unittest

from harness import FakeLLM, ParleyTestCase, options

PROVIDERS = ("openai", "anthropic", "ollama")
PATHS = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages", "ollama": "/api/chat"}

SCHEMA = {
    "type": "object",
    "properties": {
        "room": {"type": "string"},
        "colour": {"type": "string", "enum": ["red", "green"]},
        "brightness": {"type": "integer", "minimum": 10, "maximum": 100},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["room", "colour", "brightness"],
    "additionalProperties": False,
}
EXPECTED = {"room": "fake room", "colour": "red", "brightness": 10, "tags": ["fake tags"]}
FORMAT = {"name": "light_setting", "schema": SCHEMA}


def provider_options(fake, provider, **kw):
    base = fake.base_url if provider == "openai" else "http://127.0.0.1:%d" % fake.port
    return options(fake, provider=provider, base_url=base, **kw)


def llm_requests(fake, provider):
    return [r for r in fake.requests() if r.get("path") == PATHS[provider]]


class StructuredOutput(ParleyTestCase):

    def run_turns(self, provider, lines, tools=None, **opts):
        with FakeLLM() as fake:
            run = self.run_ok(lines, provider_options(fake, provider, **opts), tools=tools)
            return run, llm_requests(fake, provider)

    def test_each_provider_sends_its_shape_and_returns_the_data(self):
        for provider in PROVIDERS:
            for stream in (False, True):
                with self.subTest(provider=provider, stream=stream):
                    lines = [{"text": "set the light", "conversation_id": "c",
                              "response_format": FORMAT},
                             {"op": "history", "conversation_id": "c"}]
                    run, reqs = self.run_turns(provider, lines, stream=stream)
                    line = self.assertTurnOk(run.by_seq(1))
                    self.assertEqual(line["structured"], EXPECTED)
                    self.assertEqual(json.loads(line["response"]), EXPECTED)
                    body = reqs[0]["body"]
                    if provider == "openai":
                        self.assertEqual(body["response_format"], {
                            "type": "json_schema", "json_schema": {
                                "name": "light_setting", "schema": SCHEMA, "strict": False}})
                    elif provider == "ollama":
                        self.assertEqual(body["format"], SCHEMA)
                    else:
                        self.assertEqual(body["tool_choice"],
                                         {"type": "tool", "name": "light_setting"})
                        self.assertEqual(body["tools"][-1]["input_schema"], SCHEMA)
                    # The stored answer is the JSON text: the next turn sends it as said.
                    turns = run.by_seq(2)["result"]["turns"]
                    answer = turns[0]["messages"][-1]
                    self.assertEqual(answer["role"], "assistant")
                    self.assertEqual(json.loads(answer["content"]), EXPECTED)

    def test_a_mismatching_answer_fails_and_keeps_history(self):
        for provider in PROVIDERS:
            with self.subTest(provider=provider):
                lines = [{"text": "hello", "conversation_id": "c"},
                         {"text": "set it [[fault:schema_mismatch]]", "conversation_id": "c",
                          "response_format": FORMAT},
                         {"op": "history", "conversation_id": "c"}]
                run, _ = self.run_turns(provider, lines)
                line = self.assertTurnError(run.by_seq(2), "bad_response")
                self.assertIn("does not match the response format 'light_setting'",
                              line["error"]["message"])
                self.assertIn("lacks the required property 'room'", line["error"]["message"])
                self.assertEqual(len(run.by_seq(3)["result"]["turns"]), 1)

    def test_strict_and_json_mode(self):
        strict = dict(SCHEMA, required=list(SCHEMA["properties"]))
        lines = [{"text": "go", "response_format": {"name": "s", "schema": strict,
                                                    "strict": True}},
                 {"text": "any json please", "response_format": {}}]
        run, reqs = self.run_turns("openai", lines)
        self.assertTurnOk(run.by_seq(1))
        self.assertTrue(reqs[0]["body"]["response_format"]["json_schema"]["strict"])
        second = self.assertTurnOk(run.by_seq(2))
        self.assertEqual(reqs[1]["body"]["response_format"], {"type": "json_object"})
        self.assertEqual(second["structured"], {"answer": "any json please"})
        # OpenAI refuses JSON mode unless a message says "JSON": Parley's note after the
        # user's text does (the turn's own instructions, docs/history.md).
        self.assertIn("JSON", reqs[1]["body"]["messages"][-1]["content"])

    def test_anthropic_with_thinking_uses_output_config(self):
        lines = [{"text": "set the light", "response_format": FORMAT}]
        run, reqs = self.run_turns("anthropic", lines, thinking_budget_tokens=1024,
                                   max_tokens=4096)
        line = self.assertTurnOk(run.by_seq(1))
        self.assertEqual(line["structured"], EXPECTED)
        body = reqs[0]["body"]
        self.assertEqual(body["output_config"],
                         {"format": {"type": "json_schema", "schema": SCHEMA}})
        self.assertNotIn("tool_choice", body)

    def test_with_tools_the_answer_comes_after_them(self):
        for provider in PROVIDERS:
            with self.subTest(provider=provider):
                lines = [{"text": '[[tool:turn_on {"name":"kitchen"}]]', "response_format": FORMAT}]
                run, reqs = self.run_turns(provider, lines, tools="demo")
                line = self.assertTurnOk(run.by_seq(1))
                self.assertEqual(line["structured"], EXPECTED)
                self.assertEqual([s["type"] for s in line["steps"]],
                                 ["tool_call", "tool_result", "answer"])
                if provider == "anthropic":  # some tool: the host's, or the answer tool
                    self.assertEqual(reqs[0]["body"]["tool_choice"], {"type": "any"})

    def test_bad_formats_are_refused_by_name(self):
        cases = [
            ({"schema": {"type": "array"}}, "must describe a JSON object"),
            ({"schema": {"type": "object", "properties": {"x": {"type": "colour"}}}},
             "schema.properties.x: unknown type 'colour'"),
            ({"name": "has space"}, "name: must be 1 to 64"),
            ({"nme": "x"}, 'unknown key "nme"'),
            ({"name": "turn_on"}, "name 'turn_on' is also a tool's"),
        ]
        lines = [{"text": "x", "response_format": f} for f, _ in cases]
        with FakeLLM() as fake:
            run = self.run_ok(lines, options(fake), tools="demo")
            for i, (_, words) in enumerate(cases, 1):
                line = self.assertTurnError(run.by_seq(i), "invalid_input")
                self.assertIn("response_format_json", line["error"]["message"])
                self.assertIn(words, line["error"]["message"])
            self.assertEqual(fake.chat_requests(), [])


class EmptyAnswer(ParleyTestCase):
    """A reasoning model that spends max_tokens thinking, or stops right after </think>,
    answers nothing: the turn fails (bad_response) saying why, history unchanged."""

    def test_empty_answers_fail(self):
        cases = [
            ("[[think:pondering]] [[length]] [[empty]]", "spent its whole answer budget reasoning"),
            ("[[think-tag:pondering]] [[empty]]", "stopped without an answer"),
            ("[[empty]]", "the model gave an empty answer"),
        ]
        for provider in PROVIDERS:
            with self.subTest(provider=provider):
                lines = [{"text": t, "conversation_id": "c"} for t, _ in cases]
                lines.append({"op": "history", "conversation_id": "c"})
                thinking = {"ollama": {"think": True},
                            "anthropic": {"thinking_budget_tokens": 1024}}.get(provider, {})
                with FakeLLM() as fake:
                    run = self.run_ok(lines, provider_options(fake, provider, max_tokens=2048,
                                                              **thinking))
                for i, (_, words) in enumerate(cases, 1):
                    if provider == "anthropic" and i == 2:
                        continue  # no <think> tags in Messages content: an empty text
                    line = self.assertTurnError(run.by_seq(i), "bad_response")
                    self.assertIn(words, line["error"]["message"])
                    self.assertIsNone(line.get("response"))
                err = run.by_seq(len(cases) + 1)["error"]
                self.assertEqual(err["code"], "not_found", err)  # nothing was stored


class ToolChoice(ParleyTestCase):

    def test_option_maps_per_provider_on_the_first_request(self):
        want = {"openai": [("required", "required"),
                           ("turn_on", {"type": "function", "function": {"name": "turn_on"}}),
                           ("none", "none")],
                "anthropic": [("required", {"type": "any"}),
                              ("turn_on", {"type": "tool", "name": "turn_on"}),
                              ("none", {"type": "none"})]}
        for provider, cases in want.items():
            for choice, sent in cases:
                with self.subTest(provider=provider, choice=choice):
                    with FakeLLM() as fake:
                        run = self.run_ok([{"text": "hello"}], provider_options(
                            fake, provider, tool_choice=choice), tools="demo")
                        reqs = llm_requests(fake, provider)
                    line = self.assertTurnOk(run.by_seq(1))
                    self.assertEqual(reqs[0]["body"]["tool_choice"], sent)
                    if choice != "none":  # forced once, then the model answers
                        self.assertEqual(line["steps"][0]["type"], "tool_call")
                        self.assertNotIn("tool_choice", reqs[1]["body"])

    def test_ollama_none_offers_no_tools_and_forcing_is_refused(self):
        with FakeLLM() as fake:
            run = self.run_ok([{"text": "turn on the kitchen light"}],
                              provider_options(fake, "ollama", tool_choice="none"), tools="demo")
            self.assertTurnOk(run.by_seq(1))
            self.assertNotIn("tools", llm_requests(fake, "ollama")[0]["body"])
            bad = run_bad_options(provider_options(fake, "ollama", tool_choice="required"))
            self.assertIn("provider ollama cannot force a tool call", bad)
            bad = run_bad_options(options(fake, tool_choice="no_such_tool"))
            self.assertIn("option 'tool_choice'", bad)

    def test_a_persona_without_the_tool_refuses_its_turns(self):
        tools = [{"name": "turn_on", "parameters": {"type": "object"}},
                 {"name": "get_state", "parameters": {"type": "object"}}]
        with FakeLLM() as fake:
            opts = options(fake, tools=tools, tool_choice="turn_on",
                           personas={"reader": {"prompt": "Only read.", "tools": ["get_state"]}})
            run = self.run_ok([{"text": "hi", "persona": "reader"}], opts)
        line = self.assertTurnError(run.by_seq(1), "invalid_input")
        self.assertIn("option 'tool_choice' names the tool 'turn_on'", line["error"]["message"])

    def test_extra_body_names_the_option(self):
        with FakeLLM() as fake:
            bad = run_bad_options(options(fake, extra_body={"tool_choice": "auto"}))
        self.assertIn("set it with the option 'tool_choice'", bad)


def run_bad_options(opts):
    from harness import run_shim
    run = run_shim([{"text": "x"}], opts)
    return run.stderr


class CutShort(ParleyTestCase):
    """finish_reason "length": max_tokens, or the end of the context window?"""

    def logs(self, provider, text, **kw):
        with FakeLLM() as fake:
            run = self.run_ok([{"text": text}], provider_options(fake, provider, **kw),
                              extra_args=("--log-level", "warn"))
        return run.by_seq(1), run.stderr

    def test_context_window_is_not_called_max_tokens(self):
        for provider in PROVIDERS:
            with self.subTest(provider=provider):
                line, log = self.logs(provider, "hi [[ctx-full]]", max_tokens=500)
                self.assertEqual(line["stop_reason"], "length")
                self.assertIn("the end of the model's context window cut the answer", log)
                self.assertNotIn("hit max_tokens", log)
                line, log = self.logs(provider, "hi [[length]]", max_tokens=500)
                self.assertIn("the model hit max_tokens (500)", log)


if __name__ == "__main__":
    unittest.main()
