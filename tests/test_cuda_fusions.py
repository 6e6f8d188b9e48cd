"""The exact path's optional fusions on the GPU (verispec/ops/cuda_fusions.py): the fused
kernel against the kernels it replaces, and the model with the fusions on against off, bit
for bit (they move no rounding). Skipped where torch sees no CUDA GPU (CI)."""

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")

from cuda_cases import moe_case  # noqa: E402
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
    kept = cuda_fusions.LOGITS_IN_PRODUCT, cuda_fusions.NORM_ROUTER, cuda_fusions.MOE_TAIL
    yield
    cuda_fusions.LOGITS_IN_PRODUCT, cuda_fusions.NORM_ROUTER, cuda_fusions.MOE_TAIL = kept


def test_model_with_fusions_equals_without(fusions_restored):
    """The real-shaped model (graphs off, so each forward runs the current setting): the
    logits of decode rows and of a verify's rows with the fusions on equal those without."""
    ck = random_checkpoint(preset_config("qwen3.6-35b-a3b-shape", layers=4), seed=17, device="cuda")
    eng = Engine.from_checkpoint(ck, Execution.for_device("cuda", graphs=False))
    ids = [3, 1, 4, 1, 5, 9]
    out = {}
    for on in (True, False):
        cuda_fusions.LOGITS_IN_PRODUCT = on
        ones, many = _decode_and_verify(eng.model, ids)
        assert torch.equal(ones, many), on
        out[on] = (ones, many)
    assert torch.equal(out[True][0], out[False][0]) and torch.equal(out[True][1], out[False][1])


@pytest.fixture
def shared_first_restored():
    from verispec.ops import cuda_moe
    kept = cuda_moe.SHARED_FIRST, cuda_fusions.STREAM_MOE
    cuda_fusions.STREAM_MOE = False      # SHARED_FIRST is the Triton gate/up kernel's option
    yield cuda_moe
    cuda_moe.SHARED_FIRST, cuda_fusions.STREAM_MOE = kept


def test_shared_expert_first_moves_no_bit(shared_first_restored):
    """The shared expert's gate/up programs first, not waiting for the router
    (cuda_moe.SHARED_FIRST): the MoE's residual sum and normed output equal those with every
    program waiting, bit for bit, for every row count, right after the router's launch."""
    cuda_moe = shared_first_restored
    from verispec.ops import cuda_gemv
    e, inter, h, k, router, sgu, hx, resid, gu, dn, sdown, nw = moe_case()
    for m in (1, 2, 3, 4, 5, 6, 7, 8, 12, 16):
        got = {}
        for first in (True, False):
            cuda_moe.SHARED_FIRST = first
            parts = cuda_gemv.linear_rows(hx[:m], router, partials=True)
            w, i = cuda_moe.route_shared(parts, m, e, k, True)
            got[first] = cuda_moe.experts_add_norm(hx[:m], w, i, gu, dn, sgu, sdown, resid[:m], nw, 1e-6)
        assert torch.equal(got[True][0], got[False][0]) and torch.equal(got[True][1], got[False][1]), m


def _decode_and_verify(model, ids):
    """The logits of ids decoded one row at a time and of the same ids as one verify (copy
    slots on), each after the same prompt in a fresh state."""
    st1, stn = model.new_state(64), model.new_state(64)
    model.forward(REPEAT_PROMPT, st1)
    model.forward(REPEAT_PROMPT, stn)
    stn.ensure_slots(len(ids))
    ones = torch.cat([model.forward([t], st1).logits for t in ids])
    return ones, model.forward(ids, stn, save_slots=True).logits


def test_add_norm_router_rows_and_reference():
    """The residual add, the norm and the router product in one launch (cuda_norm_router): every
    row count's rows equal the 16-row launch's bit for bit; the sum equals add_row_norm's bit for
    bit, the norm is within bf16 rounding of it, the logits within bf16 rounding of torch's
    product of that norm; from split-K partials and from a plain tensor."""
    from verispec.ops import cuda_norm_router, cuda_norms
    h = 2048
    pre = _rand(1288, h) * h ** -0.5 * 4
    router = pre[:264]
    wo, o = _rand(h, 4096) * 4096 ** -0.5, _rand(16, 4096)
    x, nw = _rand(16, h), _rand(h) * 0.1
    for split in (True, False):
        def mixer(m):
            return (cuda_gemv.Partials(cuda_gemv.linear_rows(o[:m], wo, partials=True), m) if split
                    else cuda_gemv.linear_rows(o[:m], wo))
        full = cuda_norm_router.add_norm_router(x, mixer(16), nw, 1e-6, router)
        for m in (1, 2, 3, 4, 5, 6, 7, 8, 12, 16):
            got = cuda_norm_router.add_norm_router(x[:m], mixer(m), nw, 1e-6, router)
            assert all(torch.equal(g, f[:m]) for g, f in zip(got, full)), (split, m)
        s, y, lg = full
        s2, y2 = cuda_norms.add_row_norm(x, mixer(16), nw, 1e-6)
        assert torch.equal(s, s2)
        assert (y.float() - y2.float()).norm() / y2.float().norm() < 1e-2
        ref = y.float() @ router.float().T
        assert lg.dtype == BF and (lg.float() - ref).norm() / ref.norm() < 1e-2


def test_model_rows_invariant_with_and_without_norm_router(fusions_restored):
    """The real-shaped model with the add + norm + router launch and without it: in each, a
    verify's rows equal decode rows bit for bit, eager and graphed alike."""
    ck = random_checkpoint(preset_config("qwen3.6-35b-a3b-shape", layers=4), seed=31, device="cuda")
    ids = [2, 7, 1, 8, 2, 8]
    for on in (True, False):
        cuda_fusions.NORM_ROUTER = on
        got = []
        for graphs in (False, True):
            eng = Engine.from_checkpoint(ck, Execution.for_device("cuda", graphs=graphs))
            ones, many = _decode_and_verify(eng.model, ids)
            assert torch.equal(ones, many), (on, graphs)
            got.append(ones)
        assert torch.equal(got[0], got[1]), on
