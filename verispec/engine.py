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
from .drafts.mtp import MTPDrafter
from .drafts.vocab import VocabList, usage_path
from .errors import UsageError, VerispecError
from .execution import Execution
from .models import Model, ModelArgs
from .models.mtp import MTPHead
from .ops import linear
from .sampling import pick
from .tokenizer import Tokenizer
from .weights import Checkpoint, load_checkpoint

VERIFY_ROWS = 8
# auto on CUDA: a prompt (or the new part of one) of fewer rows goes through the graphed exact path
# in 16-row blocks; the batched forward (eager) has the larger fixed cost. At the 35B-A3B shape on the
# H200 (bench/prefill_rows.py, tok/s exact / batched): 96 rows 1767 / 1465, 128 rows 1766 / 1851
# (device call 162; 1764 / 2350 in call 161), 160 rows 1761 / 2740 (docs/cuda.md "Prompts on CUDA").
CUDA_BATCH_FROM = 128


@dataclass
class GenerateResult:
    ids: list[int]
    text: str
    stats: dict
    finish_reason: str                       # "stop" (end-of-sequence) or "length"
    logits: list[torch.Tensor] = field(default_factory=list)


class Engine:
    def __init__(self, model_dir: str | Path, *, read_mtp: bool = True, usage_file: str | None = None,
                 device: "str | Execution" = "cpu"):
        execution = device if isinstance(device, Execution) else Execution.for_device(device)
        ck = load_checkpoint(Path(model_dir), read_mtp=read_mtp, dtype=execution.dtype)
        self._setup(ck, execution, usage_file, Tokenizer.from_dir(Path(model_dir)))

    @classmethod
    def from_checkpoint(cls, ck: Checkpoint, execution: Execution, *, usage_file: str | None = None,
                        tokenizer: Tokenizer | None = None) -> "Engine":
        """An engine over tensors already in memory (random-weight benchmarks, tests)."""
        eng = cls.__new__(cls)
        eng._setup(ck, execution, usage_file, tokenizer)
        return eng

    def _setup(self, ck: Checkpoint, execution: Execution, usage_file: str | None, tokenizer) -> None:
        self.path = Path(ck.path)
        self.usage_file_override = usage_file
        self.execution = execution
        self.args = ModelArgs.from_dict(ck.config)
        self.model = Model(self.args, ck.tensors, self.execution)
        if not execution.is_cuda:
            # the CPU's row kernel compiles on first use (once a machine, then cached): here, with the
            # loading, rather than inside the first prompt's timed prefill (which it made ~0.8 s slower)
            linear.backend()
        self.has_mtp = ck.has_mtp
        self._mtp_tensors = ck.mtp
        self._heads: dict[str, MTPHead] = {}
        self.vocab_lists: dict[int, VocabList] = {}
        self.tokenizer = tokenizer
        self.eos_ids = set(self.tokenizer.eos_ids) if self.tokenizer else set(self.args.eos_token_id)
        # keep_gate (off unless set): each gated decoder continues from the last one's gate: it
        # shares its timings (T(n), rho, draft costs: the machine's and the model's, not the
        # prompt's) and starts its acceptance from its estimates, worth a prior (Gate.next_run,
        # docs/gate.md "Across runs"), as a long-lived process would. Off: every decoder's gate
        # starts from the priors with nothing measured (one CLI run; `serve` keeps one decoder,
        # and so one gate, for all its turns anyway). last_gate: the last gated decoder's gate.
        self.keep_gate = False
        self.last_gate = None

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
        if settings.context is not None and settings.context > limit:
            raise UsageError(f"--context {settings.context} exceeds the model's max_position_embeddings ({limit})")
        # never allocate past the positions the model was trained for
        ctx = min(settings.context or need + VERIFY_ROWS, limit)
        if need > ctx:
            raise UsageError(
                f"prompt ({prompt_len} tokens) plus --max-tokens {settings.max_tokens} exceeds the context "
                f"({ctx} tokens)")
        return ctx

    def head(self, wiring: str = "post") -> MTPHead:
        if not self.has_mtp or not self._mtp_tensors:
            raise UsageError(f"--mtp on: {self.path} has no MTP head (mtp.* tensors)")
        if wiring not in self._heads:
            self._heads[wiring] = MTPHead.load(self.model, self._mtp_tensors, wiring)
        return self._heads[wiring]

    def vocab_list(self, top_n: int) -> VocabList:
        """One list per size, its counts read once from the counts file."""
        if top_n not in self.vocab_lists:
            v = VocabList(self.args.vocab_size, top_n)
            v.load(self.usage_file)
            self.vocab_lists[top_n] = v
        return self.vocab_lists[top_n]

    @property
    def usage_file(self) -> Path:
        return usage_path(self.path, self.usage_file_override)

    def save_usage(self) -> None:
        for v in self.vocab_lists.values():
            v.save(self.usage_file)

    def uses_mtp(self, settings: RunSettings) -> bool:
        d = settings.drafts
        if d.mtp == "on" and not self.has_mtp:
            raise UsageError(f"--mtp on: {self.path} has no MTP head (mtp.* tensors)")
        return d.mtp == "on" or (d.mtp == "auto" and self.has_mtp and bool(self._mtp_tensors))

    def new_decoder(self, settings: RunSettings, prompt: list[int], *, clock: Callable[[], float] = time.perf_counter,
                    state=None) -> Decoder:
        from .gate import Gate, GateConfig

        d = settings.drafts
        mtp = self.uses_mtp(settings)
        config = GateConfig(enabled=d.gate, observe=d.gate_observe)
        prev = self.last_gate
        # only a gate that decides joins the chain (--gate off: its own, discarded)
        gate = (prev.next_run() if self.keep_gate and d.gate and prev is not None and prev.config == config
                else Gate(config))
        if state is None:
            state = self._fresh_state(self.context_for(len(prompt), settings))
        sources = []
        if d.force is not None:
            mode = ForceMode.parse(d.force)
            ref = list(prompt) + list(d.reference)
            sources.append(ForcedSource(mode, ref, len(prompt), self.args.vocab_size, seed=settings.sampling.seed,
                                        name="mtp" if mtp else "lookup",
                                        max_drafts=(d.mtp_drafts or 3) if mtp else d.lookup_drafts))
        else:
            if mtp:
                vocab = self.vocab_list(d.mtp_vocab)
                pstep = d.mtp_pstep if d.mtp_pstep is not None else d.mtp_drafts >= 2
                sources.append(MTPDrafter(self.head(d.mtp_wiring), d.mtp_drafts, state.shapes.max_len,
                                          gate=gate if d.gate else None, vocab=vocab, clock=clock,
                                          pstep=pstep and d.gate))
            if d.lookup:
                sources.append(LookupSource(d.lookup_drafts))
        if d.gate and sources:
            self.last_gate = gate
        return Decoder(self.model, state, sources=sources, gate=gate if sources else None, clock=clock,
                       config=DecoderConfig(prefill_batch=self.prefill_batch(settings.prefill_batch),
                                            prefill_batch_from=self.prefill_batch_from(settings.prefill_batch)))

    def prefill_batch(self, asked: bool | None) -> bool:
        """Whether a prompt goes through the batched fast kernels (True) or the exact path (False);
        None (auto): batched, from prefill_batch_from rows."""
        return True if asked is None else asked

    def prefill_batch_from(self, asked: bool | None) -> int:
        """The fewest rows a prompt (or the new part of one) needs to go batched: CUDA_BATCH_FROM for
        auto on CUDA, else 0 (any prompt of more than a verify's rows)."""
        return CUDA_BATCH_FROM if asked is None and self.model.embed.is_cuda else 0

    def _fresh_state(self, max_len: int):
        """A new sequence's state. With CUDA graphs the last one of the same size is reset and
        reused: the graphs hold its tensors' addresses, so reuse spares a re-capture per run."""
        if self.model.graphs is None:
            return self.model.new_state(max_len)
        st = getattr(self, "_graph_state", None)
        if st is None or st.shapes.max_len != max_len:
            st = self._graph_state = self.model.new_state(max_len)
        st.reset()
        return st

    def generate(self, prompt: list[int], settings: RunSettings, *, keep_logits: bool = False,
                 on_token: Callable[[int, torch.Tensor], bool | None] | None = None, decoder: Decoder | None = None,
                 clock: Callable[[], float] = time.perf_counter, eos_ids: set[int] | None = None,
                 reuse: int = 0) -> GenerateResult:
        """Generate after `prompt`. With `decoder` holding the first `reuse` prompt tokens
        already (prefix reuse), only the rest is fed. on_token(tok, logits) may return
        False to stop (finish_reason "cancelled"); the state is then plain decoding's."""
        if not prompt:
            raise UsageError("the prompt is empty")
        self.check_ids(prompt)
        dec = decoder or self.new_decoder(settings, prompt, clock=clock)
        dec.stats = type(dec.stats)()
        # (a forced source's `vocab` is the vocabulary size, not a list)
        vocab = next((s.vocab for s in dec.sources if isinstance(getattr(s, "vocab", None), VocabList)), None)
        if vocab is not None:
            vocab.start_request(prompt)
            vocab.count_prompt(prompt[reuse:])
        logits = dec.prefill(prompt[reuse:])
        ids: list[int] = []
        kept: list[torch.Tensor] = []
        finish = "length"
        eos = self.eos_ids if eos_ids is None else eos_ids
        for i in range(settings.max_tokens):
            tok = pick(logits, len(prompt) + i, settings.sampling)
            ids.append(tok)
            if keep_logits:
                kept.append(logits.clone())
            if vocab is not None:
                vocab.count_pick(tok)
            if on_token is not None and on_token(tok, logits) is False:
                finish = "cancelled"
                break
            if tok in eos:
                finish = "stop"
                break
            if i + 1 < settings.max_tokens:
                logits = dec.logits_after(tok)
        dec.finish()
        stats = dec.stats.as_dict()
        if dec.gate is not None:
            stats["gate"] = dec.gate.stats()
            stats["gate_line"] = dec.gate.describe()
        if vocab is not None:
            stats["vocab"] = vocab.stats()
        mtp = next((s for s in dec.sources if s.name == "mtp"), None)
        if mtp is not None:
            stats["mtp"] = {"depth": getattr(mtp, "depth", None),
                            "wiring": getattr(getattr(mtp, "head", None), "wiring", "forced")}
        stats.update(_speeds(stats, len(ids)))
        return GenerateResult(ids, self.decode(ids), stats, finish, kept)


def _speeds(stats: dict, n_generated: int) -> dict:
    pre, dec = stats["prefill_seconds"], stats["decode_seconds"]
    return {
        "generated": n_generated,
        "prefill_tok_s": stats["prompt_tokens"] / pre if pre > 0 else 0.0,
        "decode_tok_s": stats["tokens"] / dec if dec > 0 else 0.0,
    }


def load_engine(model_dir: str | Path, *, read_mtp: bool = True, usage_file: str | None = None,
                device: str = "cpu") -> Engine:
    try:
        return Engine(model_dir, read_mtp=read_mtp, usage_file=usage_file, device=device)
    except VerispecError:
        raise
    except KeyError as e:
        raise VerispecError(f"{model_dir}: config.json lacks a required field {e}") from None
