"""A tensor-parallel engine on `tiny` (fp32, CPU, gloo, 2 processes), shared by the tests of a module."""
import psutil
import pytest

from stallfree.engine import LLMEngine


def tp2_engine(model="tiny", **kwargs) -> LLMEngine:
    return LLMEngine.from_kwargs(model=model, dtype="float32", device="cpu", tensor_parallel_size=2, **kwargs)


def live_children() -> list[psutil.Process]:
    """This process's children that still run (not the multiprocessing resource tracker, which leaves with it)."""
    return [child for child in psutil.Process().children(recursive=True)
            if child.is_running() and child.status() != psutil.STATUS_ZOMBIE
            and "resource_tracker" not in " ".join(child.cmdline())]


@pytest.fixture
def no_orphans():
    """Fails the test if a process it started is still running at its end."""
    before = {p.pid for p in live_children()}
    yield
    left = [p for p in live_children() if p.pid not in before]
    assert not left, f"processes left running: {left}"
