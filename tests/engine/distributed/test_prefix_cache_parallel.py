"""Prefix caching across processes: TP2 and PP2 ranks read shared blocks through the block tables they are
sent, and their greedy tokens equal one process without caching."""
import pytest

from stallfree.engine import LLMEngine
from tests.helpers.engine import BLOCK, run_staggered, shared_prefix_prompts

MAX_TOKENS = 6


def tiny(**kwargs) -> LLMEngine:
    return LLMEngine.from_kwargs(model="tiny", dtype="float32", device="cpu", scheduler="sarathi", chunk_size=32,
                                 block_size=BLOCK, max_num_seqs=4, **kwargs)


@pytest.mark.slow
@pytest.mark.parametrize("sizes", [{"tensor_parallel_size": 2}, {"pipeline_parallel_size": 2}], ids=["tp2", "pp2"])
def test_parallel_ranks_with_caching_equal_one_process_without(sizes):
    prompts = shared_prefix_prompts() * 2
    expected = run_staggered(tiny(), prompts, MAX_TOKENS, gap=3)
    parallel = tiny(enable_prefix_caching=True, **sizes)
    try:
        assert run_staggered(parallel, prompts, MAX_TOKENS, gap=3) == expected
        assert parallel.kv.num_hit_tokens >= 16 * BLOCK
        assert parallel.num_free_blocks == parallel.num_total_blocks
    finally:
        parallel.shutdown()
