"""The MoE after its router as one persistent CUDA launch (cuda_moe_tail.cu): gate/up + SwiGLU,
down, and the combine with the residual add and the next norm.

cuda_moe.experts_add_norm runs the same arithmetic in three Triton launches; each ramps up to
the copy rate and drains at its end, and the down weights can be fetched only once gate/up is
done. This kernel keeps one CTA per SM streaming its share of all of the MoE's weights through
a ring of shared-memory slots filled by bulk async copies, with a grid barrier between the
phases (cuda_moe_tail.cu says how rows stay invariant). It is CUDA C++, compiled at run time
by NVRTC and launched through the driver with programmatic dependent launch, both from
`cuda-bindings` (`pip install cuda-bindings`, the `cuda` extra); without it, or for a shape it
does not take (`fits`), the Triton kernels run. Switched by cuda_fusions.MOE_TAIL, off by
default: in the graphed 40-layer forward it is still 1.02x (one row) to 1.05-1.09x (three, four
rows) slower than the Triton launches (device call 79, docs/cuda-history.md).
"""

from __future__ import annotations

import ctypes

import torch

from . import cuda_launch, cuda_nvrtc

# the ring (bench/cuda_bench.py --sections moe_tail compares choices): bytes a slot holds (one
# unit of weights), warps a CTA, slots per warp
SLOT, WARPS, SPW = 8192, 8, 3
PHASES = 3              # 1, 2: stop after gate/up or down (timing probes; the outputs are then not the MoE's)
MAX_ROWS = 16
EXTRA = 2048            # shared memory after the ring: its barriers, the warps' partial sums, the pairs' ids

_kernels: dict = {}     # (device index, HD, ID, TOPK, NE, SLOT, WARPS, SPW, PHASES) -> CUfunction
_counters: dict = {}    # device index -> the grid barrier's counters (int32 [2], put back by each launch)


def _shape_ok(hd: int, inter: int, top_k: int) -> bool:
    """The compile-time conditions of cuda_moe_tail.cu (its static_asserts) for hidden hd, width
    inter and top_k routed slots."""
    after_ring = WARPS * SPW * 8 + 4 * WARPS + 4 * MAX_ROWS * (top_k + 1)   # barriers, partial sums, pairs' ids
    if SLOT % (4 * hd) or SLOT % (2 * inter) or WARPS * SPW * SLOT + EXTRA > 227 * 1024 or after_ring > EXTRA:
        return False
    gu_rows, dn_rows = SLOT // (4 * hd), SLOT // (2 * inter)
    return (gu_rows >= 1 and inter % gu_rows == 0 and hd % 256 == 0 and 1 <= dn_rows <= 32 and hd % dn_rows == 0
            and inter % 256 == 0)


def available(device: torch.device) -> bool:
    return cuda_nvrtc.available(device)


def fits(x, top_w, top_i, gu_all, down_all, shared_gu, shared_down, resid, norm_w) -> bool:
    """Whether this kernel takes the MoE: bf16 weights and activations, a shape it compiles for,
    contiguous tensors on 16-byte boundaries (bulk copies need them), at most 16 rows and no more
    rows than SMs (a CTA combines a row)."""
    if not available(x.device):
        return False
    e, two_i, hd = gu_all.shape
    tensors = (x, gu_all, down_all, shared_gu, shared_down, resid, norm_w)
    return (_shape_ok(hd, two_i // 2, top_i.shape[1] - 1) and all(t.dtype == torch.bfloat16 and t.is_contiguous() for t in tensors)
            and all(t.data_ptr() % 16 == 0 for t in tensors) and top_w.dtype == torch.float32
            and top_i.dtype == torch.int32 and top_w.is_contiguous() and top_i.is_contiguous()
            and shared_gu.shape == gu_all.shape[1:] and shared_down.shape == down_all.shape[1:]
            and down_all.shape == (e, hd, two_i // 2) and top_i.shape[0] <= min(MAX_ROWS, cuda_nvrtc.sm_count(x.device)))


def defines(hd: int, inter: int, top_k: int, n_experts: int) -> dict:
    """The kernel's -D defines under the module's settings (no GPU needed: tools/nvrtc_check.py)."""
    return {"HD": hd, "ID": inter, "TOPK": top_k, "NE": n_experts, "SLOT": SLOT, "WARPS": WARPS, "SPW": SPW,
            "EXTRA": EXTRA, "PHASES": PHASES}


def _kernel(device: torch.device, hd: int, inter: int, top_k: int, n_experts: int):
    d = defines(hd, inter, top_k, n_experts)
    key = (cuda_nvrtc.index(device), tuple(d.items()))
    smem = WARPS * SPW * SLOT + EXTRA
    if key not in _kernels:
        if key[0] not in _counters:          # also makes the device's context current here
            _counters[key[0]] = torch.zeros(2, dtype=torch.int32, device=device)
        with torch.cuda.device(device):
            _kernels[key] = cuda_nvrtc.compile_kernel(device, "cuda_moe_tail.cu", "moe_tail", d, smem)
    return _kernels[key], smem, 32 * WARPS


def experts_add_norm(x, top_w, top_i, gu_all, down_all, shared_gu, shared_down, resid, norm_w,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """As cuda_moe.experts_add_norm (its arguments, with fits() true): -> (resid + moe(x), the
    ZC-norm of it with norm_w), in one launch."""
    rows, slots = top_i.shape
    n_experts, two_i, hd = gu_all.shape
    fn, smem, threads = _kernel(x.device, hd, two_i // 2, slots - 1, n_experts)
    act = torch.empty(rows * slots, two_i // 2, dtype=x.dtype, device=x.device)
    y = torch.empty(rows * slots, hd, dtype=torch.float32, device=x.device)
    s, out = torch.empty(rows, hd, dtype=x.dtype, device=x.device), torch.empty(rows, hd, dtype=x.dtype, device=x.device)
    ctr = _counters[cuda_nvrtc.index(x.device)]
    ptrs = [ctypes.c_void_p(t.data_ptr()) for t in (x, top_w, top_i, gu_all, shared_gu, down_all, shared_down,
                                                     resid, norm_w, act, y, s, out, ctr)]
    pdl = cuda_launch.flags(x.device)["PDL"]
    args = ptrs + [ctypes.c_int(rows), ctypes.c_float(eps), ctypes.c_int(int(pdl))]
    cuda_nvrtc.launch(fn, smem, threads, cuda_nvrtc.sm_count(x.device), torch.cuda.current_stream(x.device).cuda_stream,
                      pdl, args, "moe_tail")
    return s, out
