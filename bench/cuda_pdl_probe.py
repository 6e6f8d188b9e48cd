"""How far a programmatic dependent launch (PDL) lets a kernel run ahead of the kernels before
it, and what a dependent launched early pays when it wakes (issue 9, eleventh session).

A kernel is EARLY here when it signals its dependents before its own `griddepcontrol.wait`
(the exact path's kernels signal after it, verispec/ops/cuda_launch.py):

  timeline  a graphed chain busy1 -> busy2 -> loader, each busy kernel one program spinning on
            the global timer, the loader 256 programs each loading 64 KB of weights into
            registers before its wait; every program stamps the global timer at its start, when
            its loads are in registers, after its wait and at its end. Arms: no kernel early,
            busy2 early, both early: does the loader start while busy1 still runs?
  wake      how long after a kernel's end its dependent's programs pass their wait, launched
            after its wait (the default) or early, with 0-3 early kernels between

The session's other probes of this idea (the products preloading their weights before the wait,
in registers and by TMA, alone and in a chain of spinning kernels) ran on code since removed;
their raw results are bench/results/cuda_pdl_probe_run63-66.* (docs/cuda-history.md, eleventh session).

  python3 bench/cuda_pdl_probe.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch

try:  # CUDA builds of torch ship triton
    import triton
    import triton.language as tl
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:
    triton = None

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from cuda_timing import capture  # noqa: E402

from verispec.ops import cuda_launch  # noqa: E402

BF = torch.bfloat16

if triton is not None:
    @triton.jit
    def _now():
        return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False,
                                         pack=1)

    @triton.jit
    def _now_after(v):
        # a fake input orders the stamp after v is computed (v's loads complete)
        return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [v], dtype=tl.int64, is_pure=False,
                                         pack=1)

    @triton.jit
    def _busy(t_ptr, ns, PDL: tl.constexpr, EARLY: tl.constexpr):
        t0 = _now()
        cuda_launch.enter(PDL, EARLY)
        t1 = _now()
        t = t1
        while t < t1 + ns:
            t = _now()
        p = tl.program_id(0) * 4      # the loader's four stamps; nothing to load: start twice
        tl.store(t_ptr + p, t0)
        tl.store(t_ptr + p + 1, t0)
        tl.store(t_ptr + p + 2, t1)
        tl.store(t_ptr + p + 3, t)

    @triton.jit
    def _loader(w_ptr, out_ptr, t_ptr, KP: tl.constexpr, BN: tl.constexpr, PDL: tl.constexpr):
        t0 = _now()
        pid = tl.program_id(0)
        w = tl.load(w_ptr + pid * BN * KP + tl.arange(0, BN)[:, None] * KP + tl.arange(0, KP)[None, :])
        s = tl.sum(tl.sum(w.to(tl.float32), axis=1), axis=0)
        t1 = _now_after(s.to(tl.int32, bitcast=True))
        if PDL:
            gdc_wait()
            gdc_launch_dependents()
        t2 = _now()
        tl.store(out_ptr + pid, s)
        p = pid * 4
        tl.store(t_ptr + p, t0)
        tl.store(t_ptr + p + 1, t1)
        tl.store(t_ptr + p + 2, t2)
        tl.store(t_ptr + p + 3, _now())


def timeline(res: dict) -> None:
    f = cuda_launch.flags(torch.device("cuda"))
    pdl, extra = f["PDL"], {k: v for k, v in f.items() if k != "PDL"}
    g_load, bn, kp = 256, 32, 1024
    w = (torch.randn(g_load * bn * kp, device="cuda") * 0.01).to(BF)
    out = torch.empty(g_load, device="cuda")
    t1, t2, t3 = (torch.zeros(n * 4, dtype=torch.int64, device="cuda") for n in (1, 1, g_load))
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    for name, e1, e2 in (("none", False, False), ("busy2_early", False, True), ("both_early", True, True)):
        def chain():
            flush.zero_()                 # the weights out of L2 (a non-PDL kernel before the chain)
            _busy[(1,)](t1, 5000, PDL=pdl, EARLY=e1 and pdl, **extra)
            _busy[(1,)](t2, 2000, PDL=pdl, EARLY=e2 and pdl, **extra)
            _loader[(g_load,)](w, out, t3, KP=kp, BN=bn, num_warps=4, **f)
        g = capture(chain)
        rows = []
        for _ in range(5):
            g.replay()
            torch.cuda.synchronize()
            a, b, c = (t.view(-1, 4).cpu().double() for t in (t1, t2, t3))
            base = a[0, 2]                # busy1's own start of work
            rows.append({"busy1_end": float(a[0, 3] - base), "busy2_start": float(b[0, 0] - base),
                         "busy2_end": float(b[0, 3] - base),
                         "loader_first_start": float(c[:, 0].min() - base),
                         "loader_median_start": float(c[:, 0].median() - base),
                         "loader_last_start": float(c[:, 0].max() - base),
                         "loader_median_loaded": float(c[:, 1].median() - base),
                         "loader_last_loaded": float(c[:, 1].max() - base),
                         "loader_median_after_wait": float(c[:, 2].median() - base),
                         "loader_last_end": float(c[:, 3].max() - base)})
        med = {k: statistics.median(r[k] for r in rows) / 1e3 for k in rows[0]}   # us
        res.setdefault("timeline", {})[name] = med
        print(f"[timeline] {name}: " + ", ".join(f"{k} {v:.2f}" for k, v in med.items()) + " (us from busy1's start)",
              flush=True)


def wake(res: dict) -> None:
    """How long after a kernel ends its dependent's programs pass their wait: busy (one program,
    5 us) -> waiter (256 programs stamping the time after their wait), the waiter launched when
    busy has passed its own wait (the default) or at busy's start (EARLY), and with 1..3 more
    busy kernels of 0 us between (each EARLY), the waiter resident and waiting all along."""
    f = cuda_launch.flags(torch.device("cuda"))
    pdl, extra = f["PDL"], {k: v for k, v in f.items() if k != "PDL"}
    tb = torch.zeros(4, dtype=torch.int64, device="cuda")
    tz = torch.zeros(4, dtype=torch.int64, device="cuda")
    tw = torch.zeros(256 * 4, dtype=torch.int64, device="cuda")
    w = torch.zeros(256 * 32 * 16, device="cuda").to(BF)
    out = torch.empty(256, device="cuda")
    for name, early, between in (("default", False, 0), ("early", True, 0), ("early_1_between", True, 1),
                                 ("early_3_between", True, 3)):
        def chain():
            _busy[(1,)](tb, 5000, PDL=pdl, EARLY=early and pdl, **extra)
            for _ in range(between):
                _busy[(1,)](tz, 0, PDL=pdl, EARLY=pdl, **extra)
            _loader[(256,)](w, out, tw, KP=16, BN=32, num_warps=4, **f)
        g = capture(chain)
        gaps = []
        for _ in range(7):
            g.replay()
            torch.cuda.synchronize()
            b, c = tb.view(-1, 4).cpu().double(), tw.view(-1, 4).cpu().double()
            gaps.append(((c[:, 2].median() - b[0, 3]) / 1e3, (c[:, 2].max() - b[0, 3]) / 1e3))
        med = (statistics.median(float(x[0]) for x in gaps), statistics.median(float(x[1]) for x in gaps))
        res.setdefault("wake", {})[name] = {"median_us": med[0], "last_us": med[1]}
        print(f"[wake] {name}: waiters pass their wait {med[0]:.2f} us (median), {med[1]:.2f} us (last) "
              f"after busy's last stamp", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    p.add_argument("--sections", default="timeline,wake")
    a = p.parse_args()
    sections = a.sections.split(",")
    unknown = set(sections) - {"timeline", "wake"}
    if unknown:
        p.error(f"unknown sections: {', '.join(sorted(unknown))} (timeline, wake)")
    if not torch.cuda.is_available():
        print("cuda_pdl_probe: no CUDA GPU", file=sys.stderr)
        return 2
    res: dict = {"device": torch.cuda.get_device_name()}
    for name in sections:
        globals()[name](res)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "cuda_pdl_probe.json").write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
