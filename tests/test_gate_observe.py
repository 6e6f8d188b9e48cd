"""Free observations: drafts no verify carried, compared with the picks made where they would
have stood, feed the gate's acceptance estimates (docs/gate.md "Free observations")."""

import pytest

from harness import arm_settings, assert_same, fake_timed, plain_settings, run
from model_fixtures import REPEAT_PROMPT, engine
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
