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


def test_config_refuses_what_the_kernel_cannot_build(monkeypatch):
    """config() answers None (the Triton product runs) where cuda_stream_gemv.cu's static_asserts would
    stop NVRTC: the partial sums' reduction needs two elements a thread at most, 8 or 16 columns a task."""
    assert cuda_stream_gemv.config(K, N) == cuda_stream_gemv.CONFIG[(K, N)]
    monkeypatch.setitem(cuda_stream_gemv.CONFIG, (K, N), (2, 4, 256, 2))
    assert cuda_stream_gemv.config(K, N) is not None      # 128 threads for 16 rows x 16 columns / 2
    monkeypatch.setitem(cuda_stream_gemv.CONFIG, (K, N), (2, 2, 256, 2))
    assert cuda_stream_gemv.config(K, N) is None          # 64 threads
    monkeypatch.setitem(cuda_stream_gemv.CONFIG, (K, N), (1, 2, 256, 2))
    assert cuda_stream_gemv.config(K, N) is not None      # 8 columns a task: 64 threads suffice
    monkeypatch.setitem(cuda_stream_gemv.CONFIG, (K, N), (4, 8, 256, 1))
    assert cuda_stream_gemv.config(K, N) is None          # 32 columns a task
