"""The three providers end to end: Chat Completions, Anthropic Messages, Ollama /api/chat.

The fake LLM speaks each dialect and validates it strictly (tests/fake-llm/README.md), so a
request that would be refused by the real API fails these tests.  Shapes checked here follow
the published references:
  Anthropic Messages: https://docs.anthropic.com/en/api/messages
    streaming:        https://docs.anthropic.com/en/docs/build-with-claude/streaming
    thinking:         https://docs.anthropic.com/en/docs/build-with-claude/extended-thinking
    prompt caching:   https://docs.anthropic.com/en/docs/build-with-claude/prompt-caching
  Ollama /api/chat:   https://github.com/ollama/ollama/blob/main/docs/api.md#generate-a-chat-completion
  Chat Completions:   https://platform.openai.com/docs/api-reference/chat/create
"""
import json
import os
import shutil
import sqlite3
import subprocess
import tempfile
import unittest
import urllib.error
import urllib.request

from harness import BUILD, PLUGIN, SHIM, FakeLLM, ParleyTestCase, options, run_shim

RENDER = os.path.join(BUILD, "tests", "parley-render")
PROVIDERS = ("openai", "anthropic", "ollama")
PATHS = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages", "ollama": "/api/chat"}
TOOL_TEXT = '[[tool:turn_on {"name":"kitchen"}]]'
DEMO_RESULT = '{"ok":true,"name":"kitchen","state":"on"}'


def provider_options(fake, provider, **kw):
    base = fake.base_url if provider == "openai" else "http://127.0.0.1:%d" % fake.port
    return options(fake, provider=provider, base_url=base, **kw)


def llm_requests(fake, provider):
    return [r for r in fake.requests() if r.get("path") == PATHS[provider]]


class ProviderCase(ParleyTestCase):

    def history(self, run, seq):
        line = run.by_seq(seq)
        self.assertIsNone(line["error"], line)
        return line["result"]

    def tool_conversation(self, provider, stream, lines=None, **kw):
        """A tool turn then a plain one; returns (run, requests)."""
        lines = lines or [{"text": TOOL_TEXT, "conversation_id": "c"},
                          {"text": "thanks [[ask]]", "conversation_id": "c"},
                          {"op": "history", "conversation_id": "c"}]
        with FakeLLM() as fake:
            run = self.run_ok(lines, provider_options(fake, provider, stream=stream, **kw),
                              tools="demo")
            return run, llm_requests(fake, provider)


class ToolTurns(ProviderCase):
    """Each provider holds a full tool conversation, streamed or not, with the same history."""

    def check_provider(self, provider):
        histories = []
        for stream in (False, True):
            run, reqs = self.tool_conversation(provider, stream)
            first = self.assertTurnOk(run.by_seq(1))
            self.assertEqual(first["response"], "Done. turn_on: %s (messages: 4)" % DEMO_RESULT)
            self.assertEqual([s["type"] for s in first["steps"]],
                             ["tool_call", "tool_result", "answer"])
            self.assertEqual(first["stop_reason"], "stop")
            self.assertEqual(first["usage"]["requests"], 2)
            self.assertGreater(first["usage"]["prompt_tokens"], 0)
            self.assertGreater(first["usage"]["completion_tokens"], 0)
            second = self.assertTurnOk(run.by_seq(2))
            self.assertTrue(second["response"].endswith("Anything else?"), second)
            self.assertTrue(second["continue_conversation"])
            if stream:
                self.assertEqual(first["streamed"], first["response"])
                self.assertEqual(second["streamed"], second["response"])
            else:
                self.assertNotIn("deltas", first)
            self.assertEqual(len(reqs), 3, [r["path"] for r in reqs])
            self.assertTrue(all(r["status"] == 200 for r in reqs), reqs)
            hist = self.history(run, 3)
            histories.append([t["messages"] for t in hist["turns"]])
        self.assertEqual(histories[0], histories[1], "streamed and whole replies store the same")
        turn1 = histories[0][0]
        self.assertEqual([m["role"] for m in turn1], ["user", "assistant", "tool", "assistant"])
        self.assertEqual(turn1[2]["name"], "turn_on")
        self.assertEqual(turn1[2]["tool_call_id"], turn1[1]["tool_calls"][0]["id"])
        return reqs, histories[0]

    def test_openai(self):
        reqs, _ = self.check_provider("openai")
        body = reqs[1]["body"]
        self.assertEqual(body["messages"][2]["tool_calls"][0]["function"]["arguments"],
                         '{"name":"kitchen"}')
        self.assertEqual(body["messages"][3], {"role": "tool", "tool_call_id": "call_1_0",
                                               "content": DEMO_RESULT})

    def test_anthropic(self):
        reqs, hist = self.check_provider("anthropic")
        first, second = reqs[0]["body"], reqs[1]["body"]
        self.assertEqual(first["max_tokens"], 1024, "required; the provider's default")
        self.assertEqual(first["system"], [{"type": "text", "text": "You are a test assistant.",
                                            "cache_control": {"type": "ephemeral"}}])
        self.assertNotIn("system", [m["role"] for m in first["messages"]])
        tools = first["tools"]
        self.assertTrue(all("input_schema" in t and "name" in t for t in tools), tools)
        self.assertEqual(tools[-1]["cache_control"], {"type": "ephemeral"})
        self.assertTrue(all("cache_control" not in t for t in tools[:-1]))
        self.assertEqual([m["role"] for m in second["messages"]], ["user", "assistant", "user"])
        use = second["messages"][1]["content"][0]
        self.assertEqual(use["type"], "tool_use")
        self.assertEqual(use["input"], {"name": "kitchen"})
        self.assertEqual(second["messages"][2]["content"],
                         [{"type": "tool_result", "tool_use_id": use["id"],
                           "content": DEMO_RESULT,  # the request's end: the moving breakpoint
                           "cache_control": {"type": "ephemeral"}}])
        self.assertEqual(reqs[0]["authorization"], None)

    def test_ollama(self):
        reqs, hist = self.check_provider("ollama")
        first, second = reqs[0]["body"], reqs[1]["body"]
        self.assertIs(first["stream"], True)  # the streamed run's requests
        self.assertEqual(first["options"], {"num_ctx": 8192})
        call = second["messages"][2]["tool_calls"][0]
        self.assertEqual(call, {"function": {"name": "turn_on", "arguments": {"name": "kitchen"}}})
        self.assertEqual(second["messages"][3], {"role": "tool", "content": DEMO_RESULT,
                                                 "tool_name": "turn_on"})
        # Ollama gives no ids: Parley names calls by their place in the conversation.
        self.assertEqual(hist[0][1]["tool_calls"][0]["id"], "call_1_0")

    def test_two_rounds_and_failures_anthropic(self):
        """Two calls in one answer and an error result: one user message of tool_result
        blocks, is_error on the failure."""
        lines = [{"text": '[[tool:turn_on {"name":"kitchen"}]] [[tool:no_such_tool {}]]',
                  "conversation_id": "c"}]
        run, reqs = self.tool_conversation("anthropic", False, lines)
        self.assertTurnOk(run.by_seq(1))
        results = reqs[1]["body"]["messages"][2]["content"]
        self.assertEqual([b["type"] for b in results], ["tool_result", "tool_result"])
        self.assertNotIn("is_error", results[0])
        self.assertIs(results[1]["is_error"], True)

    def test_anthropic_extra_prompt_after_the_cached_blocks(self):
        # The system prompt is top-level only: the turn's extra prompt is a text block of
        # its own after the user's, and the moving breakpoint stays on the user's block
        # (what the next turn repeats; the extra prompt is not stored).
        lines = [{"text": "hi", "extra_system_prompt": "The user is in the kitchen."}]
        with FakeLLM() as fake:
            run = self.run_ok(lines, provider_options(fake, "anthropic"))
            self.assertTurnOk(run.by_seq(1))
            body = llm_requests(fake, "anthropic")[0]["body"]
            self.assertEqual(body["system"], [{"type": "text", "text": "You are a test assistant.",
                                               "cache_control": {"type": "ephemeral"}}])
            eph = {"type": "ephemeral"}
            self.assertEqual(body["messages"], [{"role": "user", "content": [
                {"type": "text", "text": "hi", "cache_control": eph},
                {"type": "text", "text": "[Instructions for this turn, from the system, not from "
                                         "the user]\nThe user is in the kitchen.",
                 "cache_control": eph}]}])

    def test_anthropic_key_and_max_tokens(self):
        with FakeLLM() as fake:
            opts = provider_options(fake, "anthropic", api_key="sk-ant-test", max_tokens=300)
            run = self.run_ok([{"text": "hi"}], opts)
            self.assertTurnOk(run.by_seq(1))
            req = llm_requests(fake, "anthropic")[0]
            self.assertEqual(req["authorization"], "x-api-key sk-ant-test")
            self.assertEqual(req["body"]["max_tokens"], 300)

    def test_ollama_knobs(self):
        with FakeLLM() as fake:
            opts = provider_options(fake, "ollama", keep_alive="30m", num_ctx=16384, think=False,
                                    temperature=0.5, max_tokens=64, extra_body={"format": ""})
            run = self.run_ok([{"text": "hi"}], opts)
            self.assertTurnOk(run.by_seq(1))
            body = llm_requests(fake, "ollama")[0]["body"]
            self.assertIs(body["stream"], False, "Ollama streams unless told not to")
            self.assertEqual(body["keep_alive"], "30m")
            self.assertIs(body["think"], False)
            self.assertEqual(body["options"], {"temperature": 0.5, "num_predict": 64,
                                               "num_ctx": 16384})
            self.assertEqual(body["format"], "")


class DuplicateCallIds(ProviderCase):
    """A model that repeats a call id, or names one call and not the next (Parley filled the
    empty id with "call_<position>", the same "call_1"): ids are made unique in the turn before
    anything is sent or stored, so no later request is refused ("Duplicate tool call id")."""

    CALLS = '[[tool:turn_on {"name":"kitchen"}]] [[tool:turn_off {"name":"hall"}]] '

    def check(self, provider, stream, ids):
        lines = [{"text": self.CALLS + "[[call-ids:%s]]" % ids, "conversation_id": "c"},
                 {"text": "thanks", "conversation_id": "c"},
                 {"op": "history", "conversation_id": "c"}]
        run, reqs = self.tool_conversation(provider, stream, lines)
        first = self.assertTurnOk(run.by_seq(1))
        self.assertTurnOk(run.by_seq(2))
        self.assertTrue(all(r["status"] == 200 for r in reqs), reqs)
        msgs = self.history(run, 3)["turns"][0]["messages"]
        call_ids = [c["id"] for c in msgs[1]["tool_calls"]]
        self.assertEqual(len(set(call_ids)), 2, call_ids)
        self.assertNotIn("", call_ids)
        if provider != "ollama" or "" not in ids.split(","):
            self.assertEqual(call_ids[0], "call_1", "the model's first id is kept")
        else:  # an Ollama reply with a call unnamed: Parley names them all by position
            self.assertEqual(call_ids, ["call_1_0", "call_1_1"])
        self.assertEqual([m["tool_call_id"] for m in msgs[2:4]], call_ids)
        self.assertEqual([s["call_id"] for s in first["steps"] if s["type"] == "tool_call"],
                         call_ids)

    def test_every_provider_streamed_or_not(self):
        for provider in PROVIDERS:
            for stream in (False, True):
                for ids in ("call_1,call_1", "call_1,"):
                    with self.subTest(provider=provider, stream=stream, ids=ids):
                        self.check(provider, stream, ids)

    def test_unique_across_the_rounds_of_a_turn(self):
        """A model that names every call "call_1", round after round."""
        lines = [{"text": "[[fault:endless_tools]] [[call-ids:call_1]]", "conversation_id": "c"},
                 {"op": "history", "conversation_id": "c"}]
        for provider in PROVIDERS:
            with self.subTest(provider=provider):
                run, _ = self.tool_conversation(provider, False, lines, max_tool_iterations=3)
                self.assertTurnOk(run.by_seq(1))
                msgs = self.history(run, 2)["turns"][0]["messages"]
                ids = [c["id"] for m in msgs for c in m.get("tool_calls", [])]
                self.assertEqual(len(ids), 3, msgs)
                self.assertEqual(len(set(ids)), 3, ids)


class LegacyDuplicateIds(ProviderCase):
    """A history an older Parley stored with one call id twice in an assistant message (and the
    results answering both with it) is sent with the second call and its result renamed, so the
    conversation goes on under every provider; the stored text stays as it was."""

    def test_poisoned_history_goes_on(self):
        with tempfile.TemporaryDirectory(prefix="parley-legacy-") as d, FakeLLM() as fake:
            path = os.path.join(d, "history.db")
            text = '[[tool:turn_on {"name":"kitchen"}]] [[tool:turn_off {"name":"hall"}]]'
            run = self.run_ok([{"text": text, "conversation_id": "c"}],
                              provider_options(fake, "openai", history_store="sqlite:" + path),
                              tools="demo")
            self.assertTurnOk(run.by_seq(1))
            db = sqlite3.connect(path)
            with db:  # what an older Parley stored for "call_1" and ""
                for row, js in db.execute("SELECT id, json FROM messages ORDER BY id").fetchall():
                    m = json.loads(js)
                    for c in m.get("tool_calls", []):
                        c["id"] = "call_1"
                    if "tool_call_id" in m:
                        m["tool_call_id"] = "call_1"
                    db.execute("UPDATE messages SET json = ? WHERE id = ?",
                               (json.dumps(m, separators=(",", ":")), row))
            db.close()
            for provider in PROVIDERS:
                for stream in (False, True):
                    with self.subTest(provider=provider, stream=stream):
                        copy = os.path.join(d, "%s-%d.db" % (provider, stream))
                        shutil.copyfile(path, copy)  # each from the same poisoned history
                        run = self.run_ok([{"text": "and now? [[ask]]", "conversation_id": "c"},
                                           {"op": "history", "conversation_id": "c"}],
                                          provider_options(fake, provider, stream=stream,
                                                           history_store="sqlite:" + copy),
                                          tools="demo")
                        self.assertTurnOk(run.by_seq(1))
                        body = llm_requests(fake, provider)[-1]["body"]
                        sent = json.dumps(body)
                        if provider != "ollama":
                            self.assertIn('"call_1_2"', sent)
                        # the stored text is unchanged: the renames live in requests only
                        first = self.history(run, 2)["turns"][0]["messages"]
                        self.assertEqual([c["id"] for c in first[1]["tool_calls"]],
                                         ["call_1", "call_1"])


class ManyToolCalls(ProviderCase):
    """One limit on the tool calls of one answer, the same streamed or not, on every provider:
    129 work (a stream used to stop at 128), 1024 is the most, 1025 is a bad response."""

    def turn(self, provider, stream, n):
        lines = [{"text": "[[tool:no_such_tool {}]]" * n, "conversation_id": "c"}]
        with FakeLLM() as fake:
            run = self.run_ok(lines, provider_options(fake, provider, stream=stream),
                              tools="demo")
        return run.by_seq(1)

    def test_same_both_ways(self):
        for provider in PROVIDERS:
            for stream in (False, True):
                with self.subTest(provider=provider, stream=stream):
                    res = self.assertTurnOk(self.turn(provider, stream, 129))
                    self.assertEqual(sum(s["type"] == "tool_call" for s in res["steps"]), 129)
                    res = self.turn(provider, stream, 1025)
                    self.assertTurnError(res, "bad_response")
                    self.assertIn("the answer has more than 1024 tool calls",
                                  res["error"]["message"])


class Reasoning(ProviderCase):
    """Reasoning never reaches response or on_delta; it is a step, stored, and sent back
    with the tool calls of its turn in each provider's form."""

    THOUGHT = "the user wants light"

    def think_turn(self, provider, stream):
        lines = [{"text": "[[think:%s]] %s" % (self.THOUGHT, TOOL_TEXT), "conversation_id": "c"},
                 {"op": "history", "conversation_id": "c"}]
        kw = {"thinking_budget_tokens": 2048} if provider == "anthropic" else {}
        if provider == "ollama":
            kw["think"] = True
        return self.tool_conversation(provider, stream, lines, **kw)

    def check(self, provider):
        stored = []
        for stream in (False, True):
            run, reqs = self.think_turn(provider, stream)
            res = self.assertTurnOk(run.by_seq(1))
            self.assertNotIn(self.THOUGHT, res["response"])
            self.assertNotIn(self.THOUGHT, res.get("streamed", ""))
            self.assertEqual(res["steps"][0], {"type": "reasoning", "content": self.THOUGHT})
            if stream:
                self.assertIn(self.THOUGHT, res["reasoning_streamed"])
            msgs = self.history(run, 2)["turns"][0]["messages"]
            self.assertEqual(msgs[1]["reasoning"], self.THOUGHT)
            stored.append(msgs)
        self.assertEqual(stored[0], stored[1])
        return reqs, stored[0]

    def test_openai_reasoning_content_sent_back(self):
        reqs, msgs = self.check("openai")
        # DeepSeek's rule (the fake enforces it): back with the tool calls of the turn.
        self.assertEqual(reqs[1]["body"]["messages"][2]["reasoning_content"], self.THOUGHT)
        self.assertEqual(msgs[1]["provider_data"],
                         {"openai": {"reasoning_field": "reasoning_content"}})

    def test_anthropic_thinking_block_sent_back_unchanged(self):
        reqs, msgs = self.check("anthropic")
        self.assertEqual(reqs[0]["body"]["thinking"], {"type": "enabled", "budget_tokens": 2048})
        self.assertEqual(reqs[0]["body"]["max_tokens"], 2048 + 1024)
        block = reqs[1]["body"]["messages"][1]["content"][0]
        self.assertEqual(block["type"], "thinking")
        self.assertEqual(block["thinking"], self.THOUGHT)
        self.assertTrue(block["signature"].startswith("sig-"))
        self.assertEqual(msgs[1]["provider_data"]["anthropic"]["thinking"], [block])

    def test_ollama_thinking_sent_back(self):
        reqs, _ = self.check("ollama")
        self.assertIs(reqs[0]["body"]["think"], True)
        self.assertEqual(reqs[1]["body"]["messages"][2]["thinking"], self.THOUGHT)

    def test_reasoning_not_resent_in_later_turns(self):
        lines = [{"text": "[[think:%s]] %s" % (self.THOUGHT, TOOL_TEXT), "conversation_id": "c"},
                 {"text": "next", "conversation_id": "c"}]
        run, reqs = self.tool_conversation("openai", False, lines)
        self.assertTurnOk(run.by_seq(2))
        self.assertNotIn("reasoning_content", json.dumps(reqs[-1]["body"]))

    def test_think_tags_split_off_streamed_and_not(self):
        for provider in PROVIDERS:
            for stream in (False, True):
                with self.subTest(provider=provider, stream=stream):
                    lines = [{"text": "hello [[think-tag:%s]]" % self.THOUGHT}]
                    run, _ = self.tool_conversation(provider, stream, lines)
                    res = self.assertTurnOk(run.by_seq(1))
                    self.assertTrue(res["response"].startswith('You said: "hello'), res)
                    self.assertNotIn("<think>", res["response"])
                    self.assertNotIn("<think>", res.get("streamed", ""))
                    self.assertEqual(res["steps"][0], {"type": "reasoning",
                                                       "content": self.THOUGHT})

    def test_think_tags_kept_when_asked(self):
        lines = [{"text": "hello [[think-tag:%s]]" % self.THOUGHT}]
        run, _ = self.tool_conversation("openai", True, lines, strip_think_tags=False)
        res = self.assertTurnOk(run.by_seq(1))
        self.assertTrue(res["response"].startswith("<think>%s</think>" % self.THOUGHT), res)


class Usage(ProviderCase):

    def test_anthropic_cache_reads_counted(self):
        run, _ = self.tool_conversation("anthropic", True)
        usage = self.assertTurnOk(run.by_seq(1))["usage"]
        self.assertGreater(usage["cache_read_tokens"], 0)
        self.assertGreater(usage["prompt_tokens"], usage["cache_read_tokens"])

    def test_usage_summed_in_metrics(self):
        for provider in PROVIDERS:
            with self.subTest(provider=provider):
                lines = [{"text": TOOL_TEXT}, {"op": "metrics"}]
                run, _ = self.tool_conversation(provider, False, lines)
                usage = self.assertTurnOk(run.by_seq(1))["usage"]
                metrics = run.by_seq(2)["result"]
                self.assertEqual(metrics["tokens_prompt"], usage["prompt_tokens"])
                self.assertEqual(metrics["tokens_completion"], usage["completion_tokens"])


class IterationLimit(ProviderCase):

    def test_last_round_answers_in_text(self):
        """After max_tool_iterations the last request forbids tools in each API's way:
        tool_choice none (openai), {"type": "none"} (anthropic), no tools (ollama)."""
        for provider in PROVIDERS:
            with self.subTest(provider=provider):
                lines = [{"text": "loop [[fault:endless_tools]]", "conversation_id": "c"}]
                run, reqs = self.tool_conversation(provider, False, lines,
                                                   max_tool_iterations=1)
                res = self.assertTurnOk(run.by_seq(1))
                self.assertEqual([s["type"] for s in res["steps"]],
                                 ["tool_call", "tool_result", "answer"])
                self.assertEqual(len(reqs), 2)
                last = reqs[-1]["body"]
                if provider == "openai":
                    self.assertEqual(last["tool_choice"], "none")
                elif provider == "anthropic":
                    self.assertEqual(last["tool_choice"], {"type": "none"})
                else:
                    self.assertNotIn("tools", last)


class StopReason(ProviderCase):

    def test_cut_short_is_surfaced(self):
        for provider in PROVIDERS:
            for stream in (False, True):
                with self.subTest(provider=provider, stream=stream):
                    lines = [{"text": "tell me a story [[length]]"}, {"op": "metrics"}]
                    run, _ = self.tool_conversation(provider, stream, lines)
                    res = self.assertTurnOk(run.by_seq(1))
                    self.assertEqual(res["stop_reason"], "length")
                    self.assertEqual(run.by_seq(2)["result"]["answers_cut_short"], 1)


class ChatCompletionsDetails(ProviderCase):

    def one_request(self, **kw):
        with FakeLLM() as fake:
            run = self.run_ok([{"text": "hi"}], provider_options(fake, "openai", **kw))
            self.assertTurnOk(run.by_seq(1))
            return llm_requests(fake, "openai")[0]["body"]

    def test_max_completion_tokens(self):
        body = self.one_request(max_tokens=50, max_tokens_field="max_completion_tokens")
        self.assertEqual(body["max_completion_tokens"], 50)
        self.assertNotIn("max_tokens", body)

    def test_reasoning_effort_and_extra_body(self):
        body = self.one_request(reasoning_effort="low",
                                extra_body={"top_k": 20, "chat_template_kwargs": {"x": True}})
        self.assertEqual(body["reasoning_effort"], "low")
        self.assertEqual(body["top_k"], 20)
        self.assertEqual(body["chat_template_kwargs"], {"x": True})

    def test_extra_body_key_parley_sends_is_rejected(self):
        run = run_shim([{"text": "hi"}], options(None, extra_body={"stream": True}))
        self.assertNotEqual(run.rc, 0)
        self.assertIn("option 'extra_body': key 'stream' is one Parley sends itself", run.stderr)

    def test_usage_requested_when_streaming(self):
        body = self.one_request(stream=True)
        self.assertEqual(body["stream_options"], {"include_usage": True})


class ProviderSwitch(ProviderCase):
    """A conversation recorded under one provider continues under another: its stored
    messages, rendered by the other codec, pass that API's validation."""

    def render(self, fake, provider, msgs, **kw):
        with tempfile.TemporaryDirectory() as d:
            opts_path, msgs_path = os.path.join(d, "o.json"), os.path.join(d, "m.json")
            opts = provider_options(fake, provider, **kw)
            opts["tools"] = [{"name": "turn_on", "parameters": {"type": "object"}}]
            with open(opts_path, "w") as f:
                json.dump(opts, f)
            with open(msgs_path, "w") as f:
                json.dump(msgs, f)
            out = subprocess.run([RENDER, opts_path, msgs_path], capture_output=True, text=True)
            self.assertEqual(out.returncode, 0, out.stderr)
            return out.stdout

    def post(self, fake, provider, body):
        req = urllib.request.Request("http://127.0.0.1:%d%s" % (fake.port, PATHS[provider]),
                                     data=body.encode(), method="POST",
                                     headers={"Content-Type": "application/json",
                                              "anthropic-version": "2023-06-01"})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def recorded(self, provider):
        lines = [{"text": "[[think:pondering]] " + TOOL_TEXT, "conversation_id": "c"},
                 {"op": "history", "conversation_id": "c"}]
        kw = {"thinking_budget_tokens": 2048} if provider == "anthropic" else {"think": True}
        if provider == "openai":
            kw = {}
        run, _ = self.tool_conversation(provider, False, lines, **kw)
        return self.history(run, 2)["turns"][0]["messages"]

    def test_live_switch_with_update_options(self):
        """The same agent, history kept: a tool turn under anthropic, then openai, then ollama."""
        with FakeLLM() as fake:
            base = provider_options(fake, "anthropic")
            lines = [{"text": "[[think:hmm]] " + TOOL_TEXT, "conversation_id": "c"},
                     {"op": "wait"},
                     {"op": "update_options", "options": provider_options(fake, "openai")},
                     {"text": "and now? [[recall]]", "conversation_id": "c"},
                     {"op": "wait"},
                     {"op": "update_options", "options": provider_options(fake, "ollama")},
                     {"text": TOOL_TEXT, "conversation_id": "c"},
                     {"op": "history", "conversation_id": "c"}]
            run = self.run_ok(lines, base, tools="demo")
            for seq in (1, 4, 7):
                self.assertTurnOk(run.by_seq(seq))
            self.assertIn("I have seen 6 messages (2 from you)", run.by_seq(4)["response"])
            paths = [r["path"] for r in fake.requests()
                     if r["path"] in PATHS.values()]
            self.assertEqual(paths, ["/v1/messages"] * 2 + ["/v1/chat/completions"] +
                             ["/api/chat"] * 2)
            turns = run.by_seq(8)["result"]["turns"]
            self.assertEqual(len(turns), 3)

    def test_every_provider_continues_every_other(self):
        with FakeLLM() as fake:
            for source in PROVIDERS:
                msgs = self.recorded(source) + [{"role": "user", "content": "and the hall?"}]
                for target in PROVIDERS:
                    with self.subTest(source=source, target=target):
                        body = self.render(fake, target, msgs, stream=False)
                        status, text = self.post(fake, target, body)
                        self.assertEqual(status, 200, text)
                        self.assertIn("I have seen 6 messages (2 from you)", text)

    def test_messages_stored_by_0_1_render_everywhere(self):
        """Plain Chat Completions records (no name on tool messages) still render."""
        msgs = [{"role": "user", "content": "turn on the kitchen light"},
                {"role": "assistant", "content": None,
                 "tool_calls": [{"id": "call_1", "type": "function",
                                 "function": {"name": "turn_on",
                                              "arguments": "{\"name\":\"kitchen\"}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "{\"ok\":true}"},
                {"role": "assistant", "content": "Done."},
                {"role": "user", "content": "thanks"}]
        with FakeLLM() as fake:
            for target in PROVIDERS:
                with self.subTest(target=target):
                    body = self.render(fake, target, msgs)
                    if target == "ollama":
                        self.assertIn('"tool_name":"turn_on"', body)
                    status, text = self.post(fake, target, body)
                    self.assertEqual(status, 200, text)


class ConnectionCheck(ProviderCase):

    def test_each_provider_lists_models(self):
        for provider in PROVIDERS:
            with self.subTest(provider=provider):
                with FakeLLM() as fake, tempfile.TemporaryDirectory() as d:
                    path = os.path.join(d, "o.json")
                    with open(path, "w") as f:
                        json.dump(provider_options(fake, provider, api_key="k"), f)
                    out = subprocess.run([SHIM, "--plugin", PLUGIN, "--options", path, "--check"],
                                         capture_output=True, text=True, timeout=60)
                    self.assertEqual(out.returncode, 0, out.stderr)
                    self.assertEqual(json.loads(out.stdout)["models"], ["fake-model"])
                    req = fake.requests()[-1]
                    want = {"openai": "/v1/models", "anthropic": "/v1/models",
                            "ollama": "/api/tags"}[provider]
                    self.assertEqual(req["path"], want)
                    self.assertEqual(req["authorization"],
                                     "x-api-key k" if provider == "anthropic" else "Bearer k")


class Errors(ProviderCase):

    def test_anthropic_overloaded_529_is_retried(self):
        lines = [{"text": "hi [[fault:529x1]]"}]
        with FakeLLM() as fake:
            run = self.run_ok(lines, provider_options(fake, "anthropic", max_retries=2))
            self.assertTurnOk(run.by_seq(1))
            self.assertEqual([r["status"] for r in llm_requests(fake, "anthropic")], [529, 200])

    def test_insufficient_quota_is_not_retried(self):
        with FakeLLM() as fake:
            run = self.run_ok([{"text": "hi [[quota]]"}],
                              provider_options(fake, "openai", max_retries=3))
            err = self.assertTurnError(run.by_seq(1), "rate_limited")["error"]
            self.assertIn("You exceeded your current quota", err["message"])
            self.assertEqual(len(llm_requests(fake, "openai")), 1, "retrying cannot help")

    def test_rate_limit_is_still_retried(self):
        with FakeLLM() as fake:
            run = self.run_ok([{"text": "hi [[fault:429x1]]"}],
                              provider_options(fake, "openai", max_retries=2))
            self.assertTurnOk(run.by_seq(1))
            self.assertEqual([r["status"] for r in llm_requests(fake, "openai")], [429, 200])

    def test_404_hint_follows_the_provider(self):
        hints = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages",
                 "ollama": "/api/chat"}
        for provider in PROVIDERS:
            with self.subTest(provider=provider):
                with FakeLLM() as fake:
                    opts = provider_options(fake, provider)
                    opts["base_url"] = "http://127.0.0.1:%d/wrong" % fake.port
                    run = self.run_ok([{"text": "hi"}], opts)
                    msg = self.assertTurnError(run.by_seq(1), "http_status")["error"]["message"]
                    self.assertIn("HTTP 404 for http://127.0.0.1:%d/wrong" % fake.port, msg)
                    self.assertIn("check base_url", msg)
                    self.assertIn(hints[provider], msg)

    def test_server_error_text_per_provider(self):
        for provider in PROVIDERS:
            with self.subTest(provider=provider):
                with FakeLLM() as fake:
                    run = self.run_ok([{"text": "hi [[fault:400]]"}],
                                      provider_options(fake, provider))
                    err = self.assertTurnError(run.by_seq(1), "http_status")["error"]
                    self.assertIn("LLM server answered HTTP 400: ", err["message"])


if __name__ == "__main__":
    unittest.main()
