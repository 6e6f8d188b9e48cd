"""Routed experts without host synchronisation: one program per (row, slot) pair.

The CPU MoE groups rows by expert on the host (`.tolist()`), which on a GPU stalls the
queue once per layer and cannot be captured in a CUDA graph. Here the expert ids stay on
the device: a Triton program reads its pair's expert id and streams that expert's weights.
Each program's result depends only on its own row and expert, summed in a fixed order, so
a row's bits cannot depend on how many rows (or which other experts) share the launch.

  gate_up:  act[p, j] = silu(W_gu[e_p, j] . x_r) * (W_gu[e_p, I + j] . x_r)     p = (r, s)
  down:     y[p, n] = W_d[e_p, n] . act[p]                       (fp32, one program per pair and block of n)
  combine:  out[r, n] = sum over s = 0..K-1, in slot order, of w[r, s] * y[(r, s), n]

Without Triton (the CPU, where the padded policy runs in tests) the same arithmetic runs
one pair at a time in torch, with host-side ids.
"""

from __future__ import annotations

import torch

from . import cuda_fusions, cuda_launch, cuda_moe_tail, cuda_stream_moe
import torch.nn.functional as F

try:  # triton ships with CUDA builds of torch; the CPU machine does not have it
    import triton
    import triton.language as tl
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - depends on the install
    triton = None

if triton is not None:
    @triton.jit(do_not_specialize=["R"])
    def _gate_up_act(x_ptr, w_ptr, ids_ptr, act_ptr, sh_off, R, I: tl.constexpr, H: tl.constexpr, TOP_K: tl.constexpr,
                     E: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SHARED_FIRST: tl.constexpr,
                     PDL: tl.constexpr, pred_ptr=None, PRED: tl.constexpr = False, EVW: tl.constexpr = ""):
        """SHARED_FIRST (each row's last slot is the shared expert, id E): the R rows' shared
        pairs first among the pairs; their programs need nothing from the router (the kernel
        before this one: its input x is older, their expert is fixed), so they skip the wait
        and stream the shared expert's weights while the router runs, waiting only before
        their store (nothing is written before the wait: the output buffer may reuse memory the
        router still reads). Grid (pairs, blocks), pairs varying fastest as without
        SHARED_FIRST (a grid with every shared program dispatched first was 1.01-1.02x slower
        at 3 and 4 rows, device calls 47-50). Every program's arithmetic is the same either way.
        The caller's promise: x was written before the router's launch.

        PRED (an experiment, off in the model: bench/cuda_ablation.py): pred_ptr holds a
        predicted expert id for each pair (-1: none). Before its wait each program loads its
        first PRED (1 or 2) blocks of BLOCK_K columns of the predicted expert's weights (the shared
        programs: the shared expert's); after it, every program waits (x too is read after it, so the router may
        launch this kernel before its own wait), reads the router's id, and loads that block
        again only where the prediction was wrong. The weights are the same memory either way,
        so the bits do not depend on the prediction."""
        if SHARED_FIRST:
            q = tl.program_id(0)
            nb = tl.program_id(1)
            routed = q >= R
            pair = tl.where(routed, ((q - R) // (TOP_K - 1)) * TOP_K + (q - R) % (TOP_K - 1), q * TOP_K + TOP_K - 1)
        else:
            pair = tl.program_id(0)
            nb = tl.program_id(1)
            routed = pair >= 0
        if PRED:
            row = pair // TOP_K
            offs_n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
            n_ok = offs_n < I
            acc_g = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
            acc_u = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
            ep = tl.load(pred_ptr + pair, mask=routed, other=E).to(tl.int64)   # a weight's address: no wait
            offs_k0 = tl.arange(0, BLOCK_K)
            m0 = n_ok[:, None] & (offs_k0 < H)[None, :] & (ep >= 0)
            p_rows = w_ptr + tl.where(ep == E, sh_off, ep * (2 * I) * H) + offs_n[:, None].to(tl.int64) * H
            wg0 = tl.load(p_rows + offs_k0[None, :], mask=m0, other=0.0)
            wu0 = tl.load(p_rows + I * H + offs_k0[None, :], mask=m0, other=0.0)
            if PRED > 1:   # the second block too
                offs_k1 = BLOCK_K + tl.arange(0, BLOCK_K)
                m1 = n_ok[:, None] & (offs_k1 < H)[None, :] & (ep >= 0)
                wg1 = tl.load(p_rows + offs_k1[None, :], mask=m1, other=0.0)
                wu1 = tl.load(p_rows + I * H + offs_k1[None, :], mask=m1, other=0.0)
            else:
                wg1, wu1 = wg0, wu0   # unused
            if PDL:
                gdc_wait()
                gdc_launch_dependents()
            e = tl.load(ids_ptr + pair, mask=routed, other=E).to(tl.int64)
            miss = e != ep
            g_rows = w_ptr + tl.where(e == E, sh_off, e * (2 * I) * H) + offs_n[:, None].to(tl.int64) * H
            u_rows = g_rows + I * H
            for k0 in tl.static_range(0, H, BLOCK_K):   # the same sums, in the same order, as below
                offs_k = k0 + tl.arange(0, BLOCK_K)
                k_ok = offs_k < H
                xv = tl.load(x_ptr + row * H + offs_k, mask=k_ok, other=0.0).to(tl.float32)
                m = n_ok[:, None] & k_ok[None, :]
                if k0 == 0:
                    wg = tl.where(miss, tl.load(g_rows + offs_k[None, :], mask=m & miss, other=0.0), wg0)
                    wu = tl.where(miss, tl.load(u_rows + offs_k[None, :], mask=m & miss, other=0.0), wu0)
                elif k0 == BLOCK_K and PRED > 1:
                    wg = tl.where(miss, tl.load(g_rows + offs_k[None, :], mask=m & miss, other=0.0), wg1)
                    wu = tl.where(miss, tl.load(u_rows + offs_k[None, :], mask=m & miss, other=0.0), wu1)
                else:
                    wg = tl.load(g_rows + offs_k[None, :], mask=m, other=0.0)
                    wu = tl.load(u_rows + offs_k[None, :], mask=m, other=0.0)
                acc_g += wg.to(tl.float32) * xv[None, :]
                acc_u += wu.to(tl.float32) * xv[None, :]
        else:
            if PDL:   # verispec/ops/cuda_launch.py: nothing the previous kernel writes is touched before it is done
                if routed:
                    gdc_wait()
                gdc_launch_dependents()
            e = tl.load(ids_ptr + pair, mask=routed, other=E).to(tl.int64)
            row = pair // TOP_K
            offs_n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
            n_ok = offs_n < I
            # id E is the shared expert: its [2I, H] weights sit sh_off elements from w_ptr
            base = tl.where(e == E, sh_off, e * (2 * I) * H)
            g_rows = w_ptr + base + offs_n[:, None].to(tl.int64) * H
            u_rows = g_rows + I * H
            # products accumulate element-wise across the K blocks and are reduced once at the end
            # (a reduction per block was a cross-thread shuffle per block)
            acc_g = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
            acc_u = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
            for k0 in range(0, H, BLOCK_K):
                offs_k = k0 + tl.arange(0, BLOCK_K)
                k_ok = offs_k < H
                xv = tl.load(x_ptr + row * H + offs_k, mask=k_ok, other=0.0).to(tl.float32)
                m = n_ok[:, None] & k_ok[None, :]
                wg = tl.load(g_rows + offs_k[None, :], mask=m, other=0.0, eviction_policy=EVW).to(tl.float32)
                wu = tl.load(u_rows + offs_k[None, :], mask=m, other=0.0, eviction_policy=EVW).to(tl.float32)
                acc_g += wg * xv[None, :]
                acc_u += wu * xv[None, :]
        g_sum = tl.sum(acc_g, axis=1)
        u_sum = tl.sum(acc_u, axis=1)
        act = g_sum * tl.sigmoid(g_sum) * u_sum
        if PDL and SHARED_FIRST and not PRED:
            if not routed:
                gdc_wait()
        tl.store(act_ptr + pair * I + offs_n, act.to(act_ptr.dtype.element_ty), mask=n_ok)

    @triton.jit
    def _down_tile(w_ptr, ids_ptr, sh_off, H: tl.constexpr, I: tl.constexpr, E: tl.constexpr,
                   BLOCK_N: tl.constexpr):
        """The program's pair, its output columns and their weight rows (the pair's expert id read)."""
        pair = tl.program_id(0)
        offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        e = tl.load(ids_ptr + pair).to(tl.int64)
        w_rows = w_ptr + tl.where(e == E, sh_off, e * H * I) + offs_n[:, None].to(tl.int64) * I
        return pair, offs_n, offs_n < H, w_rows

    @triton.jit
    def _down_pair(act_ptr, w_ptr, ids_ptr, y_ptr, sh_off, H: tl.constexpr, I: tl.constexpr, E: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr, EARLY_W: tl.constexpr = False,
                   EVW: tl.constexpr = ""):
        """EARLY_W (on where I = 4 BLOCK_K: DOWN_EARLY; bench/cuda_ablation.py --arms predict): the
        pair's id and all its weights are read before the wait. The router wrote the ids two
        launches back: this kernel launches only once every gate/up program has passed its own
        wait, i.e. after the router completed (as cuda_stream_moe's down relies on). The same
        sums in the same order as without it."""
        acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        if EARLY_W:
            pair, offs_n, n_ok, w_rows = _down_tile(w_ptr, ids_ptr, sh_off, H, I, E, BLOCK_N)
            ok = n_ok[:, None]
            w0 = tl.load(w_rows + tl.arange(0, BLOCK_K)[None, :], mask=ok, other=0.0, eviction_policy=EVW)
            w1 = tl.load(w_rows + BLOCK_K + tl.arange(0, BLOCK_K)[None, :], mask=ok, other=0.0, eviction_policy=EVW)
            w2 = tl.load(w_rows + 2 * BLOCK_K + tl.arange(0, BLOCK_K)[None, :], mask=ok, other=0.0, eviction_policy=EVW)
            w3 = tl.load(w_rows + 3 * BLOCK_K + tl.arange(0, BLOCK_K)[None, :], mask=ok, other=0.0, eviction_policy=EVW)
            if PDL:
                gdc_wait()
                gdc_launch_dependents()
            for k0 in tl.static_range(0, I, BLOCK_K):
                av = tl.load(act_ptr + pair * I + k0 + tl.arange(0, BLOCK_K)).to(tl.float32)
                if k0 == 0:
                    wb = w0
                elif k0 == BLOCK_K:
                    wb = w1
                elif k0 == 2 * BLOCK_K:
                    wb = w2
                else:
                    wb = w3
                acc += wb.to(tl.float32) * av[None, :]
        else:
            if PDL:   # verispec/ops/cuda_launch.py: nothing is touched before the previous kernel is done
                gdc_wait()
                gdc_launch_dependents()
            pair, offs_n, n_ok, w_rows = _down_tile(w_ptr, ids_ptr, sh_off, H, I, E, BLOCK_N)
            for k0 in range(0, I, BLOCK_K):
                offs_k = k0 + tl.arange(0, BLOCK_K)
                k_ok = offs_k < I
                av = tl.load(act_ptr + pair * I + offs_k, mask=k_ok, other=0.0).to(tl.float32)
                wv = tl.load(w_rows + offs_k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0,
                             eviction_policy=EVW).to(tl.float32)
                acc += wv * av[None, :]
        tl.store(y_ptr + pair * H + offs_n, tl.sum(acc, axis=1), mask=n_ok)

    @triton.jit
    def _combine(y_ptr, wt_ptr, extra_ptr, gate_ptr, gate_stride, out_ptr, res_ptr, nw_ptr, s_ptr, eps,
                 H: tl.constexpr, TOP_K: tl.constexpr, SLOTS: tl.constexpr, HAS_EXTRA: tl.constexpr,
                 HAS_GATE: tl.constexpr, SHARED: tl.constexpr, NORM: tl.constexpr, BLOCK: tl.constexpr,
                 PDL: tl.constexpr, EARLY: tl.constexpr = False):
        """out[r] = the TOP_K routed slots summed in slot order (fp32, rounded once), plus the
        shared expert: SHARED, slot TOP_K of the row's SLOTS (its y rounded as its own product
        would round, times its weight, the rounded sigmoid of its gate); else `extra` [R, H]
        (times sigmoid(gate) with HAS_GATE). Each addition rounds as torch adds two bf16
        tensors. NORM (one program holds the whole row): the residual add and the next norm
        as add_row_norm does, s = x + out, out = ZC-norm(s)."""
        cuda_launch.enter(PDL, EARLY)   # nothing is touched before the previous kernel is done
        row = tl.program_id(0)
        nb = tl.program_id(1)
        offs = nb * BLOCK + tl.arange(0, BLOCK)
        ok = offs < H
        total = tl.zeros([BLOCK], dtype=tl.float32)
        for s in tl.static_range(TOP_K):                      # slot order, fixed
            wt = tl.load(wt_ptr + row * SLOTS + s).to(tl.float32)
            total += wt * tl.load(y_ptr + (row * SLOTS + s) * H + offs, mask=ok, other=0.0)
        out = total.to(out_ptr.dtype.element_ty)
        if SHARED:
            extra = tl.load(y_ptr + (row * SLOTS + TOP_K) * H + offs, mask=ok, other=0.0)
            extra = extra.to(out_ptr.dtype.element_ty).to(tl.float32)
            sg = tl.load(wt_ptr + row * SLOTS + TOP_K)
            extra = (sg * extra).to(out_ptr.dtype.element_ty).to(tl.float32)
            out = (out.to(tl.float32) + extra).to(out_ptr.dtype.element_ty)
        elif HAS_EXTRA:   # as torch adds two bf16 tensors: in fp32, rounded once
            extra = tl.load(extra_ptr + row * H + offs, mask=ok, other=0.0).to(tl.float32)
            if HAS_GATE:    # sigmoid(gate) * extra, each rounded to bf16 as torch's two ops round
                sg = tl.sigmoid(tl.load(gate_ptr + row * gate_stride).to(tl.float32))
                sg = sg.to(out_ptr.dtype.element_ty).to(tl.float32)
                extra = (sg * extra).to(out_ptr.dtype.element_ty).to(tl.float32)
            out = (out.to(tl.float32) + extra).to(out_ptr.dtype.element_ty)
        if NORM:
            sm = (tl.load(res_ptr + row * H + offs, mask=ok, other=0.0).to(tl.float32)
                  + out.to(tl.float32)).to(out_ptr.dtype.element_ty)
            tl.store(s_ptr + row * H + offs, sm, mask=ok)
            xf = sm.to(tl.float32)
            yv = xf * tl.math.rsqrt(tl.sum(xf * xf, axis=0) / H + eps)
            yv = yv * (1.0 + tl.load(nw_ptr + offs, mask=ok, other=0.0).to(tl.float32))
            tl.store(out_ptr + row * H + offs, yv.to(out_ptr.dtype.element_ty), mask=ok)
        else:
            tl.store(out_ptr + row * H + offs, out, mask=ok)

    @triton.jit
    def _top_k(p, offs, ks, TOP_K: tl.constexpr, KP: tl.constexpr, BLOCK_E: tl.constexpr):
        """The TOP_K largest of p [BLOCK_E] (probabilities >= +0.0; -1.0 marks no expert), ties
        to the lower index -> (values [KP], indices [KP] int32). One max per pick: a key packs the
        value's bits (ordered as the values are, for values >= +0.0) above BLOCK_E - 1 - index,
        so the largest key is the largest value at its lowest index, as a max and then a min
        of the indices at that value would give, in half the reductions."""
        key = (p.to(tl.int32, bitcast=True).to(tl.int64) << 32) | (BLOCK_E - 1 - offs).to(tl.int64)
        wv = tl.zeros([KP], dtype=tl.float32)
        iv = tl.zeros([KP], dtype=tl.int32)
        for j in tl.static_range(TOP_K):
            best = tl.max(key, 0)
            idx = BLOCK_E - 1 - (best & 0xFFFFFFFF).to(tl.int32)
            wv = tl.where(ks == j, (best >> 32).to(tl.int32).to(tl.float32, bitcast=True), wv)
            iv = tl.where(ks == j, idx, iv)
            key = tl.where(offs == idx, -1, key)
        return wv, iv

    @triton.jit
    def _route(x_ptr, stride, split_stride, w_ptr, i_ptr, E: tl.constexpr, TOP_K: tl.constexpr, KP: tl.constexpr,
               NORM: tl.constexpr, BLOCK_E: tl.constexpr, SPLIT: tl.constexpr, SHARED: tl.constexpr,
               PDL: tl.constexpr, EARLY: tl.constexpr = False):
        """One row's router: softmax over E logits (fp32), the top K by repeated argmax (ties
        to the lower expert id), optionally renormalised. SPLIT > 1: x holds the fp32 partials
        of the router product (SPLIT chunks of K, split_stride apart), summed here in chunk
        order and rounded to bf16 as the product's own sum would be. SHARED: column E is the
        shared expert's gate; the row gets K + 1 slots, the last the shared expert (id E) with
        weight bf16(sigmoid(gate)). EARLY (only before the stream expert products, which read
        nothing but weights before their wait): the next kernel launches before this one's wait."""
        cuda_launch.enter(PDL, EARLY)   # nothing is touched before the previous kernel is done
        row = tl.program_id(0)
        offs = tl.arange(0, BLOCK_E)
        ok = offs < E
        if SPLIT == 1:
            lg = tl.load(x_ptr + row * stride + offs, mask=ok, other=0.0).to(tl.float32)
            if SHARED:
                g = tl.load(x_ptr + row * stride + E).to(tl.float32)
        else:
            acc = tl.zeros([BLOCK_E], dtype=tl.float32)
            for sp in tl.static_range(SPLIT):
                acc += tl.load(x_ptr + sp * split_stride + row * stride + offs, mask=ok, other=0.0)
            lg = acc.to(tl.bfloat16).to(tl.float32)
            if SHARED:
                ga = tl.load(x_ptr + row * stride + E)
                for sp in tl.static_range(1, SPLIT):
                    ga += tl.load(x_ptr + sp * split_stride + row * stride + E)
                g = ga.to(tl.bfloat16).to(tl.float32)
        x = tl.where(ok, lg, float("-inf"))
        ex = tl.exp(x - tl.max(x, 0))
        p = tl.where(ok, ex / tl.sum(ex, 0), -1.0)
        ks = tl.arange(0, KP)
        wv, iv = _top_k(p, offs, ks, TOP_K, KP, BLOCK_E)
        if NORM:
            wv = wv / tl.sum(wv, 0)
        if SHARED:
            sg = tl.sigmoid(g).to(tl.bfloat16).to(tl.float32)
            wv = tl.where(ks == TOP_K, sg, wv)
            iv = tl.where(ks == TOP_K, E, iv)
        tl.store(w_ptr + row * (TOP_K + SHARED) + ks, wv, mask=ks < TOP_K + SHARED)
        tl.store(i_ptr + row * (TOP_K + SHARED) + ks, iv, mask=ks < TOP_K + SHARED)

    @triton.jit
    def _silu_mul(x_ptr, stride, out_ptr, G0: tl.constexpr, N: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
        """out[r] = silu(x[r, G0:G0+N]) * x[r, G0+N:G0+2N], rounded as torch's silu then mul."""
        if PDL:   # verispec/ops/cuda_launch.py: nothing is touched before the previous kernel is done
            gdc_wait()
            gdc_launch_dependents()
        row = tl.program_id(0)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = offs < N
        g = tl.load(x_ptr + row * stride + G0 + offs, mask=ok, other=0.0).to(tl.float32)
        u = tl.load(x_ptr + row * stride + G0 + N + offs, mask=ok, other=0.0).to(tl.float32)
        sg = (g * tl.sigmoid(g)).to(out_ptr.dtype.element_ty).to(tl.float32)
        tl.store(out_ptr + row * N + offs, (sg * u).to(out_ptr.dtype.element_ty), mask=ok)


# (BLOCK_N, BLOCK_K, num_warps, num_stages) per kernel; fixed, never autotuned (a tuner choosing
# by row count would change the reduction order with it). Chosen on the H200 by
# bench/cuda_moe_sweep.py (docs/cuda-history.md); gate/up from `--wide` and the whole forward's A/B
# (bench/cuda_bench.py --sections gate_up: 0.959x of (8, 512, 4, 3) at 1 row, 0.984x at 4).
SHARED_FIRST = True   # the shared expert's gate/up programs first, not waiting for the router
# the down kernel reads its ids and weights before its wait (_down_pair's EARLY_W): 0.983-0.990x at one
# row, 0.995-0.996x at four on an H100, logits equal (bench/cuda_ablation.py --arms predict, calls 238-239)
DOWN_EARLY = True
# an experiment, off (""): the experts' weights loaded with this L2 eviction policy ("evict_first": read
# once a step, they should not push out what cuda_stream_gemv.L2_NEXT asked into L2; bench/cuda_bench.py
# --sections l2next)
EVW = ""
CONFIG = {"gate_up": (4, 1024, 8, 1), "down": (8, 128, 8, 3), "combine": (256, 0, 8, 1),
          "combine_norm": 32, "route": 1}   # the last two: warps (bench/cuda_small_sweep.py)


def route(logits: torch.Tensor, n_experts: int, top_k: int, norm: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [R, >= E] (the first E columns are the router's; any row stride) -> weights [R, K]
    fp32, expert ids [R, K] int32. One program per row."""
    rows = logits.shape[0]
    if logits.stride(1) != 1:
        raise ValueError("router logits need unit stride along the experts")
    w = torch.empty(rows, top_k, dtype=torch.float32, device=logits.device)
    i = torch.empty(rows, top_k, dtype=torch.int32, device=logits.device)
    _route[(rows,)](logits, logits.stride(0), 0, w, i, E=n_experts, TOP_K=top_k, KP=triton.next_power_of_2(top_k),
                    NORM=norm, BLOCK_E=triton.next_power_of_2(n_experts), SPLIT=1, SHARED=False, num_warps=4,
                    **cuda_launch.flags(logits.device))
    return w, i


def route_shared(x: torch.Tensor, rows: int, n_experts: int, top_k: int,
                 norm: bool, early: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The router with the shared expert as one more slot. x: the router product's output
    [R, N] (bf16), or its fp32 partial sums [SPLIT, >= R, N] over SPLIT chunks of its inputs
    (cuda_gemv.linear_rows(..., partials=True)), summed here in chunk order and rounded as the
    product would round them; columns the E router logits, then the shared expert's gate.
    -> weights [R, K + 1] fp32, ids [R, K + 1] int32: the top K experts, then the shared expert
    (id E) with weight bf16(sigmoid(gate)). One warp per row: the top-k's sixteen reductions
    stay within the warp (no shared-memory round trips); every row runs this same compiled
    kernel, so its bits do not depend on the row count. early: the next kernel is
    cuda_stream_moe's gate/up (stream_moe_runs), which may launch before this one's wait."""
    n = x.shape[-1]
    if n < n_experts + 1 or x.stride(-1) != 1 or (x.dim() == 3 and not x.is_contiguous()):
        raise ValueError("router output: [R, >= E + 1] with unit stride, or contiguous partials [SPLIT, R, >= E + 1]")
    split, stride, split_stride = (1, x.stride(0), 0) if x.dim() == 2 else (x.shape[0], n, x.stride(0))
    w = torch.empty(rows, top_k + 1, dtype=torch.float32, device=x.device)
    i = torch.empty(rows, top_k + 1, dtype=torch.int32, device=x.device)
    _route[(rows,)](x, stride, split_stride, w, i, E=n_experts, TOP_K=top_k, KP=triton.next_power_of_2(top_k + 1),
                    NORM=norm, BLOCK_E=triton.next_power_of_2(n_experts), SPLIT=split, SHARED=True, num_warps=CONFIG["route"],
                    **cuda_launch.flags(x.device, early=early))
    return w, i


def silu_mul(x: torch.Tensor, start: int, n: int) -> torch.Tensor:
    """silu(x[:, start:start+n]) * x[:, start+n:start+2n] -> [R, n], one program per row and block."""
    rows = x.shape[0]
    if x.stride(1) != 1:
        raise ValueError("silu_mul needs unit stride along the features")
    out = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    block = 512
    _silu_mul[(rows, triton.cdiv(n, block))](x, x.stride(0), out, G0=start, N=n, BLOCK=block, num_warps=4,
                                             **cuda_launch.flags(x.device))
    return out


def available(device: torch.device) -> bool:
    return triton is not None and device.type == "cuda"


def _pairs(x, ids, gu_all, down_all, pairs_per_row, shared_gu, shared_down, pred=None, pred_blocks=1,
           down_early=None, shared_first=True):
    """The gate/up + SwiGLU and down kernels over every (row, slot) pair -> y [R * slots, H] fp32.
    pred: a predicted id a pair, int32 like ids (-1: none), for _gate_up_act's PRED (pred_blocks
    of its K blocks; an experiment, the model passes none). down_early: _down_pair's EARLY_W
    (None: DOWN_EARLY where the shape allows it). shared_first False: every program waits before it
    reads x (the launch just before writes it: cuda_norm_route), whatever SHARED_FIRST says."""
    e, two_i, h = gu_all.shape
    inter = two_i // 2
    n = ids.numel()
    gu_off = (shared_gu.data_ptr() - gu_all.data_ptr()) // gu_all.element_size() if shared_gu is not None else 0
    dn_off = (shared_down.data_ptr() - down_all.data_ptr()) // down_all.element_size() if shared_down is not None else 0
    act = torch.empty(n, inter, dtype=x.dtype, device=x.device)
    bn, bk, nw, ns = CONFIG["gate_up"]
    first = SHARED_FIRST and shared_first and shared_gu is not None
    _gate_up_act[(n, triton.cdiv(inter, bn))](x, gu_all, ids, act, gu_off, n // pairs_per_row, inter, h,
                                              TOP_K=pairs_per_row, E=e, BLOCK_N=bn, BLOCK_K=bk, SHARED_FIRST=first,
                                              num_warps=nw, num_stages=ns, **cuda_launch.flags(x.device),
                                              **({} if pred is None else {"pred_ptr": pred, "PRED": pred_blocks}),
                                              **({"EVW": EVW} if EVW else {}))
    y = torch.empty(n, h, dtype=torch.float32, device=x.device)
    bn, bk, nw, ns = CONFIG["down"]
    if down_early is None:
        down_early = DOWN_EARLY and inter == 4 * bk
    if down_early and inter != 4 * bk:
        raise ValueError(f"down_early needs I = 4 BLOCK_K ({inter} against {bk})")
    _down_pair[(n, triton.cdiv(h, bn))](act, down_all, ids, y, dn_off, h, inter, E=e, BLOCK_N=bn, BLOCK_K=bk,
                                        num_warps=nw, num_stages=ns, **cuda_launch.flags(act.device),
                                        **({"EARLY_W": True} if down_early else {}), **({"EVW": EVW} if EVW else {}))
    return y


def routed_experts(x: torch.Tensor, top_w: torch.Tensor, top_i: torch.Tensor, gu_all: torch.Tensor,
                   down_all: torch.Tensor, extra: torch.Tensor | None = None,
                   extra_gate: torch.Tensor | None = None) -> torch.Tensor:
    """x [R, H]; top_w [R, K] fp32; top_i [R, K]; gu_all [E, 2I, H]; down_all [E, H, I] -> [R, H] (x's dtype),
    plus `extra` [R, H] (the shared expert's output), times sigmoid(extra_gate [R, 1]) when given,
    added as torch adds two such tensors."""
    rows, k = top_i.shape
    h = gu_all.shape[2]
    if not available(x.device):
        out = _routed_experts_torch(x, top_w, top_i, gu_all, down_all)
        if extra is not None and extra_gate is not None:
            extra = torch.sigmoid(extra_gate) * extra
        return out if extra is None else out + extra
    x = x.contiguous()
    ids = top_i.reshape(-1).to(torch.int32)
    wts = top_w.reshape(-1).to(torch.float32).contiguous()
    y = _pairs(x, ids, gu_all, down_all, k, None, None)
    out = torch.empty(rows, h, dtype=x.dtype, device=x.device)
    blk, _, nw, ns = CONFIG["combine"]
    ex = extra.contiguous() if extra is not None else out
    gate = extra_gate if extra_gate is not None else wts
    _combine[(rows, triton.cdiv(h, blk))](y, wts, ex, gate, gate.stride(0), out, out, out, out, 0.0, h, TOP_K=k,
                                          SLOTS=k, HAS_EXTRA=extra is not None, HAS_GATE=extra_gate is not None,
                                          SHARED=False, NORM=False, BLOCK=blk, num_warps=nw, num_stages=ns,
                                          **cuda_launch.flags(y.device, early=False))
    return out


def stream_moe_runs(x, slots: int, gu_all, down_all, shared_gu, shared_down) -> bool:
    """Whether experts_add_norm runs x's pairs (`slots` a row: the routed, then the shared expert)
    through cuda_stream_moe: cuda_fusions.STREAM_MOE on, the opt-in MOE_TAIL off, and the kernels
    taking the shapes. The model asks before routing (the router may then let them launch early)."""
    return (cuda_fusions.STREAM_MOE and not cuda_fusions.MOE_TAIL and x.device.type == "cuda"
            and cuda_stream_moe.fits(x, slots, gu_all, down_all, shared_gu, shared_down))


def experts_add_norm(x: torch.Tensor, top_w: torch.Tensor, top_i: torch.Tensor, gu_all: torch.Tensor,
                     down_all: torch.Tensor, shared_gu: torch.Tensor, shared_down: torch.Tensor,
                     resid: torch.Tensor, norm_w: torch.Tensor, eps: float,
                     stream: bool | None = None, shared_first: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole MoE after the router, and the residual add with the next norm, in three
    launches (or, with cuda_fusions.MOE_TAIL where cuda_moe_tail fits, one). top_w, top_i [R, K + 1] from route_shared (slot K: the shared expert, id E);
    shared_gu [2I, H] and shared_down [H, I] (the shared expert's weights, any storage: its
    pairs read them in place of an expert's); resid [R, H] the residual stream. x must be
    written before the launch that made top_i: the shared expert's programs read it before
    their wait (SHARED_FIRST; the router between them keeps it so).
    stream: the caller's stream_moe_runs answer, given when it let the router launch the stream
    gate/up early (so the two cannot disagree); None: asked here. shared_first False (x written by
    the launch just before, cuda_norm_route): the shared expert's programs wait too.
    -> (resid + moe(x), ZC-norm of it with norm_w), as add_row_norm would return them."""
    rows, slots = top_i.shape
    h = gu_all.shape[2]
    if shared_gu.shape != gu_all.shape[1:] or shared_down.shape != down_all.shape[1:]:
        raise ValueError("the shared expert's widths must equal the routed experts'")
    if cuda_fusions.MOE_TAIL and cuda_moe_tail.fits(x, top_w, top_i, gu_all, down_all, shared_gu, shared_down,
                                                     resid, norm_w):
        return cuda_moe_tail.experts_add_norm(x, top_w, top_i, gu_all, down_all, shared_gu, shared_down, resid,
                                              norm_w, eps)
    x = x.contiguous()
    if stream is None:
        stream = stream_moe_runs(x, slots, gu_all, down_all, shared_gu, shared_down)
    y = (cuda_stream_moe.pairs(x, top_i, gu_all, down_all, shared_gu, shared_down) if stream
         else _pairs(x, top_i.reshape(-1), gu_all, down_all, slots, shared_gu, shared_down, shared_first=shared_first))
    s, out = torch.empty(rows, h, dtype=x.dtype, device=x.device), torch.empty(rows, h, dtype=x.dtype, device=x.device)
    resid = resid.contiguous()
    _combine[(rows, 1)](y, top_w, out, top_w, 0, out, resid, norm_w.contiguous(), s, eps, h, TOP_K=slots - 1,
                        SLOTS=slots, HAS_EXTRA=False, HAS_GATE=False, SHARED=True, NORM=True,
                        BLOCK=triton.next_power_of_2(h), num_warps=CONFIG["combine_norm"], num_stages=1,
                        **cuda_launch.flags(y.device, early=True))
    return s, out


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
