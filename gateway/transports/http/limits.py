"""Request body size limits (HTTP 413), as ASGI middleware: a declared ``Content-Length`` over
the limit is refused before the body is read; a chunked body is counted as it arrives and the
request fails as soon as it passes the limit, so an oversized upload is never buffered whole."""

from __future__ import annotations

from collections.abc import Mapping

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tts_common.errors import PayloadTooLargeError

from .errors import http_error, log_and_count


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


__all__ = ["BodySizeLimit"]
