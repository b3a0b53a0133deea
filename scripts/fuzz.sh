#!/usr/bin/env bash
# Run every libFuzzer target for longer than CI's short runs (scripts/test.sh
# gives each a fixed 20,000 inputs).  Not part of the test command.
#   scripts/fuzz.sh [SECONDS]     (default 600 per target)
# Each target starts from its seed corpus (tests/fuzz/corpus/<name>/, read
# only) and keeps what it finds in build-fuzz/tests/fuzz/corpus-run/<name>/;
# a crash leaves its input as build-fuzz/tests/fuzz/<name>-crash-* and makes
# the script fail, naming the target.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-600}
case $seconds in '' | *[!0-9]*) echo "usage: scripts/fuzz.sh [SECONDS]" >&2; exit 2 ;; esac
bash scripts/setup.sh

# every target tests/fuzz/CMakeLists.txt declares
mapfile -t TARGETS < <(sed -n 's/^parley_fuzz_target(\([a-z_0-9]*\).*/\1/p' tests/fuzz/CMakeLists.txt)
cmake -S . -B build-fuzz -DPARLEY_WERROR=ON -DCMAKE_BUILD_TYPE=Debug -DPARLEY_FUZZ=ON \
  -DCMAKE_C_COMPILER=clang >/dev/null
cmake --build build-fuzz -j"$(nproc)" --target "${TARGETS[@]}" >/dev/null

dir=build-fuzz/tests/fuzz
failed=()
for t in "${TARGETS[@]}"; do
  printf '==== %s: %s s\n' "$t" "$seconds"
  mkdir -p "$dir/corpus-run/$t"
  dict=()
  case $t in fuzz_reply_decode | fuzz_sse_stream | fuzz_anthropic_stream | fuzz_ndjson_stream | fuzz_overflow)
    dict=(-dict=tests/fuzz/llm.dict) ;;
  fuzz_context_record) dict=(-dict=tests/fuzz/context.dict) ;;
  fuzz_message_text) dict=(-dict=tests/fuzz/message_text.dict) ;;
  fuzz_host_json) dict=(-dict=tests/fuzz/host_json.dict) ;;
  esac
  if ! "$dir/$t" -max_total_time="$seconds" -max_len=65536 -print_final_stats=1 \
      -artifact_prefix="$dir/$t-" "${dict[@]}" "$dir/corpus-run/$t" "tests/fuzz/corpus/$t"; then
    failed+=("$t")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: FAILED: ${failed[*]} (inputs in $dir/)" >&2
  exit 1
fi
echo "fuzz: every target ran $seconds s without a finding"
