"""The exact path's optional fusions on the GPU (verispec/ops/cuda_fusions.py): each fused
kernel against the kernels it replaces, row by row for 1..16 rows, and the model with the
fusions on against off. Skipped where torch sees no CUDA GPU (CI)."""

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")

from model_fixtures import REPEAT_PROMPT  # noqa: E402

from verispec.engine import Engine  # noqa: E402
from verispec.execution import Execution  # noqa: E402
from verispec.ops import cuda_fusions, cuda_gemv, cuda_moe, cuda_norms  # noqa: E402
from verispec.random_model import preset_config, random_checkpoint  # noqa: E402

ROWS = list(range(1, 9)) + [12, 16]
BF = torch.bfloat16


def _rand(*shape, dtype=BF):
    return torch.randn(*shape, device="cuda", dtype=torch.float32).to(dtype)


def test_gated_norm_prologue_rows_and_reference():
    """The output product with the gated norm on load: every row count against the full launch
    bit for bit, the partials' sum against the summed product, and the result against the
    separate norm kernel then the product (the norm's sums may round apart: close, not equal)."""
    hv, hd, h = 32, 128, 2048
    o, proj = _rand(16, hv * hd), _rand(16, 12352)
    z = proj[:, 4096:4096 + hv * hd]                    # a view with the projection's row stride
    w_out, gw = _rand(h, hv * hd) * (hv * hd) ** -0.5, _rand(hd) * 0.1 + 1
    assert cuda_gemv.gnorm_fits(w_out, hd) and cuda_gemv.splits(hv * hd, h)

    def run(m):
        gn = cuda_gemv.GatedNormPrologue(z[:m], gw, 1e-6)
        return (cuda_gemv.linear_rows(o[:m], w_out, gnorm=gn),
                cuda_gemv.linear_rows(o[:m], w_out, partials=True, gnorm=gn)[:, :m])

    full_y, full_p = run(16)
    for m in ROWS:
        y, p = run(m)
        assert torch.equal(y, full_y[:m]) and torch.equal(p, full_p[:, :m]), m
    normed = cuda_norms.row_norm(o.reshape(16, hv, hd), cuda_norms.GATED, 1e-6, gw, z.reshape(16, hv, hd))
    ref = cuda_gemv.linear_rows(normed.reshape(16, hv * hd), w_out)
    assert (full_y.float() - ref.float()).norm() / ref.float().norm() < 1e-2
    with pytest.raises(ValueError, match="one head wide"):
        cuda_gemv.linear_rows(o, w_out, gnorm=cuda_gemv.GatedNormPrologue(z, gw[:64], 1e-6))


def test_router_epilogue_rows_and_reference():
    """The router run by the router product's last program: every row count against the full
    launch bit for bit, the counter back at 0 after every launch, and the same experts (and
    weights up to the softmax sum's rounding) as the separate router kernel on the partials."""
    e, k, h = 256, 8, 2048
    router = _rand(264, h) * h ** -0.5 * 4
    hx = _rand(16, h)
    cnt = torch.zeros(1, dtype=torch.int32, device="cuda")
    full_w, full_i = cuda_gemv.linear_rows(hx, router, route=cuda_gemv.RouteEpilogue(cnt, e, k, True))
    assert cnt.item() == 0
    for m in ROWS:
        for _ in range(3):                       # whichever program finishes last, the same bits
            w, i = cuda_gemv.linear_rows(hx[:m], router, route=cuda_gemv.RouteEpilogue(cnt, e, k, True))
            assert torch.equal(w, full_w[:m]) and torch.equal(i, full_i[:m]) and cnt.item() == 0, m
    ref_w, ref_i = cuda_moe.route_shared(cuda_gemv.linear_rows(hx, router, partials=True), 16, e, k, True)
    assert torch.equal(full_i, ref_i) and (full_i[:, k] == e).all()
    assert torch.allclose(full_w, ref_w, rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="split-K"):
        cuda_gemv.linear_rows(hx, router[:200], route=cuda_gemv.RouteEpilogue(cnt, e, k, True))


def test_logits_stored_wide_equal_the_bf16_product_widened():
    hx, w = _rand(16, 2048), _rand(4096, 2048) * 2048 ** -0.5
    for m in (1, 3, 16):
        got = cuda_gemv.linear_rows(hx[:m], w, out_dtype=torch.float32)
        assert got.dtype == torch.float32 and torch.equal(got, cuda_gemv.linear_rows(hx[:m], w).float()), m


@pytest.fixture
def fusions_restored():
    kept = dict(vars(cuda_fusions))
    yield
    for name in ("GATED_NORM_IN_PRODUCT", "ROUTER_IN_PRODUCT", "LOGITS_IN_PRODUCT"):
        setattr(cuda_fusions, name, kept[name])


def test_model_with_fusions_against_without(fusions_restored):
    """The real-shaped model (graphs off, so each forward runs the current setting): decode
    rows with every fusion on equal a verify's rows bit for bit, and differ from the model
    without fusions by rounding only."""
    ck = random_checkpoint(preset_config("qwen3.6-35b-a3b-shape", layers=4), seed=17, device="cuda")
    eng = Engine.from_checkpoint(ck, Execution.for_device("cuda", graphs=False))
    ids = [3, 1, 4, 1, 5, 9]
    out = {}
    for on in (True, False):
        for name in ("GATED_NORM_IN_PRODUCT", "ROUTER_IN_PRODUCT", "LOGITS_IN_PRODUCT"):
            setattr(cuda_fusions, name, on)
        st1, stn = eng.model.new_state(64), eng.model.new_state(64)
        eng.model.forward(REPEAT_PROMPT, st1)
        eng.model.forward(REPEAT_PROMPT, stn)
        ones = torch.cat([eng.model.forward([t], st1).logits for t in ids])
        many = eng.model.forward(ids, stn).logits
        assert torch.equal(ones, many), on
        out[on] = ones
    assert (out[True] - out[False]).norm() / out[False].norm() < 2e-2
    assert (out[True].argmax(-1) == out[False].argmax(-1)).float().mean() >= 0.5
