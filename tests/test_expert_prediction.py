"""bench/expert_prediction.py's measurement on the bundled trained model (CPU, a few tokens): the hooks
see every MoE layer of every decode step, and a router applied to the layer's own input predicts its
experts far better than chance (a hook recording the wrong tensors would score near chance)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import expert_prediction as ep  # noqa: E402

from verispec.config import default_model_dir  # noqa: E402
from verispec.models import layers as model_layers  # noqa: E402
from verispec.models import qwen3_next as q3  # noqa: E402


def test_predictors_scored_at_every_moe_layer_and_hooks_removed():
    kept = q3.Model._linear_attn, q3.Model._full_attn, q3.Model.moe
    res = ep.measure(str(default_model_dir()), 6)
    assert (q3.Model._linear_attn, q3.Model._full_attn, q3.Model.moe) == kept
    layers = 8
    assert (res["samples"]["mixer_input"] == res["samples"]["random"] == res["samples"]["unnormed"]
            == len(ep.PROMPTS) * 6 * layers)
    assert res["samples"]["prev_moe"] == len(ep.PROMPTS) * 6 * (layers - 1)
    share = res["share_of_true_topk"]
    assert all(0.0 <= v <= 1.0 for v in share.values())
    assert share["mixer_input"] > share["random"] + 0.25
    # the router's own logits up to a positive scale and rounding: the same top-k but for near-ties
    assert share["unnormed"] >= 0.95 and share["unnormed"] > share["mixer_input"]
    assert q3.add_norm is model_layers.add_norm


def test_random_weights_scored_the_same_way():
    """--random-config: the same hooks over a random model (16 experts, top 4): every MoE layer of every
    step scored, and the unnormed sum (the router's logits up to scale and rounding) still finds its picks."""
    res = ep.measure_random("small", 2, 3)
    assert (res["experts"], res["top_k"]) == (16, 4)
    assert res["samples"]["unnormed"] == res["samples"]["random"] == len(ep.PROMPTS) * 3 * 2
    assert res["share_of_true_topk"]["unnormed"] >= 0.95
