#!/usr/bin/env bash
# PCCL vs MPICH's native collectives, same processes, same buffers, same run: MPI ranks as
# 2 nodes x 1 and 2 nodes x 2 (PCCL_RANKS_PER_NODE), per-rank shards of 1, 4 and 16 MiB,
# every PCCL algorithm; prints a markdown table with the best algorithm's ratio PCCL/MPI.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --release --features mpi --bin pccl-bench >/dev/null 2>&1 || cargo build --release --features mpi --bin pccl-bench
out=$(mktemp -d)
iters=${ITERS:-20}
for shape in "2 1" "4 2"; do
  set -- $shape
  n=$1 m=$2
  for coll in allgather reducescatter; do
    for algo in ring rd hier-rd hier-ring; do
      mpiexec -n "$n" target/release/pccl-bench --ranks-per-node "$m" --coll "$coll" --algo "$algo" \
        -m 1M:16M -i "$iters" -x 3 --check --json > "$out/$n-$m-$coll-$algo.json"
    done
  done
done
python3 - "$out" <<'PY'
import json, sys, glob, os
rows = {}
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    d = json.load(open(f))
    c = d["comm"]
    for r in d["results"]:
        if r["bytes"] not in (1 << 20, 4 << 20, 16 << 20):
            continue
        key = (c["ranks"], c["shape"], r["coll"], r["bytes"])
        rows.setdefault(key, []).append(r)
print("| ranks | shape | collective | shard | best PCCL algo | PCCL avg (us) | MPICH avg (us) | PCCL/MPI | other algos (us) | wrong |")
print("|---|---|---|---|---|---|---|---|---|---|")
for key in sorted(rows):
    rs = rows[key]
    best = min(rs, key=lambda r: r["avg_us"])
    mpi = sum(r["mpi_avg_us"] for r in rs) / len(rs)
    others = ", ".join(f'{r["algo"]} {r["avg_us"]:.0f}' for r in rs if r is not best)
    wrong = sum(r["wrong"] for r in rs)
    print(f'| {key[0]} | {key[1]} | {key[2]} | {key[3] >> 20} MiB | {best["algo"]} | {best["avg_us"]:.0f} | {mpi:.0f} | {best["avg_us"] / mpi:.2f} | {others} | {wrong} |')
PY
