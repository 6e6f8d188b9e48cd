"""The CUDA row policy (every batched op of the decode/verify path on a fixed 16 rows, bf16
weights and activations), run on the CPU: the same code the GPU runs, minus the device,
so CI checks its logic; tests/test_cuda.py runs it on a GPU."""

import pytest
import torch

from exact_matrix import check_matrix
from model_fixtures import REPEAT_PROMPT, fixture_dir

from verispec.engine import Engine
from verispec.execution import PAD_ROWS, Execution
from verispec.models.layers import Padded
from verispec.random_model import preset_config, random_checkpoint

CPU_PADDED = Execution("cpu", torch.bfloat16, PAD_ROWS)


def _rows_of(model, prompt, n):
    """Logits of n plain steps after the prompt, one row per forward, and of one n-row forward."""
    st1, stn = model.new_state(64), model.new_state(64)
    model.forward(prompt, st1)
    model.forward(prompt, stn)
    ids = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8][:n]
    ones = torch.cat([model.forward([t], st1).logits for t in ids])
    many = model.forward(ids, stn).logits
    return ones, many


def test_padded_rows_match_single_rows_bf16():
    eng = Engine.from_checkpoint(random_checkpoint(preset_config("small"), seed=3), CPU_PADDED)
    assert isinstance(eng.model.rows_exact, Padded) and eng.model.embed.dtype == torch.bfloat16
    for n in (2, 5, 8, 12):
        ones, many = _rows_of(eng.model, REPEAT_PROMPT, n)
        assert torch.equal(ones, many), n


def test_padded_forward_refuses_more_rows_than_the_pad():
    eng = Engine.from_checkpoint(random_checkpoint(preset_config("small"), seed=3), CPU_PADDED)
    st = eng.model.new_state(64)
    with pytest.raises(ValueError, match="at most 16 rows"):
        eng.model.forward(list(range(17)), st, exact=True)


def test_padded_matrix_on_a_fixture():
    eng = Engine(fixture_dir("qwen3_next", 0, mtp=True), device=CPU_PADDED)
    assert check_matrix(eng, REPEAT_PROMPT, 16, samplings=("greedy",), lookup_depths=(5,), mtp_depths=(2,),
                        log=lambda *_: None) > 10


@pytest.mark.slow
def test_padded_matrix_on_a_random_model_sampled():
    # bf16 products are slow on this CPU: the whole matrix took 15 minutes here; this subset ~3
    eng = Engine.from_checkpoint(random_checkpoint(preset_config("small"), seed=5), CPU_PADDED)
    assert check_matrix(eng, REPEAT_PROMPT, 12, samplings=("sampled",), lookup_depths=(2,), mtp_depths=(1, 3),
                        log=lambda *_: None) > 20
