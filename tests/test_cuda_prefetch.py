"""L2 prefetch (verispec/ops/cuda_prefetch.py): the regions it asks for, and on the GPU the
model with every prefetch site on against off, bit for bit (a prefetch moves bytes into L2,
never a value; and its launch must keep the chain's order, or a kernel would read stale data)."""

import pytest
import torch

from model_fixtures import REPEAT_PROMPT

from verispec.engine import Engine
from verispec.execution import Execution
from verispec.ops import cuda_prefetch
from verispec.random_model import preset_config, random_checkpoint

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")


def test_span_widens_to_16_bytes_and_clips():
    t = torch.zeros(100, dtype=torch.bfloat16)
    lo, n = cuda_prefetch.span(t[3:])          # starts 6 bytes in: widened down to the 16-byte line
    assert lo % 16 == 0 and n % 16 == 0
    assert lo <= t[3:].data_ptr() and lo + n >= t.data_ptr() + 200
    assert cuda_prefetch.span(t, 64) == (t.data_ptr() & ~15, (t.data_ptr() + 64 - (t.data_ptr() & ~15) + 15) & ~15)
    assert cuda_prefetch.span(t, 10 ** 6)[1] == cuda_prefetch.span(t)[1]      # never past the tensor
    with pytest.raises(ValueError, match="contiguous"):
        cuda_prefetch.span(torch.zeros(8, 8)[:, ::2])


def test_prefetch_is_nothing_where_it_cannot_run():
    cuda_prefetch.prefetch(torch.device("cpu"), torch.zeros(4))     # no GPU, no PDL: returns, launches nothing


def test_prefetch_takes_at_most_three_regions():
    with pytest.raises(ValueError, match="three"):
        cuda_prefetch.prefetch(torch.device("cpu"), *([(0, 16)] * 4))


@pytest.fixture
def sites_restored():
    kept = dict(cuda_prefetch.SITES)
    yield
    cuda_prefetch.SITES.update(kept)


@cuda
@pytest.mark.parametrize("graphs", [False, True])
def test_model_with_prefetch_equals_without(sites_restored, graphs):
    """The real-shaped model: decode rows and a verify's rows (with copy slots) give the same
    logits with every prefetch site on as with none; eager, and graphed (an engine per
    setting, since the sites are fixed at capture)."""
    ck = random_checkpoint(preset_config("qwen3.6-35b-a3b-shape", layers=4), seed=19, device="cuda")
    ids = [3, 1, 4, 1, 5, 9]
    out = {}
    for on in (True, False):
        cuda_prefetch.SITES.update(out=on, router=on, down=on, next=16 if on else 0)
        eng = Engine.from_checkpoint(ck, Execution.for_device("cuda", graphs=graphs))
        st1, stn = eng.model.new_state(64), eng.model.new_state(64)
        eng.model.forward(REPEAT_PROMPT, st1)
        eng.model.forward(REPEAT_PROMPT, stn)
        stn.ensure_slots(len(ids))
        ones = torch.cat([eng.model.forward([t], st1).logits for t in ids])
        many = eng.model.forward(ids, stn, save_slots=True).logits
        assert torch.equal(ones, many), on
        out[on] = (ones, many)
    assert torch.equal(out[True][0], out[False][0]) and torch.equal(out[True][1], out[False][1])
