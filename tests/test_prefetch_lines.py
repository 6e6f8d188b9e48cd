"""How many L2 lines a product asks for before its wait (verispec/ops/cuda_prefetch.py): a
power of two, never past the program's share of K. Pure arithmetic: runs without a GPU."""

import pytest

from verispec.ops import cuda_prefetch


@pytest.mark.parametrize("setting,span,size,want", [
    (512, 2048, 2, 8),        # 512 bf16 = 1 KiB = 8 lines
    (512, 256, 2, 4),         # the program's chunk of K is shorter: 256 bf16 = 4 lines
    (0, 2048, 2, 0),          # off
    (100, 2048, 2, 1),        # 200 bytes: 1 whole line (rounded down)
    (32, 2048, 2, 0),         # under a line
    (1500, 4096, 2, 16),      # 23 lines -> the power of two below
    (512, 2048, 4, 16),       # fp32 weights
])
def test_lines(setting, span, size, want, monkeypatch):
    monkeypatch.setattr(cuda_prefetch, "prefetch_k", setting)
    assert cuda_prefetch.lines(span, size) == want
