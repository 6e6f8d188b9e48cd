"""Where a decode step's GPU time goes (issue 9): kernels per step, their time, and the gaps.

On a random 35B-A3B-shaped model (fewer layers: every layer of a kind launches the same
kernels), one exact 1-row forward is profiled graphed and eager with torch.profiler; per
kernel name: launches per step and GPU microseconds per step. Then the GPU's busy time per
step against the step's wall time: the rest is launch latency and gaps between kernels.

  python3 bench/cuda_profile.py --layers 8 --steps 5 --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from verispec.engine import Engine  # noqa: E402
from verispec.execution import Execution  # noqa: E402
from verispec.random_model import preset_config, random_checkpoint  # noqa: E402

PROMPT = [(i * 7919 + 13) % 4000 + 11 for i in range(64)]


def steps(model, state, n: int, rows: int = 1) -> list[float]:
    out = []
    for i in range(n):
        ids = [(101 * i + 7 * j) % 4000 + 5 for j in range(rows)]
        torch.cuda.synchronize()
        t = time.perf_counter()
        model.forward(ids, state, exact=True, save_slots=rows > 1)
        out.append(time.perf_counter() - t)
        if rows > 1:
            state.commit(state.kv_len - rows, rows, 1)
    return out


def kernel_table(prof, n: int) -> tuple[list[dict], float]:
    rows, busy = [], 0.0
    for e in prof.key_averages():
        t = getattr(e, "self_device_time_total", None)
        if t is None:
            t = e.self_cuda_time_total
        if t <= 0 or e.device_type.name != "CUDA":
            continue
        rows.append({"name": e.key[:140], "per_step": e.count / n, "us_per_step": t / n})
        busy += t / n
    rows.sort(key=lambda r: -r["us_per_step"])
    return rows, busy


def profile_arm(eng: Engine, label: str, n: int, rows: int, res: dict) -> None:
    m = eng.model
    st = m.new_state(len(PROMPT) + 4 * n * (rows + 1) + 64)
    m.forward(PROMPT, st)
    st.ensure_slots(max(rows - 1, 1))
    steps(m, st, 3, rows)                                    # warm-up: captures, compiles
    wall = steps(m, st, 10, rows)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        steps(m, st, n, rows)
    table, busy = kernel_table(prof, n)
    launches = sum(r["per_step"] for r in table)
    w = statistics.median(wall) * 1e6
    res[label] = {"wall_us": w, "wall_spread_us": [min(wall) * 1e6, max(wall) * 1e6], "gpu_busy_us": busy,
                  "launches_per_step": launches, "kernels": table[:60]}
    print(f"\n== {label}: wall {w:.0f} us/step (median of 10), GPU busy {busy:.0f} us, "
          f"{launches:.0f} kernel launches per step, gaps {w - busy:.0f} us", flush=True)
    print(f"{'launches':>8} {'us/step':>9}  kernel")
    for r in table[:40]:
        print(f"{r['per_step']:8.1f} {r['us_per_step']:9.1f}  {r['name']}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--rows", default="1,4")
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    a = ap.parse_args()
    cfg = preset_config("qwen3.6-35b-a3b-shape", layers=a.layers)
    ck = random_checkpoint(cfg, seed=0, device="cuda")
    res: dict = {"layers": a.layers, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    with torch.no_grad():
        for graphs in (True, False):
            eng = Engine.from_checkpoint(ck, Execution.for_device("cuda", graphs=graphs), usage_file=os.devnull)
            for rows in (int(x) for x in a.rows.split(",")):
                profile_arm(eng, f"{'graphed' if graphs else 'eager'} rows {rows}", a.steps, rows, res)
            del eng
            torch.cuda.empty_cache()
    Path(a.out).mkdir(parents=True, exist_ok=True)
    with open(Path(a.out) / "cuda_profile.json", "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
