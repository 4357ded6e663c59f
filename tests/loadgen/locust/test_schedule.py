"""loadgen/locust/schedule.py: a Locust process's requests, grouped by session (plain Python, no Locust)."""
from __future__ import annotations

import dataclasses
import itertools
import json
from argparse import Namespace

from stallfree.engine.records.request_spec import LAST_TURN, REQUEST_LIMIT, RequestSpec
from stallfree.loadgen.locust.schedule import first_requests, generated_groups, process_groups


def options(**changes) -> Namespace:
    base = dict(workload="chat", prompt_len=0, max_tokens=0, qps=2.0, seed=0, num_requests=0, step_qps="",
                step_seconds=30.0, vocab_size=2048, specs_file="")
    return Namespace(**{**base, **changes})


def assert_sessions(groups: list[list[RequestSpec]]) -> None:
    """Each group one whole session: its turns in order under one id no other group has, each prompt holding
    the one before it."""
    ids = [group[0].session_id for group in groups]
    assert None not in ids and len(set(ids)) == len(ids)
    for group in groups:
        assert [spec.turn for spec in group] == list(range(len(group)))
        assert {spec.session_id for spec in group} == {group[0].session_id}
        for before, after in itertools.pairwise(group):
            assert after.prompt_token_ids[:len(before.prompt_token_ids)] == before.prompt_token_ids


def test_generated_sessions_stay_whole_across_blocks():
    groups = list(itertools.islice(generated_groups(options(), 0, 1), 200))  # several blocks of 256 requests
    assert_sessions(groups)
    assert all(group[-1].session_end == LAST_TURN for group in groups)  # no session cut at a block's end
    starts = [group[0].send_offset_s for group in groups]
    assert starts == sorted(starts) and starts[0] > 0
    request_ids = [spec.request_id for group in groups for spec in group]
    assert len(set(request_ids)) == len(request_ids)


def test_requests_without_sessions_are_groups_of_one():
    groups = list(itertools.islice(generated_groups(options(workload="fixed"), 1, 2), 300))
    assert {len(group) for group in groups} == {1} and groups[0][0].request_id.startswith("p1-")


def test_a_request_count_cuts_the_last_session_short():
    whole = list(itertools.islice(generated_groups(options(), 0, 1), 2))  # chat sessions have 2-6 turns
    groups = list(first_requests(generated_groups(options(), 0, 1), len(whole[0]) + 1))
    assert groups[0] == whole[0] and groups[1] == [dataclasses.replace(whole[1][0], session_end=REQUEST_LIMIT)]
    exact = list(first_requests(generated_groups(options(), 0, 1), len(whole[0]) + len(whole[1])))
    assert exact == whole


def test_a_specs_file_is_shared_among_workers_by_session(tmp_path):
    groups = list(first_requests(generated_groups(options(), 0, 1), 60))
    specs_file = tmp_path / "specs.jsonl"
    specs_file.write_text("".join(json.dumps(dataclasses.asdict(spec)) + "\n" for group in groups for spec in group))
    parts = [process_groups(options(specs_file=str(specs_file)), index, 3) for index in range(3)]
    taken = [list(part) for part, _ in parts]
    assert [count for _, count in parts] == [sum(len(group) for group in part) for part in taken]
    assert sum(count for _, count in parts) == 60
    for index, part in enumerate(taken):
        assert part == groups[index::3]
