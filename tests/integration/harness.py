"""Shared helpers for Parley's end-to-end tests.

Every test drives the real pieces: the fake OpenAI-compatible server
(parley-fake-llm) on an ephemeral loopback port, and the host shim
(parley-host --jsonl) loading build/plugin/parley.so.  Assertions are made on
what the shim prints (what a host would see) and on the server's request log
(exactly what the plugin sent).
"""
import json
import os
import re
import select
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
        # A known window: no discovery requests (GET /props...) beside the tests' own,
        # which would shift the fake's request numbers (test_context.py tests discovery).
        "context_window": 32768,
    }
    o.update(overrides)
    return o


class ShimRun:
    """The outcome of one parley-host --jsonl run."""

    def __init__(self, proc_result, elapsed):
        self.rc = proc_result.returncode
        self.stderr = proc_result.stderr
        self.elapsed = elapsed
        # The exact bytes of every stdout line (for byte-identical comparisons).
        self.raw = [l for l in proc_result.stdout.splitlines() if l.strip()]
        self.lines = [json.loads(l) for l in self.raw]

    def by_seq(self, seq):
        found = [l for l in self.lines if l.get("seq") == seq]
        if len(found) != 1:
            raise AssertionError("expected one line for seq %d, got %r" % (seq, self.lines))
        return found[0]

    def raw_result(self, seq):
        """The exact JSON text of the "result" member of op line `seq`."""
        return raw_op_result(self.raw[[l.get("seq") for l in self.lines].index(seq)])

    def turn_lines(self):
        """Result lines of conversation turns (not ops, not rejected lines), by seq."""
        return sorted((l for l in self.lines if "op" not in l and "steps" in l),
                      key=lambda l: l["seq"])


def _shim_args(d, opts, tools, concurrency, extra_args):
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
    return args


def run_shim(lines, opts, tools=None, concurrency=1, timeout=60, extra_args=(), env=None):
    """Feed JSON lines (dicts or raw strings) to parley-host --jsonl and collect its output.

    env: extra environment variables for the shim (added to os.environ; a value
    of None removes the variable)."""
    with tempfile.TemporaryDirectory(prefix="parley-shim-") as d:
        args = _shim_args(d, opts, tools, concurrency, extra_args)
        text = "".join((l if isinstance(l, str) else json.dumps(l)) + "\n" for l in lines)
        start = time.time()
        res = subprocess.run(args, input=text, capture_output=True, text=True,
                             timeout=timeout * SLOW, env=_env(env))
        return ShimRun(res, time.time() - start)


def _env(extra):
    if extra is None:
        return None
    e = dict(os.environ)
    for k, v in extra.items():
        if v is None:
            e.pop(k, None)
        else:
            e[k] = v
    return e


class InteractiveShim:
    """parley-host --jsonl driven line by line (read an answer before sending
    the next line).  Use as a context manager; close() returns the exit code.

        with InteractiveShim(opts) as sh:
            first = sh.turn({"text": "hi"})
            sh.turn({"text": "again", "conversation_id": first["conversation_id"]})
    """

    def __init__(self, opts, tools=None, concurrency=1, extra_args=(), env=None):
        self._dir = tempfile.TemporaryDirectory(prefix="parley-shim-")
        args = _shim_args(self._dir.name, opts, tools, concurrency, extra_args)
        self._err = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._err, env=_env(env))
        self.seq = 0       # seq of the last line sent
        self.raw = []      # every stdout line read so far
        self._buf = b""
        self.rc = None
        self.stderr = None

    def send(self, line):
        """Send one line (dict or raw string); returns its seq."""
        text = line if isinstance(line, str) else json.dumps(line)
        self.proc.stdin.write(text.encode() + b"\n")
        self.proc.stdin.flush()
        self.seq += 1
        return self.seq

    def read_line(self, timeout=30):
        """The next stdout line, parsed; raises AssertionError on timeout/EOF."""
        deadline = time.time() + timeout * SLOW
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.time()
            if left <= 0:
                raise AssertionError("no line from parley-host within %ss" % timeout)
            r, _, _ = select.select([fd], [], [], left)
            if r:
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise AssertionError("parley-host closed stdout (rc %r)" % self.proc.poll())
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        text = line.decode()
        self.raw.append(text)
        return json.loads(text)

    def wait_seq(self, seq, timeout=30):
        """Read lines until the one for `seq` comes; returns it."""
        while True:
            line = self.read_line(timeout)
            if line.get("seq") == seq:
                return line

    def turn(self, line, timeout=30):
        """Send one line and return its answer line."""
        return self.wait_seq(self.send(line), timeout)

    def op(self, op, timeout=30, **args):
        return self.turn(dict(op=op, **args), timeout)

    def close(self, timeout=30):
        """Close stdin, wait for exit; returns the exit code (stderr in .stderr)."""
        if self.rc is not None:
            return self.rc
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        self.proc.stdin = None  # communicate() must not touch it again
        try:
            rest, _ = self.proc.communicate(timeout=timeout * SLOW)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rest, _ = self.proc.communicate()
        self._buf += rest or b""
        for l in self._buf.decode().splitlines():
            if l.strip():
                self.raw.append(l)
        self._buf = b""
        self.rc = self.proc.returncode
        self._err.seek(0)
        self.stderr = self._err.read()
        self._err.close()
        self._dir.cleanup()
        return self.rc

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


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


def raw_op_result(raw_line):
    """The exact text of "result" in a raw op line
    {"seq":N,"op":"..","result":<R>,"error":<E>} (the shim writes keys in that order)."""
    m = re.match(r'^\{"seq":\d+,"op":"[a-z_]+","result":', raw_line)
    if not m:
        raise AssertionError("not an op line: %r" % raw_line)
    # "error" is the last member: split at the last ',"error":' that leaves
    # valid JSON on both sides.
    for idx in [i.start() for i in re.finditer(r',"error":', raw_line)][::-1]:
        try:
            json.loads(raw_line[m.end():idx])
            json.loads(raw_line[idx + len(',"error":'):-1])
        except ValueError:
            continue
        return raw_line[m.end():idx]
    raise AssertionError("cannot find the result of %r" % raw_line)


def messages(request):
    """The messages list of one logged chat request."""
    return request["body"]["messages"]


def user_texts(request):
    return [m["content"] for m in messages(request) if m["role"] == "user"]


def tool_sequence_problems(msgs):
    """Chat Completions ordering rules for tool messages; returns a list of
    problems (empty when well formed):
    - an assistant message with tool_calls is followed, before any other
      message, by exactly one tool message per call id (any order, no extra);
    - a tool message only appears inside such a block, answering one of its ids.
    """
    problems = []
    pending = None  # call ids still unanswered in the open block
    for i, m in enumerate(msgs):
        role = m.get("role")
        if role == "tool":
            cid = m.get("tool_call_id")
            if pending is None:
                problems.append("messages[%d]: tool message %r without a preceding assistant "
                                "tool_calls message" % (i, cid))
            elif cid not in pending:
                problems.append("messages[%d]: tool message %r answers no open call (open: %r)"
                                % (i, cid, sorted(pending)))
            else:
                pending.discard(cid)
                if not pending:
                    pending = None
            continue
        if pending:
            problems.append("messages[%d] (%s): tool_calls %r left without results"
                            % (i, role, sorted(pending)))
            pending = None
        if role == "assistant" and m.get("tool_calls"):
            ids = [c.get("id") for c in m["tool_calls"]]
            if len(set(ids)) != len(ids):
                problems.append("messages[%d]: duplicate tool call ids %r" % (i, ids))
            pending = set(ids)
    if pending:
        problems.append("end: tool_calls %r left without results" % sorted(pending))
    return problems


UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
UUID4_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")


def fake_reply(user_text, n_messages, n_user):
    """The fake server's plain reply (no tools, no markers but [[ask]])."""
    r = 'You said: "%s". I have seen %d messages (%d from you).' % (user_text, n_messages, n_user)
    if "[[ask]]" in user_text:
        r += " Anything else?"
    return r


# Parley's own keys in stored messages (docs/history.md): the neutral record is
# Chat Completions plus these, which the openai codec does not send.
PARLEY_MESSAGE_KEYS = ("name", "is_error", "reasoning", "provider_data")


def as_sent(msgs):
    """Stored messages as the Chat Completions codec sends them."""
    out = []
    for m in msgs:
        m = dict(m)
        if m.get("role") in ("tool", "assistant"):
            for k in PARLEY_MESSAGE_KEYS:
                m.pop(k, None)
        out.append(m)
    return out
