#!/usr/bin/env python3
"""Test hooks stay out of the plugin users get (plugin/CMakeLists.txt).

A plugin header declares a function that exists only for the tests inside
`#ifdef PARLEY_TEST_HOOKS` ... `#endif`.  parley_core (what the tests link) is
built with that definition, parley.so without it.  Usage:
    check_test_hooks.py PLUGIN_SO CORE_ARCHIVE
Exit 0 when every such function is defined in CORE_ARCHIVE (so the check is
not vacuous; a static inline one is the test's own and is not looked for there)
and none appears in PLUGIN_SO's symbols; else one line per fault and exit 1.
"""
import os
import re
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "plugin")
BLOCK = re.compile(r"^#\s*ifdef\s+PARLEY_TEST_HOOKS\s*$(.*?)^#\s*endif", re.M | re.S)
DECLARED = re.compile(r"^([A-Za-z_][\w \t*]*?)\b(\w+)\s*\(", re.M)


def hooks(root):
    names = {}
    for folder, _, files in os.walk(root):
        for f in sorted(files):
            if f.endswith(".h"):
                path = os.path.join(folder, f)
                text = open(path, encoding="utf-8").read()
                for block in BLOCK.findall(text):
                    for kind, name in DECLARED.findall(block):
                        inline = kind.startswith("static")
                        names[name] = (os.path.relpath(path, os.path.dirname(root)), inline)
    return names


def defined(path):
    out = subprocess.run(["nm", "--defined-only", path], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("check_test_hooks: nm %s failed: %s" % (path, out.stderr.strip()))
    return {line.split()[-1] for line in out.stdout.splitlines() if len(line.split()) >= 2}


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    plugin, core = defined(sys.argv[1]), defined(sys.argv[2])
    faults = []
    for name, (header, inline) in sorted(hooks(ROOT).items()):
        if not inline and name not in core:
            faults.append("%s: test hook %s is not in %s" % (header, name, sys.argv[2]))
        if name in plugin:
            faults.append("%s: test hook %s is in %s" % (header, name, sys.argv[1]))
    for f in faults:
        print(f)
    return 1 if faults else 0


if __name__ == "__main__":
    sys.exit(main())
