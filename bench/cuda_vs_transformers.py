"""verispec's exact decode against transformers' own generate, side by side on one GPU (issue 9).

One random 35B-A3B-shaped checkpoint (fewer layers, so both fit; transformers' model is built
on the very same tensors), greedy, plain decoding on both sides (no drafts), arms interleaved
(A B A B), medians. transformers' decode rate is (N - 1) / (t(N) - t(1)) with t(n) the time
of a whole generate of n new tokens (so its prefill drops out); verispec's is its report's
decode tokens over decode seconds, plus the wall-clock rate of its whole loop.

  python3 bench/cuda_vs_transformers.py --layers 8 --tokens 32 --rounds 3 --out $OUT
"""

from __future__ import annotations

import argparse
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
from verispec.random_model import preset_config, random_checkpoint  # noqa: E402

PROMPT = [(i * 7919 + 13) % 4000 + 11 for i in range(64)]


def hf_model(cfg: dict, tensors: dict):
    import transformers
    conf = transformers.Qwen3_5MoeTextConfig(**{k: v for k, v in cfg.items() if k != "model_type"})
    with torch.device("meta"):
        model = transformers.Qwen3_5MoeForCausalLM(conf)
    missing, unexpected = model.load_state_dict(tensors, strict=False, assign=True)
    # buffers (rotary inv_freq) are not in the checkpoint: rebuild them on the GPU
    model.model.rotary_emb = type(model.model.rotary_emb)(config=conf, device="cuda")
    left = [n for n, p in list(model.named_parameters()) + list(model.named_buffers()) if p.is_meta]
    if left:
        raise RuntimeError(f"transformers' model left on meta: {left[:5]} ... ({len(left)})")
    return model.to(torch.bfloat16).eval(), missing, unexpected, transformers.__version__


def hf_generate(model, n: int) -> tuple[float, list[int]]:
    ids = torch.tensor([PROMPT], device="cuda")
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, use_cache=True,
                         pad_token_id=0)
    torch.cuda.synchronize()
    return time.perf_counter() - t, out[0, len(PROMPT):].tolist()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    a = ap.parse_args()
    cfg = preset_config("qwen3.6-35b-a3b-shape", layers=a.layers)
    ck = random_checkpoint(cfg, seed=0, device="cuda", mtp=False)
    res: dict = {"layers": a.layers, "tokens": a.tokens, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    with torch.no_grad():
        hf, missing, unexpected, ver = hf_model(cfg, dict(ck.tensors))
        res.update(transformers=ver, hf_missing=missing, hf_unexpected=unexpected)
        print(f"transformers {ver}: missing {missing[:4]} unexpected {unexpected[:4]}", flush=True)
        eng = Engine.from_checkpoint(ck, Execution.for_device("cuda"), usage_file=os.devnull)
        s = RunSettings(max_tokens=a.tokens, drafts=DraftSettings(lookup=False, mtp="off"))
        hf_generate(hf, 2)
        eng.generate(PROMPT, s, eos_ids=set())                 # warm-up: captures, compiles
        hf_rate, vs_rate, vs_wall, hf_ids, vs_ids = [], [], [], None, None
        for r in range(a.rounds):
            for arm in (("hf", "vs") if r % 2 == 0 else ("vs", "hf")):
                if arm == "hf":
                    t1, _ = hf_generate(hf, 1)
                    tn, hf_ids = hf_generate(hf, a.tokens)
                    hf_rate.append((a.tokens - 1) / (tn - t1))
                else:
                    torch.cuda.synchronize()
                    t = time.perf_counter()
                    out = eng.generate(PROMPT, s, eos_ids=set())
                    wall = time.perf_counter() - t - out.stats["prefill_seconds"]
                    vs_rate.append(out.stats["tokens"] / out.stats["decode_seconds"])
                    vs_wall.append(len(out.ids) / wall)
                    vs_ids = out.ids
            print(f"round {r + 1}: transformers {hf_rate[-1]:.1f} tok/s, verispec {vs_rate[-1]:.1f} tok/s "
                  f"(wall {vs_wall[-1]:.1f})", flush=True)
    same = next((i for i, (x, y) in enumerate(zip(hf_ids, vs_ids)) if x != y), len(vs_ids))
    res.update(hf_tok_s=hf_rate, verispec_tok_s=vs_rate, verispec_wall_tok_s=vs_wall,
               first_difference=same, hf_ids=hf_ids, verispec_ids=vs_ids)
    med = {k: statistics.median(res[k]) for k in ("hf_tok_s", "verispec_tok_s", "verispec_wall_tok_s")}
    res["medians"] = med
    print(f"\n{a.layers} layers, {a.tokens} tokens, medians of {a.rounds}: transformers generate "
          f"{med['hf_tok_s']:.1f} tok/s [{min(hf_rate):.1f}-{max(hf_rate):.1f}], verispec "
          f"{med['verispec_tok_s']:.1f} [{min(vs_rate):.1f}-{max(vs_rate):.1f}] (wall {med['verispec_wall_tok_s']:.1f}): "
          f"{med['verispec_tok_s'] / med['hf_tok_s']:.2f}x; greedy ids agree for the first {same} of {len(vs_ids)} "
          "(bf16 on both sides, different kernels: an early near-tie may part them)", flush=True)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    with open(Path(a.out) / "cuda_vs_transformers.json", "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
