"""Programmatic dependent launch (PDL) for the exact path's Triton kernels.

A decode step is some 700 small kernels in a row, each waiting for the one before it. With
PDL (Hopper and later) a kernel may be launched and its programs made resident while the
previous kernel is still finishing: each of our kernels begins with `griddepcontrol.wait`
(nothing is read or written before the previous kernel has completed and its memory is
visible) and then signals `launch_dependents`, so the launch of the next kernel overlaps the
tail of this one instead of following it. The arithmetic is untouched (same kernels, same
order), so the bits are the same with PDL on or off; only the gaps between kernels change.

`VERISPEC_PDL=0` turns it off (the captured graphs then use plain launches).
"""

from __future__ import annotations

import os

import torch

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
