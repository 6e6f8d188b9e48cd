"""Where NVRTC cannot build the stream products' kernel (cuda-bindings without a matching
libnvrtc, say), verispec says so once and runs the Triton products: no GPU needed to check it."""

import torch

from verispec.ops import cuda_nvrtc, cuda_stream_gemv


def test_a_kernel_that_does_not_build_turns_the_stream_products_off(monkeypatch, capsys):
    calls = []

    def fail(*args):
        calls.append(args)
        raise RuntimeError("compiling cuda_stream_gemv.cu failed:\nnvrtc: error: no such architecture")
    monkeypatch.setattr(cuda_nvrtc, "available", lambda device: True)
    monkeypatch.setattr(cuda_stream_gemv, "_kernel", fail)
    monkeypatch.setattr(cuda_stream_gemv, "_builds", {})
    dev = torch.device("cuda", 0)
    assert not cuda_stream_gemv.available(dev)
    assert not cuda_stream_gemv.available(dev)          # decided once
    assert len(calls) == 1
    err = capsys.readouterr().err
    assert err.count("the CUDA C++ products are off (the Triton ones run): compiling cuda_stream_gemv.cu failed") == 1
