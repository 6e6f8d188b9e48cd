"""Build the default model's training data from this machine's Python standard library.

Steps (all deterministic):
  1. list every ``.py`` file under the stdlib root (``site-packages`` excluded), sorted by
     relative path; skip files that are not valid UTF-8;
  2. put ~2% of the files in a held-out split, chosen by a hash of the relative path;
  3. write the manifest (path, size, sha256, split) to ``docs/default-model-data.tsv``;
  4. train a byte-level BPE tokenizer (HF ``tokenizers``, 8192 tokens) on the train split
     and write it to ``verispec/data/default_model/tokenizer.json``;
  5. tokenize both splits, documents joined by ``<|endoftext|>``, and write uint16 ids to
     ``.devcarry/{train,heldout}.npy`` (git-ignored; carried to the GPU machine).

Usage:  python tools/make_corpus.py [--stdlib /root/.pyenv/versions/3.11.7/lib/python3.11]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

REPO = Path(__file__).resolve().parent.parent
DEFAULT_STDLIB = Path("/root/.pyenv/versions/3.11.7/lib/python3.11")
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2
VOCAB_SIZE = 8192
HELDOUT_MODULUS = 50  # a file is held out when int(sha256(path)[:8], 16) % 50 == 0 (~2%)


def list_files(root: Path) -> list[tuple[str, bytes]]:
    """(relative path, bytes) of every UTF-8 ``.py`` file under root, sorted by path."""
    out = []
    for path in sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).as_posix()):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("site-packages/") or not path.is_file():
            continue
        data = path.read_bytes()
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            print(f"skip (not UTF-8): {rel}", file=sys.stderr)
            continue
        out.append((rel, data))
    return out


def is_heldout(rel: str) -> bool:
    return int(hashlib.sha256(rel.encode()).hexdigest()[:8], 16) % HELDOUT_MODULUS == 0


def train_tokenizer(texts: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return tok


def encode_split(tok: Tokenizer, texts: list[str]) -> np.ndarray:
    """Documents joined (and ended) by <|endoftext|>: doc0 EOT doc1 EOT ..."""
    eot = tok.token_to_id("<|endoftext|>")
    ids: list[int] = []
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(eot)
    arr = np.asarray(ids, dtype=np.int64)
    assert arr.max() < 2**16
    return arr.astype(np.uint16)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stdlib", type=Path, default=DEFAULT_STDLIB)
    ap.add_argument("--manifest", type=Path, default=REPO / "docs/default-model-data.tsv")
    ap.add_argument("--tokenizer", type=Path, default=REPO / "verispec/data/default_model/tokenizer.json")
    ap.add_argument("--out", type=Path, default=REPO / ".devcarry")
    args = ap.parse_args()

    files = list_files(args.stdlib)
    splits = {"train": [], "heldout": []}
    lines = ["path\tsize\tsha256\tsplit"]
    for rel, data in files:
        split = "heldout" if is_heldout(rel) else "train"
        splits[split].append(data.decode("utf-8"))
        lines.append(f"{rel}\t{len(data)}\t{hashlib.sha256(data).hexdigest()}\t{split}")
    args.manifest.parent.mkdir(parents=True, exist_ok=True)
    args.manifest.write_text("\n".join(lines) + "\n")
    for name, texts in splits.items():
        print(f"{name}: {len(texts)} files, {sum(len(t.encode()) for t in texts)} bytes")

    tok = train_tokenizer(splits["train"])
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2]
    args.tokenizer.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(args.tokenizer))

    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"vocab_size": tok.get_vocab_size(), "eos_token_id": 0, "stdlib": str(args.stdlib)}
    for name, texts in splits.items():
        ids = encode_split(tok, texts)
        np.save(args.out / f"{name}.npy", ids)
        meta[f"{name}_tokens"] = int(ids.size)
        nbytes = sum(len(t.encode()) for t in texts)
        print(f"{name}: {ids.size} tokens, {nbytes / ids.size:.2f} bytes/token")
    # Round trip check on the held-out split: byte-level BPE must reproduce the text exactly.
    for t in splits["heldout"]:
        assert tok.decode(tok.encode(t).ids) == t
    (args.out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")


if __name__ == "__main__":
    main()
