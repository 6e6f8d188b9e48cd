"""The DeltaNet recurrence as a CUDA C++ kernel written for latency (verispec/ops/cuda_recurrence.py)
on the GPU: every row count in one launch against one row a launch (outputs, final state and each
kept row's slot, bit for bit); against the delta rule in fp64 and against the Triton kernel; replayed
in a CUDA graph; the model's verify rows equal to its decode rows with it, eager and graphed.
Skipped without a CUDA GPU (CI) or where the kernel does not build."""

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")

from cuda_cases import BF, model_rows_by_arm  # noqa: E402

from verispec.ops import cuda_deltanet as cd  # noqa: E402
from verispec.ops import cuda_fusions, cuda_recurrence, cuda_slots  # noqa: E402

ROWS = list(range(1, 9)) + [12, 16]
HK, HV, DK, DV = 16, 32, 128, 128


@pytest.fixture
def rec_on():
    if not cuda_recurrence.available(torch.device("cuda")):
        pytest.skip("the CUDA C++ recurrence does not build here")
    old = cuda_fusions.REC
    cuda_fusions.REC = True
    yield
    cuda_fusions.REC = old


def _case(seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    proj = torch.randn(16, 2 * HK * DK + HV * DV + 100, device="cuda", generator=g).to(BF)   # a wider row stride
    ba = torch.randn(16, 2 * HV + 8, device="cuda", generator=g).to(BF)
    alog = torch.rand(HV, device="cuda", generator=g) * 4
    dtb = torch.randn(HV, device="cuda", generator=g).to(BF)
    s0 = torch.randn(HV, DK, DV, device="cuda", generator=g) * 0.1
    return proj[:, :2 * HK * DK + HV * DV], ba, alog, dtb, s0


def _steps(mixed, ba, alog, dtb, state, tab):
    return cd.delta_steps(mixed, ba, alog, dtb, state, tab, HK, DK, DV, out_dtype=BF)


def _reference(mixed, ba, alog, dtb, s0, eps=1e-6):
    """The delta rule in fp64, row after row -> (outputs [R, HV, DV], the state after each row)."""
    rows, rep = mixed.shape[0], HV // HK
    x = mixed.double()
    qs, ks = x[:, :HK * DK].view(rows, HK, DK), x[:, HK * DK:2 * HK * DK].view(rows, HK, DK)
    vs = x[:, 2 * HK * DK:].view(rows, HV, DV)
    s, outs, states = s0.double().clone(), [], []
    for r in range(rows):
        q, k = qs[r].repeat_interleave(rep, 0), ks[r].repeat_interleave(rep, 0)
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + eps) * DK ** -0.5
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + eps)
        beta = torch.sigmoid(ba[r, :HV].float()).to(BF).double()
        a = ba[r, HV:2 * HV].double() + dtb.double()
        s = s * torch.exp(-alog.double() * torch.where(a > 20, a, torch.log1p(torch.exp(a))))[:, None, None]
        delta = (vs[r] - torch.einsum("hkv,hk->hv", s, k)) * beta[:, None]
        s = s + k[:, :, None] * delta[:, None, :]
        outs.append(torch.einsum("hkv,hk->hv", s, q))
        states.append(s.clone())
    return torch.stack(outs), states


def test_rows_in_one_launch_equal_a_row_a_launch(rec_on):
    mixed, ba, alog, dtb, s0 = _case()
    assert cuda_recurrence.fits(mixed, ba, alog, dtb, s0, HK, DK, DV, BF)
    for m in ROWS:
        st1, st2 = s0.clone(), s0.clone()
        sl1 = [torch.zeros_like(s0) for _ in range(m - 1)]
        one = _steps(mixed[:m], ba[:m], alog, dtb, st1, cuda_slots.table_of(sl1, st1) if m > 1 else None)
        singles, sl2 = [], []
        for i in range(m):
            singles.append(_steps(mixed[i:i + 1], ba[i:i + 1], alog, dtb, st2, None))
            if i < m - 1:
                sl2.append(st2.clone())
        assert torch.equal(one, torch.cat(singles)) and torch.equal(st1, st2), m
        assert all(torch.equal(a, b) for a, b in zip(sl1, sl2)), m


def test_against_the_delta_rule_and_the_triton_kernel(rec_on):
    mixed, ba, alog, dtb, s0 = _case(1)
    st, slots = s0.clone(), [torch.zeros_like(s0) for _ in range(15)]
    out = _steps(mixed, ba, alog, dtb, st, cuda_slots.table_of(slots, st))
    ref, states = _reference(mixed, ba, alog, dtb, s0)
    for got, want in zip(slots + [st], states):
        assert torch.allclose(got.double(), want, rtol=1e-4, atol=1e-5)
    assert torch.allclose(out.double(), ref, rtol=1e-2, atol=2e-3)       # bf16 outputs
    cuda_fusions.REC = False
    st_t = s0.clone()
    out_t = _steps(mixed, ba, alog, dtb, st_t, None)
    assert torch.allclose(st_t, st, rtol=1e-4, atol=1e-5)
    assert torch.allclose(out_t.float(), out.float(), rtol=1e-2, atol=2e-3)
    assert not torch.equal(st_t, st)        # another order of sums: the Triton kernel really ran


def test_graph_replay_equals_eager(rec_on):
    mixed, ba, alog, dtb, s0 = _case(2)
    st_e = s0.clone()
    want = _steps(mixed[:3], ba[:3], alog, dtb, st_e, None)
    st_g = s0.clone()
    _steps(mixed[:3], ba[:3], alog, dtb, st_g, None)           # compiled before the capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = _steps(mixed[:3], ba[:3], alog, dtb, st_g, None)
    for _ in range(2):
        st_g.copy_(s0)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, want) and torch.equal(st_g, st_e)


def test_model_rows_invariant_with_the_cuda_recurrence(rec_on):
    def setter(on):
        def set_():
            cuda_fusions.REC = on
        return set_
    triton_graphed, eager, graphed = model_rows_by_arm(3, [(True, setter(False)), (False, setter(True)),
                                                           (True, setter(True))])
    assert torch.equal(eager, graphed)
    assert not torch.equal(triton_graphed, graphed)          # other sums: the bf16 roundings move
    assert (triton_graphed - graphed).abs().max() < 0.25 * triton_graphed.abs().max()


def test_links_and_stamps_keep_the_bits(rec_on):
    """cuda_launch.LINKS (the kernel lets the next launch before its wait: TRIG 2) and the stamps
    build (bench/cuda_stamps.py) move no bit: the model's logits equal the default's, graphed; the
    stamps build's outputs equal the plain kernel's and it writes one record a CTA, times in order."""
    from verispec.ops import cuda_launch
    kept = cuda_launch.LINKS

    def links(on):
        def set_():
            cuda_launch.LINKS = on
        return set_
    try:
        plain, linked = model_rows_by_arm(3, [(True, links(False)), (True, links(True))])
    finally:
        cuda_launch.LINKS = kept
    assert torch.equal(plain, linked)
    mixed, ba, alog, dtb, s0 = _case(4)
    st = s0.clone()
    want = _steps(mixed[:3], ba[:3], alog, dtb, st, None)
    buf = torch.zeros(8 + 8 * 1024, dtype=torch.int64, device="cuda")
    cuda_recurrence.STAMPS = buf
    try:
        st2 = s0.clone()
        got = _steps(mixed[:3], ba[:3], alog, dtb, st2, None)
        torch.cuda.synchronize()
    finally:
        cuda_recurrence.STAMPS = None
    assert torch.equal(got, want) and torch.equal(st2, st)
    ctas = HV * DV // (cuda_recurrence.CB * cuda_recurrence.WARPS)
    assert int(buf[0]) == ctas
    recs = buf[8:8 + 8 * ctas].view(ctas, 8)
    assert bool((recs[:, 3] <= recs[:, 4]).all() and (recs[:, 4] <= recs[:, 5]).all() and (recs[:, 5] <= recs[:, 6]).all())
