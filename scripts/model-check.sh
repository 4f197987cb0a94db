#!/usr/bin/env bash
# Model vs measurement (a report, not a test): calibrates with pccl-tune, then for each shape
# measures pccl-bench (threads transport) and predicts with pccl-sim from the same profile,
# printing measured/predicted per size and algorithm, and how far `auto` is from the best
# fixed algorithm of the same run. Issue 12's targets: ratio within 1/1.5…1.5, auto ≤ 1.10×.
#
#   scripts/model-check.sh                 # 2, 4, 8 ranks, 1 KiB … 64 MiB
#   MAX=4M RANKS="2 4" scripts/model-check.sh
# Env: MAX (largest size per rank, default 64M), RANKS (default "2 4 8"), COLLS
# (default "allgather reducescatter"), TUNE (reuse a profile instead of measuring one),
# KEEP (a directory to keep the raw JSON in).
set -euo pipefail
cd "$(dirname "$0")/.."
MAX=${MAX:-64M}
RANKS=${RANKS:-"2 4 8"}
COLLS=${COLLS:-"allgather reducescatter"}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
cargo build --release -q --bin pccl-bench --bin pccl-sim --bin pccl-tune
BIN=$CARGO_TARGET_DIR/release
if [ -n "${KEEP:-}" ]; then
  WORK=$KEEP
  mkdir -p "$WORK"
else
  WORK=$(mktemp -d)
  trap 'rm -rf "$WORK"' EXIT
fi
if [ -z "${TUNE:-}" ]; then
  TUNE=$WORK/tune.toml
  "$BIN/pccl-tune" -o "$TUNE"
fi
export PCCL_TUNE_FILE=$TUNE
echo "# profile: $(grep '^source' "$TUNE")"
for p in $RANKS; do
  shapes="$p"
  [ "$p" -ge 4 ] && shapes="$p $((p / 2))"
  for m in $shapes; do
    algos="auto ring rd"
    [ "$m" -lt "$p" ] && algos="auto ring rd hier-rd hier-ring"
    for c in $COLLS; do
      for a in $algos; do
        "$BIN/pccl-bench" --ranks "$p" --ranks-per-node "$m" --coll "$c" --algo "$a" \
          -m "1K:$MAX" --json >"$WORK/bench-$p-$m-$c-$a.json"
        "$BIN/pccl-sim" --preset-file "$TUNE" --on host --engine events --ranks "$p" \
          --ranks-per-node "$m" --coll "$c" --algo "$a" --size "1K:$MAX" --json \
          >"$WORK/sim-$p-$m-$c-$a.jsonl"
      done
    done
  done
done
python3 - "$WORK" <<'PY'
import glob, json, os, sys
w = sys.argv[1]
rows = {}
for f in sorted(glob.glob(f"{w}/bench-*.json")):
    _, p, m, c, a = os.path.basename(f)[:-5].split("-", 4)
    meas = {r["bytes"]: (r["avg_us"], r["algo"]) for r in json.load(open(f))["results"]}
    pred = {}
    for line in open(f.replace("bench-", "sim-").replace(".json", ".jsonl")):
        r = json.loads(line)
        pred[r["size"]] = (r["seconds"] * 1e6, r["algo"])
    for s, (t, used) in meas.items():
        rows.setdefault((int(p), int(m), c, s), {})[a] = (t, used, pred.get(s, (float("nan"), "?"))[0])
print("| ranks | per node | coll | size | algo (ran) | measured us | predicted us | meas/pred |")
print("|---|---|---|---|---|---|---|---|")
ratios, autos = [], []
for (p, m, c, s), algos in sorted(rows.items()):
    for a, (t, used, pr) in sorted(algos.items()):
        r = t / pr
        ratios.append(r)
        print(f"| {p} | {m} | {c} | {s} | {a} ({used}) | {t:.1f} | {pr:.1f} | {r:.2f} |")
    fixed = [v[0] for k, v in algos.items() if k != "auto"]
    if "auto" in algos and fixed:
        autos.append((algos["auto"][0] / min(fixed), p, m, c, s, algos["auto"][1]))
inside = sum(1 for r in ratios if 1 / 1.5 <= r <= 1.5)
print(f"\nmeasured/predicted within 1.5x: {inside}/{len(ratios)}; "
      f"median {sorted(ratios)[len(ratios)//2]:.2f}, min {min(ratios):.2f}, max {max(ratios):.2f}")
ok = sum(1 for a in autos if a[0] <= 1.10)
print(f"auto within 10% of the best fixed algorithm: {ok}/{len(autos)}")
for a in sorted(autos, reverse=True)[:8]:
    print(f"  auto/best {a[0]:.2f}: {a[1]} ranks, {a[2]}/node, {a[3]}, {a[4]} B (auto ran {a[5]})")
PY
