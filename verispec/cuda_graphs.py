"""CUDA graphs of the exact (decode/verify) forward, one per (row count, copy slots on/off).

A decode step of a 40-layer hybrid launches thousands of small kernels; replaying a
captured graph launches them from the GPU's side in one call. The padded row policy makes
this possible: under it the forward's device work (`Model.core` with device positions)
reads no host value that changes between steps, so one capture per row count serves every
position. A graph binds the addresses of one State's tensors, so the runner re-captures
when a new State arrives (an Engine that reuses its states, as the benchmarks and the
server's sessions do, captures once), and sets `state.copy_commit` so an undo copies the
copy slot into the live state instead of swapping the two.

Replaying a graph runs the same kernels with the same shapes as the eager padded path, so
the bits equal the eager path's (tests/test_cuda.py checks it).
"""

from __future__ import annotations

import torch

from .state import State


class GraphedForward:
    def __init__(self, model, max_rows: int):
        self.model = model
        self.max_rows = max_rows
        self.state: State | None = None
        self.graphs: dict[tuple[int, bool], tuple[torch.cuda.CUDAGraph, tuple]] = {}
        self.pool = None
        dev = model.embed.device
        self.ids = torch.zeros(max_rows, dtype=torch.long, device=dev)
        self.start = torch.zeros((), dtype=torch.long, device=dev)
        self.captures = 0

    def _bind(self, state: State) -> None:
        self.graphs.clear()
        self.pool = torch.cuda.graph_pool_handle()
        self.state = state
        state.copy_commit = True

    def _core(self, rows: int, state: State, save_slots: bool):
        pos = torch.arange(rows, device=self.ids.device) + self.start
        return self.model.core(self.ids[:rows], state, int(state.kv_len), True, save_slots, pos)

    def _capture(self, rows: int, state: State, save_slots: bool):
        # A warm-up run before capture initialises cuBLAS and compiles Triton; it writes the
        # cache rows this step will write anyway and advances the recurrent state, which is
        # put back so the captured graph's first replay starts from the state as it was.
        kept = [t.clone() for t in state.recurrent.conv + state.recurrent.rec]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._core(rows, state, save_slots)
        torch.cuda.current_stream().wait_stream(side)
        for dst, src in zip(state.recurrent.conv + state.recurrent.rec, kept):
            dst.copy_(src)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = self._core(rows, state, save_slots)
        self.captures += 1
        return graph, out

    def forward(self, ids: torch.Tensor, state: State, save_slots: bool):
        from .models.qwen3_next import ForwardOut

        rows = ids.shape[0]
        if state is not self.state:
            self._bind(state)
        self.ids[:rows].copy_(ids, non_blocking=False)
        self.start.copy_(torch.tensor(state.kv_len))
        key = (rows, bool(save_slots))
        if key not in self.graphs:
            self.graphs[key] = self._capture(rows, state, save_slots)
        graph, out = self.graphs[key]
        graph.replay()
        # the next replay (of any graph: they share one memory pool) overwrites these
        return ForwardOut(*(t.clone() for t in out))
