"""Tiny random checkpoints for tests and development, made with transformers.

transformers is a test dependency: it is imported inside the functions, never at module
import time, and nothing in the engine imports this module.

A fixture directory holds config.json, model.safetensors (one file, per-expert tensors as
transformers writes them), generation_config.json and, on request, a random MTP head in
the Qwen3-Next / Qwen3.5 release layout (`mtp.*`, in the same safetensors file) and a
byte-level tokenizer whose ids 0..255 are the 256 bytes.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from .fixture_args import DEFAULT_LM_HEAD_SCALE, FAMILIES  # noqa: F401  (re-exported)

SPECIAL_TOKENS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")  # ids 256, 257, 258
BYTE_VOCAB = 256 + len(SPECIAL_TOKENS)

# Random init with transformers' initializer_range 0.02 gives near-uniform logits (std 0.16
# over a vocabulary of 1000): greedy runs hit a top-2 margin under 1e-3 within ~6-40 steps,
# and the model tests compare greedy ids only up to such a step and need >= 32 steps.
# initializer_range 0.2 (logit std ~1.6) plus an lm_head scaled by 4 (logit std ~6.4, top
# probability ~0.6) was measured over 64 greedy steps x 10 seeds x both families: 18 of 20
# runs never dropped under 1e-3, the other two first did at steps 47 and 59. Scaling the
# lm_head leaves the argmax path unchanged and keeps the internals at 0.2, where larger
# initializer ranges (0.3, 0.5) gave no better margins. `weight_scale` multiplies every
# matrix on top of this.
DEFAULT_INITIALIZER_RANGE = 0.2
NORM_STD = 0.1  # random RMSNorm weights, so (1 + w) vs w and pre/post-norm wiring matter

CHATML_TEMPLATE = (
    "{%- for message in messages %}\n"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] %}\n"
    "{{- raise_exception('unknown role: ' + message['role']) }}\n"
    "{%- endif %}\n"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "{{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)


def _classes(family: str):
    import transformers

    if family == "qwen3_next":
        return transformers.Qwen3NextConfig, transformers.Qwen3NextForCausalLM
    if family == "qwen3_5_moe":
        return transformers.Qwen3_5MoeTextConfig, transformers.Qwen3_5MoeForCausalLM
    raise ValueError(f"unknown fixture family {family!r}; expected one of {', '.join(FAMILIES)}")


def _config_kwargs(family, hidden_size, num_layers, vocab_size, num_experts, top_k, overrides) -> dict:
    kw = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        # [linear, linear, linear, full] repeated; ends on a full-attention layer when
        # num_layers is a multiple of 4
        layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(num_layers)],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        num_experts=num_experts,
        num_experts_per_tok=top_k,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        initializer_range=DEFAULT_INITIALIZER_RANGE,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    )
    if family == "qwen3_next":
        kw["intermediate_size"] = 64  # dense-MLP size; unused while every layer is sparse
    kw.update(overrides)
    return kw


@torch.no_grad()
def _randomize(model: torch.nn.Module, weight_scale: float) -> None:
    """Random norm weights and a global scale on every matrix, from the global RNG."""
    for module in model.modules():
        name = type(module).__name__
        if name.endswith("RMSNormGated"):  # plain weight (init 1): w * norm(x) * silu(z)
            module.weight.copy_(1.0 + NORM_STD * torch.randn_like(module.weight))
        elif name.endswith("RMSNorm"):  # zero-centred: norm(x) * (1 + w)
            module.weight.normal_(0.0, NORM_STD)
    if weight_scale != 1.0:
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(weight_scale)


def _mtp_tensors(family: str, config_kwargs: dict, weight_scale: float) -> dict[str, torch.Tensor]:
    """A random MTP head: fc, the two pre-fc norms, one full-attention decoder layer with its
    MoE (per-expert tensors, as save_pretrained writes the backbone), and mtp.norm."""
    config_cls, model_cls = _classes(family)
    kw = dict(config_kwargs, num_hidden_layers=1, layer_types=["full_attention"])
    # A one-layer model of the same family runs transformers' own init for the layer.
    layer_model = model_cls(config_cls(**kw)).eval()
    _randomize(layer_model, weight_scale)
    H = kw["hidden_size"]
    std = kw["initializer_range"] * weight_scale
    out: dict[str, torch.Tensor] = {
        "mtp.fc.weight": torch.randn(H, 2 * H) * std,  # [H, 2H] over [emb-norm(e); hid-norm(h)]
        "mtp.pre_fc_norm_embedding.weight": torch.randn(H) * NORM_STD,
        "mtp.pre_fc_norm_hidden.weight": torch.randn(H) * NORM_STD,
        "mtp.norm.weight": torch.randn(H) * NORM_STD,
    }
    for name, t in layer_model.model.layers[0].state_dict().items():
        if name == "mlp.experts.gate_up_proj":  # [E, 2I, H]: gate rows, then up rows
            inter = t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"mtp.layers.0.mlp.experts.{e}.gate_proj.weight"] = t[e, :inter]
                out[f"mtp.layers.0.mlp.experts.{e}.up_proj.weight"] = t[e, inter:]
        elif name == "mlp.experts.down_proj":  # [E, H, I]
            for e in range(t.shape[0]):
                out[f"mtp.layers.0.mlp.experts.{e}.down_proj.weight"] = t[e]
        else:
            out[f"mtp.layers.0.{name}"] = t
    return {k: v.detach().clone().contiguous() for k, v in out.items()}


def write_byte_tokenizer(out_dir: str | Path) -> None:
    """tokenizer.json whose ids 0..255 are the bytes, then <|im_start|>, <|im_end|>,
    <|endoftext|>; tokenizer_config.json with a ChatML template and eos <|im_end|>.

    A BPE model with no merges over the byte-level alphabet: every byte of the UTF-8 text is
    one token, so decode(encode(s)) == s for any string."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    out = Path(out_dir)
    byte_to_char = pre_tokenizers.ByteLevel.alphabet()  # 256 printable stand-ins, unordered
    # the GPT-2 byte -> unicode table, so id b is byte b
    table = _bytes_to_unicode()
    assert set(table.values()) == set(byte_to_char)
    vocab = {table[b]: b for b in range(256)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.save(str(out / "tokenizer.json"))
    tcfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "model_max_length": 4096,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHATML_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=2) + "\n")


def _bytes_to_unicode() -> dict[int, str]:
    # GPT-2's reversible byte -> printable-unicode map, the one ByteLevel uses.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def make_fixture(
    out_dir: str | Path,
    family: str = "qwen3_next",
    seed: int = 0,
    mtp: bool = False,
    byte_tokenizer: bool = False,
    hidden_size: int = 64,
    num_layers: int = 4,
    vocab_size: int | None = None,
    num_experts: int = 4,
    top_k: int = 2,
    weight_scale: float = 1.0,
    lm_head_scale: float = DEFAULT_LM_HEAD_SCALE,
    **overrides,
) -> Path:
    """Write a tiny random checkpoint of `family` to out_dir and return its path.

    `overrides` go to the transformers config (e.g. num_attention_heads=8, tie_word_embeddings=True).
    `lm_head_scale` multiplies lm_head.weight (the logit scale; with tied embeddings also
    the embedding). The same arguments give byte-identical files."""
    from safetensors.torch import load_file, save_file

    config_cls, model_cls = _classes(family)
    if vocab_size is None:
        vocab_size = BYTE_VOCAB if byte_tokenizer else 1000
    if byte_tokenizer and vocab_size < BYTE_VOCAB:
        raise ValueError(f"byte_tokenizer needs vocab_size >= {BYTE_VOCAB}, got {vocab_size}")
    # <|im_end|> stops a byte-tokenizer fixture; the plain fixture has no stop token, so a
    # run's length is max_tokens (pass eos_token_id=... to get one)
    overrides.setdefault("eos_token_id", SPECIAL_TOKENS.index("<|im_end|>") + 256 if byte_tokenizer else None)
    kw = _config_kwargs(family, hidden_size, num_layers, vocab_size, num_experts, top_k, overrides)

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = model_cls(config_cls(**kw)).eval()
    _randomize(model, weight_scale)
    with torch.no_grad():
        model.lm_head.weight.mul_(lm_head_scale)  # tied: the same tensor as the embedding
    model.generation_config.eos_token_id = kw["eos_token_id"]
    model.generation_config.do_sample = False
    _save_quietly(model, out)

    if mtp:
        head = _mtp_tensors(family, kw, weight_scale)
        path = out / "model.safetensors"
        tensors = load_file(str(path))
        clash = set(head) & set(tensors)
        assert not clash, clash
        tensors.update(head)
        save_file(tensors, str(path), metadata={"format": "pt"})
        cfg = json.loads((out / "config.json").read_text())
        cfg["num_nextn_predict_layers"] = 1  # Qwen3-Next's key
        cfg["mtp_num_hidden_layers"] = 1  # Qwen3.5's key
        (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")

    if byte_tokenizer:
        write_byte_tokenizer(out)
    return out


def _save_quietly(model, out: Path) -> None:
    # save_pretrained draws a progress bar on stderr; the CLI's stderr is for report lines
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(out, safe_serialization=True)
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _check_args(a: argparse.Namespace) -> None:
    """Bad flags are one line and exit 2 before anything is built or written; an existing
    directory is never written into (save_pretrained would delete the shards of a model there)."""
    import math
    import os

    from .errors import UsageError

    for flag, v in (("--hidden-size", a.hidden_size), ("--layers", a.layers), ("--experts", a.experts),
                    ("--top-k", a.top_k)):
        if v < 1:
            raise UsageError(f"{flag} must be >= 1, got {v}")
    if a.top_k > a.experts:
        raise UsageError(f"--top-k {a.top_k} exceeds --experts {a.experts}")
    least = BYTE_VOCAB if a.byte_tokenizer else 1
    if a.vocab_size is not None and a.vocab_size < least:
        raise UsageError(f"--vocab-size must be >= {least}{' with --byte-tokenizer' if a.byte_tokenizer else ''}, "
                         f"got {a.vocab_size}")
    for flag, v in (("--weight-scale", a.weight_scale), ("--lm-head-scale", a.lm_head_scale)):
        if not (math.isfinite(v) and v > 0):
            raise UsageError(f"{flag} must be a positive number, got {v}")
    if not a.out:
        raise UsageError("--out: give a directory name")
    out = Path(a.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {a.out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        raise UsageError(f"--out {a.out}: exists and is not empty (a fixture is written only into a new or empty "
                         "directory: it would replace a model's files there)")
    parent = next(p for p in (out.resolve(), *out.resolve().parents) if p.exists())
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise UsageError(f"--out {a.out}: cannot be written ({parent} is not a writable directory)")


def main_fixture(args: argparse.Namespace) -> int:
    _check_args(args)
    try:
        import transformers  # noqa: F401
    except ImportError:
        from .errors import VerispecError
        raise VerispecError("verispec fixture needs transformers (a test dependency): pip install -e '.[test]'") \
            from None
    path = make_fixture(
        args.out,
        family=args.family,
        seed=args.seed,
        mtp=args.mtp,
        byte_tokenizer=args.byte_tokenizer,
        hidden_size=args.hidden_size,
        num_layers=args.layers,
        vocab_size=args.vocab_size,
        num_experts=args.experts,
        top_k=args.top_k,
        weight_scale=args.weight_scale,
        lm_head_scale=args.lm_head_scale,
    )
    print(path)
    return 0
