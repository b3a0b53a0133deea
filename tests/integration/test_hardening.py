"""End-to-end tests of the hardening work (issue 14 and the error items of 16).

Each test names the defect it guards; each fails on the code before the fix:
secrets never in error text, a finished stream completes at once, transport
error classes, the connection cap, whole and valid log lines, turn_timeout_ms
from acceptance, the same status streamed or not, a 404 that names the URL,
and a tool call completed twice.
"""
import json
import os
import resource
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (BUILD, PLUGIN, SHIM, SLOW, FakeLLM, InteractiveShim,  # noqa: E402
                     ParleyTestCase, options, run_shim)

KEY = "sk-Q7x"  # short, like the keys some proxies use: jansson would quote it whole


class Secrets(ParleyTestCase):
    """Defect 1: no error text ever contains the API key, whatever the input."""

    MALFORMED = [
        '{"model":"m","api_key":%s',            # ends early
        '{"model":"m","api_key":%s,}',           # trailing comma
        '{"model":"m","api_key":%s "x":1}',      # missing comma
        '{"model":"m" "api_key":%s}',
        '{"model":"m","api_key":%s}}',           # text after the value
        '{"model":"m","api_key":%s]',
        '{"model":"m","api_key":[%s}',
        '{"model":"m","api_key":%s:1}',
        '{"api_key":%s,"api_key":%s,"model":"m"}',  # duplicate
    ]

    def texts(self):
        quoted, bare = json.dumps(KEY), KEY
        for t in self.MALFORMED:
            for v in (quoted, bare, quoted[:-1]):
                yield t.replace("%s", v)

    def test_shim_options_file_errors_never_contain_the_key(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "options.json")
            for text in self.texts():
                with open(path, "w") as f:
                    f.write(text)
                res = subprocess.run([SHIM, "--plugin", PLUGIN, "--options", path, "--jsonl"],
                                     input="", capture_output=True, text=True,
                                     timeout=30 * SLOW)
                self.assertNotEqual(res.returncode, 0, text)
                self.assertIn("--options", res.stderr)
                self.assertNotIn(KEY, res.stderr, text)
                self.assertNotIn(KEY[3:], res.stderr, text)

    def test_shim_set_errors_never_contain_the_value(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "options.json")
            with open(path, "w") as f:
                json.dump({"model": "m"}, f)
            for arg in (KEY, "api_key=" + KEY + "\udcff"):
                res = subprocess.run([SHIM, "--plugin", PLUGIN, "--options", path, "--jsonl",
                                      "--set", arg.encode("utf-8", "surrogateescape")],
                                     input="", capture_output=True, timeout=30 * SLOW)
                self.assertNotEqual(res.returncode, 0)
                self.assertNotIn(KEY.encode(), res.stderr)


class FinishedStream(ParleyTestCase):
    """Defect 2: [DONE] completes the turn, whatever the connection does after."""

    def check(self, fault):
        lines = [{"text": "hello", "conversation_id": "c"},
                 {"op": "history", "conversation_id": "c"}]
        with FakeLLM("--fault", fault) as fake:
            # Keep-alives every 100 ms would hold a stream open for ever; a
            # silent connection would time out on stream_idle_timeout_ms.
            run = self.run_ok(lines, options(fake, stream=True,
                                             stream_idle_timeout_ms=int(1500 * SLOW),
                                             turn_timeout_ms=int(4000 * SLOW)))
            self.assertEqual(len(fake.chat_requests()), 1)
        res = self.assertTurnOk(run.by_seq(1))
        self.assertIn("hello", res["response"])
        self.assertEqual(len(run.by_seq(2)["result"]["turns"]), 1)  # committed

    def test_a_normal_stream_keeps_its_connection(self):
        # Ending the turn at [DONE] must not cost the kept-alive connection:
        # the body's end follows at once and the next request reuses it.
        lines = [{"text": "turn %d" % i, "conversation_id": "k"} for i in range(4)]
        for stream in (False, True):
            with FakeLLM() as fake:
                run = self.run_ok(lines, options(fake, stream=stream))
                ports = {r["client_port"] for r in fake.chat_requests()}
            for seq in range(1, 5):
                self.assertTurnOk(run.by_seq(seq))
            self.assertEqual(len(ports), 1, "stream=%s: one connection for 4 requests" % stream)

    def test_keepalive_comments_after_done(self):
        self.check("done_keepalive:100")

    def test_connection_held_open_after_done(self):
        self.check("done_hold")


def make_cert(d):
    """A throwaway self-signed certificate for 127.0.0.1, or None without openssl."""
    if not shutil.which("openssl"):
        return None
    cert, key = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key, "-out", cert,
                    "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    return cert, key


REPLY = {"id": "chatcmpl-tls", "object": "chat.completion", "created": 0, "model": "fake-model",
         "choices": [{"index": 0, "message": {"role": "assistant", "content": "over TLS"},
                      "finish_reason": "stop"}]}


def read_request(conn):
    """One HTTP/1.1 request (headers and Content-Length body), or None at EOF."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        body += chunk
    return body


class LoopbackServer:
    """A server on a loopback port for the replies the fake LLM cannot give,
    one connection at a time; a subclass answers each in handle(conn)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.stop = False
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self):
        self.sock.settimeout(0.2)
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            self.handle(conn)

    def close(self):
        self.stop = True
        self.thread.join()
        self.sock.close()


class TLSServer(LoopbackServer):
    """HTTPS on loopback with a self-signed certificate; counts TCP connections."""

    def __init__(self, cert, key):
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(cert, key)
        self.connections = 0
        super().__init__()

    def handle(self, conn):
        self.connections += 1
        try:
            with self.ctx.wrap_socket(conn, server_side=True) as s:
                s.settimeout(10)
                if read_request(s) is None:
                    return
                out = json.dumps(REPLY).encode()
                s.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                          b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(out) + out)
        except (OSError, ssl.SSLError, IndexError, ValueError):
            conn.close()


class TransportClasses(ParleyTestCase):
    """Defect 3: transport failures land in the class docs/errors.md gives."""

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        cert = make_cert(self.dir.name)
        if cert is None:
            self.skipTest("the openssl command is missing (scripts/setup.sh installs it)")
        self.server = TLSServer(*cert)
        self.url = "https://127.0.0.1:%d/v1" % self.server.port

    def tearDown(self):
        self.server.close()
        self.dir.cleanup()

    def test_bad_certificate_is_connect_and_not_retried(self):
        run = self.run_ok([{"text": "hi"}], options(None, base_url=self.url, max_retries=2))
        res = self.assertTurnError(run.by_seq(1), "connect")
        self.assertIn("certificate", res["error"]["message"])
        self.assertIn("not retried", res["error"]["message"])
        self.assertEqual(self.server.connections, 1)  # no retry: it cannot help

    def test_verify_tls_false_works_and_warns_at_create(self):
        run = self.run_ok([{"text": "hi"}], options(None, base_url=self.url, verify_tls=False))
        self.assertEqual(self.assertTurnOk(run.by_seq(1))["response"], "over TLS")
        self.assertRegex(run.stderr, r"parley\[warn\]: verify_tls is false")


class PlainServerOverTLS(ParleyTestCase):
    """Defect 3: a failed TLS handshake is `connect` (retried: it may be transient)."""

    def test_https_to_a_plain_http_server(self):
        with FakeLLM() as fake:
            url = "https://127.0.0.1:%d/v1" % fake.port
            run = self.run_ok([{"text": "hi"}], options(fake, base_url=url, max_retries=1))
        msg = self.assertTurnError(run.by_seq(1), "connect")["error"]["message"]
        self.assertIn("TLS handshake", msg)
        self.assertIn("plain http", msg)


class CutErrorServer(LoopbackServer):
    """Answers every request with a 401 whose body is cut short: headers promise
    more than is sent, then the connection closes (as some gateways do)."""

    def __init__(self):
        self.requests = 0
        super().__init__()

    def handle(self, conn):
        with conn:
            conn.settimeout(10)
            read_request(conn)
            self.requests += 1
            conn.sendall(b"HTTP/1.1 401 Unauthorized\r\nContent-Type: text/event-stream\r\n"
                         b"Content-Length: 1000\r\n\r\n"
                         b'data: {"error":{"message":"Incorrect API key provided."}}\n\n')


class CutErrorBody(ParleyTestCase):
    """Issue 16: an error status is that status even when its body is then cut."""

    def test_401_with_a_cut_body_is_http_status_streamed_or_not(self):
        server = CutErrorServer()
        try:
            for stream in (False, True):
                before = server.requests
                run = self.run_ok([{"text": "hi"}], options(
                    None, base_url="http://127.0.0.1:%d/v1" % server.port, stream=stream))
                res = self.assertTurnError(run.by_seq(1), "http_status")
                self.assertIn("HTTP 401", res["error"]["message"])
                self.assertEqual(server.requests - before, 1, "a 401 is not retried")
        finally:
            server.close()


class IdleCloseServer(LoopbackServer):
    """Answers one request per connection with a keep-alive reply, then closes
    the connection while the client holds it idle (as servers with a short
    keep-alive timeout do)."""

    def __init__(self):
        self.connections = 0
        super().__init__()

    def handle(self, conn):
        self.connections += 1
        with conn:
            conn.settimeout(10)
            if read_request(conn) is None:
                return
            reply = dict(REPLY, choices=[dict(REPLY["choices"][0], message={
                "role": "assistant", "content": "reply %d" % self.connections})])
            out = json.dumps(reply).encode()
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(out) + out)
            time.sleep(0.05)  # the client now holds the connection idle


class IdleConnectionClosed(ParleyTestCase):
    """Issue 17: a kept-alive connection stays in the worker's epoll set while it
    idles; the server closing it then must neither break the next turn nor make
    the worker spin on the closed socket's events."""

    def test_server_closes_idle_connections_between_turns(self):
        server = IdleCloseServer()
        try:
            lines = []
            for i in range(4):
                lines += [{"text": "turn %d" % i, "conversation_id": "c"}, {"op": "wait"},
                          {"op": "sleep", "ms": 500}]
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            run = self.run_ok(lines, options(
                None, base_url="http://127.0.0.1:%d/v1" % server.port, max_retries=0))
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            for i in range(4):
                self.assertEqual(self.assertTurnOk(run.by_seq(1 + 3 * i))["response"],
                                 "reply %d" % (i + 1))
            self.assertEqual(server.connections, 4, "each turn found its connection closed")
            if SLOW == 1:  # sanitizers and valgrind cost seconds of CPU by themselves
                cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
                self.assertLess(cpu, 1.0, "the shim spent %.2f s of CPU over 2 s idle" % cpu)
        finally:
            server.close()


class UnwatchableSocket(ParleyTestCase):
    """A socket the worker cannot add to its epoll set (epoll_ctl failing, as
    the kernel may with ENOMEM) costs at most its own transfer: telling libcurl
    so from the socket callback would fail every transfer of the multi handle."""

    def test_one_failed_epoll_add_spares_the_other_turn(self):
        fault = os.path.join(BUILD, "tests", "epoll_fault.so")
        with FakeLLM("--latency-ms", "300") as fake:  # both transfers in flight at once
            env = {"LD_PRELOAD": fault, "PARLEY_FAULT_EPOLL_ADD": "2",
                   # the sanitizer runtime need not come first: this library intercepts nothing of it
                   "ASAN_OPTIONS": os.environ.get("ASAN_OPTIONS", "") + ":verify_asan_link_order=0"}
            run = self.run_ok([{"text": "one", "conversation_id": "a"},
                               {"text": "two", "conversation_id": "b"}],
                              options(fake, request_timeout_ms=int(5000 * SLOW)), concurrency=2,
                              env=env)
            self.assertTurnOk(run.by_seq(1))
            two = run.by_seq(2)  # its socket was added again on its next events, or it timed out
            if two.get("error"):
                self.assertNotIn("callback", two["error"]["message"])


def sockets_to_port(pid, port):
    """The descriptors of process pid that are TCP connections to 127.0.0.1:port."""
    inodes = set()
    with open("/proc/%d/net/tcp" % pid) as f:
        for line in list(f)[1:]:
            fields = line.split()
            if int(fields[2].split(":")[1], 16) == port:
                inodes.add(fields[9])
    fds = []
    for fd in os.listdir("/proc/%d/fd" % pid):
        try:
            target = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in inodes:
            fds.append(fd)
    return fds


class CloseOnExec(ParleyTestCase):
    """A host that forks and runs a program must not hand it the LLM connections:
    the sockets Parley's pool opens are close-on-exec."""

    def test_llm_connections_are_close_on_exec(self):
        with FakeLLM() as fake, InteractiveShim(options(fake)) as sh:
            self.assertTurnOk(sh.turn({"text": "hi"}))  # its connection now idles, kept alive
            fds = sockets_to_port(sh.proc.pid, fake.port)
            self.assertTrue(fds, "no connection to the fake server found")
            for fd in fds:
                with open("/proc/%d/fdinfo/%s" % (sh.proc.pid, fd)) as f:
                    flags = int([l for l in f if l.startswith("flags:")][0].split()[1], 8)
                self.assertTrue(flags & os.O_CLOEXEC, "descriptor %s lacks O_CLOEXEC" % fd)


class StatusAndHeaders(ParleyTestCase):
    """Defect 3 (statuses, header overflow) and issue 16: same status whatever the mode."""

    def turn(self, fake_args, **opt):
        with FakeLLM(*fake_args) as fake:
            run = self.run_ok([{"text": "hi"}], options(fake, **opt))
            return run.by_seq(1), fake.chat_requests()

    def test_status_999_is_not_retried(self):
        res, reqs = self.turn(("--fault", "999"), max_retries=2)
        self.assertTurnError(res, "http_status")
        self.assertIn("999", res["error"]["message"])
        self.assertEqual(len(reqs), 1)

    def test_header_flood_is_bad_response_not_retried(self):
        for stream in (False, True):
            res, reqs = self.turn(("--fault", "header_flood"), max_retries=2, stream=stream)
            self.assertTurnError(res, "bad_response")
            self.assertEqual(len(reqs), 1, "stream=%s" % stream)

    def test_same_status_streamed_or_not(self):
        want = {"401": ("http_status", 1), "404": ("http_status", 1),
                "429": ("rate_limited", 2), "500": ("http_status", 2)}
        for fault, (code, requests) in want.items():
            for stream in (False, True):
                res, reqs = self.turn(("--fault", fault), max_retries=1, stream=stream)
                self.assertTurnError(res, code)
                self.assertIn("HTTP " + fault, res["error"]["message"])
                self.assertEqual(len(reqs), requests, "%s stream=%s" % (fault, stream))

    def test_404_names_the_url_and_the_likely_cause(self):
        with FakeLLM() as fake:
            # The fake serves /chat/completions and /v1/chat/completions: a
            # wrong root stands for a base_url without its /v1.
            root = "http://user:hunter2@127.0.0.1:%d/api" % fake.port
            for stream in (False, True):
                run = self.run_ok([{"text": "hi"}], options(fake, base_url=root, stream=stream))
                msg = self.assertTurnError(run.by_seq(1), "http_status")["error"]["message"]
                self.assertIn("for http://127.0.0.1:%d/api/chat/completions:" % fake.port, msg)
                self.assertIn("check base_url", msg)
                self.assertIn("/v1/chat/completions", msg)
                self.assertNotIn("hunter2", msg + run.stderr)
                self.assertNotIn("user:", msg)

    def test_unparsable_base_url_is_refused_by_create(self):
        for url in ("http://[::1/v1", "http://exa mple.com/v1", "http://host:99999/v1", "https://",
                    "http://host/v1?key=k"):
            run = run_shim([{"text": "hi"}], options(None, base_url=url))
            self.assertEqual(run.rc, 1, url)
            self.assertIn("option 'base_url'", run.stderr, url)


class ConnectionCap(ParleyTestCase):
    """Defect 4: excess turns wait for a connection instead of failing."""

    def run_under_nofile(self, nofile, opts, lines, concurrency, timeout):
        """parley-host with its descriptor limit at `nofile`; it must exit 0.
        Returns its output lines."""
        def low_limit():
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
        with tempfile.TemporaryDirectory() as d:
            opt_path = os.path.join(d, "options.json")
            with open(opt_path, "w") as f:
                json.dump(opts, f)
            res = subprocess.run([SHIM, "--plugin", PLUGIN, "--options", opt_path, "--jsonl",
                                  "--concurrency", str(concurrency)],
                                 input="".join(json.dumps(l) + "\n" for l in lines),
                                 capture_output=True, text=True, timeout=timeout * SLOW,
                                 preexec_fn=low_limit)
        self.assertEqual(res.returncode, 0, res.stderr[-2000:])
        return [json.loads(l) for l in res.stdout.splitlines() if l.strip()]

    def test_2000_turns_under_ulimit_256(self):
        lines = [{"text": "turn %d" % i} for i in range(2000)]
        with FakeLLM("--latency-ms", "20") as fake:
            out = self.run_under_nofile(256, options(fake, turn_timeout_ms=int(300000 * SLOW),
                                                     request_timeout_ms=int(60000 * SLOW)),
                                        lines, 2000, 280)
        errors = [l["error"] for l in out if l.get("error")]
        self.assertEqual(errors[:3], [])
        self.assertEqual(len(out), 2000)

    def test_cap_holds_across_multi_handles(self):
        # 300 connections take two of the worker's curl multi handles (256
        # each at most, llm_http.h): their caps must add up to 300 exactly.
        # 400 turns at once under a descriptor limit with room for 300
        # sockets but not 400: every turn succeeds only if the cap holds.
        lines = [{"text": "turn %d" % i} for i in range(400)]
        with FakeLLM("--latency-ms", str(int(200 * SLOW))) as fake:
            out = self.run_under_nofile(340, options(fake, max_connections=300,
                                                     turn_timeout_ms=int(120000 * SLOW),
                                                     request_timeout_ms=int(60000 * SLOW)),
                                        lines, 400, 120)
            served = len(fake.chat_requests())
        self.assertEqual([l["error"] for l in out if l.get("error")][:3], [])
        self.assertEqual(len(out), 400)
        self.assertEqual(served, 400)

    def test_timeouts_on_every_multi_handle(self):
        # 300 hung requests spread over two multi handles: each ends by its
        # request_timeout_ms, those on the second handle too.
        with FakeLLM() as fake:
            run = self.run_ok([{"text": "[[fault:hang]] %d" % i} for i in range(300)],
                              options(fake, max_connections=300, max_retries=0,
                                      request_timeout_ms=int(1000 * SLOW),
                                      turn_timeout_ms=int(60000 * SLOW)),
                              concurrency=300)
        for seq in range(1, 301):
            self.assertTurnError(run.by_seq(seq), "timeout")
        self.assertLess(run.elapsed, 30 * SLOW, "bounded by request_timeout_ms, not the turn's")

    def test_waiting_requests_are_not_failed_by_their_own_timeouts(self):
        # One connection, 300 ms per answer, 8 turns at once: the last waits
        # ~2.1 s for its connection, longer than its request_timeout_ms (1 s)
        # and its first-byte wait; it must still succeed.
        for stream in (False, True):
            with FakeLLM("--latency-ms", str(int(300 * SLOW))) as fake:
                run = self.run_ok([{"text": "turn %d" % i} for i in range(8)],
                                  options(fake, max_connections=1, stream=stream,
                                          request_timeout_ms=int(1000 * SLOW),
                                          connect_timeout_ms=int(1000 * SLOW),
                                          turn_timeout_ms=int(60000 * SLOW)),
                                  concurrency=8)
            for seq in range(1, 9):
                self.assertTurnOk(run.by_seq(seq))
            # They really waited for the one connection: one after the other.
            self.assertGreaterEqual(run.elapsed, 8 * 0.3 * SLOW * 0.9)


    def test_turns_waiting_for_a_connection_end_by_their_deadline(self):
        # The only connection hangs; five turns wait for it and end by their
        # turn_timeout_ms while waiting, as does the hung one; then the
        # connection is free again and the next turn succeeds.  Every one of
        # the six asks for a hang: a waiting turn whose deadline falls a
        # millisecond after the hung one's (the shim accepts them over a few
        # milliseconds on a loaded machine) may get the freed connection and
        # send its request before its own deadline, which is right; it then
        # hangs and times out too instead of being answered.
        lines = [{"text": "[[fault:hang]] %d" % i} for i in range(6)]
        lines.append({"text": "afterwards"})
        with FakeLLM() as fake:
            run = self.run_ok(lines, options(fake, max_connections=1,
                                             turn_timeout_ms=int(1000 * SLOW)), concurrency=6)
            reqs = fake.chat_requests()
        for seq in range(1, 7):
            self.assertTurnError(run.by_seq(seq), "timeout")
        self.assertTurnOk(run.by_seq(7))
        sent = [r["body"]["messages"][-1]["content"] for r in reqs]
        self.assertTrue(sent[0].startswith("[[fault:hang]]"), sent)
        self.assertEqual(sent[-1], "afterwards")
        # Without the cap all six would have gone out at once; with it, the
        # waiting ones stay queued (at most a straggler goes out after the
        # hung one ends).
        self.assertLess(len(sent) - 1, 6, sent)


class LogLines(ParleyTestCase):
    """Defect 5: log messages are whole and valid UTF-8."""

    def run_bytes(self, fake, text, **opt):
        with tempfile.TemporaryDirectory() as d:
            opt_path = os.path.join(d, "options.json")
            with open(opt_path, "w") as f:
                json.dump(options(fake, debug_log_bodies=True, **opt), f)
            return subprocess.run([SHIM, "--plugin", PLUGIN, "--options", opt_path, "--jsonl",
                                   "--log-level", "debug"],
                                  input=(json.dumps({"text": text}) + "\n").encode(),
                                  capture_output=True, timeout=60 * SLOW)

    def test_long_non_ascii_body_logged_whole(self):
        text = "Grüße aus Köln, 東京 " * 300  # ~9 KB, multi-byte characters throughout
        with FakeLLM() as fake:
            res = self.run_bytes(fake, text)
        err = res.stderr.decode("utf-8")  # strict: invalid UTF-8 raises
        request = [l for l in err.splitlines() if " request: " in l]
        self.assertEqual(len(request), 1, err[-2000:])
        body = json.loads(request[0].split(" request: ", 1)[1])
        self.assertEqual(body["messages"][-1]["content"], text)
        response = [l for l in err.splitlines() if " response: " in l]
        self.assertEqual(len(response), 1)
        json.loads(response[0].split(" response: ", 1)[1])  # whole: it parses

    def test_invalid_utf8_from_the_server_is_logged_valid(self):
        with FakeLLM("--fault", "invalid_utf8") as fake:
            res = self.run_bytes(fake, "hi")
        err = res.stderr.decode("utf-8")  # strict
        self.assertIn("\ufffd", [l for l in err.splitlines() if " response: " in l][0])


class TurnDeadline(ParleyTestCase):
    """Defect 6: turn_timeout_ms bounds async_process-to-done, queue included."""

    def test_five_queued_turns_end_by_the_deadline(self):
        # Each answer takes 1.1 s, the deadline is 2 s from acceptance: the
        # first turn makes it; the second cannot (it starts after 1.1 s and
        # needs 1.1 s more) and times out mid-request at 2 s, the other three
        # at the same moment, still queued.  Before, each got 2 s from its own
        # start: all five succeeded, the fifth after 5.5 s.
        lines = [{"text": "turn %d" % i, "conversation_id": "q"} for i in range(5)]
        lines.append({"op": "history", "conversation_id": "q"})
        with FakeLLM("--latency-ms", str(int(1100 * SLOW))) as fake:
            run = self.run_ok(lines, options(fake, turn_timeout_ms=int(2000 * SLOW),
                                             max_retries=0), concurrency=5, timeout=60)
            reqs = fake.chat_requests()
        self.assertTurnOk(run.by_seq(1))
        for seq in range(2, 6):
            res = self.assertTurnError(run.by_seq(seq), "timeout")
            self.assertIn("turn_timeout_ms", res["error"]["message"])
        self.assertGreaterEqual(len(reqs), 2)
        self.assertEqual(len(run.by_seq(6)["result"]["turns"]), 1)  # only turn 1 committed


class DoubleCompletion(unittest.TestCase):
    """complete_tool_call twice with one handle: not_found, never a use-after-free."""

    def test_second_completion_is_not_found(self):
        prog = os.path.join(BUILD, "tests", "stress", "parley-double-complete")
        with FakeLLM() as fake:
            res = subprocess.run([prog, PLUGIN, fake.base_url], capture_output=True, text=True,
                                 timeout=120 * SLOW)
        self.assertEqual(res.returncode, 0, (res.stdout + res.stderr)[-4000:])
        self.assertRegex(res.stdout, r"^\d+ passed, 0 failed$")


if __name__ == "__main__":
    unittest.main()
