"""The chunked delta rule of the batched prefill (verispec/ops/chunk_delta.py) on the CPU: the
re-association against the row-by-row rule in fp64 (outputs and final state, chunk sizes that do
and do not divide the rows, strong and no decay), and from the model's inputs against deltanet.delta_rule_rows.
The Triton chain is held to the torch chain on the GPU (tests/test_cuda.py)."""

import pytest
import torch
import torch.nn.functional as F

from verispec.ops import chunk_delta, deltanet


def _rowwise(q, k, v, g, beta, state):
    """The rule one row at a time: q, k [Hv, P, dk]; v [Hv, P, dv]; g, beta [Hv, P]."""
    outs = []
    for t in range(q.shape[1]):
        state = state * g[:, t].exp()[:, None, None]
        kv = torch.einsum("hk,hkv->hv", k[:, t], state)
        delta = (v[:, t] - kv) * beta[:, t, None]
        state = state + k[:, t, :, None] * delta[:, None, :]
        outs.append(torch.einsum("hk,hkv->hv", q[:, t], state))
    return torch.stack(outs), state


def _case(rows, hv=3, dk=16, dv=8, decay=1.0, seed=0, dtype=torch.float64):
    g_ = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(hv, rows, dk, generator=g_, dtype=dtype), dim=-1) * dk ** -0.5
    k = F.normalize(torch.randn(hv, rows, dk, generator=g_, dtype=dtype), dim=-1)
    v = torch.randn(hv, rows, dv, generator=g_, dtype=dtype)
    g = -decay * torch.rand(hv, rows, generator=g_, dtype=dtype)
    beta = torch.rand(hv, rows, generator=g_, dtype=dtype)
    s0 = torch.randn(hv, dk, dv, generator=g_, dtype=dtype)
    return q, k, v, g, beta, s0


@pytest.mark.parametrize("rows,c,decay", [(1, 4, 1.0), (16, 4, 1.0), (37, 8, 1.0), (37, 16, 0.0), (50, 8, 8.0),
                                         (150, chunk_delta.CHUNK, 1.0)])
def test_chunks_equal_the_rows_in_fp64(rows, c, decay):
    q, k, v, g, beta, s0 = _case(rows, decay=decay, seed=rows + c)
    want, want_state = _rowwise(q, k, v, g, beta, s0.clone())
    state = s0.clone()
    got = chunk_delta.delta_rule_prepared(q, k, v, g, beta, state, c=c, use_triton=False)
    assert got.shape == (rows, q.shape[0], v.shape[-1])
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(state, want_state, rtol=1e-10, atol=1e-10)


def test_chunks_give_the_row_by_row_rule_from_the_models_inputs_in_fp32():
    """From the model's q, k, v, g, beta (GQA: 2 key heads, 4 value heads; some decays past
    softplus's linear threshold), the chunks give what deltanet.delta_rule_rows gives."""
    g_ = torch.Generator().manual_seed(7)
    rows, hk, hv, dk, dv = 70, 2, 4, 16, 8
    q, k = torch.randn(rows, hk, dk, generator=g_), torch.randn(rows, hk, dk, generator=g_)
    v = torch.randn(rows, hv, dv, generator=g_)
    a = torch.randn(rows, hv, generator=g_)
    a[::7] += 25.0
    g = -(torch.rand(hv, generator=g_) + 0.1) * F.softplus(a)
    beta = torch.sigmoid(torch.randn(rows, hv, generator=g_))
    s0 = torch.randn(hv, dk, dv, generator=g_) * 0.1

    state = s0.clone()
    got = chunk_delta.delta_rule(q, k, v, g, beta, state, use_triton=False)
    ref_state = s0.clone()
    want = deltanet.delta_rule_rows(q, k, v, g, beta, ref_state)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(state, ref_state, rtol=1e-4, atol=1e-5)
