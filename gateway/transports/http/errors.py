"""Exceptions to HTTP statuses and OpenAI error objects, in one place (the HTTP counterpart of
:mod:`tts_common.serving.rpc_errors`, and built on it: an exception first gets the gRPC status it
would have, :func:`~tts_common.serving.rpc_errors.grpc_status_for`, then that status its HTTP one).

The body is OpenAI's error object, so the ``openai`` SDK raises its matching exception class::

    {"error": {"message": "...", "type": "invalid_request_error", "param": null, "code": "invalid_argument"}}

400 invalid request, 401 no API key, 403 unknown key, 404 unknown voice (or route), 413 body too
large, 429 at capacity (with ``Retry-After``), 503 a stage or the voice database unavailable or
the server not serving (with ``Retry-After``: the error's own hint where it has one), 504
deadline. ``code`` is the gRPC status name in lower case.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException

from tts_common import metrics
from tts_common.errors import PayloadTooLargeError, TTSError
from tts_common.serving.rpc_errors import grpc_status_for, retry_after_seconds

from ...config import STAGE
from .connection import known_request_id

logger = logging.getLogger(__name__)

HTTP_STATUS: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.CANCELLED: 499,  # the client closed the request (nginx's convention)
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.DATA_LOSS: 500,
}
"""The HTTP status of each gRPC status (Google's API mapping, 413 aside)."""

ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "invalid_request_error",
    431: "invalid_request_error",
    429: "rate_limit_error",
    499: "cancelled",
    501: "not_implemented_error",
    503: "service_unavailable_error",
    504: "timeout_error",
}
"""OpenAI error ``type`` by HTTP status (anything else: ``server_error``)."""

RETRY_AFTER_SECONDS = 1
"""``Retry-After`` of 429 and 503 answers: capacity frees within a request's time."""

# The HTTP statuses of gRPC-less failures (routing, body parsing), by their gRPC counterpart.
_GRPC_FOR_HTTP = {status: code for code, status in HTTP_STATUS.items() if code is not grpc.StatusCode.ABORTED}
_GRPC_FOR_HTTP.update(
    {
        405: grpc.StatusCode.UNIMPLEMENTED,
        413: grpc.StatusCode.INVALID_ARGUMENT,
        431: grpc.StatusCode.INVALID_ARGUMENT,
    }
)


class ErrorObject(BaseModel):
    """OpenAI's error object."""

    message: str = Field(description="What went wrong (for a server error: the request id to quote).")
    type: str = Field(description="OpenAI's error type, e.g. invalid_request_error, rate_limit_error.")
    param: str | None = Field(description="The offending request field, where one is to blame.")
    code: str = Field(description="The gRPC status name in lower case, e.g. invalid_argument.")


class ErrorBody(BaseModel):
    """Every error answer's body (OpenAI's shape)."""

    error: ErrorObject


ERROR_STATUSES: dict[int, str] = {
    400: "Invalid request: a field, the body, its framing or its text (names the field).",
    401: "No API key (API keys configured).",
    403: "Unknown API key.",
    404: "Unknown model, voice or route.",
    413: "Request body too large.",
    429: "At capacity (Retry-After).",
    431: "Request headers too large or too many.",
    500: "Internal error (the message names the request id; details are in the server log).",
    503: "Not serving, or a stage or the voice database unavailable (Retry-After).",
    504: "Deadline exceeded.",
}
"""The error statuses every ``/v1`` route can answer, described once for the OpenAPI document."""


def error_responses(*extra: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI ``responses`` entries of the error answers (:data:`ERROR_STATUSES` plus
    ``extra`` statuses, and ``default`` for any other, e.g. 405): all :class:`ErrorBody`."""
    descriptions = {**ERROR_STATUSES, **{s: ERROR_TYPES.get(s, "error") for s in extra}}
    responses: dict[int | str, dict[str, Any]] = {
        status: {"model": ErrorBody, "description": text} for status, text in sorted(descriptions.items())
    }
    responses["default"] = {"model": ErrorBody, "description": "Any other error."}
    return responses


@dataclass(frozen=True)
class HttpError:
    """What an exception becomes on the HTTP API."""

    status: int
    grpc_code: grpc.StatusCode
    message: str
    param: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def body(self) -> dict[str, Any]:
        """OpenAI's error object."""
        return {
            "error": {
                "message": self.message,
                "type": ERROR_TYPES.get(self.status, "server_error"),
                "param": self.param,
                "code": self.grpc_code.name.lower(),
            }
        }

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def _with_retry_after(status: int, exc: BaseException | None = None) -> dict[str, str]:
    hint = None if exc is None else retry_after_seconds(exc)
    if hint is not None:
        return {"Retry-After": str(hint)}
    return {"Retry-After": str(RETRY_AFTER_SECONDS)} if status in (429, 503) else {}


INTERNAL_CODES = frozenset({grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.DATA_LOSS})
"""Statuses whose details are internals (a bug here or in a stage): never shown to a client."""


def internal_message(request_id: str | None) -> str:
    """What a client is told about an internal error: the request id to quote, nothing else."""
    where = f" (request id {request_id})" if request_id else ""
    return f"internal error{where}; the details are in the server log"


def http_error(exc: BaseException, request_id: str | None = None) -> HttpError:
    """The HTTP status, message and headers of ``exc`` (any exception). An internal error's
    message is :func:`internal_message` (``request_id``: the id the log has it under): no class
    name, repr, path or traceback of it reaches the client."""
    if isinstance(exc, RequestValidationError):
        return validation_error(exc.errors())
    if isinstance(exc, HTTPException):
        code = _GRPC_FOR_HTTP.get(exc.status_code, grpc.StatusCode.UNKNOWN)
        message = str(exc.detail) if exc.status_code < 500 else internal_message(request_id)
        return HttpError(
            exc.status_code,
            code,
            message,
            headers={**(exc.headers or {}), **_with_retry_after(exc.status_code)},
        )
    code = grpc_status_for(exc)
    status = 413 if isinstance(exc, PayloadTooLargeError) else HTTP_STATUS[code]
    if code in INTERNAL_CODES:
        stage = getattr(exc, "stage", None)  # a stage's failure (StageError) names the stage
        message = (f"{stage} stage: " if isinstance(stage, str) else "") + internal_message(request_id)
    elif isinstance(exc, grpc.aio.AioRpcError):
        # A stage call's error that no StageError wrapped: its details may be grpc-core's
        # (the stage's address); they are logged with the exception (log_and_count).
        where = f" (request id {request_id})" if request_id else ""
        message = f"a stage call failed: {code.name.lower()}{where}; the details are in the server log"
    else:
        message = str(exc) or code.name.lower()
    return HttpError(status, code, message, headers=_with_retry_after(status, exc))


def client_message(error: Mapping[str, Any]) -> str:
    """A pydantic error's message, without the Python in it (a ``<class 'str'>``, a class name)."""
    message = str(error.get("msg", "invalid value")).removeprefix("Value error, ")
    if error.get("type") == "extra_forbidden":
        return "unknown field"
    if "UploadFile" in message:
        return "expected a file (a multipart part with a filename)"
    return _PYTHON_CLASS.sub(r"\1", message)


_PYTHON_CLASS = re.compile(r"<class '(?:[\w.]*\.)?(\w+)'>")


def validation_error(errors: Sequence[Any]) -> HttpError:
    """FastAPI/pydantic body errors: 400 (OpenAI's status for bad parameters, not 422) naming
    every offending field; ``param`` is the first one."""
    parts, params = [], []
    for error in errors:
        location = [str(p) for p in error.get("loc", ()) if p not in ("body", "query", "path")]
        name = ".".join(location)
        params.append(name or None)
        message = client_message(error)
        parts.append(f"{name}: {message}" if name else message)
    return HttpError(
        400,
        grpc.StatusCode.INVALID_ARGUMENT,
        "invalid request: " + "; ".join(parts),
        param=params[0] if params else None,
    )


def log_and_count(error: HttpError, exc: BaseException | None, where: str) -> None:
    """Log a failed request (internal errors with what they were and their traceback: only the
    log has them) and count its final status in ``qwen3tts_requests_total`` (the same counter
    and labels as gRPC)."""
    if error.grpc_code in INTERNAL_CODES:
        logger.error("%s failed: %s: %r", where, error.message, exc, exc_info=exc)
    elif isinstance(exc, grpc.aio.AioRpcError):
        logger.warning("%s failed: %d %s: %s", where, error.status, error.grpc_code.name, exc.details())
    else:
        logger.info("%s failed: %d %s: %s", where, error.status, error.grpc_code.name, error.message)
    count(error.grpc_code)


def count(code: grpc.StatusCode) -> None:
    """Count a finished HTTP request by its (gRPC) status name."""
    metrics.REQUESTS.labels(stage=STAGE, status=code.name).inc()


def install_error_handlers(app: FastAPI) -> None:
    """Every exception a route raises (ours, FastAPI's validation, Starlette's routing) becomes
    an OpenAI error response."""

    async def handle(request: Request, exc: Exception) -> JSONResponse:
        request_id = known_request_id(request)
        error = http_error(exc, request_id)
        log_and_count(error, exc, f"{request.method} {request.url.path} [{request_id}]")
        response = error.response()
        response.headers["x-request-id"] = request_id
        return response

    app.add_exception_handler(RequestValidationError, handle)
    app.add_exception_handler(HTTPException, handle)
    app.add_exception_handler(TTSError, handle)
    # Anything else is a bug: answered the same way, and re-raised by Starlette's outermost
    # middleware so that the server logs it too.
    app.add_exception_handler(Exception, handle)


__all__ = [
    "ERROR_STATUSES",
    "ERROR_TYPES",
    "HTTP_STATUS",
    "ErrorBody",
    "ErrorObject",
    "RETRY_AFTER_SECONDS",
    "HttpError",
    "count",
    "error_responses",
    "http_error",
    "internal_message",
    "install_error_handlers",
    "log_and_count",
    "validation_error",
]
