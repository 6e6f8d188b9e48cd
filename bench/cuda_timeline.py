"""A timeline of one graphed one-row decode step, PDL on (issue 9): when each kernel's CTAs began
(with PDL that is when they became resident, before their wait) and ended, from the profiler's
trace of the CUDA graph's replay. bench/cuda_ablation.py found the recurrence costing 4.5 us a
layer in the chain although the output product after it should be fetching its weights while it
runs; the output product's start against the recurrence's start and end says whether it does.

  python3 bench/cuda_timeline.py --layers 8 --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

import cuda_bench as cb  # bench/ is on the path

SHORT = {"stream_gemv": "product", "_delta_steps": "recurrence", "_row_norm": "norm", "_add_norm_router": "norm_router",
         "_route": "router", "_gate_up_act": "gate_up", "_down_pair": "down", "_combine": "combine", "_prep": "prep",
         "_attend": "attend", "_attend_merge": "merge", "_add_row_norm": "add_norm", "_linear_rows": "product_triton"}


def short(name: str) -> str:
    for k, v in SHORT.items():
        if name == k or name.startswith(k + "_") or name.startswith(k + "("):
            return v
    return name[:40]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="qwen3.6-35b-a3b-shape")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    ap.add_argument("--flood", default="all ahead", choices=list(cb.FLOOD_ARMS),
                    help="how the stream products request their weights (bench/cuda_bench.py FLOOD_ARMS)")
    a = ap.parse_args()
    from verispec.ops import cuda_stream_gemv as sg
    sg.PRE, sg.PACE, sg.EVF = cb.FLOOD_ARMS[a.flood]
    if not torch.cuda.is_available():
        print("cuda_timeline: torch sees no CUDA GPU", file=sys.stderr)
        return 2
    eng, _ = cb.build(a.preset, a.layers, "independent", 1)
    m = eng.model
    st = m.new_state(len(cb.PROMPT) + 16)
    m.forward(cb.PROMPT, st)
    for i in range(3):                                # warm-up: the graph captured, kernels compiled
        m.forward([11 + i], st)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        m.forward([29], st)
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
    ks = sorted((e for e in trace.get("traceEvents", []) if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    if not ks:
        print("cuda_timeline: the trace holds no kernel events", file=sys.stderr)
        return 1
    t0 = ks[0]["ts"]
    rows, prev_end = [], None
    for e in ks:
        start, end = e["ts"] - t0, e["ts"] - t0 + e["dur"]
        rows.append({"kernel": short(e["name"]), "name": e["name"][:120], "start_us": start, "end_us": end,
                     "dur_us": e["dur"], "after_prev_end_us": None if prev_end is None else start - prev_end})
        prev_end = end
    print(f"[timeline] stream products: {a.flood}")
    print(f"[timeline] {a.layers} layers, one graphed 1-row step: {len(rows)} kernels, "
          f"{rows[-1]['end_us']:.1f} us from the first start to the last end")
    print(f"{'#':>4} {'kernel':<15} {'start':>9} {'end':>9} {'dur':>8} {'start-prev end':>15} {'end-prev end':>13}")
    for i, r in enumerate(rows):
        gap = "" if r["after_prev_end_us"] is None else f"{r['after_prev_end_us']:15.2f}"
        step = "" if i == 0 else f"{r['end_us'] - rows[i - 1]['end_us']:13.2f}"
        print(f"{i:4d} {r['kernel']:<15} {r['start_us']:9.2f} {r['end_us']:9.2f} {r['dur_us']:8.2f} {gap} {step}")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = a.flood.replace(" ", "_").replace(",", "")
    (out / f"cuda_timeline_{tag}.json").write_text(json.dumps({"layers": a.layers, "flood": a.flood, "kernels": rows},
                                                             indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
