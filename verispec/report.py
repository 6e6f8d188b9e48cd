"""The stderr report lines (never stdout, never the wire), e.g.

[verispec lookup] run: 1.56 tokens/forward (102 forwards per 159 tokens) | acceptance 85.1% (57/67 drafts in 64 verifies) | gate on, 32 declined, 5 probes
[verispec MTP] run: 2.75 tokens/forward (36 forwards per 99 tokens) | acceptance 90.0% (63/70 drafts) | wiring post-norm | fixed depth, by position: 1 97.1% (34/35) 2 82.9% (29/35)
"""

from __future__ import annotations

from .drafts.vocab import report_line as vocab_line

_LABEL = {"mtp": "MTP", "lookup": "lookup"}


def _pct(a: int, b: int) -> str:
    return f"{100.0 * a / b:.1f}%" if b else "n/a"


def _source_line(name: str, s: dict, stats: dict, gate: dict, gate_on: bool) -> str:
    tokens, forwards = stats["tokens"], stats["forwards"]
    tpf = tokens / forwards if forwards else 0.0
    parts = [f"[verispec {_LABEL.get(name, name)}] run: {tpf:.2f} tokens/forward ({forwards} forwards per {tokens} tokens)",
             f"acceptance {_pct(s['accepted'], s['drafts'])} ({s['accepted']}/{s['drafts']} drafts in {s['verifies']} verifies)"]
    g = gate.get("sources", {}).get(name, {})
    if name == "mtp":
        mtp = stats.get("mtp", {})
        wiring = mtp.get("wiring", "post")
        parts.append(f"wiring {wiring}-norm" if wiring in ("post", "pre") else f"wiring {wiring}")
        depth = mtp.get("depth")
        kind = "gate's depth" if depth == 0 else "fixed depth"
        pos = [f"{j + 1} {_pct(s['accepted_by_position'][j], s['proposed_by_position'][j])} "
               f"({s['accepted_by_position'][j]}/{s['proposed_by_position'][j]})"
               for j in range(8) if s["proposed_by_position"][j]]
        parts.append(f"{kind}, by position: " + " ".join(pos) if pos else kind)
    if gate_on:
        parts.append(f"gate on, {g.get('declined', 0)} declined, {g.get('probes', 0)} probes")
    else:
        parts.append("gate off")
    if stats.get("ended_mid_verify"):
        parts.append("ended mid-verify")
    return " | ".join(parts)


def report_lines(stats: dict, *, gate_on: bool) -> list[str]:
    gate = stats.get("gate", {})
    lines = []
    names = set(stats["by_source"]) | {n for n, g in gate.get("sources", {}).items() if g.get("declined")}
    empty = {"drafts": 0, "accepted": 0, "verifies": 0, "proposed_by_position": [0] * 8,
             "accepted_by_position": [0] * 8}
    for name in sorted(names):
        lines.append(_source_line(name, stats["by_source"].get(name, empty), stats, gate, gate_on))
    if "vocab" in stats:
        lines.append("[verispec MTP] " + vocab_line(stats["vocab"]))
    if gate_on and stats.get("gate_line") and (stats["verifies"] or stats["declined"]):
        lines.append(stats["gate_line"])
    lines.append(
        f"[verispec] {stats['generated']} tokens | prompt {stats['prompt_tokens']} tokens, "
        f"prefill {stats['prefill_tok_s']:.1f} tok/s | decode {stats['decode_tok_s']:.2f} tok/s "
        f"({stats['forwards']} forwards, {stats['verifies']} verifies, {stats['drafts']} drafts, "
        f"{stats['accepted']} accepted)")
    return lines
