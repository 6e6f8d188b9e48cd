"""Memory plan from a config alone: weights, KV cache, recurrent state, copy slots, MTP head.

The numbers are the bytes the engine allocates (fp32 on the CPU); tests check them against
a loaded fixture.
"""

from __future__ import annotations

import torch

from .execution import PAD_ROWS, Execution
from .models import ModelArgs

MIB = 1024 * 1024


def _layer_params(a: ModelArgs, i: int, kind: str) -> int:
    h = a.hidden_size
    if kind == "linear_attention":
        kd, vd, hv = a.key_dim, a.value_dim, a.linear_num_value_heads
        mixer = h * (2 * kd + 2 * vd + 2 * hv) + (2 * kd + vd) * a.linear_conv_kernel_dim \
            + 2 * hv + a.linear_value_head_dim + vd * h
    else:
        nh, nkv, hd = a.num_attention_heads, a.num_key_value_heads, a.head_dim
        mixer = h * (2 * nh * hd + 2 * nkv * hd) + 2 * hd + nh * hd * h
    return mixer + _mlp_params(a, i) + 2 * h


def _moe_params(a: ModelArgs) -> int:
    """Routed experts, plus the router + shared expert gate + shared gate/up (one matrix whose
    rows the loader pads with zeros to a multiple of 8) and the shared down projection."""
    h, si = a.hidden_size, a.shared_expert_intermediate_size
    pre_rows = a.num_experts + 1 + 2 * si
    pre_rows += -pre_rows % 8
    return a.num_experts * 3 * h * a.moe_intermediate_size + pre_rows * h + si * h


def _mlp_params(a: ModelArgs, i: int) -> int:
    if a.is_moe(i):
        return _moe_params(a)
    return 3 * a.hidden_size * a.intermediate_size


def weight_params(a: ModelArgs) -> int:
    n = a.vocab_size * a.hidden_size * (1 if a.tie_word_embeddings else 2) + a.hidden_size
    return n + sum(_layer_params(a, i, t) for i, t in enumerate(a.layer_types))


def active_params(a: ModelArgs) -> int:
    """The weights one decode row reads: every mixer matrix, the router, the shared expert and
    top-k routed experts (or the dense MLP) per layer, and the lm_head (the embedding row and the
    norms are negligible)."""
    h = a.hidden_size
    total = a.vocab_size * h
    for i, kind in enumerate(a.layer_types):
        if kind == "linear_attention":
            kd, vd = a.key_dim, a.value_dim
            total += h * (2 * kd + 2 * vd + 2 * a.linear_num_value_heads) + vd * h
        else:
            nh, nkv, hd = a.num_attention_heads, a.num_key_value_heads, a.head_dim
            total += h * (2 * nh * hd + 2 * nkv * hd) + nh * hd * h
        if a.is_moe(i):
            total += (a.num_experts + 1 + 3 * a.shared_expert_intermediate_size) * h
            total += a.num_experts_per_tok * 3 * a.moe_intermediate_size * h
        else:
            total += 3 * h * a.intermediate_size
    return total


def mtp_params(a: ModelArgs) -> int:
    if not a.mtp_layers:
        return 0
    h = a.hidden_size
    nh, nkv, hd = a.num_attention_heads, a.num_key_value_heads, a.head_dim
    attn = h * (2 * nh * hd + 2 * nkv * hd) + 2 * hd + nh * hd * h
    # the checkpoint's tensors (the loader's padding of the router matrix, a few rows, not counted)
    moe = (a.num_experts * 3 * h * a.moe_intermediate_size + a.num_experts * h
           + 3 * h * a.shared_expert_intermediate_size + h) if a.num_experts else 3 * h * a.intermediate_size
    return a.mtp_layers * (2 * h * h + 3 * h + attn + moe + 2 * h)


def _alog(a: ModelArgs) -> int:
    return sum(t == "linear_attention" for t in a.layer_types) * a.linear_num_value_heads


def layout_of(device: str) -> Execution:
    """The dtypes a device runs with; planning needs no GPU, only its layout."""
    return Execution("cuda", torch.bfloat16, PAD_ROWS) if device == "cuda" else Execution()


def plan(a: ModelArgs, context: int, layout: Execution | None = None) -> dict:
    layout = layout or Execution()
    s = a.state_shapes(context, layout)
    elem = torch.empty(0, dtype=layout.dtype).element_size()
    slot = s.slot_bytes
    return {
        "context": context,
        "device": layout.torch_device.type,
        "dtype": str(layout.dtype).replace("torch.", ""),
        # exp(A_log) is kept in fp32 whatever the layout (the decay is computed in fp32)
        "weights_bytes": (weight_params(a) - _alog(a)) * elem + _alog(a) * 4,
        "kv_cache_bytes": s.kv_bytes,
        "recurrent_state_bytes": s.recurrent_bytes,
        "copy_slot_bytes": slot,
        "slots_by_depth": {str(k): k * slot for k in range(1, 8)},
        "mtp_head_bytes": mtp_params(a) * elem,
        "mtp_kv_bytes": 2 * a.num_key_value_heads * context * a.head_dim * elem if a.mtp_layers else 0,
    }


def describe(p: dict) -> str:
    def mib(b):
        return f"{b / MIB:.1f} MiB"
    lines = [
        f"weights            {mib(p['weights_bytes'])}",
        f"KV cache           {mib(p['kv_cache_bytes'])} at context {p['context']}",
        f"recurrent state    {mib(p['recurrent_state_bytes'])}",
        f"one copy slot      {mib(p['copy_slot_bytes'])}",
        "copy slots by depth " + ", ".join(f"{k}: {mib(v)}" for k, v in p["slots_by_depth"].items()),
    ]
    if p["mtp_head_bytes"]:
        lines.append(f"MTP head           {mib(p['mtp_head_bytes'])} (+ its KV {mib(p['mtp_kv_bytes'])})")
    return "\n".join(lines)
