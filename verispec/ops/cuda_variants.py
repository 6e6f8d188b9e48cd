"""Every CUDA C++ build the engine makes at the 35B-A3B shape, and the builds of its experiments, as
(source file, -D defines) pairs taken from the modules' own `defines` functions: tools/nvrtc_check.py
and tests/test_nvrtc_builds.py compile them through NVRTC without a GPU, so a kernel the device's
NVRTC refuses is found here and not in a device call (call 339 found one: docs/device-runs.md).
No torch GPU state is touched; the modules' settings are read as they are."""

from __future__ import annotations

from ..shapes import QWEN36_35B_A3B_SHAPE as SHAPE
from . import cuda_moe_tail, cuda_norm_route, cuda_recurrence, cuda_stream_gemv, cuda_stream_moe

H = SHAPE["hidden_size"]
HV = SHAPE["linear_num_value_heads"]
REP = HV // SHAPE["linear_num_key_heads"]
DV = SHAPE["linear_value_head_dim"]
I = SHAPE["moe_intermediate_size"]     # noqa: E741 - the kernels' name
E, TOPK = SHAPE["num_experts"], SHAPE["num_experts_per_tok"]
ROUTER_ROWS = E + 8      # the router's rows, the shared expert's gate, padding to 8


def engine() -> list[tuple[str, dict]]:
    """The builds the default settings make: every configured product (with the conv epilogue for
    the mixers' input products, K = hidden), the recurrence with either trigger, the opt-in MoE
    kernels and the cluster router with and without its norm (the two families)."""
    sg = cuda_stream_gemv
    out = []
    for (k, n), cfg in sg.CONFIG.items():
        out.append(("cuda_stream_gemv.cu", sg.defines(k, n, cfg, False)))
        if k == H:
            out.append(("cuda_stream_gemv.cu", sg.defines(k, n, cfg, True)))
    out += [("cuda_recurrence.cu", cuda_recurrence.defines(HV, REP, DV, trig)) for trig in (1, 2)]
    out.append(("cuda_moe_tail.cu", cuda_moe_tail.defines(H, I, TOPK, E)))
    out.append(("cuda_stream_moe.cu", cuda_stream_moe.defines(H, I, TOPK + 1)))
    out += [("cuda_norm_route.cu", cuda_norm_route.defines(H, ROUTER_ROWS, E, TOPK, norm, cuda_norm_route.CLUSTER))
            for norm in (True, False)]
    return out


def experiments() -> list[tuple[str, dict]]:
    """The builds of the settings the benchmarks switch on (bench/cuda_bench.py's sections): the
    products' flood, L2, register-tail, ticket and stamp variants, the recurrence's other launch
    shapes and stamps, the cluster router in clusters of 16, and a small one."""
    sg = cuda_stream_gemv
    (k_out, n_out), cfg_out = next((kn, c) for kn, c in sg.CONFIG.items() if kn[0] != H)
    (k_in, n_in), cfg_in = next((kn, c) for kn, c in sg.CONFIG.items() if kn[0] == H)
    out_plain = sg.defines(k_out, n_out, cfg_out, False)
    in_conv, in_plain = sg.defines(k_in, n_in, cfg_in, True), sg.defines(k_in, n_in, cfg_in, False)
    products = [
        {**in_conv, "PRE": 3, "PACE": 1, "EVF": 1}, {**out_plain, "PRE": 1, "PACE": 0, "EVF": 0},
        {**in_conv, "STAMPS": 1}, {**in_conv, "MAXREG": 128},
        {**out_plain, "L2PF": 1, "L2AT": 0, "L2EL": 1}, {**out_plain, "L2PF": 1, "L2AT": 1, "L2EL": 0},
        {**in_conv, "REGT": 1}, {**in_plain, "REGT": 2}, {**out_plain, "REGT": 1},
        {**in_conv, "DYN": 1}, {**in_plain, "DYN": 1, "REGT": 1}]
    rec = cuda_recurrence.defines(HV, REP, DV)
    return ([("cuda_stream_gemv.cu", d) for d in products]
            + [("cuda_recurrence.cu", {**rec, "STAMPS": 1}),
               ("cuda_recurrence.cu", {**rec, "WARPS": 4, "TRIG": 2, "CB": 8, "PRE": 0, "FAST": 1})]
            + [("cuda_norm_route.cu", cuda_norm_route.defines(H, ROUTER_ROWS, E, TOPK, True, 16)),
               ("cuda_norm_route.cu", cuda_norm_route.defines(256, 40, 32, 4, True, 4))])


def all_builds() -> list[tuple[str, dict]]:
    return engine() + experiments()
