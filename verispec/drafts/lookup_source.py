"""Prompt lookup as a decoder draft source (the index lives in drafts/lookup.py)."""

from __future__ import annotations

from .lookup import PromptLookup


class LookupSource:
    name = "lookup"

    def __init__(self, max_drafts: int = 5):
        self.max_drafts = max_drafts
        self.index = PromptLookup(max_drafts=max_drafts)
        self.history: list[int] = []   # mirror of what the index holds

    def sync(self, tokens: list[int]) -> None:
        """Match the index to `tokens` (after an undo, a prefix reuse or a new prompt)."""
        n = 0
        limit = min(len(tokens), len(self.history))
        while n < limit and tokens[n] == self.history[n]:
            n += 1
        if n < len(self.history):
            self.index.truncate(n)
            del self.history[n:]
        self._extend(tokens[n:])

    def _extend(self, new: list[int]) -> None:
        if new:
            self.index.extend(new)
            self.history.extend(new)

    def propose(self, tokens: list[int], tok: int, max_k: int) -> list[int]:
        if max_k <= 0:
            return []
        # Between two proposals the history (tokens + [tok]) only grows: the previous pick
        # always stands, so only its new tail is added; prefill and undo call sync.
        if len(self.history) > len(tokens):
            self.sync(tokens + [tok])
        else:
            self._extend(tokens[len(self.history):] + [tok])
        return self.index.propose(min(max_k, self.max_drafts))
