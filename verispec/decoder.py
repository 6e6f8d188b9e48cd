"""The decoder's one question: "here is the token I picked; give me the logits after it."

    logits = decoder.prefill(prompt_ids)
    while not done:
        tok = pick(logits, position)
        logits = decoder.logits_after(tok)     # plain step, verify, or a stored row
    decoder.finish()                          # undo drafts nobody consumed

Inside `logits_after` (DESIGN.md section 2): a pick equal to the next pending draft is
answered from that draft's stored row with no forward; the first pick that differs
settles the verify (rows that stood are kept, the rest undone) and falls through to a
new step from the picked token: a plain 1-row forward, or a k+1-row verify whose row 0
is returned. The sampler never sees a draft.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

import torch

from .models import ForwardOut, Model
from .models.qwen3_next import EXACT_ROWS
from .state import State
from .stats import DecodeStats


class Source(Protocol):
    name: str

    def propose(self, tokens: list[int], tok: int, max_k: int) -> list[int]:
        """Drafts after `tok`, the token just picked; `tokens` are the fed ones (not copied:
        the history is tokens + [tok])."""


@dataclass
class _Pending:
    source: str
    start: int                 # kv_len before the verify
    drafts: list[int]
    logits: torch.Tensor       # [k+1, vocab]: row j = logits after the j-th fed row
    probs: list[float] | None  # the drafts' own probabilities, when the source gave them
    used: int = 0              # drafts the picks have matched so far


@dataclass
class DecoderConfig:
    prefill_batch: bool = True
    prefill_batch_from: int = 0        # prefill_batch on: a part of fewer rows goes through the exact path
    prefill_rows: int = EXACT_ROWS     # the exact path: rows an exact forward of the prompt takes


@dataclass
class Decoder:
    model: Model
    state: State
    sources: list = field(default_factory=list)      # draft sources, in order of preference on a tie
    gate: object | None = None                       # verispec.gate.Gate, or None = draft in full
    clock: Callable[[], float] = time.perf_counter
    config: DecoderConfig = field(default_factory=DecoderConfig)
    stats: DecodeStats = field(default_factory=DecodeStats)
    pending: _Pending | None = None
    trace: list | None = None                        # tests: [kv_len, source, drafts, used] of every verify
    # free observations (gate.observe): (source, position of drafts[0], first position no
    # verify judges, the drafts not yet compared); each compared with the next pick
    watch: list = field(default_factory=list)

    # ----- prompt -----
    def prefill(self, ids: list[int]) -> torch.Tensor:
        """Feed the prompt (or the new part of it); returns the logits after its last token."""
        self._settle_all()
        start = self.state.kv_len
        t0 = self.clock()
        if self.config.prefill_batch and len(ids) >= self.config.prefill_batch_from:
            out = self.model.forward(ids, self.state, last_logits=True)
        else:
            # the exact path, as many rows a forward as a verify may take: row-invariant, so the bits
            # are those of one row at a time (tests/test_session.py), at a fraction of the forwards
            step = self.config.prefill_rows
            outs = [self.model.forward(ids[i:i + step], self.state, exact=True) for i in range(0, len(ids), step)]
            # only the last row's logits are read (as the batched path returns them)
            out = ForwardOut(outs[-1].logits[-1:], *(torch.cat([getattr(o, f) for o in outs]) for f in ("hidden", "hidden_pre")))
        self.stats.prefill_seconds += self.clock() - t0
        self.stats.prompt_tokens += len(ids)
        for s in self.sources:
            if hasattr(s, "sync"):
                s.sync(self.state.tokens)
            if hasattr(s, "after_prefill"):
                s.after_prefill(out, list(ids), start)
        return out.logits[-1]

    # ----- decode -----
    def logits_after(self, tok: int) -> torch.Tensor:
        if self.watch:
            self._observe(tok)
        p = self.pending
        if p is not None:
            if p.used < len(p.drafts) and tok == p.drafts[p.used]:
                p.used += 1
                self.stats.tokens += 1
                self.stats.accepted += 1
                src = self.stats.source(p.source)
                src.accepted += 1
                src.accepted_at[p.used - 1] += 1
                return p.logits[p.used]
            self._settle(rejected=p.used < len(p.drafts))
        return self._step(tok)

    def finish(self) -> None:
        """End of a generation: undo the drafts no pick consumed (state = plain decoding's)."""
        if self.pending is not None and self.pending.used < len(self.pending.drafts):
            self.stats.ended_mid_verify = True
        self._settle_all()

    def _observe(self, tok: int) -> None:
        """Follow every watched proposal with the picks (a proposal guesses the next tokens;
        its draft j stands iff picks 1..j all match). A free position's outcome goes to the
        gate; the first miss ends the watch, since later drafts' condition no longer holds."""
        keep = []
        for name, pos, free_from, drafts in self.watch:
            stood = tok == drafts[0]
            if pos >= free_from:
                self.gate.observe(name, pos, stood)
            if stood and len(drafts) > 1:
                keep.append((name, pos + 1, free_from, drafts[1:]))
        self.watch = keep

    def _settle_all(self) -> None:
        self.watch = []
        if self.pending is not None:
            self._settle(rejected=False)

    def _settle(self, rejected: bool) -> None:
        p = self.pending
        self.pending = None
        rows = len(p.drafts) + 1
        keep = p.used + 1
        if self.trace:
            self.trace[-1][3] = p.used
        self.state.commit(p.start, rows, keep)
        if self.gate is not None:
            judged = p.used + 1 if rejected else p.used
            self.gate.result(p.source, judged, p.used, probs=p.probs)
        for s in self.sources:
            if hasattr(s, "settle"):
                s.settle(keep)

    def _propose(self, tok: int, room: int) -> tuple[str, list[int]]:
        """Ask every source; carry the proposal the gate values most (the longer on a tie).

        A probe wins over the others, so that a source another one outbids is still
        measured; and when the gate's refresh plain step is due, nothing is carried (every
        source is still asked, with no room: the MTP head absorbs the pending row)."""
        tokens = self.state.tokens
        gate = self.gate
        unused = []             # (source, drafts proposed) of every gated source: watched below
        if gate is not None and gate.plain_due():
            for s in self.sources:
                s.propose(tokens, tok, 0)
            self.stats.declined += 1
            return "", []
        best: tuple[bool, float, int, str, list[int]] | None = None
        for s in self.sources:
            drafts = s.propose(tokens, tok, room)     # every source is asked: the MTP head absorbs here
            if not drafts:
                continue
            probe = False
            if gate is not None and getattr(s, "gated_by_decoder", True):
                k = gate.pick(s.name, len(drafts))
                unused.append((s, drafts))
                if k == 0:
                    self.stats.declined += 1
                    continue
                drafts = drafts[:k]
                probe = gate.probing(s.name)
            # expected tokens per unit of time, from the gate's estimates (also with the gate off)
            value = gate.value(s.name, len(drafts)) if gate is not None else float(len(drafts))
            cand = (probe, value, len(drafts), s.name, drafts)
            if best is None or cand[:3] > best[:3]:
                best = cand
        if best is None:
            self._watch_unused(unused, "", 0)
            return "", []
        name, drafts = best[3], best[4]
        spoil = getattr(next(s for s in self.sources if s.name == name), "spoil", None)
        drafts = spoil(drafts) if spoil else drafts
        self._watch_unused(unused, name, len(drafts), drafts)
        return name, drafts

    def _watch_unused(self, unused: list, carried: str, k: int, carried_drafts: list[int] = ()) -> None:
        """Watch this step's proposals for free observations: the carried source's drafts past
        its k carried ones (the carried ones, as carried, only to know they stood), and each
        other gated source's drafts from its first. Watches of earlier steps run on. With the
        gate off nothing is watched (every proposal is drafted in full; the source choice then
        reads the estimates that verifies alone made, as before observations existed)."""
        if self.gate is None or not self.gate.config.enabled:
            return
        for s, proposed in unused:
            is_carried = s.name == carried
            if is_carried and k >= len(proposed):
                continue
            start = k if is_carried else 0
            seen = getattr(s, "observed_draft", None)
            tail = []
            for pos in range(start, min(len(proposed), self.gate.config.max_drafts)):
                d = seen(pos, proposed[pos]) if seen else proposed[pos]
                if d is None:
                    break
                tail.append(d)
            if tail:
                head = list(carried_drafts) if is_carried else []
                self.watch.append((s.name, 0, start, head + tail))

    def _step(self, tok: int) -> torch.Tensor:
        room = max(self.state.shapes.max_len - self.state.kv_len - 1, 0)
        name, drafts = self._propose(tok, room)
        if drafts and not self.state.ensure_slots(len(drafts)):
            self.stats.slot_alloc_failures += 1
            drafts = []
        rows = len(drafts) + 1
        start = self.state.kv_len
        t0 = self.clock()
        out = self.model.forward([tok] + drafts, self.state, exact=True, save_slots=bool(drafts))
        seconds = self.clock() - t0
        self.stats.decode_seconds += seconds
        self.stats.forwards += 1
        self.stats.tokens += 1
        if self.gate is not None:
            self.gate.forward(rows, seconds)
        fed = [tok] + drafts
        for s in self.sources:
            if hasattr(s, "after_forward"):
                s.after_forward(out, fed, start)
                if not drafts:
                    s.settle(1)
        if drafts:
            if self.trace is not None:
                self.trace.append([start, name, list(drafts), None])
            self.stats.verifies += 1
            self.stats.drafts += len(drafts)
            src = self.stats.source(name)
            src.verifies += 1
            src.drafts += len(drafts)
            for j in range(len(drafts)):
                src.proposed_at[j] += 1
            src_obj = next(s for s in self.sources if s.name == name)
            probs = getattr(src_obj, "last_probs", None)
            probs = probs[:len(drafts)] if probs and len(probs) >= len(drafts) else None
            self.pending = _Pending(name, start, drafts, out.logits, probs)
        else:
            self.stats.plain_steps += 1
        return out.logits[0]
