"""Prefix caching over HTTP as vLLM shows it: cached tokens in the usage, vLLM's counters on /metrics, the
cache's size and evictions, and POST /reset_prefix_cache behind the API key."""
from __future__ import annotations

import httpx
import pytest

from stallfree.engine.server import ServerConfig, start_server
from stallfree.loadgen.targets.server_vocabulary import read_page
from tests.helpers.server import ENGINE

PROMPT_IDS = list(range(10, 10 + 80))  # five 16-token blocks


@pytest.fixture(scope="module")
def caching_server():
    with start_server({**ENGINE, "enable_prefix_caching": True}, ServerConfig(port=0, api_key="k")) as handle:
        yield handle


@pytest.fixture
def client(caching_server):
    with httpx.Client(base_url=caching_server.url, timeout=60, trust_env=False,
                      headers={"Authorization": "Bearer k"}) as http:
        yield http


def complete(http, prompt, stream=False) -> dict:
    body = {"prompt": prompt, "max_tokens": 3, "temperature": 0, "ignore_eos": True}
    if not stream:
        return http.post("/v1/completions", json=body).json()["usage"]
    with http.stream("POST", "/v1/completions", json=body | {"stream": True,
                                                              "stream_options": {"include_usage": True}}) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: {")]
    return httpx.Response(200, content=lines[-1][len("data: "):]).json()["usage"]


def counters(http) -> dict[str, float]:
    page = read_page(http.get("/metrics").text)
    return {s.metric: s.value for s in page.samples}


def test_cached_tokens_in_usage_and_metrics_then_reset(client):
    assert client.post("/reset_prefix_cache").status_code == 200
    before = counters(client)
    assert complete(client, PROMPT_IDS)["prompt_tokens_details"] == {"cached_tokens": 0}
    usage = complete(client, PROMPT_IDS + [7, 8], stream=True)
    assert usage["prompt_tokens"] == 82 and usage["prompt_tokens_details"] == {"cached_tokens": 80}
    after = counters(client)
    assert after["prefix_cache_queries_total"] - before["prefix_cache_queries_total"] == 80 + 82
    assert after["prefix_cache_hits_total"] - before["prefix_cache_hits_total"] == 80
    page = client.get("/metrics").text
    assert "stallfree:prefix_cache_blocks" in page and "stallfree:prefix_cache_evictions_total" in page
    reset = client.post("/reset_prefix_cache")
    assert reset.json()["status"] == "ok" and reset.json()["forgotten_blocks"] >= 5
    assert complete(client, PROMPT_IDS)["prompt_tokens_details"] == {"cached_tokens": 0}


def test_reset_needs_the_api_key(caching_server):
    r = httpx.post(f"{caching_server.url}/reset_prefix_cache", trust_env=False)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


def test_without_prefix_caching_nothing_is_cached_and_reset_forgets_nothing(http):
    assert complete(http, PROMPT_IDS)["prompt_tokens_details"] == {"cached_tokens": 0}
    assert complete(http, PROMPT_IDS)["prompt_tokens_details"] == {"cached_tokens": 0}
    assert http.post("/reset_prefix_cache").json() == {"status": "ok", "forgotten_blocks": 0}
