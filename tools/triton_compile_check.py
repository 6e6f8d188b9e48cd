"""Compile the MoE's Triton kernels (and the add + norm + router product's, at each launch shape
bench/cuda_bench.py --sections norm_router tries) for sm_90 at the 35B-A3B shapes, as the model launches them, without a
GPU (tools/nvrtc_check.py does the same for the CUDA C++ kernels). tools/kernel_check_cpu.py runs their
logic in Triton's interpreter, which is plain Python: a kernel the GPU compiler rejects (device call 237:
a constexpr branch's bf16 variable carried into another branch's loop) passes there. This catches that
before a device run. Needs triton (the device image's version) and nothing else:

  pip install --target /tmp/tritonpkg triton==3.6.0
  PYTHONPATH=/tmp/tritonpkg:$PWD python tools/triton_compile_check.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

try:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
except ImportError:
    sys.exit("triton_compile_check: needs triton (see the docstring)")

from verispec.ops import cuda_moe, cuda_norm_router  # noqa: E402

H, I, E, K = 2048, 512, 256, 9      # hidden, expert width, experts, slots a row (top 8 + the shared expert)


def compile_ptx(fn, signature: dict, consts: dict, warps: int, stages: int) -> str:
    src = ASTSource(fn=fn, signature={**signature, **{n: "constexpr" for n in consts}},
                    constexprs={(fn.arg_names.index(n),): v for n, v in consts.items()})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": warps, "num_stages": stages}).asm["ptx"]


def main() -> int:
    bn, bk, nw, ns = cuda_moe.CONFIG["gate_up"]
    gate_up = {"x_ptr": "*bf16", "w_ptr": "*bf16", "ids_ptr": "*i32", "act_ptr": "*bf16", "sh_off": "i64",
               "R": "i32"}
    cases = []
    for first in (True, False):
        for pred in (0, 1, 2):
            sig = {**gate_up, **({"pred_ptr": "*i32"} if pred else {})}
            consts = {"I": I, "H": H, "TOP_K": K, "E": E, "BLOCK_N": bn, "BLOCK_K": bk, "SHARED_FIRST": first,
                      "PDL": True, "PRED": pred}
            cases.append((f"gate/up shared first {first}, PRED {pred}", cuda_moe._gate_up_act, sig, consts, nw, ns))
    cases.append(("gate/up shared first, EVW evict_first", cuda_moe._gate_up_act, gate_up,
                  {"I": I, "H": H, "TOP_K": K, "E": E, "BLOCK_N": bn, "BLOCK_K": bk, "SHARED_FIRST": True, "PDL": True,
                   "EVW": "evict_first"}, nw, ns))
    bn, bk, nw, ns = cuda_moe.CONFIG["down"]
    down = {"act_ptr": "*bf16", "w_ptr": "*bf16", "ids_ptr": "*i32", "y_ptr": "*fp32", "sh_off": "i64"}
    for early in (False, True):
        consts = {"H": H, "I": I, "E": E, "BLOCK_N": bn, "BLOCK_K": bk, "PDL": True, "EARLY_W": early}
        cases.append((f"down EARLY_W {early}", cuda_moe._down_pair, down, consts, nw, ns))
        cases.append((f"down EARLY_W {early}, EVW evict_first", cuda_moe._down_pair, down,
                      {**consts, "EVW": "evict_first"}, nw, ns))
    nr = {"x_ptr": "*bf16", "h_ptr": "*bf16", "split_stride": "i32", "nw_ptr": "*bf16", "w_ptr": "*bf16",
          "s_ptr": "*bf16", "y_ptr": "*bf16", "lg_ptr": "*bf16", "eps": "fp32", "N_OUT": "i32"}
    now = (cuda_norm_router.BLOCK_N, cuda_norm_router.WARPS)
    for bn, warps in dict.fromkeys((now, *cuda_norm_router.CANDIDATES)):
        consts = {"H": H, "BLOCK": H, "SPLIT": 1, "BLOCK_N": bn, "PDL": True}
        cases.append((f"add + norm + router ({bn}, {warps})", cuda_norm_router._add_norm_router, nr, consts, warps, 3))
    failed = 0
    for name, fn, sig, consts, warps, stages in cases:
        try:
            ptx = compile_ptx(fn, sig, consts, warps, stages)
            ok = "griddepcontrol.wait" in ptx
            print(f"{'ok  ' if ok else 'FAIL'} {name}: {len(ptx)} bytes of PTX"
                  + ("" if ok else ", no griddepcontrol.wait in it"))
        except Exception as e:  # the compiler's error is the finding
            ok = False
            print(f"FAIL {name}: {type(e).__name__}: {str(e).strip().splitlines()[-1][:300]}")
        failed += not ok
    print(f"{len(cases) - failed} compiled, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
