#!/usr/bin/env bash
# The vendor baselines against the published Frontier measurements, each mechanism's share,
# and the Perlmutter prediction: the tables of docs/SCALING.md's "Vendor rings" section.
#   scripts/vendor-report.sh > /tmp/vendor-tables.md
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
[ -n "${NO_BUILD:-}" ] || cargo build --release -q --bin pccl-sim
SIM=$CARGO_TARGET_DIR/release/pccl-sim

# bytes per rank of an output size (16M, 1G) on P ranks
block() { python3 -c "import sys; s=sys.argv[1]; m={'M':2**20,'G':2**30}; print(int(s[:-1])*m[s[-1]]//int(sys.argv[2]))" "$1" "$2"; }
# field F of pccl-sim's JSON line on stdin
field() { python3 -c "import json,sys; j=json.loads(sys.stdin.readline()); print(j[sys.argv[1]])" "$1"; }

# ratio PRESET COLL P OUT VS [WITHOUT] -> t(VS) / t(hier-rd)
ratio() {
  local b; b=$(block "$4" "$3")
  "$SIM" --preset "$1" --coll "$2" --algo hier-rd --vs "$5" --ranks "$3" --size "$b" \
    --without "${6:-}" --json | field speedup
}

echo "### Frontier: the published table against the simulator"
echo
echo "| collective | GCDs | output | measured t(RCCL)/t(hier) | simulated | RCCL as modelled | hier-rd | within 1.5x |"
echo "|---|---|---|---|---|---|---|---|"
rows=("allgather 2048 16M >30" "allgather 2048 64M >30" "allgather 2048 512M 11.4"
  "allgather 2048 1G 7" "reducescatter 2048 1G 6.2" "allgather 32 1G 0.52" "reducescatter 32 1G 0.55")
for row in "${rows[@]}"; do
  read -r -a f <<<"$row"; set -- "${f[@]}"
  b=$(block "$3" "$2")
  j=$("$SIM" --preset frontier --coll "$1" --algo hier-rd --vs rccl --ranks "$2" --size "$b" --json)
  s=$(echo "$j" | field speedup)
  t=$(echo "$j" | field seconds)
  d=$(echo "$j" | field vs_detail)
  v=$(echo "$j" | field vs_seconds)
  ok=$(python3 -c "m='$4'; s=$s
lo,hi=(30,33) if m.startswith('>') else (float(m),float(m))
print('yes' if lo/1.5<=s<=hi*1.5 else 'NO')")
  printf '| %s | %s | %s | %s | %.2f | %.1f ms (%s) | %.2f ms | %s |\n' "$1" "$2" "$3" "$4" "$s" \
    "$(python3 -c "print($v*1e3)")" "$d" "$(python3 -c "print($t*1e3)")" "$ok"
done
echo
echo "### Each mechanism's contribution (the ratio with it turned off: \`--without NAME\`)"
echo
echo "| row | all on | protocols | channels | proxy | rendezvous | dragonfly | all off |"
echo "|---|---|---|---|---|---|---|---|"
for row in "${rows[@]}"; do
  read -r -a f <<<"$row"; set -- "${f[@]}"
  line="| $1 $2 $3 |"
  for w in "" protocols channels proxy rendezvous dragonfly "protocols,channels,proxy,rendezvous,dragonfly"; do
    line="$line $(printf '%.2f' "$(ratio frontier "$1" "$2" "$3" rccl "$w")") |"
  done
  echo "$line"
done
echo
for preset in frontier perlmutter; do
  lib=rccl; [ "$preset" = perlmutter ] && lib=nccl
  m=8; [ "$preset" = perlmutter ] && m=4
  echo "### $preset: the vendor ring ($lib) and Cray MPICH's ring against the ranks, all-gather (ms)"
  echo
  echo "| ranks | $lib 16M | $lib 64M | $lib 256M | $lib 512M | $lib 1G | mpich 256M | mpich 1G |"
  echo "|---|---|---|---|---|---|---|---|"
  for p in 32 64 128 256 512 1024 2048; do
    line="| $p |"
    for spec in "$lib 16M" "$lib 64M" "$lib 256M" "$lib 512M" "$lib 1G" "mpich 256M" "mpich 1G"; do
      read -r -a f <<<"$spec"; set -- "${f[@]}"
      t=$("$SIM" --preset "$preset" --algo "$1" --ranks "$p" --ranks-per-node "$m" \
        --size "$(block "$2" "$p")" --json | field seconds)
      line="$line $(printf '%.2f' "$(python3 -c "print($t*1e3)")") |"
    done
    echo "$line"
  done
  echo
  echo "### $preset: speedup of the hierarchy (hier-rd) over $lib, by output size (all-gather / reduce-scatter)"
  echo
  echo "| ranks | 16M | 64M | 256M | 1G |"
  echo "|---|---|---|---|---|"
  for p in 32 128 512 2048; do
    line="| $p |"
    for out in 16M 64M 256M 1G; do
      ag=$(ratio "$preset" allgather "$p" "$out" "$lib")
      rs=$(ratio "$preset" reducescatter "$p" "$out" "$lib")
      line="$line $(printf '%.2f / %.2f' "$ag" "$rs") |"
    done
    echo "$line"
  done
  echo
  echo "### $preset: the tuner's choice (PCCL's plans) and its speedup over $lib, all-gather"
  echo
  echo "| ranks | 16M | 64M | 256M | 1G |"
  echo "|---|---|---|---|---|"
  for p in 32 128 512 2048; do
    line="| $p |"
    for out in 16M 64M 256M 1G; do
      j=$("$SIM" --preset "$preset" --algo auto --vs "$lib" --ranks "$p" --ranks-per-node "$m" \
        --size "$(block "$out" "$p")" --json)
      line="$line $(echo "$j" | field algo) $(printf '%.2f' "$(echo "$j" | field speedup)") |"
    done
    echo "$line"
  done
  echo
done
for spec in "frontier allgather rccl" "frontier reducescatter rccl" "frontier allgather mpich" \
  "perlmutter allgather nccl" "perlmutter reducescatter nccl"; do
  read -r -a f <<<"$spec"; set -- "${f[@]}"
  short=${2/allgather/ag}; short=${short/reducescatter/rs}
  echo "### $1, $2: hier-rd over $3 (sizes: each rank's output / input buffer)"
  echo
  "$SIM" --preset "$1" --coll "$2" --algo hier-rd --vs "$3" --output-sizes --table \
    --heatmap "docs/img/$1-$short-hier-vs-$3.png" 2>/dev/null | tail -n +2
  echo
done
