"""TP2 greedy tokens on CPU in fp32 equal to one process and to HF transformers."""
import pytest

from stallfree.engine import LLMEngine, SamplingParams
from tests.engine.distributed.conftest import MAX_TOKENS, check_tokens_equal, tp2_engine
from tests.helpers.engine import hf_greedy, make_prompts, run_staggered


@pytest.mark.slow
def test_tp2_tokens_equal_one_process_and_hf(tiny_path, prompts):
    engine = tp2_engine(max_num_seqs=6)
    try:
        check_tokens_equal(engine, tiny_path, prompts)
    finally:
        engine.shutdown()


@pytest.mark.slow
def test_tp2_qkv_bias_and_tied_embeddings_equal_hf(arch_paths, prompts):
    """Qwen2-style: the QKV bias is split with its heads; the tied embedding and LM head stay whole."""
    engine = tp2_engine(str(arch_paths["qwen2"]), scheduler="sarathi", chunk_size=64)
    try:
        got = run_staggered(engine, prompts, MAX_TOKENS)
    finally:
        engine.shutdown()
    assert [got[f"r{i}"] for i in range(len(prompts))] == hf_greedy(arch_paths["qwen2"], prompts, MAX_TOKENS)


# Before the module-scoped TP2 engine below: one process holds one default process group at a time.
@pytest.mark.slow
def test_tp2_small_equals_hf():
    """`small`: 12 heads, 4 KV heads, a 32,000-token vocabulary split in two."""
    from stallfree.engine.model.presets import resolve_model_path
    prompts = make_prompts(8, seed=0, vocab=32000)
    engine = tp2_engine("small", kv_memory_gib=0.25, scheduler="sarathi", chunk_size=64)
    try:
        got = run_staggered(engine, prompts, MAX_TOKENS)
    finally:
        engine.shutdown()
    assert [got[f"r{i}"] for i in range(len(prompts))] == hf_greedy(resolve_model_path("small"), prompts, MAX_TOKENS)


@pytest.fixture(scope="module")
def small_cache_engines():
    """One process and TP2, each with kv_memory_gib=0.01."""
    single = LLMEngine.from_kwargs(model="tiny", dtype="float32", device="cpu", kv_memory_gib=0.01)
    engine = tp2_engine(kv_memory_gib=0.01)
    yield single, engine
    engine.shutdown()


def test_kv_cache_holds_the_shard(small_cache_engines):
    """Per rank, half the KV heads: the same kv_memory_gib holds twice the blocks."""
    single, engine = small_cache_engines
    assert engine.num_total_blocks == 2 * single.num_total_blocks
    # [KV heads, blocks, block size, head dim]: 1 of tiny's 2 KV heads on this rank
    assert engine.runner.local.kv_caches[0][0].shape[0] == single.runner.kv_caches[0][0].shape[0] // 2 == 1


def test_logprobs_once_on_the_driver_equal_one_process(small_cache_engines, prompts):
    """Sample and prompt logprobs come from the gathered logits (the workers compute the same rows)."""
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=3, prompt_logprobs=2)
    outputs = []
    for engine in small_cache_engines:
        engine.add_request(prompts[2][:50], params, request_id="lp")
        while engine.has_unfinished():
            outputs += [o for o in engine.step() if o.finished]
    single, tp2 = outputs
    assert tp2.token_ids == single.token_ids
    for ours, theirs in ((tp2.logprobs, single.logprobs), (tp2.prompt_logprobs[1:], single.prompt_logprobs[1:])):
        assert len(ours) == len(theirs)
        for a, b in zip(ours, theirs, strict=True):
            assert a.logprob == pytest.approx(b.logprob, abs=1e-4)
            assert [t for t, _ in a.top] == [t for t, _ in b.top]
