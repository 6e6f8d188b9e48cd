"""Forced draft modes for tests and benchmarks (DESIGN.md section 7, test-matrix.md).

Drafts are the reference run's own next tokens, spoiled on purpose; a spoiled draft is
(true token + 1) mod vocab. `verify` counts the verifies this source's drafts went into,
so mixed / cycle can depend on it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from ..errors import UsageError

MODES = ("accept", "reject", "mixed", "cycle", "row", "bernoulli")


@dataclass(frozen=True)
class ForceMode:
    kind: str               # one of MODES
    row: int = 0            # for rowN: the 1-based wrong draft
    p: float = 1.0          # for bernoulli:P
    ps: tuple = ()          # for bernoulli:P1,P2,..: draft j stands with probability P_j (the last repeats)

    @staticmethod
    def parse(text: str) -> "ForceMode":
        t = text.strip().lower()
        if t in ("accept", "reject", "mixed", "cycle"):
            return ForceMode(t)
        if t.startswith("row") and t[3:].isdigit() and int(t[3:]) >= 1:
            return ForceMode("row", row=int(t[3:]))
        if t.startswith("bernoulli:"):
            try:
                ps = tuple(float(x) for x in t.split(":", 1)[1].split(","))
            except ValueError:
                ps = (-1.0,)
            if all(0.0 <= p <= 1.0 for p in ps):
                return ForceMode("bernoulli", p=ps[0], ps=ps if len(ps) > 1 else ())
        raise UsageError(f"--force {text!r}: expected accept, reject, mixed, cycle, rowN (N >= 1), bernoulli:P "
                         "or bernoulli:P1,P2,... (each 0 <= P <= 1; draft j stands with P_j, the last repeating)")


class ForcedSource:
    def __init__(self, mode: ForceMode, reference: list[int], prompt_len: int, vocab: int, seed: int = 0,
                 name: str = "lookup", max_drafts: int = 5):
        self.name = name
        self.max_drafts = max_drafts
        self.mode = mode
        self.full = reference          # prompt + the reference's generated ids
        self.prompt_len = prompt_len
        self.vocab = vocab
        self.verifies = 0
        self.rng = random.Random(seed)
        self.obs_rng = random.Random(seed + 1)    # observed_draft's own coins: spoil's stay as they were

    def propose(self, tokens: list[int], tok: int, max_k: int) -> list[int]:
        """tokens: every token fed so far; tok: the token just picked."""
        n = len(tokens) + 1
        max_k = min(max_k, self.max_drafts)
        if max_k <= 0 or n > len(self.full) or tok != self.full[n - 1]:
            return []   # off the reference: nothing to force
        return list(self.full[n:n + max_k])

    def spoil(self, drafts: list[int]) -> list[int]:
        """Called once per verify that carries these drafts."""
        k = len(drafts)
        v = self.verifies
        self.verifies += 1
        m = self.mode
        if m.kind == "accept":
            wrong = set()
        elif m.kind == "reject":
            wrong = set(range(1, k + 1))
        elif m.kind == "mixed":
            wrong = {1} if v % 2 == 1 else set()
        elif m.kind == "row":
            wrong = {m.row}
        elif m.kind == "cycle":
            wrong = {v % (k + 1) + 1}
        else:
            ps = m.ps or (m.p,)
            wrong = {j + 1 for j in range(k) if self.rng.random() >= ps[min(j, len(ps) - 1)]}
        return [(d + 1) % self.vocab if (j + 1) in wrong else d for j, d in enumerate(drafts)]

    def observed_draft(self, position: int, draft: int) -> int | None:
        """The draft at 0-based `position` that no verify carried, as this mode would have
        spoiled it (so the decoder's free observation sees what a verify would have), or None
        where the mode's spoiling depends on the verify (mixed, cycle)."""
        m = self.mode
        if m.kind == "accept":
            return draft
        if m.kind == "reject":
            return (draft + 1) % self.vocab
        if m.kind == "row":
            return (draft + 1) % self.vocab if position + 1 == m.row else draft
        if m.kind == "bernoulli":
            ps = m.ps or (m.p,)
            stands = self.obs_rng.random() < ps[min(position, len(ps) - 1)]
            return draft if stands else (draft + 1) % self.vocab
        return None
