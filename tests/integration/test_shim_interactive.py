"""parley-host's interactive mode on a terminal: the tests give it a pseudo-
terminal (Python's pty module) as stdin and stdout, type into it, and read
what a person would see -- banner, "thinking…" indicator, tool steps as they
happen, Ctrl-C cancelling a turn, /history, /options.  Also scripts/demo.sh's
--interactive chat is exercised through the same pty."""
import json
import os
import pty
import re
import select
import signal
import tempfile
import time
import unittest

from harness import PLUGIN, SHIM, SLOW, FakeLLM, options
from test_tools import tool

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class PtyShim:
    """parley-host in interactive mode on a pty; use as a context manager."""

    def __init__(self, opts, tools=None, extra_args=()):
        self.dir = tempfile.TemporaryDirectory(prefix="parley-pty-")
        opt_path = os.path.join(self.dir.name, "options.json")
        with open(opt_path, "w") as f:
            json.dump(opts, f)
        args = [SHIM, "--plugin", PLUGIN, "--options", opt_path, *extra_args]
        if tools is not None:
            tools_path = os.path.join(self.dir.name, "tools.json")
            with open(tools_path, "w") as f:
                json.dump({"tools": tools}, f)
            args += ["--tools", tools_path]
        self.out = ""
        self.pos = 0  # read_until searches from here: each call waits for new output
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # child: the pty is its controlling terminal
            try:
                os.execv(SHIM, args)
            finally:
                os._exit(127)
        self.status = None

    def read_until(self, pattern, timeout=30):
        """Read until `pattern` (a regex) matches output after the previous match;
        returns the match (positions index self.out)."""
        deadline = time.time() + timeout * SLOW
        rx = re.compile(pattern)
        while True:
            m = rx.search(self.out, self.pos)
            if m:
                self.pos = m.end()
                return m
            left = deadline - time.time()
            if left <= 0:
                raise AssertionError("no %r in output:\n%s" % (pattern, self.out))
            r, _, _ = select.select([self.fd], [], [], left)
            if r:
                try:
                    data = os.read(self.fd, 65536)
                except OSError:  # EIO: the child closed the terminal
                    data = b""
                if not data:
                    m = rx.search(self.out, self.pos)
                    if m:
                        self.pos = m.end()
                        return m
                    raise AssertionError("exited without %r; output:\n%s" % (pattern, self.out))
                self.out += data.decode("utf-8", "replace")

    def type(self, line):
        os.write(self.fd, line.encode() + b"\r")

    def ctrl_c(self):
        os.write(self.fd, b"\x03")

    def wait(self, timeout=30):
        """Exit code (or 128 + signal); drains output meanwhile."""
        deadline = time.time() + timeout * SLOW
        while self.status is None and time.time() < deadline:
            pid, st = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(st)
                if self.status < 0:
                    self.status = 128 - self.status
                break
            r, _, _ = select.select([self.fd], [], [], 0.05)
            if r:
                try:
                    self.out += os.read(self.fd, 65536).decode("utf-8", "replace")
                except OSError:
                    pass
        return self.status

    def text(self):
        """What the screen shows, roughly: escape sequences and CRs removed."""
        return ANSI.sub("", self.out).replace("\r", "")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.wait(0.01) is None:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        os.close(self.fd)
        self.dir.cleanup()


class Interactive(unittest.TestCase):
    def opts(self, fake, **kw):
        return options(fake, auto_create_conversation_id=True, **kw)

    def quit(self, sh):
        """At the next prompt, /quit: a clean exit."""
        sh.read_until("you> ")
        sh.type("/quit")
        self.assertEqual(sh.wait(), 0)

    def command_json(self, sh, command):
        """Type a command that prints pretty JSON; returns it parsed."""
        sh.read_until("you> ")
        start = len(sh.out)
        sh.type(command)
        sh.read_until(r'\n\}\r?\n')
        body = ANSI.sub("", sh.out[start:]).replace("\r", "")
        return json.loads(body[body.index("{"):body.rindex("}") + 1])

    def test_banner_names_model_and_server(self):
        with FakeLLM() as fake, PtyShim(self.opts(fake)) as sh:
            m = sh.read_until(r"parley [0-9.]+: model (\S+) at (\S+?),")
            self.assertEqual(m.group(1), "fake-model")
            self.assertEqual(m.group(2), fake.base_url)
            self.quit(sh)

    def test_thinking_indicator_is_shown_then_cleared(self):
        with FakeLLM() as fake, PtyShim(self.opts(fake)) as sh:
            sh.read_until("you> ")
            sh.type("hello [[latency:%d]]" % int(2500 * SLOW))
            sh.read_until("thinking\u2026")
            m = sh.read_until(r"parley> You said")
            # Erased (carriage return, clear to end of line) right before the answer.
            self.assertTrue(sh.out[:m.start()].endswith("\r\x1b[K"), repr(sh.out[-200:]))
            sh.read_until("you> ")
            self.assertNotIn("thinking", sh.text().split("parley> You said")[1])
            sh.type("/quit")
            self.assertEqual(sh.wait(), 0)

    def test_no_indicator_when_stdout_is_not_a_terminal(self):
        import subprocess
        with FakeLLM() as fake, tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "o.json")
            with open(path, "w") as f:
                json.dump(self.opts(fake), f)
            res = subprocess.run([SHIM, "--plugin", PLUGIN, "--options", path],
                                 input="hi [[latency:%d]]\n" % int(1500 * SLOW),
                                 capture_output=True, text=True, timeout=60 * SLOW)
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertNotIn("thinking", res.stdout)
        self.assertNotIn("\x1b", res.stdout)
        self.assertIn('parley> You said: "hi', res.stdout)

    def test_streamed_tool_steps_print_when_they_happen(self):
        tools = [tool("turn_on", {"ok": True}, delay_ms=int(1500 * SLOW), from_thread=True)]
        with FakeLLM() as fake, PtyShim(self.opts(fake, stream=True), tools=tools) as sh:
            sh.read_until("you> ")
            sh.type('Let me see [[tool:turn_on {"name":"kitchen"}]]')
            sh.read_until(r'-> turn_on \{"name":"kitchen"\}')
            self.assertNotIn("Done.", sh.text(), "the call shows before the tool has answered")
            sh.read_until(r'<- \{"ok":true\}')
            sh.read_until(r"parley> Done\. turn_on")
            sh.read_until("you> ")
            text = sh.text()
            self.assertEqual(text.count("-> turn_on"), 1, text)
            self.assertEqual(text.count('<- {"ok":true}'), 1, text)
            self.assertLess(text.index("-> turn_on"), text.index("<- {"))
            self.assertLess(text.index("<- {"), text.index("parley> Done."))
            sh.type("/quit")
            self.assertEqual(sh.wait(), 0)

    def test_steps_the_host_never_saw_still_show(self):
        """An unknown tool is answered by the plugin itself: shown from the result's steps."""
        with FakeLLM() as fake, PtyShim(self.opts(fake, stream=True),
                                        tools=[tool("turn_on", {"ok": True})]) as sh:
            sh.read_until("you> ")
            sh.type('[[tool:launch {"x":1}]]')
            sh.read_until(r'-> launch \{"x":1\}')
            sh.read_until(r"<- .*unknown_tool.* \(error\)")
            self.quit(sh)

    def test_ctrl_c_cancels_the_turn_then_quits_at_the_prompt(self):
        with FakeLLM() as fake, PtyShim(self.opts(fake)) as sh:
            sh.read_until("you> ")
            sh.type("first")
            sh.read_until(r"parley> You said")
            sh.read_until("you> ")
            before = len(sh.out)
            sh.type("slow one [[latency:60000]]")
            sh.read_until("thinking")
            sh.ctrl_c()
            sh.read_until(r"parley! cancelled")
            sh.read_until("you> ")
            self.assertIsNone(sh.wait(0.2), "one Ctrl-C during a turn does not quit")
            # The agent is still usable, and the cancelled turn left no history.
            sh.type("/history")
            sh.read_until(r"assistant: You said: \"first\"")
            sh.read_until("you> ")
            self.assertNotIn("slow one", sh.text()[before:].split("/history")[-1])
            sh.ctrl_c()
            self.assertEqual(sh.wait(), 130)

    def test_second_ctrl_c_during_a_turn_quits(self):
        with FakeLLM() as fake, PtyShim(self.opts(fake)) as sh:
            sh.read_until("you> ")
            sh.type("slow [[latency:60000]]")
            sh.read_until("thinking")
            sh.ctrl_c()
            time.sleep(0.3)  # two presses, not one signal merged from both
            sh.ctrl_c()
            self.assertEqual(sh.wait(), 130)

    def test_history_compact_and_json(self):
        with FakeLLM() as fake, PtyShim(self.opts(fake), tools=[tool("turn_on", {"ok": True})]) as sh:
            sh.read_until("you> ")
            sh.type('on [[tool:turn_on {"name":"hall"}]]')
            sh.read_until(r"parley> Done")
            sh.read_until("you> ")
            start = len(sh.out)
            sh.type("/history")
            sh.read_until(r"assistant: Done[^\n]*\n")
            lines = [l for l in ANSI.sub("", sh.out[start:]).replace("\r", "").split("\n")
                     if ":" in l and not l.startswith("/history")]
            self.assertEqual(lines[:4], [
                'user: on [[tool:turn_on {"name":"hall"}]]',
                'assistant: -> turn_on {"name":"hall"}',
                'tool: <- {"ok":true}',
                lines[3]])
            self.assertTrue(lines[3].startswith("assistant: Done. turn_on"), lines)
            doc = self.command_json(sh, "/history --json")
            self.assertEqual(len(doc["turns"]), 1)
            self.assertEqual(doc["turns"][0]["messages"][2]["role"], "tool")
            sh.type("/quit")
            self.assertEqual(sh.wait(), 0)

    def test_search(self):
        with FakeLLM() as fake, PtyShim(self.opts(fake)) as sh:
            sh.read_until("you> ")
            sh.type("the Washing machine is loud")
            sh.read_until(r"parley> ")
            sh.read_until("you> ")
            start = len(sh.out)
            sh.type("/search WASHING")
            sh.read_until(r"\] user: the Washing machine is loud[^\n]*\n")
            sh.read_until("you> ")
            sh.type("/search zeppelin")
            sh.read_until(r'\(no message holds "zeppelin"\)')
            found = [l for l in ANSI.sub("", sh.out[start:]).replace("\r", "").split("\n")
                     if l.startswith("[")]
            # newest first: the fake model's answer quotes the user's words
            self.assertEqual(len(found), 2, found)
            self.assertRegex(found[0], r"^\[[0-9a-f-]{36} \d{4}-\d\d-\d\dT[0-9:.]+Z\] assistant: ")
            self.assertRegex(found[1], r"^\[[0-9a-f-]{36} \d{4}-\d\d-\d\dT[0-9:.]+Z\] user: ")
            sh.type("/quit")
            self.assertEqual(sh.wait(), 0)

    def test_say_appends_without_the_model(self):
        with FakeLLM() as fake, PtyShim(self.opts(fake)) as sh:
            sh.read_until("you> ")
            sh.type("/say nothing yet")
            sh.read_until(r"\(no conversation: say something first\)")
            sh.read_until("you> ")
            sh.type("hello")
            sh.read_until(r"parley> ")
            sh.read_until("you> ")
            sh.type("/say The washing machine has finished.")
            sh.read_until(r"parley> The washing machine has finished\.")
            sh.read_until("you> ")
            sh.type("thanks")
            sh.read_until(r"parley> ")
            sh.read_until("you> ")
            last = fake.chat_requests()[-1]["body"]["messages"]
            self.assertEqual(len(fake.chat_requests()), 2, "/say called no model")
            # The announcement follows the model's answer: one assistant message, joined by a
            # blank line, so strict chat templates see the roles alternate (docs/history.md).
            self.assertEqual(last[-1], {"role": "user", "content": "thanks"})
            self.assertEqual(last[-2]["role"], "assistant")
            self.assertTrue(last[-2]["content"].endswith("\n\nThe washing machine has finished."),
                            last[-2])
            sh.type("/quit")
            self.assertEqual(sh.wait(), 0)

    def test_options_masks_secrets(self):
        with FakeLLM() as fake, PtyShim(self.opts(fake, api_key="sk-very-secret")) as sh:
            shown = self.command_json(sh, "/options")
            self.assertEqual(shown["api_key"], "********")
            self.assertNotIn("sk-very-secret", sh.out)
            self.assertEqual(shown["model"], "fake-model")
            self.assertEqual(shown["max_history_turns"], 20, "defaults filled in")
            self.assertEqual(shown["request_timeout_ms"], options(fake)["request_timeout_ms"])
            sh.type("/quit")
            self.assertEqual(sh.wait(), 0)

    def test_credentials_inside_urls_are_masked(self):
        with FakeLLM() as fake:
            url = fake.base_url.replace("http://", "http://user:url-secret@")
            with PtyShim(self.opts(fake, base_url=url)) as sh:
                shown = self.command_json(sh, "/options")
                self.assertEqual(shown["base_url"], url.replace("user:url-secret", "********"))
                self.assertNotIn("url-secret", sh.out, "neither /options nor the banner")
                sh.type("/quit")
                self.assertEqual(sh.wait(), 0)

    def test_a_redis_password_holding_at_and_slash_is_masked_whole(self):
        # The plugin splits redis://:PASSWORD@HOST at the last '@'; so does /options.
        from redis_server import RedisServer
        with FakeLLM() as fake, RedisServer("s3cr@t/pw@x") as redis:
            with PtyShim(self.opts(fake, history_store=redis.url)) as sh:
                shown = self.command_json(sh, "/options")
                self.assertEqual(shown["history_store"],
                                 "redis://********@127.0.0.1:%d" % redis.port)
                for part in ("s3cr", "t/pw", "@x@"):
                    self.assertNotIn(part, sh.out)
                sh.type("/quit")
                self.assertEqual(sh.wait(), 0)


class DemoInteractive(unittest.TestCase):
    """scripts/demo.sh --interactive: a chat with the offline fake LLM."""

    def test_demo_interactive_chat(self):
        root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
        build = os.path.abspath(os.path.join(os.path.dirname(SHIM), ".."))
        pid, fd = pty.fork()
        if pid == 0:
            try:
                os.environ["PARLEY_BUILD_DIR"] = build
                os.execv("/bin/bash", ["bash", os.path.join(root, "scripts", "demo.sh"),
                                       "--interactive"])
            finally:
                os._exit(127)
        sh = PtyShim.__new__(PtyShim)
        sh.pid, sh.fd, sh.out, sh.pos, sh.status = pid, fd, "", 0, None
        sh.dir = tempfile.TemporaryDirectory()
        with sh:
            sh.read_until("model fake-model at http://127.0.0.1:", timeout=300)
            sh.read_until("you> ")
            sh.type("Please turn on the kitchen light.")
            sh.read_until(r"-> turn_on")
            sh.read_until(r"parley> ")
            sh.read_until("you> ")
            sh.type("/quit")
            self.assertEqual(sh.wait(60), 0)


if __name__ == "__main__":
    unittest.main()
