"""`verispec bench --random-config NAME`: decode speed on random weights at a named shape.

No real checkpoint can be downloaded on these machines, yet speed must be measured at the
shapes the engine is for. This builds the random model in memory on the device (see
verispec/random_model.py), then runs plain decoding and forced-acceptance speculation
(`--force bernoulli:...` against the plain run's own ids), checks that every drafted run
equals the plain run bit for bit, and prints tok/s per arm (medians over rounds, arms
interleaved). bench/cuda_bench.py adds the verify-cost and bandwidth sections.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch

from . import cpu_threads
from .config import DraftSettings, RunSettings
from .engine import Engine
from .errors import UsageError
from .execution import Execution
from .random_model import preset_config, random_checkpoint

ARMS = {"plain": None, "mtp1": ("bernoulli:0.97", 1), "mtp2": ("bernoulli:0.97,0.83", 2)}


def _sync(eng: Engine) -> None:
    if eng.execution.is_cuda:
        torch.cuda.synchronize()


PROMPT_LEN = 32


def run_bench(a) -> int:
    if a.tokens < 2 or a.rounds < 1:
        raise UsageError("--tokens must be >= 2 and --rounds >= 1")
    if a.layers is not None and a.layers < 1:
        raise UsageError(f"--layers must be >= 1, got {a.layers}")
    full = preset_config(a.random_config)
    if a.layers is not None and a.layers > full["num_hidden_layers"]:
        raise UsageError(f"--layers {a.layers}: {a.random_config} has {full['num_hidden_layers']} layers")
    if PROMPT_LEN + a.tokens > full["max_position_embeddings"]:      # said before a model is built
        raise UsageError(f"--tokens must be at most {full['max_position_embeddings'] - PROMPT_LEN} for "
                         f"{a.random_config} (a {PROMPT_LEN}-token prompt; the shape's context is "
                         f"{full['max_position_embeddings']})")
    ex = Execution.for_device(a.device)
    cfg = preset_config(a.random_config, a.layers)
    t0 = time.perf_counter()
    eng = Engine.from_checkpoint(random_checkpoint(cfg, seed=a.seed, device=ex.device, dtype=ex.dtype,
                                                   routing=a.routing, name=a.random_config), ex)
    cpu_threads.apply_default(eng)     # as `verispec run` picks without --threads
    print(f"[verispec bench] {a.random_config} ({cfg['num_hidden_layers']} layers, {a.routing} routing) on "
          f"{ex.device} {str(ex.dtype).replace('torch.', '')}: built in {time.perf_counter() - t0:.1f} s",
          file=sys.stderr)
    prompt = [(i * 7919 + 13) % (cfg["vocab_size"] - 1) + 1 for i in range(PROMPT_LEN)]
    rates: dict[str, list[float]] = {k: [] for k in ARMS}
    equal = True
    for r in range(-1, a.rounds):                      # round -1 warms up (graph captures, compiles)
        plain = None
        for name, arm in ARMS.items():
            d = dict(lookup=False, mtp="off")
            if arm is not None:
                d.update(mtp="on", mtp_drafts=arm[1], force=arm[0], reference=tuple(plain.ids), gate=False)
            s = RunSettings(max_tokens=a.tokens, drafts=DraftSettings(**d))
            _sync(eng)
            t = time.perf_counter()
            res = eng.generate(prompt, s, keep_logits=True)
            _sync(eng)
            wall = time.perf_counter() - t - res.stats["prefill_seconds"]
            if arm is None:
                plain = res
            else:
                equal &= res.ids == plain.ids and all(torch.equal(x, y) for x, y in zip(res.logits, plain.logits))
            if r >= 0:      # decode tokens as `verispec run` counts them: the picks fed after the prompt
                rates[name].append(res.stats["tokens"] / wall)
    med = {k: statistics.median(v) for k, v in rates.items()}
    out = {"config": a.random_config, "layers": cfg["num_hidden_layers"], "routing": a.routing,
           "device": ex.device, "tokens": a.tokens, "rounds": a.rounds, "tok_s": rates, "median_tok_s": med,
           "drafted_equals_plain": equal}
    if a.json:
        print(json.dumps(out))
    else:
        for k in ARMS:
            print(f"{k:6s} {med[k]:9.1f} tok/s  [{min(rates[k]):.1f}-{max(rates[k]):.1f}]  "
                  f"{med[k] / med['plain']:.2f}x plain")
        print(f"drafted runs equal to plain, bit for bit: {'yes' if equal else 'NO'}")
    return 0 if equal else 1
