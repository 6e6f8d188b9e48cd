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
rows) slower than the Triton launches (device call 79, docs/cuda.md).
"""

from __future__ import annotations

import ctypes
from importlib import resources

import torch

from . import cuda_launch

try:
    from cuda.bindings import driver as cu
    from cuda.bindings import nvrtc
except ImportError:  # pragma: no cover - an optional dependency
    cu = nvrtc = None

# the ring (bench/cuda_bench.py --sections moe_tail compares choices): bytes a slot holds (one
# unit of weights), warps a CTA, slots per warp
SLOT, WARPS, SPW = 8192, 8, 3
PHASES = 3              # 1, 2: stop after gate/up or down (timing probes; the outputs are then not the MoE's)
MAX_ROWS = 16
EXTRA = 2048            # shared memory after the ring: its barriers, the warps' partial sums, the pairs' ids

_kernels: dict = {}     # (device index, HD, ID, TOPK, NE, SLOT, WARPS, SPW, PHASES) -> CUfunction
_counters: dict = {}    # device index -> the grid barrier's counters (int32 [2], put back by each launch)
_sms: dict = {}


def _ok(result, what: str):
    """cuda-bindings calls return (status, *values): raise on a failed status, return the values."""
    status, *values = result if isinstance(result, tuple) else (result,)
    if int(status) != 0:
        raise RuntimeError(f"{what} failed: {status!r}")
    return values[0] if len(values) == 1 else values


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
    return cu is not None and device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


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
            and down_all.shape == (e, hd, two_i // 2) and top_i.shape[0] <= min(MAX_ROWS, _sm_count(x.device)))


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def _sm_count(device: torch.device) -> int:
    i = _index(device)
    if i not in _sms:
        _sms[i] = torch.cuda.get_device_properties(i).multi_processor_count
    return _sms[i]


def _compile(device: torch.device, hd: int, inter: int, top_k: int, n_experts: int, slot: int, warps: int, spw: int,
             phases: int):
    major, minor = torch.cuda.get_device_capability(device)
    src = resources.files(__package__).joinpath("cuda_moe_tail.cu").read_text()
    prog = _ok(nvrtc.nvrtcCreateProgram(src.encode(), b"cuda_moe_tail.cu", 0, [], []), "nvrtcCreateProgram")
    opts = [f"--gpu-architecture=sm_{major}{minor}", "-std=c++17", "-lineinfo", f"-DHD={hd}", f"-DID={inter}",
            f"-DTOPK={top_k}", f"-DNE={n_experts}", f"-DSLOT={slot}", f"-DWARPS={warps}", f"-DSPW={spw}",
            f"-DEXTRA={EXTRA}", f"-DPHASES={phases}"]
    opts = [o.encode() for o in opts]
    status = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)[0]
    if int(status) != 0:
        size = _ok(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, log)
        raise RuntimeError(f"compiling cuda_moe_tail.cu failed:\n{log.decode(errors='replace')}")
    size = _ok(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
    cubin = b" " * size
    _ok(nvrtc.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
    nvrtc.nvrtcDestroyProgram(prog)
    _ok(cu.cuInit(0), "cuInit")
    module = _ok(cu.cuModuleLoadData(cubin), "cuModuleLoadData")
    fn = _ok(cu.cuModuleGetFunction(module, b"moe_tail"), "cuModuleGetFunction")
    _ok(cu.cuFuncSetAttribute(fn, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                              warps * spw * slot + EXTRA), "cuFuncSetAttribute")
    return fn


def _kernel(device: torch.device, hd: int, inter: int, top_k: int, n_experts: int):
    key = (_index(device), hd, inter, top_k, n_experts, SLOT, WARPS, SPW, PHASES)
    if key not in _kernels:
        if key[0] not in _counters:          # also makes the device's context current here
            _counters[key[0]] = torch.zeros(2, dtype=torch.int32, device=device)
        with torch.cuda.device(device):
            _kernels[key] = _compile(device, hd, inter, top_k, n_experts, SLOT, WARPS, SPW, PHASES)
    return _kernels[key], WARPS * SPW * SLOT + EXTRA, 32 * WARPS


def _launch(fn, smem: int, threads: int, grid: int, stream: int, pdl: bool, args: list) -> None:
    cfg = cu.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid, 1, 1
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = threads, 1, 1
    cfg.sharedMemBytes = smem
    cfg.hStream = cu.CUstream(stream)
    if pdl:
        attr = cu.CUlaunchAttribute()
        attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        cfg.attrs = [attr]
        cfg.numAttrs = 1
    else:
        cfg.numAttrs = 0
    params = (ctypes.c_void_p * len(args))(*[ctypes.addressof(a) for a in args])
    _ok(cu.cuLaunchKernelEx(cfg, fn, ctypes.addressof(params), 0), "cuLaunchKernelEx(moe_tail)")


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
    ctr = _counters[_index(x.device)]
    ptrs = [ctypes.c_void_p(t.data_ptr()) for t in (x, top_w, top_i, gu_all, shared_gu, down_all, shared_down,
                                                     resid, norm_w, act, y, s, out, ctr)]
    pdl = cuda_launch.flags(x.device)["PDL"]
    args = ptrs + [ctypes.c_int(rows), ctypes.c_float(eps), ctypes.c_int(int(pdl))]
    _launch(fn, smem, threads, _sm_count(x.device), torch.cuda.current_stream(x.device).cuda_stream, pdl, args)
    return s, out
