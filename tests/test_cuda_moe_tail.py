"""The MoE after its router as one persistent CUDA launch (verispec/ops/cuda_moe_tail.py) on the
GPU: every row count bit for bit against the 16-row launch, eager and in a CUDA graph, against
torch in fp32 and against the three Triton launches it replaces; the model's verify rows equal
its decode rows with it. Skipped without a CUDA GPU (CI) or without cuda-bindings."""

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")

from cuda_cases import model_rows_by_arm, moe_case, needs_bindings  # noqa: E402

from verispec.ops import cuda_fusions, cuda_gemv, cuda_moe, cuda_moe_tail  # noqa: E402

ROWS = list(range(1, 9)) + [12, 16]


@pytest.fixture
def tail_restored():
    kept = cuda_fusions.MOE_TAIL
    yield
    cuda_fusions.MOE_TAIL = kept


def _moe_case(seed=5):
    torch.manual_seed(seed)
    e, inter, h, k, router, sgu, hx, resid, gu, dn, sdown, nw = moe_case()
    w, i = cuda_moe.route_shared(cuda_gemv.linear_rows(hx, router, partials=True), 16, e, k, True)
    return dict(x=hx, top_w=w, top_i=i, gu_all=gu, down_all=dn, shared_gu=sgu, shared_down=sdown,
                resid=resid, norm_w=nw)


def _rows(case, m):
    return {k: (v[:m] if k in ("x", "top_w", "top_i", "resid") else v) for k, v in case.items()}


@needs_bindings
@pytest.mark.parametrize("ring", [None, (16384, 8, 1)])
def test_moe_tail_rows_graph_reference_and_triton(tail_restored, monkeypatch, ring):
    """Each ring (the default, and 16 KiB slots, 8 warps, one each): rows, graph, torch, Triton."""
    if ring is not None:
        for name, v in zip(("SLOT", "WARPS", "SPW"), ring):
            monkeypatch.setattr(cuda_moe_tail, name, v)
    case = _moe_case()
    assert cuda_moe_tail.fits(**case)                  # the persistent kernel runs, not the fallback
    full = cuda_moe_tail.experts_add_norm(**case, eps=1e-6)
    ctr = cuda_moe_tail._counters[torch.cuda.current_device()]
    assert torch.equal(ctr, torch.zeros_like(ctr))     # the grid barrier's counters put back
    for m in ROWS:
        got = cuda_moe_tail.experts_add_norm(**_rows(case, m), eps=1e-6)
        assert all(torch.equal(g, f[:m]) for g, f in zip(got, full)), m
    # in a CUDA graph (with PDL, as the model captures it), replayed twice
    sub = _rows(case, 3)
    cuda_moe_tail.experts_add_norm(**sub, eps=1e-6)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        graphed = cuda_moe_tail.experts_add_norm(**sub, eps=1e-6)
    for _ in range(2):
        g.replay()
        torch.cuda.synchronize()
        assert all(torch.equal(a, b[:3]) for a, b in zip(graphed, full))
    # torch in fp32, from the same routing
    s, y = full
    k = case["top_i"].shape[1] - 1
    hf = case["x"].float()
    routed = cuda_moe._routed_experts_torch(case["x"], case["top_w"][:, :k], case["top_i"][:, :k].long(),
                                            case["gu_all"], case["down_all"]).float()
    inter = case["shared_gu"].shape[0] // 2
    g_u = hf @ case["shared_gu"].float().T
    shared = (F.silu(g_u[:, :inter]) * g_u[:, inter:]) @ case["shared_down"].float().T
    s_ref = case["resid"].float() + routed + case["top_w"][:, k:] * shared
    y_ref = s_ref * torch.rsqrt(s_ref.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + case["norm_w"].float())
    assert (s.float() - s_ref).norm() / s_ref.norm() < 1e-2
    assert (y.float() - y_ref).norm() / y_ref.norm() < 1e-2
    # the three Triton launches it replaces: the same sums in other orders
    cuda_fusions.MOE_TAIL, stream_moe = False, cuda_fusions.STREAM_MOE
    cuda_fusions.STREAM_MOE = False
    s3, y3 = cuda_moe.experts_add_norm(**case, eps=1e-6)
    cuda_fusions.STREAM_MOE = stream_moe
    assert (s.float() - s3.float()).norm() / s3.float().norm() < 4e-3
    assert (y.float() - y3.float()).norm() / y3.float().norm() < 4e-3


@needs_bindings
def test_model_rows_invariant_with_the_moe_tail(tail_restored):
    """The real-shaped model with the persistent MoE: a verify's rows equal decode rows bit for
    bit, eager and graphed alike, and the graphed logits equal the eager ones."""
    def tail(on):
        return lambda: setattr(cuda_fusions, "MOE_TAIL", on)
    got = model_rows_by_arm(23, [(False, tail(True)), (True, tail(True)), (False, tail(False))])
    assert torch.equal(got[0], got[1])
    assert not torch.equal(got[2], got[0])       # the fusion did run (its sums differ from the other kernels')
    assert (got[2] - got[0]).abs().max() < 0.25 * got[2].abs().max()

