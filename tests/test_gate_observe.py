"""Free observations: drafts no verify carried, compared with the picks made where they would
have stood, feed the gate's acceptance estimates (docs/gate.md "Free observations")."""

import pytest

from gate_sim import simulate, table_cost
from harness import arm_settings, assert_same, fake_timed, plain_settings, run
from model_fixtures import REPEAT_PROMPT, engine
from test_gate import CURVES
from verispec.gate import Gate, GateConfig


def test_observe_moves_the_estimate_by_the_running_rule():
    g = Gate()
    g.observe("lookup", 2, True)          # prior 0.5 worth 2: (0.5 * 2 + 1) / 3
    a = g.stats()["sources"]["lookup"]["acceptance"]
    assert a[2] == pytest.approx(2 / 3) and a[0] == 0.5 and a[1] == 0.5
    g.observe("lookup", 2, False)         # weight 4: 2/3 + (0 - 2/3) / 4
    s = g.stats()["sources"]["lookup"]
    assert s["acceptance"][2] == pytest.approx(0.5)
    assert s["observed"][:3] == [0, 0, 2] and s["observed_hit"][:3] == [0, 0, 1]
    assert s["verifies"] == 0 and s["proposed"] == [0] * 8 and s["p_bins"][5] == 0.55


def test_observe_off_changes_nothing():
    g = Gate(GateConfig(observe=False))
    g.observe("lookup", 0, True)
    s = g.stats()["sources"]["lookup"]
    assert s["acceptance"][0] == 0.5 and s["observed"][0] == 0


def test_observe_outside_the_tracked_positions_is_ignored():
    g = Gate()
    g.observe("lookup", 8, True)
    assert g.stats()["sources"]["lookup"]["observed"] == [0] * 8
    with pytest.raises(ValueError, match="unknown draft source"):
        g.observe("nope", 0, True)


def _forced_run(mode: str, observe: bool = True, tokens: int = 60):
    eng = engine("qwen3_next", 2, vocab_size=40)
    base = plain_settings(tokens)
    plain = run(eng, REPEAT_PROMPT, base)
    ref = plain.ids[len(REPEAT_PROMPT):] if len(plain.ids) > tokens else plain.ids
    s = arm_settings(base, gate=True, lookup=True, mtp="off", lookup_drafts=5, force=mode,
                     reference=tuple(ref), gate_observe=observe)
    # a row costs a whole plain step: value(k) = E(k) / (k + 1) <= 1, so the gate declines
    # every pick but its probes, and the drafts it declines are what gets observed
    dec = fake_timed(eng, eng.new_decoder(s, REPEAT_PROMPT), row_cost=1.0)
    arm = eng.generate(REPEAT_PROMPT, s, decoder=dec, keep_logits=True)
    assert_same(plain, arm, mode)
    return dec.gate.stats()["sources"]["lookup"], arm


def test_declined_drafts_are_followed_until_the_first_miss():
    # row2: draft 2 is always wrong, so position 0 always stands, position 1 never, and no
    # later position may be observed (its condition, drafts 1..j-1 stood, never holds)
    s, arm = _forced_run("row2")
    assert arm.stats["declined"] >= 20
    assert s["observed"][0] >= 20 and s["observed_hit"][0] == s["observed"][0]
    # position 1 is also observed after each probe of one draft (the verify judged position 0)
    assert s["observed"][1] >= s["observed"][0] and s["observed_hit"][1] == 0
    assert s["observed"][2:] == [0] * 6
    assert s["acceptance"][1] < 0.2 and s["acceptance"][0] > 0.8


def test_every_position_of_an_accepted_proposal_is_observed():
    s, _ = _forced_run("accept")
    assert all(n > 0 for n in s["observed"][:5]) and s["observed_hit"][:5] == s["observed"][:5]
    assert s["observed"][5:] == [0] * 3      # lookup proposes at most 5


def test_rejected_drafts_teach_the_gate_without_verifies():
    s, _ = _forced_run("reject")
    assert s["observed"][0] >= 20 and s["observed_hit"][0] == 0 and s["observed"][1:] == [0] * 7
    assert s["acceptance"][0] < 0.1
    off, _ = _forced_run("reject", observe=False)
    assert off["observed"] == [0] * 8 and off["acceptance"][0] > s["acceptance"][0]


# --- the gate's own rules for observed sources ----------------------------------------------

def src_acc(g):
    return g.stats()["sources"]["lookup"]["acceptance"]


def test_observations_average_with_memory_32_and_verifies_keep_16():
    g = Gate()
    for _ in range(40):
        g.observe("lookup", 0, False)
    x, w = 0.5, 2                                     # prior 0.5 worth 2 verifies
    for _ in range(40):
        w = min(w + 1, 32)
        x += (0.0 - x) / w
    assert src_acc(g)[0] == pytest.approx(x)
    g.result("lookup", 1, 1)                          # a verify moves it by 1/16, not 1/32
    assert src_acc(g)[0] == pytest.approx(x + (1.0 - x) / 16)
    g.observe("lookup", 0, True)
    y = x + (1.0 - x) / 16
    assert src_acc(g)[0] == pytest.approx(y + (1.0 - y) / 32)


def _measured_gate(t2: float) -> Gate:
    g = Gate()
    for _ in range(3):
        g.forward(1, 1.0)
        g.forward(2, t2)
    g.forward(1, 1.0)
    return g


def test_a_watched_declined_source_probes_for_timing_only():
    g, ref = _measured_gate(1.3), _measured_gate(1.3)
    for _ in range(60):                               # a_1 -> about 0.05: declined
        g.observe("lookup", 0, False)
        ref.observe("lookup", 0, False)
    interval = ref.declined_probe_interval("lookup")
    assert 4 <= interval < 50
    picks, ref_picks = [], []
    for _ in range(300):
        picks.append(g.pick("lookup", 3))
        g.observe("lookup", 0, False)                 # the plain step's pick judged it: watched
        ref_picks.append(ref.pick("lookup", 3))       # nothing follows ref's proposals
    assert sum(ref_picks) >= 300 // interval - 1
    assert [i for i, k in enumerate(picks) if k] == [255]      # probe_max_interval, for T(2)
    assert g.stats()["sources"]["lookup"]["probes"] == 1


def test_a_watched_source_still_probes_unmeasured_rows():
    g = Gate()
    g.forward(1, 1.0)
    for _ in range(30):
        g.observe("lookup", 0, False)
    picks = []
    for _ in range(8):
        picks.append(g.pick("lookup", 3))
        g.observe("lookup", 0, False)
    assert picks == [0, 0, 0, 1, 0, 0, 0, 1]          # T(2) has no samples: every 4 picks


# --- simulation with observations ----------------------------------------------------------


# the mid-size model on this CPU (bench/results/spec_costs_gate_focus.json, fixed arms' ms per forward)
MID_CPU = table_cost(0.042, {1: 1, 2: 1.35, 3: 1.56, 4: 1.93, 5: 2.16, 6: 2.67,
                             7: 2.9, 8: 3.1, 9: 3.3})


@pytest.mark.parametrize("p", [0.9, 0.6, 0.3, 0.0])
@pytest.mark.parametrize("curve", list(CURVES) + ["mid cpu"])
def test_observed_gate_within_5pct_of_best_fixed_depth(curve, p):
    cost = MID_CPU if curve == "mid cpu" else CURVES[curve]
    fixed = [simulate(cost, lambda s: p, 3000, fixed=k, seed=11).rate for k in range(6)]
    run = simulate(cost, lambda s: p, 3000, gate=Gate(), seed=11, observe=True)
    assert run.rate >= 0.95 * max(fixed), (run.rate / max(fixed), fixed.index(max(fixed)))
    if p == 0.0:
        assert run.rate >= 0.99 * fixed[0]           # watched: nothing but timing probes


def test_near_break_even_costs_under_2pct_of_plain():
    """30% acceptance where one draft pays only from 35% (two rows cost 1.35 plain steps): the
    estimate, fed at every token, must not cross the break-even by chance often. Over 40 runs
    of 450 steps (about a 512-token reply) the gate averages within 2% of plain decoding and
    no run loses more than 4%."""
    ratios = []
    for seed in range(40):
        plain = simulate(MID_CPU, lambda s: 0.3, 450, fixed=0, seed=seed)
        run = simulate(MID_CPU, lambda s: 0.3, 450, gate=Gate(), seed=seed, observe=True)
        ratios.append(run.rate / plain.rate)
    assert sum(ratios) / len(ratios) >= 0.98, sum(ratios) / len(ratios)
    assert min(ratios) >= 0.96, min(ratios)


@pytest.mark.parametrize("rho", [0.1, 0.3, 0.5])
def test_observed_source_drafts_within_50_picks_of_a_jump(rho):
    """Never accepted for 300 picks, then 90%: with observations the estimate climbs at every
    pick (memory 32), so the gate drafts on its own within 50 picks for rows up to 1.5 plain
    steps for two, on every seed."""
    cost = table_cost(0.01, {n: 1 + (n - 1) * rho for n in range(1, 10)})
    for seed in range(10):
        run = simulate(cost, lambda s: 0.0 if s < 300 else 0.9, 400, gate=Gate(), seed=seed,
                       observe=True)
        first = next(i - 300 for i in range(300, 400) if run.ks[i] and run.own[i])
        assert first < 50, first
        assert sum(1 for k in run.ks[350:] if k) >= 45
