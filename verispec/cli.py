"""verispec run | serve | plan | fixture  (DESIGN.md section 7).

Exit codes: 0 success, 2 usage error, 1 runtime failure; one clear line, no traceback
unless --debug.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import traceback
from pathlib import Path

from .errors import UsageError, VerispecError


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2
        raise UsageError(f"{self.prog}: {message}")


def _onoff(v: str) -> bool:
    v = v.lower()
    if v in ("on", "1", "true", "yes"):
        return True
    if v in ("off", "0", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected on or off, got {v!r}")


def _ids(v: str) -> list[int]:
    try:
        return [int(x) for x in v.replace(" ", "").split(",") if x != ""]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated token ids, got {v!r}") from None


def _onoffauto(v: str) -> bool | None:
    if v.lower() == "auto":
        return None
    try:
        return _onoff(v)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected on, off or auto, got {v!r}") from None


def _mtp_drafts(v: str) -> int:
    if v == "auto":
        return 0
    if v in ("0", "1", "2", "3"):
        return int(v)
    raise argparse.ArgumentTypeError(f"expected 1, 2, 3, auto or 0, got {v!r}")


def add_draft_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lookup", type=_onoff, default=True, help="prompt-lookup drafts (on|off, default on)")
    p.add_argument("--lookup-drafts", type=int, default=5, help="lookup drafts per verify, 1..5 (default 5)")
    p.add_argument("--mtp", choices=["on", "off", "auto"], default="auto",
                   help="the checkpoint's MTP head (default: when present)")
    p.add_argument("--mtp-drafts", type=_mtp_drafts, default=2, help="1|2|3|auto (0 = auto; default 2, see docs/benchmarks.md)")
    p.add_argument("--mtp-pstep", type=_onoff, default=None, help="per-step depth from the head's probabilities")
    p.add_argument("--mtp-vocab", type=int, default=16000, help="tokens the head scores per draft (0 = all)")
    p.add_argument("--vocab-usage", default=None, help="the MTP vocabulary counts file")
    p.add_argument("--usage-save", type=_onoff, default=True)
    p.add_argument("--gate", type=_onoff, default=True, help="off: draft every proposal in full (tests)")
    p.add_argument("--device", choices=["cpu", "cuda", "auto"], default="auto")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (default: 1 for a small model on the CPU, else torch's: verispec/cpu_threads.py)")


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="verispec", description="Exact speculative decoding for hybrid Qwen3-Next-style models.")
    ap.add_argument("--debug", action="store_true", help="tracebacks on errors")
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=_Parser)

    r = sub.add_parser("run", help="generate from a prompt")
    r.add_argument("prompt", nargs="?", default=None)
    r.add_argument("--model", default=None, help="HF model directory (default: the bundled model)")
    r.add_argument("--prompt-ids", type=_ids, default=None, help="token ids instead of text: 1,2,3")
    r.add_argument("--chat", action="store_true", help="wrap the prompt in the checkpoint's chat template")
    r.add_argument("--max-tokens", type=int, default=128)
    r.add_argument("--temperature", type=float, default=0.0)
    r.add_argument("--top-p", type=float, default=1.0)
    r.add_argument("--top-k", type=int, default=0)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--context", type=int, default=None,
                   help="KV cache length (default: prompt + max tokens + 8 verify rows, at most the model's maximum)")
    r.add_argument("--prefill-batch", type=_onoffauto, default=None,
                   help="on|off|auto; off: the prompt through the exact path (bits that do not depend on threads); "
                        "auto (default): on, except for prompts under 128 tokens on CUDA (the exact path is faster there)")
    r.add_argument("--force", default=None, help="test mode: accept|reject|mixed|cycle|rowN|bernoulli:P")
    r.add_argument("--reference", default=None, help="REF.json: the --json output of a plain run")
    r.add_argument("--json", action="store_true",
                   help='stdout: {"ids", "text", "stats", "prompt_ids", "sampling", "model"}')
    r.add_argument("--dump-logits", default=None, help=".npy float32 [n_decoded, vocab]")
    add_draft_args(r)

    p = sub.add_parser("plan", help="memory plan: weights, KV cache, copy slots, MTP head")
    p.add_argument("--model", default=None)
    p.add_argument("--config", default=None, help="a config.json instead of a model directory")
    p.add_argument("--context", type=int, default=None, help="KV cache length (default: the model's, at most 4096)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="the layout to plan for: cpu (fp32) or cuda (bf16 weights, KV and conv; fp32 DeltaNet state)")
    p.add_argument("--json", action="store_true")

    s = sub.add_parser("serve", help="OpenAI-compatible HTTP server (needs: pip install -e '.[serve]')")
    s.add_argument("--model", default=None, help="HF model directory (default: the bundled model)")
    s.add_argument("--model-name", default=None, help="the model id the API shows (default: the directory's name)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--pin-slots", type=int, default=4, help="LRU pool of prompt snapshots (default 4)")
    s.add_argument("--context", type=int, default=None, help="KV cache length (default: the model's, at most 4096)")
    s.add_argument("--queue", type=int, default=16, help="requests that may wait behind the running one (default 16)")
    s.add_argument("--prefill-batch", type=_onoffauto, default=None,
                   help="on|off|auto; off: prompts through the exact path (16 rows a forward), so an answer does "
                        "not depend on what the server served before; auto (default): on, except for prompts (or "
                        "new parts of them) under 128 tokens on CUDA")
    add_draft_args(s)

    b = sub.add_parser("bench", help="decode speed on random weights at a named shape (e.g. qwen3.6-35b-a3b-shape)")
    from .bench_args import add_bench_args
    add_bench_args(b)

    f = sub.add_parser("fixture", help="write a tiny random test checkpoint (needs transformers)")
    from .fixture_args import add_fixture_args
    add_fixture_args(f)
    return ap


def _model_dir(arg: str | None) -> Path:
    from .config import default_model_dir

    if arg:
        # The flag names no model directory: a usage error (a damaged one is a runtime failure).
        d = Path(arg)
        if not d.is_dir():
            raise UsageError(f"--model {arg}: no such directory")
        if not (d / "config.json").exists():
            raise UsageError(f"--model {arg}: no config.json there (not an HF model directory)")
        return d
    d = default_model_dir()
    if not (d / "config.json").exists():
        if os.environ.get("VERISPEC_MODEL"):
            raise UsageError(f"no --model given and VERISPEC_MODEL={d} names no model directory (no config.json)")
        raise UsageError(f"no --model given and the bundled model is not installed at {d}")
    return d


def _read_reference(path: str) -> dict:
    """The reference's ids (a tuple) and what it records of the run that made it (absent from
    references written before those keys existed: nothing to check them against)."""
    from .sampling import SamplingParams

    try:
        ref = json.loads(Path(path).read_text())
        out = {"ids": tuple(int(t) for t in ref["ids"])}
        if "prompt_ids" in ref:
            out["prompt_ids"] = [int(t) for t in ref["prompt_ids"]]
        if "sampling" in ref:
            out["sampling"] = SamplingParams(**ref["sampling"])
        if "model" in ref:
            out["model"] = None if ref["model"] is None else str(ref["model"])
        return out
    except FileNotFoundError:
        raise UsageError(f"--reference {path}: no such file") from None
    except (json.JSONDecodeError, KeyError, TypeError, ValueError):
        raise UsageError(f"--reference {path}: not the --json output of a run (needs an \"ids\" list)") from None


def _check_reference(path: str, ref: dict, prompt: list[int], sampling, model: str | None) -> None:
    """The reference must be a plain run of this prompt with these sampling settings on this
    checkpoint: its ids are then what this run gives, and the forced drafts mean what they say."""
    if "prompt_ids" in ref and ref["prompt_ids"] != list(prompt):
        raise UsageError(f"--reference {path}: made for another prompt ({len(ref['prompt_ids'])} prompt ids there, "
                         f"{len(prompt)} here{', differing' if len(prompt) == len(ref['prompt_ids']) else ''})")
    if "sampling" in ref:
        there = ref["sampling"]
        if not (there.greedy and sampling.greedy) and there != sampling:
            raise UsageError(f"--reference {path}: made with other sampling ({_sampling_words(there)} there, "
                             f"{_sampling_words(sampling)} here)")
    if ref.get("model") is not None and model is not None and ref["model"] != model:
        raise UsageError(f"--reference {path}: made with another checkpoint (fingerprint {ref['model']} there, "
                         f"{model} here)")


def _sampling_words(s) -> str:
    if s.greedy:
        return "greedy"
    return f"temperature {s.temperature} top-p {s.top_p} top-k {s.top_k} seed {s.seed}"


def cmd_run(a: argparse.Namespace) -> int:
    import torch

    from . import cpu_threads
    from .config import DraftSettings, RunSettings
    from .engine import load_engine
    from .fingerprint import checkpoint_fingerprint
    from .gate import Gate  # noqa: F401  (fail early if missing)
    from .report import report_lines
    from .sampling import SamplingParams

    if a.threads is not None and a.threads < 1:
        raise UsageError(f"--threads must be >= 1, got {a.threads}")
    if a.mtp_vocab < 0:
        raise UsageError(f"--mtp-vocab must be >= 0 (0 = whole vocabulary), got {a.mtp_vocab}")
    if a.dump_logits:
        _check_writable(a.dump_logits)
    if a.threads:
        torch.set_num_threads(a.threads)
    if (a.prompt is None) == (a.prompt_ids is None):
        raise UsageError("give a PROMPT or --prompt-ids (exactly one)")
    if a.chat and a.prompt_ids is not None:
        raise UsageError("--chat wraps a text PROMPT in the chat template; it cannot take --prompt-ids")
    if a.reference and not a.force:
        raise UsageError("--reference is read only with --force (the forced drafts come from it)")
    try:
        sampling = SamplingParams(a.temperature, a.top_p, a.top_k, a.seed)
    except ValueError as e:
        raise UsageError(str(e)) from None
    ref = _read_reference(a.reference) if a.reference else None
    reference = ref["ids"] if ref else None
    drafts = DraftSettings(lookup=a.lookup, lookup_drafts=a.lookup_drafts, mtp=a.mtp, mtp_drafts=a.mtp_drafts,
                           mtp_pstep=a.mtp_pstep, mtp_vocab=a.mtp_vocab, gate=a.gate, force=a.force,
                           reference=reference)
    settings = RunSettings(max_tokens=a.max_tokens, sampling=sampling, drafts=drafts,
                           prefill_batch=a.prefill_batch, context=a.context)
    eng = load_engine(_model_dir(a.model), read_mtp=a.mtp != "off", usage_file=a.vocab_usage, device=a.device)
    if a.threads is None:
        cpu_threads.apply_default(eng)
    if a.prompt_ids is not None:
        prompt = a.prompt_ids
    else:
        text = a.prompt
        if a.chat:
            if eng.tokenizer is None or not eng.tokenizer.has_chat_template:
                raise UsageError("--chat: this checkpoint has no chat template")
            try:
                text = eng.tokenizer.apply_chat_template([{"role": "user", "content": text}])
            except Exception as e:      # a template that does not compile, or raises for these messages
                raise VerispecError(f"--chat: the checkpoint's chat template failed: {e}") from None
        prompt = eng.encode(text)
    if a.mtp == "on" and not eng.has_mtp:
        raise UsageError(f"--mtp on: {eng.path} has no MTP head (mtp.* tensors)")
    model = checkpoint_fingerprint(eng.path) if (a.json or ref) else None
    if ref is not None:
        try:
            eng.check_ids(list(reference))
        except UsageError as e:
            raise UsageError(f"--reference {a.reference}: {e} (a reference from another model?)") from None
        _check_reference(a.reference, ref, prompt, sampling, model)
    res = eng.generate(prompt, settings, keep_logits=a.dump_logits is not None)
    if a.usage_save:
        eng.save_usage()
    if a.json:
        # what a --reference made from this output is checked against (_check_reference)
        run = {"prompt_ids": list(prompt), "sampling": dataclasses.asdict(sampling), "model": model}
        stats = {**res.stats, "threads": torch.get_num_threads()}     # the count the run used (cpu_threads)
        _print_stdout(json.dumps({"ids": res.ids, "text": res.text, "stats": stats, **run}))
    else:
        _print_stdout(res.text)
    for line in report_lines(res.stats, gate_on=drafts.gate):
        print(line, file=sys.stderr)
    if a.dump_logits:       # after the text: a failed write loses nothing else
        import numpy as np
        try:
            with open(a.dump_logits, "wb") as f:     # the path as given (np.save would add .npy)
                np.save(f, torch.stack(res.logits).float().cpu().numpy())
        except OSError as e:
            raise VerispecError(f"--dump-logits {a.dump_logits}: could not write it ({e.strerror})") from None
    return 0


def _check_writable(path: str) -> None:
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"--dump-logits {path}: is a directory (give a file name, e.g. {p / 'logits.npy'})")
    if not p.resolve().parent.is_dir():
        raise UsageError(f"--dump-logits {path}: its directory does not exist")
    if not os.access(p.resolve().parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise UsageError(f"--dump-logits {path}: not writable")


def _print_stdout(text: str) -> None:
    """stdout may be a pipe its reader closed (`| head`): that is not a failure of the run, and the
    report lines on stderr still come."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # no second error at exit


def cmd_plan(a: argparse.Namespace) -> int:
    from .errors import ModelFormatError
    from .models import ModelArgs
    from .plan import describe, layout_of, plan
    from .weights import read_config

    if a.config and a.model:
        raise UsageError("give --model or --config, not both")
    if a.config:
        if Path(a.config).is_dir():
            raise UsageError(f"--config {a.config}: is a directory (give its config.json, or use --model)")
        try:
            cfg = json.loads(Path(a.config).read_text())
        except FileNotFoundError:
            raise UsageError(f"--config {a.config}: no such file") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise UsageError(f"--config {a.config}: not valid JSON ({e})") from None
        if not isinstance(cfg, dict):
            raise UsageError(f"--config {a.config}: not a JSON object")
    else:
        cfg = read_config(_model_dir(a.model))
    if a.context is not None and a.context < 1:
        raise UsageError(f"--context must be >= 1, got {a.context}")
    try:
        args = ModelArgs.from_dict(cfg)
    except KeyError as e:
        raise VerispecError(f"{a.config or a.model or 'config.json'}: lacks a required field {e}") from None
    except ModelFormatError as e:
        if not a.config:
            raise
        raise ModelFormatError(f"--config {a.config}: {str(e).removeprefix('config.json: ')}") from None
    if a.context is not None and a.context > args.max_position_embeddings:
        raise UsageError(f"--context {a.context} exceeds the model's max_position_embeddings "
                         f"({args.max_position_embeddings})")
    p = plan(args, a.context or min(4096, args.max_position_embeddings), layout_of(a.device))
    print(json.dumps(p) if a.json else describe(p))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # --debug is taken anywhere on the line (README: before the subcommand); it only adds tracebacks
    debug = "--debug" in argv
    argv = [x for x in argv if x != "--debug"]
    try:
        a = build_parser().parse_args(argv)
        if a.cmd == "run":
            return cmd_run(a)
        if a.cmd == "plan":
            return cmd_plan(a)
        if a.cmd == "bench":
            from .bench_cmd import run_bench
            return run_bench(a)
        if a.cmd == "serve":
            try:
                from .serve_cli import serve
            except ImportError as e:
                raise VerispecError(f"verispec serve needs the server extras ({e.name} is missing): "
                                    "pip install -e '.[serve]'") from None
            return serve(a)
        if a.cmd == "fixture":
            from .fixture import main_fixture
            return main_fixture(a)
        return 2
    except VerispecError as e:
        if debug:
            traceback.print_exc()
        print(f"verispec: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # a bug or an environment failure: still one line
        if debug:
            traceback.print_exc()
            print(f"verispec: error: {type(e).__name__}: {e}", file=sys.stderr)
            return 1
        print(f"verispec: error: {type(e).__name__}: {e} (rerun with --debug for a traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
