"""Programmatic dependent launch (PDL) for the exact path's Triton kernels.

A decode step is some 700 small kernels in a row, each waiting for the one before it. With
PDL (Hopper and later) a kernel may be launched and its programs made resident while the
previous kernel is still finishing: each of our kernels begins with `griddepcontrol.wait`
(nothing is read or written before the previous kernel has completed and its memory is
visible) and then signals `launch_dependents`, so the launch of the next kernel overlaps the
tail of this one instead of following it. The arithmetic is untouched (same kernels, same
order), so the bits are the same with PDL on or off; only the gaps between kernels change.

`VERISPEC_PDL=0` turns it off (the captured graphs then use plain launches).

Preloads. Because every kernel signals `launch_dependents` only after its own wait, kernel
N+1 is launched only once kernel N-1 has completed (N's programs passed their wait); a kernel
that never signals (a torch op, a copy) lets the next one launch only when it completes. So a
kernel may read, before its wait, what no launch after N-1 writes: weights, the residual
stream, the recurrent state, or an output of the kernel two launches back. It may not read
before its wait anything the kernel just before it writes, and it writes nothing before its
wait (an output buffer may reuse memory the kernel before it still reads). Reading earlier
moves no value: the same loads, the same arithmetic, so the bits are those of a kernel that
reads everything after its wait (`bench/cuda_bench.py --sections preload` compares the
logits). PRELOAD switches each site; the loads move only with PDL on.
"""

from __future__ import annotations

import os

import torch

enabled = os.environ.get("VERISPEC_PDL", "1") != "0"
_capable: dict[int, bool] = {}
# which kernels read their independent inputs before the wait (see above)
PRELOAD = {"gemv": True, "down": True, "delta": True, "norm": True, "combine": True}


def flags(device: torch.device) -> dict:
    """Extra launch arguments for one of our kernels on `device`: the kernel's PDL constexpr,
    and Triton's launch_pdl where the GPU has grid dependency control (sm_90+)."""
    if not (enabled and device.type == "cuda"):
        return {"PDL": False}
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _capable:
        _capable[idx] = torch.cuda.get_device_capability(idx)[0] >= 9
    return {"PDL": True, "launch_pdl": True} if _capable[idx] else {"PDL": False}


def pre(site: str, device: torch.device) -> bool:
    """Whether the kernel at `site` reads its independent inputs before its wait: PDL on for
    `device` and the site switched on."""
    return PRELOAD.get(site, False) and flags(device)["PDL"]
