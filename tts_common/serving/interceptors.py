"""Interceptors that refuse calls with a status before the servicer runs: the
:class:`RefusingInterceptor` base, and :class:`ReadinessInterceptor` (UNAVAILABLE until the
server's health says SERVING)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc

from .health import ServingHealth


class RefusingInterceptor(grpc.aio.ServerInterceptor):
    """Base of interceptors that refuse calls with a status before the servicer runs.

    Methods under the ``exempt`` prefixes always pass; for the others :meth:`refusal` decides.
    """

    def __init__(self, exempt: Sequence[str]) -> None:
        self._exempt = tuple(exempt)

    def refusal(self, details: grpc.HandlerCallDetails) -> tuple[grpc.StatusCode, str] | None:
        """``(code, message)`` to fail the call with, or None to let it through."""
        raise NotImplementedError

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(self._exempt):
            return handler
        refused = self.refusal(handler_call_details)
        return handler if refused is None else aborting_handler(handler, *refused)


class ReadinessInterceptor(RefusingInterceptor):
    """Fails RPCs with UNAVAILABLE while the health status is not SERVING, except for the
    health and reflection services and the ``always_available`` method prefixes."""

    def __init__(self, health: ServingHealth, always_available: Sequence[str]) -> None:
        super().__init__(always_available)
        self._health = health

    def refusal(self, details: grpc.HandlerCallDetails) -> tuple[grpc.StatusCode, str] | None:
        reason = self._health.refusal_reason()
        return None if reason is None else (grpc.StatusCode.UNAVAILABLE, reason)


def aborting_handler(
    handler: grpc.RpcMethodHandler, code: grpc.StatusCode, details: str
) -> grpc.RpcMethodHandler:
    """A handler of the same RPC type as ``handler`` that fails every call with ``code``."""

    async def abort(_request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(code, details)

    factory = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[(handler.request_streaming, handler.response_streaming)]
    return factory(
        abort,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


__all__ = ["ReadinessInterceptor", "RefusingInterceptor", "aborting_handler"]
