"""The routed experts of a batched prefill, grouped by expert: each expert's weights read once
for all the rows routed to it.

The decode/verify kernels (cuda_moe) run one program per (row, slot) pair, which reads its
expert's weights for that row alone: fine for a few rows, but a prompt of P rows asks for
its experts' weights ~P * K / E times over. Here the (row, slot) pairs are sorted by expert
id (stable, so each expert's block keeps row order), gathered, and run through one grouped
product per weight (torch._grouped_mm where the build has it for the device and dtype; else
a product per expert that has rows):

  pairs sorted by expert:   xs [P, H] = x[row of each pair]                   P = R * K
  gate/up, SwiGLU:          act = silu(xs W_gu[e]^T [:, :I]) * (xs W_gu[e]^T [:, I:])
  down:                     y [P, H] = act W_d[e]^T   (rounded to x's dtype, as F.linear's is)
  back to (row, slot):      out[r] = sum over s in slot order of w[r, s] * y[(r, s)] in fp32, rounded once

Prefill only (the batched policy, no row-invariance promise): which rows share a product, and
so the product's algorithm, changes with the batch. A given batch gives the same bits every
run (no atomics: the scatter back writes each pair once; the sum over slots is a fixed order).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_GROUPED = {}   # (device type, capability, dtype) -> whether torch._grouped_mm ran there


def _grouped_ok(a: torch.Tensor) -> bool:
    """torch._grouped_mm exists, and ran once on this kind of device and dtype (builds differ:
    its CUDA kernels need sm90+ and bf16; CPU builds have a reference path)."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    cap = torch.cuda.get_device_capability(a.device) if a.is_cuda else None
    key = (a.device.type, cap, a.dtype)
    if key not in _GROUPED:
        try:
            x = torch.zeros(4, 16, dtype=a.dtype, device=a.device)
            w = torch.zeros(2, 16, 16, dtype=a.dtype, device=a.device)
            torch._grouped_mm(x, w.transpose(-2, -1), offs=torch.tensor([1, 4], dtype=torch.int32, device=a.device))
            _GROUPED[key] = True
        except (RuntimeError, NotImplementedError, TypeError):
            _GROUPED[key] = False
    return _GROUPED[key]


def _aligned(*ts: torch.Tensor) -> bool:
    """The grouped kernels want 16-byte aligned rows and base addresses."""
    return all(t.data_ptr() % 16 == 0 and (t.shape[-1] * t.element_size()) % 16 == 0 for t in ts)


def runs_grouped(x: torch.Tensor, gu_all: torch.Tensor, down_all: torch.Tensor) -> bool:
    """Whether routed_experts on activations like x takes torch._grouped_mm (no host sync)."""
    return _grouped_ok(x) and _aligned(x, gu_all, down_all)


def expert_products(xs: torch.Tensor, w: torch.Tensor, offs: torch.Tensor, counts: list[int] | None,
                    grouped: bool) -> torch.Tensor:
    """xs [P, K] sorted by expert, offs [E] int32 (the end of each expert's block), w [E, N, K]
    -> [P, N] in xs's dtype: row p times its expert's w^T. grouped: one torch._grouped_mm;
    else counts (the blocks' sizes, on the host) give a product per non-empty block."""
    if grouped:
        return torch._grouped_mm(xs, w.transpose(-2, -1), offs=offs)
    out = xs.new_empty(xs.shape[0], w.shape[1])
    lo = 0
    for e, n in enumerate(counts):
        if n:
            out[lo:lo + n] = F.linear(xs[lo:lo + n], w[e])
            lo += n
    return out


def routed_experts(x: torch.Tensor, top_w: torch.Tensor, top_i: torch.Tensor, gu_all: torch.Tensor,
                   down_all: torch.Tensor, grouped: bool | None = None) -> torch.Tensor:
    """x [R, H]; top_w [R, K]; top_i [R, K] expert ids; gu_all [E, 2I, H]; down_all [E, H, I]
    -> [R, H] in x's dtype. grouped: None picks torch._grouped_mm where it runs (see module doc);
    False forces a product per expert (the reference the tests hold the grouped one to)."""
    rows, k = top_i.shape
    e, two_i, h = gu_all.shape
    inter = two_i // 2
    if grouped is None:
        grouped = runs_grouped(x, gu_all, down_all)
    flat = top_i.reshape(-1)
    order = torch.argsort(flat, stable=True)                     # [P] pairs in expert order
    # (torch.bincount would wait for the GPU to size its output)
    counts = torch.zeros(e, dtype=torch.long, device=flat.device).index_add_(0, flat, torch.ones_like(flat))
    offs = torch.cumsum(counts, 0).to(torch.int32)
    host_counts = None if grouped else counts.tolist()
    xs = x[order // k].contiguous()                             # [P, H]
    gu = expert_products(xs, gu_all, offs, host_counts, grouped)   # [P, 2I]
    act = (F.silu(gu[:, :inter]) * gu[:, inter:]).contiguous()  # rounded as torch's two ops round
    y = expert_products(act, down_all, offs, host_counts, grouped)  # [P, H]
    back = torch.empty_like(y)
    back[order] = y                                             # (row, slot) order
    back = back.view(rows, k, h).float()
    w = top_w.float()
    total = back[:, 0] * w[:, :1]
    for s in range(1, k):                                       # slot order, fixed
        total = total + back[:, s] * w[:, s:s + 1]
    return total.to(x.dtype)
