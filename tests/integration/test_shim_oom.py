"""parley-host out of memory (docs/shim.md, JSONL mode): a line whose answer cannot be written
is still answered, with a fixed no_memory line, never dropped or written in part; a line that
cannot be parsed for want of memory is answered no_memory, not invalid_input; a turn whose
transfer libcurl cannot start for want of memory ends no_memory, not internal.
tests/tools/jansson_fault.so and curl_fault.so make jansson and libcurl fail there."""
import os
import unittest

from harness import BUILD, FakeLLM, ParleyTestCase, options

FAULT = os.path.join(BUILD, "tests", "jansson_fault.so")
CURL_FAULT = os.path.join(BUILD, "tests", "curl_fault.so")
# the sanitizer runtime need not come first: this library intercepts nothing of it
ASAN = os.environ.get("ASAN_OPTIONS", "") + ":verify_asan_link_order=0"
NO_MEMORY = {"code": "no_memory", "message": "parley-host: out of memory writing this answer"}


class AnswerOutOfMemory(ParleyTestCase):
    def run_failing(self, seq, lines, fake):
        return self.run_ok(lines, options(fake), env={
            "LD_PRELOAD": FAULT, "PARLEY_FAULT_DUMPS_SEQ": str(seq), "ASAN_OPTIONS": ASAN})

    def test_a_turn_result_that_cannot_be_written_is_answered_no_memory(self):
        with FakeLLM() as fake:
            run = self.run_failing(2, [{"text": "one", "conversation_id": "a"},
                                       {"text": "two", "conversation_id": "a"},
                                       {"text": "three", "conversation_id": "a"}], fake)
            self.assertEqual([l["seq"] for l in run.lines], [1, 2, 3])
            self.assertEqual(run.by_seq(2), {"seq": 2, "error": NO_MEMORY})
            self.assertTurnOk(run.by_seq(3))

    def test_an_op_answer_that_cannot_be_written_is_answered_no_memory(self):
        with FakeLLM() as fake:
            run = self.run_failing(2, [{"text": "one", "conversation_id": "a"},
                                       {"op": "history", "conversation_id": "a"},
                                       {"op": "list"}], fake)
            self.assertEqual(run.by_seq(2),
                             {"seq": 2, "op": "history", "result": None, "error": NO_MEMORY})
            self.assertIsNone(run.by_seq(3)["error"])

    def test_a_line_that_cannot_be_parsed_is_answered_no_memory(self):
        with FakeLLM() as fake:
            run = self.run_ok([{"text": "oom-here", "conversation_id": "a"},
                               {"text": "two", "conversation_id": "a"}], options(fake), env={
                "LD_PRELOAD": FAULT, "PARLEY_FAULT_LOADB_MARK": "oom-here", "ASAN_OPTIONS": ASAN})
            self.assertEqual(run.by_seq(1)["error"]["code"], "no_memory")
            self.assertTurnOk(run.by_seq(2))


class PluginOutOfMemory(ParleyTestCase):
    def test_a_transfer_libcurl_cannot_add_ends_the_turn_no_memory(self):
        with FakeLLM() as fake:
            run = self.run_ok([{"text": "one", "conversation_id": "a"},
                               {"text": "two", "conversation_id": "a"},
                               {"op": "history", "conversation_id": "a"}], options(fake), env={
                "LD_PRELOAD": CURL_FAULT, "PARLEY_FAULT_MULTI_ADD": "1", "ASAN_OPTIONS": ASAN})
            self.assertEqual(run.by_seq(1)["error"]["code"], "no_memory")
            self.assertTurnOk(run.by_seq(2))
            turns = run.by_seq(3)["result"]["turns"]
            self.assertEqual([t["messages"][0]["content"] for t in turns], ["two"])


if __name__ == "__main__":
    unittest.main()
