"""The MoE after its router in one persistent launch (verispec/ops/cuda_moe_tail.py) on the
GPU: every row count bit for bit against the full launch, repeated launches (its counters
put back), the three-launch path within the reductions' order, and the real-shaped model's
rows. Skipped where torch sees no CUDA GPU (CI)."""

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")

from model_fixtures import REPEAT_PROMPT  # noqa: E402

from verispec.engine import Engine  # noqa: E402
from verispec.execution import Execution  # noqa: E402
from verispec.ops import cuda_gemv, cuda_moe, cuda_moe_tail  # noqa: E402
from verispec.random_model import preset_config, random_checkpoint  # noqa: E402

BF = torch.bfloat16
ROWS = list(range(1, 9)) + [12, 16]


def _rand(*shape):
    return torch.randn(*shape, device="cuda").to(BF)


def test_tail_rows_repeats_and_three_launches():
    e, inter, h, k = 256, 512, 2048, 8
    pre = _rand(1288, h) * h ** -0.5 * 4
    router, sgu = pre[:264], pre[e + 1:e + 1 + 2 * inter]
    hx, resid = _rand(16, h), _rand(16, h)
    gu, dn = _rand(e, 2 * inter, h) * h ** -0.5, _rand(e, h, inter) * inter ** -0.5
    sdown, nw = _rand(h, inter) * inter ** -0.5, _rand(h) * 0.1
    parts = cuda_gemv.linear_rows(hx, router, partials=True)
    w, i = cuda_moe.route_shared(parts, 16, e, k, True)

    def run(mod, m):
        return mod.experts_add_norm(hx[:m], w[:m], i[:m], gu, dn, sgu, sdown, resid[:m], nw, 1e-6)

    full = run(cuda_moe_tail, 16)
    for m in ROWS + [16, 1, 16]:          # the counters must be back at zero after every launch
        for got, want in zip(run(cuda_moe_tail, m), full):
            assert torch.equal(got, want[:m]), m
    three = run(cuda_moe, 16)
    for got, want in zip(full, three):
        assert (got.float() - want.float()).norm() / want.float().norm() < 1e-2
        assert ((got.float() - want.float()).abs() <= want.float().abs() * 2 ** -6 + 1e-3).float().mean() > 0.99
    with pytest.raises(ValueError, match="16 rows"):
        cuda_moe_tail.experts_add_norm(torch.cat([hx, hx]), torch.cat([w, w]), torch.cat([i, i]), gu, dn, sgu, sdown,
                                       torch.cat([resid, resid]), nw, 1e-6)


@pytest.fixture
def tail_restored():
    kept = cuda_moe_tail.enabled
    yield
    cuda_moe_tail.enabled = kept


@pytest.mark.parametrize("graphs", [False, True])
def test_model_rows_with_the_persistent_tail(tail_restored, graphs):
    """The real-shaped model with the persistent tail: n rows in one forward (with copy slots)
    equal n one-row forwards bit for bit, eager and graphed; the logits within 2% of the
    three-launch path's."""
    ck = random_checkpoint(preset_config("qwen3.6-35b-a3b-shape", layers=4), seed=29, device="cuda")
    ids = [3, 1, 4, 1, 5, 9]
    out = {}
    for on in (True, False):
        cuda_moe_tail.enabled = on
        eng = Engine.from_checkpoint(ck, Execution.for_device("cuda", graphs=graphs))
        st1, stn = eng.model.new_state(64), eng.model.new_state(64)
        eng.model.forward(REPEAT_PROMPT, st1)
        eng.model.forward(REPEAT_PROMPT, stn)
        stn.ensure_slots(len(ids))
        ones = torch.cat([eng.model.forward([t], st1).logits for t in ids])
        many = eng.model.forward(ids, stn, save_slots=True).logits
        assert torch.equal(ones, many), on
        out[on] = ones
    assert (out[True] - out[False]).norm() / out[False].norm() < 2e-2
