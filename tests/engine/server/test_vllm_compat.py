"""Behaviour taken from vLLM's OpenAI server: validation errors are 400s, X-Request-Id is the request id,
the API key guards /v1 (and /tokenize, /stallfree), HTTP metrics from prometheus-fastapi-instrumentator,
and vLLM's per-iteration and per-phase histograms."""
from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from stallfree.engine.server import ServerConfig, start_server
from tests.helpers.server import (
    ENGINE,
    PROMPT,
    async_client,
    greedy,
    is_openai_error,
    metric,
    scrape,
    wait_idle,
)

# -- validation errors: 400 with the OpenAI error body on every route ------------------------------

CHAT = {"messages": [{"role": "user", "content": "hi"}]}
INVALID = [
    # (method, path, JSON body or query parameters, param)
    ("POST", "/v1/completions", {"prompt": "x", "max_tokens": "10"}, "max_tokens"),
    ("POST", "/v1/completions", {"max_tokens": 3}, "prompt"),
    ("POST", "/v1/completions", {"prompt": "x", "top_p": 7}, "top_p"),
    ("POST", "/v1/chat/completions", CHAT | {"temperature": "hot"}, "temperature"),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, "messages"),
    ("POST", "/v1/chat/completions", CHAT | {"max_completion_tokens": 0}, "max_completion_tokens"),
    ("POST", "/tokenize", {"prompt": "hi", "add_special_tokens": "yes"}, "add_special_tokens"),
    ("POST", "/tokenize", {"prompt": 3}, "prompt"),
    ("GET", "/stallfree/batches", {"since": "yesterday"}, "since"),
    ("GET", "/stallfree/batches", {"limit": -1}, "limit"),
]


@pytest.mark.parametrize("method, path, data, param", INVALID)
def test_validation_errors_are_400_naming_the_field(http, method, path, data, param):
    r = http.request(method, path, **({"json": data} if method == "POST" else {"params": data}))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert is_openai_error(r.json()) and error["type"] == "invalid_request_error" and error["param"] == param
    assert error["code"] in ("invalid_type", "invalid_value", "missing_field")


def test_openai_client_sees_a_bad_request_error(server):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt="hi", max_tokens=2, extra_body={"top_k": "many"})
    assert info.value.status_code == 400 and info.value.body["param"] == "top_k"


# -- X-Request-Id -----------------------------------------------------------------------------------


def test_x_request_id_is_the_request_id(http):
    body = {"prompt": "hi", "max_tokens": 2}
    r = http.post("/v1/completions", json=body, headers={"X-Request-Id": "client-7"})
    assert r.headers["x-request-id"] == "client-7" and r.json()["id"] == "cmpl-client-7"
    r = http.post("/v1/chat/completions", json=CHAT | {"max_tokens": 2}, headers={"X-Request-Id": "client-8"})
    assert r.headers["x-request-id"] == "client-8" and r.json()["id"] == "chatcmpl-client-8"
    with http.stream("POST", "/v1/completions", json=body | {"stream": True}, headers={"X-Request-Id": "s-1"}) as r:
        ids = {json.loads(line[6:])["id"] for line in r.iter_lines() if line.startswith("data: {")}
    assert r.headers["x-request-id"] == "s-1" and ids == {"cmpl-s-1"}
    generated = http.post("/v1/completions", json=body)  # none sent: a new one
    assert len(generated.headers["x-request-id"]) == 32
    assert generated.json()["id"] == f"cmpl-{generated.headers['x-request-id']}"
    assert http.post("/v1/completions", json=body, headers={"X-Request-Id": ""}).headers["x-request-id"]
    # errors carry it too
    bad = http.post("/v1/completions", json={"prompt": ""}, headers={"X-Request-Id": "bad-1"})
    assert bad.status_code == 400 and bad.headers["x-request-id"] == "bad-1"


def test_same_x_request_id_in_flight_twice_does_not_mix(server, llm):
    """Two streams (and a two-prompt request) with one X-Request-Id at once: each gets its own greedy
    text, and cutting one stream off aborts only that one."""
    prompts = [PROMPT, "another prompt", "a third one"]
    want = [greedy(llm, p, 40)[0] for p in prompts]
    params = {"max_tokens": 40, "temperature": 0, "ignore_eos": True}
    headers = {"X-Request-Id": "same"}

    async def stream(client: httpx.AsyncClient, prompt: str, cut_after: int | None = None) -> tuple[str, set]:
        text, ids, n = "", set(), 0
        long = {"max_tokens": 1500} if cut_after else {}  # still running when the client leaves
        async with client.stream("POST", "/v1/completions", headers=headers,
                                 json={"prompt": prompt, "stream": True} | params | long) as r:
            assert r.status_code == 200 and r.headers["x-request-id"] == "same"
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    chunk = json.loads(line[6:])
                    text, n = text + chunk["choices"][0]["text"], n + 1
                    ids.add(chunk["id"])
                    if n == cut_after:
                        break
        return text, ids

    async def run():
        async with async_client(server.url) as client:
            return await asyncio.gather(
                stream(client, prompts[0]), stream(client, prompts[1]), stream(client, prompts[2], cut_after=3),
                client.post("/v1/completions", headers=headers, json={"prompt": prompts[:2]} | params))

    before = scrape(server.url)
    first, second, cut, both = asyncio.run(run())
    assert first == (want[0], {"cmpl-same"}) and second == (want[1], {"cmpl-same"})
    assert want[2].startswith(cut[0]) and len(cut[0]) < len(want[2])
    assert [c["text"] for c in both.json()["choices"]] == want[:2] and both.json()["id"] == "cmpl-same"
    after = wait_idle(server.url)
    assert metric(after, "vllm:request_success_total", finished_reason="length") \
        - metric(before, "vllm:request_success_total", finished_reason="length") == 4
    assert metric(after, "vllm:request_success_total", finished_reason="abort") \
        - metric(before, "vllm:request_success_total", finished_reason="abort") == 1


# -- API key: /v1, /tokenize, /stallfree; /metrics only when asked -----------------------------------


@pytest.fixture(scope="module")
def metrics_keyed_server():
    with start_server(ENGINE, ServerConfig(port=0, api_key="k2", metrics_require_api_key=True)) as handle:
        yield handle


def test_metrics_require_api_key_switch(metrics_keyed_server, keyed_server):
    url = metrics_keyed_server.url
    assert httpx.get(f"{url}/metrics", trust_env=False).status_code == 401
    samples = scrape(url, headers={"Authorization": "Bearer k2"})
    assert ("vllm:num_requests_running", (("model_name", "tiny"),)) in samples
    assert httpx.get(f"{url}/health", trust_env=False).status_code == 200
    assert httpx.get(f"{keyed_server.url}/metrics", trust_env=False).status_code == 200  # default: open
    with pytest.raises(ValueError, match="metrics_require_api_key must be true or false"):
        ServerConfig(metrics_require_api_key="yes").validate()


def test_rejected_requests_are_counted(keyed_server):
    url = keyed_server.url
    before = scrape(url)
    for _ in range(3):
        assert httpx.post(f"{url}/v1/completions", json={"prompt": "hi"}, trust_env=False).status_code == 401
    after = scrape(url)
    labels = {"handler": "/v1/completions", "method": "POST", "status": "4xx"}
    assert metric(after, "http_requests_total", **labels) - metric(before, "http_requests_total", **labels) == 3


# -- HTTP and engine metrics -------------------------------------------------------------------------


def test_http_metrics_per_handler_method_and_status(server, http):
    before = scrape(server.url)
    assert http.post("/v1/chat/completions", json=CHAT | {"max_tokens": 2}).status_code == 200
    assert http.post("/tokenize", json={"prompt": "hi"}).status_code == 200
    assert http.get("/v1/models").status_code == 200
    assert http.get("/no/such/path").status_code == 404
    assert http.get("/health").status_code == 200
    after = scrape(server.url)

    def delta(name, **labels):
        return metric(after, name, **labels) - metric(before, name, **labels)

    for handler, method in [("/v1/chat/completions", "POST"), ("/tokenize", "POST"), ("/v1/models", "GET")]:
        assert delta("http_requests_total", handler=handler, method=method, status="2xx") == 1
        assert delta("http_request_duration_seconds_count", handler=handler, method=method) == 1
    assert delta("http_requests_total", handler="none", method="GET", status="4xx") == 1  # unknown paths
    assert delta("http_requests_total", handler="/health") == 0  # excluded, as in vLLM
    assert delta("http_request_duration_highr_seconds_count") == 4


def test_vllm_iteration_and_phase_histograms(server, http):
    before = wait_idle(server.url)
    body = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    for _ in range(3):
        assert http.post("/v1/completions", json=body).status_code == 200
    after = wait_idle(server.url)

    def delta(name, **labels):
        return metric(after, name, **labels) - metric(before, name, **labels)

    buckets = {float(dict(labels)["le"]) for name, labels in after if name == "vllm:iteration_tokens_total_bucket"}
    assert buckets == {1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, float("inf")}
    prompt_len = len(http.post("/tokenize", json={"prompt": PROMPT}).json()["tokens"])
    assert delta("vllm:iteration_tokens_total_sum") == 3 * (prompt_len + 11)  # prefill + decode tokens
    assert delta("vllm:iteration_tokens_total_count") >= 12
    for phase in ("prefill", "decode", "inference"):
        assert delta(f"vllm:request_{phase}_time_seconds_count") == 3
    assert delta("vllm:request_prefill_time_seconds_sum") + delta("vllm:request_decode_time_seconds_sum") \
        == pytest.approx(delta("vllm:request_inference_time_seconds_sum"))
    assert delta("vllm:request_decode_time_seconds_sum") > 0
    assert delta("vllm:request_prompt_tokens_sum") == 3 * prompt_len
    assert delta("vllm:request_generation_tokens_sum") == 36
