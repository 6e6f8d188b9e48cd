"""The bundled model: loads with no --model, passes the exactness harness like the fixtures."""

import functools

import pytest

from harness import SAMPLED, arm_settings, assert_same, plain_settings, run
from verispec.config import BUNDLED_MODEL
from verispec.engine import Engine

pytestmark = pytest.mark.skipif(not (BUNDLED_MODEL / "config.json").exists(), reason="bundled model not installed")

CODE = "def fibonacci(n):\n    "


@functools.lru_cache(maxsize=None)
def _engine(tmp):
    return Engine(BUNDLED_MODEL, usage_file=tmp)


@pytest.fixture
def eng(tmp_path_factory):
    # the counts file goes to a temporary directory: tests never write into the package
    return _engine(str(tmp_path_factory.getbasetemp() / "vocab_usage.bin"))


@pytest.mark.parametrize("sampled", [False, True])
def test_bundled_model_drafts_vs_no_drafts(eng, sampled):
    prompt = eng.encode(CODE)
    base = plain_settings(48, sampling=SAMPLED if sampled else plain_settings().sampling)
    plain = run(eng, prompt, base)
    arms = [dict(lookup=True, mtp="off"), dict(lookup=False, mtp="on", mtp_drafts=1),
            dict(lookup=False, mtp="on", mtp_drafts=3), dict(lookup=True, mtp="on", mtp_drafts=0, gate=True),
            dict(lookup=True, mtp="on", mtp_drafts=2, gate=True)]
    for a in arms:
        arm = run(eng, prompt, arm_settings(base, **a))
        assert_same(plain, arm, str(a))
    forced = run(eng, prompt, arm_settings(base, lookup=False, mtp="on", mtp_drafts=2, force="cycle",
                                           reference=tuple(plain.ids)))
    assert_same(plain, forced, "forced cycle")


def test_bundled_model_mtp_drafts_are_accepted(eng):
    prompt = eng.encode(CODE)
    r = run(eng, prompt, arm_settings(plain_settings(64), lookup=False, mtp="on", mtp_drafts=1, mtp_vocab=0))
    s = r.stats["by_source"]["mtp"]
    assert s["verifies"] >= 10 and s["accepted"] >= 1
