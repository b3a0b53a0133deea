"""Thread stress of parley.so through its ABI (tests/stress/stress.c), run
against the fake LLM server; meant to be run under ThreadSanitizer too
(-DPARLEY_SANITIZE=thread).  Besides the program's own checks, every request
it caused is checked here from the server's log: a request only ever holds
messages of its own conversation, and on the shared conversations the user
messages are in submission order."""
import os
import re
import subprocess
import unittest

from harness import BUILD, PLUGIN, SLOW, FakeLLM, messages, tool_sequence_problems, user_texts

STRESS = os.path.join(BUILD, "tests", "stress", "parley-stress")

SHARED = re.compile(r"^stress sid=(\d+) seq=(\d+) thr=(\d+) k=(\d+)$")
SOLO = re.compile(r"^(solo|follow) thr=(\d+) k=(\d+)$")
LATE = re.compile(r"^late (\d+) \[\[latency:\d+\]\]$")


def conversation_of(text):
    m = SHARED.match(text)
    if m:
        return "shared-%s" % m.group(1), int(m.group(2))
    m = SOLO.match(text)
    if m:
        return "solo-%s-%s" % (m.group(2), m.group(3)), 0 if m.group(1) == "solo" else 1
    m = LATE.match(text)
    if m:  # phase 2 (destroy with turns in flight): even ones go to the shared ids
        i = int(m.group(1))
        return ("late-%d" % i, 0) if i % 2 else ("shared-%d" % (i % 4), 10 ** 9 + i)
    raise AssertionError("unexpected user text %r" % text)


@unittest.skipUnless(os.path.exists(STRESS),
                     "parley-stress not built (tests/stress is not in the build yet)")
class Stress(unittest.TestCase):
    def run_stress(self, threads, turns):
        with FakeLLM("--threads", "4") as llm:
            res = subprocess.run([STRESS, PLUGIN, llm.base_url, str(threads), str(turns)],
                                 capture_output=True, text=True, timeout=280 * SLOW)
            reqs = llm.chat_requests()
        out = res.stdout + res.stderr
        self.assertEqual(res.returncode, 0, out[-6000:])
        self.assertRegex(res.stdout, r"^\d+ passed, 0 failed$")
        self.assertGreater(int(res.stdout.split()[0]), 1000, res.stdout)

        # At least every turn that was not cancelled at once reached the server.
        self.assertGreater(len(reqs), threads * turns // 2, len(reqs))
        for r in reqs:
            self.assertEqual(r["status"], 200, r)
            msgs = messages(r)
            self.assertEqual(msgs[0], {"role": "system", "content": "Stress."})
            self.assertEqual(tool_sequence_problems(msgs), [])
            convs = [conversation_of(t) for t in user_texts(r)]
            ids = {c for c, _ in convs}
            self.assertEqual(len(ids), 1, "request #%s mixes conversations: %r" % (r["seq"], ids))
            order = [o for _, o in convs]
            self.assertEqual(order, sorted(order), "request #%s out of order" % r["seq"])
            self.assertEqual(len(set(order)), len(order), "request #%s repeats a turn" % r["seq"])
            # Each user message is followed by its own answer (whole turns).
            roles = [m["role"] for m in msgs[1:]]
            self.assertEqual(roles, ["user", "assistant"] * (len(roles) // 2) + ["user"])

    def test_8_threads_200_turns(self):
        self.run_stress(8, 200)


DESTROY_RACE = os.path.join(BUILD, "tests", "stress", "parley-destroy-race")


class DestroyRace(unittest.TestCase):
    def test_tool_completed_from_a_callback_during_destroy(self):
        # A use-after-free once: destroy() marked the inbox dead before ending
        # turns, so a completion from a done callback freed a handle its turn
        # still held.  Under ASan that aborts; here every turn must end
        # cancelled exactly once, 20 rounds in a row.
        with FakeLLM() as llm:
            res = subprocess.run([DESTROY_RACE, PLUGIN, llm.base_url], capture_output=True,
                                 text=True, timeout=120 * SLOW)
        self.assertEqual(res.returncode, 0, (res.stdout + res.stderr)[-4000:])
        self.assertRegex(res.stdout, r"^\d+ passed, 0 failed$")


STORE_WAIT = os.path.join(BUILD, "tests", "stress", "parley-store-wait")


class StoreWait(unittest.TestCase):
    def test_store_waits_with_a_blocking_store(self):
        # A gated store (blocking, so the agent uses its store thread) holds or
        # fails loads and appends on purpose: storage failure, cancel while
        # loading / committing, destroy with store jobs in flight.
        with FakeLLM() as llm:
            res = subprocess.run([STORE_WAIT, llm.base_url], capture_output=True, text=True,
                                 timeout=120 * SLOW)
        self.assertEqual(res.returncode, 0, (res.stdout + res.stderr)[-4000:])
        self.assertRegex(res.stdout, r"^\d+ passed, 0 failed$")


if __name__ == "__main__":
    unittest.main()
