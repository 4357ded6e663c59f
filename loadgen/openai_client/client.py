"""Streaming OpenAI completions / chat completions client that records a client receive time for every token.

HTTP/1.1 is spoken directly on asyncio streams (keep-alive pool, chunked / content-length / close-
delimited bodies, http and https). httpx was measured first: on the 2-core test machine it spent
~2.3 ms of CPU per 8-token streamed request (~0.2 ms per SSE chunk in httpcore/anyio) against
~0.45 ms here, and at 200 QPS next to a busy engine process the dispatcher fell seconds behind.
A load generator has to stay far below its fair share of a core. aiohttp, set up as vLLM's
``bench serve`` sets it up, was measured too (benchmarks/client_fidelity.py): ~45% more CPU per
request and a 2-3x higher schedule lag p99 without real-time priority; it misses the 200-QPS fidelity
test's TTFT bound in 3 of 5 runs where this client passes all 5.

``send_request`` never raises: HTTP errors, connection errors, timeouts and cancellation all become
a RequestRecord with a status and an error.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

from stallfree.engine.records import RequestRecord, RequestSpec
from stallfree.loadgen.openai_client.completions import (
    CANCELLED,
    NO_DONE,
    ResponseError,
    apply_sse_event,
    failure_error,
    request,
    timeout_error,
)

Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


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

    async def stream(self, path: str, body: bytes, record: RequestRecord) -> None:
        """POST and consume the SSE stream, filling the record in place; raises on failure."""
        conn = await self.acquire()
        reusable = False
        try:
            conn[1].write(self.post_bytes(path, body))
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
                        apply_sse_event(line[5:].strip(), received, record)
            reusable = keeps_alive(headers)
        finally:
            self.release(conn, reusable)
        if record.status != "ok":
            raise ResponseError(NO_DONE)


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


async def send_request(client: HttpClient, spec: RequestSpec, *, model: str, intended_send_time: float,
                       timeout_s: float, is_warmup: bool = False, endpoint: str = "completions",
                       ignore_eos: bool = True) -> RequestRecord:
    """POST one streaming completion (``endpoint``: completions or chat; ``ignore_eos`` sent or not) now;
    return its record (never raises).

    status: ok (stream finished with ``data: [DONE]``), timeout (no complete response within
    timeout_s), aborted (the task was cancelled), error (anything else; the message is in ``error``).
    """
    record = RequestRecord.unsent(spec, intended_send_time=intended_send_time, is_warmup=is_warmup)
    path, body = request(spec, model, endpoint, ignore_eos)
    record.mark_sent(time.time())
    status, error = "ok", None
    try:
        async with asyncio.timeout(timeout_s):
            await client.stream(path, body, record)
    except TimeoutError:
        status, error = "timeout", timeout_error(timeout_s)
    except asyncio.CancelledError:
        status, error = "aborted", CANCELLED
    except Exception as e:  # connection and protocol failures: every failure must become a record
        status, error = "error", failure_error(e)
    record.end(status, error, time.time())
    return record
