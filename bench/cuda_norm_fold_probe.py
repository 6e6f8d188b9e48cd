"""Probe: what the pending norm costs the DeltaNet input product (2048 -> 12352), by halves.

A graph of 39 back-to-back products at 1 and 4 rows, replayed: plain, the full norm in the K
loop (mode 1), the squares alone (2), the (1 + w) scaling of the dot's operand alone (3);
modes 2 and 3 compute wrong values, for timing only. Arms interleaved, medians of 20.

  python3 bench/cuda_norm_fold_probe.py --out $OUT
"""
import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from verispec.ops import cuda_gemv  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="bench/results")
    a = p.parse_args()
    w = [(torch.randn(12352, 2048, device="cuda") * 0.02).to(torch.bfloat16) for _ in range(39)]
    nw = (torch.randn(2048, device="cuda") * 0.1).to(torch.bfloat16)
    res = {}
    for rows in (1, 4):
        x = torch.randn(rows, 2048, device="cuda").to(torch.bfloat16)
        pn = cuda_gemv.PendingNorm(x, nw, 1e-6)
        arms = {"plain": lambda wi: cuda_gemv.linear_rows(x, wi)}
        for mode in (1, 2, 3):
            arms[f"mode{mode}"] = lambda wi, m=mode: cuda_gemv.linear_rows(x, wi, norm=pn, _norm_mode=m)
        graphs = {}
        for k, fn in arms.items():
            for wi in w[:2]:
                fn(wi)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for wi in w:
                    fn(wi)
            graphs[k] = g
        times = {k: [] for k in arms}
        for r in range(22):
            for k, g in graphs.items():
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                g.replay()
                e.record()
                torch.cuda.synchronize()
                if r >= 2:
                    times[k].append(s.elapsed_time(e) * 1e3 / len(w))
        med = {k: statistics.median(v) for k, v in times.items()}
        res[rows] = {"us_per_product": med, "times": times}
        print(f"[norm_fold] rows {rows}: " + "; ".join(f"{k} {v:.2f} us [{min(times[k]):.2f}-{max(times[k]):.2f}]"
                                                       for k, v in med.items()), flush=True)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "cuda_norm_fold_probe.json").write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
