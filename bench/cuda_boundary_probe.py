"""What one kernel boundary costs in a graphed chain, with and without programmatic dependent
launch (issue 9: a decode step is ~450 dependent kernels).

A CUDA graph of N kernels in a row, each waiting for the one before it (`griddepcontrol.wait`
first, as every kernel of the exact path does), replayed back to back; the time per kernel is
the floor a boundary costs, since the kernels do (almost) nothing:

  empty     one program, no memory touched
  wide      132 programs (one per SM), no memory touched
  row       one program that reads a 2048-wide bf16 row written by the kernel before it and
            writes it back (a norm's pattern: a dependent load, a store)
and the exact path's product (verispec/ops/cuda_gemv.py) chained over 16 different weights
(more than L2 holds), one row: its time per launch against its bytes at the copy rate:
  in_proj   2048 -> 12352 (50.6 MB)     out_proj  4096 -> 2048, its split-K partials (16.8 MB)

  python3 bench/cuda_boundary_probe.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch

try:  # CUDA builds of torch ship triton
    import triton
    import triton.language as tl
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:
    triton = None

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cuda_timing import capture, replay_us  # noqa: E402

if triton is not None:
    @triton.jit
    def _nothing(x_ptr, PDL: tl.constexpr):
        if PDL:
            gdc_wait()
            gdc_launch_dependents()

    @triton.jit
    def _row(x_ptr, N: tl.constexpr, PDL: tl.constexpr):
        if PDL:
            gdc_wait()
            gdc_launch_dependents()
        offs = tl.arange(0, N)
        tl.store(x_ptr + offs, tl.load(x_ptr + offs) + 1.0)


def product_chain(k: int, n: int, partials: bool, reps: int) -> torch.cuda.CUDAGraph:
    from verispec.ops import cuda_gemv

    ws = [(torch.randn(n, k, device="cuda") * k ** -0.5).to(torch.bfloat16) for _ in range(16)]
    x = torch.randn(1, k, device="cuda").to(torch.bfloat16)

    g = capture(lambda: [cuda_gemv.linear_rows(x, w, partials=partials) for _ in range(reps) for w in ws])
    g.weights = ws          # kept alive with the graph
    return g


def chain(kind: str, n: int, pdl: bool, buf: torch.Tensor) -> torch.cuda.CUDAGraph:
    kw = {"PDL": True, "launch_pdl": True} if pdl else {"PDL": False}

    def one():
        if kind == "empty":
            _nothing[(1,)](buf, num_warps=1, **kw)
        elif kind == "wide":
            _nothing[(132,)](buf, num_warps=1, **kw)
        else:
            _row[(1,)](buf, N=2048, num_warps=4, **kw)
    return capture(lambda: [one() for _ in range(n)])


def per_kernel_us(g: torch.cuda.CUDAGraph, n: int, reps: int = 20) -> float:
    return replay_us(g, reps) / n


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kernels", type=int, default=400)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    a = p.parse_args()
    if not torch.cuda.is_available() or triton is None:
        print("cuda_boundary_probe: needs a CUDA GPU and triton", file=sys.stderr)
        return 2
    buf = torch.zeros(2048, dtype=torch.bfloat16, device="cuda")
    res = {"device": torch.cuda.get_device_name(), "kernels": a.kernels, "us_per_kernel": {}}
    graphs = {(k, pdl): chain(k, a.kernels, pdl, buf) for k in ("empty", "wide", "row") for pdl in (False, True)}
    times = {key: [] for key in graphs}
    for _ in range(a.rounds):                   # interleaved
        for key, g in graphs.items():
            times[key].append(per_kernel_us(g, a.kernels))
    for (k, pdl), v in times.items():
        med = statistics.median(v)
        res["us_per_kernel"][f"{k}_{'pdl' if pdl else 'plain'}"] = {"median": med, "min": min(v), "max": max(v)}
        print(f"{k:6s} {'PDL  ' if pdl else 'plain'}: {med:.3f} us per kernel [{min(v):.3f}-{max(v):.3f}]", flush=True)
    for name, (k, n, part) in {"in_proj": (2048, 12352, False), "out_proj": (4096, 2048, True)}.items():
        g = product_chain(k, n, part, 2)
        v = [per_kernel_us(g, 32, reps=5) for _ in range(a.rounds)]
        mb = k * n * 2 / 1e6
        res["us_per_kernel"][name] = {"median": statistics.median(v), "min": min(v), "max": max(v), "MB": mb}
        print(f"{name}: {statistics.median(v):.2f} us per product [{min(v):.2f}-{max(v):.2f}] for {mb:.1f} MB "
              f"({mb / statistics.median(v):.2f} TB/s)", flush=True)
        del g
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cuda_boundary_probe.json").write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
