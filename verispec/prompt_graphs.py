"""CUDA graphs of a fresh prompt's batched forward, one per bucket of rows.

Eager, a batched prefill on CUDA is bound by its launches, not the GPU: ~2,560 kernels for 40
layers, queued at ~30 us each, so a 128-row prompt at the 35B-A3B shape took 81 ms to queue work
the GPU did in 36 (`bench/prefill_profile.py --host`, device call 165). A graph replays them in
one call.

Graphs want fixed shapes and addresses, and a prompt has neither, so:
- rows: a prompt of R rows (EXACT_ROWS < R <= GRAPH_TO) is padded with id 0 to its bucket B:
  below chunk_delta.CUDA_FROM (where the recurrence runs row by row in one launch) R rounded up
  to STEP; from there, where the recurrence runs in chunks, R rounded up to an eighth of the
  power of two at or below it (1024-2047 rows: 128, 2048: 256), so the padding stays under
  12.5% with 16 buckets a doubling. The padding sits after the prompt, so causal attention keeps
  it out of the prompt's rows; the DeltaNet's conv ring is taken at row R and its recurrence
  skips the padding (Model.core's `n_real`: b = a = -inf gives beta = 0 and no decay, which a
  chunk passes through as it does a zero row); the prompt's logits come from row R-1.
- addresses: the graph runs on its own scratch state, zeroed inside the graph (a fresh prompt
  starts from zeros: State.allocate and State.reset), and the result (the recurrent state, the
  cache's first R rows) is copied into the caller's state after. So one capture serves every
  State, unlike the exact path's graphs, which bind one State's tensors.

A bucket runs eager (the same padded shapes, so the same bits: tests/test_cuda.py) until it has
been used CAPTURE_AFTER times, then is captured: a single prompt (`verispec run`) never pays for a
capture; a server pays once per bucket.
"""

from __future__ import annotations

import torch

import warnings

from .ops import chunk_delta, grouped_moe

STEP = 64               # bucket width below chunk_delta.CUDA_FROM: a prompt's padding is at most STEP-1 rows
GRAPH_TO = 2048         # the longest prompt graphed: past it the GPU's work outlasts the host's queueing
                        # of it (graphed 1.24x eager at 1024 rows, 1.04x at 2048, 1.02x at 4096: an H100, device
                        # call 176), too little for the memory a longer bucket's graph holds
CAPTURE_AFTER = 1       # eager uses of a bucket before it is captured


def bucket_rows(rows: int) -> int:
    """The padded row count of a prompt of `rows` rows (module doc; no range check)."""
    cut = chunk_delta.CUDA_FROM
    if rows < cut:
        # the recurrence's choice follows the padded count: stay on the row-by-row side of the cut
        return min(-(-rows // STEP) * STEP, cut - 1)
    width = max(STEP, (1 << (rows.bit_length() - 1)) // 8)
    return -(-rows // width) * width


class PromptGraphs:
    def __init__(self, model, min_rows: int, capture_after: int | None = CAPTURE_AFTER):
        """capture_after: eager uses of a bucket before its capture; None: never capture (the
        eager padded path alone, which also runs on the CPU: tests)."""
        self.model = model
        self.min_rows = min_rows
        self.capture_after = capture_after
        self.scratch = None
        self.ids = self.n_real = None
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, tuple]] = {}
        self.uses: dict[int, int] = {}
        self.failed: set[int] = set()     # buckets whose capture raised: eager from then on
        self.pool = None
        self.captures = 0
        self._capturable: bool | None = None

    @staticmethod
    def max_rows() -> int:
        return GRAPH_TO

    def bucket(self, rows: int) -> int | None:
        """The padded row count of a prompt of `rows` rows, or None: not this path."""
        if rows < self.min_rows or rows > self.max_rows():
            return None
        return min(bucket_rows(rows), self.max_rows())

    def capturable(self) -> bool:
        """Every MoE layer's experts take torch._grouped_mm: the per-expert fallback reads the
        experts' row counts on the host, which a capture cannot hold (those buckets stay eager)."""
        if self._capturable is None:
            from .models.qwen3_next import MoE

            m = self.model
            x = torch.empty(1, m.args.hidden_size, dtype=m.embed.dtype, device=m.embed.device)
            moes = [layer.mlp for layer in m.layers if isinstance(layer.mlp, MoE)]
            self._capturable = all(grouped_moe.runs_grouped(x, e.gu_all, e.down_all) for e in moes)
        return self._capturable

    def _ready(self, b: int) -> None:
        if self.scratch is None or self.scratch.shapes.max_len < b:
            # sized for the largest bucket at once (a re-allocation drops every capture); at the
            # 35B-A3B shape 2048 rows of cache are ~42 MB beside the recurrent state's 60 MB
            dev = self.model.embed.device
            n = max(b, self.max_rows())
            self.scratch = self.model.new_state(n)
            self.ids = torch.zeros(n, dtype=torch.long, device=dev)
            self.n_real = torch.zeros((), dtype=torch.long, device=dev)
            self.graphs.clear()     # captured over the old scratch's addresses (and so a new pool: _use)
            # the RoPE rows every bucket reads, in place before any capture (a table grown later
            # keeps the old one alive: RopeTable.retired)
            self.model.rope.ensure(n)

    def _core(self, b: int):
        st = self.scratch
        for t in st.recurrent.conv + st.recurrent.rec:
            t.zero_()
        return self.model.core(self.ids[:b], st, 0, False, False, None, last_logits=True, n_real=self.n_real)

    def _capture(self, b: int):
        # a warm-up on a side stream first (cuBLAS workspaces, Triton compiles), as torch asks;
        # it writes only the scratch state, which every run zeroes first
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._core(b)
        torch.cuda.current_stream().wait_stream(side)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = self._core(b)
        self.captures += 1
        return graph, out

    def _use(self, b: int) -> None:
        """Count a use of bucket b and capture it once it has been used capture_after times."""
        used = self.uses.get(b, 0)
        self.uses[b] = used + 1
        if (b not in self.graphs and b not in self.failed and self.capture_after is not None
                and used >= self.capture_after and self.capturable()):
            if not self.graphs:
                # a handle whose graphs are all gone (cleared, or a failed capture's) names a pool the
                # allocator no longer counts as live: capturing into it trips its `use_count > 0`
                # assert (device call 170), so the next capture takes a fresh one
                self.pool = None
            try:
                self.graphs[b] = self._capture(b)
            except RuntimeError as e:
                # the eager run gives the same bits; only the speed is lost
                self.failed.add(b)
                warnings.warn(f"verispec: a prompt graph of {b} rows could not be captured ({e}); "
                              "prompts of that length run eager", RuntimeWarning)

    def forward(self, ids: torch.Tensor, state):
        """The batched forward of a whole prompt (state.kv_len == 0) -> ForwardOut with the last
        row's logits [1, V] and every prompt row's hidden states; `state` gets the prompt."""
        from .models.qwen3_next import ForwardOut

        rows = ids.shape[0]
        b = self.bucket(rows)
        if b is None or state.kv_len != 0:
            raise ValueError(f"a prompt graph takes a fresh prompt of {self.min_rows}..{self.max_rows()} rows")
        self._ready(b)
        self.ids[:rows].copy_(ids)
        self.ids[rows:b].zero_()      # the padding's ids, fixed: the same prompt gives the same bits
        self.n_real.fill_(rows)
        self._use(b)
        if b in self.graphs:
            graph, out = self.graphs[b]
            graph.replay()
        else:
            out = self._core(b)
        st = self.scratch
        torch._foreach_copy_(state.recurrent.conv + state.recurrent.rec, st.recurrent.conv + st.recurrent.rec)
        for dst, src in zip(state.k + state.v, st.k + st.v):
            dst[:, :rows].copy_(src[:, :rows])
        # the next run (of any bucket: they share one memory pool) overwrites `out`
        logits, hidden, pre = out
        return ForwardOut(logits.clone(), hidden[:rows].clone(), pre[:rows].clone())
