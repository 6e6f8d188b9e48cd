"""bench/cuda_step_probe.py's accounting (runs on the CPU; the probe itself needs a GPU): its phases
hold exactly the bytes a decode step must read, in the step's order, and its request tables let
the routed experts' phases start only after the router's phase (or each phase only in itself)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import cuda_step_probe as probe  # noqa: E402

from verispec.random_model import active_weight_bytes, preset_config  # noqa: E402


def test_phases_hold_the_step_bytes_in_order():
    cfg = preset_config("qwen3.6-35b-a3b-shape")
    ph = probe.phases(cfg)
    assert sum(b for _, b, _ in ph) == active_weight_bytes(cfg)
    per_layer = {"linear_attention": 9, "full_attention": 9}
    assert len(ph) == sum(per_layer[k] for k in cfg["layer_types"]) + 2
    assert ph[-1][0] == "lm_head" and ph[0][0] == ("in_conv" if cfg["layer_types"][0] == "linear_attention" else "qkv")
    assert {n for n, _, routed in ph if routed} == {"gate_up", "down"}


def test_request_tables():
    ph = probe.phases(preset_config("qwen3.6-35b-a3b-shape", layers=4))
    off, fr = probe.tables(ph, ahead=True)
    assert len(off) == len(ph) + 1 and off[0] == 0
    assert all(off[p + 1] - off[p] == -(-b // probe.UNIT) for p, (_, b, _) in enumerate(ph))
    for p, (name, _, routed) in enumerate(ph):
        if routed:                       # from the phase after this layer's router on, never before it
            route = max(q for q in range(p) if ph[q][0] == "route")
            assert fr[p] == route + 1
        else:
            assert fr[p] == 0
    assert probe.tables(ph, ahead=False)[1] == list(range(len(ph)))
    empty, _ = probe.tables(ph, ahead=True, empty=True)
    assert empty == [0] * (len(ph) + 1)


def test_costed_phases_fold_the_byteless_steps_and_carry_their_costs():
    cfg = preset_config("qwen3.6-35b-a3b-shape")
    ph = probe.costed_phases(cfg, rec_ns=1000, attend_ns=700, combine_ns=500)
    types = cfg["layer_types"]
    n_lin = sum(k == "linear_attention" for k in types)
    state = cfg["linear_num_value_heads"] * cfg["linear_key_head_dim"] * cfg["linear_value_head_dim"] * 4
    # the weights once, plus each DeltaNet layer's fp32 state read and written
    assert sum(q[1] for q in ph) == active_weight_bytes(cfg) + n_lin * 2 * state
    # a DeltaNet layer: in_conv, recurrence, gnorm_sync, out, router, route, gate_up, down; attention: qkv, attend, ...
    assert len(ph) == 8 * n_lin + 7 * (len(types) - n_lin) + 1
    assert {q[0] for q in ph if q[1] == 0} == {"gnorm_sync", "route", "attend"}
    sp = probe.spins(ph, small_ns=12345)           # small_ns is only for phases without their own cost
    assert sp == [q[3] for q in ph]
    assert {n: s for (n, *_), s in zip(ph, sp) if s} == {"recurrence": 1000, "attend": 700, "down": 500}
    assert sum(sp) == 1000 * n_lin + 700 * (len(types) - n_lin) + 500 * len(types)
    assert [q[0] for q in ph if q[2]] == ["gate_up", "down"] * len(types)


def test_spins_of_the_plain_phases():
    ph = probe.phases(preset_config("qwen3.6-35b-a3b-shape", layers=4))
    assert probe.spins(ph, 1000) == [1000 if b == 0 else 0 for _, b, _ in ph]
    assert probe.spins(ph, 0) == [0] * len(ph)


def test_a_verify_reads_its_distinct_experts_and_writes_a_slot_a_row():
    cfg = preset_config("qwen3.6-35b-a3b-shape")
    assert probe.phases(cfg, experts=cfg["num_experts_per_tok"]) == probe.phases(cfg)
    h, i, si = cfg["hidden_size"], cfg["moe_intermediate_size"], cfg["shared_expert_intermediate_size"]
    n_layers = len(cfg["layer_types"])
    more = probe.phases(cfg, experts=15.8)
    # only the routed phases grow: 7.8 more experts a layer, each 3 * I * H bf16 values
    extra = sum(b for _, b, _ in more) - sum(b for _, b, _ in probe.phases(cfg))
    assert abs(extra - n_layers * 7.8 * 3 * i * h * 2) <= 2 * n_layers
    assert [n for n, _, _ in more] == [n for n, _, _ in probe.phases(cfg)]
    one = probe.costed_phases(cfg, 1000, 700, 500)
    three = probe.costed_phases(cfg, 1000, 700, 500, rows=3, experts=23.3)
    state = cfg["linear_num_value_heads"] * cfg["linear_key_head_dim"] * cfg["linear_value_head_dim"] * 4
    rec1 = [q for q in one if q[0] == "recurrence"]
    rec3 = [q for q in three if q[0] == "recurrence"]
    assert all(q[1] == 2 * state and q[3] == 1000 for q in rec1)
    assert all(q[1] == 4 * state and q[3] == 3000 for q in rec3)     # read once, a slot written a row, rows in turn
    assert [q[3] for q in three if q[0] != "recurrence"] == [q[3] for q in one if q[0] != "recurrence"]
    assert si > 0
