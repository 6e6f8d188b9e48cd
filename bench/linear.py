"""Benchmark: row-invariant ``verispec.ops.linear`` vs ``F.linear`` for M = 1..8 rows.

    python bench/linear.py [--rounds 7] [--threads 2] [--out bench/results/linear.json]

Arms are interleaved (A B A B ...) in every round, so drift in the machine's load hits
both alike; each round's value is the median of several calls; the table shows the
median over rounds with the min-max spread, and T(M)/T(1) of each arm.
Single layers (16 MiB) stay in the 32 MiB L3 between calls; the 8-layer stack
(256 MiB) is read from DRAM, which is what a decode step of a real model sees.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from verispec.ops.linear import backend, linear

SHAPES = {  # name -> list of weights [N, K] applied in sequence
    "1024->4096": [(4096, 1024)],
    "4096->1024": [(1024, 4096)],
    "1024->8192": [(8192, 1024)],
    "stack 8x(1024->4096->1024)": [(4096, 1024), (1024, 4096)] * 8,
}


def run_stack(fn, x: torch.Tensor, weights: list[torch.Tensor]) -> torch.Tensor:
    for w in weights:
        x = fn(x, w)
    return x


def time_arm(fn, x, weights, calls: int) -> float:
    """Median seconds of one pass over the weights, of `calls` timed passes."""
    ts = []
    for _ in range(calls):
        t0 = time.perf_counter()
        run_stack(fn, x, weights)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--max-m", type=int, default=8)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "linear.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    arms = {"linear": linear, "F.linear": F.linear}
    ms = list(range(1, args.max_m + 1))
    g = torch.Generator().manual_seed(0)
    results = {}
    load_before = os.getloadavg()
    for name, shapes in SHAPES.items():
        weights = [torch.randn(n, k, generator=g) / k**0.5 for n, k in shapes]
        k0 = shapes[0][1]
        xs = {m: torch.randn(m, k0, generator=g) for m in ms}
        for m in ms:  # warm up (and compile the kernel) outside the timed rounds
            for fn in arms.values():
                run_stack(fn, xs[m], weights)
        calls = max(3, int(0.02 / max(time_arm(F.linear, xs[1], weights, 3), 1e-6)))
        raw = {arm: {m: [] for m in ms} for arm in arms}
        for _ in range(args.rounds):
            for m in ms:
                for arm, fn in arms.items():  # A B, A B, ...
                    raw[arm][m].append(time_arm(fn, xs[m], weights, calls))
        results[name] = {"calls_per_round": calls, "seconds": raw}
        print_table(name, raw, ms)
    meta = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "threads": args.threads,
        "torch": torch.__version__,
        "backend": backend(),
        "rounds": args.rounds,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    print(f"\n{meta}\nraw results -> {out}")


def print_table(name: str, raw: dict, ms: list[int]) -> None:
    print(f"\n### {name}  (ms: median [min-max] over rounds; T(M)/T(1))")
    print("| M | linear ms | F.linear ms | linear T(M)/T(1) | F.linear T(M)/T(1) | linear/F.linear |")
    print("|---|---|---|---|---|---|")
    med = {arm: {m: statistics.median(v) for m, v in d.items()} for arm, d in raw.items()}
    for m in ms:
        cells = []
        for arm in ("linear", "F.linear"):
            v = raw[arm][m]
            cells.append(f"{med[arm][m] * 1e3:.3f} [{min(v) * 1e3:.3f}-{max(v) * 1e3:.3f}]")
        ratios = [f"{med[arm][m] / med[arm][1]:.2f}" for arm in ("linear", "F.linear")]
        speed = f"{med['linear'][m] / med['F.linear'][m]:.2f}"
        print(f"| {m} | {cells[0]} | {cells[1]} | {ratios[0]} | {ratios[1]} | {speed} |")


if __name__ == "__main__":
    main()
