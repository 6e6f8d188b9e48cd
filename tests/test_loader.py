"""Checkpoint layouts the loader accepts, and the ones it refuses with a clear error."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from model_fixtures import REPEAT_PROMPT, fixture_dir
from verispec.engine import Engine
from verispec.errors import ModelFormatError


def _logits(d):
    eng = Engine(d)
    st = eng.model.new_state(64)
    return eng.model.forward(REPEAT_PROMPT, st).logits


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def _fuse_experts(t: dict) -> dict:
    """Per-expert gate/up/down -> transformers' fused [E, 2I, H] and [E, H, I]."""
    out, groups = {}, {}
    for k, v in t.items():
        if ".mlp.experts." in k and k.split(".mlp.experts.")[1].split(".")[0].isdigit():
            prefix, rest = k.split(".mlp.experts.")
            e, name = rest.split(".", 1)
            groups.setdefault(prefix, {})[(int(e), name)] = v
        else:
            out[k] = v
    for prefix, g in groups.items():
        n = max(e for e, _ in g) + 1
        out[f"{prefix}.mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat([g[(e, "gate_proj.weight")], g[(e, "up_proj.weight")]]) for e in range(n)])
        out[f"{prefix}.mlp.experts.down_proj"] = torch.stack([g[(e, "down_proj.weight")] for e in range(n)])
    return out


@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5_moe"])
def test_fused_nested_and_sharded_layouts_give_the_same_logits(family, tmp_path, capsys):
    src = fixture_dir(family, 0, mtp=True)
    want = _logits(src)
    t = load_file(str(src / "model.safetensors"))

    fused = _copy(src, tmp_path / "fused")
    save_file(_fuse_experts(t), str(fused / "model.safetensors"), metadata={"format": "pt"})
    assert torch.equal(_logits(fused), want)

    # a Qwen3.5 release: the text model nested beside a vision tower, config nested too
    nested = _copy(src, tmp_path / "nested")
    nt = {("model.language_model." + k[len("model."):]) if k.startswith("model.") else k: v for k, v in t.items()}
    nt["model.visual.blocks.0.attn.qkv.weight"] = torch.zeros(3, 3)
    save_file(nt, str(nested / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((src / "config.json").read_text())
    (nested / "config.json").write_text(json.dumps({"model_type": "qwen3_5_moe", "text_config": cfg,
                                                     "vision_config": {"depth": 1}}))
    assert torch.equal(_logits(nested), want)
    assert "vision-tower tensors ignored" in capsys.readouterr().err

    # sharded with an index
    sharded = _copy(src, tmp_path / "sharded")
    (sharded / "model.safetensors").unlink()
    names = sorted(t)
    half = len(names) // 2
    weight_map = {}
    for i, part in enumerate((names[:half], names[half:])):
        fname = f"model-0000{i + 1}-of-00002.safetensors"
        save_file({k: t[k] for k in part}, str(sharded / fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in part})
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert torch.equal(_logits(sharded), want)

    # bf16 on disk loads (upcast to fp32)
    bf = _copy(src, tmp_path / "bf16")
    save_file({k: v.to(torch.bfloat16) for k, v in t.items()}, str(bf / "model.safetensors"), metadata={"format": "pt"})
    assert torch.allclose(_logits(bf), want, atol=0.5)


def test_tied_embeddings(tmp_path):
    d = fixture_dir("qwen3_next", 0)
    tied = _copy(d, tmp_path / "tied")
    t = load_file(str(d / "model.safetensors"))
    del t["lm_head.weight"]
    save_file(t, str(tied / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((tied / "config.json").read_text())
    cfg["tie_word_embeddings"] = True
    (tied / "config.json").write_text(json.dumps(cfg))
    eng = Engine(tied)
    assert eng.model.lm_head is eng.model.embed


@pytest.mark.parametrize("edit,message", [
    (lambda t, c: t.update({"model.layers.0.extra.weight": torch.zeros(2)}), "unknown tensor"),
    (lambda t, c: t.pop("model.layers.1.linear_attn.A_log"), "missing tensor model.layers.1.linear_attn.A_log"),
    (lambda t, c: t.update({"model.norm.weight": torch.zeros(3)}), "has shape"),
    (lambda t, c: c.update({"model_type": "llama"}), "unsupported model family"),
    (lambda t, c: c.update({"hidden_act": "gelu"}), "hidden_act"),
    (lambda t, c: c.update({"attention_bias": True}), "attention_bias"),
    (lambda t, c: c.update({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}}), "rope_type"),
])
def test_refused_with_a_clear_error(tmp_path, edit, message):
    d = _copy(fixture_dir("qwen3_next", 0), tmp_path / "m")
    t = load_file(str(d / "model.safetensors"))
    c = json.loads((d / "config.json").read_text())
    edit(t, c)
    save_file(t, str(d / "model.safetensors"), metadata={"format": "pt"})
    (d / "config.json").write_text(json.dumps(c))
    with pytest.raises(ModelFormatError, match=message):
        Engine(d)


def test_mtp_off_leaves_the_head_unread():
    eng = Engine(fixture_dir("qwen3_next", 0, mtp=True), read_mtp=False)
    assert eng.has_mtp and not eng._mtp_tensors
