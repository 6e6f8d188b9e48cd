"""The MTP head as a draft source: drafts 1..3 deep, its own KV cache kept complete.

Bookkeeping (pair p = (h_p, x_{p+1}) at head index p, see models/mtp.py):
- after a prompt chunk, its completed pairs are absorbed (K/V only);
- `propose` runs the pending pair (the last fed row's hidden state with the picked token)
  as a full row at its index, then each deeper draft as a full row past it (a tail the
  settled pairs overwrite); with nothing to draft it only absorbs the pending pair;
- `settle(keep)` absorbs the standing rows of the last forward, each with the token that
  followed it, and keeps the last standing row's hidden state as the next pending one.

A declined step's absorb is deferred: an absorb reads nothing from the head's cache (it
writes the K/V of its own pairs), so the pairs of consecutive declined steps are absorbed
together, in one call of up to DEFER_MAX rows, before the head next writes a row (or when a
session saves its state). With a head the gate keeps declining, a plain step then pays about
1/DEFER_MAX of an absorb instead of a whole one (the absorb is a product with the head's
2H x H input matrix and its K/V projections; on a CPU it is ~5% of a mid-size model's step).
Drafts only: the output never depends on the head's cache.
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from ..models.mtp import MTPHead


DEFER_MAX = 16


class MTPDrafter:
    name = "mtp"
    gated_by_decoder = False      # the drafter asks the gate itself, before writing drafts

    def __init__(self, head: MTPHead, depth: int, max_len: int, *, gate=None, vocab=None,
                 clock: Callable[[], float] = time.perf_counter, pstep: bool = False):
        self.head = head
        self.depth = depth        # 1..3 fixed, 0 = auto (the gate picks 0..3)
        # per-step depth within a fixed depth >= 2: write deeper drafts while the gate's
        # deeper_p says they can pay, then trim with pick_p (never below one draft)
        self.pstep = pstep and depth >= 2 and gate is not None
        self.cache = head.new_cache(max_len)
        self.gate = gate
        self.vocab = vocab
        self.clock = clock
        self.pending: torch.Tensor | None = None   # [H] hidden of the last fed row
        self._rows: torch.Tensor | None = None     # hidden rows of the last forward
        self._fed: list[int] = []
        self._start = 0
        self._vocab_key = None
        self._vocab_w = None
        self.last_probs: list[float] = []
        self.logged: list = []   # (index, depth, vocab ids, scores) when log_scores is set (tests)
        self.log_scores = False
        self._deferred: list[tuple[torch.Tensor, int, int]] = []   # (hidden [H], token, index) not yet absorbed
        self.absorb_calls = 0

    # ----- absorbing -----
    def _absorb(self, hidden: torch.Tensor, tokens: list[int], index: int) -> None:
        self.absorb_calls += 1
        self.head.absorb(self.cache, hidden, tokens, index)

    def _defer(self, hidden: torch.Tensor, token: int, index: int) -> None:
        # a pair at index supersedes any queued at or past it (a rewound transcript)
        self._deferred = [d for d in self._deferred if d[2] < index]
        self._deferred.append((hidden.clone(), token, index))   # a row of a forward's output: keep our own
        if len(self._deferred) >= DEFER_MAX:
            self.flush_deferred()

    def flush_deferred(self) -> None:
        """Absorb the deferred pairs now (runs of consecutive indices, one call each)."""
        queued, self._deferred = self._deferred, []
        i = 0
        while i < len(queued):
            j = i + 1
            while j < len(queued) and queued[j][2] == queued[j - 1][2] + 1:
                j += 1
            run = queued[i:j]
            self._absorb(torch.stack([h for h, _, _ in run]), [t for _, t, _ in run], run[0][2])
            i = j

    def drop_deferred(self) -> None:
        """Forget the deferred pairs (the cache was replaced: a session restored a saved one)."""
        self._deferred = []

    def after_prefill(self, out, ids: list[int], start: int) -> None:
        hidden = self.head.pick_hidden(out)
        self._deferred = [d for d in self._deferred if d[2] < start - 1]
        self.flush_deferred()
        if self.pending is not None and start > 0:
            self._absorb(self.pending[None], [ids[0]], start - 1)
        if len(ids) > 1:
            self._absorb(hidden[:-1], ids[1:], start)
        self.pending = hidden[-1]

    def after_forward(self, out, fed: list[int], start: int) -> None:
        self._rows = self.head.pick_hidden(out)
        self._fed = fed
        self._start = start

    def settle(self, keep: int) -> None:
        if keep > 1:
            self._deferred = [d for d in self._deferred if d[2] < self._start]
            self.flush_deferred()
            self._absorb(self._rows[:keep - 1], self._fed[1:keep], self._start)
        self.pending = self._rows[keep - 1]

    def reset(self) -> None:
        self.pending = None
        self._deferred = []

    # ----- drafting -----
    def _vocab(self):
        if self.vocab is None:
            return None, None
        ids = self.vocab.ids()
        if ids is None:
            return None, None
        if ids is not self._vocab_key:
            self._vocab_key = ids
            self._vocab_w = self.head.model.lm_head[ids].contiguous()
        return ids, self._vocab_w

    def propose(self, tokens: list[int], tok: int, max_k: int) -> list[int]:
        index = len(tokens) - 1           # the pending pair (h_{n-1}, x_n), n = fed tokens
        k = min(max_k, self.depth or 3)
        if k > 0 and self.depth == 0 and self.gate is not None:
            k = self.gate.pick(self.name, k)
        if k == 0 or self.pending is None:
            if self.pending is not None:
                self._defer(self.pending, tok, index)
            self.last_probs = []
            return []
        self.flush_deferred()                       # the rows below attend over every absorbed pair
        ids, weight = self._vocab()
        drafts, probs = [], []
        hidden, t = self.pending, tok
        for j in range(k):
            t0 = self.clock()
            scores, out = self.head.row(self.cache, hidden, t, index + j, ids, weight)
            if self.vocab is not None:
                self.vocab.note_draft()
            if self.log_scores:
                self.logged.append((index + j, j, ids, scores.clone()))
            best = int(torch.argmax(scores))
            drafts.append(int(ids[best]) if ids is not None else best)
            probs.append(_own_probability(scores, best))
            hidden, t = out[0], drafts[-1]
            if j > 0 and self.gate is not None:
                self.gate.draft_cost(self.name, self.clock() - t0)
            if self.pstep and j + 1 < k and not self.gate.deeper_p(self.name, probs):
                break
        if self.pstep:
            keep = max(1, self.gate.pick_p(self.name, probs))
            drafts, probs = drafts[:keep], probs[:keep]
        self.last_probs = probs
        return drafts


def _own_probability(scores: torch.Tensor, best: int) -> float:
    """The head's probability of its own token: softmax over the scores within 20 of the best."""
    top = float(scores[best])
    near = scores[scores >= top - 20.0]
    return 1.0 / float(torch.exp(near.double() - top).sum()) if near.numel() else 1.0


__all__ = ["MTPDrafter"]
