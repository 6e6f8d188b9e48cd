"""GPU time of small kernels for the sweeps: calls captured in one CUDA graph and replayed.

A Python launch costs ~10 us, more than a small kernel runs, so timing calls one by one
measures the host; replaying a graph of them measures the GPU.
"""

from __future__ import annotations

import torch


def graph_us(fns, reps: int = 32) -> float:
    """Microseconds of GPU time per call; `fns` are cycled through (e.g. one per weight copy,
    so the weights come from HBM rather than L2)."""
    for f in fns:
        f()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(reps):
            fns[i % len(fns)]()
    g.replay()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    a.record()
    for _ in range(4):
        g.replay()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / (4 * reps) * 1e3
