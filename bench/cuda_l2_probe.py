"""How much faster does a decode product run when its weights are already in L2? (issue 9)

The question behind the L2 prefetch experiment (verispec/ops/cuda_prefetch.py, docs/cuda.md):
if a product whose weights sit in L2 is not much faster than one reading them from DRAM,
fetching weights early cannot pay, whatever the timing. Each case is a CUDA graph replayed
back to back (so no host gap is timed) and its time minus that of the same graph without
the product; L2 is flushed by writing a 256 MiB buffer.

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
    flush_buf = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    spin = lambda: torch.cuda._sleep(40000)  # noqa: E731  (cycles: ~20 us; measured as spin_us)
    flush = lambda: flush_buf.fill_(1)  # noqa: E731
    res = {"device": torch.cuda.get_device_name(), "cases": {}}
    for name, (k, n) in SHAPES.items():
        w = (torch.randn(n, k, device=dev) * k ** -0.5).to(torch.bfloat16)
        x = torch.randn(1, k, device=dev).to(torch.bfloat16)
        part = cuda_gemv.splits(k, n)
        prod = lambda: cuda_gemv.linear_rows(x, w, partials=part)  # noqa: E731
        pf = {p_: (lambda p_=p_: _prefetch(w, p_)) for p_ in (32, 132)}
        g = {"flush": graph_of([flush]), "cold": graph_of([flush, prod]), "one": graph_of([prod]),
             "two": graph_of([prod, prod]), "flush_spin": graph_of([flush, spin]),
             "pref": graph_of([flush, pf[132], spin, prod]), "pref_only": graph_of([flush, pf[132], spin])}
        for p_ in (32, 132):
            g[f"issue{p_}"] = graph_of([flush, pf[p_]])
        case = {"MB": w.numel() * 2 / 1e6,
                "cold_us": diff(g["cold"], g["flush"], a.rounds),
                "warm_us": diff(g["two"], g["one"], a.rounds),
                "prefetched_us": diff(g["pref"], g["pref_only"], a.rounds),
                "spin_us": diff(g["flush_spin"], g["flush"], a.rounds),
                **{f"prefetch_launch_{p_}_us": diff(g[f"issue{p_}"], g["flush"], a.rounds) for p_ in (32, 132)}}
        res["cases"][name] = case
        print(f"{name} ({case['MB']:.1f} MB): cold {case['cold_us'][0]:.2f} us [{case['cold_us'][1]:.2f}-"
              f"{case['cold_us'][2]:.2f}], warm {case['warm_us'][0]:.2f} [{case['warm_us'][1]:.2f}-{case['warm_us'][2]:.2f}], "
              f"prefetched {case['prefetched_us'][0]:.2f}; prefetch launch (32 / 132 programs) "
              f"{case['prefetch_launch_32_us'][0]:.2f} / {case['prefetch_launch_132_us'][0]:.2f} us; "
              f"spin {case['spin_us'][0]:.2f} us", flush=True)
        del g, w
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cuda_l2_probe.json").write_text(json.dumps(res, indent=1) + "\n")
    return 0


def _prefetch(w: torch.Tensor, programs: int) -> None:
    kept = cuda_prefetch.PROGRAMS
    cuda_prefetch.PROGRAMS = programs
    try:   # on the current stream: prefetch() forks a side stream, which this probe does not want
        lo, nb = cuda_prefetch.span(w)
        cuda_prefetch._prefetch[(programs,)](lo, nb, 0, 0, 0, 0, CHUNK=cuda_prefetch.CHUNK, LANES=32, num_warps=1)
    finally:
        cuda_prefetch.PROGRAMS = kept


if __name__ == "__main__":
    raise SystemExit(main())
