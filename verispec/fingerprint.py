"""A checkpoint's fingerprint: which weights a `--json` run came from, so that a `--reference` made
with another model is refused instead of silently forcing drafts that no verify accepts.

Hashing every byte would read tens of GB; the fingerprint hashes config.json, each safetensors
file's name, size and header (names, shapes, dtypes, offsets), and SAMPLE bytes at three places of
its data (start, middle, end). Two checkpoints of one shape with other weights (another training
run, another random seed) differ in the sampled bytes unless those bytes happen to agree; a copy of
a checkpoint keeps its fingerprint.
"""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

SAMPLE = 4096


def _file_part(h, f: Path) -> None:
    size = f.stat().st_size
    h.update(f"{f.name}\0{size}\0".encode())
    with f.open("rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            h.update(head)
            return
        n = struct.unpack("<Q", head)[0]
        start = 8 + n
        if start > size:          # a damaged header: what is there still names the file
            h.update(fh.read(SAMPLE))
            return
        h.update(fh.read(n))
        data = size - start
        for at in sorted({start, start + max(0, data // 2 - SAMPLE // 2), max(start, size - SAMPLE)}):
            fh.seek(at)
            h.update(fh.read(SAMPLE))


def checkpoint_fingerprint(path: str | Path) -> str | None:
    """sha256 hex (first 16 digits) over the checkpoint directory's config.json and safetensors
    files (module doc), or None where `path` is not a directory with a config.json (weights made
    in memory)."""
    d = Path(path)
    cfg = d / "config.json"
    if not cfg.is_file():
        return None
    h = hashlib.sha256(cfg.read_bytes())
    for f in sorted(d.glob("*.safetensors")):
        _file_part(h, f)
    return h.hexdigest()[:16]
