#!/bin/sh
# bench/limit.sh -- the floor, the limit and Parley side by side (issue 17):
# scenarios 1 (sequential) and 2 (10,000 in flight) of parley-bench, then one
# counting pass for heap allocations per turn, then one Markdown table.
# See docs/performance.md, "Floor, limit and Parley".
#
#   bench/limit.sh [BUILD_DIR]        default BUILD_DIR: <source>/build-bench
#   bench/run.sh --issue17 [BUILD_DIR]   the same
#
#   floor   bare libcurl: curl_easy_perform on one connection (1), curl multi
#           with epoll and curl_multi_socket_action (2)
#   limit   bench/raw_client.c: one epoll loop, raw non-blocking keep-alive
#           sockets, no allocation per request
#   Parley  parley.so through the ABI
# All three send the same captured request bodies to the same fake server, in
# the same run, each in a process of its own (CPU: getrusage of that process).
#
# Environment:
#   SEQ_RUNS=9 CONC_RUNS=3   repetitions (the table gives medians; scenario 1 is short
#                            and its server cost moves with CPU placement: nine runs;
#                            scenario 1 runs SEQ_RUNS more times with --seq-chain, Parley's
#                            host submitting from the done callback: no host/worker hand-off)
#   COUNT_ALLOCS=0           skip the counting pass
#   PARLEY_BENCH_ARGS        extra parley-bench options (they come last, so they win),
#                            e.g. "--conc-conversations 2000"
set -eu

src=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$src/build-bench}
seq_runs=${SEQ_RUNS:-9}
conc_runs=${CONC_RUNS:-3}
phase_timeout=300 # a loaded machine: Parley's 30,000 turns took a minute at load 13

echo "== building (Release) in $build"
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
nice -n 10 cmake --build "$build" -j2 --target parley parley-fake-llm parley-bench \
    parley-bench-alloc >/dev/null

out=$build/limit-run # the runs' full output and summaries, kept until the next run
rm -rf "$out"
mkdir -p "$out"

run() { # bounded: no benchmark may run away
    if command -v timeout >/dev/null 2>&1; then timeout 1800 "$@"; else "$@"; fi
}
load() { cut -d' ' -f1-3 /proc/loadavg; }

load_before=$(load)
started=$(date -u '+%Y-%m-%d %H:%M UTC')
echo "== $started; nproc $(nproc); load average (1/5/15 min) $load_before"
echo "== timing runs: scenario 1 x $seq_runs, scenario 2 x $conc_runs"
# shellcheck disable=SC2086 # PARLEY_BENCH_ARGS is a list of options
run "$build/bench/parley-bench" --scenario seq,concurrent --seq-repeats "$seq_runs" \
    --conc-repeats "$conc_runs" --phase-timeout-s "$phase_timeout" --summary-file "$out/timing" \
    ${PARLEY_BENCH_ARGS:-} |
    tee "$out/timing.txt"
echo
echo "== scenario 1 again, Parley's host chaining from the done callback (--seq-chain, x $seq_runs):"
echo "   Parley without the host/worker hand-off, against the same floor"
# shellcheck disable=SC2086
run "$build/bench/parley-bench" --scenario seq --seq-chain --no-limit --seq-repeats "$seq_runs" \
    --phase-timeout-s "$phase_timeout" --summary-file "$out/chain" ${PARLEY_BENCH_ARGS:-} |
    tee "$out/chain.txt"
load_mid=$(load)
if [ "${COUNT_ALLOCS:-1}" != 0 ]; then
    echo
    echo "== counting pass (allocations only; LD_PRELOAD=parley-bench-alloc.so, 1 run each)"
    # shellcheck disable=SC2086
    run "$build/bench/parley-bench" --count-allocs --scenario seq,concurrent --seq-repeats 1 \
        --conc-repeats 1 --phase-timeout-s "$phase_timeout" --summary-file "$out/count" \
        ${PARLEY_BENCH_ARGS:-} |
        tee "$out/count.txt"
fi
load_after=$(load)

# ---- the table ----------------------------------------------------------------
val() { # val FILE KEY
    v=$(sed -n "s/^$2=//p" "$out/$1" 2>/dev/null | head -n 1)
    echo "${v:--}"
}
row() { # row LABEL FILE KEY [noratio]: floor | limit | Parley | Parley/floor | Parley/limit
    if [ "${4:-}" = noratio ]; then rf=""; rl=""; else
        rf=$(val "$2" "$3.ratio"); rl=$(val "$2" "$3.ratio_limit")
    fi
    printf '| %s | %s | %s | %s | %s | %s |\n' "$1" "$(val "$2" "$3.floor")" \
        "$(val "$2" "$3.limit")" "$(val "$2" "$3.parley")" "$rf" "$rl"
}

n=$(val timing conc.peak_in_flight.parley)
plugin=$(sed -n 's/^parley-bench: plugin //p' "$out/timing.txt" | head -n 1)
commit=$(git -C "$src" describe --always --dirty 2>/dev/null || echo "?")
echo
echo "================ floor, limit and Parley (medians; ratios are medians of per-run ratios) ================"
echo "Started $started; nproc $(nproc); load average before $load_before, after the timing runs"
echo "$load_mid, at the end $load_after.  Scenario 1: $seq_runs runs, scenario 2: $conc_runs runs;"
echo "allocations: one counting pass (its timings are not used).  Source $commit; plugin $plugin."
echo
echo "| scenario, metric | floor (libcurl) | limit (raw epoll) | Parley | Parley/floor | Parley/limit |"
echo "|---|---:|---:|---:|---:|---:|"
row "1 sequential: turns/s" timing seq.turns_per_s
row "1 sequential: wall time (s)" timing seq.wall_s
row "1 sequential: mean turn time (ms)" timing seq.mean_ms
row "1 sequential: client CPU per turn (µs)" timing seq.cpu_us
row "1 sequential: heap allocations per turn" count seq.allocs_per_turn
row "1 sequential: bytes allocated per turn" count seq.alloc_bytes_per_turn
row "1 sequential: failures" timing seq.failures noratio
row "1 sequential, host chains from the callback: mean turn time (ms)" chain seq.mean_ms
row "1 sequential, host chains from the callback: client CPU per turn (µs)" chain seq.cpu_us
row "2 $n in flight: turns/s" timing conc.turns_per_s
row "2 $n in flight: wall time (s)" timing conc.wall_s
row "2 $n in flight: client CPU per turn (µs)" timing conc.cpu_us
row "2 $n in flight: RSS per in-flight turn (KiB)" timing conc.kib_per_in_flight
row "2 $n in flight: heap allocations per turn" count conc.allocs_per_turn
row "2 $n in flight: bytes allocated per turn" count conc.alloc_bytes_per_turn
row "2 $n in flight: failures (median)" timing conc.failures noratio
echo
echo "Issue 17 targets: scenario 2 throughput Parley/limit >= 0.50 (now $(val timing conc.turns_per_s.ratio_limit)),"
echo "failures 0 (worst run: $(val timing conc.failures_worst)), RSS per in-flight turn <= 16 KiB"
echo "(now $(val timing conc.kib_per_in_flight.parley)); scenario 1 wall <= 1.10 x floor (now"
echo "$(val timing seq.wall_s.ratio)) and CPU per turn <= 1.3 x floor (now $(val timing seq.cpu_us.ratio))."
