"""`verispec bench`'s flags (verispec/bench_cmd.py runs it), apart from it so that the CLI's parser,
and with it `--help` and every usage error, does not wait for torch to import."""

from __future__ import annotations

from .shapes import PRESETS, ROUTINGS


def add_bench_args(b) -> None:
    b.add_argument("--random-config", required=True, choices=sorted(PRESETS), help="the shape to build")
    b.add_argument("--layers", type=int, default=None, help="fewer layers than the shape's (default: all)")
    b.add_argument("--routing", choices=ROUTINGS, default="independent")
    b.add_argument("--device", choices=["cpu", "cuda", "auto"], default="auto")
    b.add_argument("--tokens", type=int, default=32)
    b.add_argument("--rounds", type=int, default=3)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--json", action="store_true")
