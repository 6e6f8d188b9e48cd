"""How much faster does a decode product run when its weights are already in L2? (issue 9)

The question behind the L2 prefetch experiment (docs/cuda-history.md, eighth session; the kernels below):
if a product whose weights sit in L2 is not much faster than one reading them from DRAM,
fetching weights early cannot pay, whatever the timing. Each case is a CUDA graph replayed
back to back (so no host gap is timed) and its time minus that of the same graph without
the product; L2 is flushed by reading a 256 MiB buffer (clean lines: a write would leave
dirty ones to be written back during the product).

  cold        flush, product                      (the weights come from DRAM)
  warm        product, product  (the second one)  (weights in L2 where they fit: 50 MiB)
  and for each way of prefetching the weights (bulk: cp.async.bulk.prefetch.L2 in 64 KiB
  chunks; lines: prefetch.global.L2 per 128-byte line; touch: loads with evict_last; 132 or
  264 programs): the prefetch launch alone (flush, prefetch), the product right after it,
  and the product after a ~20 us spin.

  python3 bench/cuda_l2_probe.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch

try:  # CUDA builds of torch ship triton; without it there is nothing to probe
    import triton
    import triton.language as tl
except ImportError:
    triton = None

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cuda_timing import capture, replay_us  # noqa: E402

from verispec.ops import cuda_gemv  # noqa: E402

CHUNK = 1 << 16          # bytes per bulk prefetch


def span(t: torch.Tensor) -> tuple[int, int]:
    """(address, bytes) of a contiguous tensor, widened to 16-byte boundaries."""
    lo = t.data_ptr() & ~15
    return lo, (t.data_ptr() + t.numel() * t.element_size() - lo + 15) & ~15


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

    SHAPES = {"out_proj 4096x2048": (4096, 2048), "router 2048x1288": (2048, 1288), "in_proj 2048x12352": (2048, 12352),
              "attn_qkv 2048x9216": (2048, 9216)}

def graph_of(fns) -> torch.cuda.CUDAGraph:
    return capture(lambda: [f() for f in fns])


def diff(with_, without, rounds: int) -> tuple[float, float, float]:
    """Median, min, max over rounds of (with - without), interleaved."""
    d = []
    for _ in range(rounds):
        d.append(replay_us(with_, 40) - replay_us(without, 40))
    return statistics.median(d), min(d), max(d)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    a = p.parse_args()
    if not torch.cuda.is_available() or triton is None:
        print("cuda_l2_probe: needs a CUDA GPU and triton", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    flush_buf = torch.empty(64 << 20, dtype=torch.float32, device=dev)   # 256 MiB, read (clean lines)
    flush = lambda: flush_buf.sum()  # noqa: E731
    spin = lambda: torch.cuda._sleep(40000)  # noqa: E731  (cycles: ~20 us; measured as spin_us)
    sink = torch.zeros(1, device=dev)
    res = {"device": torch.cuda.get_device_name(), "cases": {}}
    for name, (k, n) in SHAPES.items():
        w = (torch.randn(n, k, device=dev) * k ** -0.5).to(torch.bfloat16)
        x = torch.randn(1, k, device=dev).to(torch.bfloat16)
        part = cuda_gemv.splits(k, n)
        prod = lambda: cuda_gemv.linear_rows(x, w, partials=part)  # noqa: E731
        lo, nb = span(w)
        methods = {
            "bulk132": lambda: _prefetch[(132,)](lo, nb, 0, 0, 0, 0, CHUNK=CHUNK, LANES=32,
                                                               num_warps=1),
            "lines132": lambda: _lines[(132,)](lo, nb, 0, 0, 0, 0, LINES=128, num_warps=4),
            "touch132": lambda: _touch[(132,)](w, w.numel(), w, 0, w, 0, sink, BLOCK=8192, num_warps=4),
            "touch264": lambda: _touch[(264,)](w, w.numel(), w, 0, w, 0, sink, BLOCK=4096, num_warps=4)}
        g = {"flush": graph_of([flush]), "cold": graph_of([flush, prod]), "one": graph_of([prod]),
             "two": graph_of([prod, prod]), "flush_spin": graph_of([flush, spin])}
        case = {"MB": w.numel() * 2 / 1e6,
                "cold_us": diff(g["cold"], g["flush"], a.rounds),
                "warm_us": diff(g["two"], g["one"], a.rounds),
                "spin_us": diff(g["flush_spin"], g["flush"], a.rounds)}
        line = (f"{name} ({case['MB']:.1f} MB): cold {case['cold_us'][0]:.2f} us [{case['cold_us'][1]:.2f}-"
                f"{case['cold_us'][2]:.2f}], warm {case['warm_us'][0]:.2f} [{case['warm_us'][1]:.2f}-{case['warm_us'][2]:.2f}]")
        for mname, pf in methods.items():
            gp = {"pf": graph_of([flush, pf]), "pf_prod": graph_of([flush, pf, prod]),
                  "pf_spin": graph_of([flush, pf, spin]), "pf_spin_prod": graph_of([flush, pf, spin, prod])}
            case[mname] = {"launch_us": diff(gp["pf"], g["flush"], a.rounds),
                           "then_product_us": diff(gp["pf_prod"], gp["pf"], a.rounds),
                           "landed_product_us": diff(gp["pf_spin_prod"], gp["pf_spin"], a.rounds)}
            m = case[mname]
            line += (f"; {mname}: launch {m['launch_us'][0]:.2f}, product right after {m['then_product_us'][0]:.2f}, "
                     f"after a spin {m['landed_product_us'][0]:.2f}")
        res["cases"][name] = case
        print(line + f" (spin {case['spin_us'][0]:.2f} us)", flush=True)
        del g, w
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cuda_l2_probe.json").write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
