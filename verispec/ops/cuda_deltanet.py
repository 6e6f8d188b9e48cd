"""The causal conv and the gated delta rule on the GPU.

In torch a row of the recurrence is about ten kernels per layer and the conv about nine;
a verify of 5 rows through 30 DeltaNet layers is then ~3000 launches for these two alone.
Each kernel here does a row's whole step (the conv and the plain delta rule one launch per
row; `delta_steps` every row of a forward in one launch, in order) and writes the state after
it straight into the row's copy slot when asked. It is the same compiled code for every row
of every forward (the row count is a loop bound, never a specialised constant), so a row's
bits cannot depend on how many rows the forward carries.

  conv:   out = silu(sum_j ring[:, j] * w[:, j] + x * w[:, K-1]); ring <- (ring[:, 1:], x)
  delta:  S *= exp(g); kv = S^T k; S += k (beta (v - kv))^T; o = S^T q      (per value head)
  steps:  the delta rule with its inputs made in the same launch (q, k L2 norms, beta, g), for
          every row of a forward in order, the state in registers from row to row
"""

from __future__ import annotations

import torch

from . import cuda_launch, cuda_recurrence

try:
    import triton
    import triton.language as tl
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover
    triton = None

enabled = True
STEPS = (16, 2)   # delta_steps: (value columns per program, warps); bench/cuda_small_sweep.py

if triton is not None:
    @triton.jit
    def _conv_row(x_ptr, ring_ptr, w_ptr, out_ptr, slot_ptr, C: tl.constexpr, K: tl.constexpr,
                  BLOCK: tl.constexpr, SAVE: tl.constexpr, PDL: tl.constexpr):
        if PDL:   # verispec/ops/cuda_launch.py: nothing is touched before the previous kernel is done
            gdc_wait()
            gdc_launch_dependents()
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < C
        x = tl.load(x_ptr + offs, mask=m, other=0.0)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for j in tl.static_range(0, K - 1):
            r = tl.load(ring_ptr + offs * (K - 1) + j, mask=m, other=0.0).to(tl.float32)
            acc += r * tl.load(w_ptr + offs * K + j, mask=m, other=0.0).to(tl.float32)
        acc += x.to(tl.float32) * tl.load(w_ptr + offs * K + (K - 1), mask=m, other=0.0).to(tl.float32)
        tl.store(out_ptr + offs, (acc * tl.sigmoid(acc)).to(out_ptr.dtype.element_ty), mask=m)
        # shift the ring by one column: column j+1 is read before it is overwritten (each
        # element is read and written by the same thread, in program order)
        for j in tl.static_range(0, K - 2):
            col = tl.load(ring_ptr + offs * (K - 1) + j + 1, mask=m, other=0.0)
            tl.store(ring_ptr + offs * (K - 1) + j, col, mask=m)
            if SAVE:
                tl.store(slot_ptr + offs * (K - 1) + j, col, mask=m)
        tl.store(ring_ptr + offs * (K - 1) + (K - 2), x, mask=m)
        if SAVE:
            tl.store(slot_ptr + offs * (K - 1) + (K - 2), x, mask=m)

    @triton.jit
    def _delta_row(q_ptr, k_ptr, v_ptr, g_ptr, b_ptr, s_ptr, o_ptr, slot_ptr, HV: tl.constexpr,
                   DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr, SAVE: tl.constexpr, PDL: tl.constexpr):
        if PDL:   # verispec/ops/cuda_launch.py: nothing is touched before the previous kernel is done
            gdc_wait()
            gdc_launch_dependents()
        h = tl.program_id(0)
        vb = tl.program_id(1)
        offs_k = tl.arange(0, DK)
        offs_v = vb * BV + tl.arange(0, BV)
        cell = h * DK * DV + offs_k[:, None] * DV + offs_v[None, :]
        st = tl.load(s_ptr + cell)                                     # [DK, BV] fp32
        kk = tl.load(k_ptr + h * DK + offs_k)
        qq = tl.load(q_ptr + h * DK + offs_k)
        vv = tl.load(v_ptr + h * DV + offs_v)
        st = st * tl.exp(tl.load(g_ptr + h))
        kv = tl.sum(st * kk[:, None], axis=0)                          # [BV]
        delta = (vv - kv) * tl.load(b_ptr + h)
        st = st + kk[:, None] * delta[None, :]
        tl.store(o_ptr + h * DV + offs_v, tl.sum(st * qq[:, None], axis=0))
        tl.store(s_ptr + cell, st)
        if SAVE:
            tl.store(slot_ptr + cell, st)

    # R unspecialised: Triton compiles a separate kernel for an int argument equal to 1 (or a
    # multiple of 16), and a decode row (R = 1) must run the same code as a verify's rows
    @triton.jit(do_not_specialize=["R"])
    def _delta_steps(mix_ptr, mix_stride, ba_ptr, ba_stride, alog_ptr, dtb_ptr, s_ptr, o_ptr, tab_ptr, R,
                     HV: tl.constexpr, REP: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr,
                     SCALE: tl.constexpr, EPS: tl.constexpr, SAVE: tl.constexpr, PDL: tl.constexpr,
                     EARLY: tl.constexpr = False):
        """_delta_step for rows 0..R-1 in order in one launch: the state block stays in registers
        from row to row (the same fp32 values a launch per row would store and reload), each
        row's output is written, and with SAVE the state after row r < R-1 goes to the slot at
        tab[r]."""
        cuda_launch.enter(PDL, EARLY)   # nothing is touched before the previous kernel is done
        h = tl.program_id(0)
        vb = tl.program_id(1)
        kh = h // REP
        offs_k = tl.arange(0, DK)
        offs_v = vb * BV + tl.arange(0, BV)
        cell = h * DK * DV + offs_k[:, None] * DV + offs_v[None, :]
        st = tl.load(s_ptr + cell)                                     # [DK, BV] fp32
        a_log = tl.load(alog_ptr + h)
        dtb = tl.load(dtb_ptr + h).to(tl.float32)
        for r in range(R):
            row = mix_ptr + r * mix_stride
            qq = tl.load(row + kh * DK + offs_k).to(tl.float32)
            kk = tl.load(row + (HV // REP) * DK + kh * DK + offs_k).to(tl.float32)
            vv = tl.load(row + 2 * (HV // REP) * DK + h * DV + offs_v).to(tl.float32)
            qq = qq * tl.rsqrt(tl.sum(qq * qq, 0) + EPS) * SCALE
            kk = kk * tl.rsqrt(tl.sum(kk * kk, 0) + EPS)
            brow = ba_ptr + r * ba_stride
            beta = tl.sigmoid(tl.load(brow + h).to(tl.float32)).to(brow.dtype.element_ty).to(tl.float32)
            a = tl.load(brow + HV + h).to(tl.float32) + dtb
            g = -a_log * tl.where(a > 20.0, a, tl.log(1.0 + tl.exp(a)))
            st = st * tl.exp(g)
            kv = tl.sum(st * kk[:, None], axis=0)                      # [BV]
            delta = (vv - kv) * beta
            st = st + kk[:, None] * delta[None, :]
            tl.store(o_ptr + (r * HV + h) * DV + offs_v, tl.sum(st * qq[:, None], axis=0).to(o_ptr.dtype.element_ty))
            if SAVE:
                slot = tl.load(tab_ptr + r).to(tl.pointer_type(tl.float32))
                tl.store(slot + cell, st, mask=(offs_k[:, None] >= 0) & (r < R - 1))
        tl.store(s_ptr + cell, st)


def usable(x: torch.Tensor) -> bool:
    return enabled and triton is not None and x.is_cuda


def conv_rows(x: torch.Tensor, ring: torch.Tensor, weight: torch.Tensor, slots: list) -> torch.Tensor:
    """x [rows, C]; ring [C, K-1] (updated in place); weight [C, K]; slots[r]: tensor like ring
    to receive the ring after row r, or None. Returns [rows, C]."""
    rows, c = x.shape
    k = weight.shape[1]
    x = x.contiguous()
    out = torch.empty_like(x)
    block = 1024
    for r in range(rows):
        slot = slots[r] if r < len(slots) else None
        _conv_row[(triton.cdiv(c, block),)](x[r], ring, weight, out[r], slot if slot is not None else ring,
                                            C=c, K=k, BLOCK=block, SAVE=slot is not None, **cuda_launch.flags(x[r].device))
    return out


def delta_rule_rows(q, k, v, g, beta, state, slots: list) -> torch.Tensor:
    """q, k [rows, Hv, dk] fp32 (normalised, scaled, repeated to Hv); v [rows, Hv, dv] fp32;
    g, beta [rows, Hv] fp32; state [Hv, dk, dv] fp32 (in place); slots[r]: tensor like state
    to receive the state after row r, or None. Returns [rows, Hv, dv] fp32."""
    rows, hv, dk = q.shape
    dv = v.shape[2]
    q, k, v, g, beta = (t.contiguous() for t in (q, k, v, g, beta))
    out = torch.empty(rows, hv, dv, dtype=torch.float32, device=v.device)
    bv = min(32, dv)
    for r in range(rows):
        slot = slots[r] if r < len(slots) else None
        _delta_row[(hv, triton.cdiv(dv, bv))](q[r], k[r], v[r], g[r], beta[r], state, out[r],
                                              slot if slot is not None else state,
                                              HV=hv, DK=dk, DV=dv, BV=bv, SAVE=slot is not None, **cuda_launch.flags(q[r].device))
    return out


def delta_steps(mixed: torch.Tensor, ba: torch.Tensor, a_log_exp: torch.Tensor, dt_bias: torch.Tensor,
                state: torch.Tensor, slot_table: torch.Tensor | None, hk: int, dk: int, dv: int, eps: float = 1e-6,
                out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """delta_step_rows in one launch for all rows: mixed [rows, >= 2*hk*dk + Hv*dv] (q|k|v,
    unit stride along features, any row stride); ba [rows, >= 2*Hv] (b | a, any row stride);
    state [Hv, dk, dv] fp32 (in place); slot_table: cuda_slots table (the state after row r <
    rows-1 to its slot) or None. Returns [rows, Hv, dv] in out_dtype."""
    rows = mixed.shape[0]
    hv = state.shape[0]
    if mixed.stride(1) != 1 or ba.stride(1) != 1:
        raise ValueError("q|k|v and b|a need unit stride")
    if cuda_recurrence.fits(mixed, ba, a_log_exp, dt_bias, state, hk, dk, dv, out_dtype):
        return cuda_recurrence.delta_steps(mixed, ba, a_log_exp, dt_bias, state, slot_table, hk, dk, dv, eps)
    out = torch.empty(rows, hv, dv, dtype=out_dtype, device=mixed.device)
    bv, warps = min(STEPS[0], dv), STEPS[1]
    tab = slot_table if slot_table is not None else state
    _delta_steps[(hv, triton.cdiv(dv, bv))](mixed, mixed.stride(0), ba, ba.stride(0), a_log_exp, dt_bias, state, out,
                                           tab, rows, HV=hv, REP=hv // hk, DK=dk, DV=dv, BV=bv, SCALE=dk ** -0.5,
                                           EPS=eps, SAVE=slot_table is not None, num_warps=warps,
                                           **cuda_launch.flags(mixed.device, early="link"))
    return out
