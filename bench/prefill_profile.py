"""Where a batched prefill's time goes on the GPU: one prompt through `--prefill-batch on` under
torch.profiler, GPU time summed by kernel, at a random-weight shape.

    python3 bench/prefill_profile.py [--random-config qwen3.6-35b-a3b-shape] [--tokens 4096] [--layers N]

Prints the wall time of the profiled prefill (after one warm-up), the GPU time summed over its
kernels, and the kernels with the most GPU time; writes the table to --out (JSON).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from verispec.execution import Execution
from verispec.engine import Engine
from verispec.random_model import preset_config, random_checkpoint

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--random-config", default="qwen3.6-35b-a3b-shape")
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "prefill_profile.json"))
    a = p.parse_args()
    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU")
    cfg = preset_config(a.random_config, a.layers)
    ex = Execution.for_device("cuda")
    model = Engine.from_checkpoint(random_checkpoint(cfg, seed=1, device=ex.device, dtype=ex.dtype), ex).model
    ids = torch.tensor([(i * 7919 + 13) % (cfg["vocab_size"] - 1) + 1 for i in range(a.tokens)])
    model.forward(ids, model.new_state(a.tokens + 8), exact=False)          # warm-up: compiles, caches
    st = model.new_state(a.tokens + 8)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        model.forward(ids, st, exact=False)
        wall = time.perf_counter() - t
    rows = {}
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            r = rows.setdefault(ev.name, [0.0, 0])
            r[0] += ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
            r[1] += 1
    total = sum(r[0] for r in rows.values())
    top = sorted(rows.items(), key=lambda kv: -kv[1][0])[:a.top]
    print(f"{a.tokens} tokens, {cfg['num_hidden_layers']} layers: wall {wall * 1e3:.1f} ms "
          f"({a.tokens / wall:.0f} tok/s), GPU kernels {total / 1e3:.1f} ms")
    for name, (us, n) in top:
        print(f"{us / 1e3:9.2f} ms {100 * us / total:5.1f}% {n:6d}x  {name[:110]}")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"tokens": a.tokens, "layers": cfg["num_hidden_layers"], "wall_s": wall,
                                       "gpu_us": total, "kernels": [[n, us, c] for n, (us, c) in top]}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
