"""Shared helpers for Parley's end-to-end tests.

Every test drives the real pieces: the fake OpenAI-compatible server
(parley-fake-llm) on an ephemeral loopback port, and the host shim
(parley-host --jsonl) loading build/plugin/parley.so.  Assertions are made on
what the shim prints (what a host would see) and on the server's request log
(exactly what the plugin sent).
"""
import json
import os
import subprocess
import tempfile
import time
import unittest

BUILD = os.environ.get("PARLEY_BUILD_DIR") or os.path.join(
    os.path.dirname(__file__), "..", "..", "build")
PLUGIN = os.path.join(BUILD, "plugin", "parley.so")
SHIM = os.path.join(BUILD, "host-shim", "parley-host")
FAKE = os.path.join(BUILD, "tests", "fake-llm", "parley-fake-llm")
# Under valgrind or sanitizers everything is slower: scale waits, never assertions on speed.
SLOW = float(os.environ.get("PARLEY_TEST_SLOWDOWN", "1"))


class FakeLLM:
    """A running parley-fake-llm; use as a context manager."""

    def __init__(self, *args):
        self.dir = tempfile.TemporaryDirectory(prefix="parley-test-")
        self.log_path = os.path.join(self.dir.name, "requests.jsonl")
        port_file = os.path.join(self.dir.name, "port")
        self.proc = subprocess.Popen(
            [FAKE, "--port", "0", "--port-file", port_file, "--log", self.log_path, "--quiet",
             *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.time() + 10 * SLOW
        while not os.path.exists(port_file):
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError("fake LLM did not start: %s" % self.proc.stderr.read())
            time.sleep(0.01)
        with open(port_file) as f:
            self.port = int(f.read().strip())
        self.base_url = "http://127.0.0.1:%d/v1" % self.port

    def requests(self):
        """Every request the server received so far, in arrival order."""
        if not os.path.exists(self.log_path):
            return []
        with open(self.log_path) as f:
            return [json.loads(line) for line in f if line.strip()]

    def chat_requests(self):
        return [r for r in self.requests() if r.get("path", "").endswith("/chat/completions")]

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stderr.close()
        self.dir.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def options(fake=None, **overrides):
    """Options for an agent talking to `fake`, with short timeouts for tests."""
    o = {
        "base_url": fake.base_url if fake else "http://127.0.0.1:9/v1",
        "model": "fake-model",
        "prompt": "You are a test assistant.",
        "request_timeout_ms": int(10000 * SLOW),
        "connect_timeout_ms": int(2000 * SLOW),
        "retry_backoff_ms": 10,
    }
    o.update(overrides)
    return o


class ShimRun:
    """The outcome of one parley-host --jsonl run."""

    def __init__(self, proc_result, elapsed):
        self.rc = proc_result.returncode
        self.stderr = proc_result.stderr
        self.elapsed = elapsed
        self.lines = [json.loads(l) for l in proc_result.stdout.splitlines() if l.strip()]

    def by_seq(self, seq):
        found = [l for l in self.lines if l.get("seq") == seq]
        if len(found) != 1:
            raise AssertionError("expected one line for seq %d, got %r" % (seq, self.lines))
        return found[0]


def run_shim(lines, opts, tools=None, concurrency=1, timeout=60, extra_args=()):
    """Feed JSON lines (dicts or raw strings) to parley-host --jsonl and collect its output."""
    with tempfile.TemporaryDirectory(prefix="parley-shim-") as d:
        opt_path = os.path.join(d, "options.json")
        with open(opt_path, "w") as f:
            json.dump(opts, f)
        args = [SHIM, "--plugin", PLUGIN, "--options", opt_path, "--jsonl",
                "--concurrency", str(concurrency), *extra_args]
        if tools is not None:
            if tools == "demo":
                args += ["--tools", "demo"]
            else:
                tools_path = os.path.join(d, "tools.json")
                with open(tools_path, "w") as f:
                    json.dump({"tools": tools}, f)
                args += ["--tools", tools_path]
        text = "".join((l if isinstance(l, str) else json.dumps(l)) + "\n" for l in lines)
        start = time.time()
        res = subprocess.run(args, input=text, capture_output=True, text=True,
                             timeout=timeout * SLOW)
        return ShimRun(res, time.time() - start)


class ParleyTestCase(unittest.TestCase):
    """Base class: asserts the shim exited cleanly unless a test says otherwise."""

    def run_ok(self, lines, opts, **kw):
        run = run_shim(lines, opts, **kw)
        self.assertEqual(run.rc, 0, "parley-host failed: %s" % run.stderr)
        return run

    def assertTurnOk(self, line):
        self.assertIsNone(line.get("error"), "turn failed: %r" % line)
        self.assertIsInstance(line.get("response"), str)
        return line

    def assertTurnError(self, line, code):
        self.assertIsNotNone(line.get("error"), "turn should have failed: %r" % line)
        self.assertEqual(line["error"]["code"], code, line)
        return line


def roles(request):
    return [m["role"] for m in request["body"]["messages"]]
