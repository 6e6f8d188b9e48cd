"""Programmatic dependent launch (PDL) for the exact path's Triton kernels.

A decode step is some 700 small kernels in a row, each waiting for the one before it. With
PDL (Hopper and later) a kernel may be launched and its programs made resident while the
previous kernel is still finishing: each of our kernels begins with `griddepcontrol.wait`
(nothing is read or written before the previous kernel has completed and its memory is
visible) and then signals `launch_dependents`, so the launch of the next kernel overlaps the
tail of this one instead of following it. The arithmetic is untouched (same kernels, same
order), so the bits are the same with PDL on or off; only the gaps between kernels change.

A kernel whose successor is a cuda_stream_gemv product (the gated norm, the attention's merge,
the MoE's combine, when cuda_fusions.STREAM is on and the stream products run) signals before its wait (`flags(...,
early=True)`, `enter`): the product's CTAs are then resident while this kernel and the one
before it run, and request their weights then. Safe because the product reads nothing but
weights before its own wait, and a kernel completes only after its wait returned, so the
product's wait still covers every kernel before it.

`VERISPEC_PDL=0` turns it off (the captured graphs then use plain launches).
"""

from __future__ import annotations

import os

import torch

from . import cuda_fusions, cuda_nvrtc

try:
    import triton
    import triton.language as tl
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover
    triton = None

EARLY_STREAM = True     # bench/cuda_bench.py --sections stream turns it off for one arm
# the kernels that lead to those (the recurrence before the gated norm, the attention's attend
# before its merge) signal early too: the product then launches while they run
LINKS = False
enabled = os.environ.get("VERISPEC_PDL", "1") != "0"


def flags(device: torch.device, early: bool | str | None = None) -> dict:
    """Extra launch arguments for one of our kernels on `device`: the kernel's PDL constexpr,
    and Triton's launch_pdl where the GPU has grid dependency control (sm_90+). early (a kernel
    taking EARLY, see enter): whether its successor may be a stream product ("link": a kernel
    before one that may signal early, early when LINKS is set)."""
    out = {} if early is None else {"EARLY": False}
    if not (enabled and device.type == "cuda" and cuda_nvrtc.hopper(device)):
        return {**out, "PDL": False}
    if early and cuda_fusions.STREAM and EARLY_STREAM and (early != "link" or LINKS):
        from . import cuda_stream_gemv    # (imports this module)
        out["EARLY"] = cuda_stream_gemv.available(device)     # else the products are Triton's: nothing to gain
    return {**out, "PDL": True, "launch_pdl": True}


if triton is not None:
    @triton.jit
    def enter(PDL: tl.constexpr, EARLY: tl.constexpr):
        """A kernel's first step: wait for the previous kernel, and let the next one launch
        (before the wait when EARLY, after it otherwise)."""
        if PDL:
            if EARLY:
                gdc_launch_dependents()
            gdc_wait()
            if not EARLY:
                gdc_launch_dependents()
