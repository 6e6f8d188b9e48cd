"""The MoE after its router in one persistent launch: gate/up + SwiGLU, down, and the combine
with the residual add and the next norm (cuda_moe.experts_add_norm's three launches).

Every launch boundary costs a decode step about 2 us (the next kernel's ramp waits for the
last program of the one before; docs/cuda.md), and a layer has ten. Here one grid of
programs, all resident at once, works through a list of tiles in order: the gate/up tiles of
every (row, slot) pair, then the down tiles, then one combine tile per row. A tile that needs
others' results waits on a counter they raise when their stores are done (a pair's gate/up
tiles for its down tiles, each of a row's pairs' down tiles for its combine, slot by slot;
every counter on its own cache line, polled with a back-off), and a down tile loads its
weights before it waits: the weights do not depend on the wait, so their DRAM latency hides
behind the gate/up tail instead of following it.

No wait can deadlock: each program takes its tiles in increasing order and every tile waits
only for tiles before it, so the lowest unfinished tile can always run, provided every
program is resident (the grid is sized from the compiled kernel's registers and the SM count).
Each tile's arithmetic is the same code for every row and row count, in a fixed order, so a
row's bits do not depend on how many rows the launch carries. The last program out puts the
counters back to zero for the next launch.
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

MAX_ROWS = 16
# (gate/up block of intermediate columns, its K block, down block of outputs, warps)
CONFIG = (4, 1024, 8, 8)
enabled = False   # the model's exact CUDA path uses it instead of the three launches

if triton is not None:
    @triton.jit
    def _signal(cnt_ptr):
        tl.debug_barrier()          # the tile's stores, from every thread, come before its count
        tl.atomic_add(cnt_ptr, 1, sem="release", scope="gpu")

    @triton.jit
    def _wait(cnt_ptr, target):
        while tl.atomic_add(cnt_ptr, 0, sem="acquire", scope="gpu") < target:
            # back off: the tiles being waited for raise this counter, and polls compete with them
            tl.inline_asm_elementwise("nanosleep.u32 64; mov.u32 $0, $1;", "=r,r", [target], dtype=tl.int32,
                                      is_pure=False, pack=1)

    @triton.jit(do_not_specialize=["n_pairs", "rows"])
    def _moe_tail(x_ptr, gu_ptr, dn_ptr, ids_ptr, wt_ptr, act_ptr, y_ptr, res_ptr, nw_ptr, s_ptr, out_ptr, cnt_ptr,
                  eps, n_pairs, rows, gu_sh, dn_sh, H: tl.constexpr, I: tl.constexpr, E: tl.constexpr,
                  SLOTS: tl.constexpr, GU_N: tl.constexpr, GU_K: tl.constexpr, DN_N: tl.constexpr,
                  MAXP: tl.constexpr, SPACE: tl.constexpr, NCNT: tl.constexpr, PDL: tl.constexpr):
        if PDL:   # verispec/ops/cuda_launch.py; every program is resident before the next kernel launches
            gdc_wait()
            gdc_launch_dependents()
        pid = tl.program_id(0)
        grid = tl.num_programs(0)
        GU_T: tl.constexpr = I // GU_N
        DN_T: tl.constexpr = H // DN_N
        n_gu = n_pairs * GU_T
        n_dn = n_pairs * DN_T
        for t in range(pid, n_gu + n_dn + rows, grid):
            if t < n_gu:                                   # gate/up + SwiGLU: act[pair, block]
                pair = t // GU_T
                e = tl.load(ids_ptr + pair).to(tl.int64)
                offs_n = (t % GU_T) * GU_N + tl.arange(0, GU_N)
                g_rows = gu_ptr + tl.where(e == E, gu_sh, e * (2 * I) * H) + offs_n[:, None].to(tl.int64) * H
                acc_g = tl.zeros([GU_N, GU_K], dtype=tl.float32)
                acc_u = tl.zeros([GU_N, GU_K], dtype=tl.float32)
                for k0 in tl.static_range(0, H, GU_K):
                    offs_k = k0 + tl.arange(0, GU_K)
                    xv = tl.load(x_ptr + (pair // SLOTS) * H + offs_k).to(tl.float32)
                    acc_g += tl.load(g_rows + offs_k[None, :]).to(tl.float32) * xv[None, :]
                    acc_u += tl.load(g_rows + I * H + offs_k[None, :]).to(tl.float32) * xv[None, :]
                g_sum = tl.sum(acc_g, axis=1)
                u_sum = tl.sum(acc_u, axis=1)
                act = g_sum * tl.sigmoid(g_sum) * u_sum
                tl.store(act_ptr + pair * I + offs_n, act.to(act_ptr.dtype.element_ty))
                _signal(cnt_ptr + pair * SPACE)
            elif t < n_gu + n_dn:                          # down: y[pair, block] (fp32)
                u = t - n_gu
                pair = u // DN_T
                e = tl.load(ids_ptr + pair).to(tl.int64)
                offs_n = (u % DN_T) * DN_N + tl.arange(0, DN_N)
                offs_k = tl.arange(0, I)
                w = tl.load(dn_ptr + tl.where(e == E, dn_sh, e * H * I) + offs_n[:, None].to(tl.int64) * I
                            + offs_k[None, :])             # before the wait: it does not depend on it
                _wait(cnt_ptr + pair * SPACE, GU_T)
                a = tl.load(act_ptr + pair * I + offs_k, cache_modifier=".cg").to(tl.float32)
                tl.store(y_ptr + pair * H + offs_n, tl.sum(w.to(tl.float32) * a[None, :], axis=1))
                _signal(cnt_ptr + (MAXP + pair) * SPACE)
            else:                                          # combine + residual add + norm of a row
                row = t - n_gu - n_dn
                offs = tl.arange(0, H)
                total = tl.zeros([H], dtype=tl.float32)
                for s in tl.static_range(SLOTS - 1):      # the routed slots in slot order
                    _wait(cnt_ptr + (MAXP + row * SLOTS + s) * SPACE, DN_T)
                    wt = tl.load(wt_ptr + row * SLOTS + s)
                    total += wt * tl.load(y_ptr + (row * SLOTS + s) * H + offs, cache_modifier=".cg")
                out = total.to(out_ptr.dtype.element_ty)
                # the shared expert (the last slot): its y rounded as its own product would be,
                # times its weight (the rounded sigmoid of its gate), added as torch adds
                _wait(cnt_ptr + (MAXP + row * SLOTS + SLOTS - 1) * SPACE, DN_T)
                extra = tl.load(y_ptr + (row * SLOTS + SLOTS - 1) * H + offs, cache_modifier=".cg")
                extra = extra.to(out_ptr.dtype.element_ty).to(tl.float32)
                extra = (tl.load(wt_ptr + row * SLOTS + SLOTS - 1) * extra).to(out_ptr.dtype.element_ty)
                out = (out.to(tl.float32) + extra.to(tl.float32)).to(out_ptr.dtype.element_ty)
                sm = (tl.load(res_ptr + row * H + offs).to(tl.float32) + out.to(tl.float32)).to(out_ptr.dtype.element_ty)
                tl.store(s_ptr + row * H + offs, sm)
                xf = sm.to(tl.float32)
                yv = xf * tl.math.rsqrt(tl.sum(xf * xf, axis=0) / H + eps)
                yv = yv * (1.0 + tl.load(nw_ptr + offs).to(tl.float32))
                tl.store(out_ptr + row * H + offs, yv.to(out_ptr.dtype.element_ty))
        tl.debug_barrier()
        if tl.atomic_add(cnt_ptr + 2 * MAXP * SPACE, 1, sem="acq_rel", scope="gpu") == grid - 1:
            offs_c = tl.arange(0, NCNT)
            tl.store(cnt_ptr + offs_c * SPACE, tl.zeros([NCNT], dtype=tl.int32), mask=offs_c <= 2 * MAXP)


_counters: dict[tuple, torch.Tensor] = {}
_grids: dict[tuple, int] = {}


SPACE = 32   # int32s between counters: each on its own 128-byte line (polls and raises of one
             # counter do not queue behind another's at the same L2 slice)


def _layout(slots: int) -> tuple[int, int]:
    """(MAXP, NCNT): the pairs' gate/up counters at 0.., their down counters at MAXP.., the exit
    count at 2 MAXP (each SPACE int32s apart); NCNT counters rounded up to a power of two."""
    maxp = MAX_ROWS * slots
    return maxp, triton.next_power_of_2(2 * maxp + 1)


def _grid(kernel_args: tuple, consts: dict, device: torch.device) -> int:
    """Programs that fit on the GPU at once: the SM count times the programs per SM that the
    compiled kernel's registers, shared memory and warps allow (all must be resident, or a
    program waiting on a counter could keep the tiles it waits for from ever running)."""
    key = (device.index, tuple(sorted(consts.items())))
    if key not in _grids:
        k = _moe_tail.warmup(*kernel_args, grid=(1,), **consts)
        k._init_handles()
        props = torch.cuda.get_device_properties(device)
        warps = consts["num_warps"]
        regs_per_warp = -(-max(k.n_regs, 1) // 8) * 8 * 32
        by_regs = (65536 // regs_per_warp) // warps
        by_threads = 2048 // (32 * warps)
        smem = getattr(k.metadata, "shared", 0)
        by_smem = (228 * 1024) // smem if smem else 32
        per_sm = max(1, min(by_regs, by_threads, by_smem, 32))
        _grids[key] = props.multi_processor_count * per_sm
    return _grids[key]


def experts_add_norm(x: torch.Tensor, top_w: torch.Tensor, top_i: torch.Tensor, gu_all: torch.Tensor,
                     down_all: torch.Tensor, shared_gu: torch.Tensor, shared_down: torch.Tensor,
                     resid: torch.Tensor, norm_w: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cuda_moe.experts_add_norm in one launch (same arguments, same results up to the order of
    the reductions): top_w, top_i [R, K + 1] from route_shared, the shared expert last."""
    rows, slots = top_i.shape
    e, two_i, h = gu_all.shape
    inter = two_i // 2
    gn, gk, dn, warps = CONFIG
    if rows > MAX_ROWS or inter % gn or h % gk or h % dn or h & (h - 1) or inter & (inter - 1):
        raise ValueError("persistent MoE tail: up to 16 rows, power-of-two widths its blocks divide")
    if shared_gu.shape != gu_all.shape[1:] or shared_down.shape != down_all.shape[1:]:
        raise ValueError("the shared expert's widths must equal the routed experts'")
    dev = x.device
    x, resid, ids = x.contiguous(), resid.contiguous(), top_i.reshape(-1).contiguous()
    n = ids.numel()
    act = torch.empty(n, inter, dtype=x.dtype, device=dev)
    y = torch.empty(n, h, dtype=torch.float32, device=dev)
    s, out = torch.empty(rows, h, dtype=x.dtype, device=dev), torch.empty(rows, h, dtype=x.dtype, device=dev)
    maxp, ncnt = _layout(slots)
    ckey = (dev.index, ncnt)
    if ckey not in _counters:
        _counters[ckey] = torch.zeros(ncnt * SPACE, dtype=torch.int32, device=dev)
    cnt = _counters[ckey]
    gu_sh = (shared_gu.data_ptr() - gu_all.data_ptr()) // gu_all.element_size()
    dn_sh = (shared_down.data_ptr() - down_all.data_ptr()) // down_all.element_size()
    args = (x, gu_all, down_all, ids, top_w, act, y, resid, norm_w.contiguous(), s, out, cnt, eps, n, rows, gu_sh, dn_sh)
    consts = dict(H=h, I=inter, E=e, SLOTS=slots, GU_N=gn, GU_K=gk, DN_N=dn, MAXP=maxp, SPACE=SPACE, NCNT=ncnt,
                  num_warps=warps, num_stages=1, **cuda_launch.flags(dev))
    _moe_tail[(_grid(args, consts, dev),)](*args, **consts)
    return s, out
