"""Streaming under load, and client disconnects that abort their requests."""
from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.helpers.server import (
    PROMPT,
    async_client,
    metric,
    random_stream_bodies,
    scrape,
    stream_completion,
    wait_idle,
)


def test_100_concurrent_streams(server):
    bodies = random_stream_bodies(100, seed=1, max_tokens=(4, 32))

    async def run():
        async with async_client(server.url) as client:
            return await asyncio.gather(*(stream_completion(client, b) for b in bodies))

    results = asyncio.run(run())
    for body, res in zip(bodies, results, strict=True):
        assert res["done"] and res["tokens"] == body["max_tokens"]
        assert res["final"]["usage"]["completion_tokens"] == body["max_tokens"]
        assert len(res["final"]["stallfree"]["token_times"]) == body["max_tokens"]
    m = wait_idle(server.url)
    assert metric(m, "vllm:kv_cache_usage_perc") == 0 and metric(m, "vllm:num_requests_running") == 0


def test_disconnected_streams_are_aborted(server):
    before = scrape(server.url)
    cut = random_stream_bodies(20, seed=2, max_tokens=(1500, 1900))
    kept = random_stream_bodies(10, seed=3, max_tokens=(20, 40))

    async def run():
        async with async_client(server.url) as client:
            return await asyncio.gather(*(stream_completion(client, b, cut_after=3) for b in cut),
                                        *(stream_completion(client, b) for b in kept))

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
