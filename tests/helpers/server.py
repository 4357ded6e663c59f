"""Helpers of the server tests: greedy reference outputs, /metrics scraping, SSE parsing."""
from __future__ import annotations

import json
import random
import socket
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from stallfree.engine import LLM, SamplingParams

ENGINE = {"model": "tiny", "dtype": "float32", "scheduler": "sarathi", "chunk_size": 512, "num_blocks": 2048}
PROMPT = "the quick brown fox jumps over the lazy dog"
# GPT-2 byte-level alphabet: the token of each single byte
_PRINTABLE = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
_OTHERS = [b for b in range(256) if b not in _PRINTABLE]
BYTE_CHARS = {b: chr(b) for b in _PRINTABLE} | {b: chr(256 + i) for i, b in enumerate(_OTHERS)}



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


async def stream_completion(client: httpx.AsyncClient, body: dict, cut_after: int | None = None) -> dict:
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


async def stream_tokens(client: httpx.AsyncClient, body: dict) -> list[int]:
    """The token ids of a completion stream that must succeed: fails on an error event or a missing
    [DONE]."""
    tokens, done = [], False
    async with client.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                chunk = json.loads(line[6:])
                assert "error" not in chunk, chunk
                tokens += [t for c in chunk["choices"] for t in c["token_ids"]]
    assert done
    return tokens


def random_stream_bodies(n: int, seed: int, max_tokens: tuple[int, int]) -> list[dict]:
    rng = random.Random(seed)
    return [{"prompt": [rng.randrange(3, 2048) for _ in range(rng.randint(4, 60))],
             "max_tokens": rng.randint(*max_tokens), "temperature": 0.8, "seed": i, "ignore_eos": True,
             "stream": True, "stream_options": {"include_usage": True}} for i in range(n)]


def async_client(url: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, timeout=120, trust_env=False,
                             limits=httpx.Limits(max_connections=None, max_keepalive_connections=None))


def raw_exchange(url: str, request: bytes, timeout: float = 30.0) -> tuple[float, int, dict]:
    """Send raw bytes on a new connection and read until the server closes it: (seconds taken, status,
    JSON body)."""
    host, port = url.removeprefix("http://").split(":")
    start = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return time.monotonic() - start, int(head.split()[1]), json.loads(body)


def is_openai_error(body: object) -> bool:
    error = body.get("error") if isinstance(body, dict) else None
    return isinstance(error, dict) and set(error) == {"message", "type", "param", "code"} \
        and isinstance(error["message"], str) and bool(error["message"])
