"""`verispec plan --device cuda`: the bf16 layout's bytes, equal to what that layout allocates."""

import json

import torch

from test_plan import QWEN36_35B_A3B, plan_json
from model_fixtures import fixture_dir

from verispec.engine import Engine
from verispec.execution import PAD_ROWS, Execution


def test_cuda_layout_halves_weights_kv_and_conv_not_the_delta_state(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(QWEN36_35B_A3B))
    cpu = plan_json(capsys, "--config", cfg, "--context", 4096)
    gpu = plan_json(capsys, "--config", cfg, "--context", 4096, "--device", "cuda")
    assert (cpu["dtype"], gpu["dtype"]) == ("float32", "bfloat16")
    alog = 30 * 32                     # exp(A_log) stays fp32: 30 DeltaNet layers x 32 value heads
    assert gpu["weights_bytes"] * 2 == cpu["weights_bytes"] + 4 * alog
    assert gpu["kv_cache_bytes"] * 2 == cpu["kv_cache_bytes"]
    # a copy slot: the fp32 delta state stays, the conv ring halves
    conv_cpu = 30 * (2 * 2048 + 4096) * 3 * 4
    assert cpu["copy_slot_bytes"] - gpu["copy_slot_bytes"] == conv_cpu // 2


def test_cuda_layout_plan_equals_allocation(capsys):
    d = fixture_dir("qwen3_next", 0, mtp=True)
    p = plan_json(capsys, "--model", d, "--context", 96, "--device", "cuda")
    eng = Engine(d, device=Execution("cpu", torch.bfloat16, PAD_ROWS))   # the same layout, allocated here
    st = eng.model.new_state(96)
    assert p["kv_cache_bytes"] + p["recurrent_state_bytes"] == st.allocated_bytes
    st.ensure_slots(3)
    assert st.allocated_bytes - p["kv_cache_bytes"] - p["recurrent_state_bytes"] == p["slots_by_depth"]["3"]
    assert p["weights_bytes"] == eng.model.weight_bytes
