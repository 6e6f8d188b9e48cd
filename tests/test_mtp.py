"""The MTP head as a draft source: reference logits, its KV state, the test matrix, the vocabulary list."""

import pytest
import torch
from safetensors.torch import load_file

from harness import SAMPLED, arm_settings, assert_same, counts, plain_settings, run, simulate_forced
from model_fixtures import REPEAT_PROMPT, engine, fixture_dir
from mtp_ref import RefHead

FAMILIES = ["qwen3_next", "qwen3_5_moe"]
N = 36


def _ref_head(family, seed, **kw):
    import json
    d = fixture_dir(family, seed, mtp=True, **kw)
    cfg = json.loads((d / "config.json").read_text())
    cfg = {**cfg, **cfg.get("rope_parameters", {})}
    t = load_file(str(d / "model.safetensors"))
    eng = engine(family, seed, mtp=True, **kw)
    return RefHead(cfg, {k: v for k, v in t.items() if k.startswith("mtp.")}, eng.model.embed, eng.model.lm_head)


def _plain_hidden(model, prompt, generated, wiring="post"):
    """The backbone's hidden states at every committed position, as plain decoding computes them."""
    st = model.new_state(len(prompt) + len(generated) + 1)
    outs = [model.forward(prompt, st)]
    for t in generated[:-1]:
        outs.append(model.forward([t], st))
    return torch.cat([o.hidden if wiring == "post" else o.hidden_pre for o in outs])


def _check_logged(eng, ref, dec, prompt, res, wiring="post"):
    full = list(prompt) + res.ids
    hidden = _plain_hidden(eng.model, prompt, res.ids, wiring)
    mtp = next(s for s in dec.sources if s.name == "mtp")
    chains, checked = [], 0
    for index, j, ids, scores in mtp.logged:
        if j == 0:
            chains.append([index, []])
        chains[-1][1].append((ids, scores))
    for index, rows in chains:
        want = ref.chain(hidden[:index + 1], full[1:index + 2], len(rows))
        for (ids, got), w in zip(rows, want):
            w = w if ids is None else w[ids]
            assert (got.double() - w).abs().max().item() < 1e-6, (index, len(rows))
            checked += 1
    return checked


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("depth", [1, 2, 3])
def test_head_logits_match_reference(family, depth):
    eng = engine(family, 0, mtp=True)
    ref = _ref_head(family, 0)
    s = arm_settings(plain_settings(24), lookup=False, mtp="on", mtp_drafts=depth, mtp_vocab=0)
    dec = eng.new_decoder(s, REPEAT_PROMPT)
    next(x for x in dec.sources if x.name == "mtp").log_scores = True
    res = eng.generate(REPEAT_PROMPT, s, decoder=dec)
    assert _check_logged(eng, ref, dec, REPEAT_PROMPT, res) >= 23 * depth - 3


def _gated_run(eng, s, extra_row_cost: float):
    """Generate with the gate timing forwards by a fake clock: an n-row forward costs
    10 ms * (1 + extra_row_cost * (n - 1)). Returns (decoder, its MTP drafter logging its
    scores, result)."""
    ticks = {"t": 0.0}
    dec = eng.new_decoder(s, REPEAT_PROMPT, clock=lambda: ticks["t"])
    mtp = next(x for x in dec.sources if x.name == "mtp")
    mtp.log_scores = True
    forward = eng.model.forward

    def timed_forward(ids, state, **k):
        out = forward(ids, state, **k)
        ticks["t"] += 0.010 * (1 + extra_row_cost * (len(ids) - 1))
        return out

    dec.model = type("M", (), {"forward": staticmethod(timed_forward), "args": eng.model.args})()
    return dec, mtp, eng.generate(REPEAT_PROMPT, s, decoder=dec)


def test_head_state_in_a_long_session_with_rejections_and_declines():
    """Gate on (fake clock: rows cost 1.3 plain steps), auto depth, lookup too: rejections,
    declined steps, lookup verifies whose standing rows the head absorbs."""
    family, kw = "qwen3_next", {"vocab_size": 32, "aligned_head": True}
    eng = engine(family, 4, mtp=True, **kw)
    ref = _ref_head(family, 4, **kw)
    s = arm_settings(plain_settings(120), lookup=True, mtp="on", mtp_drafts=0, mtp_vocab=0, gate=True)
    dec, mtp, res = _gated_run(eng, s, extra_row_cost=0.3)
    st = res.stats
    assert st["declined"] >= 1, "the gate never declined"
    assert st["by_source"]["mtp"]["drafts"] > st["by_source"]["mtp"]["accepted"] >= 1
    assert st["by_source"].get("lookup", {}).get("verifies", 0) >= 1
    assert _check_logged(eng, ref, dec, REPEAT_PROMPT, res) >= 10   # head rows written after declines too
    plain = run(eng, REPEAT_PROMPT, plain_settings(120))
    assert res.ids == plain.ids


def test_declined_steps_absorb_together():
    """A random head the gate declines (rows priced at 1.3 plain steps by a fake clock): the
    pairs of declined steps are absorbed together (at most DEFER_MAX per call) before the head
    next writes a row (a probe), so absorb calls are a fraction of the declined steps (one per
    declined step before); every head row written after such a flush still matches the
    stateless reference, and the output equals plain decoding."""
    from verispec.drafts.mtp import DEFER_MAX
    family, kw = "qwen3_next", {"vocab_size": 32, "aligned_head": True}
    eng = engine(family, 4, mtp=True, **kw)
    ref = _ref_head(family, 4, **kw)
    s = arm_settings(plain_settings(120), lookup=False, mtp="on", mtp_drafts=0, mtp_vocab=0, gate=True)
    dec, mtp, res = _gated_run(eng, s, extra_row_cost=0.3)
    st = res.stats
    declined = st["gate"]["sources"]["mtp"]["declined"]
    assert declined >= len(res.ids) // 2, declined
    late = [i for i, j, *_ in mtp.logged if j == 0 and i > 40]
    assert len(late) >= 2, "no probe after a run of declines"
    # prefill; per verify a flush and (when a draft stood) the settle; a flush per DEFER_MAX declines
    assert mtp.absorb_calls <= 2 + st["verifies"] + st["accepted"] + declined // DEFER_MAX, mtp.absorb_calls
    assert mtp.absorb_calls < declined / 4
    assert _check_logged(eng, ref, dec, REPEAT_PROMPT, res) >= st["verifies"]
    assert res.ids == run(eng, REPEAT_PROMPT, plain_settings(120)).ids


@pytest.mark.parametrize("family", FAMILIES)
def test_wiring_pre_and_post_differ(family):
    eng = engine(family, 0, mtp=True)
    out = {}
    for wiring in ("post", "pre"):
        s = arm_settings(plain_settings(8), lookup=False, mtp="on", mtp_drafts=1, mtp_vocab=0)
        from dataclasses import replace
        s = replace(s, drafts=replace(s.drafts, mtp_wiring=wiring))
        dec = eng.new_decoder(s, REPEAT_PROMPT)
        m = next(x for x in dec.sources if x.name == "mtp")
        m.log_scores = True
        eng.generate(REPEAT_PROMPT, s, decoder=dec)
        out[wiring] = torch.stack([x[3] for x in m.logged])
    assert (out["post"] - out["pre"]).abs().max().item() > 1e-2


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("depth", [1, 2, 3])
def test_forced_mtp_arms(family, depth):
    eng = engine(family, 0, mtp=True)
    base = plain_settings(N)
    plain = run(eng, REPEAT_PROMPT, base)
    ctx = eng.context_for(len(REPEAT_PROMPT), base)
    for mode in ["reject", "accept", "mixed", "cycle"] + [f"row{r}" for r in range(1, depth + 1)]:
        arm = run(eng, REPEAT_PROMPT, arm_settings(base, lookup=False, mtp="on", mtp_drafts=depth, force=mode,
                                                   reference=tuple(plain.ids)))
        assert_same(plain, arm, f"mtp {depth} {mode}")
        assert set(arm.stats["by_source"]) == {"mtp"}
        assert counts(arm.stats) == simulate_forced(plain.ids, len(REPEAT_PROMPT), ctx, depth, mode,
                                                    eng.args.vocab_size), mode


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("sampling", ["greedy", "sampled"])
def test_natural_mtp_arms(family, sampling):
    eng = engine(family, 1, mtp=True, vocab_size=32)
    base = plain_settings(N, sampling=SAMPLED) if sampling == "sampled" else plain_settings(N)
    plain = run(eng, REPEAT_PROMPT, base)
    arms = [dict(lookup=False, mtp="on", mtp_drafts=d) for d in (1, 2, 3, 0)]
    arms += [dict(lookup=True, mtp="on", mtp_drafts=2), dict(lookup=True, mtp="on", mtp_drafts=0),
             dict(lookup=True, mtp="on", mtp_drafts=0, gate=True)]
    arms += [dict(lookup=False, mtp="on", mtp_drafts=0, force="cycle", reference=tuple(plain.ids))]
    for a in arms:
        arm = run(eng, REPEAT_PROMPT, arm_settings(base, **a))
        assert_same(plain, arm, str(a))
        if not a.get("gate"):
            assert arm.stats["by_source"]["mtp"]["verifies"] >= 1, a


def test_vocab_list_small_and_whole_give_identical_output(tmp_path):
    eng = engine("qwen3_next", 1, mtp=True, vocab_size=64)
    eng.usage_file_override = str(tmp_path / "counts.bin")
    eng.vocab_lists.clear()
    base = plain_settings(48)
    plain = run(eng, REPEAT_PROMPT, base)
    traces, results = {}, {}
    # the first run with a list of 8 starts from no counts (so every token is listed) and
    # leaves counts behind; the second builds a real 8-token list from them
    for run_no, n in enumerate((0, 8, 8)):
        s = arm_settings(base, lookup=False, mtp="on", mtp_drafts=2, mtp_vocab=n)
        dec = eng.new_decoder(s, REPEAT_PROMPT)
        dec.trace = []
        results[n] = eng.generate(REPEAT_PROMPT, s, decoder=dec, keep_logits=True)
        traces[n] = dec.trace
        assert_same(plain, results[n], f"mtp vocab {n}, run {run_no}")
    v = results[8].stats["vocab"]
    assert v["appended"] >= 1 and v["share_in_list"] < 1.0
    assert traces[0] != traces[8], "the list never changed a draft"


@pytest.mark.parametrize("fail_at", [None, 0, 5, 13])
def test_mtp_copy_slots_allocated_once_and_failure_safe(fail_at):
    from test_rollback import FailingAlloc

    eng = engine("qwen3_next", 4, mtp=True, vocab_size=32, aligned_head=True)
    base = plain_settings(40)
    plain = run(eng, REPEAT_PROMPT, base)
    s = arm_settings(base, lookup=False, mtp="on", mtp_drafts=3, mtp_vocab=0)
    dec = eng.new_decoder(s, REPEAT_PROMPT)
    alloc = FailingAlloc(-1 if fail_at is None else fail_at)
    dec.state.slot_alloc = alloc
    arm = eng.generate(REPEAT_PROMPT, s, decoder=dec, keep_logits=True)
    assert_same(plain, arm, f"slots, failure at {fail_at}")
    per_slot = 2 * eng.args.state_shapes(1).linear_layers
    assert len(dec.state.slots) == 3
    # three slots' tensors, plus the one failed attempt: nothing allocated per verify
    assert alloc.calls == 3 * per_slot + (0 if fail_at is None else (fail_at % per_slot) + 1)
    assert arm.stats["slot_alloc_failures"] == (0 if fail_at is None else 1)
    assert arm.stats["verifies"] > 10


def test_head_state_through_prefix_reuse_and_pin_restore():
    """A served session: every head logit equals a stateless recompute over the committed
    tokens, after prefix reuses and pin restores (the backbone hidden states the head read
    are recorded from the engine's own forwards, so the check is of the head's cache)."""
    from verispec.config import DraftSettings
    from verispec.session import Session

    family, kw = "qwen3_next", {"vocab_size": 32, "aligned_head": True}
    eng = engine(family, 4, mtp=True, **kw)
    ref = _ref_head(family, 4, **kw)
    sess = Session(eng, DraftSettings(lookup=True, mtp="on", mtp_drafts=2, gate=False, mtp_vocab=0),
                   context=256, pin_slots=4)
    mtp = next(s for s in sess.decoder.sources if s.name == "mtp")
    mtp.log_scores = True
    # the hidden state at position p, keyed by the tokens 0..p it was computed from, so a
    # pin restored later is checked against the rows its own turn computed
    hidden_at = {}
    pre, fwd = mtp.after_prefill, mtp.after_forward

    def record(out, n, start):
        tokens = sess.decoder.state.tokens
        for j in range(n):
            hidden_at[tuple(tokens[:start + j + 1])] = out.hidden[j].clone()

    def rec_prefill(out, ids, start):
        record(out, len(ids), start)
        return pre(out, ids, start)

    def rec_forward(out, fed, start):
        record(out, len(fed), start)
        return fwd(out, fed, start)

    mtp.after_prefill, mtp.after_forward = rec_prefill, rec_forward
    checked = 0

    def turn(prompt, n):
        nonlocal checked
        first = len(mtp.logged)
        r = sess.generate(prompt, plain_settings(n))
        full = list(prompt) + r.ids
        # hidden states of this turn's transcript: positions < reused came from earlier forwards
        chains = []
        for index, j, ids, scores in mtp.logged[first:]:
            if j == 0:
                chains.append([index, []])
            chains[-1][1].append(scores)
        for index, rows in chains:
            h = torch.stack([hidden_at[tuple(full[:p + 1])] for p in range(index + 1)])
            want = ref.chain(h, full[1:index + 2], len(rows))
            for got, w in zip(rows, want):
                assert (got.double() - w).abs().max().item() < 1e-6, (index, prompt[:4])
                checked += 1
        return r

    p1 = REPEAT_PROMPT
    r1 = turn(p1, 20)
    turn(p1 + r1.ids + [3, 4], 16)                        # prefix reuse
    turn([9, 8, 7, 6, 5, 4, 3, 2], 12)                    # another prompt: the state starts empty
    r4 = turn(p1 + [30, 31], 12)                          # restores p1's pin
    assert r4.stats["pin_restored"]
    assert sess.metrics["prefix_reuses"] >= 1 and sess.metrics["pin_restores"] >= 1
    assert checked > 40
