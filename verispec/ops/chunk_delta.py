"""The gated delta rule over a whole prompt in chunks: the batched prefill's recurrence.

Row by row the rule is a chain of P dependent steps (delta_steps: ~1.8 us a row on the H200, half
of a 4096-token prefill; bench/prefill_profile.py). Within a chunk of C rows it unrolls into
products that need no state, so only one step per chunk is left in the chain. Per value head,
with S0 the state at the chunk's start, G_t = g_1 + .. + g_t (log decays, <= 0), rows t, s:

  A[t, s]  = beta_t exp(G_t - G_s) (k_t . k_s)   for s < t, else 0   (strictly lower)
  W        = (I + A)^-1 diag(beta) V                                  [C, Dv]  no state
  Kc       = (I + A)^-1 diag(beta exp(G)) K                           [C, Dk]  no state
  U        = W - Kc S0                        the rows' deltas (what each row adds)
  O        = diag(exp(G)) Q S0 + (Mask(exp(G_t - G_s), s <= t) * Q K^T) U
  S_C      = exp(G_C) S0 + (diag(exp(G_C - G)) K)^T U

which is the row-by-row rule re-associated (tests/test_chunk_delta.py holds it to the row-wise
one in fp64). The state-free parts run batched over every chunk and head (torch; on CUDA in one
Triton launch, chunk_parts_cuda.py, which the model feeds its conv output directly: delta_rule_raw);
the chain of chunks runs in one Triton launch on CUDA (the state in registers; tl.dot in tf32x3, three
TF32 products for each: 1.2e-7 from fp64 where plain TF32 was 8e-4, bench/chunk_delta_probe.py), or as
a torch loop elsewhere (the CPU). Prefill only: the re-association rounds differently from the
row-wise kernels, so these bits are not a decode step's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import chunk_parts_cuda, deltanet

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - the CPU machine has no triton
    triton = None

enabled = True     # benchmarks switch it off to time the row-by-row recurrence in its place
CHUNK = 64
CUDA_FROM = 512    # on CUDA, prompts of fewer rows take delta_steps (one launch). From 512 rows the chunks win
                   # graphed and, with their inputs made ready in the parts' launch, eager too; below it they
                   # lose eager: H200 10762 / 8051 tok/s graphed and 8302 / 7664 eager at 512 rows (chunks /
                   # rows), 3992 / 4324 eager at 256 (device calls 211-212); on an H100 the chunks won at 512 too (calls
                   # 189, 203). One threshold serves both (a prompt's bits must not depend on the captures)
BV, PREC, WARPS = 32, "tf32x3", 4   # the Triton chain: value columns a program, tl.dot's precision, warps

if triton is not None:
    @triton.jit
    def _chunk_chain(kc_ptr, w_ptr, qg_ptr, p_ptr, kd_ptr, dec_ptr, s_ptr, o_ptr, N, P,
                     C: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr,
                     HV: tl.constexpr):
        """One value head's columns vb*BV.. through its N chunks in order. Inputs [HV, N, C, *]
        contiguous fp32; s [HV, DK, DV] fp32 in place; o [P, HV, DV] in its own dtype (rows past P
        are not written)."""
        h = tl.program_id(0)
        vb = tl.program_id(1)
        rc = tl.arange(0, C)
        rk = tl.arange(0, DK)
        rv = vb * BV + tl.arange(0, BV)
        st = tl.load(s_ptr + h * DK * DV + rk[:, None] * DV + rv[None, :])       # [DK, BV]
        for i in range(N):
            base = (h * N + i).to(tl.int64)      # [HV, N, C, DK] passes 2^31 elements past ~500K rows
            kc = tl.load(kc_ptr + base * C * DK + rc[:, None] * DK + rk[None, :])   # [C, DK]
            qg = tl.load(qg_ptr + base * C * DK + rc[:, None] * DK + rk[None, :])
            kd = tl.load(kd_ptr + base * C * DK + rc[:, None] * DK + rk[None, :])
            w = tl.load(w_ptr + base * C * DV + rc[:, None] * DV + rv[None, :])     # [C, BV]
            p = tl.load(p_ptr + base * C * C + rc[:, None] * C + rc[None, :])       # [C, C]
            dec = tl.load(dec_ptr + base)
            u = w - tl.dot(kc, st, input_precision=PREC)
            o = tl.dot(qg, st, input_precision=PREC) + tl.dot(p, u, input_precision=PREC)
            rows = i * C + rc
            tl.store(o_ptr + (rows[:, None].to(tl.int64) * HV + h) * DV + rv[None, :],
                     o.to(o_ptr.dtype.element_ty), mask=rows[:, None] < P)
            st = dec * st + tl.dot(tl.trans(kd), u, input_precision=PREC)
        tl.store(s_ptr + h * DK * DV + rk[:, None] * DV + rv[None, :], st)


def _chunks(x: torch.Tensor, c: int) -> torch.Tensor:
    """[Hv, P, *] -> [Hv, N, c, *], zero rows after the last (a zero row changes nothing: k = v
    = beta = 0 adds no delta, g = 0 no decay)."""
    rows = x.shape[1]
    pad = -rows % c
    if pad:
        x = F.pad(x, (0, 0) * (x.dim() - 2) + (0, pad))
    return x.reshape(x.shape[0], -1, c, *x.shape[2:])


def chunk_parts(q, k, v, g, beta, c: int = CHUNK):
    """The state-free parts of every chunk (module doc): Kc, W, Q~ = diag(exp(G)) Q, P (masked
    Q K^T), Kd = diag(exp(G_C - G)) K [Hv, N, c, *] and exp(G_C) [Hv, N]."""
    q, k, v, g, beta = (_chunks(t, c) for t in (q, k, v, g, beta))
    cum = g.cumsum(-1)                                              # G_t
    diff = cum[..., :, None] - cum[..., None, :]                    # G_t - G_s
    lower = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
    decay = torch.exp(diff.masked_fill(~lower, float("-inf")))     # s <= t, else 0
    kk = k @ k.transpose(-1, -2)
    a = (beta[..., :, None] * decay * kk).tril(-1)
    eye = torch.eye(c, dtype=q.dtype, device=q.device)
    rhs = torch.cat([beta[..., None] * v, (beta * cum.exp())[..., None] * k], -1)
    sol = torch.linalg.solve_triangular(eye + a, rhs, upper=False, unitriangular=True)
    dvv = v.shape[-1]
    w, kc = sol[..., :dvv], sol[..., dvv:]
    qg = cum.exp()[..., None] * q
    p = decay * (q @ k.transpose(-1, -2))
    last = cum[..., -1:]
    kd = torch.exp(last - cum)[..., None] * k
    return (t.contiguous() for t in (kc, w, qg, p, kd, last[..., 0].exp()))


def chain_torch(kc, w, qg, p, kd, dec, state):
    """The chunks in order, in torch; state [Hv, dk, dv] in place -> o [Hv, N, c, dv] (w's dtype)."""
    out = torch.empty_like(w)
    for i in range(w.shape[1]):
        u = w[:, i] - kc[:, i] @ state
        out[:, i] = qg[:, i] @ state + p[:, i] @ u
        state.mul_(dec[:, i, None, None]).add_(kd[:, i].transpose(-1, -2) @ u)
    return out


def chain_triton(kc, w, qg, p, kd, dec, state, bv: int = BV, prec: str = PREC, warps: int = WARPS,
                 rows: int | None = None, out_dtype: torch.dtype = torch.float32):
    """chain_torch on CUDA in one launch, its output written as the model takes it: o [rows, Hv, dv] in
    out_dtype (rows: every chunk's rows unless given)."""
    hv, n, c, dk = kc.shape
    dv = w.shape[-1]
    rows = n * c if rows is None else rows
    out = torch.empty(rows, hv, dv, dtype=out_dtype, device=w.device)
    bv = min(bv, dv)
    _chunk_chain[(hv, triton.cdiv(dv, bv))](kc, w, qg, p, kd, dec, state, out, n, rows, C=c, DK=dk, DV=dv, BV=bv,
                                           PREC=prec, HV=hv, num_warps=warps, num_stages=1)   # pipelined: 256 KiB of smem
    return out


def usable(state: torch.Tensor, dk: int, dv: int) -> bool:
    """The Triton chain: CUDA, a contiguous fp32 state, power-of-two widths of 16 to 128 (tl.dot's
    least; the most its shared memory was measured to hold, call 156)."""
    pow2 = all(16 <= n <= 128 and n & (n - 1) == 0 for n in (dk, dv))
    return (triton is not None and state.is_cuda and state.dtype == torch.float32 and state.is_contiguous()
            and pow2)


def runs(rows: int, state: torch.Tensor) -> bool:
    """Whether a prompt of `rows` rows takes the chunks: on, and on CUDA CUDA_FROM rows or more."""
    return enabled and (not state.is_cuda or rows >= CUDA_FROM)


def delta_rule_prepared(q, k, v, g, beta, state, c: int = CHUNK, use_triton: bool | None = None) -> torch.Tensor:
    """q, k [Hv, P, dk], v [Hv, P, dv], g, beta [Hv, P] fp32 (normed, scaled, repeated: deltanet.prepare's,
    heads first); state [Hv, dk, dv] fp32, updated in place -> o [P, Hv, dv] fp32."""
    rows = q.shape[1]
    if use_triton is None:
        use_triton = usable(state, q.shape[-1], v.shape[-1])
    fused = use_triton and chunk_parts_cuda.enabled and chunk_parts_cuda.usable(q, v, c)
    parts = (chunk_parts_cuda.chunk_parts if fused else chunk_parts)(q, k, v, g, beta, c)
    if use_triton:
        return chain_triton(*parts, state, rows=rows)
    out = chain_torch(*parts, state)
    return out.reshape(out.shape[0], -1, out.shape[-1])[:, :rows].transpose(0, 1)


def delta_rule_raw(mixed, ba, a_log_exp, dt_bias, state, heads: tuple[int, int, int], c: int = CHUNK,
                   out_dtype: torch.dtype = torch.float32):
    """delta_rule from the DeltaNet's conv output mixed [P, q|k|v] and the input product's b|a columns
    ba [P, 2 Hv] (chunk_parts_cuda.chunk_parts_raw: the preparing in the parts' launch); heads (Hk, dk,
    dv); state [Hv, dk, dv] fp32 in place -> [P, Hv, dv] in out_dtype (rounded from fp32 in the chain's
    launch, as .to() would). CUDA only: usable_raw says when."""
    parts = chunk_parts_cuda.chunk_parts_raw(mixed, ba, a_log_exp, dt_bias, *heads, c)
    return chain_triton(*parts, state, rows=mixed.shape[0], out_dtype=out_dtype)


def usable_raw(mixed: torch.Tensor, state: torch.Tensor, heads: tuple[int, int, int], c: int = CHUNK) -> bool:
    """Whether delta_rule_raw runs here: the Triton chain and the raw parts both take these."""
    return usable(state, heads[1], heads[2]) and chunk_parts_cuda.usable_raw(mixed, heads[1], heads[2], c)


def delta_rule(q, k, v, g, beta, state, rows_policy=None, c: int = CHUNK, use_triton: bool | None = None):
    """deltanet.delta_rule_rows's inputs and result (q, k [P, Hk, dk]; v [P, Hv, dv]; g, beta [P, Hv];
    state [Hv, dk, dv] fp32 in place -> [P, Hv, dv] fp32), the rows in chunks."""
    q, k, v, g, beta = deltanet.prepare(q, k, v, g, beta, rows_policy)
    return delta_rule_prepared(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), g.t(), beta.t(), state, c,
                               use_triton)
