"""Block sizes for the decode matrix-product kernel (verispec/ops/cuda_gemv.py), per weight shape.

For every decode/verify product of the 35B-A3B shape, every candidate configuration is timed
(CUDA events around a CUDA graph of 32 calls, so the time is the GPU's, not Python's launches;
several copies of the weight are cycled so it comes from HBM, not L2) at 1 and 4 rows, beside
cuBLAS on the same rows padded to 16 (the path it replaces). Prints the best per shape and
the CONFIG table to paste; writes cuda_gemv_sweep.json.

  python3 bench/cuda_gemv_sweep.py --out $OUT
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cuda_timing import graph_us  # noqa: E402
from verispec.ops import cuda_gemv  # noqa: E402

# (K, N): DeltaNet in_proj, attention qkv, DeltaNet/attention out, router + shared (padded),
# shared expert down, MTP fc, lm_head
SHAPES = [(2048, 12352), (2048, 9216), (4096, 2048), (2048, 1288), (512, 2048), (4096, 2048), (2048, 248320)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    ap.add_argument("--shapes", default="", help="KxN,... (default: every decode shape)")
    ap.add_argument("--partials", action="store_true",
                    help="time split-K candidates without their sum (the model hands partials to the consumer)")
    a = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")] if a.shapes else SHAPES
    torch.manual_seed(0)
    bf = torch.bfloat16
    res = {"gpu": torch.cuda.get_device_name(), "shapes": {}}
    table = {}
    for k, n in dict.fromkeys(shapes):
        copies = max(1, math.ceil(256e6 / (k * n * 2)))
        ws = [(torch.randn(n, k, device="cuda") * k ** -0.5).to(bf) for _ in range(copies)]
        out = {"cublas_padded": {}, "configs": []}
        for rows in (1, 4):
            x = torch.randn(rows, k, device="cuda").to(bf)
            pad = torch.zeros(16, k, device="cuda", dtype=bf)
            out["cublas_padded"][rows] = graph_us([lambda w=w: F.linear(pad, w) for w in ws])
        cands = [(bn, bk, nw, ns, 1) for bn, bk, nw, ns in itertools.product((16, 32, 64, 128), (64, 128, 256),
                                                                                (4, 8), (3, 4))]
        if n * k < 64e6:       # few output columns: also split K (2, 4, 8 chunks)
            cands += [(bn, bk, nw, ns, sp) for bn, bk, nw, ns, sp in itertools.product((16, 32, 64), (64, 128, 256),
                                                                                      (4,), (3, 4), (2, 4, 8))]
        for cfg in cands:
            bn, bk, nw, ns, sp = cfg
            if bk > k or k % (bk * sp):
                continue
            row = {"cfg": list(cfg)}
            try:
                for rows in (1, 4):
                    x = torch.randn(rows, k, device="cuda").to(bf)
                    part = a.partials and sp > 1
                    row[rows] = graph_us([lambda w=w: cuda_gemv.linear_rows(x, w, cfg, partials=part) for w in ws])
            except Exception as e:    # out of resources: not a candidate
                print(k, n, cfg, type(e).__name__, flush=True)
                continue
            out["configs"].append(row)
        best = sorted(out["configs"], key=lambda r: r[1] + 0.25 * r[4])[:5]
        gb = k * n * 2 / 1e9
        print(f"K {k} N {n} ({gb * 1e3:.0f} MB): cuBLAS padded {out['cublas_padded'][1]:.1f} / "
              f"{out['cublas_padded'][4]:.1f} us (1 / 4 rows); best: " + "; ".join(
                  f"{r['cfg']} {r[1]:.1f} / {r[4]:.1f} us ({gb / r[1] * 1e6 / 1e3:.2f} TB/s)" for r in best), flush=True)
        res["shapes"][f"{k}x{n}"] = out
        table[(k, n)] = tuple(best[0]["cfg"])
        del ws
        torch.cuda.empty_cache()
    print("CONFIG = {" + ", ".join(f"({k}, {n}): {v[:4] if v[4] == 1 else v}" for (k, n), v in table.items()) + "}")
    Path(a.out).mkdir(parents=True, exist_ok=True)
    with open(Path(a.out) / "cuda_gemv_sweep.json", "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
