#!/bin/sh
# Assemble the integration as the one folder to copy into Home Assistant's
# custom_components/: the integration, the Python binding inside it, and,
# when given, the plugin next to the binding.
#
#   examples/home_assistant/package.sh OUT_DIR [path/to/parley.so]
#
# prints OUT_DIR/parley_conversation.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:?usage: package.sh OUT_DIR [path/to/parley.so]}
dest="$out/parley_conversation"
rm -rf "$dest"
mkdir -p "$out"
cp -R "$here/custom_components/parley_conversation" "$dest"
cp -R "$root/bindings/python/parley" "$dest/parley"
find "$dest" -name __pycache__ -prune -exec rm -rf {} +
if [ $# -ge 2 ]; then
    cp "$2" "$dest/parley/parley.so"
fi
echo "$dest"
