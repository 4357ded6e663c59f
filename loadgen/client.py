"""Streaming OpenAI completions client that records a client receive time for every token.

HTTP/1.1 is spoken directly on asyncio streams (keep-alive pool, chunked / content-length / close-
delimited bodies, http and https). httpx was measured first: on the 2-core test machine it spent
~2.3 ms of CPU per 8-token streamed request (~0.2 ms per SSE chunk in httpcore/anyio) against
~0.45 ms here, and at 200 QPS next to a busy engine process the dispatcher fell seconds behind.
A load generator has to stay far below its fair share of a core.

``send_request`` never raises: HTTP errors, connection errors, timeouts and cancellation all become
a row of the requests.parquet schema (loadgen.results.REQUESTS_SCHEMA) with a status and an error.
"""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

from loadgen.workload import RequestSpec

COMPLETIONS_PATH = "/v1/completions"
# server-side timing extension of the final chunk ("stallfree": {...}) -> row columns
SERVER_FIELDS = {"arrival_time": "server_arrival_time", "first_scheduled_time": "server_first_scheduled_time",
                 "finish_time": "server_finish_time", "token_times": "server_token_times",
                 "num_preemptions": "num_preemptions"}

Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class ResponseError(Exception):
    """The server answered, but not with a complete successful stream."""


class HttpClient:
    """Keep-alive HTTP/1.1 connections to one server (``base_url`` is its root, e.g.
    ``http://127.0.0.1:8000``). Connections are opened on demand and reused; a caller that caps
    its requests in flight caps the connections too. Use as ``async with HttpClient(url) as c``."""

    def __init__(self, base_url: str, api_key: str | None = None):
        url = urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"base_url must be http(s)://host[:port][/prefix], got {base_url!r}")
        self.host, self.tls = url.hostname, url.scheme == "https"
        self.port = url.port or (443 if self.tls else 80)
        self.path_prefix = url.path.rstrip("/")
        auth = f"authorization: Bearer {api_key}\r\n" if api_key else ""
        self._headers = f"host: {url.netloc}\r\ncontent-type: application/json\r\n{auth}"
        self._idle: list[Connection] = []

    async def __aenter__(self) -> HttpClient:
        return self

    async def __aexit__(self, *exc) -> None:
        while self._idle:
            self._idle.pop()[1].close()

    async def acquire(self) -> Connection:
        """An idle connection the server has not closed, else a new one."""
        while self._idle:
            reader, writer = self._idle.pop()
            if not (reader.at_eof() or writer.is_closing()):
                return reader, writer
            writer.close()
        return await asyncio.open_connection(self.host, self.port, ssl=self.tls or None)

    def release(self, conn: Connection, reusable: bool) -> None:
        if reusable:
            self._idle.append(conn)
        else:
            conn[1].close()

    def post_bytes(self, path: str, body: bytes) -> bytes:
        return (f"POST {self.path_prefix}{path} HTTP/1.1\r\n{self._headers}"
                f"content-length: {len(body)}\r\n\r\n").encode() + body


async def read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    """Status code and lower-cased headers of a response."""
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionError("server closed the connection before responding")
    headers = {}
    while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
        key, _, value = line.decode("latin-1").partition(":")
        headers[key.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers


async def iter_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> AsyncIterator[bytes]:
    """The body's bytes as they arrive: chunked, content-length or up to the connection's close."""
    if "chunked" in headers.get("transfer-encoding", ""):
        while size := int((await reader.readline()).split(b";")[0], 16):
            yield (await reader.readexactly(size + 2))[:-2]  # chunk data + CRLF
        while (await reader.readline()) not in (b"\r\n", b"\n", b""):  # trailers
            pass
    elif "content-length" in headers:
        yield await reader.readexactly(int(headers["content-length"]))
    else:
        while data := await reader.read(65536):
            yield data


def keeps_alive(headers: dict[str, str]) -> bool:
    framed = "content-length" in headers or "chunked" in headers.get("transfer-encoding", "")
    return framed and headers.get("connection", "").lower() != "close"


def new_row(spec: RequestSpec, *, intended_send_time: float, is_warmup: bool) -> dict:
    """The row of a request that was never sent (status aborted, error "not sent")."""
    return {
        "request_id": spec.request_id, "status": "aborted", "error": "not sent", "is_warmup": is_warmup,
        "prompt_tokens": len(spec.prompt_token_ids), "max_tokens": spec.max_tokens, "output_tokens": 0,
        "intended_send_time": intended_send_time, "send_time": None, "first_token_time": None,
        "finish_time": None, "token_times": [],
        **dict.fromkeys(SERVER_FIELDS.values()),
    }


def tokens_in_chunk(chunk: dict) -> int:
    """Tokens carried by one stream chunk: its token_ids / logprobs.tokens when present, otherwise
    one per chunk with a choice, except an empty-text chunk that only carries a finish_reason."""
    if not chunk.get("choices"):
        return 0
    choice = chunk["choices"][0]
    if choice.get("token_ids") is not None:
        return len(choice["token_ids"])
    if (choice.get("logprobs") or {}).get("tokens") is not None:
        return len(choice["logprobs"]["tokens"])
    return int(bool(choice.get("text")) or choice.get("finish_reason") is None)


def _handle_event(data: bytes, received: float, row: dict) -> None:
    """Apply one SSE ``data:`` payload to the row."""
    if data == b"[DONE]":
        row["status"] = "ok"
        return
    chunk = json.loads(data)
    if "error" in chunk:
        raise ResponseError(f"server error in stream: {chunk['error']}")
    row["token_times"].extend([received] * tokens_in_chunk(chunk))
    if (chunk.get("usage") or {}).get("completion_tokens") is not None:
        row["output_tokens"] = chunk["usage"]["completion_tokens"]
    for key, value in (chunk.get("stallfree") or {}).items():
        if key in SERVER_FIELDS:
            row[SERVER_FIELDS[key]] = value


async def _stream(client: HttpClient, body: bytes, row: dict) -> None:
    """POST and consume the SSE stream, filling row in place; raises on failure."""
    conn = await client.acquire()
    reusable = False
    try:
        conn[1].write(client.post_bytes(COMPLETIONS_PATH, body))
        status, headers = await read_head(conn[0])
        if status != 200:
            text = b"".join([piece async for piece in iter_body(conn[0], headers)])
            raise ResponseError(f"HTTP {status}: {text.decode(errors='replace')[:500]}")
        pending = b""
        async for piece in iter_body(conn[0], headers):
            received = time.time()
            *lines, pending = (pending + piece).split(b"\n")
            for line in lines:
                if line.startswith(b"data:"):
                    _handle_event(line[5:].strip(), received, row)
        reusable = keeps_alive(headers)
    finally:
        client.release(conn, reusable)
    if row["status"] != "ok":
        raise ResponseError("stream ended without data: [DONE]")


async def send_request(client: HttpClient, spec: RequestSpec, *, model: str, intended_send_time: float,
                       timeout_s: float, is_warmup: bool = False) -> dict:
    """POST one streaming completion now; return its row (never raises).

    status: ok (stream finished with ``data: [DONE]``), timeout (no complete response within
    timeout_s), aborted (the task was cancelled), error (anything else; the message is in
    ``error``). output_tokens is the final usage.completion_tokens of a successful stream when
    the server sends it, else the number of tokens received.
    """
    row = new_row(spec, intended_send_time=intended_send_time, is_warmup=is_warmup)
    body = json.dumps({"model": model, "prompt": spec.prompt_token_ids, "max_tokens": spec.max_tokens,
                       "temperature": 0, "ignore_eos": True, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    row["send_time"], row["error"] = time.time(), None
    try:
        async with asyncio.timeout(timeout_s):
            await _stream(client, body, row)
    except TimeoutError:
        row["status"], row["error"] = "timeout", f"no complete response within {timeout_s} s"
    except asyncio.CancelledError:
        row["status"], row["error"] = "aborted", "cancelled while in flight"
    except ResponseError as e:
        row["status"], row["error"] = "error", str(e)
    except Exception as e:  # connection and protocol failures: every failure must become a row
        row["status"], row["error"] = "error", f"{type(e).__name__}: {e}"
    row["finish_time"] = time.time()
    if row["token_times"]:
        row["first_token_time"] = row["token_times"][0]
    if row["status"] != "ok" or row["output_tokens"] == 0:
        row["output_tokens"] = len(row["token_times"])
    return row
