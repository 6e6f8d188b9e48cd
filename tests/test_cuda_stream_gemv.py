"""The mixers' products with their weights requested before the wait (verispec/ops/cuda_stream_gemv.py)
on the GPU: every row count bit for bit against the 16-row launch and against each row alone,
eager and in a CUDA graph, against torch in fp32 and the Triton product; the causal conv in its
epilogue; the model's verify rows equal its decode rows with it, eager and graphed, with and
without the early launches before it. Skipped without a CUDA GPU (CI) or without cuda-bindings."""

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")

from cuda_cases import model_rows_by_arm, needs_bindings  # noqa: E402

from verispec.ops import cuda_fusions, cuda_gemv, cuda_launch, cuda_stream_gemv  # noqa: E402

ROWS = list(range(1, 9)) + [12, 16]
BF = torch.bfloat16


def _rand(*shape):
    return torch.randn(*shape, device="cuda").to(BF)


def _replays(fn, times):
    """fn() run eagerly once, then captured in a CUDA graph and replayed `times` times: the graph's
    output after each replay (the same tensor, yielded once a replay has finished)."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    for _ in range(times):
        g.replay()
        torch.cuda.synchronize()
        yield out


def _graphed(fn):
    """fn() run eagerly once, then captured in a CUDA graph and replayed: the graph's output."""
    return list(_replays(fn, 1))[-1]


@pytest.fixture
def stream_on():
    kept = cuda_fusions.STREAM, cuda_launch.EARLY_STREAM
    cuda_fusions.STREAM = True
    yield
    cuda_fusions.STREAM, cuda_launch.EARLY_STREAM = kept


@needs_bindings
@pytest.mark.parametrize("k,n", sorted(cuda_stream_gemv.CONFIG))
def test_stream_rows_graph_and_reference(stream_on, k, n):
    torch.manual_seed(k + n)
    w, x = _rand(n, k) * k ** -0.5, _rand(16, k)
    assert cuda_gemv.streams(w) and cuda_stream_gemv.fits(x, w)    # the CUDA kernel runs, not the Triton one
    full = cuda_gemv.linear_rows(x, w)
    single = [cuda_gemv.linear_rows(x[i:i + 1], w) for i in range(16)]
    for m in ROWS:
        got = cuda_gemv.linear_rows(x[:m], w)
        assert torch.equal(got, full[:m]), m
        assert all(torch.equal(got[i:i + 1], single[i]) for i in range(m)), m
    # in a CUDA graph (with PDL, as the model captures it), replayed twice
    for graphed in _replays(lambda: cuda_gemv.linear_rows(x[:3], w), 2):
        assert torch.equal(graphed, full[:3])
    ref = F.linear(x.float(), w.float())
    assert (full.float() - ref).norm() / ref.norm() < 1e-2
    cuda_fusions.STREAM = False
    triton = cuda_gemv.linear_rows(x, w)
    assert not torch.equal(triton, full)                          # the sums do run in another order
    assert (full.float() - triton.float()).norm() / triton.float().norm() < 4e-3


@needs_bindings
def test_stream_takes_rows_of_any_stride(stream_on):
    """A row stride the kernel cannot read 8 elements at a time from: the same kernel on a copy."""
    k, n = 4096, 2048
    w, big = _rand(n, k) * k ** -0.5, _rand(5, k + 4)
    x = big[:, :k]
    assert cuda_gemv.streams(w) and not cuda_stream_gemv.fits(x, w)
    assert torch.equal(cuda_gemv.linear_rows(x, w), cuda_gemv.linear_rows(x.contiguous(), w))
    with pytest.raises(ValueError, match="stream_gemv takes"):     # more rows than the kernel's 16 slots
        cuda_stream_gemv.linear_rows(_rand(17, k), w)


@needs_bindings
def test_stream_conv_epilogue(stream_on):
    """The DeltaNet's input product with the causal conv in its epilogue: the columns past the
    conv equal the plain product's bit for bit, the ring and each kept row's slot hold the
    product's outputs (bit for bit), the conv outputs match the conv kernel on the product's
    outputs within a bf16 step, and every row count's rows equal the 16-row launch's."""
    from cuda_cases import conv_runs
    torch.manual_seed(3)
    c, k, n = 8192, 2048, 12352
    x, w = _rand(16, k), _rand(n, k) * k ** -0.5
    cw, ring0 = _rand(c, 4) * 0.5, _rand(c, 3)
    assert cuda_gemv.conv_fits(w, c, 4) and cuda_gemv.streams(w)
    outs = {}
    for m in ROWS:
        fused, y, conv, (r1, s1), (r2, s2) = conv_runs(x, w, cw, ring0, m)
        assert torch.equal(fused[:, c:], y[:, c:]), m
        assert torch.equal(r1, r2) and all(torch.equal(a, b) for a, b in zip(s1, s2)), m
        diff = (fused[:, :c].float() - conv.float()).abs()
        assert (diff <= conv.float().abs() * 2 ** -7 + 1e-6).all(), m
        outs[m] = fused
    for m in ROWS:
        assert torch.equal(outs[m], outs[16][:m]), m


@needs_bindings
def test_model_rows_invariant_with_stream_products(stream_on):
    """The real-shaped model with the stream products: a verify's rows equal decode rows bit for
    bit, eager and graphed alike; the graphed logits equal the eager ones; the early launches
    before the products move no bit; the Triton products give other sums, close to these."""
    def early(on):
        return lambda: setattr(cuda_launch, "EARLY_STREAM", on)

    def triton():
        cuda_fusions.STREAM = False
    got = model_rows_by_arm(29, [(False, early(True)), (True, early(True)), (True, early(False)), (False, triton)])
    assert torch.equal(got[0], got[1]) and torch.equal(got[1], got[2])
    assert not torch.equal(got[3], got[0])
    assert (got[3] - got[0]).abs().max() < 0.25 * got[3].abs().max()


@needs_bindings
@pytest.mark.parametrize("k,n", [(2048, 12352), (4096, 2048)])
def test_request_options_and_stamps_keep_the_bits(stream_on, k, n):
    """The ways of requesting the weights before the wait (PRE units, PACE, EVF: bench/cuda_bench.py
    --sections flood) and the diagnostic stamps build (bench/cuda_stamps.py) change when bytes arrive,
    not a value: every variant's product equals the default's bit for bit at 1, 3 and 16 rows; the
    stamps build writes one record a CTA, its times in order."""
    torch.manual_seed(k - n)
    w, x = _rand(n, k) * k ** -0.5, _rand(16, k)
    sg = cuda_stream_gemv
    kept = sg.PRE, sg.PACE, sg.EVF, sg.STAMPS
    want = {m: cuda_gemv.linear_rows(x[:m], w) for m in (1, 3, 16)}
    try:
        for pre, pace, evf in [(1, 0, 0), (2, 0, 0), (None, 1, 0), (None, 0, 1), (1, 1, 1)]:
            sg.PRE, sg.PACE, sg.EVF = pre, pace, evf
            for m, ref in want.items():
                assert torch.equal(cuda_gemv.linear_rows(x[:m], w), ref), (pre, pace, evf, m)
        sg.PRE, sg.PACE, sg.EVF = kept[:3]
        buf = torch.zeros(8 + 8 * 1024, dtype=torch.int64, device="cuda")
        sg.STAMPS = buf
        got = cuda_gemv.linear_rows(x[:3], w)
        torch.cuda.synchronize()
        assert torch.equal(got, want[3])
        grid = min(n // 16, torch.cuda.get_device_properties(0).multi_processor_count)
        assert int(buf[0]) == grid
        recs = buf[8:8 + 8 * grid].view(grid, 8)
        assert set(recs[:, 0].tolist()) == {n} and sorted(recs[:, 1].tolist()) == list(range(grid))
        assert bool((recs[:, 3] <= recs[:, 4]).all() and (recs[:, 4] <= recs[:, 6]).all() and (recs[:, 5] > 0).all())
    finally:
        sg.PRE, sg.PACE, sg.EVF, sg.STAMPS = kept


@needs_bindings
def test_coresident_settings(stream_on, monkeypatch):
    """bench/cuda_bench.py --sections coresident's settings: the input products on 4 warps with a register
    cap (MAXREG) and a fixed carveout. A 4-warp product sums in another order than the 8-warp one (close to
    it), and its rows stay invariant: every row count equals the 16-row launch and each row alone, in a
    CUDA graph too; the conv epilogue's plain columns equal the 4-warp product's; a register cap and the
    carveout move no bit."""
    from cuda_cases import conv_runs
    sg = cuda_stream_gemv
    torch.manual_seed(11)
    k, n, c = 2048, 12352, 8192
    w, x = _rand(n, k) * k ** -0.5, _rand(16, k)
    eight = cuda_gemv.linear_rows(x, w)
    monkeypatch.setitem(sg.CONFIG, (k, n), (2, 4, 256, 2))
    four = cuda_gemv.linear_rows(x, w)
    assert not torch.equal(four, eight)
    assert (four.float() - eight.float()).norm() / eight.float().norm() < 4e-3
    monkeypatch.setitem(sg.MAXREG, (k, n), 176)
    monkeypatch.setattr(sg, "CARVEOUT", 100)
    full = cuda_gemv.linear_rows(x, w)
    assert torch.equal(full, four)
    for m in ROWS:
        got = cuda_gemv.linear_rows(x[:m], w)
        assert torch.equal(got, full[:m]), m
        assert all(torch.equal(got[i:i + 1], cuda_gemv.linear_rows(x[i:i + 1], w)) for i in range(m)), m
    assert torch.equal(_graphed(lambda: cuda_gemv.linear_rows(x[:3], w)), full[:3])
    cw, ring0 = _rand(c, 4) * 0.5, _rand(c, 3)
    for m in (1, 4, 16):
        fused, y, _, _, _ = conv_runs(x, w, cw, ring0, m)
        assert torch.equal(fused[:, c:], full[:m, c:]) and torch.equal(y, full[:m]), m


@needs_bindings
def test_l2_prefetch_and_evict_first_keep_the_bits(stream_on):
    """bench/cuda_bench.py --sections l2next: an output product asking L2 for another weight (L2_NEXT,
    before or after its wait, with or without an evict-last policy) and the expert kernels' evict-first
    loads (cuda_moe.EVW) change where bytes sit, not a value: the product, and the MoE's experts, equal
    the defaults bit for bit at 1, 3 and 16 rows, eager and graphed; the prefetched weight is untouched."""
    from verispec.ops import cuda_moe
    sg = cuda_stream_gemv
    torch.manual_seed(5)
    w, x = _rand(2048, 4096) * 4096 ** -0.5, _rand(16, 4096)
    nxt = _rand(12352, 2048)
    nxt_copy = nxt.clone()
    want = {m: cuda_gemv.linear_rows(x[:m], w) for m in (1, 3, 16)}
    kept = dict(sg.L2_NEXT), sg.L2AT, sg.L2EL
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    try:
        for skip in (True, False):
            sg.L2_NEXT = sg.l2_plan([(w, nxt)], sms, skip_slots=skip)
            assert w.data_ptr() in sg.L2_NEXT
            for at, el in [(1, 0), (0, 0), (1, 1), (0, 1)]:
                sg.L2AT, sg.L2EL = at, el
                for m, ref in want.items():
                    assert torch.equal(cuda_gemv.linear_rows(x[:m], w), ref), (skip, at, el, m)
                assert torch.equal(_graphed(lambda: cuda_gemv.linear_rows(x[:3], w)), want[3]), (skip, at, el)
        assert torch.equal(nxt, nxt_copy)
    finally:
        sg.L2_NEXT, sg.L2AT, sg.L2EL = kept
    # the experts with evict-first loads: gate/up and down (with and without EARLY_W)
    e, inter, h = 16, 512, 2048
    gu, dn = _rand(e, 2 * inter, h) * h ** -0.5, _rand(e, h, inter) * inter ** -0.5
    xe = _rand(4, h)
    ids = torch.randint(0, e, (4, 8), device="cuda", dtype=torch.int32)
    for early in (False, True):
        ref = cuda_moe._pairs(xe, ids.reshape(-1), gu, dn, 8, None, None, down_early=early)
        kept_evw = cuda_moe.EVW
        try:
            cuda_moe.EVW = "evict_first"
            got = cuda_moe._pairs(xe, ids.reshape(-1), gu, dn, 8, None, None, down_early=early)
        finally:
            cuda_moe.EVW = kept_evw
        assert torch.equal(got, ref), early


def _bits_hold(seed, shapes, setting, restore):
    """The products of each (K, N) in shapes, and the DeltaNet input product's conv epilogue (outputs, ring
    and each kept row's slot) where (2048, 12352) is among them, after setting() equal the default's bit
    for bit at every row count, eagerly and from a CUDA graph replayed three times (a launch must leave
    nothing behind that the next one reads: DYN's tickets); restore() puts the default back."""
    from cuda_cases import conv_runs
    torch.manual_seed(seed)
    cases = {(k, n): (_rand(n, k) * k ** -0.5, _rand(16, k)) for k, n in shapes}
    c = 8192
    cw, ring0 = _rand(c, 4) * 0.5, _rand(c, 3)
    conv = (2048, 12352) in cases
    want = {key: {m: cuda_gemv.linear_rows(x[:m], w) for m in ROWS} for key, (w, x) in cases.items()}
    if conv:
        wc, xc = cases[(2048, 12352)]
        want_conv = {m: conv_runs(xc, wc, cw, ring0, m) for m in (1, 3, 16)}
    try:
        setting()
        for key, (w, x) in cases.items():
            for m in ROWS:
                assert torch.equal(cuda_gemv.linear_rows(x[:m], w), want[key][m]), (key, m)
            for graphed in _replays(lambda: cuda_gemv.linear_rows(x[:3], w), 3):
                assert torch.equal(graphed, want[key][3]), key
        if conv:
            assert cuda_stream_gemv.conv_fits(wc, c)
            for m, ref in want_conv.items():
                fused, _, _, (r1, s1), _ = conv_runs(xc, wc, cw, ring0, m)
                assert torch.equal(fused, ref[0]) and torch.equal(r1, ref[3][0]), m
                assert all(torch.equal(a, b) for a, b in zip(s1, ref[3][1])), m
    finally:
        restore()


@needs_bindings
@pytest.mark.parametrize("regt,dyn", [(1, False), (2, False), (0, True), (1, True)])
def test_tail_options_keep_the_bits(stream_on, regt, dyn):
    """The units past a warp's slots read into registers (cuda_stream_gemv.REGT) feed each mma the operands
    the slots would, and the tasks dealt by tickets (DYN) are computed as by their CTA in turn, so (bench/
    cuda_bench.py --sections tail) every configured shape's product and the conv epilogue keep their bits
    (_bits_hold); the variant's build did run."""
    sg = cuda_stream_gemv
    kept = sg.REGT, sg.DYN

    def setting():
        sg.REGT, sg.DYN = regt, dyn

    def restore():
        sg.REGT, sg.DYN = kept
    _bits_hold(40 + regt + 3 * dyn, sorted(sg.CONFIG), setting, restore)
    built = [dict(key[1]) for key in sg._kernels]     # a key: (device, the build's defines, tasks, carveout)
    assert any(d.get("DYN", 0) == int(dyn) and d.get("REGT", 0) == regt for d in built)


@needs_bindings
@pytest.mark.parametrize("cap", [100, 66])
def test_grid_cap_keeps_the_bits(stream_on, cap):
    """The input products on fewer CTAs than SMs (cuda_stream_gemv.GRID, bench/cuda_bench.py --sections grid):
    a CTA takes more tasks, each computed as before, so the products and the conv epilogue keep their bits
    (_bits_hold)."""
    sg = cuda_stream_gemv
    ins = [kn for kn in sorted(sg.CONFIG) if kn[1] != 2048]
    kept = dict(sg.GRID)

    def restore():
        sg.GRID.clear()
        sg.GRID.update(kept)
    _bits_hold(60 + cap, ins, lambda: sg.GRID.update({kn: cap for kn in ins}), restore)
