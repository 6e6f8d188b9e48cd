"""The MoE's expert products in the stream design (verispec/ops/cuda_stream_moe.py) on the GPU:
every row count's pairs bit for bit against the 16-row launch and against each row alone, eager
and in a CUDA graph, right after the router's launch as the model runs them; against torch in
fp32 and against the Triton kernels (other sums, close); the real-shaped model's verify rows equal
its decode rows with them, eager and graphed, with and without the router letting them launch
early. Skipped without a CUDA GPU (CI) or without cuda-bindings."""

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")

from cuda_cases import model_rows_by_arm, moe_case, needs_bindings  # noqa: E402

from verispec.ops import cuda_fusions, cuda_gemv, cuda_moe, cuda_stream_moe  # noqa: E402

ROWS = list(range(1, 9)) + [12, 16]


@pytest.fixture
def stream_moe_on():
    kept = cuda_fusions.STREAM_MOE, cuda_fusions.MOE_TAIL, cuda_stream_moe.EARLY_ROUTE
    cuda_fusions.STREAM_MOE, cuda_fusions.MOE_TAIL = True, False
    yield
    cuda_fusions.STREAM_MOE, cuda_fusions.MOE_TAIL, cuda_stream_moe.EARLY_ROUTE = kept


def _routed(m, case):
    """The router's launch for x[:m] (its ids, slot K the shared expert), then the pairs."""
    e, inter, h, k, router, sgu, hx, resid, gu, dn, sdown, nw = case
    w, i = cuda_moe.route_shared(cuda_gemv.linear_rows(hx[:m], router, partials=True), m, e, k, True, early=True)
    return i, cuda_stream_moe.pairs(hx[:m], i, gu, dn, sgu, sdown)


@needs_bindings
@pytest.mark.parametrize("gr", [8, 4])
def test_stream_moe_rows_graph_and_reference(stream_moe_on, monkeypatch, gr):
    """Each gate/up task width (GR act columns): rows, graph, torch, Triton."""
    monkeypatch.setattr(cuda_stream_moe, "GR", gr)
    monkeypatch.setattr(cuda_stream_moe, "GSPW", 24 // gr)
    torch.manual_seed(11)
    case = moe_case()
    e, inter, h, k, router, sgu, hx, resid, gu, dn, sdown, nw = case
    slots = k + 1
    assert cuda_moe.stream_moe_runs(hx, slots, gu, dn, sgu, sdown)
    ids, full = _routed(16, case)
    assert (ids[:, k] == e).all() and full.shape == (16 * slots, h) and full.dtype == torch.float32
    singles = [cuda_stream_moe.pairs(hx[r:r + 1], ids[r:r + 1].contiguous(), gu, dn, sgu, sdown) for r in range(16)]
    for m in ROWS:
        i, got = _routed(m, case)
        assert torch.equal(i, ids[:m]), m
        assert torch.equal(got, full[:m * slots]), m
        assert all(torch.equal(got[r * slots:(r + 1) * slots], singles[r]) for r in range(m)), m
    # in a CUDA graph (with PDL, as the model captures it), replayed twice
    _routed(3, case)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        _, graphed = _routed(3, case)
    for _ in range(2):
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(graphed, full[:3 * slots])
    # torch in fp32 from the same ids (act rounded to bf16 as the kernel stores it)
    ref = []
    for r in range(16):
        for s in range(slots):
            wgu, wdn = (sgu, sdown) if s == k else (gu[ids[r, s]], dn[ids[r, s]])
            g_u = hx[r:r + 1].float() @ wgu.float().T
            a = (F.silu(g_u[:, :inter]) * g_u[:, inter:]).to(torch.bfloat16).float()
            ref.append(a @ wdn.float().T)
    ref = torch.cat(ref)
    assert (full - ref).norm() / ref.norm() < 1e-2
    # the Triton kernels: the same products summed in other orders
    tri = cuda_moe._pairs(hx, ids.reshape(-1), gu, dn, slots, sgu, sdown)
    assert not torch.equal(tri, full)
    assert (full - tri).norm() / tri.norm() < 1e-2


@needs_bindings
def test_stream_moe_in_the_fused_moe_and_a_clear_error(stream_moe_on):
    """experts_add_norm runs the stream kernels (the combine after them unchanged): every row
    count's sum and norm bit for bit against 16 rows; more than 16 rows is a clear error."""
    torch.manual_seed(12)
    e, inter, h, k, router, sgu, hx, resid, gu, dn, sdown, nw = moe_case()

    def run(m):
        w, i = cuda_moe.route_shared(cuda_gemv.linear_rows(hx[:m], router, partials=True), m, e, k, True, early=True)
        return cuda_moe.experts_add_norm(hx[:m], w, i, gu, dn, sgu, sdown, resid[:m], nw, 1e-6)

    full = run(16)
    for m in ROWS:
        got = run(m)
        assert torch.equal(got[0], full[0][:m]) and torch.equal(got[1], full[1][:m]), m
    cuda_fusions.STREAM_MOE = False
    tri = run(16)
    assert not torch.equal(tri[0], full[0])
    assert (tri[0].float() - full[0].float()).norm() / tri[0].float().norm() < 4e-3
    big = torch.randn(17, h, device="cuda").to(torch.bfloat16)
    with pytest.raises(ValueError, match="stream_moe takes"):
        cuda_stream_moe.pairs(big, torch.zeros(17, k + 1, dtype=torch.int32, device="cuda"), gu, dn, sgu, sdown)


@needs_bindings
def test_model_rows_invariant_with_stream_moe(stream_moe_on):
    """The real-shaped model with the stream expert products: a verify's rows equal decode rows
    bit for bit, eager and graphed alike, with and without the router's early launch (the same
    logits); the Triton expert kernels give other sums, close to these."""
    def early(on):
        return lambda: setattr(cuda_stream_moe, "EARLY_ROUTE", on)

    def triton():
        cuda_fusions.STREAM_MOE = False
    got = model_rows_by_arm(31, [(False, early(True)), (True, early(True)), (True, early(False)), (False, triton)])
    assert torch.equal(got[0], got[1]) and torch.equal(got[1], got[2])
    assert not torch.equal(got[3], got[0])
    assert (got[3] - got[0]).abs().max() < 0.25 * got[3].abs().max()
