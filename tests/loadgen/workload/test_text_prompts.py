"""Text workloads (loadgen.workload.text_prompts) on the sample files in tests/data/, counted with the tiny
preset's tokenizer."""
from __future__ import annotations

import pytest

from stallfree.engine import resolve_model_path
from stallfree.engine.config_checks import ConfigError
from stallfree.loadgen.workload.request_specs import build_workload
from stallfree.loadgen.workload.text_prompts import chat_token_ids, load_tokenizer
from tests.helpers.paths import DATA

POISSON = {"kind": "poisson", "qps": 2.0}


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(str(resolve_model_path("tiny")))


def _build(lengths: dict, n: int, tokenizer, max_total_tokens: int | None = 512, seed: int = 0):
    return build_workload(POISSON, lengths, n, seed, 1000, max_total_tokens, tokenizer=tokenizer)


def test_sharegpt_first_turn_prompt_and_reply_length(tokenizer):
    specs = _build({"kind": "sharegpt", "path": str(DATA / "sharegpt_sample.json"), "shuffle": False}, 3,
                   tokenizer)
    assert [s.prompt for s in specs] == ["What is the capital of France?", "Name three primary colors.",
                                         "Write a haiku about the sea."]  # the one-turn conversation is skipped
    assert specs[1].max_tokens == len(tokenizer.encode("Red, yellow and blue.", add_special_tokens=False))
    assert specs[0].prompt_token_ids == tokenizer.encode(specs[0].prompt)
    assert specs[0].messages is None


def test_sharegpt_shuffle_follows_the_seed_and_skips_requests_over_the_limit(tokenizer):
    lengths = {"kind": "sharegpt", "path": str(DATA / "sharegpt_sample.json")}
    orders = [[s.prompt for s in _build(lengths, 3, tokenizer, seed=seed)] for seed in (0, 0, 1, 2, 3)]
    assert orders[0] == orders[1] and len({tuple(o) for o in orders}) > 1
    longest = max(orders[0], key=lambda p: len(tokenizer.encode(p)))
    with pytest.raises(ConfigError, match="num_requests"):
        _build(lengths, 3, tokenizer, max_total_tokens=len(tokenizer.encode(longest)))


def test_jsonl_prompts_and_messages(tokenizer):
    specs = _build({"kind": "jsonl", "path": str(DATA / "requests_sample.jsonl")}, 3, tokenizer)
    assert [s.max_tokens for s in specs] == [12, 8, 5]
    assert specs[0].prompt.startswith("Summarize") and specs[0].messages is None
    assert specs[1].prompt is None and specs[1].messages[1]["content"] == "Why is the sky blue?"
    assert specs[1].prompt_token_ids == chat_token_ids(tokenizer, specs[1].messages)


def test_jsonl_bad_line_names_the_key(tmp_path, tokenizer):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "x"}\n')
    with pytest.raises(ConfigError, match="lengths.path must be lines with an integer max_tokens"):
        _build({"kind": "jsonl", "path": str(bad)}, 1, tokenizer)
    with pytest.raises(ConfigError, match="lengths.path must be an existing file"):
        _build({"kind": "jsonl", "path": str(tmp_path / "none.jsonl")}, 1, tokenizer)


def test_sonnet_prompts_near_the_target_length_with_a_shared_prefix(tokenizer):
    specs = _build({"kind": "sonnet", "input_len": 200, "prefix_len": 60, "output_len": 16}, 4, tokenizer)
    lengths = [len(s.prompt_token_ids) for s in specs]
    assert all(150 <= n <= 250 for n in lengths), lengths
    assert all(s.max_tokens == 16 for s in specs)
    prefix = "Pick as many lines as you can from these poem lines:\nFrom fairest creatures we desire increase,\n"
    assert all(s.prompt.startswith(prefix) for s in specs)
    assert len({s.prompt for s in specs}) == 4


def test_text_workload_needs_a_tokenizer():
    with pytest.raises(ConfigError, match="tokenizer"):
        build_workload(POISSON, {"kind": "sonnet"}, 2, 0, 1000)


def test_sonnet_prompts_over_the_limit_end_in_an_error_not_a_hang(tokenizer):
    with pytest.raises(ConfigError, match="num_requests"):
        _build({"kind": "sonnet", "input_len": 200, "prefix_len": 60, "output_len": 16}, 2, tokenizer,
               max_total_tokens=100)


def test_text_prompts_of_a_workload_of_lengths_count_exactly_and_are_stable(tokenizer):
    from stallfree.loadgen.workload.request_specs import with_text_prompts
    from stallfree.loadgen.workload.text_prompts import LengthTexts

    texts = LengthTexts(tokenizer)
    specs = build_workload(POISSON, {"kind": "uniform", "prompt_lo": 1, "prompt_hi": 2000, "output_lo": 1,
                                     "output_hi": 4}, 40, 0, 1000)
    texted = with_text_prompts(specs, texts)
    for spec, text in zip(specs, texted, strict=True):
        assert len(tokenizer.encode(text.prompt)) == len(text.prompt_token_ids) == len(spec.prompt_token_ids)
        assert text.max_tokens == spec.max_tokens and text.request_id == spec.request_id
    assert len({t.prompt for t in texted}) == len(texted)
    assert with_text_prompts(specs, texts) == texted  # the same spec always gets the same text
    assert with_text_prompts(texted, texts) == texted  # text is kept


def test_sharegpt_sessions_replay_the_real_turns(tokenizer):
    from stallfree.engine.records.request_spec import LAST_TURN

    specs = _build({"kind": "sharegpt_sessions", "path": str(DATA / "sharegpt_sample.json"), "shuffle": False,
                    "think_time_s": 1.0}, 4, tokenizer)
    assert [(s.session_id, s.turn) for s in specs] == [("session-00000", 0), ("session-00001", 0),
                                                       ("session-00001", 1), ("session-00002", 0)]
    second = specs[2]  # the whole history: the first question, its real answer, the next question
    assert second.messages == [{"role": "user", "content": "Name three primary colors."},
                               {"role": "assistant", "content": "Red, yellow and blue."},
                               {"role": "user", "content": "And secondary ones?"}]
    assert second.prompt_token_ids == chat_token_ids(tokenizer, second.messages)
    assert second.max_tokens == len(tokenizer.encode("Green, orange and purple.", add_special_tokens=False))
    assert second.think_time_s > 0 and specs[1].think_time_s == 0.0
    assert [s.session_end for s in specs] == [LAST_TURN, None, LAST_TURN, LAST_TURN]
    assert specs[1].send_offset_s == specs[2].send_offset_s < specs[3].send_offset_s


def test_sharegpt_sessions_from_jsonl_messages_and_their_limits(tokenizer, tmp_path):
    path = tmp_path / "chats.jsonl"
    path.write_text('{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}, '
                    '{"role": "assistant", "content": "Hello!"}]}\n'
                    '{"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}\n')
    specs = _build({"kind": "sharegpt_sessions", "path": str(path)}, 1, tokenizer)
    assert specs[0].messages[0] == {"role": "system", "content": "Be brief."}  # the skipped one does not alternate
    with pytest.raises(ConfigError, match="num_requests must be <= the 1 turns"):
        _build({"kind": "sharegpt_sessions", "path": str(path)}, 2, tokenizer)


@pytest.mark.parametrize("content, message", [
    ('{"messages": [{"role": "user", "content": "a"}]}\n{"nope": 1}\n', r"chats.jsonl line 2: not an object with"),
    ('{"messages": [{"role": "robot", "content": "a"}]}\n', r"chats.jsonl line 1: turn 0 is not"),
    ('{"messages": [\n', r"chats.jsonl line 1 is not JSON"),
])
def test_a_malformed_conversation_file_names_the_record(tokenizer, tmp_path, content, message):
    path = tmp_path / "chats.jsonl"
    path.write_text(content)
    with pytest.raises(ConfigError, match=f"lengths.path: .*{message}"):
        _build({"kind": "sharegpt_sessions", "path": str(path)}, 1, tokenizer)
