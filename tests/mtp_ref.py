"""A plain reference MTP head: full recompute over all pairs, no cache, plain torch.

Written from the release layout's definition (models/mtp.py docstring), sharing no code
with the engine: pair p = (h_p, x_{p+1}) -> fc([norm_e(embed x), norm_h(h)]) -> one gated
attention layer (causal over the pairs, RoPE position p+1) with its MoE -> norm -> lm_head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _rms(x, w, eps, plus_one=True):
    x = x.double()
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y * ((1.0 + w.double()) if plus_one else w.double())


class RefHead:
    def __init__(self, cfg: dict, tensors: dict, embed: torch.Tensor, lm_head: torch.Tensor):
        self.t = {k: v.double() for k, v in tensors.items()}
        self.c = cfg
        self.embed, self.lm_head = embed.double(), lm_head.double()

    def _rope(self, x, positions):
        hd = x.shape[-1]
        rot = int(hd * self.c.get("partial_rotary_factor", 0.25))
        theta = self.c.get("rope_theta", 10000.0)
        inv = 1.0 / (theta ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot))
        f = positions[:, None].double() * inv[None]
        cos, sin = torch.cat([f, f], -1).cos(), torch.cat([f, f], -1).sin()
        xr, xp = x[..., :rot], x[..., rot:]
        rh = torch.cat([-xr[..., rot // 2:], xr[..., :rot // 2]], -1)
        return torch.cat([xr * cos[:, None] + rh * sin[:, None], xp], -1)

    def forward(self, hidden: torch.Tensor, tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden [n, H] (row p: the hidden input of pair p), tokens [n]. Returns (logits, out) [n, ...]."""
        c, t = self.c, self.t
        eps = c.get("rms_norm_eps", 1e-6)
        n = hidden.shape[0]
        nh, nkv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        e = _rms(self.embed[torch.tensor(tokens)], t["mtp.pre_fc_norm_embedding.weight"], eps)
        h = _rms(hidden, t["mtp.pre_fc_norm_hidden.weight"], eps)
        u = torch.cat([e, h], -1) @ t["mtp.fc.weight"].T
        p = "mtp.layers.0."
        x = _rms(u, t[p + "input_layernorm.weight"], eps)
        qg = (x @ t[p + "self_attn.q_proj.weight"].T).view(n, nh, 2 * hd)
        q, gate = qg[..., :hd], qg[..., hd:].reshape(n, nh * hd)
        k = (x @ t[p + "self_attn.k_proj.weight"].T).view(n, nkv, hd)
        v = (x @ t[p + "self_attn.v_proj.weight"].T).view(n, nkv, hd)
        q = _rms(q, t[p + "self_attn.q_norm.weight"], eps)
        k = _rms(k, t[p + "self_attn.k_norm.weight"], eps)
        pos = torch.arange(1, n + 1)
        q, k = self._rope(q, pos), self._rope(k, pos)
        rep = nh // nkv
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        scores = torch.einsum("qhd,khd->hqk", q, k) * hd ** -0.5
        scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
        o = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(n, nh * hd)
        u = u + (o * torch.sigmoid(gate)) @ t[p + "self_attn.o_proj.weight"].T
        x = _rms(u, t[p + "post_attention_layernorm.weight"], eps)
        u = u + self._moe(x)
        out = _rms(u, t["mtp.norm.weight"], eps)
        return out @ self.lm_head.T, out

    def _moe(self, x):
        c, t = self.c, self.t
        p = "mtp.layers.0.mlp."
        probs = (x @ t[p + "gate.weight"].T).softmax(-1)
        w, idx = probs.topk(c["num_experts_per_tok"], -1)
        if c.get("norm_topk_prob", True):
            w = w / w.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        for r in range(x.shape[0]):
            for j in range(idx.shape[1]):
                e = int(idx[r, j])
                g = x[r] @ t[f"{p}experts.{e}.gate_proj.weight"].T
                up = x[r] @ t[f"{p}experts.{e}.up_proj.weight"].T
                out[r] += w[r, j] * ((F.silu(g) * up) @ t[f"{p}experts.{e}.down_proj.weight"].T)
        sh = (F.silu(x @ t[p + "shared_expert.gate_proj.weight"].T) * (x @ t[p + "shared_expert.up_proj.weight"].T)) \
            @ t[p + "shared_expert.down_proj.weight"].T
        return out + torch.sigmoid(x @ t[p + "shared_expert_gate.weight"].T) * sh

    def chain(self, hidden: torch.Tensor, tokens: list[int], depth: int) -> list[torch.Tensor]:
        """Stateless drafts: pairs 0..n-1 given; each deeper row feeds the previous row's
        output with its argmax token. Returns the logits of the last pair and each deeper row."""
        hid, toks, out_logits = hidden.double(), list(tokens), []
        for _ in range(depth):
            logits, out = self.forward(hid, toks)
            out_logits.append(logits[-1])
            hid = torch.cat([hid, out[-1:]])
            toks.append(int(logits[-1].argmax()))
        return out_logits
