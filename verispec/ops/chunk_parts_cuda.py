"""The state-free parts of every chunk (chunk_delta.chunk_parts) in one Triton launch.

chunk_parts is ~45 torch operations a DeltaNet layer (pads, cumsums, masks, two products, a batched
triangular solve, the scalings). Here one program takes one (value head, chunk) and writes the same
six tensors: at 1024 rows and the 35B-A3B widths 0.303 ms a layer against the torch parts' 0.556 ms,
graphed, and the prompt's forward 1.12x faster graphed at 1024 rows and 1.14-1.15x at 2048, graphed
or eager (H100, device call 189; docs/cuda.md "The chunks' parts in one launch").

Its own order of sums: the triangular solve is a forward substitution for (I + A)^-1 row by row in
fp32, then (I + A)^-1 times the right-hand sides by tl.dot in tf32x3 (three TF32 products,
fp32-close, as the chain of chunks does); so the bits differ from the torch parts' (each part as
close to fp64 as theirs within 2x: tests/test_cuda_chunk_parts.py) but not from one run to the
next. Prefill only, as the chunks are.

chunk_parts_raw takes the parts' inputs as the model has them (the conv's output, the input product's
b and a columns) and makes them ready in the same launch: the q, k L2 norms, the repeat of the key
heads to the value heads, beta = sigmoid(b) and g = -exp(A_log) softplus(a + dt_bias), as delta_steps
does them; ~20 torch operations a DeltaNet layer fewer, which matters most where the forward is queued
op by op (a bucket's first run, every `verispec run` prompt: prompt_graphs.py). At 2048 rows the
prompt's forward 1.073x faster graphed and 1.079x on a bucket's first run (H100, device call 203).
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - the CPU machine has no triton
    triton = None

enabled = True     # bench/prefill_rows.py's `_torch` arms switch it off to time the torch parts
raw = True         # the parts from the conv's output (chunk_parts_raw); its `_split` arms switch it off
PREC, WARPS = "tf32x3", 8

if triton is not None:
    @triton.jit
    def _parts(q_ptr, k_ptr, v_ptr, g_ptr, b_ptr, alog_ptr, dtb_ptr, sqh, sqp, sqd, skh, skp, skd, svh, svp, svd,
               sgh, sgp, sbh, sbp, kc_ptr, w_ptr, qg_ptr, p_ptr, kd_ptr, dec_ptr, P, N,
               C: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, PREC: tl.constexpr, REP: tl.constexpr,
               RAW: tl.constexpr, SCALE: tl.constexpr, EPS: tl.constexpr):
        """Program (h, i): value head h's chunk i. q, k [Hk, P, DK] (key head h // REP), v [Hv, P, DV],
        g, beta [Hv, P], by their strides; rows past P read as zero (no delta, no decay). RAW: q, k, v
        are the conv's outputs (any float dtype), q, k L2-normed here (q scaled by SCALE), g_ptr and
        b_ptr the input product's a and b columns, turned into g and beta as delta_steps does;
        else all are fp32 and prepared (deltanet.prepare). Writes kc, qg, kd [Hv, N, C, DK],
        w [Hv, N, C, DV], p [Hv, N, C, C], dec [Hv, N]."""
        h = tl.program_id(0).to(tl.int64)
        kh = h // REP
        i = tl.program_id(1)
        rc = tl.arange(0, C)
        rows = i * C + rc
        live = rows < P
        rk = tl.arange(0, DK)
        rv = tl.arange(0, DV)
        if RAW:
            ar = tl.load(g_ptr + h * sgh + rows * sgp, mask=live, other=0.0).to(tl.float32) + \
                tl.load(dtb_ptr + h).to(tl.float32)
            g = tl.where(live, -tl.load(alog_ptr + h) * tl.where(ar > 20.0, ar, tl.log(1.0 + tl.exp(ar))), 0.0)
            b = tl.load(b_ptr + h * sbh + rows * sbp, mask=live, other=0.0)
            beta = tl.where(live, tl.sigmoid(b.to(tl.float32)).to(b.dtype).to(tl.float32), 0.0)
        else:
            g = tl.load(g_ptr + h * sgh + rows * sgp, mask=live, other=0.0)            # [C]
            beta = tl.load(b_ptr + h * sbh + rows * sbp, mask=live, other=0.0)
        k = tl.load(k_ptr + kh * skh + rows[:, None] * skp + rk[None, :] * skd, mask=live[:, None],
                    other=0.0).to(tl.float32)                                        # [C, DK]
        if RAW:
            k = k * tl.rsqrt(tl.sum(k * k, 1) + EPS)[:, None]
        cum = tl.cumsum(g, 0)                                                        # G_t
        lower = rc[:, None] >= rc[None, :]                                           # s <= t
        decay = tl.where(lower, tl.exp(tl.where(lower, cum[:, None] - cum[None, :], 0.0)), 0.0)
        kk = tl.dot(k, tl.trans(k), input_precision=PREC)
        a = tl.where(rc[:, None] > rc[None, :], beta[:, None] * decay * kk, 0.0)   # strictly lower
        base = (h * N + i).to(tl.int64)
        # (I + A)^-1 row by row, T[t] = e_t - sum_{s<t} A[t, s] T[s]: A through p's block (p overwrites it
        # below), read back a row at a time; T held transposed, tt[j, s] = T[s, j], so each step sums along
        # a row of the tile rather than across warps (as fast as the masked sums over registers that it
        # replaced, device call 189, and closer to fp64 in the correlated case)
        pa = p_ptr + base * C * C
        tl.store(pa + rc[:, None] * C + rc[None, :], a)
        tl.debug_barrier()
        tt = tl.where(rc[:, None] == rc[None, :], 1.0, 0.0)
        for t in range(1, C):
            a_t = tl.load(pa + t * C + rc)                                           # A[t, :] [C]
            contrib = tl.sum(tt * a_t[None, :], 1)                                   # [C]
            tt = tl.where(rc[None, :] == t, tt - contrib[:, None], tt)
        tl.debug_barrier()
        t_inv = tl.trans(tt)
        last = tl.sum(tl.where(rc == C - 1, cum, 0.0), 0)                            # G_C
        eg = tl.exp(cum)
        kc = tl.dot(t_inv, (beta * eg)[:, None] * k, input_precision=PREC)
        tl.store(kc_ptr + base * C * DK + rc[:, None] * DK + rk[None, :], kc)
        tl.store(kd_ptr + base * C * DK + rc[:, None] * DK + rk[None, :], tl.exp(last - cum)[:, None] * k)
        v = tl.load(v_ptr + h * svh + rows[:, None] * svp + rv[None, :] * svd, mask=live[:, None],
                    other=0.0).to(tl.float32)                                        # [C, DV]
        w = tl.dot(t_inv, beta[:, None] * v, input_precision=PREC)
        tl.store(w_ptr + base * C * DV + rc[:, None] * DV + rv[None, :], w)
        q = tl.load(q_ptr + kh * sqh + rows[:, None] * sqp + rk[None, :] * sqd, mask=live[:, None],
                    other=0.0).to(tl.float32)
        if RAW:
            q = q * tl.rsqrt(tl.sum(q * q, 1) + EPS)[:, None] * SCALE
        tl.store(qg_ptr + base * C * DK + rc[:, None] * DK + rk[None, :], eg[:, None] * q)
        p = decay * tl.dot(q, tl.trans(k), input_precision=PREC)
        tl.store(p_ptr + base * C * C + rc[:, None] * C + rc[None, :], p)
        tl.store(dec_ptr + base, tl.exp(last))


def _pow2(*widths: int) -> bool:
    return all(16 <= n <= 128 and n & (n - 1) == 0 for n in widths)


def usable(q: torch.Tensor, v: torch.Tensor, c: int) -> bool:
    """The kernel takes these: CUDA, fp32, power-of-two widths of 16 to 128 and chunk."""
    return (triton is not None and q.is_cuda and q.dtype == v.dtype == torch.float32
            and _pow2(q.shape[-1], v.shape[-1], c))


def usable_raw(mixed: torch.Tensor, dk: int, dv: int, c: int) -> bool:
    """chunk_parts_raw takes these: CUDA, on, power-of-two widths of 16 to 128 and chunk."""
    return triton is not None and enabled and raw and mixed.is_cuda and _pow2(dk, dv, c)


def _empty_parts(hv: int, rows: int, dk: int, dv: int, c: int, dev: torch.device):
    n = -(-rows // c)
    kc, qg, kd = (torch.empty(hv, n, c, dk, dtype=torch.float32, device=dev) for _ in range(3))
    w = torch.empty(hv, n, c, dv, dtype=torch.float32, device=dev)
    p = torch.empty(hv, n, c, c, dtype=torch.float32, device=dev)
    dec = torch.empty(hv, n, dtype=torch.float32, device=dev)
    return n, (kc, w, qg, p, kd, dec)


def chunk_parts(q, k, v, g, beta, c: int):
    """chunk_delta.chunk_parts's inputs (q, k [Hv, P, dk], v [Hv, P, dv], g, beta [Hv, P] fp32, any
    strides: the model's v has its rows, not its columns, adjacent) and results (kc, w, qg, p, kd
    [Hv, N, c, *] and dec [Hv, N]), in one launch."""
    hv, rows, dk = q.shape
    dv = v.shape[-1]
    n, out = _empty_parts(hv, rows, dk, dv, c, q.device)
    _parts[(hv, n)](q, k, v, g, beta, g, g, *q.stride(), *k.stride(), *v.stride(), *g.stride(), *beta.stride(),
                    *out, rows, n, C=c, DK=dk, DV=dv, PREC=PREC, REP=1, RAW=False, SCALE=1.0, EPS=0.0,
                    num_warps=WARPS)
    return out


def chunk_parts_raw(mixed, ba, a_log_exp, dt_bias, hk: int, dk: int, dv: int, c: int, eps: float = 1e-6):
    """The same parts straight from the DeltaNet's conv output mixed [P, q|k|v: 2 Hk dk + Hv dv] and
    the input product's b|a columns ba [P, 2 Hv] (any strides and float dtype), with a_log_exp,
    dt_bias [Hv]: deltanet.prepare's norms, repeat and casts and the model's beta = sigmoid(b),
    g = -exp(A_log) softplus(a + dt_bias) done inside the launch instead of ~20 torch operations."""
    rows = mixed.shape[0]
    hv = ba.shape[1] // 2
    n, out = _empty_parts(hv, rows, dk, dv, c, mixed.device)
    sp, sd = mixed.stride()
    kd = hk * dk
    _parts[(hv, n)](mixed, mixed[:, kd:], mixed[:, 2 * kd:], ba[:, hv:], ba, a_log_exp, dt_bias,
                    dk * sd, sp, sd, dk * sd, sp, sd, dv * sd, sp, sd, *ba.stride()[::-1], *ba.stride()[::-1],
                    *out, rows, n, C=c, DK=dk, DV=dv, PREC=PREC, REP=hv // hk, RAW=True, SCALE=dk ** -0.5,
                    EPS=eps, num_warps=WARPS)
    return out
