"""Drafts vs no drafts: identical ids, text and torch.equal logits at every position
(the test matrix of reference/test-matrix.md for prompt lookup), with exact counts."""

import pytest
import torch

from harness import SAMPLED, arm_settings, assert_same, counts, plain_settings, run, simulate_forced
from model_fixtures import REPEAT_PROMPT, engine

FAMILIES = ["qwen3_next", "qwen3_5_moe"]
N = 40


def _forced(eng, prompt, plain, base, k, mode):
    arm = run(eng, prompt, arm_settings(base, lookup_drafts=k, force=mode, reference=tuple(plain.ids)))
    assert_same(plain, arm, f"force {mode} k={k}")
    ctx = eng.context_for(len(prompt), base)
    want = simulate_forced(plain.ids, len(prompt), ctx, k, mode, eng.args.vocab_size)
    assert counts(arm.stats) == want, mode
    return arm


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("k", [5, 2])
def test_forced_lookup_arms(family, k):
    eng = engine(family, 0)
    base = plain_settings(N)
    plain = run(eng, REPEAT_PROMPT, base)
    assert counts(plain.stats)["forwards"] == N - 1 and plain.stats["verifies"] == 0
    for mode in ["accept", "reject", "mixed", "cycle"] + [f"row{r}" for r in range(1, k + 1)]:
        _forced(eng, REPEAT_PROMPT, plain, base, k, mode)


@pytest.mark.parametrize("family", FAMILIES)
def test_forced_sampled_and_small_context_and_prefill_off(family):
    eng = engine(family, 1)
    for base in (plain_settings(N, sampling=SAMPLED),
                 plain_settings(N, context=len(REPEAT_PROMPT) + N),      # verifies squeezed at the end
                 plain_settings(N, context=512),
                 plain_settings(N, prefill_batch=False)):
        plain = run(eng, REPEAT_PROMPT, base)
        for mode in ("cycle", "mixed", "accept"):
            _forced(eng, REPEAT_PROMPT, plain, base, 5, mode)


def test_counts_worked_by_hand():
    # N = 40 picks, 39 fed; accept at k=5 verifies from picks 0, 6, ..., 36; the last
    # carries ref[37..39] (3 drafts), of which 37 and 38 are fed and 39 is the final pick.
    ref = list(range(100, 140))
    got = simulate_forced(ref, 10, 10 + 40 + 8, 5, "accept", 1000)
    assert got == {"forwards": 7, "tokens": 39, "accepted": 32, "drafts": 33, "verifies": 7,
                   "ended_mid_verify": True}
    # reject: every pick fed by its own forward; drafts 5 * 35 + 4 + 3 + 2 + 1
    got = simulate_forced(ref, 10, 10 + 40 + 8, 5, "reject", 1000)
    assert got == {"forwards": 39, "tokens": 39, "accepted": 0, "drafts": 185, "verifies": 39,
                   "ended_mid_verify": True}
    # row1 at k=2 is reject at k=2; row2: each verify accepts one draft -> 2 tokens a forward
    got = simulate_forced(ref, 10, 58, 2, "row2", 1000)
    assert got["tokens"] == 39 and got["forwards"] == 20 and got["accepted"] == 19


@pytest.mark.parametrize("family", FAMILIES)
def test_forced_counts_against_engine_by_hand(family):
    eng = engine(family, 0)
    base = plain_settings(N)
    plain = run(eng, REPEAT_PROMPT, base)
    arm = _forced(eng, REPEAT_PROMPT, plain, base, 5, "accept")
    assert (arm.stats["forwards"], arm.stats["tokens"], arm.stats["accepted"], arm.stats["drafts"]) == (7, 39, 32, 33)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("sampled", [False, True])
def test_natural_lookup(family, sampled):
    # a small vocabulary makes the random model's output repeat, so lookup proposes
    eng = engine(family, 2, vocab_size=40)
    base = plain_settings(80, sampling=SAMPLED if sampled else plain_settings().sampling)
    plain = run(eng, REPEAT_PROMPT, base)
    for k in (5, 2):
        arm = run(eng, REPEAT_PROMPT, arm_settings(base, lookup_drafts=k))
        assert_same(plain, arm, f"natural lookup k={k}")
        assert arm.stats["verifies"] >= 1
        assert arm.stats["forwards"] < plain.stats["forwards"] or arm.stats["accepted"] == 0


@pytest.mark.parametrize("family", FAMILIES)
def test_eos_inside_a_verify(family):
    eng = engine(family, 0)
    base = plain_settings(N)
    free = run(eng, REPEAT_PROMPT, base)
    eos_tok = free.ids[15]
    first = free.ids.index(eos_tok)
    plain = run(eng, REPEAT_PROMPT, base, eos_ids={eos_tok})
    assert plain.ids == free.ids[:first + 1] and plain.finish_reason == "stop"
    arm = run(eng, REPEAT_PROMPT, arm_settings(base, force="accept", reference=tuple(free.ids)), eos_ids={eos_tok})
    assert_same(plain, arm, "eos in a verify")
    want = simulate_forced(free.ids, len(REPEAT_PROMPT), eng.context_for(len(REPEAT_PROMPT), base), 5, "accept",
                           eng.args.vocab_size, last_fed=first)
    assert counts(arm.stats) == want


@pytest.mark.parametrize("family", FAMILIES)
def test_end_mid_verify_leaves_plain_state(family):
    eng = engine(family, 0)
    for n in (N, N - 2):   # the end falls at different rows of the last verify
        base = plain_settings(n)
        plain = run(eng, REPEAT_PROMPT, base)
        dec_plain = eng.new_decoder(base, REPEAT_PROMPT)
        eng.generate(REPEAT_PROMPT, base, decoder=dec_plain)
        s = arm_settings(base, force="accept", reference=tuple(plain.ids))
        dec = eng.new_decoder(s, REPEAT_PROMPT)
        arm = eng.generate(REPEAT_PROMPT, s, decoder=dec, keep_logits=True)
        assert_same(plain, arm, "end mid-verify")
        assert arm.stats["ended_mid_verify"]
        a, b = dec.state.snapshot(), dec_plain.state.snapshot()
        assert a["kv_len"] == b["kv_len"] == len(REPEAT_PROMPT) + n - 1
        assert a["tokens"] == b["tokens"]
        for key in ("k", "v", "conv", "rec"):
            for x, y in zip(a[key], b[key]):
                assert torch.equal(x, y), key
