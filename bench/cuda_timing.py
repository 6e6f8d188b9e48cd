"""GPU time of small kernels for the sweeps and probes: calls captured in one CUDA graph and
replayed.

A Python launch costs ~10 us, more than a small kernel runs, so timing calls one by one
measures the host; replaying a graph of them measures the GPU.
"""

from __future__ import annotations

import torch


def capture(fn) -> torch.cuda.CUDAGraph:
    """fn run once (compiles, allocates), then captured into a graph."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def replay_us(g: torch.cuda.CUDAGraph, reps: int = 4) -> float:
    """Microseconds of GPU time per replay of g, replayed back to back after one untimed replay."""
    g.replay()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    a.record()
    for _ in range(reps):
        g.replay()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / reps * 1e3


def graph_us(fns, reps: int = 32) -> float:
    """Microseconds of GPU time per call; `fns` are cycled through (e.g. one per weight copy,
    so the weights come from HBM rather than L2)."""
    return replay_us(capture(lambda: [fns[i % len(fns)]() for i in range(reps)])) / reps
