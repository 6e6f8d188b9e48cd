"""The multi-token-prediction head (Qwen3-Next / Qwen3.5 release layout, `mtp.*`).

Pair p = (h_p, x_{p+1}): the backbone's hidden state at position p and the token that
followed it. The head's row for pair p sits at index p of its own KV cache and is rotated
at position p+1:

    u   = fc([pre_fc_norm_embedding(embed(x_{p+1})), pre_fc_norm_hidden(h_p)])   # [H]
    out = norm(decoder_layer(u))          # one full-attention layer with its MoE
    logits = lm_head(out)                 # predicts x_{p+2}

A deeper draft feeds `out` (the head's own output) with the draft just proposed in place of
the backbone's hidden state. `wiring` says whether h_p is taken after the backbone's final
norm ("post", the seed's reading) or before it ("pre").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import ModelFormatError
from .layers import rms_norm
from .qwen3_next import DenseMLP, FullAttn, Model, MoE, _Weights, load_full_attn, load_moe

WIRINGS = ("post", "pre")


@dataclass
class HeadCache:
    k: list[torch.Tensor]     # one layer: [kv_heads, max_len, head_dim]
    v: list[torch.Tensor]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


@dataclass
class MTPHead:
    model: Model                   # the backbone: embedding, lm_head, RoPE, the layer math
    fc: torch.Tensor               # [H, 2H]
    norm_emb: torch.Tensor
    norm_hidden: torch.Tensor
    in_norm: torch.Tensor
    post_norm: torch.Tensor
    attn: FullAttn
    mlp: MoE | DenseMLP
    norm: torch.Tensor
    wiring: str = "post"

    @staticmethod
    def load(model: Model, tensors: dict[str, torch.Tensor], wiring: str = "post") -> "MTPHead":
        if wiring not in WIRINGS:
            raise ValueError(f"wiring must be one of {WIRINGS}")
        a = model.args
        h = a.hidden_size
        ex = model.exec
        tensors = {k: v.to(device=ex.torch_device, dtype=ex.dtype if v.is_floating_point() else v.dtype)
                   for k, v in tensors.items()}
        w = _Weights(tensors)
        p = "mtp.layers.0"
        fc = w.pop("mtp.fc.weight", (h, 2 * h))
        head = MTPHead(
            model, fc, w.pop("mtp.pre_fc_norm_embedding.weight", (h,)), w.pop("mtp.pre_fc_norm_hidden.weight", (h,)),
            w.pop(f"{p}.input_layernorm.weight", (h,)), w.pop(f"{p}.post_attention_layernorm.weight", (h,)),
            load_full_attn(w, f"{p}.self_attn", a, 0),
            load_moe(w, f"{p}.mlp", a) if a.num_experts else _dense(w, f"{p}.mlp", a),
            w.pop("mtp.norm.weight", (h,)), wiring)
        if any(k.startswith("mtp.layers.") and not k.startswith(p) for k in w.t):
            raise ModelFormatError("MTP heads of more than one layer are not supported")
        w.finish()
        return head

    @property
    def weight_bytes(self) -> int:
        ts = [self.fc, self.norm_emb, self.norm_hidden, self.in_norm, self.post_norm, self.norm]
        for obj in (self.attn, self.mlp):
            for v in vars(obj).values():
                ts += v if isinstance(v, list) else [v] if isinstance(v, torch.Tensor) else []
        return sum(t.numel() * t.element_size() for t in ts)

    def new_cache(self, max_len: int) -> HeadCache:
        a = self.model.args
        shape = (a.num_key_value_heads, max_len, a.head_dim)
        on = {"dtype": self.fc.dtype, "device": self.fc.device}
        return HeadCache([torch.zeros(shape, **on)], [torch.zeros(shape, **on)])

    def pick_hidden(self, out) -> torch.Tensor:
        """The backbone rows the head reads, by wiring: [rows, H]."""
        return out.hidden if self.wiring == "post" else out.hidden_pre

    def _inputs(self, hidden: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        eps = self.model.args.rms_norm_eps
        e = rms_norm(self.model.embed[tokens.to(self.fc.device)], self.norm_emb, eps)
        h = rms_norm(hidden, self.norm_hidden, eps)
        return F.linear(torch.cat([e, h], dim=-1), self.fc)

    def absorb(self, cache: HeadCache, hidden: torch.Tensor, tokens, index: int) -> None:
        """Write the K/V of completed pairs at index.. (the attention's keys only: no MoE, no output)."""
        tokens = torch.as_tensor(tokens, dtype=torch.long).reshape(-1)
        u = self._inputs(hidden, tokens)
        x = rms_norm(u, self.in_norm, self.model.args.rms_norm_eps)
        _, _, k, v = self.model.qkv(self.attn, x, index + 1, F.linear)
        rows = tokens.shape[0]
        cache.k[0][:, index:index + rows] = k.transpose(0, 1)
        cache.v[0][:, index:index + rows] = v.transpose(0, 1)

    def row(self, cache: HeadCache, hidden: torch.Tensor, token: int, index: int,
            vocab_ids: torch.Tensor | None = None, vocab_weight: torch.Tensor | None = None):
        """One full head row at `index` (writes its K/V there). Returns (scores [n], out [1, H]):
        scores over the vocabulary list when given (vocab_weight = lm_head rows of vocab_ids)."""
        a = self.model.args
        tok = torch.tensor([token], dtype=torch.long)
        u = self._inputs(hidden.reshape(1, -1), tok)
        x = rms_norm(u, self.in_norm, a.rms_norm_eps)
        u = u + self.model._full_attn(self.attn, x, cache, index, False, F.linear, pos_offset=1)
        x = rms_norm(u, self.post_norm, a.rms_norm_eps)
        mlp = self.model.moe if isinstance(self.mlp, MoE) else self.model.dense
        u = u + mlp(self.mlp, x, F.linear, False)
        out = rms_norm(u, self.norm, a.rms_norm_eps)
        weight = vocab_weight if vocab_ids is not None else self.model.lm_head
        return F.linear(out, weight)[0], out


def _dense(w: _Weights, p: str, a) -> DenseMLP:
    g = w.pop(f"{p}.gate_proj.weight", (a.intermediate_size, a.hidden_size))
    u = w.pop(f"{p}.up_proj.weight", (a.intermediate_size, a.hidden_size))
    return DenseMLP(torch.cat([g, u], 0).contiguous(), w.pop(f"{p}.down_proj.weight", (a.hidden_size, a.intermediate_size)))
