#!/usr/bin/env python3
"""The model of another profile against an emulated-cluster matrix already measured.

    python3 scripts/cluster_repredict.py docs/cluster/cpu64 --rk [--alpha-us 50]
    python3 scripts/cluster_repredict.py docs/cluster/cpu64 --profile 'DIR/{coll}-{n}x{m}-k{k}.toml'

Every fixed algorithm's point of every run of the folder (scripts/cluster-bench.sh's JSON,
repeats left out) is predicted again by pccl-sim under the given profile, and the points
within 1.25x and 1.5x of the measurement are counted, over all sizes, at >= 32 KiB and at
1-16 KiB per rank; then how often the algorithm the profile predicts fastest measured within
10% of the fastest. `--rk`: the profile scripts/cluster.sh profile writes from the NIC rate
and count alone (latency --alpha-us, the rate x 1448/1514, K NICs, the shaper's burst --burst). `--profile`: a file per
run, its name a pattern of {coll}, {n}, {m} and {k}.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster_report import FIXED, runs, t  # noqa: E402

SIM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "target", "release", "pccl-sim")


def rate_bits(rate):
    """`200mbit` -> 2e8 (tc's units)."""
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
    for u, f in units.items():
        if rate.endswith(u):
            return float(rate[: -len(u)]) * f
    return float(rate)


def rk_profile(run, alpha_us, folder, burst):
    """As `scripts/cluster.sh profile` writes it for this run's rate, NIC count and burst."""
    gbps = rate_bits(run["rate"]) / 8e9 * 1448 / 1514
    path = os.path.join(folder, "rk-k%d-%s.toml" % (run["k"], run["rate"]))
    with open(path, "w") as f:
        f.write('name = "cluster-%dnic-%s"\nsource = "scripts/cluster.sh profile"\n'
                'efficiency = 1.0\n\n[inter]\nalpha_us = %s\nnics = %d\n'
                'nic_bandwidth_gbps = %.6f\ntaper = 1.0\nburst_bytes = %d\n'
                % (run["k"], run["rate"], alpha_us, run["k"], gbps, burst))
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folder")
    how = ap.add_mutually_exclusive_group(required=True)
    how.add_argument("--rk", action="store_true", help="the profile from R and K alone")
    how.add_argument("--profile", help="profile file pattern ({coll}, {n}, {m}, {k})")
    ap.add_argument("--alpha-us", default="50", help="--rk's assumed latency (us)")
    ap.add_argument("--burst", type=int, default=32768,
                    help="--rk's NIC burst in bytes (scripts/cluster.sh's 32k; 0: none)")
    a = ap.parse_args()
    if not os.access(SIM, os.X_OK):
        sys.exit("cluster_repredict.py: build pccl-sim first (cargo build --release --bin pccl-sim)")
    count = {}
    # The model's own choice among the fixed algorithms (its fastest prediction) per point,
    # against the fastest measured: how `auto` would fare with this profile (auto also weighs
    # forms the list does not time, so this approximates it).
    picks, misses = 0, []
    with tempfile.TemporaryDirectory() as tmp:
        for run in runs(a.folder):
            if run["tag"]:
                continue
            prof = (rk_profile(run, a.alpha_us, tmp, a.burst) if a.rk else
                    a.profile.format(coll=run["coll"], n=run["n"], m=run["m"], k=run["k"]))
            pred = {}
            for algo in FIXED:
                out = subprocess.run(
                    [SIM, "--preset-file", prof, "--coll", run["coll"], "--algo", algo,
                     "--ranks", str(run["n"] * run["m"]), "--ranks-per-node", str(run["m"]),
                     "--size", "1K:1M", "--on", "host", "--json"],
                    capture_output=True, text=True, check=True).stdout
                for line in out.splitlines():
                    p = json.loads(line)
                    got = run["sizes"].get(p["size"], {}).get(algo)
                    if not got:
                        continue
                    pred.setdefault(p["size"], {})[algo] = p["seconds"]
                    x = t(got) * 1e-3 / p["seconds"]
                    for key in ("all", ">= 32 KiB" if p["size"] >= 32768 else "1-16 KiB"):
                        c = count.setdefault(key, [0, 0, 0])
                        c[0] += 1 / 1.25 <= x <= 1.25
                        c[1] += 1 / 1.5 <= x <= 1.5
                        c[2] += 1
            for size, by in sorted(pred.items()):
                if len(by) < len(FIXED):
                    continue
                meas = {algo: t(run["sizes"][size][algo]) for algo in by}
                pick = min(by, key=by.get)
                x = meas[pick] / min(meas.values())
                picks += 1
                if x > 1.10:
                    misses.append("%s %dx%d K=%d %d B: %s %.2fx the best (%s)" % (
                        run["coll"], run["n"], run["m"], run["k"], size, pick, x,
                        min(meas, key=meas.get)))
    for key, (a125, a15, n) in count.items():
        print(f"{key}: within 1.25x {a125} of {n}, within 1.5x {a15} of {n}")
    print(f"the model's fastest fixed algorithm within 10% of the measured best: "
          f"{picks - len(misses)} of {picks}")
    for m in misses:
        print("  miss: " + m)


if __name__ == "__main__":
    main()
