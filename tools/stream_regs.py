"""Registers and shared memory of the stream products' CTAs (verispec/ops/cuda_stream_gemv.cu) at the
35B-A3B shapes, without a GPU: NVRTC builds each setting's sm_90 cubin as cuda_nvrtc.compile_kernel does, and
cuobjdump (shipped in triton's wheel) reads its register count. It tells which two products' CTAs can sit on
one SM at once (64 K registers, 228 KiB of shared memory an SM), the premise of bench/cuda_bench.py
--sections coresident. Needs libnvrtc 13, cuda-bindings and triton's cuobjdump, e.g.:

  pip download --no-deps -d /tmp/nvrtcpkg "nvidia-cuda-nvrtc>=13,<14" && unzip -q -d /tmp/nvrtcx /tmp/nvrtcpkg/*.whl
  pip install --target /tmp/tritonpkg triton==3.6.0
  LD_LIBRARY_PATH=/tmp/nvrtcx/nvidia/cu13/lib python tools/stream_regs.py
"""
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from cuda_bench import IN_4W  # noqa: E402

from verispec.ops import cuda_nvrtc, cuda_stream_gemv  # noqa: E402

CUOBJDUMP = next((c for c in (Path(p) / "triton/backends/nvidia/bin/cuobjdump" for p in sys.path) if c.exists()), None)
# (name, K, N, config, conv, MAXREG): the configured products, and the coresident section's input products
_IN, _CAP = IN_4W["CONFIG"], IN_4W["MAXREG"]
CASES = [("input (DeltaNet, conv), configured", 2048, 12352, None, True, 0),
         ("input (attention), configured", 2048, 9216, None, False, 0),
         ("output, configured", 4096, 2048, None, False, 0),
         ("input (DeltaNet, conv), coresident, uncapped", 2048, 12352, _IN[(2048, 12352)], True, 0),
         ("input (DeltaNet, conv), coresident", 2048, 12352, _IN[(2048, 12352)], True, _CAP.get((2048, 12352), 0)),
         ("input (attention), coresident", 2048, 9216, _IN[(2048, 9216)], False, _CAP.get((2048, 9216), 0))]
SMS = 132


def registers(k: int, cfg: tuple, conv: bool, maxreg: int) -> int:
    cg, warps, kc, spw = cfg
    defines = {"K": k, "CG": cg, "WARPS": warps, "KC": kc, "SPW": spw, "CONV": int(conv), "TRIG": 1, "TMA2D": 1,
               "PRE": spw, "PACE": 0, "EVF": 0, "STAMPS": 0, "MAXREG": maxreg}
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin") as f:
        f.write(cuda_nvrtc.cubin((9, 0), "cuda_stream_gemv.cu", defines))
        f.flush()
        out = subprocess.run([str(CUOBJDUMP), "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    return int(re.search(r"REG:(\d+)", out).group(1))


def main() -> int:
    if CUOBJDUMP is None:
        sys.exit("stream_regs: needs triton's cuobjdump on sys.path (see the docstring)")
    for name, k, n, cfg, conv, maxreg in CASES:
        cfg = cfg or cuda_stream_gemv.CONFIG[(k, n)]
        regs = registers(k, cfg, conv, maxreg)
        warps = cfg[1]
        tasks = cuda_stream_gemv._tasks(n, cfg[0], SMS) if conv else 0
        smem = cuda_stream_gemv._smem(*cfg, tasks)
        alloc = -(-regs // 8) * 8 * 32 * warps      # a warp's registers are allocated in units of 256
        print(f"{name}: {cfg}, {regs} registers a thread ({alloc} a CTA), {smem / 1024:.1f} KiB of shared memory")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
