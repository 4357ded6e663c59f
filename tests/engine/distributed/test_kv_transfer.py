"""A prompt's KV moved from the engine that prefilled it to another engine: the second takes it as cache hits,
computes only the prompt's last block, and gives the tokens one engine gives alone."""
import pytest
import torch

from stallfree.engine import SCHEDULERS, SamplingParams
from stallfree.engine.distributed.kv_transfer import PrefixKv, export_prefix, import_prefix
from tests.engine.test_prefix_cache import MAX_TOKENS, make_engine, run_one
from tests.helpers.engine import BLOCK, hf_greedy

PROMPT = [(7 * i + 3) % 1900 + 5 for i in range(5 * BLOCK + 3)]  # five whole blocks and three tokens


@pytest.fixture(scope="module")
def hf_tokens(tiny_path):
    return hf_greedy(tiny_path, [PROMPT], MAX_TOKENS)[0]


def prefilled(tiny_path, policy: str, prompt=PROMPT) -> PrefixKv:
    """The prompt prefilled alone on an engine of ``policy`` (its first token sampled there), its KV read out."""
    engine = make_engine(tiny_path, policy)
    engine.add_request(prompt, SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True), request_id="prefill")
    while engine.has_unfinished():
        engine.step()
    return export_prefix(engine.kv, engine.runner, prompt)


@pytest.mark.parametrize("policy", sorted(SCHEDULERS))
def test_a_moved_prefix_decodes_the_tokens_of_one_engine_and_hf(policy, tiny_path, hf_tokens):
    moved = prefilled(tiny_path, policy)
    assert moved.num_blocks == 5 and moved.token_ids == PROMPT[:5 * BLOCK]
    decode = make_engine(tiny_path, "sarathi")
    blocks = import_prefix(decode.kv, decode.runner, moved)
    assert len(blocks) == 5
    decode.add_request(PROMPT, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True),
                       request_id="decode")
    decode.step()  # admits it: its hits are held by the request now
    decode.kv.let_go(blocks)
    final = None
    while decode.has_unfinished():
        final = next((out for out in decode.step() if out.finished), final)
    assert final.token_ids == hf_tokens
    assert final.metrics.num_cached_tokens == 5 * BLOCK
    assert decode.batch_records[0].num_prefill_tokens == 3  # only the tokens past the last whole block
    assert not any(decode.kv.pool.ref_counts)  # every hold released exactly once


def test_a_full_cache_makes_the_transfer_wait(tiny_path):
    moved = prefilled(tiny_path, "sarathi")
    decode = make_engine(tiny_path, "sarathi", num_blocks=4)  # fewer blocks than the prefix
    assert import_prefix(decode.kv, decode.runner, moved) is None
    assert not any(decode.kv.pool.ref_counts) and not decode.kv.pool.cached


def test_blocks_cached_already_are_shared_not_written(tiny_path, hf_tokens):
    moved = prefilled(tiny_path, "sarathi")
    decode = make_engine(tiny_path, "sarathi")
    first = import_prefix(decode.kv, decode.runner, moved)
    decode.kv.let_go(first)
    garbage = PrefixKv(moved.token_ids, torch.full_like(moved.kv, float("nan")), BLOCK)
    assert import_prefix(decode.kv, decode.runner, garbage) == first  # nothing overwritten
    decode.kv.let_go(first)
    out = run_one(decode, PROMPT, "decode")
    assert out.metrics.num_cached_tokens == 5 * BLOCK and out.token_ids == hf_tokens


def test_kv_of_another_shape_is_refused(tiny_path):
    moved = prefilled(tiny_path, "sarathi")
    decode = make_engine(tiny_path, "sarathi", block_size=2 * BLOCK)
    with pytest.raises(ValueError, match="same model, dtype and block size"):
        import_prefix(decode.kv, decode.runner, moved)
    no_cache = make_engine(tiny_path, "sarathi", caching=False)
    with pytest.raises(ValueError, match="enable_prefix_caching"):
        export_prefix(no_cache.kv, no_cache.runner, PROMPT)
