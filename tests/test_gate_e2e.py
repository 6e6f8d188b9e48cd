"""The gate end to end: a fake clock that makes rows cheap, every arm still bit-identical."""

import pytest

from harness import SAMPLED, arm_settings, assert_same, fake_timed, plain_settings, run
from model_fixtures import REPEAT_PROMPT, engine


ARMS = [
    dict(lookup=True, mtp="off"),
    dict(lookup=False, mtp="on", mtp_drafts=0),
    dict(lookup=False, mtp="on", mtp_drafts=3),                 # per-step depth on (fixed depth >= 2)
    dict(lookup=False, mtp="on", mtp_drafts=3, mtp_pstep=False),
    dict(lookup=True, mtp="on", mtp_drafts=0),
]


@pytest.mark.parametrize("sampled", [False, True])
def test_gate_on_with_cheap_rows(sampled):
    eng = engine("qwen3_next", 4, mtp=True, vocab_size=32, aligned_head=True)
    base = plain_settings(100, sampling=SAMPLED if sampled else plain_settings().sampling)
    plain = run(eng, REPEAT_PROMPT, base)
    rejected = full = 0
    for a in ARMS:
        s = arm_settings(base, gate=True, mtp_vocab=0, **a)
        dec = fake_timed(eng, eng.new_decoder(s, REPEAT_PROMPT), row_cost=0.0)
        dec.trace = []
        arm = eng.generate(REPEAT_PROMPT, s, decoder=dec, keep_logits=True)
        assert_same(plain, arm, str(a))
        assert arm.stats["verifies"] >= 1, a
        rejected += sum(1 for _, _, d, used in dec.trace if used is not None and used < len(d))
        full += sum(1 for _, _, d, used in dec.trace if used == len(d))
    assert rejected >= 1 and full >= 1


def test_costly_rows_decline_and_stay_exact():
    eng = engine("qwen3_next", 2, vocab_size=40)     # its output repeats: lookup proposes
    base = plain_settings(80)
    plain = run(eng, REPEAT_PROMPT, base)
    s = arm_settings(base, gate=True, lookup=True)
    dec = fake_timed(eng, eng.new_decoder(s, REPEAT_PROMPT), row_cost=1.0)   # a row costs a plain step
    arm = eng.generate(REPEAT_PROMPT, s, decoder=dec, keep_logits=True)
    assert_same(plain, arm, "costly rows")
    assert arm.stats["declined"] >= 1


@pytest.mark.parametrize("observe", [False, True])
def test_lookup_is_measured_beside_a_fixed_depth_head(observe):
    """Regression: a fixed-depth MTP head drafts at every step; lookup must still be measured
    (and the refresh plain step still taken), or it is never chosen (bench/spec_tables.py found
    this: 0 lookup verifies beside MTP 1). Under the public rules (no free observations) its
    probes are carried over the head's drafts; with observations its declined proposals are
    followed instead, and it is probed only for timing (docs/gate.md "Free observations")."""
    eng = engine("qwen3_next", 4, mtp=True, vocab_size=32, aligned_head=True)
    base = plain_settings(160)
    plain = run(eng, REPEAT_PROMPT, base)
    s = arm_settings(base, gate=True, lookup=True, mtp="on", mtp_drafts=1, mtp_vocab=0,
                     gate_observe=observe)
    dec = fake_timed(eng, eng.new_decoder(s, REPEAT_PROMPT), row_cost=0.3)
    arm = eng.generate(REPEAT_PROMPT, s, decoder=dec, keep_logits=True)
    assert_same(plain, arm, "mtp 1 + lookup")
    lookup = dec.gate.stats()["sources"]["lookup"]
    if observe:
        assert lookup["declined"] >= 10 and lookup["observed"][0] >= lookup["declined"] - 1   # the last one: no pick after it
        assert lookup["probes"] == 0           # T(2) is measured by the head's verifies
    else:
        assert arm.stats["by_source"]["lookup"]["verifies"] >= 1
        assert lookup["observed"] == [0] * 8
    assert arm.stats["plain_steps"] >= 1          # the refresh step measured T(1)
