"""bench/cuda_stamps.py's grouping of per-CTA stamps into launches and its per-layer intervals (runs
on the CPU; the stamps themselves need a GPU)."""

import sys
from pathlib import Path

from pytest import approx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import cuda_stamps as cs  # noqa: E402


def _cta(tag, block, t0, t1, t2, t3):
    return [tag, block, block % 132, t0, t1, t2, t3]


def _layer(base):
    """One DeltaNet layer's three launches, two CTAs each, times in ns from base."""
    return [_cta(12352, 0, base, base + 8000, base + 1000, base + 16000),
            _cta(12352, 1, base + 200, base + 8100, base + 1200, base + 17000),
            _cta(1, 0, base + 9000, base + 17500, base + 18000, base + 20000),
            _cta(1, 1, base + 9500, base + 17600, base + 18400, base + 21000),
            _cta(2048, 0, base + 18000, base + 22000, base + 19000, base + 24000),
            _cta(2048, 1, base + 18100, base + 22500, base + 19500, base + 24500)]


def test_launches_split_by_tag_and_gap_in_order():
    recs = _layer(0) + _layer(48_000)
    ls = cs.launches(list(reversed(recs)))
    assert [e["kernel"] for e in ls] == ["in", "rec", "out"] * 2
    assert all(e["ctas"] == 2 for e in ls)
    assert ls[0]["end_max"] == 17000 and ls[0]["wait_min"] == 8000 and ls[3]["start_first"] == 48000


def test_intervals_of_a_layer():
    rows = cs.intervals(cs.launches(_layer(0) + _layer(48_000)))
    assert len(rows) == 2
    first, second = rows
    assert first["moe_to_in_wait"] is None
    assert second["moe_to_in_wait"] == approx(31.5)
    assert first["in_wait_to_end"] == approx(9.0)                  # 17000 - 8000
    assert first["rec_wake"] == approx(0.5)                        # 17500 - 17000
    assert first["rec_total"] == approx(4.0)                       # 21000 - 17000
    assert first["gated_norm"] == approx(1.0)                      # 22000 - 21000
    assert first["out_wait_to_end"] == approx(2.5)                 # 24500 - 22000
    assert first["rec_rest"] == approx(2.6)
