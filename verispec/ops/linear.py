"""Row-invariant fp32 ``x @ weight.T`` for the decode/verify path.

``linear(x, weight)``: row i of the result is bit-equal to ``linear(x[i:i+1], weight)``
for every M, whatever the other rows hold and whatever ``torch.get_num_threads()`` is.
Speculative decoding needs this: a verify of M draft tokens must produce exactly the
logits that M one-token decodes would. MKL's SGEMM (``F.linear``) does not: on this CPU
M=1, M in {2,3} and M>=4 sum in different orders (ENV-NOTES).

The kernel (``rowgemv.c``) fixes one fp32 operation sequence per output element and
reads each weight row once for all M rows, so a verify of a few rows costs little more
than one decode. Without a C compiler it falls back to a batch of GEMVs in torch
(``torch.bmm`` over an expanded weight), which is row-invariant here but slow for M > 1.

``linear_fast`` is plain ``F.linear`` for prefill: fast, NOT row-invariant.

Outputs carry no autograd history (inference only).
"""

from __future__ import annotations

import ctypes
import functools
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

from verispec.ops import _build

_SOURCE = Path(__file__).with_name("rowgemv.c")


@functools.lru_cache(maxsize=1)
def _kernel() -> tuple[ctypes._CFuncPtr | None, str]:
    """(C entry point or None, backend name). Compiles on first use."""
    built = _build.build(_SOURCE)
    if built is None:
        warnings.warn(
            "verispec.ops.linear: no C compiler found; using the slow torch-bmm row-invariant path",
            RuntimeWarning,
            stacklevel=3,
        )
        return None, "torch-bmm"
    fn = built.lib.rowgemv
    i64 = ctypes.c_int64
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, i64, i64, i64, ctypes.c_int]
    fn.restype = None
    return fn, f"c-{built.variant}"


def backend() -> str:
    """Which implementation ``linear`` uses: "c-avx2", "c-portable" or "torch-bmm"."""
    return _kernel()[1]


def _check(x: torch.Tensor, weight: torch.Tensor) -> None:
    if x.dtype != torch.float32 or weight.dtype != torch.float32:
        raise TypeError(f"linear: float32 only, got x {x.dtype}, weight {weight.dtype}")
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"linear: want x [M, K], weight [N, K]; got {tuple(x.shape)}, {tuple(weight.shape)}")
    if x.device.type != "cpu" or weight.device.type != "cpu":
        raise ValueError("linear: CPU tensors only")
    if not weight.is_contiguous():
        # A silent .contiguous() here would copy the whole weight on every call.
        raise ValueError("linear: weight must be contiguous [N, K] (the nn.Linear layout)")


def _linear_bmm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Row-invariant torch path: M independent GEMVs. [M, K] x [N, K] -> [M, N]."""
    m, k = x.shape
    n = weight.shape[0]
    return torch.bmm(x[:, None, :], weight.T.expand(m, k, n)).squeeze(1)  # [M, 1, N] -> [M, N]


def linear(x: torch.Tensor, weight: torch.Tensor, *, _force_torch: bool = False) -> torch.Tensor:
    """Row-invariant ``x @ weight.T``. x: [M, K] fp32, weight: [N, K] fp32 -> [M, N] fp32."""
    _check(x, weight)
    fn, _ = _kernel()
    with torch.no_grad():
        x = x.detach().contiguous()
        weight = weight.detach()
        if fn is None or _force_torch:
            return _linear_bmm(x, weight)
        m, k = x.shape
        n = weight.shape[0]
        y = torch.empty(m, n, dtype=torch.float32)
        fn(x.data_ptr(), weight.data_ptr(), y.data_ptr(), m, n, k, torch.get_num_threads())
        return y


def linear_fast(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``F.linear`` for prefill: fast, but NOT row-invariant (the order depends on M)."""
    return F.linear(x, weight)
