"""The batched prefill's routed experts grouped by expert (verispec/ops/grouped_moe.py), on the CPU:
against a pair-at-a-time reference, with empty experts, one row, one slot; grouped products
against a product per expert; the same bits run to run. The GPU side (torch._grouped_mm in bf16,
the model's batched prefill) is in tests/test_cuda.py."""

import pytest
import torch
import torch.nn.functional as F

from verispec.ops import grouped_moe


def _case(rows, k, e=6, h=32, inter=16, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, h, generator=g).to(dtype)
    gu = (torch.randn(e, 2 * inter, h, generator=g) * h ** -0.5).to(dtype)
    dn = (torch.randn(e, h, inter, generator=g) * inter ** -0.5).to(dtype)
    logits = torch.randn(rows, e, generator=g)
    top_w, top_i = torch.topk(torch.softmax(logits, -1), k, dim=-1)
    return x, top_w, top_i, gu, dn


def _reference(x, top_w, top_i, gu, dn):
    """Each (row, slot) pair on its own, in fp64."""
    inter = gu.shape[1] // 2
    out = torch.zeros(x.shape, dtype=torch.float64)
    for r in range(x.shape[0]):
        for s in range(top_i.shape[1]):
            e = int(top_i[r, s])
            a = F.linear(x[r].double(), gu[e].double())
            act = F.silu(a[:inter]) * a[inter:]
            out[r] += float(top_w[r, s]) * F.linear(act, dn[e].double())
    return out


@pytest.mark.parametrize("rows,k", [(1, 1), (1, 3), (5, 2), (37, 3)])
def test_per_expert_products_match_the_pairwise_reference(rows, k):
    x, top_w, top_i, gu, dn = _case(rows, k)
    got = grouped_moe.routed_experts(x, top_w, top_i, gu, dn, grouped=False)
    assert got.dtype == x.dtype and got.shape == x.shape
    torch.testing.assert_close(got.double(), _reference(x, top_w, top_i, gu, dn), rtol=1e-5, atol=1e-5)


def test_experts_without_rows_and_a_row_order_that_is_not_expert_order():
    # every row to experts 4 and 1 (in that slot order), experts 0, 2, 3, 5 empty
    x, top_w, _, gu, dn = _case(9, 2)
    top_i = torch.tensor([[4, 1]] * 9)
    got = grouped_moe.routed_experts(x, top_w, top_i, gu, dn, grouped=False)
    torch.testing.assert_close(got.double(), _reference(x, top_w, top_i, gu, dn), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not grouped_moe._grouped_ok(torch.zeros(1, dtype=torch.float32)),
                    reason="this torch build has no torch._grouped_mm for the CPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_products_equal_a_product_per_expert(dtype):
    x, top_w, _, gu, dn = _case(40, 3, dtype=dtype, seed=3)
    # experts 1, 2, 4 only, a row's three in turning orders: 0, 3 and 5 (the first and the last) empty
    top_i = torch.tensor([[1, 2, 4], [4, 1, 2], [2, 4, 1]] * 13 + [[1, 2, 4]])
    grouped = grouped_moe.routed_experts(x, top_w, top_i, gu, dn, grouped=True)
    looped = grouped_moe.routed_experts(x, top_w, top_i, gu, dn, grouped=False)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(grouped.float(), looped.float(), rtol=tol, atol=tol)
    torch.testing.assert_close(grouped.double(), _reference(x, top_w, top_i, gu, dn), rtol=tol, atol=tol)


def test_the_same_bits_run_to_run():
    x, top_w, top_i, gu, dn = _case(23, 3, dtype=torch.bfloat16, seed=5)
    a = grouped_moe.routed_experts(x, top_w, top_i, gu, dn)
    b = grouped_moe.routed_experts(x, top_w, top_i, gu, dn)
    assert torch.equal(a, b)
