"""The MoE's expert products in the stream design (cuda_stream_moe.cu): gate/up + SwiGLU and down
over every (row, slot) pair, the gate/up weights brought to shared memory by 2D TMA tiles and the
down weights by 8 KiB bulk copies, the shared expert's gate/up units and every down unit requested
before the previous kernel is done.

Opt-in (cuda_fusions.STREAM_MOE, `VERISPEC_FUSIONS_ON=STREAM_MOE`): exact, but 2.9-5.3% slower than
the Triton kernels in the graphed 40-layer forward (device calls 95, 96 and 98; docs/cuda-history.md, fifteenth
session): a routed expert's weights can be asked for only once the router's ids are read, so the
early requests that made the dense stream products pay cover only the shared expert here.
cuda_moe.experts_add_norm hands the pairs to these two kernels when it is on and `fits` holds
(bf16, a shape the kernels compile for, cuda-bindings with NVRTC); else the Triton kernels
(_gate_up_act, _down_pair) run. The sums run in another order than the Triton kernels'
(tensor-core steps of 32, then the warps' partials in order), so the logits differ from the
Triton path's; rows are invariant (cuda_stream_moe.cu says why; tests/test_cuda_stream_moe.py).
"""

from __future__ import annotations

import ctypes

import torch

from . import cuda_launch, cuda_nvrtc

MAX_ROWS = 16
SMEM_MAX = 227 * 1024
# gate/up: warps (the K split), act columns a task (4 or 8), slots a warp; down: warps a CTA
# (each alone), slots a warp (bench/cuda_bench.py --sections stream_moe compares them)
GW, GR, GSPW = 8, 8, 3
DW, DSPW = 8, 3
TRIG = 1
# the router lets the gate/up kernel launch before its own wait, so the shared expert's units are
# requested while the router and the kernel before it run (bench/cuda_bench.py --sections stream_moe)
EARLY_ROUTE = True

_kernels: dict = {}
_builds: dict = {}


def _sizes(h: int, inter: int, slots: int) -> tuple[int, int]:
    """Bytes of shared memory of (gate/up, down): slots, barriers, (gate/up) two buffers of partial
    sums, the ids."""
    ids = 4 * MAX_ROWS * slots
    gu = GW * GSPW * (2 * GR * (h // GW) * 2 + 8) + 2 * GW * 2 * GR * 4 + ids
    dn = DW * DSPW * (8 * inter * 2 + 8) + ids
    return gu, dn


def shape_ok(h: int, inter: int, slots: int) -> bool:
    """The kernels' compile-time conditions (cuda_stream_moe.cu's static_asserts) and shared memory."""
    gkw = h // GW
    return (h % GW == 0 and gkw % 32 == 0 and gkw <= 256 and GR in (4, 8) and inter % GR == 0
            and inter % 32 == 0 and inter // 32 <= 16 and h % 8 == 0 and slots >= 2
            and max(_sizes(h, inter, slots)) <= SMEM_MAX)


def available(device: torch.device) -> bool:
    """cuda_nvrtc.available, and the kernels compiled once for this device at a first shape (where
    NVRTC cannot build them, the Triton expert kernels run, said once on stderr)."""
    return cuda_nvrtc.builds(device, _builds, lambda: _kernel(device, 2048, 512, 9), "the CUDA C++ expert products")


def fits(x, slots: int, gu_all, down_all, shared_gu, shared_down) -> bool:
    """Whether these kernels take x [R, H]'s pairs with `slots` slots a row: bf16 weights and x,
    contiguous weights on 16-byte boundaries (TMA), x rows 16-byte aligned, R <= 16, a shape they
    compile for."""
    e, two_i, h = gu_all.shape
    rows = x.shape[0]
    ws = (gu_all, down_all, shared_gu, shared_down)
    return (x.device.type == "cuda" and shape_ok(h, two_i // 2, slots)
            and all(t.dtype == torch.bfloat16 and t.is_contiguous() and t.data_ptr() % 16 == 0 for t in ws)
            and x.dtype == torch.bfloat16 and x.dim() == 2 and x.shape == (rows, h) and x.stride(1) == 1
            and x.stride(0) % 8 == 0 and x.data_ptr() % 16 == 0 and 1 <= rows <= MAX_ROWS
            and down_all.shape == (e, h, two_i // 2) and shared_gu.shape == (two_i, h)
            and shared_down.shape == (h, two_i // 2) and available(x.device))


def defines(h: int, inter: int, slots: int) -> dict:
    """The kernels' -D defines under the module's settings (no GPU needed: tools/nvrtc_check.py)."""
    return {"H": h, "I": inter, "S": slots, "GW": GW, "GR": GR, "GSPW": GSPW, "DW": DW, "DSPW": DSPW, "TRIG": TRIG}


def _kernel(device: torch.device, h: int, inter: int, slots: int):
    d = defines(h, inter, slots)
    key = (cuda_nvrtc.index(device), tuple(d.items()))
    if key not in _kernels:
        gu, dn = _sizes(h, inter, slots)
        with torch.cuda.device(device):
            _kernels[key] = (cuda_nvrtc.compile_kernel(device, "cuda_stream_moe.cu", "moe_gate_up", d, gu),
                             cuda_nvrtc.compile_kernel(device, "cuda_stream_moe.cu", "moe_down", d, dn), gu, dn)
    return _kernels[key]


def pairs(x, top_i, gu_all, down_all, shared_gu, shared_down) -> torch.Tensor:
    """x [R, H]; top_i [R, S] int32 (slots 0..S-2 routed expert ids, slot S-1 the shared expert);
    gu_all [E, 2I, H], down_all [E, H, I]; shared_gu [2I, H], shared_down [H, I] -> y [R * S, H]
    fp32, y[r * S + s] = W_down(s) . (silu(W_gate(s) . x_r) * (W_up(s) . x_r)), as cuda_moe._pairs,
    in two launches (moe_gate_up, moe_down). Precondition: top_i was written by the launch just
    before this one (moe_down reads it before its wait, once moe_gate_up has passed its own)."""
    ok_ids = top_i.dtype == torch.int32 and top_i.is_contiguous() and top_i.dim() == 2 and top_i.shape[0] == x.shape[0]
    if not (ok_ids and fits(x, top_i.shape[-1], gu_all, down_all, shared_gu, shared_down)):
        raise ValueError(f"stream_moe takes bf16 x [1..{MAX_ROWS}, H], int32 ids and contiguous bf16 expert weights "
                         f"of a shape it compiles for; got x {tuple(x.shape)} {x.dtype}, ids {tuple(top_i.shape)} "
                         f"{top_i.dtype}, gate/up {tuple(gu_all.shape)} {gu_all.dtype}")
    rows, slots = top_i.shape
    _, two_i, h = gu_all.shape
    inter = two_i // 2
    fgu, fdn, smem_gu, smem_dn = _kernel(x.device, h, inter, slots)
    pdl = cuda_launch.flags(x.device)["PDL"]
    stream = torch.cuda.current_stream(x.device).cuda_stream
    sms = cuda_nvrtc.sm_count(x.device)
    act = torch.empty(rows * slots, inter, dtype=x.dtype, device=x.device)
    args = [cuda_nvrtc.tensor_map(gu_all, GR, h // GW), cuda_nvrtc.tensor_map(shared_gu, GR, h // GW),
            ctypes.c_void_p(x.data_ptr()), ctypes.c_int(x.stride(0)), ctypes.c_void_p(top_i.data_ptr()),
            ctypes.c_void_p(act.data_ptr()), ctypes.c_int(rows), ctypes.c_int(int(pdl))]
    cuda_nvrtc.launch(fgu, smem_gu, 32 * GW, min(rows * slots * (inter // GR), sms), stream, pdl, args, "moe_gate_up")
    y = torch.empty(rows * slots, h, dtype=torch.float32, device=x.device)
    args = [ctypes.c_void_p(down_all.data_ptr()), ctypes.c_void_p(shared_down.data_ptr()), ctypes.c_void_p(act.data_ptr()),
            ctypes.c_void_p(top_i.data_ptr()), ctypes.c_void_p(y.data_ptr()), ctypes.c_int(rows), ctypes.c_int(int(pdl))]
    cuda_nvrtc.launch(fdn, smem_dn, 32 * DW, min(-(-rows * slots * (h // 8) // DW), sms), stream, pdl, args, "moe_down")
    return y
