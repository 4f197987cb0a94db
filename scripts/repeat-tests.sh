#!/usr/bin/env bash
# Runs test binaries again and again, optionally beside busy loops, to find the tests that
# fail only under load (a CI machine of 2 cores). Prints each failure's log and a tally.
#
#   scripts/repeat-tests.sh [-n RUNS] [-b BUSY_LOOPS] TEST [TEST...] [-- TEST_ARGS...]
#
# e.g. scripts/repeat-tests.sh -n 10 -b 2 faults rocm_fake_stall tcp_faults
# TEST is an integration test name (tests/TEST.rs); TEST_ARGS go to the test binary (a
# filter, --test-threads=1, ...). The build uses the features of scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=10
busy=0
while getopts "n:b:" o; do
    case $o in
        n) runs=$OPTARG ;;
        b) busy=$OPTARG ;;
        *) sed -n 2,9p "$0"; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
tests=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do tests+=("$1"); shift; done
[ $# -gt 0 ] && shift
[ ${#tests[@]} -gt 0 ] || { sed -n 2,9p "$0"; exit 2; }
features="mpi,cuda,rocm,hwloc,ofi"
targs=()
for t in "${tests[@]}"; do targs+=(--test "$t"); done
cargo test --release --features "$features" "${targs[@]}" --no-run
logs=$(mktemp -d)
pids=()
for _ in $(seq 1 "$busy"); do
    sh -c 'while :; do :; done' &
    pids+=($!)
done
trap '[ ${#pids[@]} -eq 0 ] || kill "${pids[@]}" 2>/dev/null' EXIT
summary=()
for t in "${tests[@]}"; do
    fails=0
    for i in $(seq 1 "$runs"); do
        log="$logs/$t.$i.log"
        if cargo test -q --release --features "$features" --test "$t" -- "$@" >"$log" 2>&1; then
            echo "$t run $i: ok"
        else
            fails=$((fails + 1))
            echo "$t run $i: FAILED ($log)"
            grep -E "panicked|^test .* FAILED" "$log" | head -20 || true
        fi
    done
    summary+=("$t: $fails of $runs runs failed")
done
echo "== load: $(cut -d' ' -f1-3 /proc/loadavg), busy loops: $busy"
printf '%s\n' "${summary[@]}"
