"""A plain-torch reference of the MTP head (DESIGN.md section 3), full recompute, no cache.

The head, for pair p = (h_p, x_{p+1}) with h_p the backbone's hidden state at p AFTER its
final norm (``last_hidden_state``), at RoPE position p + 1:

    e = rms(embed(x_{p+1})) * (1 + pre_fc_norm_embedding)    # zero-centred RMSNorm, fp32
    h = rms(h_p) * (1 + pre_fc_norm_hidden)
    u = fc @ cat([e, h])                                      # fc [H, 2H], embedding half first
    u = one full-attention decoder layer (gated attention, q/k norm, partial RoPE, GQA,
        sparse MoE + gated shared expert), causal over the rows
    out = rms(u) * (1 + mtp.norm);  logits = lm_head(out)    # predicts x_{p+2}

A draft at depth d > 1 appends the row (out of the row before, draft d-1) at the next
position; rows attend causally, so a deep row sees every settled pair, the deeper rows
before it and itself -- what the engine's head KV cache holds.

Import it (the engine's tests do):
    w = load_head("verispec/data/default_model")
    drafts = draft(w, hidden, tokens, depth=3)   # hidden [n+1, H] for x_0..x_n, tokens x_0..x_{n+1}

Run it (needs transformers for the backbone):
    python tools/mtp_reference.py --model verispec/data/default_model [--heldout-loss]
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

# The fixed held-out prompt: the first 40 lines of Lib/colorsys.py of CPython 3.11.7 (held out
# of the default model's training data; Python Software Foundation License, see
# docs/default-model.md), without the last newline: the byte-level BPE merges a newline with
# the next line's indentation, so a prompt ending in a bare "\n" tells the model the next
# line is not indented. The model continues the body of rgb_to_yiq.
HELDOUT_PROMPT = '''"""Conversion functions between RGB and other color systems.

This modules provides two functions for each color system ABC:

  rgb_to_abc(r, g, b) --> a, b, c
  abc_to_rgb(a, b, c) --> r, g, b

All inputs and outputs are triples of floats in the range [0.0...1.0]
(with the exception of I and Q, which covers a slightly larger range).
Inputs outside the valid range may cause exceptions or invalid outputs.

Supported color systems:
RGB: Red, Green, Blue components
YIQ: Luminance, Chrominance (used by composite video signals)
HLS: Hue, Luminance, Saturation
HSV: Hue, Saturation, Value
"""

# References:
# http://en.wikipedia.org/wiki/YIQ
# http://en.wikipedia.org/wiki/HLS_color_space
# http://en.wikipedia.org/wiki/HSV_color_space

__all__ = ["rgb_to_yiq","yiq_to_rgb","rgb_to_hls","hls_to_rgb",
           "rgb_to_hsv","hsv_to_rgb"]

# Some floating point constants

ONE_THIRD = 1.0/3.0
ONE_SIXTH = 1.0/6.0
TWO_THIRD = 2.0/3.0

# YIQ: used by composite video signals (linear combinations of RGB)
# Y: perceived grey level (0.0 == black, 1.0 == white)
# I, Q: color components
#
# There are a great many versions of the constants used in these formulae.
# The ones in this library uses constants from the FCC version of NTSC.

def rgb_to_yiq(r, g, b):'''


@dataclass(frozen=True)
class HeadConfig:
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rotary_dim: int
    rope_theta: float
    rms_norm_eps: float
    num_experts: int
    num_experts_per_tok: int
    norm_topk_prob: bool

    @classmethod
    def from_dict(cls, cfg: dict) -> "HeadConfig":
        rope = cfg.get("rope_parameters") or {}
        theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
        factor = rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25))
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        return cls(cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], head_dim,
                   int(head_dim * factor), float(theta), cfg["rms_norm_eps"], cfg["num_experts"],
                   cfg["num_experts_per_tok"], cfg.get("norm_topk_prob", True))


@dataclass
class HeadWeights:
    cfg: HeadConfig
    t: dict[str, torch.Tensor]   # mtp.* tensors (release names, experts one tensor each), fp32
    embed: torch.Tensor          # [V, H] model.embed_tokens.weight
    lm_head: torch.Tensor        # [V, H] (the embedding when tied)


def load_head(model_dir, dtype=torch.float32) -> HeadWeights:
    from safetensors import safe_open

    model_dir = Path(model_dir)
    cfg = json.loads((model_dir / "config.json").read_text())
    files = sorted(model_dir.glob("*.safetensors"))
    t, other = {}, {}
    for f in files:
        with safe_open(str(f), "pt") as fh:
            for k in fh.keys():
                if k.startswith("mtp."):
                    t[k] = fh.get_tensor(k).to(dtype)
                elif k in ("model.embed_tokens.weight", "lm_head.weight"):
                    other[k] = fh.get_tensor(k).to(dtype)
    if not t:
        raise ValueError(f"{model_dir} has no mtp.* tensors")
    embed = other["model.embed_tokens.weight"]
    lm_head = other.get("lm_head.weight", embed) if not cfg.get("tie_word_embeddings") else embed
    return HeadWeights(HeadConfig.from_dict(cfg), t, embed, lm_head)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """Zero-centred RMSNorm (Qwen3-Next): x * rsqrt(mean(x^2) + eps) * (1 + w), in fp32."""
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + w.float())).to(x.dtype)


def rope(x: torch.Tensor, pos: torch.Tensor, cfg: HeadConfig) -> torch.Tensor:
    """Partial rotary (first rotary_dim dims, rotate-half layout); x [heads, n, hd], pos [n]."""
    d = cfg.rotary_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    freqs = pos.float()[:, None] * inv_freq[None]                      # [n, d/2]
    cos, sin = torch.cat([freqs, freqs], -1).cos(), torch.cat([freqs, freqs], -1).sin()
    xr, xp = x[..., :d], x[..., d:]
    rot = torch.cat([-xr[..., d // 2:], xr[..., : d // 2]], -1)
    return torch.cat([xr * cos.to(x.dtype) + rot * sin.to(x.dtype), xp], -1)


def attention(w: HeadWeights, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Gated attention, causal over the n rows of x [n, H]."""
    c, t, p = w.cfg, w.t, "mtp.layers.0.self_attn."
    n, hd, nh, nkv = x.shape[0], c.head_dim, c.num_attention_heads, c.num_key_value_heads
    qg = (x @ t[p + "q_proj.weight"].T).view(n, nh, 2 * hd)
    q, gate = qg[..., :hd], qg[..., hd:].reshape(n, nh * hd)           # per head: [query | gate]
    k = (x @ t[p + "k_proj.weight"].T).view(n, nkv, hd)
    v = (x @ t[p + "v_proj.weight"].T).view(n, nkv, hd)
    q = rope(rms_norm(q, t[p + "q_norm.weight"], c.rms_norm_eps).transpose(0, 1), pos, c)   # [nh, n, hd]
    k = rope(rms_norm(k, t[p + "k_norm.weight"], c.rms_norm_eps).transpose(0, 1), pos, c)   # [nkv, n, hd]
    v = v.transpose(0, 1)
    rep = nh // nkv
    k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)    # head h reads kv head h // rep
    scores = (q @ k.transpose(1, 2)) * hd**-0.5                         # [nh, n, n]
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    probs = scores.masked_fill(~causal, float("-inf")).float().softmax(-1).to(x.dtype)
    o = (probs @ v).transpose(0, 1).reshape(n, nh * hd)
    return (o * torch.sigmoid(gate)) @ t[p + "o_proj.weight"].T


def moe(w: HeadWeights, x: torch.Tensor) -> torch.Tensor:
    """Top-k softmax router over experts plus a sigmoid-gated shared expert; x [n, H]."""
    c, t, p = w.cfg, w.t, "mtp.layers.0.mlp."
    probs = (x @ t[p + "gate.weight"].T).float().softmax(-1)
    top_w, top_i = probs.topk(c.num_experts_per_tok, -1)
    if c.norm_topk_prob:
        top_w = top_w / top_w.sum(-1, keepdim=True)
    out = torch.zeros_like(x)
    for e in range(c.num_experts):
        rows, slot = torch.where(top_i == e)
        if rows.numel() == 0:
            continue
        xe = x[rows]
        g = xe @ t[f"{p}experts.{e}.gate_proj.weight"].T
        u = xe @ t[f"{p}experts.{e}.up_proj.weight"].T
        y = (F.silu(g) * u) @ t[f"{p}experts.{e}.down_proj.weight"].T
        out.index_add_(0, rows, y * top_w[rows, slot, None].to(x.dtype))
    s = p + "shared_expert."
    shared = (F.silu(x @ t[s + "gate_proj.weight"].T) * (x @ t[s + "up_proj.weight"].T)) @ t[s + "down_proj.weight"].T
    return out + torch.sigmoid(x @ t[p + "shared_expert_gate.weight"].T) * shared


def head_rows(w: HeadWeights, hidden: torch.Tensor, tokens: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Rows (hidden[i], tokens[i]) at positions pos[i], causal -> out after mtp.norm [n, H]."""
    c, t = w.cfg, w.t
    e = rms_norm(w.embed[tokens], t["mtp.pre_fc_norm_embedding.weight"], c.rms_norm_eps)
    h = rms_norm(hidden, t["mtp.pre_fc_norm_hidden.weight"], c.rms_norm_eps)
    x = torch.cat([e, h], -1) @ t["mtp.fc.weight"].T
    p = "mtp.layers.0."
    x = x + attention(w, rms_norm(x, t[p + "input_layernorm.weight"], c.rms_norm_eps), pos)
    x = x + moe(w, rms_norm(x, t[p + "post_attention_layernorm.weight"], c.rms_norm_eps))
    return rms_norm(x, t["mtp.norm.weight"], c.rms_norm_eps)


def draft(w: HeadWeights, hidden: torch.Tensor, tokens: torch.Tensor, depth: int) -> list[int]:
    """Greedy drafts after the committed tokens.

    hidden [n+1, H]: the backbone's post-norm states at positions 0..n (tokens x_0..x_n);
    tokens [n+2]: x_0..x_{n+1}, the last one the token just picked. Returns `depth` drafts for
    x_{n+2}, x_{n+3}, ... (full recompute of every row, no cache).
    """
    n1 = hidden.shape[0]
    assert tokens.shape[0] == n1 + 1
    rows_h, rows_t = hidden, tokens[1:]
    pos = torch.arange(1, n1 + 1)
    out = []
    for _ in range(depth):
        o = head_rows(w, rows_h, rows_t, pos)[-1]
        d = int((o @ w.lm_head.T).argmax())
        out.append(d)
        rows_h = torch.cat([rows_h, o[None]], 0)
        rows_t = torch.cat([rows_t, torch.tensor([d], dtype=rows_t.dtype)])
        pos = torch.cat([pos, pos[-1:] + 1])
    return out


# --------------------------------------------------------------- evaluation (transformers)
# Wirings for the head's inputs: the contract ("post_norm") and wrong ones a test can check
# lose acceptance: the state before model.norm, the fc halves swapped (hidden first), and the
# token of the same position instead of the next one.
WIRINGS = ("post_norm", "pre_norm", "swapped_fc", "same_token")


def wired(w: HeadWeights, wiring: str) -> HeadWeights:
    if wiring != "swapped_fc":
        return w
    H = w.cfg.hidden_size
    fc = w.t["mtp.fc.weight"]
    t = dict(w.t, **{"mtp.fc.weight": torch.cat([fc[:, H:], fc[:, :H]], 1)})
    return HeadWeights(w.cfg, t, w.embed, w.lm_head)


def backbone_hidden(model, ids: torch.Tensor, pre_norm: bool = False):
    """(hidden [T, H], logits [T, V]) of a transformers Qwen3NextForCausalLM over ids [T];
    hidden is the state after model.norm, or its input when pre_norm."""
    grabbed = {}
    hook = model.model.norm.register_forward_hook(lambda m, i, o: grabbed.update(pre=i[0], post=o))
    try:
        with torch.no_grad():
            logits = model(input_ids=ids[None], use_cache=False).logits[0]
    finally:
        hook.remove()
    return grabbed["pre" if pre_norm else "post"][0], logits


def greedy_acceptance(model, w: HeadWeights, prompt_ids: list[int], n_new: int = 128, depth: int = 3,
                      wirings=("post_norm", "pre_norm")) -> dict:
    """Greedy-decode n_new (+depth) tokens, then at every step draft `depth` tokens with the
    head (as the engine would right after picking that step's token) and score them against
    the greedy tokens that follow. Per wiring: acceptance per depth given the drafts before
    it were right, the fraction of steps whose chain is right up to each depth, and the mean
    number of leading right drafts."""
    with torch.no_grad():
        seq = model.generate(torch.tensor([prompt_ids]), max_new_tokens=n_new + depth,
                             min_new_tokens=n_new + depth, do_sample=False, use_cache=True)[0]
    P = len(prompt_ids)
    post, logits = backbone_hidden(model, seq)
    # the full recompute must pick what generate picked (else a near-tie changed the text)
    result = {"steps": n_new, "generate_vs_recompute_mismatch": int((logits.argmax(-1)[P - 1:-1] != seq[P:]).sum()),
              "text_ids": seq[P:P + n_new].tolist()}
    for wiring in wirings:
        hidden = backbone_hidden(model, seq, pre_norm=True)[0] if wiring == "pre_norm" else post
        wt = wired(w, wiring)
        right, reached, lead = torch.zeros(depth), torch.zeros(depth), []
        with torch.no_grad():
            for n in range(P - 1, P - 1 + n_new):  # x_{n+1} = seq[n+1] is the token just picked
                toks = _same(seq, n) if wiring == "same_token" else seq[: n + 2]
                ds = draft(wt, hidden[: n + 1], toks, depth)
                k = 0
                for d in range(depth):
                    reached[d] += 1
                    if ds[d] != int(seq[n + 2 + d]):
                        break
                    right[d] += 1
                    k += 1
                lead.append(k)
        result[wiring] = {"accept_conditional": [round(float(a), 4) for a in right / reached.clamp(min=1)],
                          "accept_chain": [round(float(r) / n_new, 4) for r in right],
                          "mean_accepted": round(sum(lead) / len(lead), 4)}
    return result


def _same(seq: torch.Tensor, n: int) -> torch.Tensor:
    """Tokens for the "same_token" wiring: pair p gets x_p instead of x_{p+1}."""
    return torch.cat([seq[:1], seq[: n + 1]])


def teacher_forced_agreement(model, w: HeadWeights, ids: torch.Tensor, seq: int = 1024, windows: int = 4,
                             wirings=WIRINGS) -> dict:
    """Depth-1 draft == the LM's greedy pick, over `windows` held-out windows spread over ids
    (the text is the held-out file, not the model's own output)."""
    stride = max(1, (ids.numel() // seq) // windows)
    hits = {k: 0 for k in wirings}
    total = 0
    for i in range(windows):
        x = ids[i * stride * seq:(i * stride + 1) * seq]
        post, logits = backbone_hidden(model, x)
        greedy = logits[1:-1].argmax(-1)                       # the LM's pick for x_{p+2}
        total += greedy.numel()
        for wiring in wirings:
            h = backbone_hidden(model, x, pre_norm=True)[0] if wiring == "pre_norm" else post
            toks = x[:-2] if wiring == "same_token" else x[1:-1]
            wt = wired(w, wiring)
            with torch.no_grad():
                d1 = (head_rows(wt, h[:-2], toks, torch.arange(1, seq - 1)) @ wt.lm_head.T).argmax(-1)
            hits[wiring] += int((d1 == greedy).sum())
    return {"pairs": total, **{k: round(v / total, 4) for k, v in hits.items()}}


def heldout_losses(model, w: HeadWeights, ids: torch.Tensor, seq: int = 1024, max_windows: int | None = None) -> dict:
    """Mean LM and depth-1 MTP cross entropy over non-overlapping windows, fp32."""
    n = ids.numel() // seq
    n = min(n, max_windows) if max_windows else n
    lm = mtp = 0.0
    for i in range(n):
        x = ids[i * seq:(i + 1) * seq]
        hidden, logits = backbone_hidden(model, x)
        lm += float(F.cross_entropy(logits[:-1].float(), x[1:]))
        with torch.no_grad():
            out = head_rows(w, hidden[:-2], x[1:-1], torch.arange(1, seq - 1))
            mtp += float(F.cross_entropy((out @ w.lm_head.T).float(), x[2:]))
    return {"windows": n, "seq": seq, "lm_loss": lm / n, "lm_ppl": math.exp(lm / n), "mtp_loss": mtp / n}


def main() -> None:
    from tokenizers import Tokenizer
    from transformers import Qwen3NextForCausalLM

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(Path(__file__).resolve().parent.parent / "verispec/data/default_model"))
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--wirings", default=",".join(WIRINGS))
    ap.add_argument("--heldout", metavar="NPY", help="held-out token ids (.devcarry/heldout.npy from make_corpus)")
    ap.add_argument("--agreement-windows", type=int, default=0, help="teacher-forced depth-1 agreement windows")
    ap.add_argument("--loss-windows", type=int, default=0, help="held-out loss windows (0: skip)")
    args = ap.parse_args()
    torch.manual_seed(0)
    model = Qwen3NextForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    w = load_head(args.model)
    tok = Tokenizer.from_file(str(Path(args.model) / "tokenizer.json"))
    wirings = tuple(args.wirings.split(","))
    r = greedy_acceptance(model, w, tok.encode(HELDOUT_PROMPT).ids, args.new, args.depth, wirings)
    r["continuation"] = tok.decode(r.pop("text_ids"))
    print("greedy acceptance on the fixed held-out prompt:", json.dumps(r, indent=1), flush=True)
    result = {"greedy": r}
    if args.heldout:
        import numpy as np

        ids = torch.from_numpy(np.load(args.heldout).astype(np.int64))
        if args.agreement_windows:
            result["agreement"] = teacher_forced_agreement(model, w, ids, windows=args.agreement_windows,
                                                           wirings=wirings)
            print("teacher-forced depth-1 agreement:", json.dumps(result["agreement"]), flush=True)
        if args.loss_windows:
            result["heldout"] = heldout_losses(model, w, ids, max_windows=args.loss_windows)
            print("held-out losses (fp32):", json.dumps(result["heldout"]), flush=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
