"""A few one-row decode forwards of the 35B-A3B shape (fewer layers), eager, inside an NVTX range
"decode", for Nsight Compute to profile the small kernels one at a time (issue 9:
bench/cuda_ablation.py found the recurrence and the add + norm + router product costing 4.5 and
2.8 us a layer in the chain; ncu says what a kernel waits on). Run under ncu, e.g.:

  ncu --nvtx --nvtx-include "decode/" -k regex:"delta_steps|add_norm_router|_route|_combine" \
      --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
      --clock-control none python3 bench/cuda_ncu_step.py --layers 4 --steps 2
"""

from __future__ import annotations

import argparse
import sys

import torch

import cuda_bench as cb  # bench/ is on the path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="qwen3.6-35b-a3b-shape")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=2)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("cuda_ncu_step: torch sees no CUDA GPU", file=sys.stderr)
        return 2
    eng, _ = cb.build(a.preset, a.layers, "independent", 1, graphs=False)
    m = eng.model
    st = m.new_state(len(cb.PROMPT) + a.steps + 8)
    m.forward(cb.PROMPT, st)
    m.forward([17], st)                       # every kernel compiled before the range
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("decode")
    for i in range(a.steps):
        m.forward([23 + i], st)
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    print(f"cuda_ncu_step: {a.steps} one-row forwards of {a.layers} layers in the range 'decode'")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
