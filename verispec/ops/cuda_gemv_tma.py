"""Decode/verify matrix products whose weights arrive by TMA, issued before the kernel's wait.

cuda_gemv's product streams its weights with the loads Triton pipelines, and only after its
`griddepcontrol.wait`. The products that follow latency-bound kernels (the DeltaNet's output
product after the recurrence and the gated norm, the attention's after its three kernels) can
do better: the weights never change, so a program may fetch them before the wait, while the
kernels before it still run (cuda_launch.py: EARLY lets it launch then). Plain loads into
registers reached ~2.2 TB/s there (bench/cuda_pdl_probe.py); the Hopper tensor memory
accelerator (TMA) copies whole tiles into shared memory at the copy rate. This kernel is
written in Gluon (Triton's explicit dialect), which exposes TMA, mbarriers and the layouts.

Program (nb, s) owns output columns nb*BN.. over the s-th of SPLIT chunks of K, in NK tiles
of BK, all held in shared memory at once; the first PRE are requested before the wait, the
rest right after it. Then the rows' x tiles come by TMA too (rows past R zero-filled by the
descriptor's shape), and each tile's product is one tensor-core dot of the 16 row slots with
it (fp32 accumulation, tiles in order; the loop unrolled so nothing waits on a ring), so a
row's bits depend on its own inputs alone, whatever R. Out: y [R, N] in x's dtype, or fp32 partials [SPLIT, 16, N] for a
consumer that sums them in chunk order (cuda_gemv.Partials).
"""

from __future__ import annotations

import torch

from . import cuda_launch

try:
    import triton
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import mma_v2
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
except ImportError:  # pragma: no cover - the CPU machine has no triton; older tritons have no gluon
    gluon = None

ROWS = 16
# (K, N) -> (BN, BK, SPLIT, PRE, num_warps): a program holds its whole [BN, K / SPLIT] weight slab in
# shared memory, in K / SPLIT / BK tiles (BK * 2 bytes = the 128-byte swizzle span), the first PRE
# requested before the wait
CONFIG: dict[tuple[int, int], tuple] = {
    (4096, 2048): (128, 64, 16, 4, 4)}      # the mixers' output products: every tile before the wait

if gluon is not None:
    @gluon.jit
    def _gdc_wait():
        gl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r", [], dtype=gl.int32, is_pure=False,
                                  pack=1)

    @gluon.jit
    def _gdc_launch_dependents():
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [], dtype=gl.int32,
                                  is_pure=False, pack=1)

    @gluon.jit(do_not_specialize=["R"])
    def _gemv_tma(w_desc, x_desc, out_ptr, R, N, K: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
                  SPLIT: gl.constexpr, PRE: gl.constexpr, PARTIALS: gl.constexpr, PDL: gl.constexpr):
        ROWS_P: gl.constexpr = 16
        NK: gl.constexpr = K // SPLIT // BK
        nb = gl.program_id(0)
        sp = gl.program_id(1)
        n0 = nb * BN
        k0 = sp * (K // SPLIT)
        w_smem = gl.allocate_shared_memory(w_desc.dtype, [NK, BN, BK], w_desc.layout)
        x_smem = gl.allocate_shared_memory(x_desc.dtype, [NK, ROWS_P, BK], x_desc.layout)
        wbar = gl.allocate_shared_memory(gl.int64, [NK, 1], mbarrier.MBarrierLayout())
        xbar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(NK):
            mbarrier.init(wbar.index(i), count=1)
        mbarrier.init(xbar.index(0), count=1)
        fence_async_shared()
        for i in gl.static_range(PRE):      # weights are never written: requested before the wait
            mbarrier.expect(wbar.index(i), w_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(w_desc, [n0, k0 + i * BK], wbar.index(i), w_smem.index(i))
        if PDL:   # cuda_launch.py: nothing the previous kernels write is read before they are done
            _gdc_wait()
            _gdc_launch_dependents()
        for i in gl.static_range(PRE, NK):
            mbarrier.expect(wbar.index(i), w_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(w_desc, [n0, k0 + i * BK], wbar.index(i), w_smem.index(i))
        mbarrier.expect(xbar.index(0), NK * x_desc.block_type.nbytes)
        for i in gl.static_range(NK):
            tma.async_copy_global_to_shared(x_desc, [0, k0 + i * BK], xbar.index(0), x_smem.index(i))

        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, gl.num_warps()],
                                                      instr_shape=[16, 8])
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=8)
        b_layout: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=8)
        acc = gl.zeros([ROWS_P, BN], gl.float32, mma)
        mbarrier.wait(xbar.index(0), 0)
        for i in gl.static_range(NK):       # K blocks in order: the same sums for every row count
            mbarrier.wait(wbar.index(i), 0)
            a = x_smem.index(i).load(a_layout)                           # [16, BK]
            b = w_smem.index(i).permute((1, 0)).load(b_layout)           # [BK, BN]
            acc = mma_v2(a, b, acc)
        for i in gl.static_range(NK):
            mbarrier.invalidate(wbar.index(i))
        mbarrier.invalidate(xbar.index(0))

        offs_r = gl.arange(0, ROWS_P, layout=gl.SliceLayout(1, mma))
        offs_n = n0 + gl.arange(0, BN, layout=gl.SliceLayout(0, mma))
        ok = (offs_r < R)[:, None] & (offs_n < N)[None, :]
        if PARTIALS:
            gl.store(out_ptr + (sp * ROWS_P + offs_r)[:, None] * N + offs_n[None, :], acc, mask=ok)
        else:
            gl.store(out_ptr + offs_r[:, None] * N + offs_n[None, :], acc.to(out_ptr.dtype.element_ty), mask=ok)


def available(device: torch.device) -> bool:
    return gluon is not None and device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def fits(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether the product x @ w^T runs here: a configured shape, bf16, rows <= 16, TMA-aligned."""
    k, n = w.shape[1], w.shape[0]
    return ((k, n) in CONFIG and available(x.device) and x.dtype == w.dtype == torch.bfloat16 and x.dim() == 2
            and 1 <= x.shape[0] <= ROWS and x.stride(1) == 1 and (x.stride(0) * 2) % 16 == 0
            and x.data_ptr() % 16 == 0 and w.is_contiguous() and w.data_ptr() % 16 == 0)


def splits(k: int, n: int) -> bool:
    cfg = CONFIG.get((k, n))
    return cfg is not None and cfg[2] > 1


_W_DESC: dict = {}


def _w_desc(w: torch.Tensor, bn: int, bk: int):
    """The weight's descriptor, made once per weight tensor (its address and shape never change)."""
    key = (w.data_ptr(), tuple(w.shape), bn, bk)
    d = _W_DESC.get(key)
    if d is None:
        layout = gl.NVMMASharedLayout.get_default_for([bn, bk], gl.bfloat16)
        d = _W_DESC[key] = (TensorDescriptor.from_tensor(w, [bn, bk], layout), w)   # w kept alive with it
    return d[0]


def linear_rows(x: torch.Tensor, w: torch.Tensor, partials: bool = False, config: tuple | None = None) -> torch.Tensor:
    """x [R, K] (R <= 16) @ w [N, K]^T -> [R, N] in x's dtype, or with partials (a split
    configuration) the fp32 partial sums [SPLIT, 16, N] (rows past R unwritten)."""
    rows, k = x.shape
    n = w.shape[0]
    bn, bk, split, pre, warps = config or CONFIG[(k, n)]
    nk = k // split // bk
    if k % (split * bk) or pre > nk or nk > 16:
        raise ValueError(f"TMA product ({k}, {n}): blocks {config or CONFIG[(k, n)]} do not tile K in <= 16 tiles")
    if partials != (split > 1):
        raise ValueError(f"TMA product ({k}, {n}): partials={partials} with SPLIT {split}")
    xl = gl.NVMMASharedLayout.get_default_for([ROWS, bk], gl.bfloat16)
    x_desc = TensorDescriptor(x, [rows, k], [x.stride(0), 1], [ROWS, bk], xl)
    if partials:
        out = torch.empty(split, ROWS, n, dtype=torch.float32, device=x.device)
    else:
        out = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    f = cuda_launch.flags(x.device)
    _gemv_tma[(triton.cdiv(n, bn), split)](_w_desc(w, bn, bk), x_desc, out, rows, n, K=k, BN=bn, BK=bk,
                                           SPLIT=split, PRE=pre, PARTIALS=partials, num_warps=warps, **f)
    return out
