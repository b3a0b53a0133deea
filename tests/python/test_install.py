"""After `cmake --install` to a prefix, a python3 with the documented
PYTHONPATH (and PKG_CONFIG_PATH, for a prefix pkg-config does not search)
imports parley, finds parley.so through pkg-config and holds a conversation
with a tool -- in a fresh interpreter, outside the source tree."""
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

from support import SLOW, FakeLLM, harness, options

SCRIPT = textwrap.dedent("""
    import asyncio, json, sys
    import parley

    async def turn_on(call):
        return {"ok": True, "name": call.arguments["name"]}

    async def main():
        async with parley.Agent(json.loads(sys.argv[1]), tools={"turn_on": turn_on}) as agent:
            r = await agent.process("turn on the kitchen light", "c1")
            again = await agent.process("and again?", "c1")
        print(json.dumps({"file": parley.__file__, "plugin": agent.plugin.path,
                          "response": r.response, "again": again.response}))

    asyncio.run(main())
""")


@unittest.skipUnless(shutil.which("cmake") and shutil.which("pkg-config"),
                     "needs cmake and pkg-config")
class InstallTest(unittest.TestCase):

    def test_installed_package_finds_the_plugin_and_converses(self):
        with tempfile.TemporaryDirectory(prefix="parley-install-") as prefix, FakeLLM() as fake:
            subprocess.run(["cmake", "--install", harness.BUILD, "--prefix", prefix],
                           check=True, capture_output=True, timeout=120 * SLOW)
            env = dict(os.environ)
            env.pop("PARLEY_PLUGIN", None)
            env["PYTHONPATH"] = os.path.join(prefix, "lib", "python3", "dist-packages")
            # parley.pc is in <prefix>/<libdir>/pkgconfig (libdir: lib, lib64, lib/<multiarch>).
            pc = glob.glob(os.path.join(prefix, "lib*", "**", "parley.pc"), recursive=True)
            self.assertEqual(len(pc), 1, pc)
            env["PKG_CONFIG_PATH"] = os.path.dirname(pc[0])
            with tempfile.TemporaryDirectory() as elsewhere:
                script = os.path.join(elsewhere, "installed.py")
                with open(script, "w") as f:
                    f.write(SCRIPT)
                proc = subprocess.run([sys.executable, script, json.dumps(options(fake))],
                                      capture_output=True, text=True, env=env, cwd=elsewhere,
                                      timeout=120 * SLOW)
            self.assertEqual(proc.returncode, 0, proc.stderr)
            out = json.loads(proc.stdout)
            self.assertTrue(out["file"].startswith(prefix), out)
            # Found through pkg-config: <prefix>/<libdir>/parley/parley.so.
            self.assertTrue(out["plugin"].startswith(prefix), out)
            self.assertTrue(out["plugin"].endswith("/parley/parley.so"), out)
            self.assertEqual(out["response"], 'Done. turn_on: {"ok":true,"name":"kitchen"} '
                                              '(messages: 4)')
            self.assertIn("I have seen 6 messages (2 from you)", out["again"])


if __name__ == "__main__":
    unittest.main()
