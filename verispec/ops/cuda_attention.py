"""Gated attention for decode/verify rows on the GPU: three Triton launches instead of ~20.

`prep`: one program per (row, head) of q and per (row, kv head): the zero-centred RMSNorm of
the head, partial RoPE at the row's position (read on the device), q written for `attend`,
k and v written straight into the cache at the row's position.

`attend`: programs (row, head, g) for g < G walk every G-th block of the cache from position 0
to the row's own position, each with an online softmax in fp32; `merge` combines the G parts
in g order and writes o * sigmoid(gate) (rounded as torch rounds the attention output, the
sigmoid and their product). Splitting a head over G programs makes the walk G times shorter
(one block, not four, at a 64-token context: the walk's latency was the kernel's time). Row r
reads only its own q, gate and position and the cache up to that position (rows of the same
verify before it were written by `prep`, a launch earlier), in a fixed order with fixed G and
block: its bits cannot depend on how many rows share the launch, and the work stops at the
row's position instead of the cache's end.
"""

from __future__ import annotations

import torch

from . import cuda_launch

try:
    import triton
    import triton.language as tl
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover
    triton = None

enabled = True
ATTEND = (16, 16, 2)   # (positions per block, programs per head, warps); bench/cuda_small_sweep.py

if triton is not None:
    @triton.jit
    def _prep(proj_ptr, proj_stride, qn_ptr, kn_ptr, cos_ptr, sin_ptr, pos_ptr, q_ptr, kc_ptr, vc_ptr, eps,
              NH: tl.constexpr, NKV: tl.constexpr, HD: tl.constexpr, ROT: tl.constexpr, L: tl.constexpr, PDL: tl.constexpr):
        if PDL:   # verispec/ops/cuda_launch.py: nothing is touched before the previous kernel is done
            gdc_wait()
            gdc_launch_dependents()
        r = tl.program_id(0)
        j = tl.program_id(1)                  # 0..NH-1: q heads; NH..NH+NKV-1: kv heads
        is_q = j < NH
        kv = j - NH
        d = tl.arange(0, HD)
        p = tl.load(pos_ptr + r)
        row = proj_ptr + r * proj_stride
        base = tl.where(is_q, j * 2 * HD, 2 * NH * HD + kv * HD)
        half = ROT // 2
        rot = d < ROT
        partner = tl.where(d < half, d + half, d - half)   # rotate_half's partner of each rotated dim
        x = tl.load(row + base + d).to(tl.float32)
        xp = tl.load(row + base + partner, mask=rot, other=0.0).to(tl.float32)
        w = tl.where(is_q, tl.load(qn_ptr + d), tl.load(kn_ptr + d)).to(tl.float32)
        wp = tl.where(is_q, tl.load(qn_ptr + partner, mask=rot, other=0.0),
                      tl.load(kn_ptr + partner, mask=rot, other=0.0)).to(tl.float32)
        inv = tl.math.rsqrt(tl.sum(x * x, axis=0) / HD + eps)
        y = (x * inv * (1.0 + w)).to(q_ptr.dtype.element_ty).to(tl.float32)     # the norm's output dtype
        yp = (xp * inv * (1.0 + wp)).to(q_ptr.dtype.element_ty).to(tl.float32)
        c = tl.load(cos_ptr + p * ROT + d, mask=rot, other=1.0).to(q_ptr.dtype.element_ty).to(tl.float32)
        sn = tl.load(sin_ptr + p * ROT + d, mask=rot, other=0.0).to(q_ptr.dtype.element_ty).to(tl.float32)
        sign = tl.where(d < half, -1.0, 1.0)
        out = tl.where(rot, y * c + sign * yp * sn, y).to(q_ptr.dtype.element_ty)
        if is_q:
            tl.store(q_ptr + (r * NH + j) * HD + d, out)
        else:
            tl.store(kc_ptr + (kv * L + p) * HD + d, out)
            tl.store(vc_ptr + (kv * L + p) * HD + d, tl.load(row + 2 * NH * HD + NKV * HD + kv * HD + d))

    @triton.jit
    def _attend(q_ptr, kc_ptr, vc_ptr, pos_ptr, m_ptr, l_ptr, acc_ptr, scale, NH: tl.constexpr, NKV: tl.constexpr,
                HD: tl.constexpr, L: tl.constexpr, BLOCK_L: tl.constexpr, G: tl.constexpr, PDL: tl.constexpr,
                EARLY: tl.constexpr = False):
        """Program (r, h, g): the cache blocks g, g + G, g + 2G, ... up to row r's position, with
        an online softmax in fp32; writes its running max, sum and weighted values."""
        cuda_launch.enter(PDL, EARLY)   # nothing is touched before the previous kernel is done
        r = tl.program_id(0)
        h = tl.program_id(1)
        g = tl.program_id(2)
        kv = h // (NH // NKV)
        d = tl.arange(0, HD)
        p = tl.load(pos_ptr + r)
        q = tl.load(q_ptr + (r * NH + h) * HD + d).to(tl.float32)
        m = tl.full([1], float("-inf"), dtype=tl.float32)
        l = tl.zeros([1], dtype=tl.float32)
        acc = tl.zeros([HD], dtype=tl.float32)
        for blk in range(g, p // BLOCK_L + 1, G):
            offs = blk * BLOCK_L + tl.arange(0, BLOCK_L)
            ok = offs <= p
            k = tl.load(kc_ptr + (kv * L + offs[:, None]) * HD + d[None, :], mask=ok[:, None], other=0.0)
            v = tl.load(vc_ptr + (kv * L + offs[:, None]) * HD + d[None, :], mask=ok[:, None], other=0.0)
            sc = tl.sum(k.to(tl.float32) * q[None, :], axis=1) * scale
            sc = tl.where(ok, sc, float("-inf"))
            m_new = tl.maximum(m, tl.max(sc, axis=0))
            alpha = tl.exp(m - m_new)
            e = tl.exp(sc - m_new)
            acc = acc * alpha + tl.sum(e[:, None] * v.to(tl.float32), axis=0)
            l = l * alpha + tl.sum(e, axis=0)
            m = m_new
        cell = (r * NH + h) * G + g
        tl.store(m_ptr + cell + tl.arange(0, 1), m)
        tl.store(l_ptr + cell + tl.arange(0, 1), l)
        tl.store(acc_ptr + cell * HD + d, acc)

    @triton.jit
    def _attend_merge(m_ptr, l_ptr, acc_ptr, proj_ptr, proj_stride, o_ptr, NH: tl.constexpr, HD: tl.constexpr,
                      G: tl.constexpr, PDL: tl.constexpr, EARLY: tl.constexpr = False):
        """Program (r, h): the G partial softmaxes of `_attend` merged in g order, then o *
        sigmoid(gate), rounded as torch rounds the attention output, the sigmoid and their
        product. A part that saw no position (m = -inf, l = 0) adds nothing."""
        cuda_launch.enter(PDL, EARLY)   # nothing is touched before the previous kernel is done
        r = tl.program_id(0)
        h = tl.program_id(1)
        d = tl.arange(0, HD)
        gs = tl.arange(0, G)
        cell = (r * NH + h) * G
        ms = tl.load(m_ptr + cell + gs)
        big = tl.max(ms, axis=0)
        ws = tl.where(ms > float("-inf"), tl.exp(ms - big), 0.0)
        total = tl.sum(ws * tl.load(l_ptr + cell + gs), axis=0)
        acc = tl.zeros([HD], dtype=tl.float32)
        for j in tl.static_range(G):       # g order, fixed
            wj = tl.sum(tl.where(gs == j, ws, 0.0), axis=0)
            acc += wj * tl.load(acc_ptr + (cell + j) * HD + d)
        o = (acc / total).to(o_ptr.dtype.element_ty).to(tl.float32)
        gt = tl.load(proj_ptr + r * proj_stride + h * 2 * HD + HD + d).to(tl.float32)
        sg = tl.sigmoid(gt).to(o_ptr.dtype.element_ty).to(tl.float32)
        tl.store(o_ptr + r * NH * HD + h * HD + d, (o * sg).to(o_ptr.dtype.element_ty))


def usable(x: torch.Tensor) -> bool:
    return enabled and triton is not None and x.is_cuda


def gated_attention(proj: torch.Tensor, q_norm: torch.Tensor, k_norm: torch.Tensor, cos: torch.Tensor,
                    sin: torch.Tensor, pos: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, nh: int, eps: float,
                    block_l: int | None = None, parts: int | None = None) -> torch.Tensor:
    """proj [rows, q|gate per head (2*hd each) | k (nkv*hd) | v (nkv*hd)]; cos/sin [positions, rot]
    fp32 tables; pos [rows] (device); kc, vc [nkv, L, hd] (written at pos) -> [rows, nh*hd]
    = attention * sigmoid(gate), in proj's dtype. Each (row, head) is split over `parts`
    programs taking every parts-th block of block_l positions (fixed: never by row count or
    cache size), merged in a fixed order by a third launch."""
    rows = proj.shape[0]
    nkv, length, hd = kc.shape
    rot = cos.shape[1]
    block_l, parts, warps = block_l or ATTEND[0], parts or ATTEND[1], ATTEND[2]
    if proj.stride(1) != 1 or not (kc.is_contiguous() and vc.is_contiguous()):
        raise ValueError("gated_attention needs unit-stride projections and contiguous caches")
    q = torch.empty(rows, nh, hd, dtype=proj.dtype, device=proj.device)
    _prep[(rows, nh + nkv)](proj, proj.stride(0), q_norm, k_norm, cos, sin, pos, q, kc, vc, eps, NH=nh, NKV=nkv,
                            HD=hd, ROT=rot, L=length, num_warps=4, **cuda_launch.flags(proj.device))
    m = torch.empty(rows, nh, parts, dtype=torch.float32, device=proj.device)
    lsum = torch.empty(rows, nh, parts, dtype=torch.float32, device=proj.device)
    acc = torch.empty(rows, nh, parts, hd, dtype=torch.float32, device=proj.device)
    _attend[(rows, nh, parts)](q, kc, vc, pos, m, lsum, acc, hd ** -0.5, NH=nh, NKV=nkv, HD=hd, L=length,
                               BLOCK_L=block_l, G=parts, num_warps=warps, **cuda_launch.flags(q.device, early="link"))
    o = torch.empty(rows, nh * hd, dtype=proj.dtype, device=proj.device)
    _attend_merge[(rows, nh)](m, lsum, acc, proj, proj.stride(0), o, NH=nh, HD=hd, G=parts, num_warps=4,
                              **cuda_launch.flags(q.device, early=True))
    return o
