"""The gate: how many drafts a verify carries, from measured costs and measured acceptance.

Pure Python, no engine state and no clock: the decoder hands it seconds. The rules are
reference/gate-rules.md (the original's public spec_draft.h plus the seed's per-step
confidence bins); docs/gate.md lists them as implemented and marks our own choices.

Per source ("mtp", "lookup") it keeps the running acceptance a_j of draft j given the drafts
before it stood, a per-draft cost d for sources whose deeper drafts cost time, and ten
confidence bins; globally it keeps T(n), the seconds of an n-row forward, and rho, the
cost of each extra row in units of T(1) for row counts not measured yet. It picks

    value(k) = E(k) / cost(k),   E(k) = 1 + a_1 + a_1 a_2 + ... + a_1 ... a_k
    cost(k)  = rows_cost(k + 1) + (k - 1) d / T(1)

and drafts only when some value(k) > 1 (strict: ties go to the shallower depth).

Probes. Every 16 picks a source tries one draft deeper than its best (every 4 while the
probed row count has under 3 timing samples), so an estimate it stopped feeding recovers.
Our rule for a declined source (best 0; the seed's current rule probes less than the public
one, gate-rules.md "Probes on free text"): a probe's expected cost, in plain steps beyond the
plain step it replaces, is c = rows_cost(2) - 1 - a, and the source waits
clamp(ceil(c / probe_budget), 4, 256) picks between probes, so the expected cost of its
probes stays near probe_budget (0.8%) of the picks. a is a_1 (or the recent probes'
acceptance, memory 4, when higher), except right after a probe whose draft stood, when the
next probe is priced as if it will stand again (a = 1). So a
never-accepted source (a_1 -> 0) probes every (rows_cost(2) - 1) / 0.008 picks (63 when
two rows cost 1.5 plain steps), a nearly paying one every 4, and once a probe stands the
source probes every 4 picks until a_1 has climbed enough to draft on its own. While two
rows are barely measured, a declined source still probes every 4 picks (public rule).
A declined source whose proposals the decoder follows (free observations, below) needs no
probe to learn its acceptance: it probes only every 256 picks, to keep T(2) fresh. Probes also
go shallower (ours): first to any depth below the current one whose row count is barely
measured, and, at the deepest depth proposed, one below it instead of no probe at all, so
no row count the gate may return to keeps a stale time.

Free observations (our choice; docs/gate.md): drafts no verify carried are compared with the
tokens picked anyway and move a_j like a verify, with memory 32 instead of 16, so an
estimate fed at every token does not cross a near break-even by chance every few picks.

The machine's speed (our choice 15; docs/gate.md): a forward of a measured row count first
moves a factor `speed` (memory 3) by its time over T(rows), then every forward moves T(rows)
by its time over that speed, and the speed is pulled 1/128 of the way back to 1; so T(n) is
each row count at the machine's usual speed and a slow phase spent at one row count does not
make the others look cheap. With constant timings the speed stays 1: the public rule.

Across runs (our choice; docs/gate.md "Across runs"). What the gate measures of the machine
and model -- T(n), rho, each source's per-draft cost and the multi-row forwards since the last
plain step -- lives in a GateTimings that `next_run()` shares with the next run's gate (an
Engine keeps the chain). Acceptance belongs to the prompt: the next run starts each estimate
(and each p-bin) at this run's value, but worth no more than a prior (two verifies), so a new
prompt moves it as fast as it moves a prior; the counts and the probe state start afresh.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class GateConfig:
    enabled: bool = True                 # False: every proposal drafted in full (tests)
    max_drafts: int = 8                  # acceptance positions tracked; forwards of up to 9 rows
    probe_every: int = 16                # picks between probes
    probe_every_new: int = 4             # ... while the probed row count is barely measured
    new_samples: int = 3                 # "barely measured" = fewer timing samples than this
    refresh: int = 64                    # multi-row forwards before a plain step is forced
    rho0: float = 0.5
    rho_max: float = 4.0
    acceptance_memory: int = 16
    timing_memory: int = 8
    speed_memory: int = 3                # the machine's current slowness (0: off, the public rule)
    speed_anchor: int = 128              # forwards over which the speed returns to 1
    prior_weight: int = 2                # a prior is worth this many verifies
    priors: tuple[tuple[str, tuple[float, ...]], ...] = (
        ("mtp", (0.8, 0.6, 0.5)),        # the last value repeats for deeper positions
        ("lookup", (0.5,)),
    )
    p_bins: int = 10
    p_memory: int = 16
    p_prior_weight: int = 2
    probe_budget: float = 0.008          # expected probe cost of a declined source, plain steps per pick
    probe_max_interval: int = 256        # a declined source probes at least this often
    probe_memory: int = 4                # recent probes' acceptance, for pricing the next probe
    observe: bool = True                 # feed free observations (observe()) into the estimates
    observe_memory: int = 32             # memory of the acceptance updates observations make

    def __post_init__(self):
        if self.max_drafts < 1 or self.probe_every < 1 or self.probe_every_new < 1:
            raise ValueError("max_drafts and probe intervals must be >= 1")
        if min(self.acceptance_memory, self.observe_memory, self.timing_memory, self.p_memory) < 1:
            raise ValueError("memories must be >= 1")
        if self.speed_anchor < 1:
            raise ValueError(f"speed_anchor must be >= 1, got {self.speed_anchor}")
        if self.speed_memory < 0 or self.speed_memory == 1:
            # memory 1 would put a sample's whole surprise on the speed: T(n) would never move
            raise ValueError(f"speed_memory must be 0 (off) or >= 2, got {self.speed_memory}")
        if not self.probe_budget > 0:
            raise ValueError(f"probe_budget must be > 0, got {self.probe_budget}")
        for name, prior in self.priors:
            if not prior or not all(0.0 <= a <= 1.0 for a in prior):
                raise ValueError(f"prior of {name!r} must be non-empty values in [0, 1]")


class _Avg:
    """The one running-average rule: the first `mem` samples average exactly, then an EMA
    with alpha 1/mem. With weight 0 the first sample sets the value. Where two memories feed
    one average (acceptance: verifies 16, observations 32), a step is never smaller than
    1/mem of the update making it."""

    __slots__ = ("x", "w", "samples")

    def __init__(self, x: float = 0.0, w: int = 0):
        self.x, self.w, self.samples = x, w, 0

    def update(self, v: float, mem: int) -> None:
        if self.w < mem:
            self.w += 1
        self.x += (v - self.x) / min(self.w, mem)
        self.samples += 1


@dataclass
class _Source:
    acc: list[_Avg]                      # a_j by draft position
    bins: list[_Avg]                     # acceptance given the draft's own p, by bin of p
    draft: _Avg = field(default_factory=_Avg)   # seconds per draft past the first (the shared timings' own)
    proposed: list[int] = field(default_factory=list)
    hit: list[int] = field(default_factory=list)
    verifies: int = 0
    probes: int = 0
    declined: int = 0
    trimmed: int = 0                     # drafts pick_p removed
    observed: list[int] = field(default_factory=list)      # free observations by position
    observed_hit: list[int] = field(default_factory=list)
    since_probe: int = 0                 # the probe clock: picks since the last probe slot
    probe_pending: bool = False          # the last pick lifted a plain step to one draft
    last_probe: bool = False             # the last pick was a probe (any depth)
    probe_stood: bool = False            # ... and that probe's draft stood
    probe_acc: _Avg = field(default_factory=_Avg)   # recent probes' first drafts, memory 4
    watched: bool = False                # its first draft was observed since its last pick


def _expected(a: Sequence[float]) -> float:
    """E(k) = 1 + a_1 + a_1 a_2 + ... for k = len(a)."""
    e, run = 1.0, 1.0
    for x in a:
        run *= x
        e += run
    return e


class GateTimings:
    """What the gate measures of the machine and model, not of a prompt: T(n) by row count
    (index n; 0 unused) at the machine's usual speed, the machine's current slowness `speed`
    (a factor on every T(n)), rho, each source's seconds per draft past the first, and the
    multi-row forwards since the last plain step (so the refresh plain step also comes in a
    chain of short runs). Gates of successive runs share one (Gate.next_run)."""

    __slots__ = ("t", "speed", "rho", "draft", "since_plain")

    def __init__(self, config: GateConfig):
        self.t = [_Avg() for _ in range(config.max_drafts + 2)]
        self.speed = _Avg(1.0, 1)
        self.rho = _Avg(config.rho0, 1)
        self.draft: dict[str, _Avg] = {}
        self.since_plain = 0


class Gate:
    def __init__(self, config: GateConfig | None = None, *, timings: GateTimings | None = None):
        self.config = c = config or GateConfig()
        self._max_rows = c.max_drafts + 1
        if timings is None:
            timings = GateTimings(c)
        elif len(timings.t) != self._max_rows + 1:
            raise ValueError(f"timings hold {len(timings.t) - 1} row counts, the config {self._max_rows}")
        self.timings = timings
        self._t = timings.t                  # T(n), index n = rows; 0 unused (shared, never rebound)
        self._rho = timings.rho
        self._sources: dict[str, _Source] = {}
        for name, prior in c.priors:
            acc = [_Avg(prior[min(j, len(prior) - 1)], c.prior_weight) for j in range(c.max_drafts)]
            bins = [_Avg((b + 0.5) / c.p_bins, c.p_prior_weight) for b in range(c.p_bins)]
            self._sources[name] = _Source(acc=acc, bins=bins, proposed=[0] * c.max_drafts,
                                          hit=[0] * c.max_drafts, observed=[0] * c.max_drafts,
                                          observed_hit=[0] * c.max_drafts,
                                          draft=timings.draft.setdefault(name, _Avg()))

    @property
    def _since_plain(self) -> int:
        return self.timings.since_plain

    @_since_plain.setter
    def _since_plain(self, n: int) -> None:
        self.timings.since_plain = n

    def next_run(self) -> "Gate":
        """The gate of the next run on the same machine and model (our choice): it shares this
        gate's timings (T(n), rho, draft costs, the refresh counter), and each acceptance
        estimate and p-bin starts at this gate's value with the weight of a prior at most
        (prior_weight, p_prior_weight), so a different prompt moves it as fast as it moves a
        prior. Counts and probe state start afresh."""
        c = self.config
        nxt = Gate(c, timings=self.timings)
        for name, s in self._sources.items():
            n = nxt._sources[name]
            n.acc = [_Avg(a.x, min(a.w, c.prior_weight)) for a in s.acc]
            n.bins = [_Avg(b.x, min(b.w, c.p_prior_weight)) for b in s.bins]
        return nxt

    # --- measurements -----------------------------------------------------------------

    def forward(self, rows: int, seconds: float) -> None:
        """After every decode forward (plain steps and verifies; never a prefill)."""
        if not (1 <= rows <= self._max_rows) or not seconds > 0:
            return
        c = self.config
        t = self._t[rows]
        speed = self.timings.speed
        if c.speed_memory:
            # the machine's slowness, fed by every forward, takes most of a sample's surprise
            # first, so a slow minute spent at one row count does not make the row counts
            # not used meanwhile look cheap (docs/gate.md, our choice 15). Only a measured row
            # count says anything of the machine: a first forward is often slow for its own
            # reasons. The pull toward 1 keeps the split between the speed and T(n) from
            # wandering (every T(n) would drift with it while the gate uses one row count).
            if t.samples >= c.new_samples:
                speed.update(seconds / t.x, c.speed_memory)
            speed.x += (1.0 - speed.x) / c.speed_anchor
            seconds = seconds / speed.x
        t.update(seconds, c.timing_memory)
        if rows == 1:
            self._since_plain = 0
            return
        self._since_plain += 1
        t1 = self._t[1]
        if t1.samples:
            r = (seconds / t1.x - 1.0) / (rows - 1)
            self._rho.update(min(max(r, 0.0), c.rho_max), c.timing_memory)

    def draft_cost(self, source: str, seconds: float) -> None:
        """Seconds one extra draft (past the first) of `source` took to write."""
        if not seconds >= 0:
            raise ValueError(f"draft cost must be >= 0 seconds, got {seconds}")
        if self.config.speed_memory:
            seconds /= self.timings.speed.x      # at the machine's usual speed, as T(n) (choice 15)
        self._source(source).draft.update(seconds, self.config.timing_memory)

    def result(self, source: str, judged: int, accepted: int,
               probs: Sequence[float] | None = None) -> None:
        """A verify of `source` settled: `judged` drafts were compared, the first `accepted` stood.

        judged = accepted + 1 after a rejection; judged = accepted when every draft stood or
        the turn ended mid-verify. `probs`: the carried drafts' own probabilities, when the
        source gave them (then each judged draft also feeds its p-bin).
        """
        src = self._source(source)
        if judged < 1:
            return
        c = self.config
        judged = min(judged, c.max_drafts)
        accepted = max(0, min(accepted, judged))
        if probs is not None and len(probs) < judged:
            raise ValueError(f"{judged} drafts judged but only {len(probs)} probabilities given")
        bins = [self._bin(p) for p in probs[:judged]] if probs is not None else None   # validate first
        src.verifies += 1
        for j in range(judged):
            hit = j < accepted
            src.proposed[j] += 1
            src.hit[j] += hit
            src.acc[j].update(float(hit), c.acceptance_memory)
            if bins is not None:
                src.bins[bins[j]].update(float(hit), c.p_memory)
        if src.probe_pending:
            src.probe_stood = accepted > 0
            src.probe_acc.update(float(accepted > 0), c.probe_memory)
            src.probe_pending = False

    def observe(self, source: str, position: int, stood: bool) -> None:
        """A free observation (our choice; docs/gate.md "Free observations"): a draft of `source`
        at 0-based `position` that no verify carried -- trimmed by pick, declined, or outbid --
        but whose every earlier draft stood, was compared with the token actually picked there.
        That is the event a_{position+1} estimates (draft j stands given drafts 1..j-1 stood), seen
        without a forward, so it moves a_j by the same rule as a verify but with memory
        `observe_memory` (32; a verify still moves it by at least 1/16); verify counts, p-bins
        and the probe clock are untouched. An observed first draft marks the source as watched
        until its next pick (then, declined, it probes for timing only)."""
        src = self._source(source)
        c = self.config
        if not c.observe or not 0 <= position < c.max_drafts:
            return
        src.observed[position] += 1
        src.observed_hit[position] += stood
        src.acc[position].update(float(stood), c.observe_memory)
        src.watched |= position == 0

    # --- prices -----------------------------------------------------------------------

    def rows_cost(self, n: int) -> float:
        """Seconds of an n-row forward in units of T(1)."""
        if n <= 1:
            return 1.0
        t1 = self._t[1]
        if n <= self._max_rows and t1.samples and self._t[n].samples:
            return self._t[n].x / t1.x
        return 1.0 + (n - 1) * self._rho.x

    def value(self, source: str, k: int) -> float:
        """Expected tokens per plain-step time of a verify carrying k drafts (1.0 for k = 0)."""
        src = self._source(source)
        self._check_depth(k)
        if k == 0:
            return 1.0
        cost = self.rows_cost(k + 1)
        t1 = self._t[1]
        if k > 1 and src.draft.samples and t1.samples:
            cost += (k - 1) * src.draft.x / t1.x
        return _expected([a.x for a in src.acc[:k]]) / cost

    def _value_p(self, a: Sequence[float]) -> float:
        """value of drafts already written: their verify only, no draft cost."""
        return _expected(a) / self.rows_cost(len(a) + 1)

    # --- decisions --------------------------------------------------------------------

    def probing(self, source: str) -> bool:
        """The last pick of `source` went one draft deeper than its value alone would:
        a probe, which the decoder carries even when another source is valued higher
        (else a source that another one outbids never gets measured)."""
        return self._source(source).last_probe

    def plain_due(self) -> bool:
        """True when the next verify must be a plain step (refresh after 64 multi-row forwards)."""
        return self.config.enabled and self._since_plain >= self.config.refresh

    def pick(self, source: str, max_k: int) -> int:
        """How many of `max_k` proposed drafts of `source` to carry (0 = plain step)."""
        src = self._source(source)
        c = self.config
        max_k = min(max_k, c.max_drafts)
        if max_k <= 0:
            return 0
        if not c.enabled:
            return max_k
        if self._since_plain >= c.refresh:
            src.declined += 1               # the probe clock does not advance
            return 0
        best, best_value = 0, 1.0
        for k in range(1, max_k + 1):
            v = self.value(source, k)
            if v > best_value:
                best, best_value = k, v
        if best:
            src.probe_stood = False         # drafting on its own again
        interval = self._probe_interval(src, best, max_k)
        src.watched = False
        src.probe_pending = False
        src.last_probe = False
        src.since_probe += 1
        if src.since_probe >= interval:
            src.since_probe = 0
            below = self._unmeasured_below(best)
            if below:
                src.last_probe = True
                best = below
                src.probes += 1
            elif best < max_k:
                src.probe_pending = best == 0
                src.last_probe = True
                best += 1
                src.probes += 1
            elif best >= 2:
                # at the deepest proposed depth the public rule has no probe to make, and the row
                # count one below would never be timed again: one slow sample of it would keep
                # the gate here for good (docs/gate.md, our choice 14)
                src.last_probe = True
                best -= 1
                src.probes += 1
        if best == 0:
            src.declined += 1
        return best

    def _unmeasured_below(self, best: int) -> int:
        """The deepest k < best whose row count T(k + 1) is barely measured (0: none). A gate
        that went deeper in one step -- observations can make deep drafts look good at once --
        priced those depths by rho, a straight line through the row counts measured, which a
        cost curve with a cliff makes wrong; probes one deeper never come back to measure them."""
        for k in range(best - 1, 0, -1):
            if self._t[k + 1].samples < self.config.new_samples:
                return k
        return 0

    def _probe_interval(self, src: _Source, best: int, max_k: int) -> int:
        c = self.config
        if best < max_k and self._t[best + 2].samples < c.new_samples:
            return c.probe_every_new
        if self._unmeasured_below(best):
            return c.probe_every_new
        if best > 0:
            return c.probe_every
        if src.watched:                  # observations feed a_1 at every pick: probe for timing only
            return c.probe_max_interval
        return self.declined_probe_interval(src)

    def declined_probe_interval(self, source: str | _Source) -> int:
        """Picks between probes of a declined source: its expected probe cost over the budget."""
        src = source if isinstance(source, _Source) else self._source(source)
        c = self.config
        if src.probe_stood:
            a = 1.0                            # priced as if it stands again
        else:
            a = max(src.acc[0].x, src.probe_acc.x) if src.probe_acc.samples else src.acc[0].x
        cost = self.rows_cost(2) - 1.0 - a     # plain steps a 1-draft probe costs beyond a plain step
        interval = math.ceil(cost / c.probe_budget - 1e-9)
        return min(max(interval, c.probe_every_new), c.probe_max_interval)

    def pick_p(self, source: str, probs: Sequence[float]) -> int:
        """How many of the drafts already written (p_j = each one's own probability) to carry."""
        src = self._source(source)
        c = self.config
        k = min(len(probs), c.max_drafts)
        if k == 0:
            return 0
        if not c.enabled:
            return k
        if self._since_plain >= c.refresh:
            src.declined += 1
            return 0
        a = [src.bins[self._bin(p)].x for p in probs[:k]]
        best, best_value = 0, 1.0
        for kk in range(1, k + 1):
            v = self._value_p(a[:kk])
            if v > best_value:
                best, best_value = kk, v
        src.trimmed += k - best
        return best

    def deeper_p(self, source: str, probs: Sequence[float]) -> bool:
        """Write draft n + 1 after the n drafts whose own probabilities are `probs`?"""
        src = self._source(source)
        c = self.config
        n = len(probs)
        if n >= c.max_drafts:
            return False
        if not c.enabled:
            return True
        if self._since_plain >= c.refresh:
            return False                     # the next step is a plain one whatever is written
        a = [src.bins[self._bin(p)].x for p in probs]
        a.append(max(b.x for b in src.bins))   # the new draft as likely as the best bin
        vals = [self._value_p(a[:k]) for k in range(n + 2)]
        no_shorter_better = all(vals[n] >= vals[k] for k in range(n))
        return no_shorter_better and vals[n + 1] > 1.0 and vals[n + 1] > vals[n]

    # --- reports ----------------------------------------------------------------------

    def describe(self) -> str:
        """One report line of what was measured, e.g.
        [verispec spec gate] T(1) 12.4 ms | rows 2: 1.31, 3: 1.58 | rho 0.29 | draft 0.8 ms | acceptance 0.96 0.81
        """
        parts = ["[verispec spec gate]"]
        t1 = self._t[1]
        if t1.samples:
            parts.append(f"T(1) {t1.x * self.timings.speed.x * 1e3:.1f} ms")
            rows = [f"{n}: {self._t[n].x / t1.x:.2f}"
                    for n in range(2, self._max_rows + 1) if self._t[n].samples]
            if rows:
                parts.append("rows " + ", ".join(rows))
        if self._rho.samples:
            parts.append(f"rho {self._rho.x:.2f}")
        drafts = [(name, s.draft.x * self.timings.speed.x) for name, s in self._sources.items() if s.draft.samples]
        for name, d in drafts:
            label = f"draft {name}" if len(drafts) > 1 else "draft"
            parts.append(f"{label} {d * 1e3:.1f} ms")
        judged = [(name, s) for name, s in self._sources.items() if s.verifies]
        for name, s in judged:
            label = f"acceptance {name}" if len(judged) > 1 else "acceptance"
            est = " ".join(f"{s.acc[j].x:.2f}" for j in range(self.config.max_drafts) if s.proposed[j])
            parts.append(f"{label} {est}")
        return parts[0] + (" " + " | ".join(parts[1:]) if len(parts) > 1 else "")

    def stats(self) -> dict:
        return {
            "enabled": self.config.enabled,
            # at the machine's current speed
            "T": {n: self._t[n].x * self.timings.speed.x for n in range(1, self._max_rows + 1) if self._t[n].samples},
            "speed": self.timings.speed.x,
            "T_samples": {n: self._t[n].samples for n in range(1, self._max_rows + 1) if self._t[n].samples},
            "rho": self._rho.x,
            "rho_samples": self._rho.samples,
            "since_plain": self._since_plain,
            "sources": {name: {
                "verifies": s.verifies, "probes": s.probes, "declined": s.declined,
                "trimmed": s.trimmed,
                "proposed": list(s.proposed), "hit": list(s.hit),
                "observed": list(s.observed), "observed_hit": list(s.observed_hit),
                "acceptance": [a.x for a in s.acc],
                "p_bins": [b.x for b in s.bins],
                "draft_cost": s.draft.x * self.timings.speed.x if s.draft.samples else None,
                "probe_stood": s.probe_stood,
            } for name, s in self._sources.items()},
        }

    # --- helpers ----------------------------------------------------------------------

    def _source(self, source: str) -> _Source:
        try:
            return self._sources[source]
        except KeyError:
            raise ValueError(f"unknown draft source {source!r} (known: {', '.join(self._sources)})") from None

    def _check_depth(self, k: int) -> None:
        if not 0 <= k <= self.config.max_drafts:
            raise ValueError(f"depth {k} outside 0..{self.config.max_drafts}")

    def _bin(self, p: float) -> int:
        if not 0.0 <= p <= 1.0:
            if not -1e-6 <= p <= 1.0 + 1e-6:      # NaN fails this too
                raise ValueError(f"draft probability {p} outside [0, 1]")
            p = min(max(p, 0.0), 1.0)              # rounding just outside [0, 1]
        return min(int(p * self.config.p_bins), self.config.p_bins - 1)
