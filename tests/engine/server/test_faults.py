"""Bad input, API keys, metrics, batch records, a full queue, idle behaviour and engine faults."""
from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import openai
import pytest

from stallfree.engine import LLMEngine, SamplingParams
from stallfree.engine.request_limits import InvalidParam
from stallfree.engine.server import start_server
from tests.helpers.server import (
    ENGINE,
    PROMPT,
    async_client,
    metric,
    random_stream_bodies,
    sse_chunks,
    wait_idle,
)

# -- bad input -------------------------------------------------------------------------------------

OK = {"prompt": "hi", "max_tokens": 2}
BAD_REQUESTS = [
    # (path, body: dict | raw str, status, error code, param); field validation is a 400 as in vLLM (not
    # FastAPI's 422)
    ("/v1/completions", "{not json", 400, "invalid_json", None),
    ("/v1/completions", '{"prompt": ' + "[" * 100_000 + "]" * 100_000 + "}", 400, "invalid_json", None),
    ("/v1/completions", '{"prompt": "x", "max_tokens": 1' + "0" * 5000 + "}", 400, "invalid_json", None),
    ("/v1/completions", '{"prompt": "x", "temperature": NaN}', 400, "invalid_value", "temperature"),
    ("/v1/completions", "", 400, "missing_field", None),
    ("/v1/completions", "[1, 2]", 400, "invalid_type", None),
    ("/v1/completions", {}, 400, "missing_field", "prompt"),
    ("/v1/completions", {"prompt": 5}, 400, "invalid_type", "prompt"),
    ("/v1/completions", {"prompt": [1, "a"]}, 400, "invalid_type", "prompt"),
    ("/v1/completions", {"prompt": [[1], "a"]}, 400, "invalid_type", "prompt"),
    ("/v1/completions", {"prompt": [-1]}, 400, "invalid_type", "prompt"),
    ("/v1/completions", {"prompt": ""}, 400, "empty_prompt", "prompt"),
    ("/v1/completions", {"prompt": []}, 400, "empty_prompt", "prompt"),
    ("/v1/completions", {"prompt": ["ok", ""]}, 400, "empty_prompt", "prompt"),
    ("/v1/completions", {"prompt": [5, 99999]}, 400, "invalid_value", "prompt"),
    ("/v1/completions", OK | {"model": "gpt-4"}, 404, "model_not_found", "model"),
    ("/v1/completions", OK | {"max_tokens": 0}, 400, "invalid_value", "max_tokens"),
    ("/v1/completions", OK | {"max_tokens": -5}, 400, "invalid_value", "max_tokens"),
    ("/v1/completions", OK | {"max_tokens": "10"}, 400, "invalid_type", "max_tokens"),
    ("/v1/completions", OK | {"max_tokens": 2.5}, 400, "invalid_type", "max_tokens"),
    ("/v1/completions", OK | {"max_tokens": 10**12}, 400, "context_length_exceeded", "max_tokens"),
    ("/v1/completions", {"prompt": list(range(3, 2043)), "max_tokens": 10}, 400, "context_length_exceeded",
     "max_tokens"),
    ("/v1/completions", OK | {"temperature": -0.5}, 400, "invalid_value", "temperature"),
    ("/v1/completions", OK | {"temperature": 1e9}, 400, "invalid_value", "temperature"),
    ("/v1/completions", OK | {"top_p": 0}, 400, "invalid_value", "top_p"),
    ("/v1/completions", OK | {"top_p": 1.5}, 400, "invalid_value", "top_p"),
    ("/v1/completions", OK | {"top_k": -2}, 400, "invalid_value", "top_k"),
    ("/v1/completions", OK | {"seed": 2**70}, 400, "invalid_value", "seed"),
    ("/v1/completions", OK | {"stream": "yes"}, 400, "invalid_type", "stream"),
    ("/v1/completions", OK | {"stop": ""}, 400, "invalid_value", "stop"),
    ("/v1/completions", OK | {"stop": ["x"] * 50}, 400, "invalid_value", "stop"),
    ("/v1/completions", OK | {"stop": "x" * 5000}, 400, "invalid_value", "stop"),
    ("/v1/completions", OK | {"n": 3}, 400, "invalid_value", "n"),
    ("/v1/completions", OK | {"stream_options": {"include_usage": 1}}, 400, "invalid_type", "stream_options"),
    ("/v1/completions", {"prompt": "x" * 2_000_000}, 413, "request_too_large", None),
    ("/v1/chat/completions", {"messages": []}, 400, "invalid_value", "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "invalid_value",
     "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user"}]}, 400, "missing_field", "messages"),
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
        for method, path in [("GET", "/v1/models"), ("POST", "/v1/chat/completions"), ("POST", "/tokenize"),
                             ("GET", "/stallfree/batches")]:
            assert httpx.request(method, f"{url}{path}", headers=headers, trust_env=False).status_code == 401
    good = {"Authorization": "Bearer s3cret"}
    assert httpx.post(f"{url}/v1/completions", json=body, headers=good, trust_env=False).status_code == 200
    assert httpx.get(f"{url}/v1/models", headers=good, trust_env=False).status_code == 200
    assert httpx.post(f"{url}/tokenize", json={"prompt": "hi"}, headers=good, trust_env=False).status_code == 200
    assert httpx.get(f"{url}/stallfree/batches", headers=good, trust_env=False).status_code == 200
    # as in vLLM, /health and (unless metrics_require_api_key) /metrics are open; unknown paths are 404s
    assert httpx.get(f"{url}/health", trust_env=False).status_code == 200
    assert httpx.get(f"{url}/metrics", trust_env=False).status_code == 200
    assert httpx.get(f"{url}/nope", trust_env=False).status_code == 404
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="s3cret")
    assert client.completions.create(model="tiny", prompt="hi", max_tokens=2).usage.completion_tokens >= 1
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{url}/v1", api_key="nope").models.list()


def test_metrics_counters_match_requests(server, http):
    before = wait_idle(server.url)
    bodies = random_stream_bodies(6, seed=4, max_tokens=(3, 9))
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
    assert delta("vllm:iteration_tokens_total_sum") == delta("stallfree:iteration_prefill_tokens_total") \
        + delta("stallfree:iteration_decode_tokens_total")
    assert delta("vllm:iteration_tokens_total_count") == delta("stallfree:iterations_total") > 0
    for phase in ("prefill", "decode", "inference"):
        assert delta(f"vllm:request_{phase}_time_seconds_count") == 6
    assert delta("vllm:request_generation_tokens_sum") == sum(b["max_tokens"] for b in bodies)
    # HTTP series from prometheus-fastapi-instrumentator; the scrapes themselves are not counted
    requests = {"handler": "/v1/completions", "method": "POST"}
    assert delta("http_requests_total", **requests, status="2xx") == 6
    assert delta("http_requests_total", **requests, status="4xx") == 1
    assert delta("http_request_duration_seconds_count", **requests) == 7
    assert delta("http_requests_total", handler="/metrics") == 0
    for gauge in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        assert (gauge, (("model_name", "tiny"),)) in after


def test_batch_records_endpoint(server, http):
    wait_idle(server.url)
    since = time.time()
    bodies = random_stream_bodies(3, seed=7, max_tokens=(4, 6))
    for body in bodies:
        assert http.post("/v1/completions", json=body | {"stream": False}).status_code == 200
    batches = http.get("/stallfree/batches", params={"since": since}).json()["batches"]
    assert sum(b["num_prefill_tokens"] for b in batches) == sum(len(b["prompt"]) for b in bodies)
    assert sum(b["num_decode_tokens"] for b in batches) == sum(b["max_tokens"] - 1 for b in bodies)
    assert all(b["start_time"] >= since and b["end_time"] >= b["start_time"] for b in batches)
    assert http.get("/stallfree/batches", params={"since": time.time() + 60}).json() == {"batches": [], "next_since": None}


def test_full_queue_gets_429_with_retry_after(small_queue_server):
    body = {"prompt": "hello", "max_tokens": 64, "ignore_eos": True}

    async def run():
        async with async_client(small_queue_server.url) as client:
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


def test_the_engine_is_built_on_the_thread_that_steps_it(monkeypatch):
    # a second OpenMP team (from loading on the serving thread) slowed every step by a third or more
    threads = {}
    real_from_config = LLMEngine.from_config

    def recording_from_config(config):
        threads["build"] = threading.current_thread()
        engine = real_from_config(config)
        real_step = engine.step

        def step():
            threads.setdefault("step", threading.current_thread())
            return real_step()

        engine.step = step
        return engine

    monkeypatch.setattr(LLMEngine, "from_config", staticmethod(recording_from_config))
    with start_server(ENGINE) as handle:
        with httpx.Client(base_url=handle.url, timeout=30, trust_env=False) as client:
            assert client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2}).status_code == 200
    assert threads["build"] is threads["step"] and threads["step"].name == "stallfree-engine"


def test_a_failed_engine_build_is_raised_to_the_caller():
    with pytest.raises(ValueError, match="unknown engine option 'bogus'"):
        start_server({**ENGINE, "bogus": 1})



@pytest.mark.parametrize("prompt", [[5, 99999], list(range(3, 3 + 2048))])
def test_the_edge_and_the_engine_reject_a_prompt_through_the_same_check(http, llm, prompt):
    """The server checks a prompt against the model before it submits it, and LLMEngine.add_request checks it
    again through the same functions (engine/request_limits.py): one message, one param, one code."""
    r = http.post("/v1/completions", json={"prompt": prompt})
    with pytest.raises(InvalidParam) as rejected:
        llm.engine.add_request(prompt, SamplingParams())
    assert r.status_code == 400
    assert r.json()["error"] == {"message": str(rejected.value), "type": "invalid_request_error",
                                 "param": rejected.value.param, "code": rejected.value.code}
