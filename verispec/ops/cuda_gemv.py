"""Decode/verify matrix products on the GPU: one Triton kernel for 1..16 rows, each weight
tile read once for all rows.

cuBLAS picks its algorithm from the launch shape, so the exact path used to pad every
product to 16 rows (a copy in, a slice out) and still ran cuBLAS's split-K kernels at a
fraction of the bandwidth on the small shapes. Here a program owns a block of output
columns, walks K in a fixed order and multiplies its weight tile with all 16 row slots at
once (`tl.dot`, fp32 accumulation); rows past R are masked to zero on load. The compiled
kernel and its instruction sequence do not depend on R, and a row's products involve that
row's inputs alone, so row i's bits cannot depend on how many rows came with it.

Block sizes are fixed per weight shape (CONFIG; never autotuned: a tuner choosing by row
count would change the reduction order with it), chosen on the H200 by
bench/cuda_gemv_sweep.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import cuda_launch

try:
    import triton
    import triton.language as tl
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover
    triton = None

ROWS = 16


@dataclass(frozen=True)
class Partials:
    """A split-K product's fp32 partial sums [SPLIT, 16, N] for its first `rows` rows, left for
    the consumer (cuda_norms.add_row_norm) to sum in chunk order and round, as _split_sum would."""
    parts: torch.Tensor
    rows: int

if triton is not None:
    @triton.jit
    def _gemv_rows(x_ptr, w_ptr, out_ptr, R, N, x_stride, K: tl.constexpr, ROWS_P: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr, PDL: tl.constexpr):
        """Program (nb, s): output columns block nb over the s-th of SPLIT chunks of K. SPLIT 1:
        out is y [R, N]; else out is the fp32 partials [SPLIT, ROWS_P, N] for _split_sum."""
        if PDL:   # verispec/ops/cuda_launch.py: nothing is touched before the previous kernel is done
            gdc_wait()
            gdc_launch_dependents()
        nb = tl.program_id(0)
        sp = tl.program_id(1)
        offs_n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_r = tl.arange(0, ROWS_P)
        n_ok = offs_n < N
        r_ok = offs_r < R
        w_rows = w_ptr + offs_n[:, None].to(tl.int64) * K
        acc = tl.zeros([ROWS_P, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, K // SPLIT, BLOCK_K):
            offs_k = sp * (K // SPLIT) + k0 + tl.arange(0, BLOCK_K)
            x = tl.load(x_ptr + offs_r[:, None] * x_stride + offs_k[None, :], mask=r_ok[:, None], other=0.0)
            w = tl.load(w_rows + offs_k[None, :], mask=n_ok[:, None], other=0.0)
            acc = tl.dot(x, tl.trans(w), acc)
        tl.store(out_ptr + (sp * ROWS_P + offs_r[:, None]) * N + offs_n[None, :], acc.to(out_ptr.dtype.element_ty),
                 mask=r_ok[:, None] & n_ok[None, :])

    @triton.jit
    def _split_sum(part_ptr, y_ptr, N, ROWS_P: tl.constexpr, SPLIT: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
        """y[r] = sum of the SPLIT partials of row r, in chunk order (fixed), rounded once."""
        if PDL:   # verispec/ops/cuda_launch.py: nothing is touched before the previous kernel is done
            gdc_wait()
            gdc_launch_dependents()
        r = tl.program_id(0)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = offs < N
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for sp in tl.static_range(SPLIT):
            acc += tl.load(part_ptr + (sp * ROWS_P + r) * N + offs, mask=ok, other=0.0)
        tl.store(y_ptr + r * N + offs, acc.to(y_ptr.dtype.element_ty), mask=ok)


# (K, N) -> (BLOCK_N, BLOCK_K, num_warps, num_stages[, SPLIT]); DEFAULT for shapes not listed.
# SPLIT > 1: K is cut into SPLIT chunks run by separate programs (more programs for the
# shapes with few output columns), their fp32 partials summed in chunk order by a second launch.
DEFAULT = (32, 128, 4, 4)
CONFIG: dict[tuple[int, int], tuple] = {
    (2048, 12352): (32, 128, 4, 4), (2048, 9216): (32, 128, 4, 4), (4096, 2048): (32, 128, 4, 4, 4),
    (2048, 1288): (64, 128, 4, 4, 4), (512, 2048): (32, 128, 4, 4), (2048, 248320): (128, 128, 4, 4),
    (2048, 264): (16, 128, 4, 4, 8)}


def splits(k: int, n: int) -> bool:
    """Whether the product (K, N) runs split along K (so it has partials to hand over)."""
    cfg = CONFIG.get((k, n), DEFAULT)
    return len(cfg) > 4 and cfg[4] > 1 and k % (cfg[4] * min(cfg[1], k)) == 0


def usable(x: torch.Tensor, w: torch.Tensor) -> bool:
    k = w.shape[1]
    return (triton is not None and x.is_cuda and x.dtype == w.dtype == torch.bfloat16 and x.dim() == 2
            and 1 <= x.shape[0] <= ROWS and x.stride(1) == 1 and w.is_contiguous() and k % 64 == 0)


def linear_rows(x: torch.Tensor, w: torch.Tensor, config: tuple | None = None, partials: bool = False) -> torch.Tensor:
    """x [R, K] (R <= 16, unit stride along K) @ w[N, K]^T -> [R, N] in x's dtype. With partials
    (a split-K shape), the unsummed fp32 partials [SPLIT, 16, N] instead, for a consumer that
    sums them in chunk order itself (cuda_moe.route_shared)."""
    rows, k = x.shape
    n = w.shape[0]
    cfg = config or CONFIG.get((k, n), DEFAULT)
    bn, bk, nw, ns = cfg[:4]
    split = cfg[4] if len(cfg) > 4 else 1
    bk = min(bk, k)
    while k % bk:            # the K loop has no mask: blocks must tile K (k % 64 == 0, see usable)
        bk //= 2
    if k % (split * bk):
        split = 1
    if partials and split == 1:
        raise ValueError(f"partials need a split-K configuration; ({k}, {n}) has none")
    y = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    out = y if split == 1 else torch.empty(split, ROWS, n, dtype=torch.float32, device=x.device)
    _gemv_rows[(triton.cdiv(n, bn), split)](x, w, out, rows, n, x.stride(0), K=k, ROWS_P=ROWS, BLOCK_N=bn,
                                            BLOCK_K=bk, SPLIT=split, num_warps=nw, num_stages=ns, **cuda_launch.flags(x.device))
    if partials:
        return out
    if split > 1:
        _split_sum[(rows, triton.cdiv(n, 1024))](out, y, n, ROWS_P=ROWS, SPLIT=split, BLOCK=1024, num_warps=4, **cuda_launch.flags(out.device))
    return y
