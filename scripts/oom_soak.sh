#!/usr/bin/env bash
# Out-of-memory soak of the whole agent: parley-host runs with tests/tools/failmalloc.so
# preloaded, failing allocations at random (worker thread, libcurl, the SQLite, Redis and
# memory stores, tools, summaries, history calls), then the history is read back without
# failures and every turn checked whole (tests/tools/oom_soak.py says what is checked).
# Not part of the test command: what it finds depends on thread timing.
#   scripts/oom_soak.sh [SECONDS] [--seed N] [--valgrind-every N]     (default 120 s)
# Failing iterations are kept in build-oom/oom-soak-failures/; the script then fails.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-120}
case $seconds in '' | *[!0-9]*) echo "usage: scripts/oom_soak.sh [SECONDS] [--seed N] [--valgrind-every N]" >&2; exit 2 ;; esac
shift || true
bash scripts/setup.sh
# A tree of its own without sanitizers: they replace malloc, and failmalloc with it.
cmake -S . -B build-oom -DPARLEY_WERROR=ON -DPARLEY_SANITIZE= >/dev/null
cmake --build build-oom -j"$(nproc)" --target parley parley-host parley-fake-llm failmalloc >/dev/null
rm -rf build-oom/oom-soak-failures
PARLEY_BUILD_DIR=$PWD/build-oom exec python3 tests/tools/oom_soak.py "$seconds" \
  --lib build-oom/tests/failmalloc.so --out build-oom/oom-soak-failures "$@"
