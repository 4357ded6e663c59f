"""Hash-id traces (the Mooncake format): equal ids become equal token blocks, timestamps become arrivals, and a
malformed file is one error naming its line."""
import json

import pytest

from stallfree.loadgen.workload.prefix_reuse import ideal_hit_rate
from stallfree.loadgen.workload.request_specs import build_workload

ROWS = [{"timestamp": 0, "input_length": 40, "output_length": 8, "hash_ids": [1, 2, 3]},
        {"timestamp": 500, "input_length": 30, "output_length": 4, "hash_ids": [1, 2]},
        {"timestamp": 1500, "input_length": 52, "output_length": 16, "hash_ids": [1, 2, 3, 4]},
        {"timestamp": 1500, "input_length": 20, "output_length": 2, "hash_ids": [9]}]


def write(tmp_path, rows, name="trace.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return str(path)


def lengths(path, **settings):
    return {"kind": "hash_trace", "name": path, "block_size": 16} | settings


def test_equal_hash_ids_are_equal_blocks_and_lengths_follow_the_rows(tmp_path):
    specs = build_workload({"kind": "burst"}, lengths(write(tmp_path, ROWS)), 4, 0, 1000)
    prompts = [s.prompt_token_ids for s in specs]
    assert [len(p) for p in prompts] == [40, 30, 52, 20] and [s.max_tokens for s in specs] == [8, 4, 16, 2]
    assert prompts[1] == prompts[0][:30]  # blocks 1, 2 then cut inside block 2
    assert prompts[2][:40] == prompts[0] and prompts[3][:16] != prompts[0][:16]
    assert len(set(prompts[3][16:]) & set(prompts[0])) < 4  # past its one block: tokens of its own
    assert ideal_hit_rate(prompts, 16) == pytest.approx((16 + 32) / 142)


def test_scale_shrinks_blocks_and_lengths(tmp_path):
    specs = build_workload({"kind": "burst"}, lengths(write(tmp_path, ROWS), scale=4), 3, 0, 1000)
    assert [len(s.prompt_token_ids) for s in specs] == [10, 8, 13] and [s.max_tokens for s in specs] == [2, 1, 4]
    assert specs[1].prompt_token_ids == specs[0].prompt_token_ids[:8]


def test_the_trace_arrival_reads_its_timestamps(tmp_path):
    path = write(tmp_path, ROWS)
    specs = build_workload({"kind": "trace", "name": path, "time_scale": 2.0}, lengths(path), 4, 0, 1000)
    assert [s.send_offset_s for s in specs] == [0.0, 1.0, 3.0, 3.0]


def test_max_total_tokens_clips_prompts_keeping_their_start(tmp_path):
    full = build_workload({"kind": "burst"}, lengths(write(tmp_path, ROWS)), 4, 0, 1000)
    clipped = build_workload({"kind": "burst"}, lengths(write(tmp_path, ROWS)), 4, 0, 1000, max_total_tokens=24)
    for a, b in zip(full, clipped, strict=True):
        assert len(b.prompt_token_ids) + b.max_tokens <= 24 and a.prompt_token_ids[:len(b.prompt_token_ids)] == \
            b.prompt_token_ids


def test_the_bundled_mooncake_trace_replays():
    specs = build_workload({"kind": "trace", "name": "mooncake_conversation"},
                           {"kind": "hash_trace", "name": "mooncake_conversation", "scale": 16}, 200, 0, 32000,
                           max_total_tokens=2048)
    assert len(specs) == 200 and all(len(s.prompt_token_ids) + s.max_tokens <= 2048 for s in specs)
    assert 0.05 < ideal_hit_rate([s.prompt_token_ids for s in specs], 32) < 0.5
    assert specs[-1].send_offset_s > 30


@pytest.mark.parametrize(("line", "error"), [
    ("{not json", r":2: not JSON"),
    (json.dumps({"timestamp": 5, "input_length": 3}), r":2: no output_length, hash_ids"),
    (json.dumps({"timestamp": 5, "input_length": 0, "output_length": 1, "hash_ids": []}),
     r":2: input_length must be an integer >= 1, got 0"),
    (json.dumps({"timestamp": 5, "input_length": 3, "output_length": 1, "hash_ids": ["a"]}),
     r":2: hash_ids must be a list of integers"),
    (json.dumps({"timestamp": -1, "input_length": 3, "output_length": 1, "hash_ids": [1]}),
     r":2: timestamp must be a number >= 0"),
])
def test_a_malformed_row_is_an_error_naming_its_line(tmp_path, line, error):
    path = write(tmp_path, [ROWS[1], line], name=f"bad{abs(hash(line))}.jsonl")
    with pytest.raises(ValueError, match=error):
        build_workload({"kind": "burst"}, lengths(path), 2, 0, 1000)


def test_timestamps_that_go_back_and_bad_settings_name_their_key(tmp_path):
    path = write(tmp_path, [ROWS[1], ROWS[0]], name="backwards.jsonl")
    with pytest.raises(ValueError, match=r"backwards.jsonl:2: timestamp 0 goes back from 500"):
        build_workload({"kind": "burst"}, lengths(path), 2, 0, 1000)
    good = write(tmp_path, ROWS)
    with pytest.raises(ValueError, match="lengths.scale"):
        build_workload({"kind": "burst"}, lengths(good, scale=32), 2, 0, 1000)
    with pytest.raises(ValueError, match="num_requests must be <= the 4 rows"):
        build_workload({"kind": "burst"}, lengths(good), 5, 0, 1000)
    with pytest.raises(ValueError, match="lengths.name: trace name 'nope'"):
        build_workload({"kind": "burst"}, {"kind": "hash_trace", "name": "nope"}, 1, 0, 1000)
