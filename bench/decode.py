"""Benchmark: plain decode tok/s and the verify cost curve T(M)/T(1) of the row-invariant
forward, against the same forward with ``F.linear`` swapped in.

    python bench/decode.py [--models fixture,mid] [--rounds 5] [--reps 7] [--threads N]

Models: the tiny test fixture (hidden 64, 4 layers) and a mid-size random model (hidden
1024, 16 layers 3:1 DeltaNet:attention, 16 experts top-2, moe/shared intermediate 512,
vocab 8192; ~510M parameters, ~2 GiB fp32), both written by ``verispec.fixture.make_fixture``.

Arms: ``rowgemv`` is the engine as shipped (``verispec.ops.linear.linear``, the C kernel);
``F.linear`` monkeypatches ``verispec.ops.linear.linear`` to ``linear_fast`` (MKL SGEMM; not
row-invariant, so drafting with it would break exactness: a speed reference only).
Arms are interleaved (A B A B ...) in every round so drift in the machine's load hits both;
each round's T(M) is the median of ``--reps`` forwards of M rows at a fixed cache length,
with the recurrent state restored between forwards (outside the timing) so every forward
routes the same way; the decode tok/s of a round is one plain greedy run
(``Engine.generate``, lookup off). Tables show the median over rounds [min-max].

Writes bench/results/decode.json (raw) and docs/benchmarks-decode.md (tables).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import verispec.ops.linear as lin_ops
from verispec.config import DraftSettings, RunSettings
from verispec.engine import Engine
from verispec.fixture import make_fixture

ROOT = Path(__file__).resolve().parent.parent
MS = (1, 2, 3, 4, 5, 6)

MODELS = {
    "fixture": dict(family="qwen3_next", seed=0, weight_scale=0.3),
    "mid": dict(family="qwen3_next", seed=0, weight_scale=0.3, hidden_size=1024, num_layers=16, vocab_size=8192,
                num_experts=16, top_k=2, moe_intermediate_size=512, shared_expert_intermediate_size=512,
                intermediate_size=512, num_attention_heads=8, num_key_value_heads=2, head_dim=128,
                linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=128,
                linear_value_head_dim=128),
}

ARMS = ("rowgemv", "F.linear")


class use_arm:
    """Within the block, the model's exact path uses the arm's linear."""

    def __init__(self, arm: str):
        self.arm = arm

    def __enter__(self):
        self.saved = lin_ops.linear
        if self.arm == "F.linear":
            lin_ops.linear = lin_ops.linear_fast

    def __exit__(self, *exc):
        lin_ops.linear = self.saved


def build(name: str, cache: Path) -> Path:
    d = cache / name
    if not (d / "config.json").exists():
        t0 = time.perf_counter()
        make_fixture(d, **MODELS[name])
        print(f"[bench] wrote {name} to {d} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return d


def verify_times(eng: Engine, prompt: list[int], reps: int) -> dict[int, float]:
    """Median seconds of one M-row exact forward (with copy slots, as a verify writes them)."""
    model = eng.model
    state = model.new_state(len(prompt) + max(MS) + 1)
    model.forward(prompt, state)
    state.ensure_slots(max(MS) - 1)
    start = state.kv_len
    saved = state.recurrent.clone()
    rows = [(prompt[i % len(prompt)] * 7 + 3) % eng.args.vocab_size for i in range(max(MS))]
    out = {}
    for m in MS:
        ts = []
        for _ in range(reps + 1):                     # the first forward warms up
            state.kv_len = start
            del state.tokens[start:]
            for i in range(len(saved.rec)):
                state.recurrent.copy_layer_from(saved, i)
            t0 = time.perf_counter()
            model.forward(rows[:m], state, exact=True, save_slots=m > 1)
            ts.append(time.perf_counter() - t0)
        out[m] = statistics.median(ts[1:])
    return out


def decode_tok_s(eng: Engine, prompt: list[int], tokens: int) -> float:
    settings = RunSettings(max_tokens=tokens + 1, drafts=DraftSettings(lookup=False, mtp="off"))
    res = eng.generate(prompt, settings, eos_ids=set())
    return res.stats["decode_tok_s"]


def bench_model(name: str, path: Path, rounds: int, reps: int, decode_tokens: int, prompt_len: int) -> dict:
    eng = Engine(path)
    prompt = [(13 * i + 5) % eng.args.vocab_size for i in range(prompt_len)]
    raw = {arm: {"T": {m: [] for m in MS}, "decode_tok_s": []} for arm in ARMS}
    for r in range(rounds):
        order = ARMS if r % 2 == 0 else ARMS[::-1]
        for arm in order:
            with use_arm(arm):
                for m, t in verify_times(eng, prompt, reps).items():
                    raw[arm]["T"][m].append(t)
                raw[arm]["decode_tok_s"].append(decode_tok_s(eng, prompt, decode_tokens))
        print(f"[bench] {name} round {r + 1}/{rounds}: " + ", ".join(
            f"{a} T(1) {raw[a]['T'][1][-1] * 1e3:.2f} ms T(4)/T(1) {raw[a]['T'][4][-1] / raw[a]['T'][1][-1]:.2f} "
            f"decode {raw[a]['decode_tok_s'][-1]:.1f} tok/s" for a in ARMS), file=sys.stderr)
    return {"path": str(path), "config": MODELS[name], "params": sum(t.numel() for t in _tensors(eng)),
            "prompt_len": prompt_len, "decode_tokens": decode_tokens, "rounds": rounds, "reps": reps,
            "raw": {a: {"T_seconds": {str(m): v for m, v in raw[a]["T"].items()},
                        "decode_tok_s": raw[a]["decode_tok_s"]} for a in ARMS}}


def _tensors(eng: Engine):
    seen = set()
    for t in eng.model._all_tensors():
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            yield t


def summarize(res: dict) -> dict:
    out = {}
    for arm in ARMS:
        raw = res["raw"][arm]
        t = {int(m): v for m, v in raw["T_seconds"].items()}
        # the ratio per round (both from the same round), then the median over rounds
        ratio = {m: [a / b for a, b in zip(t[m], t[1])] for m in MS}
        out[arm] = {
            "T_ms": {m: _stat([x * 1e3 for x in t[m]]) for m in MS},
            "ratio": {m: _stat(ratio[m]) for m in MS},
            "decode_tok_s": _stat(raw["decode_tok_s"]),
        }
    return out


def _stat(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def machine() -> dict:
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        model = next((ln.split(":", 1)[1].strip() for ln in lscpu.splitlines() if ln.startswith("Model name")), "?")
    except OSError:
        model = platform.processor() or "?"
    return {"cpu": model, "cpus_online": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": platform.python_version(), "linear_backend": lin_ops.backend()}


def fmt(s: dict, digits: int = 2) -> str:
    return f"{s['median']:.{digits}f} [{s['min']:.{digits}f}-{s['max']:.{digits}f}]"


def markdown(doc: dict) -> str:
    m = doc["machine"]
    la0, la1 = doc["load_start"], doc["load_end"]
    lines = [
        "# Decode and verify cost of the row-invariant forward",
        "",
        f"Command: `{doc['command']}`  ",
        f"Machine: {m['cpu']}, {m['cpus_online']} CPUs online, torch {m['torch']} with {m['torch_threads']} threads, "
        f"linear backend `{m['linear_backend']}`, Python {m['python']}.  ",
        f"Load average (1/5/15 min) at start {la0[0]:.2f}/{la0[1]:.2f}/{la0[2]:.2f}, "
        f"at end {la1[0]:.2f}/{la1[1]:.2f}/{la1[2]:.2f}. Date: {doc['date']}.  ",
        "Raw data: `bench/results/decode.json`. Written by `bench/decode.py`.",
        "",
    ]
    if doc.get("note"):
        lines += [doc["note"], ""]
    if max(la0[0], la1[0]) > 0.5 * m["cpus_online"]:
        lines += [
            f"**These numbers are suspect**: the machine was shared with other jobs while this ran (load "
            f"average up to {max(la0[0], la1[0]):.1f} on {m['cpus_online']} CPUs), so absolute times are inflated "
            "and noisy; the arms were interleaved so the comparison between them is fairer than the absolute "
            "numbers. Re-measure on a quiet machine before planning on them.",
            "",
        ]
    lines += [
        "T(M) is one exact forward of M rows (a verify of M-1 drafts, copy slots written) at a fixed cache "
        "length; T(M)/T(1) is taken per round, then the median over rounds. `rowgemv` is the engine as shipped "
        "(`verispec.ops.linear.linear`, the C kernel: each weight read once for all rows, a fixed per-row "
        "order). `F.linear` swaps MKL's SGEMM into the same forward; it is not row-invariant (drafting with it "
        "would change the output) and is shown as the speed reference. Values: median [min-max] over rounds.",
        "",
    ]
    for name, res in doc["models"].items():
        s = res["summary"]
        cfg = res["config"]
        shape = (f"hidden {cfg.get('hidden_size', 64)}, {cfg.get('num_layers', 4)} layers, "
                 f"{cfg.get('num_experts', 4)} experts top-{cfg.get('top_k', 2)}, vocab {cfg.get('vocab_size', 1000)}")
        lines += [f"## {name}: {shape}, {res['params'] / 1e6:.1f}M parameters", "",
                  f"Prompt {res['prompt_len']} tokens; decode runs of {res['decode_tokens']} tokens; "
                  f"{res['rounds']} rounds x {res['reps']} forwards per M.", "",
                  "| | rowgemv | F.linear | rowgemv / F.linear |", "|---|---|---|---|"]
        d_r, d_f = s["rowgemv"]["decode_tok_s"], s["F.linear"]["decode_tok_s"]
        lines.append(f"| plain decode tok/s | {fmt(d_r, 1)} | {fmt(d_f, 1)} | {d_r['median'] / d_f['median']:.2f} |")
        lines += ["", "| M | rowgemv T(M) ms | F.linear T(M) ms | rowgemv T(M)/T(1) | F.linear T(M)/T(1) |",
                  "|---|---|---|---|---|"]
        for mm in MS:
            lines.append(f"| {mm} | {fmt(s['rowgemv']['T_ms'][mm])} | {fmt(s['F.linear']['T_ms'][mm])} | "
                         f"{fmt(s['rowgemv']['ratio'][mm])} | {fmt(s['F.linear']['ratio'][mm])} |")
        lines.append("")
    if "mid" in doc["models"]:
        s = doc["models"]["mid"]["summary"]
        r4 = s["rowgemv"]["ratio"][4]["median"]
        d_r, d_f = s["rowgemv"]["decode_tok_s"]["median"], s["F.linear"]["decode_tok_s"]["median"]
        lines += ["## Against the target", "",
                  f"- T(4)/T(1) on the mid-size model: **{r4:.2f}** (target <= 2.0: "
                  f"{'met' if r4 <= 2.0 else 'NOT met'}).",
                  f"- Plain decode with rowgemv vs with F.linear: {d_r:.1f} vs {d_f:.1f} tok/s "
                  f"({'no slower' if d_r >= d_f else f'{100 * (1 - d_r / d_f):.0f}% slower'}).", ""]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="fixture,mid")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=7, help="forwards per M per round (median)")
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--note", default="", help="a line for the doc (how the run was pinned, where it ran)")
    ap.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "verispec-bench-models"))
    ap.add_argument("--json-out", default=str(ROOT / "bench" / "results" / "decode.json"))
    ap.add_argument("--md-out", default=str(ROOT / "docs" / "benchmarks-decode.md"))
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    cache = Path(a.cache)
    names = [n for n in a.models.split(",") if n]
    paths = {n: build(n, cache) for n in names}      # before the clock: making the models is slow
    doc = {"command": "python bench/decode.py " + " ".join(sys.argv[1:]), "machine": machine(),
           "date": time.strftime("%Y-%m-%d %H:%M"), "note": a.note, "load_start": list(os.getloadavg()), "models": {}}
    with torch.no_grad():
        for n in names:
            res = bench_model(n, paths[n], a.rounds, a.reps, a.decode_tokens, a.prompt_len)
            res["summary"] = summarize(res)
            doc["models"][n] = res
    doc["load_end"] = list(os.getloadavg())
    Path(a.json_out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json_out).write_text(json.dumps(doc, indent=1) + "\n")
    Path(a.md_out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.md_out).write_text(markdown(doc))
    print(markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
