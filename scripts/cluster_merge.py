#!/usr/bin/env python3
"""One pccl-bench JSON document from several launches of the same benchmark (the median per
point), as scripts/cluster-bench.sh --launches N writes it.

    python3 scripts/cluster_merge.py OUT.json LAUNCH1.json LAUNCH2.json ...

Why launches and not passes: on the emulated cluster (16 rank processes on 2 cores) the time of
a small message is set by how the scheduler happens to interleave that launch's processes,
and it stays so for the launch's whole life. Three passes in one launch agree with another
launch's three passes no better than single passes do (4x4, 2 NICs, all-reduce 1-16 KiB: 82%
and 83% of points within 10%); the medians of three launches agree at 92%, of five at 97%
(docs/CLUSTER.md, "Launches against passes"; in the full matrix three were not enough).

Per point (size, requested entry), over the launches that have it:
- the slowest rank's time (`slowest_us`), the mean (`avg_us`) and the rank median
  (`median_us`): each the median over launches; `algbw`/`busbw` follow `avg_us`;
- `min_us` the least, `max_us` the largest, `iters` and `wrong` the sums (a wrong element in
  any launch stays counted), the host's stolen share the mean;
- `algo`: every plan the launches ran, joined with `|` (auto-online may settle differently);
- `x_floor` and the ratios against MPI and the vendor recomputed from the medians.
A point missing from some launch is merged from those that have it; a launch file without a
JSON document fails the merge (a crashed launch must not vanish into a median).
"""

import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster_report  # noqa: E402  (its reader of pccl-bench documents)


def load(path):
    doc = cluster_report.load(path)
    if doc is None:
        raise SystemExit(f"cluster_merge.py: {path} holds no JSON document")
    return doc


def median_of(rows, field):
    vals = [r[field] for r in rows if r.get(field) is not None]
    return statistics.median(vals) if vals else None


def merge_point(rows):
    out = dict(rows[0])
    avg = median_of(rows, "avg_us")
    for bw in ("algbw_gbs", "busbw_gbs"):
        if out.get(bw) is not None and out["avg_us"]:
            out[bw] = out[bw] * out["avg_us"] / avg
    out["avg_us"] = avg
    out["slowest_us"] = median_of(rows, "slowest_us")
    out["median_us"] = median_of(rows, "median_us")
    out["min_us"] = min(r["min_us"] for r in rows)
    out["max_us"] = max(r["max_us"] for r in rows)
    out["iters"] = sum(r["iters"] for r in rows)
    out["wrong"] = sum(r["wrong"] for r in rows)
    steal = [r["host_steal_pct"] for r in rows if r.get("host_steal_pct") is not None]
    out["host_steal_pct"] = sum(steal) / len(steal) if steal else None
    ran = []
    for r in rows:
        for a in r["algo"].split("|"):
            if a not in ran:
                ran.append(a)
    out["algo"] = "|".join(ran)
    for key, ratio in (("mpi_avg_us", "ratio_vs_mpi"), ("vendor_avg_us", "ratio_vs_vendor")):
        other = median_of(rows, key)
        out[key] = other
        out[ratio] = avg / other if other else None
    if out.get("floor_us"):
        out["x_floor"] = (out["slowest_us"] or avg) / out["floor_us"]
    return out


def merge(docs):
    order, points = [], {}
    for doc in docs:
        for r in doc["results"]:
            key = (r["coll"], r["bytes"], r.get("requested", r["algo"]))
            if key not in points:
                order.append(key)
                points[key] = []
            points[key].append(r)
    comm = dict(docs[0]["comm"])
    comm["launches"] = len(docs)
    return {"comm": comm, "results": [merge_point(points[k]) for k in order]}


def main(argv):
    if len(argv) < 3:
        raise SystemExit(__doc__.split("\n\n")[1])
    merged = merge([load(p) for p in argv[2:]])
    wrong = sum(r["wrong"] for r in merged["results"])
    with open(argv[1], "w") as f:
        json.dump(merged, f, indent=2)
        f.write("\n")
        f.write("# check: all results correct\n" if wrong == 0
                else f"# check: {wrong} wrong elements\n")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
