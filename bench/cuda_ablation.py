"""Where the real decode step's time goes, in its own chain (issue 9): the graphed forward of the
35B-A3B shape with one kind of launch taken out at a time.

bench/cuda_chain_probe.py runs the step's phases as a PDL chain of kernels that only stream bytes;
this runs the real forward (bench/cuda_bench.py's model and graphed A/B, `graph_arms`) with some
launches left out of the captured graph: a Triton kernel's launcher replaced by one that launches
nothing, the router by fixed valid expert ids, the CUDA C++ stream products by skipping their
launch. The logits are wrong by construction; only the time counts. (With the router left out, the
shared expert's gate/up programs, which read their input before their wait because the router's
launch sits between them and the kernel writing it, read it while that kernel still runs: the arm's
values are racy, not only wrong; its time stands. Eighteenth session, call 132.) The time an arm saves is what
those launches cost where they sit in the chain (their own work, their boundary and what the kernels
around them could not overlap), which is what folding them away, or making them faster, could win.
Every arm but `no_router` runs the real router's launch and then reads fixed valid expert ids (as
the predict arms' `fixed` does): a left-out kernel leaves garbage activations, and ids routed from
them could send every row to the same experts (call 115: the 4-row arms read fewer bytes) or, in
`no_gate_up`, reach the down kernel unwritten (it reads its ids before its wait, DOWN_EARLY, which
is safe only because gate/up sits between it and the router: call 290's illegal address). With
fixed ids every arm reads the same weight bytes.
Arms interleaved, medians; 1 row (and 4 with --rows 1,4).

  python3 bench/cuda_ablation.py --rounds 20 --out $OUT

--arms predict measures instead what predicting the routed experts could win in the real chain
(thirty-second session): the router runs as always, but the experts read fixed valid ids, so a
prediction of them can be always right. The gate/up kernel's PRED variant (cuda_moe._gate_up_act)
loads the first half of each program's weights (the predicted expert's) before its wait; the
router launches it after its own wait (as now) or before (so its programs are resident while the
add + norm + router product and the router run). The arms: `fixed` (no prediction), `fixed_pred`
(always right, router as now), `fixed_early_none` (router early, only the shared expert's
programs preload), `fixed_early_pred` (router early, always right), `fixed_early_wrong` (router
early, always wrong: the bytes a miss wastes), `fixed_early_pred2` (both halves of the weights
before the wait), `fixed_down` and `fixed_early_pred2_down` (the down kernel reading its ids and
all its weights before its wait: EARLY_W), and `full` (the real routing, for reference). A second
A/B on the real routing: `full` against `full_down` (EARLY_W needs no prediction: the router's
ids are complete when the down kernel launches; their logits must be equal). The
fixed arms' logits must be equal to each other bit for bit (the prediction moves no value); `full`
routes otherwise and differs.

  python3 bench/cuda_ablation.py --arms predict --rounds 20 --rows 1,4 --out $OUT

--arms l2experts measures the ceiling of asking L2 for a layer's routed experts ahead (thirty-eighth
session). From the input product's end to the router's end the DRAM carries little more than the
output product's 16.8 MB (bench/cuda_timeline.py, call 290), and a layer's eight routed gate/up
weights are 33.6 MB: if they were in L2 when gate/up starts, gate/up would read them at L2's rate.
Unlike the next layer's input product (--sections l2next of bench/cuda_bench.py, no gain: the
experts' 57 MB stream through L2 between the ask and the read), nothing but the router's 1 MB and
the shared expert is read between the ask and gate/up here. Every arm's router runs and every row
reads the same fixed experts 0..7 (contiguous, so one range of gu_all is the whole ask) and the
shared expert; the arms differ only in cuda_stream_gemv.L2_NEXT, so their logits must be equal:
`contig` (no ask), `out_after` / `out_before` (each layer's output product asks for the eight after /
before its wait), `out_half` (the first four only), `out_wrong` (experts 8..15: what a wrong prediction
costs), `in_after` (the input product asks, after its wait: earlier, but while its own 50 MB stream).

  python3 bench/cuda_ablation.py --arms l2experts --rounds 20 --rows 1,4 --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import cuda_bench as cb  # noqa: E402  (bench/ is on the path)
from verispec.ops import (cuda_attention, cuda_deltanet, cuda_moe, cuda_norm_router, cuda_norms,  # noqa: E402
                          cuda_nvrtc)


class _NoLaunch:
    """Stands in for a Triton kernel: kernel[grid](...) launches nothing."""

    def __getitem__(self, grid):
        return lambda *a, **k: None


# what each arm leaves out: (module, Triton kernel name)
KERNELS = {
    "recurrence": [(cuda_deltanet, "_delta_steps")],
    "row_norms": [(cuda_norms, "_row_norm")],                # the gated norm of each DeltaNet layer, the final norm
    "attention_steps": [(cuda_attention, "_prep"), (cuda_attention, "_attend"), (cuda_attention, "_attend_merge")],
    "combine": [(cuda_moe, "_combine")],
    "add_norm_router": [(cuda_norm_router, "_add_norm_router")],   # with its 1 MB of router weights
    "gate_up": [(cuda_moe, "_gate_up_act")],
    "down": [(cuda_moe, "_down_pair")],
}
SMALL = ("recurrence", "row_norms", "attention_steps", "combine", "router")


class Ablation:
    """Puts the launches an arm leaves out in place of the real ones, and back."""

    def __init__(self):
        self.kernels = {(m, n): getattr(m, n) for parts in KERNELS.values() for m, n in parts}
        self.route_shared, self.launch, self.pairs = cuda_moe.route_shared, cuda_nvrtc.launch, cuda_moe._pairs
        w = torch.full((16, 9), 0.125, dtype=torch.float32, device="cuda")
        w[:, 8] = 0.5
        ids = torch.tensor([[(32 * j + r) % 256 for j in range(8)] + [256] for r in range(16)], dtype=torch.int32,
                           device="cuda")
        self.w, self.ids = w, ids
        wrong = (ids + 1) % 256
        wrong[:, 8] = 256
        none = torch.full_like(ids, -1)
        none[:, 8] = 256
        self.preds = {"right": ids, "wrong": wrong, "none": none}
        self.early, self.pred, self.blocks, self.down_early = False, None, 1, False
        self.contig = torch.tensor([list(range(8)) + [256]] * 16, dtype=torch.int32, device="cuda")

    def set(self, leave_out: tuple[str, ...], fixed_ids: bool = False) -> None:
        for (m, n), k in self.kernels.items():
            setattr(m, n, k)
        cuda_moe.route_shared, cuda_nvrtc.launch, cuda_moe._pairs = self.route_shared, self.launch, self.pairs
        if fixed_ids and "router" not in leave_out:
            cuda_moe.route_shared = self._live_route
        for name in leave_out:
            if name == "router":
                cuda_moe.route_shared = self._fixed_route
            elif name == "stream_products":
                cuda_nvrtc.launch = self._launch_but_stream
            else:
                for m, n in KERNELS[name]:
                    setattr(m, n, _NoLaunch())

    def set_predict(self, arm: str) -> None:
        """--arms predict: `full[_down]` or `fixed[_early][_pred|_pred2|_none|_wrong][_down]` (the
        module docstring)."""
        self.set(())
        self.early = "_early" in arm
        self.blocks = 2 if "_pred2" in arm else 1
        self.down_early = arm.endswith("_down")
        self.pred = next((self.preds[p] for p in ("none", "wrong") if f"_{p}" in arm),
                         self.preds["right"] if "_pred" in arm else None)
        if arm.startswith("fixed"):
            cuda_moe.route_shared = self._live_route
        cuda_moe._pairs = self._pairs_pred   # down_early explicit: `full` is the down kernel waiting first

    def _live_route(self, x, rows, n_experts, top_k, norm, early=False):
        """The real router's launch (its ids unused: the chain keeps its latency), fixed ids out."""
        self.route_shared(x, rows, n_experts, top_k, norm, early=self.early)
        return self._fixed_route(x, rows, n_experts, top_k, norm)

    def _pairs_pred(self, x, ids, gu_all, down_all, pairs_per_row, shared_gu, shared_down, shared_first=True):
        rows = ids.numel() // pairs_per_row
        pred = None if self.pred is None else self.pred[:rows].reshape(-1)
        return self.pairs(x, ids, gu_all, down_all, pairs_per_row, shared_gu, shared_down, pred=pred,
                          pred_blocks=self.blocks, down_early=self.down_early, shared_first=shared_first)

    @staticmethod
    def _fixed_shape(n_experts, top_k):
        if n_experts != 256 or top_k != 8:
            raise ValueError("the fixed routing is for 256 experts, top 8")

    def _fixed_route(self, x, rows, n_experts, top_k, norm, early=False):
        self._fixed_shape(n_experts, top_k)
        return self.w[:rows], self.ids[:rows]

    def _contig_route(self, x, rows, n_experts, top_k, norm, early=False):
        """The real router's launch, then every row on experts 0..7 and the shared expert."""
        self._fixed_shape(n_experts, top_k)
        self.route_shared(x, rows, n_experts, top_k, norm)
        return self.w[:rows], self.contig[:rows]

    def set_l2experts(self, plan: dict) -> None:
        """--arms l2experts: contiguous fixed ids, and `plan` as cuda_stream_gemv.L2_NEXT."""
        from verispec.ops import cuda_stream_gemv as sg
        self.set(())
        cuda_moe.route_shared = self._contig_route
        sg.L2_NEXT = plan

    def _launch_but_stream(self, fn, smem, threads, grid, stream, pdl, args, what):
        if what != "stream_gemv":
            self.launch(fn, smem, threads, grid, stream, pdl, args, what)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="qwen3.6-35b-a3b-shape")
    ap.add_argument("--layers", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--rows", default="1")
    ap.add_argument("--arms", choices=("ablation", "predict", "l2experts"), default="ablation")
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("cuda_ablation: torch sees no CUDA GPU", file=sys.stderr)
        return 2
    bw = cb.bandwidth()
    eng, _ = cb.build(a.preset, a.layers, "independent", 1)
    abl = Ablation()
    if a.arms == "predict":
        return predict(eng, abl, a, bw)
    if a.arms == "l2experts":
        return l2experts(eng, abl, a, bw)
    arms = {"full": ()}
    arms |= {f"no_{k}": (k,) for k in ("recurrence", "row_norms", "attention_steps", "router", "combine",
                                       "add_norm_router")}
    arms |= {"no_small": SMALL, "no_small_nor": SMALL + ("add_norm_router",), "no_gate_up": ("gate_up",),
             "no_down": ("down",), "no_stream_products": ("stream_products",)}
    try:
        cb.graph_arms(eng, a.rounds, "ablation", {k: (lambda v=v: abl.set(v, fixed_ids=True)) for k, v in arms.items()},
                      row_counts=tuple(int(r) for r in a.rows.split(",")))
    finally:
        abl.set(())
    limit = cb._active_bytes(eng) / bw
    res = cb.RESULTS["ablation"]
    for rows, r in res.items():
        full = r["ms"]["full"]
        r["saved_ms"] = {k: full - v for k, v in r["ms"].items()}
        cb.log(f"[ablation] rows {rows}: full {full:.3f} ms ({limit * 1e3 / full * 100:.1f}% of the {limit * 1e3:.3f} ms "
               f"limit); saved: " + "; ".join(f"{k} {full - v:.3f} ms" for k, v in r["ms"].items() if k != "full"))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cuda_ablation.json").write_text(json.dumps({"bandwidth_Bps": bw, "limit_ms": limit * 1e3,
                                                        "arms": {k: list(v) for k, v in arms.items()},
                                                        "ablation": res}, indent=1, default=str) + "\n")
    return 0


PREDICT_ARMS = ("fixed", "fixed_pred", "fixed_early_none", "fixed_early_pred", "fixed_early_pred2",
                "fixed_early_wrong", "fixed_down", "fixed_early_pred2_down", "full")
REAL_ARMS = ("full", "full_down")   # the real routing: the down kernel reading its weights before its wait


def predict(eng, abl: Ablation, a, bw: float) -> int:
    """--arms predict (the module docstring)."""
    if not cuda_moe.available(torch.device("cuda")):
        print("cuda_ablation: the predict arms need Triton", file=sys.stderr)
        return 2
    from verispec.ops import cuda_launch
    early = cuda_launch.flags(torch.device("cuda"), early=True).get("EARLY", False)
    cb.log(f"[predict] the router can launch gate/up before its wait here: {early}"
           + ("" if early else " (no stream products: the _early arms run as the others)"))
    try:
        rows = tuple(int(r) for r in a.rows.split(","))
        cb.graph_arms(eng, a.rounds, "predict", {k: (lambda v=k: abl.set_predict(v)) for k in PREDICT_ARMS},
                      row_counts=rows)
        cb.graph_arms(eng, a.rounds, "predict_real", {k: (lambda v=k: abl.set_predict(v)) for k in REAL_ARMS},
                      row_counts=rows)
    finally:
        abl.set(())
    limit = cb._active_bytes(eng) / bw
    res = cb.RESULTS.get("predict")
    if not res:
        print("cuda_ablation: no graphed forwards ran", file=sys.stderr)
        return 2
    bad = False
    for rows, r in res.items():
        fixed_equal = {k: r["logits_equal_to_first"][k] for k in PREDICT_ARMS[1:-1]}
        r["fixed_arms_equal"] = all(fixed_equal.values())
        bad |= not r["fixed_arms_equal"]
        cb.log(f"[predict] rows {rows}: " + "; ".join(
            f"{k} {v:.3f} ms = {limit * 1e3 / v * 100:.1f}% of the {limit * 1e3:.3f} ms limit" for k, v in r["ms"].items())
            + f"; the fixed arms' logits equal to each other: {fixed_equal}")
    real = cb.RESULTS.get("predict_real", {})
    for rows, r in real.items():
        bad |= not r["logits_equal"]
        cb.log(f"[predict_real] rows {rows}: " + "; ".join(
            f"{k} {v:.3f} ms = {limit * 1e3 / v * 100:.1f}%" for k, v in r["ms"].items())
            + f"; logits equal: {r['logits_equal']}")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cuda_ablation_predict.json").write_text(json.dumps({"bandwidth_Bps": bw, "limit_ms": limit * 1e3,
                                                                "arms": list(PREDICT_ARMS), "predict": res,
                                                                "real_arms": list(REAL_ARMS), "predict_real": real},
                                                               indent=1, default=str) + "\n")
    return 1 if bad else 0


# arm -> (which product asks: "out" / "in" / None, first expert, experts asked, L2AT)
L2EXPERT_ARMS = {"contig": (None, 0, 0, 1), "out_after": ("out", 0, 8, 1), "out_before": ("out", 0, 8, 0),
                 "out_half": ("out", 0, 4, 1), "out_wrong": ("out", 8, 8, 1), "in_after": ("in", 0, 8, 1)}


def l2experts_plan(layers, who: str | None, first: int, n: int) -> dict[int, tuple[int, int]]:
    """cuda_stream_gemv.L2_NEXT asking, in every MoE layer, for routed experts first..first+n-1's
    gate/up weights (one contiguous range of gu_all) from the layer's output product ("out") or its
    input product ("in")."""
    plan = {}
    for layer in layers if who else ():
        mlp, mixer = layer.mlp, layer.mixer
        if not isinstance(getattr(mlp, "gu_all", None), torch.Tensor):
            continue
        gu = mlp.gu_all
        w = mixer.out if who == "out" else (mixer.w_in if hasattr(mixer, "w_in") else mixer.w_qkv)
        plan[w.data_ptr()] = (gu[first].data_ptr(), n * gu[0].numel() * gu.element_size())
    return plan


def l2experts(eng, abl: Ablation, a, bw: float) -> int:
    """--arms l2experts (the module docstring)."""
    from verispec.ops import cuda_stream_gemv as sg
    if not sg.available(torch.device("cuda")):
        print("cuda_ablation: the l2experts arms need the CUDA C++ stream products", file=sys.stderr)
        return 2
    layers = eng.model.layers
    plans = {k: l2experts_plan(layers, who, first, n) for k, (who, first, n, _) in L2EXPERT_ARMS.items()}
    for k, plan in plans.items():
        cb.log(f"[l2experts] {k}: {len(plan)} products ask for "
               f"{sum(b for _, b in plan.values()) / max(len(plan), 1) / 1e6:.1f} MB each")
    kept = sg.L2_NEXT, sg.L2AT

    def arm(k):
        def set_():
            abl.set_l2experts(plans[k])
            sg.L2AT = L2EXPERT_ARMS[k][3]
        return set_
    try:
        cb.graph_arms(eng, a.rounds, "l2experts", {k: arm(k) for k in L2EXPERT_ARMS},
                      row_counts=tuple(int(r) for r in a.rows.split(",")))
    finally:
        abl.set(())
        sg.L2_NEXT, sg.L2AT = kept
    limit = cb._active_bytes(eng) / bw
    res = cb.RESULTS.get("l2experts")
    if not res:
        print("cuda_ablation: no graphed forwards ran", file=sys.stderr)
        return 2
    bad = False
    for rows, r in res.items():
        bad |= not r["logits_equal"]
        base = r["ms"]["contig"]
        cb.log(f"[l2experts] rows {rows}: " + "; ".join(
            f"{k} {v:.3f} ms ({v / base:.3f}x, {limit * 1e3 / v * 100:.1f}%)" for k, v in r["ms"].items())
            + f"; logits equal: {r['logits_equal']}")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cuda_ablation_l2experts.json").write_text(json.dumps(
        {"bandwidth_Bps": bw, "limit_ms": limit * 1e3, "arms": L2EXPERT_ARMS, "l2experts": res},
        indent=1, default=str) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
