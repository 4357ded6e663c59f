"""Build and load the native CPU kernels (engine/attention/csrc) with the system C++ compiler.

The shared library is compiled once per source, flags and CPU (``-march=native``) into the preset
cache folder and loaded with ctypes; no torch headers are needed, so a build takes seconds. Where no
compiler works, ``load_paged_decode`` returns None and the caller keeps the portable path.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from engine.model.presets import cache_root

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("csrc") / "paged_decode.cpp"
# -ffast-math: vectorized fp32 reductions need reassociation and exp needs glibc's vector variants;
# the kernel only ever reads the finite keys of each sequence (no -inf masking).
FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-ffast-math"]
HEAD_DIMS = (16, 32, 64, 80, 96, 128, 256)  # the kernel's compile-time instantiations
KERNEL_NAMES = {torch.bfloat16: "paged_decode_bf16", torch.float32: "paged_decode_f32"}
_ARGTYPES = ([ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
              ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_int64] * 6
             + [ctypes.c_float, ctypes.c_int])


def _cpu_signature() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), platform.processor())
    except OSError:
        return platform.processor()


def _build(compiler: str) -> Path:
    key = hashlib.sha256("\n".join([SOURCE.read_text(), compiler, *FLAGS, _cpu_signature()]).encode())
    target = cache_root() / "kernels" / f"paged_decode-{key.hexdigest()[:16]}.so"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", tmp], check=True, capture_output=True, text=True)
        os.replace(tmp, target)  # atomic: concurrent builders (server + tests) never load a partial file
    finally:
        Path(tmp).unlink(missing_ok=True)
    return target


@functools.cache
def load_paged_decode() -> ctypes.CDLL | None:
    """The compiled paged-decode library, or None (with a warning) when it cannot be built here."""
    compiler = shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")
    if compiler is None:
        log.warning("no C++ compiler found; CPU decode attention uses the portable gather path")
        return None
    try:
        lib = ctypes.CDLL(str(_build(compiler)))
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", "") or exc
        log.warning("building the native paged-decode kernel failed; using the portable path: %s", detail)
        return None
    for name in KERNEL_NAMES.values():
        getattr(lib, name).argtypes = _ARGTYPES
        getattr(lib, name).restype = ctypes.c_int
    return lib
