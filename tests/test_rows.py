"""Row invariance: an M-row forward gives, bit for bit, what the same rows fed one at a time give."""

import pytest
import torch
import torch.nn.functional as F

from model_fixtures import engine
from verispec.models.layers import gated_rms_norm, l2_norm, rms_norm, rowwise, silu_mul
from verispec.ops import attention, deltanet


def _states_equal(a, b):
    n = a.kv_len
    assert n == b.kv_len
    assert a.tokens == b.tokens
    for x, y in zip(a.k + a.v, b.k + b.v):
        assert torch.equal(x[:, :n], y[:, :n])
    for x, y in zip(a.recurrent.conv + a.recurrent.rec, b.recurrent.conv + b.recurrent.rec):
        assert torch.equal(x, y)


def _check_model(model, prefix_lens, threads, max_rows=8, seed=0):
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, model.args.vocab_size, (max(prefix_lens) + max_rows,), generator=g).tolist()
        for pre in prefix_lens:
            base = model.new_state(pre + max_rows + 1)
            if pre:
                model.forward(ids[:pre], base)
            snap = base.snapshot()
            for m in range(1, max_rows + 1):
                a, b = model.new_state(pre + max_rows + 1), model.new_state(pre + max_rows + 1)
                for st in (a, b):
                    st.restore(snap)
                out = model.forward(ids[pre:pre + m], a)
                one = [model.forward(ids[pre + i:pre + i + 1], b) for i in range(m)]
                assert torch.equal(out.logits, torch.cat([o.logits for o in one])), (pre, m)
                assert torch.equal(out.hidden, torch.cat([o.hidden for o in one])), (pre, m)
                _states_equal(a, b)
    finally:
        torch.set_num_threads(old)


@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5_moe"])
@pytest.mark.parametrize("threads", [1, 2])
def test_whole_model_rows_fixture(family, threads):
    _check_model(engine(family, 0).model, [0, 7, 300], threads)


@pytest.mark.slow
@pytest.mark.parametrize("threads", [1, 2])
def test_whole_model_rows_mid_size(threads):
    # hidden 1024: MKL's result classes depend on shape and threads (ENV-NOTES.md)
    eng = engine("qwen3_next", 5, hidden_size=1024, num_layers=4, num_experts=8, top_k=2,
                 num_attention_heads=8, num_key_value_heads=2, head_dim=128,
                 linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=128,
                 linear_value_head_dim=128, moe_intermediate_size=512, shared_expert_intermediate_size=512)
    _check_model(eng.model, [0, 40], threads)


# ----- every op on its own -----

def _rows_equal(fn, *shapes, max_rows=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    for m in range(1, max_rows + 1):
        xs = [torch.randn(m, *s, generator=g) for s in shapes]
        full = fn(*xs)
        one = torch.cat([fn(*(x[i:i + 1] for x in xs)) for i in range(m)])
        assert torch.equal(full, one), (fn, m)


@pytest.mark.parametrize("width", [4, 16, 37, 64, 1024, 8192])
def test_rowwise_elementwise_ops(width):
    for f in (torch.sigmoid, F.softplus, F.silu, torch.exp):
        _rows_equal(lambda x, f=f: rowwise(f, x), (width,))
    _rows_equal(lambda x, y: silu_mul(x, y), (width,), (width,))


def test_plain_sigmoid_is_not_row_invariant_here():
    # why rowwise exists: torch's vectorized main loop and scalar tail round differently
    g = torch.Generator().manual_seed(0)
    diffs = 0
    for m in range(2, 17):
        x = torch.randn(m, 4, generator=g) * 3
        one = torch.cat([torch.sigmoid(x[i:i + 1]) for i in range(m)])
        diffs += not torch.equal(torch.sigmoid(x), one)
    assert diffs > 0


@pytest.mark.parametrize("width", [16, 64, 1024])
def test_norms(width):
    w = torch.randn(width) * 0.1
    _rows_equal(lambda x: rms_norm(x, w, 1e-6), (width,))
    _rows_equal(lambda x: rms_norm(x, w[:16], 1e-6), (4, 16))
    _rows_equal(lambda x, z: gated_rms_norm(x, z, w[:16] + 1, 1e-6), (4, 16), (4, 16))
    _rows_equal(lambda x: l2_norm(x), (4, width))


def test_attention_rows():
    g = torch.Generator().manual_seed(1)
    for start in (0, 5, 300):
        kc = torch.randn(2, start + 9, 16, generator=g)
        vc = torch.randn(2, start + 9, 16, generator=g)
        q = torch.randn(8, 4, 16, generator=g)
        full = attention.attend_rows(q, kc, vc, start, 0.25)
        for m in range(8):
            assert torch.equal(full[m:m + 1], attention.attend_rows(q[m:m + 1], kc, vc, start + m, 0.25))


@pytest.mark.parametrize("start", [0, 5])
def test_prefill_attention_is_causal_after_a_cached_prefix(start):
    """attend_prefill (SDPA with a lower-right causal bias, grouped heads) gives what the row-wise
    kernel gives: row m sees the cache up to start + m, nothing after."""
    g = torch.Generator().manual_seed(3 + start)
    kc = torch.randn(2, start + 9, 16, generator=g)
    vc = torch.randn(2, start + 9, 16, generator=g)
    q = torch.randn(7, 4, 16, generator=g)
    want = attention.attend_rows(q, kc, vc, start, 0.25)
    torch.testing.assert_close(attention.attend_prefill(q, kc, vc, start, 0.25), want, rtol=1e-5, atol=1e-5)
    vc[:, start + 7:] += 100.0                           # keys after the last row's position: never seen
    torch.testing.assert_close(attention.attend_prefill(q, kc, vc, start, 0.25), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,start", [(7, 0), (64, 0), (1, 12), (5, 3), (33, 40)])
def test_prefill_attention_is_the_causal_bias_call_bit_for_bit(dtype, rows, start):
    """attend_prefill leaves torch.nn.attention.bias alone off CUDA (its import pulls in torch._dynamo
    at start-up); the output must be the bias's own, bit for bit, from 0 and after."""
    from torch.nn.attention.bias import causal_lower_right
    g = torch.Generator().manual_seed(rows + start)
    n = start + rows
    kc, vc = (torch.randn(2, n + 4, 16, generator=g).to(dtype) for _ in range(2))
    q = torch.randn(rows, 8, 16, generator=g).to(dtype)
    k, v = (c[:, :n].repeat_interleave(4, dim=0)[None] for c in (kc, vc))
    want = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k, v, attn_mask=causal_lower_right(rows, n),
                                          scale=0.25)[0].transpose(0, 1)
    assert torch.equal(attention.attend_prefill(q, kc, vc, start, 0.25), want)


def test_conv_and_recurrence_rows():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(8, 48, generator=g)
    w = torch.randn(48, 4, generator=g)
    ring0 = torch.randn(48, 3, generator=g)
    r1 = ring0.clone()
    full = deltanet.conv_rows(x, r1, w)
    r2 = ring0.clone()
    one = torch.cat([deltanet.conv_rows(x[i:i + 1], r2, w) for i in range(8)])
    assert torch.equal(full, one) and torch.equal(r1, r2)

    q, k = torch.randn(8, 2, 16, generator=g), torch.randn(8, 2, 16, generator=g)
    v = torch.randn(8, 4, 16, generator=g)
    gg, beta = -torch.rand(8, 4, generator=g), torch.rand(8, 4, generator=g)
    s0 = torch.randn(4, 16, 16, generator=g)
    s1, s2 = s0.clone(), s0.clone()
    full = deltanet.delta_rule_rows(q, k, v, gg, beta, s1)
    one = torch.cat([deltanet.delta_rule_rows(q[i:i + 1], k[i:i + 1], v[i:i + 1], gg[i:i + 1], beta[i:i + 1], s2)
                     for i in range(8)])
    assert torch.equal(full, one) and torch.equal(s1, s2)


def test_verify_is_one_forward():
    """Dense weights are applied in one call for all rows; a routed expert once for its rows."""
    from verispec.ops import linear as lin_ops

    model = engine("qwen3_next", 0).model
    dense = {id(t) for t in model._all_tensors()} - {id(t) for layer in model.layers
                                                      if hasattr(layer.mlp, "experts_gu")
                                                      for t in layer.mlp.experts_gu + layer.mlp.experts_down}
    counts = {}
    orig = lin_ops.linear

    def counting(x, w):
        key = "dense" if id(w) in dense else "expert"
        counts[key] = counts.get(key, 0) + 1
        counts.setdefault("expert_ids", set())
        if key == "expert":
            counts.setdefault(id(w), 0)
            counts[id(w)] += 1
        return orig(x, w)

    dense_by_m = {}
    try:
        lin_ops.linear = counting
        for m in range(1, 9):
            counts.clear()
            st = model.new_state(32)
            model.forward(list(range(3, 3 + m)), st)
            dense_by_m[m] = counts["dense"]
            per_expert = [v for k, v in counts.items() if isinstance(k, int)]
            assert per_expert and max(per_expert) == 1   # one call per routed expert matrix per layer
    finally:
        lin_ops.linear = orig
    assert len(set(dense_by_m.values())) == 1, dense_by_m
