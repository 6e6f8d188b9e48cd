"""The gate in simulation: tokens per second against the best fixed depth chosen in hindsight.

Drives the gate's public calls from tests/gate_sim.py's synthetic decode loop (no model, no
clock) on the cost curves of tests/test_gate.py plus the mid-size model's measured curve on
this CPU, with and without free observations. Prints the table docs/gate.md quotes and
writes the raw numbers to bench/results/gate_sim.json. Then the two numbers that chose the
observations' memory (GateConfig.observe_memory), for memories 16, 32 and 64:
  near break-even  30% acceptance on the mid-size curve (one draft pays from 35%): the gate's
                   rate over plain decoding in 40 runs of 450 steps (about a 512-token reply)
  after a jump     never accepted for 300 picks, then 90%: picks until the gate drafts on its
                   own (not a probe), 30 seeds, for two rows at 1.38, 1.5 and 1.8 plain steps
Then the study of the machine's speed (GateConfig.speed_memory / speed_anchor, docs/gate.md
choice 15): on a drifting machine (tests/gate_sim.py drifting_speed), with and without slow
first forwards of each row count, and a steady one, 80 runs of 600 picks on the mid-size curve
per P, the gate's rate over the same run's best fixed depth.

    python bench/gate_sim.py [--steps 3000] [--seed 11]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

from gate_sim import drifting_speed, simulate      # noqa: E402
from test_gate import CURVES                       # noqa: E402
from test_gate_observe import MID_CPU              # noqa: E402
from gate_sim import table_cost                    # noqa: E402
from verispec.gate import Gate, GateConfig         # noqa: E402

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
    memory = memory_study()
    speed = speed_study()
    pathlib.Path(args.out).write_text(json.dumps({"command": " ".join(sys.argv), "steps": args.steps,
                                                  "seed": args.seed, "rows": rows, "memory": memory,
                                                  "speed": speed}, indent=1))


def memory_study() -> dict:
    out = {}
    print("\n| observe_memory | P = 0.3 near break-even: mean / min over plain (40 runs) |"
          " picks to draft after a jump, two rows at 1.38 / 1.5 / 1.8: median [max] |")
    print("|---|---|---|")
    for mem in (16, 32, 64):
        cfg = GateConfig(observe_memory=mem)
        ratios = []
        for seed in range(40):
            plain = simulate(MID_CPU, lambda s: 0.3, 450, fixed=0, seed=seed)
            run = simulate(MID_CPU, lambda s: 0.3, 450, gate=Gate(cfg), seed=seed, observe=True)
            ratios.append(run.rate / plain.rate)
        jumps = {}
        for t2 in (1.38, 1.5, 1.8):
            cost = table_cost(0.01, {n: 1 + (n - 1) * (t2 - 1) for n in range(1, 10)})
            picks = []
            for seed in range(30):
                run = simulate(cost, lambda s: 0.0 if s < 300 else 0.9, 500, gate=Gate(cfg), seed=seed,
                               observe=True)
                picks.append(next((i - 300 for i in range(300, 500) if run.ks[i] and run.own[i]), 200))
            picks.sort()
            jumps[str(t2)] = picks
        out[str(mem)] = {"break_even_ratios": ratios, "jump_picks": jumps}
        mean = sum(ratios) / len(ratios)
        cells = " / ".join(f"{p[len(p) // 2]} [{p[-1]}{'+' if p[-1] >= 200 else ''}]" for p in jumps.values())
        print(f"| {mem}{' (default)' if mem == GateConfig().observe_memory else ''} | {mean:.3f} / "
              f"{min(ratios):.3f} | {cells} |")
    return out


def speed_study(runs: int = 80, steps: int = 600) -> dict:
    out = {}
    ps = (0.9, 0.6, 0.3)
    settings = {"public (speed_memory 0)": GateConfig(speed_memory=0),
                "speed 3, no pull to 1": GateConfig(speed_anchor=10 ** 9),
                "speed 3, pulled over 128 (default)": GateConfig()}
    machines = {"drifting, first forwards slow": (True, 0.25), "drifting": (True, 0.0), "steady": (False, 0.0)}
    print("\n| machine | timing rule | " + " | ".join(f"P = {p}: mean [worst]" for p in ps) + " |")
    print("|---|---|" + "---|" * len(ps))
    for mname, (drift, first) in machines.items():
        for sname, cfg in settings.items():
            cells, rec = [], {}
            for p in ps:
                ratios = []
                for seed in range(runs):
                    slow = drifting_speed(steps, seed + 100) if drift else [1.0] * steps
                    kw = dict(seed=seed, speed=slow.__getitem__, first_slow=first)
                    fixed = [simulate(MID_CPU, lambda s: p, steps, fixed=k, **kw).rate for k in range(6)]
                    run = simulate(MID_CPU, lambda s: p, steps, gate=Gate(cfg), observe=True, **kw)
                    ratios.append(run.rate / max(fixed))
                rec[str(p)] = ratios
                cells.append(f"{sum(ratios) / len(ratios):.3f} [{min(ratios):.3f}]")
            out[f"{mname} / {sname}"] = rec
            print(f"| {mname} | {sname} | " + " | ".join(cells) + " |")
    return out


if __name__ == "__main__":
    main()
