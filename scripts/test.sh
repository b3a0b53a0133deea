#!/usr/bin/env bash
# Build Parley and run the whole test suite, the way CI does:
#   1. a normal build (-Wall -Wextra -Werror), every test;
#   2. an ASan+UBSan build, every test;
#   3. a TSan build, the concurrency tests (label "tsan");
#   4. valgrind on one end-to-end conversation (zero leaks, zero errors);
#   5. libFuzzer targets, a fixed number of runs each.
# Usage: scripts/test.sh [--quick]   (--quick: step 1 only)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

JOBS=$(nproc)
quick=0
[ "${1:-}" = "--quick" ] && quick=1

step() { printf '\n==== %s ====\n' "$*"; }

# Every stage's test count adds up to one closing line.
passed=0
count() { # run a test command, echo its output, add its "N tests" to the total
  local out rc=0
  out=$(mktemp)
  "$@" 2>&1 | tee "$out" || rc=$?
  local n
  n=$(sed -n 's/.*tests passed, 0 tests failed out of \([0-9]*\).*/\1/p; s/^Ran \([0-9]*\) tests\{0,1\} in .*/\1/p' "$out" | tail -n1)
  rm -f "$out"
  if [ "$rc" -ne 0 ]; then
    printf 'total: %d passed, 1 failed\n' "$passed"
    exit "$rc"
  fi
  passed=$((passed + ${n:-0}))
}

build() { # dir, extra cmake args...   (TARGETS="a b" builds only those)
  local dir=$1; shift
  cmake -S . -B "$dir" -DPARLEY_WERROR=ON "$@" >/dev/null
  if [ -n "${TARGETS:-}" ]; then
    # shellcheck disable=SC2086
    cmake --build "$dir" -j"$JOBS" --target $TARGETS >/dev/null
  else
    cmake --build "$dir" -j"$JOBS" >/dev/null
  fi
}

step "normal build + all tests"
build build -DCMAKE_BUILD_TYPE=RelWithDebInfo
count ctest --test-dir build --output-on-failure -j"$JOBS"
if [ $quick = 1 ]; then printf 'total: %d passed, 0 failed\n' "$passed"; exit 0; fi

step "ASan+UBSan build + all tests"
build build-asan -DCMAKE_BUILD_TYPE=Debug -DPARLEY_SANITIZE=address,undefined
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
PARLEY_TEST_SLOWDOWN=2 count ctest --test-dir build-asan --output-on-failure -j"$JOBS"

step "TSan build + concurrency tests"
build build-tsan -DCMAKE_BUILD_TYPE=Debug -DPARLEY_SANITIZE=thread -DCMAKE_C_COMPILER=clang
TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 PARLEY_TEST_SLOWDOWN=4 \
  count ctest --test-dir build-tsan --output-on-failure -L tsan

step "valgrind: one end-to-end conversation"
PARLEY_VALGRIND=1 PARLEY_BUILD_DIR="$PWD/build" PARLEY_TEST_SLOWDOWN=10 \
  count bash -c "cd tests/integration && python3 -m unittest -v valgrind_check"

step "libFuzzer targets"
TARGETS="fuzz_reply_decode fuzz_sse_stream fuzz_anthropic_stream fuzz_ndjson_stream fuzz_options fuzz_jsonl" \
  build build-fuzz -DCMAKE_BUILD_TYPE=Debug -DPARLEY_FUZZ=ON -DCMAKE_C_COMPILER=clang
count ctest --test-dir build-fuzz --output-on-failure -L fuzz

step "all test stages passed"
printf 'total: %d passed, 0 failed\n' "$passed"
