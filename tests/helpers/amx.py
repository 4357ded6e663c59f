"""The AMX layer stack on any CPU, for tests: bf16 CPU models get AmxLinear (and so the native decoder layer)
even where the CPU has no AMX, and the kernel then runs its reference loop (engine/native/csrc/linear_amx.cpp).
Its sums are not AMX's to the bit, so tests compare paths that both run it. The models' linears must tile
(a multiple of 32 inputs and outputs): one that does not would be a oneDNN bf16 linear, which needs AVX512."""
import pytest

from stallfree.engine.model import amx_linear, loader


def use_amx_linears(patch: pytest.MonkeyPatch) -> None:
    patch.setattr(amx_linear, "amx_available", lambda: True)
    patch.setattr(loader, "can_pack", lambda device, dtype: device.type == "cpu")  # where bf16 models pack
