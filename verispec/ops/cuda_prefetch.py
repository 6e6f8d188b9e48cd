"""Weights asked of L2 while the memory is idle, so the product that reads them starts warm.

Between two weight-streaming products a decode step runs small kernels (the recurrence, a
norm, the router) during which the DRAM does almost nothing, and each product then pays a
ramp before its reads reach the copy rate. The weights do not depend on the activations, so
they can be fetched early: a prefetch launch issues Hopper's bulk L2 prefetch
(`cp.async.bulk.prefetch.L2`: one instruction per chunk, nothing comes back to the SM) for
the regions the next products read, placed in the chain so that it becomes resident while
the small kernel before it runs (programmatic dependent launch: it is launched when that
kernel starts). It touches no data: it only waits, before it ends, for the kernel before it,
so the kernel after it still sees that kernel's writes. The arithmetic is unchanged; only
where the bytes come from.

The routed experts are known only once the router has run, so the router kernel issues their
prefetch itself (`issue_experts`, cuda_moe._route).

SITES picks the places (a capture-time option, as the kernels' blocks are); every one of them
needs PDL (without it a prefetch launch would run after the kernel before it, not alongside).
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

# out: a mixer's output product during the recurrence / attention; router: the router product
# and the shared expert during the add + norm; experts: the routed experts' gate/up from the
# router; next: the first `next` MiB of the next layer's input product during the combine
SITES = {"out": False, "router": False, "experts": False, "next": 0}
CHUNK = 1 << 16          # bytes per bulk prefetch
PROGRAMS = 16            # programs of a prefetch launch (each one warp)

if triton is not None:
    @triton.jit
    def _bulk_l2(addr, nbytes, ok):
        """Prefetch [addr, addr + nbytes) into L2 where ok (int64 addresses, sizes multiples of 16)."""
        return tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.b32 p, $3, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
            "=r,l,r,r", [addr, nbytes, ok.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)

    @triton.jit
    def issue(addr, nbytes, part, parts, CHUNK: tl.constexpr, LANES: tl.constexpr):
        """Program `part` of `parts` prefetches chunks part*LANES.., every parts*LANES-th block of LANES."""
        nch = (nbytes + CHUNK - 1) // CHUNK
        lanes = tl.arange(0, LANES)
        for c0 in range(part * LANES, nch, parts * LANES):
            c = (c0 + lanes).to(tl.int64)
            size = tl.minimum(nbytes - c * CHUNK, CHUNK).to(tl.int32)
            _bulk_l2(addr + c * CHUNK, size, c < nch)

    @triton.jit
    def issue_experts(ids, base, sh_addr, stride, nbytes, E: tl.constexpr, CHUNK: tl.constexpr, NCH: tl.constexpr):
        """Prefetch each expert's weights of ids [KP] (int32, -1: none; E: the shared expert at
        sh_addr): nbytes from base + id * stride, in NCH chunks."""
        e = ids.to(tl.int64)
        start = tl.where(e == E, sh_addr, base + e * stride)
        c = tl.arange(0, NCH).to(tl.int64)
        size = tl.minimum(nbytes - c * CHUNK, CHUNK)
        ok = (e[:, None] >= 0) & (size[None, :] > 0)
        _bulk_l2(start[:, None] + c[None, :] * CHUNK, tl.maximum(size, 0).to(tl.int32)[None, :], ok)

    @triton.jit
    def _prefetch(a0, n0, a1, n1, a2, n2, CHUNK: tl.constexpr, LANES: tl.constexpr, PDL: tl.constexpr):
        part = tl.program_id(0)
        parts = tl.num_programs(0)
        issue(a0, n0, part, parts, CHUNK, LANES)
        issue(a1, n1, part, parts, CHUNK, LANES)
        issue(a2, n2, part, parts, CHUNK, LANES)
        if PDL:   # the next kernel may launch now; it waits for this one, which ends after the one before
            gdc_launch_dependents()
            gdc_wait()


def usable(device: torch.device) -> bool:
    return triton is not None and device.type == "cuda" and cuda_launch.flags(device).get("PDL", False)


def span(t: torch.Tensor, nbytes: int | None = None) -> tuple[int, int]:
    """(address, bytes) of a contiguous tensor's storage, the first `nbytes` of it if given,
    widened to 16-byte boundaries."""
    if not t.is_contiguous():
        raise ValueError("prefetch needs a contiguous region")
    lo = t.data_ptr()
    hi = lo + (t.numel() * t.element_size() if nbytes is None else min(nbytes, t.numel() * t.element_size()))
    lo &= ~15
    return lo, (hi - lo + 15) & ~15


def prefetch(device: torch.device, *regions: torch.Tensor | tuple[int, int]) -> None:
    """Launch a prefetch into L2 of up to three regions on `device` (tensors, or (address, bytes)
    from span); nothing where it cannot run (no Triton, no PDL)."""
    if len(regions) > 3:
        raise ValueError("at most three regions per prefetch launch")
    if not regions or not usable(device):
        return
    regions = [span(t) if isinstance(t, torch.Tensor) else t for t in regions]
    args = [v for r in regions + [(0, 0)] * (3 - len(regions)) for v in r]
    _prefetch[(PROGRAMS,)](*args, CHUNK=CHUNK, LANES=32, num_warps=1, **cuda_launch.flags(device))
