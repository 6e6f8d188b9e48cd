"""cuda_stream_gemv.conv_fits, without a GPU: the kernel's conv runs a thread a conv column of a CTA's
tasks, so a setting with fewer threads than that must not take the conv (it would skip columns)."""

import torch

from verispec.ops import cuda_nvrtc, cuda_stream_gemv

K, N, C = 2048, 12352, 8192     # the DeltaNet input product of the 35B-A3B shape, its conv's channels


def test_conv_needs_a_thread_for_each_conv_column(monkeypatch):
    w = torch.empty(N, K, dtype=torch.bfloat16, device="meta")
    monkeypatch.setattr(cuda_nvrtc, "sm_count", lambda device: 132)
    assert cuda_stream_gemv.conv_fits(w, C)             # configured: 6 tasks of 16 columns, 256 threads
    monkeypatch.setitem(cuda_stream_gemv.CONFIG, (K, N), (2, 4, 256, 2))
    assert cuda_stream_gemv._tasks(N, 2, 132) * 16 == 96
    assert cuda_stream_gemv.conv_fits(w, C)             # 4 warps (the coresident arms): 96 of 128 threads
    monkeypatch.setattr(cuda_nvrtc, "sm_count", lambda device: 33)
    tasks = cuda_stream_gemv._tasks(N, 2, 33)
    assert tasks * 16 > 128 and cuda_stream_gemv._smem(2, 4, 256, 2, tasks) <= cuda_stream_gemv.SMEM_MAX
    assert not cuda_stream_gemv.conv_fits(w, C)         # shared memory would fit; the threads do not
    assert not cuda_stream_gemv.conv_fits(w, C + 8)     # not whole tasks of conv columns
