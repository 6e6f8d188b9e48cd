"""The exact path's dense products with their weights requested before the previous kernel is
done (cuda_stream_gemv.cu): a CUDA C++ kernel whose weights reach shared memory by 2D TMA
tiles requested ahead, so a product after latency-bound kernels streams its weights while they
run (the kernels before it let it launch early: cuda_launch.enter).

cuda_gemv.linear_rows hands a product to this kernel when cuda_fusions.STREAM is on and the
shape is in CONFIG (the mixers' input and output products), for every row count alike (a
shape's kernel never depends on R). The sums run in another order than the Triton product's
(tensor-core steps of 32, then the warps' partials in order), so the logits differ from the
Triton path's; rows are invariant (cuda_stream_gemv.cu says why; tests/test_cuda_stream_gemv.py).
"""

from __future__ import annotations

import ctypes

import torch

from . import cuda_launch, cuda_nvrtc

MAX_ROWS = 16
SMEM_MAX = 227 * 1024

# (K, N) -> (CG: 8-column groups a task, WARPS: K split, KC: elements a unit, SPW: slots a warp).
# Chosen on the H200 (bench/cuda_bench.py --sections stream); TRIG: let the next kernel launch
# right after the wait (1) or at the end (0).
CONFIG: dict[tuple[int, int], tuple[int, int, int, int]] = {
    (4096, 2048): (2, 8, 256, 2), (2048, 12352): (2, 8, 256, 3), (2048, 9216): (2, 8, 256, 3)}
TRIG = 1
TMA2D = 1               # a unit as one 2D TMA tile (1) or a bulk copy per column (0)
# units a warp requested before the wait (None: all its SPW slots), one at a time (PACE), and an
# evict-first L2 policy on the copies (EVF): cuda_stream_gemv.cu, bench/cuda_bench.py --sections flood
PRE: int | None = None
PACE = 0
EVF = 0
# Two experiments, off, measured slower (docs/cuda.md, calls 306-307; bench/cuda_bench.py --sections tail): the units
# past a warp's slots read into registers (REGT 1: streaming loads, 2: non-coherent loads) instead of TMA tiles into
# the freed slots; the tasks past each CTA's first ns0 dealt by tickets (DYN), so the CTAs whose bytes come sooner
# take the tail (cuda_stream_gemv.cu says how)
REGT = 0
DYN = False
# An experiment, off (empty): (K, N) -> the most CTAs the product takes (fewer than the SMs), so that the kernels
# launched early after it (with cuda_launch.LINKS, the output product) find free SMs while it streams
# (bench/cuda_bench.py --sections grid). Which CTA computes a task moves no bit.
GRID: dict[tuple[int, int], int] = {}
_sites: dict[tuple[int, int], int] = {}   # (device, weight address) -> its ticket counter in the module (DYN)
SITES = 512
# (K, N) -> registers a thread at most (cuda_stream_gemv.cu's MAXREG; absent: the compiler's choice), so a
# CTA fits beside another product's on an SM (bench/cuda_bench.py --sections coresident)
MAXREG: dict[tuple[int, int], int] = {}
CARVEOUT: int | None = None   # cuda_nvrtc.compile_kernel's carveout for every shape (None: the driver's choice)
STAMPS: torch.Tensor | None = None   # a u64 buffer: the kernel built with per-CTA stamps (bench/cuda_stamps.py)
# An experiment, off (empty): a weight's data_ptr -> (address, bytes) of another product's weights that the
# kernel asks into L2 while it runs (cuda_stream_gemv.cu's L2; l2_plan builds it; bench/cuda_bench.py
# --sections l2next), before its wait (L2AT 0) or after it (1), with an evict-last policy (L2EL 1) or none.
L2_NEXT: dict[int, tuple[int, int]] = {}
L2AT = 1
L2EL = 0

_kernels: dict = {}
_builds: dict = {}      # device index -> whether the kernel compiled there


def _smem(cg: int, warps: int, kc: int, spw: int, tasks: int = 0) -> int:
    """Bytes of shared memory: the slots, their barriers, two buffers of the warps' partial sums,
    and for a conv product the sums of its `tasks` tasks a CTA."""
    stages = warps * spw
    return stages * 8 * cg * kc * 2 + stages * 8 + 2 * warps * 16 * 8 * cg * 4 + tasks * 16 * 8 * cg * 4


def _tasks(n: int, cg: int, sms: int) -> int:
    """The most tasks a CTA takes (tasks dealt in turn to min(tasks, SMs) CTAs)."""
    nt = n // (8 * cg)
    return -(-nt // min(nt, sms))


def config(k: int, n: int) -> tuple | None:
    """The kernel's configuration for a (K, N) product, or None where it does not take it."""
    cfg = CONFIG.get((k, n))
    if cfg is None:
        return None
    cg, warps, kc, spw = cfg
    ok = (k % warps == 0 and (k // warps) % kc == 0 and kc % 32 == 0 and n % (8 * cg) == 0
          and cg in (1, 2) and 32 * warps >= 8 * 8 * cg and _smem(*cfg) <= SMEM_MAX)   # the kernel's static_asserts
    return cfg if ok else None


def _ctas(k: int, n: int, cfg: tuple, device: torch.device) -> int:
    """The launch's CTAs: a task each at most, an SM each at most, GRID's cap where it has one."""
    return min(n // (8 * cfg[0]), cuda_nvrtc.sm_count(device), GRID.get((k, n), n))


def _conv_tasks(cfg: tuple, n: int, device: torch.device, k: int = 0) -> int | None:
    """The most tasks a CTA takes for a product of N = n (and K = k) with the conv epilogue, or None where
    the epilogue does not fit: the tasks' sums beside the ring in shared memory, and a thread for each
    conv column of a CTA's tasks (the kernel's conv runs a thread a column: fewer would skip columns)."""
    tasks = _tasks(n, cfg[0], _ctas(k, n, cfg, device))
    return tasks if _smem(*cfg, tasks) <= SMEM_MAX and tasks * 8 * cfg[0] <= 32 * cfg[1] else None


def conv_fits(w: torch.Tensor, channels: int) -> bool:
    """Whether a product with w carries the conv of its first `channels` columns: whole tasks of
    conv columns, and the epilogue fitting a CTA (_conv_tasks)."""
    cfg = config(w.shape[1], w.shape[0])
    if cfg is None or channels % (8 * cfg[0]):
        return False
    return _conv_tasks(cfg, w.shape[0], w.device, w.shape[1]) is not None


def available(device: torch.device) -> bool:
    """cuda_nvrtc.available, and the kernel compiled once for this device (a first shape): where
    NVRTC cannot build it, the Triton products run (said once on stderr)."""
    (k, n), cfg = next(iter(CONFIG.items()))
    return cuda_nvrtc.builds(device, _builds, lambda: _kernel(device, k, cfg, False, 0, n), "the CUDA C++ products")


def fits(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether this kernel takes x [R, K] @ w[N, K]^T: a configured shape, bf16, R <= 16, rows on
    16-byte boundaries (the kernel reads 8 elements at a time)."""
    k, n = w.shape[1], w.shape[0]
    return (config(k, n) is not None and available(x.device) and x.dtype == w.dtype == torch.bfloat16
            and x.dim() == 2 and 1 <= x.shape[0] <= MAX_ROWS and x.shape[1] == k and x.stride(1) == 1
            and x.stride(0) % 8 == 0 and x.data_ptr() % 16 == 0 and w.is_contiguous() and w.data_ptr() % 16 == 0)


def _pre(spw: int) -> int:
    """Units a warp requests before its wait (the kernel's PRE)."""
    return spw if PRE is None else min(PRE, spw)


def dyn_static(k: int, n: int, cfg: tuple, grid: int, conv_cols: int = 0) -> int:
    """DYN's ns0, the tasks a CTA takes in turn before the tickets: one round short of all of them (so
    about a round is dealt by tickets), at least the tasks a warp may request before it has consumed its
    first (so the first ticket, asked after the wait, is needed a task later) and every conv task; 0 (all
    in turn) where that leaves no task for tickets."""
    cg, warps, kc, spw = cfg
    tc, upw = 8 * cg, (k // warps) // kc
    nt = n // tc
    ns0 = max(nt // grid - 1, (upw - 1 + spw) // upw + 1, -(-(conv_cols // tc) // grid))
    return ns0 if ns0 * grid < nt else 0


def defines(k: int, n: int, cfg: tuple, conv: bool, l2: bool = False) -> dict:
    """The -D defines of the kernel for a (K, N) product of configuration cfg under the module's
    settings (no GPU needed: tools/nvrtc_check.py builds them)."""
    cg, warps, kc, spw = cfg
    return {"K": k, "CG": cg, "WARPS": warps, "KC": kc, "SPW": spw, "CONV": int(conv), "TRIG": TRIG,
            "TMA2D": TMA2D, "PRE": _pre(spw), "PACE": PACE, "EVF": EVF, "STAMPS": int(STAMPS is not None),
            "MAXREG": MAXREG.get((k, n), 0),
            **({"L2PF": 1, "L2AT": L2AT, "L2EL": L2EL} if l2 else {}), **({"REGT": REGT} if REGT else {}),
            **({"DYN": 1} if DYN else {})}


def _kernel(device: torch.device, k: int, cfg: tuple, conv: bool, tasks: int, n: int, l2: bool = False):
    d = defines(k, n, cfg, conv, l2)
    key = (cuda_nvrtc.index(device), tuple(d.items()), tasks, CARVEOUT)
    smem = _smem(*cfg, tasks)
    if key not in _kernels:
        with torch.cuda.device(device):
            _kernels[key] = cuda_nvrtc.compile_kernel(device, "cuda_stream_gemv.cu", "stream_gemv", d, smem,
                                                      carveout=CARVEOUT)
    return _kernels[key], smem, 32 * cfg[1]


def linear_rows(x: torch.Tensor, w: torch.Tensor, conv=None) -> torch.Tensor:
    """x [R, K] @ w[N, K]^T -> [R, N] bf16 (fits() true). conv: a cuda_gemv.ConvEpilogue, the
    causal conv of the first C output columns (C a multiple of the task's columns)."""
    if not fits(x, w):
        raise ValueError(f"stream_gemv takes bf16 x [1..{MAX_ROWS}, K] (rows 16-byte aligned) and a configured weight; "
                         f"got x {tuple(x.shape)} {x.dtype}, w {tuple(w.shape)} {w.dtype}")
    rows, k = x.shape
    n = w.shape[0]
    cfg = config(k, n)
    tc = 8 * cfg[0]
    if conv is not None and (conv.ring.shape[0] % tc or conv.weight.shape[1] != 4
                             or not (conv.ring.is_contiguous() and conv.weight.is_contiguous())):
        raise ValueError("the conv epilogue needs C a multiple of the task's columns and kernel 4")
    tasks = _conv_tasks(cfg, n, x.device, k) if conv is not None else 0
    if tasks is None:
        raise ValueError("the conv epilogue does not fit a CTA: its sums beside the ring in shared memory, "
                         "or a thread for each of its conv columns")
    l2p, l2n = L2_NEXT.get(w.data_ptr(), (0, 0))
    fn, smem, threads = _kernel(x.device, k, cfg, conv is not None, tasks, n, l2=l2n > 0)
    y = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    if conv is None:
        ring, cw, tab, c, save = y, y, y, 0, 0
    else:
        ring, cw, c = conv.ring, conv.weight, conv.ring.shape[0]
        tab, save = (conv.slots, 1) if conv.slots is not None else (conv.ring, 0)
    pdl = cuda_launch.flags(x.device)["PDL"]
    args = [cuda_nvrtc.tensor_map(w, tc, cfg[2]), ctypes.c_void_p(x.data_ptr()), ctypes.c_int(x.stride(0)),
            ctypes.c_void_p(w.data_ptr()),
            ctypes.c_void_p(y.data_ptr()), ctypes.c_int(rows), ctypes.c_int(n), ctypes.c_void_p(ring.data_ptr()),
            ctypes.c_void_p(cw.data_ptr()), ctypes.c_void_p(tab.data_ptr()), ctypes.c_int(c), ctypes.c_int(save),
            ctypes.c_int(int(pdl)), ctypes.c_void_p(STAMPS.data_ptr() if STAMPS is not None else 0)]
    args += [ctypes.c_void_p(l2p), ctypes.c_uint64(l2n)]
    grid = _ctas(k, n, cfg, x.device)
    if DYN:
        site = _sites.setdefault((cuda_nvrtc.index(x.device), w.data_ptr()), len(_sites))
        ns0 = dyn_static(k, n, cfg, grid, c) if site < SITES else 0
        args += [ctypes.c_int(ns0), ctypes.c_int(site if ns0 else 0)]
    cuda_nvrtc.launch(fn, smem, threads, grid, torch.cuda.current_stream(x.device).cuda_stream, pdl, args,
                      "stream_gemv")
    return y


def l2_plan(pairs, sms: int, skip_slots: bool = True) -> dict[int, tuple[int, int]]:
    """L2_NEXT for (weight, next weight) pairs: while the product with `weight` runs, the bytes of
    `next weight` that its own product cannot request before its wait (the rows of the tasks past
    the first PRE // UPW of each CTA: tasks are dealt to CTAs in turn, so those are the weight's last
    rows) are asked into L2; all of it where skip_slots is False. A next weight this kernel does not
    take is left out."""
    plan = {}
    for w, nxt in pairs:
        cfg = config(nxt.shape[1], nxt.shape[0])
        if cfg is None or not nxt.is_contiguous() or nxt.dtype != torch.bfloat16 or nxt.data_ptr() % 16:
            continue
        cg, warps, kc, spw = cfg
        n, k, tc = nxt.shape[0], nxt.shape[1], 8 * cg
        ahead = _pre(spw) // ((k // warps) // kc)     # tasks a CTA has requested before its wait (units / UPW)
        skip = min(n, ahead * min(n // tc, sms) * tc) if skip_slots else 0
        if skip < n:
            plan[w.data_ptr()] = (nxt.data_ptr() + skip * k * 2, (n - skip) * k * 2)
    return plan
