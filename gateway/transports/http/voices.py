"""The voice routes of the HTTP API (an ``APIRouter`` the app mounts under ``/v1``), over the
core's :class:`~gateway.core.voices.VoiceService`, so ownership, limits, families and errors are
the gRPC API's own:

* ``GET /v1/audio/voices?model=NAME`` — a model's preset speakers, the caller's registered voices
  it can speak (a page: ``page_size``, ``page_token``; ``all_families`` for every family) and the
  aliases, with the model's languages and capabilities (the default model without ``model``);
* ``POST /v1/audio/voices`` — register a voice (multipart form): cloned from an upload
  (``audio_sample``, ``name``, ``ref_text`` or ``x_vector_only``) or designed ("Voice Design,
  then Clone": ``instructions`` and ``text``, optional ``language``, ``seed`` and
  ``design_model``), embedded by the Base model ``model`` (default: the first that can clone),
  with optional ``description``, ``labels`` (a JSON object) and ``consent``;
* ``GET``, ``PATCH`` (JSON: ``name``, ``description``, ``labels``) and ``DELETE
  /v1/audio/voices/{id}``;
* ``GET /v1/audio/voices/{id}/export`` — the voice's versioned document;
  ``POST /v1/audio/voices/import`` — store a document's voice for the caller.

With API keys a voice belongs to the key that registered it: another key gets 404 for it and
does not list it; admin keys see every voice. Errors are OpenAI error objects (the app's
handlers); a voice database that is down is 503 with ``Retry-After``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal

import grpc
from fastapi import APIRouter, Depends, File, Form, Query, Request, UploadFile
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from tts_common.errors import InvalidRequestError
from tts_common.logging_setup import request_context
from tts_common.pb.qwen3tts.v1 import tts_pb2

from ...core import Gateway
from ...voice_library import DOCUMENT_FORMAT, DOCUMENT_VERSION, Caller
from ...voice_library.library import MAX_PAGE_SIZE
from .connection import request_id_of
from .errors import count
from .forms import Utf8FormRoute
from .schemas import ApiBody

VOICES_PATH = "/v1/audio/voices"


# --- response bodies -------------------------------------------------------------------------
class VoiceDesignObject(BaseModel):
    """How a designed voice was made."""

    instructions: str
    text: str
    language: str
    seed: int
    model: str = Field(description="The VoiceDesign model that spoke the reference.")


class RegisteredVoice(BaseModel):
    """A registered voice: OpenAI's voice object plus its cloning details and metadata."""

    id: str
    object: Literal["audio.voice"] = "audio.voice"
    type: Literal["audio_sample", "designed"]
    name: str
    created_at: int = Field(description="Unix time, seconds.")
    updated_at: int = Field(description="Unix time of the last change of its metadata, seconds.")
    description: str
    labels: dict[str, str]
    consent: str = Field(description="The consent text or id recorded at registration.")
    owner: str = Field(description='Keyed digest of the API key that registered it ("" without keys).')
    x_vector_only: bool
    ref_text: str
    ref_audio_seconds: float
    model: str = Field(description="The model that embedded it.")
    family: str = Field(description="Its model family: the models of this family speak it.")
    design: VoiceDesignObject | None = None


class PresetVoice(BaseModel):
    """A preset speaker of the model."""

    id: str
    object: Literal["audio.voice"] = "audio.voice"
    type: Literal["preset"] = "preset"
    name: str
    dialect: str


class AliasVoice(BaseModel):
    """A ``--voice-alias`` name."""

    id: str
    object: Literal["audio.voice"] = "audio.voice"
    type: Literal["alias"] = "alias"
    name: str
    target: str


class VoiceList(BaseModel):
    """What ``GET /v1/audio/voices`` answers."""

    object: Literal["list"] = "list"
    data: list[Annotated[PresetVoice | RegisteredVoice | AliasVoice, Field(discriminator="type")]]
    next_page_token: str = Field(
        description='Pass as page_token for the next page of registered voices; "" at the end.'
    )
    model: str
    model_type: str
    model_size: str
    languages: list[str]
    instruct_supported: bool
    voice_clone_supported: bool
    sample_rate: int


class VoiceDeleted(BaseModel):
    id: str
    object: Literal["audio.voice.deleted"] = "audio.voice.deleted"
    deleted: bool = True


# --- request bodies --------------------------------------------------------------------------
class VoicePatchBody(ApiBody):
    """``PATCH /v1/audio/voices/{id}``: the fields to change (absent or null: unchanged)."""

    model_config = ConfigDict(extra="forbid")
    name: str | None = None
    description: str | None = None
    labels: dict[str, str] | None = Field(None, description="Replaces every label ({} removes them all).")


class RefCodesObject(ApiBody):
    model_config = ConfigDict(strict=True)
    num_frames: int = Field(ge=0)
    num_codebooks: int = Field(ge=0)
    values: list[int] = Field(description="Frame-major.")


class DocumentVoice(ApiBody):
    """The voice of a document; the library checks every value (limits, sizes)."""

    model_config = ConfigDict(strict=True)
    voice_id: str | None = None
    name: str = ""
    description: str = ""
    labels: dict[str, str] = {}
    model_family: str = ""
    model_name: str = ""
    consent: str = ""
    x_vector_only: bool
    ref_text: str = ""
    ref_audio_seconds: float = 0.0
    audio_sha256: str = ""
    created_at: str | None = Field(None, description="ISO 8601 with a time zone.")
    updated_at: str | None = None
    design: dict[str, Any] | None = None
    speaker_embedding: list[float] = Field(description="float32 values, exactly as stored.")
    ref_codes: RefCodesObject | None = None


class VoiceDocument(ApiBody):
    """A voice moving between deployments (``ExportVoice``): embedding, reference codes,
    transcript and metadata; not its owner."""

    model_config = ConfigDict(strict=True)
    format: str = Field(description=f'"{DOCUMENT_FORMAT}".')
    format_version: int = Field(
        description=f"{DOCUMENT_VERSION}; a document of a newer version is refused (400)."
    )
    exported_at: str | None = None
    voice: DocumentVoice


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
        description: Annotated[str, Form(description="Free text about the voice.")] = "",
        labels: Annotated[
            str, Form(description='Labels, a JSON object of strings, e.g. {"lang": "en"}.')
        ] = "",
        consent: Annotated[
            str, Form(description="The speaker's consent: a text or a consent record's id.")
        ] = "",
    ) -> None:
        self.audio_sample = audio_sample
        self.name, self.ref_text, self.x_vector_only, self.model = name, ref_text, x_vector_only, model
        self.description, self.labels, self.consent = description, labels, consent
        self.design = tts_pb2.VoiceDesign(
            instruct=instructions, text=text, language=language, model=design_model
        )
        if seed is not None:
            self.design.seed = seed

    def label_map(self) -> dict[str, str]:
        """The ``labels`` field as a map (INVALID_ARGUMENT unless a JSON object of strings)."""
        if not self.labels.strip():
            return {}
        try:
            labels = json.loads(self.labels)
        except ValueError as exc:
            raise InvalidRequestError(f"labels is not JSON: {exc}") from None
        if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
            raise InvalidRequestError("labels must be a JSON object of strings")
        return labels

    async def request(self) -> tts_pb2.RegisterVoiceRequest:
        """The RegisterVoice request of the form (INVALID_ARGUMENT for neither or both sources)."""
        message = tts_pb2.RegisterVoiceRequest(
            name=self.name,
            model=self.model,
            description=self.description,
            labels=self.label_map(),
            consent=self.consent,
        )
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


# --- the objects of the messages -------------------------------------------------------------
def registered_voice(voice: tts_pb2.Voice) -> RegisteredVoice:
    """A registered voice as the HTTP API describes it."""
    design = None
    if voice.HasField("design"):
        design = VoiceDesignObject(
            instructions=voice.design.instruct,
            text=voice.design.text,
            language=voice.design.language,
            seed=voice.design.seed,
            model=voice.design.model,
        )
    return RegisteredVoice(
        id=voice.voice_id,
        type="designed" if design is not None else "audio_sample",
        name=voice.name,
        created_at=voice.created_at.seconds,
        updated_at=voice.updated_at.seconds,
        description=voice.description,
        labels=dict(voice.labels),
        consent=voice.consent,
        owner=voice.owner,
        x_vector_only=voice.x_vector_only,
        ref_text=voice.ref_text,
        ref_audio_seconds=voice.ref_audio_seconds,
        model=voice.model,
        family=voice.family,
        design=design,
    )


def update_request(voice_id: str, body: VoicePatchBody) -> tts_pb2.UpdateVoiceRequest:
    """The UpdateVoice request of a PATCH body."""
    request = tts_pb2.UpdateVoiceRequest(voice_id=voice_id)
    if body.name is not None:
        request.name = body.name
    if body.description is not None:
        request.description = body.description
    if body.labels is not None:
        if body.labels:
            request.labels.update(body.labels)
        else:
            request.clear_labels = True
    return request


def voices_router(
    gateway: Gateway, aliases: Mapping[str, str], caller_of: Callable[[Request], Caller]
) -> APIRouter:
    """The voice routes over ``gateway`` (``aliases``: the ``--voice-alias`` table;
    ``caller_of``: whose request it is, from its headers)."""
    router = APIRouter(tags=["voices"], route_class=Utf8FormRoute)
    voices = gateway.voices
    # A default, not Annotated[...]: annotations are strings here, and this one is a local.
    caller_dependency = Depends(caller_of)

    def ok() -> None:
        count(grpc.StatusCode.OK)

    @router.get("/audio/voices", response_model=VoiceList)
    async def list_voices(
        request: Request,
        caller: Caller = caller_dependency,
        model: Annotated[
            str, Query(description="The model whose voices to list (default: the default model).")
        ] = "",
        page_size: Annotated[
            int, Query(ge=0, le=MAX_PAGE_SIZE, description="Most registered voices in one answer (0: 1000).")
        ] = 0,
        page_token: Annotated[str, Query(description="next_page_token of the previous page.")] = "",
        all_families: Annotated[bool, Query(description="Registered voices of every family.")] = False,
    ) -> VoiceList:
        with request_context(request_id_of(request)):
            listing = await voices.list_voices(
                tts_pb2.ListVoicesRequest(
                    model=model, page_size=page_size, page_token=page_token, all_families=all_families
                ),
                caller,
            )
        data: list[PresetVoice | RegisteredVoice | AliasVoice] = [
            PresetVoice(id=s.name, name=s.name, dialect=s.dialect) for s in listing.speakers
        ]
        data += [registered_voice(v) for v in listing.voices]
        data += [AliasVoice(id=alias, name=alias, target=target) for alias, target in sorted(aliases.items())]
        ok()
        return VoiceList(
            data=data,
            next_page_token=listing.next_page_token,
            model=listing.model,
            model_type=listing.model_type,
            model_size=listing.model_size,
            languages=list(listing.languages),
            instruct_supported=listing.instruct_supported,
            voice_clone_supported=listing.voice_clone_supported,
            sample_rate=listing.sample_rate,
        )

    @router.post("/audio/voices", response_model=RegisteredVoice)
    async def create_voice(
        request: Request, form: Annotated[VoiceForm, Depends()], caller: Caller = caller_dependency
    ) -> RegisteredVoice:
        request_id = request_id_of(request)
        with request_context(request_id):
            message = await form.request()
            voice = await voices.register(message, caller, request_id, None)
        ok()
        return registered_voice(voice)

    @router.post("/audio/voices/import", response_model=RegisteredVoice)
    async def import_voice(
        request: Request, document: VoiceDocument, caller: Caller = caller_dependency
    ) -> RegisteredVoice:
        with request_context(request_id_of(request)):
            voice = await voices.import_document(document.model_dump(mode="json", exclude_unset=True), caller)
        ok()
        return registered_voice(voice)

    @router.get("/audio/voices/{voice_id}", response_model=RegisteredVoice)
    async def retrieve_voice(
        request: Request, voice_id: str, caller: Caller = caller_dependency
    ) -> RegisteredVoice:
        with request_context(request_id_of(request)):
            voice = await voices.get(voice_id, caller)
        ok()
        return registered_voice(voice)

    @router.patch("/audio/voices/{voice_id}", response_model=RegisteredVoice)
    async def update_voice(
        request: Request, voice_id: str, body: VoicePatchBody, caller: Caller = caller_dependency
    ) -> RegisteredVoice:
        with request_context(request_id_of(request)):
            voice = await voices.update(update_request(voice_id, body), caller)
        ok()
        return registered_voice(voice)

    @router.delete("/audio/voices/{voice_id}", response_model=VoiceDeleted)
    async def delete_voice(
        request: Request, voice_id: str, caller: Caller = caller_dependency
    ) -> VoiceDeleted:
        with request_context(request_id_of(request)):
            await voices.delete(voice_id, caller)
        ok()
        return VoiceDeleted(id=voice_id)

    @router.get("/audio/voices/{voice_id}/export", response_model=VoiceDocument)
    async def export_voice(
        request: Request, voice_id: str, caller: Caller = caller_dependency
    ) -> JSONResponse:
        # JSONResponse: the floats printed as Python prints them (shortest exact form).
        with request_context(request_id_of(request)):
            document = await voices.export(voice_id, caller)
        ok()
        return JSONResponse(document)

    return router


__all__ = [
    "AliasVoice",
    "PresetVoice",
    "RegisteredVoice",
    "VOICES_PATH",
    "VoiceDocument",
    "VoiceForm",
    "VoiceList",
    "VoicePatchBody",
    "registered_voice",
    "update_request",
    "voices_router",
]
