"""The agent's metrics in the Prometheus text format (parley_plugin.metrics_prometheus),
scraped over HTTP from the shim's --metrics-listen and checked with `promtool check
metrics` (Debian's prometheus package; scripts/setup.sh installs it).  On the memory store,
an SQLite file and a Redis server: counters only grow, gauges say what is stored now, labels
are persona / interface_type / reason / outcome and never a conversation id."""
import os
import re
import shutil
import socket
import subprocess
import tempfile
import unittest
import urllib.error
import urllib.request

from redis_server import RedisServer
from harness import FakeLLM, InteractiveShim, ParleyTestCase, options, run_shim

SAMPLE = re.compile(r'^([a-z_]+)(?:\{(.*)\})? (\d+)$')


def free_port():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def parse(text):
    """{(name, frozenset of (label, value)): value} of every sample."""
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        m = SAMPLE.match(line)
        assert m, "not a sample line: %r" % line
        labels = frozenset(re.findall(r'([a-z_]+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        out[(m.group(1), labels)] = int(m.group(3))
    return out


def value(samples, name, **labels):
    return samples.get((name, frozenset(labels.items())), 0)


class PrometheusCase(ParleyTestCase):
    maxDiff = None
    STORE = "memory"

    def store(self):
        if self.STORE == "memory":
            return "memory"
        if self.STORE == "redis":
            server = RedisServer()
            self.addCleanup(server.stop)
            return server.url
        d = tempfile.TemporaryDirectory(prefix="parley-prom-")
        self.addCleanup(d.cleanup)
        return "sqlite:" + os.path.join(d.name, "history.db")

    def scrape(self, port):
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as r:
            self.assertEqual(r.status, 200)
            self.assertEqual(r.headers["Content-Type"], "text/plain; version=0.0.4; charset=utf-8")
            text = r.read().decode()
        promtool = shutil.which("promtool")
        self.assertIsNotNone(promtool, "promtool missing: scripts/setup.sh installs Debian's "
                                       "prometheus package")
        check = subprocess.run([promtool, "check", "metrics"], input=text.encode(),
                               capture_output=True, timeout=60)
        self.assertEqual(check.returncode, 0, (check.stdout, check.stderr, text))
        return text, parse(text)

    def test_scrape_counts_gauges_switches_and_clears(self):
        port = free_port()
        with FakeLLM() as fake:
            opts = options(fake, history_store=self.store(), max_history_turns=1,
                           summarize=False,  # no summary requests beside the turns'
                           history_keep_turns=5,
                           personas={"chef": {"prompt": "You are a chef."}})
            with InteractiveShim(opts, extra_args=("--metrics-listen", "127.0.0.1:%d" % port)) \
                    as sh:
                for line in ({"text": "one", "conversation_id": "secret-42",
                              "interface_type": "telegram", "persona": "chef"},
                             {"text": "two", "conversation_id": "secret-42",
                              "interface_type": "telegram", "persona": "chef"},
                             {"text": "three", "conversation_id": "secret-42",
                              "interface_type": "telegram"},
                             {"text": "four", "conversation_id": "secret-42",
                              "interface_type": "telegram", "persona": "chef"},
                             {"text": "web", "conversation_id": "w"}):
                    self.assertTurnOk(sh.turn(line))
                first_text, first = self.scrape(port)
                self.assertIsNone(sh.op("clear", conversation_id="w")["error"])
                self.assertIsNone(sh.op("clear")["error"])  # the other two
                _, after = self.scrape(port)
                json_metrics = sh.op("metrics")["result"]
                # anything else is not served
                with self.assertRaises(urllib.error.HTTPError) as cm:
                    urllib.request.urlopen("http://127.0.0.1:%d/other" % port, timeout=10)
                self.assertEqual(cm.exception.code, 404)
        self.assertNotIn("secret-42", first_text, "never a conversation id as a label")
        chef = {"persona": "chef", "interface_type": "telegram"}
        plain = {"persona": "", "interface_type": "telegram"}
        self.assertEqual(value(first, "parley_turns_total", outcome="ok", **chef), 3)
        self.assertEqual(value(first, "parley_turns_total", outcome="ok", **plain), 1)
        self.assertEqual(value(first, "parley_turns_total", outcome="ok", persona="",
                               interface_type=""), 1)
        self.assertEqual(value(first, "parley_messages_stored_total", **chef), 6)
        self.assertEqual(value(first, "parley_turns_stored_total", **chef), 3)
        # chef's third turn ("four") had two turns before it; max_history_turns sends one
        self.assertEqual(value(first, "parley_history_cut_turns_total", **chef), 1)
        self.assertEqual(value(first, "parley_persona_switches_total", **{"from": "chef",
                                                                         "to": ""}), 1)
        self.assertEqual(value(first, "parley_persona_switches_total", **{"from": "",
                                                                         "to": "chef"}), 1)
        self.assertEqual(value(first, "parley_conversations"), 3)
        self.assertEqual(value(first, "parley_stored_turns"), 5)
        self.assertEqual(value(first, "parley_stored_messages"), 10)
        self.assertGreater(value(first, "parley_stored_message_bytes"), 0)
        self.assertEqual(value(first, "parley_llm_requests_total"), 5)
        self.assertEqual(value(first, "parley_turns_in_flight"), 0)
        # gauges now, counters never down
        self.assertEqual(value(after, "parley_conversations"), 0)
        self.assertEqual(value(after, "parley_stored_turns"), 0)
        self.assertEqual(value(after, "parley_stored_messages"), 0)
        self.assertEqual(value(after, "parley_stored_message_bytes"), 0)
        self.assertEqual(value(after, "parley_conversations_cleared_total", reason="host"), 3)
        self.assertEqual(json_metrics["personas"]["chef"]["clears"], 1,
                         "a clear-all counts as a clear of each persona's conversation")
        for key, v in first.items():
            if key[0].endswith("_total"):
                self.assertGreaterEqual(after.get(key, 0), v, key)

    def test_turns_the_store_trims_are_counted(self):
        """With history_keep_turns = max_history_turns the store drops the older turns, and
        parley_history_trimmed_turns_total says so."""
        port = free_port()
        with FakeLLM() as fake:
            opts = options(fake, history_store=self.store(), max_history_turns=2,
                           history_keep_turns=2, summarize=False)
            with InteractiveShim(opts, extra_args=("--metrics-listen", "127.0.0.1:%d" % port)) \
                    as sh:
                for text in ("one", "two", "three", "four"):
                    self.assertTurnOk(sh.turn({"text": text, "conversation_id": "t"}))
                _, samples = self.scrape(port)
        self.assertEqual(value(samples, "parley_history_trimmed_turns_total"), 2)
        self.assertEqual(value(samples, "parley_stored_turns"), 2)
        self.assertEqual(value(samples, "parley_stored_messages"), 4)

    def test_listen_address_must_be_loopback(self):
        with FakeLLM() as fake:
            for spec in ("0.0.0.0:9464", "192.168.1.2:9464", "127.0.0.1:0", "127.0.0.1",
                         "localhost:http"):
                run = run_shim([], options(fake), extra_args=("--metrics-listen", spec))
                self.assertEqual(run.rc, 2, (spec, run.stderr))
                self.assertIn("--metrics-listen", run.stderr)


class SqlitePrometheusCase(PrometheusCase):
    STORE = "sqlite"


class RedisPrometheusCase(PrometheusCase):
    STORE = "redis"


if __name__ == "__main__":
    unittest.main()
