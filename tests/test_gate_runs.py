"""The gate across runs (Gate.next_run; Engine.keep_gate / last_gate): shared timings,
acceptance carried at a prior's weight, and what that buys a chain of short runs."""

from __future__ import annotations

import math

import pytest

from gate_sim import simulate, table_cost
from harness import arm_settings, assert_same, fake_timed, plain_settings, run
from model_fixtures import REPEAT_PROMPT, engine
from verispec.gate import Gate, GateConfig, GateTimings

MS = 1e-3


def src(gate: Gate, name: str) -> dict:
    return gate.stats()["sources"][name]


def timed(gate: Gate, units: dict[int, float], t1: float = 10 * MS, samples: int = 3) -> None:
    for _ in range(samples):
        gate.forward(1, t1)
    for n, u in sorted(units.items()):
        for _ in range(samples):
            gate.forward(n, t1 * u)
    gate.forward(1, t1)


def test_next_run_shares_the_timings():
    g1 = Gate()
    timed(g1, {2: 1.4, 3: 1.6})
    g1.draft_cost("mtp", 2 * MS)
    g2 = g1.next_run()
    assert g2.timings is g1.timings
    assert g2.stats()["T"] == g1.stats()["T"] and g2.stats()["T_samples"] == {1: 4, 2: 3, 3: 3}
    assert g2.rows_cost(3) == pytest.approx(1.6) and g2.stats()["rho"] == g1.stats()["rho"]
    assert src(g2, "mtp")["draft_cost"] == 2 * MS
    g2.forward(4, 20 * MS)                       # measured by the new run, seen by both
    assert g1.rows_cost(4) == g2.rows_cost(4) == pytest.approx(2.0)
    g2.draft_cost("mtp", 4 * MS)
    assert src(g1, "mtp")["draft_cost"] == pytest.approx(3 * MS)


def test_refresh_counts_multi_row_forwards_across_runs():
    """A chain of short runs that always draft must still take the refresh plain step."""
    g = Gate()
    timed(g, {n: 1.0 for n in range(2, 10)})
    for _ in range(40):
        g.forward(3, 10 * MS)
    g = g.next_run()
    assert not g.plain_due()
    for _ in range(24):
        g.forward(3, 10 * MS)
    assert g.plain_due() and g.pick("lookup", 5) == 0
    g.forward(1, 10 * MS)
    assert not g.plain_due()


def test_next_run_carries_acceptance_at_a_priors_weight():
    c = GateConfig()
    g1 = Gate(c)
    timed(g1, {2: 1.2, 3: 1.3})
    for _ in range(20):                          # lookup: the first draft always stands, the second never
        g1.result("lookup", 2, 1, probs=[0.95, 0.25])
    a1, a2 = src(g1, "lookup")["acceptance"][:2]
    assert a1 > 0.9 and a2 < 0.1
    g2 = g1.next_run()
    s = src(g2, "lookup")
    assert s["acceptance"][:2] == [a1, a2]
    assert s["acceptance"][2:] == [0.5] * 6      # positions never judged keep the prior
    assert src(g2, "mtp")["acceptance"] == [0.8, 0.6] + [0.5] * 6
    assert s["p_bins"] == src(g1, "lookup")["p_bins"]
    assert (s["verifies"], s["probes"], s["declined"], s["proposed"]) == (0, 0, 0, [0] * 8)
    assert g2.describe().count("acceptance") == 0    # nothing judged in this run yet
    # worth a prior (two verifies): one refusal moves a_1 a third of the way, one hit a_2 too
    g2.result("lookup", 2, 1, probs=[0.95, 0.25])
    g2.result("lookup", 1, 0, probs=[0.95])
    assert src(g2, "lookup")["acceptance"][0] == pytest.approx(a1 + (1.0 - a1) / 3 + (0.0 - (a1 + (1.0 - a1) / 3)) / 4)
    assert src(g2, "lookup")["acceptance"][1] == pytest.approx(a2 + (0.0 - a2) / 3)
    b = src(g1, "lookup")["p_bins"][9]
    assert src(g2, "lookup")["p_bins"][9] == pytest.approx(b + (1.0 - b) / 3 + (0.0 - (b + (1.0 - b) / 3)) / 4)
    # ... while the first run's estimates, worth 16 verifies, would have moved 1/16 of the way
    g1.result("lookup", 1, 0)
    assert src(g1, "lookup")["acceptance"][0] == pytest.approx(a1 - a1 / 16)


def test_next_run_weight_below_a_prior_stays():
    g1 = Gate()
    g1.result("lookup", 1, 0)                    # weight 3 -> capped at 2; an estimate at weight 2 stays 2
    g2 = g1.next_run()
    g2.result("lookup", 1, 1)
    x = 0.5 * 2 / 3
    assert src(g2, "lookup")["acceptance"][0] == pytest.approx(x + (1 - x) / 3)


def test_a_later_run_does_not_repeat_the_start_up_probes():
    """A fresh gate probes every 4 picks while two rows are barely measured; the next run of the
    same machine has them measured, so a never-accepted source waits its budgeted interval."""
    g1 = Gate()
    g1.forward(1, 10 * MS)
    picks1 = []
    for _ in range(64):
        k = g1.pick("lookup", 5)
        picks1.append(k)
        g1.forward(k + 1, 10 * MS * (1.4 if k else 1.0))
        if k:
            g1.result("lookup", 1, 0)
    assert picks1[3] == picks1[7] == picks1[11] == 1      # the public start-up probes
    g2 = g1.next_run()
    a1 = src(g2, "lookup")["acceptance"][0]
    interval = g2.declined_probe_interval("lookup")
    assert interval == math.ceil((0.4 - a1) / 0.008 - 1e-9) > 4
    picks2 = [g2.pick("lookup", 5) for _ in range(interval)]
    assert picks2 == [0] * (interval - 1) + [1]


def test_timings_must_match_the_config():
    with pytest.raises(ValueError):
        Gate(GateConfig(max_drafts=4), timings=GateTimings(GateConfig()))


COST = table_cost(0.045, {1: 1.0, 2: 1.391, 3: 1.553, 4: 1.961, 5: 2.264, 6: 2.674})   # the mid-size model, 1 thread


def _chain(p: float, carry: bool, runs: int = 10, picks: int = 40):
    """`runs` short runs (40 picks each, 40-160 tokens); runs 2.. counted."""
    gate, seconds, tokens, excess = None, 0.0, 0, 0.0
    for r in range(runs):
        gate = gate.next_run() if carry and gate is not None else Gate()
        run = simulate(COST, lambda s: p, picks, gate=gate, seed=r)
        if r:
            seconds, tokens = seconds + run.seconds, tokens + run.tokens
            excess += run.verify_seconds - run.plain_equivalent
    best = max(sum(simulate(COST, lambda s: p, picks, fixed=k, seed=r).rate for r in range(1, runs))
               for k in range(6)) / (runs - 1)
    return tokens / seconds / best, excess / seconds


def test_short_runs_never_accepted_probe_under_1pct_when_carried():
    ratio, excess = _chain(0.0, carry=True)
    assert excess < 0.01 and ratio > 0.99, (ratio, excess)
    ratio_fresh, excess_fresh = _chain(0.0, carry=False)
    assert excess_fresh > 0.02                   # what every run's start-up learning costs


def test_short_runs_at_high_acceptance_within_5pct_of_best_fixed_when_carried():
    ratio, _ = _chain(0.9, carry=True)
    assert ratio > 0.95, ratio
    ratio_fresh, _ = _chain(0.9, carry=False)
    assert ratio_fresh < ratio


# --- the engine's chain --------------------------------------------------------------------

def test_engine_chains_gated_decoders_only():
    eng = engine("qwen3_next", 2, vocab_size=40)     # its output repeats: lookup proposes (a cached engine)
    assert not eng.keep_gate
    try:
        _engine_chain(eng)
    finally:
        eng.keep_gate, eng.last_gate = False, None


def _engine_chain(eng):
    base = plain_settings(60)
    plain = run(eng, REPEAT_PROMPT, base)
    s = arm_settings(base, gate=True, lookup=True)
    fresh = [eng.new_decoder(s, REPEAT_PROMPT).gate for _ in range(2)]     # off by default: no chain
    assert fresh[1].timings is not fresh[0].timings and eng.last_gate is fresh[1]
    eng.keep_gate = True
    eng.last_gate = None
    dec1 = fake_timed(eng, eng.new_decoder(s, REPEAT_PROMPT), row_cost=0.2)
    assert eng.last_gate is dec1.gate
    assert_same(plain, eng.generate(REPEAT_PROMPT, s, decoder=dec1, keep_logits=True), "run 1")
    t1 = dec1.gate.stats()["T"]
    off = arm_settings(base, gate=False, lookup=True)
    dec_off = eng.new_decoder(off, REPEAT_PROMPT)     # gate off: its own gate, not chained
    assert dec_off.gate is not dec1.gate and dec_off.gate.timings is not dec1.gate.timings
    assert eng.last_gate is dec1.gate
    assert_same(plain, eng.generate(REPEAT_PROMPT, off, decoder=dec_off, keep_logits=True), "gate off")
    assert dec1.gate.stats()["T"] == t1
    dec2 = fake_timed(eng, eng.new_decoder(s, REPEAT_PROMPT), row_cost=0.2)
    assert dec2.gate is not dec1.gate and dec2.gate.timings is dec1.gate.timings
    assert src(dec2.gate, "lookup")["acceptance"][0] == src(dec1.gate, "lookup")["acceptance"][0]
    arm = eng.generate(REPEAT_PROMPT, s, decoder=dec2, keep_logits=True)
    assert_same(plain, arm, "run 2")
    assert arm.stats["gate"]["T_samples"][1] > dec1.stats.forwards - dec1.stats.verifies
