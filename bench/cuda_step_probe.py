"""How near the copy rate could a persistent "megakernel" decode step get? (issue 9)

bench/cuda_step_probe.cu streams a whole decode step's weight bytes of the 35B-A3B shape (5.89 GB,
laid out phase by phase in the real step's order: each layer's mixer products, the router product,
the shared and the routed experts, then the lm_head) through one persistent grid, with a grid
barrier at each kernel boundary of the current design, computing nothing. Arms, interleaved, each
timed with CUDA events, medians of --rounds:
  stream        no barriers: the step's bytes as one stream (the ceiling of any design)
  ahead         barriers; every weight requested as soon as a slot frees, across barriers, except the
                routed experts (only after the router's phase): what a megakernel's loads could do
  ahead_small   the same, with --small-ns of latency at each phase that moves no bytes (the
                recurrence, the norms, the router, the combine, the attention's steps)
  in_order      barriers, nothing requested before its own phase (a kernel chain without prefetch),
                with the same latencies
  barriers_only the barriers alone (no bytes, no latencies): what a grid barrier costs
  fused_ahead   as ahead, without the phases that move no bytes (their work folded into their
                neighbours at no cost, and the barriers they add gone): fewer sync points
  fused_costed  fused_ahead with what the folds would still cost a real megakernel (costed_phases):
                the DeltaNet state's traffic (read and written once a step, as bytes requested ahead)
                and --rec-ns of recurrence after each DeltaNet input product, a barrier for the gated
                norm's reduction across the CTAs of a head, --attend-ns for attention over the cache,
                and --combine-ns at each MoE's end for the combine and norm repeated in every CTA
  fused_costed_2x  the same with those three latencies doubled (how much the estimate rests on them)
  *_rel         barriers_only, fused_ahead, fused_costed with the grid barrier's arrival a release
                reduction instead of a fence and an atomic add (cuda_step_probe.cu, grid_sync_mode 1)
  *_spread      the same with the arrivals spread over 8 counters (grid_sync_mode 2)
  verifyN_*     with --verify: a verify of N rows reading the given distinct experts a layer, as
                fused_ahead and fused_costed (the state written to a copy slot a row, the recurrence
                stepping its rows in turn), against the bandwidth time of the bytes it must read
Each as a fraction of the limit the issue sets (the active bytes at the copy rate that
bench/cuda_bench.py's bandwidth() measures). Writes JSON to --out.

  python3 bench/cuda_step_probe.py --rounds 20 --out $OUT
  python3 bench/cuda_step_probe.py --rounds 20 --verify 1:8,2:15.8,3:23.3,4:30.5,5:37.6,6:44.2 --out $OUT
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from verispec.ops import cuda_nvrtc  # noqa: E402
from verispec.random_model import active_weight_bytes, preset_config  # noqa: E402

UNIT = 8192
WARPS, SPW = 8, 3


def phases(cfg: dict, experts: float | None = None) -> list[tuple[str, int, bool]]:
    """(name, bytes, routed) in the step's order; routed: requested only once the router has run.
    experts: the distinct routed experts a layer reads (a verify's rows together; default top-k)."""
    h = cfg["hidden_size"]
    kd = cfg["linear_num_key_heads"] * cfg["linear_key_head_dim"]
    vd = cfg["linear_num_value_heads"] * cfg["linear_value_head_dim"]
    hv = cfg["linear_num_value_heads"]
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    e, k, i, si = (cfg["num_experts"], cfg["num_experts_per_tok"], cfg["moe_intermediate_size"],
                   cfg["shared_expert_intermediate_size"])
    k = k if experts is None else experts
    out = []
    for kind in cfg["layer_types"]:
        if kind == "linear_attention":
            out += [("in_conv", (2 * kd + 2 * vd + 2 * hv) * h * 2, False), ("recurrence", 0, False),
                    ("gated_norm", 0, False), ("out", vd * h * 2, False)]
        else:
            out += [("qkv", (2 * nh * hd + 2 * nkv * hd) * h * 2, False), ("attend", 0, False),
                    ("merge", 0, False), ("out", h * nh * hd * 2, False)]
        out += [("add_norm_router", (e + 1) * h * 2, False), ("route", 0, False),
                ("gate_up", round((2 * si + k * 2 * i) * h * 2), True), ("down", round((si + k * i) * h * 2), True),
                ("combine", 0, False)]
    return out + [("final_norm", 0, False), ("lm_head", cfg["vocab_size"] * h * 2, False)]


def costed_phases(cfg: dict, rec_ns: int, attend_ns: int, combine_ns: int, rows: int = 1,
                  experts: float | None = None) -> list[tuple[str, int, bool, int]]:
    """phases() as a megakernel with the byte-less steps folded would run them, with the costs the
    folds leave (name, bytes, routed, spin ns at the phase's end). The state bytes are fp32: read
    once and written once a row (a verify's rows each write their copy slot); the writes are
    modelled as reads requested ahead, the reads' own cost. The recurrence steps its rows in turn
    (rows x rec_ns); a verify's rows attend and combine side by side."""
    state = cfg["linear_num_value_heads"] * cfg["linear_key_head_dim"] * cfg["linear_value_head_dim"] * 4
    out: list[tuple[str, int, bool, int]] = []
    for name, nbytes, routed in phases(cfg, experts):
        if name == "in_conv":
            out += [(name, nbytes, routed, 0), ("recurrence", (1 + rows) * state, False, rows * rec_ns),
                    ("gnorm_sync", 0, False, 0)]
        elif name == "attend":
            out.append((name, 0, False, attend_ns))
        elif name == "combine":
            last = out.pop()
            assert last[0] == "down"
            out.append(last[:3] + (combine_ns,))
        elif nbytes > 0 or name == "route":
            out.append((name, nbytes, routed, 0))
    return out


def spins(ph, small_ns: int) -> list[int]:
    """ns to spin at each phase's end: the phase's own (costed_phases) or small_ns where it moves no bytes."""
    return [q[3] if len(q) > 3 else (small_ns if q[1] == 0 else 0) for q in ph]


def tables(ph, ahead: bool, empty: bool = False):
    """-> (unit offsets [P + 1], from [P]) for the kernel (empty: every phase without bytes)."""
    off, fr, u, after_route = [0], [], 0, 0
    for p, (name, nbytes, routed, *_) in enumerate(ph):
        u += 0 if empty else -(-nbytes // UNIT)
        off.append(u)
        if name == "route":
            after_route = p + 1
        fr.append(p if not ahead else (after_route if routed else 0))
    return off, fr


def probe_source(name: str) -> str:
    """A probe kernel's source (bench/NAME) with bench/cuda_probe.cuh in front, the helpers both
    probes share (NVRTC is given only the package's headers)."""
    here = Path(__file__).parent
    return (here / "cuda_probe.cuh").read_text() + "\n" + (here / name).read_text()


def summarise(name: str, ts: list[float], limit: float, bw: float, verify_bytes: dict) -> tuple[dict, str]:
    """An arm's times as JSON and as a line: a verify arm (verifyN_...) against the bandwidth time
    of the bytes it must read, any other against the step's limit. Medians, [min-max]."""
    med = statistics.median(ts)
    entry = {"ms": med * 1e3, "spread_ms": [min(ts) * 1e3, max(ts) * 1e3], "times": ts}
    line = f"{name}: {med * 1e3:.3f} ms [{min(ts) * 1e3:.3f}-{max(ts) * 1e3:.3f}] = "
    if name.startswith("verify"):
        rows = int(name[len("verify"):].split("_")[0])
        bt = verify_bytes[rows] / bw
        entry |= {"rows": rows, "bytes": verify_bytes[rows], "over_bytes_time": med / bt}
        return entry, line + f"{med / bt:.3f}x the bandwidth time of its {verify_bytes[rows] / 1e9:.2f} GB ({bt * 1e3:.3f} ms)"
    entry["of_limit"] = limit / med
    return entry, line + f"{limit / med * 100:.1f}% of the limit"


def probe_args(ap: argparse.ArgumentParser, verify_help: str) -> None:
    """The options both probes take (this one and bench/cuda_chain_probe.py)."""
    ap.add_argument("--preset", default="qwen3.6-35b-a3b-shape")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--small-ns", type=int, default=1000, help="latency of a phase that moves no bytes (ns)")
    ap.add_argument("--rec-ns", type=int, default=1000, help="costed phases: the recurrence's latency (ns)")
    ap.add_argument("--attend-ns", type=int, default=1000, help="costed phases: attention's latency (ns)")
    ap.add_argument("--combine-ns", type=int, default=500, help="costed phases: the combine + norm in every CTA (ns)")
    ap.add_argument("--verify", default=[], type=verify_list,
                    help="ROWS:EXPERTS,...: also a verify of ROWS rows reading EXPERTS distinct experts a layer, "
                    + verify_help + " (e.g. 2:15.8,3:23.3,4:30.5)")
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/results"))


def verify_list(text: str) -> list[tuple[int, float]]:
    """'2:15.8,3:23.3' -> [(2, 15.8), (3, 23.3)]"""
    try:
        return [(int(r), float(e)) for r, e in (x.split(":") for x in text.split(",") if x)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"want ROWS:EXPERTS,... (got {text!r})") from None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    probe_args(ap, "as fused_ahead and fused_costed")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("cuda_step_probe: torch sees no CUDA GPU", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    cfg = preset_config(a.preset)
    ph = phases(cfg)
    need = active_weight_bytes(cfg)
    units = sum(-(-b // UNIT) for _, b, _ in ph)
    assert abs(units * UNIT - need) < 0.01 * need, (units * UNIT, need)
    verify = a.verify
    costed = costed_phases(cfg, a.rec_ns, a.attend_ns, a.combine_ns)
    fused = [q for q in ph if q[1] > 0 or q[0] == "route"]     # the router's phase marks where routed ones may start
    # name: (phases, barriers, requests ahead, ns at a byte-less phase, no bytes[, barrier mode])
    arms = {"stream": (ph, False, True, 0, False), "ahead": (ph, True, True, 0, False),
            "ahead_small": (ph, True, True, a.small_ns, False), "in_order": (ph, True, False, a.small_ns, False),
            "barriers_only": (ph, True, True, 0, True), "fused_ahead": (fused, True, True, 0, False),
            "fused_costed": (costed, True, True, 0, False),
            "fused_costed_2x": (costed_phases(cfg, 2 * a.rec_ns, 2 * a.attend_ns, 2 * a.combine_ns), True, True, 0, False),
            "barriers_only_rel": (ph, True, True, 0, True, 1), "fused_ahead_rel": (fused, True, True, 0, False, 1),
            "fused_costed_rel": (costed, True, True, 0, False, 1),
            "barriers_only_spread": (ph, True, True, 0, True, 2), "fused_ahead_spread": (fused, True, True, 0, False, 2),
            "fused_costed_spread": (costed, True, True, 0, False, 2)}
    verify_bytes = {}
    for rows, ex in verify:
        vph = phases(cfg, ex)
        verify_bytes[rows] = sum(q[1] for q in vph)
        arms[f"verify{rows}_fused"] = ([q for q in vph if q[1] > 0 or q[0] == "route"], True, True, 0, False)
        arms[f"verify{rows}_costed"] = (costed_phases(cfg, a.rec_ns, a.attend_ns, a.combine_ns, rows, ex),
                                        True, True, 0, False)
    most = max(sum(-(-q[1] // UNIT) for q in arm[0]) for arm in arms.values())
    w = torch.randint(0, 255, (most * UNIT,), dtype=torch.uint8, device=dev)   # never zeros
    src = probe_source("cuda_step_probe.cu")
    smem = WARPS * SPW * UNIT + WARPS * SPW * 8
    fn = cuda_nvrtc.compile_kernel(dev, "cuda_step_probe.cu", "step_probe", {"WARPS": WARPS, "SPW": SPW}, smem, text=src)
    grid = cuda_nvrtc.sm_count(dev)
    ctr = torch.zeros(8 * 32, dtype=torch.int32, device=dev)     # 8 lines of counters (grid_sync_mode)
    sink = torch.zeros(grid * WARPS, dtype=torch.int32, device=dev)
    stream = torch.cuda.current_stream(dev)

    from cuda_bench import bandwidth     # the ceiling as the main benchmark measures it (bench/ is on the path)
    bw = bandwidth()
    limit = need / bw

    args_of = {}
    for name, (arm_ph, barriers, ahead, small, empty, *mode) in arms.items():
        off, fr = tables(arm_ph, ahead, empty=empty)
        offt = torch.tensor(off, dtype=torch.int64, device=dev)
        frt = torch.tensor(fr, dtype=torch.int32, device=dev)
        spt = torch.tensor(spins(arm_ph, small), dtype=torch.int64, device=dev)
        args_of[name] = ((offt, frt, spt), [ctypes.c_void_p(w.data_ptr()), ctypes.c_void_p(offt.data_ptr()),
                                            ctypes.c_void_p(frt.data_ptr()), ctypes.c_int(len(arm_ph)),
                                            ctypes.c_void_p(ctr.data_ptr()), ctypes.c_void_p(sink.data_ptr()),
                                            ctypes.c_int(int(barriers)), ctypes.c_void_p(spt.data_ptr()),
                                            ctypes.c_int(mode[0] if mode else 0)])
    times = {k: [] for k in arms}
    for r in range(-2, a.rounds):
        for name in arms:
            ctr.zero_()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            cuda_nvrtc.launch(fn, smem, 32 * WARPS, grid, stream.cuda_stream, False, args_of[name][1], "step_probe")
            e1.record()
            e1.synchronize()
            if r >= 0:
                times[name].append(e0.elapsed_time(e1) / 1e3)
    zero_phases = sum(1 for _, b, _ in ph if b == 0)
    res = {"copy_Bps": bw, "active_bytes": need, "limit_ms": limit * 1e3, "phases": len(ph),
           "zero_byte_phases": zero_phases, "small_ns": a.small_ns,
           "fused_costed": {"phases": len(costed), "bytes": sum(q[1] for q in costed), "rec_ns": a.rec_ns,
                            "attend_ns": a.attend_ns, "combine_ns": a.combine_ns}, "grid": grid, "warps": WARPS, "spw": SPW,
           "arms": {}}
    print(f"[probe] copy {bw / 1e12:.2f} TB/s; {need / 1e9:.2f} GB a step -> limit {limit * 1e3:.3f} ms; "
          f"{len(ph)} phases ({zero_phases} move no bytes), grid {grid} x {WARPS} warps x {SPW} slots of {UNIT} B; "
          f"fused_costed: {len(costed)} phases, {sum(q[1] for q in costed) / 1e9:.2f} GB, recurrence {a.rec_ns} ns, "
          f"attention {a.attend_ns} ns, combine {a.combine_ns} ns")
    for name, ts in times.items():
        res["arms"][name], line = summarise(name, ts, limit, bw, verify_bytes)
        print(f"[probe] {line}" + (f"; {statistics.median(ts) / (len(ph) - 1) * 1e6:.2f} us a barrier"
                                   if name.startswith("barriers_only") else ""))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cuda_step_probe.json").write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
