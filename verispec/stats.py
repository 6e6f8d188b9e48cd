"""One stats type for every report (the counts DESIGN.md section 3 defines)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SourceStats:
    verifies: int = 0
    drafts: int = 0
    accepted: int = 0
    proposed_at: list[int] = field(default_factory=lambda: [0] * 8)   # carried, by draft position
    accepted_at: list[int] = field(default_factory=lambda: [0] * 8)

    def as_dict(self) -> dict:
        return {"verifies": self.verifies, "drafts": self.drafts, "accepted": self.accepted,
                "proposed_by_position": list(self.proposed_at), "accepted_by_position": list(self.accepted_at)}


@dataclass
class DecodeStats:
    tokens: int = 0            # decode tokens fed after the prompt (rows that stood)
    forwards: int = 0          # decode forwards (plain steps and verifies)
    plain_steps: int = 0
    verifies: int = 0
    drafts: int = 0
    accepted: int = 0
    declined: int = 0          # proposals the gate carried none of
    slot_alloc_failures: int = 0
    ended_mid_verify: bool = False
    prompt_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    by_source: dict[str, SourceStats] = field(default_factory=dict)

    def source(self, name: str) -> SourceStats:
        return self.by_source.setdefault(name, SourceStats())

    def as_dict(self) -> dict:
        d = {k: v for k, v in vars(self).items() if k != "by_source"}
        d["by_source"] = {k: v.as_dict() for k, v in self.by_source.items()}
        d["proposed_by_position"] = [sum(s.proposed_at[j] for s in self.by_source.values()) for j in range(8)]
        d["accepted_by_position"] = [sum(s.accepted_at[j] for s in self.by_source.values()) for j in range(8)]
        return d
