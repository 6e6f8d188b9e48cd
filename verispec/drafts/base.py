"""One result type for every draft source."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Draft:
    ids: list[int]
    probs: list[float] | None = None   # per draft, for sources that can say how likely each is
