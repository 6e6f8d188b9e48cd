"""Random-weight checkpoints at real shapes, made in memory on the target device.

No real checkpoint can be downloaded here, yet the GPU path must be measured at the shapes
it is for: a 35B-A3B hybrid reads ~6 GB of active weights per token, and what a verify
costs there (rows routed to different experts read more) is what the benchmarks report.
The tensors carry the release names (Qwen3.5 split projections, fused experts), so the
ordinary loader code (`Model`, `MTPHead.load`) builds the model from them.

Routing: "independent" draws every tensor at random, so neighbouring rows pick unrelated
experts; "correlated" gives every token embedding one shared direction (plus a smaller own
part), which the residual stream carries into every router, so neighbouring rows share most
of their experts, as neighbouring tokens of real text often do.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from .models import ModelArgs
from .plan import active_params
from .shapes import PRESETS, QWEN36_35B_A3B_SHAPE, ROUTINGS, SMALL_SHAPE, preset_config  # noqa: F401  (re-exported)
from .weights import Checkpoint

class _Gen:
    def __init__(self, seed: int, device, dtype):
        self.g = torch.Generator(device=device).manual_seed(seed)
        self.device, self.dtype = device, dtype

    def matrix(self, *shape, scale: float = 1.0) -> torch.Tensor:
        """Entries ~ N(0, scale^2 / fan_in): outputs keep the inputs' size."""
        t = torch.randn(shape, generator=self.g, device=self.device, dtype=self.dtype)
        return t.mul_(scale / math.sqrt(shape[-1]))

    def norm(self, n: int) -> torch.Tensor:
        """Zero-centred norm weights (1 + w), w ~ N(0, 0.1^2)."""
        return torch.randn(n, generator=self.g, device=self.device, dtype=self.dtype).mul_(0.1)

    def uniform(self, n: int, lo: float, hi: float) -> torch.Tensor:
        return torch.rand(n, generator=self.g, device=self.device, dtype=torch.float32).mul_(hi - lo).add_(lo)


def _attn(gen: _Gen, p: str, c: dict, out: dict) -> None:
    h, nh, nkv, hd = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    out[f"{p}.q_proj.weight"] = gen.matrix(2 * nh * hd, h)
    out[f"{p}.k_proj.weight"] = gen.matrix(nkv * hd, h)
    out[f"{p}.v_proj.weight"] = gen.matrix(nkv * hd, h)
    out[f"{p}.o_proj.weight"] = gen.matrix(h, nh * hd, scale=0.5)
    out[f"{p}.q_norm.weight"] = gen.norm(hd)
    out[f"{p}.k_norm.weight"] = gen.norm(hd)


def _moe(gen: _Gen, p: str, c: dict, out: dict) -> None:
    h, e, i, si = c["hidden_size"], c["num_experts"], c["moe_intermediate_size"], c["shared_expert_intermediate_size"]
    out[f"{p}.gate.weight"] = gen.matrix(e, h, scale=4.0)
    out[f"{p}.shared_expert_gate.weight"] = gen.matrix(1, h)
    out[f"{p}.shared_expert.gate_proj.weight"] = gen.matrix(si, h)
    out[f"{p}.shared_expert.up_proj.weight"] = gen.matrix(si, h)
    out[f"{p}.shared_expert.down_proj.weight"] = gen.matrix(h, si, scale=0.5)
    out[f"{p}.experts.gate_up_proj"] = gen.matrix(e, 2 * i, h)
    out[f"{p}.experts.down_proj"] = gen.matrix(e, h, i, scale=0.5)


def _linear_attn(gen: _Gen, p: str, c: dict, out: dict) -> None:
    h = c["hidden_size"]
    kd = c["linear_num_key_heads"] * c["linear_key_head_dim"]
    vd = c["linear_num_value_heads"] * c["linear_value_head_dim"]
    hv, k = c["linear_num_value_heads"], c["linear_conv_kernel_dim"]
    out[f"{p}.in_proj_qkv.weight"] = gen.matrix(2 * kd + vd, h)
    out[f"{p}.in_proj_z.weight"] = gen.matrix(vd, h)
    out[f"{p}.in_proj_b.weight"] = gen.matrix(hv, h)
    out[f"{p}.in_proj_a.weight"] = gen.matrix(hv, h)
    out[f"{p}.conv1d.weight"] = gen.matrix(2 * kd + vd, 1, k)
    out[f"{p}.A_log"] = gen.uniform(hv, 0.0, math.log(16.0)).to(gen.dtype)
    out[f"{p}.dt_bias"] = gen.uniform(hv, -1.0, 1.0).to(gen.dtype)
    out[f"{p}.norm.weight"] = (1.0 + gen.norm(c["linear_value_head_dim"])).to(gen.dtype)
    out[f"{p}.out_proj.weight"] = gen.matrix(h, vd, scale=0.5)


def random_checkpoint(config: dict, *, seed: int = 0, device="cpu", dtype=torch.bfloat16,
                      mtp: bool = True, routing: str = "independent", name: str = "random") -> Checkpoint:
    """A Checkpoint of random tensors with release names, made on `device` in `dtype`."""
    if routing not in ROUTINGS:
        raise ValueError(f"routing must be one of {ROUTINGS}")
    c = config
    gen = _Gen(seed, device, dtype)
    h, v = c["hidden_size"], c["vocab_size"]
    emb = gen.matrix(v, h, scale=math.sqrt(h))
    if routing == "correlated":
        emb.mul_(0.25).add_(gen.matrix(1, h, scale=math.sqrt(h)))   # shared direction: 4x each token's own
    t: dict[str, torch.Tensor] = {"model.embed_tokens.weight": emb}
    for li, kind in enumerate(c["layer_types"]):
        p = f"model.layers.{li}"
        t[f"{p}.input_layernorm.weight"] = gen.norm(h)
        t[f"{p}.post_attention_layernorm.weight"] = gen.norm(h)
        if kind == "linear_attention":
            _linear_attn(gen, f"{p}.linear_attn", c, t)
        else:
            _attn(gen, f"{p}.self_attn", c, t)
        _moe(gen, f"{p}.mlp", c, t)
    t["model.norm.weight"] = gen.norm(h)
    t["lm_head.weight"] = gen.matrix(v, h, scale=4.0)
    head: dict[str, torch.Tensor] = {}
    if mtp:
        head["mtp.fc.weight"] = gen.matrix(h, 2 * h)
        head["mtp.pre_fc_norm_embedding.weight"] = gen.norm(h)
        head["mtp.pre_fc_norm_hidden.weight"] = gen.norm(h)
        head["mtp.layers.0.input_layernorm.weight"] = gen.norm(h)
        head["mtp.layers.0.post_attention_layernorm.weight"] = gen.norm(h)
        _attn(gen, "mtp.layers.0.self_attn", c, head)
        _moe(gen, "mtp.layers.0.mlp", c, head)
        head["mtp.norm.weight"] = gen.norm(h)
    return Checkpoint(Path(f"<{name}>"), dict(c), t, head, mtp, str(dtype).replace("torch.", ""))


def active_weight_bytes(config: dict, elem: int = 2) -> int:
    """Bytes of the weights one decode row must read (verispec.plan.active_params) at elem bytes each."""
    return elem * active_params(ModelArgs.from_dict(config))


def expert_bytes(config: dict, elem: int = 2) -> int:
    return 3 * config["moe_intermediate_size"] * config["hidden_size"] * elem
