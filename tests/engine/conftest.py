"""Fixtures of the engine tests."""
import importlib.util
import sys

import pytest
import torch

from tests.helpers.tiled import use_tiled_linears

# Modules that define Triton kernels: ``@triton.jit`` reads TRITON_INTERPRET when a module is imported.
TRITON_KERNEL_MODULES = ("stallfree.engine.attention.triton_kernel", "stallfree.engine.model.triton_layer_kernels")


def import_triton_for_the_interpreter(monkeypatch) -> None:
    """Import triton with TRITON_INTERPRET=1 on a machine without CUDA: ``triton.language``'s own jit
    functions (``tl.sum``, ``tl.max``, ...) are defined at its import, and only interpreted ones run on
    the CPU. Without CUDA no compiled Triton kernel can run in this process anyway."""
    language = sys.modules.get("triton.language")
    if language is None:
        with monkeypatch.context() as m:
            m.setenv("TRITON_INTERPRET", "1")
            import triton.language as language
    from triton.runtime.interpreter import InterpretedFunction
    if not isinstance(language.sum, InterpretedFunction):
        pytest.fail("triton was imported without TRITON_INTERPRET=1 before this test: its interpreter "
                    "cannot run here (tests/conftest.py sets it before torch is imported on a machine without a GPU)")


@pytest.fixture
def triton_device(monkeypatch):
    """The device Triton kernels run on in this test: CUDA where there is one; else the CPU under Triton's
    interpreter, with TRITON_INTERPRET=1 for this test only (the kernel modules are imported afresh under
    it and dropped afterwards, so no other test sees interpreted kernels or the variable)."""
    if importlib.util.find_spec("triton") is None:  # not importorskip: triton must not be imported yet
        pytest.skip("triton is not installed")
    if torch.cuda.is_available():
        yield torch.device("cuda")
        return
    import_triton_for_the_interpreter(monkeypatch)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    for name in TRITON_KERNEL_MODULES:
        sys.modules.pop(name, None)
    yield torch.device("cpu")
    for name in TRITON_KERNEL_MODULES:
        sys.modules.pop(name, None)


@pytest.fixture
def tiled_linears(monkeypatch):
    """bf16 CPU models built in this test use TiledLinear and the native decoder layer, on the CPU's best path
    or, where it has no fast one, on the kernel's reference loop (tests/helpers/tiled.py)."""
    use_tiled_linears(monkeypatch)
