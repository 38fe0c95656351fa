"""The ``/v1`` HTTP routes' gate, as ASGI middleware, so it runs before anything reads the body:
readiness (503 while not serving) and the API key (401/403, ``authorization: Bearer`` or
``x-api-key``). An unauthenticated upload is refused from its headers, without being read, let
alone buffered or parsed; its connection is then closed (the unread body cannot be skipped)."""

from __future__ import annotations

from collections.abc import Callable

from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Receive, Scope, Send

from tts_common.errors import TTSError

from .connection import known_request_id
from .errors import http_error, log_and_count

GATED_PREFIX = "/v1/"


class AccessGate:
    """Runs ``check`` (raising a :class:`TTSError` to refuse) on every ``/v1`` HTTP request
    before the app sees it. (The WebSocket checks its key itself: it may come in a message.)"""

    def __init__(self, app: ASGIApp, check: Callable[[HTTPConnection], None]) -> None:
        self.app = app
        self.check = check

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (scope["path"] + "/").startswith(GATED_PREFIX):
            connection = HTTPConnection(scope)
            try:
                self.check(connection)
            except TTSError as exc:
                request_id = known_request_id(connection)
                error = http_error(exc, request_id)
                log_and_count(error, exc, f"{scope['method']} {scope['path']} [{request_id}]")
                response = error.response()
                response.headers["x-request-id"] = request_id
                if _has_body(scope):
                    response.headers["connection"] = "close"
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _has_body(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() not in (b"", b"0")):
            return True
    return False


__all__ = ["AccessGate"]
