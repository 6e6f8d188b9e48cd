"""Where the time of one plain step and one verify goes, on a loaded Engine.

    python bench/profile_step.py [--reps 20] [--threads 2]      (prints JSON)

Used by bench/spec_tables.py. Method, per row count M (1 = a plain step, 3 = a verify of two
drafts, copy slots written as a verify writes them):
- T(M): median wall time of one exact forward at a fixed cache length, the recurrent state
  restored between forwards (outside the timing), as bench/decode.py does;
- the forward again with timers wrapped around the four kinds of work that are functions of
  their own: the matrix products (`verispec.ops.linear.linear`), the DeltaNet recurrence
  (`conv_rows`, `delta_rule_rows`), attention (`attend_rows`); the rest of the forward is
  Python and the small torch ops between them (norms, gates, MoE routing, slicing);
- inside the matrix products: the C kernel alone, replayed on the same operands (the
  difference is the wrapper's Python and ctypes cost);
- the bytes a step must read (every weight the products touch, once) against the
  machine's copy bandwidth: the floor a bandwidth-bound step would sit on;
- torch.profiler's count of aten ops per forward and cProfile's count of Python calls;
- sampling: one greedy `pick` on a logits row.
"""

from __future__ import annotations

import cProfile
import json
import pstats
import statistics
import sys
import time

import torch

import verispec.ops.attention as attn_ops
import verispec.ops.deltanet as dn_ops
import verispec.ops.linear as lin_ops
from verispec.sampling import SamplingParams, pick

ROWS = (1, 2, 3, 4)
PATCHED = {"matmul": (lin_ops, ("linear",)), "recurrence": (dn_ops, ("conv_rows", "delta_rule_rows")),
           "attention": (attn_ops, ("attend_rows",))}


class _Timers:
    """Within the block, the patched functions add their wall time to self.t[category]."""

    def __init__(self, record_linear: bool = False):
        self.t = {k: 0.0 for k in PATCHED}
        self.calls = {k: 0 for k in PATCHED}
        self.linear_args: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.record_linear = record_linear

    def __enter__(self):
        self.saved = []
        for cat, (mod, names) in PATCHED.items():
            for n in names:
                fn = getattr(mod, n)
                self.saved.append((mod, n, fn))
                setattr(mod, n, self._wrap(cat, fn))
        return self

    def _wrap(self, cat, fn):
        def timed(*a, **k):
            if self.record_linear and cat == "matmul":
                self.linear_args.append((a[0].detach().contiguous().clone(), a[1]))
            t0 = time.perf_counter()
            out = fn(*a, **k)
            self.t[cat] += time.perf_counter() - t0
            self.calls[cat] += 1
            return out
        return timed

    def __exit__(self, *exc):
        for mod, n, fn in reversed(self.saved):
            setattr(mod, n, fn)


class _Bench:
    """A state at a fixed cache length that every timed forward starts from again."""

    def __init__(self, eng, prompt: list[int]):
        self.model = eng.model
        self.state = self.model.new_state(len(prompt) + max(ROWS) + 1)
        self.model.forward(prompt, self.state)
        self.state.ensure_slots(max(ROWS) - 1)
        self.start = self.state.kv_len
        self.saved = self.state.recurrent.clone()
        self.rows = [(prompt[i % len(prompt)] * 7 + 3) % eng.args.vocab_size for i in range(max(ROWS))]

    def reset(self):
        self.state.kv_len = self.start
        del self.state.tokens[self.start:]
        for i in range(len(self.saved.rec)):
            self.state.recurrent.copy_layer_from(self.saved, i)

    def forward(self, m: int):
        self.reset()
        t0 = time.perf_counter()
        out = self.model.forward(self.rows[:m], self.state, exact=True, save_slots=m > 1)
        return time.perf_counter() - t0, out


def copy_bandwidth(mib: int = 256, reps: int = 5) -> float:
    """Bytes per second of a large tensor copy (read + write counted), median of reps."""
    a = torch.empty(mib * 2 ** 20 // 4, dtype=torch.float32).fill_(1.0)
    b = torch.empty_like(a)
    ts = []
    for _ in range(reps + 1):
        t0 = time.perf_counter()
        b.copy_(a)
        ts.append(time.perf_counter() - t0)
    return 2 * a.numel() * 4 / statistics.median(ts[1:])


def profile(eng, prompt: list[int], reps: int = 20) -> dict:
    b = _Bench(eng, prompt)
    with torch.no_grad():
        for m in ROWS:                                   # warm up every row count
            b.forward(m)
        T = {m: [] for m in ROWS}
        for _ in range(reps):                            # interleaved over M
            for m in ROWS:
                T[m].append(b.forward(m)[0])
        out = {"T_ms": {m: statistics.median(v) * 1e3 for m, v in T.items()},
               "T_ms_min": {m: min(v) * 1e3 for m, v in T.items()}}
        out["ratio"] = {m: out["T_ms"][m] / out["T_ms"][1] for m in ROWS}
        out["steps"] = {}
        for m in (1, 3):
            cats = {k: [] for k in PATCHED}
            totals = []
            calls = None
            for r in range(reps):
                with _Timers(record_linear=(r == 0)) as tm:
                    t, o = b.forward(m)
                totals.append(t)
                for k in PATCHED:
                    cats[k].append(tm.t[k])
                if r == 0:
                    calls, largs = dict(tm.calls), tm.linear_args
            # the kernel alone on the same operands (each weight once per call, as in the step)
            fn, backend = lin_ops._kernel()
            kern = []
            for _ in range(reps):
                t0 = time.perf_counter()
                for x, w in largs:
                    if fn is None:
                        lin_ops._linear_bmm(x, w)
                    else:
                        y = torch.empty(x.shape[0], w.shape[0])
                        fn(x.data_ptr(), w.data_ptr(), y.data_ptr(), x.shape[0], w.shape[0], x.shape[1],
                           torch.get_num_threads())
                kern.append(time.perf_counter() - t0)
            weight_bytes = sum(w.numel() * 4 for _, w in largs)
            total = statistics.median(totals)
            parts = {k: statistics.median(v) for k, v in cats.items()}
            parts["matmul_kernel"] = statistics.median(kern)
            parts["matmul_wrapper"] = max(parts["matmul"] - parts["matmul_kernel"], 0.0)
            parts["other"] = max(total - parts["matmul"] - parts["recurrence"] - parts["attention"], 0.0)
            # op and call counts of one forward
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                b.forward(m)
            aten_ops = sum(e.count for e in prof.key_averages())
            pr = cProfile.Profile()
            b.reset()
            pr.enable()
            b.model.forward(b.rows[:m], b.state, exact=True, save_slots=m > 1)
            pr.disable()
            py_calls = pstats.Stats(pr).total_calls
            out["steps"][m] = {"total_ms": total * 1e3, "parts_ms": {k: v * 1e3 for k, v in parts.items()},
                               "calls": calls, "linear_calls": len(largs), "weight_bytes": weight_bytes,
                               "aten_ops": aten_ops, "python_calls": py_calls, "backend": backend}
        logits = b.forward(1)[1].logits[0]
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            pick(logits, 10, SamplingParams())
            ts.append(time.perf_counter() - t0)
        out["sampling_ms"] = statistics.median(ts) * 1e3
    bw = copy_bandwidth()
    out["copy_bandwidth_GBps"] = bw / 1e9
    # a bandwidth-bound step reads its weights once: bytes / (read half of the copy rate)
    out["bandwidth_floor_ms"] = out["steps"][1]["weight_bytes"] / (bw / 2) * 1e3
    return out


def markdown(p: dict, threads: int) -> str:
    s1, s3 = p["steps"][1], p["steps"][3]
    t1 = s1["total_ms"]

    def row(name, key):
        a, c = s1["parts_ms"][key], s3["parts_ms"][key]
        return f"| {name} | {a:.2f} ({100 * a / s1['total_ms']:.0f}%) | {c:.2f} ({100 * c / s3['total_ms']:.0f}%) |"

    floor = p["bandwidth_floor_ms"]
    lines = [
        "| where the time goes (median ms, share) | plain step (1 row) | verify of 2 drafts (3 rows) |",
        "|---|---|---|",
        f"| whole forward (with timers) | {s1['total_ms']:.2f} | {s3['total_ms']:.2f} |",
        row("matrix products, C kernel alone", "matmul_kernel"),
        row("matrix products, Python/ctypes wrapper", "matmul_wrapper"),
        row("DeltaNet recurrence (conv + delta rule, per row)", "recurrence"),
        row("attention (per row)", "attention"),
        row("everything else: Python + small torch ops (norms, gates, MoE routing, slicing)", "other"),
        f"| calls of linear / recurrence / attention | {s1['linear_calls']} / {s1['calls']['recurrence']} / "
        f"{s1['calls']['attention']} | {s3['linear_calls']} / {s3['calls']['recurrence']} / {s3['calls']['attention']} |",
        f"| aten ops per forward (torch.profiler) | {s1['aten_ops']} | {s3['aten_ops']} |",
        f"| Python function calls per forward (cProfile) | {s1['python_calls']} | {s3['python_calls']} |",
        "",
        f"Sampling (one greedy `pick` on a logits row): {p['sampling_ms']:.3f} ms.  ",
        "T(M) without timers, median [min] over the reps, interleaved over M: " + ", ".join(
            f"T({m}) {p['T_ms'][m]:.2f} [{p['T_ms_min'][m]:.2f}] ms" for m in ROWS) + "; T(M)/T(1): " + ", ".join(
            f"{p['ratio'][m]:.2f}" for m in ROWS) + ".  ",
        f"A plain step's matrix products read {s1['weight_bytes'] / 2 ** 20:.1f} MiB of fp32 weights; at this "
        f"machine's copy rate ({p['copy_bandwidth_GBps']:.1f} GB/s read+write, {threads} threads) reading them once "
        f"takes {floor:.2f} ms, **{100 * floor / t1:.0f}% of the step's {t1:.2f} ms**.",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    import argparse

    from verispec.config import BUNDLED_MODEL
    from verispec.engine import Engine
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    eng = Engine(BUNDLED_MODEL, usage_file="/dev/null")
    p = profile(eng, eng.encode("def hls_to_rgb(h, l, s):\n    if s == 0.0:\n        return l, l, l\n"), a.reps)
    print(json.dumps(p, indent=1))
    print(markdown(p, a.threads))
    return 0


if __name__ == "__main__":
    sys.exit(main())
