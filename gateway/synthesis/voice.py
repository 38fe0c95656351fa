"""The voice of a request for the talker: a registered voice from the store (checked against the
model's voice family), an inline clone embedded by the model's speaker stage, or none (preset
speakers, voice design)."""

from __future__ import annotations

from dataclasses import dataclass

from tts_common.errors import FailedPreconditionError, NotFoundError
from tts_common.pb.qwen3tts.internal.v1 import stages_pb2
from tts_common.synthesis.validation import SynthesisPlan, check_speaker_embedding, model_label

from ..stages.backend import ModelBackend, voice_family
from ..voices.store import StoredVoice


@dataclass(frozen=True)
class ResolvedVoice:
    """What the talker request carries for a voice (empty for preset speakers / voice design)."""

    speaker_embedding: tuple[float, ...] = ()
    ref_codes: stages_pb2.Codes | None = None
    """In-context cloning: the reference codes (also the decoder's left context)."""
    ref_text: str = ""

    @classmethod
    def of(
        cls, embedding: tuple[float, ...], ref_codes: stages_pb2.Codes | None, ref_text: str
    ) -> ResolvedVoice:
        """An x-vector-only voice when ``ref_codes`` is None, else an in-context one."""
        if ref_codes is None:
            return cls(embedding)
        return cls(embedding, ref_codes, ref_text)


def require_speaker(backend: ModelBackend) -> None:
    """FAILED_PRECONDITION unless ``backend`` has a speaker stage."""
    if backend.speaker is None:
        raise FailedPreconditionError(
            f"voice cloning from reference audio needs the speaker stage, and model {backend.name!r} has "
            "none configured (--speaker-targets / --models ... speaker=; QWEN3TTS_SPEAKER_TARGETS); "
            "registered voices (voice_id) still work"
        )


def check_voice_family(voice: StoredVoice, backend: ModelBackend, talker: stages_pb2.TalkerInfo) -> None:
    """A registered voice is spoken only by models of its family: FAILED_PRECONDITION naming
    the voice's model and family and the requested model otherwise."""
    family = voice_family(talker)
    if family and voice.family in ("", family):
        return
    belongs = f"the {voice.family} family" if voice.family else "another model"
    registered = f", registered with model {voice.model_name!r}" if voice.model_name else ""
    cannot = (
        f"a {family} model"
        if family
        else f"a {model_label(talker.model)} model, which speaks no registered voice"
    )
    raise FailedPreconditionError(
        f"voice {voice.voice_id} belongs to {belongs}{registered}; model {backend.name!r} is {cannot} "
        f"and cannot speak it (use a model of the {voice.family or 'same'} family)"
    )


async def resolve_voice(
    plan: SynthesisPlan,
    stored: StoredVoice | None,
    backend: ModelBackend,
    talker: stages_pb2.TalkerInfo,
    request_id: str,
    time_remaining: float | None,
) -> ResolvedVoice:
    """The voice of ``plan`` for the talker: ``stored`` (the registered voice its ``voice_id``
    names, looked up by the caller; NotFoundError if None), an inline clone through the model's
    speaker stage, or none."""
    if plan.voice_kind == "voice_id":
        if stored is None:
            raise NotFoundError(f"unknown voice_id {plan.voice_id!r} (see ListVoices)")
        check_speaker_embedding(
            len(stored.speaker_embedding), talker.speaker_embedding_dim, f"registered voice {plan.voice_id}"
        )
        codes = None if stored.voice.x_vector_only else stored.ref_codes
        return ResolvedVoice.of(tuple(stored.speaker_embedding), codes, stored.voice.ref_text)
    if plan.voice_kind == "clone":
        assert plan.clone is not None
        require_speaker(backend)
        assert backend.speaker is not None
        embedding = await backend.speaker.embed(plan.clone, request_id, time_remaining, talker)
        codes = None if plan.clone.x_vector_only else embedding.ref_codes
        return ResolvedVoice.of(tuple(embedding.speaker_embedding), codes, plan.clone.ref_text)
    return ResolvedVoice()


__all__ = ["ResolvedVoice", "check_voice_family", "require_speaker", "resolve_voice"]
