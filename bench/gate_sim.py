"""The gate in simulation: tokens per second against the best fixed depth chosen in hindsight.

Drives the gate's public calls from tests/gate_sim.py's synthetic decode loop (no model, no
clock) on the cost curves of tests/test_gate.py plus the mid-size model's measured curve on
this CPU, with and without free observations. Prints the table docs/gate.md quotes and
writes the raw numbers to bench/results/gate_sim.json.

    python bench/gate_sim.py [--steps 3000] [--seed 11]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

from gate_sim import simulate                      # noqa: E402
from test_gate import CURVES                       # noqa: E402
from test_gate_observe import MID_CPU              # noqa: E402
from verispec.gate import Gate                     # noqa: E402

PS = (0.9, 0.6, 0.3, 0.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--out", default=str(ROOT / "bench/results/gate_sim.json"))
    args = ap.parse_args()
    curves = dict(CURVES, **{"mid-size model, this CPU": MID_CPU})
    rows = []
    print("| rows | source | observations | " + " | ".join(f"p={p}" for p in PS)
          + " | probe cost, p=0 (5000 picks) |")
    print("|---|---|---|" + "---|" * len(PS) + "---|")
    for name, cost in curves.items():
        for source, max_k, draft_s in (("lookup", 5, 0.0), ("mtp", 3, 0.002)):
            for observe in (False, True):
                if observe and source == "mtp":
                    continue                        # the decoder does not follow the head's drafts
                cells, rec = [], {"curve": name, "source": source, "observe": observe, "by_p": {}}
                for p in PS:
                    fixed = [simulate(cost, lambda s: p, args.steps, fixed=k, max_k=max_k, seed=args.seed,
                                      draft_seconds=draft_s).rate for k in range(max_k + 1)]
                    run = simulate(cost, lambda s: p, args.steps, gate=Gate(), max_k=max_k, seed=args.seed,
                                   source=source, draft_seconds=draft_s, observe=observe)
                    best = max(range(max_k + 1), key=lambda k: fixed[k])
                    ratio = run.rate / fixed[best]
                    rec["by_p"][str(p)] = {"gate_over_best": ratio, "best_fixed": best,
                                           "gate_over_plain": run.rate / fixed[0]}
                    cells.append(f"{ratio:.3f} (k={best})")
                zero = simulate(cost, lambda s: 0.0, 5000, gate=Gate(), max_k=max_k, source=source,
                                draft_seconds=draft_s, observe=observe)
                share = zero.verify_seconds / zero.seconds
                rec["probe_excess"], rec["verify_share"] = zero.probe_excess, share
                rows.append(rec)
                print(f"| {name} | {source} | {'on' if observe else 'off'} | " + " | ".join(cells)
                      + f" | {zero.probe_excess:.2%} ({share:.1%} in verifies) |")
    pathlib.Path(args.out).write_text(json.dumps({"command": " ".join(sys.argv), "steps": args.steps,
                                                  "seed": args.seed, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
