"""The OpenAI-compatible HTTP API and the browser playground: a FastAPI app over the gateway's
transport-free core (:class:`gateway.core.Gateway`), so model choice, validation, admission,
voices and metrics are the gRPC API's own.

Before any route: a request framed with both ``Content-Length`` and ``Transfer-Encoding`` is 400,
an oversized head 431 (:class:`.limits.RequestFraming`); then ``/v1`` needs the API key when keys
are configured and answers 503 while the process is not serving (starting up or shutting down),
both decided from the headers before the body is read (:class:`.access.AccessGate`); then the
body's size (413). ``/openapi.json`` describes every route as it behaves (:mod:`.openapi`).

Routes:

* ``POST /v1/audio/speech`` — OpenAI's speech body (+ our fields as ``extra_body``); ``model``
  names a served model (absent or "": the default; unknown: 404 listing them); the audio
  streamed in the requested format, or OpenAI's server-sent events (``stream_format: "sse"``),
  or one JSON body with the audio in base64, its timestamps and the summary
  (``stream_format: "json"``: for clients that want the audio and the word timings at once);
  ``timestamps`` need one of the last two (400 with the plain audio body);
* ``GET /v1/models`` and ``GET /v1/models/{id}`` — every served model with its type, size and
  capabilities;
* ``/v1/audio/voices`` — list, register, read, change, export, import and delete voices
  (:mod:`.voices`);
* ``GET /health`` — readiness: 200 while serving, else 503, also while no talker or no decoder
  replica is reachable (like the gRPC service's health; load-balancer and container probes; no
  key);
* ``GET /docs`` — Swagger UI over ``/openapi.json``, its files served from here
  (``/docs/assets``: no CDN, so it renders air-gapped; no key);
* ``GET /`` — the playground page (static, shipped with the package; no key needed for the page,
  it sends the key it is given).

* ``WebSocket /v1/audio/speech/stream`` — text in as it is written, audio out as it is spoken
  (StreamingSynthesize; :mod:`.websocket`); the playground's "type as you speak" mode uses it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from importlib import resources
from typing import Any

import grpc
from fastapi import APIRouter, FastAPI, Request, WebSocket
from fastapi.requests import HTTPConnection
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi_offline import FastAPIOffline
from google.protobuf.json_format import MessageToDict

from tts_common.logging_setup import request_context
from tts_common.pb.qwen3tts.v1 import tts_pb2
from tts_common.serving.health import ServingHealth

from ...config import GatewayConfig
from ...core import Gateway
from ...voice_library import Caller
from ..auth import ApiKeys, Callers
from .access import AccessGate
from .connection import check_ready, request_id_of
from .errors import count, error_responses, install_error_handlers
from .formats import RESPONSE_FORMATS, SSE_MEDIA_TYPE
from .limits import BodySizeLimit, RequestFraming
from .openapi import install_openapi, speech_responses
from .schemas import SpeechRequest, check_speech_body
from .speech import speech_request
from .streaming import SynthesisResponse, audio_bytes, json_body, sse_events
from .voices import VOICES_PATH, voices_router
from .websocket import STREAM_PATH, SpeechStream

logger = logging.getLogger(__name__)

OWNED_BY = "qwen3-tts"


def playground_html() -> str:
    """The playground page (package data)."""
    return resources.files(__package__).joinpath("static/playground.html").read_text(encoding="utf-8")


class HttpApi:
    """The routes' shared state: the core, the settings and the process's health."""

    def __init__(self, gateway: Gateway, config: GatewayConfig) -> None:
        self.gateway = gateway
        self.config = config
        self.aliases: Mapping[str, str] = dict(config.voice_alias)
        self.keys = ApiKeys(config.api_keys) if config.api_keys else None
        self.callers = Callers(config.api_keys, config.voices_admin_keys)
        self.health: ServingHealth | None = None
        """Set when the server starts (None: always ready, for embedding in tests)."""

    # --- the gate of the /v1 routes (:class:`.access.AccessGate`: before the body is read) -----
    def check_access(self, connection: HTTPConnection) -> None:
        """UNAVAILABLE (503) unless the process is serving; then UNAUTHENTICATED (401) /
        PERMISSION_DENIED (403) unless the request carries a valid key."""
        check_ready(self.health)
        if self.keys is not None:
            self.keys.authenticate(connection.headers.items(), "header")

    def caller(self, request: Request) -> Caller:
        """Whose request it is (its API key, accepted by :meth:`check_access`)."""
        return self.callers.of(request.headers.items())

    # --- routes ---------------------------------------------------------------------------------
    async def speech(self, body: Any, request: Request) -> Response:
        received = time.monotonic()
        check_speech_body(body)
        request_id = request_id_of(request, body.request_id)
        where = f"POST /v1/audio/speech [{request_id}]"
        with request_context(request_id):
            message = await speech_request(body, request_id, self.gateway, self.aliases)
            responses = self.gateway.unary.synthesize(
                message, request_id, caller=self.caller(request), received=received, speed=body.speed
            )
            first = await anext(responses)  # validated, admitted, stages started: or an error
        metadata = first.metadata
        headers = {
            "x-request-id": request_id,
            "x-sample-rate": str(metadata.sample_rate),
            "x-seed": str(metadata.sampling.seed),
            "x-model": metadata.model_name,
            "cache-control": "no-store",
        }
        if body.stream_format == "sse":
            return SynthesisResponse(
                sse_events(responses, where, metadata.sample_rate),
                responses,
                media_type=SSE_MEDIA_TYPE,
                headers=headers,
            )
        if body.stream_format == "json":
            try:
                with request_context(request_id):
                    content = await json_body(responses, metadata, body.timestamps)
            finally:
                await responses.aclose()  # type: ignore[attr-defined]
            count_ok()
            return JSONResponse(content, headers=headers)
        media_type = RESPONSE_FORMATS[body.response_format].media_type
        return SynthesisResponse(
            audio_bytes(responses, where), responses, media_type=media_type, headers=headers
        )

    async def models(self) -> dict[str, Any]:
        listing = await self.gateway.catalog.list_models()
        count_ok()
        return {"object": "list", "data": [model_object(info) for info in listing.models]}

    async def model(self, model_id: str) -> dict[str, Any]:
        model = model_object(await self.gateway.catalog.model_info(model_id))
        count_ok()
        return model

    def health_response(self) -> JSONResponse:
        # Readiness, as the gRPC service's status: the k8s readiness probe and the Compose
        # healthcheck use this, so it also fails while a stage the gateway needs is unreachable.
        health = self.health
        if health is None or health.services_ready:
            return JSONResponse({"status": "serving"})
        if health.shutting_down:
            return JSONResponse({"status": "shutting_down"}, status_code=503)
        body: dict[str, Any] = {"status": "not_serving"}
        if health.ready:
            body["unavailable"] = list(health.unmet_dependencies)
        return JSONResponse(body, status_code=503)


def count_ok() -> None:
    """Count a request answered successfully (streams count themselves when they end)."""
    count(grpc.StatusCode.OK)


def model_object(info: tts_pb2.ModelInfo) -> dict[str, Any]:
    """A served model as OpenAI's model object, plus its type, size and capabilities."""
    return {
        "id": info.model_name,
        "object": "model",
        "created": 0,
        "owned_by": OWNED_BY,
        "type": info.model_type,
        "size": info.model_size,
        "default": info.is_default,
        "capabilities": {
            "preset_speakers": bool(info.speakers),
            "voice_design": info.model_type == "voice_design",
            "voice_clone": info.voice_clone_supported,
            "instructions": info.instruct_supported,
            "voice_family": info.voice_family,
            "timestamps": info.timestamps_supported,
        },
        "model_info": MessageToDict(info, preserving_proto_field_name=True),
    }


DOCS_ASSETS_PATH = "/docs/assets"
"""Where Swagger UI's files (shipped by the ``fastapi-offline`` package) are served for /docs."""


def create_app(api: HttpApi) -> FastAPI:
    """The FastAPI application of ``api`` (see the module doc)."""
    # FastAPIOffline: a FastAPI whose /docs (FastAPI's Swagger UI page) loads Swagger UI's script,
    # style sheet and icon from this server (DOCS_ASSETS_PATH), not a CDN: it works air-gapped.
    app = FastAPIOffline(
        title="qwen3-tts OpenAI-compatible API",
        version="1",
        description="OpenAI's speech API (plus our fields) over Qwen3-TTS, and a voice library. "
        "Every error is OpenAI's error object. Where API keys are configured, /v1 needs "
        "`authorization: Bearer KEY` or `x-api-key: KEY`, checked before the body is read. "
        "Not described here (OpenAPI has no WebSockets): `WebSocket /v1/audio/speech/stream`, text "
        "in as it is written and audio out as it is spoken (the key as a handshake header, or "
        '`api_key` in the first `{"type": "config"}` message, due within --websocket-config-timeout-seconds, default 10 s).',
        docs_url="/docs",
        redoc_url=None,
        static_url=DOCS_ASSETS_PATH,
    )
    app.state.api = api
    install_error_handlers(app)
    install_openapi(app, keys=api.keys is not None)
    config = api.config
    app.add_middleware(
        BodySizeLimit,
        default_limit=config.http_max_body_bytes,
        limits={("POST", VOICES_PATH): config.http_max_body_bytes + config.max_ref_audio_bytes},
    )
    # Outside in: the request's framing and head, readiness and the key, then the body's size.
    app.add_middleware(AccessGate, check=api.check_access)
    app.add_middleware(
        RequestFraming, max_headers=config.http_max_headers, max_head_bytes=config.http_max_header_bytes
    )
    v1 = APIRouter(prefix="/v1", responses=error_responses())

    # status_code: FastAPI cannot read it off SynthesisResponse (its __init__ has none).
    @v1.post("/audio/speech", response_class=SynthesisResponse, status_code=200, responses=speech_responses())
    async def create_speech(body: SpeechRequest, request: Request) -> Response:  # type: ignore[valid-type]
        return await api.speech(body, request)

    @v1.get("/models")
    async def list_models() -> dict[str, Any]:
        return await api.models()

    @v1.get("/models/{model_id}")
    async def retrieve_model(model_id: str) -> dict[str, Any]:
        return await api.model(model_id)

    v1.include_router(voices_router(api.gateway, api.aliases, api.caller))
    app.include_router(v1)

    @app.websocket(STREAM_PATH)
    async def speech_stream(websocket: WebSocket) -> None:
        # Readiness and the API key are checked on the connection (errors as close codes).
        await SpeechStream(
            websocket,
            api.gateway,
            api.aliases,
            api.keys,
            api.health,
            api.callers,
            config_timeout=config.websocket_config_timeout_seconds,
        ).run()

    page = playground_html()

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def playground() -> HTMLResponse:
        return HTMLResponse(page, headers={"cache-control": "no-cache"})

    @app.get("/health", responses={503: {"description": "Not serving (starting, stopping, a stage down)."}})
    async def health() -> JSONResponse:
        return api.health_response()

    return app


__all__ = ["HttpApi", "create_app", "model_object", "playground_html"]
