"""stream_options.continuous_usage_stats, as vLLM implements it: usage in every token chunk, counting the
choice's tokens so far, so a client counts exactly what the final usage says (special tokens, which
stream as empty text, included)."""
from __future__ import annotations

from tests.server.conftest import PROMPT
from tests.server.helpers import sse_chunks


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
