"""What the cluster router kernel (verispec/ops/cuda_norm_route.py) takes, on the CPU: the warps a
hidden size gets, the shapes it compiles for, and the inputs it declines (the model then runs
the two launches it replaces)."""

import torch

from verispec.ops import cuda_gemv, cuda_norm_route


def test_warps_divide_the_hidden_size():
    assert cuda_norm_route._warps(2048) == 16
    assert cuda_norm_route._warps(256) == 2
    assert cuda_norm_route._warps(384) == 3
    assert cuda_norm_route._warps(64) == 0


def test_shapes_it_compiles_for():
    assert cuda_norm_route._shape_ok(2048, 264, 256, 8, 8)
    assert cuda_norm_route._shape_ok(2048, 264, 256, 8, 16)
    assert not cuda_norm_route._shape_ok(2048, 264, 250, 8, 8)        # experts not a multiple of 32
    assert not cuda_norm_route._shape_ok(2048, 256, 256, 8, 8)        # no row for the shared gate
    assert not cuda_norm_route._shape_ok(2048, 264, 256, 8, 4)        # 66 rows a CTA: too many registers
    assert not cuda_norm_route._shape_ok(64, 40, 32, 4, 4)            # hidden under 128
    d = cuda_norm_route.defines(2048, 264, 256, 8, True, 16)
    assert d == {"HD": 2048, "NOUT": 264, "NE": 256, "TOPK": 8, "NORM": 1, "CL": 16, "WARPS": 16}


def test_declines_what_it_cannot_take():
    x = torch.zeros(2, 2048, dtype=torch.bfloat16)
    nw = torch.zeros(2048, dtype=torch.bfloat16)
    router = torch.zeros(264, 2048, dtype=torch.bfloat16)
    assert not cuda_norm_route.fits(x, x.clone(), nw, router, 256, 8)                     # not on a GPU
    parts = cuda_gemv.Partials(torch.zeros(2, 2, 2048), 2)
    assert not cuda_norm_route.fits(x, parts, nw, router, 256, 8)                         # split-K partials
