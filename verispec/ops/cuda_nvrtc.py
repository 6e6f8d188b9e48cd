"""Our CUDA C++ kernels: compiled at run time by NVRTC and launched through the driver with
programmatic dependent launch, both from `cuda-bindings` (the `cuda` extra). Without it the
callers fall back to their Triton kernels (each module's `available`)."""

from __future__ import annotations

import ctypes
import sys
from importlib import resources

import torch

try:
    from cuda.bindings import driver as cu
    from cuda.bindings import nvrtc
except ImportError:  # pragma: no cover - an optional dependency
    cu = nvrtc = None

HEADERS = ("cuda_device.cuh",)     # package files a kernel may #include
_sms: dict = {}
_maps: dict = {}        # (address, rows, K, box rows, box K) -> a tensor map's 128 bytes
_loaded: bool | None = None
_hopper: dict = {}


def ok(result, what: str):
    """cuda-bindings calls return (status, *values): raise on a failed status, return the values."""
    status, *values = result if isinstance(result, tuple) else (result,)
    if int(status) != 0:
        raise RuntimeError(f"{what} failed: {status!r}")
    return values[0] if len(values) == 1 else values


def _loads() -> bool:
    """Whether the NVRTC library and the driver answer (cuda-bindings may be installed without a
    matching libnvrtc)."""
    global _loaded
    if _loaded is None:
        try:
            _loaded = int(nvrtc.nvrtcVersion()[0]) == 0 and int(cu.cuInit(0)[0]) == 0
        except Exception:  # noqa: BLE001 - a missing or mismatched library, whatever it raises
            _loaded = False
    return _loaded


def available(device: torch.device) -> bool:
    """cuda-bindings with NVRTC and the driver, and a GPU of compute capability 9 or later."""
    return cu is not None and device.type == "cuda" and hopper(device) and _loads()


def builds(device: torch.device, cache: dict, build, what: str) -> bool:
    """available(device), and build() (a first kernel compiled for the device) succeeded: asked
    once a device, the answer kept in cache. Where NVRTC cannot build it, `what` are off and the
    Triton kernels run, said once on stderr."""
    if not available(device):
        return False
    i = index(device)
    if i not in cache:
        try:
            build()
            cache[i] = True
        except RuntimeError as e:
            print(f"verispec: {what} are off (the Triton ones run): {str(e).splitlines()[0]}", file=sys.stderr)
            cache[i] = False
    return cache[i]


def hopper(device: torch.device) -> bool:
    """Whether the CUDA device has compute capability 9 or later (grid dependency control, TMA)."""
    i = index(device)
    if i not in _hopper:
        _hopper[i] = torch.cuda.get_device_capability(i)[0] >= 9
    return _hopper[i]


def index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def sm_count(device: torch.device) -> int:
    i = index(device)
    if i not in _sms:
        _sms[i] = torch.cuda.get_device_properties(i).multi_processor_count
    return _sms[i]


def cubin(arch: tuple[int, int], source: str, defines: dict, text: str | None = None,
          header_texts: dict[str, str] | None = None) -> bytes:
    """The cubin NVRTC builds for sm_<arch> from the package file `source` (or from `text`, named
    `source`) with -D defines, the HEADERS from the package (or from header_texts, by name); no GPU
    needed (tools/nvrtc_check.py, tools/sass_diff.py, tools/stream_regs.py)."""
    files = resources.files(__package__)
    src = text if text is not None else files.joinpath(source).read_text()
    given = header_texts or {}
    headers = [(given[h] if h in given else files.joinpath(h).read_text()).encode() for h in HEADERS]
    prog = ok(nvrtc.nvrtcCreateProgram(src.encode(), source.encode(), len(HEADERS), headers,
                                       [h.encode() for h in HEADERS]), "nvrtcCreateProgram")
    opts = [f"--gpu-architecture=sm_{arch[0]}{arch[1]}", "-std=c++17", "-lineinfo"]
    opts += [f"-D{k}={v}" for k, v in defines.items()]
    opts = [o.encode() for o in opts]
    status = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)[0]
    if int(status) != 0:
        size = ok(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, log)
        raise RuntimeError(f"compiling {source} failed:\n{log.decode(errors='replace')}")
    size = ok(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
    out = b" " * size
    ok(nvrtc.nvrtcGetCUBIN(prog, out), "nvrtcGetCUBIN")
    nvrtc.nvrtcDestroyProgram(prog)
    return out


def compile_kernel(device: torch.device, source: str, name: str, defines: dict, smem: int, text: str | None = None,
                   carveout: int | None = None):
    """The function `name` of the package file `source` (or of `text`, named `source`: a benchmark's
    probe kernel), compiled for device with -D defines, allowed `smem` bytes of dynamic shared memory.
    carveout: the percent of the SM's unified L1 + shared memory it prefers as shared memory (the
    driver's choice where None); an SM holds CTAs of two kernels at once only in one configuration."""
    torch.zeros(1, device=device)     # the device's primary context made current: the module loads into it
    built = cubin(torch.cuda.get_device_capability(device), source, defines, text)
    ok(cu.cuInit(0), "cuInit")
    module = ok(cu.cuModuleLoadData(built), "cuModuleLoadData")
    fn = ok(cu.cuModuleGetFunction(module, name.encode()), "cuModuleGetFunction")
    ok(cu.cuFuncSetAttribute(fn, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem),
       "cuFuncSetAttribute")
    if carveout is not None:
        ok(cu.cuFuncSetAttribute(fn, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                                 carveout), "cuFuncSetAttribute(carveout)")
    return fn


def launch(fn, smem: int, threads: int, grid: int, stream: int, pdl: bool, args: list, what: str,
           cluster: int = 0) -> None:
    """fn<<<grid, threads, smem, stream>>>(args) (ctypes values), with PDL when pdl, in clusters of
    `cluster` CTAs along x when given (fn allowed that size: cluster_function)."""
    cfg = cu.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid, 1, 1
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = threads, 1, 1
    cfg.sharedMemBytes = smem
    cfg.hStream = cu.CUstream(stream)
    attrs = []
    if pdl:
        attr = cu.CUlaunchAttribute()
        attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        attrs.append(attr)
    if cluster:
        attr = cu.CUlaunchAttribute()
        attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = cluster, 1, 1
        attrs.append(attr)
    if attrs:
        cfg.attrs = attrs
    cfg.numAttrs = len(attrs)
    params = (ctypes.c_void_p * len(args))(*[ctypes.addressof(a) for a in args])
    ok(cu.cuLaunchKernelEx(cfg, fn, ctypes.addressof(params), 0), f"cuLaunchKernelEx({what})")


def cluster_function(fn, size: int):
    """Lets fn launch in clusters of `size` CTAs (over 8, the non-portable sizes Hopper allows)."""
    if size > 8:
        ok(cu.cuFuncSetAttribute(fn, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1),
           "cuFuncSetAttribute(non-portable cluster size)")
    return fn


def tensor_map(w: torch.Tensor, box_rows: int, box_k: int):
    """The 2D TMA descriptor of w viewed as [rows, K] (K its last dimension, contiguous) in boxes of
    box_rows rows by box_k elements, no swizzle (a box lands as box_rows rows of box_k elements), as
    the 128 bytes a kernel takes by value (TensorMap in cuda_device.cuh)."""
    k = w.shape[-1]
    rows = w.numel() // k
    key = (w.data_ptr(), rows, k, box_rows, box_k)
    if key not in _maps:
        m = ok(cu.cuTensorMapEncodeTiled(
            cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, w.data_ptr(),
            [cu.cuuint64_t(k), cu.cuuint64_t(rows)], [cu.cuuint64_t(2 * k)], [cu.cuuint32_t(box_k), cu.cuuint32_t(box_rows)],
            [cu.cuuint32_t(1), cu.cuuint32_t(1)], cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
            cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE, cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE), "cuTensorMapEncodeTiled")
        _maps[key] = (ctypes.c_uint64 * 16).from_buffer_copy(ctypes.string_at(m.getPtr(), 128))
    return _maps[key]
