#!/usr/bin/env bash
# The main job: pccl-bench across 8 thread-ranks as 2 nodes x 4, every result checked.
# Extra arguments go to pccl-bench (e.g. -m 1M:256M --coll all).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --release --features mpi --bin pccl-bench
exec target/release/pccl-bench --ranks 8 --ranks-per-node 4 --check --coll all "$@"
