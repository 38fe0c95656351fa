"""The voice of a request for the talker: a registered voice from the voice library (the caller's
own, checked against the model's voice family), an inline clone embedded by the model's speaker
stage, or none (preset speakers, voice design: no database involved)."""

from __future__ import annotations

from dataclasses import dataclass

from tts_common.errors import FailedPreconditionError, NotFoundError
from tts_common.pb.qwen3tts.internal.v1 import stages_pb2
from tts_common.synthesis.validation import SynthesisPlan, check_speaker_embedding, model_label

from ..stages.backend import ModelBackend, voice_family
from ..voice_library import Caller, VoiceLibrary, VoiceRecord


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


async def find_registered_voice(library: VoiceLibrary, caller: Caller, voice_id: str) -> VoiceRecord | None:
    """The caller's registered voice ``voice_id`` (None if unknown or another key's;
    VoiceStoreUnavailableError while the library cannot answer)."""
    try:
        return await library.get(voice_id, await library.scope_of(caller))
    except NotFoundError:
        return None


def check_voice_family(voice: VoiceRecord, backend: ModelBackend, talker: stages_pb2.TalkerInfo) -> None:
    """A registered voice is spoken only by models of its family (a voice registered before
    families by any model that can clone): FAILED_PRECONDITION naming the voice's model and
    family and the requested model otherwise."""
    family = voice_family(talker)
    its_family = voice.info.model_family
    if family and its_family in ("", family):
        return
    belongs = f"the {its_family} family" if its_family else "another model"
    model_name = voice.info.model_name
    registered = f", registered with model {model_name!r}" if model_name else ""
    cannot = (
        f"a {family} model"
        if family
        else f"a {model_label(talker.model)} model, which speaks no registered voice"
    )
    raise FailedPreconditionError(
        f"voice {voice.voice_id} belongs to {belongs}{registered}; model {backend.name!r} is {cannot} "
        f"and cannot speak it (use a model of the {its_family or 'same'} family)"
    )


async def resolve_voice(
    plan: SynthesisPlan,
    stored: VoiceRecord | None,
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
        ref = stored.ref_codes
        codes = (
            None
            if ref is None
            else stages_pb2.Codes(
                num_frames=ref.num_frames, num_codebooks=ref.num_codebooks, values=ref.flat()
            )
        )
        return ResolvedVoice.of(tuple(stored.speaker_embedding.tolist()), codes, stored.info.ref_text)
    if plan.voice_kind == "clone":
        assert plan.clone is not None
        require_speaker(backend)
        assert backend.speaker is not None
        embedding = await backend.speaker.embed(plan.clone, request_id, time_remaining, talker)
        codes = None if plan.clone.x_vector_only else embedding.ref_codes
        return ResolvedVoice.of(tuple(embedding.speaker_embedding), codes, plan.clone.ref_text)
    return ResolvedVoice()


__all__ = ["ResolvedVoice", "check_voice_family", "find_registered_voice", "require_speaker", "resolve_voice"]
