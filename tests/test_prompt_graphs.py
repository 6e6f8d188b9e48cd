"""A fresh prompt padded to its bucket (verispec/prompt_graphs.py), eager, on the CPU: the padding
rows after the prompt change neither the state it leaves nor its last logits beyond the batched
path's rounding. The captured graphs are held to this eager padded path bit for bit on the GPU
(tests/test_cuda.py)."""

import pytest
import torch

from verispec.models.layers import RopeTable
from verispec.ops import chunk_delta
from verispec.prompt_graphs import GRAPH_TO, STEP, PromptGraphs, bucket_rows

from model_fixtures import engine


def _state_tensors(st, rows):
    return ([t[:, :rows] for t in st.k + st.v] + list(st.recurrent.conv) + list(st.recurrent.rec))


def _prefill(model, ids, padded: bool, monkeypatch):
    """Through Model.forward, as the decoder feeds a prompt, with or without the padded path."""
    st = model.new_state(max(STEP * 3, ids.shape[0] + 8))
    monkeypatch.setattr(model, "prompt_graphs", PromptGraphs(model, 2, capture_after=None) if padded else None)
    out = model.forward(ids, st, exact=False, last_logits=True)
    assert bool(model.prompt_graphs is not None and model.prompt_graphs.uses) == padded   # the path taken
    return out, st


@pytest.mark.parametrize("rows", [20, STEP, STEP + 5, 1030])
def test_padding_rows_leave_the_prompt_alone(rows, monkeypatch):
    """(1030 rows: a bucket of the chunks' range, 1152 rows; on the CPU every prompt's recurrence
    runs in chunks.)"""
    model = engine().model
    ids = torch.tensor([(i * 37 + 11) % (model.args.vocab_size - 1) + 1 for i in range(rows)])
    want, want_st = _prefill(model, ids, False, monkeypatch)
    got, got_st = _prefill(model, ids, True, monkeypatch)
    assert got.logits.shape == want.logits.shape == (1, model.args.vocab_size)
    assert got.hidden.shape == want.hidden.shape == (rows, model.args.hidden_size)
    assert got_st.kv_len == want_st.kv_len == rows and got_st.tokens == ids.tolist()
    torch.testing.assert_close(got.logits, want.logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got.hidden, want.hidden, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got.hidden_pre, want.hidden_pre, rtol=1e-4, atol=1e-4)
    for g, w in zip(_state_tensors(got_st, rows), _state_tensors(want_st, rows)):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def test_the_padding_would_show_if_not_skipped(monkeypatch):
    """The check above has teeth: the same padded rows run as prompt rows (no n_real) leave a
    recurrent state far from the prompt's."""
    model = engine().model
    rows = 20
    ids = torch.tensor([(i * 37 + 11) % (model.args.vocab_size - 1) + 1 for i in range(rows)])
    _, want_st = _prefill(model, ids, False, monkeypatch)
    st = model.new_state(STEP)
    model.core(torch.cat([ids, ids.new_zeros(STEP - rows)]), st, 0, False, False, None, last_logits=True)
    far = max((a - b).abs().max().item() for a, b in zip(st.recurrent.rec, want_st.recurrent.rec))
    assert far > 1e-2


def test_buckets_and_bad_calls(monkeypatch):
    model = engine().model
    pg = PromptGraphs(model, 17, capture_after=None)
    assert [pg.bucket(r) for r in (16, 17, STEP, STEP + 1)] == [None, STEP, STEP, 2 * STEP]
    assert pg.bucket(pg.max_rows()) == pg.max_rows() and pg.bucket(pg.max_rows() + 1) is None
    # the row-by-row recurrence's buckets stay below the cut, the chunks' are wider from it
    cut = chunk_delta.CUDA_FROM
    assert cut == 512 and GRAPH_TO == 2048 == pg.max_rows()
    assert [pg.bucket(r) for r in (cut - 70, cut - 60, cut - 1)] == [cut - 64, cut - 1, cut - 1]
    assert [pg.bucket(r) for r in (1024, 1025, 1153, 2047, 2048, 2049)] == [1024, 1152, 1280, 2048, 2048, None]
    assert [bucket_rows(r) for r in (2049, 4095, 4096, 4097)] == [2304, 4096, 4096, 4608]
    for r in range(17, GRAPH_TO + 1):
        b = pg.bucket(r)
        assert r <= b < r + max(STEP, r // 8) and (b < cut) == (r < cut), r
    monkeypatch.setattr(model, "prompt_graphs", pg)
    st = model.new_state(STEP)
    ids = torch.arange(1, 21)
    model.forward(ids, st, exact=False, last_logits=True)
    assert pg.uses == {STEP: 1} and st.kv_len == 20
    model.forward(ids[:5], st, exact=False, last_logits=True)   # the rest of a prompt: not this path
    assert pg.uses == {STEP: 1} and st.kv_len == 25
    with pytest.raises(ValueError, match="fresh prompt"):
        pg.forward(ids, st)                      # kv_len is 20 now: not a fresh prompt


def test_one_instance_through_growing_and_shrinking_buckets(monkeypatch):
    """One PromptGraphs (as a server holds it) takes prompts of 20, 100, 20 and 200 rows: each
    close to its unpadded prefill, each bucket counted."""
    model = engine().model
    pg = PromptGraphs(model, 2, capture_after=None)
    for rows in (20, 100, 20, 200):
        ids = torch.tensor([(i * 31 + rows) % (model.args.vocab_size - 1) + 1 for i in range(rows)])
        monkeypatch.setattr(model, "prompt_graphs", None)
        want = model.forward(ids, model.new_state(rows + 4), exact=False, last_logits=True)
        monkeypatch.setattr(model, "prompt_graphs", pg)
        st = model.new_state(rows + 4)
        got = model.forward(ids, st, exact=False, last_logits=True)
        assert st.kv_len == rows and got.hidden.shape[0] == rows
        torch.testing.assert_close(got.logits, want.logits, rtol=1e-4, atol=1e-4)
    assert pg.uses == {STEP: 2, 2 * STEP: 1, 4 * STEP: 1}


def test_a_grown_rope_table_keeps_the_old_one_alive_and_equal():
    """CUDA graphs captured over a RoPE table read its addresses after the table grows; the old
    table stays alive (RopeTable.retired) and its rows are the new table's."""
    t = RopeTable(64, 0.25, 10000.0)
    t.ensure(300)
    old_cos, old_sin = t.cos, t.sin
    t.ensure(5000)
    assert t.cos.shape[0] >= 5000 and any(r is old_cos for r in t.retired) and any(r is old_sin for r in t.retired)
    assert torch.equal(old_cos, t.cos[:old_cos.shape[0]]) and torch.equal(old_sin, t.sin[:old_sin.shape[0]])

