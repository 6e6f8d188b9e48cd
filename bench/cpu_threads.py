"""CPU decode speed by thread count and OpenMP wait policy, on a quiet machine and with one core busy.

    python bench/cpu_threads.py [--models default,small,mid] [--rounds 5] [--tokens 256]
                                [--arms auto,t1,tall,tall_spin] [--busy both|no|yes] [--out bench/results]

Each arm is a fresh `verispec run --json` process (greedy, drafts on, as a user runs it); its
decode_tok_s is read from the JSON. Arms, interleaved within a round (A B C A B C ...):
  auto       no --threads: whatever the CLI picks (verispec/cpu_threads.py)
  t1         --threads 1
  tall       --threads <CPUs online>, OMP_WAIT_POLICY=PASSIVE (verispec's default policy)
  tall_spin  --threads <CPUs online>, OMP_WAIT_POLICY unset: GNU OpenMP spins a while before sleeping
"Busy" runs a spinning process (pure Python, one core) beside each round, as a shared box has.

`--products` instead times the row kernel alone (verispec.ops.linear) on one thread and on every
CPU, passive waiting, for weights of 0.3-67 MB at 1 and 4 rows, in a loop with a small torch op
between calls as a forward has: where the second thread starts to pay. Raw: OUT/cpu_threads_products.json.

Models: `default` the bundled model; `small` and `mid` random checkpoints written once by
verispec.fixture.make_fixture under $XDG_CACHE_HOME/verispec-bench (83 and 570 MiB of active fp32
weights a token; the bundled model reads 34 MiB). Raw: OUT/cpu_threads.json; a table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from decode import MODELS as DECODE_MODELS  # noqa: E402
from verispec.config import default_model_dir  # noqa: E402

# `mid` is bench/decode.py's mid-size model; `small` the same family at half its width and layers
MODELS = {"mid": DECODE_MODELS["mid"],
          "small": {**DECODE_MODELS["mid"], "hidden_size": 512, "num_layers": 8, "num_experts": 8,
                    "moe_intermediate_size": 256, "shared_expert_intermediate_size": 256, "intermediate_size": 256,
                    "head_dim": 64, "linear_key_head_dim": 64, "linear_value_head_dim": 64}}
ARMS = ("auto", "t1", "tall", "tall_spin")


def model_dir(name: str) -> tuple[Path, list[str]]:
    """(the model directory, the prompt arguments for it)."""
    if name == "default":
        return default_model_dir(), ["def fibonacci(n):"]
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "verispec-bench"
    d = root / name
    if not (d / "config.json").exists():
        from verispec.fixture import make_fixture
        t0 = time.perf_counter()
        make_fixture(d, **MODELS[name])
        print(f"[cpu_threads] wrote {name} to {d} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return d, ["--prompt-ids", "1,2,3,4,5,6,7,8,9,10,11,12"]


def run_arm(arm: str, model: Path, prompt: list[str], tokens: int) -> float:
    env = dict(os.environ)
    args = [sys.executable, "-m", "verispec.cli", "run", *prompt, "--model", str(model), "--max-tokens", str(tokens),
            "--json", "--usage-save", "off"]
    if arm == "t1":
        args += ["--threads", "1"]
    elif arm in ("tall", "tall_spin"):
        args += ["--threads", str(os.cpu_count())]
    env.pop("OMP_WAIT_POLICY", None)
    if arm == "tall_spin":
        env["OMP_WAIT_POLICY"] = ""      # set, so verispec leaves it; empty, so GNU OpenMP keeps its default
    out = subprocess.run(args, env=env, capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        raise RuntimeError(f"{arm}: rc {out.returncode}: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout)["stats"]["decode_tok_s"]


PRODUCT_SHAPES = ((256, 256), (512, 256), (1024, 256), (1024, 512), (1024, 1024), (2048, 1024), (4096, 1024),
                  (8192, 1024), (8192, 2048))


def products(rounds: int) -> dict:
    """{"NxK": {rows: {"1": us, "all": us}}}: medians over rounds of the mean time a call (in process:
    verispec sets OMP_WAIT_POLICY=PASSIVE on import, before torch loads)."""
    import verispec  # noqa: F401  (the wait policy, before torch)
    import torch

    from verispec.ops import linear as lin

    n_all = os.cpu_count()
    out = {}
    for n, k in PRODUCT_SHAPES:
        w = torch.randn(n, k)
        out[f"{n}x{k}"] = {}
        for m in (1, 4):
            x = torch.randn(m, k)
            t = {"1": [], "all": []}
            for _ in range(rounds):
                for arm, th in (("1", 1), ("all", n_all)):
                    torch.set_num_threads(th)
                    reps = max(20, int(2e7 / (n * k)))
                    t0 = time.perf_counter()
                    for _ in range(reps):
                        lin.linear(x, w)
                        x.add_(0.0)
                    t[arm].append((time.perf_counter() - t0) / reps * 1e6)
            a, b = statistics.median(t["1"]), statistics.median(t["all"])
            out[f"{n}x{k}"][m] = {"1": a, "all": b}
            print(f"[cpu_threads] product {n}x{k} ({n * k * 4 / 1e6:.1f} MB), {m} rows: 1 thread {a:.1f} us, "
                  f"{n_all} threads {b:.1f} us ({a / b:.2f}x)", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="default,small,mid")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--busy", choices=("both", "no", "yes"), default="both")
    ap.add_argument("--out", default=os.environ.get("OUT", str(ROOT / "bench/results")))
    ap.add_argument("--products", action="store_true", help="time the row kernel alone (see above)")
    a = ap.parse_args()
    if a.products:
        doc = {"machine": {"cpus_online": os.cpu_count(), "python": platform.python_version(),
                           "load_at_start": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M"),
                           "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "PASSIVE (verispec's)")},
               "command": " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]), "products_us": products(a.rounds)}
        doc["machine"]["load_at_end"] = os.getloadavg()
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "cpu_threads_products.json").write_text(json.dumps(doc, indent=1))
        return 0
    arms = a.arms.split(",")
    if set(arms) - set(ARMS) or not arms:
        ap.error(f"--arms: some of {','.join(ARMS)}")
    conditions = {"both": (False, True), "no": (False,), "yes": (True,)}[a.busy]
    doc = {"machine": {"cpus_online": os.cpu_count(), "python": platform.python_version(),
                       "load_at_start": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M")},
           "command": " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]), "tokens": a.tokens, "results": {}}
    for name in a.models.split(","):
        d, prompt = model_dir(name)
        for busy in conditions:
            times: dict[str, list[float]] = {arm: [] for arm in arms}
            for _ in range(a.rounds):
                hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
                try:
                    for arm in arms:
                        times[arm].append(run_arm(arm, d, prompt, a.tokens))
                finally:
                    if hog is not None:
                        hog.kill()
                        hog.wait()
            key = f"{name}/{'busy' if busy else 'quiet'}"
            doc["results"][key] = {arm: {"median": statistics.median(v), "min": min(v), "max": max(v), "runs": v}
                                   for arm, v in times.items()}
            print(f"[cpu_threads] {key}: " + "; ".join(
                f"{arm} {statistics.median(v):.1f} [{min(v):.1f}-{max(v):.1f}]" for arm, v in times.items()), flush=True)
    doc["machine"]["load_at_end"] = os.getloadavg()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cpu_threads.json").write_text(json.dumps(doc, indent=1))
    print(f"\n| model / machine | " + " | ".join(arms) + " |\n|---|" + "---|" * len(arms))
    for key, r in doc["results"].items():
        print(f"| {key} | " + " | ".join(f"{r[arm]['median']:.1f} [{r[arm]['min']:.1f}-{r[arm]['max']:.1f}]"
                                         for arm in arms) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
