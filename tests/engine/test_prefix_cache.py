"""Automatic prefix caching in the engine: the same greedy tokens as without it and as HF transformers, cached
prefixes not computed again, references released exactly once."""
import pytest

from stallfree.engine import SCHEDULERS, LLMEngine, SamplingParams
from stallfree.engine.prefix_cache import PrefixCachingKVCacheManager
from tests.helpers.engine import BLOCK, hf_greedy, run_staggered, shared_prefix_prompts

MAX_TOKENS = 6


@pytest.fixture(scope="module")
def prompts():
    return shared_prefix_prompts()


@pytest.fixture(scope="module")
def hf_reference(tiny_path, prompts):
    return hf_greedy(tiny_path, prompts, MAX_TOKENS)


def make_engine(tiny_path, policy, caching=True, **kwargs):
    knobs = dict(model=str(tiny_path), scheduler=policy, chunk_size=32, dtype="float32", max_num_seqs=4,
                 block_size=BLOCK, max_model_len=256, max_num_batched_tokens=256, enable_prefix_caching=caching)
    return LLMEngine.from_kwargs(**(knobs | kwargs))


def assert_all_released(engine):
    assert engine.num_free_blocks == engine.num_total_blocks
    assert not any(engine.kv.pool.ref_counts) and not engine.kv.block_tables


@pytest.mark.parametrize("policy", sorted(SCHEDULERS))
def test_greedy_tokens_equal_hf_and_caching_off(policy, tiny_path, prompts, hf_reference):
    engine = make_engine(tiny_path, policy)
    assert isinstance(engine.kv, PrefixCachingKVCacheManager)
    outputs = run_staggered(engine, prompts, MAX_TOKENS, gap=3)
    assert [outputs[f"r{i}"] for i in range(len(prompts))] == hf_reference
    assert engine.kv.num_hit_tokens >= 8 * BLOCK  # the repeated prefixes were taken from the cache
    computed = sum(r.num_prefill_tokens for r in engine.batch_records)
    off = make_engine(tiny_path, policy, caching=False)
    assert run_staggered(off, prompts, MAX_TOKENS, gap=3) == outputs
    assert computed == sum(r.num_prefill_tokens for r in off.batch_records) - engine.kv.num_hit_tokens
    records = engine.batch_records
    assert sum(r.num_cached_tokens for r in records) == engine.kv.num_hit_tokens
    assert sum(r.prefix_cache_queried_tokens for r in records) == engine.kv.num_query_tokens
    assert records[-1].num_kv_blocks_cached == engine.kv.num_cached_free_blocks > 0
    assert not any(r.num_cached_tokens or r.num_kv_blocks_cached for r in off.batch_records)
    assert_all_released(engine)


def run_one(engine, prompt, request_id, **params):
    engine.add_request(prompt, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, **params),
                       request_id=request_id)
    final = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
    return final[request_id]


def test_a_cached_prompt_computes_only_its_last_token(tiny_path, prompts):
    engine = make_engine(tiny_path, "sarathi")
    prompt = prompts[2]  # five whole blocks
    first = run_one(engine, prompt, "first")
    records = len(engine.batch_records)
    again = run_one(engine, prompt, "again")
    assert again.token_ids == first.token_ids
    assert again.metrics.num_cached_tokens == len(prompt) - BLOCK  # the last block is computed again
    assert engine.batch_records[records].num_prefill_tokens == BLOCK
    assert first.metrics.num_cached_tokens == 0


def test_a_prompt_shorter_than_a_block_is_never_cached(tiny_path):
    engine = make_engine(tiny_path, "sarathi")
    for request_id in ("a", "b"):
        out = run_one(engine, [5, 6, 7], request_id)
        assert out.metrics.num_cached_tokens == 0
    assert engine.kv.num_hit_tokens == 0


def test_a_block_shared_by_many_running_requests(tiny_path, prompts):
    engine = make_engine(tiny_path, "sarathi", max_num_seqs=8)
    run_one(engine, prompts[0], "warm")
    for i in range(5):
        engine.add_request(prompts[0][:5 * BLOCK] + [100 + i] * 3,
                           SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True),
                           request_id=f"s{i}")
    engine.step()
    shared = engine.kv.block_tables["s0"][:5]
    assert all(engine.kv.block_tables[f"s{i}"][:5] == shared for i in range(5))
    assert [engine.kv.pool.ref_counts[b] for b in shared] == [5] * 5
    while engine.has_unfinished():
        engine.step()
    assert_all_released(engine)


def test_abort_releases_references_once_and_forgets_its_own_blocks(tiny_path, prompts):
    engine = make_engine(tiny_path, "sarathi", chunk_size=16)
    run_one(engine, prompts[0], "warm")
    cached_before = engine.kv.num_cached_free_blocks
    engine.add_request(prompts[0][:5 * BLOCK] + list(range(30, 70)), SamplingParams(max_tokens=50),
                       request_id="aborted")
    engine.step()
    engine.step()  # its hit blocks shared, some of its own computed and offered to the cache
    table = list(engine.kv.block_tables["aborted"])
    engine.abort("aborted")
    assert_all_released(engine)
    assert engine.kv.num_cached_free_blocks == cached_before  # what it computed is not kept
    assert all(engine.kv.pool.keys[b] is not None for b in table[:5])
    engine.abort("aborted")  # a second abort finds nothing to release
    assert_all_released(engine)


def test_eviction_and_preemption_keep_tokens_right(tiny_path, prompts, hf_reference):
    """A cache of 24 blocks: requests of up to 18 blocks evict cached blocks and preempt each other."""
    engine = make_engine(tiny_path, "sarathi", num_blocks=24, watermark=0.0)
    outputs = run_staggered(engine, prompts * 2, 24, gap=1)
    assert [outputs[f"r{i}"][:MAX_TOKENS] for i in range(2 * len(prompts))] == hf_reference * 2
    assert engine.kv.num_evictions > 0
    assert sum(r.num_preemptions for r in engine.batch_records) > 0
    assert run_staggered(make_engine(tiny_path, "sarathi", caching=False), prompts * 2, 24, gap=1) == outputs
    assert_all_released(engine)


def test_prompt_logprobs_are_computed_for_every_prompt_token(tiny_path, prompts):
    on, off = make_engine(tiny_path, "sarathi"), make_engine(tiny_path, "sarathi", caching=False)
    run_one(on, prompts[2], "warm")
    got = run_one(on, prompts[0], "scored", prompt_logprobs=1)
    want = run_one(off, prompts[0], "scored", prompt_logprobs=1)
    assert got.metrics.num_cached_tokens == 0
    assert len(got.prompt_logprobs) == len(prompts[0])
    assert [p and p.token_id for p in got.prompt_logprobs] == [p and p.token_id for p in want.prompt_logprobs]


def test_reset_forgets_cached_prefixes(tiny_path, prompts):
    engine = make_engine(tiny_path, "sarathi")
    run_one(engine, prompts[2], "first")
    assert engine.reset_prefix_cache() == 5
    assert run_one(engine, prompts[2], "again").metrics.num_cached_tokens == 0
    assert make_engine(tiny_path, "sarathi", caching=False).reset_prefix_cache() == 0
