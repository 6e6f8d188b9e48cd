"""Weights fetched into L2 before `griddepcontrol.wait`.

With programmatic dependent launch (cuda_launch.py) a kernel's programs are resident while
the kernel before it still runs, and wait there until it is done. A product's weights do not
depend on that kernel, so each program first asks L2 for the first lines of its own weight
rows (`prefetch.global.L2`: no registers, no result, nothing written), then waits; the loads
after the wait find those lines in L2 instead of starting from DRAM. The arithmetic is
untouched: the same loads, in the same order, read the same values.

`VERISPEC_PREFETCH_K` (elements of K per weight row, default 512; 0 = off) sets how much;
`prefetch_k` can be changed before a graph is captured (the benchmark compares settings).
"""

from __future__ import annotations

import os

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None

prefetch_k = int(os.environ.get("VERISPEC_PREFETCH_K", "512"))
LINE = 128                                 # bytes per L2 line


def lines(k_span: int, element_size: int) -> int:
    """Lines of one weight row to prefetch (a power of two, 0 = none) within k_span elements."""
    n = min(prefetch_k, k_span) * element_size // LINE
    return 1 << (n.bit_length() - 1) if n > 0 else 0


if triton is not None:
    @triton.jit
    def prefetch_l2(ptrs):
        """Ask L2 for the line holding each pointer of `ptrs` (any shape); nothing returned."""
        tl.inline_asm_elementwise("prefetch.global.L2 [$1]; // $0", "=r,l", [ptrs], dtype=tl.int32,
                                  is_pure=False, pack=1)
