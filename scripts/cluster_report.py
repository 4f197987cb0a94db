#!/usr/bin/env python3
"""Tables and target checks of the emulated-cluster runs (scripts/cluster-bench.sh's JSON).

    python3 scripts/cluster_report.py docs/cluster [--before docs/cluster/before-ack] \
        [--into docs/CLUSTER.md [--marker NAME]]

--marker: the block between `<!-- NAME:start -->` and `<!-- NAME:end -->` (default
cluster-report) is replaced, so several folders' reports can live in one document.

For every run (shape N x M, K NICs, collective): one row per size with each entry's time (the
slowest rank's, median over rounds: the collective's completion), its distance from the NIC
floor and from the model, `auto` against the best fixed algorithm and against MPI's own
collective, and (where pccl-bench recorded it) the share of the host's CPU time its
hypervisor stole while the size ran. Then the issue's targets, counted over all runs. Times
in ms.
"""

import glob
import json
import os
import re
import sys
from collections import defaultdict

FIXED = ["ring", "rd", "hier-rd", "hier-ring", "hier-rd-pipe4", "hier-ring-pipe4"]


def load(path):
    """The first JSON document of a file (mpiexec may append its own messages)."""
    text = open(path).read()
    start = text.find("{")
    if start < 0:
        return None
    try:
        doc, _ = json.JSONDecoder().raw_decode(text[start:])
    except json.JSONDecodeError:
        return None
    return doc


def runs(folder):
    out = []
    for f in sorted(glob.glob(os.path.join(folder, "*.json"))):
        m = re.match(r"(\w+)-(\d+)x(\d+)-k(\d+)-([0-9a-z]+?)(-.+)?\.json$", os.path.basename(f))
        doc = load(f)
        if not m or not doc:
            continue
        coll, n, mm, k, rate, tag = m.groups()
        by = defaultdict(dict)
        for r in doc["results"]:
            by[r["bytes"]][r["requested"]] = r
        out.append({"file": f, "coll": coll, "n": int(n), "m": int(mm), "k": int(k),
                    "rate": rate, "tag": (tag or "").lstrip("-"), "sizes": dict(by)})
    return out


def t(r):
    return (r.get("slowest_us") or r["avg_us"]) / 1e3


def size_name(b):
    for unit, div in (("M", 1 << 20), ("K", 1 << 10)):
        if b >= div and b % div == 0:
            return f"{b // div}{unit}"
    return str(b)


def table(run):
    entries = [e for e in ["auto", "auto-pure", "auto-online"] + FIXED + ["mpi"]
               if any(e in row for row in run["sizes"].values())]
    steal = any(r.get("host_steal_pct") is not None
                for row in run["sizes"].values() for r in row.values())
    head = ["size"] + entries + ["auto ran", "auto/best", "auto/mpi"] + (
        ["host steal %"] if steal else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for b in sorted(run["sizes"]):
        row = run["sizes"][b]
        cells = [size_name(b)]
        for e in entries:
            r = row.get(e)
            if not r:
                cells.append("-")
                continue
            c = f"{t(r):.2f}"
            if r.get("floor_us"):
                c += f" ({t(r) * 1e3 / r['floor_us']:.2f}f"
                c += f", {t(r) * 1e3 / r['model_us']:.2f}m)" if r.get("model_us") else ")"
            cells.append(c)
        best = min((t(row[e]) for e in FIXED if e in row), default=None)
        auto = row.get("auto")
        cells.append(auto["algo"] if auto else "-")
        cells.append(f"{t(auto) / best:.2f}" if auto and best else "-")
        cells.append(f"{t(auto) / t(row['mpi']):.2f}" if auto and "mpi" in row else "-")
        if steal:
            st = [r["host_steal_pct"] for r in row.values() if r.get("host_steal_pct") is not None]
            cells.append(f"{max(st):.1f}" if st else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def targets(all_runs, big=1 << 20, profile="profile from R and K alone"):
    model_pts = model_ok = model_ok15 = 0
    online_pts = online_ok = 0
    pure_pts = pure_ok = 0
    auto_pts = auto_ok = auto_same = 0
    mpi_pts = mpi_ok = 0
    same = []
    floor_pts = floor_ok = 0
    worst_floor = []
    for run in all_runs:
        for b, row in run["sizes"].items():
            for e in FIXED:
                r = row.get(e)
                if not r:
                    continue
                if r.get("model_us"):
                    model_pts += 1
                    x = t(r) * 1e3 / r["model_us"]
                    model_ok += 0.8 <= x <= 1.25
                    model_ok15 += 1 / 1.5 <= x <= 1.5
                if b >= big and r.get("floor_us"):
                    floor_pts += 1
                    x = t(r) * 1e3 / r["floor_us"]
                    floor_ok += x <= 1.15
                    if x > 1.15:
                        worst_floor.append((round(x, 2), e, run["coll"], f"{run['n']}x{run['m']}",
                                            f"K={run['k']}", size_name(b)))
            best = min((t(row[e]) for e in FIXED if e in row), default=None)
            best_name = min((e for e in FIXED if e in row), key=lambda e: t(row[e]), default=None)
            if "auto" in row and best:
                auto_pts += 1
                auto_ok += t(row["auto"]) <= 1.1 * best
                # A miss where auto ran the best entry's own plan is the measurement's.
                auto_same += (t(row["auto"]) > 1.1 * best and row["auto"]["algo"] == best_name)
            for e in ("auto", "auto-online"):
                r = row.get(e)
                if r and r["algo"] in FIXED and r["algo"] in row:
                    same.append(t(r) / t(row[r["algo"]]))
            if "auto-pure" in row and best:
                pure_pts += 1
                pure_ok += t(row["auto-pure"]) <= 1.1 * best
            if "auto-online" in row and best:
                online_pts += 1
                online_ok += t(row["auto-online"]) <= 1.1 * best
            if "auto" in row and "mpi" in row:
                mpi_pts += 1
                mpi_ok += t(row["auto"]) <= t(row["mpi"])
    out = {
        f"model within 1.25x ({profile})": f"{model_ok} of {model_pts}",
        f"model within 1.5x ({profile})": f"{model_ok15} of {model_pts}",
        "auto within 10% of the best fixed algorithm": f"{auto_ok} of {auto_pts}",
        "auto's misses where it ran the best entry's own plan (the measurement's, not the "
        "choice's)": f"{auto_same} of {auto_pts - auto_ok}",
        "the same plan under two names in one run (auto or auto-online against the fixed entry "
        "of the plan it ran), within 10%":
            f"{sum(1 / 1.1 <= x <= 1.1 for x in same)} of {len(same)}"
            + (f" (ratios {min(same):.2f}-{max(same):.2f})" if same else ""),
        "auto at least as fast as MPI's own collective": f"{mpi_ok} of {mpi_pts}",
        f"within 1.15x of the NIC floor at >= {size_name(big)}": f"{floor_ok} of {floor_pts}",
        "worst misses of the floor": sorted(worst_floor, reverse=True)[:8],
    }
    if pure_pts:
        out["auto-pure (PCCL_TUNE_MARGIN=0, PCCL_TUNE_OVERLAP_MARGIN=0: the model's fastest) within 10% of the best fixed "
            "algorithm"] = f"{pure_ok} of {pure_pts}"
    if online_pts:
        out["auto-online (PCCL_TUNE_ONLINE) within 10% of the best fixed algorithm"] = \
            f"{online_ok} of {online_pts}"
    return out


def summary(all_runs, b=1 << 20):
    """One line per run at per-rank size `b`: flat ring against the best hierarchy, as
    measured and as the NIC floors say, and auto's standing."""
    head = ["run", "ring ms (f)", "best hierarchy ms (f)", "ring / hierarchy: measured",
            "floors", "auto ran", "auto / best", "auto / MPI"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for run in all_runs:
        row = run["sizes"].get(b)
        if not row or "ring" not in row:
            continue
        hier = [e for e in FIXED if e.startswith("hier") and e in row]
        if not hier:
            continue
        h = min(hier, key=lambda e: t(row[e]))
        ring, best_h = row["ring"], row[h]
        best = min(t(row[e]) for e in FIXED if e in row)
        auto = row.get("auto")
        lines.append("| " + " | ".join([
            f"{run['coll']} {run['n']}x{run['m']} K={run['k']}"
            + (f" ({run['tag']})" if run["tag"] else ""),
            f"{t(ring):.0f} ({t(ring) * 1e3 / ring['floor_us']:.2f})",
            f"{h} {t(best_h):.0f} ({t(best_h) * 1e3 / best_h['floor_us']:.2f})",
            f"{t(ring) / t(best_h):.2f}",
            f"{ring['floor_us'] / best_h['floor_us']:.2f}",
            auto["algo"] if auto else "-",
            f"{t(auto) / best:.2f}" if auto else "-",
            f"{t(auto) / t(row['mpi']):.2f}" if auto and "mpi" in row else "-",
        ]) + " |")
    return "\n".join(lines)


def spread(all_runs):
    """Runs repeated (same collective, shape, K and rate, another tag): the share of the
    points (size x entry) whose two times agree within 10%, and the largest ratio."""
    key = lambda r: (r["coll"], r["n"], r["m"], r["k"], r["rate"])
    groups = defaultdict(list)
    for r in all_runs:
        groups[key(r)].append(r)
    pts = ok = 0
    worst = 1.0
    for runs_ in groups.values():
        base = [r for r in runs_ if not r["tag"]]
        reps = [r for r in runs_ if r["tag"].startswith("rep")]
        if not base or not reps:
            continue
        a, b = base[0], reps[0]
        for size, row in a["sizes"].items():
            for e, r in row.items():
                other = b["sizes"].get(size, {}).get(e)
                if not other:
                    continue
                x = max(t(r), t(other)) / min(t(r), t(other))
                pts += 1
                ok += x <= 1.10
                worst = max(worst, x)
    return pts, ok, worst


def report(all_runs, profile="profile from R and K alone"):
    out = [f"Per-rank size 1 MiB, every run (ms, the slowest rank's median; in brackets the time "
           f"over the NIC floor):\n", summary(all_runs), "\nTargets, over every point of "
           f"every run:\n"]
    for k, v in targets(all_runs, profile=profile).items():
        out.append(f"- {k}: {v}")
    pts, ok, worst = spread(all_runs)
    if pts:
        out.append(f"- repeated runs agreeing within 10%: {ok} of {pts} points "
                   f"(largest ratio {worst:.2f})")
    for run in all_runs:
        tag = f" ({run['tag']})" if run["tag"] else ""
        out.append(f"\n<details><summary>{run['coll']}, {run['n']}x{run['m']}, K = {run['k']} "
                   f"NICs at {run['rate']}{tag}</summary>\n")
        out.append("ms (slowest rank; f: over the NIC floor, m: over the model)\n")
        out.append(table(run))
        out.append("\n</details>")
    return "\n".join(out)


def compare(old_runs, new_runs, b=1 << 20):
    """Each entry's time over its NIC floor at per-rank size `b`, an earlier matrix against
    this one (median over the runs of each)."""
    def ratios(all_runs):
        out = defaultdict(list)
        for run in all_runs:
            if run["tag"]:
                continue
            for e, r in run["sizes"].get(b, {}).items():
                if r.get("floor_us"):
                    out[e].append(t(r) * 1e3 / r["floor_us"])
        return out

    def med(v):
        v = sorted(v)
        return v[len(v) // 2] if v else float("nan")

    old, new = ratios(old_runs), ratios(new_runs)
    lines = ["| algorithm | before: time / floor (median, range) | after |", "|---|---|---|"]
    for e in FIXED:
        if e in old and e in new:
            lines.append(f"| {e} | {med(old[e]):.2f} ({min(old[e]):.2f}–{max(old[e]):.2f}) | "
                         f"{med(new[e]):.2f} ({min(new[e]):.2f}–{max(new[e]):.2f}) |")
    return "\n".join(lines)


def main():
    args = sys.argv[1:]
    marker = "cluster-report"
    if "--marker" in args:
        i = args.index("--marker")
        marker = args[i + 1]
        del args[i:i + 2]
    into = None
    if "--into" in args:
        i = args.index("--into")
        into = args[i + 1]
        del args[i:i + 2]
    before = None
    if "--before" in args:
        i = args.index("--before")
        before = args[i + 1]
        del args[i:i + 2]
    folder = args[0] if args else "docs/cluster"
    tuned = glob.glob(os.path.join(folder, "profile-tuned-*.toml"))
    text = report(runs(folder), "profile from pccl-tune inside the cluster" if tuned
                  else "profile from R and K alone")
    if before:
        text = (f"Each algorithm's time over its NIC floor at 1 MiB per rank, the matrix in "
                f"`{before}` against this one:\n\n{compare(runs(before), runs(folder))}\n\n"
                + text)
    if into is None:
        print(text)
        return
    doc = open(into).read()
    start, end = f"<!-- {marker}:start -->", f"<!-- {marker}:end -->"
    a, b = doc.index(start) + len(start), doc.index(end)
    open(into, "w").write(doc[:a] + "\n" + text + "\n" + doc[b:])


if __name__ == "__main__":
    main()
