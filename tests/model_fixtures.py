"""Tiny checkpoints made once per test session (shared by the model and harness tests)."""

from __future__ import annotations

import functools
import hashlib
import tempfile
from pathlib import Path

import torch

from verispec.engine import Engine
from verispec.fixture import make_fixture

_ROOT = Path(tempfile.mkdtemp(prefix="verispec-fixtures-"))

# Weight scale of the test checkpoints: large enough that greedy top-2 margins stay above
# 1e-3 for 64 steps, small enough that fp32 rounding stays ~1e-5 in the logits. Measured:
# at scale 1.0 (init std 0.2) transformers' own fp32 forward is 1e-4..7e-4 away from its
# fp64 forward on 8-layer fixtures, so no fp32 engine could meet 1e-4 there; at 0.3 it is
# ~5e-6 and every seed still compares all 64 greedy steps.
SCALE = 0.3
# The fixture module's default lm_head scale (4) makes logits ~4x larger and so their fp32
# rounding ~4x larger too; the tests here were calibrated at 1 (64 greedy steps compared,
# head logits within 1e-6 of an fp64 reference).
LM_HEAD_SCALE = 1.0

# A prompt that ends with a repeating tail, so lookup proposes (test-matrix.md).
REPEAT_PROMPT = [5, 9, 31, 2, 7, 11, 13, 17, 7, 11, 13, 17, 7, 11, 13, 17, 7, 11]


@functools.lru_cache(maxsize=None)
def fixture_dir(family: str = "qwen3_next", seed: int = 0, mtp: bool = False, byte_tokenizer: bool = False,
                aligned_head: bool = False, **kw) -> Path:
    kw.setdefault("weight_scale", SCALE)
    kw.setdefault("lm_head_scale", LM_HEAD_SCALE)
    name = f"{family}-s{seed}-m{int(mtp)}-b{int(byte_tokenizer)}-a{int(aligned_head)}-" + "-".join(
        f"{k}{v}" for k, v in sorted(kw.items()))
    if len(name) > 120:   # file names are limited to 255 bytes
        name = name[:60] + "-" + hashlib.sha1(name.encode()).hexdigest()[:16]
    d = make_fixture(_ROOT / name, family=family, seed=seed, mtp=mtp, byte_tokenizer=byte_tokenizer, **kw)
    if aligned_head:
        _align_head(d)
    return d


def _align_head(d: Path) -> None:
    """Make a random MTP head predictive: its fc passes the next token's normed embedding
    through, the hidden-state half and the layer's outputs are damped (not removed: the
    hidden state the head reads and its attention over its KV cache must still show in its
    logits). The head then predicts roughly what the backbone's residual path does for that
    token, so real drafts are often accepted."""
    from safetensors.torch import load_file, save_file

    path = d / "model.safetensors"
    t = load_file(str(path))
    h = t["mtp.fc.weight"].shape[0]
    t["mtp.fc.weight"] = torch.cat([torch.eye(h), 0.2 * t["mtp.fc.weight"][:, h:]], dim=1)
    t["mtp.pre_fc_norm_embedding.weight"] = torch.zeros(h)
    t["mtp.norm.weight"] = t["model.norm.weight"].clone()
    for k in list(t):
        if k.startswith("mtp.layers.0.") and (k.endswith("o_proj.weight") or k.endswith("down_proj.weight")):
            t[k] = t[k] * 0.1
    save_file(t, str(path), metadata={"format": "pt"})


@functools.lru_cache(maxsize=None)
def engine(family: str = "qwen3_next", seed: int = 0, mtp: bool = False, byte_tokenizer: bool = False,
           aligned_head: bool = False, **kw) -> Engine:
    kw.setdefault("weight_scale", SCALE)
    kw.setdefault("lm_head_scale", LM_HEAD_SCALE)
    return Engine(fixture_dir(family, seed, mtp, byte_tokenizer, aligned_head, **kw))
