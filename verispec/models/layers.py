"""Shared blocks of the Qwen3-Next family: norms, partial RoPE tables, SwiGLU.

How the decode/verify path keeps every row's bits independent of the row count is a
`Rows` policy, picked per device:

* `ROWWISE` (the CPU): transcendental elementwise ops (silu, sigmoid, softplus, exp) are NOT
  row-invariant in torch on this CPU -- the vectorized main loop and the scalar tail round
  differently, so where an element lands depends on the tensor's size (measured: sigmoid
  differs at 4 rows, softplus at 8) -- so they run one row at a time; reductions along one
  row are invariant there and run batched.
* `Padded(n)` (CUDA): a kernel's launch shape picks its algorithm (a reduction over 2048
  values splits across threads by how many rows share the launch). On CUDA the heavy ops are
  fixed-order Triton kernels that compute each row alone (docs/cuda.md); every torch op
  left on the decode/verify path runs on exactly n rows (the rows copied into an n-row
  buffer, the result sliced), so row i goes through the very instructions it would go
  through in any other call.
* `BATCH`: prefill; no promise.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..ops import cuda_norms


class Rows:
    """A row policy: `elementwise` wraps transcendental elementwise ops, `reduce` wraps
    reductions along the last dimension (norms, the router's softmax/top-k)."""

    kind = "batch"

    def elementwise(self, fn, *xs):
        return fn(*xs)

    def reduce(self, fn, *xs):
        return fn(*xs)

    def __repr__(self) -> str:
        return self.kind


class _RowWise(Rows):
    kind = "rowwise"

    def elementwise(self, fn, *xs):
        rows = xs[0].shape[0]
        if rows == 1:
            return fn(*xs)
        return torch.cat([fn(*(x[i:i + 1] for x in xs)) for i in range(rows)])


class Padded(Rows):
    def __init__(self, n: int):
        self.n = n
        self.kind = f"padded({n})"

    def elementwise(self, fn, *xs):
        return self.reduce(fn, *xs)

    def reduce(self, fn, *xs):
        rows = xs[0].shape[0]
        if rows > self.n:
            raise ValueError(f"{rows} rows on a path padded to {self.n}")
        if rows < self.n:
            # rows past `rows` are left as they come (any bits): every op run under this policy
            # computes each row from that row alone, so they cannot reach the rows kept
            padded = []
            for x in xs:
                buf = x.new_empty((self.n,) + tuple(x.shape[1:]))
                buf[:rows].copy_(x)
                padded.append(buf)
            xs = tuple(padded)
        out = fn(*xs)
        if isinstance(out, tuple):
            return tuple(o[:rows] for o in out)
        return out[:rows]


BATCH = Rows()
ROWWISE = _RowWise()


def policy(exact) -> Rows:
    """Callers pass a Rows policy, or the older bool (True: ROWWISE, False: BATCH)."""
    if isinstance(exact, Rows):
        return exact
    return ROWWISE if exact else BATCH


def rowwise(fn, *xs: torch.Tensor, exact=True) -> torch.Tensor:
    """fn(*xs) under the row policy `exact` (True: one row at a time)."""
    return policy(exact).elementwise(fn, *xs)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * (1.0 + weight.float())).to(x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, rows=False) -> torch.Tensor:
    """Zero-centred RMSNorm: x / rms(x) * (1 + w), in fp32 (Qwen3NextRMSNorm)."""
    if cuda_norms.usable(x):      # one program per row: invariant without padding
        return cuda_norms.row_norm(x, cuda_norms.ZC, eps, weight)
    return policy(rows).reduce(lambda t: _rms_norm(t, weight, eps), x)


def add_norm(x: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, eps: float, rows=False):
    """(x + h, rms_norm(x + h)): the residual add and the next norm, one launch on the GPU."""
    if cuda_norms.usable(x):
        return cuda_norms.add_row_norm(x, h, weight, eps)
    x = x + h
    return x, rms_norm(x, weight, eps, rows)


def _gated_rms_norm(x, gate, weight, eps, rp: Rows):
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    y = weight * y.to(x.dtype)
    return (y * rp.elementwise(F.silu, gate.float())).to(x.dtype)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float,
                   exact=True) -> torch.Tensor:
    """DeltaNet output norm: plain-weight RMSNorm, then times silu(gate)."""
    rp = policy(exact)
    if cuda_norms.usable(x):
        return cuda_norms.row_norm(x, cuda_norms.GATED, eps, weight, gate)
    if isinstance(rp, Padded):
        return rp.reduce(lambda a, b: _gated_rms_norm(a, b, weight, eps, BATCH), x, gate)
    return _gated_rms_norm(x, gate, weight, eps, rp)


def l2_norm(x: torch.Tensor, eps: float = 1e-6, rows=False) -> torch.Tensor:
    if cuda_norms.usable(x):
        return cuda_norms.row_norm(x, cuda_norms.L2, eps)
    return policy(rows).reduce(lambda t: t * torch.rsqrt((t * t).sum(dim=-1, keepdim=True) + eps), x)


def silu_mul(gate: torch.Tensor, up: torch.Tensor, exact=True) -> torch.Tensor:
    return rowwise(F.silu, gate, exact=exact) * up


class RopeTable:
    """cos/sin rows per absolute position for the rotated part of a head (partial RoPE).

    Rows are computed on demand in blocks and cached; each entry depends only on its
    position, so a verify row and a decode step at the same position get equal bits.
    """

    def __init__(self, head_dim: int, partial: float, theta: float, device=None):
        self.device = torch.device(device or "cpu")
        self.rot = int(head_dim * partial)
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, self.rot, 2, dtype=torch.float) / self.rot))
        self.cos = torch.empty(0, self.rot)
        self.sin = torch.empty(0, self.rot)
        # tables replaced by a larger one stay alive: a CUDA graph captured over one keeps reading
        # its addresses, and its rows stay right (a row depends on its position alone)
        self.retired: list[torch.Tensor] = []

    def _grow(self, n: int) -> None:
        n = max(n, 2 * self.cos.shape[0], 256)
        pos = torch.arange(n, dtype=torch.float)
        freqs = pos[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        if self.cos.numel():
            self.retired += [self.cos, self.sin]
        self.cos, self.sin = emb.cos().to(self.device), emb.sin().to(self.device)

    def ensure(self, limit: int) -> None:
        """Grow the table to at least `limit` positions (before a CUDA graph captures it)."""
        if limit > self.cos.shape[0]:
            self._grow(limit)

    def at(self, pos: torch.Tensor, limit: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows for positions held in a device tensor (no host read: CUDA graphs); the table
        is grown to `limit` positions first."""
        if limit > self.cos.shape[0]:
            self._grow(limit)
        return self.cos[pos], self.sin[pos]

    def get(self, start: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        if start + n > self.cos.shape[0]:
            self._grow(start + n)
        return self.cos[start:start + n], self.sin[start:start + n]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [rows, heads, head_dim]; cos/sin [rows, rot]. Rotates the first `rot` dims (rotate_half)."""
    rot = cos.shape[-1]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)    # as transformers: rotate in the activations' dtype
    xr, xp = x[..., :rot], x[..., rot:]
    half = rot // 2
    rotated = torch.cat((-xr[..., half:], xr[..., :half]), dim=-1)
    out = xr * cos[:, None, :] + rotated * sin[:, None, :]
    return torch.cat((out, xp), dim=-1)
