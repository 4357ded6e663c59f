"""Build and load the native CPU kernels (engine/native/csrc: paged attention and the fused layer
ops) with the system C++ compiler.

The shared library is compiled once per source, flags and CPU (``-march=native``) into the engine's
cache folder and loaded with ctypes; no torch headers are needed, so a build takes seconds. Where no
compiler works, ``load_cpu_kernels`` returns None and the caller keeps the portable path.
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

from stallfree.engine.cache_dir import cache_root

log = logging.getLogger(__name__)

CSRC = Path(__file__).with_name("csrc")
LIBRARY = "cpu_kernels"  # one shared library built from every .cpp file of csrc/
# -ffast-math: vectorized fp32 reductions need reassociation; the kernel masks with finite values only.
FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-ffast-math", "-std=c++17", "-Wno-psabi"]
HEAD_DIM_MULTIPLE = 16  # the kernel's vectors run along head_dim in steps of 16 floats
KERNEL_SUFFIXES = {torch.bfloat16: "bf16", torch.float32: "f32"}
_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
ARGTYPES = {  # keep in sync with DEFINE_KERNELS in csrc/paged_attention.cpp
    "paged_attention": [_P, _I, _I, _P, _P, _P, _I, _P, _P, _I, _P, _I, _I, _I, _I, _I, _F, ctypes.c_int],
    "write_cache": [_P, _I, _P, _I, _P, _P, _P, _I, _I, _I, _I, _I, ctypes.c_int],
    # csrc/layer_ops.cpp, DEFINE_LAYER_OPS
    "rms_norm": [_P, _I, _P, _P, _P, _I, _I, _F, ctypes.c_int, ctypes.c_int],
    "rotary": [_P, _I, _I, _P, _I, _I, _P, _P, _I, _I, ctypes.c_int],
    "silu_and_mul": [_P, _P, _I, _I, ctypes.c_int],
}
ONE_DTYPE_ARGTYPES = {  # kernels of one dtype (no _bf16 / _f32 pair): bf16 linear_tiled and decoder_layer*_bf16, fp32 linear_widened, decoder_layer*_widened_f32 and sampling
    "linear_tiled_path": [],
    "linear_tiled_select": [ctypes.c_int],
    "linear_tiled_pack": [_P, _I, _I, _P],
    "linear_tiled_bf16": [_P, _I, _I, _P, _I, _P, ctypes.c_int, _P, ctypes.c_int],
    "linear_widened_f32": [_P, _I, _I, _P, _I, _P, _P, ctypes.c_int],
    "argmax_rows_f32": [_P, _I, _I, _I, _P, ctypes.c_int],
    "decoder_layer_bf16": [_P, _P, _P, _P, _P, _P, ctypes.c_int],
    "decoder_layer_attention_bf16": [_P, _P, _P, _P, _P, _P, ctypes.c_int],
    "decoder_layer_mlp_bf16": [_P, _P, _P, _P],
    "decoder_layer_widened_f32": [_P, _P, _P, _P, _P, _P, ctypes.c_int],
    "decoder_layer_attention_widened_f32": [_P, _P, _P, _P, _P, _P, ctypes.c_int],
    "decoder_layer_mlp_widened_f32": [_P, _P, _P, _P],
}


def _cpu_signature() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), platform.processor())
    except OSError:
        return platform.processor()


def _build(compiler: str) -> Path:
    sources = [path.read_text() for path in sorted(CSRC.iterdir()) if path.is_file()]
    key = hashlib.sha256("\n".join([*sources, compiler, *FLAGS, _cpu_signature()]).encode())
    target = cache_root() / "kernels" / f"{LIBRARY}-{key.hexdigest()[:16]}.so"
    if target.is_file():
        return target
    log.info("building the native CPU kernels into %s (once per source and CPU)", target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        subprocess.run([compiler, *FLAGS, *map(str, sorted(CSRC.glob("*.cpp"))), "-o", tmp], check=True, capture_output=True, text=True)
        os.replace(tmp, target)  # atomic: concurrent builders (server + tests) never load a partial file
    finally:
        Path(tmp).unlink(missing_ok=True)
    return target


@functools.cache
def load_cpu_kernels() -> ctypes.CDLL | None:
    """The compiled kernel library, or None (with a warning) when it cannot be built here."""
    compiler = shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")
    if compiler is None:
        log.warning("no C++ compiler found; CPU attention and layer ops use the portable PyTorch paths")
        return None
    try:
        lib = ctypes.CDLL(str(_build(compiler)))
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", "") or exc
        log.warning("building the native CPU kernels failed; using the portable PyTorch paths: %s", detail)
        return None
    for name, argtypes in ARGTYPES.items():
        for suffix in KERNEL_SUFFIXES.values():
            getattr(lib, f"{name}_{suffix}").argtypes = argtypes
            getattr(lib, f"{name}_{suffix}").restype = ctypes.c_int
    for name, argtypes in ONE_DTYPE_ARGTYPES.items():
        getattr(lib, name).argtypes, getattr(lib, name).restype = argtypes, ctypes.c_int
    return lib
