"""Without --threads, a small model runs on one CPU thread and a large one on torch's count
(verispec/cpu_threads.py); decode bits do not depend on it (tests/test_cli.py)."""

import json

import pytest
import torch

from verispec import cpu_threads
from verispec.cli import build_parser, main
from verispec.config import default_model_dir
from verispec.models import ModelArgs
from verispec.random_model import preset_config


def test_the_rule_follows_the_bytes_a_decode_row_reads():
    small = ModelArgs.from_dict(json.loads((default_model_dir() / "config.json").read_text()))
    large = ModelArgs.from_dict(preset_config("qwen3.6-35b-a3b-shape"))
    assert cpu_threads.default_threads(small) == 1          # 34 MiB of fp32 weights a token
    assert cpu_threads.default_threads(large) is None       # 11 GiB


def _run(capsys, *extra):
    capsys.readouterr()
    rc = main(["run", "def f(x):", "--max-tokens", "2", "--device", "cpu", "--usage-save", "off", "--json", *extra])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert json.loads(out)["stats"]["threads"] == torch.get_num_threads()     # --json says what the run used


def test_run_picks_one_thread_for_the_bundled_model_unless_told(capsys, monkeypatch):
    torch.set_num_threads(2)
    _run(capsys)
    assert torch.get_num_threads() == 1
    torch.set_num_threads(2)
    _run(capsys, "--threads", "2")
    assert torch.get_num_threads() == 2
    monkeypatch.setattr(cpu_threads, "SMALL_BYTES", 0)      # the bundled model counted as large
    torch.set_num_threads(2)
    _run(capsys)
    assert torch.get_num_threads() == 2


def test_serve_picks_the_same_way(tmp_path):
    """`verispec serve` without --threads: one thread for the bundled model (the generation's worker
    thread sees the process's count); with --threads it keeps the count given."""
    pytest.importorskip("uvicorn")
    from verispec.serve_cli import build_server

    def build(*flags):
        torch.set_num_threads(2)
        a = build_parser().parse_args(["serve", "--device", "cpu", "--vocab-usage", str(tmp_path / "u.bin"), *flags])
        build_server(a)
        return torch.get_num_threads()

    assert build() == 1
    assert build("--threads", "2") == 2
