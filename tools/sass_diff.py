"""Whether a change to the CUDA C++ kernels changes the code the GPU runs, without a GPU: every build
of verispec/ops/cuda_variants.py (the working tree's list) compiled for sm_90 through NVRTC from the
sources at REV (default HEAD) and from the working tree, disassembled by cuobjdump and compared
instruction for instruction. A refactor that keeps every build's SASS keeps every bit and every
timing; one that does not needs the GPU tests (device time is scarce: docs/device-runs.md).

  python tools/sass_diff.py [REV]          exit 0: every build the same; 1: some differ; 2: a build failed

Needs NVRTC as tools/nvrtc_check.py does, and cuobjdump with its nvdisasm beside it (on the PATH, or
cuobjdump in $CUOBJDUMP), e.g.:
  pip download --no-deps -d /tmp/cuobj "nvidia-cuda-cuobjdump==13.5.*" "nvidia-cuda-nvdisasm==13.5.*"
  for w in /tmp/cuobj/*.whl; do unzip -q -o -d /tmp/cuobj "$w"; done
  CUOBJDUMP=/tmp/cuobj/nvidia/cu13/bin/cuobjdump python tools/sass_diff.py HEAD~1
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from verispec.ops import cuda_nvrtc, cuda_variants  # noqa: E402

OPS = "verispec/ops"


def at_rev(rev: str, name: str) -> str:
    """The text of verispec/ops/<name> at rev."""
    run = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{OPS}/{name}"], capture_output=True, text=True)
    if run.returncode:
        raise RuntimeError(f"{OPS}/{name} is not at {rev}: {run.stderr.strip()}")
    return run.stdout


def sass(cuobjdump: str, built: bytes) -> list[str]:
    """The cubin's SASS lines from its first function on (the header names the temporary file)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(built)
        f.flush()
        run = subprocess.run([cuobjdump, "-sass", f.name], capture_output=True, text=True,
                             env={**os.environ, "PATH": f"{Path(cuobjdump).parent}:{os.environ.get('PATH', '')}"})
    if run.returncode or "Function :" not in run.stdout:   # e.g. no nvdisasm beside cuobjdump
        raise RuntimeError(f"cuobjdump gave no SASS: {(run.stderr or run.stdout).strip()[:300]}")
    out = run.stdout
    lines = out.splitlines()
    start = next((i for i, line in enumerate(lines) if "Function :" in line), 0)
    return [line.strip() for line in lines[start:] if line.strip()]


# the instructions that compute or move a product's values: where these keep their order, a difference is
# in registers, addresses and integer work, which moves no bit (the timings may still move)
VALUE_OPS = re.compile(r"(HMMA|FADD|FFMA|FMUL|F2F|F2FP|HADD2|HFMA2|FMNMX|MUFU|FSET|FSETP|SHFL|STS|LDS|STG|LDG|UTMALDG"
                       r"|SYNCS)")


def value_ops(lines: list[str]) -> list[str]:
    """The opcodes of VALUE_OPS in program order (predicates and operands dropped)."""
    out = []
    for line in lines:
        m = re.match(r"/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", line)
        if m and VALUE_OPS.match(m.group(1)):
            out.append(m.group(1))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("rev", nargs="?", default="HEAD")
    a = p.parse_args()
    cuobjdump = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    if not cuobjdump:
        sys.exit("sass_diff: no cuobjdump (set CUOBJDUMP; the docstring says where to get one)")
    if cuda_nvrtc.nvrtc is None:
        sys.exit("sass_diff: needs cuda-bindings and libnvrtc (tools/nvrtc_check.py's docstring)")
    try:
        old_headers = {h: at_rev(a.rev, h) for h in cuda_nvrtc.HEADERS}
    except RuntimeError as e:
        sys.exit(f"sass_diff: {e}")
    same = differ = failed = 0
    for source, defines in cuda_variants.all_builds():
        try:
            new = sass(cuobjdump, cuda_nvrtc.cubin((9, 0), source, defines))
            old = sass(cuobjdump, cuda_nvrtc.cubin((9, 0), source, defines, text=at_rev(a.rev, source),
                                                   header_texts=old_headers))
        except RuntimeError as e:   # NVRTC's, cuobjdump's or git's message
            failed += 1
            print(f"FAILED {source} {defines}: {str(e).splitlines()[0]}")
            continue
        if old == new:
            same += 1
            print(f"same    {source} {defines} ({len(new)} lines)")
        else:
            differ += 1
            kept = value_ops(old) == value_ops(new)
            print(f"DIFFERS {source} {defines}: {len(old)} -> {len(new)} lines; " +
                  ("the float and memory operations in the same order (registers and integer work differ)"
                   if kept else "the float or memory operations differ"))
    print(f"against {a.rev}: {same} the same, {differ} differ, {failed} failed to build")
    return 2 if failed else (1 if differ else 0)


if __name__ == "__main__":
    raise SystemExit(main())
