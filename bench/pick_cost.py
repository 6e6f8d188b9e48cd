"""What a greedy pick costs the host on CUDA logits: verispec.sampling.pick (one max gives the id and,
by propagating NaN, the check; one transfer) against argmax + isnan stacked into one transfer and the two
separate host reads pick had before, interleaved (A B C A B C).

    python3 bench/pick_cost.py [--vocab 248320] [--calls 200] [--rounds 7]

Each call follows a small kernel on the logits, as a decode step's pick follows its forward, so
every read waits for the GPU. Prints medians [min-max] of the per-call time in microseconds and
writes the raw rounds to --out (JSON).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from verispec.sampling import SamplingParams, pick

ROOT = Path(__file__).resolve().parents[1]


def one_stack(logits: torch.Tensor) -> int:
    """The first version: argmax and the NaN check stacked into one transfer."""
    tok, bad = torch.stack([torch.argmax(logits), torch.isnan(logits).any().long()]).tolist()
    if bad:
        raise ValueError("NaN")
    return tok


def two_reads(logits: torch.Tensor) -> int:
    if torch.isnan(logits).any():
        raise ValueError("NaN")
    return int(torch.argmax(logits))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=248320)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "pick_cost.json"))
    a = p.parse_args()
    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU")
    logits = torch.randn(a.vocab, device="cuda")
    greedy = SamplingParams()
    arms = {"pick (one max, one transfer)": lambda x: pick(x, 0, greedy), "argmax + isnan, one transfer": one_stack,
            "two host reads (before)": two_reads}
    assert len({f(logits) for f in arms.values()}) == 1
    raw = {k: [] for k in arms}
    for r in range(-1, a.rounds):
        for name, f in arms.items():
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(a.calls):
                logits.mul_(1.0)           # a kernel the pick must wait for
                f(logits)
            us = (time.perf_counter() - t) / a.calls * 1e6
            if r >= 0:
                raw[name].append(us)
    for name, v in raw.items():
        print(f"{name}: {statistics.median(v):.1f} us a call [{min(v):.1f}-{max(v):.1f}] ({a.rounds} rounds of {a.calls})")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "vocab": a.vocab, "calls": a.calls,
                                       "us_per_call": raw}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
