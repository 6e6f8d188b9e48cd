"""A small decode loop around the gate's public calls, for the simulation tests.

Synthetic: a forward of n rows takes cost(n) seconds, a source proposes `max_k` drafts at
every step, each draft stands with probability accept(step) given the ones before it did,
and a deeper draft (past the first) takes `draft_seconds` to write. It shares nothing with
the gate but its public calls (pick, forward, result, draft_cost, observe, stats).

With `observe`, the loop also does what the decoder does with free observations (docs/gate.md
"Free observations"): the drafts no verify carried -- a declined proposal from its first, a
verify's trimmed drafts when every carried one stood -- are compared with the tokens that come
anyway, position by position until the first miss, each outcome drawn from its own generator
(so the steps' own draws are those of the same seed without observations).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class SimRun:
    tokens: int = 0
    seconds: float = 0.0
    verify_seconds: float = 0.0        # forwards of 2+ rows, plus their drafts' writing time
    plain_equivalent: float = 0.0      # what plain steps would have taken for the verifies' tokens
    ks: list[int] = field(default_factory=list)         # drafts carried, per step
    own: list[bool] = field(default_factory=list)       # drafted by the gate's own choice (no probe)
    accepted: list[int] = field(default_factory=list)   # drafts that stood, per step

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds

    @property
    def probe_excess(self) -> float:
        """Time the verifies cost beyond plain steps for the same tokens, share of decode time."""
        return (self.verify_seconds - self.plain_equivalent) / self.seconds


def simulate(cost: Callable[[int], float], accept: Callable[[int], float], steps: int, *,
             gate=None, fixed: int | None = None, max_k: int = 5, seed: int = 0,
             source: str = "lookup", draft_seconds: float = 0.0, observe: bool = False,
             speed: Callable[[int], float] | None = None, first_slow: float = 0.0) -> SimRun:
    """Run `steps` decode steps with the gate picking the depth, or at a fixed depth.
    speed(step): the machine's slowness at that step, a factor on every forward's cost.
    first_slow: the first forward of each row count in the run is slower by a factor drawn
    from 1..1 + first_slow (a fresh decoder's first forwards of a row count were measured
    0-43% slower than the next ones, median ~10%: docs/gate.md choice 15)."""
    assert (gate is None) != (fixed is None)
    rng = random.Random(seed)
    seen = random.Random(seed + 1)
    first = random.Random(seed + 2)
    rows_seen: set[int] = set()
    run = SimRun()
    probes = gate.stats()["sources"][source]["probes"] if gate is not None else 0
    for step in range(steps):
        p = accept(step)
        if gate is not None:
            k = gate.pick(source, max_k)
            if k:                                # a probe always carries a draft
                before, probes = probes, gate.stats()["sources"][source]["probes"]
                run.own.append(probes == before)
            else:
                run.own.append(False)
        else:
            k = min(fixed, max_k)
            run.own.append(k > 0)
        m = 0
        while m < k and rng.random() < p:
            m += 1
        slow = speed(step) if speed is not None else 1.0
        if first_slow and k + 1 not in rows_seen:
            rows_seen.add(k + 1)
            slow *= 1.0 + first.random() * first_slow
        seconds = cost(k + 1) * slow
        drafting = (k - 1) * draft_seconds if k > 1 else 0.0
        run.seconds += seconds + drafting
        run.tokens += m + 1
        if k:
            run.verify_seconds += seconds + drafting
            run.plain_equivalent += (m + 1) * cost(1) * slow
        if gate is not None:
            for _ in range(k - 1):
                if draft_seconds:
                    gate.draft_cost(source, draft_seconds)
            gate.forward(k + 1, seconds)
            if k:
                gate.result(source, m + 1 if m < k else k, m)
            pos = k if m == k else max_k         # the first draft no verify judged
            while observe and pos < max_k:
                stood = seen.random() < p
                gate.observe(source, pos, stood)
                if not stood:
                    break
                pos += 1
        run.ks.append(k)
        run.accepted.append(m)
    return run


def drifting_speed(steps: int, seed: int) -> list[float]:
    """A shared machine's slowness per step, as measured on this 2-CPU machine during issue 5's
    lockstep runs (docs/gate.md choice 15): single forwards 15-40% slow now and then, and slow
    phases of 8-30 forwards at 10-30% slower; around them a few percent of noise."""
    rng = random.Random(seed)
    out, phase, left = [], 1.0, 0
    for _ in range(steps):
        if left == 0 and rng.random() < 1 / 40:
            phase, left = rng.uniform(1.10, 1.30), rng.randint(8, 30)
        f = (phase if left else 1.0) * rng.uniform(0.97, 1.03)
        left = max(left - 1, 0)
        if rng.random() < 0.05:
            f *= rng.uniform(1.15, 1.40)
        out.append(f)
    return out


def linear_cost(t1: float, rho: float) -> Callable[[int], float]:
    return lambda n: t1 * (1.0 + (n - 1) * rho)


def table_cost(t1: float, units: dict[int, float]) -> Callable[[int], float]:
    """T(n) = t1 * units[n] (units[1] = 1)."""
    return lambda n: t1 * units[n]
