"""The gate/up kernel's PRED variant and the down kernel's EARLY_W (cuda_moe; experiments that
bench/cuda_ablation.py --arms predict times) on the GPU: whatever the predicted expert ids (right,
wrong, none, half right), with one or both weight blocks read before the wait, and with the down
kernel reading its weights before its wait, every pair's output equals the kernels without them
bit for bit, for every row count, eager and in a CUDA graph with the router launching gate/up
before its own wait. Skipped without a CUDA GPU (CI)."""

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")

from cuda_cases import moe_case  # noqa: E402

from verispec.ops import cuda_gemv, cuda_moe  # noqa: E402


def _preds(ids: torch.Tensor, e: int) -> dict[str, torch.Tensor]:
    """ids [R, K + 1] (slot K the shared expert) -> predictions of the same shape, int32."""
    wrong = (ids + 1) % e
    wrong[:, -1] = e
    none = torch.full_like(ids, -1)
    none[:, -1] = e
    half = ids.clone()
    half[:, 1::2] = wrong[:, 1::2]
    return {"right": ids.clone(), "wrong": wrong, "none": none, "half": half}


def test_prediction_moves_no_bits():
    torch.manual_seed(21)
    e, inter, h, k, router, sgu, hx, resid, gu, dn, sdown, nw = moe_case()
    slots = k + 1

    def run(m, pred=None, early=False, blocks=1, down=False):
        w, i = cuda_moe.route_shared(cuda_gemv.linear_rows(hx[:m], router, partials=True), m, e, k, True,
                                     early=early)
        p = None if pred is None else pred[:m].reshape(-1).contiguous()
        return i, cuda_moe._pairs(hx[:m], i.reshape(-1), gu, dn, slots, sgu, sdown, pred=p, pred_blocks=blocks,
                                  down_early=down)

    ids, full = run(16)
    assert (ids[:, k] == e).all() and len(set(ids[:, :k].flatten().tolist())) > 8
    preds = _preds(ids, e)
    for name, pred in preds.items():
        for blocks in (1, 2):
            for m in (1, 2, 3, 4, 5, 8, 16):
                i, got = run(m, pred, early=True, blocks=blocks, down=m % 2 == 0)
                assert torch.equal(i, ids[:m]), (name, blocks, m)
                assert torch.equal(got, full[:m * slots]), (name, blocks, m)
    for m in (1, 3, 16):
        assert torch.equal(run(m, down=True)[1], full[:m * slots]), m
    # in a CUDA graph (PDL as the model captures it), the router launching gate/up before its wait
    for name in ("right", "none"):
        run(4, preds[name], early=True, blocks=2, down=True)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            _, graphed = run(4, preds[name], early=True, blocks=2, down=True)
        for _ in range(2):
            g.replay()
            torch.cuda.synchronize()
            assert torch.equal(graphed, full[:4 * slots]), name
