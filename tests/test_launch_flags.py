"""Which of our kernels let their successor launch before their own wait (cuda_launch.flags):
only where that successor can be a stream product, i.e. where the stream kernel builds. The
decision reads no GPU once the capability is known, so it is checked here without one; the
GPU suites check that the launches it picks keep every bit (tests/test_cuda_stream_gemv.py)."""

import pytest
import torch

from verispec.ops import cuda_fusions, cuda_launch, cuda_nvrtc, cuda_stream_gemv

DEV = torch.device("cuda", 0)


@pytest.fixture
def hopper(monkeypatch):
    monkeypatch.setattr(cuda_launch, "enabled", True)
    monkeypatch.setattr(cuda_nvrtc, "_hopper", {0: True})
    monkeypatch.setattr(cuda_launch, "EARLY_STREAM", True)
    monkeypatch.setattr(cuda_launch, "LINKS", False)
    monkeypatch.setattr(cuda_fusions, "STREAM", True)


@pytest.mark.parametrize("builds", [True, False])
def test_early_only_where_the_stream_products_run(hopper, monkeypatch, builds):
    monkeypatch.setattr(cuda_stream_gemv, "available", lambda device: builds)
    f = cuda_launch.flags(DEV, early=True)
    assert f["EARLY"] is builds and f["PDL"] is True and f["launch_pdl"] is True
    assert cuda_launch.flags(DEV, early=False)["EARLY"] is False
    assert "EARLY" not in cuda_launch.flags(DEV)          # a kernel without the option gets none


def test_links_and_the_switches(hopper, monkeypatch):
    monkeypatch.setattr(cuda_stream_gemv, "available", lambda device: True)
    assert cuda_launch.flags(DEV, early="link")["EARLY"] is False
    monkeypatch.setattr(cuda_launch, "LINKS", True)
    assert cuda_launch.flags(DEV, early="link")["EARLY"] is True
    monkeypatch.setattr(cuda_fusions, "STREAM", False)
    assert cuda_launch.flags(DEV, early=True)["EARLY"] is False
    monkeypatch.setattr(cuda_fusions, "STREAM", True)
    monkeypatch.setattr(cuda_launch, "EARLY_STREAM", False)
    assert cuda_launch.flags(DEV, early=True)["EARLY"] is False


def test_no_pdl_before_hopper_or_when_off(hopper, monkeypatch):
    monkeypatch.setattr(cuda_stream_gemv, "available", lambda device: True)
    monkeypatch.setattr(cuda_nvrtc, "_hopper", {0: False})
    assert cuda_launch.flags(DEV, early=True) == {"EARLY": False, "PDL": False}
    monkeypatch.setattr(cuda_nvrtc, "_hopper", {0: True})
    monkeypatch.setattr(cuda_launch, "enabled", False)
    assert cuda_launch.flags(DEV, early=True) == {"EARLY": False, "PDL": False}
    assert cuda_launch.flags(torch.device("cpu")) == {"PDL": False}
