"""The OpenAI-compatible HTTP API and the browser playground: a FastAPI app over the gateway's
transport-free core (:class:`gateway.core.Gateway`), so model choice, validation, admission,
voices and metrics are the gRPC API's own.

Routes (``/v1`` needs the API key when keys are configured, and answers 503 while the process is
not serving: starting up or shutting down):

* ``POST /v1/audio/speech`` — OpenAI's speech body (+ our fields as ``extra_body``); ``model``
  names a served model (absent or "": the default; unknown: 404 listing them); the audio
  streamed in the requested format, or OpenAI's server-sent events (``stream_format: "sse"``);
* ``GET /v1/models`` and ``GET /v1/models/{id}`` — every served model with its type, size and
  capabilities;
* ``GET /v1/audio/voices?model=NAME`` — a model's preset speakers, the registered voices it can
  speak and the aliases, with its languages and capabilities (the default model without
  ``model``);
* ``POST /v1/audio/voices`` — register a voice (multipart form): cloned from an upload
  (``audio_sample``, ``name``, ``ref_text`` or ``x_vector_only``) or designed ("Voice Design,
  then Clone": ``instructions`` and ``text``, optional ``language``, ``seed`` and
  ``design_model``), embedded by the Base model ``model`` (default: the first that can clone);
  ``DELETE /v1/audio/voices/{id}``;
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
from fastapi import APIRouter, Depends, FastAPI, File, Form, Query, Request, UploadFile, WebSocket
from fastapi.responses import HTMLResponse, JSONResponse
from google.protobuf.json_format import MessageToDict

from tts_common.errors import InvalidRequestError
from tts_common.logging_setup import request_context
from tts_common.pb.qwen3tts.v1 import tts_pb2
from tts_common.serving.health import ServingHealth

from ...config import GatewayConfig
from ...core import Gateway
from ..auth import ApiKeys
from .connection import check_ready, request_id_of
from .errors import count, install_error_handlers
from .formats import RESPONSE_FORMATS, SSE_MEDIA_TYPE
from .limits import BodySizeLimit
from .schemas import SpeechRequest
from .speech import speech_request
from .streaming import SynthesisResponse, audio_bytes, sse_events
from .websocket import STREAM_PATH, SpeechStream

logger = logging.getLogger(__name__)

VOICES_PATH = "/v1/audio/voices"
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
        self.health: ServingHealth | None = None
        """Set when the server starts (None: always ready, for embedding in tests)."""

    # --- dependencies of the /v1 routes ---------------------------------------------------------
    def check_ready(self) -> None:
        """UNAVAILABLE (503) unless the process is serving."""
        check_ready(self.health)

    def check_key(self, request: Request) -> None:
        """UNAUTHENTICATED (401) / PERMISSION_DENIED (403) unless the request carries a key."""
        if self.keys is not None:
            self.keys.authenticate(request.headers.items(), "header")

    # --- routes ---------------------------------------------------------------------------------
    async def speech(self, body: Any, request: Request) -> SynthesisResponse:
        received = time.monotonic()
        request_id = request_id_of(request, body.request_id)
        where = f"POST /v1/audio/speech [{request_id}]"
        with request_context(request_id):
            message = await speech_request(body, request_id, self.gateway, self.aliases)
            responses = self.gateway.unary.synthesize(
                message, request_id, received=received, speed=body.speed
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
                sse_events(responses, where), responses, media_type=SSE_MEDIA_TYPE, headers=headers
            )
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

    async def list_voices(self, model: str) -> dict[str, Any]:
        listing = await self.gateway.voices.list_voices(model)
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
            "model": listing.model,
            "model_type": listing.model_type,
            "model_size": listing.model_size,
            "languages": list(listing.languages),
            "instruct_supported": listing.instruct_supported,
            "voice_clone_supported": listing.voice_clone_supported,
            "sample_rate": listing.sample_rate,
        }

    async def register_voice(self, request: Request, form: VoiceForm) -> dict[str, Any]:
        request_id = request_id_of(request)
        with request_context(request_id):
            message = await form.request()
            voice = await self.gateway.voices.register(message, request_id, None)
        count_ok()
        return voice_object(voice)

    async def delete_voice(self, voice_id: str) -> dict[str, Any]:
        await self.gateway.voices.delete(voice_id)
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
        },
        "model_info": MessageToDict(info, preserving_proto_field_name=True),
    }


def voice_object(voice: tts_pb2.Voice) -> dict[str, Any]:
    """A registered voice as OpenAI's voice object, plus its cloning details."""
    data: dict[str, Any] = {
        "id": voice.voice_id,
        "object": "audio.voice",
        "type": "audio_sample",
        "name": voice.name,
        "created_at": voice.created_at.seconds,
        "x_vector_only": voice.x_vector_only,
        "ref_text": voice.ref_text,
        "ref_audio_seconds": voice.ref_audio_seconds,
        "model": voice.model,
        "family": voice.family,
    }
    if voice.HasField("design"):
        data["type"] = "designed"
        data["design"] = {
            "instructions": voice.design.instruct,
            "text": voice.design.text,
            "language": voice.design.language,
            "seed": voice.design.seed,
            "model": voice.design.model,
        }
    return data


class VoiceForm:
    """The multipart form of ``POST /v1/audio/voices``: a reference upload or a design."""

    def __init__(
        self,
        audio_sample: Annotated[
            UploadFile | None, File(description="Reference recording (any audio file); or design a voice.")
        ] = None,
        name: Annotated[str, Form()] = "",
        ref_text: Annotated[str, Form(description="Transcript of the recording.")] = "",
        x_vector_only: Annotated[bool, Form()] = False,
        model: Annotated[
            str, Form(description="The Base model that clones the voice (default: the first that can).")
        ] = "",
        instructions: Annotated[str, Form(description="Design: the voice, described.")] = "",
        text: Annotated[str, Form(description="Design: what the voice says in its reference.")] = "",
        language: Annotated[str, Form(description="Design: the language of `text`.")] = "",
        seed: Annotated[int | None, Form(ge=0, le=2**64 - 1, description="Design: sampling seed.")] = None,
        design_model: Annotated[
            str, Form(description="Design: the VoiceDesign model (default: the first served).")
        ] = "",
        consent: Annotated[str, Form(description="Accepted for OpenAI SDK compatibility; unused.")] = "",
    ) -> None:
        self.audio_sample = audio_sample
        self.name, self.ref_text, self.x_vector_only, self.model = name, ref_text, x_vector_only, model
        self.design = tts_pb2.VoiceDesign(
            instruct=instructions, text=text, language=language, model=design_model
        )
        if seed is not None:
            self.design.seed = seed

    async def request(self) -> tts_pb2.RegisterVoiceRequest:
        """The RegisterVoice request of the form (INVALID_ARGUMENT for neither or both sources)."""
        message = tts_pb2.RegisterVoiceRequest(name=self.name, model=self.model)
        designing = bool(self.design.ListFields())
        if self.audio_sample is not None and designing:
            raise InvalidRequestError(
                "send either audio_sample (a voice cloned from a recording) or a design (instructions, text, "
                "language, seed, design_model), not both"
            )
        if self.audio_sample is not None:
            message.reference.CopyFrom(
                tts_pb2.VoiceClone(
                    ref_audio=await self.audio_sample.read(),
                    ref_text=self.ref_text,
                    x_vector_only=self.x_vector_only,
                )
            )
        elif designing:
            message.design.CopyFrom(self.design)
        else:
            raise InvalidRequestError(
                "audio_sample (a recording to clone) or a design (instructions and text) is required"
            )
        return message


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
    async def list_voices(
        model: Annotated[
            str, Query(description="The model whose voices to list (default: the default model).")
        ] = "",
    ) -> dict[str, Any]:
        return await api.list_voices(model)

    @v1.post("/audio/voices")
    async def create_voice(request: Request, form: Annotated[VoiceForm, Depends()]) -> dict[str, Any]:
        return await api.register_voice(request, form)

    @v1.delete("/audio/voices/{voice_id}")
    async def delete_voice(voice_id: str) -> dict[str, Any]:
        return await api.delete_voice(voice_id)

    app.include_router(v1)

    @app.websocket(STREAM_PATH)
    async def speech_stream(websocket: WebSocket) -> None:
        # Readiness and the API key are checked on the connection (errors as close codes).
        await SpeechStream(websocket, api.gateway, api.aliases, api.keys, api.health).run()

    page = playground_html()

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def playground() -> HTMLResponse:
        return HTMLResponse(page, headers={"cache-control": "no-cache"})

    @app.get("/health")
    async def health() -> JSONResponse:
        return api.health_response()

    return app


__all__ = ["HttpApi", "VoiceForm", "create_app", "model_object", "playground_html", "voice_object"]
