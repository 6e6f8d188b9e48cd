"""The graphed forward's inputs (ids and start position) reach the GPU by one asynchronous copy
from pinned memory (verispec/cuda_graphs.py, PINNED_INPUTS): the logits equal those of the two
blocking copies it replaced and of the eager forward, at every step of a decode and a verify.
Skipped without a CUDA GPU (CI)."""

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")

from cuda_cases import model_rows_by_arm  # noqa: E402

from verispec import cuda_graphs  # noqa: E402


@pytest.fixture
def keep_inputs_setting():
    kept = cuda_graphs.PINNED_INPUTS
    yield
    cuda_graphs.PINNED_INPUTS = kept


def test_pinned_inputs_move_no_value(keep_inputs_setting):
    def pinned(on):
        return lambda: setattr(cuda_graphs, "PINNED_INPUTS", on)
    got = model_rows_by_arm(41, [(True, pinned(True)), (True, pinned(False)), (False, pinned(True))])
    assert torch.equal(got[0], got[1]) and torch.equal(got[0], got[2])
