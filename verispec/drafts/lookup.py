"""Prompt lookup: propose the tokens that followed the last n-gram's most recent earlier occurrence.

The rule (reference/gate-rules.md "Lookup"): for n from n_max down to n_min, the last n
tokens of the history are the suffix; scan earlier start positions from the most recent to
the oldest; the first match wins and the proposal is up to `max_drafts` tokens that
followed it, stopping at the end of the history. An occurrence needs at least one token
after it and may overlap the suffix, so periodic histories work.

    history  = [7, 1, 2, 3, 9, 1, 2, 3]      suffix (n=3) = (1, 2, 3)
    earlier occurrences of (1, 2, 3): start 1 (ends at 4)
    proposal = history[4:4 + 5] = [9, 1, 2, 3]

`lookup_bruteforce` is that scan, O(len) per call; `PromptLookup` keeps an index so a
proposal costs O(n_max - n_min + 1) and an append O(n_max - n_min + 1), with identical
proposals (tests/test_lookup.py checks them against each other).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def lookup_bruteforce(history: Sequence[int], max_drafts: int, n_min: int = 2, n_max: int = 4) -> list[int]:
    """The reference scan. Returns up to `max_drafts` proposed tokens ([] when nothing matches)."""
    length = len(history)
    if max_drafts < 1:
        return []
    for n in range(n_max, n_min - 1, -1):
        if n > length - 1:          # no start s with 0 <= s < length - n
            continue
        suffix = list(history[length - n:])
        for start in range(length - n - 1, -1, -1):   # most recent earlier start first
            if list(history[start:start + n]) == suffix:
                end = start + n                         # < length: at least one token follows
                return [int(t) for t in history[end:end + max_drafts]]
    return []


class PromptLookup:
    """Incremental prompt lookup over a growing (and sometimes shrinking) token history.

    Index: n-gram tuple -> end positions (exclusive) of its occurrences, oldest first, for
    every n in n_min..n_max. The suffix of length n always occurs last (it ends at len), so
    its most recent *earlier* occurrence is the second-to-last entry; that entry ends before
    len, so at least one token follows it, and it may overlap the suffix.
    """

    def __init__(self, max_drafts: int = 5, n_min: int = 2, n_max: int = 4):
        if max_drafts < 1:
            raise ValueError(f"max_drafts must be >= 1, got {max_drafts}")
        if not 1 <= n_min <= n_max:
            raise ValueError(f"need 1 <= n_min <= n_max, got n_min={n_min} n_max={n_max}")
        self.max_drafts = max_drafts
        self.n_min = n_min
        self.n_max = n_max
        self._history: list[int] = []
        self._ends: dict[tuple[int, ...], list[int]] = {}

    def __len__(self) -> int:
        return len(self._history)

    @property
    def history(self) -> list[int]:
        return list(self._history)

    def reset(self) -> None:
        self._history.clear()
        self._ends.clear()

    def append(self, tok: int) -> None:
        h = self._history
        h.append(int(tok))
        end = len(h)
        for n in range(self.n_min, min(self.n_max, end) + 1):
            key = tuple(h[end - n:end])
            ends = self._ends.get(key)
            if ends is None:
                self._ends[key] = [end]
            else:
                ends.append(end)

    def extend(self, tokens: Iterable[int]) -> None:
        for tok in tokens:
            self.append(tok)

    def truncate(self, n: int) -> None:
        """Keep the first `n` tokens. Costs O(tokens removed); rebuilds when most of the history goes."""
        if n < 0:
            raise ValueError(f"cannot truncate to {n} tokens")
        h = self._history
        if n >= len(h):
            return
        if n < (len(h) - n):      # removing more than is kept: rebuilding is cheaper
            kept = h[:n]
            self.reset()
            self.extend(kept)
            return
        for end in range(len(h), n, -1):      # newest first, so each end is its list's last entry
            for m in range(self.n_min, min(self.n_max, end) + 1):
                key = tuple(h[end - m:end])
                ends = self._ends[key]
                ends.pop()
                if not ends:
                    del self._ends[key]
        del h[n:]

    def propose(self, max_drafts: int | None = None) -> list[int]:
        k = self.max_drafts if max_drafts is None else max_drafts
        if k < 1:
            return []
        h = self._history
        length = len(h)
        for n in range(min(self.n_max, length), self.n_min - 1, -1):
            ends = self._ends.get(tuple(h[length - n:]))
            if ends is not None and len(ends) >= 2:
                end = ends[-2]
                return h[end:end + k]
        return []
