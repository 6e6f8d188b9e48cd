"""GPU benchmark of the exact decode/verify path at real shapes (issue 9), on random weights.

Sections (each timed with torch.cuda.synchronize around host clocks; medians over rounds,
arms interleaved within a round):
  bandwidth  device-to-device copy of 4 GiB: the ceiling (bytes read + written per second)
  decode     plain decode tok/s on the 35B-A3B shape; the floor from the active weight bytes
  verify     T(n)/T(1) for n = 1..6 rows (a verify with its copy slots), against the bytes
             those rows must read (distinct experts per layer counted from the routing): T(n) over
             the bytes' time at the copy rate, and T(n)/T(1) over bytes(n)/bytes(1)
  overhead   one exact (padded) decode row against the same row through plain cuBLAS/SDPA
  pdl        the same graphed forwards (1 and 4 rows) captured with programmatic dependent
             launch on and off (verispec/ops/cuda_launch.py), interleaved
  gate_up    the same, with the expert gate/up kernel's blocks as configured and as the candidates
  down       the same for the expert down kernel
  gemv       the same for the largest decode products' blocks (GEMV_ARMS)
  small      the same for the small kernels' warps and the recurrence's columns per program
  norm_router  the same for the add + norm + router product's router columns a program and warps
             (cuda_norm_router.BLOCK_N, WARPS; never swept before the thirty-third session)
  undo       the copy of a kept row's slot into the live state (a rejection's undo), per layer
             against multi-tensor copies
  fusions    the same (1, 3 and 4 rows), with every fusion of verispec/ops/cuda_fusions.py on and
             each one off (NORM_ROUTER sums the router's logits in another order: with it off the
             logits differ)
  shared_first  the same (1, 3 and 4 rows), with the shared expert's gate/up programs not waiting
             for the router, and with every program waiting
  moe_tail   the same (1, 3 and 4 rows), the MoE after its router as one persistent launch
             (cuda_fusions.MOE_TAIL) against the three Triton launches; then each alone, every
             layer's MoE tail in one graph
  stream     the same (1, 3 and 4 rows), the mixers' products by the CUDA kernel that requests
             its weights before the wait (cuda_fusions.STREAM) against the Triton products; with
             and without the kernels before them letting them launch early, each STREAM_ARMS
  coresident the same (1, 3 and 4 rows), the input products on 4 warps (2 slots each) so an output
             product's CTA fits beside an input product's on an SM (CORESIDENT_ARMS), with and without
             cuda_launch.LINKS (the recurrence and the attend letting the output product launch while
             the input product finishes) and a fixed shared-memory carveout, against the default
  stream_moe the expert products by the stream kernels (each STREAM_MOE_ARMS setting) against the
             Triton expert kernels, graphed forward, 1/3/4 rows
  stream_alone  each stream product shape alone (a graph of products with distinct weights, and
             the output product behind the DeltaNet's gated norm) against the Triton product
  l2next     the same (1 and 4 rows), each layer's output product asking L2 for the next layer's
             input product's weights, the experts' loads evict-first (L2NEXT_ARMS; an experiment)
  tail       the same (1, 3 and 4 rows), the stream products' units past their slots read into
             registers, their last tasks dealt by tickets (cuda_stream_gemv.REGT, DYN; experiments)
  grid       the same (1, 3 and 4 rows), the input products on fewer CTAs than SMs, with and without
             cuda_launch.LINKS (cuda_stream_gemv.GRID; an experiment)
  route      the same (1, 3 and 4 rows), the add + norm + router product and the router as one launch,
             a thread-block cluster a row (cuda_fusions.ROUTE_CLUSTER; an experiment), clusters of 8,
             against the default two launches, and the default with the shared expert's
             programs waiting (as they must with the cluster router); then clusters of 16 against 8
  spec       --force bernoulli at the seed's acceptance (MTP depths 1/2: 0.97, 0.83) against
             plain, with independent and with correlated routing
Writes JSON to --out (default $OUT or bench/results) and prints a summary table last.

  python3 bench/cuda_bench.py --layers 40 --sections bandwidth,decode,verify,overhead,spec
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from verispec.config import DraftSettings, RunSettings  # noqa: E402
from verispec.engine import Engine  # noqa: E402
from verispec.execution import Execution  # noqa: E402
from verispec.plan import active_params  # noqa: E402
from verispec.random_model import (expert_bytes, preset_config,  # noqa: E402
                                   random_checkpoint)

RESULTS: dict = {}


def log(*a):
    print(*a, flush=True)


DEVICE = "cuda"


def _sync():
    if DEVICE != "cpu":
        torch.cuda.synchronize()


def sync_time(fn) -> float:
    _sync()
    t = time.perf_counter()
    fn()
    _sync()
    return time.perf_counter() - t


def bandwidth(rounds: int = 20) -> float:
    n = 4 * 2**30
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    a.random_(0, 255)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    ts = [sync_time(lambda: b.copy_(a)) for _ in range(rounds)]
    bw = 2 * n / statistics.median(ts)
    del a, b
    torch.cuda.empty_cache()
    RESULTS["bandwidth_Bps"] = bw
    log(f"[bandwidth] D2D copy {bw / 1e12:.2f} TB/s (read + write, median of {rounds})")
    return bw


def build(preset: str, layers: int, routing: str, seed: int, graphs: bool = True):
    """(engine, checkpoint): keep the checkpoint to build a second engine on the same tensors."""
    cfg = preset_config(preset, layers=layers)
    t = time.perf_counter()
    ex = Execution.for_device("cuda", graphs=graphs) if DEVICE == "cuda" else Execution("cpu", torch.bfloat16, 16)
    ck = random_checkpoint(cfg, seed=seed, device=DEVICE, routing=routing)
    eng = Engine.from_checkpoint(ck, ex, usage_file=os.devnull)
    _sync()
    mem = torch.cuda.memory_allocated() / 2**30 if DEVICE == "cuda" else 0.0
    log(f"[build] {preset}, {layers} layers, {routing} routing, graphs {graphs}: {time.perf_counter() - t:.1f} s, "
        f"{mem:.1f} GiB on the GPU")
    return eng, ck


PROMPT = [(i * 7919 + 13) % 4000 + 11 for i in range(64)]


def settings(n: int, **drafts) -> RunSettings:
    d = dict(lookup=False, mtp="off")
    d.update(drafts)
    return RunSettings(max_tokens=n, drafts=DraftSettings(**d))


def decode(eng: Engine, n: int, rounds: int, bw: float) -> None:
    cfg = eng.args
    ab = _active_bytes(eng)
    floor = ab / bw                # the issue's limit: every active weight read once at the copy bandwidth
    rates, walls = [], []
    eng.generate(PROMPT, settings(n))          # warm-up: graph captures, Triton compiles
    for _ in range(rounds):
        res, wall = timed_generate(eng, PROMPT, settings(n))
        rates.append(_tok_s(res))
        walls.append(wall)
    RESULTS["decode_wall_tok_s"] = walls
    log(f"[decode] wall clock (sampling and host work included): {statistics.median(walls):.1f} tok/s "
        f"[{min(walls):.1f}-{max(walls):.1f}]")
    med = statistics.median(rates)
    RESULTS["decode"] = {"active_bytes": ab, "floor_ms": floor * 1e3, "tok_s": rates, "median_tok_s": med,
                         "layers": cfg.num_hidden_layers, "fraction_of_limit": floor * med}
    log(f"[decode] active weights {ab / 1e9:.2f} GB/token -> limit {floor * 1e3:.2f} ms ({1 / floor:.0f} tok/s); "
        f"measured {med:.1f} tok/s ({1e3 / med:.1f} ms) = {floor * med * 100:.1f}% of the limit "
        f"[{min(rates):.1f}-{max(rates):.1f}]")


def _tok_s(res) -> float:
    """Decode tokens over the forwards' seconds (the report's decode tok/s)."""
    s = res.stats
    return s["tokens"] / s["decode_seconds"]


def timed_generate(eng, prompt, s, **kw):
    """(result, wall-clock decode tok/s: the whole generate minus its prefill, drafting and
    sampling included)."""
    _sync()
    t = time.perf_counter()
    res = eng.generate(prompt, s, **kw)
    _sync()
    wall = time.perf_counter() - t - res.stats["prefill_seconds"]
    return res, len(res.ids) / wall


def _active_bytes(eng: Engine, top_k: int | None = None) -> int:
    """The bf16 bytes one decode row reads (verispec.plan.active_params); top_k=0: without routed experts."""
    a = eng.args if top_k is None else dataclasses.replace(eng.args, num_experts_per_tok=top_k)
    return 2 * active_params(a)


def _cfg_dict(eng: Engine) -> dict:
    a = eng.args
    return {"hidden_size": a.hidden_size, "linear_num_key_heads": a.linear_num_key_heads,
            "linear_key_head_dim": a.linear_key_head_dim, "linear_num_value_heads": a.linear_num_value_heads,
            "linear_value_head_dim": a.linear_value_head_dim, "num_attention_heads": a.num_attention_heads,
            "num_key_value_heads": a.num_key_value_heads, "head_dim": a.head_dim, "num_experts": a.num_experts,
            "num_experts_per_tok": a.num_experts_per_tok, "moe_intermediate_size": a.moe_intermediate_size,
            "shared_expert_intermediate_size": a.shared_expert_intermediate_size, "layer_types": a.layer_types,
            "vocab_size": a.vocab_size}


def _distinct_experts(eng: Engine, ids: list[int], state) -> float:
    """Mean distinct experts per MoE layer for these rows (hooked from the model's routing)."""
    seen = []
    orig = eng.model.moe

    def hooked(m, h, lin, exact):
        pre = lin(h, m.pre)
        top = torch.topk(torch.softmax(pre[:, :m.n_experts].float(), -1), m.top_k, -1).indices
        seen.append(len(torch.unique(top)))
        return orig(m, h, lin, exact)

    eng.model.moe = hooked
    try:   # the batched path (no graphs, which would not call the hook); rolled back by the caller
        ids_t = torch.tensor(ids, device=eng.model.embed.device)
        eng.model.core(ids_t, state, state.kv_len, False, False, None)
    finally:
        eng.model.moe = orig
    return statistics.mean(seen)


def verify(eng: Engine, rounds: int, bw: float, max_rows: int = 6, key: str = "verify") -> None:
    m = eng.model
    st = m.new_state(len(PROMPT) + rounds * (max_rows + 2) + 64)
    m.forward(PROMPT, st)
    st.ensure_slots(max_rows)
    times = {n: [] for n in range(1, max_rows + 1)}
    distinct = {n: [] for n in range(1, max_rows + 1)}
    tok = 17
    for r in range(-1, rounds):                  # round -1: warm-up (graph captures), not counted
        for n in range(1, max_rows + 1):
            ids = [(tok + 31 * j + 101 * r) % 4000 + 5 for j in range(n)]
            start = st.kv_len
            t = sync_time(lambda: m.forward(ids, st, save_slots=n > 1))
            st.commit(start, n, 1)
            if r < 0:
                continue
            times[n].append(t)
            if r < 2:   # routing of these rows (the KV rows it writes are past kv_len; the recurrent state drifts: timing only)
                distinct[n].append(_distinct_experts(eng, ids, st))
    cfg = _cfg_dict(eng)
    dense = _active_bytes(eng, top_k=0)
    eb = expert_bytes(cfg)
    n_moe = len(cfg["layer_types"])
    out = {}
    t1 = statistics.median(times[1])
    mean_distinct = {n: statistics.mean(distinct[n]) if distinct[n] else float("nan") for n in times}
    bytes_of = {n: dense + n_moe * d * eb for n, d in mean_distinct.items()}
    for n in times:
        t = statistics.median(times[n])
        d, need = mean_distinct[n], bytes_of[n]
        bt = need / bw
        # two readings of issue 9's target: T(n) against its bytes' time at the copy rate, and the
        # growth T(n)/T(1) against the bytes' growth (how much of a verify's added cost its added bytes explain)
        growth = (t / t1) / (need / bytes_of[1])
        out[n] = {"ms": t * 1e3, "ratio": t / t1, "distinct_experts": d, "bytes": need, "bandwidth_ms": bt * 1e3,
                  "vs_bandwidth": t / bt, "growth_vs_bytes_growth": growth,
                  "spread_ms": [min(times[n]) * 1e3, max(times[n]) * 1e3]}
        log(f"[{key}] rows {n}: {t * 1e3:.2f} ms [{min(times[n]) * 1e3:.2f}-{max(times[n]) * 1e3:.2f}] "
            f"T(n)/T(1) {t / t1:.2f}; distinct experts/layer {d:.1f}; bytes {need / 1e9:.2f} GB -> "
            f"{bt * 1e3:.2f} ms at the ceiling; measured/ceiling {t / bt:.2f}x; "
            f"T(n)/T(1) over bytes(n)/bytes(1) {growth:.3f}")
    RESULTS[key] = out


def overhead(eng: Engine, ck, rounds: int) -> None:
    """One decode row, both graphed, on the same weights: the exact path (every op padded to
    16 rows) against the same model with nothing padded (cuBLAS's 1-row kernels: the plain
    decode an engine without the row-invariance promise would run)."""
    ex1 = Execution(eng.execution.device, eng.execution.dtype, pad_rows=1, graphs=eng.execution.graphs)
    plain_eng = Engine.from_checkpoint(ck, ex1, usage_file=os.devnull)
    arms = {"exact": eng.model, "unpadded": plain_eng.model}
    states = {k: m.new_state(len(PROMPT) + 4 * rounds + 16) for k, m in arms.items()}
    for k, m in arms.items():
        m.forward(PROMPT, states[k])
    times = {k: [] for k in arms}
    for r in range(-2, rounds):
        for k, m in arms.items():                # interleaved: exact, unpadded, exact, ...
            st = states[k]
            start = st.kv_len
            t = sync_time(lambda: m.forward([42 + r % 7], st))
            st.commit(start, 1, 1)
            if r >= 0:
                times[k].append(t)
    e, f = statistics.median(times["exact"]), statistics.median(times["unpadded"])
    RESULTS["overhead"] = {"exact_ms": e * 1e3, "unpadded_ms": f * 1e3, "ratio": e / f, "times": times}
    log(f"[overhead] exact (padded to 16) row {e * 1e3:.3f} ms vs unpadded row {f * 1e3:.3f} ms: {e / f:.3f}x "
        f"[{min(times['exact']) * 1e3:.3f}-{max(times['exact']) * 1e3:.3f} vs "
        f"{min(times['unpadded']) * 1e3:.3f}-{max(times['unpadded']) * 1e3:.3f}]")
    del plain_eng


def graph_arms(eng: Engine, rounds: int, key: str, arms: dict, row_counts=(1, 4), refs: dict | None = None) -> None:
    """Graphed forwards of 1 and 4 rows (or row_counts; more than one with copy slots, as a
    verify) captured once per arm:
    arms maps a name to a function that sets the kernels' launch options before a capture.
    One graph runner per arm over the same weights, each with its own state, replayed in turn
    (A, B, ..., A, B, ...); the first arm is the reference every other's logits must equal, or
    refs[arm] where an arm sums in another order (an arm named there as its own reference has none)."""
    from verispec.cuda_graphs import GraphedForward

    m = eng.model
    if m.graphs is None:
        log(f"[{key}] skipped: no CUDA graphs")
        return
    kept_runner = m.graphs
    restore = _launch_options()
    names = list(arms)
    runners = {k: GraphedForward(m, m.graphs.max_rows) for k in names}
    states = {}
    try:
        for k in names:
            m.graphs = runners[k]
            arms[k]()
            states[k] = m.new_state(len(PROMPT) + 6 * (rounds + 3) + 16)
            m.forward(PROMPT, states[k])
            states[k].ensure_slots(max(row_counts))
        out = {}
        for rows in row_counts:
            times = {k: [] for k in names}
            got, same, each = {}, [], {k: True for k in names[1:]}
            for r in range(-2, rounds):
                for k in names:
                    m.graphs = runners[k]
                    arms[k]()                    # the options matter at capture only
                    st = states[k]
                    start = st.kv_len
                    ids = [(42 + 7 * r + j) % 4000 + 5 for j in range(rows)]
                    t = sync_time(lambda: got.__setitem__(k, m.forward(ids, st, save_slots=rows > 1).logits))
                    st.commit(start, rows, 1)
                    if r >= 0:
                        times[k].append(t)
                ref = {k: (refs or {}).get(k, names[0]) for k in names[1:]}
                same.append(all(torch.equal(got[ref[k]], got[k]) for k in names[1:]))   # the bits must not move
                for k in names[1:]:
                    each[k] = each[k] and torch.equal(got[ref[k]], got[k])
            med = {k: statistics.median(v) for k, v in times.items()}
            out[rows] = {"ms": {k: v * 1e3 for k, v in med.items()},
                         "over_first": {k: v / med[names[0]] for k, v in med.items()},
                         "times": times, "logits_equal": all(same),
                         "logits_equal_to_first": each}         # (against refs[arm] where refs names one)
            log(f"[{key}] rows {rows}: " + "; ".join(
                f"{k} {med[k] * 1e3:.3f} ms [{min(times[k]) * 1e3:.3f}-{max(times[k]) * 1e3:.3f}] "
                f"({med[k] / med[names[0]]:.3f})" for k in names) + f"; logits equal in every round: {all(same)}"
                + (f" (each against its reference: {each})" if not all(same) else ""))
        RESULTS[key] = out
    finally:
        m.graphs = kept_runner
        restore()


FUSIONS = ("LOGITS_IN_PRODUCT", "NORM_ROUTER")   # on by default; MOE_TAIL (off) has its own section


def _launch_options():
    """A function that puts the kernels' launch options back as they are now: PDL, the fusions, the
    products', expert and small kernels' settings and the recurrence's (the sections that vary them)."""
    from verispec.ops import cuda_deltanet, cuda_fusions, cuda_gemv, cuda_launch, cuda_moe, cuda_norm_router, cuda_norms

    pdl_on, steps = cuda_launch.enabled, cuda_deltanet.STEPS
    nr = (cuda_norm_router.BLOCK_N, cuda_norm_router.WARPS)
    gemv_cfg, moe_cfg, warps = dict(cuda_gemv.CONFIG), dict(cuda_moe.CONFIG), dict(cuda_norms.WARPS)
    shared_first = cuda_moe.SHARED_FIRST
    fused = {f: getattr(cuda_fusions, f) for f in FUSIONS}

    def restore():
        cuda_launch.enabled, cuda_deltanet.STEPS = pdl_on, steps
        cuda_gemv.CONFIG.clear()
        cuda_gemv.CONFIG.update(gemv_cfg)
        cuda_moe.CONFIG.update(moe_cfg)
        cuda_moe.SHARED_FIRST = shared_first
        cuda_norms.WARPS.update(warps)
        cuda_norm_router.BLOCK_N, cuda_norm_router.WARPS = nr
        for f, v in fused.items():
            setattr(cuda_fusions, f, v)
    return restore


def shared_first(eng: Engine, rounds: int) -> None:
    """The shared expert's gate/up programs not waiting for the router (cuda_moe.SHARED_FIRST)
    against every program waiting; the same arithmetic, so the logits must be equal. 1, 3 (an
    MTP-2 verify) and 4 rows."""
    from verispec.ops import cuda_moe

    graph_arms(eng, rounds, "shared_first", {"all_wait": lambda: setattr(cuda_moe, "SHARED_FIRST", False),
                                             "shared_first": lambda: setattr(cuda_moe, "SHARED_FIRST", True)},
               row_counts=(1, 3, 4))


# the persistent MoE tail per arm: (slot bytes, warps, slots per warp)
TAIL_ARMS = {"tail_8k_8x3": (8192, 8, 3), "tail_16k_8x1": (16384, 8, 1)}


def moe_tail(eng: Engine, rounds: int) -> None:
    """The persistent MoE tail (verispec/ops/cuda_moe_tail.py), with each ring of TAIL_ARMS, against
    the Triton launches: in the graphed forward (1, 3, 4 rows) and alone (every layer's tail after
    random routing, one graph per arm)."""
    from verispec.ops import cuda_fusions, cuda_moe, cuda_moe_tail

    kept = cuda_fusions.MOE_TAIL, cuda_moe_tail.SLOT, cuda_moe_tail.WARPS, cuda_moe_tail.SPW

    def arm(ring):
        def setup():
            cuda_fusions.MOE_TAIL = ring is not None
            if ring is not None:
                cuda_moe_tail.SLOT, cuda_moe_tail.WARPS, cuda_moe_tail.SPW = ring
        return setup
    arms = {"triton": arm(None), **{k: arm(v) for k, v in TAIL_ARMS.items()}}
    phases = {f"{next(iter(TAIL_ARMS))}_phases{p}": p for p in (1, 2)}   # alone only: where the time goes
    try:
        graph_arms(eng, rounds, "moe_tail", arms, row_counts=(1, 3, 4))
        if DEVICE != "cuda":
            return
        layers = [la.mlp for la in eng.model.layers if hasattr(la.mlp, "gu_all")]
        out = {}
        for rows in (1, 4):
            torch.manual_seed(rows)
            h = layers[0].gu_all.shape[2]
            calls = []
            for m in layers:
                e, si = m.n_experts, m.shared_inter
                logits = (torch.randn(rows, 264, device="cuda") * 2).to(torch.bfloat16)
                w, i = cuda_moe.route_shared(logits, rows, e, m.top_k, m.norm_topk)
                x = torch.randn(rows, h, device="cuda").to(torch.bfloat16)
                calls.append((x, w, i, m.gu_all, m.down_all, m.pre[e + 1:e + 1 + 2 * si], m.shared_down, x.clone(),
                              torch.zeros(h, device="cuda", dtype=torch.bfloat16), 1e-6))
            graphs = {}
            for name in [*arms, *phases]:
                (arms[name] if name in arms else arms[next(iter(TAIL_ARMS))])()
                cuda_moe_tail.PHASES = phases.get(name, 3)
                for c in calls:
                    cuda_moe.experts_add_norm(*c)
                _sync()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    for c in calls:
                        cuda_moe.experts_add_norm(*c)
                graphs[name] = g
            times = {k: [] for k in graphs}
            for r in range(-2, 4 * rounds):
                for k, g in graphs.items():
                    t = sync_time(g.replay)
                    if r >= 0:
                        times[k].append(t / len(calls))
            med = {k: statistics.median(v) * 1e6 for k, v in times.items()}
            out[rows] = {"us_per_layer": med, "times": times}
            log(f"[moe_tail] alone, rows {rows}, per layer: " + "; ".join(
                f"{k} {med[k]:.2f} us [{min(times[k]) * 1e6:.2f}-{max(times[k]) * 1e6:.2f}]" for k in med))
        RESULTS["moe_tail_alone"] = out
    finally:
        cuda_fusions.MOE_TAIL, cuda_moe_tail.SLOT, cuda_moe_tail.WARPS, cuda_moe_tail.SPW = kept
        cuda_moe_tail.PHASES = 3


# name -> settings over the defaults: early launches before the products (cuda_launch.EARLY_STREAM),
# and before those (cuda_launch.LINKS), cuda_stream_gemv's TRIG, TMA2D and CONFIG entries; the first
# arm is the reference (device calls 85-89 also measured TRIG 0, TMA2D 0, LINKS and 8-column tasks
# for the attention's input product: within 1-2% or slower, bench/results/cuda_bench_stream_run8*).
# Units and slots (KC, SPW) move no bit: the same steps in the same order.
STREAM_ARMS = {"stream": {}, "stream_not_early": {"early": False},
               "stream_in_spw2": {"CONFIG": {(2048, 12352): (2, 8, 256, 2), (2048, 9216): (2, 8, 256, 2)}},
               "stream_kc128": {"CONFIG": {(4096, 2048): (2, 8, 128, 4), (2048, 12352): (2, 8, 128, 6),
                                           (2048, 9216): (2, 8, 128, 6)}}}


def stream(eng: Engine, rounds: int, key: str = "stream", arms: dict | None = None, triton: bool = True) -> None:
    """The stream products (verispec/ops/cuda_stream_gemv.py) in each setting of arms (STREAM_ARMS) against
    the Triton products (triton), in the graphed forward (1, 3, 4 rows). A setting may set "early", "TRIG",
    "TMA2D", "links", "CONFIG", "MAXREG" and "carveout"; the rest stays as it is. The arms with the default
    CONFIG must give the first arm's logits; the Triton arm and other CONFIGs sum in other orders."""
    from verispec.ops import cuda_fusions, cuda_launch, cuda_stream_gemv as sg

    kept = (cuda_fusions.STREAM, cuda_launch.EARLY_STREAM, sg.TRIG, sg.TMA2D, dict(sg.CONFIG), cuda_launch.LINKS,
            dict(sg.MAXREG), sg.CARVEOUT)

    def put(setting):
        cuda_fusions.STREAM = setting is not None
        setting = setting or {}
        cuda_launch.EARLY_STREAM = setting.get("early", kept[1])
        sg.TRIG, sg.TMA2D = setting.get("TRIG", kept[2]), setting.get("TMA2D", kept[3])
        cuda_launch.LINKS = setting.get("links", kept[5])
        sg.CONFIG.clear()
        sg.CONFIG.update({**kept[4], **setting.get("CONFIG", {})})
        sg.MAXREG.clear()
        sg.MAXREG.update({**kept[6], **setting.get("MAXREG", {})})
        sg.CARVEOUT = setting.get("carveout", kept[7])

    graphed = {k: (lambda v=v: put(v)) for k, v in (STREAM_ARMS if arms is None else arms).items()}
    if triton:
        graphed["triton"] = lambda: put(None)
    try:
        graph_arms(eng, rounds, key, graphed, row_counts=(1, 3, 4))
    finally:
        put({})
        cuda_fusions.STREAM = kept[0]


# The input products' shapes on 4 warps of 2 slots (8 slots of 8 KiB a CTA: 78 KiB of shared memory with the
# conv's sums), the DeltaNet's (its conv: 188 registers a thread) capped at 176, so that an output product's
# CTA (8 warps of 165 registers, 144 KiB) fits beside one: 22.5 + 43 K registers of 64 K, 222 KiB of 228.
# "carveout": the stream products prefer all of L1 as shared memory, so an SM is in one configuration for
# both kernels. (Registers: tools/stream_regs.py, on the CPU.)
IN_4W = {"CONFIG": {(2048, 12352): (2, 4, 256, 2), (2048, 9216): (2, 4, 256, 2)}, "MAXREG": {(2048, 12352): 176}}
CORESIDENT_ARMS = {"default": {}, "links": {"links": True},
                   "in_4w, links, carveout": {**IN_4W, "links": True, "carveout": 100},
                   "in_4w, links": {**IN_4W, "links": True},
                   "in_4w, carveout": {**IN_4W, "carveout": 100},
                   "carveout": {"carveout": 100}}


def coresident(eng: Engine, rounds: int) -> None:
    """Whether the output product's weights stream sooner once its CTAs fit beside the input product's
    (CORESIDENT_ARMS through stream(); docs/cuda.md "From inside the kernels": its CTAs start asking only as
    the input product's leave). The arms with the default CONFIG give the same logits; IN_4W sums the input
    products in another order."""
    stream(eng, rounds, "coresident", CORESIDENT_ARMS, triton=False)


# small_smem: 128 + 64 KiB of slots, so a down CTA fits beside a gate/up CTA on an SM
STREAM_MOE_ARMS = {"stream_moe": {}, "stream_moe_small_smem": {"GSPW": 2, "DSPW": 1},
                   "stream_moe_dspw1": {"DSPW": 1}}


def stream_moe(eng: Engine, rounds: int) -> None:
    """The expert products by the stream kernels (verispec/ops/cuda_stream_moe.py) in each
    STREAM_MOE_ARMS setting against the Triton expert kernels, in the graphed forward (1, 3, 4 rows).
    GR, GSPW, DSPW and the early launch change no sum's order (their arms must give the first arm's
    logits); the Triton arm sums in other orders. (Calls 95-96 also ran the stream gate/up with the
    Triton down: docs/cuda-history.md.)"""
    from verispec.ops import cuda_fusions, cuda_stream_moe as sm

    names = ("GR", "GSPW", "DSPW", "EARLY_ROUTE")
    kept = cuda_fusions.STREAM_MOE, {k: getattr(sm, k) for k in names}

    def arm(setting):
        def setup():
            cuda_fusions.STREAM_MOE = setting is not None
            for k in names:
                setattr(sm, k, (setting or {}).get(k, kept[1][k]))
        return setup
    try:
        graph_arms(eng, rounds, "stream_moe", {**{k: arm(v) for k, v in STREAM_MOE_ARMS.items()}, "triton": arm(None)},
                   row_counts=(1, 3, 4))
    finally:
        cuda_fusions.STREAM_MOE = kept[0]
        for k in names:
            setattr(sm, k, kept[1][k])


def stream_alone(rounds: int) -> None:
    """Each shape of cuda_stream_gemv.CONFIG alone: a graph of products over distinct weights
    (~400 MB in all, so L2 holds none of them; the DeltaNet's input product with its conv), 1 and
    4 rows, stream against Triton, interleaved; and the output product behind the gated norm
    (the norm lets a stream product launch early)."""
    from verispec.ops import cuda_fusions, cuda_gemv, cuda_norms, cuda_stream_gemv

    kept = cuda_fusions.STREAM, cuda_stream_gemv.TMA2D
    out = {}
    bf = torch.bfloat16
    try:
        for (k, n) in sorted(cuda_stream_gemv.CONFIG):
            count = max(4, (400 << 20) // (2 * k * n))
            ws = [torch.randn(n, k, device="cuda").to(bf) * k ** -0.5 for _ in range(count)]
            conv = n == 12352
            rings = [torch.zeros(8192, 3, device="cuda", dtype=bf) for _ in range(count)]
            cw = torch.randn(8192, 4, device="cuda").to(bf)
            gnorm = k == 4096
            for rows in (1, 4):
                x = torch.randn(rows, k, device="cuda").to(bf)
                z = torch.randn(rows, 32, 128, device="cuda").to(bf)
                nw = torch.ones(128, device="cuda", dtype=bf)

                def body(with_norm):
                    for i, w in enumerate(ws):
                        xi = x
                        if with_norm:
                            xi = cuda_norms.row_norm(x.view(rows, 32, 128), cuda_norms.GATED, 1e-6, nw, z).view(rows, k)
                        cuda_gemv.linear_rows(xi, w, conv=cuda_gemv.ConvEpilogue(rings[i], cw, None) if conv else None)
                graphs = {}
                for arm in ("triton", "stream", "stream_1d"):
                    for with_norm in ((False, True) if gnorm else (False,)):
                        cuda_fusions.STREAM = arm != "triton"
                        cuda_stream_gemv.TMA2D = int(arm != "stream_1d")
                        body(with_norm)
                        _sync()
                        g = torch.cuda.CUDAGraph()
                        with torch.cuda.graph(g):
                            body(with_norm)
                        graphs[arm + ("_after_gnorm" if with_norm else "")] = g
                times = {a: [] for a in graphs}
                for r in range(-2, rounds):
                    for a, g in graphs.items():
                        t = sync_time(g.replay)
                        if r >= 0:
                            times[a].append(t / count)
                med = {a: statistics.median(v) * 1e6 for a, v in times.items()}
                out[f"{k}x{n}_rows{rows}"] = {"us": med, "times": times, "bytes": 2 * k * n}
                log(f"[stream_alone] {k}x{n}{' +conv' if conv else ''}, rows {rows}, per product: " + "; ".join(
                    f"{a} {med[a]:.2f} us [{min(times[a]) * 1e6:.2f}-{max(times[a]) * 1e6:.2f}] "
                    f"({2 * k * n / med[a] / 1e6:.2f} TB/s)" for a in med))
            del ws
            torch.cuda.empty_cache()
        RESULTS["stream_alone"] = out
    finally:
        cuda_fusions.STREAM, cuda_stream_gemv.TMA2D = kept


def pdl(eng: Engine, rounds: int) -> None:
    """PDL off against on (verispec/ops/cuda_launch.py)."""
    from verispec.ops import cuda_launch

    graph_arms(eng, rounds, "pdl", {"pdl_off": lambda: setattr(cuda_launch, "enabled", False),
                                    "pdl_on": lambda: setattr(cuda_launch, "enabled", True)})


def fusions(eng: Engine, rounds: int) -> None:
    """Every fusion on (the default) against each one off (verispec/ops/cuda_fusions.py). Only
    LOGITS_IN_PRODUCT moves no bit; NORM_ROUTER's router logits are summed in another order."""
    from verispec.ops import cuda_fusions

    def only_off(*off):
        return lambda: [setattr(cuda_fusions, f, f not in off) for f in FUSIONS]
    graph_arms(eng, rounds, "fusions", {"all_on": only_off(), **{f"{f.lower()}_off": only_off(f) for f in FUSIONS}},
               row_counts=(1, 3, 4))


# candidates for the expert kernels' blocks: the best of cuda_moe_sweep.py --wide, and gate/up's
# configuration before it
MOE_ARMS = {"gate_up": [(4, 128, 8, 3), (8, 256, 16, 3), (8, 512, 4, 3)],
            "down": [(16, 128, 16, 3), (16, 256, 16, 1), (4, 256, 4, 1)]}


def moe_blocks(eng: Engine, rounds: int, kernel: str) -> None:
    """An expert kernel's configured blocks against the candidates MOE_ARMS[kernel], in the
    whole graphed forward (another K block sums in another order: the logits may differ)."""
    from verispec.ops import cuda_moe

    def use(cfg):
        return lambda: cuda_moe.CONFIG.__setitem__(kernel, cfg)
    arms = {f"configured {list(cuda_moe.CONFIG[kernel])}": use(cuda_moe.CONFIG[kernel])}
    arms.update({str(list(c)): use(c) for c in MOE_ARMS[kernel]})
    graph_arms(eng, rounds, kernel, arms)


# candidates for the largest decode products' blocks (BLOCK_N, BLOCK_K, warps, stages[, split])
GEMV_ARMS = {(2048, 12352): [(16, 128, 4, 4), (16, 256, 4, 4), (32, 256, 8, 4), (64, 128, 8, 4)],
             (2048, 9216): [(16, 128, 4, 4), (16, 256, 4, 4), (32, 256, 8, 4), (64, 128, 8, 4)]}


def gemv_blocks(eng: Engine, rounds: int) -> None:
    """For each shape of GEMV_ARMS, the fixed-order product's configured blocks against the
    candidates, in the whole graphed forward (the logits may differ: other K blocks)."""
    from verispec.ops import cuda_gemv

    for shape, cands in GEMV_ARMS.items():
        now = cuda_gemv.CONFIG.get(shape, cuda_gemv.DEFAULT)

        def use(cfg, shape=shape):
            return lambda: cuda_gemv.CONFIG.__setitem__(shape, cfg)
        arms = {f"configured {list(now)}": use(now)}
        arms.update({str(list(c)): use(c) for c in cands})
        graph_arms(eng, rounds, f"gemv {shape[0]}x{shape[1]}", arms)     # puts CONFIG back


def small(eng: Engine, rounds: int) -> None:
    """The small kernels' settings (chosen alone by bench/cuda_small_sweep.py) against a
    neighbour each, in the whole graphed forward: the add + norm's and the combine's warps,
    the recurrence's value columns per program. Each arm changes one setting."""
    from verispec.ops import cuda_deltanet, cuda_moe, cuda_norms

    base = (dict(cuda_norms.WARPS), dict(cuda_moe.CONFIG), cuda_deltanet.STEPS)

    def arm(warps=None, moe=None, steps=None):
        def set_():
            cuda_norms.WARPS.update({**base[0], **(warps or {})})
            cuda_moe.CONFIG.update({**base[1], **(moe or {})})
            cuda_deltanet.STEPS = steps or base[2]
        return set_
    graph_arms(eng, rounds, "small", {"configured": arm(), "add_norm 8 warps": arm(warps={"add": 8}),
                                      "combine_norm 16 warps": arm(moe={"combine_norm": 16}),
                                      "recurrence (32, 2)": arm(steps=(32, 2)),
                                      "recurrence (16, 4)": arm(steps=(16, 4))})


def norm_router(eng: Engine, rounds: int) -> None:
    """The add + norm + router product's launch shape (cuda_norm_router.BLOCK_N, WARPS) against
    cuda_norm_router.CANDIDATES, in the whole graphed forward. Another shape may lay the sums out otherwise,
    so the logits may differ between arms (each is exact and row-invariant on its own)."""
    from verispec.ops import cuda_norm_router

    def use(bn, w):
        def set_():
            cuda_norm_router.BLOCK_N, cuda_norm_router.WARPS = bn, w
        return set_
    now = (cuda_norm_router.BLOCK_N, cuda_norm_router.WARPS)
    arms = {f"configured {list(now)}": use(*now)}
    arms.update({str(list(c)): use(*c) for c in cuda_norm_router.CANDIDATES if c != now})
    graph_arms(eng, rounds, "norm_router", arms, row_counts=(1, 4))


def recurrence(eng: Engine, rounds: int) -> None:
    """The recurrence's value columns per program and warps (cuda_deltanet.STEPS), and LINKS (the
    recurrence letting its successor launch before its wait), in the whole graphed forward: whether
    the recurrence's ~4.5 us a DeltaNet layer in the chain (bench/cuda_ablation.py) depends on its
    launch shape. (Call 116: it does not.) The bits may differ between block settings (the
    reduction's layout changes with the block)."""
    from verispec.ops import cuda_deltanet, cuda_launch

    base, links = cuda_deltanet.STEPS, cuda_launch.LINKS

    def arm(steps, link=links):
        def set_():
            cuda_deltanet.STEPS, cuda_launch.LINKS = steps, link
        return set_
    arms = {f"recurrence {base}": arm(base)}
    arms |= {f"recurrence {st}": arm(st) for st in ((32, 2), (32, 4), (64, 4), (128, 4), (128, 8)) if st != base}
    arms[f"recurrence {base}, links {not links}"] = arm(base, not links)
    try:
        graph_arms(eng, rounds, "recurrence", arms)
    finally:
        cuda_deltanet.STEPS, cuda_launch.LINKS = base, links


def rec(eng: Engine, rounds: int) -> None:
    """The DeltaNet recurrence by the CUDA C++ kernel written for latency (cuda_fusions.REC,
    verispec/ops/cuda_recurrence.py) against the Triton kernel, in the whole graphed forward. The
    bits differ (other sums); each arm's rows are invariant (tests/test_cuda_recurrence.py)."""
    from verispec.ops import cuda_fusions, cuda_recurrence as cr

    kept = cuda_fusions.REC, cr.CB, cr.WARPS, cr.PRE, cr.FAST

    def arm(on, cb=16, warps=2, pre=1, fast=0):
        def set_():
            cuda_fusions.REC, cr.CB, cr.WARPS, cr.PRE, cr.FAST = on, cb, warps, pre, fast
        return set_
    arms = {"triton recurrence": arm(False), "cuda (16, 2, pre)": arm(True),
            "cuda (16, 2, pre, fast)": arm(True, fast=1), "cuda (16, 2, fast)": arm(True, pre=0, fast=1),
            "cuda (8, 2, pre, fast)": arm(True, 8, 2, 1, 1), "cuda (8, 4, pre, fast)": arm(True, 8, 4, 1, 1),
            "cuda (8, 1, pre, fast)": arm(True, 8, 1, 1, 1)}
    try:
        graph_arms(eng, rounds, "rec", arms)
    finally:
        cuda_fusions.REC, cr.CB, cr.WARPS, cr.PRE, cr.FAST = kept


def links(eng: Engine, rounds: int) -> None:
    """The recurrence (the CUDA C++ kernel, cuda_fusions.REC, or the Triton one) with and without
    cuda_launch.LINKS (it and the attention's attend let the next kernel launch before their wait,
    so the output product after the gated norm launches, and fetches its weights, while the input
    product is still finishing: bench/cuda_stamps.py, call 124). Arms with the same recurrence must
    give the same logits (the first two; the last two)."""
    from verispec.ops import cuda_fusions, cuda_launch

    kept = cuda_fusions.REC, cuda_launch.LINKS

    def arm(rec_on, link):
        def set_():
            cuda_fusions.REC, cuda_launch.LINKS = rec_on, link
        return set_
    arms = {"cuda recurrence": arm(True, False), "cuda recurrence, links": arm(True, True),
            "triton recurrence": arm(False, False), "triton recurrence, links": arm(False, True)}
    try:
        graph_arms(eng, rounds, "links", arms, row_counts=(1, 3, 4))
    finally:
        cuda_fusions.REC, cuda_launch.LINKS = kept


# name -> (PRE, PACE, EVF) of the stream products (cuda_stream_gemv.py): units a warp requested before
# the wait (None: all its slots), one at a time, evict-first copies. The arithmetic is the same in
# every arm: the logits must equal the first arm's.
FLOOD_ARMS = {"all ahead": (None, 0, 0), "paced": (None, 1, 0), "one ahead": (1, 0, 0), "two ahead": (2, 0, 0),
              "evict first": (None, 0, 1), "paced, evict first": (None, 1, 1)}


def flood(eng: Engine, rounds: int) -> None:
    """How the stream products request their weights before their wait (bench/cuda_flood_probe.py
    says why it may matter): all of a warp's slots at once (today), paced, fewer, evict-first."""
    from verispec.ops import cuda_stream_gemv as sg

    kept = sg.PRE, sg.PACE, sg.EVF

    def arm(setting):
        def set_():
            sg.PRE, sg.PACE, sg.EVF = setting
        return set_
    try:
        graph_arms(eng, rounds, "flood", {k: arm(v) for k, v in FLOOD_ARMS.items()})
    finally:
        sg.PRE, sg.PACE, sg.EVF = kept


# (prefetch: None / "after" / "before" the product's wait, the next weight's rows past its slots or "all",
#  an evict-last policy on the prefetch, the experts' and stream products' loads evict-first)
L2NEXT_ARMS = {"off": (None, True, False, False), "evict first": (None, True, False, True),
               "after": ("after", True, False, True), "before": ("before", True, False, True),
               "after, evict last": ("after", True, True, True), "after, all": ("after", False, False, True),
               "after, no hints": ("after", True, False, False)}


def l2next(eng: Engine, rounds: int) -> None:
    """Each layer's output product asks the copy engine to bring the next layer's input product's
    weights into L2 (cuda_stream_gemv.L2_NEXT, an experiment): between the two the DRAM idles
    through the recurrence, the norms and the router (bench/cuda_timeline.py, call 290), and the
    input product streams only its first slots into shared memory before its wait. With the
    experts' weights loaded evict-first (cuda_moe.EVW) so their 57 MB a layer do not push the
    prefetched lines out. Nothing here moves a value: every arm's logits must equal `off`'s."""
    from verispec.ops import cuda_moe, cuda_nvrtc, cuda_stream_gemv as sg

    if DEVICE != "cuda":
        log("[l2next] skipped: no CUDA GPU")
        return
    layers = eng.model.layers
    pairs = [(a.mixer.out, b.mixer.w_in if hasattr(b.mixer, "w_in") else b.mixer.w_qkv)
             for a, b in zip(layers, layers[1:])]
    sms = cuda_nvrtc.sm_count(torch.device("cuda"))
    plans = {skip: sg.l2_plan(pairs, sms, skip_slots=skip) for skip in (True, False)}
    for skip, plan in plans.items():
        log(f"[l2next] {'past the slots' if skip else 'all'}: {len(plan)} of {len(pairs)} output products prefetch "
            f"{sum(b for _, b in plan.values()) / len(plan) / 1e6 if plan else 0:.1f} MB each")
    kept = sg.L2_NEXT, sg.L2AT, sg.L2EL, sg.EVF, cuda_moe.EVW

    def arm(setting):
        where, skip, last, evf = setting

        def set_():
            sg.L2_NEXT = plans[skip] if where else {}
            sg.L2AT = 0 if where == "before" else 1
            sg.L2EL = int(last)
            sg.EVF = int(evf)
            cuda_moe.EVW = "evict_first" if evf else ""
        return set_
    try:
        graph_arms(eng, rounds, "l2next", {k: arm(v) for k, v in L2NEXT_ARMS.items()})
    finally:
        sg.L2_NEXT, sg.L2AT, sg.L2EL, sg.EVF, cuda_moe.EVW = kept


TAIL_ARMS = {"off": (0, False), "registers, streaming": (1, False), "registers, nc": (2, False),
             "tickets": (0, True), "tickets, registers": (1, True)}


def tail(eng: Engine, rounds: int) -> None:
    """The stream products' work after their wait (experiments, cuda_stream_gemv.REGT and DYN): the units
    past a warp's slots read into registers instead of TMA tiles into the freed slots (on the H200 a burst
    of layer size streamed 3.46 TB/s by register loads against 3.0 by bulk copies: bench/cuda_flood_probe.py,
    calls 135-136), and the tasks past each CTA's first round but one dealt by tickets, so the CTAs whose
    bytes come sooner take the tail (the input product's CTAs end over 2.4-3.5 us: bench/cuda_stamps.py,
    call 124). No value moves: every arm's logits must equal `off`'s."""
    from verispec.ops import cuda_stream_gemv as sg

    kept = sg.REGT, sg.DYN

    def arm(setting):
        def set_():
            sg.REGT, sg.DYN = setting
        return set_
    try:
        graph_arms(eng, rounds, "tail", {k: arm(v) for k, v in TAIL_ARMS.items()}, row_counts=(1, 3, 4))
    finally:
        sg.REGT, sg.DYN = kept


# name -> (the input products' CTAs at most, or None: one an SM; cuda_launch.LINKS; the CUDA C++ recurrence,
# cuda_fusions.REC). The REC arms sum in another order: their logits must equal `rec`'s.
# (Calls 310-311 also ran caps of 116, 66 and 50 with LINKS and 100 without: within the spread or slower.)
GRID_ARMS = {"default": (None, False, False), "links": (None, True, False), "100, links": (100, True, False),
             "84, links": (84, True, False), "rec": (None, False, True), "rec, links": (None, True, True),
             "rec, 100, links": (100, True, True), "rec, 84, links": (84, True, True)}


def grid(eng: Engine, rounds: int) -> None:
    """The mixers' input products on fewer CTAs than SMs (cuda_stream_gemv.GRID, an experiment), with and
    without the recurrence and the gated norm letting the output product launch before their waits
    (cuda_launch.LINKS). An output product's CTA cannot sit beside an input product's (docs/cuda.md, "The
    output product beside the input product"), so today it starts asking for its weights only as the input
    product's CTAs leave; on the SMs left free it can ask while the input product streams. The 4-warp input
    products that made room (call 277) lost by halving the bytes in flight a CTA; these keep 24 units a CTA.
    With the CUDA C++ recurrence too (REC): alone it ended 3.3-3.8 us after the input product against the
    Triton one's 6.4, and the time moved to the output product's weights arriving (call 124); the cap and
    LINKS (calls 310-311) were measured with the Triton recurrence only. No value moves: every arm's logits
    must equal `default`'s, or `rec`'s for the REC arms."""
    from verispec.ops import cuda_fusions, cuda_launch, cuda_stream_gemv as sg

    kept = dict(sg.GRID), cuda_launch.LINKS, cuda_fusions.REC
    ins = [kn for kn in sg.CONFIG if kn[1] != 2048]

    def arm(setting):
        cap, links, rec_on = setting

        def set_():
            sg.GRID.clear()
            sg.GRID.update({kn: cap for kn in ins} if cap else {})
            cuda_launch.LINKS = links
            cuda_fusions.REC = rec_on
        return set_
    refs = {k: "rec" for k, v in GRID_ARMS.items() if v[2]}
    try:
        graph_arms(eng, rounds, "grid", {k: arm(v) for k, v in GRID_ARMS.items()}, row_counts=(1, 3, 4), refs=refs)
    finally:
        sg.GRID.clear()
        sg.GRID.update(kept[0])
        cuda_launch.LINKS, cuda_fusions.REC = kept[1], kept[2]


# arm -> (cuda_fusions.ROUTE_CLUSTER, cuda_norm_route.CLUSTER, cuda_moe.SHARED_FIRST)
ROUTE_ARMS = {"default": (False, 8, True), "shared waits": (False, 8, False), "cluster 8": (True, 8, True)}
ROUTE16_ARMS = {"cluster 8": (True, 8, True), "cluster 16": (True, 16, True)}   # a second run: 16 is non-portable


def route(eng: Engine, rounds: int) -> None:
    """The add + norm + router product and the router in one launch (cuda_fusions.ROUTE_CLUSTER, an
    experiment): a row's CTAs form a cluster, the first routes once the others' logits are in its shared
    memory. The router ends ~2.5 us after the product in the graphed step (call 290). With it folded, the
    gate/up launch follows the launch that writes its input, so the shared expert's programs wait too
    (`shared waits` is the default with only that). The cluster sums in other orders than the two
    launches: its arms' logits must equal each other's (a row's sums do not depend on the cluster's
    size), the default's only `shared waits`'."""
    from verispec.ops import cuda_fusions, cuda_moe, cuda_norm_route, cuda_stream_gemv

    if DEVICE != "cuda" or not cuda_norm_route.available(torch.device("cuda")):
        log("[route] skipped: the cluster router kernel does not build here")
        return
    if not cuda_stream_gemv.available(torch.device("cuda")):   # the router runs in the stream products' chain only
        log("[route] skipped: the cluster router needs the CUDA C++ stream products, which do not build here")
        return
    kept = cuda_fusions.ROUTE_CLUSTER, cuda_norm_route.CLUSTER, cuda_moe.SHARED_FIRST

    def arm(setting):
        def set_():
            cuda_fusions.ROUTE_CLUSTER, cuda_norm_route.CLUSTER, cuda_moe.SHARED_FIRST = setting
        return set_
    try:
        graph_arms(eng, rounds, "route", {k: arm(v) for k, v in ROUTE_ARMS.items()}, row_counts=(1, 3, 4),
                   refs={"cluster 8": "cluster 8"})
        try:   # the cluster arms' logits must be equal: the reference is the first arm
            graph_arms(eng, rounds, "route16", {k: arm(v) for k, v in ROUTE16_ARMS.items()}, row_counts=(1, 3, 4))
        except Exception as e:  # a size the GPU cannot schedule: keep the first run's numbers
            RESULTS["route16_error"] = repr(e)
            log(f"[route16] FAILED: {e!r}")
    finally:
        cuda_fusions.ROUTE_CLUSTER, cuda_norm_route.CLUSTER, cuda_moe.SHARED_FIRST = kept


def undo(eng: Engine, rounds: int) -> None:
    """The undo after a rejected draft under CUDA graphs (State.commit with copy_commit): the
    kept row's copy slot copied into the live state, every layer: two copies per layer, one
    multi-tensor copy of the mixed-dtype list, one per dtype (RecurrentState.copy_from), and
    the latter replayed from a CUDA graph; synchronised, interleaved."""
    m = eng.model
    st = m.new_state(len(PROMPT) + 16)
    m.forward(PROMPT, st)
    st.ensure_slots(1)
    slot, live = st.slots[0], st.recurrent
    n = len(live.conv)

    def per_layer():
        for layer in range(n):
            live.copy_layer_from(slot, layer)

    def mixed():
        torch._foreach_copy_(live.conv + live.rec, slot.conv + slot.rec)

    arms = [("per_layer", per_layer), ("one_launch", mixed), ("by_dtype", lambda: live.copy_from(slot))]
    g = torch.cuda.CUDAGraph() if DEVICE == "cuda" else None
    if g is not None:
        live.copy_from(slot)
        torch.cuda.synchronize()
        with torch.cuda.graph(g):
            live.copy_from(slot)
    if g is not None:
        arms.append(("graph", g.replay))
    times = {k: [] for k, _ in arms}
    for r in range(-2, rounds):
        for k, fn in arms:
            t = sync_time(fn)
            if r >= 0:
                times[k].append(t)
    med = {k: statistics.median(v) for k, v in times.items()}
    nbytes = sum(t.numel() * t.element_size() for t in live.conv + live.rec)
    RESULTS["undo"] = {"ms": {k: v * 1e3 for k, v in med.items()}, "bytes": nbytes, "layers": n, "times": times}
    log(f"[undo] {n} DeltaNet layers, {nbytes / 1e6:.1f} MB: " + "; ".join(
        f"{k} {med[k] * 1e3:.3f} ms [{min(v) * 1e3:.3f}-{max(v) * 1e3:.3f}]" for k, v in times.items()))


def spec(eng: Engine, n: int, rounds: int, key: str) -> None:
    plain_arm = settings(n)
    rates = {"plain": [], "mtp2_bernoulli": [], "mtp1_bernoulli": []}
    walls = {k: [] for k in rates}
    ids_equal = True
    for r in range(-1, rounds):                  # round -1: warm-up, not counted
        plain, wall = timed_generate(eng, PROMPT, plain_arm, keep_logits=True)
        if r >= 0:
            rates["plain"].append(_tok_s(plain))
            walls["plain"].append(wall)
        for name, depth, force in (("mtp2_bernoulli", 2, "bernoulli:0.97,0.83"), ("mtp1_bernoulli", 1, "bernoulli:0.97")):
            s = settings(n, mtp="on", mtp_drafts=depth, force=force, reference=tuple(plain.ids), gate=False)
            res, wall = timed_generate(eng, PROMPT, s, keep_logits=True)
            ids_equal &= res.ids == plain.ids and all(torch.equal(a, b) for a, b in zip(res.logits, plain.logits))
            if r >= 0:
                rates[name].append(_tok_s(res))
                walls[name].append(wall)
    med = {k: statistics.median(v) for k, v in rates.items()}
    wmed = {k: statistics.median(v) for k, v in walls.items()}
    RESULTS[key] = {"rates": rates, "median": med, "wall": walls, "wall_median": wmed,
                    "ids_and_logits_equal_plain": ids_equal}
    log(f"[{key}] wall clock: plain {wmed['plain']:.1f} tok/s; MTP 1 {wmed['mtp1_bernoulli']:.1f} "
        f"({wmed['mtp1_bernoulli'] / wmed['plain']:.2f}x); MTP 2 {wmed['mtp2_bernoulli']:.1f} "
        f"({wmed['mtp2_bernoulli'] / wmed['plain']:.2f}x)")
    log(f"[{key}] plain {med['plain']:.1f} tok/s; MTP 1 bernoulli 0.97 {med['mtp1_bernoulli']:.1f} "
        f"({med['mtp1_bernoulli'] / med['plain']:.2f}x); MTP 2 bernoulli 0.97,0.83 {med['mtp2_bernoulli']:.1f} "
        f"({med['mtp2_bernoulli'] / med['plain']:.2f}x); drafted = plain bit for bit: {ids_equal}")


def kernels() -> None:
    """Which CUDA C++ kernels build and run here, said before any timing: where NVRTC refuses one, the
    engine runs its Triton kernels instead (exact, slower) and says so only once on stderr, so a run on
    that fallback could pass for the default (device call 339)."""
    from verispec.ops import cuda_fusions, cuda_norm_route, cuda_recurrence, cuda_stream_gemv, cuda_stream_moe

    dev = torch.device("cuda")
    got = {"stream products": (cuda_fusions.STREAM, cuda_stream_gemv.available(dev)),
           "recurrence": (cuda_fusions.REC, cuda_recurrence.available(dev)),
           "stream experts": (cuda_fusions.STREAM_MOE, cuda_stream_moe.available(dev)),
           "cluster router": (cuda_fusions.ROUTE_CLUSTER, cuda_norm_route.available(dev))}
    RESULTS["kernels"] = {k: {"on": on, "builds": built} for k, (on, built) in got.items()}
    said = ", ".join(f"{k} {'on' if on else 'off'}{'' if built else ' (DOES NOT BUILD)'}" for k, (on, built) in got.items())
    log(f"[kernels] CUDA C++: {said}")
    if cuda_fusions.STREAM and not got["stream products"][1]:
        log("[kernels] WARNING: the default stream products do not build here: every timing below is of the "
            "Triton fallback, not of the default path")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=40)
    p.add_argument("--preset", default="qwen3.6-35b-a3b-shape")
    p.add_argument("--eager", action="store_true", help="no CUDA graphs")
    p.add_argument("--cpu-smoke", action="store_true", help="run the logic on the CPU (padded bf16), no timings worth reading")
    p.add_argument("--sections", default="bandwidth,decode,verify,overhead,spec")
    p.add_argument("--tokens", type=int, default=24)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    a = p.parse_args()
    global DEVICE
    if a.cpu_smoke:
        DEVICE = "cpu"
    elif not torch.cuda.is_available():
        print("cuda_bench: torch sees no CUDA GPU (use --cpu-smoke to check the logic here)", file=sys.stderr)
        return 2
    sections = a.sections.split(",")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    RESULTS.update(device=torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu", torch=torch.__version__, layers=a.layers,
                   date=time.strftime("%Y-%m-%d %H:%M"), args=vars(a))

    def save():
        (out / "cuda_bench.json").write_text(json.dumps(RESULTS, indent=1, default=str) + "\n")

    # every ceiling is this card's: an H200's constant put an H100's verify at 2x its limit (device call 278)
    uses_bw = {"bandwidth", "decode", "verify", "spec"} & set(sections)
    bw = bandwidth() if uses_bw and DEVICE == "cuda" else 4.27e12
    if DEVICE == "cuda":
        kernels()
    save()
    eng, ck = build(a.preset, a.layers, "independent", 1, graphs=not a.eager)
    steps = [("decode", lambda: decode(eng, a.tokens, a.rounds, bw)),
             ("verify", lambda: verify(eng, a.rounds + 2, bw)),
             ("overhead", lambda: overhead(eng, ck, 4 * a.rounds + 4)),
             ("pdl", lambda: pdl(eng, 4 * a.rounds + 4)),
             ("fusions", lambda: fusions(eng, 4 * a.rounds + 4)),
             ("shared_first", lambda: shared_first(eng, 4 * a.rounds + 4)),
             ("moe_tail", lambda: moe_tail(eng, 4 * a.rounds + 4)),
             ("stream", lambda: stream(eng, 4 * a.rounds + 4)),
             ("coresident", lambda: coresident(eng, 4 * a.rounds + 4)),
             ("stream_alone", lambda: stream_alone(10 * a.rounds)),
             ("stream_moe", lambda: stream_moe(eng, 4 * a.rounds + 4)),
             ("gate_up", lambda: moe_blocks(eng, 4 * a.rounds + 4, "gate_up")),
             ("down", lambda: moe_blocks(eng, 4 * a.rounds + 4, "down")),
             ("gemv", lambda: gemv_blocks(eng, 4 * a.rounds + 4)),
             ("small", lambda: small(eng, 4 * a.rounds + 4)),
             ("norm_router", lambda: norm_router(eng, 4 * a.rounds + 4)),
             ("recurrence", lambda: recurrence(eng, 4 * a.rounds + 4)),
             ("rec", lambda: rec(eng, 4 * a.rounds + 4)),
             ("flood", lambda: flood(eng, 4 * a.rounds + 4)),
             ("links", lambda: links(eng, 4 * a.rounds + 4)),
             ("l2next", lambda: l2next(eng, 4 * a.rounds + 4)),
             ("tail", lambda: tail(eng, 4 * a.rounds + 4)),
             ("grid", lambda: grid(eng, 4 * a.rounds + 4)),
             ("route", lambda: route(eng, 4 * a.rounds + 4)),
             ("undo", lambda: undo(eng, 10 * a.rounds)),
             ("spec", lambda: spec(eng, a.tokens, a.rounds, "spec_independent"))]
    for name, fn in steps:
        if name in sections:
            try:
                fn()
            except Exception as e:  # keep what the other sections measured
                RESULTS[f"{name}_error"] = repr(e)
                log(f"[{name}] FAILED: {e!r}")
            save()
    if "spec" in sections:
        del eng, ck, steps, fn
        # the model and its graphs refer to each other (Model.graphs, .prompt_graphs): only the cycle
        # collector frees them, and an 80 GB card holds one 68 GiB model, not two (device call 178)
        gc.collect()
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
        try:
            eng, ck = build(a.preset, a.layers, "correlated", 2, graphs=not a.eager)
            verify(eng, a.rounds, bw, key="verify_correlated")
            spec(eng, a.tokens, a.rounds, "spec_correlated")
        except Exception as e:
            RESULTS["correlated_error"] = repr(e)
            log(f"[correlated] FAILED: {e!r}")
        save()
    log(json.dumps({k: v for k, v in RESULTS.items() if k in ("bandwidth_Bps",)}, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
