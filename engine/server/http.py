"""HTTP plumbing: the request-context middleware, an SSE response that notices disconnects, and a
helper that cancels a non-streaming handler's work when its client goes away."""
from __future__ import annotations

import asyncio
import hmac
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import anyio
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from stallfree.engine.request_limits import SIZES
from stallfree.engine.server.protocol import APIError

logger = logging.getLogger("stallfree.server")
T = TypeVar("T")
# Paths that need the API key (when there is one), each with everything below it; /health never does,
# /metrics only with metrics_require_api_key. vLLM checks the key on /v1 alone.
API_KEY_PREFIXES = ("/v1", "/tokenize", "/stallfree", "/reset_prefix_cache")


class ClientDisconnected(Exception):
    """The client went away before the response was ready."""


def request_id_error(request_id: str) -> APIError | None:
    """The 400 for a client's ``X-Request-Id`` that is too long or not printable ASCII (a control
    character in a reflected header is invalid HTTP, and in a log line a forged entry), else None."""
    size = SIZES["x-request-id"]
    if len(request_id) > size.max_items:
        problem = f"has {len(request_id):,} characters"
    elif (bad := next((i for i, c in enumerate(request_id) if not " " <= c <= "~"), None)) is not None:
        problem = f"has a character outside printable ASCII at index {bad}"
    else:
        return None
    return APIError(400, f"X-Request-Id {problem}; send {size.describe()} or none", param="X-Request-Id",
                    code="invalid_request_id")


def needs_api_key(path: str, metrics_require_api_key: bool) -> bool:
    if path == "/metrics":
        return metrics_require_api_key
    return any(path == prefix or path.startswith(prefix + "/") for prefix in API_KEY_PREFIXES)


class RequestContextMiddleware:
    """Gives every request its id (``request.state.request_id``: the client's ``X-Request-Id`` as vLLM
    takes it, else a new one; sent back as ``x-request-id``; one too long or not printable ASCII gets a
    400 under a new id) and its arrival time
    (``request.state.arrival_time``), enforces the API key, the body-size limit and the body-read
    timeout, and turns any unhandled exception into an OpenAI-style 500. HTTP metrics come from the
    prometheus-fastapi-instrumentator middleware around it."""

    def __init__(self, app: ASGIApp, *, api_key: str | None, metrics_require_api_key: bool,
                 max_body_bytes: int, body_read_timeout_s: float):
        self.app = app
        self.api_key = api_key
        self.metrics_require_api_key = metrics_require_api_key
        self.max_body_bytes = max_body_bytes
        self.body_read_timeout_s = body_read_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        request_id = headers.get("x-request-id", "").strip()
        bad_id = request_id_error(request_id) if request_id else None
        if bad_id is not None or not request_id:  # a bad one is never echoed, stored or logged
            request_id = uuid.uuid4().hex
        scope.setdefault("state", {}).update(request_id=request_id, arrival_time=time.time())
        raw_request_id = request_id.encode("ascii")
        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                message["headers"] = [*message.get("headers", []), (b"x-request-id", raw_request_id)]
            await send(message)

        try:
            if (error := bad_id or self._reject(scope, headers)) is not None:
                await error.response()(scope, receive, send_with_id)
            else:
                await self.app(scope, self._limited(receive), send_with_id)
        except Exception:
            logger.exception("unhandled error in %s %s", scope["method"], scope["path"])
            if not started:
                await APIError(500, "internal server error", type="server_error",
                               code="internal_error").response()(scope, receive, send_with_id)

    def _reject(self, scope: Scope, headers: Headers) -> APIError | None:
        if self.api_key is not None and needs_api_key(scope["path"], self.metrics_require_api_key):
            scheme, _, token = headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self.api_key.encode()):
                return APIError(401, "missing or invalid API key (send 'Authorization: Bearer <key>')",
                                type="authentication_error", code="invalid_api_key",
                                headers={"WWW-Authenticate": "Bearer"})
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_body_bytes:
            return self._too_large()
        return None

    def _too_large(self) -> APIError:
        return APIError(413, f"request body exceeds {self.max_body_bytes} bytes", code="request_too_large")

    def _limited(self, receive: Receive) -> Receive:
        """Counts body bytes when there is no (truthful) Content-Length, e.g. chunked uploads, and ends a
        body that is not complete within body_read_timeout_s of the request (a Content-Length larger
        than what the client sends would otherwise hold the handler as long as the client likes)."""
        received, complete = 0, False
        deadline = asyncio.get_running_loop().time() + self.body_read_timeout_s

        async def receive_limited() -> Message:
            nonlocal received, complete
            if complete:  # afterwards the app only waits for the disconnect, for as long as it streams
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise APIError(408, f"request body not received within {self.body_read_timeout_s:g} s",
                               code="request_timeout", headers={"Connection": "close"}) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                complete = not message.get("more_body", False)
                if received > self.max_body_bytes:
                    raise self._too_large()
            return message

        return receive_limited


class SSEResponse(StreamingResponse):
    """Server-sent events. Stops streaming as soon as the client disconnects (even while waiting for
    the next event), then closes the event generator and calls ``on_close`` (which aborts whatever
    is unfinished, also when the stream never started)."""

    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], None], **kwargs):
        super().__init__(content, **kwargs)
        self.on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as tg:
                async def stream() -> None:
                    try:
                        await self.stream_response(send)
                    except OSError:  # the client is gone
                        pass
                    tg.cancel_scope.cancel()

                tg.start_soon(stream)
                await self.listen_for_disconnect(receive)
                tg.cancel_scope.cancel()
        finally:
            await self.body_iterator.aclose()
            self.on_close()


async def until_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await ``work``; if the client disconnects first, cancel it and raise ClientDisconnected."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        raise ClientDisconnected
    finally:
        for t in (task, watcher):
            t.cancel()
        await asyncio.gather(task, watcher, return_exceptions=True)


async def _wait_for_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
