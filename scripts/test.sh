#!/usr/bin/env bash
# Build Parley and run the whole test suite, the way CI does:
#   1. a normal build (-Wall -Wextra -Werror), every test;
#   2. an ASan+UBSan build, every test;
#   3. a TSan build, the concurrency tests (label "tsan");
#   4. valgrind on one end-to-end conversation (zero leaks, zero errors);
#   5. libFuzzer targets, a fixed number of runs each.
# Usage: scripts/test.sh [--quick]   (--quick: step 1 only)
#
# Each stage prints condensed progress with elapsed times (targets built,
# tests finished, a heartbeat while something long runs); full logs are in
# build-logs/.  The closing line counts individual tests (unit checks,
# unittest cases, fuzz targets, ...: see scripts/test_progress.py) and keeps
# exactly the form CI reads:  total: N passed, N failed
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

JOBS=$(nproc)
quick=0
[ "${1:-}" = "--quick" ] && quick=1

LOGS=build-logs
mkdir -p "$LOGS"
rm -f "$LOGS"/*.log
PROGRESS="python3 scripts/test_progress.py"
PARLEY_TEST_T0=$(date +%s.%N)   # the progress lines' clock: time since this script started
export PARLEY_TEST_T0
T0=$SECONDS
stage_start=$SECONDS
step() {
  stage_start=$SECONDS
  printf '\n==== %s ====  (started at %s)\n' "$*" "$(elapsed $((SECONDS - T0)))"
}
elapsed() { printf '%d:%02d' $(($1 / 60)) $(($1 % 60)); }
stage_done() { printf '  stage took %s\n' "$(elapsed $((SECONDS - stage_start)))"; }

passed=0
failed=0
finish() {
  printf '\nall stages took %s\n' "$(elapsed $((SECONDS - T0)))"
  printf 'total: %d passed, %d failed\n' "$passed" "$failed"
}

# count MODE NAME CMD...: run a test command (MODE ctest: `ctest -V ...`;
# unittest: one Python unittest run), show progress, add its individual
# tests to the totals.  Stops the run after a failing stage.
count() {
  local mode=$1 name=$2; shift 2
  local log="$LOGS/$name.log" counts rc=0
  counts=$(mktemp)
  echo "  running: $*  (log: $log)"
  "$@" 2>&1 | $PROGRESS "$mode" "$log" "$counts" || rc=$?
  local p=0 f=0
  read -r p f <"$counts" || true
  rm -f "$counts"
  [ "$rc" -ne 0 ] && [ "$f" -eq 0 ] && f=1
  passed=$((passed + p))
  failed=$((failed + f))
  printf '  %s: %d passed, %d failed\n' "$name" "$p" "$f"
  stage_done
  if [ "$rc" -ne 0 ] || [ "$f" -ne 0 ]; then
    finish
    exit 1
  fi
}

build() { # dir, extra cmake args...   (TARGETS="a b" builds only those)
  local dir=$1; shift
  local log="$LOGS/build-$(basename "$dir").log" rc=0
  echo "  configuring $dir  (log: $log)"
  cmake -S . -B "$dir" -DPARLEY_WERROR=ON "$@" >"$log" 2>&1 || rc=$?
  if [ "$rc" -eq 0 ]; then
    echo "  building $dir${TARGETS:+ (targets: $TARGETS)}"
    # shellcheck disable=SC2086
    cmake --build "$dir" -j"$JOBS" ${TARGETS:+--target $TARGETS} 2>&1 \
      | $PROGRESS build "$log" || rc=$?
  fi
  if [ "$rc" -ne 0 ]; then
    echo "  build of $dir FAILED; the end of $log:"
    tail -n 40 "$log"
    failed=$((failed + 1))
    finish
    exit 1
  fi
}

step "normal build + all tests"
build build -DCMAKE_BUILD_TYPE=RelWithDebInfo
count ctest normal ctest --test-dir build -V -j"$JOBS"
if [ $quick = 1 ]; then finish; exit 0; fi

step "ASan+UBSan build + all tests"
build build-asan -DCMAKE_BUILD_TYPE=Debug -DPARLEY_SANITIZE=address,undefined
# LSAN_OPTIONS=use_tls=0: at exit LeakSanitizer may crash ("Tracer caught signal 11") reading
# the stale dynamic TLS block of the plugin parley-host has dlclose()d; not scanning TLS as roots
# can only add leak reports, never hide one.
LSAN_OPTIONS=use_tls=0 \
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
PARLEY_TEST_SLOWDOWN=2 count ctest asan ctest --test-dir build-asan -V -j"$JOBS"

step "TSan build + concurrency tests"
build build-tsan -DCMAKE_BUILD_TYPE=Debug -DPARLEY_SANITIZE=thread -DCMAKE_C_COMPILER=clang
TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 PARLEY_TEST_SLOWDOWN=4 \
  count ctest tsan ctest --test-dir build-tsan -V -L tsan

step "valgrind: one end-to-end conversation"
PARLEY_VALGRIND=1 PARLEY_BUILD_DIR="$PWD/build" PARLEY_TEST_SLOWDOWN=10 \
  count unittest valgrind bash -c "cd tests/integration && python3 -m unittest -v valgrind_check"

step "libFuzzer targets"
# every target tests/fuzz/CMakeLists.txt declares (a new one cannot be left out)
TARGETS="$(sed -n 's/^parley_fuzz_target(\([a-z_0-9]*\).*/\1/p' tests/fuzz/CMakeLists.txt | tr '\n' ' ')" \
  build build-fuzz -DCMAKE_BUILD_TYPE=Debug -DPARLEY_FUZZ=ON -DCMAKE_C_COMPILER=clang
count ctest fuzz ctest --test-dir build-fuzz -V -L fuzz

step "all test stages passed"
finish
