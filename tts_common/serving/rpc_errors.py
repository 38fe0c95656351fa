"""Exceptions to gRPC statuses: :func:`grpc_status_for` (the project errors by the status their
class declares in :mod:`tts_common.errors`), :func:`abort_for_exception` and the servicer method
decorator :func:`handle_rpc_errors` (which also counts final statuses)."""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import math
from collections.abc import AsyncIterator, Callable
from typing import Any, NoReturn, TypeVar

import grpc

from tts_common import metrics
from tts_common.errors import TTSError
from tts_common.logging_setup import current_request_id
from tts_common.serving.request_ids import REQUEST_ID_METADATA_KEY, check_request_id

logger = logging.getLogger(__name__)

RETRY_AFTER_METADATA = "retry-after"
"""Trailing metadata key of a failure's retry hint (whole seconds, as HTTP's ``Retry-After``)."""


def retry_after_seconds(exc: BaseException) -> int | None:
    """The retry hint of ``exc`` in whole seconds (at least 1), where it has one
    (``TTSError.retry_after_s``)."""
    hint = exc.retry_after_s if isinstance(exc, TTSError) else None
    return None if hint is None else max(1, math.ceil(hint))


def grpc_status_for(exc: BaseException) -> grpc.StatusCode:
    """The status code an exception is reported as: the project errors by their declared code,
    a downstream stage's error by its code, timeouts as DEADLINE_EXCEEDED, cancellation as
    CANCELLED, NotImplementedError as UNIMPLEMENTED, anything else INTERNAL."""
    if isinstance(exc, TTSError):
        return grpc.StatusCode[exc.grpc_status]
    if isinstance(exc, grpc.aio.AioRpcError):
        return exc.code()
    if isinstance(exc, asyncio.CancelledError):
        return grpc.StatusCode.CANCELLED
    if isinstance(exc, TimeoutError):  # asyncio.TimeoutError is TimeoutError since 3.11
        return grpc.StatusCode.DEADLINE_EXCEEDED
    if isinstance(exc, asyncio.TimeoutError):
        return grpc.StatusCode.DEADLINE_EXCEEDED
    if isinstance(exc, NotImplementedError):
        return grpc.StatusCode.UNIMPLEMENTED
    return grpc.StatusCode.INTERNAL


def _details_for(exc: BaseException, code: grpc.StatusCode, context: grpc.aio.ServicerContext) -> str:
    """What the client is told: an internal error's details are the request id to quote only
    (the exception and its traceback go to the log), never a class name, repr or path."""
    if isinstance(exc, grpc.aio.AioRpcError):
        return exc.details() or code.name
    if code is grpc.StatusCode.INTERNAL:
        request_id = current_request_id() or _metadata_request_id(context)
        where = f" (request id {request_id})" if request_id else ""
        return f"internal error{where}; the details are in the server log"
    return str(exc) or code.name.lower()


def _metadata_request_id(context: grpc.aio.ServicerContext) -> str | None:
    try:
        metadata = context.invocation_metadata() or ()
    except Exception:  # noqa: BLE001 - a context without metadata: no id to name
        return None
    for key, value in metadata:
        if key == REQUEST_ID_METADATA_KEY and value:
            text = value if isinstance(value, str) else value.decode("utf-8", "replace")
            return text if _acceptable(text) else None
    return None


def _acceptable(request_id: str) -> bool:
    try:
        check_request_id(request_id)
    except TTSError:
        return False
    return True


async def abort_for_exception(context: grpc.aio.ServicerContext, exc: BaseException) -> NoReturn:
    """Log ``exc`` (with traceback if it is an internal error) and fail the RPC with the
    matching status (:func:`grpc_status_for`) and its retry hint (:func:`retry_after_seconds`,
    trailing metadata ``retry-after``). Never returns."""
    code = grpc_status_for(exc)
    details = _details_for(exc, code, context)
    if code is grpc.StatusCode.INTERNAL:
        logger.error("RPC failed: %s: %r", details, exc, exc_info=exc)
    else:
        logger.info("RPC failed: %s: %s", code.name, details)
    retry_after = retry_after_seconds(exc)
    trailing = () if retry_after is None else ((RETRY_AFTER_METADATA, str(retry_after)),)
    await context.abort(code, details, trailing_metadata=trailing)
    raise AssertionError("unreachable")  # context.abort always raises


_F = TypeVar("_F", bound=Callable[..., Any])


def handle_rpc_errors(func: _F | None = None, *, stage: str | None = None) -> Any:
    """Decorator for servicer methods (``async def`` or ``async def`` generators): exceptions
    become gRPC statuses via :func:`abort_for_exception`. With ``stage``, the final status of
    every call is counted in ``qwen3tts_requests_total{stage, status}``. Usable bare
    (``@handle_rpc_errors``) or with arguments (``@handle_rpc_errors(stage="talker")``)."""

    def count(status: str) -> None:
        if stage:
            metrics.REQUESTS.labels(stage=stage, status=status).inc()

    def decorate(fn: _F) -> _F:
        if inspect.isasyncgenfunction(fn):

            @functools.wraps(fn)
            async def gen_wrapper(
                self: Any, request: Any, context: grpc.aio.ServicerContext, *args: Any, **kwargs: Any
            ) -> AsyncIterator[Any]:
                try:
                    async for item in fn(self, request, context, *args, **kwargs):
                        yield item
                except grpc.aio.AbortError:
                    count(_abort_status(context))
                    raise
                except (asyncio.CancelledError, GeneratorExit):
                    count(grpc.StatusCode.CANCELLED.name)
                    raise
                except Exception as exc:  # noqa: BLE001 - mapped to a status
                    count(grpc_status_for(exc).name)
                    await abort_for_exception(context, exc)
                else:
                    count(grpc.StatusCode.OK.name)

            return gen_wrapper  # type: ignore[return-value]

        @functools.wraps(fn)
        async def wrapper(
            self: Any, request: Any, context: grpc.aio.ServicerContext, *args: Any, **kwargs: Any
        ) -> Any:
            try:
                result = await fn(self, request, context, *args, **kwargs)
            except grpc.aio.AbortError:
                count(_abort_status(context))
                raise
            except asyncio.CancelledError:
                count(grpc.StatusCode.CANCELLED.name)
                raise
            except Exception as exc:  # noqa: BLE001 - mapped to a status
                count(grpc_status_for(exc).name)
                await abort_for_exception(context, exc)
            count(grpc.StatusCode.OK.name)
            return result

        return wrapper  # type: ignore[return-value]

    return decorate(func) if func is not None else decorate


def _abort_status(context: grpc.aio.ServicerContext) -> str:
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code.name
    return grpc.StatusCode.UNKNOWN.name


__all__ = [
    "RETRY_AFTER_METADATA",
    "abort_for_exception",
    "grpc_status_for",
    "handle_rpc_errors",
    "retry_after_seconds",
]
