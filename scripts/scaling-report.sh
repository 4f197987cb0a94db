#!/usr/bin/env bash
# Regenerates the tables and heatmaps of docs/SCALING.md from pccl-sim (no hardware needed).
#   scripts/scaling-report.sh > /tmp/scaling-tables.md
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
[ -n "${NO_BUILD:-}" ] || cargo build --release -q --bin pccl-sim
SIM=$CARGO_TARGET_DIR/release/pccl-sim
mkdir -p docs/img
for preset in frontier perlmutter; do
  for coll in allgather reducescatter; do
    short=${coll/allgather/ag}; short=${short/reducescatter/rs}
    for vs in ring rd; do
      echo "### $preset, $coll: hier-rd over flat $vs (NCCL-like ring: --ring nccl)"
      echo
      "$SIM" --preset "$preset" --coll "$coll" --algo hier-rd --vs "$vs" --table \
        --heatmap "docs/img/$preset-$short-hier-vs-$vs.png" 2>/dev/null | tail -n +2
      echo
    done
    echo "### $preset, $coll: hier-rd over PCCL's own flat ring (--ring pccl; table only)"
    echo
    "$SIM" --preset "$preset" --ring pccl --coll "$coll" --algo hier-rd --vs ring --table \
      --heatmap /tmp/pccl-ring-$$.png 2>/dev/null | tail -n +2
    rm -f /tmp/pccl-ring-$$.png
    echo
  done
done
for preset in frontier perlmutter; do
  for size in 16M 256M; do
    echo "### Growth with rank count: $preset, allgather, $size per rank (seconds)"
    echo
    echo "| ranks | ring (NCCL-like) | ring (PCCL) | rd | hier-rd | hier-ring |"
    echo "|---|---|---|---|---|---|"
    for p in 32 128 512 2048 8192 32768; do
      row="| $p |"
      for spec in "ring nccl" "ring pccl" "rd nccl" "hier-rd nccl" "hier-ring nccl"; do
        set -- $spec
        t=$("$SIM" --preset "$preset" --ring "$2" --coll allgather --algo "$1" --ranks "$p" \
          --size "$size" --json | sed 's/.*"seconds":\([^,]*\),.*/\1/')
        row="$row $(printf '%.4g' "$t") |"
      done
      echo "$row"
    done
    echo
  done
done
for preset in frontier perlmutter; do
  echo "### Small sizes: $preset, allgather, hier-rd over the NCCL-like ring (speedup)"
  echo
  echo "| ranks | 4K | 16K | 64K | 256K | 1M | 4M | 16M |"
  echo "|---|---|---|---|---|---|---|---|"
  for p in 32 128 512 2048 4096; do
    h=$("$SIM" --preset "$preset" --coll allgather --algo hier-rd --ranks "$p" --size 4K:16M --json |
      sed 's/.*"seconds":\([^,]*\),.*/\1/')
    r=$("$SIM" --preset "$preset" --coll allgather --algo ring --ranks "$p" --size 4K:16M --json |
      sed 's/.*"seconds":\([^,]*\),.*/\1/')
    echo "| $p |$(paste <(echo "$h") <(echo "$r") | awk 'NR%2==1{printf " %.2f |", $2/$1}')"
  done
  echo
done
echo "### Simulator run time at 32768 ranks (frontier, 4096 nodes x 8, one size)"
echo
echo "| collective | algo | wall seconds | max RSS (MB) |"
echo "|---|---|---|---|"
for coll in allgather reducescatter; do
  for a in ring rd hier-rd hier-ring; do
    /usr/bin/time -f "%e %M" -o /tmp/simtime-$$ "$SIM" --preset frontier --coll "$coll" --algo "$a" \
      --ranks 32768 --size 16M >/dev/null
    read -r wall rss </tmp/simtime-$$
    echo "| $coll | $a | $wall | $((rss / 1024)) |"
  done
done
rm -f /tmp/simtime-$$
