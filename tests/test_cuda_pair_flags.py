"""The experts' down programs waiting for their own (row, slot) pair's gate/up programs instead of the
whole gate/up launch (verispec/ops/cuda_moe.py PAIR_FLAGS) on the GPU: the same bits as the default
at every row count, eager and replayed in a CUDA graph (the counters back at zero after each launch),
and the model's verify rows equal to its decode rows with it. Skipped without a CUDA GPU (CI)."""

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")

from cuda_cases import model_rows_by_arm, moe_case  # noqa: E402

from verispec.ops import cuda_gemv, cuda_moe  # noqa: E402

ROWS = list(range(1, 9)) + [12, 16]


@pytest.fixture
def flags_restored():
    kept = cuda_moe.PAIR_FLAGS
    yield
    cuda_moe.PAIR_FLAGS = kept


def test_pair_flags_keep_the_bits_eager_and_graphed(flags_restored):
    torch.manual_seed(11)
    e, inter, h, k, router, sgu, hx, resid, gu, dn, sdown, nw = moe_case()
    w, i = cuda_moe.route_shared(cuda_gemv.linear_rows(hx, router, partials=True), 16, e, k, True)

    def run(m):
        return cuda_moe.experts_add_norm(hx[:m], w[:m], i[:m], gu, dn, sgu, sdown, resid[:m], nw, 1e-6)
    cuda_moe.PAIR_FLAGS = False
    want = {m: run(m) for m in ROWS}
    cuda_moe.PAIR_FLAGS = True
    for m in ROWS:
        s, y = run(m)
        assert torch.equal(s, want[m][0]) and torch.equal(y, want[m][1]), m
    counters = cuda_moe._pair_counters(hx.device)
    torch.cuda.synchronize()
    assert not counters.any()
    run(3)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = run(3)
    for _ in range(3):
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out[0], want[3][0]) and torch.equal(out[1], want[3][1])
        assert not counters.any()


def test_model_rows_invariant_with_pair_flags(flags_restored):
    def setter(on):
        def set_():
            cuda_moe.PAIR_FLAGS = on
        return set_
    plain, flagged_eager, flagged = model_rows_by_arm(5, [(True, setter(False)), (False, setter(True)),
                                                          (True, setter(True))])
    assert torch.equal(plain, flagged) and torch.equal(flagged_eager, flagged)
