"""Every failure as an OpenAI-style error body (engine/server/protocol.py:APIError), one handler per kind."""
from __future__ import annotations

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from stallfree.engine.server.http import ClientDisconnected
from stallfree.engine.server.protocol import APIError, validation_error


async def api_error(_: Request, exc: APIError) -> JSONResponse:
    return exc.response()


async def http_error(_: Request, exc: HTTPException) -> JSONResponse:
    # FastAPI's own 400: a body it could not decode (bad UTF-8, nesting too deep, huge numbers)
    code = {400: "invalid_json", 404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    return APIError(exc.status_code, str(exc.detail), code=code, headers=exc.headers).response()


async def invalid_body(_: Request, exc: RequestValidationError) -> JSONResponse:
    return validation_error(exc).response()


async def client_gone(_: Request, __: ClientDisconnected) -> Response:
    return Response(status_code=499)


ERROR_HANDLERS = {APIError: api_error, HTTPException: http_error, RequestValidationError: invalid_body,
                  ClientDisconnected: client_gone}
