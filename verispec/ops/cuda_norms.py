"""Row norms on the GPU in one launch: one Triton program per row (or per row and head).

A torch RMSNorm is about ten kernels (cast, square, mean, add, rsqrt, ...) and, padded to
16 rows for row invariance, two more; a decode step of a 40-layer hybrid runs five such
norms per layer. Here each program reads one row, reduces it in a fixed order and writes
it: its bits depend on its own row alone, whatever the launch size, so no padding is needed.

Modes (all arithmetic in fp32, the result in the output's dtype):
  ZC     Qwen3-Next RMSNorm:  x * rsqrt(mean(x^2) + eps) * (1 + w)
  L2     the q/k L2 norm:      x * rsqrt(sum(x^2) + eps)
  GATED  the DeltaNet output:  w * bf16(x * rsqrt(mean(x^2) + eps)) * silu(z)
and `add_row_norm`, the residual add fused with the next ZC norm.
"""

from __future__ import annotations

import torch

from . import cuda_launch

try:
    import triton
    import triton.language as tl
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover
    triton = None

ZC, L2, GATED = 0, 1, 2
# warps per program (fixed; never by row count): bench/cuda_small_sweep.py
WARPS = {"row": 4, "gated": 1, "add": 16}
enabled = True   # tests and benchmarks switch the kernels off to compare with the torch path

if triton is not None:
    @triton.jit
    def _row_norm(x_ptr, w_ptr, z_ptr, y_ptr, eps, N: tl.constexpr, BLOCK: tl.constexpr, MODE: tl.constexpr,
                  PDL: tl.constexpr, EARLY: tl.constexpr = False):
        cuda_launch.enter(PDL, EARLY)   # nothing is touched before the previous kernel is done
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        m = offs < N
        x = tl.load(x_ptr + row * N + offs, mask=m, other=0.0).to(tl.float32)
        ss = tl.sum(x * x, axis=0)
        if MODE == 1:
            y = x * tl.math.rsqrt(ss + eps)
        else:
            y = x * tl.math.rsqrt(ss / N + eps)
            w = tl.load(w_ptr + offs, mask=m, other=0.0).to(tl.float32)
            if MODE == 0:
                y = y * (1.0 + w)
            else:
                z = tl.load(z_ptr + row * N + offs, mask=m, other=0.0).to(tl.float32)
                y = w * y.to(y_ptr.dtype.element_ty).to(tl.float32)
                y = y * (z * tl.sigmoid(z))
        tl.store(y_ptr + row * N + offs, y.to(y_ptr.dtype.element_ty), mask=m)

    @triton.jit
    def add_norm_row(x_ptr, h_ptr, nw_ptr, split_stride, row, offs, m, eps, N: tl.constexpr, SPLIT: tl.constexpr,
                     dtype: tl.constexpr):
        """Row `row`'s residual add and ZC norm over offs (mask m): s = x + h rounded to dtype (h
        a product's output, or SPLIT > 1 its fp32 partials split_stride apart, summed in chunk
        order and rounded first, as cuda_gemv's _split_sum would), y = ZC-norm(s) in dtype.
        -> (s, y). Shared by _add_row_norm and cuda_norm_router: s the same bits in both; y's sum
        of squares ordered by each kernel's own layout."""
        if SPLIT == 1:
            h = tl.load(h_ptr + row * N + offs, mask=m, other=0.0).to(tl.float32)
        else:
            acc = tl.zeros(offs.shape, dtype=tl.float32)
            for sp in tl.static_range(SPLIT):
                acc += tl.load(h_ptr + sp * split_stride + row * N + offs, mask=m, other=0.0)
            h = acc.to(dtype).to(tl.float32)
        s = (tl.load(x_ptr + row * N + offs, mask=m, other=0.0).to(tl.float32) + h).to(dtype)
        x = s.to(tl.float32)
        y = x * tl.math.rsqrt(tl.sum(x * x, axis=0) / N + eps)
        y = y * (1.0 + tl.load(nw_ptr + offs, mask=m, other=0.0).to(tl.float32))
        return s, y.to(dtype)

    @triton.jit
    def _add_row_norm(x_ptr, h_ptr, w_ptr, s_ptr, y_ptr, eps, split_stride, N: tl.constexpr, BLOCK: tl.constexpr,
                      SPLIT: tl.constexpr, PDL: tl.constexpr):
        """The residual add and the next RMSNorm in one pass: s = x + h (rounded to the
        activations' dtype, as torch adds), y = ZC-norm(s). SPLIT > 1: h is a product's fp32
        partials (split_stride apart), summed in chunk order and rounded first, as
        cuda_gemv's _split_sum would."""
        if PDL:   # verispec/ops/cuda_launch.py: nothing is touched before the previous kernel is done
            gdc_wait()
            gdc_launch_dependents()
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        m = offs < N
        s, y = add_norm_row(x_ptr, h_ptr, w_ptr, split_stride, row, offs, m, eps, N, SPLIT, s_ptr.dtype.element_ty)
        tl.store(s_ptr + row * N + offs, s, mask=m)
        tl.store(y_ptr + row * N + offs, y, mask=m)


def usable(x: torch.Tensor) -> bool:
    return enabled and triton is not None and x.is_cuda


def row_norm(x: torch.Tensor, mode: int, eps: float, weight: torch.Tensor | None = None,
             gate: torch.Tensor | None = None) -> torch.Tensor:
    """Norm along the last dimension of x (any leading shape); one program per leading index."""
    n = x.shape[-1]
    xc = x.contiguous()
    y = torch.empty_like(xc)
    w = weight.contiguous() if weight is not None else xc
    z = gate.contiguous() if gate is not None else xc
    _row_norm[(xc.numel() // n,)](xc, w, z, y, eps, N=n, BLOCK=triton.next_power_of_2(n), MODE=mode,
                                  num_warps=WARPS["gated" if mode == GATED else "row"],
                                  **cuda_launch.flags(xc.device, early=mode == GATED))
    return y


def split_args(h, n: int) -> tuple[torch.Tensor, int, int]:
    """add_norm_row's h, SPLIT and split_stride for h [rows, n] or a cuda_gemv.Partials."""
    if not hasattr(h, "parts"):
        return h.contiguous(), 1, 0
    if h.parts.shape[2] != n or not h.parts.is_contiguous():
        raise ValueError(f"partials must be contiguous [SPLIT, rows, {n}]")
    return h.parts, h.parts.shape[0], h.parts.stride(0)


def add_row_norm(x: torch.Tensor, h, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + h, RMSNorm(x + h) with zero-centred weight) for x, h [rows, N]; one program per row.
    h may be a cuda_gemv.Partials (a split-K product's partial sums), summed here."""
    n = x.shape[-1]
    xc = x.contiguous()
    s, y = torch.empty_like(xc), torch.empty_like(xc)
    hc, split, stride = split_args(h, n)
    _add_row_norm[(xc.numel() // n,)](xc, hc, weight.contiguous(), s, y, eps, stride, N=n,
                                      BLOCK=triton.next_power_of_2(n), SPLIT=split, num_warps=WARPS["add"],
                                      **cuda_launch.flags(xc.device))
    return s, y
