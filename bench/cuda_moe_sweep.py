"""Block sizes for the routed-expert kernels (verispec/ops/cuda_moe.py), measured on the GPU.

The kernels' configurations are fixed in the code (a tuner choosing per row count would change
the reduction order with it), so they are chosen here, once: every candidate is timed with CUDA
events on the 35B-A3B expert shapes (256 experts, 2048 x 512, top-8), 1 and 4 rows, the expert
ids cycling through 32 random sets (calls captured in a CUDA graph: GPU time, not Python's launches) so the weights come from HBM, not L2. Prints the best few
per kernel and the bandwidth they reach (expert bytes read / time).

  python3 bench/cuda_moe_sweep.py --out $OUT [--wide]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cuda_timing import graph_us  # noqa: E402
from verispec.ops import cuda_moe  # noqa: E402

E, H, INTER, K = 256, 2048, 512, 8


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    ap.add_argument("--wide", action="store_true",
                    help="narrower output blocks (4), longer K blocks (up to all of K) and 16 warps too")
    a = ap.parse_args()
    if a.wide:
        cands = list(itertools.product((4, 8, 16), (128, 256, 512, 1024, 2048), (4, 8, 16), (1, 3)))
    else:
        cands = list(itertools.product((8, 16, 32, 64), (128, 256, 512), (4, 8), (1, 3)))
    torch.manual_seed(0)
    bf = torch.bfloat16
    gu = (torch.randn(E, 2 * INTER, H, device="cuda") * H ** -0.5).to(bf)
    dn = (torch.randn(E, H, INTER, device="cuda") * INTER ** -0.5).to(bf)
    res = {"gpu": torch.cuda.get_device_name(), "gate_up": [], "down": [], "combine": []}
    for rows in (1, 4):
        x = torch.randn(rows, H, device="cuda").to(bf)
        sets = [torch.stack([torch.randperm(E, device="cuda")[:K] for _ in range(rows)]).reshape(-1).to(torch.int32)
                for _ in range(32)]
        act = torch.randn(rows * K, INTER, device="cuda").to(bf)
        y = torch.empty(rows * K, H, device="cuda")
        it = itertools.cycle(sets)
        gu_bytes = rows * K * 2 * INTER * H * 2
        dn_bytes = rows * K * H * INTER * 2
        for bn, bk, nw, ns in cands:
            if bn * bk > 32768:
                continue
            try:
                t = graph_us([lambda: cuda_moe._gate_up_act[(rows * K, INTER // bn)](
                    x, gu, next(it), act, 0, rows, INTER, H, TOP_K=K, E=E, BLOCK_N=bn, BLOCK_K=bk, SHARED_FIRST=False,
                    num_warps=nw, num_stages=ns, PDL=False)])
                res["gate_up"].append({"rows": rows, "cfg": [bn, bk, nw, ns], "us": t, "TBps": gu_bytes / t / 1e6})
            except Exception as e:   # out of shared memory and the like: not a candidate
                print("gate_up", bn, bk, nw, ns, type(e).__name__, flush=True)
            if bk > INTER:
                continue
            try:
                t = graph_us([lambda: cuda_moe._down_pair[(rows * K, H // bn)](
                    act, dn, next(it), y, 0, H, INTER, E=E, BLOCK_N=bn, BLOCK_K=bk, num_warps=nw, num_stages=ns,
                    PDL=False)])
                res["down"].append({"rows": rows, "cfg": [bn, bk, nw, ns], "us": t, "TBps": dn_bytes / t / 1e6})
            except Exception as e:
                print("down", bn, bk, nw, ns, type(e).__name__, flush=True)
        wts = torch.rand(rows * K, device="cuda")
        out = torch.empty(rows, H, device="cuda", dtype=bf)
        for blk, nw in itertools.product((256, 512, 1024, 2048), (2, 4, 8)):
            # the shared expert's output gated by a sigmoid (the model's exact path now fuses the
            # combine with the residual add and norm: cuda_moe.experts_add_norm)
            t = graph_us([lambda: cuda_moe._combine[(rows, H // blk)](y, wts, out, wts, 1, out, out, out, out, 0.0, H,
                                                                    TOP_K=K, SLOTS=K, HAS_EXTRA=True, HAS_GATE=True,
                                                                    SHARED=False, NORM=False, BLOCK=blk,
                                                                    num_warps=nw, PDL=False)])
            res["combine"].append({"rows": rows, "cfg": [blk, 0, nw, 1], "us": t})
    for kern in ("gate_up", "down", "combine"):
        for rows in (1, 4):
            best = sorted((r for r in res[kern] if r["rows"] == rows), key=lambda r: r["us"])[:6]
            print(f"{kern}, {rows} row(s): " + "; ".join(
                f"{r['cfg']} {r['us']:.1f} us" + (f" {r['TBps']:.2f} TB/s" if "TBps" in r else "") for r in best),
                flush=True)
        cur = cuda_moe.CONFIG[kern]
        now = [r for r in res[kern] if r["cfg"] == list(cur)]
        print(f"{kern}: the configured {list(cur)}: " + "; ".join(f"{r['rows']} row(s) {r['us']:.1f} us" for r in now))
    Path(a.out).mkdir(parents=True, exist_ok=True)
    with open(Path(a.out) / ("cuda_moe_sweep_wide.json" if a.wide else "cuda_moe_sweep.json"), "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
