"""Prompt lookup: the incremental index proposes exactly what the brute-force scan proposes."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings, strategies as st

from verispec.drafts.lookup import PromptLookup, lookup_bruteforce


# --- hand-worked examples -------------------------------------------------------------------

HAND = [
    # (history, max_drafts, expected): worked out by hand in the comments
    # suffix (1,2,3) occurred at start 1 -> tokens from index 4
    ([7, 1, 2, 3, 9, 1, 2, 3], 5, [9, 1, 2, 3]),
    # n=4 suffix (1,2,1,2) occurs at start 0, overlapping the suffix (start 2); ends at 4
    ([1, 2, 1, 2, 1, 2], 5, [1, 2]),
    # only n=2 fits: (5,5) at start 0 ends at 2; one token follows
    ([5, 5, 5], 5, [5]),
    # (1,2) occurs at 0 and 3: the most recent earlier one (3) wins -> 9, not 8
    ([1, 2, 8, 1, 2, 9, 1, 2], 5, [9, 1, 2]),
    # longest n wins over a more recent shorter match: (1,2,3) at 0 beats (2,3) at 5
    ([1, 2, 3, 5, 9, 2, 3, 6, 1, 2, 3], 5, [5, 9, 2, 3, 6]),
    ([1, 2, 3, 5, 9, 2, 3, 6, 1, 2, 3], 2, [5, 9]),
    # match right before the end: (2,2,2) at start 0 ends at 3, the last token follows
    ([2, 2, 2, 2], 5, [2]),
    # (3,4) at start 0 -> [3,4]; the n=3 suffix (4,3,4) has no earlier occurrence
    ([3, 4, 3, 4], 5, [3, 4]),
    # nothing repeats
    ([1, 2, 3, 4], 5, []),
    ([], 5, []),
    ([1], 5, []),
    ([1, 1], 5, []),          # (1,1) has no earlier start
    ([1, 1, 1], 1, [1]),
    # the n=4 match stops at max_drafts
    ([4, 5, 6, 7, 1, 2, 3, 4, 5, 6, 7], 3, [1, 2, 3]),
]


@pytest.mark.parametrize("history,k,expected", HAND)
def test_hand_worked(history, k, expected):
    assert lookup_bruteforce(history, k) == expected
    lk = PromptLookup(max_drafts=k)
    lk.extend(history)
    assert lk.propose() == expected
    assert len(lk) == len(history)


def test_constructible_from_three_integers_and_validates():
    lk = PromptLookup(5, 2, 4)
    assert (lk.max_drafts, lk.n_min, lk.n_max) == (5, 2, 4)
    with pytest.raises(ValueError):
        PromptLookup(0, 2, 4)
    with pytest.raises(ValueError):
        PromptLookup(5, 3, 2)
    with pytest.raises(ValueError):
        PromptLookup(5, 0, 2)


def test_propose_override_and_zero():
    lk = PromptLookup(max_drafts=5)
    lk.extend([1, 2, 3, 4, 5, 6, 1, 2])
    assert lk.propose() == [3, 4, 5, 6, 1]
    assert lk.propose(2) == [3, 4]
    assert lk.propose(0) == []
    assert lookup_bruteforce([1, 2, 3, 1, 2], 0) == []


# --- model checks ----------------------------------------------------------------------------

def _check_all(lk: PromptLookup, history: list[int]) -> int:
    """Compare every max_drafts 1..5 against the scan; return how many proposed something."""
    assert len(lk) == len(history)
    proposed = 0
    for k in range(1, 6):
        want = lookup_bruteforce(history, k, lk.n_min, lk.n_max)
        got = lk.propose(k)
        assert got == want, (history, k)
        proposed += bool(got)
    return proposed


def _fresh_index(history, n_min, n_max):
    lk = PromptLookup(5, n_min, n_max)
    lk.extend(history)
    return lk._ends


@settings(max_examples=300, deadline=None)
@given(alphabet=st.integers(2, 4), seed=st.integers(0, 2**32 - 1), length=st.integers(0, 80))
def test_random_histories_every_prefix(alphabet, seed, length):
    rng = random.Random(seed)
    history = [rng.randrange(alphabet) for _ in range(length)]
    lk = PromptLookup()
    for i, tok in enumerate(history):
        lk.append(tok)
        _check_all(lk, history[:i + 1])


def test_random_histories_mostly_propose():
    """Seeded: every prefix of many small-alphabet histories, and most calls do propose
    (so the comparison is between real proposals, not between two empty lists)."""
    rng = random.Random(1234)
    calls = proposing = 0
    for _ in range(200):
        alphabet = rng.randint(2, 4)
        history = [rng.randrange(alphabet) for _ in range(rng.randint(30, 80))]
        lk = PromptLookup()
        for i, tok in enumerate(history):
            lk.append(tok)
            got = _check_all(lk, history[:i + 1])
            if i + 1 >= 24:
                proposing += got
                calls += 5
    assert proposing >= 0.9 * calls


@settings(max_examples=200, deadline=None)
@given(period=st.lists(st.integers(0, 5), min_size=1, max_size=6), reps=st.integers(1, 12),
       tail=st.integers(0, 5), n_min=st.integers(1, 3), extra=st.integers(0, 3))
def test_periodic_histories(period, reps, tail, n_min, extra):
    n_max = n_min + extra
    history = (period * (reps + 1))[:len(period) * reps + tail]
    lk = PromptLookup(5, n_min, n_max)
    for i, tok in enumerate(history):
        lk.append(tok)
        _check_all(lk, history[:i + 1])
    # once the suffix is a whole period repeated, the proposal continues the period
    if len(history) >= 2 * len(period) + n_max and n_min <= len(period):
        got = lk.propose(5)
        assert got, history


def test_periodic_continues_the_period_through_overlap():
    history = [1, 2, 3] * 4 + [1]
    lk = PromptLookup(5)
    lk.extend(history)
    # n=4 suffix (1,2,3,1) last occurred at start 6, ending at 10: three tokens follow
    assert lk.propose() == [2, 3, 1] == lookup_bruteforce(history, 5)
    # a run of one token: the most recent earlier (9,9,9,9) starts one back, overlapping
    # the suffix by n - 1, so exactly one token follows it
    lk = PromptLookup(5)
    lk.extend([9] * 7)
    assert lk.propose() == [9] == lookup_bruteforce([9] * 7, 5)


ops = st.one_of(
    st.tuples(st.just("append"), st.integers(0, 3)),
    st.tuples(st.just("extend"), st.lists(st.integers(0, 3), max_size=8)),
    st.tuples(st.just("truncate"), st.integers(0, 40)),
    st.tuples(st.just("propose"), st.integers(1, 5)),
    st.tuples(st.just("reset"), st.just(0)),
)


@settings(max_examples=300, deadline=None)
@given(seq=st.lists(ops, min_size=1, max_size=60), n_min=st.integers(1, 3), extra=st.integers(0, 2))
def test_interleaved_append_truncate_propose(seq, n_min, extra):
    n_max = n_min + extra
    lk = PromptLookup(5, n_min, n_max)
    model: list[int] = []
    for op, arg in seq:
        if op == "append":
            lk.append(arg)
            model.append(arg)
        elif op == "extend":
            lk.extend(arg)
            model.extend(arg)
        elif op == "truncate":
            n = min(arg, len(model) + 2)    # sometimes past the end: a no-op
            lk.truncate(n)
            del model[n:]
        elif op == "reset":
            lk.reset()
            model.clear()
        else:
            assert lk.propose(arg) == lookup_bruteforce(model, arg, n_min, n_max)
        assert lk.history == model
        _check_all(lk, model)
    # the index after any edits equals one built from scratch
    assert lk._ends == _fresh_index(model, n_min, n_max)


def test_decoder_like_undo_loop():
    """Seeded long run: append a few tokens, undo some (rejected drafts), propose, repeat."""
    rng = random.Random(7)
    lk = PromptLookup(5)
    model: list[int] = []
    proposing = calls = 0
    for step in range(3000):
        alphabet = 3 if step % 500 < 250 else 4
        toks = [rng.randrange(alphabet) for _ in range(rng.randint(1, 6))]
        lk.extend(toks)
        model.extend(toks)
        if rng.random() < 0.5:
            drop = rng.randint(1, len(toks))
            lk.truncate(len(model) - drop)
            del model[len(model) - drop:]
        if rng.random() < 0.01:          # prefix reuse rewinding far back
            n = rng.randint(0, len(model))
            lk.truncate(n)
            del model[n:]
        k = rng.randint(1, 5)
        got = lk.propose(k)
        assert got == lookup_bruteforce(model, k), step
        proposing += bool(got)
        calls += 1
    assert proposing >= 0.9 * calls
    assert lk._ends == _fresh_index(model, 2, 4)


def test_truncate_negative_raises_and_past_end_is_noop():
    lk = PromptLookup()
    lk.extend([1, 2, 1, 2])
    with pytest.raises(ValueError):
        lk.truncate(-1)
    lk.truncate(10)
    assert lk.history == [1, 2, 1, 2]
    lk.truncate(3)
    assert lk.history == [1, 2, 1]
    assert lk.propose() == lookup_bruteforce([1, 2, 1], 5) == []   # (2,1) has no earlier start
    lk.append(2)
    assert lk.propose() == [1, 2]


def test_numpy_like_ints_are_normalized():
    class IntLike(int):
        pass
    lk = PromptLookup()
    lk.extend([IntLike(3), IntLike(4), 3, 4])
    assert lk.propose() == [3, 4]
    assert all(type(t) is int for t in lk.history)
