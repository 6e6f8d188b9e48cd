"""Benchmark: what speculation costs and buys on the mid-size random model (issues 3, 4, 5).

    python bench/spec_costs.py [--rounds 3] [--tokens 32] [--gate-tokens 256] [--sections 3,4,5] [--quick]

Section 3 (forced drafts, issue 3). On the mid-size model of bench/decode.py (hidden 1024,
16 layers 3:1 DeltaNet:attention, 16 experts top-2, vocab 8192), every arm a greedy
`Engine.generate` of --tokens tokens after a 64-token prompt: plain; forced accept with
1..5 lookup drafts; forced reject with 1 and 5 drafts (`DraftSettings(lookup=True,
lookup_drafts=k, gate=False, force=..., reference=<plain ids>)`). Reported: tokens per
forward, decode tok/s (wall clock of the generate minus its prefill; the engine's own
forward-only figure is in the JSON), and each arm's ids against plain's. Then the copy
slots: T(M) of `model.forward(M rows, exact=True, save_slots=True)` against
`save_slots=False` (state restored between forwards), and one slot's copy on its own
(every DeltaNet layer's recurrent state and conv ring, `copy_`), which a verify pays once
per row past the first.

Section 4 (the MTP head, issue 4). On the fixture with an MTP head and on the mid-size model
with a random one: a plain 1-row exact step, a head draft (the first row: the pending pair),
a deeper draft (the head's own output fed back), absorbing k = 1..5 rows. Then the head's
time against its vocabulary list on the mid-size model with a 151936-row lm_head: the whole
vocabulary, a 16000-token list and a 4000-token list (a VocabList whose counts really give
that size), and that model's plain step.

Section 5 (the gate, issue 5). Forced `bernoulli:P` lookup drafts, P = 0.9, 0.6, 0.3, 0:
the gate (`gate=True`, up to 5 drafts) against every fixed depth k = 1..5 (`gate=False`)
and plain, --gate-tokens tokens per run (a comma list runs the section once per length).
Two gate arms: `gate`, the engine's chain (`Engine.keep_gate`: each gated run continues
from the engine's last gated run: its measured T(n) and rho, acceptance carried at a prior's
weight, as a long-lived process would; the chain starts empty at the section's first gate
run, so that run is a cold one), and `gate_cold`, a gate with nothing measured at every run
(the engine's chain set aside around it): what a single CLI run gets, and `gate_noobs`, that
cold gate without free observations (only verifies feed its acceptance estimates). `plain2`
is plain again, for the noise floor. The forced coins of round r come from seed 1000 + r
(the same for every arm of the round): with one seed for all rounds, each fixed depth kept
one coin sequence, lucky or not, in every round (at P = 0.9 fixed4's stood 3.8% above its
expectation), which no number of rounds averaged out. With the forced source the decoder's gate does
pick the depth (ForcedSource has no `gated_by_decoder = False`, so `Decoder._propose` calls
`gate.pick` and cuts the drafts before `spoil`). Then the real (random) MTP head on the
mid-size model: plain, fixed depth 1 and 3 without the gate, depth 3 with the gate and
per-step depth off / on, and depth auto with the gate (a random head's drafts almost never
stand: the P ~ 0 case with real draft costs). In the MTP drafter the gate picks the depth
only with `mtp_drafts=0` (auto); at a fixed depth it never declines, and per-step depth
(fixed depth >= 2 only) trims to no fewer than one draft.

Discipline: before each section the script waits (poll every 30 s, up to --wait s) for the
1-minute load average to fall under --quiet-load, and records the load before and after.
Arms are interleaved in every round (the order reversed every other round); tables show the
median over rounds [min-max]. Raw numbers go to bench/results/spec_costs.json, tables to
docs/benchmarks-spec.md (with --quick: /tmp, for a smoke run).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode import MODELS, machine  # noqa: E402  (bench/decode.py: the same models and machine line)
from lockstep import lockstep  # noqa: E402

from verispec.config import DraftSettings, RunSettings  # noqa: E402
from verispec.drafts.vocab import VocabList  # noqa: E402
from verispec.engine import Engine  # noqa: E402
from verispec.fixture import make_fixture  # noqa: E402
from verispec.sampling import SamplingParams  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PROMPT_LEN = 64

# The mid-size model of bench/decode.py with a random MTP head. make_fixture seeds the global
# RNG, builds and randomizes the backbone, then draws the head: the backbone tensors are the
# ones bench/decode.py's "mid" holds.
SPECS = {
    "fixture-mtp": dict(MODELS["fixture"], mtp=True),
    "mid-mtp": dict(MODELS["mid"], mtp=True),
    "mid-mtp-v152k": dict(MODELS["mid"], mtp=True, vocab_size=151936),
}


# ----- helpers ------------------------------------------------------------------------------

def build(name: str, cache: Path) -> Path:
    d = cache / name
    if not (d / "config.json").exists():
        t0 = time.perf_counter()
        make_fixture(d, **SPECS[name])
        log(f"wrote {name} to {d} in {time.perf_counter() - t0:.0f} s")
    return d


def log(msg: str) -> None:
    print(f"[spec_costs] {msg}", file=sys.stderr, flush=True)


def stat(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def fmt(s: dict | None, digits: int = 2, scale: float = 1.0) -> str:
    if not s:
        return "-"
    return f"{s['median'] * scale:.{digits}f} [{s['min'] * scale:.{digits}f}-{s['max'] * scale:.{digits}f}]"


class Quiet:
    """Wait for a quiet machine before a section; record the load around it."""

    def __init__(self, limit: float, wait_s: float, record: list, wait_total: float):
        self.limit, self.wait_s, self.record, self.left = limit, wait_s, record, wait_total

    def section(self, label: str):
        return _Section(self, label)


class _Section:
    def __init__(self, q: Quiet, label: str):
        self.q, self.label = q, label

    def __enter__(self):
        t0 = time.time()
        load = os.getloadavg()
        while load[0] >= self.q.limit and time.time() - t0 < min(self.q.wait_s, self.q.left):
            log(f"{self.label}: load {load[0]:.2f} >= {self.q.limit}; waiting")
            time.sleep(30)
            load = os.getloadavg()
        self.q.left -= time.time() - t0
        self.entry = {"section": self.label, "waited_s": round(time.time() - t0), "load_before": list(load),
                      "quiet": load[0] < self.q.limit, "start": time.strftime("%H:%M:%S")}
        log(f"{self.label}: start, load {load[0]:.2f} (waited {self.entry['waited_s']} s)")
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.entry["load_after"] = list(os.getloadavg())
        self.entry["seconds"] = round(time.perf_counter() - self.t0, 1)
        self.q.record.append(self.entry)
        log(f"{self.label}: done in {self.entry['seconds']} s, load after {self.entry['load_after'][0]:.2f}")


SEED0 = 1000     # section 5 round r forces its coins with seed SEED0 + r (before: seed 0 in every round)


def prompt_for(vocab: int) -> list[int]:
    return [(13 * i + 5) % vocab for i in range(PROMPT_LEN)]


def run_arm(eng: Engine, prompt: list[int], tokens: int, drafts: DraftSettings, cold: bool = False,
            seed: int = 0) -> dict:
    """One greedy generate. cold: the gate starts with nothing measured (the engine's chain of
    gates, Engine.last_gate, is set aside for this run and put back after it)."""
    settings = RunSettings(max_tokens=tokens, drafts=drafts, sampling=SamplingParams(seed=seed))   # greedy
    kept = eng.last_gate
    if cold:
        eng.last_gate = None
    try:
        t0 = time.perf_counter()
        res = eng.generate(list(prompt), settings, eos_ids=set())
        wall = time.perf_counter() - t0
    finally:
        if cold:
            eng.last_gate = kept
    return arm_result(res, wall - res.stats["prefill_seconds"], wall)


def arm_result(res, decode_wall: float, wall: float) -> dict:
    """One generate's sample: its counts and speeds, decode_wall the seconds its decode took."""
    s = res.stats
    out = {"ids": res.ids, "tokens": s["tokens"], "forwards": s["forwards"], "verifies": s["verifies"],
           "drafts": s["drafts"], "accepted": s["accepted"], "declined": s["declined"],
           "plain_steps": s["plain_steps"], "proposed_by_position": s["proposed_by_position"][:6],
           "decode_wall_s": decode_wall, "decode_forward_s": s["decode_seconds"],
           "prefill_s": s["prefill_seconds"], "wall_s": wall,
           "tok_s": s["tokens"] / decode_wall, "tok_s_forward_only": s["decode_tok_s"],
           # the decode loop's time outside the forwards (sampling, proposing, the gate), per token
           "outside_forward_ms_per_token": (decode_wall - s["decode_seconds"]) / s["tokens"] * 1e3,
           "load1": os.getloadavg()[0]}
    if "gate" in s:
        g = s["gate"]
        out["gate"] = {"T_ratio": {n: t / g["T"][1] for n, t in g["T"].items()} if 1 in g["T"] else {},
                       "sources": {k: {f: v[f] for f in ("verifies", "probes", "declined", "trimmed", "draft_cost")}
                                   for k, v in g["sources"].items() if v["verifies"] or v["declined"]}}
    return out


def lockstep_round(eng: Engine, prompt: list[int], tokens: int, arms: dict, seed: int, chunk: int) -> dict:
    """Every arm of one round generated at once, `chunk` tokens of each in turn (bench/lockstep.py);
    arms: name -> (drafts, cold). -> name -> the same dict as run_arm gives, its decode time the
    arm's own turns (from its first token)."""
    decoders = {}
    for name, (drafts, cold) in sorted(arms.items(), key=lambda kv: not kv[1][1]):   # cold ones first
        settings = RunSettings(max_tokens=tokens, drafts=drafts, sampling=SamplingParams(seed=seed))
        kept = eng.last_gate
        if cold:
            eng.last_gate = None
        decoders[name] = (settings, eng.new_decoder(settings, list(prompt)))
        if cold:
            eng.last_gate = kept       # the chain continues from the `gate` arm's, not the cold one's

    def runner(name):
        settings, dec = decoders[name]
        return lambda on_token: eng.generate(list(prompt), settings, decoder=dec, on_token=on_token, eos_ids=set())
    got = lockstep({n: runner(n) for n in arms}, chunk)
    # decode time: the arm's own turns from its first token (prefill excluded)
    return {name: dict(arm_result(res, active, active + res.stats["prefill_seconds"]), lockstep_chunk=chunk)
            for name, (res, active) in got.items()}


def interleaved(arms: dict, rounds: int, fn, label: str, with_round: bool = False) -> dict[str, list]:
    """fn(arm_value) (or fn(arm_value, round) with with_round) -> sample; arms run in order,
    reversed every other round."""
    raw = {a: [] for a in arms}
    names = list(arms)
    for r in range(rounds):
        for a in (names if r % 2 == 0 else names[::-1]):
            raw[a].append(fn(arms[a], r) if with_round else fn(arms[a]))
        log(f"{label} round {r + 1}/{rounds} done, load {os.getloadavg()[0]:.2f}")
    return raw


def restore(state, start: int, saved) -> None:
    state.kv_len = start
    del state.tokens[start:]
    for i in range(len(saved.rec)):
        state.recurrent.copy_layer_from(saved, i)


# ----- section 3: forced accept / reject, copy slots -----------------------------------------

def section3(eng: Engine, rounds: int, tokens: int, reps: int) -> dict:
    prompt = prompt_for(eng.args.vocab_size)
    plain = DraftSettings(lookup=False, mtp="off")
    ref = run_arm(eng, prompt, tokens, plain)["ids"]          # also the warm-up
    arms = {"plain": plain}
    for k in range(1, 6):
        arms[f"accept{k}"] = DraftSettings(lookup=True, lookup_drafts=k, mtp="off", gate=False, force="accept",
                                           reference=tuple(ref))
    for k in (1, 5):
        arms[f"reject{k}"] = DraftSettings(lookup=True, lookup_drafts=k, mtp="off", gate=False, force="reject",
                                           reference=tuple(ref))
    raw = interleaved(arms, rounds, lambda d: run_arm(eng, prompt, tokens, d), "section 3 arms")
    runs = {a: {"tok_s": stat([x["tok_s"] for x in xs]),
                "tok_s_forward_only": stat([x["tok_s_forward_only"] for x in xs]),
                "tokens_per_forward": xs[0]["tokens"] / xs[0]["forwards"],
                "forwards": xs[0]["forwards"], "verifies": xs[0]["verifies"], "accepted": xs[0]["accepted"],
                "same_ids_as_plain": all(x["ids"] == ref for x in xs),
                "speedup": stat([x["tok_s"] / p["tok_s"] for x, p in zip(xs, raw["plain"])]),
                "raw_tok_s": [x["tok_s"] for x in xs]}
            for a, xs in raw.items()}
    return {"tokens": tokens, "prompt_len": len(prompt), "arms": runs, "slots": slot_costs(eng, prompt, rounds, reps)}


def slot_costs(eng: Engine, prompt: list[int], rounds: int, reps: int) -> dict:
    model = eng.model
    ms = (2, 3, 4, 5, 6)
    state = model.new_state(len(prompt) + 8)
    model.forward(prompt, state)
    state.ensure_slots(max(ms) - 1)
    start, saved = state.kv_len, state.recurrent.clone()
    rows = [(prompt[i] * 7 + 3) % eng.args.vocab_size for i in range(max(ms))]
    fwd = {(m, s): [] for m in ms for s in (True, False)}
    copy = []
    slot = state.slots[0]

    def one_copy():
        t0 = time.perf_counter()
        for i in range(len(slot.rec)):
            slot.conv[i].copy_(state.recurrent.conv[i])
            slot.rec[i].copy_(state.recurrent.rec[i])
        return time.perf_counter() - t0

    def one_forward(m, save):
        restore(state, start, saved)
        t0 = time.perf_counter()
        model.forward(rows[:m], state, exact=True, save_slots=save)
        return time.perf_counter() - t0

    one_forward(2, True)                                   # warm-up
    for r in range(rounds):
        per = {key: [] for key in fwd}
        cp = []
        for rep in range(reps):
            for m in ms:
                order = (True, False) if (r + rep) % 2 == 0 else (False, True)
                for s in order:
                    per[(m, s)].append(one_forward(m, s))
            cp += [one_copy() for _ in range(5)]
        for key, xs in per.items():
            fwd[key].append(statistics.median(xs))
        copy.append(statistics.median(cp))
        log(f"section 3 slots round {r + 1}/{rounds} done")
    restore(state, start, saved)
    out = {"slot_bytes": state.shapes.slot_bytes, "linear_layers": state.shapes.linear_layers,
           "copy_one_slot_s": stat(copy), "raw_copy_s": copy, "by_rows": {}}
    for m in ms:
        on, off = fwd[(m, True)], fwd[(m, False)]
        out["by_rows"][m] = {"save_s": stat(on), "nosave_s": stat(off),
                             "extra_per_slot_s": stat([(a - b) / (m - 1) for a, b in zip(on, off)]),
                             "raw_save_s": on, "raw_nosave_s": off}
    return out


# ----- section 4: the MTP head ----------------------------------------------------------------

def head_setup(eng: Engine):
    model, head = eng.model, eng.head("post")
    prompt = prompt_for(eng.args.vocab_size)
    ctx = len(prompt) + 8
    state = model.new_state(ctx)
    out = model.forward(prompt, state)
    cache = head.new_cache(ctx)
    head.absorb(cache, head.pick_hidden(out)[:-1], prompt[1:], 0)
    return model, head, prompt, state, cache, head.pick_hidden(out)


def section4_costs(eng: Engine, rounds: int, reps: int) -> dict:
    model, head, prompt, state, cache, hidden = head_setup(eng)
    start, saved = state.kv_len, state.recurrent.clone()
    tok = prompt[-1]
    index = len(prompt) - 1            # the pending pair (h_{n-1}, x_n)
    pending = hidden[-1]
    _, first_out = head.row(cache, pending, tok, index)
    draft1 = int(torch.argmax(_))

    def plain():
        restore(state, start, saved)
        t0 = time.perf_counter()
        model.forward([tok], state, exact=True)
        return time.perf_counter() - t0

    def first():
        t0 = time.perf_counter()
        s, _o = head.row(cache, pending, tok, index)
        int(torch.argmax(s))
        return time.perf_counter() - t0

    def deeper():
        t0 = time.perf_counter()
        s, _o = head.row(cache, first_out[0], draft1, index + 1)
        int(torch.argmax(s))
        return time.perf_counter() - t0

    def absorb(k):
        def f():
            t0 = time.perf_counter()
            head.absorb(cache, hidden[-k:], prompt[-k:], index)
            return time.perf_counter() - t0
        return f

    arms = {"plain_step": plain, "head_first": first, "head_deeper": deeper}
    arms.update({f"absorb{k}": absorb(k) for k in range(1, 6)})
    res = micro(arms, rounds, reps, "section 4 head")
    restore(state, start, saved)
    return res


def section4_vocab(eng: Engine, rounds: int, reps: int, sizes=(0, 16000, 4000)) -> dict:
    model, head, prompt, state, cache, hidden = head_setup(eng)
    start, saved = state.kv_len, state.recurrent.clone()
    tok, index, pending = prompt[-1], len(prompt) - 1, hidden[-1]
    V = eng.args.vocab_size
    lists, gather_s = {}, {}
    for n in sizes:
        if n == 0:
            lists[n] = (None, None)
            continue
        v = VocabList(V, n, halve_every=10**9)
        v.count_prompt(range(n))          # n tokens counted once: the list holds exactly those n
        v.start_request([])
        ids = v.ids()
        assert ids is not None and v.list_size() == n, (n, v.list_size())
        t0 = time.perf_counter()
        w = model.lm_head[ids].contiguous()   # what MTPDrafter gathers once per list rebuild
        gather_s[n] = time.perf_counter() - t0
        lists[n] = (ids, w)

    def plain():
        restore(state, start, saved)
        t0 = time.perf_counter()
        model.forward([tok], state, exact=True)
        return time.perf_counter() - t0

    def row(n):
        ids, w = lists[n]

        def f():
            t0 = time.perf_counter()
            s, _o = head.row(cache, pending, tok, index, ids, w)
            int(torch.argmax(s))
            return time.perf_counter() - t0
        return f

    arms = {"plain_step": plain}
    arms.update({f"head_list{n}": row(n) for n in sizes})
    res = micro(arms, rounds, reps, "section 4 vocab")
    res["vocab_size"] = V
    res["gather_s"] = gather_s
    restore(state, start, saved)
    return res


def micro(arms: dict, rounds: int, reps: int, label: str) -> dict:
    """Per round: reps passes over the arms (order rotated every pass); the round's value is
    each arm's median; reported: median over rounds [min-max]."""
    names = list(arms)
    for f in arms.values():
        f()                                              # warm-up
    per_round = {a: [] for a in names}
    for r in range(rounds):
        xs = {a: [] for a in names}
        for rep in range(reps):
            shift = (r * reps + rep) % len(names)
            for a in names[shift:] + names[:shift]:
                xs[a].append(arms[a]())
        for a in names:
            per_round[a].append(statistics.median(xs[a]))
        log(f"{label} round {r + 1}/{rounds} done")
    return {"seconds": {a: stat(v) for a, v in per_round.items()},
            "vs_plain": {a: stat([x / p for x, p in zip(v, per_round["plain_step"])]) for a, v in per_round.items()},
            "raw_round_medians_s": per_round}


# ----- section 5: the gate --------------------------------------------------------------------

def section5(eng: Engine, rounds: int, tokens: int, ps: tuple[float, ...], fixed: dict | None = None,
             noobs: bool = True, chunk: int = 0) -> dict:
    """fixed: P -> the fixed depths to run at that P (default 1..5); noobs: the gate_noobs arm;
    chunk > 0: each round's arms decoded in lockstep, chunk tokens per turn (lockstep_round)."""
    prompt = prompt_for(eng.args.vocab_size)
    plain = DraftSettings(lookup=False, mtp="off")
    ref = run_arm(eng, prompt, tokens, plain)["ids"]
    eng.keep_gate, eng.last_gate = True, None     # the `gate` arm's chain starts here, empty
    out = {"tokens": tokens, "rounds": rounds, "threads": torch.get_num_threads(), "by_p": {}}
    for p in ps:
        force = f"bernoulli:{p:g}"
        arms = {"plain": (plain, False), "plain2": (plain, False)}
        for k in (fixed or {}).get(p, range(1, 6)):
            arms[f"fixed{k}"] = (DraftSettings(lookup=True, lookup_drafts=k, mtp="off", gate=False, force=force,
                                               reference=tuple(ref)), False)
        gated = DraftSettings(lookup=True, lookup_drafts=5, mtp="off", gate=True, force=force, reference=tuple(ref))
        arms["gate_cold"] = (gated, True)
        arms["gate"] = (gated, False)
        # the cold gate without free observations (docs/gate.md "Free observations"): the rules alone
        if noobs:
            arms["gate_noobs"] = (dataclasses.replace(gated, gate_observe=False), True)
        # the forced coins come from the run's sampling seed: a new seed each round (every arm of
        # a round the same), so no arm keeps one lucky or unlucky coin sequence across rounds
        if chunk:
            raw = {a: [] for a in arms}
            for r in range(rounds):
                for a, res in lockstep_round(eng, prompt, tokens, arms, SEED0 + r, chunk).items():
                    raw[a].append(res)
                log(f"section 5 {force} {tokens} tok (lockstep {chunk}) round {r + 1}/{rounds} done, "
                    f"load {os.getloadavg()[0]:.2f}")
        else:
            raw = interleaved(arms, rounds, lambda d, r: run_arm(eng, prompt, tokens, *d, seed=SEED0 + r),
                              f"section 5 {force} {tokens} tok", with_round=True)
        out["by_p"][str(p)] = summarize_arms(raw, ref)
    return out


def section5_mtp(eng: Engine, rounds: int, tokens: int) -> dict:
    prompt = prompt_for(eng.args.vocab_size)
    plain = DraftSettings(lookup=False, mtp="off")
    ref = run_arm(eng, prompt, tokens, plain)["ids"]
    eng.keep_gate, eng.last_gate = True, None     # the gated arms' chain starts here, empty
    auto = DraftSettings(lookup=False, mtp="on", mtp_drafts=0, gate=True)
    arms = {"plain": (plain, False),
            "mtp1_nogate": (DraftSettings(lookup=False, mtp="on", mtp_drafts=1, gate=False), False),
            "mtp3_nogate": (DraftSettings(lookup=False, mtp="on", mtp_drafts=3, gate=False), False),
            # depth auto: the gate picks 0..3 (the only MTP setting in which it can decline);
            # the engine's chain of gates, and a gate with nothing measured
            "mtp_auto_gate": (auto, False),
            "mtp_auto_gate_cold": (auto, True),
            # a fixed depth with the gate: it never declines; per-step depth trims to >= 1 draft
            "mtp3_gate_pstep_off": (DraftSettings(lookup=False, mtp="on", mtp_drafts=3, gate=True, mtp_pstep=False),
                                    False),
            "mtp3_gate_pstep_on": (DraftSettings(lookup=False, mtp="on", mtp_drafts=3, gate=True, mtp_pstep=True),
                                   False)}
    raw = interleaved(arms, rounds, lambda d: run_arm(eng, prompt, tokens, *d), "section 5 mtp")
    return {"tokens": tokens, "rounds": rounds, "threads": torch.get_num_threads(), "arms": summarize_arms(raw, ref)}


def summarize_arms(raw: dict, ref: list[int]) -> dict:
    res = {}
    for a, xs in raw.items():
        res[a] = {"tok_s": stat([x["tok_s"] for x in xs]),
                  "tok_s_forward_only": stat([x["tok_s_forward_only"] for x in xs]),
                  "vs_plain": stat([x["tok_s"] / p["tok_s"] for x, p in zip(xs, raw["plain"])]),
                  "tokens_per_forward": stat([x["tokens"] / x["forwards"] for x in xs]),
                  "drafts_per_verify": stat([x["drafts"] / x["verifies"] if x["verifies"] else 0.0 for x in xs]),
                  "acceptance": stat([x["accepted"] / x["drafts"] if x["drafts"] else 0.0 for x in xs]),
                  "outside_forward_ms_per_token": stat([x["outside_forward_ms_per_token"] for x in xs]),
                  "verifies": stat([float(x["verifies"]) for x in xs]),
                  "probes": stat([float(sum(v["probes"] for v in x.get("gate", {}).get("sources", {}).values()))
                                  for x in xs]),
                  "same_ids_as_plain": all(x["ids"] == ref for x in xs),
                  "runs": [{k: v for k, v in x.items() if k != "ids"} for x in xs]}
    return res


# ----- the report -----------------------------------------------------------------------------

def markdown(doc: dict) -> str:
    m = doc["machine"]
    L = ["# What speculation costs and buys: forced drafts, copy slots, the MTP head, the gate", "",
         "Command: " + ", then ".join(f"`{c}`" for c in (doc["command"] if isinstance(doc["command"], list)
                                                          else [doc["command"]])) + "  ",
         f"Machine: {m['cpu']}, {m['cpus_online']} CPUs online, torch {m['torch']} with {m['torch_threads']} "
         f"threads (set by the script, --threads; this is the last command's: section 5 states its own), linear backend `{m['linear_backend']}`, Python {m['python']}.  ",
         f"Code: {doc['git']['head']}{' + uncommitted changes in ' + ', '.join(doc['git']['dirty']) if doc['git']['dirty'] else ''}."
         f" Date: {doc['date']}. Raw data: `bench/results/spec_costs.json`. Written by `bench/spec_costs.py`.", ""]
    loud = [s for s in doc["sections"] if not s["quiet"] or s["load_after"][0] >= doc["quiet_load"]]
    L += ["Load average (1 min) around each section (the script waits for < "
          f"{doc['quiet_load']} before each, up to {doc['wait_s']} s):", "",
          "| section | waited s | load before | load after | seconds |", "|---|---|---|---|---|"]
    for s in doc["sections"]:
        L.append(f"| {s['section']} | {s['waited_s']} | {s['load_before'][0]:.2f} | {s['load_after'][0]:.2f} | "
                 f"{s['seconds']} |")
    L.append("")
    if loud:
        L += [f"**Suspect sections**: {', '.join(s['section'] for s in loud)} ran with a 1-minute load at or above "
              f"{doc['quiet_load']} on {m['cpus_online']} CPUs (the machine is shared): their absolute times are "
              "inflated and noisy; the interleaved comparison between arms is fairer than the absolute numbers.", ""]
    if doc.get("note"):
        L += [doc["note"], ""]
    L += ["Values: median over rounds [min-max]. Decode tok/s is the wall clock of `Engine.generate` minus its "
          "prefill (so proposing, gating, picking and the MTP head's drafts are counted); the engine's own "
          "forward-only figure is in the JSON (`tok_s_forward_only`).", ""]

    if "s3" in doc:
        s3 = doc["s3"]
        L += ["## Issue 3: forced accept / reject on the mid-size model", "",
              f"{doc['models']['mid-mtp']}; prompt {s3['prompt_len']} tokens, {s3['tokens']} generated tokens per run, "
              f"{doc['rounds']} rounds. Lookup source forced (`gate=False`), drafts from the plain run's ids.", "",
              "| arm | tokens/forward | forwards | decode tok/s | vs plain | ids = plain |", "|---|---|---|---|---|---|"]
        for a, r in s3["arms"].items():
            L.append(f"| {a} | {r['tokens_per_forward']:.2f} | {r['forwards']} | {fmt(r['tok_s'], 2)} | "
                     f"{fmt(r['speedup'], 2)} | {'yes' if r['same_ids_as_plain'] else '**NO**'} |")
        sl = s3["slots"]
        L += ["", "### Copy slots", "",
              f"One slot = the recurrent state and conv ring of {sl['linear_layers']} DeltaNet layers, "
              f"{sl['slot_bytes'] / 2**20:.2f} MiB. A verify of M rows writes M-1 slots (after every row but the last); "
              "the undo is a pointer swap.", "",
              f"- One slot copied on its own (`copy_` of every layer's tensors): **{fmt(sl['copy_one_slot_s'], 3, 1e3)} ms**.",
              "", "| M rows | forward with slots ms | without ms | (with - without)/(M-1) ms per row |",
              "|---|---|---|---|"]
        for mm, r in sl["by_rows"].items():
            L.append(f"| {mm} | {fmt(r['save_s'], 2, 1e3)} | {fmt(r['nosave_s'], 2, 1e3)} | "
                     f"{fmt(r['extra_per_slot_s'], 3, 1e3)} |")
        L.append("")

    if "s4" in doc:
        s4 = doc["s4"]
        L += ["## Issue 4: the MTP head's costs", ""]
        for name, r in s4["costs"].items():
            L += [f"### {name}: {doc['models'][name]}", "",
                  "| operation | ms | / plain step |", "|---|---|---|"]
            for a in r["seconds"]:
                L.append(f"| {a} | {fmt(r['seconds'][a], 3, 1e3)} | {fmt(r['vs_plain'][a], 3)} |")
            L.append("")
        if "vocab" in s4:
            r = s4["vocab"]
            L += [f"### The vocabulary list at a real model's size: {doc['models']['mid-mtp-v152k']}", "",
                  "Head draft (first row) scoring the whole vocabulary (`mtp_vocab 0`) or a list of the given size; "
                  "plain step of the same model for scale.", "",
                  "| operation | ms | / plain step |", "|---|---|---|"]
            for a in r["seconds"]:
                L.append(f"| {a} | {fmt(r['seconds'][a], 3, 1e3)} | {fmt(r['vs_plain'][a], 3)} |")
            L += ["", "Gathering the list's lm_head rows (once per list rebuild): " +
                  ", ".join(f"{n}: {s * 1e3:.1f} ms" for n, s in r["gather_s"].items()) + ".", ""]

    if "s5" in doc:
        s5 = doc["s5"]
        L += ["## Issue 5: the gate against every fixed depth (forced bernoulli:P, lookup source)", "",
              "Targets (the issue): the gate within 5% of the best fixed depth, and never below plain decoding by "
              "more than 2%. `fixedK`: `gate=False, lookup_drafts=K`; `gate`: `gate=True, lookup_drafts=5`, the "
              "engine's chain of gates (`Engine.keep_gate`: each gated run continues from the engine's last one: its measured T(n), rho "
              "and refresh counter, and its acceptance estimates worth a prior, docs/gate.md \"Across runs\"; the "
              "chain starts empty at the section's first gate run, P = 0.9 round 1, which is therefore cold, and it "
              "runs on through the P values in order, so the first round of each P starts from the previous P's "
              "estimates); `gate_cold`: the same with nothing measured at every run (what one CLI run gets); "
              "`gate_noobs`: `gate_cold` without free observations (`gate_observe=False`: only verifies feed the "
              "acceptance estimates, the public rules alone; docs/gate.md \"Free observations\"); "
              "`plain2`: plain again, the noise floor. Overhead: the decode loop's wall time outside the forwards "
              "(sampling, proposing, the gate), ms per token.", ""]
        for run in (s5["runs"] if "runs" in s5 else [s5]):
            L += _s5_run(run, doc)
    if "s5mtp" in doc:
        r = doc["s5mtp"]
        L += ["### The real (random) MTP head on the mid-size model", "",
              f"{r['tokens']} generated tokens per run, {r.get('rounds', doc['rounds'])} rounds, "
              f"{r.get('threads', doc['machine']['torch_threads'])} torch thread(s). A random head's drafts almost "
              "never stand, so this is "
              "the P ~ 0 case with the head's real draft costs. `mtp_auto_gate`: `mtp_drafts=0`, the gate picks 0..3 "
              "(the engine's chain of gates; `_cold`: nothing measured at every run); "
              "`mtp3_gate_pstep_*`: depth 3 with the gate, per-step depth off/on (at a fixed depth the drafter never "
              "asks the gate whether to draft at all; per-step depth keeps at least one draft).", "",
              "| arm | decode tok/s | vs plain | tokens/forward | drafts/verify | acceptance | ids = plain |",
              "|---|---|---|---|---|---|---|"]
        for a, x in r["arms"].items():
            L.append(f"| {a} | {fmt(x['tok_s'])} | {fmt(x['vs_plain'])} | {fmt(x['tokens_per_forward'])} | "
                     f"{fmt(x['drafts_per_verify'])} | {fmt(x['acceptance'])} | "
                     f"{'yes' if x['same_ids_as_plain'] else '**NO**'} |")
        L.append("")
    return "\n".join(L) + "\n"


def _s5_run(s5: dict, doc: dict) -> list[str]:
    L = [f"### {s5['tokens']} generated tokens per run", "",
         f"{s5.get('threads', doc['machine']['torch_threads'])} torch thread(s).", ""]
    verdicts = []
    for p, arms in s5["by_p"].items():
        m = s5.get("meta", {}).get(p)
        L += [f"#### P = {p}, {s5['tokens']} tokens", ""]
        if m:
            L += [f"Measured {m['date']} at {m['git']['head']}"
                  + (f" + uncommitted changes in {', '.join(m['git']['dirty'])}" if m['git']['dirty'] else "")
                  + f", {m['rounds']} rounds, load (1 min) after each run {m['load_range'][0]:.2f}-"
                  f"{m['load_range'][1]:.2f}; the `gate` chain started empty at P = {m['chain_from']} round 1.", ""]
        L += ["| arm | decode tok/s | vs plain | tokens/forward | drafts/verify | acceptance | verifies | probes | "
              "overhead ms/tok | ids = plain |", "|---|---|---|---|---|---|---|---|---|---|"]
        for a, r in arms.items():
            L.append(f"| {a} | {fmt(r['tok_s'])} | {fmt(r['vs_plain'])} | {fmt(r['tokens_per_forward'])} | "
                     f"{fmt(r['drafts_per_verify'])} | {fmt(r['acceptance'])} | {fmt(r.get('verifies'), 0)} | "
                     f"{fmt(r.get('probes'), 0)} | {fmt(r.get('outside_forward_ms_per_token'), 3)} | "
                     f"{'yes' if r['same_ids_as_plain'] else '**NO**'} |")
        best = max((a for a in arms if a.startswith("fixed")), key=lambda a: arms[a]["tok_s"]["median"])
        med = {a: arms[a]["tok_s"]["median"] for a in arms}

        def paired(a, b):        # median over rounds of the same round's ratio (robust to drifting load)
            return statistics.median(x["tok_s"] / y["tok_s"] for x, y in zip(arms[a]["runs"], arms[b]["runs"]))
        verdicts.append((p, best, {g: (med[g] / med[best], med[g] / med["plain"], paired(g, best), paired(g, "plain"))
                                   for g in ("gate", "gate_cold", "gate_noobs") if g in med},
                         (med["plain2"] / med["plain"], paired("plain2", "plain")) if "plain2" in med else None))
        L.append("")
    gates = [g for g in ("gate", "gate_cold", "gate_noobs") if g in verdicts[0][2]]
    L += [f"#### Against the targets, {s5['tokens']} tokens", "",
          "Ratio of the medians (best fixed: the highest median), then in parentheses the median over rounds of "
          "the same round's ratio; the verdict reads the ratio of the medians. `plain2 / plain` is the noise floor.",
          "", "| P | best fixed | " + " | ".join(f"{g} / best fixed | {g} / plain" for g in gates) + " | plain2 / plain |",
          "|---|---|" + "---|---|" * len(gates) + "---|"]
    for p, best, vs, noise in verdicts:
        cells = []
        for g in gates:
            gb, gp, pgb, pgp = vs[g]
            cells.append(f"{gb:.3f} ({pgb:.3f}) {'ok' if gb >= 0.95 else '**MISS**'} | "
                         f"{gp:.3f} ({pgp:.3f}) {'ok' if gp >= 0.98 else '**MISS**'}")
        L.append(f"| {p} | {best} | " + " | ".join(cells) + " | "
                 + ("-" if noise is None else f"{noise[0]:.3f} ({noise[1]:.3f})") + " |")
    L.append("")
    return L


def git_info() -> dict:
    def run(*a):
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = [ln[3:] for ln in run("status", "--porcelain", "--untracked-files=no").splitlines()
             if ln[3:].startswith("verispec/")]
    return {"head": run("rev-parse", "--short", "HEAD"), "dirty": dirty}


def describe(name: str) -> str:
    c = SPECS[name]
    return (f"`{name}` (hidden {c.get('hidden_size', 64)}, {c.get('num_layers', 4)} layers, "
            f"{c.get('num_experts', 4)} experts top-{c.get('top_k', 2)}, vocab {c.get('vocab_size', 1000)}, "
            f"weight_scale {c.get('weight_scale')}, random MTP head)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=32, help="generated tokens per run, section 3")
    ap.add_argument("--gate-tokens", default="256",
                    help="generated tokens per run, section 5 (a comma list: the bernoulli part once per length; "
                         "the MTP part at the longest)")
    ap.add_argument("--reps", type=int, default=5, help="timed calls per arm per round (micro timings)")
    ap.add_argument("--sections", default="3,4,5")
    ap.add_argument("--ps", default="0.9,0.6,0.3,0", help="P of the bernoulli arms ('': none, only the real head's)")
    ap.add_argument("--no-mtp-gate", action="store_true", help="skip the real MTP head arms of section 5")
    ap.add_argument("--fixed", default="", help="with --ps: the fixed depths to run at each P, e.g. '4,2,1,1' "
                    "(one per P; '' = every depth 1..5)")
    ap.add_argument("--no-noobs", action="store_true", help="skip section 5's gate_noobs arm")
    ap.add_argument("--lockstep", type=int, default=0, metavar="CHUNK",
                    help="section 5's bernoulli arms of a round decoded at once, CHUNK tokens of each in turn "
                         "(bench/lockstep.py; 0: one whole run after another)")
    ap.add_argument("--no-vocab", action="store_true", help="skip the 151936-vocabulary model (section 4)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 round, few tokens, output to /tmp")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quiet-load", type=float, default=1.5)
    ap.add_argument("--wait", type=float, default=480, help="seconds to wait for a quiet machine per section")
    ap.add_argument("--wait-total", type=float, default=900, help="seconds of waiting for all sections together")
    ap.add_argument("--update", action="store_true",
                    help="keep the sections of the existing --json-out that this run does not measure")
    ap.add_argument("--note", default="")
    ap.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "verispec-bench-models"))
    ap.add_argument("--json-out", default=None)
    ap.add_argument("--md-out", default=None)
    a = ap.parse_args()
    if a.quick:
        a.rounds, a.tokens, a.gate_tokens, a.reps, a.wait, a.wait_total = 1, 8, "12", 2, 0, 0
    gate_tokens = [int(t) for t in str(a.gate_tokens).split(",")]
    json_out = Path(a.json_out or (Path(tempfile.gettempdir()) / "spec_costs_quick.json" if a.quick
                                   else ROOT / "bench" / "results" / "spec_costs.json"))
    md_out = Path(a.md_out or (Path(tempfile.gettempdir()) / "spec_costs_quick.md" if a.quick
                               else ROOT / "docs" / "benchmarks-spec.md"))
    torch.set_num_threads(a.threads)
    sections = set(a.sections.split(","))
    cache = Path(a.cache)
    names = ["mid-mtp"] + (["fixture-mtp"] if "4" in sections else []) + \
        (["mid-mtp-v152k"] if "4" in sections and not a.no_vocab else [])
    paths = {n: build(n, cache) for n in names}         # before any clock: making models is slow
    command = "python bench/spec_costs.py " + " ".join(sys.argv[1:])
    doc = {"command": command, "machine": machine(),
           "git": git_info(), "date": time.strftime("%Y-%m-%d %H:%M"), "note": a.note, "rounds": a.rounds,
           "reps": a.reps, "quiet_load": a.quiet_load, "wait_s": a.wait, "sections": [],
           "models": {n: describe(n) for n in names}, "load_start": list(os.getloadavg())}
    if a.update and json_out.exists():
        # keep the sections of an earlier run that this one does not measure again
        old = json.loads(json_out.read_text())
        old_cmds = old["command"] if isinstance(old["command"], list) else [old["command"]]
        for key in ("s3", "s4", "s5", "s5mtp"):
            if key in old and key not in doc:
                doc[key] = old[key]
        doc["sections"] = old["sections"]          # this run's sections are appended
        doc["models"] = {**old["models"], **doc["models"]}
        doc["command"] = old_cmds + [command]
        doc["load_start"] = old["load_start"]
        doc["date"] = old["date"] + " and " + doc["date"]
    q = Quiet(a.quiet_load, a.wait, doc["sections"], a.wait_total)

    def save():
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(doc, indent=1, default=str) + "\n")
        md_out.parent.mkdir(parents=True, exist_ok=True)
        md_out.write_text(markdown(doc))

    with torch.no_grad():
        eng = Engine(paths["mid-mtp"])
        if "3" in sections:
            with q.section("3 forced accept/reject + copy slots"):
                doc["s3"] = section3(eng, a.rounds, a.tokens, a.reps)
            save()
        if "5" in sections:
            # with --update, runs of other lengths measured earlier are kept (new format only)
            # with --update, what was measured before at other lengths, or at other P of the same length, stays
            old_runs = {r["tokens"]: r for r in doc.get("s5", {}).get("runs", [])}
            doc["s5"] = {"runs": sorted(old_runs.values(), key=lambda r: r["tokens"])}
            ps = tuple(float(p) for p in a.ps.split(",") if p.strip())
            for n in (gate_tokens if ps else ()):     # --ps '': only the real MTP head's arms
                with q.section(f"5 gate vs fixed depths (bernoulli), {n} tokens"):
                    fixed = ({p: (int(k),) for p, k in zip(ps, a.fixed.split(","))} if a.fixed else None)
                    run = section5(eng, a.rounds, n, ps, fixed, noobs=not a.no_noobs, chunk=a.lockstep)
                stamp = time.strftime("%Y-%m-%d %H:%M")
                run["meta"] = {}
                for p, arms in run["by_p"].items():
                    loads = [x["load1"] for r in arms.values() for x in r["runs"]]
                    run["meta"][p] = {"date": stamp, "git": doc["git"], "load_range": [min(loads), max(loads)],
                                      "rounds": a.rounds, "chain_from": str(ps[0])}
                old = old_runs.get(n)
                if old is not None and "meta" in old:
                    merged = {p: old["by_p"][p] for p in old["by_p"] if p not in run["by_p"]}
                    merged.update(run["by_p"])
                    meta = {p: old["meta"][p] for p in merged if p not in run["by_p"]}
                    meta.update(run["meta"])
                    order = sorted(merged, key=float, reverse=True)
                    run["by_p"] = {p: merged[p] for p in order}
                    run["meta"] = {p: meta[p] for p in order}
                old_runs[n] = run
                doc["s5"]["runs"] = sorted(old_runs.values(), key=lambda r: r["tokens"])
                save()
            if not a.no_mtp_gate:
                with q.section("5 real MTP head, gate, per-step depth"):
                    doc["s5mtp"] = section5_mtp(eng, a.rounds, max(gate_tokens))
                save()
        if "4" in sections:
            doc["s4"] = {"costs": {}}
            with q.section("4 MTP head costs, mid"):
                doc["s4"]["costs"]["mid-mtp"] = section4_costs(eng, a.rounds, a.reps * 2)
            del eng
            gc.collect()
            fx = Engine(paths["fixture-mtp"])
            with q.section("4 MTP head costs, fixture"):
                doc["s4"]["costs"]["fixture-mtp"] = section4_costs(fx, a.rounds, a.reps * 4)
            del fx
            save()
            if not a.no_vocab:
                big = Engine(paths["mid-mtp-v152k"])
                with q.section("4 vocabulary list, 151936 vocab"):
                    doc["s4"]["vocab"] = section4_vocab(big, a.rounds, a.reps * 2)
                del big
                gc.collect()
        else:
            del eng
    doc["load_end"] = list(os.getloadavg())
    save()
    print(markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
