#!/usr/bin/env python3
"""The plugin's include rule and its store door (plugin/README.md), checked.

plugin/ is one folder per layer.  A file may include headers of its own folder
and of the folders below it in LAYERS, never of a folder above: dependencies
run one way.  Every quoted include is written from the plugin root
("lib/buf.h"), or is the public header "parley/plugin.h".  The layer order is
read from plugin/CMakeLists.txt (PARLEY_LAYERS), so the build and this check
cannot disagree.  Outside plugin/store/, no file calls a backend's table
directly (`s->backend->load(...)`): every store call goes through the door,
the store_*() functions of store/store.h.  Exit 0 when every include keeps the rule; else one line per
offending include and exit 1.
"""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "plugin")
INCLUDE = re.compile(r'\s*#\s*include\s+"([^"]+)"')
# A call or test of a backend's table: outside store/, only the door (store.h) may.
BACKEND_CALL = re.compile(r"->backend->|\bstore_\w+_backend\.\w+\s*\(")


def layers(root):
    text = open(os.path.join(root, "CMakeLists.txt"), encoding="utf-8").read()
    m = re.search(r"set\(PARLEY_LAYERS ([^)]*)\)", text)
    if not m:
        sys.exit("check_layers: PARLEY_LAYERS not found in plugin/CMakeLists.txt")
    return m.group(1).split()


def problems(root, order):
    rank = {name: i for i, name in enumerate(order)}
    out = []
    for entry in sorted(os.listdir(root)):
        path = os.path.join(root, entry)
        if os.path.isfile(path) and entry.endswith((".c", ".h")):
            out.append(f"plugin/{entry}: a source file outside every layer folder")
        if not os.path.isdir(path):
            continue
        if entry not in rank:
            out.append(f"plugin/{entry}/: a folder that is not a layer (add it to PARLEY_LAYERS)")
            continue
        for name in sorted(os.listdir(path)):
            if not name.endswith((".c", ".h")):
                continue
            with open(os.path.join(path, name), encoding="utf-8") as f:
                for lineno, line in enumerate(f, 1):
                    if entry != "store" and BACKEND_CALL.search(line):
                        out.append(f"plugin/{entry}/{name}:{lineno}: reaches into a store "
                                   "backend's table: call the door (store_*() in store/store.h)")
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    inc = m.group(1)
                    where = f"plugin/{entry}/{name}:{lineno}"
                    top = inc.split("/")[0]
                    if inc == "parley/plugin.h":
                        continue
                    if "/" not in inc or top not in rank or ".." in inc.split("/"):
                        out.append(f'{where}: "{inc}" is not written from the plugin root '
                                   f'("<layer>/<file>.h")')
                    elif rank[top] > rank[entry]:
                        out.append(f'{where}: {entry}/ may not include {inc}: {top}/ is above '
                                   f"{entry}/ (order: {' < '.join(order)})")
    return out


def self_test():
    """The check must be able to fail: a tree with each kind of fault."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        for d in ("lib", "turn"):
            os.mkdir(os.path.join(tmp, d))
        with open(os.path.join(tmp, "CMakeLists.txt"), "w") as f:
            f.write("set(PARLEY_LAYERS lib turn)\n")
        with open(os.path.join(tmp, "lib", "a.c"), "w") as f:
            f.write('#include "turn/t.h"\n#include "b.h"\n#include "../turn/t.h"\n')
        with open(os.path.join(tmp, "turn", "t.c"), "w") as f:
            f.write('#include "lib/a.h"\n#include "parley/plugin.h"\n'
                    "x = s->backend->load(s);\n")
        with open(os.path.join(tmp, "stray.c"), "w") as f:
            f.write("")
        got = problems(tmp, layers(tmp))
    want = ["plugin/lib/a.c:1: lib/ may not include", 'plugin/lib/a.c:2: "b.h"',
            'plugin/lib/a.c:3: "../turn/t.h"', "plugin/stray.c",
            "plugin/turn/t.c:3: reaches into a store backend's table"]
    missing = [w for w in want if not any(g.startswith(w) for g in got)]
    if missing or len(got) != len(want):
        print("check_layers self-test FAILED; got:", *got, sep="\n  ")
        return 1
    print(f"check_layers self-test: {len(got)} planted faults found")
    return 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    order = layers(ROOT)
    found = problems(ROOT, order)
    for line in found:
        print(line)
    print(f"check_layers: {len(found)} problem(s) in plugin/ (layers: {' < '.join(order)})")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
