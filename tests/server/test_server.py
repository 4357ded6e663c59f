"""stallfree-serve: OpenAI compatibility, streaming, disconnects, bad input, auth, metrics, 429, faults.

One in-process server per configuration (module-scoped fixtures), tiny preset in float32.
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine import LLM, SamplingParams
from engine.server import ServerConfig, main, start_server
from engine.server.text import IncrementalDetokenizer, StopStringFilter

ENGINE = {"model": "tiny", "dtype": "float32", "scheduler": "sarathi", "chunk_size": 512, "num_blocks": 2048}
PROMPT = "the quick brown fox jumps over the lazy dog"
# GPT-2 byte-level alphabet: the token of each single byte
_PRINTABLE = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
_OTHERS = [b for b in range(256) if b not in _PRINTABLE]
BYTE_CHARS = {b: chr(b) for b in _PRINTABLE} | {b: chr(256 + i) for i, b in enumerate(_OTHERS)}


@pytest.fixture(scope="module")
def server():
    with start_server(ENGINE) as handle:
        yield handle


@pytest.fixture(scope="module")
def keyed_server():
    with start_server(ENGINE, ServerConfig(port=0, api_key="s3cret")) as handle:
        yield handle


@pytest.fixture(scope="module")
def small_queue_server():
    with start_server({**ENGINE, "max_num_seqs": 2}, ServerConfig(port=0, max_waiting=2)) as handle:
        yield handle


@pytest.fixture(scope="module")
def llm():
    return LLM(**ENGINE)


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.url, timeout=60, trust_env=False) as client:
        yield client


def greedy(llm: LLM, prompt: str | list[int], max_tokens: int) -> tuple[str, list[int]]:
    out = llm.generate(prompt, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))[0]
    return out.text, out.token_ids


def scrape(url: str, headers: dict | None = None) -> dict[tuple[str, tuple], float]:
    """/metrics as {(sample name, sorted labels): value} (also checks that it parses)."""
    text = httpx.get(f"{url}/metrics", headers=headers, trust_env=False).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def metric(samples: dict, name: str, **labels) -> float:
    return sum(v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= set(ls))


def wait_idle(url: str, timeout: float = 20.0) -> dict:
    """Metrics once nothing runs or waits and no KV block is in use (aborts are asynchronous)."""
    deadline = time.monotonic() + timeout
    while True:
        m = scrape(url)
        busy = sum(metric(m, n) for n in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                                          "vllm:kv_cache_usage_perc"))
        if busy == 0 or time.monotonic() > deadline:
            return m
        time.sleep(0.05)


def sse_chunks(lines) -> tuple[list[dict], bool]:
    chunks, done = [], False
    for line in lines:
        if line.startswith("data: "):
            if line == "data: [DONE]":
                done = True
            else:
                chunks.append(json.loads(line[6:]))
    return chunks, done


# -- OpenAI client ---------------------------------------------------------------------------------


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


async def _stream(client: httpx.AsyncClient, body: dict, cut_after: int | None = None) -> dict:
    """Stream one completion; with cut_after, disconnect after that many token events."""
    tokens, final, done = 0, None, False
    async with client.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                chunk = json.loads(line[6:])
                tokens += len(chunk["choices"])
                final = chunk if chunk.get("usage") else final
                if cut_after is not None and tokens >= cut_after:
                    break  # leaving the block closes the connection mid-stream
    return {"tokens": tokens, "done": done, "final": final}


def _bodies(n: int, seed: int, max_tokens: tuple[int, int]) -> list[dict]:
    rng = random.Random(seed)
    return [{"prompt": [rng.randrange(3, 2048) for _ in range(rng.randint(4, 60))],
             "max_tokens": rng.randint(*max_tokens), "temperature": 0.8, "seed": i, "ignore_eos": True,
             "stream": True, "stream_options": {"include_usage": True}} for i in range(n)]


def _client(url: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, timeout=120, trust_env=False,
                             limits=httpx.Limits(max_connections=None, max_keepalive_connections=None))


def test_100_concurrent_streams(server):
    bodies = _bodies(100, seed=1, max_tokens=(4, 32))

    async def run():
        async with _client(server.url) as client:
            return await asyncio.gather(*(_stream(client, b) for b in bodies))

    results = asyncio.run(run())
    for body, res in zip(bodies, results, strict=True):
        assert res["done"] and res["tokens"] == body["max_tokens"]
        assert res["final"]["usage"]["completion_tokens"] == body["max_tokens"]
        assert len(res["final"]["stallfree"]["token_times"]) == body["max_tokens"]
    m = wait_idle(server.url)
    assert metric(m, "vllm:kv_cache_usage_perc") == 0 and metric(m, "vllm:num_requests_running") == 0


def test_disconnected_streams_are_aborted(server):
    before = scrape(server.url)
    cut = _bodies(20, seed=2, max_tokens=(1500, 1900))
    kept = _bodies(10, seed=3, max_tokens=(20, 40))

    async def run():
        async with _client(server.url) as client:
            return await asyncio.gather(*(_stream(client, b, cut_after=3) for b in cut),
                                        *(_stream(client, b) for b in kept))

    results = asyncio.run(run())
    assert all(not r["done"] and r["tokens"] == 3 for r in results[:20])
    assert all(r["done"] and r["tokens"] == b["max_tokens"] for r, b in zip(results[20:], kept, strict=True))
    after = wait_idle(server.url)
    aborted = metric(after, "vllm:request_success_total", finished_reason="abort") \
        - metric(before, "vllm:request_success_total", finished_reason="abort")
    assert aborted == 20
    assert metric(after, "vllm:kv_cache_usage_perc") == 0 and metric(after, "vllm:num_requests_running") == 0
    # the aborted requests stopped long before max_tokens
    generated = metric(after, "vllm:generation_tokens_total") - metric(before, "vllm:generation_tokens_total")
    assert generated < sum(b["max_tokens"] for b in kept) + 20 * 200


def test_non_streaming_disconnect_aborts(server):
    before = scrape(server.url)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/v1/completions", json={"prompt": PROMPT, "max_tokens": 2000, "ignore_eos": True},
                   timeout=httpx.Timeout(30, read=0.3), trust_env=False)
    after = wait_idle(server.url)
    assert metric(after, "vllm:request_success_total", finished_reason="abort") \
        - metric(before, "vllm:request_success_total", finished_reason="abort") == 1
    assert metric(after, "vllm:kv_cache_usage_perc") == 0


# -- bad input -------------------------------------------------------------------------------------

OK = {"prompt": "hi", "max_tokens": 2}
BAD_REQUESTS = [
    # (path, body: dict | raw str, status, error code, param)
    ("/v1/completions", "{not json", 400, "invalid_json", None),
    ("/v1/completions", '{"prompt": ' + "[" * 100_000 + "]" * 100_000 + "}", 400, "invalid_json", None),
    ("/v1/completions", '{"prompt": "x", "max_tokens": 1' + "0" * 5000 + "}", 400, "invalid_json", None),
    ("/v1/completions", '{"prompt": "x", "temperature": NaN}', 422, "invalid_value", "temperature"),
    ("/v1/completions", "", 422, "missing_field", None),
    ("/v1/completions", "[1, 2]", 422, "invalid_type", None),
    ("/v1/completions", {}, 422, "missing_field", "prompt"),
    ("/v1/completions", {"prompt": 5}, 422, "invalid_type", "prompt"),
    ("/v1/completions", {"prompt": [1, "a"]}, 422, "invalid_type", "prompt"),
    ("/v1/completions", {"prompt": [[1], "a"]}, 422, "invalid_type", "prompt"),
    ("/v1/completions", {"prompt": [-1]}, 422, "invalid_type", "prompt"),
    ("/v1/completions", {"prompt": ""}, 400, "empty_prompt", "prompt"),
    ("/v1/completions", {"prompt": []}, 400, "empty_prompt", "prompt"),
    ("/v1/completions", {"prompt": ["ok", ""]}, 400, "empty_prompt", "prompt"),
    ("/v1/completions", {"prompt": [5, 99999]}, 400, "invalid_value", None),
    ("/v1/completions", OK | {"model": "gpt-4"}, 404, "model_not_found", "model"),
    ("/v1/completions", OK | {"max_tokens": 0}, 422, "invalid_value", "max_tokens"),
    ("/v1/completions", OK | {"max_tokens": -5}, 422, "invalid_value", "max_tokens"),
    ("/v1/completions", OK | {"max_tokens": "10"}, 422, "invalid_type", "max_tokens"),
    ("/v1/completions", OK | {"max_tokens": 2.5}, 422, "invalid_type", "max_tokens"),
    ("/v1/completions", OK | {"max_tokens": 10**12}, 400, "context_length_exceeded", "max_tokens"),
    ("/v1/completions", {"prompt": list(range(3, 2043)), "max_tokens": 10}, 400, "context_length_exceeded",
     "max_tokens"),
    ("/v1/completions", OK | {"temperature": -0.5}, 422, "invalid_value", "temperature"),
    ("/v1/completions", OK | {"temperature": 1e9}, 422, "invalid_value", "temperature"),
    ("/v1/completions", OK | {"top_p": 0}, 422, "invalid_value", "top_p"),
    ("/v1/completions", OK | {"top_p": 1.5}, 422, "invalid_value", "top_p"),
    ("/v1/completions", OK | {"top_k": -2}, 422, "invalid_value", "top_k"),
    ("/v1/completions", OK | {"seed": 2**70}, 422, "invalid_value", "seed"),
    ("/v1/completions", OK | {"stream": "yes"}, 422, "invalid_type", "stream"),
    ("/v1/completions", OK | {"stop": ""}, 422, "invalid_value", "stop"),
    ("/v1/completions", OK | {"stop": ["x"] * 50}, 422, "invalid_value", "stop"),
    ("/v1/completions", OK | {"stop": "x" * 5000}, 422, "invalid_value", "stop"),
    ("/v1/completions", OK | {"n": 3}, 422, "invalid_value", "n"),
    ("/v1/completions", OK | {"stream_options": {"include_usage": 1}}, 422, "invalid_type", "stream_options"),
    ("/v1/completions", {"prompt": "x" * 2_000_000}, 413, "request_too_large", None),
    ("/v1/chat/completions", {"messages": []}, 422, "invalid_value", "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}, 422, "invalid_value",
     "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user"}]}, 422, "missing_field", "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5000}, 400,
     "context_length_exceeded", "max_tokens"),
    ("/tokenize", {}, 400, None, "prompt"),
    ("/v1/nope", {}, 404, "not_found", None),
]


def test_bad_requests_get_openai_errors(http):
    assert len(BAD_REQUESTS) >= 25
    for path, body, status, code, param in BAD_REQUESTS:
        content = body if isinstance(body, str) else json.dumps(body)
        r = http.post(path, content=content, headers={"content-type": "application/json"})
        assert r.status_code == status, (path, body if len(content) < 200 else content[:50], r.text)
        error = r.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"]
        assert (error["code"], error["param"]) == (code, param), (body if len(content) < 200 else "big", error)
        assert r.headers["x-request-id"]
    r = http.get("/v1/completions")
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"
    form = http.post("/v1/completions", content=b"prompt=hi", headers={"content-type": "text/plain"})
    assert form.status_code == 400 and form.json()["error"]["code"] == "invalid_json"
    assert http.post("/v1/completions", content=json.dumps(OK).encode()).status_code == 200  # no Content-Type
    chunked = http.post("/v1/completions", content=iter([b'{"prompt": "', b"y" * 2_000_000, b'"}']))
    assert chunked.status_code == 413 and chunked.json()["error"]["code"] == "request_too_large"
    r = http.post("/v1/completions", json=OK | {"temperature": 0})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
    assert http.get("/health").status_code == 200


# -- auth, metrics, 429 ----------------------------------------------------------------------------


def test_api_key(keyed_server):
    url = keyed_server.url
    body = {"prompt": "hi", "max_tokens": 2}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
        r = httpx.post(f"{url}/v1/completions", json=body, headers=headers, trust_env=False)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(f"{url}/metrics", headers=headers, trust_env=False).status_code == 401
    good = {"Authorization": "Bearer s3cret"}
    assert httpx.post(f"{url}/v1/completions", json=body, headers=good, trust_env=False).status_code == 200
    assert httpx.get(f"{url}/v1/models", headers=good, trust_env=False).status_code == 200
    assert httpx.get(f"{url}/health", trust_env=False).status_code == 200
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="s3cret")
    assert client.completions.create(model="tiny", prompt="hi", max_tokens=2).usage.completion_tokens >= 1
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{url}/v1", api_key="nope").models.list()


def test_metrics_counters_match_requests(server, http):
    before = wait_idle(server.url)
    bodies = _bodies(6, seed=4, max_tokens=(3, 9))
    for body in bodies[:3]:
        assert http.post("/v1/completions", json=body | {"stream": False}).status_code == 200
    for body in bodies[3:]:
        with http.stream("POST", "/v1/completions", json=body) as r:
            assert sse_chunks(r.iter_lines())[1]
    assert http.post("/v1/completions", json={"prompt": ""}).status_code == 400
    after = wait_idle(server.url)

    def delta(name, **labels):
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert delta("vllm:request_success_total", finished_reason="length") == 6
    assert delta("vllm:prompt_tokens_total") == sum(len(b["prompt"]) for b in bodies)
    assert delta("vllm:generation_tokens_total") == sum(b["max_tokens"] for b in bodies)
    assert delta("vllm:time_to_first_token_seconds_count") == 6
    assert delta("vllm:e2e_request_latency_seconds_count") == 6
    assert delta("vllm:inter_token_latency_seconds_count") == sum(b["max_tokens"] - 1 for b in bodies)
    assert delta("stallfree:iteration_prefill_tokens_total") == sum(len(b["prompt"]) for b in bodies)
    assert delta("stallfree:http_requests_total", path="/v1/completions", status_code="200") == 6
    assert delta("stallfree:http_requests_total", path="/v1/completions", status_code="400") == 1
    for gauge in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        assert (gauge, (("model_name", "tiny"),)) in after


def test_batch_records_endpoint(server, http):
    wait_idle(server.url)
    since = time.time()
    bodies = _bodies(3, seed=7, max_tokens=(4, 6))
    for body in bodies:
        assert http.post("/v1/completions", json=body | {"stream": False}).status_code == 200
    batches = http.get("/stallfree/batches", params={"since": since}).json()["batches"]
    assert sum(b["num_prefill_tokens"] for b in batches) == sum(len(b["prompt"]) for b in bodies)
    assert sum(b["num_decode_tokens"] for b in batches) == sum(b["max_tokens"] - 1 for b in bodies)
    assert all(b["start_time"] >= since and b["end_time"] >= b["start_time"] for b in batches)
    assert http.get("/stallfree/batches", params={"since": time.time() + 60}).json() == {"batches": []}


def test_full_queue_gets_429_with_retry_after(small_queue_server):
    body = {"prompt": "hello", "max_tokens": 64, "ignore_eos": True}

    async def run():
        async with _client(small_queue_server.url) as client:
            return await asyncio.gather(*(client.post("/v1/completions", json=body) for _ in range(24)))

    responses = asyncio.run(run())
    rejected = [r for r in responses if r.status_code == 429]
    served = [r for r in responses if r.status_code == 200]
    assert rejected and served and len(rejected) + len(served) == 24
    assert all(r.headers["retry-after"] == "1" and r.json()["error"]["code"] == "queue_full" for r in rejected)
    assert all(r.json()["usage"]["completion_tokens"] == 64 for r in served)


def test_idle_server_does_not_spin(server):
    wait_idle(server.url)
    start = time.process_time()
    time.sleep(1.0)
    assert time.process_time() - start < 0.1  # engine thread and event loop both asleep


# -- faults ----------------------------------------------------------------------------------------


def test_engine_step_exception_fails_requests_and_thread_survives(server, http):
    engine = server.state.engine_loop.engine
    real_step = engine.step

    def failing_step():
        engine.step = real_step  # fail once
        raise RuntimeError("injected")

    engine.step = failing_step
    r = http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 4})
    assert r.status_code == 500 and r.json()["error"]["code"] == "engine_error"
    engine.step = failing_step
    with http.stream("POST", "/v1/completions", json={"prompt": PROMPT, "max_tokens": 4, "stream": True}) as r:
        chunks, done = sse_chunks(r.iter_lines())
    assert done and chunks[-1]["error"]["code"] == "engine_error"
    assert http.get("/health").status_code == 200
    assert http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 4}).status_code == 200
    m = wait_idle(server.url)
    assert metric(m, "stallfree:engine_step_errors_total") == 2 and metric(m, "vllm:kv_cache_usage_perc") == 0


def test_dead_engine_thread_gives_503():
    with start_server(ENGINE) as handle:
        engine = handle.state.engine_loop.engine

        def broken() -> float:
            raise RuntimeError("boom")

        engine.kv_usage = broken  # raised outside engine.step: the thread dies
        with httpx.Client(base_url=handle.url, timeout=10, trust_env=False) as client:
            r = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
            assert r.status_code == 503
            deadline = time.monotonic() + 10
            while (health := client.get("/health")).status_code == 200 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert health.status_code == 503 and "boom" in health.json()["error"]["message"]
            start = time.monotonic()
            r = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
            assert r.status_code == 503 and time.monotonic() - start < 1


# -- text pieces -----------------------------------------------------------------------------------


def test_incremental_detokenizer_holds_partial_utf8(llm):
    tok = llm.engine.tokenizer
    byte_ids = tok.convert_tokens_to_ids([BYTE_CHARS[b] for b in "naïve café — ok 😀 done".encode()])
    detok = IncrementalDetokenizer(tok, tok.encode("say:"))
    pieces = [detok.push(i) for i in byte_ids]
    assert "".join(pieces) + detok.flush() == tok.decode(byte_ids)
    assert all("\ufffd" not in p for p in pieces)
    # a lone first byte of a multi-byte character shows up only at the end, as U+FFFD
    lone = tok.convert_tokens_to_ids(BYTE_CHARS[0xF0])
    detok = IncrementalDetokenizer(tok, [])
    assert detok.push(lone) == "" and detok.flush() == "\ufffd"


def test_stop_string_filter_holds_back_possible_prefixes():
    f = StopStringFilter(["STOP", "end"])
    assert f.feed("hello ST") == ("hello ", False)
    assert f.feed("ART e") == ("START ", False)
    assert f.feed("nd more") == ("", True)
    assert f.text == "hello START "
    g = StopStringFilter([])
    assert g.feed("abc") == ("abc", False) and g.flush() == ""


# -- command line ----------------------------------------------------------------------------------


@pytest.mark.parametrize("args, message", [
    (["scheduler=nope"], "Could not find 'scheduler/nope'"),
    (["port=-1"], "port must be in [0, 65535]"),
    (["foo=1"], "Could not override 'foo'"),
    (["model=path"], "model.path"),
    (["max_waiting=0"], "max_waiting"),
    (["--api-key"], "--api-key needs a value"),
])
def test_cli_bad_values_exit_2_with_one_line(args, message, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_cli_ready_line_and_sigterm():
    exe = Path(sys.executable).with_name("stallfree-serve")
    proc = subprocess.Popen([str(exe), "port=0", "model.dtype=float32", "model.kv_memory_gib=0.01",
                             "--api-key", "k"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=os.environ | {"PYTHONUNBUFFERED": "1"})
    try:
        line = proc.stdout.readline()
        assert line.startswith("stallfree-serve ready: http://127.0.0.1:"), line + proc.stderr.read()
        url = line.split()[2]
        assert httpx.get(f"{url}/health", trust_env=False).status_code == 200
        assert httpx.get(f"{url}/v1/models", trust_env=False).status_code == 401
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert "stopped" in proc.stdout.read() and "Traceback" not in proc.stderr.read()
    finally:
        proc.kill()
