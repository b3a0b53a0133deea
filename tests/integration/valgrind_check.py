"""One end-to-end run of parley-host + parley.so under valgrind memcheck.

Run by scripts/test.sh (not by ctest: valgrind is slow).  It fails on any
memory error and on any definitely/indirectly lost block, across a session
that exercises every path of a turn: plain, multi-turn history, tools (with a
host error and an unknown tool), streaming, a server error, a cancel, and
history ops.
"""
import json
import os
import subprocess
import tempfile
import unittest

from harness import FAKE, PLUGIN, SHIM, SLOW, FakeLLM, options


class Valgrind(unittest.TestCase):
    def run_under_valgrind(self, opts, lines, tools=None):
        with tempfile.TemporaryDirectory() as d:
            opt_path = os.path.join(d, "o.json")
            with open(opt_path, "w") as f:
                json.dump(opts, f)
            log = os.path.join(d, "vg.log")
            args = ["valgrind", "--error-exitcode=99", "--leak-check=full",
                    "--errors-for-leak-kinds=definite,indirect", "--show-leak-kinds=definite,indirect",
                    "--log-file=" + log, SHIM, "--plugin", PLUGIN, "--options", opt_path, "--jsonl",
                    "--concurrency", "4"]
            if tools:
                args += ["--tools", tools]
            text = "".join(json.dumps(l) + "\n" for l in lines)
            res = subprocess.run(args, input=text, capture_output=True, text=True,
                                 timeout=300 * SLOW)
            with open(log) as f:
                report = f.read()
        self.assertEqual(res.returncode, 0, "valgrind found errors:\n" + report[-4000:])
        self.assertIn("ERROR SUMMARY: 0 errors", report)
        return [json.loads(l) for l in res.stdout.splitlines() if l.strip()]

    def test_session_is_clean(self):
        with FakeLLM() as llm:
            opts = options(llm, request_timeout_ms=60000, turn_timeout_ms=120000)
            out = self.run_under_valgrind(opts, [
                {"text": "hello", "conversation_id": "a"},
                {"text": "turn on the kitchen light", "conversation_id": "a"},
                {"text": "[[tool:turn_on {\"name\":\"garage\"}]] [[tool:nope {}]]", "conversation_id": "b"},
                {"text": "[[fault:500]] fail", "conversation_id": "a"},
                {"text": "[[latency:3000]] slow", "conversation_id": "c"},
                {"op": "sleep", "ms": 300},
                {"op": "cancel", "seq": 5},
                {"op": "history", "conversation_id": "a"},
                {"op": "list"},
                {"op": "metrics"},
                {"text": "[[latency:5000]] still running at EOF", "conversation_id": "d"},
            ], tools="demo")
            codes = {l["seq"]: (l.get("error") or {}).get("code") for l in out}
            self.assertIsNone(codes[1])
            self.assertIsNone(codes[2])
            self.assertIsNone(codes[3])
            self.assertEqual(codes[4], "http_status")
            self.assertEqual(codes[5], "cancelled")
            self.assertIsNone(codes[11])  # EOF waits for in-flight turns

    def test_personas_and_images_are_clean(self):
        png = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAAB"
        with FakeLLM() as llm:
            opts = options(llm, request_timeout_ms=60000,
                           personas={"chef": {"prompt": "You cook.", "max_history_turns": 1},
                                     "butler": {"prompt": "You serve."}})
            out = self.run_under_valgrind(opts, [
                {"text": "look", "conversation_id": "p", "persona": "chef", "images": [{"url": png}]},
                {"text": "again", "conversation_id": "p", "persona": "chef"},
                {"text": "and", "conversation_id": "p", "persona": "chef"},
                {"text": "hi", "conversation_id": "p", "persona": "butler"},
                {"text": "bad", "conversation_id": "p", "persona": "pirate"},
                {"text": "bad", "conversation_id": "p", "images": [{"url": "ftp://x/y.png"}]},
                {"op": "history", "conversation_id": "p", "persona": "chef"},
                {"op": "clear", "conversation_id": "p", "persona": "*"},
                {"op": "metrics"},
            ])
            codes = {l["seq"]: (l.get("error") or {}).get("code") for l in out}
            self.assertEqual([codes[k] for k in range(1, 10)],
                             [None, None, None, None, "invalid_input", "invalid_input", None, None,
                              None])

    def test_streaming_is_clean(self):
        with FakeLLM() as llm:
            opts = options(llm, stream=True, request_timeout_ms=60000)
            out = self.run_under_valgrind(opts, [
                {"text": "stream this", "conversation_id": "s"},
                {"text": "[[tool:get_state {}]] and this", "conversation_id": "s"},
                {"text": "[[fault:stream_cut]] cut", "conversation_id": "s"},
            ], tools="demo")
            by = {l["seq"]: l for l in out}
            self.assertIsNone(by[1]["error"])
            self.assertGreater(by[1].get("deltas", 0), 1)
            self.assertIsNone(by[2]["error"])
            self.assertEqual(by[3]["error"]["code"], "bad_response")

    def test_message_identity_is_clean(self):
        """Metadata, interface ids and reply context, on the store threads (SQLite)."""
        with FakeLLM() as llm, tempfile.TemporaryDirectory() as d:
            opts = options(llm, request_timeout_ms=60000, max_history_turns=1,
                           history_keep_turns=0,
                           history_store="sqlite:" + os.path.join(d, "h.db"))
            out = self.run_under_valgrind(opts, [
                {"text": "[[tool:turn_on {\"name\":\"hall\"}]]", "conversation_id": "r",
                 "interface_message_id": "m1", "metadata": {"from": "anna"}},
                {"text": "next", "conversation_id": "r"},
                {"text": "back", "conversation_id": "r", "reply_to": {"interface_message_id": "m1"}},
                {"text": "near", "conversation_id": "r", "reply_to": {"interface_message_id": "m1"}},
                {"text": "none", "conversation_id": "r", "reply_to": {"interface_message_id": "x"}},
                {"text": "bad", "conversation_id": "r", "reply_to": {"turn_id": "x"}},
                {"text": "bad", "conversation_id": "r", "metadata": {"a": 1}, "reply_to": {}},
                {"op": "query", "conversation_id": "r"},
            ], tools="demo")
            by = {l["seq"]: l for l in out}
            self.assertEqual([by[k].get("reply_context") for k in (3, 4, 5)],
                             ["included", "included", "not_found"])
            self.assertEqual([by[k]["error"]["code"] for k in (6, 7)], ["invalid_input"] * 2)


if __name__ == "__main__":
    unittest.main()
