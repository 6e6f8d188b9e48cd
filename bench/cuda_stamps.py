"""A timeline of one graphed one-row decode step from inside the CUDA C++ kernels (issue 9,
eighteenth session): each CTA of the mixers' stream products and of the recurrence (the CUDA C++
one, cuda_fusions.REC, as fast as the Triton one: docs/cuda.md) stamps the global timer at its
start, after its griddepcontrol.wait, at a point of its own (a product: its first unit landed; the
recurrence: its first row's inputs loaded) and at its end (after its last store).

bench/cuda_timeline.py (the profiler's trace) showed the recurrence ending 6.4-7.0 us after the input
product although it takes 3.7 us alone; these stamps split that time: the wake (the input product's
last CTA ends -> the recurrence's waits return), the loads, the rest of the recurrence, the gated
norm (the recurrence's last CTA ends -> the output product's waits return), the output product.

  python3 bench/cuda_stamps.py --layers 8 --steps 5 --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch

import cuda_bench as cb  # bench/ is on the path

NAMES = {12352: "in", 9216: "in_attn", 2048: "out", 1: "rec"}


def launches(recs: list[list[int]]) -> list[dict]:
    """Records (tag, block, sm, t0, t1, t2, t3) -> one entry per launch, in launch order: the same
    tag's records split where their starts are more than 15 us apart (a layer is ~48 us)."""
    out = []
    for tag in sorted({r[0] for r in recs}):
        rs = sorted((r for r in recs if r[0] == tag), key=lambda r: r[3])
        group = [rs[0]]
        for r in rs[1:]:
            if r[3] - group[-1][3] > 15_000:
                out.append(group)
                group = []
            group.append(r)
        out.append(group)
    res = []
    for g in out:
        t0 = [r[3] for r in g]
        t1 = [r[4] for r in g]
        t2 = [r[5] for r in g]
        t3 = [r[6] for r in g]
        res.append({"kernel": NAMES.get(g[0][0], str(g[0][0])), "ctas": len(g), "start_first": min(t0),
                    "start_last": max(t0), "wait_min": min(t1), "wait_med": statistics.median(t1),
                    "wait_max": max(t1), "mark_med": statistics.median(t2), "mark_max": max(t2),
                    "end_min": min(t3), "end_med": statistics.median(t3), "end_max": max(t3)})
    return sorted(res, key=lambda e: e["start_first"])


def intervals(ls: list[dict]) -> list[dict]:
    """Per DeltaNet layer (in, rec, out), in us: the previous output product's end -> the input
    product's waits (the MoE between), the input product after its wait, the recurrence's wake,
    loads and rest, the gated norm, the output product after its wait."""
    rows = []
    for i in range(len(ls) - 2):
        a, r, o = ls[i], ls[i + 1], ls[i + 2]
        if (a["kernel"], r["kernel"], o["kernel"]) != ("in", "rec", "out"):
            continue
        prev = next((ls[j] for j in range(i - 1, -1, -1) if ls[j]["kernel"] == "out"), None)
        us = 1e-3
        rows.append({
            "moe_to_in_wait": (a["wait_min"] - prev["end_max"]) * us if prev else None,
            "in_wait_to_end": (a["end_max"] - a["wait_min"]) * us,
            "in_ends_spread": (a["end_max"] - a["end_min"]) * us,
            "in_first_unit_after_start": (a["mark_med"] - a["start_first"]) * us,
            "rec_resident_before_in_end": (a["end_max"] - r["start_last"]) * us,
            "rec_wake": (r["wait_min"] - a["end_max"]) * us,
            "rec_wake_spread": (r["wait_max"] - r["wait_min"]) * us,
            "rec_loads": (r["mark_med"] - r["wait_med"]) * us,
            "rec_loads_max": (r["mark_max"] - r["wait_min"]) * us,
            "rec_rest": (r["end_max"] - r["mark_max"]) * us,
            "rec_total": (r["end_max"] - a["end_max"]) * us,
            "out_resident_before_rec_end": (r["end_max"] - o["start_last"]) * us,
            "out_first_unit_after_start": (o["mark_med"] - o["start_first"]) * us,
            "gated_norm": (o["wait_min"] - r["end_max"]) * us,
            "out_wait_to_end": (o["end_max"] - o["wait_min"]) * us})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="qwen3.6-35b-a3b-shape")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--flood", default="all ahead", choices=list(cb.FLOOD_ARMS))
    ap.add_argument("--links", action="store_true", help="cuda_launch.LINKS on (the recurrence lets the gated norm "
                    "launch before its wait)")
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("cuda_stamps: torch sees no CUDA GPU", file=sys.stderr)
        return 2
    from verispec.ops import cuda_fusions, cuda_launch, cuda_recurrence as cr, cuda_stream_gemv as sg
    cuda_launch.LINKS = a.links
    sg.PRE, sg.PACE, sg.EVF = cb.FLOOD_ARMS[a.flood]
    buf = torch.zeros(1 << 17, dtype=torch.int64, device="cuda")
    sg.STAMPS = cr.STAMPS = buf
    cuda_fusions.REC = True
    eng, _ = cb.build(a.preset, a.layers, "independent", 1)
    m = eng.model
    st = m.new_state(len(cb.PROMPT) + a.steps + 16)
    m.forward(cb.PROMPT, st)
    for i in range(3):                                # warm-up: the graph captured, kernels compiled
        m.forward([11 + i], st)
    per_step = []
    for s in range(a.steps):
        buf.zero_()
        torch.cuda.synchronize()
        m.forward([29 + s], st)
        torch.cuda.synchronize()
        n = int(buf[0].item())
        recs = buf[8:8 + 8 * n].view(n, 8).tolist()
        ls = launches(recs)
        per_step.append({"launches": ls, "layers": intervals(ls)})
    keys = list(per_step[0]["layers"][0])
    nl = len(per_step[0]["layers"])
    print(f"[stamps] {a.layers} layers, stream products '{a.flood}', recurrence CUDA C++, links {a.links}; medians over {a.steps} "
          f"steps, us; per DeltaNet layer ({nl})")
    table = {}
    for k in keys:
        vals = [[st_["layers"][li][k] for st_ in per_step] for li in range(nl)]
        meds = [None if any(v is None for v in col) else statistics.median(col) for col in vals]
        table[k] = meds
        print(f"  {k:28s} " + " ".join("    -  " if v is None else f"{v:7.2f}" for v in meds))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = a.flood.replace(" ", "_").replace(",", "") + ("_links" if a.links else "")
    (out / f"cuda_stamps_{tag}.json").write_text(json.dumps({"layers": a.layers, "flood": a.flood, "links": a.links,
                                                             "table": table,
                                                             "steps": per_step}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
