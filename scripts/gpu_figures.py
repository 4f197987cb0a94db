#!/usr/bin/env python3
"""The figures of a scripts/gpu-check.sh run, from its logs folder.

    python3 scripts/gpu_figures.py LOG_DIR [FIGURES_JSON]

Reads the pccl-bench JSONs (bench-w1: one rank with NCCL's own collective timed beside
PCCL's; bench-staged / bench-level: 2 thread-ranks on the GPU, host-staged and through the
NCCL level) and the train_fsdp.py / train_deepspeed.py summaries, prints the headline figures
the open GPU issues ask for, and writes every figure to FIGURES_JSON. A missing input is
reported and skipped (the step was skipped or failed).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

KIB, MIB = 1024, 1024 * 1024


def load(path: Path):
    try:
        text = path.read_text()
    except OSError:
        return None
    # pccl-bench prints one JSON document; tolerate anything before it.
    start = text.find("{")
    if start < 0:
        return None
    try:
        return json.loads(text[start:])
    except json.JSONDecodeError:
        return None


def rows(doc) -> dict:
    """(coll, bytes) -> result row of a pccl-bench JSON."""
    if not doc:
        return {}
    return {(r["coll"], r["bytes"]): r for r in doc.get("results", [])}


def size(b: int) -> str:
    return f"{b // MIB} MiB" if b >= MIB else f"{b // KIB} KiB"


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    d = Path(sys.argv[1])
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else None
    fig: dict = {"missing": []}
    benches = {}
    for name in ("bench-w1", "bench-staged", "bench-level", "rs-staged-fixed", "rs-level-fixed"):
        doc = load(d / f"{name}.json")
        if doc is None:
            fig["missing"].append(name)
        benches[name] = rows(doc)
        fig[name] = doc

    # PCCL / NCCL at world size 1, every size.
    w1 = benches["bench-w1"]
    ratios = []
    for (coll, b), r in sorted(w1.items()):
        if r.get("vendor_avg_us"):
            ratios.append({"coll": coll, "bytes": b, "pccl_us": r["avg_us"],
                           "nccl_us": r["vendor_avg_us"], "pccl_over_nccl": r["ratio_vs_vendor"],
                           "algo": r.get("algo")})
    fig["pccl_vs_nccl_world1"] = ratios
    if ratios:
        print("PCCL / NCCL, world size 1 (pccl-bench -d cuda --ranks 1):")
        for x in ratios:
            if x["bytes"] in (KIB, 64 * KIB, MIB, 16 * MIB, 256 * MIB):
                print(f"  {x['coll']:<14} {size(x['bytes']):>8}: {x['pccl_us']:10.1f} us vs "
                      f"{x['nccl_us']:10.1f} us = {x['pccl_over_nccl']:.2f}x ({x['algo']})")
    elif w1:
        print("bench-w1: no NCCL column (NCCL not found or not comparable)")

    # The NCCL level against the staged path at 2 ranks, and the 1 KiB latencies.
    st, lv = benches["bench-staged"], benches["bench-level"]
    level = []
    for key in sorted(set(st) & set(lv)):
        a, b = st[key], lv[key]
        level.append({"coll": key[0], "bytes": key[1], "staged_us": a["avg_us"],
                      "level_us": b["avg_us"], "level_over_staged": b["avg_us"] / a["avg_us"],
                      "staged_busbw_gbs": a.get("busbw_gbs"), "level_busbw_gbs": b.get("busbw_gbs"),
                      "level_algo": b.get("algo")})
    fig["level_vs_staged_2ranks"] = level
    if level:
        print("NCCL level (2 nodes x 1) / staged (1 node x 2), 2 thread-ranks on the GPU:")
        for x in level:
            if x["bytes"] in (KIB, MIB, 16 * MIB, 256 * MIB):
                print(f"  {x['coll']:<14} {size(x['bytes']):>8}: level {x['level_us']:10.1f} us, "
                      f"staged {x['staged_us']:10.1f} us = {x['level_over_staged']:.2f}x")
    a = benches["rs-staged-fixed"].get(("reducescatter", 256 * MIB))
    b = benches["rs-level-fixed"].get(("reducescatter", 256 * MIB))
    if a and b:
        fig["rs_256mib_ring_4mib_pieces"] = {"staged_us": a["avg_us"], "level_us": b["avg_us"],
                                             "level_over_staged": b["avg_us"] / a["avg_us"]}
        print(f"  reduce-scatter 256 MiB, PCCL_ALGO=ring PCCL_CHUNK_SIZE=4M: level "
              f"{b['avg_us']:.1f} us, staged {a['avg_us']:.1f} us = {b['avg_us'] / a['avg_us']:.2f}x")
    lat = {}
    for coll in ("allgather", "reducescatter", "allreduce"):
        k = (coll, KIB)
        lat[coll] = {
            "staged_2ranks_us": st.get(k, {}).get("avg_us"),
            "level_2ranks_us": lv.get(k, {}).get("avg_us"),
            "pccl_1rank_us": w1.get(k, {}).get("avg_us"),
            "nccl_1rank_us": w1.get(k, {}).get("vendor_avg_us"),
        }
        n, l_ = lat[coll]["nccl_1rank_us"], lat[coll]["level_2ranks_us"]
        lat[coll]["level_over_nccl"] = l_ / n if n and l_ else None
    fig["latency_1kib"] = lat
    print("1 KiB latency (us): coll: staged 2 ranks / NCCL level 2 ranks / PCCL 1 rank / NCCL 1 rank "
          "(issue 13 target: level within 3x of NCCL)")
    for coll, v in lat.items():
        cells = " / ".join("-" if v[k] is None else f"{v[k]:.1f}" for k in
                           ("staged_2ranks_us", "level_2ranks_us", "pccl_1rank_us", "nccl_1rank_us"))
        ratio = v["level_over_nccl"]
        print(f"  {coll:<14} {cells}" + (f"  (level/NCCL {ratio:.1f}x)" if ratio else ""))

    # Training harnesses.
    train = {}
    for name in ("fsdp-w1", "fsdp-w2", "nccl-w2", "deepspeed-pccl", "deepspeed-nccl"):
        doc = load(d / f"{name}.json")
        if doc is None:
            continue
        doc.pop("losses", None)
        ref = doc.get("reference")
        if isinstance(ref, dict):
            ref.pop("losses", None)
        train[name] = doc
    fig["training"] = train
    for name, v in train.items():
        ref = v.get("reference") or {}
        line = f"{name}: step {1e3 * (v.get('mean_step_s') or 0):.1f} ms, last loss {v.get('last_loss')}"
        if ref:
            line += (f"; reference {ref.get('backend', '')} step "
                     f"{1e3 * (ref.get('mean_step_s') or 0):.1f} ms, last loss {ref.get('last_loss')}, "
                     f"worst relative loss difference {v.get('worst_rel_diff')}")
        print(line)
    if fig["missing"]:
        print("missing (skipped or failed steps):", ", ".join(fig["missing"]))
    if out:
        out.write_text(json.dumps(fig, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
