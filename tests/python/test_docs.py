"""The complete example of docs/python.md runs as written (against the fake LLM)."""
import os
import re
import subprocess
import sys
import tempfile
import unittest

from support import BINDING, PLUGIN, SLOW, SOURCE, FakeLLM


class DocsExampleTest(unittest.TestCase):

    def test_complete_example_runs(self):
        with open(os.path.join(SOURCE, "docs", "python.md")) as f:
            code = re.search(r"## A complete example\n\n```python\n(.*?)```", f.read(),
                             re.S).group(1)
        with FakeLLM() as fake, tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "example.py")
            with open(path, "w") as f:
                f.write(code)
            env = dict(os.environ, PYTHONPATH=BINDING, PARLEY_PLUGIN=PLUGIN,
                       PARLEY_BASE_URL=fake.base_url, PARLEY_MODEL="fake-model")
            proc = subprocess.run([sys.executable, path], capture_output=True, text=True,
                                  env=env, timeout=60 * SLOW)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        lines = proc.stdout.splitlines()
        self.assertEqual(lines[0], 'Done. turn_on: {"ok":true,"light":"kitchen"} (messages: 4)')
        self.assertEqual(lines[1], "['tool_call', 'tool_result', 'answer']")
        self.assertIn('You said: "thanks, anything else?"', proc.stdout)
        self.assertIn("keep listening: False", proc.stdout)
        self.assertIn("2 turns stored", proc.stdout)
        self.assertIn("no such conversation: not_found", proc.stdout)


if __name__ == "__main__":
    unittest.main()
