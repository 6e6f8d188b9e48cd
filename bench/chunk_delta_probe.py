"""The batched prefill's chain of chunks (verispec/ops/chunk_delta.py) alone on the GPU at the 35B-A3B
DeltaNet widths (32 value heads of 128 x 128): the Triton chain's settings (tl.dot precision, value
columns a program, warps) and the torch chain, each timed (median of --rounds, CUDA events) and held
to an fp64 torch chain.

    python3 bench/chunk_delta_probe.py [--tokens 4096] [--rounds 5] [--only "tf32x3 bv32"]

(Call 157: "tf32x3 bv16 w8" ended the process with an illegal memory access, so run the arms a few
at a time with --only.)
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from verispec.ops import chunk_delta

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--only", default="", help="run only the arms whose name contains this")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "chunk_delta_probe.json"))
    a = p.parse_args()
    hv, dk, dv = 32, 128, 128
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.nn.functional.normalize(torch.randn(hv, a.tokens, dk, device="cuda", generator=g), dim=-1) * dk ** -0.5
    k = torch.nn.functional.normalize(torch.randn(hv, a.tokens, dk, device="cuda", generator=g), dim=-1)
    v = torch.randn(hv, a.tokens, dv, device="cuda", generator=g)
    gg = -torch.rand(hv, a.tokens, device="cuda", generator=g) * 0.5
    beta = torch.rand(hv, a.tokens, device="cuda", generator=g)
    s0 = torch.randn(hv, dk, dv, device="cuda", generator=g) * 0.05
    parts = list(chunk_delta.chunk_parts(q, k, v, gg, beta))
    ref = chunk_delta.chain_torch(*[t.double() for t in parts], s0.double().clone())
    arms = {"torch": lambda st: chunk_delta.chain_torch(*parts, st)}
    for prec in ("tf32", "tf32x3", "ieee"):
        for bv in (16, 32, 64):
            for warps in (4, 8):
                arms[f"triton {prec} bv{bv} w{warps}"] = (
                    lambda st, prec=prec, bv=bv, warps=warps: chunk_delta.chain_triton(*parts, st, bv=bv, prec=prec,
                                                                                       warps=warps))
    res = {}
    for name, fn in arms.items():
        if a.only not in name:
            continue
        try:
            out = fn(s0.clone())
        except Exception as e:  # noqa: BLE001 - a setting that does not compile is a result too
            res[name] = {"error": f"{type(e).__name__}: {str(e)[:120]}"}
            print(f"{name}: {res[name]['error']}", flush=True)
            continue
        err = ((out.double() - ref).norm() / ref.norm()).item()
        ms = []
        for _ in range(a.rounds):
            st = s0.clone()
            t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0.record()
            fn(st)
            t1.record()
            torch.cuda.synchronize()
            ms.append(t0.elapsed_time(t1))
        res[name] = {"ms": ms, "median_ms": statistics.median(ms), "rel_err_fp64": err}
        print(f"{name}: {statistics.median(ms):.3f} ms [{min(ms):.3f}-{max(ms):.3f}], relative error {err:.2e}",
              flush=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"tokens": a.tokens, "arms": res}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
