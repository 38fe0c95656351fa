"""Request limits, as ASGI middleware:

* :class:`RequestFraming` -- the request head: a request framed with both ``Content-Length`` and
  ``Transfer-Encoding`` is 400 (RFC 9112 section 6.1: the request-smuggling shape behind a
  proxy), more header fields than ``max_headers`` or a head larger than ``max_head_bytes`` is 431;
  each answered from the head alone, with ``connection: close``, so the connection is closed
  after it. (The HTTP server's parser is given a larger bound, :data:`PARSER_HEAD_FACTOR` times
  this one, for a head that arrives in pieces: what it buffers stays bounded, and every head over
  this limit but under that one is answered 431 here.)
* :class:`BodySizeLimit` -- the body (413): a declared ``Content-Length`` over the limit is
  refused before the body is read; a chunked body is counted as it arrives and the request fails
  as soon as it passes the limit, so an oversized upload is never buffered whole."""

from __future__ import annotations

from collections.abc import Mapping

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tts_common.errors import PayloadTooLargeError

from .errors import http_error, log_and_count

PARSER_HEAD_FACTOR = 4
"""The HTTP parser's own bound on a request head, in multiples of :class:`RequestFraming`'s."""


def head_bytes(scope: Scope) -> int:
    """The size of a request's head as sent: request line and header lines."""
    line = len(scope.get("method", "GET")) + len(scope.get("raw_path") or scope["path"].encode()) + 12
    line += len(scope.get("query_string", b"")) + 1
    return line + sum(len(name) + len(value) + 4 for name, value in scope["headers"]) + 2


class RequestFraming:
    """Refuses, from its head alone, a request framed ambiguously or with too large a head (see
    the module doc); a WebSocket handshake so refused is refused (HTTP 403) before accepting."""

    def __init__(self, app: ASGIApp, max_headers: int, max_head_bytes: int) -> None:
        self.app = app
        self.max_headers = max_headers
        self.max_head_bytes = max_head_bytes

    def refusal(self, scope: Scope) -> tuple[int, str] | None:
        """``(status, message)`` of a request to refuse, else None."""
        headers = scope["headers"]
        if len(headers) > self.max_headers:
            return 431, f"too many header fields: {len(headers)} (limit {self.max_headers})"
        size = head_bytes(scope)
        if size > self.max_head_bytes:
            return 431, f"request head too large: {size} bytes (limit {self.max_head_bytes})"
        names = {name for name, _ in headers}
        if b"transfer-encoding" in names and b"content-length" in names:
            return 400, "a request may not carry both Content-Length and Transfer-Encoding"
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        refusal = self.refusal(scope)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        status, message = refusal
        exc = HTTPException(status, message)
        error = http_error(exc)
        log_and_count(error, exc, f"{scope.get('method', 'WS')} {scope['path']}")
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        response = error.response()
        response.headers["connection"] = "close"
        await response(scope, receive, send)


def _too_large(limit: int) -> str:
    return f"request body too large (limit {limit} bytes)"


class BodySizeLimit:
    """At most ``limits[(method, path)]`` (else ``default_limit``) body bytes per request."""

    def __init__(self, app: ASGIApp, default_limit: int, limits: Mapping[tuple[str, str], int]) -> None:
        self.app = app
        self.default_limit = default_limit
        self.limits = dict(limits)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limits.get((scope["method"], scope["path"].rstrip("/")), self.default_limit)
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                exc = PayloadTooLargeError(_too_large(limit))
                error = http_error(exc)
                log_and_count(error, exc, f"{scope['method']} {scope['path']}")
                await error.response()(scope, receive, send)
                return
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    # An HTTPException passes FastAPI's body parsing unchanged (any other
                    # exception there becomes a generic 400); the error handlers answer it.
                    raise HTTPException(413, _too_large(limit))
            return message

        await self.app(scope, counting_receive, send)


__all__ = ["PARSER_HEAD_FACTOR", "BodySizeLimit", "RequestFraming", "head_bytes"]
