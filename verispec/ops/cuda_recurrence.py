"""The DeltaNet recurrence as a CUDA C++ kernel written for latency (cuda_recurrence.cu).

A decode step's timeline (bench/cuda_timeline.py, docs/cuda.md) has the Triton recurrence
(cuda_deltanet._delta_steps) ending 6.4-7.0 us after its input is complete, with everything after
it waiting: ~0.19 ms of a step. This kernel takes the same inputs and gives the same function:
a warp owns 16 value columns of a head over all 128 key rows, so each sum over the key rows is one
warp's butterfly (no shared memory, no block barrier), and the state is read before the kernel's
wait. cuda_deltanet.delta_steps hands the launch here when cuda_fusions.REC is on and fits() holds;
the sums run in another order than the Triton kernel's, so the bits differ from it; rows are
invariant (tests/test_cuda_recurrence.py). Measured no faster in the graphed forward (1.002-1.025x
over its options: docs/cuda.md), so it is off by default. It is done 3.3-3.8 us after its input
(bench/cuda_stamps.py), but the window is bound by the output product's weights arriving, so the
time moves to the gated norm's wait (docs/cuda.md, "From inside the kernels").
"""

from __future__ import annotations

import ctypes

import torch

from . import cuda_fusions, cuda_launch, cuda_nvrtc

CB = 16          # value columns a warp (cuda_recurrence.cu): 16 or 8
WARPS = 2        # warps a CTA
PRE = 1          # the state read before the wait
FAST = 0         # the exponentials and the logarithm by the fast intrinsics
DK = 128         # key rows (4 a lane)
STAMPS: torch.Tensor | None = None   # a u64 buffer: the kernel built with per-CTA stamps (bench/cuda_stamps.py)

_kernels: dict = {}
_builds: dict = {}


def defines(hv: int, rep: int, dv: int, trig: int = 1) -> dict:
    """The kernel's -D defines under the module's settings (no GPU needed: tools/nvrtc_check.py)."""
    return {"HV": hv, "REP": rep, "DV": dv, "WARPS": WARPS, "TRIG": trig, "CB": CB, "PRE": PRE, "FAST": FAST,
            "STAMPS": int(STAMPS is not None)}


def _kernel(device: torch.device, hv: int, rep: int, dv: int, trig: int = 1):
    d = defines(hv, rep, dv, trig)
    key = (cuda_nvrtc.index(device), tuple(d.items()))
    if key not in _kernels:
        with torch.cuda.device(device):
            _kernels[key] = cuda_nvrtc.compile_kernel(device, "cuda_recurrence.cu", "delta_rec", d, 0)
    return _kernels[key]


def available(device: torch.device) -> bool:
    """cuda_nvrtc.available, and the kernel compiled once for this device (the 35B-A3B shape)."""
    return cuda_nvrtc.builds(device, _builds, lambda: _kernel(device, 32, 2, 128), "the CUDA C++ recurrence")


def fits(mixed: torch.Tensor, ba: torch.Tensor, a_log_exp: torch.Tensor, dt_bias: torch.Tensor,
         state: torch.Tensor, hk: int, dk: int, dv: int, out_dtype: torch.dtype) -> bool:
    """Whether this kernel takes cuda_deltanet.delta_steps' launch: REC on, key width 128, value
    width a multiple of a CTA's columns, bf16 inputs and output, fp32 state, q|k rows 8-byte aligned."""
    hv = state.shape[0] if state.dim() == 3 else 0
    return (cuda_fusions.REC and mixed.is_cuda and dk == DK and hv > 0 and dv % (CB * WARPS) == 0
            and hv % hk == 0 and state.shape == (hv, dk, dv) and state.dtype == torch.float32
            and state.is_contiguous() and state.data_ptr() % 16 == 0
            and mixed.dtype == ba.dtype == dt_bias.dtype == out_dtype == torch.bfloat16
            and a_log_exp.dtype == torch.float32 and a_log_exp.is_contiguous() and dt_bias.is_contiguous()
            and mixed.dim() == 2 and mixed.stride(1) == 1 and mixed.stride(0) % 4 == 0 and mixed.data_ptr() % 8 == 0
            and mixed.shape[1] >= 2 * hk * dk + hv * dv and ba.dim() == 2 and ba.stride(1) == 1
            and ba.shape[1] >= 2 * hv and ba.shape[0] == mixed.shape[0] and available(mixed.device))


def delta_steps(mixed: torch.Tensor, ba: torch.Tensor, a_log_exp: torch.Tensor, dt_bias: torch.Tensor,
                state: torch.Tensor, slot_table: torch.Tensor | None, hk: int, dk: int, dv: int,
                eps: float = 1e-6) -> torch.Tensor:
    """cuda_deltanet.delta_steps for what fits() takes: every row in order in one launch, the state
    in place, the state after row r < rows - 1 to the slot at slot_table[r]. -> [rows, Hv, dv] bf16."""
    rows, hv = mixed.shape[0], state.shape[0]
    fl = cuda_launch.flags(mixed.device, early="link")     # the gated norm after it may let a product launch
    pdl = fl["PDL"]
    fn = _kernel(mixed.device, hv, hv // hk, dv, 2 if fl["EARLY"] else 1)
    out = torch.empty(rows, hv, dv, dtype=torch.bfloat16, device=mixed.device)
    tab = slot_table if slot_table is not None else state
    args = [ctypes.c_void_p(mixed.data_ptr()), ctypes.c_int(mixed.stride(0)), ctypes.c_void_p(ba.data_ptr()),
            ctypes.c_int(ba.stride(0)), ctypes.c_void_p(a_log_exp.data_ptr()), ctypes.c_void_p(dt_bias.data_ptr()),
            ctypes.c_void_p(state.data_ptr()), ctypes.c_void_p(out.data_ptr()), ctypes.c_void_p(tab.data_ptr()),
            ctypes.c_int(rows), ctypes.c_int(int(slot_table is not None)), ctypes.c_int(int(pdl)),
            ctypes.c_float(dk ** -0.5), ctypes.c_float(eps),
            ctypes.c_void_p(STAMPS.data_ptr() if STAMPS is not None else 0)]
    grid = hv * (dv // (CB * WARPS))
    cuda_nvrtc.launch(fn, 0, 32 * WARPS, grid, torch.cuda.current_stream(mixed.device).cuda_stream, pdl, args,
                      "delta_rec")
    return out
