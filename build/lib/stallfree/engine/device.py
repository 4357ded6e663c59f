"""Device and dtype selection."""
from __future__ import annotations

import functools
import platform

import torch

DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float32": torch.float32, "fp32": torch.float32,
          "float16": torch.float16, "fp16": torch.float16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"model.device={name!r} but CUDA is not available")
    return torch.device(name)


@functools.cache
def cpu_description() -> str:
    """The CPU's model name and whether it has native bf16, for the records of a profile."""
    try:
        with open("/proc/cpuinfo") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        name = ""
    return f"{name or platform.processor() or platform.machine()}, {'' if cpu_has_fast_bf16() else 'no '}native bf16"


@functools.cache
def cpu_has_fast_bf16() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """``auto``: bf16 on CUDA and on CPUs with AVX512-BF16/AMX (native bf16 matmuls), fp32 otherwise."""
    if name == "auto":
        fast_bf16 = device.type == "cuda" or cpu_has_fast_bf16()
        return torch.bfloat16 if fast_bf16 else torch.float32
    if name not in DTYPES:
        raise ValueError(f"unknown model.dtype {name!r}; choose auto, {', '.join(DTYPES)}")
    return DTYPES[name]
