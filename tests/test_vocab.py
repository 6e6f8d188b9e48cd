"""The MTP vocabulary list: counting, halving, rebuilds, the 3/4 rule, the counts file."""

from __future__ import annotations

import hashlib
import os
import random
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import verispec
from verispec.drafts.vocab import MAGIC, VERSION, VocabList, report_line, usage_path


def ids_list(v: VocabList) -> list[int]:
    t = v.ids()
    if t is None:                        # a list that holds every token is returned as None
        assert v.top_n > 0 and v.list_size() == v.vocab_size
        return list(range(v.vocab_size))
    assert t.dtype == torch.int64
    return t.tolist()


def header(vocab: int, records: int, since: int = 0, magic: bytes = MAGIC, version: int = VERSION) -> bytes:
    return struct.pack("<8sIIII", magic, version, vocab, since, records)


def records(pairs) -> bytes:
    return b"".join(struct.pack("<II", i, c) for i, c in pairs)


# --- counting, halving, rebuilds -------------------------------------------------------------

def test_counting_prompt_and_picks():
    v = VocabList(10, top_n=3, halve_every=1000)
    v.start_request([])
    v.count_prompt([1, 1, 2, 7])
    v.count_pick(2)
    v.count_pick(9)
    assert v.counts().tolist() == [0, 2, 2, 0, 0, 0, 0, 1, 0, 1]
    s = v.stats()
    assert s["counted"] == 6 and s["picks"] == 2 and s["halvings"] == 0


def test_count_prompt_accepts_tensor_and_rejects_out_of_range():
    v = VocabList(10, top_n=3)
    v.count_prompt(torch.tensor([[3, 4]]))
    assert v.counts()[[3, 4]].tolist() == [1, 1]
    with pytest.raises(ValueError):
        v.count_prompt([10])
    with pytest.raises(ValueError):
        v.count_pick(-1)
    with pytest.raises(ValueError):
        v.contains(10)


def test_halving_at_exactly_1024_and_rebuild_then():
    v = VocabList(5000, top_n=2)                   # halve_every defaults to 1024
    v.start_request([])
    assert v.stats()["rebuilds"] == 1
    assert v.ids() is None                         # no counts yet: the 2nd count is 0, every token is in
    # 1023 tokens: counts of 0 -> 500, 1 -> 300, 2 -> 223
    v.count_prompt([0] * 500 + [1] * 300 + [2] * 223)
    assert v.stats()["halvings"] == 0 and v.stats()["counted"] == 1023
    assert v.ids() is None                         # not rebuilt yet
    assert v.counts()[:3].tolist() == [500, 300, 223]
    v.count_pick(3)                                # the 1024th counted token (in the whole list)
    s = v.stats()
    assert s["halvings"] == 1 and s["rebuilds"] == 2 and s["appended"] == 0
    assert v.counts()[:4].tolist() == [250, 150, 111, 0]   # 1 // 2 == 0
    # rebuild: top 2 = {0, 1}, c_N = 150, 3/4 -> 112.5: token 2 (111) not by the rule,
    # but 0..3 are conversation tokens
    assert ids_list(v) == [0, 1, 2, 3]
    v.start_request([4000])
    assert ids_list(v) == [0, 1, 4000]
    # the next halving comes 1024 counted tokens later, in the middle of a prompt
    v.count_prompt([7] * 1000)
    assert v.stats()["halvings"] == 1
    v.count_prompt([7] * 30)                       # the 24th of these is the 2048th counted token
    assert v.stats()["halvings"] == 2
    assert v.counts()[7] == (1000 + 24) // 2 + 6
    assert v.counts()[0] == 125


def test_halving_boundary_inside_one_prompt():
    v = VocabList(4, top_n=1, halve_every=4)
    v.count_prompt([0, 0, 0, 0, 1, 1])            # halve after the 4th: 0 -> 2, then 1 -> 2
    assert v.counts().tolist() == [2, 2, 0, 0]
    assert v.stats()["halvings"] == 1
    v.count_prompt([1, 1, 1, 1, 1])               # halve after the 2nd: [2, 4] -> [1, 2] then +3
    assert v.counts().tolist() == [1, 5, 0, 0]
    assert v.stats()["halvings"] == 2
    v.count_prompt([1] * 5)                       # halve after the 1st and the 5th:
    assert v.counts().tolist() == [0, 3, 0, 0]    # [1, 6] -> [0, 3]; +4 -> [0, 7] -> [0, 3]
    assert v.stats()["halvings"] == 4


def test_rebuild_on_start_request_replaces_conversation():
    v = VocabList(100, top_n=2, halve_every=10_000)
    v.start_request([50, 51])
    v.count_prompt([1] * 10 + [2] * 9 + [3] * 3)
    v.count_pick(60)
    assert v.ids() is None                         # built before any count: every token
    v.start_request([70])                          # old conversation leaves; rule: {1, 2}
    assert ids_list(v) == [1, 2, 70]
    assert v.stats()["rebuilds"] == 2


def test_list_does_not_change_between_rebuilds_except_joins():
    v = VocabList(100, top_n=1, halve_every=10_000)
    v.count_prompt([5] * 4)
    v.start_request([])
    assert ids_list(v) == [5]
    v.count_prompt([9] * 20)                       # 9 now outranks 5, but no rebuild yet
    assert ids_list(v) == [5, 9]                   # 9 joined as a conversation token
    v.start_request([])
    assert ids_list(v) == [9]


@pytest.mark.parametrize("c_n", [4, 8, 12, 100, 101, 103])
def test_three_quarter_rule(c_n):
    # top_n = 3: tokens 10, 11, 12 get c_n + 2, c_n + 1, c_n; candidates around 3/4 * c_n
    vocab = 64
    v = VocabList(vocab, top_n=3, halve_every=10**9)
    counts = {10: c_n + 2, 11: c_n + 1, 12: c_n}
    at = -(-3 * c_n // 4)                          # ceil(3/4 c_n): the smallest count that is in
    counts[20] = at
    counts[21] = at - 1
    counts[22] = c_n                               # a tie with the N-th (higher id): in by the 3/4 rule
    for tok, c in counts.items():
        v.count_prompt([tok] * c)
    v.start_request([40])
    got = ids_list(v)
    assert got == sorted([10, 11, 12, 20, 22, 40]), (c_n, counts)
    assert 4 * at >= 3 * c_n and 4 * (at - 1) < 3 * c_n


def test_fewer_counted_tokens_than_n_and_all_zero():
    v = VocabList(50, top_n=10)
    v.start_request([])
    assert v.ids() is None and v.list_size() == 50   # all counts 0: the N-th count is 0, every token is in
    v.count_prompt([30, 31, 31])
    v.start_request([])
    assert v.ids() is None                           # 2 counted tokens < N: still every token
    v.count_prompt(list(range(10)))                  # now 12 counted tokens, the 10th has count 1
    v.start_request([])
    assert ids_list(v) == list(range(10)) + [30, 31]


def test_conversation_tokens_always_in():
    v = VocabList(1000, top_n=2, halve_every=7)
    rng = random.Random(3)
    conv = [rng.randrange(1000) for _ in range(20)]
    v.start_request(conv)
    for step in range(200):
        t = rng.randrange(1000)
        if step % 3:
            v.count_pick(t)
        else:
            v.count_prompt([t, rng.randrange(1000)])
        conv.append(t)
        got = set(ids_list(v))
        assert set(conv) <= got


def test_missing_pick_joins_at_once_and_counts_as_appended():
    v = VocabList(100, top_n=2, halve_every=10_000)
    v.count_prompt([1, 1, 2, 2])
    v.start_request([])
    t0 = v.ids()
    assert t0.tolist() == [1, 2]
    assert v.ids() is t0                           # cached while nothing changes
    assert not v.contains(42)
    v.count_pick(42)
    assert v.contains(42)
    assert v.ids().tolist() == [1, 2, 42]
    v.count_pick(42)
    v.count_pick(1)
    s = v.stats()
    assert s["appended"] == 1 and s["picks"] == 3 and s["picks_in_list"] == 2
    assert s["share_in_list"] == pytest.approx(2 / 3)


def test_note_draft_average_and_report_line():
    v = VocabList(100, top_n=2, halve_every=10_000)
    v.count_prompt([1] * 3 + [2] * 3)
    v.start_request([1, 2])                        # top 2 = {1, 2}, nothing else within 3/4
    v.note_draft()                                 # 2 ids
    v.count_pick(3)
    v.count_pick(4)
    v.note_draft()                                 # 4 ids
    s = v.stats()
    assert s["avg_list_size"] == pytest.approx(3.0)
    line = report_line(s)
    assert line == "vocab list: avg 3 ids, 0.0% of picks inside, 2 appended, 1 rebuilds"


def test_top_n_zero_is_whole_vocabulary():
    v = VocabList(30, top_n=0, halve_every=4)
    v.start_request([1, 2])
    assert v.ids() is None
    assert v.contains(29)
    v.count_prompt([5, 5, 5])
    v.count_pick(7)                                # 4th counted: halving
    v.note_draft()
    s = v.stats()
    assert s["appended"] == 0 and s["picks_in_list"] == 1 and s["halvings"] == 1
    assert s["avg_list_size"] == 30
    assert v.counts()[5] == 1 and v.counts()[7] == 0
    assert v.ids() is None


# --- the list against a brute-force recomputation of the rule ----------------------------------

class Model:
    """The rule written the slow way: sort by (-count, id), take N, add >= 3/4 of the N-th."""

    def __init__(self, vocab, top_n, halve_every):
        self.vocab, self.top_n, self.halve_every = vocab, top_n, halve_every
        self.counts = [0] * vocab
        self.since = 0
        self.conv: set[int] = set()
        self.rule: set[int] = set()

    def rebuild(self):
        ranked = sorted(range(self.vocab), key=lambda t: (-self.counts[t], t))
        top = ranked[:self.top_n]
        rule = set(top)
        c_n = self.counts[top[-1]] if top else 0
        rule |= {t for t in ranked if 4 * self.counts[t] >= 3 * c_n}
        self.rule = rule

    def count(self, t):
        self.counts[t] += 1
        self.conv.add(t)
        self.since += 1
        if self.since == self.halve_every:
            self.counts = [c // 2 for c in self.counts]
            self.since = 0
            self.rebuild()

    def start(self, conv):
        self.conv = set(conv)
        self.rebuild()

    def ids(self):
        return sorted(self.rule | self.conv)


def run_ops(ops, vocab, top_n, halve_every):
    v = VocabList(vocab, top_n=top_n, halve_every=halve_every)
    m = Model(vocab, top_n, halve_every)
    picks_outside = 0
    for kind, toks in ops:
        if kind == "start":
            v.start_request(toks)
            m.start(toks)
        elif kind == "prompt":
            v.count_prompt(toks)
            for t in toks:
                m.count(t)
        else:
            t = toks[0]
            picks_outside += t not in m.ids()
            v.count_pick(t)
            m.count(t)
        assert ids_list(v) == m.ids()
        assert v.counts().tolist() == m.counts
        assert all(v.contains(t) == (t in m.ids()) for t in range(vocab))
    assert v.stats()["appended"] == picks_outside


op = st.one_of(
    st.tuples(st.just("start"), st.lists(st.integers(0, 19), max_size=6)),
    st.tuples(st.just("prompt"), st.lists(st.integers(0, 19), max_size=12)),
    st.tuples(st.just("pick"), st.lists(st.integers(0, 19), min_size=1, max_size=1)),
)


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(op, max_size=40), top_n=st.integers(1, 25), halve_every=st.integers(1, 9))
def test_ids_match_brute_force(ops, top_n, halve_every):
    run_ops(ops, 20, top_n, halve_every)


def test_ids_match_brute_force_seeded_long():
    rng = random.Random(0)
    for trial in range(5):
        vocab = 60
        ops = []
        for _ in range(400):
            r = rng.random()
            # a skewed distribution so counts differ and the 3/4 rule matters
            tok = lambda: min(int(rng.expovariate(0.15)), vocab - 1)
            if r < 0.05:
                ops.append(("start", [tok() for _ in range(rng.randrange(5))]))
            elif r < 0.35:
                ops.append(("prompt", [tok() for _ in range(rng.randrange(20))]))
            else:
                ops.append(("pick", [tok()]))
        run_ops(ops, vocab, top_n=rng.randrange(1, 12), halve_every=rng.randrange(5, 60))


# --- the counts file -------------------------------------------------------------------------

def test_round_trip(tmp_path):
    rng = np.random.default_rng(1)
    v = VocabList(5000, top_n=50, halve_every=1024)
    v.count_prompt(rng.integers(0, 5000, size=3000).tolist())   # 2 halvings, 952 since
    path = tmp_path / "sub" / "dir" / "vocab_usage.bin"          # parents are created
    assert v.save(path)
    w = VocabList(5000, top_n=50, halve_every=1024)
    assert w.load(path)
    assert np.array_equal(w.counts(), v.counts())
    # the halving phase carries over: 72 more counted tokens halve
    w.count_prompt([0] * 71)
    assert w.stats()["halvings"] == 0
    w.count_pick(0)
    assert w.stats()["halvings"] == 1
    # the file is the documented layout
    data = path.read_bytes()
    nz = np.flatnonzero(v.counts())
    assert data[:24] == struct.pack("<8sIIII", MAGIC, VERSION, 5000, 3000 - 2048, nz.size)
    assert data[24:] == records((int(i), int(v.counts()[i])) for i in nz)
    # a load rebuilds the list from the read counts (the conversation is empty)
    w2 = VocabList(5000, top_n=50)
    w2.load(path)
    c = v.counts()
    c_n = np.sort(c)[::-1][49]
    assert ids_list(w2) == [int(i) for i in np.flatnonzero((c > 0) & (4 * c >= 3 * c_n))]


def test_missing_file_is_fresh_counts_without_warning(tmp_path, capsys):
    v = VocabList(10)
    assert v.load(tmp_path / "nope.bin") is False
    assert v.counts().sum() == 0
    assert capsys.readouterr().err == ""
    v.count_pick(3)
    assert v.save(tmp_path / "nope.bin")
    assert capsys.readouterr().err == ""


def test_empty_counts_round_trip(tmp_path):
    v = VocabList(10)
    assert v.save(tmp_path / "c.bin")
    assert (tmp_path / "c.bin").read_bytes() == header(10, 0)
    assert VocabList(10).load(tmp_path / "c.bin") is True


DAMAGED = {
    "bad magic": header(10, 1, magic=b"NOTVOCAB") + records([(1, 5)]),
    "bad version": header(10, 1, version=2) + records([(1, 5)]),
    "truncated header": header(10, 1)[:13],
    "empty file": b"",
    "wrong vocab size": header(11, 1) + records([(1, 5)]),
    "id out of range": header(10, 2) + records([(1, 5), (10, 3)]),
    "trailing partial record": header(10, 2) + records([(1, 5), (2, 3)])[:-3],
    "fewer records than the header": header(10, 3) + records([(1, 5), (2, 3)]),
    "extra bytes after the records": header(10, 1) + records([(1, 5)]) + b"\0",
    "repeated id": header(10, 2) + records([(1, 5), (1, 3)]),
    "garbage bytes": bytes(random.Random(7).randrange(256) for _ in range(77)),
}


@pytest.mark.parametrize("kind", sorted(DAMAGED))
def test_damaged_file_left_untouched(tmp_path, capsys, kind):
    path = tmp_path / "vocab_usage.bin"
    path.write_bytes(DAMAGED[kind])
    mtime = path.stat().st_mtime_ns
    v = VocabList(10, top_n=2)
    v.count_pick(4)
    assert v.load(path) is False
    assert v.counts().tolist() == [0, 0, 0, 0, 1, 0, 0, 0, 0, 0]  # kept as they were
    v.count_pick(5)
    assert v.save(path) is False
    assert path.read_bytes() == DAMAGED[kind]
    assert path.stat().st_mtime_ns == mtime
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"[verispec MTP] vocab counts {path}: ")
    assert err[0].endswith("; not replaced")
    assert sorted(os.listdir(tmp_path)) == ["vocab_usage.bin"]


def test_damaged_file_not_replaced_even_without_load(tmp_path, capsys):
    path = tmp_path / "vocab_usage.bin"
    path.write_bytes(DAMAGED["garbage bytes"])
    v = VocabList(10)
    v.count_pick(1)
    assert v.save(path) is False
    assert path.read_bytes() == DAMAGED["garbage bytes"]
    assert len(capsys.readouterr().err.splitlines()) == 1


def test_atomic_write_leaves_no_temp_files(tmp_path):
    path = tmp_path / "vocab_usage.bin"
    v = VocabList(100)
    for i in range(5):
        v.count_pick(i)
        assert v.save(path)
    assert os.listdir(tmp_path) == ["vocab_usage.bin"]
    w = VocabList(100)
    assert w.load(path) and w.counts()[:5].tolist() == [1] * 5


def test_unwritable_location_warns_once_and_does_not_raise(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_bytes(b"x")
    v = VocabList(10)
    assert v.save(blocker / "sub" / "vocab_usage.bin") is False   # a parent is a file
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "cannot write" in err[0]
    assert blocker.read_bytes() == b"x"


# --- where the file lives --------------------------------------------------------------------

def _state_path(state_home: Path, model_dir: Path) -> Path:
    digest = hashlib.sha256(str(model_dir.resolve()).encode()).hexdigest()[:16]
    return state_home / "verispec" / digest / "vocab_usage.bin"


def test_usage_path_explicit(tmp_path):
    assert usage_path(tmp_path, str(tmp_path / "x.bin")) == tmp_path / "x.bin"


def test_usage_path_writable_model_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    model = tmp_path / "model"
    model.mkdir()
    assert usage_path(model, None) == model.resolve() / "vocab_usage.bin"


def test_usage_path_inside_package_goes_to_state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    package = Path(verispec.__file__).parent
    for model in (package, package / "data" / "some-model"):
        got = usage_path(model, None)
        assert got == _state_path(tmp_path / "state", model)
        assert package.resolve() not in got.resolve().parents


def test_usage_path_default_state_home(tmp_path, monkeypatch):
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    model = Path(verispec.__file__).parent
    assert usage_path(model, None) == _state_path(tmp_path / "home" / ".local" / "state", model)


def test_usage_path_unwritable_dir_goes_to_state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    model = tmp_path / "model"
    model.mkdir()
    model.chmod(0o500)
    try:
        if os.access(model, os.W_OK):
            pytest.skip("running as a user who can write a 0o500 directory (root)")
        got = usage_path(model, None)
        assert got == _state_path(tmp_path / "state", model)
        # and the state directory is created on save
        v = VocabList(10)
        v.count_pick(1)
        assert v.save(got)
        assert VocabList(10).load(got)
    finally:
        model.chmod(0o700)


def test_usage_path_unwritable_dir_rule_even_as_root(tmp_path, monkeypatch):
    # the 0o500 test above skips as root; here the writability check itself answers "no"
    import verispec.drafts.vocab as vocab_mod
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    model = tmp_path / "model"
    model.mkdir()
    real_access = os.access
    monkeypatch.setattr(vocab_mod.os, "access",
                        lambda p, mode: False if Path(p) == model.resolve() else real_access(p, mode))
    assert usage_path(model, None) == _state_path(tmp_path / "state", model)
