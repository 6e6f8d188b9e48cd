"""What a latency-bound kernel's loads pay while a stream product's weights are being requested
(issue 9, eighteenth session).

In the graphed decode step (bench/cuda_timeline.py, call 119) the MoE's combine ends 6.9-8.2 us
after the expert down product although it takes 2.8 us alone (no PDL), and the recurrence 6.4 us
after the input product against 3.7 us alone; both run while the next stream product, launched
early, has requested its first units (up to 192 KiB a SM, ~25 MB over the GPU) before its wait.
If the memory system serves requests roughly in order, a load issued behind ~25 MB of requests
waits ~25 MB / 4.2 TB/s = 6 us, L2 hit or not.

This probe measures it: one launch, a CTA an SM; warps 0-7 of the flooding CTAs request UNITS
units of 8 KiB each (all at once, or paced: each after the one before it landed) while one lane
of CTA 0 walks a chain of dependent loads, in L2 (a small chain read just before) or in DRAM (a
chain over 256 MB), for modes none / same (the prober's SM floods too) / other (every SM but the
prober's). Medians over --rounds launches; raw per-launch stamps in the JSON.

  python3 bench/cuda_flood_probe.py --rounds 15 --out $OUT

Its last part times asking L2 for 33.5 MB ahead (bulk prefetches from 33 or 132 CTAs, or a prefetch a
line), and a read of the same bytes after it against the read alone.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from cuda_step_probe import probe_source  # noqa: E402

from verispec.ops import cuda_nvrtc  # noqa: E402

UNIT = 8192
SMEM = 24 * UNIT + 24 * 8
MODES = {"none": 0, "same": 1, "other": 2}
DRAM_NODES, DRAM_STRIDE = 8192, 8192        # 8192 nodes 32 KB apart: 256 MB
L2_NODES, L2_STRIDE = 64, 32                # 64 nodes 128 B apart: 8 KB


def chain(nodes: int, stride: int, seed: int) -> torch.Tensor:
    """A u32 array whose entry at node i's position holds the next node's position (one cycle)."""
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(nodes, generator=g)
    a = torch.zeros(nodes * stride, dtype=torch.int32)
    nxt = torch.roll(order, -1)
    a[order * stride] = (nxt * stride).to(torch.int32)
    return a


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("cuda_flood_probe: torch sees no CUDA GPU", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    fn = cuda_nvrtc.compile_kernel(dev, "cuda_flood_probe.cu", "flood_probe", {}, SMEM,
                                   text=probe_source("cuda_flood_probe.cu"))
    grid = cuda_nvrtc.sm_count(dev)
    region = grid * 24 * UNIT
    regions = 48                                   # a fresh region each launch: never in L2
    big = torch.randint(0, 255, (regions * region,), dtype=torch.uint8, device=dev)
    dram = chain(DRAM_NODES, DRAM_STRIDE, 1).to(dev)
    l2 = chain(L2_NODES, L2_STRIDE, 2).to(dev)
    scratch = torch.empty(96 << 20, dtype=torch.uint8, device=dev)
    out = torch.zeros(8 + grid, dtype=torch.int64, device=dev)
    stream = torch.cuda.current_stream(dev).cuda_stream
    arms = [("none", 0, 0)] + [(m, u, p) for m in ("same", "other") for u in (1, 2, 3) for p in (0, 1)]
    res = {"grid": grid, "unit": UNIT, "steps": a.steps, "arms": {}}
    k = 0
    for target, buf in (("l2", l2), ("dram", dram)):
        rows = {f"{m} units {u}{' paced' if p else ''}": [] for m, u, p in arms}
        for r in range(-2, a.rounds):
            for (m, u, p), name in zip(arms, rows):
                k += 1
                scratch.fill_(k & 255)                 # L2 holds other lines
                start = 0
                if target == "l2":
                    buf.sum()                          # the chain's lines in L2
                else:
                    start = int((k * 2654435761) % DRAM_NODES) * DRAM_STRIDE
                torch.cuda.synchronize()
                args = [ctypes.c_void_p(big.data_ptr() + (k % regions) * region), ctypes.c_void_p(buf.data_ptr()),
                        ctypes.c_uint(start), ctypes.c_int(a.steps), ctypes.c_int(u), ctypes.c_int(p),
                        ctypes.c_int(MODES[m]), ctypes.c_void_p(out.data_ptr())]
                cuda_nvrtc.launch(fn, SMEM, 288, grid, stream, False, args, "flood_probe")
                o = out.tolist()
                if r >= 0:
                    rows[name].append({"chase_start_ns": o[0], "per_load_ns": o[1] / a.steps,
                                       "flood_done_ns": max(o[8:8 + grid]) if m != "none" else 0})
        for name, v in rows.items():
            med = statistics.median(x["per_load_ns"] for x in v)
            fd = statistics.median(x["flood_done_ns"] for x in v)
            res["arms"][f"{target} {name}"] = {"per_load_ns": med, "flood_done_ns": fd, "raw": v}
            print(f"[flood] {target:4s} {name:22s}: {med:7.0f} ns a dependent load "
                  f"[{min(x['per_load_ns'] for x in v):.0f}-{max(x['per_load_ns'] for x in v):.0f}]; "
                  f"flood done at {fd / 1e3:.2f} us ({grid} CTAs)")
    rate = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fr = cuda_nvrtc.compile_kernel(dev, "cuda_flood_probe.cu", "stream_rate", {}, SMEM,
                                   text=probe_source("cuda_flood_probe.cu"))
    sink = torch.zeros(grid, dtype=torch.int32, device=dev)
    res["stream_rate"] = {}
    methods = {"bulk copy, 3 slots": (0, 3), "bulk copy, 2 slots": (0, 2), "bulk copy, 1 slot": (0, 1),
               "cp.async 16 B": (1, 3), "registers, 4 in flight": (2, 4), "registers, 8 in flight": (2, 8),
               "registers, 16 in flight": (2, 16)}
    for units in (6, 12, 48):                      # ~52, 104, 415 MB over the GPU
        nbytes = grid * 8 * units * UNIT
        big2 = torch.randint(0, 255, (2 * nbytes,), dtype=torch.uint8, device=dev)
        ts = {m: [] for m in methods}
        for r in range(-2, a.rounds):
            for m, (mi, depth) in methods.items():
                k += 1
                scratch.fill_(k & 255)
                base = big2.data_ptr() + (k % 2) * nbytes
                args = [ctypes.c_void_p(base), ctypes.c_int(units), ctypes.c_int(mi), ctypes.c_int(depth),
                        ctypes.c_void_p(sink.data_ptr()),
                        ctypes.c_void_p(out.data_ptr())]
                rate[0].record()
                cuda_nvrtc.launch(fr, SMEM, 256, grid, stream, False, args, "stream_rate")
                rate[1].record()
                rate[1].synchronize()
                if r >= 0:
                    ts[m].append((rate[0].elapsed_time(rate[1]) * 1e3, max(out[:grid].tolist()) / 1e3))
        for m, v in ts.items():
            ev = statistics.median(x[0] for x in v)
            cta = statistics.median(x[1] for x in v)
            res["stream_rate"][f"{m} {units}"] = {"bytes": nbytes, "event_us": ev, "cta_us": cta, "raw": v}
            print(f"[rate] {m:24s} {nbytes / 1e6:7.1f} MB: {ev:8.2f} us by events ({nbytes / ev / 1e6:.2f} TB/s), "
                  f"slowest CTA {cta:8.2f} us ({nbytes / cta / 1e6:.2f} TB/s)")
        del big2
    # asking L2 ahead: how long the asking launch takes, and how long a read of the same 33.5 MB (as the
    # stream_rate kernel, bulk copies) takes after it, against the read alone
    fp = cuda_nvrtc.compile_kernel(dev, "cuda_flood_probe.cu", "l2_prefetch", {}, 0,
                                   text=probe_source("cuda_flood_probe.cu"))
    total = 8 * 4 * 2**20                                         # eight experts' gate/up weights
    units_rd = total // (grid * 8 * UNIT)
    rd_bytes = grid * 8 * units_rd * UNIT
    region = torch.randint(0, 255, (2 * total,), dtype=torch.uint8, device=dev)
    ways = {"read alone": None, "bulk, 33 CTAs x 64 x 16 KiB": (33, 64, 16384, 0),
            "bulk, 132 CTAs x 16 x 16 KiB": (132, 16, 16384, 0), "bulk, 128 CTAs x 64 x 4 KiB": (128, 64, 4096, 0),
            "lines, 128 CTAs x 256 x 1 KiB": (128, 256, 1024, 1)}
    res["l2_prefetch"] = {}
    tsp = {w: [] for w in ways}
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
    for r in range(-2, a.rounds):
        for w, cfg in ways.items():
            k += 1
            scratch.fill_(k & 255)
            base = region.data_ptr() + (k % 2) * total
            ev[0].record()
            if cfg is not None:
                ctas, per, chunk, mode = cfg
                cuda_nvrtc.launch(fp, 0, 256, ctas, stream, False,
                                  [ctypes.c_void_p(base), ctypes.c_int(chunk), ctypes.c_int(per), ctypes.c_int(mode)],
                                  "l2_prefetch")
            ev[1].record()
            cuda_nvrtc.launch(fr, SMEM, 256, grid, stream, False,
                              [ctypes.c_void_p(base), ctypes.c_int(units_rd), ctypes.c_int(0), ctypes.c_int(3),
                               ctypes.c_void_p(sink.data_ptr()), ctypes.c_void_p(out.data_ptr())], "stream_rate")
            ev[2].record()
            ev[2].synchronize()
            if r >= 0:
                tsp[w].append((ev[0].elapsed_time(ev[1]) * 1e3, ev[1].elapsed_time(ev[2]) * 1e3))
    for w, v in tsp.items():
        ask = statistics.median(x[0] for x in v)
        rd = statistics.median(x[1] for x in v)
        res["l2_prefetch"][w] = {"ask_us": ask, "read_us": rd, "read_bytes": rd_bytes, "raw": v}
        print(f"[l2] {w:30s}: asking {ask:7.2f} us, then reading {rd_bytes / 1e6:.1f} MB {rd:7.2f} us")
    p = Path(a.out)
    p.mkdir(parents=True, exist_ok=True)
    (p / "cuda_flood_probe.json").write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
