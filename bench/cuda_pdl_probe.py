"""How far a programmatic dependent launch (PDL) lets a product's weight loads run ahead, and
what the preloading products (cuda_gemv.PRELOAD_CONFIG) cost on their own (issue 9).

  timeline  a graphed chain busy1 -> busy2 -> loader, each busy kernel one program spinning on
            the global timer, the loader 256 programs each loading 64 KB of weights before its
            wait; every program stamps the global timer at its start, when its loads are in
            registers, after its wait and at its end. Arms: no kernel early, busy2 early, both
            early (cuda_launch.enter): does the loader start while busy1 still runs?
  wake      how long after a kernel's end its dependent's programs pass their wait, launched
            after its wait (the default) or early, with 0-3 early kernels between
  products  the exact product chained over 16 weight copies (more than L2 holds), one row: the
            base blocks against each preload configuration, us per product
  chains    per "layer" a recurrence-like kernel (256 programs spinning ~3 us), a norm-like one
            (32 programs, ~1.3 us) and the output product (4096 -> 2048 partials), 40 layers over
            16 weight copies: EARLY_LAUNCH and PRELOAD off / each / both, us per layer

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
from cuda_timing import capture, replay_us  # noqa: E402

from verispec.ops import cuda_fusions, cuda_gemv, cuda_launch  # noqa: E402

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
        p = tl.program_id(0) * 4
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

    @triton.jit
    def _spin(t_ptr, ns, PDL: tl.constexpr, EARLY: tl.constexpr):
        cuda_launch.enter(PDL, EARLY)
        t1 = _now()
        t = t1
        while t < t1 + ns:
            t = _now()
        if tl.program_id(0) == 0:
            tl.store(t_ptr, t)


def timeline(res: dict) -> None:
    f = cuda_launch.flags(torch.device("cuda"))
    pdl = f["PDL"]
    g_load, bn, kp = 256, 32, 1024
    w = (torch.randn(g_load * bn * kp, device="cuda") * 0.01).to(BF)
    out = torch.empty(g_load, device="cuda")
    t1, t2, t3 = (torch.zeros(n * 4, dtype=torch.int64, device="cuda") for n in (1, 1, g_load))
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    for name, e1, e2 in (("none", False, False), ("busy2_early", False, True), ("both_early", True, True)):
        def chain():
            flush.zero_()                 # the weights out of L2 (a non-PDL kernel before the chain)
            _busy[(1,)](t1, 5000, PDL=pdl, EARLY=e1 and pdl, **{k: v for k, v in f.items() if k != "PDL"})
            _busy[(1,)](t2, 2000, PDL=pdl, EARLY=e2 and pdl, **{k: v for k, v in f.items() if k != "PDL"})
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


def products(res: dict) -> None:
    for (k, n), pre in sorted(cuda_gemv.PRELOAD_CONFIG.items()):
        ws = [(torch.randn(n, k, device="cuda") * k ** -0.5).to(BF) for _ in range(16)]
        x = torch.randn(1, k, device="cuda").to(BF)
        cands = {"base": cuda_gemv.CONFIG.get((k, n), cuda_gemv.DEFAULT), "preload": pre,
                 "preload_kp0": pre[:5] + (0,)}
        for name, cfg in cands.items():
            split = len(cfg) > 4 and cfg[4] > 1
            g = capture(lambda cfg=cfg, split=split: [cuda_gemv.linear_rows(x, ws[i % 16], config=cfg, partials=split)
                                                      for i in range(40)])
            us = statistics.median(replay_us(g) for _ in range(5)) / 40
            mb = n * k * 2 / 1e6
            res.setdefault("products", {})[f"{k}x{n} {name} {cfg}"] = us
            print(f"[products] {k} -> {n} {name} {cfg}: {us:.2f} us ({mb / us:.2f} TB/s)", flush=True)


def chains(res: dict) -> None:
    k, n = 4096, 2048
    ws = [(torch.randn(n, k, device="cuda") * k ** -0.5).to(BF) for _ in range(16)]
    x = torch.randn(1, k, device="cuda").to(BF)
    ts = torch.zeros(1, dtype=torch.int64, device="cuda")
    arms = {"none": (False, False), "early": (True, False), "preload": (False, True), "both": (True, True)}
    kept = cuda_fusions.EARLY_LAUNCH, cuda_fusions.PRELOAD
    graphs = {}
    try:
        for name, (early, pre) in arms.items():
            cuda_fusions.EARLY_LAUNCH, cuda_fusions.PRELOAD = early, pre

            def layer_chain():
                fe = cuda_launch.flags_early(x.device)
                for i in range(40):
                    _spin[(256,)](ts, 3000, num_warps=2, **fe)
                    _spin[(32,)](ts, 1300, num_warps=1, **fe)
                    cuda_gemv.linear_rows(x, ws[i % 16], partials=cuda_gemv.splits(k, n))
            graphs[name] = capture(layer_chain)
        times = {name: [] for name in arms}
        for _ in range(7):
            for name in arms:
                times[name].append(replay_us(graphs[name]) / 40)
    finally:
        cuda_fusions.EARLY_LAUNCH, cuda_fusions.PRELOAD = kept
    res["chains"] = {name: statistics.median(v) for name, v in times.items()}
    print("[chains] us per layer (spin 3 us, spin 1.3 us, out product): " +
          "; ".join(f"{k} {v:.2f}" for k, v in res["chains"].items()), flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    p.add_argument("--sections", default="timeline,wake,products,chains")
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("cuda_pdl_probe: no CUDA GPU", file=sys.stderr)
        return 2
    res: dict = {"device": torch.cuda.get_device_name()}
    for name in a.sections.split(","):
        globals()[name](res)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "cuda_pdl_probe.json").write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
