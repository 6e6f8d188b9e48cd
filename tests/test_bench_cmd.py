"""`verispec bench --random-config`: builds the shape in memory, runs plain and forced MTP arms,
and reports them only if every drafted run equals the plain one bit for bit."""

import json

import torch

from verispec.cli import main


def test_bench_small_shape_on_cpu(capsys):
    torch.set_num_threads(2)
    rc = main(["bench", "--random-config", "small", "--layers", "2", "--tokens", "6", "--rounds", "1",
               "--device", "cpu", "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    res = json.loads(out)
    assert res["drafted_equals_plain"] is True
    assert res["layers"] == 2 and set(res["median_tok_s"]) == {"plain", "mtp1", "mtp2"}
    assert all(v > 0 for v in res["median_tok_s"].values())
    assert "small (2 layers" in err
    assert torch.get_num_threads() == 1         # a small model on the CPU: one thread, as `run` picks


def test_bench_bad_settings_are_one_line(capsys):
    assert main(["bench", "--random-config", "small", "--layers", "0", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--layers" in err[0]
