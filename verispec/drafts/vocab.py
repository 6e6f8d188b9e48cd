"""The MTP head's vocabulary list: the tokens a head draft scores, from persisted usage counts.

The rule (the seed, "For a draft the head scores a list of tokens"): the list holds

  * the `top_n` most-counted tokens (ties: the lower id first; only tokens with a count > 0),
  * every token counted at least 3/4 of the `top_n`-th of those (`4 * count >= 3 * c_N`;
    when fewer than `top_n` tokens have a count > 0 there is no N-th and this adds nothing),
  * every token of the current conversation.

With all counts 0 the list is just the conversation's tokens. Every prompt token counted (the
caller passes only the part past a prefix-cache restore) and every picked token adds 1 to its
count; ALL counts halve (floor) every `halve_every` counted tokens, prompt and picks together
(the halving lands right after the `halve_every`-th token's +1). The list is rebuilt when a
request starts and at every halving; between rebuilds it only grows: a picked token missing
from it joins at once (counted in `appended`), and so does a counted prompt token (it joins
the conversation, and the conversation is always in the list). So at every moment

    list == rule(counts at the last rebuild) | conversation tokens

which tests/test_vocab.py checks against a brute-force recomputation.

Since every token counted exactly c_N passes the 3/4 test, the tie-break inside the top N never
changes the set; the list is `{count > 0 and 4*count >= 3*c_N} | conversation`. `ids()` gives
the list in ascending id order, so an argmax over the list breaks ties like an argmax over the
whole vocabulary (lowest id). The output never depends on the list: the verify checks every
token, and a missing token can only turn an accepted draft into a rejected one.

`top_n == 0` scores the whole vocabulary (`ids()` is None); counting and the file go on.

Counts file (little-endian throughout):

    offset  size  field
    0       8     magic b"VSVOCAB\\0"
    8       4     format version, uint32 (1)
    12      4     vocabulary size, uint32
    16      4     tokens counted since the last halving, uint32 (the halving phase carries over)
    20      4     number of records R, uint32
    24      8*R   records: id uint32, count uint32, for the nonzero counts in ascending id order

A file is damaged or foreign when it is shorter than the header, has another magic or version,
another vocabulary size, a record count that does not match its length (a truncated or partial
last record, or trailing bytes), an id out of range or repeated. `load()` then keeps the counts
it had, prints one line to stderr and `save()` never replaces that file. `save()` writes a
temporary file in the same directory and `os.replace`s it, so a reader sees the old file or the
new one, never half of one.
"""

from __future__ import annotations

import hashlib
import os
import struct
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch

import verispec

MAGIC = b"VSVOCAB\0"
VERSION = 1
_HEADER = struct.Struct("<8sIIII")          # magic, version, vocab_size, since_halving, records
_RECORD = np.dtype([("id", "<u4"), ("count", "<u4")])
_U32_MAX = 2**32 - 1
FILE_NAME = "vocab_usage.bin"


class VocabList:
    """The head's vocabulary list and the usage counts it is built from."""

    def __init__(self, vocab_size: int, top_n: int = 16000, halve_every: int = 1024):
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
        if top_n < 0:
            raise ValueError(f"top_n must be >= 0 (0 = whole vocabulary), got {top_n}")
        if halve_every < 1:
            raise ValueError(f"halve_every must be >= 1, got {halve_every}")
        self.vocab_size = vocab_size
        self.top_n = top_n
        self.halve_every = halve_every
        self._counts = np.zeros(vocab_size, dtype=np.int64)       # [vocab]
        self._since_halving = 0
        self._conversation = np.zeros(vocab_size, dtype=bool)     # [vocab]
        self._in_list = np.zeros(vocab_size, dtype=bool)          # [vocab]; unused when top_n == 0
        self._ids: torch.Tensor | None = None                     # cache of flatnonzero(_in_list)
        self._refused: set[Path] = set()                          # paths load() found damaged
        # stats
        self._drafts = 0
        self._list_size_sum = 0
        self._picks = 0
        self._picks_in_list = 0
        self._appended = 0
        self._rebuilds = 0
        self._halvings = 0
        self._counted = 0

    # --- the list ------------------------------------------------------------------------

    @property
    def whole_vocabulary(self) -> bool:
        return self.top_n == 0

    def _rule_mask(self) -> np.ndarray:
        """The seed's rule read literally: the top_n most counted tokens, plus every token
        counted at least 3/4 of the top_n-th count. While fewer than top_n tokens have been
        counted the top_n-th count is 0, so every token qualifies: a fresh list (no counts
        file yet) is the whole vocabulary, not just the handful of tokens seen so far."""
        counts = self._counts
        if self.top_n >= self.vocab_size:
            return np.ones(self.vocab_size, dtype=bool)
        c_n = int(np.partition(counts, self.vocab_size - self.top_n)[self.vocab_size - self.top_n])
        return 4 * counts >= 3 * c_n     # c_n == 0: every token

    def _rebuild(self, *, counted_as_rebuild: bool = True) -> None:
        if self.whole_vocabulary:
            return
        self._in_list = self._rule_mask() | self._conversation
        self._ids = None
        if counted_as_rebuild:
            self._rebuilds += 1

    def _join(self, toks: np.ndarray) -> None:
        """Tokens join the conversation and, at once, the list."""
        self._conversation[toks] = True
        if self.whole_vocabulary:
            return
        if not self._in_list[toks].all():
            self._in_list[toks] = True
            self._ids = None

    def ids(self) -> torch.Tensor | None:
        """int64 ids of the list in ascending order (None = whole vocabulary); cached."""
        if self.whole_vocabulary or self._in_list.all():
            return None      # the list is every token: score the lm_head as it is, no gathered copy
        if self._ids is None:
            self._ids = torch.from_numpy(np.flatnonzero(self._in_list).astype(np.int64))
        return self._ids

    def contains(self, tok: int) -> bool:
        self._check(tok)
        return self.whole_vocabulary or bool(self._in_list[tok])

    def list_size(self) -> int:
        return self.vocab_size if self.whole_vocabulary else int(self._in_list.sum())

    # --- counting ------------------------------------------------------------------------

    def _check(self, tok: int) -> None:
        if not 0 <= tok < self.vocab_size:
            raise ValueError(f"token id {tok} outside the vocabulary [0, {self.vocab_size})")

    def _as_ids(self, ids: Iterable[int]) -> np.ndarray:
        if isinstance(ids, torch.Tensor):
            arr = ids.detach().cpu().reshape(-1).numpy().astype(np.int64)
        else:
            arr = np.fromiter((int(t) for t in ids), dtype=np.int64)
        if arr.size and (arr.min() < 0 or arr.max() >= self.vocab_size):
            bad = int(arr.min()) if arr.min() < 0 else int(arr.max())
            raise ValueError(f"token id {bad} outside the vocabulary [0, {self.vocab_size})")
        return arr

    def start_request(self, conversation: Iterable[int]) -> None:
        """A request starts: its tokens replace the previous conversation's; the list is rebuilt."""
        toks = self._as_ids(conversation)
        self._conversation[:] = False
        self._conversation[toks] = True
        self._rebuild()

    def count_prompt(self, ids: Iterable[int]) -> None:
        """+1 for every prompt token read (only the part past a prefix-cache restore)."""
        toks = self._as_ids(ids)
        self._join(toks)
        start = 0
        while start < toks.size:
            # count up to the next halving point, halve there, go on
            room = max(self.halve_every - self._since_halving, 1)
            chunk = toks[start:start + room]
            np.add.at(self._counts, chunk, 1)
            self._advance(chunk.size)
            start += chunk.size

    def count_pick(self, tok: int) -> None:
        """+1 for a picked token; a pick missing from the list joins it at once."""
        tok = int(tok)
        self._check(tok)
        self._picks += 1
        self._conversation[tok] = True
        if self.whole_vocabulary or self._in_list[tok]:
            self._picks_in_list += 1
        else:
            self._in_list[tok] = True
            self._ids = None
            self._appended += 1
        self._counts[tok] += 1
        self._advance(1)

    def _advance(self, n: int) -> None:
        self._counted += n
        self._since_halving += n
        if self._since_halving >= self.halve_every:
            self._counts //= 2
            self._since_halving = 0
            self._halvings += 1
            self._rebuild()

    def counts(self) -> np.ndarray:
        """A copy of the counts, [vocab] int64."""
        return self._counts.copy()

    # --- stats ---------------------------------------------------------------------------

    def note_draft(self) -> None:
        """Once per draft the head scores with the list (for the average list size)."""
        self._drafts += 1
        self._list_size_sum += self.list_size()

    def stats(self) -> dict:
        return {
            "avg_list_size": self._list_size_sum / self._drafts if self._drafts else 0.0,
            "picks": self._picks,
            "picks_in_list": self._picks_in_list,
            "share_in_list": self._picks_in_list / self._picks if self._picks else 0.0,
            "appended": self._appended,
            "rebuilds": self._rebuilds,
            "halvings": self._halvings,
            "counted": self._counted,
        }

    # --- the counts file -----------------------------------------------------------------

    def _parse(self, data: bytes) -> tuple[np.ndarray, int] | str:
        """(counts, since_halving) or the reason the bytes are not our counts."""
        if len(data) < _HEADER.size:
            return f"{len(data)} bytes, shorter than the {_HEADER.size}-byte header"
        magic, version, vocab, since, n_rec = _HEADER.unpack_from(data)
        if magic != MAGIC:
            return "not a verispec counts file (bad magic)"
        if version != VERSION:
            return f"format version {version}, expected {VERSION}"
        if vocab != self.vocab_size:
            return f"counts for a vocabulary of {vocab}, this model has {self.vocab_size}"
        body = len(data) - _HEADER.size
        if body != n_rec * _RECORD.itemsize:
            return (f"header says {n_rec} records, the file holds {body} bytes of records "
                    f"(ends on a damaged record)")
        rec = np.frombuffer(data, dtype=_RECORD, count=n_rec, offset=_HEADER.size)
        ids = rec["id"].astype(np.int64)
        if ids.size and int(ids.max()) >= vocab:
            return f"id {int(ids.max())} out of range for a vocabulary of {vocab}"
        if np.unique(ids).size != ids.size:
            return "an id has more than one record"
        counts = np.zeros(vocab, dtype=np.int64)
        counts[ids] = rec["count"].astype(np.int64)
        return counts, int(since)

    def _warn_refused(self, path: Path, why: str) -> None:
        print(f"[verispec MTP] vocab counts {path}: {why}; not replaced", file=sys.stderr)
        self._refused.add(_key(path))

    def load(self, path) -> bool:
        """Read counts from `path`. True when counts were read; a missing file is fresh counts."""
        path = Path(path)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return False
        except OSError as e:
            self._warn_refused(path, f"cannot read ({e.strerror or e})")
            return False
        parsed = self._parse(data)
        if isinstance(parsed, str):
            self._warn_refused(path, parsed)
            return False
        self._counts, self._since_halving = parsed
        self._rebuild(counted_as_rebuild=False)
        return True

    def to_bytes(self) -> bytes:
        ids = np.flatnonzero(self._counts)
        rec = np.empty(ids.size, dtype=_RECORD)
        rec["id"] = ids
        rec["count"] = np.minimum(self._counts[ids], _U32_MAX)
        since = min(self._since_halving, _U32_MAX)
        return _HEADER.pack(MAGIC, VERSION, self.vocab_size, since, ids.size) + rec.tobytes()

    def save(self, path) -> bool:
        """Write the counts atomically. Never raises; True when written."""
        path = Path(path)
        if _key(path) in self._refused:
            return False                # load() said why, once
        # a file we never read (no load(), or another writer since) is replaced only if it is ours
        try:
            existing = path.read_bytes()
        except OSError as e:
            if os.path.lexists(path):   # there but unreadable (or a directory): not ours to replace
                self._warn_refused(path, f"cannot read ({e.strerror or e})")
                return False
            existing = None
        if existing is not None:
            parsed = self._parse(existing)
            if isinstance(parsed, str):
                self._warn_refused(path, parsed)
                return False
        tmp = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            with os.fdopen(fd, "wb") as f:
                f.write(self.to_bytes())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            tmp = None
            return True
        except OSError as e:
            print(f"[verispec MTP] vocab counts {path}: cannot write ({e.strerror or e}); "
                  f"counts not saved", file=sys.stderr)
            return False
        finally:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass


def _key(path: Path) -> Path:
    try:
        return path.resolve()
    except OSError:
        return path.absolute()


def _state_dir() -> Path:
    # XDG base directory spec: a relative or empty XDG_STATE_HOME is ignored
    xdg = os.environ.get("XDG_STATE_HOME", "")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".local" / "state"
    return base / "verispec"


def usage_path(model_dir: Path, explicit: str | None) -> Path:
    """Where the counts file lives.

    `explicit` if given; else <model_dir>/vocab_usage.bin when the model directory is writable
    and not inside the installed verispec package; else
    $XDG_STATE_HOME/verispec/<sha256(resolved model dir)[:16]>/vocab_usage.bin
    (XDG_STATE_HOME defaults to ~/.local/state).
    """
    if explicit:
        return Path(explicit).expanduser()
    model_dir = Path(model_dir).resolve()
    package = Path(verispec.__file__).resolve().parent
    inside_package = model_dir == package or package in model_dir.parents
    if not inside_package and model_dir.is_dir() and os.access(model_dir, os.W_OK | os.X_OK):
        return model_dir / FILE_NAME
    digest = hashlib.sha256(str(model_dir).encode()).hexdigest()[:16]
    return _state_dir() / digest / FILE_NAME


def report_line(stats: dict) -> str:
    """e.g. `vocab list: avg 16211 ids, 98.7% of picks inside, 12 appended, 3 rebuilds`."""
    return (f"vocab list: avg {stats['avg_list_size']:.0f} ids, "
            f"{100.0 * stats['share_in_list']:.1f}% of picks inside, "
            f"{stats['appended']} appended, {stats['rebuilds']} rebuilds")
