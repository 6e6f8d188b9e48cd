"""Gated DeltaNet: the causal-conv ring and the gated delta recurrence.

Decode/verify rows go one at a time through the same fixed-shape ops a 1-row step uses,
and the caller may copy the state after each row (copy slots). A batched prefill takes the
batched conv here and the rule in chunks (verispec/ops/chunk_delta.py).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from ..models.layers import l2_norm
from . import cuda_deltanet


def conv_rows(x: torch.Tensor, ring: torch.Tensor, weight: torch.Tensor,
              on_row: Callable[[int], None] | None = None) -> torch.Tensor:
    """Depthwise causal conv + silu, row by row. x [rows, C]; ring [C, K-1] (updated in place);
    weight [C, K]. Elementwise products summed in a fixed order, so rows are invariant."""
    rows, _ = x.shape
    k = weight.shape[1]
    out = torch.empty_like(x)
    for m in range(rows):
        acc = ring[:, 0] * weight[:, 0]
        for j in range(1, k - 1):
            acc = acc + ring[:, j] * weight[:, j]
        acc = acc + x[m] * weight[:, k - 1]
        out[m] = F.silu(acc)
        if k > 1:
            ring[:, :-1] = ring[:, 1:].clone()
            ring[:, -1] = x[m]
        if on_row is not None:
            on_row(m)
    return out


def conv_prefill(x: torch.Tensor, ring: torch.Tensor, weight: torch.Tensor,
                 n_real: torch.Tensor | None = None) -> torch.Tensor:
    """Batched causal conv for a prompt chunk. x [rows, C]; ring [C, K-1] updated in place.
    n_real (a device count): rows from n_real on are padding, and the ring ends at row n_real-1."""
    rows, c = x.shape
    k = weight.shape[1]
    full = torch.cat([ring, x.t()], dim=1)                              # [C, K-1+rows]
    out = F.conv1d(full[None], weight[:, None, :], groups=c)[0]         # [C, rows]
    if n_real is None:
        ring.copy_(full[:, full.shape[1] - (k - 1):])
    else:
        ring.copy_(full.index_select(1, torch.arange(k - 1, device=x.device) + n_real))
    return F.silu(out.t())


def prepare(q, k, v, g, beta, rows_policy=False):
    """The recurrence's inputs in fp32: q, k L2-normed (q scaled by dk^-0.5) and repeated to the
    value heads."""
    hk, dk = q.shape[1], q.shape[2]
    rep = v.shape[1] // hk
    q = l2_norm(q.float(), rows=rows_policy) * (dk ** -0.5)
    k = l2_norm(k.float(), rows=rows_policy)
    if rep > 1:
        q = q.repeat_interleave(rep, dim=1)
        k = k.repeat_interleave(rep, dim=1)
    return q, k, v.float(), g.float(), beta.float()


def delta_rule_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                    state: torch.Tensor, on_row: Callable[[int], None] | None = None, rows_policy=False,
                    slots: list | None = None) -> torch.Tensor:
    """The gated delta rule, one row at a time; state [Hv, dk, dv] fp32, updated in place.

    q, k [rows, Hk, dk]; v [rows, Hv, dv]; g, beta [rows, Hv]. Returns [rows, Hv, dv] fp32.
    `rows_policy` runs the q/k L2 norms (the one batched reduction here). The state after row
    r goes to `on_row(r)` (torch) or straight into `slots[r]` (the GPU kernel; None: no copy).
    """
    rows = q.shape[0]
    hv = v.shape[1]
    q, k, v, g, beta = prepare(q, k, v, g, beta, rows_policy)
    if on_row is None and cuda_deltanet.usable(state):
        return cuda_deltanet.delta_rule_rows(q, k, v, g, beta, state, slots or [])
    if slots:
        raise ValueError("slots are written by the GPU kernel only; use on_row")
    out = torch.empty(rows, hv, v.shape[2], dtype=torch.float32, device=v.device)
    for m in range(rows):
        state.mul_(g[m].exp()[:, None, None])
        kv_mem = torch.bmm(k[m][:, None, :], state)[:, 0, :]              # [Hv, dv]
        delta = (v[m] - kv_mem) * beta[m][:, None]
        state.add_(k[m][:, :, None] * delta[:, None, :])
        out[m] = torch.bmm(q[m][:, None, :], state)[:, 0, :]
        if on_row is not None:
            on_row(m)
    return out
