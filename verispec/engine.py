"""Load a model directory and run generations: the sampler outside, the decoder inside."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from .config import RunSettings
from .decoder import Decoder, DecoderConfig
from .drafts.forced import ForcedSource, ForceMode
from .drafts.lookup_source import LookupSource
from .errors import UsageError, VerispecError
from .models import Model, ModelArgs
from .sampling import pick
from .tokenizer import Tokenizer
from .weights import load_checkpoint

VERIFY_ROWS = 8


@dataclass
class GenerateResult:
    ids: list[int]
    text: str
    stats: dict
    finish_reason: str                       # "stop" (end-of-sequence) or "length"
    logits: list[torch.Tensor] = field(default_factory=list)


class Engine:
    def __init__(self, model_dir: str | Path, *, read_mtp: bool = True):
        self.path = Path(model_dir)
        ck = load_checkpoint(self.path, read_mtp=read_mtp)
        self.args = ModelArgs.from_dict(ck.config)
        self.model = Model(self.args, ck.tensors)
        self.has_mtp = ck.has_mtp
        self.mtp_tensors = ck.mtp
        self.tokenizer = Tokenizer.from_dir(self.path)
        self.eos_ids = set(self.tokenizer.eos_ids) if self.tokenizer else set(self.args.eos_token_id)

    # ----- helpers -----
    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise UsageError(f"{self.path} has no tokenizer.json: give the prompt as --prompt-ids")
        return self.tokenizer.encode(text)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids) if self.tokenizer else " ".join(map(str, ids))

    def check_ids(self, ids: list[int]) -> None:
        v = self.args.vocab_size
        bad = [t for t in ids if not 0 <= t < v]
        if bad:
            raise UsageError(f"token id {bad[0]} out of range: the vocabulary has {v} ids (0..{v - 1})")

    def context_for(self, prompt_len: int, settings: RunSettings) -> int:
        need = prompt_len + settings.max_tokens
        limit = self.args.max_position_embeddings
        ctx = settings.context or min(need + VERIFY_ROWS, limit)
        if need > min(ctx, limit):
            raise UsageError(
                f"prompt ({prompt_len} tokens) plus --max-tokens {settings.max_tokens} exceeds the context "
                f"({min(ctx, limit)} tokens)")
        return ctx

    def new_decoder(self, settings: RunSettings, prompt: list[int], *, clock: Callable[[], float] = time.perf_counter,
                    state=None) -> Decoder:
        from .gate import Gate, GateConfig

        d = settings.drafts
        if d.mtp == "on" and not self.has_mtp:
            raise UsageError(f"--mtp on: {self.path} has no MTP head (mtp.* tensors)")
        sources = []
        if d.force is not None:
            mode = ForceMode.parse(d.force)
            ref = list(prompt) + list(d.reference)
            forced = ForcedSource(mode, ref, len(prompt), self.args.vocab_size, seed=settings.sampling.seed)
            forced.name = "lookup"
            sources.append(forced)
        elif d.lookup:
            sources.append(LookupSource(d.lookup_drafts))
        gate = Gate(GateConfig(enabled=d.gate)) if sources else None
        state = state or self.model.new_state(self.context_for(len(prompt), settings))
        return Decoder(self.model, state, sources=sources, gate=gate, clock=clock,
                       config=DecoderConfig(max_drafts=d.lookup_drafts, prefill_batch=settings.prefill_batch))

    def generate(self, prompt: list[int], settings: RunSettings, *, keep_logits: bool = False,
                 on_token: Callable[[int], None] | None = None, decoder: Decoder | None = None,
                 clock: Callable[[], float] = time.perf_counter, eos_ids: set[int] | None = None) -> GenerateResult:
        if not prompt:
            raise UsageError("the prompt is empty")
        self.check_ids(prompt)
        dec = decoder or self.new_decoder(settings, prompt, clock=clock)
        logits = dec.prefill(prompt)
        ids: list[int] = []
        kept: list[torch.Tensor] = []
        finish = "length"
        eos = self.eos_ids if eos_ids is None else eos_ids
        for i in range(settings.max_tokens):
            tok = pick(logits, len(prompt) + i, settings.sampling)
            ids.append(tok)
            if keep_logits:
                kept.append(logits.clone())
            if on_token is not None:
                on_token(tok)
            if tok in eos:
                finish = "stop"
                break
            if i + 1 < settings.max_tokens:
                logits = dec.logits_after(tok)
        dec.finish()
        stats = dec.stats.as_dict()
        if dec.gate is not None:
            stats["gate"] = dec.gate.stats()
        stats.update(_speeds(stats, len(ids)))
        return GenerateResult(ids, self.decode(ids), stats, finish, kept)


def _speeds(stats: dict, n_generated: int) -> dict:
    pre, dec = stats["prefill_seconds"], stats["decode_seconds"]
    return {
        "generated": n_generated,
        "prefill_tok_s": stats["prompt_tokens"] / pre if pre > 0 else 0.0,
        "decode_tok_s": stats["tokens"] / dec if dec > 0 else 0.0,
    }


def load_engine(model_dir: str | Path, *, read_mtp: bool = True) -> Engine:
    try:
        return Engine(model_dir, read_mtp=read_mtp)
    except VerispecError:
        raise
    except KeyError as e:
        raise VerispecError(f"{model_dir}: config.json lacks a required field {e}") from None
