"""bench/cuda_chain_probe.py's launch list (runs on the CPU; the probe itself needs a GPU): a launch
per phase over contiguous units holding the phase's bytes, the routed experts never requested before
their wait, the byte-less phases (or the costed phases' folds) carrying their latency."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import cuda_chain_probe as chain  # noqa: E402
import cuda_step_probe as probe  # noqa: E402

from verispec.random_model import preset_config  # noqa: E402


def test_a_launch_per_phase_in_order():
    cfg = preset_config("qwen3.6-35b-a3b-shape", layers=4)
    ph = probe.phases(cfg)
    for pre in (False, True):
        for early in (False, True):
            seq = chain.launches(ph, 700, pre, early)
            assert len(seq) == len(ph)
            u = 0
            for (u0, n, ns, p, e), (name, nbytes, routed) in zip(seq, ph):
                assert u0 == u and n == -(-nbytes // probe.UNIT)
                assert ns == (700 if nbytes == 0 else 0)
                assert p == (pre and not routed) and e == early
                u += n


def test_predicted_experts_are_requested_ahead_only_when_asked():
    cfg = preset_config("qwen3.6-35b-a3b-shape", layers=4)
    ph = probe.phases(cfg)
    plain = chain.launches(ph, 700, True, False)
    pred = chain.launches(ph, 700, True, False, pred=True)
    routed = [q[2] for q in ph]
    assert any(routed) and not all(routed)
    assert [s[3] for s in pred] == [True] * len(ph)
    assert [s[3] for s in plain] == [not r for r in routed]
    assert [s[:3] for s in pred] == [s[:3] for s in plain]
    assert not any(s[3] for s in chain.launches(ph, 700, False, True, pred=True))


def test_costed_phases_keep_their_own_latency():
    cfg = preset_config("qwen3.6-35b-a3b-shape", layers=4)
    costed = probe.costed_phases(cfg, 1000, 700, 500)
    seq = chain.launches(costed, 12345, True, True)
    assert [s[2] for s in seq] == [q[3] for q in costed]
    assert sum(s[1] for s in seq) == sum(-(-q[1] // probe.UNIT) for q in costed)


def test_the_probe_kernels_get_the_shared_helpers_once():
    """Both probe kernels call the helpers of bench/cuda_probe.cuh, which probe_source puts in front
    (NVRTC is given only the package's headers), and neither defines its own copy."""
    for name in ("cuda_step_probe.cu", "cuda_chain_probe.cu"):
        src = probe.probe_source(name)
        assert src.count("void spin_ns(") == 1 and src.count("unsigned xor_unit(") == 1, name
        assert "spin_ns(ns)" in src and "xor_unit<UNIT>(" in src, name
        assert src.count("globaltimer") == 2, name          # spin_ns's two reads of the timer, no other


def test_early_by_phase_name():
    """The engine arms: only the phases named launch their successor early, and every name is a phase's."""
    cfg = preset_config("qwen3.6-35b-a3b-shape", layers=4)
    ph = probe.phases(cfg)
    names = {q[0] for q in ph}
    assert chain.ENGINE_EARLY | chain.MOE_EARLY <= names
    for chosen in (chain.ENGINE_EARLY, chain.ENGINE_EARLY | chain.MOE_EARLY):
        seq = chain.launches(ph, 700, True, chosen, pred=True)
        assert [s[4] for s in seq] == [q[0] in chosen for q in ph]
        assert any(s[4] for s in seq) and not all(s[4] for s in seq)
