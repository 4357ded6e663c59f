"""A tensor-parallel engine on `tiny` (fp32, CPU, gloo, 2 processes), shared by the tests of a module, and the
token check every parallel layout passes."""
import psutil
import pytest

from stallfree.engine import LLMEngine
from tests.helpers.engine import hf_greedy, make_prompts, run_staggered

MAX_TOKENS = 24
POLICIES = [("sarathi", 64), ("vllm", 512)]


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


@pytest.fixture(scope="module")
def prompts():
    return make_prompts(8, seed=0)


def check_tokens_equal(parallel: LLMEngine, tiny_path, prompts) -> None:
    """``parallel``'s greedy tokens equal one process's and HF's under each policy, every KV block freed after."""
    reference = hf_greedy(tiny_path, prompts, MAX_TOKENS)
    assert len({tuple(o) for o in reference}) == len(prompts)  # varied outputs: the comparison means something
    single = LLMEngine.from_kwargs(model="tiny", dtype="float32", device="cpu", max_num_seqs=6)
    for policy, chunk_size in POLICIES:
        for e in (single, parallel):
            e.reconfigure_scheduler(policy=policy, chunk_size=chunk_size)
        expected = run_staggered(single, prompts, MAX_TOKENS)
        got = run_staggered(parallel, prompts, MAX_TOKENS)
        assert got == expected, policy
        assert [got[f"r{i}"] for i in range(len(prompts))] == reference, policy
        assert parallel.num_free_blocks == parallel.num_total_blocks
