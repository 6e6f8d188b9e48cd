"""`verispec plan`: the seed's copy-slot prices at the Qwen3.6-35B-A3B shapes, and on
fixtures the very bytes the engine allocates."""

from __future__ import annotations

import json

import pytest

from model_fixtures import fixture_dir
from verispec.random_model import QWEN36_35B_A3B_SHAPE
from verispec.cli import main
from verispec.engine import Engine
from verispec.weights import load_checkpoint

MIB = 1024 * 1024

# The shapes of Qwen3.6-35B-A3B (text model): 40 layers, 3 DeltaNet : 1 attention.
QWEN36_35B_A3B = QWEN36_35B_A3B_SHAPE


def plan_json(capsys, *argv) -> dict:
    capsys.readouterr()
    rc = main(["plan", *map(str, argv), "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    return json.loads(out)


def test_qwen36_copy_slots_match_the_seed_table(capsys, tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(QWEN36_35B_A3B))
    p = plan_json(capsys, "--config", cfg, "--context", 4096)
    # the seed's table: one slot ~63 MiB, five ~314 MiB
    assert abs(p["copy_slot_bytes"] / MIB - 63) <= 1
    assert abs(p["slots_by_depth"]["5"] / MIB - 314) <= 1
    # and exactly: 30 DeltaNet layers x (fp32 state [32, 128, 128] + conv ring [2*16*128 + 32*128, 3])
    assert p["copy_slot_bytes"] == 30 * (32 * 128 * 128 * 4 + (2 * 16 * 128 + 32 * 128) * 3 * 4)
    assert p["slots_by_depth"] == {str(k): k * p["copy_slot_bytes"] for k in range(1, 8)}
    assert p["recurrent_state_bytes"] == p["copy_slot_bytes"]
    # KV: 10 attention layers x K and V x 2 kv heads x 4096 x 256 x fp32
    assert p["kv_cache_bytes"] == 10 * 2 * 2 * 4096 * 256 * 4 == 160 * MIB
    # weights in fp32: about 34.7e9 parameters for the backbone, 0.84e9 for the head
    assert 34.0e9 < p["weights_bytes"] / 4 < 35.5e9
    assert 0.8e9 < p["mtp_head_bytes"] / 4 < 0.9e9
    assert p["mtp_kv_bytes"] == 2 * 2 * 4096 * 256 * 4


def test_qwen36_nested_release_config_plans_the_same(capsys, tmp_path):
    """A release nests the text model under text_config beside a vision tower."""
    flat = tmp_path / "flat.json"
    flat.write_text(json.dumps(QWEN36_35B_A3B))
    nested = tmp_path / "nested.json"
    text = {k: v for k, v in QWEN36_35B_A3B.items() if k != "model_type"}
    nested.write_text(json.dumps({"model_type": "qwen3_5_moe", "text_config": {**text, "model_type": "qwen3_5_moe_text"},
                                  "vision_config": {"depth": 27}, "tie_word_embeddings": False}))
    assert plan_json(capsys, "--config", nested) == plan_json(capsys, "--config", flat)


def test_human_output(capsys, tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(QWEN36_35B_A3B))
    capsys.readouterr()
    assert main(["plan", "--config", str(cfg), "--context", "4096"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    lines = out.splitlines()
    assert any(line.startswith("one copy slot") and "62.8 MiB" in line for line in lines), out
    assert any(line.startswith("KV cache") and "160.0 MiB" in line and "4096" in line for line in lines), out
    assert any("5: 314.1 MiB" in line for line in lines), out
    assert any(line.startswith("MTP head") for line in lines), out


FIXTURES = [
    dict(family="qwen3_next"),
    dict(family="qwen3_5_moe"),
    dict(family="qwen3_next", mtp=True),
    dict(family="qwen3_5_moe", mtp=True, tie_word_embeddings=True),
    dict(family="qwen3_next", decoder_sparse_step=2),        # dense MLPs on every other layer
    dict(family="qwen3_5_moe", hidden_size=48, num_layers=6, num_experts=3, top_k=1,
         linear_num_value_heads=6, linear_num_key_heads=3, num_key_value_heads=1),
]


@pytest.mark.parametrize("kw", FIXTURES, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()))
@pytest.mark.parametrize("context", [1, 77])
def test_plan_equals_what_the_engine_allocates(capsys, kw, context):
    fx = fixture_dir(**kw)
    p = plan_json(capsys, "--model", fx, "--context", context)
    eng = Engine(fx)
    assert p["weights_bytes"] == eng.model.weight_bytes
    state = eng.model.new_state(context)
    kv = sum(t.numel() * t.element_size() for t in state.k + state.v)
    assert p["kv_cache_bytes"] == kv
    assert p["recurrent_state_bytes"] == state.allocated_bytes - kv
    before = state.allocated_bytes
    assert state.ensure_slots(1)
    assert p["copy_slot_bytes"] == state.allocated_bytes - before
    assert state.ensure_slots(5)
    assert p["slots_by_depth"]["5"] == state.allocated_bytes - before
    mtp = load_checkpoint(fx).mtp
    assert p["mtp_head_bytes"] == sum(t.numel() * t.element_size() for t in mtp.values())
    assert (p["mtp_head_bytes"] > 0) == bool(kw.get("mtp"))
