"""How well a layer's routed experts can be predicted before its router runs (issue 9, eighteenth
session; docs/cuda.md, "The one large lever"): on a trained checkpoint, decode greedily one token
at a time and, at every layer, compare the experts the router picks (its top-k of the MoE's input)
with the top-k the same router weights pick from an earlier hidden state:

  mixer_input   the layer's input after its input norm (available when the layer starts)
  prev_moe      the previous layer's MoE input (available a whole layer earlier)
  unnormed      the residual stream and the mixer's output summed in fp32 and times the norm's
                (1 + w), without the norm's 1/rms and without the bf16 roundings: the router's own
                logits up to a positive scale and rounding (a top-k does not move under a positive
                scale), so a linear split, W_r (1 + w) x + (W_r (1 + w) W_o) g, could give the
                same ids before the mixer's output product has run (docs/cuda.md)
  random        k experts drawn at random (the floor: k / E of the picks on average)

A prediction moves no value (the router's own ids decide); a right one would let the expert's
weights be requested while the router runs. Reported: the share of the true top-k that a predictor
got, over every decode step and layer with an MoE. The benchmark's random-weight models cannot
answer this (their routing has nothing to learn from); the bundled model is small (8 experts, top 2),
so its numbers say how a trained router behaves, not what a 256-expert one would.

  python3 bench/expert_prediction.py --tokens 256 --out bench/results
  python3 bench/expert_prediction.py --random-config qwen3.6-35b-a3b-shape --layers 4 --tokens 32
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from verispec.config import default_model_dir  # noqa: E402
from verispec.engine import Engine, load_engine  # noqa: E402
from verispec.execution import Execution  # noqa: E402
from verispec.random_model import preset_config, random_checkpoint  # noqa: E402
from verispec.models import qwen3_next as q3  # noqa: E402

PROMPTS = ["def fibonacci(n):", "import os\n\n\ndef walk(path):", "class Stack:\n    def __init__(self):",
           "    for i, line in enumerate(lines):"]


def topk_ids(router: torch.Tensor, h: torch.Tensor, k: int) -> set[int]:
    """The router's top k experts for one row h [H] (softmax is monotone: the logits' top k)."""
    return set(torch.topk(router.float() @ h.float(), k).indices.tolist())


def _since_last_moe(seen: list, i: int, kind: str):
    """The latest record of `kind` before seen[i] and after the MoE before it (this layer's), or None."""
    for j in range(i - 1, -1, -1):
        if seen[j][0] == "moe":
            return None
        if seen[j][0] == kind:
            return seen[j]
    return None


def measure(model_dir: str, tokens: int) -> dict:
    """Greedy decode of `tokens` tokens after each prompt, the predictors scored at every MoE layer."""
    eng = load_engine(model_dir, read_mtp=False)
    return {"model": model_dir, "prompts": PROMPTS, **score(eng.model, [eng.encode(p) for p in PROMPTS], tokens)}


def measure_random(preset: str, layers: int, tokens: int, routing: str = "independent") -> dict:
    """The same on random weights at a preset's shapes (CPU, bf16), prompts of 64 fixed ids: their
    routers have learnt nothing, so only the unnormed predictor (rounding alone) says anything here."""
    cfg = preset_config(preset, layers=layers)
    ck = random_checkpoint(cfg, seed=0, routing=routing, mtp=False)
    eng = Engine.from_checkpoint(ck, Execution("cpu", torch.bfloat16, 16), usage_file=os.devnull)
    prompts = [[(i * 7919 + 13 * (j + 1)) % 4000 + 11 for i in range(64)] for j in range(len(PROMPTS))]
    return {"model": f"random {preset}, {layers} layers, {routing} routing", **score(eng.model, prompts, tokens)}


def score(m, prompts: list[list[int]], tokens: int) -> dict:
    """Greedy decode of `tokens` tokens after each prompt (ids) on model m, scoring the predictors."""
    seen: list[tuple[str, object, torch.Tensor]] = []
    kept = q3.Model._linear_attn, q3.Model._full_attn, q3.Model.moe
    kept_add_norm = q3.add_norm

    def lin_attn(self, mixer, h, *args, **kw):
        seen.append(("in", mixer, h[-1].detach().clone()))
        return kept[0](self, mixer, h, *args, **kw)

    def full_attn(self, mixer, h, *args, **kw):
        seen.append(("in", mixer, h[-1].detach().clone()))
        return kept[1](self, mixer, h, *args, **kw)

    def moe(self, mlp, h, *args, **kw):
        seen.append(("moe", mlp, h[-1].detach().clone()))
        return kept[2](self, mlp, h, *args, **kw)

    def add_norm(x, h, weight, *args, **kw):
        seen.append(("add", weight, x[-1].float() + h[-1].float()))
        return kept_add_norm(x, h, weight, *args, **kw)
    q3.Model._linear_attn, q3.Model._full_attn, q3.Model.moe = lin_attn, full_attn, moe
    q3.add_norm = add_norm
    rng = random.Random(0)
    hits = {"mixer_input": [], "prev_moe": [], "unnormed": [], "random": []}
    k = e = 0
    try:
        for ids in prompts:
            st = m.new_state(len(ids) + tokens + 1)
            out = m.forward(ids, st, exact=False)
            tok = int(out.logits[-1].argmax())
            for _ in range(tokens):
                seen.clear()
                out = m.forward([tok], st, exact=False)
                tok = int(out.logits[-1].argmax())
                prev_moe = None
                for i, (kind, mod, h) in enumerate(seen):
                    if kind != "moe":
                        continue
                    e, k = mod.n_experts, mod.top_k
                    router = mod.pre[:e]
                    truth = topk_ids(router, h, k)
                    mixer_in, added = _since_last_moe(seen, i, "in"), _since_last_moe(seen, i, "add")
                    if added is not None:                       # the residual add + norm before this MoE
                        _, w, summed = added
                        hits["unnormed"].append(len(truth & topk_ids(router, (1.0 + w.float()) * summed, k)) / k)
                    if mixer_in is not None:
                        hits["mixer_input"].append(len(truth & topk_ids(router, mixer_in[2], k)) / k)
                    if prev_moe is not None:
                        hits["prev_moe"].append(len(truth & topk_ids(router, prev_moe, k)) / k)
                    hits["random"].append(len(truth & set(rng.sample(range(e), k))) / k)
                    prev_moe = h
    finally:
        q3.Model._linear_attn, q3.Model._full_attn, q3.Model.moe = kept
        q3.add_norm = kept_add_norm
    return {"experts": e, "top_k": k, "tokens_per_prompt": tokens,
            "share_of_true_topk": {p: statistics.mean(v) for p, v in hits.items() if v},
            "samples": {p: len(v) for p, v in hits.items()}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="a checkpoint directory (default: the bundled model)")
    ap.add_argument("--tokens", type=int, default=256, help="decode steps a prompt")
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    ap.add_argument("--random-config", default=None, help="random weights at a preset's shapes instead of a checkpoint")
    ap.add_argument("--layers", type=int, default=4, help="with --random-config: layers")
    a = ap.parse_args()
    if a.random_config:
        res = measure_random(a.random_config, a.layers, a.tokens)
    else:
        res = measure(a.model or str(default_model_dir()), a.tokens)
    for p, v in res["share_of_true_topk"].items():
        print(f"[experts] {p:12s}: {100 * v:5.1f}% of the true top-{res['top_k']} of {res['experts']} "
              f"({res['samples'][p]} layer-steps)")
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    name = "expert_prediction.json" if not a.random_config else f"expert_prediction_{a.random_config}.json"
    (out_dir / name).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
