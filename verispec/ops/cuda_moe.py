"""Routed experts without host synchronisation: one program per (row, slot) pair.

The CPU MoE groups rows by expert on the host (`.tolist()`), which on a GPU stalls the
queue once per layer and cannot be captured in a CUDA graph. Here the expert ids stay on
the device: a Triton program reads its pair's expert id and streams that expert's weights.
Each program's result depends only on its own row and expert, summed in a fixed order, so
a row's bits cannot depend on how many rows (or which other experts) share the launch.

  gate_up:  act[p, j] = silu(W_gu[e_p, j] . x_r) * (W_gu[e_p, I + j] . x_r)     p = (r, s)
  down:     out[r, n] = sum over s = 0..K-1, in slot order, of w[r, s] * (W_d[e_(r,s), n] . act[(r, s)])

Without Triton (the CPU, where the padded policy runs in tests) the same arithmetic runs
one pair at a time in torch, with host-side ids.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

try:  # triton ships with CUDA builds of torch; the CPU machine does not have it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the install
    triton = None

if triton is not None:
    @triton.jit
    def _gate_up_act(x_ptr, w_ptr, ids_ptr, act_ptr, I: tl.constexpr, H: tl.constexpr, TOP_K: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        pair = tl.program_id(0)
        nb = tl.program_id(1)
        e = tl.load(ids_ptr + pair).to(tl.int64)
        row = pair // TOP_K
        offs_n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = offs_n < I
        g_rows = w_ptr + e * (2 * I) * H + offs_n[:, None].to(tl.int64) * H
        u_rows = g_rows + I * H
        acc_g = tl.zeros([BLOCK_N], dtype=tl.float32)
        acc_u = tl.zeros([BLOCK_N], dtype=tl.float32)
        for k0 in range(0, H, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            k_ok = offs_k < H
            xv = tl.load(x_ptr + row * H + offs_k, mask=k_ok, other=0.0).to(tl.float32)
            m = n_ok[:, None] & k_ok[None, :]
            wg = tl.load(g_rows + offs_k[None, :], mask=m, other=0.0).to(tl.float32)
            wu = tl.load(u_rows + offs_k[None, :], mask=m, other=0.0).to(tl.float32)
            acc_g += tl.sum(wg * xv[None, :], axis=1)
            acc_u += tl.sum(wu * xv[None, :], axis=1)
        act = acc_g * tl.sigmoid(acc_g) * acc_u
        tl.store(act_ptr + pair * I + offs_n, act.to(act_ptr.dtype.element_ty), mask=n_ok)

    @triton.jit
    def _down_sum(act_ptr, w_ptr, ids_ptr, wt_ptr, out_ptr, H: tl.constexpr, I: tl.constexpr, TOP_K: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        row = tl.program_id(0)
        nb = tl.program_id(1)
        offs_n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = offs_n < H
        total = tl.zeros([BLOCK_N], dtype=tl.float32)
        for s in range(TOP_K):
            pair = row * TOP_K + s
            e = tl.load(ids_ptr + pair).to(tl.int64)
            wt = tl.load(wt_ptr + pair).to(tl.float32)
            w_rows = w_ptr + e * H * I + offs_n[:, None].to(tl.int64) * I
            acc = tl.zeros([BLOCK_N], dtype=tl.float32)
            for k0 in range(0, I, BLOCK_K):
                offs_k = k0 + tl.arange(0, BLOCK_K)
                k_ok = offs_k < I
                av = tl.load(act_ptr + pair * I + offs_k, mask=k_ok, other=0.0).to(tl.float32)
                wv = tl.load(w_rows + offs_k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
                acc += tl.sum(wv * av[None, :], axis=1)
            total += wt * acc
        tl.store(out_ptr + row * H + offs_n, total.to(out_ptr.dtype.element_ty), mask=n_ok)


BLOCKS = {"gate_up": (16, 256), "down": (32, 128)}   # (BLOCK_N, BLOCK_K); tuned on the H200 in bench/cuda_bench.py


def available(device: torch.device) -> bool:
    return triton is not None and device.type == "cuda"


def routed_experts(x: torch.Tensor, top_w: torch.Tensor, top_i: torch.Tensor, gu_all: torch.Tensor,
                   down_all: torch.Tensor) -> torch.Tensor:
    """x [R, H]; top_w [R, K] fp32; top_i [R, K]; gu_all [E, 2I, H]; down_all [E, H, I] -> [R, H] (x's dtype)."""
    rows, k = top_i.shape
    e, two_i, h = gu_all.shape
    inter = two_i // 2
    if not available(x.device):
        return _routed_experts_torch(x, top_w, top_i, gu_all, down_all)
    x = x.contiguous()
    ids = top_i.reshape(-1).to(torch.int32)
    wts = top_w.reshape(-1).to(torch.float32).contiguous()
    act = torch.empty(rows * k, inter, dtype=x.dtype, device=x.device)
    bn, bk = BLOCKS["gate_up"]
    _gate_up_act[(rows * k, triton.cdiv(inter, bn))](x, gu_all, ids, act, inter, h, TOP_K=k, BLOCK_N=bn, BLOCK_K=bk)
    out = torch.empty(rows, h, dtype=x.dtype, device=x.device)
    bn, bk = BLOCKS["down"]
    _down_sum[(rows, triton.cdiv(h, bn))](act, down_all, ids, wts, out, h, inter, TOP_K=k, BLOCK_N=bn, BLOCK_K=bk)
    return out


def _routed_experts_torch(x, top_w, top_i, gu_all, down_all):
    """The same arithmetic, one pair at a time (fixed shapes per pair, so rows stay invariant)."""
    rows, k = top_i.shape
    inter = gu_all.shape[1] // 2
    ids = top_i.tolist()
    out = []
    for r in range(rows):
        total = torch.zeros(1, x.shape[1], dtype=torch.float32, device=x.device)
        for s in range(k):
            gu = F.linear(x[r:r + 1].float(), gu_all[ids[r][s]].float())
            act = (F.silu(gu[:, :inter]) * gu[:, inter:]).to(x.dtype)
            total = total + top_w[r, s].float() * F.linear(act.float(), down_all[ids[r][s]].float())
        out.append(total.to(x.dtype))
    return torch.cat(out)
