"""How many CPU threads a run uses when --threads is not given.

A decode forward of a small model is a few hundred small ops. Each op that torch or the row
kernel splits over threads wakes the OpenMP pool, which sleeps between ops (verispec asks for
OMP_WAIT_POLICY=PASSIVE: spinning threads collapse when another process holds a core,
verispec/__init__.py), and the wake costs more than a small op. On the 2-core development
machine the bundled model (34 MiB of fp32 weights a token) decoded 221.8 tok/s on one thread
against 115.3 on two, and 246.3 against 198.6 with a core busy elsewhere (bench/cpu_threads.py,
docs/benchmarks-decode.md). Decode and verify bits do not depend on the thread count
(tests/test_cli.py); the batched prefill's last bits may (README, --prefill-batch), and a drafted
and a plain run of one model pick the same count. Large checkpoints keep torch's count: their
products are megabytes each, and on a box with more cores than this one the pool should pay (not
measured here).
"""

from __future__ import annotations

import torch

from .models import ModelArgs
from .plan import active_params

SMALL_BYTES = 256 * 1024 * 1024     # fp32 weights one decode row reads, below which one thread is the default


def default_threads(a: ModelArgs) -> int | None:
    """1 for a model whose decode row reads under SMALL_BYTES; None (torch's count) otherwise."""
    return 1 if 4 * active_params(a) < SMALL_BYTES else None


def apply_default(engine) -> None:
    """Without --threads: one thread for a small model on the CPU, for the whole process (as
    --threads sets it); torch's count otherwise, and on CUDA."""
    if not engine.execution.is_cuda and default_threads(engine.args) == 1:
        torch.set_num_threads(1)
