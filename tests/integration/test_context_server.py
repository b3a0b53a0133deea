"""The fake LLM's prompt model against what real servers do, and Parley reading it.

Fidelity (tests/fake-llm/README.md, "The prompt model"): cached tokens as llama.cpp reports
them (usage.prompt_tokens_details.cached_tokens and timings {prompt_n, cache_n}; at least one
token evaluated; slots chosen by prompt similarity, else least recently used), Anthropic's
breakpoint cache (cache_control, minimum length, lookback, lifetime), OpenAI's automatic cache
(1024 tokens, then steps of 128), Ollama's prompt_eval_cached_count and its silent truncation
to num_ctx, the overflow answers in each server's shape, and the discovery endpoints
(GET /props, GET /v1/models max_model_len, POST /api/show).

Parley: a context overflow ends the turn with status context_overflow carrying the sizes
(history unchanged), and the usage it reports carries the cached and evaluated figures.
"""
import json
import time
import unittest
import urllib.error
import urllib.request

from harness import FakeLLM, ParleyTestCase, options

SYSTEM = "You are a helpful home assistant."


def post(fake, path, body, headers=None):
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (fake.port, path),
                                 data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def get(fake, path):
    with urllib.request.urlopen("http://127.0.0.1:%d%s" % (fake.port, path), timeout=10) as r:
        return json.loads(r.read())


def chat(fake, msgs, **kw):
    return post(fake, "/v1/chat/completions", {"model": "fake-model", "messages": msgs, **kw})


def anthropic(fake, body):
    return post(fake, "/v1/messages", {"model": "fake-model", "max_tokens": 100, **body},
                {"anthropic-version": "2023-06-01"})


def ollama(fake, msgs, **kw):
    return post(fake, "/api/chat", {"model": "fake-model", "messages": msgs, "stream": False,
                                    **kw})


def conversation(turns, words=30):
    """A system prompt and `turns` user/assistant exchanges, then a new user message,
    answered the way the fake answers (so each request extends the previous one)."""
    msgs = [{"role": "system", "content": SYSTEM}]
    for i in range(turns):
        text = "message %d %s" % (i, " ".join("word%d" % k for k in range(words)))
        msgs.append({"role": "user", "content": text})
        msgs.append({"role": "assistant", "content": 'You said: "%s". I have seen %d messages '
                     '(%d from you).' % (text, len(msgs), i + 1)})
    msgs.append({"role": "user", "content": "and now?"})
    return msgs


class LlamaCppCache(unittest.TestCase):

    def test_prefix_reuse_reported_as_llamacpp_does(self):
        with FakeLLM() as fake:
            msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hello"}]
            _, first = chat(fake, msgs)
            self.assertEqual(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0)
            msgs += [first["choices"][0]["message"], {"role": "user", "content": "again"}]
            _, second = chat(fake, msgs)
            u, t = second["usage"], second["timings"]
            cached = u["prompt_tokens_details"]["cached_tokens"]
            # the previous prompt and the answer generated after it are both in the slot
            self.assertGreater(cached, first["usage"]["prompt_tokens"])
            self.assertEqual(t["cache_n"], cached)
            self.assertEqual(t["prompt_n"] + t["cache_n"], u["prompt_tokens"])
            log = fake.chat_requests()
            self.assertIsNone(log[0]["extends_previous"])
            self.assertTrue(log[1]["extends_previous"])
            self.assertEqual((log[1]["slot"], log[1]["cached_tokens"], log[1]["evaluated_tokens"]),
                             (0, cached, t["prompt_n"]))
            # a changed first message: only the system prompt is reused
            msgs[1] = {"role": "user", "content": "HELLO"}
            _, third = chat(fake, msgs)
            self.assertFalse(fake.chat_requests()[2]["extends_previous"])
            self.assertLess(third["usage"]["prompt_tokens_details"]["cached_tokens"],
                            first["usage"]["prompt_tokens"])

    def test_one_token_is_always_evaluated(self):
        with FakeLLM() as fake:
            msgs = [{"role": "user", "content": "the same"}]
            chat(fake, msgs)
            _, again = chat(fake, msgs)
            self.assertEqual(again["timings"]["prompt_n"], 1)
            self.assertEqual(again["timings"]["cache_n"], again["usage"]["prompt_tokens"] - 1)

    def test_streamed_timings_on_the_last_chunk(self):
        with FakeLLM() as fake:
            req = urllib.request.Request(
                "http://127.0.0.1:%d/v1/chat/completions" % fake.port, method="POST",
                data=json.dumps({"model": "m", "stream": True,
                                 "stream_options": {"include_usage": True},
                                 "messages": [{"role": "user", "content": "hi"}]}).encode(),
                headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=10) as r:
                events = [json.loads(l[6:]) for l in r.read().decode().splitlines()
                          if l.startswith("data: {")]
            with_timings = [e for e in events if "timings" in e]
            self.assertEqual(len(with_timings), 1)
            self.assertEqual(with_timings[0]["choices"][0]["finish_reason"], "stop")
            self.assertEqual(events[-1]["usage"]["prompt_tokens"],
                             with_timings[0]["timings"]["prompt_n"])

    def test_slots(self):
        a = conversation(3)
        b = [{"role": "system", "content": "Another prompt entirely, for a second user, " * 5}] + \
            conversation(3)[1:]
        for slots, extends in ((2, True), (1, False)):
            with self.subTest(slots=slots), FakeLLM("--slots", str(slots)) as fake:
                for msgs in (a[:2], b[:2], a[:4], b[:4]):
                    chat(fake, msgs)
                log = fake.chat_requests()
                # with two slots each conversation keeps its own; with one they evict each other
                self.assertEqual([r["extends_previous"] for r in log[2:]], [extends, extends])
                if slots == 2:
                    self.assertNotEqual(log[2]["slot"], log[3]["slot"])

    def test_cache_ram(self):
        # one slot, a conversation interrupted by an unrelated request (a summary, say)
        a = conversation(3)
        other = [{"role": "user", "content": "summarize " * 50}]
        for ram, restored in (("4", True), ("0", False)):
            with self.subTest(cache_ram=ram), FakeLLM("--cache-ram", ram) as fake:
                chat(fake, a[:4])
                chat(fake, other)
                _, r = chat(fake, a[:6])
                log = fake.chat_requests()[-1]
                self.assertFalse(log["extends_previous"])  # the slot held the other prompt
                cached = r["usage"]["prompt_tokens_details"]["cached_tokens"]
                if restored:  # the conversation's prefix came back from RAM
                    self.assertGreater(cached, log["prompt_tokens"] // 2)
                else:
                    self.assertLess(cached, 10)

    def test_tokenizer_is_not_chars_over_four(self):
        with FakeLLM("--cache", "none") as fake:
            def tokens(text):
                return chat(fake, [{"role": "user", "content": text}])[1]["usage"]["prompt_tokens"]
            base = tokens("x")
            prose = "the quick brown fox jumps over the lazy dog " * 20
            self.assertLess(tokens(prose) - base, len(prose) / 4 * 1.1)
            data = json.dumps([{"entity_id": "light.kitchen_%d" % i, "state": "on"}
                               for i in range(20)])
            self.assertGreater(tokens(data) - base, len(data) / 4 * 1.5)
            umlauts = "Grüße aus München, schönes Wetter! " * 10
            self.assertGreater(tokens(umlauts) - base, len(umlauts) / 4 * 1.3)
            self.assertEqual([r["cached_tokens"] for r in fake.chat_requests()], [0] * 4)


class OtherCaches(unittest.TestCase):

    def test_anthropic_breakpoints(self):
        long_system = [{"type": "text", "text": "rule %d: be brief and kind. " % i}
                       for i in range(120)]
        long_system[-1]["cache_control"] = {"type": "ephemeral"}
        msgs = [{"role": "user", "content": "hello"}]
        with FakeLLM("--cache", "anthropic", "--cache-ttl-ms", "1500") as fake:
            _, r1 = anthropic(fake, {"system": long_system, "messages": msgs})
            _, r2 = anthropic(fake, {"system": long_system, "messages": msgs})
            self.assertGreaterEqual(r1["usage"]["cache_creation_input_tokens"], 1024)
            self.assertEqual(r1["usage"]["cache_read_input_tokens"], 0)
            self.assertEqual(r2["usage"]["cache_read_input_tokens"],
                             r1["usage"]["cache_creation_input_tokens"])
            self.assertEqual(r2["usage"]["cache_creation_input_tokens"], 0)
            total = fake.requests()[0]["prompt_tokens"]
            self.assertEqual(r1["usage"]["input_tokens"] + r1["usage"]["cache_creation_input_tokens"],
                             total)
            # a breakpoint moving with the conversation reads the older one back (lookback)
            turn = [{"role": "user", "content": "hello"},
                    {"role": "assistant", "content": "hi"},
                    {"role": "user", "content": [{"type": "text", "text": "more",
                                                  "cache_control": {"type": "ephemeral"}}]}]
            _, r3 = anthropic(fake, {"system": long_system, "messages": turn})
            self.assertEqual(r3["usage"]["cache_read_input_tokens"],
                             r2["usage"]["cache_read_input_tokens"])
            self.assertGreater(r3["usage"]["cache_creation_input_tokens"], 0)
            time.sleep(1.6)  # past the lifetime: written again
            _, r4 = anthropic(fake, {"system": long_system, "messages": msgs})
            self.assertEqual(r4["usage"]["cache_read_input_tokens"], 0)
            self.assertGreater(r4["usage"]["cache_creation_input_tokens"], 0)
            # no breakpoint, or a prefix under the minimum: nothing is cached
            _, r5 = anthropic(fake, {"system": "short", "messages": msgs})
            _, r6 = anthropic(fake, {"system": [{"type": "text", "text": "short",
                                                 "cache_control": {"type": "ephemeral"}}],
                                     "messages": msgs})
            for r in (r5, r6):
                self.assertEqual((r["usage"]["cache_read_input_tokens"],
                                  r["usage"]["cache_creation_input_tokens"]), (0, 0))

    def test_anthropic_lookback_and_limit(self):
        # platform.claude.com/docs/en/build-with-claude/prompt-caching: a breakpoint finds a
        # cached prefix at a block boundary at most 20 blocks before it; at most 4
        # breakpoints a request ("A maximum of 4 blocks with cache_control may be provided")
        eph = {"type": "ephemeral"}
        system = [{"type": "text", "text": "rule: be brief and kind. " * 250}]

        def blocks(*marked):
            return [{"role": "user", "content": [
                dict({"type": "text", "text": "part %d" % i}, **({"cache_control": eph}
                                                                if i in marked else {}))
                for i in range(30)]}]
        with FakeLLM("--cache", "anthropic") as fake:
            _, a = anthropic(fake, {"system": system, "messages": blocks(5)})
            self.assertGreater(a["usage"]["cache_creation_input_tokens"], 1024)
            _, c = anthropic(fake, {"system": system, "messages": blocks(26)})  # 21 after
            self.assertEqual(c["usage"]["cache_read_input_tokens"], 0)
            _, b = anthropic(fake, {"system": system, "messages": blocks(25)})  # 20 after
            self.assertEqual(b["usage"]["cache_read_input_tokens"],
                             a["usage"]["cache_creation_input_tokens"])
            status, e = anthropic(fake, {"system": system, "messages": blocks(1, 2, 3, 4, 5)})
            self.assertEqual(status, 400)
            self.assertEqual(e["error"]["message"],
                             "A maximum of 4 blocks with cache_control may be provided. Found 5.")
            status, _ = anthropic(fake, {"system": system, "messages": blocks(1, 2, 3, 4)})
            self.assertEqual(status, 200)

    def test_openai_automatic_steps(self):
        with FakeLLM("--cache", "openai") as fake:
            short = conversation(1)
            chat(fake, short)
            _, r = chat(fake, short)
            self.assertEqual(r["usage"]["prompt_tokens_details"]["cached_tokens"], 0)
            self.assertNotIn("timings", r)
            long = conversation(40)
            chat(fake, long[:-1] + [{"role": "user", "content": "first"}])
            _, r = chat(fake, long)
            cached = r["usage"]["prompt_tokens_details"]["cached_tokens"]
            self.assertGreaterEqual(cached, 1024)
            self.assertEqual((cached - 1024) % 128, 0)
            self.assertLess(r["usage"]["prompt_tokens"] - cached, 128 + 20)

    def test_ollama_cached_count(self):
        with FakeLLM() as fake:
            msgs = conversation(2)
            ollama(fake, msgs)
            _, r = ollama(fake, msgs)
            self.assertEqual(r["prompt_eval_cached_count"], r["prompt_eval_count"] - 1)


class Overflow(unittest.TestCase):

    def test_shapes(self):
        msgs = conversation(5)
        cases = {
            "llamacpp": lambda e: (e["error"]["type"], e["error"]["n_ctx"]) ==
                                  ("exceed_context_size_error", 100)
                                  and "exceeds the available context size (100 tokens)"
                                  in e["error"]["message"],
            "openai": lambda e: e["error"]["code"] == "context_length_exceeded" and
                                e["error"]["message"].startswith(
                                    "This model's maximum context length is 100 tokens. "
                                    "However, your messages resulted in "),
            "vllm": lambda e: e["error"]["type"] == "BadRequestError" and
                              "However, your request has " in e["error"]["message"],
        }
        for style, check in cases.items():
            with self.subTest(style=style), \
                    FakeLLM("--n-ctx", "100", "--overflow-style", style) as fake:
                status, body = chat(fake, msgs)
                self.assertEqual(status, 400)
                self.assertTrue(check(body), body)
                log = fake.chat_requests()[0]
                self.assertTrue(log["overflow"])
                self.assertGreater(log["prompt_tokens"], 100)

    def test_answer_reserve(self):
        msgs = [{"role": "user", "content": "hi"}]
        with FakeLLM("--n-ctx", "100", "--overflow-style", "vllm") as fake:
            status, body = chat(fake, msgs, max_tokens=95)
            self.assertEqual(status, 400)
            self.assertIn("'max_tokens' or 'max_completion_tokens' is too large: 95",
                          body["error"]["message"])
        with FakeLLM("--n-ctx", "100") as fake:  # llama.cpp stops at the context's end instead
            self.assertEqual(chat(fake, msgs, max_tokens=95)[0], 200)
            long = [{"role": "user", "content": "word " * 70}]  # the echo does not fit the rest
            status, r = chat(fake, long, max_tokens=1000)
            self.assertEqual(status, 200)
            self.assertEqual(r["choices"][0]["finish_reason"], "length")
            self.assertLessEqual(r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"],
                                 100)
        with FakeLLM("--n-ctx", "100") as fake:
            status, body = anthropic(fake, {"messages": msgs, "max_tokens": 95})
            self.assertEqual(status, 400)
            self.assertIn("input length and `max_tokens` exceed context limit",
                          body["error"]["message"])

    def test_honor_max_tokens(self):
        long = [{"role": "user", "content": "word " * 100}]
        with FakeLLM("--honor-max-tokens") as fake:
            _, r = chat(fake, long, max_tokens=10)
            self.assertEqual(r["choices"][0]["finish_reason"], "length")
            self.assertLessEqual(r["usage"]["completion_tokens"], 10)
            _, a = anthropic(fake, {"messages": long, "max_tokens": 10})
            self.assertEqual(a["stop_reason"], "max_tokens")
            _, o = ollama(fake, long, options={"num_predict": 10})
            self.assertEqual(o["done_reason"], "length")
            _, whole = chat(fake, long, max_tokens=1000)
            self.assertEqual(whole["choices"][0]["finish_reason"], "stop")
        with FakeLLM() as fake:  # off by default: the echo stays whole
            _, r = chat(fake, long, max_tokens=10)
            self.assertEqual(r["choices"][0]["finish_reason"], "stop")

    def test_anthropic(self):
        with FakeLLM("--n-ctx", "100") as fake:
            status, body = anthropic(fake, {"messages": [{"role": "user", "content": "x " * 300}],
                                            "max_tokens": 10})
            self.assertEqual(status, 400)
            self.assertEqual(body["type"], "error")
            self.assertEqual(body["error"]["type"], "invalid_request_error")
            self.assertRegex(body["error"]["message"], r"^prompt is too long: \d+ tokens > 100 maximum$")

    def test_ollama_truncates_silently(self):
        msgs = conversation(8)
        with FakeLLM() as fake:
            status, r = ollama(fake, msgs, options={"num_ctx": 300})
            self.assertEqual(status, 200)
            log = fake.requests()[-1]
            self.assertGreater(log["truncated_messages"], 0)
            self.assertLessEqual(r["prompt_eval_count"], 300)
            self.assertLess(r["prompt_eval_count"], log["sent_tokens"])
            # the model saw fewer messages: the system prompt and the last message kept
            seen = int(r["message"]["content"].split("I have seen ")[1].split(" ")[0])
            self.assertLess(seen, len(msgs))
            self.assertTrue(r["message"]["content"].startswith('You said: "and now?"'))
            # however small the window, the system prompt and the last message stay
            _, tiny = ollama(fake, msgs, options={"num_ctx": 5})
            self.assertTrue(tiny["message"]["content"].startswith(
                'You said: "and now?". I have seen 2 messages'), tiny)
            _, echo = ollama(fake, msgs[:-1] + [{"role": "user", "content": "[[echo-system]]"}],
                             options={"num_ctx": 300})
            self.assertEqual(echo["message"]["content"], SYSTEM)


class Discovery(unittest.TestCase):

    def test_endpoints(self):
        with FakeLLM("--n-ctx", "16384", "--slots", "2") as fake:
            props = get(fake, "/props")
            self.assertEqual(props["default_generation_settings"]["n_ctx"], 16384)
            self.assertEqual(props["total_slots"], 2)
            self.assertEqual(get(fake, "/v1/models")["data"][0]["max_model_len"], 16384)
            status, show = post(fake, "/api/show", {"model": "fake-model"})
            self.assertEqual(status, 200)
            self.assertEqual(show["model_info"]["fake.context_length"], 16384)
            self.assertRegex(show["parameters"], r"(^|\n)num_ctx +16384")
            self.assertEqual(post(fake, "/api/show", {"model": "nope"})[0], 404)
        with FakeLLM() as fake:  # unlimited: nothing to say
            self.assertNotIn("max_model_len", get(fake, "/v1/models")["data"][0])
            self.assertNotIn("fake.context_length",
                             post(fake, "/api/show", {"model": "fake-model"})[1]["model_info"])


class ParleyReads(ParleyTestCase):
    """What the plugin makes of it, through the shim."""

    def overflow_turn(self, fake_args, provider="openai"):
        with FakeLLM(*fake_args) as fake:
            base = fake.base_url if provider == "openai" else "http://127.0.0.1:%d" % fake.port
            opts = options(fake, provider=provider, base_url=base, max_tokens=900)
            run = self.run_ok([{"text": "hello " * 200, "conversation_id": "c"},
                               {"op": "history", "conversation_id": "c"}], opts)
            return run

    def test_overflow_is_its_own_status(self):
        cases = ((("--n-ctx", "200"), "openai"),
                 (("--n-ctx", "200", "--overflow-style", "openai"), "openai"),
                 (("--n-ctx", "200", "--overflow-style", "vllm"), "openai"),
                 (("--n-ctx", "200"), "anthropic"),
                 (("--n-ctx", "1040"), "anthropic"))  # fits, but max_tokens does not
        for args, provider in cases:
            with self.subTest(args=args, provider=provider):
                run = self.overflow_turn(args, provider)
                line = self.assertTurnError(run.by_seq(1), "context_overflow")
                self.assertRegex(line["error"]["message"],
                                 r"does not fit the model's context window \(\d+ tokens > %s\)"
                                 % args[1])
                history = run.by_seq(2)
                self.assertTrue((history.get("error") or {}).get("code") == "not_found" or
                                history["result"]["turns"] == [], history)

    def test_overflow_inside_a_stream(self):
        # llama.cpp before October 2025: HTTP 200, then "error: {...}" (the fake's llamacpp-old)
        with FakeLLM("--n-ctx", "200", "--overflow-style", "llamacpp-old") as fake:
            opts = options(fake, stream=True, max_tokens=10)
            run = self.run_ok([{"text": "hello " * 200, "conversation_id": "c"}], opts)
            line = self.assertTurnError(run.by_seq(1), "context_overflow")
            self.assertRegex(line["error"]["message"],
                             r"context window \(\d+ tokens > 200\): .*exceeds the available")
            self.assertEqual(fake.chat_requests()[0]["status"], 200)

    def test_other_400_stays_http_status(self):
        with FakeLLM() as fake:
            run = self.run_ok([{"text": "hi [[fault:400]]"}], options(fake))
            self.assertTurnError(run.by_seq(1), "http_status")

    def test_usage_carries_cached_and_evaluated(self):
        for provider in ("openai", "ollama", "anthropic"):
            with self.subTest(provider=provider), FakeLLM() as fake:
                base = fake.base_url if provider == "openai" else "http://127.0.0.1:%d" % fake.port
                run = self.run_ok([{"text": "hello", "conversation_id": "c"},
                                   {"text": "again", "conversation_id": "c"},
                                   {"op": "metrics"}],
                                  options(fake, provider=provider, base_url=base))
                u = self.assertTurnOk(run.by_seq(2))["usage"]
                first = run.by_seq(1)["usage"]
                self.assertEqual(run.by_seq(3)["result"]["tokens_prompt_evaluated"],
                                 first["prompt_tokens_evaluated"] + u["prompt_tokens_evaluated"])
                log = fake.requests()[-1]
                self.assertEqual(u["prompt_tokens"], log["prompt_tokens"])
                self.assertEqual(u["cache_read_tokens"], log["cached_tokens"])
                self.assertGreater(u["cache_read_tokens"], 0)
                self.assertEqual(u["prompt_tokens_evaluated"], log["evaluated_tokens"])


if __name__ == "__main__":
    unittest.main()
