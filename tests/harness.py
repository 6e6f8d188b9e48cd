"""The drafts-vs-no-drafts harness: runs arms in-process and compares them bit for bit."""

from __future__ import annotations

from dataclasses import replace

import torch

from verispec.config import DraftSettings, RunSettings
from verispec.sampling import SamplingParams

GREEDY = SamplingParams()
SAMPLED = SamplingParams(temperature=0.9, top_p=0.95, seed=1234)


def plain_settings(max_tokens=40, sampling=GREEDY, **kw) -> RunSettings:
    return RunSettings(max_tokens=max_tokens, sampling=sampling, drafts=DraftSettings(lookup=False, mtp="off"), **kw)


def arm_settings(base: RunSettings, **drafts) -> RunSettings:
    d = dict(lookup=True, mtp="off", gate=False)
    d.update(drafts)
    return replace(base, drafts=DraftSettings(**d))


def run(eng, prompt, settings, **kw):
    return eng.generate(list(prompt), settings, keep_logits=True, **kw)


def assert_same(plain, arm, what=""):
    assert arm.ids == plain.ids, f"{what}: ids differ"
    assert arm.text == plain.text, f"{what}: text differs"
    assert len(arm.logits) == len(plain.logits)
    for i, (a, b) in enumerate(zip(arm.logits, plain.logits)):
        assert torch.equal(a, b), f"{what}: logits differ at decoded position {i}"


def simulate_forced(ref: list[int], prompt_len: int, context: int, k: int, mode: str, vocab: int,
                    last_fed: int | None = None) -> dict:
    """Predict the counts of a forced run with the gate off. Written from the verify loop's
    rules (DESIGN.md sections 2-3), sharing no code with the decoder.

    ref: the plain run's ids (N tokens). A pick is fed (its logits asked for) unless it is
    the last one; `last_fed` overrides which pick index ends the run (end-of-sequence)."""
    n = len(ref)
    end = n - 1 if last_fed is None else last_fed   # index of the pick that is never fed
    forwards = tokens = accepted = drafts = verifies = 0
    mid = False
    i = 0
    while i < end:
        kv = prompt_len + i
        room = context - kv - 1
        d = ref[i + 1:i + 1 + min(k, room)]
        forwards += 1
        tokens += 1
        if not d:
            i += 1
            continue
        wrong = _wrong_rows(mode, verifies, len(d))
        verifies += 1
        drafts += len(d)
        sent = [(t + 1) % vocab if (j + 1) in wrong else t for j, t in enumerate(d)]
        t, j = i + 1, 0
        while j < len(sent) and t < end and ref[t] == sent[j]:
            accepted += 1
            tokens += 1
            j += 1
            t += 1
        if j < len(sent) and t >= end:
            mid = True
        i = t
    return {"forwards": forwards, "tokens": tokens, "accepted": accepted, "drafts": drafts,
            "verifies": verifies, "ended_mid_verify": mid}


def _wrong_rows(mode: str, v: int, k: int) -> set[int]:
    if mode == "accept":
        return set()
    if mode == "reject":
        return set(range(1, k + 1))
    if mode == "mixed":
        return {1} if v % 2 == 1 else set()
    if mode == "cycle":
        return {v % (k + 1) + 1}
    if mode.startswith("row"):
        return {int(mode[3:])}
    raise ValueError(mode)


def counts(stats: dict) -> dict:
    return {k: stats[k] for k in ("forwards", "tokens", "accepted", "drafts", "verifies", "ended_mid_verify")}


def fake_timed(eng, dec, row_cost: float = 0.0, t1: float = 0.010):
    """Give `dec` a fake clock that only moves inside the model's forward: a forward of n rows
    takes t1 * (1 + row_cost * (n - 1)) seconds (row_cost 0: extra rows are free)."""
    t = {"now": 0.0}
    forward = eng.model.forward

    def timed(ids, state, **k):
        out = forward(ids, state, **k)
        t["now"] += t1 * (1 + row_cost * (len(ids) - 1))
        return out

    class _Timed:
        args = eng.model.args

    m = _Timed()
    m.forward = timed
    dec.model = m
    dec.clock = lambda: t["now"]
    for s in dec.sources:
        if hasattr(s, "clock"):
            s.clock = dec.clock
    return dec
