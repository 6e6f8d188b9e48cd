"""Weights asked of L2 while the memory is idle, so the product that reads them starts warm.

Between two weight-streaming products a decode step runs small kernels (the recurrence, a
norm, the router) during which the DRAM does almost nothing, and each product then pays a
ramp before its reads reach the copy rate. The weights do not depend on the activations, so
they can be fetched early: a prefetch launch issues Hopper's bulk L2 prefetch
(`cp.async.bulk.prefetch.L2`: one instruction per chunk, nothing comes back to the SM) for
the regions later products read. It runs on a side stream forked from the main one (a
branch of the captured graph): it starts when the kernel before the fork has finished and
nothing on the main stream waits for it until `join` at the end of the forward, since an SM
issues these prefetches at only ~0.2 TB/s (measured: a prefetch launch placed in the chain
made every kernel after it wait for its issue, docs/cuda.md). It touches no data, so the
arithmetic is unchanged; only where the bytes come from.

SITES picks the places (a capture-time option, as the kernels' blocks are).
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None

# out: a mixer's output product, router: the router product and the shared expert (both
# forked after the mixer's input product, during the recurrence / attention); down: the
# routed experts' down weights, forked after the router (during gate/up); next: the first
# `next` MiB of the next layer's input product, forked after the experts (during the combine)
SITES = {"out": False, "router": False, "down": False, "next": 0}
CHUNK = 1 << 16          # bytes per bulk prefetch
PROGRAMS = 32            # programs of a prefetch launch (one warp each)
_side: dict[int, torch.cuda.Stream] = {}
_forked: set[int] = set()

if triton is not None:
    @triton.jit
    def _bulk_l2(addr, nbytes, ok):
        """Prefetch [addr, addr + nbytes) into L2 where ok (int64 addresses, sizes multiples of 16)."""
        return tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.b32 p, $3, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
            "=r,l,r,r", [addr, nbytes, ok.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)

    @triton.jit
    def _issue(addr, nbytes, part, parts, CHUNK: tl.constexpr, LANES: tl.constexpr):
        """Program `part` of `parts` prefetches chunks part*LANES.., every parts*LANES-th block of LANES."""
        nch = (nbytes + CHUNK - 1) // CHUNK
        lanes = tl.arange(0, LANES)
        for c0 in range(part * LANES, nch, parts * LANES):
            c = (c0 + lanes).to(tl.int64)
            size = tl.minimum(nbytes - c * CHUNK, CHUNK).to(tl.int32)
            _bulk_l2(addr + c * CHUNK, size, c < nch)

    @triton.jit
    def _prefetch(a0, n0, a1, n1, a2, n2, CHUNK: tl.constexpr, LANES: tl.constexpr):
        part = tl.program_id(0)
        parts = tl.num_programs(0)
        _issue(a0, n0, part, parts, CHUNK, LANES)
        _issue(a1, n1, part, parts, CHUNK, LANES)
        _issue(a2, n2, part, parts, CHUNK, LANES)

    @triton.jit
    def _lines_l2(addr, ok):
        """prefetch.global.L2::evict_last of the 128-byte line at each address where ok."""
        return tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2::evict_last [$1]; mov.u32 $0, 0; }",
            "=r,l,r", [addr, ok.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)

    @triton.jit
    def _lines_region(a, n, part, parts, LINES: tl.constexpr):
        nl = (n + 127) // 128
        lanes = tl.arange(0, LINES).to(tl.int64)
        for l0 in range(part * LINES, nl, parts * LINES):
            _lines_l2(a + (l0 + lanes) * 128, (l0 + lanes) < nl)

    @triton.jit
    def _lines(a0, n0, a1, n1, a2, n2, LINES: tl.constexpr):
        """The regions' 128-byte lines, LINES per pass, spread over the programs."""
        part = tl.program_id(0)
        parts = tl.num_programs(0)
        _lines_region(a0, n0, part, parts, LINES)
        _lines_region(a1, n1, part, parts, LINES)
        _lines_region(a2, n2, part, parts, LINES)

    @triton.jit
    def _touch_region(w, n, part, parts, acc, BLOCK: tl.constexpr):
        for b in range(part * BLOCK, n, parts * BLOCK):
            offs = b + tl.arange(0, BLOCK)
            acc += tl.load(w + offs, mask=offs < n, other=0.0, eviction_policy="evict_last").to(tl.float32)
        return acc

    @triton.jit
    def _touch(w0, n0, w1, n1, w2, n2, sink_ptr, BLOCK: tl.constexpr):
        """Read the regions (element counts n*) with loads that ask L2 to keep the lines; the
        sum goes to sink only on a value it never has, so the loads are not optimised away."""
        part = tl.program_id(0)
        parts = tl.num_programs(0)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        acc = _touch_region(w0, n0, part, parts, acc, BLOCK)
        acc = _touch_region(w1, n1, part, parts, acc, BLOCK)
        acc = _touch_region(w2, n2, part, parts, acc, BLOCK)
        total = tl.sum(acc, 0)
        if total == -1.0e38:
            tl.store(sink_ptr, total)

    @triton.jit
    def _prefetch_experts(ids_ptr, n_ids, base, sh_addr, stride, nbytes, E: tl.constexpr, CHUNK: tl.constexpr,
                          NCH: tl.constexpr, LANES: tl.constexpr):
        """Each id's weights (nbytes at base + id * stride; id E: the shared expert, at sh_addr),
        NCH chunks per id, spread over the programs."""
        part = tl.program_id(0)
        parts = tl.num_programs(0)
        lanes = tl.arange(0, LANES)
        for c0 in range(part * LANES, n_ids * NCH, parts * LANES):
            c = c0 + lanes
            ok = c < n_ids * NCH
            e = tl.load(ids_ptr + c // NCH, mask=ok, other=0).to(tl.int64)
            off = (c % NCH).to(tl.int64) * CHUNK
            start = tl.where(e == E, sh_addr, base + e * stride)
            size = tl.minimum(nbytes - off, CHUNK)
            _bulk_l2(start + off, tl.maximum(size, 0).to(tl.int32), ok & (size > 0))


def usable(device: torch.device) -> bool:
    return triton is not None and device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def span(t: torch.Tensor, nbytes: int | None = None) -> tuple[int, int]:
    """(address, bytes) of a contiguous tensor's storage, the first `nbytes` of it if given,
    widened to 16-byte boundaries."""
    if not t.is_contiguous():
        raise ValueError("prefetch needs a contiguous region")
    lo = t.data_ptr()
    hi = lo + (t.numel() * t.element_size() if nbytes is None else min(nbytes, t.numel() * t.element_size()))
    lo &= ~15
    return lo, (hi - lo + 15) & ~15


def _fork(device: torch.device):
    """The side stream, made to wait for everything the main stream has queued so far."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    side = _side.get(idx)
    if side is None:
        side = _side[idx] = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    _forked.add(idx)
    return torch.cuda.stream(side)


def prefetch(device: torch.device, *regions: torch.Tensor | tuple[int, int]) -> None:
    """Ask L2 for up to three regions on `device` (tensors, or (address, bytes) from span), from
    the side stream once the main stream's queued work is done; nothing where it cannot run."""
    if len(regions) > 3:
        raise ValueError("at most three regions per prefetch launch")
    if not regions or not usable(device):
        return
    regions = [span(t) if isinstance(t, torch.Tensor) else t for t in regions]
    args = [v for r in regions + [(0, 0)] * (3 - len(regions)) for v in r]
    with _fork(device):
        _prefetch[(PROGRAMS,)](*args, CHUNK=CHUNK, LANES=32, num_warps=1)


def prefetch_experts(ids: torch.Tensor, w_all: torch.Tensor, shared: torch.Tensor) -> None:
    """Ask L2 for the weights of the experts in ids (int32, on the device; id E = w_all.shape[0]
    is the shared expert, whose weights are `shared`), once the main stream has written ids."""
    if not usable(ids.device):
        return
    if not (w_all.is_contiguous() and shared.is_contiguous() and ids.is_contiguous()):
        raise ValueError("expert prefetch needs contiguous weights and ids")
    each = w_all[0].numel() * w_all.element_size()
    with _fork(ids.device):
        _prefetch_experts[(PROGRAMS,)](ids, ids.numel(), w_all.data_ptr(), shared.data_ptr(), each, each,
                                       E=w_all.shape[0], CHUNK=CHUNK, NCH=triton.cdiv(each, CHUNK), LANES=32,
                                       num_warps=1)


def join(device: torch.device) -> None:
    """Make the main stream wait for the side stream's prefetches (a captured graph must end
    with its branches joined); nothing if none was forked since the last join."""
    idx = device.index if device.index is not None else (torch.cuda.current_device() if device.type == "cuda" else -1)
    if idx in _forked:
        torch.cuda.current_stream(device).wait_stream(_side[idx])
        _forked.discard(idx)
