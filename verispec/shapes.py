"""The named model shapes of `verispec bench --random-config` and the random-weight benchmarks:
plain config dicts, importable without torch (the CLI's parser lists them)."""

from __future__ import annotations

QWEN36_35B_A3B_SHAPE = {
    "model_type": "qwen3_5_moe",
    "vocab_size": 248320,
    "hidden_size": 2048,
    "num_hidden_layers": 40,
    "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(40)],
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "linear_num_key_heads": 16,
    "linear_key_head_dim": 128,
    "linear_num_value_heads": 32,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "num_experts": 256,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512,
    "mtp_num_hidden_layers": 1,
    "tie_word_embeddings": False,
    "max_position_embeddings": 262144,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25},
}

# A small member of the family (fits a laptop and the CPU test suite).
SMALL_SHAPE = {**QWEN36_35B_A3B_SHAPE, "vocab_size": 4096, "hidden_size": 256, "num_hidden_layers": 4,
               "layer_types": ["linear_attention"] * 3 + ["full_attention"], "num_attention_heads": 4,
               "head_dim": 64, "linear_num_key_heads": 2, "linear_key_head_dim": 64, "linear_num_value_heads": 4,
               "linear_value_head_dim": 64, "num_experts": 16, "num_experts_per_tok": 4,
               "moe_intermediate_size": 128, "shared_expert_intermediate_size": 128, "max_position_embeddings": 4096}

PRESETS = {"qwen3.6-35b-a3b-shape": QWEN36_35B_A3B_SHAPE, "small": SMALL_SHAPE}
ROUTINGS = ("independent", "correlated")


def preset_config(name: str, layers: int | None = None) -> dict:
    if name not in PRESETS:
        raise ValueError(f"unknown random config {name!r}; presets: {', '.join(PRESETS)}")
    cfg = dict(PRESETS[name])
    if layers is not None:
        if layers < 1:
            raise ValueError("layers must be >= 1")
        types = cfg["layer_types"]
        cfg["num_hidden_layers"] = layers
        cfg["layer_types"] = [types[i % len(types)] for i in range(layers)]
    return cfg
