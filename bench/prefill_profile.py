"""Where a batched prefill's time goes on the GPU: one prompt through `--prefill-batch on` under
torch.profiler, GPU time summed by kernel, at a random-weight shape.

    python3 bench/prefill_profile.py [--random-config qwen3.6-35b-a3b-shape] [--tokens 4096] [--layers N] [--host]

Prints the wall time of the profiled prefill (after one warm-up), the GPU time summed over its
kernels, and the kernels with the most GPU time; writes the table to --out (JSON).
--host instead asks where the host's time goes: how long the forward takes to queue its work
against how long until that work is done (a forward whose queueing takes as long as the whole
is bound by its launches, not the GPU), the operations that made the host wait for the GPU
(torch.cuda.set_sync_debug_mode), and the torch operations by host time and count.
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
    p.add_argument("--host", action="store_true", help="where the host's time goes (see above)")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "prefill_profile.json"))
    a = p.parse_args()
    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU")
    cfg = preset_config(a.random_config, a.layers)
    ex = Execution.for_device("cuda")
    model = Engine.from_checkpoint(random_checkpoint(cfg, seed=1, device=ex.device, dtype=ex.dtype), ex).model
    ids = torch.tensor([(i * 7919 + 13) % (cfg["vocab_size"] - 1) + 1 for i in range(a.tokens)])
    model.forward(ids, model.new_state(a.tokens + 8), exact=False)          # warm-up: compiles, caches
    if a.host:
        return host(model, ids, a)
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


def host(model, ids: torch.Tensor, a) -> int:
    """Queueing time against completion time, medians of 5; then the syncs and the host ops."""
    dev = model.embed.device
    queued, done = [], []
    for _ in range(5):
        st = model.new_state(a.tokens + 8)
        torch.cuda.synchronize(dev)
        t = time.perf_counter()
        model.core(ids.to(dev), st, 0, False, False, None, last_logits=True)
        queued.append(time.perf_counter() - t)
        torch.cuda.synchronize(dev)
        done.append(time.perf_counter() - t)
    q, d = sorted(queued)[2], sorted(done)[2]
    print(f"{a.tokens} tokens: queued in {q * 1e3:.1f} ms, done after {d * 1e3:.1f} ms (medians of 5)")
    import warnings
    st = model.new_state(a.tokens + 8)
    torch.cuda.synchronize(dev)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            model.core(ids.to(dev), st, 0, False, False, None, last_logits=True)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = {}
    for w in caught:
        if "synchroniz" in str(w.message):
            key = f"{w.filename}:{w.lineno}"
            syncs[key] = syncs.get(key, 0) + 1
    print(f"synchronizing operations: {sum(syncs.values())}")
    for k, n in sorted(syncs.items(), key=lambda kv: -kv[1]):
        print(f"  {n:5d}x {k}")
    st = model.new_state(a.tokens + 8)
    torch.cuda.synchronize(dev)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        model.core(ids.to(dev), st, 0, False, False, None, last_logits=True)
        torch.cuda.synchronize(dev)
    ops = {}
    for ev in prof.key_averages():
        ops[ev.key] = (ev.self_cpu_time_total, ev.count)
    total = sum(v[0] for v in ops.values())
    launches = sum(v[1] for k, v in ops.items() if k in ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel",
                                                         "cuLaunchKernelEx"))
    print(f"host self time {total / 1e3:.1f} ms; kernel launches {launches}")
    top = sorted(ops.items(), key=lambda kv: -kv[1][0])[:a.top]
    for name, (us, n) in top:
        print(f"{us / 1e3:9.2f} ms {n:6d}x  {name[:100]}")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"tokens": a.tokens, "queued_s": queued, "done_s": done, "syncs": syncs,
                                       "launches": launches, "host_ops": [[n, us, c] for n, (us, c) in top]}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
