#!/usr/bin/env python3
"""Plots of the emulated-cluster runs (scripts/cluster-bench.sh's JSON), as SVG with no
dependency beyond Python:

    python3 scripts/cluster_plots.py docs/cluster/tuned --out docs/img [--size 1M] [--k 2] \
        [--coll allgather]

* cluster-<coll>-ranks.svg: time against ranks (shapes N x M with the same M and K) at one
  per-rank size, one line per algorithm and MPI, the model's prediction dashed;
* cluster-model.svg: every point's prediction against its measurement (log-log), with the
  1.25x band.
"""

import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster_report as cr  # noqa: E402

COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
          "#7f7f7f", "#17becf"]
W, H, L, R, T, B = 720, 440, 70, 190, 30, 50


def parse_size(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * units[s[-1]] if s[-1] in units else int(s)


class Axes:
    def __init__(self, xs, ys, logx=False, logy=True):
        self.logx, self.logy = logx, logy
        f = (lambda v: math.log10(v)) if logx else (lambda v: v)
        g = (lambda v: math.log10(v)) if logy else (lambda v: v)
        self.fx, self.fy = f, g
        self.x0, self.x1 = f(min(xs)), f(max(xs))
        self.y0, self.y1 = g(min(ys)), g(max(ys))
        if self.x1 == self.x0:
            self.x1 += 1
        if self.y1 == self.y0:
            self.y1 += 1
        pad = 0.05 * (self.y1 - self.y0)
        self.y0, self.y1 = self.y0 - pad, self.y1 + pad

    def px(self, x):
        return L + (self.fx(x) - self.x0) / (self.x1 - self.x0) * (W - L - R)

    def py(self, y):
        return H - B - (self.fy(y) - self.y0) / (self.y1 - self.y0) * (H - T - B)


def ticks(lo, hi, log):
    if log:
        out = []
        for e in range(math.floor(lo), math.ceil(hi) + 1):
            for m in (1, 2, 5):
                v = m * 10 ** e
                if lo <= math.log10(v) <= hi:
                    out.append(v)
        return out
    step = 10 ** math.floor(math.log10(max(hi - lo, 1e-9)))
    return [v * step for v in range(math.ceil(lo / step), math.floor(hi / step) + 1)]


def svg(title, xlabel, ylabel, ax, series, extra=""):
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{L}" y="18" font-size="14">{title}</text>',
           f'<rect x="{L}" y="{T}" width="{W - L - R}" height="{H - T - B}" fill="none" '
           f'stroke="#888"/>']
    for v in ticks(ax.y0, ax.y1, ax.logy):
        y = ax.py(v)
        out.append(f'<line x1="{L}" x2="{W - R}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>')
        out.append(f'<text x="{L - 6}" y="{y + 4:.1f}" text-anchor="end">{v:g}</text>')
    for v in ticks(ax.x0, ax.x1, ax.logx):
        x = ax.px(v)
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{T}" y2="{H - B}" stroke="#eee"/>')
        out.append(f'<text x="{x:.1f}" y="{H - B + 16}" text-anchor="middle">{v:g}</text>')
    out.append(f'<text x="{(L + W - R) / 2}" y="{H - 12}" text-anchor="middle">{xlabel}</text>')
    out.append(f'<text x="16" y="{(T + H - B) / 2}" text-anchor="middle" '
               f'transform="rotate(-90 16 {(T + H - B) / 2})">{ylabel}</text>')
    out.append(extra)
    for i, (name, pts, dashed, color) in enumerate(series):
        d = " ".join(f"{ax.px(x):.1f},{ax.py(y):.1f}" for x, y in pts)
        style = ' stroke-dasharray="5,4"' if dashed else ""
        out.append(f'<polyline points="{d}" fill="none" stroke="{color}" stroke-width="2"'
                   f'{style}/>')
        for x, y in pts:
            out.append(f'<circle cx="{ax.px(x):.1f}" cy="{ax.py(y):.1f}" r="3" fill="{color}"/>')
        ly = T + 14 + 16 * i
        out.append(f'<line x1="{W - R + 10}" x2="{W - R + 34}" y1="{ly - 4}" y2="{ly - 4}" '
                   f'stroke="{color}" stroke-width="2"{style}/>')
        out.append(f'<text x="{W - R + 40}" y="{ly}">{name}</text>')
    out.append("</svg>")
    return "\n".join(out)


def ranks_plot(runs, coll, size, k, m):
    sel = sorted((r for r in runs if r["coll"] == coll and r["k"] == k and r["m"] == m
                  and not r["tag"] and size in r["sizes"]), key=lambda r: r["n"])
    if len(sel) < 2:
        return None
    entries = [e for e in cr.FIXED + ["auto", "mpi"]
               if all(e in r["sizes"][size] for r in sel)]
    series, xs, ys = [], [], []
    for i, e in enumerate(entries):
        color = COLORS[i % len(COLORS)]
        pts = [(r["n"] * r["m"], cr.t(r["sizes"][size][e])) for r in sel]
        series.append((e, pts, False, color))
        model = [(r["n"] * r["m"], r["sizes"][size][e]["model_us"] / 1e3) for r in sel
                 if r["sizes"][size][e].get("model_us")]
        if len(model) == len(sel) and e in cr.FIXED:
            series.append((f"{e} (model)", model, True, color))
            ys += [y for _, y in model]
        xs += [x for x, _ in pts]
        ys += [y for _, y in pts]
    ax = Axes(xs, ys)
    title = (f"{coll}, {cr.size_name(size)} per rank, {m} ranks per node, K = {k} NICs at "
             f"{sel[0]['rate']}")
    return svg(title, "ranks", "ms (slowest rank, median)", ax, series)


def model_plot(runs):
    pts = []
    for r in runs:
        for row in r["sizes"].values():
            for e in cr.FIXED:
                x = row.get(e)
                if x and x.get("model_us"):
                    pts.append((x["model_us"] / 1e3, cr.t(x)))
    if not pts:
        return None
    ax = Axes([p for p, _ in pts] + [m for _, m in pts], [p for p, _ in pts] + [m for _, m in pts],
              logx=True)
    lo, hi = 10 ** ax.x0, 10 ** ax.x1
    inside = sum(1 for p, m in pts if 0.8 <= m / p <= 1.25)
    band = "".join(
        f'<line x1="{ax.px(lo):.1f}" y1="{ax.py(lo * f):.1f}" x2="{ax.px(hi):.1f}" '
        f'y2="{ax.py(hi * f):.1f}" stroke="#999" stroke-dasharray="{d}"/>'
        for f, d in ((1.0, "1,0"), (1.25, "4,3"), (0.8, "4,3")))
    dots = "".join(f'<circle cx="{ax.px(p):.1f}" cy="{ax.py(m):.1f}" r="2" fill="#1f77b4" '
                   f'fill-opacity="0.6"/>' for p, m in pts)
    title = (f"measured against predicted, {len(pts)} points ({inside} within 1.25x; "
             f"dashed: 1.25x)")
    return svg(title, "model (ms)", "measured (ms)", ax, [], band + dots)


def main():
    args = sys.argv[1:]

    def opt(name, default):
        if name in args:
            i = args.index(name)
            v = args[i + 1]
            del args[i:i + 2]
            return v
        return default

    out = opt("--out", "docs/img")
    size = parse_size(opt("--size", "1M"))
    k = int(opt("--k", "2"))
    m = int(opt("--m", "4"))
    colls = opt("--coll", "allgather,reducescatter,allreduce").split(",")
    runs = cr.runs(args[0] if args else "docs/cluster/tuned")
    os.makedirs(out, exist_ok=True)
    for coll in colls:
        text = ranks_plot(runs, coll, size, k, m)
        if text:
            f = os.path.join(out, f"cluster-{coll}-ranks.svg")
            open(f, "w").write(text)
            print(f)
    text = model_plot(runs)
    if text:
        f = os.path.join(out, "cluster-model.svg")
        open(f, "w").write(text)
        print(f)


if __name__ == "__main__":
    main()
