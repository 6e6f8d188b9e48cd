"""Benchmark: the prompt fed through the exact path (`--prefill-batch off`), one row a forward
against EXACT_ROWS (16) rows a forward (the same bits: row invariance, tests/test_session.py), and
the batched prefill (fast kernels, bits that may depend on the row count and threads), on the
bundled model.

    python bench/prefill_rows.py [--tokens 480[,N...]] [--rounds 5] [--threads N] [--arms exact1,exact16,batched,...]
    python bench/prefill_rows.py --random-config qwen3.6-35b-a3b-shape --device cuda [--layers N]

With --random-config: random weights at that shape (verispec/random_model.py) on --device, and a
prompt of --tokens random ids.

With --after N the prompt continues a cache of N other ids (a server's next turn: prefix reuse),
fed before the clock starts; the batched arms then take verispec/prompt_pieces.py's path.

The prompt is the first --tokens ids of verispec/decoder.py's source (code, as the model was
trained on). Arms are interleaved (A B A B ...) each round; a round's number is prompt tokens over
the wall time of one `Engine.generate` with max_tokens 1 (the prefill and one pick). Prints the
median over rounds [min-max] and writes bench/results/prefill_rows.json (raw).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from verispec.config import DraftSettings, RunSettings, default_model_dir
from verispec.engine import Engine, load_engine
from verispec.execution import Execution
from verispec.ops import chunk_delta, chunk_parts_cuda
from verispec.prompt_graphs import CAPTURE_AFTER, PromptGraphs
from verispec.prompt_pieces import ContinuationGraphs
from verispec.random_model import preset_config, random_checkpoint

ROOT = Path(__file__).resolve().parents[1]


def _prompts(eng, a, sizes: list[int]) -> list[list[int]]:
    if a.random_config:
        v = eng.args.vocab_size
        return [[(i * 7919 + 13) % (v - 1) + 1 for i in range(n)] for n in sizes]
    ids = eng.encode((ROOT / "verispec" / "decoder.py").read_text())
    return [ids[:n] for n in sizes]


VARIANTS = {"_torch": "the chunks' parts in torch",
            "_split": "the chunks' parts in one launch, their inputs made ready by torch operations"}


def _variants(batched) -> dict:
    """The arms that run the chunks' parts another way: batched[_eager|_chunks|_chunks_eager] + a VARIANTS suffix."""
    bases = {"batched": ("batched", "default"), "batched_eager": ("batched, prompt graphs never captured", "eager"),
             "batched_chunks": ("batched, the recurrence in chunks at any length", "chunks"),
             "batched_chunks_eager": ("batched, the recurrence in chunks at any length, prompt graphs never captured",
                                      "chunks_eager")}
    return {arm + suf: (f"{text}, {how}", (batched, rows + suf))
            for arm, (text, rows) in bases.items() for suf, how in VARIANTS.items()}


def _base(rows: str) -> str:
    """An arm's recurrence without its VARIANTS suffix."""
    for suf in VARIANTS:
        rows = rows.removesuffix(suf)
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", default="480", help="prompt length, or several comma-separated (one model load)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--random-config", default=None, help="a random-weight shape instead of the bundled model")
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--device", default="cpu")
    p.add_argument("--after", type=int, default=0, help="cached ids before the timed prompt (a continuation)")
    p.add_argument("--arms", default="exact1,exact16,batched",
                   help="which of exact1 (one row a forward), exact16, batched, batched_eager (the prompt padded to "
                        "its bucket but never captured: a bucket's first run, verispec/prompt_graphs.py), "
                        "batched_unpadded (no prompt graphs at all), batched_rows (the recurrence row by row at any "
                        "length: delta_steps on CUDA), batched_rows_eager (the same, never captured), batched_chunks "
                        "(in chunks at any length), batched_chunks_eager (the same, never captured), batched_torch, "
                        "batched_eager_torch, batched_chunks_torch and batched_chunks_eager_torch (those four with "
                        "the chunks' state-free parts as torch operations, not one Triton launch: "
                        "verispec/ops/chunk_parts_cuda.py), batched_split, batched_eager_split, batched_chunks_split "
                        "and batched_chunks_eager_split (the one launch, its inputs made ready by torch operations "
                        "rather than inside it: chunk_parts_cuda.raw off) to run, comma-separated; every arm but "
                        "batched holds prompt graphs of its own")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "prefill_rows.json"))
    a = p.parse_args()
    exact = RunSettings(max_tokens=1, prefill_batch=False, drafts=DraftSettings(lookup=False, mtp="off"))
    batched = RunSettings(max_tokens=1, prefill_batch=True, drafts=DraftSettings(lookup=False, mtp="off"))
    every = {"exact1": ("exact, 1 row a forward", (exact, 1)), "exact16": ("exact, 16 rows a forward", (exact, 16)),
             "batched": ("batched", (batched, None)),
             "batched_eager": ("batched, prompt graphs never captured (a bucket's first run)", (batched, "eager")),
             "batched_unpadded": ("batched, no prompt graphs (unpadded, eager)", (batched, "unpadded")),
             "batched_rows": ("batched, the recurrence row by row", (batched, "rows")),
             "batched_rows_eager": ("batched, the recurrence row by row, prompt graphs never captured",
                                    (batched, "rows_eager")),
             "batched_chunks": ("batched, the recurrence in chunks at any length", (batched, "chunks")),
             "batched_chunks_eager": ("batched, the recurrence in chunks at any length, prompt graphs never captured",
                                      (batched, "chunks_eager")),
             **_variants(batched)}
    asked = a.arms.split(",")
    if any(k not in every for k in asked):
        p.error(f"--arms: a comma-separated choice of {', '.join(every)}, got {a.arms!r}")
    try:
        sizes = [int(t) for t in a.tokens.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 2:
        p.error(f"--tokens: prompt lengths >= 2, comma-separated, got {a.tokens!r}")
    if a.after < 0:
        p.error(f"--after: a count of cached ids >= 0, got {a.after}")
    arms = dict(every[k] for k in asked)
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.random_config:
        cfg = preset_config(a.random_config, a.layers)
        ex = Execution.for_device(a.device)
        eng = Engine.from_checkpoint(random_checkpoint(cfg, seed=1, device=ex.device, dtype=ex.dtype), ex)
    else:
        eng = load_engine(default_model_dir(), device=a.device)
    runs = []
    m = eng.model
    mine = (m.prompt_graphs, m.prompt_pieces)
    own = {}

    def graphs_for(rows):
        """The prompt graphs an arm runs with: none, or a pair of its own (never captured for the
        "eager" arms), so that no bucket replays another arm's captures of another recurrence or
        other parts. (`batched` itself runs with the model's own.)"""
        base = _base(rows)
        if base == "unpadded" or mine[0] is None:
            return None, None
        if rows not in own:
            cap = None if base.endswith("eager") else CAPTURE_AFTER
            # pieces only where the model has them (prompt_pieces.ENABLED)
            own[rows] = (PromptGraphs(m, mine[0].min_rows, capture_after=cap),
                         mine[1] and ContinuationGraphs(m, mine[1].min_rows, capture_after=cap))
        return own[rows]

    parts_default = chunk_parts_cuda.enabled, chunk_parts_cuda.raw
    prefix = [(i * 104729 + 7) % (eng.args.vocab_size - 1) + 1 for i in range(a.after)]
    for prompt in _prompts(eng, a, sizes):
        raw = {k: [] for k in arms}
        # rounds -2 and -1 warm up, not kept: kernel compiles, graph captures (a prompt's bucket is
        # captured on its second use)
        for r in range(-2, a.rounds):
            for name, (settings, rows) in arms.items():
                base = _base(rows) if isinstance(rows, str) else ""   # "" for exact1, exact16, batched
                dec = eng.new_decoder(settings, prefix + prompt)
                if prefix:
                    dec.prefill(prefix)
                if isinstance(rows, int):
                    dec.config.prefill_rows = rows
                chunk_delta.enabled, cuda_from = not base.startswith("rows"), chunk_delta.CUDA_FROM
                if base.startswith("chunks"):
                    chunk_delta.CUDA_FROM = 0
                m.prompt_graphs, m.prompt_pieces = graphs_for(rows) if isinstance(rows, str) else mine
                chunk_parts_cuda.enabled = not (isinstance(rows, str) and rows.endswith("_torch"))
                chunk_parts_cuda.raw = not (isinstance(rows, str) and rows.endswith(("_torch", "_split")))
                t = time.perf_counter()
                eng.generate(prefix + prompt, settings, decoder=dec, reuse=len(prefix))
                chunk_delta.enabled, chunk_delta.CUDA_FROM = True, cuda_from
                chunk_parts_cuda.enabled, chunk_parts_cuda.raw = parts_default
                m.prompt_graphs, m.prompt_pieces = mine
                if r >= 0:
                    raw[name].append(len(prompt) / (time.perf_counter() - t))
        cuda = m.embed.is_cuda
        reserved = torch.cuda.memory_reserved() / 2 ** 30 if cuda else None
        runs.append({"prompt_tokens": len(prompt), "after": a.after, "tok_s": raw, "cuda_reserved_gib": reserved})
        if cuda:
            print(f"CUDA memory reserved after {len(prompt)} tokens: {reserved:.2f} GiB", flush=True)
        for name, v in raw.items():
            print(f"{name}: {statistics.median(v):.1f} tok/s [{min(v):.1f}-{max(v):.1f}] "
                  f"({len(prompt)} prompt tokens after {a.after}, {a.rounds} rounds, {torch.get_num_threads()} threads)", flush=True)
    out = {"machine": (torch.cuda.get_device_name() if "cuda" in str(eng.model.embed.device)
                       else platform.processor() or platform.machine()),
           "model": a.random_config or "bundled", "layers": eng.args.num_hidden_layers, "threads": torch.get_num_threads(),
           "rounds": a.rounds, "runs": runs, "date": time.strftime("%Y-%m-%d %H:%M")}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
