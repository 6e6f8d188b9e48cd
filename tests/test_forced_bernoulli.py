"""--force bernoulli:P and bernoulli:P1,P2,...: each draft stands with its position's probability."""

import pytest

from verispec.drafts.forced import ForcedSource, ForceMode
from verispec.errors import UsageError


def _wrong_rates(mode: ForceMode, k: int, n: int = 20000) -> list[float]:
    src = ForcedSource(mode, list(range(100)), 10, vocab=1000, seed=7)
    wrong = [0] * k
    for _ in range(n):
        out = src.spoil([1] * k)
        for j, d in enumerate(out):
            wrong[j] += d != 1
    return [w / n for w in wrong]


def test_per_position_probabilities():
    m = ForceMode.parse("bernoulli:0.97,0.83")
    assert m.kind == "bernoulli" and m.ps == (0.97, 0.83)
    r = _wrong_rates(m, 3)
    assert abs(r[0] - 0.03) < 0.006 and abs(r[1] - 0.17) < 0.012 and abs(r[2] - 0.17) < 0.012, r


def test_single_probability_applies_to_every_position():
    m = ForceMode.parse("bernoulli:0.6")
    assert m.p == 0.6 and m.ps == ()
    r = _wrong_rates(m, 2)
    assert all(abs(x - 0.4) < 0.015 for x in r), r


@pytest.mark.parametrize("bad", ["bernoulli:1.2", "bernoulli:0.5,x", "bernoulli:", "bernoulli:0.5,-0.1"])
def test_bad_probabilities_are_refused(bad):
    with pytest.raises(UsageError, match="bernoulli"):
        ForceMode.parse(bad)
