"""Programmatic dependent launch (PDL) for the exact path's Triton kernels.

A decode step is some 700 small kernels in a row, each waiting for the one before it. With
PDL (Hopper and later) a kernel may be launched and its programs made resident while the
previous kernel is still finishing: each of our kernels begins with `griddepcontrol.wait`
(nothing the previous kernels write is read, and nothing is written, before the previous
kernel has completed and its memory is visible) and signals `launch_dependents`, so the
launch of the next kernel overlaps the tail of this one instead of following it. The
arithmetic is untouched (same kernels, same order), so the bits are the same with PDL on or
off; only the gaps between kernels change.

By default a kernel signals after its wait, so when a kernel starts, the launch two back has
completed. An EARLY kernel (`enter(PDL, EARLY)`, cuda_fusions.EARLY_LAUNCH) signals before
its wait: its successor may then start while the kernels before it still run. That is what
lets a product after a chain of latency-bound kernels (the recurrence, the gated norm, the
attention's three, the MoE's combine) stream its weights during them (cuda_gemv's preload).
The successor's own wait still covers everything before it (a kernel completes only after its
wait returned), so this is safe for every successor that reads nothing but weights before its
wait. The one kernel that reads more is the experts' gate/up (its shared programs read x, made
two launches back): the router before it never signals early.

`VERISPEC_PDL=0` turns it off (the captured graphs then use plain launches).
"""

from __future__ import annotations

import os

import torch

from . import cuda_fusions

try:
    import triton
    import triton.language as tl
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover
    triton = None

enabled = os.environ.get("VERISPEC_PDL", "1") != "0"
_capable: dict[int, bool] = {}


def flags(device: torch.device) -> dict:
    """Extra launch arguments for one of our kernels on `device`: the kernel's PDL constexpr,
    and Triton's launch_pdl where the GPU has grid dependency control (sm_90+)."""
    if not (enabled and device.type == "cuda"):
        return {"PDL": False}
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _capable:
        _capable[idx] = torch.cuda.get_device_capability(idx)[0] >= 9
    return {"PDL": True, "launch_pdl": True} if _capable[idx] else {"PDL": False}


# Kernels that only lead to an early kernel (the recurrence before the gated norm, the attention's
# first two before its merge) signal early too when LINKS is set. Off: each early kernel that waits
# longer wakes later (bench/cuda_pdl_probe.py --sections wake: a dependent passed its wait 0.26 us
# after its predecessor's end, 0.51 us when launched early, 0.77 and 1.79 us behind 1 and 3 more
# early kernels), and a product launched when the kernel before its early one starts still
# streams through that kernel.
LINKS = False


def flags_early(device: torch.device, link: bool = False) -> dict:
    """flags() for a kernel taking EARLY (see enter): early when PDL is on and EARLY_LAUNCH is (for
    a link, when LINKS is too)."""
    f = flags(device)
    return {**f, "EARLY": f["PDL"] and cuda_fusions.EARLY_LAUNCH and (LINKS or not link)}


if triton is not None:
    @triton.jit
    def enter(PDL: tl.constexpr, EARLY: tl.constexpr = False):
        """A kernel's first step: wait for the previous kernel, and let the next one launch
        (before the wait when EARLY, after it otherwise)."""
        if PDL:
            if EARLY:
                gdc_launch_dependents()
            gdc_wait()
            if not EARLY:
                gdc_launch_dependents()
