"""The batched prefill's chain of chunks (verispec/ops/chunk_delta.py) alone on the GPU at the 35B-A3B
DeltaNet widths (32 value heads of 128 x 128): the Triton chain's settings (tl.dot precision, value
columns a program, warps) and the torch chain, each timed (median of --rounds, CUDA events) and held
to an fp64 torch chain.

    python3 bench/chunk_delta_probe.py [--tokens 4096] [--rounds 5] [--only "tf32x3 bv32"]

The `parts torch` and `parts triton` arms time the chunks' state-free parts instead
(chunk_delta.chunk_parts against verispec/ops/chunk_parts_cuda.py's one launch; --only parts), on the
GPU (CUDA events) and on the host's clock (a synchronize after each, launch costs included), each
part's error against the fp64 parts.

(Call 157: "tf32x3 bv16 w8" ended the process with an illegal memory access, so run the arms a few
at a time with --only.)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from verispec.ops import chunk_delta, chunk_parts_cuda

ROOT = Path(__file__).resolve().parents[1]


def _graphed(fn):
    """fn captured in a CUDA graph: its replay, whose outputs are the captured tensors (the GPU's time
    alone, no launches from the host)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        list(fn())                          # the Triton compile and torch's workspaces outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = list(fn())

    def replay():
        graph.replay()
        return outs
    return replay


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

    def rows_first(o):     # chain_torch's [Hv, N, C, dv] as chain_triton writes it: [P, Hv, dv]
        return o.reshape(hv, -1, dv)[:, :a.tokens].transpose(0, 1)

    ref = rows_first(chunk_delta.chain_torch(*[t.double() for t in parts], s0.double().clone()))
    arms = {"torch": lambda st: rows_first(chunk_delta.chain_torch(*parts, st))}
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
    # the parts' v as the model hands it on: a slice of the conv's output [channels, P], rows adjacent
    vm = v.permute(0, 2, 1).contiguous().permute(0, 2, 1)
    ref_parts = list(chunk_delta.chunk_parts(*(t.double() for t in (q, k, vm, gg, beta))))
    parts_arms = {"parts torch": lambda: chunk_delta.chunk_parts(q, k, vm, gg, beta),
                  "parts triton": lambda: chunk_parts_cuda.chunk_parts(q, k, vm, gg, beta, chunk_delta.CHUNK)}
    for name in list(parts_arms):
        if a.only in name + " graphed":
            parts_arms[name + " graphed"] = _graphed(parts_arms[name])
    for name, fn in parts_arms.items():
        if a.only not in name:
            continue
        errs = [((o.double() - r).norm() / r.norm()).item() for o, r in zip(fn(), ref_parts)]
        ms, wall = [], []
        for _ in range(a.rounds):
            torch.cuda.synchronize()
            t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            w0 = time.perf_counter()
            t0.record()
            list(fn())
            t1.record()
            torch.cuda.synchronize()
            wall.append((time.perf_counter() - w0) * 1e3)
            ms.append(t0.elapsed_time(t1))
        res[name] = {"ms": ms, "median_ms": statistics.median(ms), "wall_ms": wall,
                     "median_wall_ms": statistics.median(wall), "rel_err_fp64": errs}
        print(f"{name}: GPU {statistics.median(ms):.3f} ms [{min(ms):.3f}-{max(ms):.3f}], host clock "
              f"{statistics.median(wall):.3f} ms [{min(wall):.3f}-{max(wall):.3f}]; relative error of kc, w, qg, "
              f"p, kd, dec: {', '.join(f'{e:.1e}' for e in errs)}", flush=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"tokens": a.tokens, "arms": res}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
