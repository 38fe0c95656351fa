"""Registered voices, for any transport: listing them per model, registering one (from reference
audio, or designed: "Voice Design, then Clone", :mod:`.designs`), reading, changing, exporting,
importing and deleting one, all in the voice library (:mod:`gateway.voice_library`) that every
gateway over the same database shares.

A voice is embedded by the speaker stage of a Base model and belongs to that model's family
(:func:`gateway.stages.backend.voice_family`): the models of that family speak it. It belongs to
the API key that registered it (the call's :class:`~gateway.voice_library.Caller`, turned into a
library scope only here, when a voice is touched): another key gets NOT_FOUND for it and does not
list it; an admin key sees every voice. A database that is down or slow is UNAVAILABLE with a
retry hint (:class:`~gateway.voice_library.VoiceStoreUnavailableError`).
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Any

import numpy as np
from google.protobuf.json_format import MessageToDict, ParseDict
from google.protobuf.timestamp_pb2 import Timestamp

from tts_common.errors import FailedPreconditionError, InvalidRequestError
from tts_common.pb.qwen3tts.internal.v1 import stages_pb2
from tts_common.pb.qwen3tts.v1 import tts_pb2
from tts_common.synthesis.validation import RequestLimits, check_clone, check_voice_kind

from ..stages.backend import ModelBackend, voice_family
from ..stages.models import ModelRegistry
from ..synthesis.voice import require_speaker
from ..voice_library import Caller, NewVoice, RefCodes, VoiceInfo, VoiceLibrary, VoicePatch
from ..voice_library.library import MAX_PAGE_SIZE
from ..voice_library.records import check_metadata
from .designs import VoiceDesigner

logger = logging.getLogger(__name__)


def _is_base(backend: ModelBackend, talker: stages_pb2.TalkerInfo) -> bool:
    return talker.model.model_type == "base"


def _timestamp(moment: datetime) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(moment)
    return stamp


def voice_message(info: VoiceInfo) -> tts_pb2.Voice:
    """A stored voice as the API describes it."""
    voice = tts_pb2.Voice(
        voice_id=info.voice_id,
        name=info.name,
        x_vector_only=info.x_vector_only,
        ref_text=info.ref_text,
        ref_audio_seconds=info.ref_audio_seconds,
        created_at=_timestamp(info.created_at),
        model=info.model_name,
        family=info.model_family,
        description=info.description,
        labels=dict(info.labels),
        consent=info.consent,
        owner=info.owner,
        updated_at=_timestamp(info.updated_at),
    )
    if info.design is not None:
        ParseDict(info.design, voice.design, ignore_unknown_fields=True)
    return voice


def _voice_id(text: str) -> str:
    voice_id = text.strip()
    if not voice_id:
        raise InvalidRequestError("voice_id is empty")
    return voice_id


def voice_patch(request: tts_pb2.UpdateVoiceRequest) -> VoicePatch:
    """What an UpdateVoice request changes (INVALID_ARGUMENT for ``labels`` with ``clear_labels``)."""
    if request.labels and request.clear_labels:
        raise InvalidRequestError("send labels (replacing them) or clear_labels, not both")
    labels = dict(request.labels) if request.labels else ({} if request.clear_labels else None)
    return VoicePatch(
        name=request.name if request.HasField("name") else None,
        description=request.description if request.HasField("description") else None,
        labels=labels,
    )


class VoiceService:
    """Registered voices over the served models and the voice library (see the module doc)."""

    def __init__(
        self, models: ModelRegistry, library: VoiceLibrary, designer: VoiceDesigner, limits: RequestLimits
    ) -> None:
        self.models = models
        self.library = library
        self.designer = designer
        self.limits = limits

    async def list_voices(
        self, request: tts_pb2.ListVoicesRequest, caller: Caller
    ) -> tts_pb2.ListVoicesResponse:
        """What ListVoices answers: the model's description and a page of the caller's registered
        voices it can speak (its family, and those registered before families; every family with
        ``all_families``). A model that speaks no registered voice lists none without asking the
        library."""
        backend = self.models.get(request.model)
        talker = await backend.talker_info()
        info = backend.public_info(talker)
        response = tts_pb2.ListVoicesResponse(
            model_type=info.model_type,
            model_size=info.model_size,
            speakers=info.speakers,
            languages=info.languages,
            instruct_supported=info.instruct_supported,
            voice_clone_supported=info.voice_clone_supported,
            sample_rate=info.sample_rate,
            model=backend.name,
        )
        family = voice_family(talker)
        if not family and not request.all_families:
            return response
        scope = await self.library.scope_of(caller)
        page = await self.library.list_voices(
            scope,
            model_family=None if request.all_families else (family, ""),
            page_size=request.page_size or MAX_PAGE_SIZE,
            page_token=request.page_token,
        )
        response.voices.extend(voice_message(v) for v in page.voices)
        response.next_page_token = page.next_page_token
        return response

    async def register(
        self,
        request: tts_pb2.RegisterVoiceRequest,
        caller: Caller,
        request_id: str,
        time_remaining: float | None,
    ) -> tts_pb2.Voice:
        """Embed the reference (given, or designed first) with a Base model's speaker stage and
        store the voice for the caller (RESOURCE_EXHAUSTED past the library's or the key's
        limit, checked before the costly part and again when storing)."""
        check_metadata(
            name=request.name,
            description=request.description,
            consent=request.consent,
            labels=dict(request.labels),
        )
        source = request.WhichOneof("source")
        if source is None:
            raise InvalidRequestError(
                "reference (reference audio and transcript) or design (a voice description) is required"
            )
        designing = source == "design"
        base = self._clone_model(request.model, designing)
        talker = await base.talker_info()
        if designing:
            self.designer.check(request.design)
        else:
            check_voice_kind("clone", base.public_info(talker))
            check_clone(request.reference, self.limits, "reference")
        require_speaker(base)
        scope = await self.library.scope_of(caller)
        await self.library.check_capacity(scope)
        design = None
        if designing:
            reference, design = await self.designer.reference(request.design, request_id, time_remaining)
        else:
            reference = request.reference
        assert base.speaker is not None
        field = "the designed reference" if designing else "reference"
        embedding = await base.speaker.embed(reference, request_id, time_remaining, talker, field)
        codes = embedding.ref_codes
        record = await self.library.add(
            NewVoice(
                speaker_embedding=np.asarray(embedding.speaker_embedding, dtype=np.float32),
                ref_codes=None
                if reference.x_vector_only
                else RefCodes.from_flat(list(codes.values), codes.num_frames, codes.num_codebooks),
                x_vector_only=reference.x_vector_only,
                ref_text="" if reference.x_vector_only else reference.ref_text,
                name=request.name,
                description=request.description,
                labels=dict(request.labels),
                model_family=voice_family(talker),
                model_name=base.name,
                consent=request.consent,
                ref_audio_seconds=embedding.audio_seconds,
                audio_sha256=embedding.audio_sha256,
                design=None if design is None else MessageToDict(design, preserving_proto_field_name=True),
            ),
            scope,
        )
        info = record.info
        logger.info(
            "registered voice %s (%r, %s, %.1f s reference%s) with model %s, family %s",
            info.voice_id,
            info.name,
            "x-vector only" if info.x_vector_only else "in-context",
            info.ref_audio_seconds,
            f", designed with model {design.model}" if design is not None else "",
            base.name,
            info.model_family,
        )
        return voice_message(info)

    async def get(self, voice_id: str, caller: Caller) -> tts_pb2.Voice:
        """One of the caller's voices (NOT_FOUND if unknown or another key's)."""
        record = await self.library.get(_voice_id(voice_id), await self.library.scope_of(caller))
        return voice_message(record.info)

    async def update(self, request: tts_pb2.UpdateVoiceRequest, caller: Caller) -> tts_pb2.Voice:
        """Rename, describe or relabel one of the caller's voices (NOT_FOUND as :meth:`get`)."""
        patch = voice_patch(request)
        info = await self.library.update(
            _voice_id(request.voice_id), patch, await self.library.scope_of(caller)
        )
        logger.info("updated voice %s: %s", info.voice_id, ", ".join(patch.changed_fields()) or "nothing")
        return voice_message(info)

    async def delete(self, voice_id: str, caller: Caller) -> None:
        """Delete one of the caller's voices (NOT_FOUND as :meth:`get`)."""
        info = await self.library.delete(_voice_id(voice_id), await self.library.scope_of(caller))
        logger.info("deleted voice %s", info.voice_id)

    async def export(self, voice_id: str, caller: Caller) -> dict[str, Any]:
        """The export document of one of the caller's voices (NOT_FOUND as :meth:`get`)."""
        return await self.library.export(_voice_id(voice_id), await self.library.scope_of(caller))

    async def import_document(self, document: Any, caller: Caller) -> tts_pb2.Voice:
        """Store the voice of an export document for the caller (its id kept when free)."""
        record = await self.library.import_document(document, await self.library.scope_of(caller))
        logger.info("imported voice %s (%r)", record.voice_id, record.info.name)
        return voice_message(record.info)

    @staticmethod
    def parse_document(text: str) -> Any:
        """An export document sent as JSON text (INVALID_ARGUMENT when it is not JSON)."""
        try:
            return json.loads(text)
        except ValueError as exc:
            raise InvalidRequestError(f"document is not JSON: {exc}") from None

    # --- choosing the model -------------------------------------------------------------------
    def _clone_model(self, name: str, designing: bool) -> ModelBackend:
        """The Base model that embeds the reference: the one named, else the default if it is a
        Base model, else the first Base model served (without one: a designed voice is refused
        naming what is missing; a reference goes to the default model, which refuses it)."""
        if name.strip():
            return self.models.get(name)
        try:
            return self.models.find(
                "a Base model (voices are cloned with a Base model's speaker stage)", _is_base
            )
        except FailedPreconditionError:
            if designing:
                raise
            return self.models.default


__all__ = ["VoiceService", "voice_message", "voice_patch"]
