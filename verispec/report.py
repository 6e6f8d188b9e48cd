"""The stderr report lines (never stdout, never the wire)."""

from __future__ import annotations


def _pct(a: int, b: int) -> str:
    return f"{100.0 * a / b:.1f}%" if b else "n/a"


def report_lines(stats: dict, *, gate_on: bool, gate_describe: str | None = None) -> list[str]:
    lines = []
    tokens, forwards = stats["tokens"], stats["forwards"]
    tpf = tokens / forwards if forwards else 0.0
    gate = stats.get("gate", {})
    for name, s in sorted(stats["by_source"].items()) or [("lookup", None)]:
        if s is None:
            if not gate.get("declined") and not stats.get("declined"):
                break
            s = {"drafts": 0, "accepted": 0, "verifies": 0}
        parts = [
            f"[verispec {name}] run: {tpf:.2f} tokens/forward ({forwards} forwards per {tokens} tokens)",
            f"acceptance {_pct(s['accepted'], s['drafts'])} ({s['accepted']}/{s['drafts']} drafts in {s['verifies']} verifies)",
        ]
        probes = gate.get("sources", {}).get(name, {}).get("probes", 0)
        parts.append(f"gate {'on' if gate_on else 'off'}, {stats['declined']} declined, {probes} probes"
                     if gate_on else "gate off")
        if stats.get("ended_mid_verify"):
            parts.append("ended mid-verify")
        lines.append(" | ".join(parts))
    if gate_on and gate_describe:
        lines.append(gate_describe)
    lines.append(
        f"[verispec] {stats['generated']} tokens | prompt {stats['prompt_tokens']} tokens, "
        f"prefill {stats['prefill_tok_s']:.1f} tok/s | decode {stats['decode_tok_s']:.2f} tok/s "
        f"({forwards} forwards, {stats['verifies']} verifies, {stats['drafts']} drafts, {stats['accepted']} accepted)"
    )
    return lines
