"""Run settings: frozen dataclasses; the only place (with cli.py) that reads flags or env."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from .errors import UsageError
from .sampling import SamplingParams

BUNDLED_MODEL = Path(__file__).parent / "data" / "default_model"


@dataclass(frozen=True)
class DraftSettings:
    lookup: bool = True
    lookup_drafts: int = 5
    mtp: str = "auto"            # auto: use the head when the checkpoint has one; on; off
    mtp_drafts: int = 2          # 0 = auto (the gate picks 0..3); 2: docs/benchmarks.md Table A
    mtp_pstep: bool | None = None
    mtp_wiring: str = "post"     # the backbone hidden state the head reads: after ("post") or before its final norm
    mtp_vocab: int = 16000       # tokens the head scores per draft; 0 = the whole vocabulary
    gate: bool = True
    gate_observe: bool = True    # feed the gate free observations of drafts no verify carried (docs/gate.md)
    force: str | None = None     # a forced test mode (drafts/forced.py)
    reference: tuple[int, ...] | None = None   # the reference run's generated ids

    def __post_init__(self):
        if not 1 <= self.lookup_drafts <= 5:
            raise UsageError(f"--lookup-drafts must be 1..5, got {self.lookup_drafts}")
        if self.mtp not in ("auto", "on", "off"):
            raise UsageError(f"--mtp must be on or off, got {self.mtp!r}")
        if not 0 <= self.mtp_drafts <= 3:
            raise UsageError(f"--mtp-drafts must be 1, 2, 3 or auto (0), got {self.mtp_drafts}")
        if self.mtp_wiring not in ("post", "pre"):
            raise UsageError(f"MTP wiring must be post or pre, got {self.mtp_wiring!r}")
        if self.mtp_vocab < 0:
            raise UsageError(f"--mtp-vocab must be >= 0, got {self.mtp_vocab}")
        if self.force is not None and self.reference is None:
            raise UsageError("--force needs --reference REF.json (the --json output of a plain run)")


@dataclass(frozen=True)
class RunSettings:
    max_tokens: int = 128
    sampling: SamplingParams = field(default_factory=SamplingParams)
    drafts: DraftSettings = field(default_factory=DraftSettings)
    # None (auto): the batched fast kernels on the CPU; the exact path in 16-row blocks on CUDA, where it is
    # 2-3x faster than the batched path at the 35B-A3B shape (bench/prefill_rows.py, docs/cuda.md)
    prefill_batch: bool | None = None
    context: int | None = None   # KV cache length; default: prompt + max_tokens (+ verify rows)

    def __post_init__(self):
        if self.max_tokens < 1:
            raise UsageError(f"--max-tokens must be >= 1, got {self.max_tokens}")
        if self.context is not None and self.context < 1:
            raise UsageError(f"--context must be >= 1, got {self.context}")


def default_model_dir() -> Path:
    env = os.environ.get("VERISPEC_MODEL")
    return Path(env) if env else BUNDLED_MODEL
