"""CUDA graphs of a prompt that continues a cache (a server's next turn), in pieces.

A fresh prompt's batched forward is one graph (verispec/prompt_graphs.py). A continuation's
attention layers read the cache up to a position that changes from turn to turn, which a graph
cannot hold (the fast attention kernels take the key count as a shape). So the forward is
captured in pieces that end at each attention layer: every product, norm, the DeltaNet layers
and the MoE replay from graphs, and between two pieces the attention layer's cache writes and
attention run eager (a handful of launches, against ~2,500 for the whole forward).

As for fresh prompts: the rows are padded with id 0 to the bucket (the DeltaNet state skips the
padding: Model.core's `n_real`), the recurrent state is copied into a scratch state before the
pieces and out after (so one capture serves every State), and a bucket runs eager until it has
been used CAPTURE_AFTER times. The eager run hands the attention to the same code with the same
shapes, so a captured bucket gives its eager run's bits (tests/test_cuda.py). Only the real rows'
keys and values are written to the cache and only the real rows attend; the padding rows'
attention output is zero, so nothing a padding row computes depends on what the cache held
beyond the prompt.
"""

from __future__ import annotations

import torch

from .ops import attention as attn_ops
from .prompt_graphs import CAPTURE_AFTER, STEP, PromptGraphs

# On since device call 171 (an H100: the twelve GPU suites with it on, 103 passed). Off, a
# continuation takes the unpadded eager batched forward.
ENABLED = True


class Attend:
    """The attention layers' part of a continuation that stays eager: write the real rows' keys
    and values at the cache's end, attend, and zero the padding rows' output."""

    def __init__(self, pos: torch.Tensor):
        self.pos = pos              # [B] device positions start.. of the bucket's rows (the RoPE)
        self.state = None           # the caller's State, its start and real rows: set per call
        self.start = self.rows = 0
        self.pieces: _Pieces | None = None   # while capturing

    def __call__(self, m, q, k, v) -> torch.Tensor:
        """q [B, heads, hd], k and v [B, kv_heads, hd] -> o [B, heads, hd]."""
        if self.pieces is not None:
            return self.pieces.split(m, q, k, v)
        out = torch.empty_like(q)
        self.run(m, q, k, v, out)
        return out

    def run(self, m, q, k, v, out: torch.Tensor) -> None:
        s, r = self.start, self.rows
        out[:r] = attn_ops.append_and_attend(q[:r], k[:r], v[:r], self.state.k[m.index], self.state.v[m.index],
                                             s, q.shape[-1] ** -0.5, exact=False)
        out[r:].zero_()


class _Pieces:
    """A capture split at each attention layer: graphs[i] runs up to attention layer i (calls[i]),
    the last one to the logits."""

    def __init__(self, pool):
        self.pool = pool
        self.graphs: list[torch.cuda.CUDAGraph] = []
        self.calls: list[tuple] = []     # (layer, q, k, v, out): what the eager part reads and writes
        self._begin()

    def _begin(self) -> None:
        g = torch.cuda.CUDAGraph()
        g.capture_begin(pool=self.pool)
        self.graphs.append(g)

    def split(self, m, q, k, v) -> torch.Tensor:
        self.graphs[-1].capture_end()
        # allocated between captures, outside the pool: the eager attention writes it at replay
        out = torch.empty_like(q)
        self.calls.append((m, q, k, v, out))
        self._begin()
        return out

    def end(self) -> None:
        self.graphs[-1].capture_end()

    def abandon(self) -> None:
        # a capture that raised: close the open one so the stream can run again
        try:
            self.graphs[-1].capture_end()
        except RuntimeError:
            pass

    def replay(self, attend: Attend) -> None:
        self.graphs[0].replay()
        for (m, q, k, v, out), g in zip(self.calls, self.graphs[1:]):
            attend.run(m, q, k, v, out)
            g.replay()


class ContinuationGraphs(PromptGraphs):
    """The batched forward of a prompt of min_rows..max_rows() rows appended to a state that
    already holds rows (state.kv_len > 0), on CUDA from pieces of graphs."""

    def __init__(self, model, min_rows: int, capture_after: int | None = CAPTURE_AFTER):
        super().__init__(model, min_rows, capture_after)
        self.pos = None
        self.attend: Attend | None = None
        self._rope = None

    def _ready(self, b: int) -> None:
        if self.scratch is None:
            dev = self.model.embed.device
            n = self.max_rows()
            # only its recurrent state is used: the attention writes the caller's cache
            self.scratch = self.model.new_state(STEP)
            self.ids = torch.zeros(n, dtype=torch.long, device=dev)
            self.n_real = torch.zeros((), dtype=torch.long, device=dev)
            self.pos = torch.zeros(n, dtype=torch.long, device=dev)
            self.attend = Attend(self.pos)

    def _core(self, b: int):
        self.attend.pos = self.pos[:b]
        return self.model.core(self.ids[:b], self.scratch, self.attend.start, False, False, None,
                               last_logits=True, n_real=self.n_real, attend=self.attend)

    def _capture(self, b: int):
        st = self.scratch
        kept = [t.clone() for t in st.recurrent.conv + st.recurrent.rec]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        try:
            with torch.cuda.stream(side):
                # the warm-up torch asks for (cuBLAS workspaces, Triton compiles): it writes the cache
                # rows the replay writes again, with the same values, and advances the scratch state,
                # which is put back below (also when the capture fails: the eager run follows)
                self._core(b)
                torch.cuda.synchronize()
                if self.pool is None:
                    self.pool = torch.cuda.graph_pool_handle()
                pieces = _Pieces(self.pool)
                self.attend.pieces = pieces
                try:
                    out = self._core(b)
                    pieces.end()
                except BaseException:
                    pieces.abandon()
                    raise
                finally:
                    self.attend.pieces = None
        finally:
            torch.cuda.current_stream().wait_stream(side)
            torch._foreach_copy_(st.recurrent.conv + st.recurrent.rec, kept)
        self.captures += 1
        return pieces, out

    def forward(self, ids: torch.Tensor, state):
        """The batched forward of `ids` appended at state.kv_len > 0 -> ForwardOut with the last
        row's logits [1, V] and the rows' hidden states; `state` gets the rows."""
        from .models.qwen3_next import ForwardOut

        rows, start = ids.shape[0], state.kv_len
        b = self.bucket(rows)
        if b is None or start == 0:
            raise ValueError(f"a continuation graph takes {self.min_rows}..{self.max_rows()} rows after a cache")
        self._ready(b)
        rope = self.model.rope
        rope.ensure(max(start + b, state.shapes.max_len))
        if rope.cos is not self._rope:
            # the pieces gather RoPE rows by position from the table they were captured over, which
            # is too short for the positions that made it grow
            self.graphs.clear()
            self._rope = rope.cos
        self.ids[:rows].copy_(ids)
        self.ids[rows:b].zero_()
        self.n_real.fill_(rows)
        self.pos[:b] = torch.arange(start, start + b, device=self.pos.device)
        self.attend.state, self.attend.start, self.attend.rows = state, start, rows
        st = self.scratch
        torch._foreach_copy_(st.recurrent.conv + st.recurrent.rec, state.recurrent.conv + state.recurrent.rec)
        self._use(b)
        if b in self.graphs:
            pieces, out = self.graphs[b]
            pieces.replay(self.attend)
        else:
            out = self._core(b)
        torch._foreach_copy_(state.recurrent.conv + state.recurrent.rec, st.recurrent.conv + st.recurrent.rec)
        self.attend.state = None
        logits, hidden, pre = out
        return ForwardOut(logits.clone(), hidden[:rows].clone(), pre[:rows].clone())
