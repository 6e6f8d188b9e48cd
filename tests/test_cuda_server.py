"""`verispec serve --device cuda` on the GPU: the 9-turn session of tests/test_server.py, drafted
against plain, frame by frame (skipped where torch sees no GPU, as in CI)."""

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")

from test_server import DRAFTED, PLAIN, _session, serving  # noqa: E402


def test_cuda_session_with_and_without_drafts_frame_by_frame(tmp_path):
    with serving(tmp_path, "--device", "cuda", *DRAFTED) as d, serving(tmp_path, "--device", "cuda", *PLAIN) as p:
        drafted, plain = _session(d), _session(p)
        health = d.client.models.list().data[0].id
    assert health
    for i, (a, b) in enumerate(zip(drafted, plain), 1):
        for key in ("text", "ids", "finish", "logprobs", "chunks"):
            assert a.get(key) == b.get(key), f"turn {i}: {key} differs with drafts on the GPU"
    assert sum(t["stats"]["verifies"] for t in drafted) >= 5
    assert sum(t["stats"]["verifies"] for t in plain) == 0
    assert any(t["stats"]["ended_mid_verify"] for t in drafted)
