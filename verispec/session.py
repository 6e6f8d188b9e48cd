"""A served conversation: one model, one decoding state, prefix reuse and pins.

A request whose tokens strictly extend what the state has fed (also a state a speculating
turn left, one that ended mid-verify included: `Decoder.finish` made it plain decoding's)
feeds only the new tokens. Otherwise the deepest pin that is a strict prefix of the
request is restored, or the state starts empty. A pin is a snapshot taken after a
request's prompt: its ids, the state (KV up to its length, recurrent and conv state), the
MTP head's KV and pending row; an LRU pool keeps `pin_slots` of them.
"""

from __future__ import annotations

import sys
import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from .config import DraftSettings, RunSettings
from .engine import Engine
from .errors import UsageError
from .report import report_lines
from .sampling import logprob_of, top_logprobs


@dataclass
class LogprobEntry:
    token: int
    logprob: float
    top: list[tuple[int, float]]


@dataclass
class TurnResult:
    ids: list[int]
    text: str
    finish_reason: str             # "stop" | "length" | "cancelled"
    stats: dict
    logprobs: list[LogprobEntry] | None
    report: list[str] = field(default_factory=list)


@dataclass
class Pin:
    ids: list[int]
    state: dict                    # State.snapshot()
    head: tuple | None             # (k, v, pending) of the MTP drafter
    asked: bool = False            # taken for a request with "pin": true: automatic pins are evicted first


class Session:
    def __init__(self, engine: Engine, drafts: DraftSettings, *, context: int, pin_slots: int = 4,
                 prefill_batch: bool | None = None, clock: Callable[[], float] = time.perf_counter):
        if context < 2:
            raise UsageError(f"--context must be >= 2, got {context}")
        self.engine = engine
        self.drafts = drafts
        self.context = min(context, engine.args.max_position_embeddings)
        self.pin_slots = pin_slots
        # prefill_batch off: every prompt row runs the exact path, so a state reached by prefix reuse or a
        # pin restore is bit for bit a fresh run's (batched prefill sums in other orders than the rows
        # a reused state was fed as), and a turn's logits do not depend on the server's history
        base = RunSettings(max_tokens=1, drafts=drafts, context=self.context, prefill_batch=prefill_batch)
        self.decoder = engine.new_decoder(base, [0], clock=clock)
        self.pins: OrderedDict[tuple, Pin] = OrderedDict()
        self.metrics: dict = {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0, "forwards": 0,
                              "drafts_proposed": {}, "drafts_accepted": {}, "verifies": {},
                              "prefix_reuses": 0, "pin_restores": 0, "reused_tokens": 0, "cancelled": 0}

    # ----- state management -----
    @property
    def _mtp(self):
        return next((s for s in self.decoder.sources if s.name == "mtp" and hasattr(s, "cache")), None)

    def _snapshot(self, ids: list[int]) -> Pin:
        mtp = self._mtp
        head = None
        if mtp is not None:
            mtp.flush_deferred()          # deferred absorbs into the cache before it is saved
            n = len(ids)
            head = (mtp.cache.k[0][:, :n].clone(), mtp.cache.v[0][:, :n].clone(),
                    None if mtp.pending is None else mtp.pending.clone())
        return Pin(list(ids), self.decoder.state.snapshot(), head)

    def _restore(self, pin: Pin) -> None:
        self.decoder.state.restore(pin.state)
        mtp = self._mtp
        if mtp is not None and pin.head is not None:
            k, v, pending = pin.head
            mtp.cache.k[0][:, :k.shape[1]] = k
            mtp.cache.v[0][:, :v.shape[1]] = v
            mtp.pending = None if pending is None else pending.clone()
            mtp.drop_deferred()

    def _reset(self) -> None:
        st = self.decoder.state
        st.kv_len = 0
        st.tokens.clear()
        for t in st.recurrent.conv + st.recurrent.rec:
            t.zero_()
        mtp = self._mtp
        if mtp is not None:
            mtp.reset()

    def _prepare(self, prompt: list[int]) -> tuple[int, bool]:
        """Bring the state to the deepest strict prefix of `prompt` it can; returns (reused, pin restored)."""
        cached = self.decoder.state.tokens
        live = len(cached) if len(cached) < len(prompt) and prompt[:len(cached)] == cached else 0
        best = None
        for key, pin in self.pins.items():
            n = len(pin.ids)
            if live < n < len(prompt) and prompt[:n] == pin.ids and (best is None or n > len(best.ids)):
                best = pin
        if best is not None:
            self.pins.move_to_end(tuple(best.ids))
            self._restore(best)
            return len(best.ids), True
        if live == 0:
            self._reset()
        return live, False

    def _pin(self, ids: list[int], asked: bool) -> None:
        key = tuple(ids)
        if key in self.pins:
            self.pins.move_to_end(key)
            self.pins[key].asked |= asked
            return
        pin = self._snapshot(ids)
        pin.asked = asked
        self.pins[key] = pin
        while len(self.pins) > self.pin_slots:
            # least recently used first, automatic pins before asked-for ones
            victim = next((k for k, p in self.pins.items() if not p.asked), next(iter(self.pins)))
            del self.pins[victim]

    # ----- a turn -----
    def generate(self, prompt: list[int], settings: RunSettings, *, on_token=None, pin: bool = False,
                 logprobs: int | None = None) -> TurnResult:
        eng = self.engine
        if not prompt:
            raise UsageError("the prompt is empty")
        eng.check_ids(prompt)
        if len(prompt) + settings.max_tokens > self.context:
            raise UsageError(f"prompt ({len(prompt)} tokens) plus max_tokens {settings.max_tokens} exceeds the "
                             f"context ({self.context} tokens)")
        reused, restored = self._prepare(prompt)
        entries: list[LogprobEntry] | None = [] if logprobs is not None else None
        pinned = {"done": False}

        def each(tok: int, logits: torch.Tensor):
            if not pinned["done"] and self.pin_slots > 0:
                # after the prompt, before any decode row: the state is exactly the prompt's
                self._pin(prompt, pin)
                pinned["done"] = True
            entry = None
            if entries is not None:
                entry = LogprobEntry(tok, logprob_of(logits, tok), top_logprobs(logits, logprobs) if logprobs else [])
                entries.append(entry)
            if on_token is not None:
                return on_token(tok, entry)
            return None

        settings = replace(settings, drafts=self.drafts)
        res = eng.generate(prompt, settings, decoder=self.decoder, reuse=reused, on_token=each)
        stats = dict(res.stats, reused_tokens=reused, pin_restored=restored, pinned=pinned["done"])
        self._count(prompt, reused, restored, res)
        report = report_lines(stats, gate_on=self.drafts.gate)
        for line in report:
            print(line, file=sys.stderr)
        return TurnResult(res.ids, res.text, res.finish_reason, stats, entries, report)

    def _count(self, prompt, reused, restored, res) -> None:
        m, st = self.metrics, res.stats
        m["requests"] += 1
        m["prompt_tokens"] += len(prompt)
        m["completion_tokens"] += len(res.ids)
        m["forwards"] += st["forwards"]
        m["reused_tokens"] += reused
        m["prefix_reuses"] += int(reused > 0 and not restored)
        m["pin_restores"] += int(restored)
        m["cancelled"] += int(res.finish_reason == "cancelled")
        for name, s in st["by_source"].items():
            m["drafts_proposed"][name] = m["drafts_proposed"].get(name, 0) + s["drafts"]
            m["drafts_accepted"][name] = m["drafts_accepted"].get(name, 0) + s["accepted"]
            m["verifies"][name] = m["verifies"].get(name, 0) + s["verifies"]

    def save_usage(self) -> None:
        self.engine.save_usage()
