"""Where and how a model runs: device, compute dtype, and the decode/verify row policy.

CPU: fp32 weights and activations, the row-invariant C matrix kernel, transcendental ops one
row at a time. CUDA: bf16 weights and activations (fp32 for the DeltaNet state, norms and
softmax), cuBLAS products, and every batched op of the decode/verify path on a fixed number
of rows (`Padded`), so a kernel's algorithm never depends on how many rows a verify carries.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import UsageError

PAD_ROWS = 16   # == the decode/verify row limit (EXACT_ROWS): every exact forward runs this many rows


@dataclass(frozen=True)
class Execution:
    device: str = "cpu"                 # "cpu" or "cuda[:i]"
    dtype: torch.dtype = torch.float32  # weights and activations
    pad_rows: int = 0                   # 0: the CPU row policy; n: pad the exact path to n rows
    graphs: bool = False                # CUDA graphs for the exact path (verispec/cuda_graphs.py)

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.device)

    @property
    def is_cuda(self) -> bool:
        return self.torch_device.type == "cuda"

    @staticmethod
    def for_device(name: str = "cpu", graphs: bool = True) -> "Execution":
        """`cpu`, `cuda`, `cuda:N` or `auto` (CUDA when torch sees a GPU); graphs: CUDA graphs on CUDA."""
        if name == "auto":
            name = "cuda" if torch.cuda.is_available() else "cpu"
        if name == "cpu":
            return Execution()
        if name.startswith("cuda"):
            if not torch.cuda.is_available():
                raise UsageError(f"--device {name}: torch sees no CUDA GPU here (torch {torch.__version__}); "
                                 "use --device cpu")
            return Execution(name, torch.bfloat16, PAD_ROWS, graphs=graphs)
        raise UsageError(f"unknown device {name!r}: expected cpu, cuda, cuda:N or auto")
