"""The add + norm + router product and the router in one launch, a thread-block cluster a row
(verispec/ops/cuda_norm_route.py, cuda_fusions.ROUTE_CLUSTER) on the GPU: every row count's rows
equal the 16-row launch's bit for bit; the sum equals add_row_norm's, the norm is within bf16
rounding of it, the routing is a top-K of the softmax of the logits the kernel's own norm gives;
a CUDA graph's replay equals the eager launch; the model's verify rows equal its decode rows with
it, eager and graphed. Skipped without a CUDA GPU (CI) or where the kernel does not build."""

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")

from cuda_cases import moe_case, model_rows_by_arm  # noqa: E402

from verispec.ops import cuda_fusions, cuda_norm_route, cuda_norms  # noqa: E402

ROWS = list(range(1, 9)) + [12, 16]


@pytest.fixture(params=[8, 16])
def cluster(request, monkeypatch):
    if not cuda_norm_route.available(torch.device("cuda")):
        pytest.skip("the cluster router kernel does not build here")
    monkeypatch.setattr(cuda_norm_route, "CLUSTER", request.param)
    return request.param


def _inputs():
    """moe_case's layer with the router rows scaled down by 8: logits within a few units, where a
    bf16 step is under 2% (the routing's checks allow each logit one step)."""
    e, _, h, k, router, _, hx, resid, *_, nw = moe_case()
    return e, k, (router * 0.125).contiguous(), resid, hx * 0.5, nw


def _ref_logits(y, router):
    """bf16(y @ router^T) summed in fp64, and each logit's bf16 spacing (an upper bound): the
    kernel's fp32 sums may round a logit to a neighbour of the reference's."""
    lg = (y.double() @ router.double().T).to(torch.bfloat16).double()
    return lg, lg.abs().clamp_min(2.0 ** -126) * 2.0 ** -7


def _check_routing(y, router, w, i, e, k):
    """w, i [R, K + 1] against the logits of y in fp64, each logit allowed one bf16 step: the K ids
    are distinct and each picked logit is within two steps of the K-th largest; log w is within
    two of the picked logits' largest step of the renormalised softmax over the picked logits;
    the last slot is the shared expert with bf16(sigmoid(gate))."""
    lg, ulp = _ref_logits(y, router)
    ids = i[:, :k].long()
    assert all(len(set(r.tolist())) == k for r in ids)
    assert bool((ids >= 0).all() and (ids < e).all())
    kth = lg[:, :e].topk(k, dim=-1).values[:, -1:]
    kth_ulp = kth.abs().clamp_min(2.0 ** -126) * 2.0 ** -7
    picked = lg.gather(1, ids)
    assert bool((picked >= kth - 2 * kth_ulp).all())
    want = torch.log_softmax(picked, dim=-1)
    tol = 2 * ulp.gather(1, ids).max(dim=-1, keepdim=True).values + 1e-6
    assert bool(((w[:, :k].double().log() - want).abs() <= tol).all())
    assert bool((i[:, k] == e).all())
    gate = torch.sigmoid(lg[:, e]).to(torch.bfloat16).double()
    assert torch.allclose(w[:, k].double(), gate, atol=1e-2)


def test_rows_and_reference(cluster):
    e, k, router, x, hx, nw = _inputs()
    full = cuda_norm_route.add_norm_route(x, hx, nw, 1e-6, router, e, k, True)
    for m in ROWS:
        got = cuda_norm_route.add_norm_route(x[:m], hx[:m], nw, 1e-6, router, e, k, True)
        assert all(torch.equal(g, f[:m]) for g, f in zip(got, full)), m
    s, y, w, i = full
    s2, y2 = cuda_norms.add_row_norm(x, hx, nw, 1e-6)
    assert torch.equal(s, s2)
    assert (y.float() - y2.float()).norm() / y2.float().norm() < 1e-2
    _check_routing(y, router, w, i, e, k)
    # rows in another order: each row's outputs move with it, bit for bit
    perm = torch.randperm(16, device="cuda")
    got = cuda_norm_route.add_norm_route(x[perm].contiguous(), hx[perm].contiguous(), nw, 1e-6, router, e, k, True)
    assert all(torch.equal(g, f[perm]) for g, f in zip(got, full))


def test_unnormalised_weights(cluster):
    e, k, router, x, hx, nw = _inputs()
    s, y, w, i = cuda_norm_route.add_norm_route(x[:3], hx[:3], nw, 1e-6, router, e, k, False)
    lg, ulp = _ref_logits(y, router)
    want = torch.log_softmax(lg[:, :e], dim=-1).gather(1, i[:, :k].long())   # every logit counts here
    tol = 2 * ulp[:, :e].max(dim=-1, keepdim=True).values + 1e-6
    assert bool(((w[:, :k].double().log() - want).abs() <= tol).all())
    assert bool((w[:, :k].sum(-1) < 1).all())                                  # not renormalised


def test_graph_replay_equals_eager(cluster):
    e, k, router, x, hx, nw = _inputs()
    for m in (1, 4):
        want = cuda_norm_route.add_norm_route(x[:m], hx[:m], nw, 1e-6, router, e, k, True)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            cuda_norm_route.add_norm_route(x[:m], hx[:m], nw, 1e-6, router, e, k, True)   # built before capture
        torch.cuda.current_stream().wait_stream(stream)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = cuda_norm_route.add_norm_route(x[:m], hx[:m], nw, 1e-6, router, e, k, True)
        for t in out:
            t.zero_()
        g.replay()
        torch.cuda.synchronize()
        assert all(torch.equal(a, b) for a, b in zip(out, want)), m


def test_model_rows_invariant_with_the_cluster_router(cluster, monkeypatch):
    """The 4-layer real-shaped model: with ROUTE_CLUSTER a verify's rows equal decode rows bit for
    bit, eager and graphed alike, and the launch is taken (counted); its logits differ from the
    default's only by the other sums' roundings."""
    calls = []
    real = cuda_norm_route.add_norm_route

    def counted(*a, **kw):
        calls.append(1)
        return real(*a, **kw)
    monkeypatch.setattr(cuda_norm_route, "add_norm_route", counted)
    monkeypatch.setattr(cuda_fusions, "ROUTE_CLUSTER", False)      # (put back after the test)

    def route(on):
        return lambda: setattr(cuda_fusions, "ROUTE_CLUSTER", on)
    default, eager, graphed = model_rows_by_arm(5, [(True, route(False)), (False, route(True)), (True, route(True))])
    assert calls
    assert torch.equal(eager, graphed)
    assert (default - graphed).abs().max() < 0.25 * default.abs().max()


def test_cluster_size_moves_no_bit(monkeypatch):
    """A row's sums do not depend on how its columns are dealt to the cluster's CTAs."""
    if not cuda_norm_route.available(torch.device("cuda")):
        pytest.skip("the cluster router kernel does not build here")
    e, k, router, x, hx, nw = _inputs()
    got = {}
    for size in (8, 12, 16):
        monkeypatch.setattr(cuda_norm_route, "CLUSTER", size)
        got[size] = cuda_norm_route.add_norm_route(x[:5], hx[:5], nw, 1e-6, router, e, k, True)
    assert all(torch.equal(a, b) for a, b in zip(got[12], got[8]))
    assert all(torch.equal(a, b) for a, b in zip(got[16], got[8]))
