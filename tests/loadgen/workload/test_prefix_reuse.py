"""The shared-prefix workload and the hit rate an unbounded prefix cache reaches on a workload's prompts."""
import pytest

from stallfree.loadgen.workload.prefix_reuse import ideal_hit_rate
from stallfree.loadgen.workload.request_specs import build_workload

SHARED = {"kind": "shared_prefix", "num_prefixes": 3, "prefix_len": 64, "suffix_len": 8, "output_len": 5}


def test_each_request_opens_with_one_of_the_prefixes_in_turn():
    specs = build_workload({"kind": "burst"}, SHARED, 12, 0, 1000)
    prefixes = {tuple(s.prompt_token_ids[:64]) for s in specs}
    assert len(prefixes) == 3
    assert sorted(sum(tuple(s.prompt_token_ids[:64]) == p for s in specs) for p in prefixes) == [4, 4, 4]
    assert all(len(s.prompt_token_ids) == 72 and s.max_tokens == 5 for s in specs)
    assert len({tuple(s.prompt_token_ids[64:]) for s in specs}) == 12  # suffixes of their own
    assert all(10 <= t < 1000 for s in specs for t in s.prompt_token_ids)
    assert [s.prompt_token_ids for s in build_workload({"kind": "burst"}, SHARED, 12, 0, 1000)] == \
        [s.prompt_token_ids for s in specs]
    assert build_workload({"kind": "burst"}, SHARED, 12, 1, 1000)[0].prompt_token_ids != specs[0].prompt_token_ids


@pytest.mark.parametrize(("change", "key"), [({"prefix_len": 0}, "lengths.prefix_len"),
                                             ({"num_prefixes": 1.5}, "lengths.num_prefixes"),
                                             ({"suffix_len": -1}, "lengths.suffix_len"),
                                             ({"prefix_length": 3}, "lengths.prefix_length")])
def test_bad_settings_name_their_key(change, key):
    with pytest.raises(ValueError, match=key):
        build_workload({"kind": "burst"}, SHARED | change, 4, 0, 1000)


def test_max_total_tokens_clips_each_prompt_keeping_its_prefix():
    specs = build_workload({"kind": "burst"}, SHARED, 6, 0, 1000, max_total_tokens=50)
    assert all(len(s.prompt_token_ids) + s.max_tokens == 50 for s in specs)
    assert len({tuple(s.prompt_token_ids) for s in specs}) == 3  # the suffixes are cut off: the prefixes remain


def test_ideal_hit_rate_counts_leading_blocks_seen_before_short_of_the_last_token():
    a = list(range(100, 133))  # 33 tokens: two full blocks of 16
    assert ideal_hit_rate([a, a], 16) == 32 / 66
    assert ideal_hit_rate([a[:32], a[:32]], 16) == 16 / 64  # the last token is always computed
    other_start = [0] + a[1:]
    assert ideal_hit_rate([a, other_start], 16) == 0  # a block counts only after the blocks before it
    assert ideal_hit_rate([a[:10], a[:10]], 16) == 0  # shorter than a block
    assert ideal_hit_rate([], 16) is None


def test_the_shared_prefix_workload_gives_its_repeats_prefixes():
    specs = build_workload({"kind": "burst"}, SHARED, 12, 0, 1000)
    rate = ideal_hit_rate([s.prompt_token_ids for s in specs], 16)
    assert rate == pytest.approx((12 - 3) * 64 / (12 * 72))
