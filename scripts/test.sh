#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit + integration tests (thread-ranks, symbolic
# plan checks, MPI processes under mpiexec, the benchmark CLI, the C ABI). Installs what it needs.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export CARGO_TERM_COLOR=never
features="mpi,cuda,rocm,hwloc,ofi"
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy (features: $features)"
cargo clippy --release --all-targets --features "$features" -- -D warnings
echo "== cargo test (features: $features)"
built="$(cargo test --release --features "$features" --no-run 2>&1)" || { echo "$built"; exit 1; }
echo "$built" | tail -n 3
# The four exhaustive plan proofs (tests/plan_check.rs, ~3 CPU-minutes) are pure computation
# with nothing timed: they run at the lowest priority beside the rest of the suite, in the
# time its multi-process tests spend waiting, instead of after it.
proofs=(every_algorithm_is_correct_for_every_rank_count_and_node_shape_up_to_64
  large_rank_counts_are_correct three_level_hierarchy_is_correct_for_every_node_group_shape_up_to_64
  overlapped_hierarchy_is_correct_for_every_rank_count_node_shape_and_piece_count_up_to_64)
plan_check="$(echo "$built" | sed -n 's/.*Executable tests\/plan_check.rs (\(.*\))$/\1/p')"
[ -x "$plan_check" ] || { echo "test.sh: no plan_check test binary in: $built" >&2; exit 1; }
proofs_log="$(mktemp)"
nice -n 19 "$plan_check" --exact "${proofs[@]}" >"$proofs_log" 2>&1 &
proofs_pid=$!
skips=()
for t in "${proofs[@]}"; do skips+=(--skip "$t"); done
set +e
cargo test --release --features "$features" -- --exact "${skips[@]}" 2>&1
rc=$?
wait "$proofs_pid"
proofs_rc=$?
set -e
echo "== the exhaustive plan proofs (tests/plan_check.rs, run beside the above)"
proofs_out="$(cat "$proofs_log")"
echo "$proofs_out"
rm -f "$proofs_log"
[ "$rc" = 0 ] || exit "$rc"
[ "$proofs_rc" = 0 ] || { echo "test.sh: the plan proofs failed" >&2; exit "$proofs_rc"; }
grep -q "test result: ok. ${#proofs[@]} passed" <<<"$proofs_out" \
  || { echo "test.sh: expected ${#proofs[@]} plan proofs to pass (a test renamed?)" >&2; exit 1; }
echo "== python: torch.distributed backend, FSDP2 harness"
# The same features as the cargo test build above: its libpccl.so is used, not rebuilt.
PCCL_TEST_FEATURES="$features" PCCL_TEST_PREBUILT=1 scripts/test-python.sh
