"""Every CUDA C++ build of verispec/ops/cuda_variants.py compiles for sm_90 through NVRTC, without a
GPU. Where no GPU is, this is the only check of the kernels' sources: a build NVRTC refuses turns the
CUDA C++ kernels off on the device (the Triton ones run, exact but slower), found until now only in a
device call (339). .ci/run installs NVRTC 13.0, likely what the device machines load; without
cuda-bindings and libnvrtc the tests skip."""

import pytest

from verispec.ops import cuda_nvrtc, cuda_variants


def _nvrtc_version():
    if cuda_nvrtc.nvrtc is None:
        return None
    try:
        status, major, minor = cuda_nvrtc.nvrtc.nvrtcVersion()
    except Exception:  # noqa: BLE001 - cuda-bindings without a loadable libnvrtc, whatever it raises
        return None
    return (major, minor) if int(status) == 0 else None


VERSION = _nvrtc_version()
needs_nvrtc = pytest.mark.skipif(VERSION is None, reason="no cuda-bindings with a loadable libnvrtc "
                                 "(pip install 'cuda-bindings>=13,<14' 'nvidia-cuda-nvrtc==13.0.*')")
BUILDS = cuda_variants.all_builds()


def _name(build):
    source, defines = build
    return source.removesuffix(".cu") + "-" + "-".join(f"{k}{v}" for k, v in defines.items())


@needs_nvrtc
@pytest.mark.parametrize("source,defines", BUILDS, ids=[_name(b) for b in BUILDS])
def test_builds_for_sm90(source, defines):
    built = cuda_nvrtc.cubin((9, 0), source, defines)
    assert built[:4] == b"\x7fELF", f"NVRTC {VERSION} returned no cubin for {source} {defines}"


def test_the_builds_cover_every_kernel_and_the_engine_settings():
    """The list is the modules' own: every kernel file in the package, and each default build with
    the module's present settings (so a new define reaches the check without editing the list)."""
    from importlib import resources

    from verispec.ops import cuda_stream_gemv as sg

    sources = {f.name for f in resources.files("verispec.ops").iterdir() if f.name.endswith(".cu")}
    assert sources == {s for s, _ in BUILDS}
    (k, n), cfg = next(iter(sg.CONFIG.items()))
    assert ("cuda_stream_gemv.cu", sg.defines(k, n, cfg, False)) in cuda_variants.engine()
    kept = sg.PACE
    try:
        sg.PACE = 1
        assert cuda_variants.engine()[0][1]["PACE"] == 1
    finally:
        sg.PACE = kept
