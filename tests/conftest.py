"""Each test leaves torch's thread count as it found it: `verispec run` and `serve`, called in this
process, set it for the whole process (--threads, or one thread for a small model:
verispec/cpu_threads.py), and the tests after them compare against engines at torch's count."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _keep_torch_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)
