"""Attention over the KV cache: a row-invariant decode/verify kernel and a fast prefill one.

Cache layout per layer: k, v [kv_heads, max_len, head_dim]. Row m of a forward that
starts at position `start` attends to positions 0..start+m.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def attend_rows(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, start: int, scale: float) -> torch.Tensor:
    """Row-invariant attention. q [rows, heads, hd] -> [rows, heads, hd].

    Each row runs on its own with the shapes a 1-row decode step at that position
    uses, so its bits cannot depend on the other rows (SDPA's do: ENV-NOTES.md).
    """
    rows, heads, hd = q.shape
    kv_heads = k_cache.shape[0]
    group = heads // kv_heads
    out = torch.empty_like(q)
    for m in range(rows):
        n = start + m + 1
        qm = q[m].view(kv_heads, group, hd)                          # [kvh, g, hd]
        scores = torch.bmm(qm, k_cache[:, :n, :].transpose(1, 2))   # [kvh, g, n]
        probs = torch.softmax(scores.float() * scale, dim=-1).to(v_cache.dtype)
        out[m] = torch.bmm(probs, v_cache[:, :n, :]).view(heads, hd)
    return out


def attend_prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, start: int, scale: float) -> torch.Tensor:
    """Batched causal attention for a prompt chunk (SDPA; not row-invariant)."""
    rows, heads, hd = q.shape
    kv_heads = k_cache.shape[0]
    n = start + rows
    k = k_cache[:, :n, :].repeat_interleave(heads // kv_heads, dim=0)   # [heads, n, hd]
    v = v_cache[:, :n, :].repeat_interleave(heads // kv_heads, dim=0)
    q, k, v = q.transpose(0, 1)[None], k[None], v[None]
    # query row m sees keys 0..start+m. torch.nn.attention.bias's causal_lower_right says so and lets
    # SDPA take its flash kernels on CUDA (with a dense mask it ran its fp32 math path there, ~9 ms a
    # layer for 4096 rows: bench/prefill_profile.py, device call 154). Off CUDA, and for a square
    # block anywhere, the bias dispatches exactly the calls below; importing it imports torch._dynamo,
    # ~1.4 s of every CLI start, so only CUDA pays that.
    if start == 0:
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    elif q.is_cuda:
        from torch.nn.attention.bias import causal_lower_right
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(rows, n), scale=scale)
    else:
        seen = torch.ones(rows, n, dtype=torch.bool, device=q.device).tril(start)      # [rows, n]
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=seen, scale=scale)
    return o[0].transpose(0, 1)


def append_and_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                      v_cache: torch.Tensor, start: int, scale: float, exact: bool) -> torch.Tensor:
    """Write k, v [rows, kv_heads, hd] at the cache's positions start.. and attend with q
    [rows, heads, hd]: row-invariant (attend_rows) where exact, else batched SDPA."""
    rows = k.shape[0]
    k_cache[:, start:start + rows] = k.transpose(0, 1)
    v_cache[:, start:start + rows] = v.transpose(0, 1)
    return (attend_rows if exact else attend_prefill)(q, k_cache, v_cache, start, scale)


def attend_static(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, pos: torch.Tensor, scale: float,
                  n_rows: int) -> torch.Tensor:
    """Row-invariant attention with shapes that never change (the GPU path; CUDA graphs).

    q [rows, heads, hd]; pos [rows] absolute positions on q's device. The rows are padded to
    n_rows and every row attends over the whole cache with the keys after its position masked
    out, so one launch of fixed shape serves every row count and every position: a masked key
    adds exactly zero, and row i's scores and sums involve row i alone."""
    rows, heads, hd = q.shape
    kvh, length, _ = k_cache.shape
    g = heads // kvh
    if rows < n_rows:
        q = torch.cat([q, q.new_zeros(n_rows - rows, heads, hd)])
        pos = torch.cat([pos, pos[-1:].expand(n_rows - rows)])
    qg = q.view(n_rows, kvh, g, hd).permute(1, 0, 2, 3).reshape(kvh, n_rows * g, hd)
    scores = torch.bmm(qg, k_cache.transpose(1, 2)).float() * scale              # [kvh, n*g, L]
    masked = torch.arange(length, device=q.device)[None, :] > pos[:, None]        # [n, L]
    masked = masked[:, None, :].expand(n_rows, g, length).reshape(1, n_rows * g, length)
    probs = torch.softmax(scores.masked_fill(masked, float("-inf")), dim=-1).to(v_cache.dtype)
    out = torch.bmm(probs, v_cache)                                               # [kvh, n*g, hd]
    return out.view(kvh, n_rows, g, hd).permute(1, 0, 2, 3).reshape(n_rows, heads, hd)[:rows]
