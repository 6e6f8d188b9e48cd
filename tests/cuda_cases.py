"""Inputs and checks shared by the GPU tests of our kernels (their skips make them harmless
where no GPU is present)."""

import pytest
import torch

from verispec.ops import cuda_nvrtc

BF = torch.bfloat16
# the CUDA C++ kernels' tests: skipped only without the library or the GPU (a kernel that does not
# build fails them)
needs_bindings = pytest.mark.skipif(not (torch.cuda.is_available() and cuda_nvrtc.available(torch.device("cuda"))),
                                    reason="no cuda-bindings (NVRTC) or GPU older than sm_90")
MODEL_IDS = [6, 2, 8, 3, 1, 8]


def model_rows_by_arm(seed: int, arms) -> list:
    """The real-shaped model (4 layers of the 35B-A3B shape) built once; for each arm (graphs,
    setup: a function that sets the kernels' options first) a fresh engine's logits of MODEL_IDS
    decoded a row at a time, each asserted bit for bit equal to the same ids as one verify.
    -> the logits, one tensor an arm."""
    from test_cuda_fusions import _decode_and_verify
    from verispec.engine import Engine
    from verispec.execution import Execution
    from verispec.random_model import preset_config, random_checkpoint
    ck = random_checkpoint(preset_config("qwen3.6-35b-a3b-shape", layers=4), seed=seed, device="cuda")
    out = []
    for i, (graphs, setup) in enumerate(arms):
        setup()
        eng = Engine.from_checkpoint(ck, Execution.for_device("cuda", graphs=graphs))
        ones, many = _decode_and_verify(eng.model, MODEL_IDS)
        assert torch.equal(ones, many), (i, graphs)
        out.append(ones)
    return out


def moe_case():
    """A real-shaped MoE layer on the GPU and 16 rows: 256 experts of width 512, top 8, hidden
    2048; the router and the shared expert's gate/up rows in one block as Model holds them.
    -> (e, inter, h, k, router [264, h], shared gate/up [2 inter, h], x [16, h], resid [16, h],
    gate/up [e, 2 inter, h], down [e, h, inter], shared down [h, inter], norm weight [h])."""
    def rand(*shape):
        return torch.randn(*shape, device="cuda").to(BF)
    e, inter, h, k = 256, 512, 2048, 8
    pre = rand(1288, h) * h ** -0.5 * 4
    router, sgu = pre[:264], pre[e + 1:e + 1 + 2 * inter]
    hx, resid = rand(16, h), rand(16, h)
    gu, dn = rand(e, 2 * inter, h) * h ** -0.5, rand(e, h, inter) * inter ** -0.5
    sdown, nw = rand(h, inter) * inter ** -0.5, rand(h) * 0.1
    return e, inter, h, k, router, sgu, hx, resid, gu, dn, sdown, nw


def conv_runs(x, w, cw, ring0, m):
    """The DeltaNet input product of x[:m] with the causal conv of its first C = len(ring0) columns
    in its epilogue, and the same product followed by the per-row conv kernel, each from its own
    copy of ring0 with a slot for each kept row. -> (fused [m, N], product [m, N], conv [m, C],
    (fused's ring, its slots), (the kernel's ring, its slots))."""
    from verispec.ops import cuda_deltanet, cuda_gemv, cuda_slots
    c = ring0.shape[0]
    r1, r2 = ring0.clone(), ring0.clone()
    s1 = [torch.zeros_like(ring0) for _ in range(m - 1)]
    s2 = [torch.zeros_like(ring0) for _ in range(m - 1)] + [None]
    tab = cuda_slots.table_of(s1, r1) if m > 1 else None
    fused = cuda_gemv.linear_rows(x[:m], w, conv=cuda_gemv.ConvEpilogue(r1, cw, tab))
    y = cuda_gemv.linear_rows(x[:m], w)
    conv = cuda_deltanet.conv_rows(y[:, :c], r2, cw, s2 if m > 1 else [])
    return fused, y, conv, (r1, s1), (r2, s2)
