"""The gate on synthetic timings and outcomes (no model, no clock), then in a simulated decode loop."""

from __future__ import annotations

import copy
import math
import random

import pytest

from gate_sim import linear_cost, simulate, table_cost
from verispec.gate import Gate, GateConfig

MS = 1e-3


def timed(gate: Gate, units: dict[int, float], t1: float = 10 * MS, samples: int = 3) -> None:
    """Feed `samples` forwards of each row count n taking t1 * units[n] seconds (plain first)."""
    for _ in range(samples):
        gate.forward(1, t1)
    for n, u in sorted(units.items()):
        if n > 1:
            for _ in range(samples):
                gate.forward(n, t1 * u)
    gate.forward(1, t1)          # leave the since-plain counter at 0


def E(a):
    e, run = 1.0, 1.0
    for x in a:
        run *= x
        e += run
    return e


def src(gate: Gate, name: str) -> dict:
    return gate.stats()["sources"][name]


# --- the running-average rule ------------------------------------------------------------

# The public rule: T(n) a plain running average (our choice 15, the machine's speed, off).
PUBLIC_TIMING = GateConfig(speed_memory=0)


def test_timing_first_sample_exact_then_average_then_ema():
    g = Gate(PUBLIC_TIMING)
    g.forward(1, 0.010)
    assert g.stats()["T"][1] == 0.010                       # first sample sets it exactly
    g.forward(1, 0.020)
    assert g.stats()["T"][1] == pytest.approx(0.015)        # exact mean of two
    vals = [0.010, 0.020, 0.030, 0.040, 0.050, 0.060, 0.070, 0.080]
    g = Gate(PUBLIC_TIMING)
    for v in vals:
        g.forward(1, v)
    assert g.stats()["T"][1] == pytest.approx(sum(vals) / 8)   # exact mean up to memory 8
    g.forward(1, 0.125)
    assert g.stats()["T"][1] == pytest.approx(0.045 + (0.125 - 0.045) / 8)   # then EMA 1/8


def test_acceptance_priors_and_running_average():
    g = Gate()
    assert src(g, "mtp")["acceptance"] == [0.8, 0.6] + [0.5] * 6
    assert src(g, "lookup")["acceptance"] == [0.5] * 8
    # prior worth two verifies: the first result is the third sample
    g.result("mtp", 2, 1)                      # draft 1 stood, draft 2 refused
    a = src(g, "mtp")["acceptance"]
    assert a[0] == pytest.approx(0.8 + (1 - 0.8) / 3)
    assert a[1] == pytest.approx(0.6 + (0 - 0.6) / 3)
    assert a[2:] == [0.5] * 6                   # positions past `judged` untouched
    g.result("mtp", 1, 0)
    a1 = 0.8 + (1 - 0.8) / 3
    a1 += (0 - a1) / 4
    assert src(g, "mtp")["acceptance"][0] == pytest.approx(a1)
    # weight grows to 16, then alpha 1/16
    g = Gate()
    x, w = 0.5, 2
    rng = random.Random(3)
    for _ in range(40):
        v = float(rng.random() < 0.7)
        g.result("lookup", 1, int(v))
        if w < 16:
            w += 1
        x += (v - x) / w
        assert src(g, "lookup")["acceptance"][0] == pytest.approx(x)


def test_result_clamps_and_counts():
    g = Gate()
    g.result("lookup", 0, 0)                    # nothing judged: ignored
    assert src(g, "lookup")["verifies"] == 0
    g.result("lookup", 12, 20)                  # judged clamps to 8, accepted to judged
    s = src(g, "lookup")
    assert s["verifies"] == 1 and s["proposed"] == [1] * 8 and s["hit"] == [1] * 8
    g.result("lookup", 3, 2)
    s = src(g, "lookup")
    assert s["proposed"][:4] == [2, 2, 2, 1] and s["hit"][:4] == [2, 2, 1, 1]
    with pytest.raises(ValueError):
        g.result("nope", 1, 1)


def test_rho_fit_and_clamp():
    g = Gate(PUBLIC_TIMING)
    g.forward(2, 0.030)                          # T(1) unmeasured: no rho sample
    assert g.stats()["rho"] == 0.5 and g.stats()["rho_samples"] == 0
    g.forward(1, 0.010)
    g.forward(2, 0.013)                          # r = 0.3; rho 0.5 has weight 1
    assert g.stats()["rho"] == pytest.approx(0.5 + (0.3 - 0.5) / 2)
    g.forward(3, 0.020)                          # r = (2 - 1) / 2 = 0.5
    assert g.stats()["rho"] == pytest.approx(0.4 + (0.5 - 0.4) / 3)
    g2 = Gate(PUBLIC_TIMING)
    g2.forward(1, 0.010)
    g2.forward(2, 0.100)                         # r = 9, clamped to 4
    assert g2.stats()["rho"] == pytest.approx(0.5 + (4.0 - 0.5) / 2)
    g2.forward(2, 0.005)                         # r = -0.5, clamped to 0
    assert g2.stats()["rho"] == pytest.approx(2.25 + (0.0 - 2.25) / 3)


def test_forward_ignores_out_of_range():
    g = Gate()
    g.forward(0, 0.01)
    g.forward(10, 0.01)
    g.forward(1, 0.0)
    g.forward(1, -1.0)
    g.forward(2, float("nan"))
    assert g.stats()["T"] == {} and g.stats()["since_plain"] == 0


def test_rows_cost():
    g = Gate()
    assert g.rows_cost(0) == g.rows_cost(1) == 1.0
    assert g.rows_cost(4) == pytest.approx(1 + 3 * 0.5)      # unmeasured: rho0
    timed(g, {2: 1.2}, samples=1)
    rho = g.stats()["rho"]
    assert g.rows_cost(2) == pytest.approx(1.2)
    assert g.rows_cost(5) == pytest.approx(1 + 4 * rho)


# --- value and pick ------------------------------------------------------------------------

def test_free_extra_rows_pick_the_deepest_depth():
    g = Gate()
    timed(g, {n: 1.0 for n in range(2, 10)})     # T(n) = T(1): every row is free
    assert g.pick("lookup", 5) == 5
    assert g.pick("mtp", 3) == 3
    assert g.pick("lookup", 8) == 8
    assert g.pick("lookup", 12) == 8             # clamped to the 8 tracked positions


def test_strict_ties_go_to_a_plain_step():
    g = Gate()
    # lookup prior 0.5 and rho 0.5: value(1) = 1.5 / 1.5 = 1 exactly -> plain step
    assert g.value("lookup", 1) == 1.0
    assert [g.pick("lookup", 5) for _ in range(3)] == [0, 0, 0]
    assert src(g, "lookup")["declined"] == 3


def test_costly_rows_probe_count_over_48_picks_drafting_source():
    # MTP priors 0.8, 0.6: value(1) = 1.8 / 1.2 = 1.5; value(2) = 2.28 / 3.0 = 0.76; value(3) worse
    g = Gate()
    timed(g, {2: 1.2, 3: 3.0, 4: 4.0})
    assert g.value("mtp", 1) == pytest.approx(1.8 / 1.2)
    assert g.value("mtp", 2) == pytest.approx((1 + 0.8 + 0.48) / 3.0)
    picks = [g.pick("mtp", 3) for _ in range(48)]
    # T(3) has 3 samples, so a probe (one deeper: 2) every 16 picks: at picks 16, 32, 48
    assert picks == [2 if (i + 1) % 16 == 0 else 1 for i in range(48)]
    assert src(g, "mtp")["probes"] == 3 and src(g, "mtp")["declined"] == 0


def test_unmeasured_depth_probed_every_4_picks():
    g2 = Gate()
    timed(g2, {2: 1.2}, samples=3)
    for _ in range(2):
        g2.forward(3, 0.030)                     # ... against only 2 (barely measured)
    g2.forward(1, 0.010)
    picks = [g2.pick("mtp", 3) for _ in range(48)]
    assert picks == [2 if (i + 1) % 4 == 0 else 1 for i in range(48)]
    assert src(g2, "mtp")["probes"] == 12
    # a declined source whose two-row forward is barely measured also probes every 4 picks
    g3 = Gate()
    g3.forward(1, 0.010)
    g3.forward(2, 0.016)                         # T(2) one sample: value(1) = 1.5/1.6 < 1
    g3.forward(1, 0.010)
    picks = [g3.pick("lookup", 5) for _ in range(48)]
    assert picks == [1 if (i + 1) % 4 == 0 else 0 for i in range(48)]


@pytest.mark.parametrize("ratio,interval", [
    # declined lookup source (a_1 = 0.5): a probe costs c = T(2)/T(1) - 1 - 0.5 plain steps
    # beyond the plain step; it waits ceil(c / 0.008) picks, at least 4, at most 256
    (1.8, 38),      # c = 0.30 -> 37.5 -> 38 picks: one probe in 48 picks (at pick 38)
    (1.6, 13),      # c = 0.10 -> 12.5 -> 13: probes at 13, 26, 39
    (1.55, 7),      # c = 0.05 -> 6.25 -> 7: probes at 7, 14, ..., 42 (6 probes)
    (1.52, 4),      # c = 0.02 -> 2.5, raised to 4: 12 probes
    (5.0, 256),     # c = 3.5 -> 437.5, capped at 256: none in 48 picks
])
def test_costly_rows_probe_count_over_48_picks_declined_source(ratio, interval):
    g = Gate()
    timed(g, {2: ratio})
    assert g.declined_probe_interval("lookup") == interval
    picks = [g.pick("lookup", 5) for _ in range(48)]
    assert picks == [1 if (i + 1) % interval == 0 else 0 for i in range(48)]
    assert src(g, "lookup")["probes"] == 48 // interval
    assert src(g, "lookup")["declined"] == 48 - 48 // interval


def test_refresh_forces_a_plain_step_after_64_multi_row_forwards():
    g = Gate()
    timed(g, {n: 1.0 for n in range(2, 10)})
    for _ in range(63):
        g.forward(3, 0.010)
    assert not g.plain_due() and g.pick("lookup", 5) == 5
    g.forward(3, 0.010)                          # the 64th
    assert g.plain_due()
    before = src(g, "lookup")
    assert g.pick("lookup", 5) == 0 and g.pick("mtp", 3) == 0
    assert g.pick_p("mtp", [0.99, 0.99]) == 0 and not g.deeper_p("mtp", [0.99])
    after = src(g, "lookup")
    assert after["declined"] == before["declined"] + 1
    g.forward(1, 0.010)                          # the plain step resets the counter
    assert not g.plain_due() and g.pick("lookup", 5) == 5


def test_refresh_does_not_advance_the_probe_clock():
    g = Gate()
    timed(g, {2: 1.2, 3: 3.0, 4: 4.0})
    for _ in range(10):
        assert g.pick("mtp", 3) == 1
    for _ in range(64):
        g.forward(2, 0.012)
    for _ in range(5):
        assert g.pick("mtp", 3) == 0             # forced plain steps, clock stays at 10
    g.forward(1, 0.010)
    picks = [g.pick("mtp", 3) for _ in range(6)]
    assert picks == [1, 1, 1, 1, 1, 2]           # the probe comes on the 16th counted pick


def test_draft_cost_scales_value_exactly():
    g = Gate()
    timed(g, {2: 1.1, 3: 1.2, 4: 1.3})
    v = [g.value("mtp", k) for k in range(4)]
    g.draft_cost("mtp", 0.002)                   # 2 ms per draft past the first, T(1) = 10 ms
    d = 0.2
    assert g.value("mtp", 0) == 1.0
    assert g.value("mtp", 1) == pytest.approx(1.8 / 1.1) == pytest.approx(v[1])   # no extra draft
    assert g.value("mtp", 2) == pytest.approx((1 + 0.8 + 0.48) / (1.2 + 1 * d))
    assert g.value("mtp", 3) == pytest.approx((1 + 0.8 + 0.48 + 0.24) / (1.3 + 2 * d))
    assert g.value("lookup", 2) == pytest.approx((1 + 0.5 + 0.25) / 1.2)          # per source
    # without T(1) the draft cost is not counted
    g2 = Gate()
    g2.draft_cost("mtp", 0.002)
    assert g2.value("mtp", 3) == pytest.approx((1 + 0.8 + 0.48 + 0.24) / (1 + 3 * 0.5))
    with pytest.raises(ValueError):
        g.draft_cost("mtp", -1.0)
    with pytest.raises(ValueError):
        g.value("mtp", 9)


def test_gate_off_drafts_every_proposal_in_full():
    g = Gate(GateConfig(enabled=False))
    timed(g, {2: 5.0, 3: 9.0})                   # rows that never pay
    for _ in range(70):
        g.forward(2, 0.05)
    assert g.pick("lookup", 5) == 5 and g.pick("mtp", 3) == 3 and g.pick("lookup", 0) == 0
    assert g.pick_p("mtp", [0.01, 0.01]) == 2
    assert g.deeper_p("mtp", [0.01] * 7) and not g.deeper_p("mtp", [0.01] * 8)
    assert not g.plain_due()
    s = src(g, "lookup")
    assert s["declined"] == 0 and s["probes"] == 0


# --- per-step confidence bins ------------------------------------------------------------

def test_p_bins_start_at_their_own_p_and_move_as_specified():
    g = Gate()
    assert src(g, "mtp")["p_bins"] == pytest.approx([(b + 0.5) / 10 for b in range(10)])
    g.result("mtp", 3, 2, probs=[0.93, 0.42, 1.0, 0.3])   # 3 judged: bins 9, 4 stood; bin 9 refused
    bins = src(g, "mtp")["p_bins"]
    b9 = 0.95 + (1 - 0.95) / 3
    b9 += (0 - b9) / 4
    assert bins[9] == pytest.approx(b9)
    assert bins[4] == pytest.approx(0.45 + (1 - 0.45) / 3)
    assert bins[3] == pytest.approx(0.35)        # p_4 = 0.3 was not judged
    assert src(g, "lookup")["p_bins"][9] == pytest.approx(0.95)   # per source
    # bin edges: [b/10, (b+1)/10), 1.0 in bin 9
    g = Gate()
    g.result("mtp", 4, 0, probs=[0.0999, 0.1, 0.6, 0.0])
    bins = src(g, "mtp")["p_bins"]
    assert bins[0] == pytest.approx(0.05 * 2 / 3 * 3 / 4)   # two refusals in bin 0 (weights 3, 4)
    assert bins[1] == pytest.approx(0.15 * 2 / 3)
    assert bins[6] == pytest.approx(0.65 * 2 / 3)
    with pytest.raises(ValueError):
        g.result("mtp", 2, 1, probs=[0.5])
    with pytest.raises(ValueError):
        g.result("mtp", 1, 1, probs=[float("nan")])


def test_p_bins_follow_the_running_average_with_memory_16():
    g = Gate()
    x, w = 0.75, 2
    for i in range(40):
        v = i % 3 != 0
        g.result("mtp", 1, int(v), probs=[0.71])
        if w < 16:
            w += 1
        x += (float(v) - x) / w
        assert src(g, "mtp")["p_bins"][7] == pytest.approx(x)


def test_pick_p_prices_only_the_verify():
    g = Gate()
    timed(g, {2: 1.1, 3: 1.2, 4: 1.3})
    g.draft_cost("mtp", 0.050)                   # huge: pick_p must ignore it
    # bins: 0.95 -> 0.95, 0.05 -> 0.05
    # v1 = 1.95/1.1 = 1.773, v2 = (1.95 + 0.9025)/1.2 = 2.377, v3 = (2.8525 + 0.045125)/1.3 = 2.229
    assert g.pick_p("mtp", [0.95, 0.95, 0.05]) == 2
    assert src(g, "mtp")["trimmed"] == 1
    assert g.pick_p("mtp", [0.95, 0.95, 0.95]) == 3
    assert g.pick_p("mtp", [0.05]) == 0          # 1.05 / 1.1 < 1
    assert g.pick_p("mtp", [0.05, 0.95]) == 0    # (1.05 + 0.0475) / 1.2 < 1
    assert g.pick_p("mtp", []) == 0
    assert src(g, "mtp")["trimmed"] == 1 + 1 + 2


def deeper_reference(bins, cost, probs):
    """The rule as gate-rules.md words it, written independently of the gate."""
    n = len(probs)
    a = [bins[min(int(p * 10), 9)] for p in probs] + [max(bins)]

    def val(k):
        return 1.0 if k == 0 else E(a[:k]) / cost(k + 1)

    if any(val(n) < val(kk) for kk in range(n)):
        return False
    return val(n + 1) > 1 and val(n + 1) > val(n)


def test_deeper_p_stops_exactly_where_the_rule_says():
    g = Gate()
    timed(g, {n: 1 + 0.5 * (n - 1) for n in range(2, 10)})
    # every draft at p = 0.95 (bin 9, 0.95), rows 1 + 0.5 (n - 1):
    # v1 = 1.95/1.5 = 1.300, v2 = 2.8525/2 = 1.426, v3 = 3.7099/2.5 = 1.484,
    # v4 = 4.5244/3 = 1.508, v5 = 5.2981/3.5 = 1.514, v6 = 6.0332/4 = 1.508
    assert [g.deeper_p("mtp", [0.95] * n) for n in range(7)] == [True] * 5 + [False, False]
    # (a): a shorter verify already worth more stops it, even though n + 1 would beat n.
    g = Gate()
    timed(g, {2: 1.0, 3: 1.5, 4: 1.5})
    # a = 0.95, 0.55 (bins 9, 5), the next one 0.95 (best bin):
    # v1 = 1.95, v2 = (1.95 + 0.5225)/1.5 = 1.648, v3 = (2.4725 + 0.4964)/1.5 = 1.979:
    # (b) holds (v3 > v2, v3 > 1) but v1 > v2, so no
    assert not g.deeper_p("mtp", [0.93, 0.53])
    # n = 1: (a) holds (v1 >= 1) but v2 = (1.95 + 0.9025)/1.5 = 1.902 < v1 = 1.95: (b) fails
    assert not g.deeper_p("mtp", [0.93])
    # a cheaper third row makes v2 = 2.8525/1.2 = 2.377 > v1: yes
    g = Gate()
    timed(g, {2: 1.0, 3: 1.2, 4: 1.5})
    assert g.deeper_p("mtp", [0.93])
    # n = 0: write the first draft when v1 = (1 + best bin)/rows_cost(2) > 1
    assert g.deeper_p("mtp", [])
    g = Gate()
    timed(g, {2: 2.0})
    assert not g.deeper_p("mtp", [])             # 1.95 / 2.0 < 1
    # k' < n includes k' = 0 (our literal reading): n drafts must be worth a plain step.
    g = Gate()
    timed(g, {2: 1.2, 3: 1.2})
    # a = 0.15 (bin 1), next 0.95: v1 = 1.15/1.2 = 0.958 < 1, v2 = (1.15 + 0.1425)/1.2 = 1.077
    assert not g.deeper_p("mtp", [0.15])


@pytest.mark.parametrize("seed", range(6))
def test_deeper_p_matches_the_rule_on_random_cases(seed):
    rng = random.Random(seed)
    answers = []
    for _ in range(200):
        g = Gate()
        units = {1: 1.0}
        for n in range(2, 10):
            units[n] = units[n - 1] + rng.choice([0.0, 0.02, 0.1, 0.3, 0.8])
        timed(g, units, samples=rng.randint(0, 3))
        for _ in range(rng.randint(0, 30)):      # move the bins
            k = rng.randint(1, 4)
            probs = [rng.random() for _ in range(k)]
            acc = 0
            while acc < k and rng.random() < probs[acc]:
                acc += 1
            g.result("mtp", min(acc + 1, k), acc, probs=probs)
        probs = [rng.random() ** 0.3 for _ in range(rng.randint(0, 7))]
        bins = src(g, "mtp")["p_bins"]
        answers.append(g.deeper_p("mtp", probs))
        assert answers[-1] == deeper_reference(bins, g.rows_cost, probs)
    assert 0.1 < sum(answers) / len(answers) < 0.9     # both answers are exercised


def test_deeper_p_uses_the_best_bin_for_the_new_draft():
    g = Gate()
    timed(g, {n: 1 + 0.5 * (n - 1) for n in range(2, 10)})
    assert g.deeper_p("mtp", [0.95] * 4)         # v5 = 1.514 > v4 = 1.508 with a_5 = 0.95
    for _ in range(3):                           # bin 9 refused three times: 0.95 -> 0.475 ...
        g.result("mtp", 1, 0, probs=[0.97])
    bins = src(g, "mtp")["p_bins"]
    assert max(bins) == pytest.approx(0.85)      # bin 8 is now the best
    assert g.deeper_p("mtp", [0.85] * 4) == deeper_reference(bins, g.rows_cost, [0.85] * 4)
    assert not g.deeper_p("mtp", [0.85] * 4)     # v4 = 3.709/3 = 1.236 > v5 = 4.152/3.5 = 1.186


# --- reports -------------------------------------------------------------------------------

def test_describe_line():
    g = Gate()
    assert g.describe() == "[verispec spec gate]"
    g.forward(1, 0.010)
    g.forward(2, 0.012)                          # rows 2: 1.20, rho (0.5 + 0.2) / 2 = 0.35
    g.draft_cost("mtp", 0.0008)
    g.result("mtp", 2, 1)                        # a_1 = 0.8 + 0.2/3, a_2 = 0.6 - 0.6/3
    assert g.describe() == ("[verispec spec gate] T(1) 10.0 ms | rows 2: 1.20 | rho 0.35 | "
                            "draft 0.8 ms | acceptance 0.87 0.40")
    g.result("lookup", 1, 1)
    assert g.describe().endswith("acceptance mtp 0.87 0.40 | acceptance lookup 0.67")


def test_describe_example_shape():
    g = Gate()
    t1 = 0.0124
    for n, u in ((2, 1.31), (3, 1.58), (4, 1.92)):
        g.forward(1, t1)
        g.forward(n, t1 * u)
    # rho: 0.5 (weight 1), then samples 0.31, 0.29, 0.92/3 -> 0.405, 0.3667, 0.3517
    assert g.describe() == "[verispec spec gate] T(1) 12.4 ms | rows 2: 1.31, 3: 1.58, 4: 1.92 | rho 0.35"


def test_unknown_source_fails_loudly():
    g = Gate()
    for call in (lambda: g.pick("draft", 3), lambda: g.value("x", 1), lambda: g.pick_p("x", [0.5]),
                 lambda: g.deeper_p("x", []), lambda: g.draft_cost("x", 0.1)):
        with pytest.raises(ValueError):
            call()


# --- probes on free text -------------------------------------------------------------------

def test_never_accepted_source_backs_off_to_its_budget():
    g = Gate()
    timed(g, {2: 1.5})
    picks = 0
    for _ in range(3000):
        k = g.pick("lookup", 5)
        if k:
            g.forward(2, 0.015)
            g.result("lookup", 1, 0)
        else:
            g.forward(1, 0.010)
        picks += 1
    a1 = src(g, "lookup")["acceptance"][0]
    assert a1 < 0.01
    # about (0.5 - 0) / 0.008 = 62.5 picks; a_1 is not quite 0 yet
    assert g.declined_probe_interval("lookup") == math.ceil((0.5 - a1) / 0.008) in (62, 63)
    assert src(g, "lookup")["probes"] <= 3000 / 50


def test_a_probe_that_stands_is_followed_by_probes_every_4_picks():
    g = Gate()
    timed(g, {2: 1.5})
    for _ in range(300):                         # a long refused stretch
        if g.pick("lookup", 5):
            g.result("lookup", 1, 0)
    assert g.declined_probe_interval("lookup") >= 40
    while not g.pick("lookup", 5):               # wait for the next probe; it stands
        pass
    g.result("lookup", 1, 1)
    assert src(g, "lookup")["probe_stood"]
    assert g.declined_probe_interval("lookup") == 4
    picks = [g.pick("lookup", 5) for _ in range(4)]
    assert picks == [0, 0, 0, 1]
    g.result("lookup", 1, 1)                     # stood again
    assert g.declined_probe_interval("lookup") == 4
    assert [g.pick("lookup", 5) for _ in range(4)] == [0, 0, 0, 1]
    g.result("lookup", 1, 0)                     # refused: priced by max(a_1, recent probes)
    # recent probes (memory 4, full of refusals): 0 -> 0.25 -> 0.4375 -> 0.328125
    a1 = src(g, "lookup")["acceptance"][0]
    assert a1 < 0.328125
    assert g.declined_probe_interval("lookup") == math.ceil((0.5 - 0.328125) / 0.008) == 22


# --- simulation ----------------------------------------------------------------------------

CURVES = {
    "rows nearly free": linear_cost(0.01, 0.05),
    "cheap rows": linear_cost(0.01, 0.15),
    "moderate rows": linear_cost(0.01, 0.3),
    "costly rows": linear_cost(0.01, 0.6),
    "cpu-like rows": linear_cost(0.01, 1.0),
    "flat then a cliff": table_cost(0.01, {1: 1, 2: 1.02, 3: 1.04, 4: 1.06, 5: 1.6,
                                           6: 1.65, 7: 1.7, 8: 1.75, 9: 1.8}),
}


@pytest.mark.parametrize("source,max_k,draft_seconds", [("lookup", 5, 0.0), ("mtp", 3, 0.002)])
@pytest.mark.parametrize("curve", list(CURVES))
@pytest.mark.parametrize("p", [0.9, 0.6, 0.3, 0.0])
def test_gate_within_5pct_of_best_fixed_depth(curve, p, source, max_k, draft_seconds):
    cost = CURVES[curve]
    steps = 3000
    fixed = [simulate(cost, lambda s: p, steps, fixed=k, max_k=max_k, seed=11,
                      draft_seconds=draft_seconds).rate for k in range(max_k + 1)]
    run = simulate(cost, lambda s: p, steps, gate=Gate(), max_k=max_k, seed=11,
                   source=source, draft_seconds=draft_seconds)
    assert run.rate >= 0.95 * max(fixed), (run.rate / max(fixed), fixed.index(max(fixed)))


@pytest.mark.parametrize("source,max_k", [("lookup", 5), ("mtp", 3)])
@pytest.mark.parametrize("curve", list(CURVES))
def test_never_accepted_probes_cost_under_1pct(curve, source, max_k):
    """Every draft refused. What probing costs is the time its verifies take beyond the plain
    steps that would have produced the same tokens (a refused verify yields one token, like a
    plain step); that stays under 1% of decode time."""
    run = simulate(CURVES[curve], lambda s: 0.0, 5000, gate=Gate(), max_k=max_k, source=source)
    assert sum(run.ks) > 0                       # it did probe
    assert run.probe_excess < 0.01, run.probe_excess


def _jumps(rho, phases, seeds, horizon):
    """2000+ picks with every draft refused, then 90% acceptance from a jump that falls at
    each of `phases` successive picks (every phase of the probe schedule). The refused stretch
    does not depend on the seed, so it runs once and each jump continues a copy of the gate.
    Yields (picks until a carried draft stood, drafts carried per pick after the jump)."""
    cost = linear_cost(0.01, rho)
    gate = Gate()
    run = simulate(cost, lambda s: 0.0, 2000, gate=gate)
    assert sum(run.ks) > 0 and not any(run.accepted)
    for phase in range(phases):
        simulate(cost, lambda s: 0.0, 1, gate=gate)
        for i in range(seeds):              # a seed per run: the first draws decide the first probes
            after = simulate(cost, lambda s: 0.9, horizon, gate=copy.deepcopy(gate),
                             seed=1000 * phase + i)
            found = next(i for i, m in enumerate(after.accepted) if m)
            yield found, after.ks


@pytest.mark.parametrize("rho", [0.05, 0.1])
def test_recovers_within_50_picks_when_acceptance_jumps(rho):
    """When acceptance jumps to 90% after a never-accepted stretch, a draft is carried and
    stands within 50 picks, and soon the gate drafts on its own at almost every step. (Rows
    this cheap keep the probe interval at 13 picks or less, so at least three probes, each
    standing with probability 0.9, fall within 50 picks.)"""
    for found, ks in _jumps(rho, phases=16, seeds=3, horizon=300):
        assert found < 50, found
        assert sum(1 for k in ks[150:] if k) >= 0.95 * 150


@pytest.mark.parametrize("rho", [0.15, 0.2, 0.3, 0.5])
def test_recovery_on_costlier_rows(rho):
    """Costlier rows stretch the never-accepted probe interval to about (rows_cost(2) - 1) / 0.008
    picks (19, 25, 38, 63 here), so that those probes stay under 1% of decode time. A paying
    source is then found at the first probe that stands: within two intervals unless two probes
    in a row are refused (1 in 100 at 90% acceptance), within four unless four are (1 in 10^4)."""
    interval = math.ceil(rho / 0.008)
    founds = []
    for found, ks in _jumps(rho, phases=interval, seeds=3, horizon=4 * interval + 200):
        founds.append(found)
        assert found < 4 * interval, found
        assert sum(1 for k in ks[-100:] if k) >= 0.9 * 100
    assert sum(f < 2 * interval for f in founds) >= 0.95 * len(founds)
    if interval <= 25:                           # two probes fit in 50 picks
        assert sum(f < 50 for f in founds) >= 0.95 * len(founds)


def test_probes_come_back_to_shallower_unmeasured_depths():
    """Our choice 13 (docs/gate.md): a gate that went deeper in one step priced the row counts
    in between by rho, a straight line through the ones measured. On a cliff (4 rows as cheap
    as 2, 5 and 6 costly) the line says 4 rows are costly too. Probe slots come back to the
    deepest barely measured depth below the current one, every 4 picks, until each has 3
    samples; then the gate settles on the cliff's edge (3 drafts) on its own."""
    cliff = {1: 1.0, 2: 1.02, 3: 1.04, 4: 1.06, 5: 1.6, 6: 1.65}
    g = Gate()
    timed(g, {2: cliff[2], 6: cliff[6]})            # T(3), T(4), T(5) never measured
    for _ in range(40):                            # every draft stands (free observations)
        for pos in range(5):
            g.observe("lookup", pos, True)
    picks = []
    for _ in range(60):
        k = g.pick("lookup", 5)
        picks.append(k)
        g.forward(k + 1, 10 * MS * cliff[k + 1])
        g.result("lookup", k, k)
    # deepest first: 4 drafts (5 rows) every 4 picks until T(5) has 3 samples; then 3 drafts
    # (4 rows): one sample of T(4) is enough for 3 drafts to win on their own; then 2 drafts
    # (3 rows) every 4 picks until T(3) has 3 samples; then the public probe, one deeper every 16
    assert picks[:32] == [5, 5, 5, 4] * 3 + [5, 5, 5, 3] + [3, 3, 3, 2] * 3 + [3] * 4, picks
    assert picks[32:] == [3] * 11 + [4] + [3] * 15 + [4], picks
    assert src(g, "lookup")["probes"] == 3 + 1 + 3 + 2
    assert g.rows_cost(4) == pytest.approx(1.06) and g.rows_cost(3) == pytest.approx(1.04)


def test_at_the_deepest_depth_the_probe_slot_refreshes_the_next_shallower():
    """Our choice 14 (docs/gate.md): at best == max_k the public rule has no probe to make, so
    the row count one below is never timed again. One slow sample of it moves the gate to the
    deepest depth, where nothing would correct it; now every 16th pick there carries one draft
    fewer, and once that row count's estimate has come back down (memory 8: slowly, when the
    two depths are this close) the gate returns to the depth that pays more."""
    units = {1: 1.0, 2: 1.3, 3: 1.5, 4: 1.7, 5: 1.9, 6: 2.2}
    g = Gate()
    timed(g, units, samples=8)
    for pos in range(5):                                    # a_j = 0.9 (observations, weight 32)
        for i in range(40):
            g.observe("lookup", pos, i % 10 != 0)
    assert g.pick("lookup", 5) == 4                          # 4 drafts (5 rows): 2.155 against 2.13
    g.forward(5, 10 * MS * units[5] * 3)                     # one very slow 5-row forward
    assert g.pick("lookup", 5) == 5
    picks = []
    for _ in range(600):
        k = g.pick("lookup", 5)
        picks.append(k)
        g.forward(k + 1, 10 * MS * units[k + 1])
    back = next(i for i in range(len(picks)) if picks[i:i + 20].count(4) >= 15)
    counted = [k for k in picks[:back] if k]                 # a refresh plain step does not count
    slots = [i for i, k in enumerate(counted) if k == 4]     # at 5: every 16th pick refreshes 5 rows
    assert len(slots) >= 5 and all(b - a == 16 for a, b in zip(slots, slots[1:])), slots
    assert set(picks[:back]) <= {0, 4, 5} and back < 450, back
    assert picks[-40:].count(4) >= 36, picks[-40:]          # back at 4, probing 5 every 16
    assert g.value("lookup", 4) > g.value("lookup", 5)
