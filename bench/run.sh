#!/bin/sh
# bench/run.sh -- build Parley (Release) and run every benchmark, then print
# one summary table.  See docs/performance.md for the method.
#
#   bench/run.sh [BUILD_DIR]          default BUILD_DIR: <source>/build-bench
#   bench/run.sh --issue17 [BUILD_DIR]   only the floor / limit / Parley table of
#                                        scenarios 1 and 2 (bench/limit.sh)
#
# Scenarios (all traffic stays on 127.0.0.1; a few minutes in all):
#   1  sequential turns, 20-turn history, 5 tools, 0 ms server latency,
#      against bare libcurl on one reused connection (5 runs, medians)
#   2  10,000 conversations in flight, 200 ms server latency, against
#      curl multi keeping 10,000 POSTs in flight (3 runs, medians)
#   3  the conversation store with 100,000 and 1,000,000 conversations
#   1s, 2s  scenarios 1 and 2 with history_store "sqlite:FILE" against the
#      memory store (parley-bench --scenario store-seq / store-concurrent)
#   4  opening a SQLite store of 100,000 and 1,000,000 conversations (store-bench)
#   5  the Redis store against memory, and two hosts on one Redis (redis-bench)
#   6  history_query / message_get over 1,000,000 messages, memory, SQLite and Redis (query-bench)
#   7  the prompt-cache cost of a 200-turn conversation, old window against the context
#      engine, llama.cpp and Anthropic cache rules (bench/context_bench.py; its own table)
#
# Environment:
#   PARLEY_BENCH_ARGS   extra parley-bench options, e.g. "--seq-repeats 9"
#   SKIP_HISTORY=1      skip scenario 3 (its 1,000,000 case needs ~2 GB)
#   SKIP_STORE_OPEN=1   skip scenario 4 (its 1,000,000 case writes a 1.4 GB file into BUILD_DIR)
#   SKIP_REDIS=1        skip scenario 5 (redis-bench; also skipped without redis-server) and
#                       the Redis column of scenario 6
#   SKIP_QUERY=1        skip scenario 6 (a ~300 MB SQLite file in BUILD_DIR, about a minute)
#   SKIP_CONTEXT=1      skip scenario 7 (also skipped without python3)
set -eu

if [ "${1:-}" = --issue17 ]; then
    shift
    exec "$(dirname "$0")/limit.sh" "$@"
fi

src=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$src/build-bench}
jobs=$(nproc 2>/dev/null || echo 2)

echo "== building (Release) in $build"
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"$jobs" --target parley parley-fake-llm parley-bench history-bench \
    store-bench redis-bench query-bench parley-host >/dev/null

out=$(mktemp -d /tmp/parley-bench-run.XXXXXX)
trap 'rm -rf "$out"' EXIT INT TERM

run() { # bounded: no benchmark may run away
    if command -v timeout >/dev/null 2>&1; then timeout 900 "$@"; else "$@"; fi
}

echo "== scenarios 1 and 2: parley-bench"
# shellcheck disable=SC2086 # PARLEY_BENCH_ARGS is a list of options
run "$build/bench/parley-bench" --summary-file "$out/summary" --store-dir "$build" \
    ${PARLEY_BENCH_ARGS:-} |
    tee "$out/parley-bench.txt"

if [ "${SKIP_HISTORY:-0}" != 1 ]; then
    for n in 100000 1000000; do
        echo
        echo "== scenario 3: history-bench $n"
        run "$build/bench/history-bench" "$n" | tee "$out/history-$n.txt"
    done
fi

if [ "${SKIP_STORE_OPEN:-0}" != 1 ]; then
    for n in 100000 1000000; do
        echo
        echo "== scenario 4: store-bench open $n"
        run "$build/bench/store-bench" open "$n" "$build" | tee "$out/open-$n.txt"
    done
fi

if [ "${SKIP_REDIS:-0}" != 1 ] && command -v redis-server >/dev/null 2>&1; then
    echo
    echo "== scenario 5: redis-bench (the Redis store; its own summary lines)"
    run "$build/bench/redis-bench" | tee "$out/redis-bench.txt"
fi

if [ "${SKIP_QUERY:-0}" != 1 ]; then
    echo
    echo "== scenario 6: query-bench 1000000"
    run "$build/bench/query-bench" 1000000 "$build" | tee "$out/query.txt"
fi

if [ "${SKIP_CONTEXT:-0}" != 1 ] && command -v python3 >/dev/null 2>&1; then
    echo
    echo "== scenario 7: context-bench (prompt tokens the server evaluates per new token)"
    run python3 "$src/bench/context_bench.py" --build "$build" | tee "$out/context.txt"
fi

# ---- the summary table -------------------------------------------------------
val() { # val KEY: a median from parley-bench's summary file, or "-"
    v=$(sed -n "s/^$1=//p" "$out/summary" 2>/dev/null | head -n 1)
    echo "${v:--}"
}
hist() { # hist N NAME: one figure of history-bench N
    v=$(awk -v k="$2" '$1 == k { print $2; exit }' "$out/history-$1.txt" 2>/dev/null)
    echo "${v:--}"
}
verdict() { # verdict VALUE OP LIMIT
    awk -v v="$1" -v op="$2" -v l="$3" 'BEGIN {
        if (v == "-") { print "n/a"; exit }
        ok = (op == "<=") ? (v + 0 <= l + 0) : (op == ">=") ? (v + 0 >= l + 0) : (v + 0 == l + 0)
        print ok ? "met" : "MISSED" }'
}
row() { printf '%-44s %16s %16s %9s  %-9s %s\n' "$@"; }

echo
echo "================================ summary (medians) ================================"
row "" "Parley" "floor" "ratio" "target" "verdict"
r=$(val seq.mean_ms.ratio)
row "1 sequential: turn time, mean (ms)" "$(val seq.mean_ms.parley)" "$(val seq.mean_ms.floor)" \
    "$r" "<= 1.10" "$(verdict "$r" "<=" 1.10)"
row "1 sequential: p50 latency (ms)" "$(val seq.p50_ms.parley)" "$(val seq.p50_ms.floor)" \
    "$(val seq.p50_ms.ratio)" "" ""
row "1 sequential: p99 latency (ms)" "$(val seq.p99_ms.parley)" "$(val seq.p99_ms.floor)" \
    "$(val seq.p99_ms.ratio)" "" ""
row "1 sequential: client CPU per turn (us)" "$(val seq.cpu_us.parley)" "$(val seq.cpu_us.floor)" \
    "$(val seq.cpu_us.ratio)" "" ""
row "1 sequential: server CPU per turn (us)" "$(val seq.server_cpu_us.parley)" \
    "$(val seq.server_cpu_us.floor)" "" "" ""
row "1 sequential: peak RSS (MiB)" "$(val seq.hwm_mib.parley)" "$(val seq.hwm_mib.floor)" "" "" ""
row "1 sequential: RSS growth over the run (KiB)" "$(val seq.rss_growth_kib.parley)" \
    "$(val seq.rss_growth_kib.floor)" "" "" ""
row "1 sequential: limit (raw epoll): turn time (ms)" "$(val seq.mean_ms.limit)" "" \
    "$(val seq.mean_ms.ratio_limit)" "" ""
row "1 sequential: limit: client CPU per turn (us)" "$(val seq.cpu_us.limit)" "" \
    "$(val seq.cpu_us.ratio_limit)" "" ""
r=$(val conc.turns_per_s.ratio)
row "2 concurrent: turns/s" "$(val conc.turns_per_s.parley)" "$(val conc.turns_per_s.floor)" \
    "$r" ">= 0.80" "$(verdict "$r" ">=" 0.80)"
f=$(val conc.failures_worst)
row "2 concurrent: failures (worst run)" "$f" "$(val conc.failures.floor)" "" "0" \
    "$(verdict "$f" "==" 0)"
k=$(val conc.kib_per_in_flight.parley)
row "2 concurrent: RSS per in-flight turn (KiB)" "$k" "$(val conc.kib_per_in_flight.floor)" "" \
    "<= 64" "$(verdict "$k" "<=" 64)"
row "2 concurrent: p50 / p99 latency (ms)" \
    "$(val conc.p50_ms.parley)/$(val conc.p99_ms.parley)" \
    "$(val conc.p50_ms.floor)/$(val conc.p99_ms.floor)" "" "" ""
row "2 concurrent: client CPU per turn (us)" "$(val conc.cpu_us.parley)" "$(val conc.cpu_us.floor)" \
    "$(val conc.cpu_us.ratio)" "" ""
row "2 concurrent: server CPU per turn (us)" "$(val conc.server_cpu_us.parley)" \
    "$(val conc.server_cpu_us.floor)" "" "" ""
r=$(val conc.turns_per_s.ratio_limit)
row "2 concurrent: limit (raw epoll): turns/s" "$(val conc.turns_per_s.limit)" "" "$r" ">= 0.50" \
    "$(verdict "$r" ">=" 0.50)"
row "2 concurrent: limit: client CPU per turn (us)" "$(val conc.cpu_us.limit)" "" \
    "$(val conc.cpu_us.ratio_limit)" "" ""
row "2 concurrent: peak RSS (MiB)" "$(val conc.hwm_mib.parley)" "$(val conc.hwm_mib.floor)" "" "" ""
if [ "${SKIP_HISTORY:-0}" != 1 ]; then
    for n in 100000 1000000; do
        row "3 history $n: RSS bytes per conversation" "$(hist "$n" rss_bytes_per_conv)" "" "" "" ""
        row "3 history $n: RSS per stored message byte" \
            "$(hist "$n" rss_growth_per_stored_byte)" "" "" "" ""
        row "3 history $n: render / commit / new (ns)" \
            "$(hist "$n" render_ns_per_op)/$(hist "$n" commit_ns_per_op)/$(hist "$n" commit_new_ns_per_op)" \
            "" "" "" ""
    done
fi
r=$(val store_seq.mean_ms.ratio)
row "1s SQLite vs memory: turn time, mean (ms)" "$(val store_seq.mean_ms.parley)" \
    "$(val store_seq.mean_ms.floor)" "$r" "<= 1.10" "$(verdict "$r" "<=" 1.10)"
r=$(val store_conc.turns_per_s.ratio)
row "2s SQLite vs memory: turns/s" "$(val store_conc.turns_per_s.parley)" \
    "$(val store_conc.turns_per_s.floor)" "$r" ">= 0.90" "$(verdict "$r" ">=" 0.90)"
f=$(val store_conc.failures_worst)
row "2s SQLite: failures (worst run)" "$f" "" "" "0" "$(verdict "$f" "==" 0)"
if [ "${SKIP_STORE_OPEN:-0}" != 1 ]; then
    for n in 100000 1000000; do
        ms=$(awk '$1 == "open_ms" { print $2 }' "$out/open-$n.txt" 2>/dev/null | sort -n | sed -n 2p)
        kib=$(awk '$1 == "rss_open_growth_kib" { print $2 }' "$out/open-$n.txt" 2>/dev/null |
              sort -n | sed -n 2p)
        row "4 open SQLite store, $n conv. (ms)" "${ms:--}" "" "" "< 1000" \
            "$(verdict "${ms:--}" "<=" 1000)"
        row "4 open: RSS growth (KiB)" "${kib:--}" "" "" "" ""
    done
fi
echo "(store rows: 'Parley' = SQLite store, 'floor' = memory store, same run)"
echo "(limit rows: the raw epoll client's figure in the first column, ratio = Parley/limit)"
echo "(floor = bare libcurl against the same fake server in the same run; ratio = Parley/floor"
echo " per run, median over runs; turn-time and CPU ratios > 1 and throughput ratios < 1 are"
echo " Parley's overhead.  Figures are measurements on this machine, not assertions.)"
