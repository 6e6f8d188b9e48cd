"""`verispec run` through its entry point (DESIGN.md section 7), in-process.

Every case calls `verispec.cli.main(argv)` and reads stdout/stderr with capsys; one
smoke test runs the installed console script in a subprocess.
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from harness import counts, simulate_forced
from model_fixtures import REPEAT_PROMPT, engine, fixture_dir
from verispec.cli import main
from verispec.config import DraftSettings, RunSettings
from verispec.fingerprint import checkpoint_fingerprint
from verispec.sampling import SamplingParams

STATS_KEYS = ("tokens", "forwards", "drafts", "accepted", "verifies", "prefill_tok_s", "decode_tok_s")


def cli(capsys, *argv) -> tuple[int, str, str]:
    capsys.readouterr()                       # drop anything printed before (fixture writing)
    argv = [str(a) for a in argv]
    if argv[:1] == ["run"] and "--device" not in argv:
        # the references here are CPU engines; `auto` would pick a GPU where there is one (device
        # call 178: four tests failed there). tests/test_cuda.py runs the CLI on CUDA.
        argv[1:1] = ["--device", "cpu"]
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope="module")
def byte_fx() -> Path:
    return fixture_dir("qwen3_next", byte_tokenizer=True)


@pytest.fixture(scope="module")
def ids_fx() -> Path:
    return fixture_dir("qwen3_next")        # no tokenizer: --prompt-ids only


def plain(max_tokens, sampling=SamplingParams(), **kw) -> RunSettings:
    return RunSettings(max_tokens=max_tokens, sampling=sampling, drafts=DraftSettings(lookup=False, mtp="off"), **kw)


# ----- --json, stdout/stderr, counts -----

def test_json_text_prompt(capsys, byte_fx):
    rc, out, err = cli(capsys, "run", "hello", "--model", byte_fx, "--max-tokens", 12, "--lookup", "off", "--json")
    assert rc == 0, err
    lines = out.splitlines()
    assert len(lines) == 1, "stdout holds exactly the JSON object"
    res = json.loads(lines[0])
    assert set(res) == {"ids", "text", "stats", "prompt_ids", "sampling", "model"}
    assert res["prompt_ids"] == list(b"hello") and res["model"] == checkpoint_fingerprint(byte_fx)
    assert res["sampling"] == {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": 0}
    for k in STATS_KEYS:
        assert k in res["stats"], k
    s = res["stats"]
    eng = engine("qwen3_next", byte_tokenizer=True)
    prompt = eng.encode("hello")
    assert prompt == list(b"hello") and s["prompt_tokens"] == 5
    ref = eng.generate(prompt, plain(12))
    assert res["ids"] == ref.ids and res["text"] == ref.text
    n = len(res["ids"])
    assert 1 <= n <= 12
    # counts (DESIGN.md section 3): every pick but the last is fed, one forward each, no drafts
    assert s["tokens"] == n - 1 and s["forwards"] == n - 1
    assert s["drafts"] == s["accepted"] == s["verifies"] == 0
    assert s["prefill_tok_s"] > 0 and (n == 1 or s["decode_tok_s"] > 0)
    # the report goes to stderr, never stdout
    assert "[verispec]" in err and "[verispec]" not in out
    assert f"{n} tokens" in err


def test_plain_text_output_is_just_the_text(capsys, byte_fx):
    rc, out, err = cli(capsys, "run", "abc", "--model", byte_fx, "--max-tokens", 6)
    assert rc == 0, err
    eng = engine("qwen3_next", byte_tokenizer=True)
    ref = eng.generate(eng.encode("abc"), RunSettings(max_tokens=6))
    assert out == ref.text + "\n"
    assert "[verispec]" in err


def test_prompt_ids_and_dump_logits(capsys, ids_fx, tmp_path):
    dump = tmp_path / "logits.npy"
    rc, out, err = cli(capsys, "run", "--prompt-ids", ",".join(map(str, REPEAT_PROMPT)), "--model", ids_fx,
                       "--max-tokens", 16, "--lookup", "off", "--json", "--dump-logits", dump)
    assert rc == 0, err
    res = json.loads(out)
    ref = engine("qwen3_next").generate(list(REPEAT_PROMPT), plain(16), keep_logits=True)
    assert res["ids"] == ref.ids and len(ref.ids) == 16       # this fixture has no stop token
    assert res["text"] == " ".join(map(str, ref.ids))          # no tokenizer: the ids as text
    arr = np.load(dump)
    assert arr.dtype == np.float32 and arr.shape == (16, 1000)
    assert np.array_equal(arr, np.stack([t.numpy() for t in ref.logits]))
    assert [int(r.argmax()) for r in arr] == res["ids"]        # greedy: each pick is its row's argmax


def test_drafts_change_nothing_but_counts(capsys, tmp_path):
    """Through the CLI: lookup drafts (gate off) give the same ids and bit-identical logits."""
    fx = fixture_dir("qwen3_next", 2, vocab_size=40)    # a small vocabulary: the output repeats
    ids = ",".join(map(str, REPEAT_PROMPT))
    arms = {}
    for arm, flags in (("plain", ["--lookup", "off"]), ("lookup", ["--lookup", "on", "--gate", "off"])):
        dump = tmp_path / f"{arm}.npy"
        rc, out, err = cli(capsys, "run", "--prompt-ids", ids, "--model", fx, "--max-tokens", 60, "--json",
                           "--dump-logits", dump, *flags)
        assert rc == 0, err
        arms[arm] = (json.loads(out), np.load(dump))
    (p, pl), (d, dl) = arms["plain"], arms["lookup"]
    assert d["ids"] == p["ids"]
    assert np.array_equal(dl, pl)
    assert d["stats"]["verifies"] > 0, "the repeating prompt should make lookup propose"
    assert d["stats"]["forwards"] < p["stats"]["forwards"] or d["stats"]["accepted"] == 0


def test_force_with_reference(capsys, ids_fx, tmp_path):
    ids = ",".join(map(str, REPEAT_PROMPT))
    rc, out, err = cli(capsys, "run", "--prompt-ids", ids, "--model", ids_fx, "--max-tokens", 12, "--json",
                       "--lookup", "off")
    assert rc == 0, err
    ref = tmp_path / "ref.json"
    ref.write_text(out)
    rc, out, err = cli(capsys, "run", "--prompt-ids", ids, "--model", ids_fx, "--max-tokens", 12, "--json",
                       "--force", "accept", "--reference", ref, "--gate", "off")
    assert rc == 0, err
    res = json.loads(out)
    assert res["ids"] == json.loads(ref.read_text())["ids"]
    # counts as the verify loop's rules predict them (harness.simulate_forced shares no code)
    prompt, ref_ids = list(REPEAT_PROMPT), res["ids"]
    context = engine("qwen3_next").context_for(len(prompt), RunSettings(max_tokens=12))
    want = simulate_forced(ref_ids, len(prompt), context, 5, "accept", 1000)
    assert counts(res["stats"]) == want
    assert want["accepted"] > 0


def _reference(capsys, fx, tmp_path, prompt, *flags) -> Path:
    rc, out, err = cli(capsys, "run", "--prompt-ids", ",".join(map(str, prompt)), "--model", fx, "--max-tokens", 8,
                       "--json", "--lookup", "off", *flags)
    assert rc == 0, err
    ref = tmp_path / "ref.json"
    ref.write_text(out)
    return ref


@pytest.mark.parametrize("case", ["another prompt", "a prompt of another length", "other sampling",
                                  "another checkpoint"])
def test_a_reference_from_another_run_is_refused(capsys, ids_fx, tmp_path, case):
    """A reference records the plain run that made it (--json: prompt_ids, sampling, model); a forced run
    whose prompt, sampling or checkpoint differ would force drafts that are not its plain run's tokens."""
    prompt = list(REPEAT_PROMPT)
    model, flags, word = ids_fx, [], case.split()[-1]
    ref = _reference(capsys, ids_fx, tmp_path, prompt, "--temperature", 0.8, "--seed", 3)
    if case == "another prompt":
        prompt = [prompt[1], prompt[0]] + prompt[2:]
    elif case == "a prompt of another length":
        prompt, word = prompt[:-1], "prompt"
    elif case == "other sampling":
        flags = ["--seed", 4]
    else:
        model = fixture_dir("qwen3_next", seed=1)
        assert checkpoint_fingerprint(model) != checkpoint_fingerprint(ids_fx)
    rc, out, err = cli(capsys, "run", "--prompt-ids", ",".join(map(str, prompt)), "--model", model, "--max-tokens", 8,
                       "--force", "accept", "--reference", ref, "--gate", "off", "--temperature", 0.8, "--seed", 3,
                       *flags)
    assert rc == 2 and out == "", err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("verispec: error: --reference"), err
    assert f"{word} " in lines[0] or lines[0].endswith(word), lines[0]


def test_a_greedy_reference_ignores_the_seed_and_an_old_one_is_not_checked(capsys, ids_fx, tmp_path):
    """Greedy picks read no seed, top-p or top-k: a greedy reference serves a greedy run with any of them. A
    reference written before the run's record existed (ids only) is taken as it is."""
    prompt = list(REPEAT_PROMPT)
    ids = ",".join(map(str, prompt))
    ref = _reference(capsys, ids_fx, tmp_path, prompt)
    rc, out, err = cli(capsys, "run", "--prompt-ids", ids, "--model", ids_fx, "--max-tokens", 8, "--json",
                       "--force", "accept", "--reference", ref, "--gate", "off", "--seed", 9, "--top-k", 5)
    assert rc == 0, err
    want = json.loads(ref.read_text())
    assert json.loads(out)["ids"] == want["ids"]
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"ids": want["ids"], "text": want["text"], "stats": want["stats"]}))
    other = fixture_dir("qwen3_next", seed=1)
    rc, out, err = cli(capsys, "run", "--prompt-ids", "3,1,4", "--model", other, "--max-tokens", 8,
                       "--force", "accept", "--reference", old, "--gate", "off")
    assert rc == 0, err


def test_fingerprints(tmp_path, ids_fx):
    """A copy keeps a checkpoint's fingerprint; other weights of the same shape change it; a bare
    directory has none."""
    copy = tmp_path / "copy"
    shutil.copytree(ids_fx, copy)
    fp = checkpoint_fingerprint(ids_fx)
    assert isinstance(fp, str) and len(fp) == 16 and checkpoint_fingerprint(copy) == fp
    assert checkpoint_fingerprint(fixture_dir("qwen3_next", seed=1)) != fp
    f = sorted(copy.glob("*.safetensors"))[0]
    data = bytearray(f.read_bytes())
    data[-1] ^= 1                                   # one bit of the last tensor's last value
    f.write_bytes(bytes(data))
    assert checkpoint_fingerprint(copy) != fp
    assert checkpoint_fingerprint(tmp_path / "nothing") is None


def test_sampling_flags(capsys, ids_fx):
    ids = ",".join(map(str, REPEAT_PROMPT))
    got = {}
    for seed in (3, 4):
        rc, out, err = cli(capsys, "run", "--prompt-ids", ids, "--model", ids_fx, "--max-tokens", 16, "--json",
                           "--temperature", 1.5, "--top-p", 0.95, "--top-k", 50, "--seed", seed)
        assert rc == 0, err
        got[seed] = json.loads(out)["ids"]
        ref = engine("qwen3_next").generate(list(REPEAT_PROMPT), plain(16, SamplingParams(1.5, 0.95, 50, seed)))
        assert got[seed] == ref.ids
    assert got[3] != got[4], "the seed reaches the sampler"
    greedy = engine("qwen3_next").generate(list(REPEAT_PROMPT), plain(16)).ids
    assert got[3] != greedy, "the temperature reaches the sampler"


def test_prefill_batch_off_and_threads(capsys, ids_fx, tmp_path):
    """--prefill-batch off over a prompt of 40 ids (three exact forwards of up to 16 rows): the logits
    with --threads 1 equal, bit for bit, those of the engine at torch's default thread count."""
    import torch

    prompt = [(7 * i + 3) % 1000 for i in range(40)]
    threads = torch.get_num_threads()
    ref = engine("qwen3_next").generate(prompt, plain(5, prefill_batch=False), keep_logits=True)
    dump = tmp_path / "l.npy"
    try:
        rc, out, err = cli(capsys, "run", "--prompt-ids", ",".join(map(str, prompt)), "--model", ids_fx,
                           "--max-tokens", 5, "--json", "--prefill-batch", "off", "--threads", 1, "--lookup", "off",
                           "--dump-logits", dump)
    finally:
        torch.set_num_threads(threads)          # --threads sets it for this whole process
    assert rc == 0, err
    assert json.loads(out)["ids"] == ref.ids
    assert np.array_equal(np.load(dump), np.stack([t.numpy() for t in ref.logits]))


def test_mtp_checkpoint_loads_and_runs(capsys):
    fx = fixture_dir("qwen3_5_moe", mtp=True, byte_tokenizer=True)
    # --usage-save off: leave no counts file in the shared fixture directory
    rc, out, err = cli(capsys, "run", "hi", "--model", fx, "--max-tokens", 4, "--mtp", "on", "--json",
                       "--usage-save", "off")
    assert rc == 0, err
    assert 1 <= len(json.loads(out)["ids"]) <= 4


def test_debug_gives_the_traceback_and_keeps_the_exit_code(ids_fx, capsys):
    """--debug adds the traceback, before or after the subcommand, and changes no exit code."""
    for argv in (["--debug", "run", "--prompt-ids", "1,2,99999", "--model", str(ids_fx)],
                 ["run", "--prompt-ids", "1,2,99999", "--model", str(ids_fx), "--debug"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "Traceback (most recent call last)" in err and "out of range" in err
        assert err.strip().splitlines()[-1].startswith("verispec: error: token id 99999")
    assert main(["run", "--prompt-ids", "1,2,99999", "--model", str(ids_fx)]) == 2
    assert "Traceback" not in capsys.readouterr().err


# ----- bad input: one line "verispec: error: ...", exit 2 (usage) or 1 (runtime) -----

def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _edit_config(d: Path, **changes) -> None:
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(changes)
    (d / "config.json").write_text(json.dumps(cfg))


# a copy of the fixture with one file replaced: case -> (file, its new text, a word the message must contain)
ONE_FILE_DAMAGED = {
    "damaged config.json": ("config.json", '{"model_type": "qwen3_next", "hidden_size": ', "config.json"),
    "config.json that is not an object": ("config.json", "[1, 2]", "not a JSON object"),
    "index whose weight_map is a list": ("model.safetensors.index.json", '{"weight_map": [1]}', "index.json"),
    "damaged tokenizer.json": ("tokenizer.json", "{", "tokenizer.json"),
    "damaged tokenizer_config.json": ("tokenizer_config.json", "{", "tokenizer_config.json"),
}


def _bad(tmp_path: Path, fx: Path, case: str) -> tuple[list, int, str]:
    """(argv, expected exit code, a word the message must contain)."""
    m = ["--model", fx]
    if case in ONE_FILE_DAMAGED:
        name, text, word = ONE_FILE_DAMAGED[case]
        d = _copy(fx, tmp_path / "damaged")
        (d / name).write_text(text)
        return ["run", "hi", "--model", d], 1, word
    if case == "missing model directory":
        return ["run", "hi", "--model", tmp_path / "nope"], 2, "no such directory"
    if case == "directory without config.json":
        (tmp_path / "empty").mkdir()
        return ["run", "hi", "--model", tmp_path / "empty"], 2, "config.json"
    if case == "unsupported family":
        d = _copy(fx, tmp_path / "llama")
        _edit_config(d, model_type="llama")
        return ["run", "hi", "--model", d], 1, "llama"
    if case == "truncated safetensors":
        d = _copy(fx, tmp_path / "trunc")
        f = d / "model.safetensors"
        f.write_bytes(f.read_bytes()[:f.stat().st_size // 2])
        return ["run", "hi", "--model", d], 1, "truncated"
    if case == "config.json without a required field":
        d = _copy(fx, tmp_path / "field")
        cfg = json.loads((d / "config.json").read_text())
        del cfg["hidden_size"]
        (d / "config.json").write_text(json.dumps(cfg))
        return ["run", "hi", "--model", d], 1, "hidden_size"
    if case == "token id out of range":
        return ["run", "--prompt-ids", "1,2,259", *m], 2, "259"
    if case == "negative token id":
        return ["run", "--prompt-ids", "1,-3", *m], 2, "out of range"
    if case == "token ids that are not numbers":
        return ["run", "--prompt-ids", "1,x", *m], 2, "--prompt-ids"
    if case == "prompt plus max-tokens beyond --context":
        return ["run", "--prompt-ids", "1,2,3,4,5", "--max-tokens", 10, "--context", 12, *m], 2, "context"
    if case == "max-tokens beyond the model's positions":
        return ["run", "hi", "--max-tokens", 5000, *m], 2, "context"
    if case == "context 0":
        return ["run", "hi", "--context", 0, *m], 2, "--context"
    if case == "negative temperature":
        return ["run", "hi", "--temperature", -0.5, *m], 2, "temperature"
    if case == "top-p above 1":
        return ["run", "hi", "--top-p", 1.5, *m], 2, "top_p"
    if case == "lookup-drafts 9":
        return ["run", "hi", "--lookup-drafts", 9, *m], 2, "--lookup-drafts"
    if case == "force without reference":
        return ["run", "hi", "--force", "accept", *m], 2, "--reference"
    if case == "bad force value":
        ref = tmp_path / "ref.json"
        ref.write_text(json.dumps({"ids": [1, 2, 3], "text": "", "stats": {}}))
        return ["run", "hi", "--force", "sometimes", "--reference", ref, *m], 2, "--force"
    if case == "missing reference file":
        return ["run", "hi", "--force", "accept", "--reference", tmp_path / "none.json", *m], 2, "--reference"
    if case == "mtp on without a head":
        return ["run", "hi", "--mtp", "on", *m], 2, "MTP"
    if case == "device cuda without a GPU":
        import torch
        if torch.cuda.is_available():
            pytest.skip("this machine has a GPU")
        return ["run", "hi", "--device", "cuda", *m], 2, "cuda"
    if case == "threads 0 or less":
        return ["run", "hi", "--threads", -1, *m], 2, "--threads"
    if case == "dump-logits into a missing directory":
        return ["run", "hi", "--dump-logits", tmp_path / "no" / "x.npy", *m], 2, "--dump-logits"
    if case == "no prompt":
        return ["run", *m], 2, "PROMPT"
    if case == "empty prompt":
        return ["run", "", *m], 2, "empty"
    if case == "text prompt without a tokenizer":
        d = _copy(fx, tmp_path / "notok")
        (d / "tokenizer.json").unlink()
        return ["run", "hi", "--model", d], 2, "--prompt-ids"
    if case == "unknown flag":
        return ["run", "hi", "--frobnicate", *m], 2, "frobnicate"
    if case == "config.json with zero heads":
        d = _copy(fx, tmp_path / "heads")
        _edit_config(d, num_attention_heads=0)
        return ["run", "hi", "--model", d], 1, "num_attention_heads"
    if case == "safetensors header that is not an object":
        d = _copy(fx, tmp_path / "hdr")
        f = d / "model.safetensors"
        f.write_bytes(struct.pack("<Q", 6) + b"[1, 2]" + f.read_bytes()[8:])
        return ["run", "hi", "--model", d], 1, "model.safetensors"
    if case == "safetensors entry without data_offsets":
        d = _copy(fx, tmp_path / "offs")
        f = d / "model.safetensors"
        raw = f.read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8:8 + n])
        name = next(k for k in header if k != "__metadata__")
        del header[name]["data_offsets"]
        new = json.dumps(header).encode().ljust(n)
        f.write_bytes(raw[:8] + new + raw[8 + n:])
        return ["run", "hi", "--model", d], 1, "model.safetensors"
    if case == "chat template that does not compile":
        d = _copy(fx, tmp_path / "tmpl")
        cfg = json.loads((d / "tokenizer_config.json").read_text())
        cfg["chat_template"] = "{% for m in messages %}{{ m.content }"
        (d / "tokenizer_config.json").write_text(json.dumps(cfg))
        for extra in d.glob("chat_template.jinja"):
            extra.unlink()
        return ["run", "hi", "--chat", "--model", d], 1, "chat template"
    if case == "chat with prompt ids":
        return ["run", "--prompt-ids", "1,2", "--chat", *m], 2, "--chat"
    if case == "reference without force":
        ref = tmp_path / "ref.json"
        ref.write_text(json.dumps({"ids": [1, 2, 3], "text": "", "stats": {}}))
        return ["run", "hi", "--reference", ref, *m], 2, "--force"
    if case == "reference ids outside the vocabulary":
        ref = tmp_path / "ref.json"
        ref.write_text(json.dumps({"ids": [1, 999999], "text": "", "stats": {}}))
        return ["run", "hi", "--force", "accept", "--reference", ref, *m], 2, "--reference"
    if case == "reference with a damaged run record":
        ref = tmp_path / "ref.json"
        ref.write_text(json.dumps({"ids": [1, 2], "text": "", "stats": {}, "sampling": {"temperature": "hot"}}))
        return ["run", "hi", "--force", "accept", "--reference", ref, *m], 2, "--reference"
    if case == "context beyond the model's positions":
        return ["run", "hi", "--context", 10 ** 6, *m], 2, "max_position_embeddings"
    if case == "dump-logits into a directory":
        return ["run", "hi", "--dump-logits", tmp_path, *m], 2, "directory"
    raise AssertionError(case)


BAD_CASES = [
    "missing model directory", "directory without config.json", "unsupported family", "truncated safetensors",
    "damaged config.json", "config.json without a required field", "token id out of range", "negative token id",
    "token ids that are not numbers", "prompt plus max-tokens beyond --context",
    "max-tokens beyond the model's positions", "context 0", "negative temperature", "top-p above 1",
    "lookup-drafts 9", "force without reference", "bad force value", "missing reference file",
    "mtp on without a head", "device cuda without a GPU", "threads 0 or less", "dump-logits into a missing directory",
    "no prompt", "empty prompt", "text prompt without a tokenizer",
    "unknown flag", "config.json that is not an object", "config.json with zero heads",
    "safetensors header that is not an object", "safetensors entry without data_offsets",
    "index whose weight_map is a list", "damaged tokenizer.json", "damaged tokenizer_config.json",
    "chat template that does not compile", "chat with prompt ids", "reference without force",
    "reference ids outside the vocabulary", "reference with a damaged run record", "context beyond the model's positions", "dump-logits into a directory",
]


@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_input_one_line_and_exit_code(capsys, tmp_path, byte_fx, case):
    argv, code, word = _bad(tmp_path, byte_fx, case)
    rc, out, err = cli(capsys, *argv)
    assert rc == code, (case, err)
    assert out == "", "nothing on stdout on failure"
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("verispec: error: ")
    assert "Traceback" not in err and "--debug" not in err, "an expected failure, not a bug"
    assert word.lower() in lines[0].lower(), lines[0]


@pytest.mark.parametrize("argv,code,word", [
    (["plan", "--config", "/nonexistent/config.json"], 2, "no such file"),
    (["plan", "--model", "/nonexistent/dir"], 2, "no such directory"),
    (["plan", "--config", "CFG", "--context", 0], 2, "--context"),
    (["plan", "--config", "CFG", "--context", 10 ** 9], 2, "max_position_embeddings"),
    (["plan", "--config", "DIR"], 2, "is a directory"),
    (["plan", "--config", "CFG", "--model", "DIR"], 2, "not both"),
    (["fixture", "--out", "DIR"], 2, "not empty"),
    (["fixture", "--out", "CFG"], 2, "not a directory"),
    (["fixture", "--out", ""], 2, "--out"),
    (["fixture", "--out", "NEW", "--hidden-size", 0], 2, "--hidden-size"),
    (["fixture", "--out", "NEW", "--layers", -1], 2, "--layers"),
    (["fixture", "--out", "NEW", "--top-k", 9], 2, "--top-k"),
    (["fixture", "--out", "NEW", "--weight-scale", "nan"], 2, "--weight-scale"),
    (["fixture", "--out", "NEW", "--byte-tokenizer", "--vocab-size", 100], 2, "--vocab-size"),
    (["bench", "--random-config", "small", "--tokens", 100000], 2, "--tokens"),
    (["bench", "--random-config", "small", "--layers", 9], 2, "--layers"),
])
def test_plan_fixture_bench_bad_input(capsys, byte_fx, tmp_path, argv, code, word):
    """One line, the exit code, and nothing written or built: a fixture never goes into a directory
    that has files (save_pretrained would replace a model's shards there)."""
    before = sorted(p.name for p in byte_fx.iterdir())
    argv = [byte_fx / "config.json" if a == "CFG" else byte_fx if a == "DIR" else tmp_path / "new" if a == "NEW"
            else a for a in argv]
    rc, out, err = cli(capsys, *argv)
    assert rc == code and out == ""
    assert err.startswith("verispec: error: ") and len(err.strip().splitlines()) == 1
    assert word in err
    assert sorted(p.name for p in byte_fx.iterdir()) == before and not (tmp_path / "new").exists()


def test_plan_names_the_config_given(capsys, tmp_path):
    bad = tmp_path / "mine.json"
    cfg = json.loads((fixture_dir("qwen3_next") / "config.json").read_text())
    bad.write_text(json.dumps(dict(cfg, hidden_size="big")))
    rc, out, err = cli(capsys, "plan", "--config", bad)
    assert rc == 1 and err.startswith(f"verispec: error: --config {bad}: hidden_size") and "config.json" not in err
    bad.write_text(json.dumps({"hidden_size": 8}))
    rc, out, err = cli(capsys, "plan", "--config", bad)
    assert rc == 1 and "no model_type" in err


def test_installed_console_script(tmp_path, ids_fx):
    """The one subprocess: the `verispec` script pip installed, end to end."""
    exe = Path(sys.executable).parent / "verispec"
    if not exe.exists():
        exe = shutil.which("verispec")
    assert exe, "the verispec console script is not installed (pip install -e .)"
    r = subprocess.run([str(exe), "run", "--prompt-ids", "1,2,3", "--model", str(ids_fx), "--max-tokens", "3",
                        "--json", "--device", "cpu"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["ids"] == engine("qwen3_next").generate([1, 2, 3], RunSettings(max_tokens=3)).ids
    assert "[verispec]" in r.stderr


def test_context_stays_within_the_model_positions(tmp_path):
    """The default context is capped at max_position_embeddings; a larger --context is a usage
    error, never silently shortened (a later "exceeds the context" would name another number)."""
    from verispec.config import RunSettings
    from verispec.engine import Engine
    from verispec.errors import UsageError
    from model_fixtures import fixture_dir

    eng = Engine(fixture_dir("qwen3_next", 0))
    limit = eng.args.max_position_embeddings
    assert eng.context_for(10, RunSettings(max_tokens=5, context=limit)) == limit
    assert eng.context_for(limit - 20, RunSettings(max_tokens=12)) == limit     # need + 8 verify rows, capped
    with pytest.raises(UsageError, match="max_position_embeddings"):
        eng.context_for(10, RunSettings(max_tokens=5, context=limit * 4))


def test_dump_logits_is_written_where_named(capsys, tmp_path, byte_fx):
    target = tmp_path / "logits-without-suffix"
    rc, out, err = cli(capsys, "run", "hi", "--model", byte_fx, "--max-tokens", 4, "--dump-logits", target)
    assert rc == 0, err
    assert target.is_file() and not (tmp_path / "logits-without-suffix.npy").exists()
    vocab = json.loads((byte_fx / "config.json").read_text())["vocab_size"]
    assert np.load(target).shape == (4, vocab)


def test_a_reader_that_closes_stdout_early_is_not_an_error(tmp_path, byte_fx):
    """`verispec run ... | head`: the pipe is closed before the text is written (here, before the model
    has even loaded), so the write fails with EPIPE; the run still exits 0 and reports on stderr."""
    proc = subprocess.Popen([sys.executable, "-m", "verispec.cli", "run", "hi", "--model", str(byte_fx),
                             "--max-tokens", "4"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 0, err
    assert "BrokenPipe" not in err and "error" not in err
    assert "[verispec] 4 tokens" in err


def test_serve_port_in_use_and_bad_context_are_one_line(capsys, byte_fx):
    import socket
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        rc, out, err = cli(capsys, "serve", "--model", byte_fx, "--port", port)
        assert rc == 1 and err.startswith("verispec: error: cannot listen on 127.0.0.1:") and len(err.splitlines()) == 1
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for context in (0, 10 ** 6):
        rc, out, err = cli(capsys, "serve", "--model", byte_fx, "--port", port, "--context", context)
        assert rc == 2 and "--context must be 2.." in err and len(err.splitlines()) == 1, err


def test_serve_binds_and_listens_before_the_model_loads():
    """Two servers started at once on one port: the second fails at its bind, one line (before, both
    bound with SO_REUSEADDR and the clash came out of uvicorn as a traceback after the model loaded)."""
    from verispec.errors import VerispecError
    from verispec.serve_cli import _listen

    first = _listen("127.0.0.1", 0)
    try:
        port = first[0].getsockname()[1]
        with pytest.raises(VerispecError, match="cannot listen on 127.0.0.1:"):
            _listen("127.0.0.1", port)
    finally:
        for sock in first:
            sock.close()


def test_help_and_usage_errors_do_not_import_torch():
    """`verispec --help` and a mistyped flag answer before torch loads (a second and more here):
    the parser's modules import no torch."""
    code = ("import sys\nfrom verispec.cli import main\n"
            "for argv in (['--help'], ['run', '--max-tokens', 'x'], ['bench', '--help'], ['fixture', '--help']):\n"
            "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "False", out.stderr[-2000:]
    assert "invalid int value: 'x'" in out.stderr
