"""The gateway's gRPC servicer: ``qwen3tts.v1.TextToSpeech``, a thin layer over the
transport-free core :class:`gateway.core.Gateway` (request ids, log context, the caller from the
call's API key, errors mapped to statuses), and the server assembly (API keys, TLS)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from tts_common.logging_setup import request_context
from tts_common.pb.qwen3tts.v1 import tts_pb2, tts_pb2_grpc
from tts_common.serving.config import ServerConfig
from tts_common.serving.names import service_name
from tts_common.serving.request_ids import resolve_request_id
from tts_common.serving.rpc_errors import handle_rpc_errors
from tts_common.serving.server import build_server

from ..config import STAGE, GatewayConfig
from ..core import Gateway
from ..synthesis.text_cutter import read_config
from ..voice_library import Caller
from .auth import ApiKeyInterceptor, Callers
from .grpc_parsing import add_servicer

SERVICE_NAME = service_name(tts_pb2, "TextToSpeech")


class GatewayServicer(tts_pb2_grpc.TextToSpeechServicer):
    """The public gRPC API over a :class:`~gateway.core.Gateway`."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.callers = Callers(gateway.config.api_keys, gateway.config.voices_admin_keys)

    def caller(self, context: grpc.aio.ServicerContext) -> Caller:
        """Whose call it is (its API key; the interceptor has accepted it)."""
        return self.callers.of(context.invocation_metadata())

    @handle_rpc_errors(stage=STAGE)
    async def Synthesize(
        self, request: tts_pb2.SynthesizeRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[tts_pb2.SynthesizeResponse]:
        received = time.monotonic()
        request_id = resolve_request_id(request.request_id, context)
        with request_context(request_id):
            responses = self.gateway.unary.synthesize(
                request,
                request_id,
                caller=self.caller(context),
                received=received,
                time_remaining=context.time_remaining(),
            )
            async for response in responses:
                yield response

    @handle_rpc_errors(stage=STAGE)
    async def StreamingSynthesize(
        self,
        request_iterator: AsyncIterator[tts_pb2.StreamingSynthesizeRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[tts_pb2.SynthesizeResponse]:
        received = time.monotonic()
        messages = aiter(request_iterator)
        config = await read_config(messages)
        request_id = resolve_request_id(config.request_id, context)
        with request_context(request_id):
            responses = self.gateway.streamed.synthesize(
                config,
                messages,
                request_id,
                caller=self.caller(context),
                received=received,
                time_remaining=context.time_remaining(),
            )
            async for response in responses:
                yield response

    @handle_rpc_errors(stage=STAGE)
    async def ListVoices(
        self, request: tts_pb2.ListVoicesRequest, context: grpc.aio.ServicerContext
    ) -> tts_pb2.ListVoicesResponse:
        with request_context(resolve_request_id("", context)):
            return await self.gateway.voices.list_voices(request, self.caller(context))

    @handle_rpc_errors(stage=STAGE)
    async def GetModelInfo(
        self, request: tts_pb2.GetModelInfoRequest, context: grpc.aio.ServicerContext
    ) -> tts_pb2.ModelInfo:
        with request_context(resolve_request_id("", context)):
            return await self.gateway.catalog.model_info(request.model)

    @handle_rpc_errors(stage=STAGE)
    async def ListModels(
        self, request: tts_pb2.ListModelsRequest, context: grpc.aio.ServicerContext
    ) -> tts_pb2.ListModelsResponse:
        with request_context(resolve_request_id("", context)):
            return await self.gateway.catalog.list_models()

    @handle_rpc_errors(stage=STAGE)
    async def RegisterVoice(
        self, request: tts_pb2.RegisterVoiceRequest, context: grpc.aio.ServicerContext
    ) -> tts_pb2.Voice:
        request_id = resolve_request_id("", context)
        with request_context(request_id):
            return await self.gateway.voices.register(
                request, self.caller(context), request_id, context.time_remaining()
            )

    @handle_rpc_errors(stage=STAGE)
    async def DeleteVoice(
        self, request: tts_pb2.DeleteVoiceRequest, context: grpc.aio.ServicerContext
    ) -> tts_pb2.DeleteVoiceResponse:
        with request_context(resolve_request_id("", context)):
            await self.gateway.voices.delete(request.voice_id, self.caller(context))
            return tts_pb2.DeleteVoiceResponse()

    @handle_rpc_errors(stage=STAGE)
    async def GetVoice(
        self, request: tts_pb2.GetVoiceRequest, context: grpc.aio.ServicerContext
    ) -> tts_pb2.Voice:
        with request_context(resolve_request_id("", context)):
            return await self.gateway.voices.get(request.voice_id, self.caller(context))

    @handle_rpc_errors(stage=STAGE)
    async def UpdateVoice(
        self, request: tts_pb2.UpdateVoiceRequest, context: grpc.aio.ServicerContext
    ) -> tts_pb2.Voice:
        with request_context(resolve_request_id("", context)):
            return await self.gateway.voices.update(request, self.caller(context))

    @handle_rpc_errors(stage=STAGE)
    async def ExportVoice(
        self, request: tts_pb2.ExportVoiceRequest, context: grpc.aio.ServicerContext
    ) -> tts_pb2.ExportVoiceResponse:
        with request_context(resolve_request_id("", context)):
            document = await self.gateway.voices.export(request.voice_id, self.caller(context))
            return tts_pb2.ExportVoiceResponse(document=json.dumps(document, ensure_ascii=False))

    @handle_rpc_errors(stage=STAGE)
    async def ImportVoice(
        self, request: tts_pb2.ImportVoiceRequest, context: grpc.aio.ServicerContext
    ) -> tts_pb2.Voice:
        with request_context(resolve_request_id("", context)):
            voices = self.gateway.voices
            return await voices.import_document(voices.parse_document(request.document), self.caller(context))


# ---------------------------------------------------------------------------------------------
# Server assembly


def server_credentials(config: GatewayConfig) -> grpc.ServerCredentials | None:
    """TLS credentials for the public port, or None for plaintext."""
    if not config.tls_cert or not config.tls_key:
        return None
    with open(config.tls_cert, "rb") as fh:
        cert = fh.read()
    with open(config.tls_key, "rb") as fh:
        key = fh.read()
    client_ca = None
    if config.tls_client_ca:
        with open(config.tls_client_ca, "rb") as fh:
            client_ca = fh.read()
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=client_ca, require_client_auth=client_ca is not None
    )


def server_setup(
    servicer: GatewayServicer, config: GatewayConfig
) -> tuple[Callable[[grpc.aio.Server], None], dict[str, Any]]:
    """``add_servicers`` and the extra ``build_server`` keyword arguments (API-key
    interceptor, TLS) for :func:`tts_common.serving.serve` / ``build_server``."""
    kwargs: dict[str, Any] = {}
    if config.api_keys:
        kwargs["interceptors"] = [ApiKeyInterceptor(config.api_keys, stage=STAGE)]
    credentials = server_credentials(config)
    if credentials is not None:
        kwargs["credentials"] = credentials

    def add_servicers(server: grpc.aio.Server) -> None:
        # Not tts_pb2_grpc's registration: requests that do not parse are INVALID_ARGUMENT.
        add_servicer(server, tts_pb2.DESCRIPTOR.services_by_name["TextToSpeech"], servicer, STAGE)

    return add_servicers, kwargs


def build_gateway_server(
    server_config: ServerConfig, servicer: GatewayServicer, config: GatewayConfig, **build_kwargs: Any
) -> tuple[grpc.aio.Server, Any]:
    """:func:`tts_common.serving.build_server` for the gateway (tests and embedding)."""
    add_servicers, kwargs = server_setup(servicer, config)
    return build_server(server_config, add_servicers, [SERVICE_NAME], **kwargs, **build_kwargs)


__all__ = ["GatewayServicer", "SERVICE_NAME", "build_gateway_server", "server_credentials", "server_setup"]
