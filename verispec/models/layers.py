"""Shared blocks of the Qwen3-Next family: norms, partial RoPE tables, SwiGLU.

Reductions here run along the last dimension of one row. Transcendental elementwise ops
(silu, sigmoid, softplus, exp) are NOT row-invariant in torch on this CPU: the vectorized
main loop and the scalar tail round differently, so where an element lands depends on the
tensor's size (measured: sigmoid differs at 4 rows, softplus at 8). `rowwise` runs them one
row at a time on the decode/verify path, so each row gets exactly a 1-row call's bits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rowwise(fn, *xs: torch.Tensor, exact: bool = True) -> torch.Tensor:
    """fn(*xs) computed row by row (dim 0) when exact, so no row depends on the row count."""
    rows = xs[0].shape[0]
    if not exact or rows == 1:
        return fn(*xs)
    return torch.cat([fn(*(x[i:i + 1] for x in xs)) for i in range(rows)])


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Zero-centred RMSNorm: x / rms(x) * (1 + w), in fp32 (Qwen3NextRMSNorm)."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * (1.0 + weight.float())).to(x.dtype)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float,
                   exact: bool = True) -> torch.Tensor:
    """DeltaNet output norm: plain-weight RMSNorm, then times silu(gate)."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    y = weight * y.to(x.dtype)
    return (y * rowwise(F.silu, gate.float(), exact=exact)).to(x.dtype)


def l2_norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def silu_mul(gate: torch.Tensor, up: torch.Tensor, exact: bool = True) -> torch.Tensor:
    return rowwise(F.silu, gate, exact=exact) * up


class RopeTable:
    """cos/sin rows per absolute position for the rotated part of a head (partial RoPE).

    Rows are computed on demand in blocks and cached; each entry depends only on its
    position, so a verify row and a decode step at the same position get equal bits.
    """

    def __init__(self, head_dim: int, partial: float, theta: float):
        self.rot = int(head_dim * partial)
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, self.rot, 2, dtype=torch.float) / self.rot))
        self.cos = torch.empty(0, self.rot)
        self.sin = torch.empty(0, self.rot)

    def _grow(self, n: int) -> None:
        n = max(n, 2 * self.cos.shape[0], 256)
        pos = torch.arange(n, dtype=torch.float)
        freqs = pos[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos, self.sin = emb.cos(), emb.sin()

    def get(self, start: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        if start + n > self.cos.shape[0]:
            self._grow(start + n)
        return self.cos[start:start + n], self.sin[start:start + n]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [rows, heads, head_dim]; cos/sin [rows, rot]. Rotates the first `rot` dims (rotate_half)."""
    rot = cos.shape[-1]
    xr, xp = x[..., :rot], x[..., rot:]
    half = rot // 2
    rotated = torch.cat((-xr[..., half:], xr[..., :half]), dim=-1)
    out = xr * cos[:, None, :] + rotated * sin[:, None, :]
    return torch.cat((out, xp), dim=-1)
