#!/usr/bin/env bash
# Where three levels (network → node → GCD pair) beat two on the Frontier preset: the tables
# of docs/SCALING.md's "Three levels" section.
#   scripts/depth-report.sh > /tmp/depth-tables.md
# Each cell: t(two levels) / t(three levels), the tuner's choice on each side. Sizes are each
# rank's output (all-gather) or input (reduce-scatter, all-reduce) buffer, as the study gives them.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
[ -n "${NO_BUILD:-}" ] || cargo build --release -q --bin pccl-sim
SIM=$CARGO_TARGET_DIR/release/pccl-sim
own=$(mktemp /tmp/frontier-own.XXXXXX.toml)
trap 'rm -f "$own"' EXIT
# The preset without its vendor tables: PCCL's own plans run the intra-node levels, one
# message per link (the 50 GB/s links between MI250X, 200 GB/s inside one).
python3 - "$own" <<'PY'
import sys
keep, out = True, []
for line in open("presets/frontier.toml"):
    if line.startswith("["):
        keep = not (line.startswith("[vendor") or line.startswith("[mpich"))
    if keep:
        out.append(line)
open(sys.argv[1], "w").writelines(out)
PY
SIZES="64K 1M 16M 256M 1G"
# t ALGO GROUPS PRESETARGS... -> "seconds algo" per size, one line each
t() {
  local algo=$1 groups=$2 coll=$3 ranks=$4; shift 4
  for s in $SIZES; do
    "$SIM" "$@" --coll "$coll" --algo "$algo" --groups "$groups" --ranks "$ranks" --size "$s" \
      --output-sizes --json |
      python3 -c "import json,sys; j=json.loads(sys.stdin.readline()); print(j['seconds'], j['algo'])"
  done
}
table() {
  local what=$1; shift
  echo "#### $what"
  echo
  printf '| collective | GCDs |'; for s in $SIZES; do printf ' %s |' "$s"; done; echo
  printf '|---|---|'; for _ in $SIZES; do printf -- '---|'; done; echo
  for coll in allgather reducescatter allreduce; do
    for ranks in 32 256 2048; do
      printf '| %s | %s |' "$coll" "$ranks"
      paste -d' ' <(t "$ALGO" 1 "$coll" "$ranks" "$@") <(t "$ALGO3" 2 "$coll" "$ranks" "$@") |
        while read -r a an b bn; do
          python3 -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); print(' %.2f' % (a/b), end='')" "$a" "$b"
          [ "$ALGO" = auto ] && printf ' (%s / %s)' "$an" "$bn"
          printf ' |'
        done
      echo
    done
  done
  echo
}
ALGO=hier-rd ALGO3=hier3-rd table "hier-rd over hier3-rd, RCCL's rates inside the node (the preset)" --preset frontier
ALGO=hier-rd ALGO3=hier3-rd table "hier-rd over hier3-rd, PCCL's own intra-node plans (the preset without [vendor])" --preset-file "$own"
ALGO=auto ALGO3=auto table "the tuner without groups over the tuner with pairs, RCCL's rates" --preset frontier
ALGO=auto ALGO3=auto table "the tuner without groups over the tuner with pairs, PCCL's own intra-node plans" --preset-file "$own"
