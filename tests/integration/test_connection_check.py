"""The connection check a setup screen calls (parley_plugin.check_connection,
`parley-host --check`) and the options schema a settings form renders
(`parley-host --print-schema`).

The check is asserted as a person would read it: the exit code, the JSON on
stdout, and that the error message says what to do; plus, from the fake LLM's
request log, that it sent the same Authorization header a turn sends."""
import http.server
import json
import os
import subprocess
import tempfile
import threading
import time
import unittest

from harness import PLUGIN, SHIM, SLOW, FakeLLM, options
from test_basic import closed_port


def check(opts, timeout=60):
    """Run `parley-host --check`; returns (exit code, parsed stdout, stderr)."""
    with tempfile.TemporaryDirectory(prefix="parley-check-") as d:
        path = os.path.join(d, "options.json")
        with open(path, "w") as f:
            json.dump(opts, f)
        res = subprocess.run([SHIM, "--plugin", PLUGIN, "--options", path, "--check"],
                             capture_output=True, text=True, timeout=timeout * SLOW)
    out = json.loads(res.stdout) if res.stdout.strip() else None
    return res.returncode, out, res.stderr


class GetStub:
    """A loopback server answering every GET with one scripted (status, body),
    or never answering when hang is set."""

    def __init__(self, status=200, body="", hang=False):
        self.paths, self.auth = [], []
        release = self.release = threading.Event()
        stub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                stub.paths.append(self.path)
                stub.auth.append(self.headers.get("Authorization"))
                if hang:
                    release.wait(60)
                    return
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.root = "http://127.0.0.1:%d" % self.server.server_address[1]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


class ConnectionCheck(unittest.TestCase):
    def assertFails(self, opts, code, *phrases):
        rc, out, err = check(opts)
        self.assertEqual(rc, 1, (out, err))
        self.assertEqual(out["ok"], False, out)
        self.assertEqual(out["error"]["code"], code, out)
        for p in phrases:
            self.assertIn(p, out["error"]["message"])
        self.assertNotIn("sk-secret", json.dumps(out), "the key is never shown")
        return out["error"]["message"]

    def test_lists_the_fake_llm_models_with_the_turns_auth_header(self):
        with FakeLLM() as fake:
            rc, out, err = check(options(fake, api_key="sk-secret"))
            reqs = fake.requests()
        self.assertEqual(rc, 0, err)
        self.assertEqual(out, {"ok": True, "url": fake.base_url + "/models",
                               "models": ["fake-model"]})
        self.assertEqual([(r["method"], r["path"]) for r in reqs], [("GET", "/v1/models")])
        self.assertEqual(reqs[0]["authorization"], "Bearer sk-secret")

    def test_closed_port_says_nothing_listens(self):
        url = "http://127.0.0.1:%d/v1" % closed_port()
        msg = self.assertFails(options(base_url=url), "connect", "nothing listens at " + url,
                               "is the server running?")
        self.assertIn(url + "/models", msg)

    def test_refused_key(self):
        with GetStub(401, '{"error":{"message":"Incorrect API key provided"}}') as stub:
            self.assertFails(options(base_url=stub.root + "/v1", api_key="sk-secret"),
                             "http_status", "the server refused the API key",
                             "Incorrect API key provided")
            self.assertEqual(stub.auth, ["Bearer sk-secret"])

    def test_refused_key_quoted_back_by_the_server_is_redacted(self):
        key = "sk-secret-Quoted9f2c"
        body = '{"error":{"message":"Incorrect API key provided: Bearer %s"}}' % key
        with GetStub(401, body) as stub:
            msg = self.assertFails(options(base_url=stub.root + "/v1", api_key=key),
                                   "http_status", "the server refused the API key",
                                   "Incorrect API key provided: Bearer [redacted]")
            self.assertEqual(stub.auth, ["Bearer " + key])
        self.assertNotIn("Quoted9f2c", msg)

    def test_a_key_given_as_api_key_env_is_not_quoted(self):
        # The key put where the variable's name goes: refused, never repeated.
        msg = self.assertFails(options(api_key_env="sk-secret-proj-Ab12Cd34"), "invalid_options",
                               "option 'api_key_env': the value looks like an API key")
        self.assertNotIn("Ab12Cd34", msg)

    def test_missing_key(self):
        with GetStub(401, '{"error":"unauthorized"}') as stub:
            self.assertFails(options(base_url=stub.root + "/v1"), "http_status",
                             "the server wants an API key", "api_key_env")
            self.assertEqual(stub.auth, [None])

    def test_404_without_v1_hints_at_v1(self):
        with GetStub(404, '{"detail":"Not Found"}') as stub:
            msg = self.assertFails(options(base_url=stub.root), "http_status",
                                   stub.root + "/models", "HTTP 404", "/v1")
            self.assertEqual(stub.paths, ["/models"])
        self.assertIn("Not Found", msg)

    def test_not_a_model_list(self):
        with GetStub(200, "<html>router login</html>") as stub:
            self.assertFails(options(base_url=stub.root + "/v1"), "bad_response",
                             "not with a model list")

    def test_no_answer_is_a_timeout(self):
        with GetStub(hang=True) as stub:
            start = time.time()
            self.assertFails(options(base_url=stub.root + "/v1",
                                     request_timeout_ms=int(300 * SLOW)),
                             "timeout", "did not answer within request_timeout_ms")
        self.assertLess(time.time() - start, 30 * SLOW, "bounded by the request timeout")

    def test_https_to_a_plain_http_server_names_tls(self):
        with GetStub(200, "{}") as stub:
            url = stub.root.replace("http://", "https://") + "/v1"
            self.assertFails(options(base_url=url), "connect", "TLS", url)

    def test_bad_options_name_the_option(self):
        rc, out, err = check({"model": "m", "temprature": 1})
        self.assertEqual(rc, 1, err)
        self.assertEqual(out["error"]["code"], "invalid_options")
        self.assertIn("did you mean 'temperature'?", out["error"]["message"])


class PrintSchema(unittest.TestCase):
    def test_print_schema_needs_no_options(self):
        res = subprocess.run([SHIM, "--plugin", PLUGIN, "--print-schema"], capture_output=True,
                             text=True, timeout=30 * SLOW)
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertIn('\n  "properties": {', res.stdout, "pretty-printed")
        schema = json.loads(res.stdout)
        props = schema["properties"]
        for name, p in props.items():
            self.assertTrue(p.get("title"), name)
            self.assertIn(p.get("x-group"), ("basic", "advanced"), name)
        self.assertEqual(props["api_key"]["writeOnly"], True)
        self.assertEqual(props["api_key"]["format"], "password")
        self.assertEqual(props["base_url"]["format"], "uri")
        self.assertEqual(props["tools"]["items"]["type"], "object")
        self.assertTrue(schema["examples"])


if __name__ == "__main__":
    unittest.main()
