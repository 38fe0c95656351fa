"""The OpenAI-compatible HTTP API and the browser playground: a FastAPI app over the gateway's
transport-free core (:class:`gateway.service.SynthesisService`), so validation, admission,
voices and metrics are the gRPC API's own.

Routes (``/v1`` needs the API key when keys are configured, and answers 503 while the process is
not serving: starting up or shutting down):

* ``POST /v1/audio/speech`` — OpenAI's speech body (+ our fields as ``extra_body``); the audio
  streamed in the requested format, or OpenAI's server-sent events (``stream_format: "sse"``);
* ``GET /v1/models`` and ``GET /v1/models/{id}`` — the served model;
* ``GET /v1/audio/voices`` — preset speakers, registered voices and aliases, with the model's
  languages and capabilities;
* ``POST /v1/audio/voices`` — register a cloned voice (Base models) from a multipart upload
  (``audio_sample``, ``name``, ``ref_text`` or ``x_vector_only``), ``DELETE
  /v1/audio/voices/{id}``;
* ``GET /health`` — readiness: 200 while serving, else 503, also while no talker or no decoder
  replica is reachable (like the gRPC service's health; load-balancer and container probes; no
  key);
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
from typing import Annotated, Any

import grpc
from fastapi import APIRouter, Depends, FastAPI, File, Form, Request, UploadFile, WebSocket
from fastapi.requests import HTTPConnection
from fastapi.responses import HTMLResponse, JSONResponse
from google.protobuf.json_format import MessageToDict

from tts_common.errors import NotFoundError, UnavailableError
from tts_common.logging_setup import request_context
from tts_common.pb.qwen3tts.v1 import tts_pb2
from tts_common.serving.health import ServingHealth
from tts_common.serving.request_ids import resolve_request_id

from ..auth import ApiKeys
from ..config import GatewayConfig
from ..service import SynthesisService
from .errors import count, install_error_handlers
from .formats import RESPONSE_FORMATS, SSE_MEDIA_TYPE
from .limits import BodySizeLimit
from .schemas import SpeechRequest
from .speech import synthesize_request
from .streaming import SynthesisResponse, audio_bytes, sse_events
from .websocket import STREAM_PATH, SpeechStream

logger = logging.getLogger(__name__)

VOICES_PATH = "/v1/audio/voices"
OWNED_BY = "qwen3-tts"


def playground_html() -> str:
    """The playground page (package data)."""
    return resources.files(__package__).joinpath("static/playground.html").read_text(encoding="utf-8")


class HttpApi:
    """The routes' shared state: the service, the settings and the process's health."""

    def __init__(self, service: SynthesisService, config: GatewayConfig) -> None:
        self.service = service
        self.config = config
        self.aliases: Mapping[str, str] = dict(config.voice_alias)
        self.keys = ApiKeys(config.api_keys) if config.api_keys else None
        self.health: ServingHealth | None = None
        """Set when the server starts (None: always ready, for embedding in tests)."""

    # --- dependencies of the /v1 routes ---------------------------------------------------------
    def check_ready(self) -> None:
        """UNAVAILABLE (503) unless the process is serving."""
        reason = None if self.health is None else self.health.refusal_reason()
        if reason is not None:
            raise UnavailableError(reason)

    def check_key(self, request: Request) -> None:
        """UNAUTHENTICATED (401) / PERMISSION_DENIED (403) unless the request carries a key."""
        if self.keys is not None:
            self.keys.authenticate(request.headers.items(), "header")

    def request_id(self, connection: HTTPConnection, explicit: str = "") -> str:
        """The request's id: ``explicit``, else the ``x-request-id`` header, else a new one."""
        return resolve_request_id(explicit, metadata=connection.headers.items(), where="header")

    # --- routes ---------------------------------------------------------------------------------
    async def speech(self, body: Any, request: Request) -> SynthesisResponse:
        received = time.monotonic()
        request_id = self.request_id(request, body.request_id)
        where = f"POST /v1/audio/speech [{request_id}]"
        with request_context(request_id):
            info = await self.service.public_model_info()
            message = synthesize_request(body, request_id, info, self.service.voices, self.aliases)
            responses = self.service.synthesize(message, request_id, received=received, speed=body.speed)
            first = await anext(responses)  # validated, admitted, stages started: or an error
        metadata = first.metadata
        headers = {
            "x-request-id": request_id,
            "x-sample-rate": str(metadata.sample_rate),
            "x-seed": str(metadata.sampling.seed),
            "cache-control": "no-store",
        }
        if body.stream_format == "sse":
            return SynthesisResponse(
                sse_events(responses, where), responses, media_type=SSE_MEDIA_TYPE, headers=headers
            )
        media_type = RESPONSE_FORMATS[body.response_format].media_type
        return SynthesisResponse(
            audio_bytes(responses, where), responses, media_type=media_type, headers=headers
        )

    async def models(self) -> dict[str, Any]:
        listing = {"object": "list", "data": [await self._model_object()]}
        count_ok()
        return listing

    async def model(self, model_id: str) -> dict[str, Any]:
        model = await self._model_object()
        if model_id != model["id"]:
            raise NotFoundError(f"unknown model {model_id!r} (this server serves {model['id']!r})")
        count_ok()
        return model

    async def _model_object(self) -> dict[str, Any]:
        info = await self.service.public_model_info()
        return {
            "id": info.model_name,
            "object": "model",
            "created": 0,
            "owned_by": OWNED_BY,
            "model_info": MessageToDict(info, preserving_proto_field_name=True),
        }

    async def list_voices(self) -> dict[str, Any]:
        listing = await self.service.list_voices()
        data: list[dict[str, Any]] = [
            {"id": s.name, "object": "audio.voice", "type": "preset", "name": s.name, "dialect": s.dialect}
            for s in listing.speakers
        ]
        data += [voice_object(v) for v in listing.voices]
        data += [
            {"id": alias, "object": "audio.voice", "type": "alias", "name": alias, "target": target}
            for alias, target in sorted(self.aliases.items())
        ]
        count_ok()
        return {
            "object": "list",
            "data": data,
            "model_type": listing.model_type,
            "model_size": listing.model_size,
            "languages": list(listing.languages),
            "instruct_supported": listing.instruct_supported,
            "voice_clone_supported": listing.voice_clone_supported,
            "sample_rate": listing.sample_rate,
        }

    async def register_voice(
        self,
        request: Request,
        audio_sample: UploadFile,
        name: str,
        ref_text: str,
        x_vector_only: bool,
    ) -> dict[str, Any]:
        request_id = self.request_id(request)
        with request_context(request_id):
            message = tts_pb2.RegisterVoiceRequest(
                name=name,
                reference=tts_pb2.VoiceClone(
                    ref_audio=await audio_sample.read(), ref_text=ref_text, x_vector_only=x_vector_only
                ),
            )
            voice = await self.service.register_voice(message, request_id, None)
        count_ok()
        return voice_object(voice)

    async def delete_voice(self, voice_id: str) -> dict[str, Any]:
        await self.service.delete_voice(voice_id)
        count_ok()
        return {"id": voice_id, "object": "audio.voice.deleted", "deleted": True}

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


def voice_object(voice: tts_pb2.Voice) -> dict[str, Any]:
    """A registered voice as OpenAI's voice object, plus its cloning details."""
    return {
        "id": voice.voice_id,
        "object": "audio.voice",
        "type": "audio_sample",
        "name": voice.name,
        "created_at": voice.created_at.seconds,
        "x_vector_only": voice.x_vector_only,
        "ref_text": voice.ref_text,
        "ref_audio_seconds": voice.ref_audio_seconds,
    }


def create_app(api: HttpApi) -> FastAPI:
    """The FastAPI application of ``api`` (see the module doc)."""
    app = FastAPI(
        title="qwen3-tts OpenAI-compatible API",
        version="1",
        docs_url="/docs",
        redoc_url=None,
    )
    app.state.api = api
    install_error_handlers(app)
    config = api.config
    app.add_middleware(
        BodySizeLimit,
        default_limit=config.http_max_body_bytes,
        limits={("POST", VOICES_PATH): config.http_max_body_bytes + config.max_ref_audio_bytes},
    )
    v1 = APIRouter(prefix="/v1", dependencies=[Depends(api.check_ready), Depends(api.check_key)])

    @v1.post("/audio/speech", response_class=SynthesisResponse)
    async def create_speech(body: SpeechRequest, request: Request) -> SynthesisResponse:  # type: ignore[valid-type]
        return await api.speech(body, request)

    @v1.get("/models")
    async def list_models() -> dict[str, Any]:
        return await api.models()

    @v1.get("/models/{model_id}")
    async def retrieve_model(model_id: str) -> dict[str, Any]:
        return await api.model(model_id)

    @v1.get("/audio/voices")
    async def list_voices() -> dict[str, Any]:
        return await api.list_voices()

    @v1.post("/audio/voices")
    async def create_voice(
        request: Request,
        audio_sample: Annotated[UploadFile, File(description="Reference recording (any audio file).")],
        name: Annotated[str, Form()] = "",
        ref_text: Annotated[str, Form(description="Transcript of the recording.")] = "",
        x_vector_only: Annotated[bool, Form()] = False,
        consent: Annotated[str, Form(description="Accepted for OpenAI SDK compatibility; unused.")] = "",
    ) -> dict[str, Any]:
        return await api.register_voice(request, audio_sample, name, ref_text, x_vector_only)

    @v1.delete("/audio/voices/{voice_id}")
    async def delete_voice(voice_id: str) -> dict[str, Any]:
        return await api.delete_voice(voice_id)

    app.include_router(v1)

    @app.websocket(STREAM_PATH)
    async def speech_stream(websocket: WebSocket) -> None:
        # Readiness and the API key are checked on the connection (errors as close codes).
        await SpeechStream(api, websocket).run()

    page = playground_html()

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def playground() -> HTMLResponse:
        return HTMLResponse(page, headers={"cache-control": "no-cache"})

    @app.get("/health")
    async def health() -> JSONResponse:
        return api.health_response()

    return app


__all__ = ["HttpApi", "create_app", "playground_html", "voice_object"]
