"""The speculative-decoding tables on the bundled model, beside transformers' own generate.

    python bench/spec_tables.py [--rounds 5] [--tokens 128] [--threads 2] [--quick] [--tables ABC]

One process, one `Engine`. Every arm of a prompt is an `Engine.generate` with other
`DraftSettings`; the arms of all prompts run once per round, in a fixed order (A B C ...
A B C ...), so drift in the machine's load hits every arm alike. Tables show the median over
rounds [min-max]. Greedy, a fixed number of new tokens (end-of-sequence ignored).

- Table A, MTP depth on code continuation (lookup off): off, 1, 2 and 3 with the per-step
  depth on and off, and the gate's depth (`mtp_drafts=0`).
- Table B, a code edit (rename a variable in ~25 lines and print them again): no drafts,
  lookup, MTP 1, MTP 1 + lookup, the gate's MTP depth + lookup.
- Table C, free text: plain vs lookup with the gate on.
- Peer: transformers' `Qwen3NextForCausalLM.generate` on the same checkpoint (fp32), same
  prompt ids, token count and threads, interleaved in the same rounds; and its
  `prompt_lookup_num_tokens`, whose error is recorded when it refuses.
- A profile of one plain step and one verify (bench/profile_step.py).

Decode tok/s is measured by this script's own clock: (new tokens - 1) / (wall time of
`generate` - its prefill seconds), so the drafting (MTP head rows, lookup), the gate and
sampling count. For transformers: (new tokens - 1) / (generate(N) - generate(1)), generate(1)
being prefill and the first pick. Every arm of a prompt must give the same ids (md5 per
prompt); the script exits with 3 otherwise, naming the prompt, arm and first differing position.

Writes bench/results/spec_tables.json, docs/benchmarks.md and docs/benchmarks.png
(--quick: 1 round of 24 tokens, no load wait, written under /tmp unless told otherwise).
`--tables A` (any subset of ABC) runs only those tables and writes its own files,
bench/results/spec_tables-A.json, docs/benchmarks-A.md and docs/benchmarks-A.png, leaving
the full run's files alone.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import profile_step  # noqa: E402

from verispec.config import BUNDLED_MODEL, DraftSettings, RunSettings  # noqa: E402
from verispec.engine import Engine  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

# Code continuation: starts of functions/classes from files of the model's held-out split
# (docs/default-model-data.tsv: colorsys.py, tracemalloc.py, ipaddress.py are "heldout").
CODE = {
    "colorsys.hls_to_rgb": "def hls_to_rgb(h, l, s):\n    if s == 0.0:\n        return l, l, l\n",
    "tracemalloc.Snapshot": ('class Snapshot:\n    """\n    Snapshot of traces of memory blocks allocated by Python.\n'
                             '    """\n\n    def __init__(self, traces, traceback_limit):\n        '),
    "ipaddress._count_righthand_zero_bits": (
        'def _count_righthand_zero_bits(number, bits):\n    """Count the number of zero bits on the right hand '
        'side.\n\n    Args:\n        number: an integer.\n        bits: maximum number of bits to count.\n\n'
        '    Returns:\n        The number of zero bits on the right hand side of the number.\n\n    """\n'),
}

_EDIT_CODE = '''def summarize(records, key=None):
    """Return the number of records, the count per key and the largest record."""
    count = 0
    largest = None
    groups = {}
    for record in records:
        if key is not None:
            name = key(record)
        else:
            name = record
        groups.setdefault(name, []).append(record)
        count += 1
        if largest is None or record > largest:
            largest = record
    sizes = {}
    for name, items in groups.items():
        sizes[name] = len(items)
    if count == 0:
        raise ValueError("no records")
    return {
        "count": count,
        "groups": sizes,
        "largest": largest,
        "mean": sum(sizes.values()) / count,
    }
'''
EDIT = {"rename count -> total": (
    "# Rename the variable `count` to `total` in the function below and print the whole function again.\n\n"
    + _EDIT_CODE + "\n\n# The same function with `count` renamed to `total`:\n\n"
    + "\n".join(_EDIT_CODE.splitlines()[:2]) + "\n    total = 0\n")}

PROSE = {"comment block": (
    "# This module keeps a small cache of parsed configuration files. Each entry remembers the\n"
    "# time the file was last modified, so that a later call can tell whether the file changed\n"
    "# on disk since it was read. When it did, the entry is dropped and the file is parsed again.\n"
    "# The cache is not shared between threads: each thread")}

LOOKUP_OFF = dict(lookup=False)
ARMS_A = {
    "plain": dict(lookup=False, mtp="off"),
    "MTP 1": dict(LOOKUP_OFF, mtp="on", mtp_drafts=1),
    "MTP 2, per-step": dict(LOOKUP_OFF, mtp="on", mtp_drafts=2, mtp_pstep=True),
    "MTP 2, fixed": dict(LOOKUP_OFF, mtp="on", mtp_drafts=2, mtp_pstep=False),
    "MTP 3, per-step": dict(LOOKUP_OFF, mtp="on", mtp_drafts=3, mtp_pstep=True),
    "MTP 3, fixed": dict(LOOKUP_OFF, mtp="on", mtp_drafts=3, mtp_pstep=False),
    "MTP gate's depth": dict(LOOKUP_OFF, mtp="on", mtp_drafts=0),
}
ARMS_B = {
    "plain": dict(lookup=False, mtp="off"),
    "lookup": dict(lookup=True, mtp="off"),
    "MTP 1": dict(lookup=False, mtp="on", mtp_drafts=1),
    "MTP 1 + lookup": dict(lookup=True, mtp="on", mtp_drafts=1),
    "MTP gate's depth + lookup": dict(lookup=True, mtp="on", mtp_drafts=0),
}
ARMS_C = {
    "plain": dict(lookup=False, mtp="off"),
    "lookup, gate on": dict(lookup=True, mtp="off", gate=True),
}
PEER = "transformers"


def md5(ids: list[int]) -> str:
    return hashlib.md5(",".join(map(str, ids)).encode()).hexdigest()


# ----- the arms -----
def run_arm(eng: Engine, prompt: list[int], tokens: int, drafts: dict) -> dict:
    settings = RunSettings(max_tokens=tokens, drafts=DraftSettings(**drafts))
    dec = eng.new_decoder(settings, prompt)             # state allocation outside the clock
    t0 = time.perf_counter()
    res = eng.generate(prompt, settings, decoder=dec, eos_ids=set())
    wall = time.perf_counter() - t0
    s = res.stats
    decode_wall = wall - s["prefill_seconds"]
    g = s.get("gate", {}).get("sources", {})
    return {"ids": res.ids, "md5": md5(res.ids), "wall_s": wall, "decode_wall_s": decode_wall,
            "decode_tok_s": s["tokens"] / decode_wall, "engine_forward_tok_s": s["decode_tok_s"],
            "tokens": s["tokens"], "forwards": s["forwards"], "verifies": s["verifies"], "drafts": s["drafts"],
            "accepted": s["accepted"], "declined": s["declined"], "plain_steps": s["plain_steps"],
            "by_source": s["by_source"],
            "gate_sources": {k: {f: v[f] for f in ("verifies", "probes", "declined", "trimmed")} for k, v in g.items()},
            "gate_line": s.get("gate_line", "")}


class Peer:
    """transformers' generate on the same checkpoint (mtp.* ignored on load)."""

    def __init__(self, path: Path):
        from transformers import Qwen3NextForCausalLM
        from transformers.utils import logging as hf_logging
        hf_logging.set_verbosity_error()
        import transformers
        self.version = transformers.__version__
        self.model = Qwen3NextForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()

    def _gen(self, prompt: list[int], n: int, **kw):
        x = torch.tensor([prompt])
        t0 = time.perf_counter()
        out = self.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, min_new_tokens=n,
                                  do_sample=False, pad_token_id=0, **kw)
        return time.perf_counter() - t0, out[0, len(prompt):].tolist()

    def run(self, prompt: list[int], tokens: int) -> dict:
        t1, _ = self._gen(prompt, 1)
        tn, ids = self._gen(prompt, tokens)
        return {"ids": ids, "md5": md5(ids), "wall_s": tn, "prefill_s": t1, "decode_wall_s": tn - t1,
                "decode_tok_s": (tokens - 1) / (tn - t1), "total_tok_s": tokens / tn}

    def lookup_error(self, prompt: list[int]) -> str | None:
        try:
            self._gen(prompt, 4, prompt_lookup_num_tokens=5)
        except Exception as e:                                  # noqa: BLE001 - recorded, not handled
            return f"{type(e).__name__}: {e}"
        return None


# ----- measuring -----
def wait_for_quiet(max_wait: float, below: float) -> list[list[float]]:
    seen = [list(os.getloadavg())]
    t0 = time.monotonic()
    while seen[-1][0] >= below and time.monotonic() - t0 < max_wait:
        print(f"[bench] 1-min load {seen[-1][0]:.2f} >= {below}: waiting 30 s", file=sys.stderr)
        time.sleep(30)
        seen.append(list(os.getloadavg()))
    return seen


TABLES = (("A", CODE, ARMS_A), ("B", EDIT, ARMS_B), ("C", PROSE, ARMS_C))


def plan(tokens: int, tables: str = "ABC") -> list[tuple[str, str, str, dict]]:
    """(table, prompt name, arm, drafts) in the order a round runs them."""
    out = []
    for table, prompts, arms in TABLES:
        if table not in tables:
            continue
        for p in prompts:
            out += [(table, p, a, d) for a, d in arms.items()]
            out.append((table, p, PEER, {}))
    return out


def prompt_text(name: str) -> str:
    return {**CODE, **EDIT, **PROSE}[name]


def measure(eng: Engine, peer: Peer, rounds: int, tokens: int, tables: str = "ABC") -> dict:
    ids = {p: eng.encode(prompt_text(p)) for p in {**CODE, **EDIT, **PROSE}}
    steps = plan(tokens, tables)
    # warm-up: every arm once, short (kernel build, first-touch of weights, transformers' caches)
    for table, p, arm, d in steps:
        if arm == PEER:
            peer.run(ids[p], 4)
        else:
            run_arm(eng, ids[p], 8, d)
    raw: dict = {}
    for r in range(rounds):
        t0 = time.perf_counter()
        for table, p, arm, d in steps:
            res = peer.run(ids[p], tokens) if arm == PEER else run_arm(eng, ids[p], tokens, d)
            raw.setdefault(table, {}).setdefault(p, {}).setdefault(arm, []).append(res)
        print(f"[bench] round {r + 1}/{rounds} in {time.perf_counter() - t0:.0f} s, load "
              f"{os.getloadavg()[0]:.2f}", file=sys.stderr)
    return {"prompt_ids": ids, "raw": raw}


def check_identical(raw: dict) -> tuple[list[str], dict]:
    """Every verispec arm of a prompt, every round: the same ids. Returns (errors, md5 per prompt)."""
    errors, sums = [], {}
    for table, prompts in raw.items():
        for p, arms in prompts.items():
            ref = arms["plain"][0]["ids"]
            sums[p] = md5(ref)
            for arm, runs in arms.items():
                if arm == PEER:
                    continue
                for r, run in enumerate(runs):
                    if run["ids"] != ref:
                        pos = next((i for i, (a, b) in enumerate(zip(run["ids"], ref)) if a != b),
                                   min(len(ref), len(run["ids"])))
                        errors.append(f"table {table}, prompt {p!r}, arm {arm!r}, round {r + 1}: ids differ from "
                                      f"plain round 1 at generated position {pos}")
    return errors, sums


# ----- summarizing -----
def _stat(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def summarize(raw: dict) -> dict:
    out = {}
    for table, prompts in raw.items():
        for p, arms in prompts.items():
            plain = arms["plain"]
            for arm, runs in arms.items():
                s = {"decode_tok_s": _stat([x["decode_tok_s"] for x in runs]),
                     # per round, this arm over plain of the same round
                     "speedup": _stat([x["decode_tok_s"] / y["decode_tok_s"] for x, y in zip(runs, plain)])}
                if arm != PEER:
                    tok = sum(x["tokens"] for x in runs)
                    fw = sum(x["forwards"] for x in runs)
                    s["tokens_per_forward"] = tok / fw
                    s["drafts"] = sum(x["drafts"] for x in runs)
                    s["accepted"] = sum(x["accepted"] for x in runs)
                    s["verifies"] = sum(x["verifies"] for x in runs)
                    s["declined"] = sum(x["declined"] for x in runs)
                    s["by_position"] = {}
                    for src in ("mtp", "lookup"):
                        prop = [sum(x["by_source"].get(src, {}).get("proposed_by_position", [0] * 8)[j] for x in runs)
                                for j in range(8)]
                        acc = [sum(x["by_source"].get(src, {}).get("accepted_by_position", [0] * 8)[j] for x in runs)
                               for j in range(8)]
                        if any(prop):
                            s["by_position"][src] = {"proposed": prop, "accepted": acc}
                    s["gate_sources"] = {k: {f: sum(x["gate_sources"].get(k, {}).get(f, 0) for x in runs)
                                             for f in ("verifies", "probes", "declined", "trimmed")}
                                         for k in {k for x in runs for k in x["gate_sources"]}}
                else:
                    s["total_tok_s"] = _stat([x["total_tok_s"] for x in runs])
                out.setdefault(table, {}).setdefault(p, {})[arm] = s
    return out


def geomean(xs: list[float]) -> float:
    return float(torch.tensor(xs, dtype=torch.float64).log().mean().exp())


# ----- the document -----
def fmt(s: dict, d: int = 1) -> str:
    return f"{s['median']:.{d}f} [{s['min']:.{d}f}-{s['max']:.{d}f}]"


def by_position(s: dict) -> str:
    parts = []
    for src, v in s.get("by_position", {}).items():
        cells = [f"{j + 1}: {100 * a / n:.0f}% ({a}/{n})" for j, (n, a) in enumerate(zip(v["proposed"], v["accepted"]))
                 if n]
        parts.append(("lookup " if src == "lookup" and len(s["by_position"]) > 1 else "") + ", ".join(cells))
    return "; ".join(parts) or "-"


def table_md(summary: dict, prompts: dict, arms: dict) -> list[str]:
    lines = ["| prompt | arm | decode tok/s | x plain | tokens/forward | acceptance | by position |",
             "|---|---|---|---|---|---|---|"]
    for p in prompts:
        for arm in list(arms) + [PEER]:
            s = summary[p][arm]
            if arm == PEER:
                lines.append(f"| {p} | transformers generate | {fmt(s['decode_tok_s'])} | {fmt(s['speedup'], 2)} | 1.00 "
                             f"| - | - |")
                continue
            acc = f"{100 * s['accepted'] / s['drafts']:.0f}% ({s['accepted']}/{s['drafts']})" if s["drafts"] else "-"
            lines.append(f"| {p} | {arm} | {fmt(s['decode_tok_s'])} | {fmt(s['speedup'], 2)} | "
                         f"{s['tokens_per_forward']:.2f} | {acc} | {by_position(s)} |")
    return lines


def markdown(doc: dict) -> str:
    m, S = doc["machine"], doc["summary"]
    la0, la1 = doc["load_start"], doc["load_end"]
    n, rounds = doc["tokens"], doc["rounds"]
    L = ["# Speculative decoding on the bundled model: MTP depth, lookup, the gate, and transformers", "",
         f"Command: `{doc['command']}` ({doc['elapsed_s'] / 60:.1f} min).  ",
         f"Machine: {m['cpu']}, {m['cpus_online']} CPUs online; torch {m['torch']} with {m['torch_threads']} threads "
         f"(`torch.set_num_threads`, also the C kernel's), linear backend `{m['linear_backend']}`; transformers "
         f"{m['transformers']}; Python {m['python']}. Date: {doc['date']}.  ",
         f"Load average (1/5/15 min): before measuring {la0[0]:.2f}/{la0[1]:.2f}/{la0[2]:.2f} (after "
         f"{doc['waited_s']:.0f} s of waiting for the 1-min load to fall under {doc['load_below']}), after "
         f"{la1[0]:.2f}/{la1[1]:.2f}/{la1[2]:.2f}.  ",
         "Model: `verispec/data/default_model` (15.1M parameters, hidden 256, 8 layers 3:1 DeltaNet:attention, "
         "8 experts top-2, vocab 8192, MTP head), bf16 on disk, fp32 in both engines.  ",
         f"Raw data: `{doc.get('json_out', 'bench/results/spec_tables.json')}`; plot: "
         f"`{doc.get('png_out', 'docs/benchmarks.png')}`. Written by `bench/spec_tables.py`.", ""]
    if sorted(S) != ["A", "B", "C"]:
        L += [f"Tables run: {', '.join(sorted(S))} only (`--tables`); the others are in `docs/benchmarks.md`.", ""]
    if doc.get("note"):
        L += [doc["note"], ""]
    if max(la0[0], la1[0]) >= doc["load_below"]:
        L += [f"**The machine was not quiet**: the 1-min load was {la0[0]:.2f} before and {la1[0]:.2f} after on "
              f"{m['cpus_online']} CPUs (other jobs). Arms were interleaved so the ratios are fairer than the "
              "absolute tok/s; see the spreads.", ""]
    L += ["Method: greedy, "
          f"{n} new tokens per run (end-of-sequence ignored), {rounds} round(s); in each round every arm of every "
          f"prompt runs once, in the order of the tables ({' '.join(sorted(S))} ... {' '.join(sorted(S))} ...), "
          "transformers' generate among them. "
          "Values are the median over rounds [min-max]; `x plain` is each round's ratio to the plain run of the "
          "same round, then the median. Decode tok/s counts the script's wall clock from the end of prefill to "
          f"the last token: ({n} - 1) tokens over (generate's wall time - its prefill), drafting, gate and "
          f"sampling included; transformers: ({n} - 1) / (generate({n}) - generate(1)). Tokens/forward, "
          "acceptance and acceptance by draft position (accepted/carried) are summed over the rounds. Gate on "
          "in every arm (the default); `--mtp-vocab` default (16000 >= the 8192 ids: the head scores the whole "
          "vocabulary).", "",
          "**Identical text**: every verispec arm of a prompt, in every round, produced the same ids as plain "
          "decoding (checked by the script, which exits non-zero otherwise). md5 of the ids per prompt: " +
          "; ".join(f"{p} `{h}`" for p, h in doc["md5"].items()) + ". Transformers' greedy ids equal verispec's "
          "for: " + "; ".join(f"{p} {'yes' if ok else 'no, first difference at position ' + str(ok_pos)}"
                               for p, (ok, ok_pos) in doc["peer_same"].items()) + ".", ""]
    if "A" in S:
        L += _table_a_md(doc)
    if "B" in S:
        L += _table_b_md(doc)
    if "C" in S:
        L += _table_c_md(doc)
    L += ["## Peer: transformers' generate", "",
          f"transformers {m['transformers']}, `Qwen3NextForCausalLM.from_pretrained(..., dtype=torch.float32)` "
          "(its torch fallback kernels), `generate(max_new_tokens=N, min_new_tokens=N, do_sample=False)` after a "
          "warm-up, same prompt ids and threads, run inside the same rounds. Its rows are in the tables above; "
          "total tok/s (prefill included, N / generate(N)) for reference: " +
          "; ".join(f"{p} {fmt(S[t][p][PEER]['total_tok_s'])}" for t, ps, _ in TABLES if t in S for p in ps) + ".", "",
          "`generate(..., prompt_lookup_num_tokens=5)`: " +
          (f"refused: `{doc['peer_lookup_error']}`" if doc["peer_lookup_error"] else "ran (no error)") + ".", ""]
    L += ["## Prompts and outputs", "", "Each prompt, then the first 400 characters of the text every arm produced "
          "(greedy; the bundled model is a 15M-parameter code toy, and its continuations repeat themselves).", ""]
    for p, text in doc["prompts"].items():
        if p not in doc["outputs"]:
            continue
        L += [f"**{p}** prompt ({len(doc['prompt_ids'][p])} tokens):", "", "```", text, "```", "", "output:", "", "```",
              doc["outputs"][p][:400], "```", ""]
    L += ["## Profile: one plain step and one verify", "", doc["profile_md"], doc["profile_text"], ""]
    L += ["## Targets (reported, not asserted)", ""] + [f"- {t}" for t in doc["targets"]] + [""]
    return "\n".join(L) + "\n"


def _table_a_md(doc: dict) -> list[str]:
    S = doc["summary"]
    L = ["## Table A: MTP depth on code continuation (lookup off)", "",
         "Prompts: starts of functions/classes from files of the model's held-out split (`colorsys.py`, "
         "`tracemalloc.py`, `ipaddress.py` are `heldout` in `docs/default-model-data.tsv`).", ""]
    L += table_md(S["A"], CODE, ARMS_A)
    gm = {arm: geomean([S["A"][p][arm]["speedup"]["median"] for p in CODE]) for arm in list(ARMS_A) + [PEER]}
    L += ["", "Geometric mean over the code prompts of `x plain`: " +
          ", ".join(f"{a} {v:.2f}" for a, v in gm.items()) + ".", ""]
    L += ["### What Table A says about the defaults", "", doc["defaults_text"], ""]
    return L


def _table_b_md(doc: dict) -> list[str]:
    S, rounds = doc["summary"], doc["rounds"]
    L = ["## Table B: a code edit (rename a variable in 25 lines and print them again)", ""]
    L += table_md(S["B"], EDIT, ARMS_B)
    e = next(iter(EDIT))
    want = "\n".join(_EDIT_CODE.replace("count", "total").splitlines()[3:])
    copied = doc["outputs"][e].startswith(want[:60])
    L.append("\nThe model " + ("copies the renamed code, as intended." if copied else
             "does **not** copy the renamed code (see 'Prompts and outputs'): after a few lines it writes code of its "
             "own and then repeats itself, so lookup's accepted drafts here come from that repetition and the "
             "few copied lines, not from an edit copied in full."))
    for arm in ARMS_B:
        g = S["B"][e][arm]["gate_sources"].get("lookup")
        if g and ARMS_B[arm].get("mtp") == "on" and ARMS_B[arm].get("lookup"):
            L.append(f"\n{arm}: lookup was carried in {g['verifies']} verifies, the gate declined it {g['declined']} "
                     f"times and probed it {g['probes']} times (over {rounds} rounds).")
            runs = doc["raw"]["B"][e][arm]
            if g["verifies"] == 0 and not any("T(1)" in r["gate_line"] for r in runs):
                L.append(
                    "Why (read from the gate's report line and `verispec/gate.py`, `verispec/decoder.py`): with the MTP "
                    "head drafting at every step, no plain step runs, so the gate never measures T(1) and prices a "
                    "2-row forward with its prior rho (1 + 0.5); lookup's prior acceptance 0.5 then values one draft "
                    "at exactly (1 + 0.5) / 1.5 = 1.0, which is not > 1, so it is declined. Its probes lift it to one "
                    "draft, but `Decoder._propose` then carries the MTP proposal, whose value is higher, so the probe "
                    "never runs and lookup's estimate is never fed. After 64 multi-row forwards without a plain step "
                    "the gate declines lookup at every pick (`since_plain >= refresh`), and nothing resets that count "
                    "while a fixed-depth MTP head drafts at every step. So with the CLI's defaults (lookup on, "
                    "`--mtp-drafts 1`) lookup is in effect off on this edit.")
    L.append("")
    return L


def _table_c_md(doc: dict) -> list[str]:
    S, rounds = doc["summary"], doc["rounds"]
    L = ["## Table C: free text with the gate on", ""]
    L += table_md(S["C"], PROSE, ARMS_C)
    c = S["C"][next(iter(PROSE))]["lookup, gate on"]
    g = c["gate_sources"].get("lookup", {})
    L += ["", f"Lookup with the gate on, summed over {rounds} round(s): {c['verifies']} verifies carried "
              f"{c['drafts']} drafts ({c['accepted']} accepted); the gate declined {g.get('declined', 0)} proposals "
              f"outright and made {g.get('probes', 0)} probes.", ""]
    return L


def defaults_text(S: dict) -> str:
    if "A" not in S:
        return ""
    gm = {arm: geomean([S["A"][p][arm]["speedup"]["median"] for p in CODE]) for arm in ARMS_A}
    fixed = {a: v for a, v in gm.items() if a not in ("plain",)}
    best = max(fixed, key=fixed.get)
    t = [f"Fastest MTP arm by geometric mean over the code prompts: **{best}** ({fixed[best]:.2f}x plain); "
         f"MTP 1: {gm['MTP 1']:.2f}x, MTP 2: {gm['MTP 2, per-step']:.2f}x per-step / {gm['MTP 2, fixed']:.2f}x "
         f"fixed, MTP 3: {gm['MTP 3, per-step']:.2f}x per-step / {gm['MTP 3, fixed']:.2f}x fixed, the gate's "
         f"depth: {gm[chr(77) + 'TP gate' + chr(39) + 's depth']:.2f}x."]
    for d in (2, 3):
        on, off = gm[f"MTP {d}, per-step"], gm[f"MTP {d}, fixed"]
        word = "as fast as" if round(on, 2) == round(off, 2) else "faster than" if on > off else "slower than"
        t.append(f"At depth {d} the per-step depth is {word} the fixed depth ({on:.2f} vs {off:.2f}).")
    # a clear win: this arm's slowest round beat the other arm's fastest round, prompt by prompt
    def wins(a: str, b: str) -> int:
        return sum(S["A"][p][a]["speedup"]["min"] > S["A"][p][b]["speedup"]["max"] for p in CODE)

    n = len(CODE)
    t.append("Clear wins (every round of one arm faster than every round of the other, on a prompt), out of "
             f"{n} code prompts: " + "; ".join(
                 f"{a} over MTP 1: {wins(a, 'MTP 1')}, MTP 1 over {a}: {wins('MTP 1', a)}"
                 for a in ARMS_A if a not in ("plain", "MTP 1")) + ".")
    beat_all = [a for a in ARMS_A if a not in ("plain", "MTP 1") and wins(a, "MTP 1") == n]
    default = f"the CLI's default is `--mtp-drafts {DraftSettings().mtp_drafts}`"
    if best == "MTP 1":
        t.append(f"So the table supports a depth of 1 ({default}).")
    elif beat_all:
        t.append(f"On code continuation the table supports a depth of 2 or more over 1: "
                 f"{', '.join(beat_all)} beat MTP 1 clearly on every code prompt ({default}; see Table B for "
                 "the code edit, where the choice matters less or the other way).")
    else:
        t.append(f"{best} beat MTP 1 on the geometric mean, but not clearly on every prompt: the table does not "
                 f"clearly separate depth 1 from the deeper arms ({default}).")
    for d in (2, 3):
        on, off = f"MTP {d}, per-step", f"MTP {d}, fixed"
        t.append(f"Per-step vs fixed at depth {d}: clear wins {wins(on, off)} vs {wins(off, on)} of {n}.")
    t.append("`--mtp-pstep` (on by default for depth >= 2): the table " + (
        "supports it." if all(wins(f"MTP {d}, per-step", f"MTP {d}, fixed") > wins(f"MTP {d}, fixed", f"MTP {d}, per-step")
                              for d in (2, 3)) else
        "does not show it faster than the fixed depth at both depths (the differences are mostly inside the round "
        "spreads); it does raise the acceptance of the drafts it carries (by position, above)."))
    return " ".join(t)


def targets(S: dict, prof: dict) -> list[str]:
    out = []
    if "A" in S:
        gm = {arm: geomean([S["A"][p][arm]["speedup"]["median"] for p in CODE]) for arm in ARMS_A}
        best = max((a for a in gm if a != "plain"), key=gm.get)
        v = gm[best]
        out.append(f"MTP at its best depth >= 1.5x plain on code continuation: {best}, {v:.2f}x (geometric mean of "
                   f"the per-prompt medians) - {'met' if v >= 1.5 else f'missed by {100 * (1.5 - v) / 1.5:.0f}%'}.")
    e = next(iter(EDIT))
    if "B" in S:
        v = S["B"][e]["lookup"]["speedup"]["median"]
        out.append(f"Lookup on the code edit >= 1.3x plain: {v:.2f}x - "
                   f"{'met' if v >= 1.3 else f'missed by {100 * (1.3 - v) / 1.3:.0f}%'}.")
    if "C" in S:
        out.append(_target_c(S))
    ratios = [1 / S[t][p][PEER]["speedup"]["median"] for t, ps, _ in TABLES if t in S for p in ps]
    v = geomean(ratios)
    out.append(f"verispec plain >= 3x transformers' plain generate: {v:.2f}x (geometric mean over the "
               f"{len(ratios)} prompts; {min(ratios):.2f}-{max(ratios):.2f}) - "
               f"{'met' if v >= 3 else f'missed by {100 * (3 - v) / 3:.0f}%'}.")
    if "B" in S:
        bestB = max((a for a in ARMS_B if a != "plain"), key=lambda a: S["B"][e][a]["speedup"]["median"])
        v = S["B"][e][bestB]["decode_tok_s"]["median"] / S["B"][e][PEER]["decode_tok_s"]["median"]
        out.append(f"verispec with drafts faster than transformers with its prompt lookup: transformers refuses "
                   f"prompt lookup on this architecture, so against its plain generate on the code edit: {bestB} "
                   f"{v:.2f}x.")
    return out


def _target_c(S: dict) -> str:
    c = S["C"][next(iter(PROSE))]
    v, pl = c["lookup, gate on"]["decode_tok_s"]["median"], c["plain"]["decode_tok_s"]
    slower = 100 * (1 - v / pl["median"])
    how = f"{slower:.1f}% slower" if slower > 0 else f"{-slower:.1f}% faster"
    where = ("inside" if pl["min"] <= v <= pl["max"] else "above" if v > pl["max"] else "below")
    return (f"Free text with the gate on no more than 2% slower than plain: lookup {v:.1f} vs plain "
            f"{pl['median']:.1f} tok/s ({how}; {where} plain's own spread {pl['min']:.1f}-{pl['max']:.1f}) - "
            f"{'met' if slower <= 2 else 'missed'}. (The prompt's continuation repeats itself, see 'Prompts and "
            "outputs', so lookup has much to copy: this does not show the gate's cost on free text that does not "
            "repeat.)")


def profile_text(prof: dict) -> str:
    s1 = prof["steps"][1]
    p = s1["parts_ms"]
    t1 = s1["total_ms"]
    py = p["matmul_wrapper"] + p["other"]
    floor = prof["bandwidth_floor_ms"]
    regime = "dispatch-bound" if floor < 0.5 * t1 else "bandwidth-bound"
    return (
        f"\n**Regime: {regime}.** Reading the weights once would take {floor:.2f} ms of the plain step's "
        f"{t1:.2f} ms; the C kernel's own time is {p['matmul_kernel']:.2f} ms ({100 * p['matmul_kernel'] / t1:.0f}%), "
        f"while Python and small-op dispatch (the linear wrapper plus everything between the kernels: "
        f"{s1['aten_ops']} aten ops and {s1['python_calls']} Python calls per forward) take {py:.2f} ms "
        f"({100 * py / t1:.0f}%). For speculation this means: a verify does not get its extra rows for the price of "
        f"the weight reads, as it would on a bandwidth-bound model; it pays for the per-row work the row-invariant "
        f"path does in Python (the DeltaNet conv and delta rule, the row-by-row elementwise ops, attention per "
        f"row: the recurrence alone goes from {p['recurrence']:.2f} ms at 1 row to "
        f"{prof['steps'][3]['parts_ms']['recurrence']:.2f} ms at 3), so T(M)/T(1) = "
        + ", ".join(f"{prof['ratio'][m]:.2f}" for m in profile_step.ROWS)
        + " for M = 1..4, and the MTP head's draft rows are another Python-heavy forward each. A draft pays only when "
          "its acceptance beats those costs; that is what the gate measures.")


def plot(doc: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    S = doc["summary"]
    panels = [(t, ps, arms, title, w) for (t, ps, arms), title, w in
              zip(TABLES, ("A: MTP depth, code continuation", "B: code edit", "C: free text"), (3 * len(CODE), 6, 3))
              if t in S]
    fig, axes = plt.subplots(1, len(panels), figsize=(16 * sum(p[4] for p in panels) / (3 * len(CODE) + 9), 5.5),
                             gridspec_kw={"width_ratios": [p[4] for p in panels]}, squeeze=False)
    for ax, (table, prompts, arms, title, _) in zip(axes[0], panels):
        names = list(arms) + [PEER]
        width = 0.8 / len(prompts)
        for i, p in enumerate(prompts):
            med = [S[table][p][a]["decode_tok_s"]["median"] for a in names]
            lo = [m - S[table][p][a]["decode_tok_s"]["min"] for m, a in zip(med, names)]
            hi = [S[table][p][a]["decode_tok_s"]["max"] - m for m, a in zip(med, names)]
            xs = [j + (i - (len(prompts) - 1) / 2) * width for j in range(len(names))]
            ax.bar(xs, med, width, yerr=[lo, hi], capsize=2, label=p.split(".")[0] if len(prompts) > 1 else None)
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=40, ha="right", fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.set_ylabel("decode tok/s (median, min-max)")
        if len(prompts) > 1:
            ax.legend(fontsize=7)
    fig.suptitle(f"verispec on the bundled model, {doc['tokens']} greedy tokens, {doc['rounds']} rounds, "
                 f"{doc['machine']['torch_threads']} threads, load {doc['load_start'][0]:.1f}->{doc['load_end'][0]:.1f}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def machine(threads: int) -> dict:
    import transformers

    import verispec.ops.linear as lin_ops
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        cpu = next((ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name")), "?")
    except OSError:
        cpu = platform.processor() or "?"
    return {"cpu": cpu, "cpus_online": os.cpu_count(), "torch_threads": threads, "torch": torch.__version__,
            "transformers": transformers.__version__, "python": platform.python_version(),
            "linear_backend": lin_ops.backend()}


def render_again(src: Path, md_out: Path, png_out: Path) -> int:
    """The doc and plot from a saved run (the texts recomputed from its numbers)."""
    doc = json.loads(src.read_text())
    if "outputs" not in doc:                      # runs saved before the outputs were
        from verispec.tokenizer import Tokenizer
        tok = Tokenizer.from_dir(BUNDLED_MODEL)
        doc["outputs"] = {p: tok.decode(ids) for p, ids in doc["ids"].items()}
    prof = doc["profile"]
    for key in ("T_ms", "T_ms_min", "ratio", "steps"):
        prof[key] = {int(k): v for k, v in prof[key].items()}
    if doc["identical_errors"]:
        print("[bench] the saved run has differing texts:\n" + "\n".join(doc["identical_errors"]), file=sys.stderr)
        return 3
    doc["profile_md"] = profile_step.markdown(prof, doc["machine"]["torch_threads"])
    doc["profile_text"] = profile_text(prof)
    doc["defaults_text"] = defaults_text(doc["summary"])
    doc["targets"] = targets(doc["summary"], prof)
    md_out.write_text(markdown(doc))
    plot(doc, png_out)
    print(f"[bench] re-rendered {md_out}, {png_out} from {src}", file=sys.stderr)
    return 0


def _rel(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(ROOT))
    except ValueError:
        return str(p)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=None, help="default: 2, or the CPU count if smaller")
    ap.add_argument("--quick", action="store_true", help="1 round of 24 tokens, no load wait, output under /tmp")
    ap.add_argument("--max-wait", type=float, default=None, help="seconds to wait for a quiet machine (default 600)")
    ap.add_argument("--load-below", type=float, default=1.5)
    ap.add_argument("--profile-reps", type=int, default=20)
    ap.add_argument("--note", default="", help="a paragraph for the doc (why the threads or load are what they are)")
    ap.add_argument("--from-json", default=None, help="re-render the doc and plot from a saved JSON; no measuring")
    ap.add_argument("--json-out", default=None)
    ap.add_argument("--md-out", default=None)
    ap.add_argument("--png-out", default=None)
    ap.add_argument("--tables", default="ABC", help="the tables to run, a subset of ABC; a subset writes its own "
                    "files (bench/results/spec_tables-A.json, docs/benchmarks-A.md, docs/benchmarks-A.png for A)")
    a = ap.parse_args()
    tables = "".join(t for t in "ABC" if t in a.tables.upper())
    if not tables or set(a.tables.upper()) - set("ABC"):
        ap.error(f"--tables: a subset of ABC, not {a.tables!r}")
    sfx = "" if tables == "ABC" else f"-{tables}"
    if a.quick:
        a.rounds, a.tokens, a.profile_reps = 1, 24, 5
    max_wait = a.max_wait if a.max_wait is not None else (0 if a.quick else 600)
    outdir = Path(tempfile.gettempdir()) / "verispec-spec-tables-quick" if a.quick else None
    json_out = Path(a.json_out or (outdir / f"spec_tables{sfx}.json" if outdir else
                                   ROOT / f"bench/results/spec_tables{sfx}.json"))
    md_out = Path(a.md_out or (outdir / f"benchmarks{sfx}.md" if outdir else ROOT / f"docs/benchmarks{sfx}.md"))
    png_out = Path(a.png_out or (outdir / f"benchmarks{sfx}.png" if outdir else ROOT / f"docs/benchmarks{sfx}.png"))
    if a.from_json:
        return render_again(Path(a.from_json), md_out, png_out)
    threads = a.threads or min(2, os.cpu_count() or 1)
    torch.set_num_threads(threads)
    t_start = time.perf_counter()

    usage = Path(tempfile.mkdtemp()) / "vocab_usage.bin"        # never write the package's counts file
    eng = Engine(BUNDLED_MODEL, usage_file=str(usage))
    peer = Peer(BUNDLED_MODEL)
    waited0 = time.perf_counter()
    loads = wait_for_quiet(max_wait, a.load_below)
    waited = time.perf_counter() - waited0
    doc = {"command": "python bench/spec_tables.py " + " ".join(sys.argv[1:]), "machine": machine(threads),
           "date": time.strftime("%Y-%m-%d %H:%M"), "tokens": a.tokens, "rounds": a.rounds,
           "load_polls": loads, "waited_s": waited, "load_below": a.load_below, "load_start": loads[-1],
           "prompts": {**CODE, **EDIT, **PROSE}, "note": a.note, "tables": tables,
           "json_out": _rel(json_out), "png_out": _rel(png_out)}
    with torch.no_grad():
        m = measure(eng, peer, a.rounds, a.tokens, tables)
        doc["peer_lookup_error"] = peer.lookup_error(m["prompt_ids"][next(iter(EDIT))])
        prof = profile_step.profile(eng, m["prompt_ids"][next(iter(CODE))], a.profile_reps)
    doc["load_end"] = list(os.getloadavg())
    errors, doc["md5"] = check_identical(m["raw"])
    doc["prompt_ids"] = m["prompt_ids"]
    doc["peer_same"] = {}
    for table, prompts in m["raw"].items():
        for p, arms in prompts.items():
            ref, hf = arms["plain"][0]["ids"], arms[PEER][0]["ids"]
            pos = next((i for i, (x, y) in enumerate(zip(hf, ref)) if x != y), None)
            doc["peer_same"][p] = (pos is None and len(hf) == len(ref), pos)
    doc["summary"] = summarize(m["raw"])
    doc["raw"] = {t: {p: {arm: [{k: v for k, v in r.items() if k != "ids"} for r in runs] for arm, runs in arms.items()}
                      for p, arms in ps.items()} for t, ps in m["raw"].items()}
    doc["ids"] = {p: arms["plain"][0]["ids"] for ps in m["raw"].values() for p, arms in ps.items()}
    doc["outputs"] = {p: eng.decode(ids) for p, ids in doc["ids"].items()}
    doc["identical_errors"] = errors
    doc["profile"] = prof
    doc["profile_md"] = profile_step.markdown(prof, threads)
    doc["profile_text"] = profile_text(prof)
    doc["defaults_text"] = defaults_text(doc["summary"])
    doc["targets"] = targets(doc["summary"], prof)
    doc["elapsed_s"] = time.perf_counter() - t_start
    json_out.parent.mkdir(parents=True, exist_ok=True)
    json_out.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    if errors:
        print("[bench] TEXT DIFFERS BETWEEN ARMS (an engine bug):\n" + "\n".join(errors), file=sys.stderr)
        print(f"[bench] raw results in {json_out}; no tables written", file=sys.stderr)
        return 3
    md_out.parent.mkdir(parents=True, exist_ok=True)
    md_out.write_text(markdown(doc))
    plot(doc, png_out)
    print(markdown(doc))
    print(f"[bench] wrote {json_out}, {md_out}, {png_out} in {doc['elapsed_s']:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
