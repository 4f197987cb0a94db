#!/usr/bin/env python3
"""How far repeated model checks disagree with each other (a report, not a test).

    scripts/model-check-spread.py RUN1.txt RUN2.txt [RUN3.txt ...]

Reads the tables `scripts/model-check.sh` prints and, per transport, counts the points (shape,
collective, size, fixed algorithm) measured in every run whose slowest and fastest medians
differ by more than 1.5× and by more than 2.25× = 1.5². Past 2.25× no prediction, whatever
the model, lies within 1.5× of both measurements: the share of such points bounds what the
issue's "within 1.5× everywhere" can reach on that machine. The worst points are listed.
"""
import sys


def load(path):
    rows = {}
    for line in open(path):
        cells = [c.strip() for c in line.split("|")]
        if len(cells) < 9 or cells[1] not in ("threads", "mpi"):
            continue
        transport, ranks, per_node, coll, size, algo = cells[1:7]
        if algo.startswith("auto"):
            continue  # the tuner's choice may differ between runs
        rows[(transport, int(ranks), int(per_node), coll, int(size), algo)] = float(cells[7])
    return rows


def main(paths):
    if len(paths) < 2:
        sys.exit("model-check-spread: give two or more model-check outputs")
    runs = [load(p) for p in paths]
    common = set(runs[0]).intersection(*runs[1:])
    for t in sorted({k[0] for k in common}):
        keys = sorted(k for k in common if k[0] == t)
        spread = {k: max(r[k] for r in runs) / min(r[k] for r in runs) for k in keys}
        over = [k for k in keys if spread[k] > 2.25]
        print(
            f"{t}: {len(keys)} points in all {len(runs)} runs; measurements differ "
            f">1.5x at {sum(1 for k in keys if spread[k] > 1.5)}, >2.25x at {len(over)} "
            f"(no single prediction within 1.5x of each)"
        )
        for k in sorted(over, key=lambda k: -spread[k])[:5]:
            times = ", ".join(f"{r[k]:.1f}" for r in runs)
            print(f"  {spread[k]:.2f}x: {k[1]} ranks, {k[2]}/node, {k[3]}, {k[4]} B, {k[5]}: {times} us")


if __name__ == "__main__":
    main(sys.argv[1:])
