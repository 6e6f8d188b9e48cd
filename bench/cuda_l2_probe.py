"""How much faster does a decode product run when its weights are already in L2? (issue 9)

The question behind the L2 prefetch experiment (verispec/ops/cuda_prefetch.py, docs/cuda.md):
if a product whose weights sit in L2 is not much faster than one reading them from DRAM,
fetching weights early cannot pay, whatever the timing. Each case is a CUDA graph replayed
back to back (so no host gap is timed) and its time minus that of the same graph without
the product; L2 is flushed by reading a 256 MiB buffer (clean lines: a write would leave
dirty ones to be written back during the product).

  cold        flush, product                      (the weights come from DRAM)
  warm        product, product  (the second one)  (weights in L2 where they fit: 50 MiB)
  prefetched  flush, bulk L2 prefetch of the weights, a ~20 us spin, product
  and the prefetch launch alone (flush, prefetch) against flush: its issue time.

  python3 bench/cuda_l2_probe.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch

from verispec.ops import cuda_gemv, cuda_prefetch

SHAPES = {"out_proj 4096x2048": (4096, 2048), "router 2048x1288": (2048, 1288), "in_proj 2048x12352": (2048, 12352),
          "attn_qkv 2048x9216": (2048, 9216)}


def graph_of(fns) -> torch.cuda.CUDAGraph:
    for f in fns:               # warm-up: compile, allocate
        f()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in fns:
            f()
    return g


def per_replay(g: torch.cuda.CUDAGraph, n: int = 40) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    g.replay()
    start.record()
    for _ in range(n):
        g.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / n * 1e3      # us


def diff(with_, without, rounds: int) -> tuple[float, float, float]:
    """Median, min, max over rounds of (with - without), interleaved."""
    d = []
    for _ in range(rounds):
        d.append(per_replay(with_) - per_replay(without))
    return statistics.median(d), min(d), max(d)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("cuda_l2_probe: torch sees no CUDA GPU", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    flush_buf = torch.empty(64 << 20, dtype=torch.float32, device=dev)   # 256 MiB, read (clean lines)
    flush = lambda: flush_buf.sum()  # noqa: E731
    spin = lambda: torch.cuda._sleep(40000)  # noqa: E731  (cycles: ~20 us; measured as spin_us)
    sink = torch.zeros(1, device=dev)
    res = {"device": torch.cuda.get_device_name(), "cases": {}}
    for name, (k, n) in SHAPES.items():
        w = (torch.randn(n, k, device=dev) * k ** -0.5).to(torch.bfloat16)
        x = torch.randn(1, k, device=dev).to(torch.bfloat16)
        part = cuda_gemv.splits(k, n)
        prod = lambda: cuda_gemv.linear_rows(x, w, partials=part)  # noqa: E731
        lo, nb = cuda_prefetch.span(w)
        methods = {
            "bulk132": lambda: cuda_prefetch._prefetch[(132,)](lo, nb, 0, 0, 0, 0, CHUNK=cuda_prefetch.CHUNK, LANES=32,
                                                               num_warps=1),
            "lines132": lambda: cuda_prefetch._lines[(132,)](lo, nb, 0, 0, 0, 0, LINES=128, num_warps=4),
            "touch132": lambda: cuda_prefetch._touch[(132,)](w, w.numel(), w, 0, w, 0, sink, BLOCK=8192, num_warps=4),
            "touch264": lambda: cuda_prefetch._touch[(264,)](w, w.numel(), w, 0, w, 0, sink, BLOCK=4096, num_warps=4)}
        g = {"flush": graph_of([flush]), "cold": graph_of([flush, prod]), "one": graph_of([prod]),
             "two": graph_of([prod, prod]), "flush_spin": graph_of([flush, spin])}
        case = {"MB": w.numel() * 2 / 1e6,
                "cold_us": diff(g["cold"], g["flush"], a.rounds),
                "warm_us": diff(g["two"], g["one"], a.rounds),
                "spin_us": diff(g["flush_spin"], g["flush"], a.rounds)}
        line = (f"{name} ({case['MB']:.1f} MB): cold {case['cold_us'][0]:.2f} us [{case['cold_us'][1]:.2f}-"
                f"{case['cold_us'][2]:.2f}], warm {case['warm_us'][0]:.2f} [{case['warm_us'][1]:.2f}-{case['warm_us'][2]:.2f}]")
        for mname, pf in methods.items():
            gp = {"pf": graph_of([flush, pf]), "pf_prod": graph_of([flush, pf, prod]),
                  "pf_spin": graph_of([flush, pf, spin]), "pf_spin_prod": graph_of([flush, pf, spin, prod])}
            case[mname] = {"launch_us": diff(gp["pf"], g["flush"], a.rounds),
                           "then_product_us": diff(gp["pf_prod"], gp["pf"], a.rounds),
                           "landed_product_us": diff(gp["pf_spin_prod"], gp["pf_spin"], a.rounds)}
            m = case[mname]
            line += (f"; {mname}: launch {m['launch_us'][0]:.2f}, product right after {m['then_product_us'][0]:.2f}, "
                     f"after a spin {m['landed_product_us'][0]:.2f}")
        res["cases"][name] = case
        print(line + f" (spin {case['spin_us'][0]:.2f} us)", flush=True)
        del g, w
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cuda_l2_probe.json").write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
