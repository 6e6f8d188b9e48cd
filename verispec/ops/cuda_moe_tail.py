"""The MoE after its router product as one persistent CUDA launch (cuda_moe_tail.cu): the router,
gate/up + SwiGLU, down, and the combine with the residual add and the next norm.

cuda_moe.route_experts_add_norm otherwise runs these as four Triton launches; each ramps up to
the copy rate and drains at its end, and the experts' weights can be requested only once the
launch before is done. This kernel keeps one CTA per SM streaming its share of all of the MoE's
weights through a ring of shared-memory slots filled by bulk async copies, every CTA routing
every row itself (cuda_moe_tail.cu says how rows stay invariant). It is CUDA C++, compiled at run
time by NVRTC and launched through the driver with programmatic dependent launch, both from
`cuda-bindings` (`pip install cuda-bindings`); without it, or for a shape it does not take
(`fits`), the Triton kernels run. Switched by cuda_fusions.MOE_TAIL (off: still slower than the
Triton launches, docs/cuda.md).
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

_kernels: dict = {}     # (device index, HD, ID, TOPK, NE, NORM_TOPK, SLOT, WARPS, SPW, PHASES) -> CUfunction
_counters: dict = {}    # device index -> the kernel's counters (int32 [1024], put back to zero by each launch)
_sms: dict = {}


def _ok(result, what: str):
    """cuda-bindings calls return (status, *values): raise on a failed status, return the values."""
    status, *values = result if isinstance(result, tuple) else (result,)
    if int(status) != 0:
        raise RuntimeError(f"{what} failed: {status!r}")
    return values[0] if len(values) == 1 else values


def _extra(top_k: int) -> int:
    """Shared memory after the ring: its barriers, the warps' partial sums, each pair's id and weight."""
    return -(-(WARPS * SPW * 8 + 4 * WARPS + 8 * MAX_ROWS * (top_k + 1)) // 128) * 128


def _shape_ok(hd: int, inter: int, n_experts: int, top_k: int) -> bool:
    """The compile-time conditions of cuda_moe_tail.cu (its static_asserts)."""
    if (SLOT % (4 * hd) or SLOT % (2 * inter) or WARPS * SPW * SLOT + _extra(top_k) > 227 * 1024
            or n_experts % 32 or n_experts > 1024 or not 1 <= top_k <= min(32, n_experts)):
        return False
    gu_rows, dn_rows = SLOT // (4 * hd), SLOT // (2 * inter)
    return (gu_rows >= 1 and inter % gu_rows == 0 and hd % 256 == 0 and 1 <= dn_rows <= 32 and hd % dn_rows == 0
            and inter % 256 == 0)


def available(device: torch.device) -> bool:
    return cu is not None and device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def _logits_args(logits: torch.Tensor, rows: int) -> tuple[int, int, int] | None:
    """(split, row stride, split stride) of the router product's output: bf16 [R, N] (split 0), or
    its fp32 split-K partials [SPLIT, >= R, N]; None for anything else."""
    if logits.dim() == 2 and logits.dtype == torch.bfloat16 and logits.stride(1) == 1 and logits.shape[0] >= rows:
        return 0, logits.stride(0), 0
    if (logits.dim() == 3 and logits.dtype == torch.float32 and logits.is_contiguous() and logits.shape[1] >= rows):
        return logits.shape[0], logits.shape[2], logits.stride(0)
    return None


def fits(logits, rows, x, gu_all, down_all, shared_gu, shared_down, resid, norm_w, top_k) -> bool:
    """Whether this kernel takes the MoE: bf16 weights and activations, a shape it compiles for,
    router logits as the router product leaves them (the E experts' columns, then the shared
    expert's gate), contiguous tensors on 16-byte boundaries (bulk copies need them), at most 16
    rows and no more rows than SMs (a CTA combines a row)."""
    if not available(x.device):
        return False
    e, two_i, hd = gu_all.shape
    tensors = (x, gu_all, down_all, shared_gu, shared_down, resid, norm_w)
    return (_shape_ok(hd, two_i // 2, e, top_k) and all(t.dtype == torch.bfloat16 and t.is_contiguous() for t in tensors)
            and all(t.data_ptr() % 16 == 0 for t in tensors) and _logits_args(logits, rows) is not None
            and logits.shape[-1] >= e + 1 and x.shape == (rows, hd) and resid.shape == (rows, hd)
            and shared_gu.shape == gu_all.shape[1:] and shared_down.shape == down_all.shape[1:]
            and down_all.shape == (e, hd, two_i // 2) and rows <= min(MAX_ROWS, _sm_count(x.device)))


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def _sm_count(device: torch.device) -> int:
    i = _index(device)
    if i not in _sms:
        _sms[i] = torch.cuda.get_device_properties(i).multi_processor_count
    return _sms[i]


def _compile(device: torch.device, hd: int, inter: int, top_k: int, n_experts: int, norm_topk: bool, slot: int,
             warps: int, spw: int, phases: int):
    major, minor = torch.cuda.get_device_capability(device)
    src = resources.files(__package__).joinpath("cuda_moe_tail.cu").read_text()
    prog = _ok(nvrtc.nvrtcCreateProgram(src.encode(), b"cuda_moe_tail.cu", 0, [], []), "nvrtcCreateProgram")
    opts = [f"--gpu-architecture=sm_{major}{minor}", "-std=c++17", "-lineinfo", f"-DHD={hd}", f"-DID={inter}",
            f"-DTOPK={top_k}", f"-DNE={n_experts}", f"-DNORM_TOPK={int(norm_topk)}", f"-DSLOT={slot}",
            f"-DWARPS={warps}", f"-DSPW={spw}", f"-DEXTRA={_extra(top_k)}", f"-DPHASES={phases}"]
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
                              warps * spw * slot + _extra(top_k)), "cuFuncSetAttribute")
    return fn


def _kernel(device: torch.device, hd: int, inter: int, top_k: int, n_experts: int, norm_topk: bool):
    key = (_index(device), hd, inter, top_k, n_experts, norm_topk, SLOT, WARPS, SPW, PHASES)
    if key not in _kernels:
        if key[0] not in _counters:          # also makes the device's context current here
            _counters[key[0]] = torch.zeros(1024, dtype=torch.int32, device=device)
        with torch.cuda.device(device):
            _kernels[key] = _compile(device, hd, inter, top_k, n_experts, norm_topk, SLOT, WARPS, SPW, PHASES)
    return _kernels[key], WARPS * SPW * SLOT + _extra(top_k), 32 * WARPS


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


def route_experts_add_norm(logits, rows: int, x, gu_all, down_all, shared_gu, shared_down, resid, norm_w,
                           eps: float, top_k: int, norm_topk: bool):
    """As cuda_moe.route_experts_add_norm (its arguments, with fits() true), in one launch ->
    (resid + moe(x), the ZC-norm of it with norm_w, the routing's weights [R, K + 1] fp32 and
    expert ids [R, K + 1] int32, slot K the shared expert)."""
    n_experts, two_i, hd = gu_all.shape
    slots = top_k + 1
    fn, smem, threads = _kernel(x.device, hd, two_i // 2, top_k, n_experts, norm_topk)
    split, lrs, lss = _logits_args(logits, rows)
    dev = x.device
    top_i = torch.empty(rows, slots, dtype=torch.int32, device=dev)
    top_w = torch.empty(rows, slots, dtype=torch.float32, device=dev)
    act = torch.empty(rows * slots, two_i // 2, dtype=x.dtype, device=dev)
    y = torch.empty(rows * slots, hd, dtype=torch.float32, device=dev)
    s, out = torch.empty(rows, hd, dtype=x.dtype, device=dev), torch.empty(rows, hd, dtype=x.dtype, device=dev)
    ctr = _counters[_index(dev)]
    pdl = cuda_launch.flags(dev)["PDL"]
    args = ([ctypes.c_void_p(logits.data_ptr()), ctypes.c_int(split), ctypes.c_int(lrs), ctypes.c_int(lss)]
            + [ctypes.c_void_p(t.data_ptr()) for t in (x, gu_all, shared_gu, down_all, shared_down, resid, norm_w,
                                                       top_i, top_w, act, y, s, out, ctr)]
            + [ctypes.c_int(rows), ctypes.c_float(eps), ctypes.c_int(int(pdl))])
    _launch(fn, smem, threads, _sm_count(dev), torch.cuda.current_stream(dev).cuda_stream, pdl, args)
    return s, out, top_w, top_i
