#!/usr/bin/env bash
# Parley's main job: a short conversation through the host shim.
#
#   scripts/demo.sh                     offline: against the bundled fake LLM, scripted
#   scripts/demo.sh --interactive       offline, and you type: chat with the fake LLM
#   scripts/demo.sh --options FILE      interactive: against the LLM your options name
#
# The offline run shows multi-turn memory (the fake model reports how many
# messages it was sent), a tool call the host executes (the demo home), and
# then memory across a restart: two processes on one SQLite history file.
set -euo pipefail
cd "$(dirname "$0")/.."
# PARLEY_BUILD_DIR: use that (already built) build tree instead of building build/.
BUILD=${PARLEY_BUILD_DIR:-}
if [ -z "$BUILD" ]; then
  BUILD=build
  bash scripts/setup.sh
  cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build build -j"$(nproc)" >/dev/null
fi

SHIM=$BUILD/host-shim/parley-host
HOST_BIN=$SHIM   # the coproc below reuses the name SHIM for its file descriptors
PLUGIN=$BUILD/plugin/parley.so

if [ "${1:-}" = "--options" ]; then
  exec "$SHIM" --plugin "$PLUGIN" --options "$2" --tools demo --set auto_create_conversation_id=true
fi

work=$(mktemp -d)
cleanup() { [ -n "${FAKE_PID:-}" ] && kill "$FAKE_PID" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

"$BUILD"/tests/fake-llm/parley-fake-llm --port 0 --port-file "$work/port" --quiet >/dev/null &
FAKE_PID=$!
for _ in $(seq 100); do [ -s "$work/port" ] && break; sleep 0.05; done
port=$(cat "$work/port")
cat >"$work/options.json" <<JSON
{"base_url": "http://127.0.0.1:$port/v1", "model": "fake-model",
 "auto_create_conversation_id": true, "max_history_turns": 20}
JSON

if [ "${1:-}" = "--interactive" ]; then
  echo "Chat with the offline fake LLM. It echoes what you say and counts the messages it was"
  echo "sent; [[tool:turn_on {\"name\":\"kitchen\"}]] in a message makes it call a demo-home tool."
  echo "/help lists the commands; Ctrl-C cancels a turn, Ctrl-C at the prompt or /quit leaves."
  "$SHIM" --plugin "$PLUGIN" --options "$work/options.json" --tools demo --set stream=true \
    || true   # Ctrl-C at the prompt exits 130: still clean up the fake LLM
  exit 0
fi

echo "Parley demo: plugin $PLUGIN, offline fake LLM on 127.0.0.1:$port, demo home tools"
coproc SHIM { "$SHIM" --plugin "$PLUGIN" --options "$work/options.json" --tools demo 2>&1; }
IFS= read -r banner <&"${SHIM[0]}"   # "parley X: model M at URL, ..."
printf '%s\n\n' "$banner"
say() {
  printf 'you> %s\n' "$1"
  printf '%s\n' "$1" >&"${SHIM[1]}"
  local out
  while IFS= read -r out <&"${SHIM[0]}"; do
    printf '%s\n' "$out"
    case "$out" in parley\>*|parley!*) break ;; esac
  done
  echo
}
say "Hello! I just got home."
say "Please turn on the kitchen light."
say "Is the kitchen light on now?"
say "Thanks. Do you remember what I said first? [[recall]]"
printf '/history\n/quit\n' >&"${SHIM[1]}"
echo "history as the plugin stores it (/history):"
cat <&"${SHIM[0]}"

# Durable history: two separate processes on one SQLite file; the second
# remembers what the first was told (history_store "sqlite:PATH").
echo
echo "memory across a restart: two processes, history_store \"sqlite:$work/history.db\""
once() { # one host process: one JSON line in, the answer's text out
  printf '%s\n' "$1" | "$HOST_BIN" --plugin "$PLUGIN" --options "$work/options.json" --jsonl \
    --set "history_store=sqlite:$work/history.db" \
    | python3 -c 'import json,sys; l=json.loads(sys.stdin.readline()); print(l.get("response") or l.get("error"))'
}
printf 'process 1, you> My name is Ada.\n'
printf 'process 1, parley> %s\n' "$(once '{"text": "My name is Ada.", "conversation_id": "kitchen"}')"
printf 'process 2, you> What did I tell you first? [[recall]]\n'
printf 'process 2, parley> %s\n' "$(once '{"text": "What did I tell you first? [[recall]]", "conversation_id": "kitchen"}')"
