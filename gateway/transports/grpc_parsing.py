"""The public service's request messages parsed by the gateway, not by grpcio: a message that
does not parse (a string field that is not UTF-8, a truncated or malformed message) is
INVALID_ARGUMENT with a plain message, where grpcio's own deserializer would answer UNKNOWN with
``Unexpected <class 'google.protobuf.message.DecodeError'>...``.

:func:`add_servicer` registers every method of a service from its descriptor with the raw bytes
as the request (no deserializer) and parses them here, before the servicer's method runs (each
message of a client stream as it arrives, so a bad one fails the stream through the servicer's
own error handling)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass

from tts_common import metrics
from tts_common.errors import InvalidRequestError


def unparsable(message_class: type[Message]) -> str:
    """What the client is told about a request that does not parse as ``message_class``."""
    return (
        f"the request does not parse as {message_class.DESCRIPTOR.full_name} (a string field that is "
        "not valid UTF-8, or a truncated or malformed message)"
    )


def parse(message_class: type[Message], raw: bytes) -> Message:
    """``raw`` as a ``message_class``; :class:`InvalidRequestError` if it does not parse."""
    try:
        return message_class.FromString(raw)
    except DecodeError:
        raise InvalidRequestError(unparsable(message_class)) from None


def _handler(method: MethodDescriptor, behavior: Callable[..., Any], stage: str) -> grpc.RpcMethodHandler:
    request_class = GetMessageClass(method.input_type)
    serializer = GetMessageClass(method.output_type).SerializeToString

    async def refuse(raw: bytes, context: grpc.aio.ServicerContext) -> Message | None:
        try:
            return parse(request_class, raw)
        except InvalidRequestError as exc:
            metrics.REQUESTS.labels(stage=stage, status=grpc.StatusCode.INVALID_ARGUMENT.name).inc()
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return None

    async def parsed_stream(raws: AsyncIterator[bytes]) -> AsyncIterator[Message]:
        async for raw in raws:
            yield parse(request_class, raw)

    if method.client_streaming and method.server_streaming:

        async def stream_stream(
            raws: AsyncIterator[bytes], context: grpc.aio.ServicerContext
        ) -> AsyncIterator[Message]:
            async for response in behavior(parsed_stream(raws), context):
                yield response

        return grpc.stream_stream_rpc_method_handler(stream_stream, response_serializer=serializer)
    if method.client_streaming:

        async def stream_unary(raws: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> Message:
            return await behavior(parsed_stream(raws), context)

        return grpc.stream_unary_rpc_method_handler(stream_unary, response_serializer=serializer)
    if method.server_streaming:

        async def unary_stream(raw: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[Message]:
            request = await refuse(raw, context)
            async for response in behavior(request, context):
                yield response

        return grpc.unary_stream_rpc_method_handler(unary_stream, response_serializer=serializer)

    async def unary_unary(raw: bytes, context: grpc.aio.ServicerContext) -> Message:
        request = await refuse(raw, context)
        return await behavior(request, context)

    return grpc.unary_unary_rpc_method_handler(unary_unary, response_serializer=serializer)


def add_servicer(server: grpc.aio.Server, service: ServiceDescriptor, servicer: object, stage: str) -> None:
    """Register ``servicer``'s methods of ``service`` on ``server``, parsing requests as the module
    doc says (``stage``: the metrics label of refused requests)."""
    handlers = {
        method.name: _handler(method, getattr(servicer, method.name), stage) for method in service.methods
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))


__all__ = ["add_servicer", "parse", "unparsable"]
