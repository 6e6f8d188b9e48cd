"""The residual add, the norm before the MoE, the router product and the router in one launch
(cuda_norm_route.cu): an experiment, cuda_fusions.ROUTE_CLUSTER, off by default.

The default path runs two launches here: cuda_norm_router's add + norm + router product (33
programs a row at the 35B-A3B shape) and cuda_moe.route_shared's router (a warp a row). In the
graphed decode step the router ends ~2.5 us after the product (bench/cuda_timeline.py, call 290)
for ~1 us of work. Here a row's CL CTAs form a thread-block cluster: each computes its share of
the logits, puts them into the first CTA's shared memory, and after one cluster barrier that CTA
routes. Folding the router into the product's last program by a counter lost 5.5% (ninth
session); a cluster barrier needs no global memory round trip.

The gate/up kernel that follows must then wait before reading its input in every program
(cuda_moe.experts_add_norm(..., shared_first=False)): with the router gone, the launch before it
is the one writing that input.
"""

from __future__ import annotations

import ctypes

import torch

from . import cuda_launch, cuda_nvrtc

CLUSTER = 8        # CTAs a row (8 portable; 16 needs Hopper's non-portable sizes)
_kernels: dict = {}
_built: dict = {}


def _warps(hd: int) -> int:
    """The most warps (<= 16) with hd a multiple of 128 warps (a thread's groups of 4 elements)."""
    return next((w for w in range(16, 0, -1) if hd % (128 * w) == 0), 0)


def _shape_ok(hd: int, n_out: int, n_experts: int, top_k: int, cluster: int) -> bool:
    cols = -(-n_out // cluster)
    return (_warps(hd) > 0 and n_experts % 32 == 0 and n_out > n_experts and top_k < 32 and 1 <= cluster <= 16
            and cols * (hd // (4 * 32 * _warps(hd))) <= 40)     # the weights a thread holds: at most 80 registers


def defines(hd: int, n_out: int, n_experts: int, top_k: int, norm: bool, cluster: int) -> dict:
    return {"HD": hd, "NOUT": n_out, "NE": n_experts, "TOPK": top_k, "NORM": int(norm), "CL": cluster,
            "WARPS": _warps(hd)}


def _kernel(device: torch.device, d: dict):
    key = (cuda_nvrtc.index(device), tuple(d.items()))
    if key not in _kernels:
        with torch.cuda.device(device):
            fn = cuda_nvrtc.compile_kernel(device, "cuda_norm_route.cu", "norm_route", d, 0)
            _kernels[key] = cuda_nvrtc.cluster_function(fn, d["CL"])
    return _kernels[key]


def available(device: torch.device) -> bool:
    """cuda-bindings, a Hopper GPU, and the kernel builds there (asked once a device)."""
    d = defines(2048, 264, 256, 8, True, CLUSTER)
    return cuda_nvrtc.builds(device, _built, lambda: _kernel(device, d), "the cluster router kernels")


def fits(x: torch.Tensor, h, norm_w: torch.Tensor, router: torch.Tensor, n_experts: int, top_k: int) -> bool:
    """Whether this kernel takes the layer: bf16 contiguous x, h (a tensor, not split-K partials),
    norm weight and router rows on 8-byte boundaries, a shape it compiles for, and at most as many
    rows as a grid of clusters may hold (16)."""
    if not isinstance(h, torch.Tensor) or not x.is_cuda:
        return False
    tensors = (x, h, norm_w, router)
    return (x.dim() == 2 and h.shape == x.shape and x.shape[0] <= 16 and router.shape[1] == x.shape[1]
            and norm_w.shape == (x.shape[1],)
            and all(t.dtype == torch.bfloat16 and t.is_contiguous() and t.data_ptr() % 8 == 0 for t in tensors)
            and _shape_ok(x.shape[1], router.shape[0], n_experts, top_k, CLUSTER) and available(x.device))


def add_norm_route(x: torch.Tensor, h: torch.Tensor, norm_w: torch.Tensor, eps: float, router: torch.Tensor,
                   n_experts: int, top_k: int, norm: bool) -> tuple[torch.Tensor, ...]:
    """x, h [R, H] (the residual stream, the mixer's output); router [N, H] (the E router rows, the
    shared expert's gate, padding) -> (s = x + h, y = ZC-norm(s) with norm_w, weights [R, K + 1]
    fp32, ids [R, K + 1] int32), as cuda_norm_router.add_norm_router followed by
    cuda_moe.route_shared return them, in one launch (with fits() true)."""
    rows, hd = x.shape
    d = defines(hd, router.shape[0], n_experts, top_k, norm, CLUSTER)
    fn = _kernel(x.device, d)
    s, y = torch.empty_like(x), torch.empty_like(x)
    w = torch.empty(rows, top_k + 1, dtype=torch.float32, device=x.device)
    i = torch.empty(rows, top_k + 1, dtype=torch.int32, device=x.device)
    pdl = cuda_launch.flags(x.device)["PDL"]
    args = [ctypes.c_void_p(t.data_ptr()) for t in (x, h, norm_w, router, s, y, w, i)]
    args += [ctypes.c_float(eps), ctypes.c_int(int(pdl))]
    cuda_nvrtc.launch(fn, 0, 32 * d["WARPS"], CLUSTER * rows, torch.cuda.current_stream(x.device).cuda_stream, pdl,
                      args, "norm_route", cluster=CLUSTER)
    return s, y, w, i
