"""Compile our CUDA C++ kernels through NVRTC as verispec/ops/cuda_nvrtc.py does, with the
headers it passes, for sm_90: every build of verispec/ops/cuda_variants.py (the engine's at the
35B-A3B shape and its experiments'), without a GPU (it stops before loading the module).
tests/test_nvrtc_builds.py does the same where NVRTC is installed (.ci/run installs 13.0).
Needs libnvrtc 13 where cuda-bindings finds it: `pip install "nvidia-cuda-nvrtc==13.0.*"
"cuda-bindings>=13,<14"` in the venv, or:

  pip download --no-deps -d /tmp/nvrtcpkg "nvidia-cuda-nvrtc==13.0.*" && unzip -q -d /tmp/nvrtcx /tmp/nvrtcpkg/*.whl
  LD_LIBRARY_PATH=/tmp/nvrtcx/nvidia/cu13/lib python tools/nvrtc_check.py
13.0 is likely what the device machines load (their torch is built for CUDA 13.0): it refused a generic
lambda in device code that 13.3 and 13.5 accept (device call 339), so check with the oldest.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from verispec.ops import cuda_nvrtc, cuda_variants  # noqa: E402


def build(source, defines):
    try:
        cuda_nvrtc.cubin((9, 0), source, defines)
    except RuntimeError as e:   # the compiler's log is the finding
        print(source, "FAILED", str(e)[:2000])
        return False
    print(source, "ok", defines)
    return True


if __name__ == "__main__":
    print("NVRTC", ".".join(str(v) for v in cuda_nvrtc.nvrtc.nvrtcVersion()[1:]))
    results = [build(source, defines) for source, defines in cuda_variants.all_builds()]
    print(f"{sum(results)} of {len(results)} builds ok")
    sys.exit(0 if all(results) else 1)
