"""The tiled linear's layer stack on any CPU, for tests: bf16 CPU models get TiledLinear (and so the native
decoder layer) even where the CPU has neither AMX nor AVX512-BF16, and the kernel then runs its reference loop
(engine/native/csrc/linear_tiled.cpp). Paths' sums differ in their last bits, so tests compare runs on one path.
The models' linears must tile (a multiple of 32 inputs and outputs): one that does not would be a oneDNN bf16
linear, which needs AVX512."""
import pytest

from stallfree.engine.model import loader, tiled_linear


def use_tiled_linears(patch: pytest.MonkeyPatch) -> None:
    patch.setattr(tiled_linear, "fast_path_available", lambda: True)
    patch.setattr(loader, "can_pack", lambda device, dtype: device.type == "cpu")  # where bf16 models pack


def paths_here() -> list[str]:
    """The tiled linear's paths this CPU runs (the reference loop always)."""
    best = tiled_linear.linear_path()
    return [] if best is None else list(tiled_linear.PATHS[: tiled_linear.PATHS.index(best) + 1])
