"""The exact path's optional fusions on the GPU (verispec/ops/cuda_fusions.py): the fused
kernel against the kernels it replaces, and the model with the fusions on against off, bit
for bit (they move no rounding). Skipped where torch sees no CUDA GPU (CI)."""

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")

from model_fixtures import REPEAT_PROMPT  # noqa: E402

from verispec.engine import Engine  # noqa: E402
from verispec.execution import Execution  # noqa: E402
from verispec.ops import cuda_fusions, cuda_gemv  # noqa: E402
from verispec.random_model import preset_config, random_checkpoint  # noqa: E402

BF = torch.bfloat16


def _rand(*shape):
    return torch.randn(*shape, device="cuda").to(BF)


def test_logits_stored_wide_equal_the_bf16_product_widened():
    hx, w = _rand(16, 2048), _rand(4096, 2048) * 2048 ** -0.5
    for m in (1, 3, 16):
        got = cuda_gemv.linear_rows(hx[:m], w, out_dtype=torch.float32)
        assert got.dtype == torch.float32 and torch.equal(got, cuda_gemv.linear_rows(hx[:m], w).float()), m
    with pytest.raises(ValueError, match="unsplit"):
        cuda_gemv.linear_rows(_rand(16, 4096), _rand(2048, 4096), partials=True, out_dtype=torch.float32)


@pytest.fixture
def fusions_restored():
    kept = cuda_fusions.LOGITS_IN_PRODUCT
    yield
    cuda_fusions.LOGITS_IN_PRODUCT = kept


def test_model_with_fusions_equals_without(fusions_restored):
    """The real-shaped model (graphs off, so each forward runs the current setting): the
    logits of decode rows and of a verify's rows with the fusions on equal those without."""
    ck = random_checkpoint(preset_config("qwen3.6-35b-a3b-shape", layers=4), seed=17, device="cuda")
    eng = Engine.from_checkpoint(ck, Execution.for_device("cuda", graphs=False))
    ids = [3, 1, 4, 1, 5, 9]
    out = {}
    for on in (True, False):
        cuda_fusions.LOGITS_IN_PRODUCT = on
        st1, stn = eng.model.new_state(64), eng.model.new_state(64)
        eng.model.forward(REPEAT_PROMPT, st1)
        eng.model.forward(REPEAT_PROMPT, stn)
        ones = torch.cat([eng.model.forward([t], st1).logits for t in ids])
        many = eng.model.forward(ids, stn).logits
        assert torch.equal(ones, many), on
        out[on] = (ones, many)
    assert torch.equal(out[True][0], out[False][0]) and torch.equal(out[True][1], out[False][1])


def _delta_inputs():
    hk, hv, dk, dv = 16, 32, 128, 128
    proj = _rand(16, 2 * hk * dk + 2 * hv * dv + 100)   # q|k|v|z and a wider row stride, as the model's
    mixed, z = proj[:, :2 * hk * dk + hv * dv], proj[:, 2 * hk * dk + hv * dv:2 * hk * dk + 2 * hv * dv]
    ba = _rand(16, 2 * hv + 8)
    alog, dtb = torch.rand(hv, device="cuda") * 4, _rand(hv)
    s0 = torch.randn(hv, dk, dv, device="cuda") * 0.1
    nw = _rand(dv).abs() + 0.5
    return (hk, hv, dk, dv), mixed, z, ba, alog, dtb, s0, nw


def test_recurrence_with_gated_norm_rows_slots_and_reference():
    """The recurrence with the gated norm in its launch (a program per value head): every row
    count in one launch equals one row per launch, outputs, final state and each kept row's
    slot bit for bit; against the step then the norm kernel (another split of the value
    columns, so other reduction orders): the state within 1e-5, the output within a bf16 step."""
    from verispec.ops import cuda_deltanet as cd
    from verispec.ops import cuda_norms, cuda_slots
    (hk, hv, dk, dv), mixed, z, ba, alog, dtb, s0, nw = _delta_inputs()
    with pytest.raises(ValueError, match="gated norm"):
        cd.delta_steps(mixed, ba, alog, dtb, s0.clone(), None, hk, dk, dv, gate=z, norm_w=nw)   # fp32 output
    for m in (1, 2, 3, 4, 5, 6, 7, 8, 12, 16):
        st1, st2, st3 = s0.clone(), s0.clone(), s0.clone()
        sl1 = [torch.zeros_like(s0) for _ in range(m - 1)]
        tab = cuda_slots.table_of(sl1, st1) if m > 1 else None
        one = cd.delta_steps(mixed[:m], ba[:m], alog, dtb, st1, tab, hk, dk, dv, out_dtype=BF, gate=z[:m], norm_w=nw)
        singles, sl2 = [], []
        for i in range(m):
            singles.append(cd.delta_steps(mixed[i:i + 1], ba[i:i + 1], alog, dtb, st2, None, hk, dk, dv, out_dtype=BF,
                                          gate=z[i:i + 1], norm_w=nw))
            if i < m - 1:
                sl2.append(st2.clone())
        assert torch.equal(one, torch.cat(singles)) and torch.equal(st1, st2), m
        assert all(torch.equal(a, b) for a, b in zip(sl1, sl2)), m
        plain = cd.delta_steps(mixed[:m], ba[:m], alog, dtb, st3, None, hk, dk, dv, out_dtype=BF)
        ref = cuda_norms.row_norm(plain, cuda_norms.GATED, 1e-6, nw, z[:m].reshape(m, hv, dv))
        assert (st1 - st3).norm() / st3.norm() < 1e-5, m
        step = (ref.float().abs() * 2 ** -7).clamp_min(1e-6)       # one bf16 step at each value
        assert ((one.float() - ref.float()).abs() <= 2 * step).float().mean() > 0.999, m
        assert (one.float() - ref.float()).norm() / ref.float().norm() < 1e-2, m


@pytest.fixture
def norm_in_steps_restored():
    from verispec.ops import cuda_deltanet as cd
    kept = cd.NORM_IN_STEPS
    yield cd
    cd.NORM_IN_STEPS = kept


def test_model_with_norm_in_the_recurrence_rows_and_against_without(norm_in_steps_restored):
    """The real-shaped model with the gated norm in the recurrence's launch: n rows in one
    forward (with copy slots) equal n one-row forwards bit for bit; against the separate norm,
    the logits within 2% (other reduction orders)."""
    cd = norm_in_steps_restored
    ck = random_checkpoint(preset_config("qwen3.6-35b-a3b-shape", layers=4), seed=23, device="cuda")
    ids = [3, 1, 4, 1, 5, 9]
    out = {}
    for on in (True, False):
        cd.NORM_IN_STEPS = on
        eng = Engine.from_checkpoint(ck, Execution.for_device("cuda", graphs=on))
        st1, stn = eng.model.new_state(64), eng.model.new_state(64)
        eng.model.forward(REPEAT_PROMPT, st1)
        eng.model.forward(REPEAT_PROMPT, stn)
        stn.ensure_slots(len(ids))
        ones = torch.cat([eng.model.forward([t], st1).logits for t in ids])
        many = eng.model.forward(ids, stn, save_slots=True).logits
        assert torch.equal(ones, many), on
        out[on] = ones
    assert (out[True] - out[False]).norm() / out[False].norm() < 2e-2
