"""Benchmark: the prompt fed through the exact path (`--prefill-batch off`), one row a forward
against EXACT_ROWS (16) rows a forward (the same bits: row invariance, tests/test_session.py), and
the default batched prefill (fast kernels, bits that may depend on the row count and threads) for
scale, on the bundled model.

    python bench/prefill_rows.py [--tokens 480] [--rounds 5] [--threads N]

The prompt is the first --tokens ids of verispec/decoder.py's source (code, as the model was
trained on). Arms are interleaved (A B A B ...) each round; a round's number is prompt tokens over
the wall time of one `Engine.generate` with max_tokens 1 (the prefill and one pick). Prints the
median over rounds [min-max] and writes bench/results/prefill_rows.json (raw).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from verispec.config import DraftSettings, RunSettings, default_model_dir
from verispec.engine import load_engine

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=480)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "prefill_rows.json"))
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    eng = load_engine(default_model_dir(), device="cpu")
    prompt = eng.encode((ROOT / "verispec" / "decoder.py").read_text())[:a.tokens]
    exact = RunSettings(max_tokens=1, prefill_batch=False, drafts=DraftSettings(lookup=False, mtp="off"))
    batched = RunSettings(max_tokens=1, prefill_batch=True, drafts=DraftSettings(lookup=False, mtp="off"))
    arms = {"exact, 1 row a forward": (exact, 1), "exact, 16 rows a forward": (exact, 16),
            "batched (the default)": (batched, None)}
    raw = {k: [] for k in arms}
    for _ in range(a.rounds):
        for name, (settings, rows) in arms.items():
            dec = eng.new_decoder(settings, prompt)
            if rows is not None:
                dec.config.prefill_rows = rows
            t = time.perf_counter()
            eng.generate(prompt, settings, decoder=dec)
            raw[name].append(len(prompt) / (time.perf_counter() - t))
    out = {"machine": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
           "prompt_tokens": len(prompt), "rounds": a.rounds, "tok_s": raw,
           "date": time.strftime("%Y-%m-%d %H:%M")}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    for name, v in raw.items():
        print(f"{name}: {statistics.median(v):.1f} tok/s [{min(v):.1f}-{max(v):.1f}] "
              f"({len(prompt)} prompt tokens, {a.rounds} rounds, {torch.get_num_threads()} threads)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
