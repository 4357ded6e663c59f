"""Chat-completions load (target.endpoint=chat): the open-loop client and Locust stream
/v1/chat/completions from the in-process server on the tiny preset, timing every token."""
from __future__ import annotations

import json

import numpy as np
import pytest

from stallfree.engine import resolve_model_path
from stallfree.engine.server import start_server
from stallfree.loadgen.locust.target import run_locust
from stallfree.loadgen.openai_client.completions import request, tokens_in_chunk
from stallfree.loadgen.openai_client.openloop import run_open_loop_sync
from stallfree.loadgen.workload.request_specs import RequestSpec, build_workload
from stallfree.loadgen.workload.text_prompts import load_tokenizer
from tests.helpers.paths import DATA


@pytest.fixture(scope="module")
def tiny_url():
    with start_server({"model": "tiny", "dtype": "float32"}) as server:
        yield server.url


@pytest.fixture(scope="module")
def chat_specs():
    tokenizer = load_tokenizer(str(resolve_model_path("tiny")))
    return build_workload({"kind": "poisson", "qps": 8.0}, {"kind": "jsonl", "path": str(DATA / "requests_sample.jsonl")},
                          3, 0, 1000, tokenizer=tokenizer)


def test_chat_body_sends_messages_or_the_prompt_as_a_user_message():
    spec = RequestSpec("r", 0.0, [1, 2], 4, prompt="hi")
    path, body = request(spec, "m", "chat")
    body = json.loads(body)
    assert path == "/v1/chat/completions" and body["model"] == "m"
    assert body["messages"] == [{"role": "user", "content": "hi"}] and body["stream"] and body["max_tokens"] == 4
    messages = [{"role": "user", "content": "yo"}]
    assert json.loads(request(RequestSpec("r", 0.0, [1], 4, messages=messages), "", "chat")[1])["messages"] == messages
    assert json.loads(request(spec, "", "completions")[1])["prompt"] == "hi"
    # without text (warm-ups, the decode probe) a chat target sends a completion of the token ids
    path, body = request(RequestSpec("r", 0.0, [1, 2], 4), "", "chat")
    assert path == "/v1/completions" and json.loads(body)["prompt"] == [1, 2]


def test_chat_chunks_count_content_not_the_role():
    assert tokens_in_chunk({"choices": [{"delta": {"role": "assistant", "content": ""}}]}) == 0
    assert tokens_in_chunk({"choices": [{"delta": {"content": "a"}, "finish_reason": None}]}) == 1
    assert tokens_in_chunk({"choices": [{"delta": {}, "finish_reason": "length"}]}) == 0


def _check(records, specs) -> None:
    for record, spec in zip(records, specs, strict=True):
        assert record.status == "ok", record.error
        assert record.output_tokens == len(record.token_times) == spec.max_tokens
        # the server's count (its usage): a text prompt sent as a chat message gets the chat template's tokens too
        assert record.prompt_tokens >= len(spec.prompt_token_ids)
        assert np.all(np.diff(record.token_times) >= 0) and record.send_time <= record.token_times[0]
        assert len(record.server_token_times) == spec.max_tokens


def test_open_loop_chat_times_every_token(tiny_url, chat_specs):
    records = run_open_loop_sync(tiny_url, chat_specs, model="tiny", timeout_s=60, endpoint="chat")
    _check(records, chat_specs)


@pytest.mark.slow
def test_locust_chat_times_every_token(tiny_url, chat_specs, tmp_path):
    records = run_locust(tiny_url, chat_specs, tmp_path, model="tiny", timeout_s=60, endpoint="chat")
    _check(records, chat_specs)
