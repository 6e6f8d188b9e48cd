"""Compile our CUDA C++ kernels through NVRTC as verispec/ops/cuda_nvrtc.py does, with the
headers it passes, for sm_90 at the 35B-A3B shapes, without a GPU (it stops before loading the
module). Needs libnvrtc 13 where cuda-bindings finds it, e.g.:

  pip download --no-deps -d /tmp/nvrtcpkg "nvidia-cuda-nvrtc==13.0.*" && unzip -q -d /tmp/nvrtcx /tmp/nvrtcpkg/*.whl
  LD_LIBRARY_PATH=/tmp/nvrtcx/nvidia/cu13/lib python tools/nvrtc_check.py
13.0 is likely what the device machines load (their torch is built for CUDA 13.0): it refused a generic
lambda in device code that 13.3 and 13.5 accept (device call 339), so check with the oldest.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from verispec.ops import cuda_nvrtc  # noqa: E402


def build(source, defines):
    try:
        cuda_nvrtc.cubin((9, 0), source, defines)
    except RuntimeError as e:   # the compiler's log is the finding
        print(source, "FAILED", str(e)[:2000])
        return False
    print(source, "ok", defines)
    return True


ok = build("cuda_stream_gemv.cu", dict(K=4096, CG=2, WARPS=8, KC=256, SPW=2, CONV=0, TRIG=1, TMA2D=1))
ok &= build("cuda_stream_gemv.cu", dict(K=2048, CG=2, WARPS=8, KC=256, SPW=3, CONV=1, TRIG=1, TMA2D=1))
ok &= build("cuda_stream_gemv.cu", dict(K=2048, CG=2, WARPS=8, KC=256, SPW=3, CONV=1, TRIG=1, TMA2D=1, PRE=3, PACE=1,
                                        EVF=1))
ok &= build("cuda_stream_gemv.cu", dict(K=4096, CG=2, WARPS=8, KC=256, SPW=2, CONV=0, TRIG=1, TMA2D=1, PRE=1, PACE=0,
                                        EVF=0))
ok &= build("cuda_stream_gemv.cu", dict(K=2048, CG=2, WARPS=8, KC=256, SPW=3, CONV=1, TRIG=1, TMA2D=1, STAMPS=1))
ok &= build("cuda_stream_gemv.cu", dict(K=4096, CG=2, WARPS=8, KC=256, SPW=2, CONV=0, TRIG=1, TMA2D=1, L2PF=1, L2AT=0, L2EL=1))
ok &= build("cuda_stream_gemv.cu", dict(K=4096, CG=2, WARPS=8, KC=256, SPW=2, CONV=0, TRIG=1, TMA2D=1, L2PF=1, L2AT=1, L2EL=0))
ok &= build("cuda_stream_gemv.cu", dict(K=2048, CG=2, WARPS=8, KC=256, SPW=3, CONV=1, TRIG=1, TMA2D=1, REGT=1))
ok &= build("cuda_stream_gemv.cu", dict(K=2048, CG=2, WARPS=8, KC=256, SPW=3, CONV=0, TRIG=1, TMA2D=1, REGT=2))
ok &= build("cuda_stream_gemv.cu", dict(K=4096, CG=2, WARPS=8, KC=256, SPW=2, CONV=0, TRIG=1, TMA2D=1, REGT=1))
ok &= build("cuda_stream_gemv.cu", dict(K=2048, CG=2, WARPS=8, KC=256, SPW=3, CONV=1, TRIG=1, TMA2D=1, DYN=1))
ok &= build("cuda_stream_gemv.cu", dict(K=2048, CG=2, WARPS=8, KC=256, SPW=3, CONV=0, TRIG=1, TMA2D=1, DYN=1, REGT=1))
ok &= build("cuda_recurrence.cu", dict(HV=32, REP=2, DV=128, WARPS=2, TRIG=1, CB=16, PRE=1, FAST=0, STAMPS=1))
ok &= build("cuda_moe_tail.cu", dict(HD=2048, ID=512, TOPK=8, NE=256, SLOT=8192, WARPS=8, SPW=3, EXTRA=2048, PHASES=3))
ok &= build("cuda_stream_moe.cu", dict(H=2048, I=512, S=9, GW=8, GR=8, GSPW=3, DW=8, DSPW=3, TRIG=1))
ok &= build("cuda_recurrence.cu", dict(HV=32, REP=2, DV=128, WARPS=2, TRIG=1, CB=16, PRE=1, FAST=0))
ok &= build("cuda_recurrence.cu", dict(HV=32, REP=2, DV=128, WARPS=4, TRIG=2, CB=8, PRE=0, FAST=1))
ok &= build("cuda_norm_route.cu", dict(HD=2048, NOUT=264, NE=256, TOPK=8, NORM=1, CL=8, WARPS=16))
ok &= build("cuda_norm_route.cu", dict(HD=2048, NOUT=264, NE=256, TOPK=8, NORM=0, CL=16, WARPS=16))
ok &= build("cuda_norm_route.cu", dict(HD=256, NOUT=40, NE=32, TOPK=4, NORM=1, CL=4, WARPS=2))
sys.exit(0 if ok else 1)
