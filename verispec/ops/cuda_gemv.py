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

from . import cuda_fusions, cuda_launch, cuda_stream_gemv

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
    # R unspecialised: Triton compiles a separate kernel for an int argument equal to 1 (or a
    # multiple of 16), and a decode row (R = 1) must run the same code as a verify's rows
    @triton.jit(do_not_specialize=["R"])
    def _gemv_rows(x_ptr, w_ptr, out_ptr, R, N, x_stride, ring_ptr, cw_ptr, tab_ptr, C, K: tl.constexpr,
                   ROWS_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr,
                   CONV: tl.constexpr, KC: tl.constexpr, SAVE: tl.constexpr, ROUND: tl.constexpr,
                   PDL: tl.constexpr):
        """Program (nb, s): output columns block nb over the s-th of SPLIT chunks of K. SPLIT 1:
        out is y [R, N]; else out is the fp32 partials [SPLIT, ROWS_P, N] for _split_sum.
        CONV (SPLIT 1): columns below C are the DeltaNet's conv channels; their rows go through
        the causal conv, row after row, in this program (see _conv_epilogue). ROUND: y is
        rounded to x's dtype before it is stored in out's (fp32 logits equal to the bf16
        product's, widened)."""
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
        if ROUND:
            y = acc.to(x_ptr.dtype.element_ty).to(out_ptr.dtype.element_ty)
        else:
            y = acc.to(out_ptr.dtype.element_ty)
        if CONV:
            if nb * BLOCK_N < C:     # C is a multiple of BLOCK_N: a block is all conv or none
                y = _conv_epilogue(y, R, offs_n, ring_ptr, cw_ptr, tab_ptr, ROWS_P, KC, SAVE)
        tl.store(out_ptr + (sp * ROWS_P + offs_r[:, None]) * N + offs_n[None, :], y,
                 mask=r_ok[:, None] & n_ok[None, :])

    @triton.jit
    def _conv_epilogue(y, R, offs_n, ring_ptr, cw_ptr, tab_ptr, ROWS_P: tl.constexpr, KC: tl.constexpr,
                       SAVE: tl.constexpr):
        """The causal conv (kernel KC = 4) of the channels offs_n for rows 0..R-1 in order, as
        _conv_row does it (cuda_deltanet.py), on the product's rounded outputs y [ROWS_P,
        BLOCK_N]: out = silu(sum_j ring[:, j] w[:, j] + x w[:, 3]), then the ring shifts x in.
        The ring [C, 3] is updated in place; with SAVE the ring after row r < R-1 goes to the
        slot at tab[r]. A channel belongs to one program: nothing it writes is read elsewhere."""
        offs_r = tl.arange(0, ROWS_P)
        r0 = tl.load(ring_ptr + offs_n * (KC - 1)).to(tl.float32)
        r1 = tl.load(ring_ptr + offs_n * (KC - 1) + 1).to(tl.float32)
        r2 = tl.load(ring_ptr + offs_n * (KC - 1) + 2).to(tl.float32)
        w0 = tl.load(cw_ptr + offs_n * KC).to(tl.float32)
        w1 = tl.load(cw_ptr + offs_n * KC + 1).to(tl.float32)
        w2 = tl.load(cw_ptr + offs_n * KC + 2).to(tl.float32)
        w3 = tl.load(cw_ptr + offs_n * KC + 3).to(tl.float32)
        yf = y.to(tl.float32)
        out = tl.zeros(y.shape, dtype=tl.float32)
        all_n = offs_n >= 0
        for r in range(0, R):          # the rows present only: one pass for a decode row
            x = tl.sum(tl.where(offs_r[:, None] == r, yf, 0.0), axis=0)
            a = tl.zeros(x.shape, dtype=tl.float32)
            a += r0 * w0
            a += r1 * w1
            a += r2 * w2
            a += x * w3
            c = (a * tl.sigmoid(a)).to(y.dtype).to(tl.float32)
            out = tl.where(offs_r[:, None] == r, c[None, :], out)
            r0, r1, r2 = r1, r2, x
            if SAVE:
                slot = tl.load(tab_ptr + r).to(tl.pointer_type(ring_ptr.dtype.element_ty))
                keep = all_n & (r < R - 1)
                tl.store(slot + offs_n * (KC - 1), r0.to(ring_ptr.dtype.element_ty), mask=keep)
                tl.store(slot + offs_n * (KC - 1) + 1, r1.to(ring_ptr.dtype.element_ty), mask=keep)
                tl.store(slot + offs_n * (KC - 1) + 2, r2.to(ring_ptr.dtype.element_ty), mask=keep)
        tl.store(ring_ptr + offs_n * (KC - 1), r0.to(ring_ptr.dtype.element_ty))
        tl.store(ring_ptr + offs_n * (KC - 1) + 1, r1.to(ring_ptr.dtype.element_ty))
        tl.store(ring_ptr + offs_n * (KC - 1) + 2, r2.to(ring_ptr.dtype.element_ty))
        return out.to(y.dtype)

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
    (2048, 264): (16, 256, 4, 4, 8)}


def streams(w: torch.Tensor) -> bool:
    """Whether linear_rows hands products with w to cuda_stream_gemv (cuda_fusions.STREAM, a
    shape it takes, bf16 on a GPU it runs on): decided by the weight alone, never by the rows."""
    return (cuda_fusions.STREAM and w.dtype == torch.bfloat16 and w.is_cuda
            and cuda_stream_gemv.config(w.shape[1], w.shape[0]) is not None and cuda_stream_gemv.available(w.device))


def splits(k: int, n: int, w: torch.Tensor | None = None) -> bool:
    """Whether the product (K, N) (with weight w, when given) runs split along K (so it has
    partials to hand over)."""
    if w is not None and streams(w):
        return False
    cfg = CONFIG.get((k, n), DEFAULT)
    return len(cfg) > 4 and cfg[4] > 1 and k % (cfg[4] * min(cfg[1], k)) == 0


def usable(x: torch.Tensor, w: torch.Tensor) -> bool:
    k = w.shape[1]
    return (triton is not None and x.is_cuda and x.dtype == w.dtype == torch.bfloat16 and x.dim() == 2
            and 1 <= x.shape[0] <= ROWS and x.stride(1) == 1 and w.is_contiguous() and k % 64 == 0)


@dataclass(frozen=True)
class ConvEpilogue:
    """The DeltaNet's causal conv run on a product's first C output columns (kernel 4): ring
    [C, 3] (updated in place), weight [C, 4], slots: cuda_slots.table(...) for a verify that
    keeps each row's ring, or None."""
    ring: torch.Tensor
    weight: torch.Tensor
    slots: torch.Tensor | None


def conv_fits(w: torch.Tensor, conv_channels: int, kernel: int) -> bool:
    """Whether the product with w [N, K] can carry the conv of its first conv_channels outputs."""
    k, n = w.shape[1], w.shape[0]
    if streams(w):
        return kernel == 4 and cuda_stream_gemv.conv_fits(w, conv_channels)
    cfg = CONFIG.get((k, n), DEFAULT)
    return kernel == 4 and (len(cfg) < 5 or cfg[4] == 1) and conv_channels % cfg[0] == 0


def linear_rows(x: torch.Tensor, w: torch.Tensor, config: tuple | None = None, partials: bool = False,
                conv: ConvEpilogue | None = None, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x [R, K] (R <= 16, unit stride along K) @ w[N, K]^T -> [R, N] in x's dtype. With partials
    (a split-K shape), the unsummed fp32 partials [SPLIT, 16, N] instead, for a consumer that
    sums them in chunk order itself (cuda_moe.route_shared). With conv (conv_fits), the first
    C output columns come out through the causal conv, row after row. out_dtype (an unsplit
    product): y rounded to x's dtype, stored widened (the lm_head's fp32 logits in one launch,
    the bits of the bf16 product followed by a conversion)."""
    if config is None and not partials and out_dtype is None and streams(w):
        if not cuda_stream_gemv.fits(x, w):        # x's row stride or address: the same kernel on a copy
            x = x.clone(memory_format=torch.contiguous_format)
        return cuda_stream_gemv.linear_rows(x, w, conv)
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
    if conv is not None and (split != 1 or conv.ring.shape[0] % bn or conv.weight.shape[1] != 4
                             or not (conv.ring.is_contiguous() and conv.weight.is_contiguous())):
        raise ValueError("the conv epilogue needs an unsplit product, C a multiple of its block and kernel 4")
    if out_dtype is not None and (split != 1 or partials or conv is not None):
        raise ValueError("out_dtype is for an unsplit product without epilogue")
    y = torch.empty(rows, n, dtype=out_dtype or x.dtype, device=x.device)
    out = y if split == 1 else torch.empty(split, ROWS, n, dtype=torch.float32, device=x.device)
    if conv is None:
        cargs, save = (out, out, out, 0), False
    else:
        tab = conv.slots if conv.slots is not None else conv.ring
        cargs, save = (conv.ring, conv.weight, tab, conv.ring.shape[0]), conv.slots is not None
    _gemv_rows[(triton.cdiv(n, bn), split)](x, w, out, rows, n, x.stride(0), *cargs, K=k, ROWS_P=ROWS, BLOCK_N=bn,
                                            BLOCK_K=bk, SPLIT=split, CONV=conv is not None, KC=4, SAVE=save,
                                            ROUND=out_dtype is not None and out_dtype != x.dtype, num_warps=nw,
                                            num_stages=ns, **cuda_launch.flags(x.device))
    if partials:
        return out
    if split > 1:
        _split_sum[(rows, triton.cdiv(n, 1024))](out, y, n, ROWS_P=ROWS, SPLIT=split, BLOCK=1024, num_warps=4,
                                                 **cuda_launch.flags(out.device))
    return y
