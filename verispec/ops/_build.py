"""Compile a C source of this package once per user and load it with ctypes.

The shared object goes to ``$XDG_CACHE_HOME/verispec`` (or ``~/.cache/verispec``)
under a name keyed by a hash of the source, the flags and the compiler, so an edit
rebuilds and two versions never collide. It is written to a temp file and renamed
into place, so two processes compiling at once cannot leave a half-written file.
No torch headers: a plain C file compiles in well under a second.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

BASE_FLAGS = ("-O3", "-fopenmp", "-shared", "-fPIC", "-ffp-contract=off")
AVX2_FLAGS = ("-mavx2", "-mfma", "-DVS_AVX2")


@dataclass(frozen=True)
class Built:
    lib: ctypes.CDLL
    variant: str  # "avx2" or "portable"
    path: Path


def cpu_has_avx2_fma() -> bool:
    """True when /proc/cpuinfo lists both avx2 and fma (Linux x86-64)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    for line in text.splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            return {"avx2", "fma"} <= flags
    return False


def find_compiler() -> str | None:
    for name in ("gcc", "cc"):
        path = shutil.which(name)
        if path:
            return path
    return None


def cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "verispec"


def build(source: Path, compiler: str | None = None, variant: str | None = None) -> Built | None:
    """Compile ``source`` (if not cached) and load it. None when no compiler exists.

    A compiler that exists but fails raises: that is a bug to see, not to hide.
    ``variant`` ("avx2" or "portable") overrides the choice made from the CPU flags.
    """
    compiler = compiler or find_compiler()
    if compiler is None:
        return None
    variant = variant or ("avx2" if cpu_has_avx2_fma() else "portable")
    flags = BASE_FLAGS + (AVX2_FLAGS if variant == "avx2" else ())
    key = hashlib.sha256()
    key.update(source.read_bytes())
    key.update(" ".join((compiler,) + flags).encode())
    out_dir = cache_dir()
    target = out_dir / f"{source.stem}-{variant}-{key.hexdigest()[:16]}.so"
    if not target.exists():
        out_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=target.stem + ".", suffix=".tmp")
        os.close(fd)
        try:
            cmd = [compiler, *flags, str(source), "-o", tmp]
            res = subprocess.run(cmd, capture_output=True, text=True)
            if res.returncode != 0:
                raise RuntimeError(f"compiling {source.name} failed:\n{' '.join(cmd)}\n{res.stderr}")
            os.replace(tmp, target)  # atomic: readers see the old name or the whole file
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return Built(lib=ctypes.CDLL(str(target)), variant=variant, path=target)
