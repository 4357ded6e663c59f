"""uvicorn's h11 protocol with two changes: protocol-level errors (a request h11 cannot parse, e.g.
``Content-Length: -1``) get the OpenAI error body instead of uvicorn's plain-text 400, and a request
line + headers that do not arrive within ``header_timeout_s`` of the connection or of their first byte
(slowloris) get a 408 and the connection is closed. uvicorn has no header timeout of its own: its
keep-alive timer stops at the first byte, and a new connection that sends nothing has no timer at all."""
from __future__ import annotations

import asyncio
import json
from http import HTTPStatus

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from stallfree.engine.server.protocol import APIError


def raw_error_response(error: APIError) -> bytes:
    """A complete HTTP/1.1 response (connection: close) for errors raised below the ASGI app."""
    body = json.dumps(error.body()).encode()
    head = (f"HTTP/1.1 {error.status_code} {HTTPStatus(error.status_code).phrase}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n")
    return head.encode("ascii") + body


class JSONErrorH11Protocol(H11Protocol):
    def __init__(self, *args, header_timeout_s: float, **kwargs):
        super().__init__(*args, **kwargs)
        self.header_timeout_s = header_timeout_s
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:  # the request line and headers are in
            self._cancel_header_timer()
        elif self._header_timer is None:  # part of the next request on a keep-alive connection
            self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        self._send_raw(APIError(400, msg, code="invalid_http_request"))  # msg: uvicorn's, e.g. "Invalid HTTP request received."

    def _arm_header_timer(self) -> None:
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._header_timeout)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timeout(self) -> None:
        self._header_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self._send_raw(APIError(408, f"request headers not received within {self.header_timeout_s:g} s",
                                    code="request_timeout"))

    def _send_raw(self, error: APIError) -> None:
        self.transport.write(raw_error_response(error))
        self.transport.close()
