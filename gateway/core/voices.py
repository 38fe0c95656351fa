"""Registered voices, for any transport: listing them per model, registering one (from reference
audio, or designed: "Voice Design, then Clone") and deleting one.

A voice is embedded by the speaker stage of a Base model and belongs to that model's family
(:func:`gateway.stages.backend.voice_family`): the models of that family speak it. A designed voice
takes one more step first: a VoiceDesign model speaks the design's sample text in the described
voice (:meth:`gateway.synthesis.context.SynthesisContext.render`, holding a stream place like any
synthesis), and that audio is the reference, its text the transcript. Because every later
segment is cloned from that one reference, the voice stays the same over a long text, unlike a
VoiceDesign description, which is interpreted anew for every segment.
"""

from __future__ import annotations

import logging
import time

from google.protobuf.timestamp_pb2 import Timestamp

from tts_common.errors import FailedPreconditionError, InvalidRequestError
from tts_common.logging_setup import model_context
from tts_common.pb.qwen3tts.internal.v1 import stages_pb2
from tts_common.pb.qwen3tts.v1 import tts_pb2
from tts_common.synthesis.validation import check_clone, check_text, check_voice_kind, model_label

from ..stages.backend import ModelBackend, voice_family
from ..stages.models import ModelRegistry
from ..synthesis.context import SynthesisContext
from ..synthesis.voice import require_speaker
from ..voices.store import StoredVoice, VoiceStore, new_voice_id
from .admission import Admission

logger = logging.getLogger(__name__)

MAX_VOICE_NAME_CHARS = 200


def _is_base(backend: ModelBackend, talker: stages_pb2.TalkerInfo) -> bool:
    return talker.model.model_type == "base"


def _is_voice_design(backend: ModelBackend, talker: stages_pb2.TalkerInfo) -> bool:
    return talker.model.model_type == "voice_design"


class VoiceService:
    """Registered voices over the served models (see the module doc)."""

    def __init__(
        self, models: ModelRegistry, store: VoiceStore, context: SynthesisContext, admission: Admission
    ) -> None:
        self.models = models
        self.store = store
        self.context = context
        self.admission = admission

    async def list_voices(self, model: str) -> tts_pb2.ListVoicesResponse:
        """What ListVoices answers for ``model`` ("" = the default): its description and the
        registered voices it can speak."""
        backend = self.models.get(model)
        talker = await backend.talker_info()
        info = backend.public_info(talker)
        family = voice_family(talker)
        voices = await self.store.list_voices(family) if family else []
        return tts_pb2.ListVoicesResponse(
            model_type=info.model_type,
            model_size=info.model_size,
            speakers=info.speakers,
            languages=info.languages,
            instruct_supported=info.instruct_supported,
            voice_clone_supported=info.voice_clone_supported,
            voices=[v.voice for v in voices],
            sample_rate=info.sample_rate,
            model=backend.name,
        )

    async def register(
        self, request: tts_pb2.RegisterVoiceRequest, request_id: str, time_remaining: float | None
    ) -> tts_pb2.Voice:
        """Embed the reference (given, or designed first) with a Base model's speaker stage and
        store the voice (RESOURCE_EXHAUSTED past the store's limit)."""
        if len(request.name) > MAX_VOICE_NAME_CHARS:
            raise InvalidRequestError(
                f"name is too long: {len(request.name)} characters (maximum {MAX_VOICE_NAME_CHARS})"
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
            self._check_design(request.design)
        else:
            check_voice_kind("clone", base.public_info(talker))
            check_clone(request.reference, self.context.limits, "reference")
        require_speaker(base)
        await self.store.check_capacity()
        design = None
        if designing:
            reference, design = await self._design(request.design, request_id, time_remaining)
        else:
            reference = request.reference
        assert base.speaker is not None
        field = "the designed reference" if designing else "reference"
        embedding = await base.speaker.embed(reference, request_id, time_remaining, talker, field)
        created = Timestamp()
        created.GetCurrentTime()
        voice = tts_pb2.Voice(
            voice_id=new_voice_id(),
            name=request.name,
            x_vector_only=reference.x_vector_only,
            ref_text="" if reference.x_vector_only else reference.ref_text,
            ref_audio_seconds=embedding.audio_seconds,
            created_at=created,
            model=base.name,
            family=voice_family(talker),
        )
        if design is not None:
            voice.design.CopyFrom(design)
        stored = StoredVoice(
            voice=voice,
            speaker_embedding=list(embedding.speaker_embedding),
            ref_codes=None if reference.x_vector_only else embedding.ref_codes,
            audio_sha256=embedding.audio_sha256,
        )
        await self.store.add(stored)
        logger.info(
            "registered voice %s (%r, %s, %.1f s reference%s) with model %s, family %s",
            voice.voice_id,
            request.name,
            "x-vector only" if reference.x_vector_only else "in-context",
            voice.ref_audio_seconds,
            f", designed with model {design.model}" if design is not None else "",
            base.name,
            voice.family,
        )
        return voice

    async def delete(self, voice_id: str) -> None:
        """Delete a registered voice (NOT_FOUND if there is none)."""
        if not voice_id.strip():
            raise InvalidRequestError("voice_id is empty")
        await self.store.delete(voice_id.strip())
        logger.info("deleted voice %s", voice_id)

    # --- choosing the models ------------------------------------------------------------------
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

    def _design_model(self, name: str) -> ModelBackend:
        """The VoiceDesign model that speaks a design: the one named, else the first served."""
        if not name.strip():
            return self.models.find(
                "a VoiceDesign model (it speaks the designed reference)", _is_voice_design
            )
        backend = self.models.get(name)
        talker = backend.info.cached
        if talker is not None and not _is_voice_design(backend, talker):
            raise FailedPreconditionError(
                f"design.model {name!r} is a {model_label(talker.model)} model; a voice is designed by a "
                "voice_design model"
            )
        return backend

    # --- Voice Design, then Clone ---------------------------------------------------------------
    def _check_design(self, design: tts_pb2.VoiceDesign) -> None:
        limits = self.context.limits
        if not design.instruct.strip():
            raise InvalidRequestError("design.instruct is required: describe the voice")
        check_text(design.instruct, limits.max_instruct_chars, "design.instruct")
        if not design.text.strip():
            raise InvalidRequestError("design.text is required: what the voice says in its reference")
        check_text(design.text, limits.max_instruct_chars, "design.text")

    async def _design(
        self, design: tts_pb2.VoiceDesign, request_id: str, time_remaining: float | None
    ) -> tuple[tts_pb2.VoiceClone, tts_pb2.VoiceDesign]:
        """The designed reference (native-rate float32, its text the transcript) and the design
        as done (its model and seed)."""
        designer = self._design_model(design.model)
        request = tts_pb2.SynthesizeRequest(
            text=design.text,
            language=design.language,
            instruct=design.instruct,
            output=tts_pb2.AudioFormat(encoding=tts_pb2.AUDIO_ENCODING_FLOAT32),
        )
        if design.HasField("seed"):
            request.sampling.seed = design.seed
        with model_context(designer.name), self.admission.admit(time.monotonic(), designer):
            prepared, audio, results = await self.context.render(
                designer, request, request_id, time_remaining, single_segment="design.text"
            )
        if not audio.size:
            raise InvalidRequestError(
                f"model {designer.name!r} said nothing for design.text (finish reason "
                f"{tts_pb2.FinishReason.Name(results[0].finish_reason) if results else 'none'}); try another text or seed"
            )
        reference = tts_pb2.VoiceClone(
            ref_audio=audio.astype("<f4").tobytes(),
            ref_audio_encoding=tts_pb2.REFERENCE_AUDIO_ENCODING_RAW_FLOAT32,
            ref_audio_sample_rate=prepared.info.sample_rate,
            ref_text=design.text,
        )
        done = tts_pb2.VoiceDesign(
            instruct=design.instruct,
            text=design.text,
            language=prepared.plan.language,
            seed=prepared.plan.sampling.seed or 0,
            model=designer.name,
        )
        logger.info(
            "designed a reference with model %s: %.2f s, seed %d",
            designer.name,
            audio.size / reference.ref_audio_sample_rate,
            done.seed,
        )
        return reference, done


__all__ = ["MAX_VOICE_NAME_CHARS", "VoiceService"]
