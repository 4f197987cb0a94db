#!/usr/bin/env bash
# Tables and heatmaps of the overlapped hierarchy (hier-*-pipeK) for docs/SCALING.md, from
# pccl-sim (no hardware needed):  scripts/overlap-report.sh > /tmp/overlap-tables.md
# COLLS="allreduce" limits it to some collectives (default: all-gather, reduce-scatter, all-reduce).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
[ -n "${NO_BUILD:-}" ] || cargo build --release -q --bin pccl-sim
SIM=$CARGO_TARGET_DIR/release/pccl-sim
mkdir -p docs/img
for preset in frontier perlmutter; do
  for coll in ${COLLS:-allgather reducescatter allreduce}; do
    short=${coll/allgather/ag}; short=${short/reducescatter/rs}; short=${short/allreduce/ar}
    for algo in hier-rd-pipe16 hier-rd-rd-pipe8; do
      for vs in ring hier-rd; do
        echo "### $preset, $coll: $algo over $vs (ring: NCCL-like)"
        echo
        if [ "$algo" = hier-rd-pipe16 ] && [ "$vs" = ring ]; then
          img="docs/img/$preset-$short-pipe-vs-ring.png"
        else
          img=/tmp/overlap-$$.png
        fi
        "$SIM" --preset "$preset" --coll "$coll" --algo "$algo" --vs "$vs" --table \
          --heatmap "$img" 2>/dev/null | tail -n +2
        echo
      done
    done
  done
done
rm -f /tmp/overlap-$$.png
