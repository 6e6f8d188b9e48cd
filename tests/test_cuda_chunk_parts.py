"""The chunks' state-free parts in one Triton launch (verispec/ops/chunk_parts_cuda.py) against the
torch parts (chunk_delta.chunk_parts) in fp64, at the 35B-A3B DeltaNet widths (32 value heads of
128 x 128) with the model's strided layout and a part-filled last chunk. Skipped where torch sees
no CUDA GPU (CI); run on the device machine."""

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")

from verispec.ops import chunk_delta, chunk_parts_cuda  # noqa: E402

HV, DK, DV = 32, 128, 128
NAMES = ("kc", "w", "qg", "p", "kd", "dec")


def _inputs(rows: int, correlated: bool, seed: int = 0):
    """q, k [Hv, P, dk], v [Hv, P, dv], g, beta [Hv, P] as chunk_delta.delta_rule hands them on:
    transposed views of [P, Hv, *] tensors, v's rows adjacent in memory (the model's v is a slice of
    the conv's output, laid out [channels, P]). Correlated: every key near one direction, beta near 1 and
    almost no decay, the hardest case for the triangular solve (its entries grow along the chunk)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    k = torch.randn(rows, HV, DK, device="cuda", generator=gen)
    if correlated:
        k = k * 0.1 + torch.randn(1, HV, DK, device="cuda", generator=gen)
    q = F.normalize(torch.randn(rows, HV, DK, device="cuda", generator=gen), dim=-1) * DK ** -0.5
    k = F.normalize(k, dim=-1)
    v = torch.randn(HV * DV, rows, device="cuda", generator=gen).t().reshape(rows, HV, DV)
    if correlated:
        g = -torch.rand(rows, HV, device="cuda", generator=gen) * 0.01
        beta = 0.9 + 0.1 * torch.rand(rows, HV, device="cuda", generator=gen)
    else:
        g = -torch.rand(rows, HV, device="cuda", generator=gen) * 0.5
        beta = torch.rand(rows, HV, device="cuda", generator=gen)
    return q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), g.t(), beta.t()


def _rel(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


@pytest.mark.parametrize("rows,correlated", [(300, False), (64, False), (1100, False), (300, True)])
def test_chunk_parts_in_one_launch_match_the_torch_parts(rows, correlated):
    """Each of the six parts is as close to the fp64 parts as the fp32 torch parts are (within 4x
    and 1e-6), and two launches give the same bits."""
    x = _inputs(rows, correlated)
    assert x[2].stride(1) == 1 and x[2].stride(2) == rows     # v as the model hands it on
    assert chunk_parts_cuda.usable(x[0], x[2], chunk_delta.CHUNK)
    ref = [t.clone() for t in chunk_delta.chunk_parts(*(t.double() for t in x))]
    mine = chunk_delta.chunk_parts(*x)
    got = chunk_parts_cuda.chunk_parts(*x, chunk_delta.CHUNK)
    again = chunk_parts_cuda.chunk_parts(*x, chunk_delta.CHUNK)
    errs = {}
    for name, g, m, r in zip(NAMES, got, mine, ref):
        assert g.shape == r.shape and g.dtype == torch.float32, name
        errs[name] = (_rel(g, r), _rel(m, r))
    print(f"rows {rows} correlated {correlated}: (one launch, torch) relative to fp64:", errs)
    for name, (e_got, e_torch) in errs.items():
        assert e_got <= max(4 * e_torch, 1e-6), (name, e_got, e_torch)
    assert all(torch.equal(a, b) for a, b in zip(got, again))


def test_the_rule_with_fused_parts_follows_the_torch_parts():
    """The whole chunked rule with the fused parts against the same rule with the torch parts, outputs
    and final state, and a 300-row prompt cut in two (the state carried from the first part) against it
    in one."""
    q, k, v, g, beta = _inputs(300, False, seed=1)
    s0 = torch.randn(HV, DK, DV, device="cuda") * 0.05
    outs = {}
    default = chunk_parts_cuda.enabled
    try:
        for fused in (True, False):
            chunk_parts_cuda.enabled = fused
            st = s0.clone()
            outs[fused] = (chunk_delta.delta_rule_prepared(q, k, v, g, beta, st), st)
        chunk_parts_cuda.enabled = True
        st = s0.clone()
        first = chunk_delta.delta_rule_prepared(q[:, :130], k[:, :130], v[:, :130], g[:, :130], beta[:, :130], st)
        second = chunk_delta.delta_rule_prepared(q[:, 130:], k[:, 130:], v[:, 130:], g[:, 130:], beta[:, 130:], st)
    finally:
        chunk_parts_cuda.enabled = default
    rel = [((a - b).norm() / b.norm()).item() for a, b in zip(outs[True], outs[False])]
    split = torch.cat([first, second])
    rel += [((split - outs[True][0]).norm() / outs[True][0].norm()).item(),
            ((st - outs[True][1]).norm() / outs[True][1].norm()).item()]
    print("fused/torch out, state; split/whole out, state:", rel)
    assert max(rel) < 1e-5, rel


def _raw_inputs(rows: int, padded: int, seed: int = 2):
    """What the model hands chunk_delta.delta_rule_raw: the conv's output mixed [P, q|k|v] in bf16 with its
    rows adjacent (deltanet.conv_prefill's layout), the input product's b|a columns [P, 2 Hv] in bf16 with
    the last `padded` rows at -inf (a bucket's padding), exp(A_log) and dt_bias; 16 key heads to 32 value
    heads as at the 35B-A3B shape. And the same made ready the torch way (the model's own operations)."""
    from verispec.ops import deltanet
    gen = torch.Generator(device="cuda").manual_seed(seed)
    hk = HV // 2
    kd = hk * DK
    mixed = torch.randn(2 * kd + HV * DV, rows, device="cuda", generator=gen).t().to(torch.bfloat16)
    ba = torch.randn(rows, 2 * HV, device="cuda", generator=gen).to(torch.bfloat16)
    ba[rows - padded:] = float("-inf")
    a_log_exp = torch.rand(HV, device="cuda", generator=gen) + 0.5
    dt_bias = torch.randn(HV, device="cuda", generator=gen).to(torch.bfloat16)
    q = mixed[:, :kd].reshape(rows, hk, DK)
    k = mixed[:, kd:2 * kd].reshape(rows, hk, DK)
    v = mixed[:, 2 * kd:].reshape(rows, HV, DV)
    beta = torch.sigmoid(ba[:, :HV])
    g = -a_log_exp * F.softplus(ba[:, HV:].float() + dt_bias)
    q, k, v, g, beta = deltanet.prepare(q, k, v, g, beta)
    ready = (q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), g.t(), beta.t())
    return (mixed, ba, a_log_exp, dt_bias), (hk, DK, DV), ready


def test_the_parts_from_the_conv_output_match_the_prepared_parts():
    """chunk_parts_raw (the norms, the repeat to the value heads, beta and g inside the launch) against the
    parts of the same inputs made ready by the model's torch operations, both against fp64: each part
    within 4x (and 1e-6) of the prepared launch's error; the padding rows (b = a = -inf) and the rows past
    the prompt add nothing, so dec over the last chunk is exp(0) past them; two launches the same bits."""
    raw, heads, ready = _raw_inputs(1100, 60)
    assert chunk_parts_cuda.usable_raw(raw[0], DK, DV, chunk_delta.CHUNK)
    ref = [t.clone() for t in chunk_delta.chunk_parts(*(t.double() for t in ready))]
    prepared = chunk_parts_cuda.chunk_parts(*ready, chunk_delta.CHUNK)
    got = chunk_parts_cuda.chunk_parts_raw(*raw, *heads, chunk_delta.CHUNK)
    again = chunk_parts_cuda.chunk_parts_raw(*raw, *heads, chunk_delta.CHUNK)
    errs = {}
    for name, g, m, r in zip(NAMES, got, prepared, ref):
        assert g.shape == r.shape and g.dtype == torch.float32, name
        errs[name] = (_rel(g, r), _rel(m, r))
    print("(raw launch, prepared launch) relative to fp64:", errs)
    for name, (e_got, e_prep) in errs.items():
        assert e_got <= max(4 * e_prep, 1e-6), (name, e_got, e_prep)
    assert torch.equal(got[5][:, -1], torch.ones_like(got[5][:, -1]))   # rows 1088-1151: padding or past P
    assert all(torch.equal(a, b) for a, b in zip(got, again))


def test_the_rule_from_the_conv_output_follows_the_torch_rule():
    """delta_rule_raw's outputs and final state against the whole rule the torch way (deltanet.prepare, the
    torch parts, the Triton chain), within 1e-5; its bf16 output (the chain rounding as it stores) equal to
    its fp32 output rounded by torch."""
    raw, heads, ready = _raw_inputs(700, 30, seed=3)
    s0 = torch.randn(HV, DK, DV, device="cuda") * 0.05
    st_raw, st_torch = s0.clone(), s0.clone()
    out_raw = chunk_delta.delta_rule_raw(*raw, st_raw, heads)
    out_bf16 = chunk_delta.delta_rule_raw(*raw, s0.clone(), heads, out_dtype=torch.bfloat16)
    assert out_bf16.dtype == torch.bfloat16 and torch.equal(out_bf16, out_raw.to(torch.bfloat16))
    default = chunk_parts_cuda.enabled
    try:
        chunk_parts_cuda.enabled = False
        out_torch = chunk_delta.delta_rule_prepared(*ready, st_torch)
    finally:
        chunk_parts_cuda.enabled = default
    rel = [_rel(out_raw, out_torch.double()), _rel(st_raw, st_torch.double())]
    print("raw/torch out, state:", rel)
    assert out_raw.shape == out_torch.shape == (700, HV, DV)
    assert max(rel) < 1e-5, rel


def test_the_forward_reaches_the_fused_parts(monkeypatch):
    """A batched prefill of the bundled model in chunks calls the parts' launch once a DeltaNet layer when
    it is on: from the conv's output by default (chunk_parts_raw), from the prepared inputs with `raw` off
    (the model's v is strided: a check on the layout once kept the forward from it); and its first token
    is the one the torch parts give in both."""
    from verispec.config import DraftSettings, RunSettings, default_model_dir
    from verispec.engine import load_engine

    eng = load_engine(default_model_dir(), device="cuda")
    monkeypatch.setattr(chunk_delta, "CUDA_FROM", 0)
    # eager every time: a bucket's capture on its second use would run the forward more than once
    monkeypatch.setattr(eng.model, "prompt_graphs", None)
    monkeypatch.setattr(eng.model, "prompt_pieces", None)
    settings = RunSettings(max_tokens=1, prefill_batch=True, drafts=DraftSettings(lookup=False, mtp="off"))
    prompt = list(range(5, 305))
    calls = []
    for name in ("chunk_parts", "chunk_parts_raw"):
        real = getattr(chunk_parts_cuda, name)
        monkeypatch.setattr(chunk_parts_cuda, name,
                            lambda *a, _n=name, _f=real, **kw: calls.append(_n) or _f(*a, **kw))
    assert chunk_parts_cuda.raw is True and chunk_parts_cuda.enabled is True    # the defaults
    monkeypatch.setattr(chunk_parts_cuda, "enabled", False)
    torch_ids = eng.generate(prompt, settings).ids
    assert calls == []
    deltanet_layers = eng.args.layer_types.count("linear_attention")
    assert deltanet_layers > 0
    monkeypatch.setattr(chunk_parts_cuda, "enabled", True)
    raw_ids = eng.generate(prompt, settings).ids
    assert calls == ["chunk_parts_raw"] * deltanet_layers, calls
    calls.clear()
    monkeypatch.setattr(chunk_parts_cuda, "raw", False)
    fused_ids = eng.generate(prompt, settings).ids
    assert calls == ["chunk_parts"] * deltanet_layers, calls
    assert raw_ids == fused_ids == torch_ids
