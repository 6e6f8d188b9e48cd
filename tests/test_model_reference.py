"""The model against transformers, the numerical reference its users trust."""

import pytest
import torch

from model_fixtures import engine, fixture_dir

CASES = [
    ("qwen3_next", 0, {}),
    ("qwen3_next", 2, {"num_experts": 8, "top_k": 3}),
    ("qwen3_5_moe", 0, {}),
    pytest.param("qwen3_next", 1, {"hidden_size": 96, "num_layers": 8}, marks=pytest.mark.slow),
    pytest.param("qwen3_5_moe", 3, {"hidden_size": 96, "num_layers": 8}, marks=pytest.mark.slow),
    pytest.param("qwen3_5_moe", 4, {"tie_word_embeddings": True}, marks=pytest.mark.slow),
]


def _reference(family, seed, kw):
    import transformers
    cls = transformers.Qwen3NextForCausalLM if family == "qwen3_next" else transformers.Qwen3_5MoeForCausalLM
    return cls.from_pretrained(fixture_dir(family, seed, **kw), dtype=torch.float32).eval()


@pytest.mark.parametrize("family,seed,kw", CASES)
def test_full_sequence_logits_match_transformers(family, seed, kw):
    ref = _reference(family, seed, kw)
    eng = engine(family, seed, **kw)
    g = torch.Generator().manual_seed(100 + seed)
    ids = torch.randint(0, eng.args.vocab_size, (48,), generator=g)
    with torch.no_grad():
        want = ref(ids[None]).logits[0]
    # the batched prefill path, the exact path row by row, and both mixed
    st = eng.model.new_state(64)
    fast = eng.model.forward(ids, st, exact=False).logits
    st = eng.model.new_state(64)
    rows = torch.cat([eng.model.forward(ids[i:i + 1], st, exact=True).logits for i in range(48)])
    st = eng.model.new_state(64)
    mixed = torch.cat([eng.model.forward(ids[:40], st, exact=False).logits,
                       eng.model.forward(ids[40:], st, exact=True).logits])
    assert want.abs().max() > 1.0   # peaky logits, so the tolerance means something
    for got in (fast, rows, mixed):
        assert (got - want).abs().max().item() < 1e-4


@pytest.mark.parametrize("family,seed,kw", CASES)
def test_greedy_ids_match_transformers_recompute(family, seed, kw):
    ref = _reference(family, seed, kw)
    eng = engine(family, seed, **kw)
    g = torch.Generator().manual_seed(200 + seed)
    prompt = torch.randint(0, eng.args.vocab_size, (12,), generator=g).tolist()
    st = eng.model.new_state(128)
    logits = eng.model.forward(prompt, st).logits[-1]
    ours = []
    for _ in range(64):
        tok = int(torch.argmax(logits))
        ours.append(tok)
        logits = eng.model.forward([tok], st).logits[0]
    # transformers by full-sequence recompute, compared up to the first near-tie
    seq = list(prompt)
    compared = 0
    with torch.no_grad():
        for step in range(64):
            lg = ref(torch.tensor([seq])).logits[0, -1]
            top2 = torch.topk(lg, 2).values
            if (top2[0] - top2[1]).item() < 1e-3:
                break
            want = int(torch.argmax(lg))
            assert ours[step] == want, f"step {step}: {ours[step]} != {want}"
            compared += 1
            seq.append(want)
    assert compared >= 32, f"only {compared} steps compared"
