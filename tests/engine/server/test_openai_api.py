"""OpenAI compatibility: the openai client and raw HTTP against LLM.generate, token-id prompts, stop strings."""
from __future__ import annotations

import openai

from tests.helpers.server import (
    PROMPT,
    greedy,
    metric,
    sse_chunks,
    wait_idle,
)


def test_openai_client_completions_match_llm_generate(server, llm):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    want, want_ids = greedy(llm, PROMPT, 24)
    extra = {"ignore_eos": True}

    resp = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=24, temperature=0, extra_body=extra)
    assert resp.choices[0].text == want and resp.choices[0].finish_reason == "length"
    assert resp.usage.completion_tokens == 24 and resp.model_extra["stallfree"]["finish_time"] is not None

    chunks = list(client.completions.create(model="tiny", prompt=PROMPT, max_tokens=24, temperature=0, stream=True,
                                            stream_options={"include_usage": True}, extra_body=extra))
    token_chunks = [c for c in chunks if c.choices]
    assert len(token_chunks) == 24  # one event per generated token
    assert "".join(c.choices[0].text for c in token_chunks) == want
    assert [c.choices[0].model_extra["token_ids"][0] for c in token_chunks] == want_ids
    assert chunks[-1].usage.completion_tokens == 24
    timings = chunks[-1].model_extra["stallfree"]
    assert len(timings["token_times"]) == 24 and timings["num_preemptions"] == 0
    assert timings["arrival_time"] <= timings["first_scheduled_time"] <= timings["first_token_time"] \
        <= timings["finish_time"]


def test_openai_client_chat_matches_llm_generate(server, llm, http):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
    prompt_ids = http.post("/tokenize", json={"messages": messages}).json()["tokens"]
    want, _ = greedy(llm, prompt_ids, 12)
    extra = {"ignore_eos": True}

    resp = client.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0,
                                          extra_body=extra)
    assert resp.choices[0].message.content == want and resp.choices[0].message.role == "assistant"
    assert resp.usage.prompt_tokens == len(prompt_ids)

    stream = client.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0,
                                            stream=True, extra_body=extra)
    chunks = list(stream)
    assert len(chunks) == 12 and chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content for c in chunks) == want
    assert chunks[-1].choices[0].finish_reason == "length" and "stallfree" in chunks[-1].model_extra


def test_token_id_prompts_and_multiple_prompts(http, llm):
    ids = http.post("/tokenize", json={"prompt": PROMPT}).json()["tokens"]
    want = [greedy(llm, PROMPT, 6)[0], greedy(llm, "another prompt", 6)[0]]
    params = {"max_tokens": 6, "temperature": 0, "ignore_eos": True}
    single = http.post("/v1/completions", json={"prompt": ids} | params).json()
    assert single["choices"][0]["text"] == want[0] and single["usage"]["prompt_tokens"] == len(ids)
    for prompts in ([PROMPT, "another prompt"], [ids, http.post("/tokenize", json={"prompt": "another prompt"})
                                                 .json()["tokens"]]):
        resp = http.post("/v1/completions", json={"prompt": prompts} | params).json()
        assert [c["index"] for c in resp["choices"]] == [0, 1]
        assert [c["text"] for c in resp["choices"]] == want
        assert all(c["stallfree"]["finish_time"] for c in resp["choices"]) and "stallfree" not in resp
    with http.stream("POST", "/v1/completions", json={"prompt": [PROMPT, "another prompt"], "stream": True}
                     | params) as r:
        chunks, done = sse_chunks(r.iter_lines())
    assert done and len(chunks) == 12
    assert ["".join(c["choices"][0]["text"] for c in chunks if c["choices"][0]["index"] == i) for i in (0, 1)] \
        == want


def test_stop_strings_cut_the_text_and_free_the_request(server, http, llm):
    full, _ = greedy(llm, PROMPT, 24)
    stop = full[len(full) // 2: len(full) // 2 + 3]
    want = full[:full.index(stop)]
    body = {"prompt": PROMPT, "max_tokens": 24, "temperature": 0, "ignore_eos": True, "stop": [stop, "\x00zz"]}
    resp = http.post("/v1/completions", json=body).json()
    assert resp["choices"][0]["text"] == want and resp["choices"][0]["finish_reason"] == "stop"
    with http.stream("POST", "/v1/completions", json=body | {"stream": True}) as r:
        chunks, done = sse_chunks(r.iter_lines())
    assert done and "".join(c["choices"][0]["text"] for c in chunks) == want
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert metric(wait_idle(server.url), "vllm:kv_cache_usage_perc") == 0


# -- load: concurrency, disconnects ----------------------------------------------------------------

