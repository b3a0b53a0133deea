"""history_query cursors are taken only as Parley wrote them, on every store (issue 27, item 13).

A forged cursor -- the same query's fingerprint with the position written otherwise: upper-case
hex, a sign, "0x", leading zeros, 17 digits, 2^63 or more -- used to page one way on memory and
Redis and the other way on SQLite.  Now each is invalid_input naming "cursor", on every store,
and the cursor Parley gave still pages."""
import os
import tempfile
import unittest

from harness import FakeLLM, ParleyTestCase, options
from redis_server import RedisServer

FORGED = ["8000000000000000", "ffffffffffffffff", "0%s", "+%s", "0x%s", "%S", "1%s0000000000000000"]


class Cursors(ParleyTestCase):
    def setUp(self):
        self.llm = FakeLLM()
        self.addCleanup(self.llm.close)

    def stores(self):
        d = tempfile.TemporaryDirectory(prefix="parley-cursors-")
        self.addCleanup(d.cleanup)
        server = RedisServer()
        self.addCleanup(server.stop)
        return {"memory": "memory", "sqlite": "sqlite:" + os.path.join(d.name, "history.db"),
                "redis": server.url}

    def test_only_canonical_cursors_page_on_every_store(self):
        for name, store in self.stores().items():
            with self.subTest(store=name):
                opts = options(self.llm, history_store=store)
                lines = [{"text": "message %d" % i, "conversation_id": "c"} for i in range(3)]
                lines.append({"op": "query", "limit": 2})
                page = self.run_ok(lines, opts).by_seq(4)["result"]
                cursor = page["next_cursor"]
                head, pos = cursor.rsplit(".", 1)
                self.assertEqual(pos, pos.lower())
                forged = [head + "." + (f % pos if "%s" in f else f.replace("%S", pos.upper()))
                          for f in FORGED]
                forged = [c for c in forged if c != cursor]  # "%S" of a digits-only position
                # The memory store forgets between runs but numbers messages alike: the same
                # turns again give the same positions (the stored stores just hold more).
                queries = [{"op": "query", "limit": 2, "cursor": c} for c in [cursor] + forged]
                run = self.run_ok(lines[:3] + queries, opts)
                self.assertIsNone(run.by_seq(4)["error"], run.by_seq(4))
                self.assertEqual(len(run.by_seq(4)["result"]["messages"]), 2)
                for seq, c in enumerate(forged, start=5):
                    err = run.by_seq(seq)["error"]
                    self.assertIsNotNone(err, (c, run.by_seq(seq)))
                    self.assertEqual(err["code"], "invalid_input", (c, err))
                    self.assertIn("cursor", err["message"])


if __name__ == "__main__":
    unittest.main()
