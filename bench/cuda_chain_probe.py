"""How near the copy rate could a decode step get as a chain of kernels? (issue 9)

bench/cuda_step_probe.py measured a persistent step kernel: its grid barriers (1.2-1.5 us each) cap
it near 72% of the limit once the small steps are folded at a cost. A chain of kernels has a cheaper
boundary (the hardware's, 0.40-0.53 us with programmatic dependent launch) but requests weights
across a boundary only from kernels already resident beside the running one. This probe runs the
step's phases (cuda_step_probe.phases, in the step's order, the 35B-A3B shape) as one launch each
(bench/cuda_chain_probe.cu: a phase kernel streams its bytes through bulk copies into per-warp slots
and computes nothing but a read; a byte-less phase is one CTA spinning --small-ns), chained by PDL in
a CUDA graph. Arms, interleaved, medians of --rounds:
  one          the step's bytes as one launch (no chain)
  nopre        nothing requested before a kernel's wait (a chain without prefetch)
  late         each kernel requests its first units before its wait (the routed experts' only after
               it), and lets the next launch after its own wait: one kernel ahead, as the stream products
  early        the same, the next launched before this kernel's wait: as many kernels ahead as fit
  early_fused  early over the phases without the byte-less ones (folded at no cost)
  early_costed early over cuda_step_probe.costed_phases (the folds' remaining costs)
  late_pred, early_pred  late and early with the routed experts' first units requested before the
               wait too, as if their ids were known ahead (a prediction that is always right): the
               ceiling of predicting the experts (192 KiB only)
  engine       late, but the kernels before a mixer product (the combine, the gated norm, the
               attention's merge) let it launch before their wait, as the engine's do (EARLY)
  engine_moe   engine with the MoE's launches (add + norm + router, router, gate/up, down) early too
  *_pred       the same with the routed experts predicted (as late_pred)
each at two shared-memory budgets a CTA: 8 warps x 3 slots of 8 KiB (192 KiB, one CTA an SM, as the
stream products) and 4 x 3 (96 KiB, two an SM, so the next phase's CTAs can sit beside the running
ones). With --verify, a verify's rows as late, early and early_costed (192 KiB), against the bandwidth
time of the bytes the verify must read. Fractions of the limit (the active bytes at cuda_bench.bandwidth()'s copy rate). JSON to --out.

  python3 bench/cuda_chain_probe.py --rounds 20 --out $OUT
  python3 bench/cuda_chain_probe.py --rounds 20 --verify 2:15.8,3:23.3,4:30.5,5:37.6,6:44.2 --out $OUT
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from verispec.ops import cuda_nvrtc  # noqa: E402
from verispec.random_model import active_weight_bytes, preset_config  # noqa: E402

from cuda_step_probe import UNIT, costed_phases, phases, probe_args, probe_source, spins, summarise  # noqa: E402  (bench/ is on the path)

BUDGETS = {"192k": (8, 3), "96k": (4, 3)}     # (warps, slots a warp) of a phase kernel's CTA


ENGINE_EARLY = frozenset({"combine", "gated_norm", "merge"})     # their successor: a stream product
MOE_EARLY = frozenset({"add_norm_router", "route", "gate_up", "down"})


def launches(ph, small_ns: int, pre: bool, early: bool | frozenset, pred: bool = False):
    """-> [(unit offset, units, spin ns, request before the wait, early)] a launch per phase, the
    units laid out in order; routed phases request before their wait only with pred (their ids
    predicted ahead), never otherwise (the router's ids). early: every launch, or the phases named."""
    out, u = [], 0
    for q, ns in zip(ph, spins(ph, small_ns)):
        n = -(-q[1] // UNIT)
        e = early if isinstance(early, bool) else q[0] in early
        out.append((u, n, ns, pre and (pred or not q[2]), e))
        u += n
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    probe_args(ap, "as late, early and early_costed (192 KiB)")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("cuda_chain_probe: torch sees no CUDA GPU", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    cfg = preset_config(a.preset)
    ph = phases(cfg)
    need = active_weight_bytes(cfg)
    fused = [q for q in ph if q[1] > 0 or q[0] == "route"]
    costed = costed_phases(cfg, a.rec_ns, a.attend_ns, a.combine_ns)
    verify = a.verify
    arm_specs = {"one": [("step", need, False)]}
    for b in BUDGETS:
        arm_specs |= {f"nopre_{b}": (ph, False, False), f"late_{b}": (ph, True, False), f"early_{b}": (ph, True, True),
                      f"early_fused_{b}": (fused, True, True), f"early_costed_{b}": (costed, True, True),
                      f"engine_{b}": (ph, True, ENGINE_EARLY), f"engine_pred_{b}": (ph, True, ENGINE_EARLY, True),
                      f"engine_moe_{b}": (ph, True, ENGINE_EARLY | MOE_EARLY),
                      f"engine_moe_pred_{b}": (ph, True, ENGINE_EARLY | MOE_EARLY, True)}
    arm_specs |= {"late_pred_192k": (ph, True, False, True), "early_pred_192k": (ph, True, True, True)}
    verify_bytes = {}
    for rows, ex in verify:
        vph = phases(cfg, ex)
        verify_bytes[rows] = sum(q[1] for q in vph)
        arm_specs |= {f"verify{rows}_late_192k": (vph, True, False), f"verify{rows}_early_192k": (vph, True, True),
                      f"verify{rows}_early_costed_192k": (costed_phases(cfg, a.rec_ns, a.attend_ns, a.combine_ns,
                                                                        rows, ex), True, True)}
    most = max(sum(-(-q[1] // UNIT) for q in spec[0]) for name, spec in arm_specs.items() if name != "one")
    w = torch.randint(0, 255, (most * UNIT,), dtype=torch.uint8, device=dev)   # never zeros
    sink = torch.zeros(1 << 16, dtype=torch.int32, device=dev)
    src = probe_source("cuda_chain_probe.cu")
    fns = {}
    for b, (warps, spw) in BUDGETS.items():
        smem = warps * spw * UNIT + warps * spw * 8
        fns[b] = (cuda_nvrtc.compile_kernel(dev, "cuda_chain_probe.cu", "chain_phase", {"WARPS": warps, "SPW": spw},
                                            smem, text=src), smem, 32 * warps)
    small = cuda_nvrtc.compile_kernel(dev, "cuda_chain_probe.cu", "chain_small", {"WARPS": 1, "SPW": 1}, 0, text=src)
    grid = cuda_nvrtc.sm_count(dev)

    from cuda_bench import bandwidth
    bw = bandwidth()
    limit = need / bw

    keep = []                                       # the launches' argument objects, alive while graphs are

    def record(spec, budget: str):
        fn, smem, threads = fns[budget]
        for u0, n, ns, pre, early in spec:
            stream = torch.cuda.current_stream().cuda_stream
            if n == 0:
                args = [ctypes.c_longlong(ns), ctypes.c_int(int(early))]
                cuda_nvrtc.launch(small, 0, 32, 1, stream, True, args, "chain_small")
            else:
                args = [ctypes.c_void_p(w.data_ptr()), ctypes.c_longlong(u0), ctypes.c_longlong(n), ctypes.c_longlong(ns),
                        ctypes.c_int(int(pre)), ctypes.c_int(int(early)), ctypes.c_void_p(sink.data_ptr())]
                cuda_nvrtc.launch(fn, smem, threads, grid, stream, True, args, "chain_phase")
            keep.append(args)

    graphs = {}
    for name, spec in arm_specs.items():
        if name == "one":
            seq, budget = [(0, -(-need // UNIT), 0, True, False)], "192k"
        else:
            arm_ph, pre, early, *pred = spec
            seq, budget = launches(arm_ph, a.small_ns, pre, early, *pred), name.rsplit("_", 1)[1]
        record(seq, budget)                         # once outside the graph: the modules load, errors show
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            record(seq, budget)
        graphs[name] = (g, len(seq))
    times = {k: [] for k in graphs}
    for r in range(-2, a.rounds):
        for name, (g, _) in graphs.items():
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            g.replay()
            e1.record()
            e1.synchronize()
            if r >= 0:
                times[name].append(e0.elapsed_time(e1) / 1e3)
    res = {"copy_Bps": bw, "active_bytes": need, "limit_ms": limit * 1e3, "grid": grid, "small_ns": a.small_ns,
           "budgets": BUDGETS, "arms": {}}
    print(f"[chain] copy {bw / 1e12:.2f} TB/s; {need / 1e9:.2f} GB a step -> limit {limit * 1e3:.3f} ms; "
          f"grid {grid}; byte-less phases {a.small_ns} ns")
    for name, ts in times.items():
        res["arms"][name], line = summarise(name, ts, limit, bw, verify_bytes)
        res["arms"][name]["launches"] = graphs[name][1]
        print(f"[chain] {line} ({graphs[name][1]} launches)")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cuda_chain_probe.json").write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
