"""Undo: a rejection after any row of a verify leaves exactly plain decoding's state."""

import pytest
import torch

from harness import arm_settings, assert_same, plain_settings, run
from model_fixtures import REPEAT_PROMPT, engine


def _same_state(a, b):
    sa, sb = a.snapshot(), b.snapshot()
    assert sa["kv_len"] == sb["kv_len"] and sa["tokens"] == sb["tokens"]
    for key in ("k", "v", "conv", "rec"):
        for x, y in zip(sa[key], sb[key]):
            assert torch.equal(x, y), key


@pytest.mark.parametrize("copy_commit", [False, True])
@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5_moe"])
def test_rejection_at_every_row_restores_plain_state(family, copy_commit):
    """copy_commit (as under CUDA graphs): the kept row's slot is copied into the live state's
    own tensors, which must stay the same tensors."""
    model = engine(family, 0).model
    g = torch.Generator().manual_seed(7)
    prompt = torch.randint(0, model.args.vocab_size, (9,), generator=g).tolist()
    true = torch.randint(0, model.args.vocab_size, (8,), generator=g).tolist()
    for rows in range(2, 7):
        for keep in range(1, rows + 1):
            plain = model.new_state(32)
            model.forward(prompt, plain)
            for t in true[:keep]:
                model.forward([t], plain)
            spec = model.new_state(32)
            spec.copy_commit = copy_commit
            model.forward(prompt, spec)
            assert spec.ensure_slots(rows - 1)
            live = [t.data_ptr() for t in spec.recurrent.conv + spec.recurrent.rec]
            # rows that stand are the true tokens; the rest are wrong drafts
            fed = true[:keep] + [(t + 1) % model.args.vocab_size for t in true[keep:rows]]
            start = spec.kv_len
            out = model.forward(fed, spec, save_slots=True)
            spec.commit(start, rows, keep)
            _same_state(spec, plain)
            if copy_commit:
                assert [t.data_ptr() for t in spec.recurrent.conv + spec.recurrent.rec] == live
            # and the next step from the restored state gives plain decoding's bits
            nxt = true[keep] if keep < len(true) else 3
            assert torch.equal(model.forward([nxt], spec).logits, model.forward([nxt], plain).logits)
            assert out.logits.shape[0] == rows


class FailingAlloc:
    """Fails the n-th tensor allocation (0-based), once."""

    def __init__(self, fail_at):
        self.fail_at, self.calls, self.failed = fail_at, 0, False

    def __call__(self, shape, dtype):
        i = self.calls
        self.calls += 1
        if i == self.fail_at:
            self.failed = True
            raise RuntimeError("injected allocation failure")
        return torch.empty(shape, dtype=dtype)


@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5_moe"])
def test_allocation_failure_at_every_point(family):
    eng = engine(family, 0)
    base = plain_settings(14)
    plain = run(eng, REPEAT_PROMPT, base)
    per_slot = 2 * eng.model.args.state_shapes(1).linear_layers     # conv + recurrent per DeltaNet layer
    s = arm_settings(base, lookup_drafts=5, force="accept", reference=tuple(plain.ids))
    for fail_at in range(5 * per_slot):
        dec = eng.new_decoder(s, REPEAT_PROMPT)
        alloc = FailingAlloc(fail_at)
        dec.state.slot_alloc = alloc
        arm = eng.generate(REPEAT_PROMPT, s, decoder=dec, keep_logits=True)
        assert alloc.failed
        assert_same(plain, arm, f"alloc failure at {fail_at}")
        assert arm.stats["slot_alloc_failures"] == 1
        # the failed verify became a plain step, a later verify retried and got every slot
        assert arm.stats["plain_steps"] >= 1 and arm.stats["verifies"] >= 1
        assert len(dec.state.slots) == 5


def test_failed_allocation_keeps_finished_slots_and_state():
    model = engine("qwen3_next", 0).model
    st = model.new_state(32)
    model.forward([1, 2, 3], st)
    before = st.snapshot()
    per_slot = 2 * model.args.state_shapes(1).linear_layers
    st.slot_alloc = FailingAlloc(2 * per_slot + 1)     # the third slot fails midway
    assert not st.ensure_slots(4)
    assert len(st.slots) == 2
    after = st.snapshot()
    for key in ("k", "v", "conv", "rec"):
        for x, y in zip(before[key], after[key]):
            assert torch.equal(x, y)
    assert st.ensure_slots(4) and len(st.slots) == 4   # the retry works
