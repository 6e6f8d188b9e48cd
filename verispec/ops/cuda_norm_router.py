"""The residual add, the norm before the MoE and the router product in one launch.

After a mixer the exact path ran two short kernels back to back: the residual add with the
norm (one program per row, cuda_norms.add_row_norm) and the router product (1 MB of weights,
split along K so its partials keep enough programs busy, cuda_gemv). Both are latency-bound.
Here a program (column block nb, row r) does row r's add and norm itself, with
add_row_norm's arithmetic (cuda_norms.add_norm_row: s bit for bit, the norm's sum of squares
in this kernel's own layout), and then its block of the router's logits from that row: every
program of a row repeats the row's norm (a few KB from L2) instead of waiting for another
launch. Its weight block is read before the kernel's wait (weights are never written:
verispec/ops/cuda_launch.py). A program's work is one row's,
summed in one fixed order, so a row's bits cannot depend on how many rows the launch has.

  s = bf16(x + h);  y = ZC-norm(s);  logits[r, n] = bf16(sum_k W[n, k] * y[k])   (fp32 sums)
"""

from __future__ import annotations

import torch

from . import cuda_launch, cuda_norms

try:
    import triton
    import triton.language as tl
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover
    triton = None

BLOCK_N = 8      # router columns per program: 33 programs a row for the 264 of the 35B-A3B shape
WARPS = 16
# (BLOCK_N, WARPS) candidates that bench/cuda_bench.py --sections norm_router measures against the
# configured shape (tools/triton_compile_check.py compiles each): fewer warps shorten the two
# cross-warp reductions after the wait (the norm's sum of squares, the columns' dot products)
CANDIDATES = ((8, 8), (8, 4), (4, 8), (4, 4), (16, 8), (16, 16))

if triton is not None:
    @triton.jit
    def _add_norm_router(x_ptr, h_ptr, split_stride, nw_ptr, w_ptr, s_ptr, y_ptr, lg_ptr, eps, N_OUT,
                         H: tl.constexpr, BLOCK: tl.constexpr, SPLIT: tl.constexpr, BLOCK_N: tl.constexpr,
                         PDL: tl.constexpr):
        nb = tl.program_id(0)
        row = tl.program_id(1).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        m = offs < H
        offs_n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = offs_n < N_OUT
        w = tl.load(w_ptr + offs_n[:, None].to(tl.int64) * H + offs[None, :], mask=n_ok[:, None] & m[None, :],
                    other=0.0)                                   # [BLOCK_N, BLOCK] before the wait: a weight
        if PDL:   # verispec/ops/cuda_launch.py: nothing the previous kernel writes is touched before it is done
            gdc_wait()
            gdc_launch_dependents()
        s, y = cuda_norms.add_norm_row(x_ptr, h_ptr, nw_ptr, split_stride, row, offs, m, eps, H, SPLIT,
                                       s_ptr.dtype.element_ty)
        if nb == 0:   # every program of the row has the same s and y; one stores them
            tl.store(s_ptr + row * H + offs, s, mask=m)
            tl.store(y_ptr + row * H + offs, y, mask=m)
        lg = tl.sum(w.to(tl.float32) * y.to(tl.float32)[None, :], axis=1)     # [BLOCK_N]
        tl.store(lg_ptr + row * N_OUT + offs_n, lg.to(lg_ptr.dtype.element_ty), mask=n_ok)


def usable(x: torch.Tensor, w: torch.Tensor) -> bool:
    return (triton is not None and x.is_cuda and x.dim() == 2 and x.dtype == w.dtype and x.is_contiguous()
            and w.is_contiguous() and w.shape[1] == x.shape[1])


def add_norm_router(x: torch.Tensor, h, norm_w: torch.Tensor, eps: float,
                    router: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [R, H] the residual stream; h [R, H] or a cuda_gemv.Partials (the mixer's output
    product's split-K partials); router [N, H] -> (s = x + h, y = ZC-norm(s) with norm_w, as
    cuda_norms.add_row_norm returns them, and the router's logits y @ router^T [R, N] in x's dtype).
    x must not be written by the launch just before (it is read after the wait, but s may be
    stored by one program while another still reads x: never in place)."""
    rows, hd = x.shape
    n = router.shape[0]
    hc, split, stride = cuda_norms.split_args(h, hd)
    s, y = torch.empty_like(x), torch.empty_like(x)
    lg = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    _add_norm_router[(triton.cdiv(n, BLOCK_N), rows)](x, hc, stride, norm_w.contiguous(), router, s, y, lg, eps, n,
                                                      H=hd, BLOCK=triton.next_power_of_2(hd), SPLIT=split,
                                                      BLOCK_N=BLOCK_N, num_warps=WARPS, **cuda_launch.flags(x.device))
    return s, y, lg
