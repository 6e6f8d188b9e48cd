"""A prompt continuing a cache, padded to its bucket and run in pieces around the attention layers
(verispec/prompt_pieces.py), eager, on the CPU: close to the unpadded batched continuation, the
cache written for the real rows only. The captured pieces are held to this eager path bit for bit on
the GPU (tests/test_cuda.py)."""

import pytest
import torch

from verispec.prompt_graphs import STEP
from verispec.prompt_pieces import ContinuationGraphs

from model_fixtures import engine


def _ids(model, n, seed):
    return torch.tensor([(i * 37 + 11 * seed) % (model.args.vocab_size - 1) + 1 for i in range(n)])


def _state_tensors(st, rows):
    return [t[:, :rows] for t in st.k + st.v] + list(st.recurrent.conv) + list(st.recurrent.rec)


def _continue(model, prefix, ids, pieces, monkeypatch, max_len=STEP * 4):
    """The prefix fed plainly, then `ids` through Model.forward as the decoder feeds a prompt's new
    part, with or without the pieces."""
    monkeypatch.setattr(model, "prompt_graphs", None)
    monkeypatch.setattr(model, "prompt_pieces", None)
    st = model.new_state(max_len)
    model.forward(prefix, st, exact=False, last_logits=True)
    monkeypatch.setattr(model, "prompt_pieces", pieces)
    return model.forward(ids, st, exact=False, last_logits=True), st


@pytest.mark.parametrize("rows", [20, STEP, STEP + 5])
def test_a_continuation_in_pieces_is_the_unpadded_one(rows, monkeypatch):
    model = engine().model
    prefix, ids = _ids(model, 30, 1), _ids(model, rows, 2)
    want, want_st = _continue(model, prefix, ids, None, monkeypatch)
    cg = ContinuationGraphs(model, 2, capture_after=None)
    got, got_st = _continue(model, prefix, ids, cg, monkeypatch)
    assert cg.uses == {-(-rows // STEP) * STEP: 1}            # the path taken
    n = 30 + rows
    assert got_st.kv_len == want_st.kv_len == n and got_st.tokens == want_st.tokens
    assert got.logits.shape == (1, model.args.vocab_size) and got.hidden.shape == (rows, model.args.hidden_size)
    torch.testing.assert_close(got.logits, want.logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got.hidden, want.hidden, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got.hidden_pre, want.hidden_pre, rtol=1e-4, atol=1e-4)
    for g, w in zip(_state_tensors(got_st, n), _state_tensors(want_st, n)):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def test_the_cache_past_the_prompt_is_neither_written_nor_read(monkeypatch):
    """The padding rows write no keys or values (what the cache held past the prompt is still there)
    and attend to nothing: junk there leaves every bit of the result alone."""
    model = engine().model
    prefix, ids = _ids(model, 30, 3), _ids(model, 20, 4)
    outs = []
    for junk in (0.0, 1e3):
        monkeypatch.setattr(model, "prompt_graphs", None)
        monkeypatch.setattr(model, "prompt_pieces", None)
        st = model.new_state(STEP * 2)
        for t in st.k + st.v:
            t.fill_(junk)
        model.forward(prefix, st, exact=False, last_logits=True)
        monkeypatch.setattr(model, "prompt_pieces", ContinuationGraphs(model, 2, capture_after=None))
        outs.append((model.forward(ids, st, exact=False, last_logits=True), st))
        assert all(bool((t[:, 50:] == junk).all()) for t in st.k + st.v)
    (a, sa), (b, sb) = outs
    assert torch.equal(a.logits, b.logits) and torch.equal(a.hidden, b.hidden)
    assert all(torch.equal(x, y) for x, y in zip(_state_tensors(sa, 50), _state_tensors(sb, 50)))


def test_one_instance_through_turns_of_a_conversation(monkeypatch):
    """One ContinuationGraphs, as a server holds it, over three turns appended to one state (20, 100
    and 20 rows): each turn close to the unpadded path's, the buckets counted; a fresh prompt is not
    its job."""
    model = engine().model
    cg = ContinuationGraphs(model, 2, capture_after=None)
    turns = [_ids(model, n, s) for n, s in ((40, 5), (20, 6), (100, 7), (20, 8))]
    monkeypatch.setattr(model, "prompt_graphs", None)
    states = {}
    for pieces in (None, cg):
        monkeypatch.setattr(model, "prompt_pieces", pieces)
        st = model.new_state(STEP * 4)
        states[pieces is cg] = (st, [model.forward(t, st, exact=False, last_logits=True) for t in turns])
    (st_w, want), (st_g, got) = states[False], states[True]
    for w, g in zip(want, got):
        torch.testing.assert_close(g.logits, w.logits, rtol=1e-4, atol=1e-4)
    assert st_g.kv_len == st_w.kv_len == 180 and st_g.tokens == st_w.tokens
    assert cg.uses == {STEP: 2, 2 * STEP: 1}                  # the first turn is a fresh prompt


def test_bad_calls():
    model = engine().model
    cg = ContinuationGraphs(model, 17, capture_after=None)
    st = model.new_state(STEP)
    with pytest.raises(ValueError, match="after a cache"):
        cg.forward(torch.arange(1, 21), st)                    # kv_len 0: a fresh prompt
    model.forward(torch.arange(1, 5), st, exact=True)
    with pytest.raises(ValueError, match="after a cache"):
        cg.forward(torch.arange(1, 11), st)                    # below the bucket's rows
    assert st.kv_len == 4 and cg.uses == {}
