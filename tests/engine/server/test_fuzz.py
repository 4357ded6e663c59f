"""Fuzzing the OpenAI endpoints with hypothesis: JSON bodies of random shapes (near-valid ones too),
strings with lone surrogates, and valid bodies with every field's out-of-range values
(tests/helpers/hostile.py: integers beyond int64, NaN and infinities, negatives, huge lists and strings).
No response may be a 5xx, every error has the OpenAI error body, every stream ends with [DONE], and the
server still serves afterwards."""
from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.hostile import HUGE, hostile_requests
from tests.helpers.server import is_openai_error

FUZZ = settings(max_examples=150, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

# Some library in the process sets flush-to-zero, so hypothesis cannot draw subnormal floats here.
# Text with lone surrogates (and other odd code points) mixed in.
texts = st.text(st.characters(codec=None, categories=None), max_size=12) | \
    st.text(st.sampled_from(["a", " ", "\ud800", "\udfff", "\udbff", "\udc00", "é", "\x00", "😀"]), max_size=6)
# Integers are small (a valid max_tokens stays quick) or out of every range.
ints = st.integers(-3, 8) | st.sampled_from([2**31, 2**63, 2**64, -(2**63) - 1, 10**30, HUGE, -HUGE])
leaves = st.none() | st.booleans() | ints | st.floats(allow_subnormal=False) | texts  # NaN, inf: JSON NaN, Infinity
json_values = st.recursive(leaves, lambda children: st.lists(children, max_size=4)
                           | st.dictionaries(texts, children, max_size=4), max_leaves=12)
token_ids = st.lists(st.integers(-2, 2100), max_size=6)
prompts = texts | token_ids | st.lists(texts | token_ids, max_size=3) | json_values
messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "bot"]) | texts,
                                           "content": texts | st.lists(st.fixed_dictionaries(
                                               {"type": st.just("text"), "text": texts}), max_size=2)}),
                    max_size=3) | json_values
valid_sampling = {"temperature": st.floats(0, 2, allow_subnormal=False),
                  "top_p": st.floats(0.01, 1), "top_k": st.integers(-1, 50),
                  "seed": st.integers(0, 2**32), "stop": st.lists(texts, max_size=2), "stream": st.booleans(),
                  "ignore_eos": st.booleans(), "model": st.just("tiny"),
                  "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
                  "stop_token_ids": st.lists(st.integers(0, 2**63 - 1), max_size=3), "n": st.just(1),
                  "min_p": st.just(0), "presence_penalty": st.just(0.0), "frequency_penalty": st.just(0),
                  "repetition_penalty": st.just(1), "logit_bias": st.just({})}
random_sampling = {key: json_values for key in valid_sampling}


def bodies(required: dict[str, st.SearchStrategy]) -> st.SearchStrategy:
    """Near-valid bodies (only the ``required`` fields random), bodies with every field random, and
    random JSON values."""
    near_valid = st.fixed_dictionaries({**required, "max_tokens": st.integers(1, 8)}, optional=valid_sampling)
    random_fields = st.fixed_dictionaries({}, optional={**required, "max_tokens": ints | json_values,
                                                        **random_sampling})
    return near_valid | random_fields | json_values


completion_bodies = bodies({"prompt": prompts}) | hostile_requests.filter(lambda pb: pb[0] == "/v1/completions").map(
    lambda pb: pb[1])
chat_bodies = bodies({"messages": messages}) | hostile_requests.filter(lambda pb: pb[0] != "/v1/completions").map(
    lambda pb: pb[1])
tokenize_bodies = st.fixed_dictionaries({}, optional={"prompt": prompts, "messages": messages,
                                                      "add_special_tokens": st.booleans() | json_values})


@pytest.fixture(scope="module")
def fuzz_client(server):
    with httpx.Client(base_url=server.url, timeout=30, trust_env=False) as client:
        yield client
        # the server still serves after all of it
        assert client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2}).status_code == 200
        assert client.get("/health").status_code == 200


def post(client: httpx.Client, path: str, body: object, raw_utf8: bool) -> None:
    """POST ``body`` as JSON: escaped (``\\ud800``) or as raw UTF-8 bytes (a surrogate as ED A0 80)."""
    content = json.dumps(body, ensure_ascii=not raw_utf8).encode("utf-8", "surrogatepass")
    with client.stream("POST", path, content=content, headers={"Content-Type": "application/json"}) as r:
        data = r.read().decode("utf-8")
    assert r.status_code < 500 and r.status_code != 422, data  # field errors are 400s, as in vLLM
    if r.status_code >= 400:
        assert is_openai_error(json.loads(data)), data
    elif r.headers["content-type"].startswith("text/event-stream"):
        assert data.rstrip().endswith("data: [DONE]") and '"error"' not in data, data


@FUZZ
@given(body=completion_bodies, raw_utf8=st.booleans())
def test_fuzz_completions(fuzz_client, body, raw_utf8):
    post(fuzz_client, "/v1/completions", body, raw_utf8)


@FUZZ
@given(body=chat_bodies, raw_utf8=st.booleans())
def test_fuzz_chat(fuzz_client, body, raw_utf8):
    post(fuzz_client, "/v1/chat/completions", body, raw_utf8)


@settings(FUZZ, max_examples=100)
@given(body=tokenize_bodies, raw_utf8=st.booleans())
def test_fuzz_tokenize(fuzz_client, body, raw_utf8):
    post(fuzz_client, "/tokenize", body, raw_utf8)
