"""stream_options.continuous_usage_stats, as vLLM implements it: usage in every token chunk, counting the
choice's tokens so far, so a client counts exactly what the final usage says (special tokens, which
stream as empty text, included)."""
from __future__ import annotations

from tests.helpers.server import PROMPT, sse_chunks


def stream(http, **body) -> list[dict]:
    with http.stream("POST", "/v1/completions", json={"prompt": PROMPT, "stream": True, "max_tokens": 12,
                                                       "temperature": 0, "ignore_eos": True} | body) as r:
        chunks, done = sse_chunks(r.iter_lines())
    assert done
    return chunks


def test_continuous_usage_counts_every_token_and_ends_at_the_final_usage(http):
    chunks = stream(http, prompt=[PROMPT, "another prompt"],
                    stream_options={"include_usage": True, "continuous_usage_stats": True})
    *tokens, final = chunks
    assert len(tokens) == 24 and final["choices"] == [] and final["usage"]["completion_tokens"] == 24
    prompts = [len(http.post("/tokenize", json={"prompt": p}).json()["tokens"]) for p in (PROMPT, "another prompt")]
    for index in (0, 1):
        usages = [c["usage"] for c in tokens if c["choices"][0]["index"] == index]
        assert [u["completion_tokens"] for u in usages] == list(range(1, 13))
        assert all(u["prompt_tokens"] == prompts[index] and u["total_tokens"] == prompts[index] + u["completion_tokens"]
                   for u in usages)


def test_usage_only_in_the_final_chunk_without_continuous_stats(http):
    *tokens, final = stream(http, stream_options={"include_usage": True})
    assert all("usage" not in c for c in tokens) and final["usage"]["completion_tokens"] == 12
    assert all("usage" not in c for c in stream(http, stream_options={"continuous_usage_stats": True}))


def test_unsupported_parameters_are_a_400_naming_them(http):
    base = {"prompt": PROMPT, "max_tokens": 2}
    for body, name in [({"best_of": 2}, "best_of"), ({"suffix": "x"}, "suffix"),
                       ({"logit_bias": {"1": 5}}, "logit_bias"), ({"presence_penalty": 0.5}, "presence_penalty")]:
        r = http.post("/v1/completions", json=base | body)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == name and error["code"] == "unsupported_parameter" and name in error["message"]
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    # the values that ask for nothing stay accepted, as clients send them by default
    ok = http.post("/v1/completions", json=base | {"logprobs": None, "echo": False, "best_of": 1,
                                                   "presence_penalty": 0, "frequency_penalty": 0.0})
    assert ok.status_code == 200, ok.text
    assert http.post("/v1/chat/completions", json=chat | {"logprobs": False}).status_code == 200
