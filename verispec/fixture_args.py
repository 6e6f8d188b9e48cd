"""`verispec fixture`'s flags (verispec/fixture.py writes the checkpoint), apart from it so that the
CLI's parser, and with it `--help` and every usage error, does not wait for torch to import."""

from __future__ import annotations

import argparse

FAMILIES = ("qwen3_next", "qwen3_5_moe")
# the lm_head's scale over the other matrices (why 4: the comment above DEFAULT_INITIALIZER_RANGE
# in verispec/fixture.py)
DEFAULT_LM_HEAD_SCALE = 4.0


def add_fixture_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--family", choices=FAMILIES, default="qwen3_next")
    p.add_argument("--mtp", action="store_true", help="add a random MTP head (mtp.* tensors)")
    p.add_argument("--byte-tokenizer", action="store_true", help="256-id byte-level tokenizer and a chat template")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--hidden-size", type=int, default=64)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab-size", type=int, default=None)
    p.add_argument("--experts", type=int, default=4)
    p.add_argument("--top-k", type=int, default=2, help="experts per token")
    p.add_argument("--weight-scale", type=float, default=1.0)
    p.add_argument("--lm-head-scale", type=float, default=DEFAULT_LM_HEAD_SCALE)
