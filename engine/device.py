"""Device and dtype selection."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from stallfree.engine.records.machine import cpu_has_fast_bf16

DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float32": torch.float32, "fp32": torch.float32,
          "float16": torch.float16, "fp16": torch.float16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"model.device={name!r} but CUDA is not available")
    return torch.device(name)


@dataclass(frozen=True)
class DtypeChoice:
    dtype: torch.dtype  # what the model computes in: activations, KV cache, sums
    reason: str  # why this dtype: the setting, and for ``auto`` what it found
    # the linears' stored weights where they differ from ``dtype`` (bf16 weights computed in fp32)
    weight_dtype: torch.dtype | None = None

    @property
    def name(self) -> str:
        """The dtype as set: bf16 weights computed in fp32 are ``bfloat16``, as a peer server is asked to run."""
        return str(self.weight_dtype or self.dtype).removeprefix("torch.")

    def __str__(self) -> str:
        return f"{self.name} ({self.reason})"


def choose_dtype(name: str, device: torch.device | str) -> DtypeChoice:
    """``auto``: bf16 on CUDA and on CPUs with AVX512-BF16/AMX (native bf16 matmuls), fp32 otherwise (bf16
    would be emulated, slower than fp32). ``bfloat16`` on a CPU without native bf16: fp32 compute over bf16
    linear weights (engine/model/widened_linear.py). Raises ValueError on an unknown name."""
    device = resolve_device(device) if isinstance(device, str) else device
    if name == "auto":
        if device.type == "cuda":
            return DtypeChoice(torch.bfloat16, "model.dtype=auto: CUDA")
        if cpu_has_fast_bf16():
            return DtypeChoice(torch.bfloat16, "model.dtype=auto: this CPU has native bf16 (AMX-BF16 / AVX512-BF16)")
        return DtypeChoice(torch.float32, "model.dtype=auto: this CPU has no native bf16 (AMX-BF16 / AVX512-BF16)")
    if name not in DTYPES:
        raise ValueError(f"unknown model.dtype {name!r}; choose auto, {', '.join(DTYPES)}")
    if DTYPES[name] == torch.bfloat16 and device.type == "cpu" and not cpu_has_fast_bf16():
        # emulated bf16 matmuls ran ~100x slower than fp32: keep the weights' bytes, compute in fp32
        return DtypeChoice(torch.float32, f"model.dtype={name}: this CPU has no native bf16 (AMX-BF16 / "
                           "AVX512-BF16): bf16 weights widened to fp32, computed in fp32", torch.bfloat16)
    return DtypeChoice(DTYPES[name], f"model.dtype={name}")
